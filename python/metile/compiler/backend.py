"""One record per code generator, resolved once and passed down.

A `Backend` says everything the compiler needs to know about where a kernel's
code goes: the language it is written in (MSL or CUDA C++), the hardware it is
planned for (`schedule.Target`: thread and shared-memory limits, matrix paths),
the emitter's matrix units, and the launcher that enqueues the source on MLX's
graph.  `resolve_backend` is the only function that looks at MLX's device or at
`METILE_BACKEND` / `METILE_TARGET`; every later stage reads the record it was given.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from .. import settings
from ..errors import LaunchError
from ..schedule.targets import Target, target_for, units_for

LANGUAGES = ("msl", "cuda")


@dataclass(frozen=True)
class Backend:
    language: str            # "msl" | "cuda": what the emitter writes
    target: Target           # the hardware the plan is made for
    device: str              # the device the code was resolved for (part of cache keys)
    native: bool = True      # whether that device runs this language
    device_label: str = ""   # the device as MLX prints it, for messages
    units: tuple = ()        # the matrix units GEMMs may lower to (schedule.targets.units_for)
    scalars: str = "array"   # CUDA: runtime scalars by "value" or as 0-d "array"s (settings.cuda_scalars)
    # general products (a dot outside the GEMM lowering) on the matrix unit
    # (passes/lower_dot_fragments.py): MSL always; CUDA unless METILE_DOT_FRAGMENTS=0
    dot_fragments: bool = False
    # products and the code around them in the matrix unit's accumulator layout
    # (passes/mma_layout.py): where dot_fragments is, unless METILE_MMA_LAYOUT=0
    mma_layout: bool = False
    # a warpgroup product into a loop's carried tile left in flight round the back edge
    # (lower_mma_layout.carried_products), unless METILE_WGMMA_CARRY=0
    wgmma_carry: bool = True
    # a dual GEMM's two products on the warpgroup unit: "split" (one m64nBN product each)
    # or "joined" (one m64n(2BN) product over both B tiles; settings.wgmma_dual)
    wgmma_dual: str = "split"
    # what orders a TMA stage's refill: "barrier" or "empty" mbarriers (settings.wgmma_refill)
    wgmma_refill: str = "empty"
    # computed operand tiles load their words a K step ahead (settings.staging_ahead)
    staging_ahead: bool = True
    # a computed operand's GEMM takes its loaded operands by bulk copies (settings.mixed_bulk)
    mixed_bulk: bool = False

    @property
    def emitter(self):
        from ..codegen.cuda import CUDAEmitter
        from ..codegen.msl import MSLEmitter
        return CUDAEmitter if self.language == "cuda" else MSLEmitter

    @property
    def matrix_units(self) -> tuple:
        """The matrix instructions this language's emitter spells for this target (GEMM
        lowering picks one): its entry of the one table, schedule/targets.py MATRIX_UNITS,
        less the units made for other targets (wgmma: sm_90 only, and opt-in: `units_for`)."""
        return self.units

    @property
    def shared_memory_bytes(self) -> int:
        return self.target.threadgroup_memory_bytes

    @property
    def shared_memory_optin_bytes(self) -> int:
        return self.target.shared_memory_optin_bytes

    @property
    def max_threads(self) -> int:
        return self.target.max_threads_per_threadgroup

    def emit(self, thread_fn, scalars: set[str]) -> tuple[str, str]:
        """(header, body) of MLX's custom-kernel contract for this language."""
        if self.language == "cuda":
            from ..codegen.cuda import emit_cuda
            return emit_cuda(thread_fn, scalars)
        from ..codegen.msl import emit_msl
        return emit_msl(thread_fn)

    @property
    def launcher(self) -> Callable:
        """make(name, input_names, output_names, body, header=...) -> a callable kernel."""
        from ..runtime.cuda_kernel import cuda_kernel
        from ..runtime.metal_kernel import metal_kernel
        return cuda_kernel if self.language == "cuda" else metal_kernel


def _device_target() -> tuple[str, Target, str]:
    """(kind, target, label) of MLX's default device."""
    import mlx.core as mx

    device = mx.default_device()
    label = str(device)
    if device.type == mx.cpu:
        return "cpu", target_for("cpu"), label
    if mx.metal.is_available():
        return "metal", target_for("metal", mx.metal.device_info().get("architecture")), label
    if mx.cuda.is_available():
        try:
            info = mx.device_info(device)
        except (TypeError, RuntimeError, ValueError):
            info = {}
        major, minor = info.get("compute_capability_major"), info.get("compute_capability_minor")
        arch = f"sm_{major}{minor or 0}" if major is not None else None
        return "cuda", target_for("cuda", arch), label
    raise RuntimeError(f"no metile target for MLX device {device}")


@functools.lru_cache(maxsize=None)
def _fingerprint(kind: str) -> str:
    import mlx.core as mx

    try:
        info = mx.device_info()
    except Exception:  # older MLX
        return kind
    return f"{kind}:{info.get('architecture', '')}:{info.get('device_name', '')}"


# The environment resolve_backend reads (METILE_BACKEND, METILE_TARGET, the matrix
# units' METILE_CUDA_WGMMA, METILE_DOT_FRAGMENTS): a launch resolved under other values
# must not be reused (runtime/dispatch.py's launch key).
SELECTION_VARIABLES = ("METILE_BACKEND", "METILE_TARGET", "METILE_CUDA_WGMMA",
                       "METILE_DOT_FRAGMENTS", "METILE_MMA_LAYOUT", "METILE_WGMMA_CARRY",
                       "METILE_WGMMA_DUAL", "METILE_WGMMA_REFILL", "METILE_STAGING_AHEAD",
                       "METILE_MIXED_BULK")


def device_type():
    """The default device's type, which resolve_backend also reads: part of a cached
    launch's key (runtime/dispatch.py), so a launch resolved for one device is not reused
    on another."""
    import mlx.core as mx
    return mx.default_device().type


def resolve_backend(language: "str | Backend | None" = None, *, target: str | None = None) -> Backend:
    """The backend a kernel compiles for.

    `language` ("msl" or "cuda") is the caller's choice (a launch's `backend=`);
    else `METILE_BACKEND`; else the target's language when a target is named;
    else the default device's: CUDA on MLX's CUDA backend, MSL on Metal and on
    the CPU (where the MSL CPU runtime runs it).  `target` (a launch's
    `target=`, else `METILE_TARGET`) names the hardware to plan and emit for,
    e.g. "apple10" to plan as on an M5 while the MSL runs here; by default the
    device's own, or, for a language the device does not run, that language's
    reference target.  A target of the other language is an error.
    """
    if isinstance(language, Backend):
        return language
    from .. import settings

    if language is not None and language not in LANGUAGES:
        raise LaunchError(f"backend must be one of {', '.join(LANGUAGES)}, got {language!r}")
    forced = settings._get("METILE_BACKEND") or None
    if forced is not None and forced not in LANGUAGES:
        raise LaunchError(f"METILE_BACKEND must be one of {', '.join(LANGUAGES)}, got {forced!r}")
    chosen = language or forced
    from ..schedule.targets import TARGETS

    named_by = "target="
    if target is None:
        target, named_by = settings.target(TARGETS), "METILE_TARGET="
    kind, device_target, label = _device_target()
    device_language = "cuda" if kind == "cuda" else "msl"
    if target is not None:
        if not isinstance(target, str) or target not in TARGETS:
            raise LaunchError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
        planned = TARGETS[target]
        if chosen is not None and planned.language != chosen:
            how = f"backend={language!r}" if language else f"METILE_BACKEND={forced}"
            others = ", ".join(t for t, v in TARGETS.items() if v.language == chosen)
            raise LaunchError(f"{named_by}{target!r} is a {planned.language.upper()} target, but "
                              f"{how} emits {chosen.upper()}; name a {chosen.upper()} target "
                              f"({others}) or leave the language to the target")
        chosen = planned.language
    else:
        chosen = chosen or device_language
        if chosen == device_language:
            planned = device_target
        else:
            # Code for a language the device does not run (inspecting CUDA source on a
            # Mac or the CPU, MSL on an NVIDIA machine): plan for that language's
            # reference hardware.
            planned = target_for("cuda", None) if chosen == "cuda" else target_for("cpu")
    # (the settings read, so a malformed value is refused, on every backend)
    fragments = settings.flag("METILE_DOT_FRAGMENTS", default=True) or chosen == "msl"
    mma = settings.flag("METILE_MMA_LAYOUT", default=True)
    return Backend(chosen, planned, _fingerprint(kind), chosen == device_language, label,
                   units_for(chosen, planned.name, settings.wgmma_variant()),
                   _cuda_scalars() if chosen == "cuda" else "array", fragments,
                   fragments and mma, settings.flag("METILE_WGMMA_CARRY", default=True),
                   settings.wgmma_dual(), settings.wgmma_refill(), settings.staging_ahead(),
                   settings.mixed_bulk())


def _cuda_scalars() -> str:
    """METILE_CUDA_SCALARS, else "value" where metile's NVRTC and the CUDA headers are
    found (kernels with by-value scalars are compiled by metile), else "array"."""
    from .. import settings
    explicit = settings.cuda_scalars()
    if explicit is not None:
        return explicit
    from ..runtime import nvrtc
    try:
        nvrtc.find_toolkit()
    except (nvrtc.NvrtcUnavailable, settings.SettingError):
        return "array"
    return "value"
