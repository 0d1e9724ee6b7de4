"""What Triton's `CompiledKernel` (the result of `kernel.warmup(...)`) exposes, read from
a prepared launch (`Dispatch`): `asm`, `metadata`, and `n_regs` / `n_spills`.

metile compiles a kernel to source (MSL or CUDA); the backend's own compiler makes the
machine code.  For CUDA that is NVRTC, which needs no GPU: `n_regs` / `n_spills` come
from ptxas's report of the launch's own translation unit for its architecture (compiled
once more with --ptxas-options=-v).  Metal's compiler and the CPU runtime's clang report
no register use, so on those backends reading them raises AttributeError saying why."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx

from ..errors import LaunchError
from ..ir.printer import format_function
from .nvrtc import NvrtcUnavailable
from .source_kernel import as_array

_WARP = 32   # lanes of a CUDA warp and of a Metal SIMD-group alike

_UNKNOWN = ("metile does not know {what}: it generates {language} source, and the "
            "compiler that turns it into machine code at the first launch ({compiler}) "
            "reports no register use to metile; read the generated code in .asm[{key!r}] "
            "(README, Coming from Triton; a launch prepared with backend='cuda' has them)")
_COMPILER = {"msl": "Metal's, or the CPU runtime's clang",
             "cuda": "MLX's cuda_kernel, which builds this kernel from its source"}


class CompiledKernelView:
    """Triton's CompiledKernel attributes on a prepared launch (a mixin of Dispatch,
    which provides `source`, `spec`, `variant`, `execution_report` and
    `_refuse_unlowered`)."""

    @property
    def asm(self) -> dict:
        """Triton's `compiled.asm`: the generated source under its language ("msl" or
        "cuda": the code the backend compiles, as Triton's "ptx"), and the kernel's
        checked Tile IR under "tile_ir" (what Triton's "ttir" is to it)."""
        source = self.source   # (a launch planned for an unlowered backend: refused here)
        return {self.variant.backend: source, "tile_ir": format_function(self.spec.tile_ir())}

    @property
    def metadata(self) -> SimpleNamespace:
        """The fields of Triton's `compiled.metadata` metile knows: `name` (the generated
        kernel's), `num_warps` (threads a program / 32), `num_stages` (the GEMM operand
        stages lowering emitted, 1 without a staged K loop) and `shared` (bytes of
        threadgroup memory the kernel declares)."""
        self._refuse_unlowered()
        report = self.execution_report
        launch = self.variant.compiled.lowering.get("launch") or {}
        return SimpleNamespace(
            name=self.variant.compiled.name,
            num_warps=-(-self.spec.threads // _WARP),
            num_stages=report.num_stages or 1,
            shared=launch.get("shared_memory") or report.threadgroup_bytes)

    def __getitem__(self, grid):
        """Triton's `compiled[grid](*args)` (its softmax tutorial launches the warmup's
        result so): this launch's kernel over `grid` with the call's keyword constexprs and
        launch options held; a call may pass its own, by keyword or in parameter order, as
        Triton's compiled kernel takes every argument."""
        self._refuse_unlowered()
        kernel, held = self.kernel, self._held

        def launch(*args, **kwargs):
            positional = set(kernel.param_names[:len(args)])
            return kernel[grid](*args, **{**{k: v for k, v in held.items()
                                             if k not in positional}, **kwargs})
        return launch

    def _unknown(self, what: str):
        self._refuse_unlowered()
        language = self.variant.backend
        raise AttributeError(_UNKNOWN.format(what=what, language=language.upper(),
                                             compiler=_COMPILER.get(language, language),
                                             key=language))

    def _resources(self, what: str) -> dict:
        """ptxas's report of a CUDA launch (CudaKernel.resources): registers a thread, bytes
        of spill stores and loads, the arch; on other backends AttributeError naming `what`."""
        self._refuse_unlowered()
        kernel = self.variant.callable() if self.variant.backend == "cuda" else None
        if kernel is None or kernel.arch is None:
            self._unknown(what)
        call = self.call_kwargs
        inputs = [as_array(a, n, "n_regs").dtype for n, a in zip(kernel.input_names,
                                                                  call["inputs"])]
        try:
            return kernel.resources(inputs, call["output_dtypes"], call["threadgroup"])
        except NvrtcUnavailable as e:
            raise AttributeError(f"metile reads {what} from NVRTC's ptxas report, and NVRTC "
                                 f"is not available here: {e}") from None

    @property
    def n_regs(self) -> int:
        """Registers a thread uses (CUDA: ptxas's report for the launch's arch); see the
        module docstring."""
        return self._resources("n_regs (registers a thread uses)")["registers"]

    @property
    def n_spills(self) -> int:
        """Registers spilled to memory (CUDA: ptxas's bytes of spill stores / 4, as Triton
        counts 4-byte registers); see the module docstring."""
        return self._resources("n_spills (registers spilled to memory)")["spill_stores"] // 4


def refuse_dtype_placeholders(kernel, args, kwargs) -> None:
    """Triton's warmup takes a dtype in place of a tensor; metile's compile needs the array
    (its size enters the coverage proofs and the launch's checks): say so by name."""
    named = {**dict(zip(kernel.param_names, args)), **kwargs}
    for name, value in named.items():
        if isinstance(value, mx.Dtype):
            raise LaunchError(f"{kernel.fn.__name__}.warmup(): argument {name!r} is the dtype "
                              f"{value}; Triton's warmup takes a dtype for a tensor, metile's "
                              f"takes the array a launch takes (its size enters the compile's "
                              f"proofs): pass an mx.array of that dtype and shape")
