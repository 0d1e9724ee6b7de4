"""Launching a specialized kernel: `kernel[grid](...)` (Launcher, with a cache of
resolved launches keyed on the call's signature) and `Dispatch`, a launch with
everything resolved (specialization, coverage proof, variant, call arguments) that
enqueues the kernel again when called."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import warnings
from typing import TYPE_CHECKING

import mlx.core as mx

from ..compiler.backend import SELECTION_VARIABLES, device_type
from ..errors import CompilationError, GridError, LaunchError
from ..schedule import ExecutionReport, Schedule, SchedulePlan
from ..schedule.schedule import plain_number
from .. import _ext
from ..settings import raw_source, raw_values
from . import tensor_maps
from .compiled_view import CompiledKernelView
from .op_function import in_op_forward
from .arguments import arg_spec, check_buffer_sizes, int_scalar_dtype, scalar_array

if TYPE_CHECKING:
    from .kernel import Kernel


def resolve_grid(grid, bound: dict) -> tuple[int, int, int]:
    # (an error names the grid as given: the tuple made of a list showed [] as "got ()")
    given, returned = grid, callable(grid)
    if returned:
        try:
            grid = given = grid(bound)
        except Exception as e:
            raise GridError(f"the grid callable raised {type(e).__name__}: {e}; it receives a "
                            f"dict of the launch's arguments by name: "
                            f"{', '.join(map(repr, bound))}") from e
    try:
        if not isinstance(grid, (tuple, list, bool, float)) and hasattr(grid, "__index__"):
            grid = (operator.index(grid),)
        if isinstance(grid, (tuple, list)):
            # NumPy and other integer types are accepted as MLX accepts them.
            grid = tuple(operator.index(g) if not isinstance(g, (bool, float)) and
                         hasattr(g, "__index__") else g for g in grid)
    except TypeError:   # (an array of several elements: MLX's own message named no grid)
        raise _refused_grid(given, returned) from None
    if not isinstance(grid, (tuple, list)) or not 1 <= len(grid) <= 3 or \
            not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in grid):
        raise _refused_grid(given, returned)
    return tuple(grid) + (1,) * (3 - len(grid))


def _refused_grid(grid, returned: bool) -> GridError:
    return GridError(f"grid must be 1 to 3 non-negative ints (programs per axis), got "
                     f"{grid!r}{' (returned by the grid callable)' if returned else ''}")


# MLX's custom-kernel calls take the grid in threads as 32-bit ints; CUDA caps the
# y and z block counts at 65535.
_INT32_MAX = 2**31 - 1
_CUDA_GRID_YZ = 65535


def _check_grid_limits(grid, threads: int, backend: str) -> None:
    if grid[0] * threads > _INT32_MAX:
        raise LaunchError(f"grid {grid[0]} programs x {threads} threads = {grid[0] * threads} "
                          f"threads on axis 0 exceeds {_INT32_MAX} (the launch takes 32-bit thread "
                          f"counts); use fewer, larger programs (a bigger BLOCK) or a 2-D grid")
    for axis in (1, 2):
        if grid[axis] > _INT32_MAX:
            raise LaunchError(f"grid axis {axis} has {grid[axis]} programs, more than {_INT32_MAX}")
        if backend == "cuda" and grid[axis] > _CUDA_GRID_YZ:
            raise LaunchError(f"grid axis {axis} has {grid[axis]} programs; CUDA allows at most "
                              f"{_CUDA_GRID_YZ} on axes 1 and 2: put the large count on axis 0")


def _drop_launch_stages(kernel, kwargs: dict, schedule, error: CompilationError):
    """Triton's `num_stages=` launch option (or Config field) on a kernel with nothing to
    pipeline: Triton ignores it, so a Triton launch runs here too, with a warning saying
    why it is not honoured.  Re-raises `error` for anything else, including num_stages
    written into an explicit SCHEDULE (a requirement, refused as such)."""
    from_launch = "num_stages" in kwargs and "num_stages" not in kernel.param_names and \
        "SCHEDULE" not in kwargs
    # (bind() took a NumPy count as its int: the error names num_stages=3, not np.int64(3))
    stages = plain_number(kwargs["num_stages"]) if from_launch else None
    if not from_launch or f"num_stages={stages!r}" not in error.message:
        raise error
    if stages != 1:   # (one stage is no pipelining: met, nothing to say)
        warnings.warn(f"num_stages={stages!r} is not honoured for kernel "
                      f"{kernel.fn.__name__!r} and is ignored (as Triton ignores it where "
                      f"nothing is pipelined): {error.message}", stacklevel=4)
    rest = dataclasses.replace(schedule, num_stages=None)
    return None if rest == Schedule() else rest


def _scalar_input(value, name: str, kept: dict):
    """A runtime scalar's 0-d input array: the one a launch of the same family made for
    this value (`kept`, by name and value_key), else a new one."""
    if not isinstance(value, mx.array):
        a = kept.get((name, *value_key(value)))
        if a is not None:
            return a
    return scalar_array(value, name)


def _refuse_overruns(kernel, spec, outputs, out_arrays, runtime, grid, scalars) -> None:
    """A LaunchError where an access whose pattern the coverage analysis knows (the 1-D
    block, the 2-D tile, the mixed-radix form, one element) would reach past its buffer at
    these argument values - a bound `n` larger than the array, or no mask with a grid past
    its end: a store there wrote out of bounds (on the CPU runtime it corrupted the
    process's heap), a load read another buffer's bytes into the result."""
    def refuse(verb, name, last, size, first=0):
        ints = ", ".join(f"{k}={v}" for k, v in scalars.items() if type(v) is int)
        raise LaunchError(
            f"kernel {kernel.fn.__name__!r} would {verb} element {last} of {name!r}, which "
            f"has {size} elements: its {verb.split()[0]} reaches [{first}, {last + 1}) at "
            f"grid {tuple(grid)}"
            f"{f' and {ints}' if ints else ''}; pass bounds no larger than the array, a "
            f"smaller grid or a mask (or a larger array)")

    def before(verb, name, first, size):
        raise LaunchError(
            f"kernel {kernel.fn.__name__!r} would {verb} element {first} of {name!r} (which "
            f"has {size} elements), before its start: its offsets begin at {first} at grid "
            f"{tuple(grid)}; keep the offsets added to the pointer at 0 or more")

    def check(verb, name, rule, size):
        first = getattr(rule, "first_index", None)
        first = None if first is None else first(grid, scalars)
        if first is not None and first < 0:
            before(verb, name, first, size)
        last = rule.last_index(grid, scalars)
        if last is not None and last >= size:
            refuse(verb, name, last, size, first or 0)

    for name, out in zip(outputs, out_arrays):
        rule = spec.coverage.get(name)
        if rule is not None:
            check("store to", name, rule, out.size)
    for name, rules in spec.reads.items():
        size = getattr(runtime.get(name), "size", None)
        if size is None:
            continue
        for rule in rules:
            check("load from", name, rule, size)


def _host_value(value, name: str):
    """A scalar argument's Python value (a 0-d array's read on the host)."""
    if not isinstance(value, mx.array):
        return value
    try:
        return value.item()
    except Exception as e:   # e.g. an array being traced by mx.compile
        raise LaunchError(f"argument {name!r}: METILE_CUDA_SCALARS=value passes scalars as "
                          f"kernel parameters, so a 0-d array's value must be readable here "
                          f"({e}); pass a Python number, or leave METILE_CUDA_SCALARS unset") from None


def _check_aliasing(runtime: dict, outputs: list[str]) -> list:
    """The output arrays; a LaunchError if an input is an output or two outputs coincide."""
    out_arrays = [runtime[n] for n in outputs]
    for name, value in runtime.items():
        if name in outputs:
            continue
        for o, arr in zip(outputs, out_arrays):
            if value is arr:
                raise LaunchError(f"argument {name!r} is the same array as output {o!r}; "
                                  f"an input must not alias an output")
    for i, a in enumerate(out_arrays):
        for j in range(i):
            if out_arrays[j] is a:
                raise LaunchError(f"outputs {outputs[j]!r} and {outputs[i]!r} are the same array")
    return out_arrays


_LAUNCH_CACHE_SIZE = 256
_NOT_RUN = object()   # Dispatch._direct_call: the C++ binding did not run


def value_key(v) -> tuple:
    """(type, value) as a cache key holds a scalar: with its type (True == 1 and 1.0 == 1
    must not share an entry) and, for a float zero, its sign (-0.0 == 0.0, but a kernel
    dividing by one gives -inf where the other gives +inf)."""
    if type(v) is float and not v:
        return float, v, math.copysign(1.0, v)
    return type(v), v


def _launch_key(grid, args, kwargs):
    """What a repeated `kernel[grid](...)` call must share to reuse a resolved launch:
    the grid, each argument's type, dtype and shape (scalars by value: they take part
    in coverage proofs), the keyword options, and the launch environment (settings and
    device).  None when a call is not cacheable.  Every eager launch computes it, so it
    is written for speed: exact type tests before isinstance, shapes as MLX returns them
    (tuples), no generator expressions."""
    if callable(grid):
        return None
    parts = []
    for a in args:
        t = type(a)
        if t is mx.array:
            parts.append((a.dtype, a.shape))
        elif t is int or t is bool or (t is float and a):
            parts.append((t, a))
        elif isinstance(a, mx.array):
            parts.append((a.dtype, tuple(a.shape)))
        elif isinstance(a, (bool, int, float)):
            parts.append(value_key(a))
        elif a is None:   # (an optional pointer left out: a constexpr None)
            parts.append(None)
        else:
            return None
    # with types: True == 1 and 1.0 == 1 must not share an entry.  In call order, not
    # sorted: one call site passes its options in one order (another order is only
    # another entry), and sorting was a measurable part of an eager launch.
    options = tuple([(k, *value_key(v)) for k, v in kwargs.items()]) if kwargs else ()
    if options:
        try:
            hash(options)
        except TypeError:
            return None
    if type(grid) is tuple or type(grid) is list:
        grid_key = (tuple(grid), tuple(map(type, grid)))
    else:
        grid_key = (grid, type(grid))
    return (grid_key, tuple(parts), options, raw_values(_LAUNCH_VARIABLES), device_type())


def _family_key(kernel: "Kernel", grid, args, key):
    """What a call must share with a resolved launch to take its specialization with
    other shapes and scalar values (Dispatch._resized): the grid's rank, each array's
    dtype and rank, each scalar's type (an int's by the dtype it binds as), constexprs
    passed positionally by value, and its launch key's options and environment (`key`,
    the call's _launch_key).  None when a call has no family (a callable grid, another
    argument type); computed only after a launch-key miss."""
    if type(grid) is tuple:
        grid_key = len(grid)
    elif type(grid) is int:
        grid_key = 0
    else:
        return None
    consts = kernel.constexpr_names
    parts = []
    for name, a in zip(kernel.param_names, args):
        t = type(a)
        if name in consts:
            if t is mx.array:
                return None
            parts.append(value_key(a))
        elif t is mx.array:
            parts.append((a.dtype, a.ndim))
        elif t is int:
            parts.append((int, -2**31 <= a < 2**31 or int_scalar_dtype(name, a)))
        elif t is float or t is bool:
            parts.append(t)
        elif a is None:
            parts.append(None)
        else:
            return None
    return (grid_key, len(args), tuple(parts), *key[2:])


# What a resolved launch also depends on: the backend selection (compiler/backend.py,
# SELECTION_VARIABLES), METILE_DEBUG=asserts, how a precompiled kernel takes its scalars,
# which binding launches a cubin, and the CPU runtime's lane order and checks (a Dispatch
# keeps its bound call, with these read once: Dispatch._launch).
_LAUNCH_VARIABLES = (*SELECTION_VARIABLES, "METILE_DEBUG", "METILE_CUDA_SCALARS",
                     "METILE_CUDA_LAUNCH", "METILE_LANE_ORDER", "METILE_RACE_CHECK",
                     "METILE_MSL_BOUNDS_CHECK")


def launch_environment() -> tuple:
    """The raw values of the settings a resolved launch depends on, and the default
    device's type: a launch resolved for another language, target or device must not be
    reused after they change (MSL for the CPU runtime after mx.set_default_device(mx.gpu)
    on an NVIDIA machine), nor one resolved before METILE_DEBUG=asserts was set or
    cleared, nor one whose precompiled kernel takes its scalars the other way
    (METILE_CUDA_SCALARS) or through the other binding (METILE_CUDA_LAUNCH)."""
    return (*raw_values(_LAUNCH_VARIABLES), device_type())


class LaunchCache(dict):
    """A kernel's resolved launches by launch key; `last`: the one its most recent
    cached launch reused, whose LaunchGuard a repeated call tries before building a key;
    `families`: by _family_key, the latest launch of each family, whose specialization a
    call of new shapes or scalar values takes.  Clearing the cache (Kernel.refresh, a
    full cache, a test) forgets `last` and the families with it."""

    __slots__ = ("last", "families")

    def __init__(self):
        super().__init__()
        self.last = None
        self.families = {}

    def clear(self) -> None:
        super().clear()
        self.last = None
        self.families.clear()


def _make_guard(grid, args, kwargs, key, plan, out_positions):
    """The _ext.LaunchGuard of a launch resolved for `key`: it holds the key's environment
    values as read then, so a call it accepts is one _launch_key would give this key.
    None where the C++ check cannot read the environment as raw_values does."""
    source = raw_source(_LAUNCH_VARIABLES)
    guard = getattr(_ext, "LaunchGuard", None)
    if source is None or guard is None:
        return None
    environ, names = source
    return guard(grid, args, kwargs, environ, names, key[3], key[4],
                 [v for _, v in plan], out_positions)


def bounded_put(cache: dict, key, value, size: int) -> None:
    """cache[key] = value, the oldest entry going first when the cache holds `size` (a dict
    keeps insertion order).  Clearing a full cache whole cost ~0.7 ms every 256 new shapes
    of an eager loop over a growing launch cache, and forgot the families the next new
    shape resolves from."""
    if key not in cache and len(cache) >= size:
        del cache[next(iter(cache))]
    cache[key] = value


def remember(kernel: "Kernel", key, d: "Dispatch") -> None:
    """Keep `d` as the kernel's launch for `key` (a bounded cache)."""
    bounded_put(kernel._launches, key, d, _LAUNCH_CACHE_SIZE)


def _is_plain(grid) -> bool:
    """Whether a launch may read `grid` as it is: an int, a tuple of ints or a callable.
    A loop, not all() over a generator: every `kernel[grid]` runs it, and the generator
    cost a quarter of a microsecond of an eager launch's ~1.5 (eager_host_cost.py)."""
    t = type(grid)
    if t is tuple:
        for g in grid:
            if type(g) is not int:
                return False
        return True
    return t is int or callable(grid)


class Launcher:
    __slots__ = ("kernel", "grid", "_plain")

    def __init__(self, kernel: "Kernel", grid):
        self.kernel, self.grid = kernel, grid
        # ints (a tuple of them) and callables are read as they are; anything else (a list,
        # an mx.array or NumPy value, a tuple holding one) can change after this call, so
        # each launch reads its current value (a list changed in place, or an mx.array
        # incremented, ran the first grid again from the launch cache)
        self._plain = _is_plain(grid)

    def __call__(self, *args, **kwargs):
        # A repeated launch with the same signature reuses the resolved Dispatch
        # (binding, specialization, coverage proof) and only swaps the arrays: first the
        # one the last cached launch used, checked by its guard in one C++ call; else the
        # one the call's launch key finds.
        kernel = self.kernel
        try:
            kernel.refresh()
        except CompilationError as e:
            raise e.with_traceback(None) from None
        grid = self.grid if self._plain else resolve_grid(self.grid, {})
        launches = kernel._launches
        last = launches.last
        if last is not None:
            outs = last._guard.launch(grid, args, kwargs)
            if outs is not None:
                # (what kernel.explain() describes: the launch that ran, which a prepare()
                # or another signature's launch may have replaced there)
                kernel.last_dispatch = last
                return outs
            inputs = last._guard(grid, args, kwargs)
            if inputs is not None:
                kernel.last_dispatch = last
                return last._fast(inputs, args)
        key = None if kernel.differentiable else _launch_key(grid, args, kwargs)
        if key is not None:
            template = launches.get(key)
            if template is not None:
                if template._guard is not None:
                    launches.last = template
                kernel.last_dispatch = template
                return template._relaunch(args)
        d = None
        family = None if key is None else _family_key(kernel, grid, args, key)
        if family is not None:
            like = launches.families.get(family)
            if like is not None:
                d = like._resized(grid, args, kwargs, key)
        if d is None:
            try:
                d = self.prepare(*args, **kwargs)
            except Exception as e:
                # kernel.explain() must not go on describing an earlier, other launch
                kernel.last_dispatch, kernel.last_failure = None, e
                raise
        if d._key is not None:  # this call's key, when the launch can be reused
            remember(kernel, d._key, d)
            if d._guard is not None:
                launches.last = d
            if family is not None and d._family:
                # bounded as the launches are: a family per distinct constexpr held every
                # one's specialization and loaded kernel (~65 KB each, never freed)
                bounded_put(launches.families, family, d, _LAUNCH_CACHE_SIZE)
        try:
            return d()
        finally:
            d._release()

    def explain(self, *args, **kwargs) -> str:
        """`prepare(*args, **kwargs).explain()`: the plan and execution report of this
        launch as JSON without running it (e.g. with target="apple10" on any machine).
        `steps=True` is explain's own (each compile step with what it proved), unless the
        kernel has a parameter of that name."""
        steps = kwargs.pop("steps", False) if "steps" not in self.kernel.param_names else False
        return self.prepare(*args, **kwargs).explain(steps)

    def prepare(self, *args, **kwargs) -> "Dispatch":
        try:
            self.kernel.refresh()
            grid = self.grid if self._plain else resolve_grid(self.grid, {})
            return Dispatch(self.kernel, grid, args, kwargs)
        except CompilationError as e:
            raise e.with_traceback(None) from None  # hide compiler frames


class Dispatch(CompiledKernelView):
    """A launch with everything resolved; calling it enqueues the kernel again.  It is
    what `kernel.warmup(...)` returns, and answers Triton's CompiledKernel attributes
    (`asm`, `metadata`; compiled_view.py)."""

    def __init__(self, kernel: "Kernel", grid, args, kwargs, like: "Dispatch | None" = None):
        runtime, consts, threads, schedule, backend, debug = kernel.bind(args, kwargs)
        if like is not None:
            like._check_same(runtime, consts, threads)
        try:
            spec, specs = kernel.specialize(runtime, consts, threads, schedule, backend, debug)
        except CompilationError as e:
            schedule = _drop_launch_stages(kernel, kwargs, schedule, e)
            spec, specs = kernel.specialize(runtime, consts, threads, schedule, backend, debug)
        self.grid_arg, self.specs = grid, specs
        grid = resolve_grid(grid, {**runtime, **consts})
        self.kernel, self.spec = kernel, spec
        # The call's keyword constexprs and launch options (SCHEDULE, target=, backend=,
        # num_warps, ...): a call of this launch with new arrays keeps them unless it
        # passes its own (without them it ran a different plan than explain() reported).
        self._held = {k: v for k, v in kwargs.items()
                      if k not in kernel.param_names or k in kernel.constexpr_names}
        self.unlowered = spec.unlowered
        if self.unlowered is not None:
            # Planned for a backend metile does not lower yet (an M5 tensor_ops plan):
            # the plan and a plan-only report can be inspected; calling it refuses.
            self.variant, self._key, self._input_plan = None, None, None
            self._guard = self._direct = None
            self._family = None
            kernel.last_dispatch = self
            return
        self._set_launch(runtime, grid, args, kwargs, None, None)
        # the runtime values not passed positionally (keyword scalars, defaults), which
        # a call of the same family passes alike (its arrays are all positional)
        passed = set(kernel.param_names[:len(args)])
        self._rest = {n: v for n, v in runtime.items() if n not in passed} \
            if self._family else None

    def _set_launch(self, runtime: dict, grid: tuple, args, kwargs, key, like) -> None:
        """Everything of a launch that depends on its argument values for an already chosen
        specialization: coverage proof and variant, buffer-size check, scalar inputs,
        output shapes, launch key and guard.  `key`: the call's launch key where the
        caller has it; `like`: a launch of the same family whose scalar arrays of equal
        value are reused."""
        kernel, spec, specs = self.kernel, self.spec, self.specs
        outputs = spec.outputs
        for name in outputs:
            if specs[name][0] != "buffer":
                raise LaunchError(f"argument {name!r} is stored to by the kernel, so it must be "
                                  f"an mx.array with at least one dimension")
        out_arrays = _check_aliasing(runtime, outputs)
        scalars = {n: v for n, v in runtime.items() if specs[n][0] == "scalar"}
        # atomic_add outputs start at zero and are added to the passed arrays afterwards
        # (_finish), so they need no coverage proof or written mask
        proven = tuple(
            n in spec.atomic_outputs or
            (n in spec.coverage and spec.coverage[n].covers(grid, runtime[n].size, scalars))
            for n in outputs)
        self.empty = grid[0] * grid[1] * grid[2] == 0 or any(a.size == 0 for a in out_arrays)
        if not self.empty:   # (an empty launch runs nothing)
            _refuse_overruns(kernel, spec, outputs, out_arrays, runtime, grid, scalars)
        self.variant = spec.variant(proven)
        d = self.variant.compiled
        check_buffer_sizes(kernel.fn.__name__, runtime,
                           self.variant.data["lowering"].get("wide_offsets"))
        self.outputs = out_arrays
        # Scalars are part of the launch key by value, so a relaunch can reuse their
        # 0-d arrays instead of building them again (arguments.scalar_array).
        launch = d.lowering.get("launch") or {}
        maps = launch.get("tensor_maps")
        # (the driver encodes the templates: only where the kernel can run)
        kept = {} if like is None else like._scalar_arrays
        self.inputs = [tensor_maps.templates(maps, spec.backend.native) if role == "tensor_maps"
                       else _scalar_input(runtime[name], name, kept) for role, name in d.input_roles]
        # reused as they are by a relaunch: scalars' arrays and the tensor-map templates
        self._fixed_inputs = {i: a for i, ((role, name), a) in enumerate(zip(d.input_roles,
                                                                              self.inputs))
                               if role == "tensor_maps" or not isinstance(runtime[name], mx.array)}
        self.tracked = [outputs.index(n) for n in d.tracked]
        self.atomic = [outputs.index(n) for n in spec.atomic_outputs]
        T = spec.threads
        _check_grid_limits(grid, T, spec.backend.language)
        self.call_kwargs = dict(
            inputs=self.inputs, grid=(grid[0] * T, grid[1], grid[2]), threadgroup=(T, 1, 1),
            output_shapes=[a.shape for a in out_arrays] + [out_arrays[i].shape for i in self.tracked],
            output_dtypes=[a.dtype for a in out_arrays] + [mx.bool_ for _ in self.tracked],
            init_value=0 if self.tracked or self.atomic else None)
        if spec.backend.language == "msl" and spec.analysis.order_dependent:
            # the CPU runtime's race check compares thread orders: tell it which outputs
            # legitimately depend on them (it raised on float atomics and handed-out old
            # values, and advised an order_dependent_outputs= that a launch cannot take)
            self.call_kwargs["order_dependent_outputs"] = dict(spec.analysis.order_dependent)
        # what the caller sees of the kernel's outputs (not the tensor maps' scratch)
        self.results = len(out_arrays) + len(self.tracked)
        if maps:
            self.call_kwargs["output_shapes"].append(tensor_maps.slots_shape(maps, grid))
            self.call_kwargs["output_dtypes"].append(mx.uint8)
        by_value = launch.get("scalars_by_value")
        reusable = True
        if by_value:
            # passed as kernel parameters (METILE_CUDA_SCALARS=value): their Python values;
            # a 0-d array's is read on the host, so such a launch is not reused by key
            names = [name for (_, name), sig in zip(d.input_roles, d.inputs) if sig in by_value]
            reusable = not any(isinstance(runtime[n], mx.array) for n in names)
            self.call_kwargs["scalars"] = [_host_value(runtime[n], n) for n in names]
        self.single = len(out_arrays) == 1
        # outputs as the kernel returns them: no merge with the passed arrays, no sum
        self._plain = not self.tracked and not self.atomic and self.results > 0
        self.scalars = scalars
        self.autodiff = None
        self._guarded = None
        self._released = False
        # the launcher's C++ binding call (CudaKernel.bind, MetalKernel.bind), once bound
        self._direct, self._bound = None, {}
        if kernel.differentiable and not self.empty:
            self.autodiff = self._differentiable(runtime, outputs)
        # Calling this launch again with arguments of the same signature (this key) swaps
        # the arrays only: _relaunch takes them positionally.
        passed = set(kernel.param_names[:len(args)])
        positional = all(name in passed for role, name in d.input_roles if role == "in") and \
            all(name in passed for name in outputs)
        self._key = None if kernel.differentiable or not positional or not reusable else \
            (key or _launch_key(self.grid_arg, args, kwargs))
        # Where a relaunch finds its arrays among the positional arguments: each output's
        # position, and per kernel input its position or the array kept from this launch.
        where = {name: i for i, name in enumerate(kernel.param_names[:len(args)])}
        self._input_plan = None
        if positional and all(i in self._fixed_inputs or name in where
                              for i, (_, name) in enumerate(d.input_roles)):
            self._out_positions = [where[n] for n in outputs]
            self._others = [i for i in range(len(args)) if i not in self._out_positions]
            self._input_plan = [(True, self._fixed_inputs[i]) if i in self._fixed_inputs
                                else (False, where[name])
                                for i, (_, name) in enumerate(d.input_roles)]
        else:
            self._key = None   # a relaunch takes every array positionally
        self._guard = None if self._key is None else _make_guard(
            self.grid_arg, args, kwargs, self._key, self._input_plan, self._out_positions)
        # scalar values -> their 0-d input arrays, for a launch of the same family
        self._scalar_arrays = {(name, *value_key(runtime[name])): self.inputs[i]
                               for i, (role, name) in enumerate(d.input_roles)
                               if i in self._fixed_inputs and role != "tensor_maps"}
        # new argument values of this signature's family may take this specialization
        # (no tensor maps: their templates are encoded for one launch's shapes; no
        # int-specialized schedule: its proofs hold for one launch's values)
        self._family = self._key is not None and not maps and not spec.int_values
        kernel.last_dispatch = self

    def _resized(self, grid, args, kwargs, key) -> "Dispatch":
        """This launch's specialization for a call of its family (_family_key: the same
        dtypes, ranks, constexprs and options) with other shapes or scalar values: only
        what depends on the values is resolved again (_set_launch).  Binding and
        specializing cost most of a new signature's launch (~130 us of ~290 on a 2-core
        CPU for attention's decode kernel), and an eager decoding loop meets a new
        signature every token (its cache grows).  What a full resolution refuses for these
        values (an aliased output, a buffer past the kernel's offsets, a grid past the
        limits) is refused here too."""
        kernel = self.kernel
        names, consts = kernel.param_names, kernel.constexpr_names
        runtime = dict(self._rest)
        for name, value in zip(names, args):
            if value is not None and name not in consts:
                runtime[name] = value
        d = Dispatch.__new__(Dispatch)
        d.kernel, d.spec, d.specs, d.grid_arg = kernel, self.spec, self.specs, grid
        d._held, d.unlowered, d._rest = self._held, None, self._rest
        try:
            d._set_launch(runtime, resolve_grid(grid, {}), args, kwargs, key, self)
        except CompilationError as e:
            raise e.with_traceback(None) from None
        return d

    def _release(self) -> None:
        """Let go of the arrays of the call this launch was resolved for, once it has run.
        A launch kept for reuse (the kernel's launch cache, `last_dispatch`) takes each
        later call's arrays; holding the first call's kept them alive as long as the kernel
        (a model's activations, one set per launch signature).  The scalars' 0-d arrays and
        the tensor-map templates stay: relaunches reuse them."""
        if self.unlowered is not None or self._released:
            return
        self.inputs = [a if i in self._fixed_inputs else None for i, a in enumerate(self.inputs)]
        self.call_kwargs["inputs"] = self.inputs
        self.outputs, self.autodiff, self._released = None, None, True

    def _check_same(self, runtime: dict, consts: dict, threads) -> None:
        for name, value in runtime.items():
            kind, d, ndim = arg_spec(name, value)
            pk, pd, pn = self.specs[name]
            if (kind, d) != (pk, pd):
                raise LaunchError(f"argument {name!r}: prepared for a {pd} {pk}, got a {d} {kind}")
            if ndim != pn:
                raise LaunchError(f"argument {name!r}: prepared for rank {pn}, got rank {ndim}")
        if consts != self.spec.constexprs:
            raise LaunchError("constexpr arguments differ from the prepared launch; prepare again")
        if threads != self.spec.threads_req:
            # (the constexprs' message named the wrong thing for a new num_warps)
            lanes = "the kernel's default" if self.spec.threads_req is None else \
                f"{self.spec.threads_req // 32} warps"
            got = "the kernel's default" if threads is None else f"{threads // 32} warps"
            raise LaunchError(f"num_warps/num_simdgroups differ from the prepared launch ({lanes}, "
                              f"got {got}); prepare again (kernel[grid](...) resolves a new "
                              f"launch by itself)")

    def _loaded_buffers(self, outputs: list[str]) -> tuple[list[str], list[int]]:
        """(names, input positions) of the buffers the kernel reads and does not write: the
        arrays a differentiable launch takes as its primals."""
        roles = self.variant.compiled.input_roles
        loaded = [name for role, name in roles if role == "in"
                  and self.specs[name][0] == "buffer" and name not in outputs]
        return loaded, [i for i, (_, name) in enumerate(roles) if name in loaded]

    def _differentiable(self, runtime: dict, outputs: list[str]):
        """The launch wrapped in mx.custom_function with the expression vjp."""
        from . import autodiff

        fn = self.spec.tile_ir()
        if fn.meta.get("fragments"):
            return self._differentiable_fragments(fn, runtime, outputs)
        autodiff.check_pointwise(fn)
        n = min(a.size for a in self.outputs)
        loaded_by_kernel = autodiff.loaded_buffers(fn)
        read_back = [name for name in outputs if name in loaded_by_kernel]
        if read_back:
            raise CompilationError(f"differentiable=True does not take an output the kernel "
                                   f"also loads ({', '.join(map(repr, read_back))}: a "
                                   f"read-modify-write); pass its old values as an input "
                                   f"of their own", self.kernel.loc)
        if self.tracked or any(a.size != n for a in self.outputs):
            twice = autodiff.stored_twice(fn)
            # (two stores to one output were reported as a launch not covering it)
            why = (f"{', '.join(map(repr, twice))} is stored more than once; each output takes "
                   f"one store" if twice else
                   "grid * BLOCK and n covering the outputs, all of one size")
            raise CompilationError(f"differentiable=True needs launches that write every output "
                                   f"element exactly once ({why})", self.kernel.loc)
        loaded, positions = self._loaded_buffers(outputs)
        call, kwargs = self.variant.callable(), self.call_kwargs
        # this call's inputs, held by the graph's custom function for its vjp (the
        # Dispatch lets go of its own after the launch: _release)
        given = list(kwargs["inputs"])

        def launch(*arrays):
            inputs = list(given)
            for i, a in zip(positions, arrays):
                inputs[i] = a
            return call(**{**kwargs, "inputs": inputs})[:len(outputs)]

        forward = autodiff.differentiable_launch(fn, launch, loaded, outputs, self.scalars, n)
        return lambda: forward(*[runtime[name] for name in loaded])

    def _differentiable_fragments(self, fn, runtime: dict, outputs: list[str]):
        """simdgroup_inline kernels: a pointwise epilogue of device tiles (autodiff.py)."""
        from . import autodiff

        autodiff.check_fragment_pointwise(fn)
        loaded, positions = self._loaded_buffers(outputs)
        call, kwargs, passed = self.variant.callable(), self.call_kwargs, list(self.outputs)
        tracked, k = self.tracked, len(outputs)
        given = list(kwargs["inputs"])   # (as in _differentiable)

        def launch(*arrays):
            inputs = list(given)
            for i, a in zip(positions, arrays):
                inputs[i] = a
            kept = arrays[len(loaded):]   # the passed outputs: primals, for their gradient
            outs = list(call(**{**kwargs, "inputs": inputs}))
            written = [mx.ones(a.shape, mx.float32) for a in kept]
            for j, i in enumerate(tracked):
                written[i] = outs[k + j].astype(mx.float32)
                outs[i] = mx.where(outs[k + j], outs[i], kept[i])
            return outs[:k], written

        forward = autodiff.fragment_differentiable_launch(fn, launch, loaded, outputs,
                                                          self.scalars)
        return lambda: forward(*[runtime[name] for name in loaded], *passed)

    def _relaunch(self, args, trusted: bool = False):
        """This launch with new arrays of the same signature (see Launcher.__call__).
        `trusted`: the caller (metile.ops) passes freshly allocated outputs and gives the
        launch its own vjp, so the aliasing check and the no-vjp guard are skipped (about a
        quarter of an eager op's host time on the CPU)."""
        self._refuse_unlowered()
        if self._input_plan is None:
            raise LaunchError(f"kernel {self.kernel.fn.__name__!r}: this launch was prepared "
                              "with arrays passed by keyword; a relaunch takes them positionally")
        outputs = [args[i] for i in self._out_positions]
        if not trusted and self._aliased(args, outputs):
            # the full check raises, naming the arguments
            _check_aliasing(dict(zip(self.kernel.param_names, args)), self.spec.outputs)
        if self.empty:
            return outputs[0] if self.single else tuple(outputs)
        inputs = [v if fixed else args[v] for fixed, v in self._input_plan]
        done = self._direct_call(inputs, args)
        if done is not _NOT_RUN:
            return done
        return self._finish(self._launch(inputs, guard=not trusted), outputs)

    def _fast(self, inputs, args):
        """This launch on `inputs`, which its guard assembled from `args` (a call of this
        launch's signature whose outputs alias nothing): the binding call straight away
        once there is one, else _relaunch."""
        done = self._direct_call(inputs, args)
        return self._relaunch(args) if done is _NOT_RUN else done

    def _direct_call(self, inputs, args):
        """The result of the binding bound in C++ (`_direct`) called on `inputs`, or
        _NOT_RUN before there is one or when it declines (off its device)."""
        direct = self._direct
        if direct is None:
            return _NOT_RUN
        outs = direct(inputs)
        if outs is None:
            return _NOT_RUN
        if self._plain:
            return outs[0] if self.single else tuple(outs[:self.results])
        return self._finish(outs[:self.results], [args[i] for i in self._out_positions])

    def _refuse_unlowered(self) -> None:
        """A launch planned for a backend metile does not lower yet cannot run."""
        if self.unlowered is not None:
            raise CompilationError(f"kernel {self.kernel.fn.__name__!r}: {self.unlowered}",
                                   self.kernel.loc)

    def _aliased(self, args, outputs) -> bool:
        """Whether an argument is one of the outputs, or two outputs are one array."""
        for i in self._others:
            a = args[i]
            for o in outputs:
                if a is o:
                    return True
        return len(outputs) > 1 and len({id(o) for o in outputs}) < len(outputs)

    def _launch(self, inputs, guard: bool = True):
        """Enqueue the kernel on `inputs`.  A gradient reaching the launch must say how to
        get one (MLX's own message for a primitive without a vjp is "[Primitive::vjp] Not
        implemented"): the primitives metile owns raise that LaunchError themselves; MLX's
        (Metal, MLX-compiled CUDA) are wrapped (`guard`) in an mx.custom_function whose vjp
        raises it."""
        if self._guarded is None:
            backend = self.spec.backend
            if not backend.native:
                runs_on = ("MLX's CUDA backend" if backend.language == "cuda" else
                           "Metal or the CPU (metile's MSL CPU runtime)")
                raise LaunchError(
                    f"kernel {self.kernel.fn.__name__!r} was compiled to "
                    f"{'CUDA' if backend.language == 'cuda' else 'MSL'} (backend="
                    f"{backend.language!r}, METILE_BACKEND={backend.language}, or a target= / "
                    f"METILE_TARGET of that language such as {backend.target.name!r}), which "
                    f"runs only on {runs_on}; the default device is {backend.device_label}. "
                    f"Leave the backend and target to the device to run it here (a prepared "
                    f"launch's .source still shows the code)")
            call, name = self.variant.callable(), self.kernel.fn.__name__
            message = (f"kernel {name!r} has no vjp, so mx.grad/mx.vjp cannot differentiate "
                       f"through it: declare a pointwise kernel @metile.kernel(differentiable="
                       f"True), or wrap the launch in mx.custom_function and give it a vjp")
            # A primitive metile owns (the CPU runtime's, its CUDA launch) refuses a gradient
            # itself with this message, so it needs no mx.custom_function around each launch.
            owns = getattr(call, "owns_primitive", None)
            own = owns is not None and owns(**self.call_kwargs)
            # (without this call's arrays: the closure below outlives them, _release)
            kwargs = {k: v for k, v in self.call_kwargs.items() if k != "inputs"}
            found = self._bound   # (not self: the closure would make a reference cycle)

            def binding(kw, keep_direct: bool):
                bound = None   # not tried yet; False: the launcher cannot bind this launch

                def run(inputs):
                    # The first launch binds: a launcher that can (CudaKernel.bind,
                    # MetalKernel.bind on the CPU runtime) makes its binding call with this
                    # launch's fixed arguments, running the checks of a full call once, and
                    # the launch runs through it, as do the relaunches (same dtypes and
                    # shapes; the settings it read are in the launch key).  Its `direct`, a
                    # C++ call answering None off its device, serves _fast.  A launcher
                    # without one (Metal) takes the full call each time.  (The first launch
                    # made the full call and then bound: every check twice, ~35 us each for
                    # a launch of a new shape on a 2-core CPU.)
                    nonlocal bound
                    if bound is None:
                        bind = getattr(call, "bind", None)
                        bound = (bind(**kw, inputs=inputs) if bind is not None else None) or False
                        if keep_direct and bound:
                            found["direct"] = getattr(bound, "direct", None)
                    if bound:
                        return bound(inputs)
                    return call(**kw, inputs=inputs)
                return run

            run = binding({**kwargs, "no_vjp": message} if own else kwargs, own)
            self._guarded = self._unguarded = self._in_op = run
            node = getattr(call, "refusal_node", None)
            if own and node is not None and node(**self.call_kwargs):
                # (MLX's own launch primitive refuses under a custom vjp: a node of its own,
                # which inside an op's forward kept the op from being one MetileOp)
                self._in_op = binding(kwargs, False)
            if not own:
                @mx.custom_function
                def launch(inputs):
                    return run(inputs)

                @launch.vjp
                def no_vjp(primals, cotangents, outputs):
                    raise LaunchError(message)

                self._guarded = launch
        if in_op_forward():
            outs = list(self._in_op(inputs))[:self.results]
        else:
            outs = list((self._guarded if guard else self._unguarded)(inputs))[:self.results]
        if self._direct is None and self._bound:
            self._direct = self._bound.get("direct")
            if self._direct is not None and self._plain and self._guard is not None:
                # the guard then runs a repeated call of this signature by itself
                self._guard.set_launch(self._direct, self.results)
        return outs

    def _finish(self, outs, passed):
        """Merge preserve-masked outputs with the passed arrays, add atomic_add outputs to
        them; one array or a tuple."""
        for i in self.atomic:
            outs[i] = passed[i] + outs[i]
        if self.tracked:
            n = len(passed)
            for k, i in enumerate(self.tracked):
                outs[i] = mx.where(outs[n + k], outs[i], passed[i])
            outs = outs[:n]
        if not outs:
            return None
        return outs[0] if self.single else tuple(outs)

    def __call__(self, *args, **kwargs):
        """Relaunch; with arguments, rebinds them (same dtypes, ranks and constexprs; the
        keyword constexprs and launch options of the call this launch was made for apply
        unless the call passes its own)."""
        self._refuse_unlowered()
        if args or kwargs:
            if self._held:
                positional = self.kernel.param_names[:len(args)]
                kwargs = {**{k: v for k, v in self._held.items() if k not in positional},
                          **kwargs}
            if self._guard is not None:
                outs = self._guard.launch(self.grid_arg, args, kwargs)
                if outs is not None:
                    self.kernel.last_dispatch = self
                    return outs
                inputs = self._guard(self.grid_arg, args, kwargs)
                if inputs is not None:
                    self.kernel.last_dispatch = self
                    return self._fast(inputs, args)
            # (the guard also refuses an aliased output: the relaunch's check names it)
            if self._key is not None and _launch_key(self.grid_arg, args, kwargs) == self._key:
                self.kernel.last_dispatch = self
                return self._relaunch(args)
            try:
                d = Dispatch(self.kernel, self.grid_arg, args, kwargs, like=self)
            except CompilationError as e:
                raise e.with_traceback(None) from None
            try:
                return d()
            finally:
                d._release()   # (it stays the kernel's last_dispatch)
        if self._released:
            raise LaunchError(f"kernel {self.kernel.fn.__name__!r}: this launch has run and let "
                              "go of its arrays (kept launches do not keep them alive); call "
                              "it with arrays, or prepare it again (kernel[grid].prepare(...))")
        if self.empty:
            outs = list(self.outputs)
        elif self.autodiff is not None:
            outs = list(self.autodiff())
        else:
            return self._finish(self._launch(self.inputs), self.outputs)
        if not outs:
            return None
        return outs[0] if self.single else tuple(outs)

    @property
    def source(self) -> str:
        if self.unlowered is not None:
            raise CompilationError(f"kernel {self.kernel.fn.__name__!r} has no source: "
                                   f"{self.unlowered}", self.kernel.loc)
        return self.variant.compiled.source

    @property
    def schedule_plan(self) -> SchedulePlan:
        """The immutable pre-lowering decisions for this launch, with their reasons."""
        return self.spec.plan

    @property
    def execution_report(self) -> ExecutionReport:
        """What lowering materialized: plan, passes, loops, allocations, epilogues (for a
        plan whose backend is not lowered yet, the plan-only report saying so)."""
        if self.unlowered is not None:
            return self.spec.plan_only_report()
        return self.variant.compiled.report

    def explain(self, steps: bool = False) -> str:
        """The execution report as formatted JSON (the recorded format; its `passes`
        are the compile steps that ran).  `steps=True` adds "steps": each step with
        what it proved or produced."""
        if not isinstance(steps, bool):    # ("yes" or "no" would both read as true)
            raise TypeError(f"explain(steps=) takes True or False, got {steps!r}")
        report = self.execution_report.to_dict()
        if steps and self.unlowered is not None:
            details = self.spec.analysis.details
            report["steps"] = [{"step": s, **({"detail": details[s]} if s in details else {})}
                               for s in self.spec.analysis.steps]
        elif steps:
            report["steps"] = self.variant.compiled.step_log()
        return json.dumps(report, indent=2)
