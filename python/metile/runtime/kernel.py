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

import functools
import inspect
import os
import sys
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ..frontend import CompilationError, LaunchError, build_tile_ir, constexpr_params
from ..ir.printer import format_function
from ..ir.verifier import verify
from ..language import dtypes as dt
from ..passes.buffer_usage import atomic_roots, buffer_roles, coverage_from_json, store_coverage
from ..passes.lower_tiles import lower_tiles
from ..passes.uniformity import check_uniformity
from ..ir.core import Loc, walk
from ..schedule import Schedule, ScheduleError
from . import cache, planning
from .metal_kernel import RESERVED_NAMES
from .dependencies import Snapshot

if TYPE_CHECKING:
    from .dispatch import Dispatch, Launcher

BACKENDS = ("msl", "cuda")
# Generated argument names avoid MSL/C++ keywords and the shim's type names; a
# Python parameter that collides is renamed (arg_<name>), never refused.
RESERVED = set(RESERVED_NAMES) | {
    "half", "float", "int", "uint", "bool", "char", "short", "long", "void", "bfloat",
    "bfloat16_t", "float16_t", "vec", "main"}


def matrix_units(backend: str) -> tuple:
    """The matrix instructions the backend's emitter declares (GEMM lowering picks one)."""
    from ..codegen.cuda import CUDAEmitter
    from ..codegen.msl import MSLEmitter
    return (CUDAEmitter if backend == "cuda" else MSLEmitter).MATRIX_UNITS


def current_backend() -> str:
    """The emitter for the default device: CUDA on MLX's CUDA backend, MSL on
    Metal and on the CPU (where the MSL CPU runtime executes it).
    `METILE_BACKEND=msl|cuda` forces one (codegen tests; inspecting the other
    backend's source)."""
    forced = os.environ.get("METILE_BACKEND")
    if forced:
        if forced not in BACKENDS:
            raise LaunchError(f"METILE_BACKEND must be one of {', '.join(BACKENDS)}, got {forced!r}")
        return forced
    if mx.default_device().type == mx.gpu and mx.cuda.is_available():
        return "cuda"
    return "msl"


@functools.lru_cache(maxsize=None)
def device_fingerprint(backend: str) -> str:
    """The GPU a backend compiles for, as MLX reports it (part of cache keys)."""
    try:
        info = mx.device_info()
    except Exception:  # older MLX
        return backend
    return f"{backend}:{info.get('architecture', '')}:{info.get('device_name', '')}"


from ..settings import debug_flags  # noqa: E402  (re-exported: used across runtime/)


def _arg_spec(name: str, value):
    """(kind, dtype, ndim) of a runtime argument, or a LaunchError."""
    if isinstance(value, mx.array):
        d = dt.to_dtype(value.dtype)
        if d is None:
            raise LaunchError(f"argument {name!r}: dtype {value.dtype} is not supported "
                              f"(metile kernels take float32, float16, bfloat16, int32, uint32, bool)")
        if value.ndim == 0:
            return ("scalar", d, 0)
        return ("buffer", d, value.ndim)
    if isinstance(value, bool):
        return ("scalar", dt.bool_, 0)
    if isinstance(value, int):
        if not -2**31 <= value < 2**31:
            raise LaunchError(f"argument {name!r}: {value} does not fit in int32")
        return ("scalar", dt.int32, 0)
    if isinstance(value, float):
        return ("scalar", dt.float32, 0)
    raise LaunchError(f"argument {name!r}: expected an mx.array or a Python int/float/bool, "
                      f"got {type(value).__name__}")


def _unique(base: str, used: set[str]) -> str:
    name = f"arg_{base}" if base in RESERVED or base.startswith("_") else base
    out, i = name, 1
    while out in used:
        i += 1
        out = f"{name}{i}"
    used.add(out)
    return out


def _name_constexprs(error: CompilationError, constexprs: dict) -> None:
    """Say which constexpr a constant in the message came from: `BLOCK=8.0` reaches
    the compiler as the bare constant 8.0."""
    named = [f"{k}={v!r}" for k, v in constexprs.items()
             if (isinstance(v, (int, float, str)) or v is None)
             and (f"constant {v!r}" in error.message
                  or f"{type(v).__name__} {v!r}" in error.message)]
    if named:
        error.message += f" (the constant is constexpr {', '.join(named)})"


class Variant:
    """One generated kernel: source, the metal_kernel call signature, and the callable."""

    def __init__(self, data: dict, backend: str):
        self.data = data
        self.backend = backend
        self._callable = None

    def callable(self):
        if self._callable is None:
            from .. import cuda_kernel, metal_kernel
            d = self.data
            make = cuda_kernel if self.backend == "cuda" else metal_kernel
            self._callable = make(d["name"], d["inputs"], d["outputs"], d["body"], header=d["header"])
        return self._callable


class Specialization:
    """A kernel for one argument signature and constexpr binding."""

    def __init__(self, kernel: "Kernel", specs: dict, constexprs: dict, threads_req, backend: str,
                 target: planning.Target, schedule: Schedule | None = None,
                 int_values: dict | None = None):
        self.kernel, self.specs, self.constexprs, self.threads_req = kernel, specs, constexprs, \
            threads_req
        self.backend = backend
        self.target = target  # what this backend's code runs on (planning.target_for_backend)
        self.schedule = schedule
        self.int_values = int_values or {}
        self._tile = None
        self.key = cache.key_hash({
            "source": cache.source_fingerprint(kernel.fn),
            "specs": {k: [v[0], v[1].name, v[2]] for k, v in specs.items()},
            "constexprs": {k: repr(v) for k, v in constexprs.items()},
            "threads": threads_req, "backend": backend, "device": device_fingerprint(backend),
            # plans depend on the target's capabilities (the device names it on GPUs)
            "target": target.name,
            "schedule": None if schedule is None else schedule.key(),
            "int_values": sorted(self.int_values.items()),
            "compiler": cache.compiler_fingerprint(),
        })
        self.entry = cache.disk_load(self.key)
        if self.entry is None:
            self.entry = self._analyze()
            cache.disk_store(self.key, self.entry)
        self.outputs: list[str] = self.entry["outputs"]
        self.atomic_outputs: list[str] = self.entry.get("atomic_outputs", [])
        self.coverage = {k: coverage_from_json(v) for k, v in self.entry["coverage"].items()}
        self.threads: int = self.entry["threads"]
        self.variants: dict[tuple, Variant] = {}
        self.plan = planning.SchedulePlan.from_dict(self.entry["plan"])

    def tile_ir(self):
        if self._tile is None:
            fragments = self.schedule is not None and self.schedule.backend == "simdgroup_inline"
            try:
                fn, _ = build_tile_ir(self.kernel.fn, {k: v[:2] for k, v in self.specs.items()},
                                      self.constexprs, *((True,) if fragments else ()))
            except CompilationError as e:
                _name_constexprs(e, self.constexprs)
                raise
            verify(fn)
            check_uniformity(fn)
            fn.meta["passes"] = ["frontend", "verify", "uniformity"]
            if "tile_ir" in debug_flags():
                print(format_function(fn), file=sys.stdout)
            self._tile = fn
        return self._tile

    def _analyze(self) -> dict:
        fn = self.tile_ir()
        loaded, stored = buffer_roles(fn)
        names = self.kernel.param_names
        outputs = [n for n in names if n in stored]
        if not outputs:
            raise CompilationError(f"kernel {self.kernel.fn.__name__!r} stores to no buffer, so it "
                                   f"has no result: a kernel's outputs are the buffers it writes "
                                   f"with metile.store, a tensor view's store or atomic_add",
                                   self.kernel.loc)
        atomic = atomic_roots(fn)
        if atomic:
            first = next(iter(atomic.values()))
            why = ("differentiable=True kernels" if self.kernel.differentiable else
                   "kernels with dot" if any(op.name == "dot" for op in walk(fn.body)) else
                   "simdgroup_inline kernels" if fn.meta.get("fragments") else None)
            if why:
                raise CompilationError(f"atomic_add is not supported in {why}", first.loc)
        cov = store_coverage(fn, loaded)
        try:
            bounds = tuple(sorted({c.bound for c in cov.values() if getattr(c, "bound", None)}))
            tiles = [c.bounds for c in cov.values() if hasattr(c, "bounds")]
            plan, threads = planning.make_plan(
                fn, self.constexprs, self.int_values, self.schedule,
                self.target, threads_req=self.threads_req,
                units=matrix_units(self.backend), mask_bounds=bounds,
                tile_bounds=tiles[0] if tiles else None)
        except ScheduleError as e:
            raise CompilationError(str(e), self.kernel.loc) from None
        return {"outputs": outputs, "atomic_outputs": [n for n in outputs if n in atomic],
                "plan": plan.to_dict(), "loaded_outputs": sorted(loaded & stored),
                "coverage": {k: c.to_json() for k, c in cov.items()},
                "threads": threads, "variants": {}}

    def variant(self, proven: tuple) -> Variant:
        v = self.variants.get(proven)
        if v is not None:
            return v
        tag = "".join("1" if p else "0" for p in proven)
        data = self.entry["variants"].get(tag)
        if data is None:
            data = self._generate(proven)
            self.entry["variants"][tag] = data
            cache.disk_store(self.key, self.entry)
        elif self.backend in debug_flags():
            print(data["header"] + "\n" + data["body"], file=sys.stdout)
        v = self.variants[proven] = Variant(data, self.backend)
        return v

    def _generate(self, proven: tuple) -> dict:
        from ..codegen.cuda import emit_cuda
        from ..codegen.msl import emit_msl

        fn = self.tile_ir()
        used: set[str] = set()
        buffers, inputs, outputs, roles = {}, [], [], []
        tracked = {o for o, p in zip(self.outputs, proven) if not p}
        for name in self.kernel.param_names:
            spec = self.specs.get(name)
            if spec is None:
                continue
            if spec[0] == "scalar":
                buffers[(name, "scalar")] = _unique(name, used)
                inputs.append(buffers[(name, "scalar")])
                roles.append(["in", name])
            elif name not in self.outputs:
                buffers[(name, "read")] = _unique(name, used)
                inputs.append(buffers[(name, "read")])
                roles.append(["in", name])
        for name in self.outputs:
            buffers[(name, "out")] = _unique(name, used)
        for name in self.outputs:
            if name in tracked:
                buffers[(name, "read")] = _unique(f"{name}_in", used)
                inputs.append(buffers[(name, "read")])
                roles.append(["in", name])
                buffers[(name, "written")] = _unique(f"{name}_written", used)
        outputs = [buffers[(n, "out")] for n in self.outputs]
        outputs += [buffers[(n, "written")] for n in self.outputs if n in tracked]
        thread_fn = lower_tiles(
            fn, self.threads, buffers, matrix_units(self.backend), plan=self.plan,
            scalars=self.int_values,
            shared_limit=self.target.threadgroup_memory_bytes)
        verify(thread_fn)
        if "thread_ir" in debug_flags():
            print(format_function(thread_fn), file=sys.stdout)
        if self.backend == "cuda":
            scalars = {buffers[(n, "scalar")] for n, s in self.specs.items() if s[0] == "scalar"}
            header, body = emit_cuda(thread_fn, scalars)
        else:
            header, body = emit_msl(thread_fn)
        if self.backend in debug_flags():
            print(f"// metile kernel {fn.name} ({self.key[:12]})\n{header}\n{body}", file=sys.stdout)
        matmul = thread_fn.meta.get("matmul") or {}
        # In the order they ran: bounds proofs feed the GEMM lowering, which then
        # splits, vectorizes and buffers its staging.
        extra = thread_fn.meta.get("lowering_passes", [])
        gemm = [p for p in extra if p == "prove_gemm_bounds"]
        if matmul:
            gemm += ["lower_matmul"] + (["fuse_epilogue"] if matmul.get("epilogue_regions") else [])
        gemm += [p for p in extra if p != "prove_gemm_bounds"]
        passes = fn.meta["passes"] + ["plan_schedule", "placement", "lower_tiles", *gemm, "verify",
                                      f"emit_{self.backend}"]
        report = planning.make_report(self.plan, thread_fn, passes, self.target)
        planning.dump(fn.name, self.plan, report)
        return {"name": f"metile_{fn.name}_{self.key[:12]}_{''.join('1' if p else '0' for p in proven)}",
                "header": header, "body": body, "inputs": inputs, "outputs": outputs,
                "input_roles": roles, "tracked": [n for n in self.outputs if n in tracked],
                "lowering": {k: thread_fn.meta[k] for k in ("matmul", "loops", "allocations")
                             if k in thread_fn.meta},
                "passes": passes, "report": report.to_dict()}


class Kernel:
    """A @metile.kernel function; index it with a grid to launch."""

    __metile_kernel__ = True

    def __init__(self, fn, num_simdgroups: int | None = None, differentiable: bool = False):
        if not inspect.isfunction(fn):
            raise TypeError(f"metile.kernel decorates a Python function written with def, got "
                            f"{type(fn).__name__} {fn!r}")
        self.fn = fn
        self.differentiable = differentiable
        functools.update_wrapper(self, fn)
        try:
            self.param_names, self.constexpr_names, self.defaults = constexpr_params(fn)
        except CompilationError as e:
            raise e.with_traceback(None) from None
        self.num_simdgroups = num_simdgroups
        self._specs: dict = {}
        self.last_dispatch: "Dispatch | None" = None
        self._launches: dict = {}
        self._deps: Snapshot | None = None
        code = getattr(fn, "__code__", None)
        self.loc = Loc(code.co_filename, code.co_firstlineno, 0) if code else None

    def __getitem__(self, grid) -> "Launcher":
        from .dispatch import Launcher  # dispatch.py builds on this module
        return Launcher(self, grid)

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
            raise RuntimeError(f"{self.fn.__name__} has not been launched or prepared yet; "
                               "prepare it (kernel[grid].prepare(...)) to inspect its plan")
        return self.last_dispatch

    @property
    def schedule_plan(self):
        return self._last().schedule_plan

    @property
    def execution_report(self):
        return self._last().execution_report

    def explain(self) -> str:
        return self._last().explain()

    # -- binding ---------------------------------------------------------------------------
    def bind(self, args, kwargs) -> tuple[dict, dict, int | None, Schedule | None]:
        """(runtime arguments by name, constexpr values by name, threads requested, schedule)."""
        kwargs = dict(kwargs)
        nsg = kwargs.pop("num_simdgroups", self.num_simdgroups)
        if "NUM_SG" in kwargs and "NUM_SG" not in self.param_names:
            # Legacy spelling (Config(num_simdgroups=...) passes NUM_SG).
            legacy = kwargs.pop("NUM_SG")
            if nsg is not None and nsg != legacy:
                raise LaunchError(f"NUM_SG={legacy} contradicts num_simdgroups={nsg}")
            nsg = legacy
        schedule = None if "SCHEDULE" in self.param_names else kwargs.pop("SCHEDULE", None)
        strict = None if "STRICT_MATH" in self.param_names else kwargs.pop("STRICT_MATH", None)
        if strict is not None and not isinstance(strict, bool):
            raise LaunchError(f"STRICT_MATH must be True or False, got {strict!r}")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise LaunchError(f"SCHEDULE must be a metile.Schedule, got {type(schedule).__name__}")
        if len(args) > len(self.param_names):
            raise LaunchError(f"{self.fn.__name__}() takes {len(self.param_names)} arguments, "
                              f"got {len(args)}")
        bound = dict(zip(self.param_names, args))
        for k, v in kwargs.items():
            if k not in self.param_names:
                raise LaunchError(f"{self.fn.__name__}() got an unexpected argument {k!r}")
            if k in bound:
                raise LaunchError(f"{self.fn.__name__}() got multiple values for {k!r}")
            bound[k] = v
        for k, v in self.defaults.items():
            bound.setdefault(k, v)
        for k, v in bound.items():
            if isinstance(v, np.generic) and isinstance(v, (np.integer, np.floating, np.bool_)):
                bound[k] = v.item()  # NumPy scalars count as the Python numbers they hold
        missing = [n for n in self.param_names if n not in bound]
        if missing:
            raise LaunchError(f"{self.fn.__name__}() missing arguments: {', '.join(missing)}")
        runtime = {n: bound[n] for n in self.param_names if n not in self.constexpr_names}
        consts = {n: bound[n] for n in self.param_names if n in self.constexpr_names}
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
        threads = None
        if nsg is not None:
            if not isinstance(nsg, int) or not 1 <= nsg <= 32:
                raise LaunchError(f"num_simdgroups must be an int in 1..32, got {nsg!r}")
            threads = 32 * nsg
        return runtime, consts, threads, schedule

    def specialize(self, runtime: dict, consts: dict, threads, schedule=None
                   ) -> tuple[Specialization, dict]:
        specs = {n: _arg_spec(n, v) for n, v in runtime.items()}
        backend = current_backend()
        target = planning.target_for_backend(backend)
        # An explicit schedule specializes integer scalars so that shape proofs
        # (divisibility, alignment) are exact for this launch.
        ints = {} if schedule is None else {
            n: v for n, v in runtime.items() if isinstance(v, int) and not isinstance(v, bool)}
        key = (tuple((n, s[0], s[1].name, s[2]) for n, s in specs.items()),
               tuple((k, type(v).__name__, v) for k, v in consts.items()), threads, backend,
               target.name, None if schedule is None else schedule.key(),
               tuple(sorted(ints.items())))
        spec = self._specs.get(key)
        if spec is None:
            spec = Specialization(self, specs, consts, threads, backend, target, schedule, ints)
            self._specs[key] = spec
        return spec, specs


def kernel(fn=None, *, num_simdgroups: int | None = None, differentiable: bool = False):
    """Decorator: compile a Python function as a metile kernel (see module docstring).
    `differentiable=True` gives pointwise kernels a vjp (see runtime/autodiff.py)."""
    if fn is None:
        return lambda f: Kernel(f, num_simdgroups, differentiable)
    return Kernel(fn, num_simdgroups, differentiable)


def inline(fn):
    """Decorator: a helper whose body is inlined into the kernels that call it."""
    @functools.wraps(fn)
    def stub(*args, **kwargs):
        raise RuntimeError(f"{fn.__name__} is a @metile.inline helper; call it inside a kernel")

    stub.__metile_inline__ = True
    stub.__wrapped__ = fn
    return stub
