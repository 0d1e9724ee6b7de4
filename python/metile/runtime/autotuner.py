"""`@metile.autotune(configs=[...])`: pick a kernel's meta-parameters by
measuring them, once per tuning key (see `runtime.tuning`).

    @metile.autotune(configs=[metile.Config(BLOCK=256), metile.Config(BLOCK=1024, num_simdgroups=8)],
                     key=["n"])  # Triton's num_warps=, num_stages= are accepted too
    @metile.kernel
    def add(X, Y, Z, n, BLOCK: metile.constexpr): ...

    z = add[lambda meta: (metile.cdiv(meta["n"], meta["BLOCK"]),)](x, y, z, n)

Arrays enter the tuning key by type, dtype, shape and strides and integer
scalars by value; `key` names further arguments (e.g. floats) whose values
should select their own winner.

Triton's options: `prune_configs_by={"early_config_prune": f, "perf_model": g,
"top_k": k}` narrows the candidates before any is measured, with Triton's calls
(`f(configs, named_args, **kwargs)`, `g(**named_args, **kwargs, **config's
keywords)`, `k` a count or a fraction <= 1.0); once per tuning key.
`reset_to_zero=` / `restore_value=` name array arguments a candidate would
otherwise find changed by an earlier one: a metile launch never writes the
caller's arrays (its outputs are new arrays), so every candidate, and the
launch after, reads them as passed - what those options arrange in Triton.
The names are checked.  The grid may depend on the candidate's meta-parameters (a callable of the
bound arguments).  Candidates that cannot compile or that the schedule rejects
are skipped with their reason; each candidate's outputs are checked against
the first usable one before it is timed.
"""

from __future__ import annotations

import functools
import numbers
import warnings

import mlx.core as mx
import numpy as np

from ..errors import ArgumentError, CompilationError, GridError, LaunchError, ScheduleError
from ..schedule import Config
from . import cache, tuning
from .dispatch import resolve_grid
from ..compiler.backend import resolve_backend
from .compiled_view import refuse_dtype_placeholders
from .kernel import Kernel

# Launch keywords that change numerics or lowering: part of the tuning key.
POLICY_KEYWORDS = ("RELAXED_PRECISION", "STRICT_MATH", "SCHEDULE", "num_stages", "num_warps",
                   "num_simdgroups")


def _outputs_close(outs, reference) -> bool:
    outs = outs if isinstance(outs, tuple) else (outs,)
    reference = reference if isinstance(reference, tuple) else (reference,)
    for a, b in zip(outs, reference):
        if not (mx.issubdtype(a.dtype, mx.inexact) or mx.issubdtype(b.dtype, mx.inexact)):
            # integers have no rounding to forgive, and through float32 with rtol a count
            # off by one (of 1e6, or past 2**24) agreed
            if a.shape != b.shape or not np.array_equal(np.array(a), np.array(b)):
                return False
            continue
        # Candidates differ only in tiling, so they agree to accumulation-order rounding.
        if not np.allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                           rtol=1e-3, atol=1e-3, equal_nan=True):
            return False
    return True


PRUNE_FIELDS = ("early_config_prune", "perf_model", "top_k")


def _named_arrays(kernel, names, option: str) -> tuple:
    """`names` (reset_to_zero / restore_value) checked as the kernel's parameter names."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]    # (Triton takes one name or a list)
    names = list(names)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"metile.autotune {option} must be a parameter name or a list of them, "
                        f"got {names!r}")
    return _known(kernel, names, option)


def _known(kernel, names: list, option: str) -> tuple:
    unknown = [n for n in names if n not in kernel.param_names]
    if unknown:
        raise ValueError(f"metile.autotune {option} names unknown parameters {unknown}; "
                         f"{kernel.fn.__name__} has {kernel.param_names}")
    return tuple(names)


def _prune_options(prune) -> dict:
    if prune is None:
        return {}
    if not isinstance(prune, dict):
        raise TypeError(f"metile.autotune prune_configs_by must be a dict with "
                        f"{', '.join(PRUNE_FIELDS)}, got {type(prune).__name__}")
    unknown = sorted(set(prune) - set(PRUNE_FIELDS))
    if unknown:
        raise ValueError(f"metile.autotune prune_configs_by: unknown fields {unknown}; it takes "
                         f"{', '.join(PRUNE_FIELDS)}")
    for name in ("early_config_prune", "perf_model"):
        if prune.get(name) is not None and not callable(prune[name]):
            raise TypeError(f"metile.autotune prune_configs_by[{name!r}] must be callable")
    top_k = prune.get("top_k", 1.0)
    if isinstance(top_k, bool) or not (isinstance(top_k, int) and top_k >= 1 or
                                       isinstance(top_k, float) and 0.0 < top_k <= 1.0):
        raise TypeError(f"metile.autotune prune_configs_by['top_k'] must be an int >= 1 (a "
                        f"count) or a float in (0, 1] (a fraction), got {top_k!r}")
    return {**prune, "top_k": top_k}


class Autotuned:
    def __init__(self, kernel: Kernel, configs, key, warmup: int, reps: int, prune=None,
                 reset_to_zero=None, restore_value=None):
        from .heuristics import Heuristics
        if not isinstance(kernel, (Kernel, Heuristics)):
            raise TypeError("metile.autotune decorates a @metile.kernel (put it above "
                            "@metile.kernel and any @metile.heuristics)")
        configs = list(configs)
        if not configs or not all(isinstance(c, Config) for c in configs):
            raise TypeError("metile.autotune needs a non-empty list of metile.Config")
        seen = set()
        for c in configs:   # (refused only at the first launch before, unnamed)
            if c in seen:
                raise ValueError(f"metile.autotune configs list {c} twice")
            seen.add(c)
        try:
            names = None if isinstance(key, str) else list(key)
        except TypeError:      # (key=None: "'NoneType' object is not iterable" before)
            names = None
        if names is None or not all(isinstance(k, str) for k in names):
            raise TypeError(f"metile.autotune key must be a list of parameter names, e.g. "
                            f"key=['n'], got {key!r}")
        self.key = _known(kernel, names, "key")
        # (num_warmups, as Triton names it: `warmup` is Triton's compile-only call)
        self.kernel, self.configs, self.num_warmups, self.reps = kernel, configs, warmup, reps
        self.prune = _prune_options(prune)
        self.reset_to_zero = _named_arrays(kernel, reset_to_zero, "reset_to_zero")
        self.restore_value = _named_arrays(kernel, restore_value, "restore_value")
        self._pruned: dict[str, list] = {}      # tuning key -> the candidates pruning kept
        self.last_result: tuning.TuneResult | None = None

    def pruned(self, parts: dict, named: dict, kwargs: dict) -> list:
        """The candidates left by prune_configs_by for this call, worked out once per tuning
        key (as Triton prunes once per key)."""
        if not self.prune:
            return self.configs
        memo = tuning.tuning_key(parts)
        kept = self._pruned.get(memo)
        if kept is not None:
            return kept
        kept = self.configs
        early = self.prune.get("early_config_prune")
        if early is not None:
            returned = early(list(kept), dict(named), **kwargs)
            if returned is None:
                # (a forgotten `return`: "'NoneType' object is not iterable" before)
                raise LaunchError(f"{self.kernel.fn.__name__}: prune_configs_by's "
                                  f"early_config_prune returned None; it must return the "
                                  f"configs to keep")
            kept = list(returned)
            if not kept:
                raise LaunchError(f"{self.kernel.fn.__name__}: prune_configs_by's "
                                  f"early_config_prune left no config; it must return at least one")
            if not all(isinstance(c, Config) for c in kept):
                raise TypeError(f"{self.kernel.fn.__name__}: early_config_prune must return "
                                f"metile.Config candidates, got {kept!r}")
            kept = list(dict.fromkeys(kept))    # (a duplicate would be measured twice)
        model, top_k = self.prune.get("perf_model"), self.prune["top_k"]
        if model is not None:
            count = top_k if isinstance(top_k, int) else max(1, int(len(kept) * top_k))
            if len(kept) > count:
                estimate = {c: model(**named, **kwargs, **c.all_kwargs()) for c in kept}
                bad = {c: t for c, t in estimate.items()
                       if isinstance(t, bool) or not isinstance(t, numbers.Real)}
                if bad:
                    raise TypeError(f"{self.kernel.fn.__name__}: prune_configs_by's perf_model "
                                    f"must return a number (an estimated time), got "
                                    f"{next(iter(bad.values()))!r} for {next(iter(bad))}")
                kept = sorted(kept, key=lambda c: estimate[c])[:count]
        self._pruned[memo] = kept
        return kept

    @property
    def best_config(self) -> Config | None:
        """Triton's Autotuner.best_config: the winner of the last tuned call (None before)."""
        return None if self.last_result is None else self.last_result.config

    def __getitem__(self, grid):
        return _TunedLauncher(self, grid)

    def warmup(self, *args, grid, **kwargs) -> list:
        """Triton's Autotuner.warmup: every candidate prune_configs_by keeps, compiled for
        this call and neither run nor measured - a list of the prepared launches.  A
        candidate the tuning would skip as unusable (its ScheduleError, CompilationError or
        LaunchError) is left out; when none is left, the first one's error is raised."""
        return self[grid].warmup(*args, **kwargs)


def _grid_with(grid, options: dict, bound: dict):
    """A warmup candidate's grid callable: `grid` of the launch's arguments and the
    candidate's launch options."""
    return grid({**options, **bound})


class _TunedLauncher:
    def __init__(self, tuned: Autotuned, grid):
        self.tuned, self.grid = tuned, grid

    def _resolved(self, config: Config, args, kwargs, kept: bool = False):
        """(the kernel's launcher, its keywords) for `config` at this call.  `kept`: for a
        launch kept to be called again (warmup), a grid callable stays one, so a call with
        other arguments sizes the grid for them."""
        options = {**kwargs, **config.meta}
        if config.num_simdgroups is not None:
            options["num_simdgroups"] = config.num_simdgroups
        kernel = self.tuned.kernel
        complete = getattr(kernel, "complete", None)
        if complete is not None:   # metile.heuristics below: computed from this candidate
            options, kernel = complete(args, options), kernel.base
        grid = self.grid
        if callable(grid) and kept:
            # (the launch gives it the arguments by name; the candidate's launch options,
            # num_warps say, which are no arguments, are added as a tuned launch adds them)
            grid = functools.partial(_grid_with, grid, {k: v for k, v in options.items()
                                                        if k not in kernel.param_names})
        elif callable(grid):
            # with the kernel's defaults, as a plain launch's grid callable sees them
            bound = {**kernel.defaults, **dict(zip(kernel.param_names, args)), **options}
            grid = resolve_grid(grid, bound)
        return kernel[grid], options

    def _launch(self, config: Config, args, kwargs):
        try:
            launcher, options = self._resolved(config, args, kwargs)
            return launcher(*args, **options)
        except (ArgumentError, GridError) as e:
            # (Triton raises them too: a typo in a Config or in the grid callable is not a
            # candidate to skip - skipped, every candidate failed alike: "no usable candidate")
            raise type(e)(f"{e} (from autotune {config})") from e.__cause__

    def prepare(self, *args, **kwargs):
        """The winner's Dispatch for this call (the candidates are measured first unless
        the tuning cache holds the winner)."""
        def prepared(config):
            launcher, options = self._resolved(config, args, kwargs)
            return launcher.prepare(*args, **options)
        # (a cached winner that cannot compile this call failed explain() and prepare()
        # while the launch itself measured again)
        return self._with_winner(args, kwargs, prepared)

    def explain(self, *args, **kwargs) -> str:
        """The winner's plan and execution report (as `kernel[grid].explain`), with
        "autotune": the winner, whether it came from the tuning cache, each candidate's
        median seconds a launch and why the unusable ones were skipped."""
        import json
        report = json.loads(self.prepare(*args, **kwargs).explain())
        result = self.tuned.last_result
        report["autotune"] = {"winner": result.config.key(), "from_cache": result.from_cache,
                              "timings": result.timings, "unusable": result.unusable}
        return json.dumps(report, indent=2)

    def warmup(self, *args, **kwargs) -> list:
        """Autotuned.warmup for this launcher's grid."""
        refuse_dtype_placeholders(self.tuned.kernel, args, kwargs)
        prepared, refused = [], []
        for config in self._candidates(args, kwargs)[1]:
            try:
                launcher, options = self._resolved(config, args, kwargs, kept=True)
                prepared.append(launcher.prepare(*args, **options))
            except (ArgumentError, GridError) as e:
                raise type(e)(f"{e} (from autotune {config})") from e.__cause__
            except (ScheduleError, CompilationError, LaunchError) as e:
                refused.append(e)
        if not prepared:
            raise refused[0]
        return prepared

    def best(self, *args, **kwargs) -> Config:
        """The winning Config for these arguments (measured or from the tuning cache)."""
        parts, candidates = self._candidates(args, kwargs)
        try:
            result = tuning.autotune(
                candidates, lambda c: self._launch(c, args, kwargs), parts,
                warmup=self.tuned.num_warmups, reps=self.tuned.reps, validate=_outputs_close,
                unusable=(ScheduleError, CompilationError, LaunchError),
                fatal=(ArgumentError, GridError))
        except ValueError as e:
            # measuring runs the candidates: inside mx.compile / mx.vmap tracing MLX refuses
            # the evaluation with its own words, which name neither autotune nor the cure
            if "function transformations" not in str(e):
                raise
            named = {**dict(zip(self.tuned.kernel.param_names, args)), **kwargs}
            key = ", ".join(f"{k}={named[k]!r}" for k in self.tuned.key if k in named)
            raise LaunchError(
                f"autotuned kernel {self.tuned.kernel.fn.__name__!r} has no tuned winner for "
                f"this call{f' ({key})' if key else ''} and cannot measure its candidates "
                f"while mx.compile or mx.vmap traces it; call it once eagerly with arguments "
                f"of these shapes and dtypes first (the winner is kept in the tuning cache), "
                f"or launch a chosen Config without autotune inside the transformation") \
                from None
        self.tuned.last_result = result
        return result.config

    def _candidates(self, args, kwargs) -> tuple[dict, list]:
        """(the tuning key's parts, the candidates prune_configs_by keeps) for this call."""
        self._check_conflicts(kwargs)
        self._check_arguments(args, kwargs)
        if not callable(self.grid):
            resolve_grid(self.grid, {})   # (the call's mistake, not the first candidate's)
        kernel = self.tuned.kernel
        named = dict(zip(kernel.param_names, args))   # (Triton's named_args: the positional ones)
        bound = {**named, **{k: v for k, v in kwargs.items() if k in kernel.param_names}}
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
        return parts, self.tuned.pruned(parts, named, kwargs)

    def _check_arguments(self, args, kwargs) -> None:
        """The call against the kernel's signature before any candidate runs, as Python
        checks a call: every candidate failed on a missing argument (the grid callable's
        KeyError for it), which read as "no usable candidate".  A name some config or a
        heuristic sets is no missing argument of the call."""
        supplied = {k for c in self.tuned.configs for k in c.meta}
        layer = self.tuned.kernel
        if hasattr(layer, "computed"):        # metile.heuristics layers
            supplied |= layer.computed()
            layer = layer.base
        layer.check_call(args, kwargs, supplied)

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
        return self._with_winner(args, kwargs, lambda config: self._launch(config, args, kwargs))

    def _with_winner(self, args, kwargs, use):
        """use(the winning Config for this call)."""
        config = self.best(*args, **kwargs)
        try:
            return use(config)
        except (ArgumentError, GridError):
            raise
        except (ScheduleError, CompilationError, LaunchError) as e:
            result = self.tuned.last_result
            if result is None or not result.from_cache:
                raise
            # A winner kept from another call (or an edited entry) that cannot compile or
            # launch this one: measured again, as a damaged entry is, instead of failing
            # every launch until the file is deleted by hand
            warnings.warn(f"metile: the tuning cache's winner {config} for "
                          f"{self.tuned.kernel.fn.__name__} cannot run this call "
                          f"({type(e).__name__}: {str(e).splitlines()[0]}); measuring again")
            tuning.TuningCache().forget(result.key)
            return use(self.best(*args, **kwargs))


# Triton's autotune options metile does not take, and why
_REFUSED = {
    "pre_hook": "hooks run around each candidate to change its arrays; a metile launch never "
                "writes the caller's arrays, so there is nothing to reset or restore",
    "post_hook": "hooks run around each candidate to change its arrays; a metile launch never "
                 "writes the caller's arrays, so there is nothing to reset or restore",
    "do_bench": "metile times candidates itself (many launches a sync, alternating); its counts "
                "are warmup= and reps=",
    "rep": "Triton's rep is milliseconds of timing; metile's reps= counts timed rounds",
    "use_cuda_graph": "metile times candidates itself (many launches a sync, alternating)",
    "cache_results": "metile always keeps winners in its persistent tuning cache",
}


def autotune(configs, key=(), *, prune_configs_by=None, reset_to_zero=None,
             restore_value=None, warmup: int = 2, reps: int = 7, **triton_options):
    """Decorator over a @metile.kernel: launches use the fastest of `configs`."""
    for name in triton_options:
        if name in _REFUSED:
            raise TypeError(f"metile.autotune does not take {name}=: {_REFUSED[name]}")
        raise TypeError(f"metile.autotune() got an unexpected keyword argument {name!r}")
    for name, value, least in (("warmup", warmup, 0), ("reps", reps, 1)):
        # (reps=0 was taken here and failed at the first launch, in the statistics)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"metile.autotune {name} must be an int >= {least}, got {value!r}")
    _prune_options(prune_configs_by)   # (checked at the decorator, before any kernel)
    return lambda kernel: Autotuned(kernel, configs, key, warmup, reps, prune_configs_by,
                                    reset_to_zero, restore_value)
