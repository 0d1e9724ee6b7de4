"""`@metile.autotune(configs=[...])`: pick a kernel's meta-parameters by
measuring them, once per tuning key (see `runtime.tuning`).

    @metile.autotune(configs=[metile.Config(BLOCK=256), metile.Config(BLOCK=1024, num_simdgroups=8)],
                     key=["n"])  # Triton's num_warps=, num_stages= are accepted too
    @metile.kernel
    def add(X, Y, Z, n, BLOCK: metile.constexpr): ...

    z = add[lambda meta: (metile.cdiv(meta["n"], meta["BLOCK"]),)](x, y, z, n)

Arrays enter the tuning key by type, dtype, shape and strides and integer
scalars by value; `key` names further arguments (e.g. floats) whose values
should select their own winner.  The grid may depend on the candidate's meta-parameters (a callable of the
bound arguments).  Candidates that cannot compile or that the schedule rejects
are skipped with their reason; each candidate's outputs are checked against
the first usable one before it is timed.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..errors import ArgumentError, CompilationError, LaunchError, ScheduleError
from ..schedule import Config
from . import cache, tuning
from .dispatch import resolve_grid
from ..compiler.backend import resolve_backend
from .kernel import Kernel

# Launch keywords that change numerics or lowering: part of the tuning key.
POLICY_KEYWORDS = ("RELAXED_PRECISION", "STRICT_MATH", "SCHEDULE", "num_stages", "num_warps",
                   "num_simdgroups")


def _outputs_close(outs, reference) -> bool:
    outs = outs if isinstance(outs, tuple) else (outs,)
    reference = reference if isinstance(reference, tuple) else (reference,)
    for a, b in zip(outs, reference):
        # Candidates differ only in tiling, so they agree to accumulation-order rounding.
        if not np.allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                           rtol=1e-3, atol=1e-3, equal_nan=True):
            return False
    return True


class Autotuned:
    def __init__(self, kernel: Kernel, configs, key, warmup: int, reps: int):
        from .heuristics import Heuristics
        if not isinstance(kernel, (Kernel, Heuristics)):
            raise TypeError("metile.autotune decorates a @metile.kernel (put it above "
                            "@metile.kernel and any @metile.heuristics)")
        configs = list(configs)
        if not configs or not all(isinstance(c, Config) for c in configs):
            raise TypeError("metile.autotune needs a non-empty list of metile.Config")
        if isinstance(key, str) or not all(isinstance(k, str) for k in key):
            raise TypeError(f"metile.autotune key must be a list of parameter names, e.g. "
                            f"key=['n'], got {key!r}")
        unknown = [k for k in key if k not in kernel.param_names]
        if unknown:
            raise ValueError(f"metile.autotune key names unknown parameters {unknown}; "
                             f"{kernel.fn.__name__} has {kernel.param_names}")
        self.kernel, self.configs, self.warmup, self.reps = kernel, configs, warmup, reps
        self.key = tuple(key)
        self.last_result: tuning.TuneResult | None = None

    def __getitem__(self, grid):
        return _TunedLauncher(self, grid)


class _TunedLauncher:
    def __init__(self, tuned: Autotuned, grid):
        self.tuned, self.grid = tuned, grid

    def _launch(self, config: Config, args, kwargs):
        options = {**kwargs, **config.meta}
        if config.num_simdgroups is not None:
            options["num_simdgroups"] = config.num_simdgroups
        kernel = self.tuned.kernel
        complete = getattr(kernel, "complete", None)
        if complete is not None:   # metile.heuristics below: computed from this candidate
            options, kernel = complete(args, options), kernel.base
        grid = self.grid
        if callable(grid):
            # with the kernel's defaults, as a plain launch's grid callable sees them
            bound = {**kernel.defaults, **dict(zip(kernel.param_names, args)), **options}
            grid = resolve_grid(grid, bound)
        try:
            return kernel[grid](*args, **options)
        except ArgumentError as e:
            # (Triton raises it too: a typo in a Config is not a candidate to skip)
            raise ArgumentError(f"{e} (from autotune {config})") from None

    def best(self, *args, **kwargs) -> Config:
        """The winning Config for these arguments (measured or from the tuning cache)."""
        self._check_conflicts(kwargs)
        kernel = self.tuned.kernel
        bound = dict(zip(kernel.param_names, args))
        bound.update({k: v for k, v in kwargs.items() if k in kernel.param_names})
        overrides = {k: v for k, v in kwargs.items() if k in POLICY_KEYWORDS}
        # (as the launch resolves it: target= picks the plan, so a winner measured for one
        # target is not another's)
        backend = resolve_backend(
            kwargs.get("backend") if "backend" not in kernel.param_names else None,
            target=kwargs.get("target") if "target" not in kernel.param_names else None)
        parts = tuning.key_parts(
            operands={k: v for k, v in bound.items() if k not in overrides},
            overrides=overrides, grid=None if callable(self.grid) else (
                self.grid if isinstance(self.grid, (tuple, list))
                else resolve_grid(self.grid, {})[:1]),   # an int grid, as launches take it
            source=cache.source_fingerprint(kernel.fn), compiler=cache.compiler_fingerprint(),
            target=f"{backend.device}:{backend.language}:{backend.target.name}",
            by_value=self.tuned.key)
        result = tuning.autotune(
            self.tuned.configs, lambda c: self._launch(c, args, kwargs), parts,
            warmup=self.tuned.warmup, reps=self.tuned.reps, validate=_outputs_close,
            unusable=(ScheduleError, CompilationError, LaunchError), fatal=(ArgumentError,))
        self.tuned.last_result = result
        return result.config

    def _check_conflicts(self, kwargs) -> None:
        """A meta-parameter given at the call that the configs also set would be overridden
        by each config (the call sized its grid for its own value): an error, as in Triton."""
        tuned = {k for c in self.tuned.configs for k in c.meta}
        if any(c.num_simdgroups is not None for c in self.tuned.configs):
            # (each config's count replaced the call's: a call's num_simdgroups=4 ran on 1)
            tuned |= {"num_simdgroups", "NUM_SG", "num_warps"}
        clash = sorted(tuned & set(kwargs))
        if clash:
            raise LaunchError(f"{self.tuned.kernel.fn.__name__}: conflicting meta-parameters "
                              f"{', '.join(clash)}: the autotune configs set them; leave them "
                              f"out of the call (or out of the configs)")

    def __call__(self, *args, **kwargs):
        return self._launch(self.best(*args, **kwargs), args, kwargs)


def autotune(configs, key=(), *, warmup: int = 2, reps: int = 7):
    """Decorator over a @metile.kernel: launches use the fastest of `configs`."""
    for name, value, least in (("warmup", warmup, 0), ("reps", reps, 1)):
        # (reps=0 was taken here and failed at the first launch, in the statistics)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"metile.autotune {name} must be an int >= {least}, got {value!r}")
    return lambda kernel: Autotuned(kernel, configs, key, warmup, reps)
