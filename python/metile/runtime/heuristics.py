"""`@metile.heuristics(values={...})`: meta-parameters computed from a launch's arguments,
as Triton's `@triton.heuristics`.

    @metile.heuristics(values={"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
    @metile.kernel
    def matmul(A, B, C, M, N, K, BLOCK_K: metile.constexpr, EVEN_K: metile.constexpr): ...

Each function receives the call's arguments by name (positional and keyword, the kernel's
defaults filled, and the values computed before it) and returns the value of its
parameter, in the order given.  Under `@metile.autotune` (placed above, as in Triton) the
functions see each candidate's meta-parameters.  A parameter both computed and passed at
the call is an error, as autotune's are: the call would be silently overridden.
"""

from __future__ import annotations

from ..errors import LaunchError
from .compiled_view import refuse_dtype_placeholders
from .kernel import Kernel


class Heuristics:
    """A kernel whose listed meta-parameters are computed at each launch; every other
    attribute (param_names, fn, explain of its last launch, ...) is the kernel's."""

    def __init__(self, kernel, values: dict):
        if not isinstance(kernel, (Kernel, Heuristics)):
            raise TypeError("metile.heuristics decorates a @metile.kernel (put it above "
                            "@metile.kernel, below @metile.autotune)")
        if not isinstance(values, dict) or not values:
            raise TypeError(f"metile.heuristics needs values={{name: function of the "
                            f"arguments}}, got {values!r}")
        for name, fn in values.items():
            if not isinstance(name, str) or not callable(fn):
                raise TypeError(f"metile.heuristics values must map parameter names to "
                                f"functions of the arguments, got {name!r}: {fn!r}")
            if name not in kernel.param_names:
                raise ValueError(f"metile.heuristics: {kernel.fn.__name__} has no parameter "
                                 f"{name!r} (it has {', '.join(kernel.param_names)})")
        self.kernel, self.values = kernel, dict(values)

    @property
    def base(self) -> Kernel:
        """The @metile.kernel under every heuristics layer."""
        return self.kernel.base if isinstance(self.kernel, Heuristics) else self.kernel

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def computed(self) -> set:
        """The parameters this layer and the layers under it compute."""
        inner = self.kernel.computed() if isinstance(self.kernel, Heuristics) else set()
        return inner | set(self.values)

    def checked(self, args, kwargs: dict) -> dict:
        """complete() after the call is checked against the kernel's signature, so a missing
        or unexpected argument is an ArgumentError naming it, not a KeyError from inside a
        heuristic function that reads it."""
        self.base.check_call(args, kwargs, self.computed())
        return self.complete(args, kwargs)

    def complete(self, args, kwargs: dict) -> dict:
        """`kwargs` with each computed parameter added (inner layers first)."""
        if isinstance(self.kernel, Heuristics):
            kwargs = self.kernel.complete(args, kwargs)
        base = self.base
        if len(args) > len(base.param_names):
            raise LaunchError(f"{base.fn.__name__}() takes {len(base.param_names)} arguments, "
                              f"got {len(args)}")
        named = dict(zip(base.param_names, args))
        given = sorted(n for n in self.values if n in kwargs or n in named)
        if given:
            raise LaunchError(f"{base.fn.__name__}: {', '.join(given)} computed by "
                              f"metile.heuristics and also passed at the call; leave "
                              f"{'it' if len(given) == 1 else 'them'} out of the call")
        out = dict(kwargs)
        for name, fn in self.values.items():
            out[name] = fn({**base.defaults, **named, **out})
        return out

    def __getitem__(self, grid):
        return _Launcher(self, grid)

    def warmup(self, *args, grid, **kwargs):
        """Triton's `kernel.warmup(..., grid=grid)`: the prepared launch, not run."""
        refuse_dtype_placeholders(self.base, args, kwargs)
        return self[grid].prepare(*args, **kwargs)

    def __repr__(self):
        return f"metile.heuristics({sorted(self.values)}) over {self.kernel!r}"


class _Launcher:
    def __init__(self, heuristics: Heuristics, grid):
        self.heuristics, self.grid = heuristics, grid

    def __call__(self, *args, **kwargs):
        h = self.heuristics
        return h.base[self.grid](*args, **h.checked(args, kwargs))

    def prepare(self, *args, **kwargs):
        h = self.heuristics
        return h.base[self.grid].prepare(*args, **h.checked(args, kwargs))


def heuristics(values: dict):
    """Decorator over a @metile.kernel: `values` maps meta-parameter names to functions of
    the call's arguments (a dict by name), computed at every launch."""
    return lambda kernel: Heuristics(kernel, values)
