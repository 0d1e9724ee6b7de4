"""@metile.kernel objects: specialization, compile caches and launches.

    @metile.kernel
    def add(X, Y, Z, n, BLOCK: metile.constexpr):
        ...
    z = add[(metile.cdiv(n, 256),)](x, y, z, n, BLOCK=256)      # lazy mx.array
    dispatch = add[grid].prepare(x, y, z, n, BLOCK=256)         # bind once
    z = dispatch()                                              # minimal-overhead relaunch

Launch contract.  `grid` counts programs (threadgroups), 1-3 ints or a
callable of the bound arguments.  mx.array arguments are buffers; Python
int/float/bool (and 0-d arrays) are runtime scalars; constexpr parameters
specialize.  Buffers the kernel stores to are outputs: the launch returns
their new contents (one array, or a tuple in parameter order), with the shape
and dtype of the array passed.  Elements the kernel does not write keep the
passed array's values: unless `passes.buffer_usage` proves every element is
written, the kernel also records which elements it wrote and the result is
`where(written, new, passed)`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from typing import TYPE_CHECKING

import mlx.core as mx

from .. import settings
from ..compiler import pipeline
from ..compiler.backend import Backend, resolve_backend
from ..compiler.debug_support import warn_unchecked_asserts
from ..errors import ArgumentError, CompilationError, LaunchError
from ..frontend import constexpr_params
from ..language.core import constexpr
from ..frontend import source
from ..ir.core import Loc
from ..ir.ops import TMA_SLOTS, TMA_TEMPLATE
from ..schedule import Schedule
from ..schedule.schedule import plain_number
from . import cache
from .arguments import arg_spec
from .compiled_view import refuse_dtype_placeholders
from .dependencies import Snapshot
from .dispatch import LaunchCache, Launcher, bounded_put, value_key
from .metal_kernel import RESERVED_NAMES

if TYPE_CHECKING:
    from .dispatch import Dispatch

# The kernel-input attributes of MSL: MLX's metal_kernel declares one as a parameter of
# the signature when the body names it, so a kernel parameter of that name was a
# redefinition in the generated signature.
METAL_ATTRIBUTES = frozenset({
    "dispatch_quadgroups_per_threadgroup", "dispatch_simdgroups_per_threadgroup",
    "dispatch_threads_per_threadgroup", "grid_origin", "grid_size",
    "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup", "thread_execution_width",
    "thread_index_in_quadgroup", "thread_index_in_simdgroup", "thread_index_in_threadgroup",
    "thread_position_in_grid", "thread_position_in_threadgroup",
    "threadgroup_position_in_grid", "threadgroups_per_grid", "threads_per_grid",
    "threads_per_simdgroup", "threads_per_threadgroup"})

# Macros the generated source sees (C's math, float, limits, stddef and errno headers,
# MSL's constants, CUDA's): a parameter of that name was expanded by the preprocessor and
# failed in the C++ compiler, far from its cause (a hostile trial: `NAN`, `errno`, `NULL`).
C_MACROS = frozenset("""
    NAN INFINITY HUGE_VAL HUGE_VALF HUGE_VALL FP_NAN FP_INFINITE FP_ZERO FP_SUBNORMAL FP_NORMAL
    FLT_MAX FLT_MIN FLT_EPSILON FLT_DIG FLT_MANT_DIG FLT_RADIX FLT_TRUE_MIN FLT_MAX_EXP
    FLT_MIN_EXP DBL_MAX DBL_MIN DBL_EPSILON DBL_DIG DBL_MANT_DIG HALF_MAX HALF_MIN HALF_EPSILON
    CHAR_BIT CHAR_MAX CHAR_MIN SCHAR_MAX SCHAR_MIN UCHAR_MAX SHRT_MAX SHRT_MIN USHRT_MAX
    INT_MAX INT_MIN UINT_MAX LONG_MAX LONG_MIN ULONG_MAX LLONG_MAX LLONG_MIN ULLONG_MAX
    INT8_MAX INT8_MIN INT16_MAX INT16_MIN INT32_MAX INT32_MIN INT64_MAX INT64_MIN UINT8_MAX
    UINT16_MAX UINT32_MAX UINT64_MAX SIZE_MAX PTRDIFF_MAX PTRDIFF_MIN INTPTR_MAX UINTPTR_MAX
    NULL EOF errno assert offsetof EDOM ERANGE EINVAL MAXFLOAT
    M_E M_LOG2E M_LOG10E M_LN2 M_LN10 M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI M_2_SQRTPI M_SQRT2
    M_SQRT1_2 M_E_F M_LOG2E_F M_LOG10E_F M_LN2_F M_LN10_F M_PI_F M_PI_2_F M_PI_4_F M_1_PI_F
    M_2_PI_F M_2_SQRTPI_F M_SQRT2_F M_SQRT1_2_F
    CUDART_INF_F CUDART_NAN_F CUDART_PI_F CUDA_VERSION CUDART_VERSION
    """.split())
# CUDA's built-in variables and the functions the emitters call unqualified (a parameter
# of that name shadows them: `as_type` where the kernel bitcasts)
BUILTIN_NAMES = frozenset("""
    threadIdx blockIdx blockDim gridDim warpSize as_type
    """.split())
# MSL's and CUDA's vector and matrix types: float2, uint3, half4, float4x4, ushort2, ...
_VECTOR_TYPE = re.compile(r"(u?(char|short|int|long|longlong)|half|float|double|bfloat|bool)"
                          r"[1-4](x[1-4])?")

# Generated argument names avoid MSL/C++ keywords, macros, built-in names and the shim's
# type names; a Python parameter that collides is renamed (arg_<name>), never refused.
RESERVED = frozenset(RESERVED_NAMES | C_MACROS | BUILTIN_NAMES | {
    "half", "float", "int", "uint", "bool", "char", "short", "long", "void", "bfloat",
    "bfloat16_t", "float16_t", "vec", "main", TMA_TEMPLATE, TMA_SLOTS} | METAL_ATTRIBUTES)


class _Reserved(frozenset):
    """RESERVED, and every name of a vector or matrix type."""

    def __contains__(self, name) -> bool:
        return frozenset.__contains__(self, name) or \
            (isinstance(name, str) and _VECTOR_TYPE.fullmatch(name) is not None)


RESERVED = _Reserved(RESERVED)


# Specializations a kernel keeps in memory (Kernel.specialize), as many as its launches.
SPECIALIZATION_CACHE_SIZE = 256


class Variant:
    """One generated kernel (compiler.pipeline.CompiledKernel) and its callable."""

    def __init__(self, compiled: pipeline.CompiledKernel, backend: Backend):
        self.compiled = compiled
        self.backend_record = backend
        self._callable = None
        self._data = None

    @property
    def backend(self) -> str:
        return self.backend_record.language

    @property
    def data(self) -> dict:
        """The compiled kernel in its serialized form (as cached on disk), for inspection."""
        if self._data is None:
            self._data = self.compiled.to_json()
        return self._data

    def callable(self):
        if self._callable is None:
            c = self.compiled
            # Kernels that lay out dynamic shared memory or need an arch-specific target
            # (the warpgroup GEMM: sm_90a) say so in their lowering record.
            launch = c.lowering.get("launch") or {}
            extra = {k: launch[k] for k in ("shared_memory", "arch", "min_blocks")
                     if launch.get(k)}
            if launch.get("scalars_by_value"):
                extra["value_inputs"] = launch["scalars_by_value"]
            self._callable = self.backend_record.launcher(c.name, c.inputs, c.outputs, c.body,
                                                          header=c.header, **extra)
        return self._callable


class Specialization:
    """A kernel for one argument signature, constexpr binding, schedule and backend:
    the compiler's analysis of it and its generated variants, cached on disk."""

    def __init__(self, kernel: "Kernel", specs: dict, constexprs: dict, threads_req,
                 backend: Backend, schedule: Schedule | None = None,
                 int_values: dict | None = None, debug: bool = False):
        self.kernel, self.specs, self.constexprs = kernel, specs, constexprs
        self.threads_req, self.backend, self.schedule = threads_req, backend, schedule
        self.int_values = int_values or {}
        self.debug = debug
        self.request = pipeline.Request(
            kernel.fn, tuple(kernel.param_names), specs, constexprs, threads_req, schedule,
            self.int_values, backend, kernel.differentiable, kernel.loc, debug)
        self._tile = None
        self.key = cache.key_hash({
            "source": cache.source_fingerprint(kernel.fn),
            "specs": {k: [v[0], v[1].name, v[2]] for k, v in specs.items()},
            "constexprs": {k: repr(v) for k, v in constexprs.items()},
            "threads": threads_req, "backend": backend.language, "device": backend.device,
            # plans depend on the target's capabilities (the device names it on GPUs)
            "target": backend.target.name,
            "units": [u.name for u in backend.matrix_units],
            **({"dot_fragments": True} if backend.dot_fragments else {}),
            **({"mma_layout": True} if backend.mma_layout else {}),
            **({} if backend.wgmma_carry else {"wgmma_carry": False}),
            **({} if backend.wgmma_dual == "split" else {"wgmma_dual": backend.wgmma_dual}),
            **({} if backend.wgmma_refill == "empty" else {"wgmma_refill": backend.wgmma_refill}),
            **({} if backend.staging_ahead else {"staging_ahead": False}),
            **({"mixed_bulk": True} if backend.mixed_bulk else {}),
            "schedule": None if schedule is None else schedule.key(),
            "int_values": sorted(self.int_values.items()),
            "compiler": cache.compiler_fingerprint(),
            # precompiled CUDA kernels take their scalars by value or through pointers
            **({"cuda_scalars": backend.scalars} if backend.language == "cuda" else {}),
            # device_assert checks are compiled in (only debug builds add the key)
            **({"debug": True} if debug else {}),
        })
        entry = cache.disk_load(self.key)
        if entry is None:
            fn, steps = pipeline.tile_form(self.request)
            self._tile = fn
            entry = {"analysis": pipeline.analyze(self.request, fn, steps).to_json(),
                     "variants": {}}
            cache.disk_store(self.key, entry)
        self.entry = entry
        self.analysis = pipeline.Analysis.from_json(entry["analysis"])
        warn_unchecked_asserts(kernel.fn.__name__, self.analysis.details, backend)
        self.outputs: list[str] = self.analysis.outputs
        self.atomic_outputs: list[str] = self.analysis.atomic_outputs
        self.coverage = self.analysis.coverage
        self.reads = self.analysis.reads
        self.threads: int = self.analysis.threads
        self.plan = self.analysis.plan
        self.variants: dict[tuple, Variant] = {}

    @property
    def target(self):
        return self.backend.target

    def tile_ir(self):
        if self._tile is None:
            self._tile, _ = pipeline.tile_form(self.request)
        return self._tile

    @property
    def unlowered(self) -> str | None:
        """Why this specialization's kernel cannot be generated (its plan's backend is
        planned but not lowered yet), else None."""
        from ..compiler.planning import unlowered
        return unlowered(self.plan, self.backend.target)

    def plan_only_report(self):
        from ..compiler.planning import plan_only_report
        return plan_only_report(self.plan, self.analysis.steps, self.backend.target)

    def variant(self, proven: tuple) -> Variant:
        v = self.variants.get(proven)
        if v is not None:
            return v
        why = self.unlowered
        if why is not None:
            raise CompilationError(f"kernel {self.kernel.fn.__name__!r}: {why}", self.kernel.loc)
        tag = "".join("1" if p else "0" for p in proven)
        data = self.entry["variants"].get(tag)
        if data is None:
            name = f"metile_{self.kernel.fn.__name__}_{self.key[:12]}_{tag}"
            compiled = pipeline.generate(self.request, self.tile_ir(), self.analysis, proven,
                                         name, RESERVED)
            self.entry["variants"][tag] = compiled.to_json()
            cache.disk_store(self.key, self.entry)
        else:
            compiled = pipeline.CompiledKernel.from_json(data)
            # (the dumps a compile prints, printed for a kernel from the disk cache too:
            # METILE_DEBUG=schedule printed nothing with a warm cache)
            if pipeline.dumps(f"emit_{self.backend.language}"):
                print(compiled.source, file=sys.stdout)
            if pipeline.dumps("plan_schedule"):
                from ..compiler import planning
                planning.dump(self.kernel.fn.__name__, self.plan, compiled.report)
        v = self.variants[proven] = Variant(compiled, self.backend)
        return v


# The keywords a launch takes besides the kernel's arguments, which bind() reads (a kernel
# with a parameter of one of these names gets it as that argument): a new one goes here too,
# or a tuned or heuristics launch refuses it as an unexpected argument (Kernel.check_call).
LAUNCH_OPTIONS = frozenset({"num_simdgroups", "NUM_SG", "SCHEDULE", "backend", "target",
                            "STRICT_MATH", "debug", "num_warps", "num_stages"})


class Kernel:
    """A @metile.kernel function; index it with a grid to launch."""

    __metile_kernel__ = True

    def __init__(self, fn, num_simdgroups: int | None = None, differentiable: bool = False,
                 debug: bool | None = None, do_not_specialize=()):
        if not inspect.isfunction(fn):
            raise TypeError(f"metile.kernel decorates a Python function written with def, got "
                            f"{type(fn).__name__} {fn!r}")
        self.fn = fn
        source.capture(fn)
        self.differentiable = differentiable
        if debug is not None and not isinstance(debug, bool):
            raise TypeError(f"metile.kernel debug= must be True, False or None, got {debug!r}")
        self.debug = debug  # None: METILE_DEBUG=asserts decides (see _debug)
        functools.update_wrapper(self, fn)
        try:
            self.param_names, self.constexpr_names, self.defaults = constexpr_params(fn)
        except CompilationError as e:
            raise e.with_traceback(None) from None
        self.num_simdgroups = num_simdgroups
        self.do_not_specialize = self._unspecialized(do_not_specialize)
        self._specs: dict = {}
        self.last_dispatch: "Dispatch | None" = None
        # why the last launch could not be prepared (what _last names instead of a report)
        self.last_failure: Exception | None = None
        self._launches = LaunchCache()
        self._deps: Snapshot | None = None
        code = getattr(fn, "__code__", None)
        self.loc = Loc(code.co_filename, code.co_firstlineno, 0) if code else None

    def __getitem__(self, grid) -> "Launcher":
        return Launcher(self, grid)

    def warmup(self, *args, grid, **kwargs) -> "Dispatch":
        """Triton's `kernel.warmup(*args, grid=grid, **kwargs)`: compile for this call
        without running it - `kernel[grid].prepare(*args, **kwargs)`, the prepared launch,
        which runs when called and answers Triton's CompiledKernel attributes (`asm`,
        `metadata`; `n_regs`/`n_spills` are not known: compiled_view.py)."""
        refuse_dtype_placeholders(self, args, kwargs)
        return self[grid].prepare(*args, **kwargs)

    def _unspecialized(self, names) -> frozenset:
        """Triton's do_not_specialize (parameter names or positions) as names.  metile
        specializes a runtime scalar on its value only under an explicit Schedule (for its
        shape proofs); these are left out of that too."""
        if isinstance(names, (str, int)):
            names = [names]
        out = []
        for n in names:
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < len(self.param_names):
                n = self.param_names[n]
            if not isinstance(n, str) or n not in self.param_names:
                raise TypeError(f"metile.kernel do_not_specialize names {n!r}, which is not a "
                                f"parameter of {self.fn.__name__} (give names or positions)")
            if n in self.constexpr_names:
                raise TypeError(f"metile.kernel do_not_specialize names constexpr {n!r}: a "
                                f"constexpr is always specialized")
            out.append(n)
        return frozenset(out)

    def refresh(self) -> None:
        """Forget compiled specializations and resolved launches when a global or
        closure value the kernel reads (or a helper it calls) changed since they
        were made; the next launch then compiles against the current values.  A
        prepared Dispatch keeps the code it was prepared with."""
        if self._deps is None:
            self._deps = Snapshot(self.fn)
        elif self._deps.changed():
            self._specs.clear()
            self._launches.clear()
            self._deps = Snapshot(self.fn)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"launch a metile kernel with {self.fn.__name__}[grid](...)")

    def __repr__(self) -> str:
        return f"<metile.kernel {self.fn.__qualname__}>"

    # The most recent launch's plan and report, for `kernel.explain()` after a
    # launch; a prepared Dispatch has its own.
    def _last(self) -> "Dispatch":
        if self.last_dispatch is None:
            if self.last_failure is not None:
                raise RuntimeError(f"{self.fn.__name__}'s last launch failed before it was "
                                   f"prepared ({type(self.last_failure).__name__}: "
                                   f"{self.last_failure}); there is no launch to describe")
            raise RuntimeError(f"{self.fn.__name__} has not been launched or prepared yet; "
                               "prepare it (kernel[grid].prepare(...)) to inspect its plan")
        return self.last_dispatch

    @property
    def schedule_plan(self):
        return self._last().schedule_plan

    @property
    def execution_report(self):
        return self._last().execution_report

    def explain(self, steps: bool = False) -> str:
        return self._last().explain(steps)

    # -- binding ---------------------------------------------------------------------------
    def bind(self, args, kwargs) -> tuple[dict, dict, int | None, Schedule | None, object, bool]:
        """(runtime arguments by name, constexpr values by name, threads requested, schedule,
        backend requested, whether device_assert is checked)."""
        kwargs = dict(kwargs)
        for name in ("num_simdgroups", "NUM_SG", "num_warps", "num_stages"):
            if name in kwargs and name not in self.param_names:
                # a NumPy count as the int it holds, as a Schedule or Config takes it (it
                # was refused as no int, or its repr failed to match num_stages=3)
                kwargs[name] = _plain_numbers(kwargs[name])
        debug = self._debug(kwargs)
        launch_nsg = "num_simdgroups" in kwargs or (
            "NUM_SG" in kwargs and "NUM_SG" not in self.param_names)
        nsg_name = "num_simdgroups" if "num_simdgroups" in kwargs else "NUM_SG"
        nsg = kwargs.pop("num_simdgroups", self.num_simdgroups)
        if "NUM_SG" in kwargs and "NUM_SG" not in self.param_names:
            # Legacy spelling (Config(num_simdgroups=...) passes NUM_SG).
            legacy = kwargs.pop("NUM_SG")
            if nsg is not None and nsg != legacy:
                raise LaunchError(f"NUM_SG={legacy} contradicts num_simdgroups={nsg}")
            nsg = legacy
        schedule = None if "SCHEDULE" in self.param_names else kwargs.pop("SCHEDULE", None)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise LaunchError(f"SCHEDULE must be a metile.Schedule, got {type(schedule).__name__}")
        if launch_nsg and schedule is not None and schedule.num_simdgroups not in (None, nsg):
            # (as for num_warps: planning blamed "the kernel's" lane count, naming one side)
            raise LaunchError(f"{nsg_name}={nsg!r} contradicts the SCHEDULE's "
                              f"num_simdgroups={schedule.num_simdgroups!r}")
        nsg, schedule = self._triton_options(kwargs, nsg, launch_nsg, schedule)
        # backend="msl"|"cuda" (or a compiler.Backend): compile for that language instead
        # of the default device's, e.g. to read the CUDA source on a Mac or the CPU.
        backend = None if "backend" in self.param_names else kwargs.pop("backend", None)
        if backend is not None and not isinstance(backend, (str, Backend)):
            raise LaunchError(f"backend must be 'msl', 'cuda' or a metile.compiler.Backend, got "
                              f"{type(backend).__name__} {backend!r}")
        # target="apple10" (any name of schedule.targets.TARGETS): plan and emit for that
        # hardware family while the kernel runs where it can (an M5 plan on the CPU runtime).
        target = None if "target" in self.param_names else kwargs.pop("target", None)
        if target is not None:
            if not isinstance(target, str):
                raise LaunchError(f"target must be a target name such as 'apple10', got "
                                  f"{type(target).__name__} {target!r}")
            if isinstance(backend, Backend):
                raise LaunchError("pass either a resolved Backend or target=, not both: the "
                                  f"Backend already plans for {backend.target.name}")
            backend = resolve_backend(backend, target=target)
        strict = None if "STRICT_MATH" in self.param_names else kwargs.pop("STRICT_MATH", None)
        if strict is not None and not isinstance(strict, bool):
            raise LaunchError(f"STRICT_MATH must be True or False, got {strict!r}")
        self.check_arguments(args, kwargs)
        bound = {**dict(zip(self.param_names, args)), **kwargs}
        for k, v in self.defaults.items():
            bound.setdefault(k, v)
        for k, v in bound.items():
            if isinstance(v, constexpr):
                # (Triton's `FLAG=tl.constexpr(False)`: the object is always truthy, so an
                # `if FLAG:` took the true branch)
                bound[k] = v = v.value
            bound[k] = _plain_numbers(v)  # NumPy scalars count as the Python numbers they hold
        # A None for a runtime parameter (an optional pointer) is a constexpr None, as in
        # Triton: `if B is not None:` folds, and the launch passes nothing for it.
        runtime = {n: bound[n] for n in self.param_names
                   if n not in self.constexpr_names and bound[n] is not None}
        consts = {n: bound[n] for n in self.param_names
                  if n in self.constexpr_names or bound[n] is None}
        relaxed = consts.get("RELAXED_PRECISION", False)
        if not isinstance(relaxed, bool):
            # (the precision policy reads `is True`: 1 or "True" ran strict, and a backend that
            # needs it then asked for RELAXED_PRECISION=True, which was given)
            raise LaunchError(f"RELAXED_PRECISION must be True or False, got {relaxed!r}")
        if strict is not None:
            # A launch-level precision policy (strict is metile's default): a
            # specialization key like any constexpr; it contradicts RELAXED_PRECISION.
            if strict and consts.get("RELAXED_PRECISION") is True:
                raise LaunchError("STRICT_MATH=True contradicts RELAXED_PRECISION=True")
            consts["STRICT_MATH"] = strict
        for n, v in consts.items():
            try:
                hash(v)
            except TypeError:
                raise LaunchError(f"constexpr {n!r} must be hashable, got {type(v).__name__}") \
                    from None
            if isinstance(v, mx.array):
                raise LaunchError(f"constexpr {n!r} must be a Python value, got an mx.array")
        if nsg is None and schedule is not None and schedule.num_simdgroups is not None:
            # the SCHEDULE's count is the launch's, as num_warps= is: an elementwise or
            # reduction kernel is traced on that many lanes (it was only checked against
            # the default geometry, and refused where num_warps= of the same count ran)
            nsg = schedule.num_simdgroups
        threads = None
        if nsg is not None:
            if isinstance(nsg, bool) or not isinstance(nsg, int) or not 1 <= nsg <= 32:
                raise LaunchError(f"num_simdgroups must be an int in 1..32, got {nsg!r}")
            threads = 32 * nsg
        return runtime, consts, threads, schedule, backend, debug

    def check_call(self, args, kwargs: dict, supplied=()) -> None:
        """check_arguments for a call's keywords before bind() has taken its launch options
        out: a keyword is an argument if the kernel has a parameter of that name, else a
        launch option if it is one (LAUNCH_OPTIONS)."""
        self.check_arguments(args, [k for k in kwargs if k in self.param_names or
                                    k not in LAUNCH_OPTIONS], supplied)

    def check_arguments(self, args, keywords, supplied=()) -> None:
        """The call's arguments against the kernel's signature, as Python binds a call: too
        many, an unexpected, repeated or missing one is an ArgumentError.  `keywords`: the
        names passed by keyword, launch options (LAUNCH_OPTIONS) left out; `supplied`: names
        given otherwise (autotune's configs, heuristics)."""
        name = self.fn.__name__
        if len(args) > len(self.param_names):
            raise ArgumentError(f"{name}() takes {len(self.param_names)} arguments, "
                                f"got {len(args)}")
        positional = self.param_names[:len(args)]
        for k in keywords:
            if k not in self.param_names:
                raise ArgumentError(f"{name}() got an unexpected argument {k!r}")
            if k in positional:
                raise ArgumentError(f"{name}() got multiple values for {k!r}")
        missing = [n for n in self.param_names[len(args):] if n not in keywords and
                   n not in self.defaults and n not in supplied]
        if missing:
            raise ArgumentError(f"{name}() missing arguments: {', '.join(missing)}")

    def _debug(self, kwargs: dict) -> bool:
        """Debug builds check device_assert: the launch's debug= (popped from kwargs unless
        the kernel has a parameter of that name), else the kernel's, else METILE_DEBUG=asserts
        (Triton's debug= and TRITON_DEBUG)."""
        debug = None if "debug" in self.param_names else kwargs.pop("debug", None)
        if debug is not None and not isinstance(debug, bool):
            raise LaunchError(f"debug must be True or False, got {debug!r}")
        if debug is None:
            debug = self.debug
        return settings.debug_asserts() if debug is None else debug

    def _triton_options(self, kwargs: dict, nsg, launch_nsg: bool, schedule):
        """Triton's launch options: num_warps is num_simdgroups (a warp and a SIMD-group are
        both 32 lanes); num_stages is Schedule(num_stages=), merged with any SCHEDULE given.
        A kernel with parameters of these names receives them as arguments instead."""
        if "num_warps" in kwargs and "num_warps" not in self.param_names:
            warps = kwargs.pop("num_warps")
            if launch_nsg and nsg != warps:
                raise LaunchError(f"num_warps={warps!r} contradicts num_simdgroups={nsg!r}")
            if not isinstance(warps, int) or isinstance(warps, bool) or not 1 <= warps <= 32:
                raise LaunchError(f"num_warps must be an int in 1..32, got {warps!r}")
            if schedule is not None and schedule.num_simdgroups not in (None, warps):
                # (planning then blamed the kernel's lane count and never named num_warps)
                raise LaunchError(f"num_warps={warps!r} contradicts the SCHEDULE's "
                                  f"num_simdgroups={schedule.num_simdgroups!r}")
            nsg = warps
        if "num_stages" in kwargs and "num_stages" not in self.param_names:
            stages = kwargs.pop("num_stages")
            if schedule is not None and schedule.num_stages not in (None, stages):
                raise LaunchError(f"num_stages={stages!r} contradicts the SCHEDULE's "
                                  f"num_stages={schedule.num_stages!r}")
            try:
                schedule = dataclasses.replace(schedule or Schedule(), num_stages=stages)
            except (TypeError, ValueError) as e:
                raise LaunchError(f"num_stages={stages!r}: {e}") from None
        return nsg, schedule

    def specialize(self, runtime: dict, consts: dict, threads, schedule=None, backend=None,
                   debug: bool = False) -> tuple[Specialization, dict]:
        specs = {n: arg_spec(n, v) for n, v in runtime.items()}
        backend = resolve_backend(backend)
        # An explicit schedule specializes integer scalars so that shape proofs
        # (divisibility, alignment) are exact for this launch.
        ints = {} if schedule is None else {
            n: v for n, v in runtime.items() if isinstance(v, int) and not isinstance(v, bool)
            and n not in self.do_not_specialize}
        key = (tuple((n, s[0], s[1].name, s[2]) for n, s in specs.items()),
               tuple((k, *value_key(v)) for k, v in consts.items()), threads, backend,
               None if schedule is None else schedule.key(), tuple(sorted(ints.items())), debug)
        spec = self._specs.get(key)
        if spec is None:
            spec = Specialization(self, specs, consts, threads, backend, schedule, ints, debug)
            # bounded as the launch cache is: each specialization holds its loaded kernel,
            # and one per distinct constexpr kept every library loaded (~65 KB each); the
            # oldest goes (a launch still holding it keeps it; again, it is read from disk)
            bounded_put(self._specs, key, spec, SPECIALIZATION_CACHE_SIZE)
        return spec, specs


def _plain_numbers(v):
    """`v` with each NumPy number, alone or in a tuple (a constexpr shape), as the Python
    number it holds (plain_number)."""
    if type(v) is tuple:
        return tuple(_plain_numbers(x) for x in v)
    return plain_number(v)


def kernel(fn=None, *, num_simdgroups: int | None = None, differentiable: bool = False,
           debug: bool | None = None, do_not_specialize=()):
    """Decorator: compile a Python function as a metile kernel (see module docstring).
    `differentiable=True` gives pointwise kernels a vjp (see runtime/autodiff.py);
    `debug=True` checks its device_asserts (default: METILE_DEBUG=asserts; a launch's
    debug= overrides both); `do_not_specialize` as Triton's jit option (Kernel._unspecialized)."""
    if fn is None:
        return lambda f: Kernel(f, num_simdgroups, differentiable, debug, do_not_specialize)
    return Kernel(fn, num_simdgroups, differentiable, debug, do_not_specialize)


def inline(fn):
    """Decorator: a helper whose body is inlined into the kernels that call it."""
    @functools.wraps(fn)
    def stub(*args, **kwargs):
        raise RuntimeError(f"{fn.__name__} is a @metile.inline helper; call it inside a kernel")

    stub.__metile_inline__ = True
    stub.__wrapped__ = fn
    source.capture(fn)
    return stub
