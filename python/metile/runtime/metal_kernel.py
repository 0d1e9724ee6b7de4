"""`metile.metal_kernel`: `mx.fast.metal_kernel` on every MLX device.

Same constructor and call contract as MLX's.  On a Metal device the kernel goes
to `mlx::core::fast::metal_kernel` through metile's C++ layer; on the CPU
stream the same MSL runs in metile's MSL CPU runtime.  Either way the call
returns lazy arrays: nothing runs before `mx.eval`, and it traces through
`mx.compile`.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Mapping, Sequence

import mlx.core as mx

from .. import _ext, settings
from . import forks
from .msl_cpu import compiler, source as msl_source, strict
from .msl_cpu.rewrite import rewrite_msl
from .source_kernel import SourceKernel, as_array, resolve_stream

LANE_ORDERS = ("forward", "reverse", "shuffle")

# Loaded libraries by path, shared by the kernels whose source is the same.  An entry only
# this dict still holds is dropped (_prune): a kernel's launches and the graph's primitives
# hold the library they run (C++ shared_ptr), so it is closed when the last of them goes -
# every distinct constexpr is a library, and keeping them all grew the process ~65 KB each.
_libraries: dict[str, _ext.KernelLibrary] = {}
_PRUNE_EVERY = 64
_PRUNE_AT = _PRUNE_EVERY
_checked: set[str] = set()      # sha256 of the translation units the strict check passed
_lock = threading.Lock()

forks.renew_lock_after_fork(globals())


def route(device: mx.Device, name: str = "kernel") -> str:
    """Where MSL runs for `device`: "metal" (MLX's own metal_kernel) or "cpu"
    (metile's MSL CPU runtime).  Other GPUs cannot run MSL."""
    if device.type == mx.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    raise RuntimeError(
        "[metal_kernel] " + (
            f"kernel '{name}' is MSL, which runs on a Metal GPU or on the CPU stream; "
            f"the requested device is {device}, which is not a Metal GPU. Pass stream=mx.cpu to run it "
            "in metile's MSL CPU runtime, or write the kernel with @metile.kernel to get CUDA code."
        )
    )


def _load(tu: str, label: str) -> _ext.KernelLibrary:
    if not _ext.has_msl_cpu:
        raise RuntimeError(
            "[metal_kernel] this metile build has no MSL CPU runtime (boost.context was not found when "
            "it was built); install libboost-context-dev and reinstall metile"
        )
    with _lock:
        if strict.enabled():
            digest = hashlib.sha256(tu.encode()).hexdigest()
            if digest not in _checked:
                strict.check(tu, label)
                _checked.add(digest)
        path = str(compiler.compile_library(tu, label))
        lib = _libraries.get(path)
        if lib is None:
            if len(_libraries) >= _PRUNE_AT:
                _prune()
            lib = _libraries[path] = _ext.KernelLibrary(path)
        return lib


def _prune() -> None:
    """Drop the libraries no kernel holds any more (their only reference is this dict's),
    every _PRUNE_EVERY new ones: at most that many entries more than are in use."""
    global _PRUNE_AT
    for path in [p for p in list(_libraries) if sys.getrefcount(_libraries[p]) <= 2]:
        del _libraries[path]       # (2: the dict's and getrefcount's argument)
    _PRUNE_AT = len(_libraries) + _PRUNE_EVERY


# MLX's math modes, in the order of its MathMode enum.
MATH_MODES = ("safe", "relaxed", "fast")


def math_mode_of(compile_options) -> int:
    """MLX's MathMode value for `compile_options`, checked as MLX checks it."""
    if compile_options is None:
        return 0
    if not isinstance(compile_options, Mapping):
        raise ValueError("[metal_kernel] Expected `compile_options` to be a dict.")
    mode = 0
    for key, value in compile_options.items():
        if key != "math_mode":
            raise ValueError(f"[metal_kernel] Unknown compile option `{key}`.")
        if value not in MATH_MODES:
            raise ValueError("[metal_kernel] Expected math_mode to be 'safe', 'relaxed', or 'fast'.")
        mode = MATH_MODES.index(value)
    return mode


def race_compare(spec, output_names: list[str]) -> list[tuple[bool, float, float]]:
    """Per output, how the race check compares it: (compare, rtol, atol).

    `spec` lists the outputs whose values may legitimately depend on thread
    order: a sequence of names (not compared), or a mapping from name to
    None (not compared) or to a tolerance, `rtol` or `(rtol, atol)`
    (compared as |forward - other| <= atol + rtol * |forward|)."""
    compare = [(True, 0.0, 0.0)] * len(output_names)
    if spec is None:
        return compare
    if isinstance(spec, str) or not isinstance(spec, Mapping | Sequence):
        raise TypeError(
            "[metal_kernel] order_dependent_outputs must be a list of output names or a dict from output "
            f"name to None, rtol or (rtol, atol), got {spec!r}"
        )
    items = spec.items() if isinstance(spec, Mapping) else ((name, None) for name in spec)
    for name, tol in items:
        if name not in output_names:
            raise ValueError(
                f"[metal_kernel] order_dependent_outputs names '{name}', which is not an output; "
                f"the outputs are {output_names}"
            )
        if tol is None:
            entry = (False, 0.0, 0.0)
        else:
            rtol, atol = tol if isinstance(tol, tuple) else (tol, 0.0)
            try:
                rtol, atol = float(rtol), float(atol)
            except (TypeError, ValueError):
                rtol = atol = -1.0
            if not (rtol >= 0 and atol >= 0) or (rtol == 0 and atol == 0):
                raise ValueError(
                    f"[metal_kernel] order_dependent_outputs['{name}'] must be None, a positive rtol or "
                    f"(rtol, atol) with non-negative values, not both zero; got {tol!r}"
                )
            entry = (True, rtol, atol)
        compare[output_names.index(name)] = entry
    return compare


# Words an MSL kernel argument cannot be named: MSL's own keywords (function
# and address-space qualifiers; `metal` would hide the metal:: namespace) and
# the C++14 keywords MSL inherits.  Metal accepts them on no GPU, so the CPU
# runtime refuses them too.
MSL_KEYWORDS = frozenset(
    "kernel vertex fragment device constant thread threadgroup threadgroup_imageblock ray_data object_data "
    "metal".split()
)
CXX_KEYWORDS = frozenset(
    "alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t class compl "
    "const constexpr const_cast continue decltype default delete do double dynamic_cast else enum explicit "
    "export extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq "
    "nullptr operator or or_eq private protected public register reinterpret_cast return short signed sizeof "
    "static static_assert static_cast struct switch template this thread_local throw true try typedef typeid "
    "typename union unsigned using virtual void volatile wchar_t while xor xor_eq".split()
)
RESERVED_NAMES = MSL_KEYWORDS | CXX_KEYWORDS


def _refuse_double(inputs, output_dtypes, input_names, output_names) -> None:
    """MSL has no 64-bit float: the CPU runtime could run it, Metal could not."""
    named = [(n, x.dtype) for n, x in zip(input_names, inputs)] + list(zip(output_names, output_dtypes))
    for name, dtype in named:
        if dtype == mx.float64:
            raise TypeError(f"[metal_kernel] {name!r} is float64, which Metal does not have (MSL "
                            f"has no double); cast it to float32")


class MetalKernel(SourceKernel):
    """A callable MSL kernel; create it with `metile.metal_kernel`."""

    op = "metal_kernel"

    def __init__(
        self, name, input_names, output_names, source, header, ensure_row_contiguous, atomic_outputs,
        compile_options=None,
    ):
        super().__init__(name, input_names, output_names, source, header, ensure_row_contiguous)
        for role, names in (("input_names", self.input_names), ("output_names", self.output_names)):
            for i, n in enumerate(names):
                if n in RESERVED_NAMES:
                    raise ValueError(self.error(
                        f"{role}[{i}] is {n!r}, which is a reserved word of Metal Shading Language and cannot "
                        f"name a kernel argument (Metal's compiler rejects it); rename it, e.g. {n + '_'!r}"
                    ))
        self.atomic_outputs = atomic_outputs
        self.math_mode = math_mode_of(compile_options)
        self._libraries: dict[tuple, _ext.KernelLibrary] = {}
        self._shape_infos = msl_source.shape_infos(source, self.input_names)

    def translation_unit(self, inputs, output_dtypes, template=()) -> str:
        """The C++ source the CPU runtime compiles for these argument types."""
        specs = [
            msl_source.InputSpec(n, x.dtype, x.ndim, x.size) for n, x in zip(self.input_names, inputs)
        ]
        return msl_source.build(
            name=self.name,
            inputs=specs,
            output_names=self.output_names,
            output_dtypes=list(output_dtypes),
            source=self.source,
            header=self.header,
            template=list(template or ()),
            atomic_outputs=self.atomic_outputs,
            rewrite=rewrite_msl,
        )

    def check(self, *, inputs, output_dtypes, template=()) -> None:
        """Compile-check the MSL against the strict Metal model (no run); see msl_cpu/strict.py."""
        inputs = [as_array(x, n, self.op) for x, n in zip(inputs, self.input_names)]
        strict.check(self.translation_unit(inputs, output_dtypes, template), self.name)

    def __call__(
        self,
        *,
        inputs,
        output_shapes,
        output_dtypes,
        grid,
        threadgroup,
        template=None,
        init_value=None,
        verbose=False,
        stream=None,
        lane_order=None,
        race_check=None,
        bounds_check=None,
        order_dependent_outputs=None,
        no_vjp="",
    ):
        compare = race_compare(order_dependent_outputs, self.output_names)
        inputs, grid, threadgroup, shapes = self.prepare_call(
            inputs, output_shapes, output_dtypes, grid, threadgroup
        )
        template, init_value = self.checked_extras(template, init_value)
        _refuse_double(inputs, output_dtypes, self.input_names, self.output_names)
        s = resolve_stream(stream, self.op)
        if route(s.device, self.name) == "metal":
            return _ext.launch_metal(
                self.name, self.input_names, self.output_names, self.source, self.header,
                self.ensure_row_contiguous, self.atomic_outputs, self.math_mode, inputs, shapes, list(output_dtypes),
                grid, threadgroup, template, init_value, verbose, s,
            )
        library = self._library(inputs, output_dtypes, template, verbose)
        return self._cpu_launch(library, shapes, output_dtypes, grid, threadgroup, init_value,
                                lane_order, race_check, bounds_check, compare, no_vjp)(inputs, s)

    def _library(self, inputs, output_dtypes, template, verbose=False):
        """The CPU runtime's library of this kernel for these input and output dtypes."""
        # The translation unit depends only on this signature; building it (and
        # hashing it for the library cache) on every launch would dominate the
        # launch cost of small kernels.
        signature = (
            tuple((x.dtype, x.ndim, x.size < msl_source.MAX_CONSTANT_ARRAY_SIZE) for x in inputs),
            tuple(output_dtypes),
            tuple((k, repr(v)) for k, v in template),
        )
        library = self._libraries.get(signature)
        if library is None or verbose:
            tu = self.translation_unit(inputs, output_dtypes, template)
            if verbose:
                print(f"Generated source code for `{self.name}` (MSL CPU runtime):\n```\n{tu}\n```")
            library = self._libraries[signature] = _load(tu, self.name)
        return library

    @staticmethod
    def _cpu_settings(lane_order, race_check, bounds_check) -> tuple[str, bool, bool]:
        """The lane order and checks of a CPU-runtime launch, from the settings where not given."""
        order = lane_order or settings.choice("METILE_LANE_ORDER", LANE_ORDERS, "forward")
        race = bool(settings.flag("METILE_RACE_CHECK") if race_check is None else race_check)
        bounds = bool(settings.flag("METILE_MSL_BOUNDS_CHECK") if bounds_check is None else bounds_check)
        return order, race, bounds

    def _cpu_launch(self, library, shapes, output_dtypes, grid, threadgroup, init_value,
                    lane_order, race_check, bounds_check, compare, no_vjp):
        """`launch(arrays, stream)` on the CPU runtime with all but the arrays and stream
        fixed, the lane order and checks read from the settings where not given."""
        order, race, bounds = self._cpu_settings(lane_order, race_check, bounds_check)
        dtypes, names = list(output_dtypes), self.input_names + self.output_names
        contiguous = self.ensure_row_contiguous

        def launch(arrays, s):
            if contiguous:
                arrays = [mx.contiguous(x, stream=s) if x.ndim > 0 else x for x in arrays]
            return _ext.launch_cpu(library, self.name, arrays, self._shape_infos, shapes, dtypes,
                                   grid, threadgroup, init_value, order, race, compare, bounds,
                                   names, s, no_vjp)
        return launch

    def owns_primitive(self, *, stream=None, **launch) -> bool:
        """Whether this launch runs as metile's own primitive (the CPU runtime's), which
        refuses a gradient with `no_vjp` itself."""
        return route(resolve_stream(stream, self.op).device, self.name) == "cpu"

    def bind(self, *, inputs, verbose=False, stream=None, lane_order=None, race_check=None,
             bounds_check=None, no_vjp="", **launch):
        """This launch on the CPU runtime reduced to its binding call, for a caller that
        keeps its signature (a Dispatch relaunching arrays of the same dtypes and shapes):
        `launch(inputs)` with the checks, the library lookup and the settings read once,
        here (the caller's launch key holds the settings: runtime/dispatch.py).  A call
        whose stream is not the CPU's takes __call__; a launch on Metal is not bound (None)."""
        s = resolve_stream(stream, self.op)
        if verbose or route(s.device, self.name) != "cpu" or not _ext.has_msl_cpu:
            return None     # (no CPU runtime: __call__ names what is missing)
        compare = race_compare(launch.get("order_dependent_outputs"), self.output_names)
        checked, grid, threadgroup, shapes = self.prepare_call(
            inputs, launch["output_shapes"], launch["output_dtypes"], launch["grid"],
            launch["threadgroup"])
        template, init_value = self.checked_extras(launch.get("template"), launch.get("init_value"))
        _refuse_double(checked, launch["output_dtypes"], self.input_names, self.output_names)
        order, race, bounds = self._cpu_settings(lane_order, race_check, bounds_check)
        # the launch with its arguments converted once, in C++ (about half of launch_cpu's
        # cost per call was converting them)
        bound = _ext.CpuLaunch(self._library(checked, launch["output_dtypes"], template), self.name,
                               self._shape_infos, shapes, list(launch["output_dtypes"]), grid,
                               threadgroup, init_value, order, race, compare, bounds,
                               self.input_names + self.output_names, no_vjp,
                               self.ensure_row_contiguous)
        at = s if stream is not None else None   # None: the default device's, at each call

        def run(arrays):
            outs = bound(arrays, at)
            if outs is None:   # the default device changed: route it again
                return self(inputs=arrays, stream=stream, lane_order=lane_order,
                            race_check=race_check, bounds_check=bounds_check, no_vjp=no_vjp,
                            **launch)
            return outs
        run.direct = bound if at is None else None
        return run


def metal_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    atomic_outputs: bool = False,
    compile_options: dict | None = None,
) -> MetalKernel:
    """A custom Metal kernel from a body of MSL, like `mx.fast.metal_kernel`,
    runnable on a Metal GPU and on the CPU stream of any machine.

    Call the result with `inputs=`, `output_shapes=`, `output_dtypes=`, `grid=`
    (threads, not threadgroups), `threadgroup=`, and optionally `template=`,
    `init_value=`, `verbose=`, `stream=`.  CPU-only extras: `lane_order=`
    ("forward", "reverse", "shuffle"; default `$METILE_LANE_ORDER`, else "forward") and
    `race_check=` (run all three orders and fail if the outputs differ; default
    `$METILE_RACE_CHECK`, a boolean setting, off when unset) and `bounds_check=` (run on
    copies of the buffers fenced by inaccessible pages, so an index before the start or
    past the 16-byte-rounded end of a buffer is an error naming it; default
    `$METILE_MSL_BOUNDS_CHECK`, off when unset) and `order_dependent_outputs=` (outputs
    the race check must not require to be equal across orders: a list of
    names, or a dict from name to None or a tolerance `rtol` / `(rtol, atol)`).

    `compile_options={"math_mode": "safe" | "relaxed" | "fast"}` is checked as
    MLX checks it and passed to Metal; the CPU runtime computes every mode with
    IEEE semantics (what "safe" promises, and a result the faster modes allow).
    """
    return MetalKernel(
        name, input_names, output_names, source, header, ensure_row_contiguous, atomic_outputs, compile_options
    )
