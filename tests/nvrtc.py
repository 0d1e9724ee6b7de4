"""Compile metile's generated CUDA with NVRTC on a machine without a GPU.

The pip wheels nvidia-cuda-nvrtc (the compiler library), nvidia-cuda-runtime
(cuda_fp16.h / cuda_bf16.h) and nvidia-cuda-cccl (cuda::std) are enough: NVRTC
compiles for any architecture without a device.  The library and headers are
found, and the translation unit built, by the runtime's own modules
(metile/runtime/nvrtc.py, cuda_source.py), the ones `cuda_kernel(arch=...)`
uses: the fixed-width integer names and cuda::std limits MLX's device headers
provide, the half/bfloat16 headers, metile's header, and a signature of
`const T*` inputs (0-d arrays for scalars) and `T*` outputs.  It checks what
metile emits, not MLX's own preamble."""

from __future__ import annotations

import glob
import os

from metile.runtime import cuda_source, nvrtc
from metile.runtime.source_kernel import as_array


def _toolkit() -> tuple[str, list[str]] | None:
    """(libnvrtc path, include dirs), or None where there is no NVRTC."""
    try:
        toolkit = nvrtc.find_toolkit()
    except (nvrtc.NvrtcUnavailable, ValueError):
        return None
    return toolkit.library, list(toolkit.includes)


TOOLKIT = _toolkit()


def translation_unit(dispatch) -> str:
    """The standalone CUDA source of a dispatch prepared with backend="cuda"."""
    data = dispatch.variant.data
    inputs = [(n, as_array(a, n, "nvrtc").dtype) for n, a in zip(data["inputs"], dispatch.call_kwargs["inputs"])]
    outputs = list(zip(data["outputs"], dispatch.call_kwargs["output_dtypes"]))
    # scalars a precompiled kernel takes by value (METILE_CUDA_SCALARS=value) follow the outputs
    launch = data["lowering"].get("launch") or {}
    by_value = set(launch.get("scalars_by_value") or ())
    # the launch's block size and occupancy bounds, as the precompiled launch compiles it
    tg = dispatch.call_kwargs.get("threadgroup") or (0,)
    threads = tg[0] * tg[1] * tg[2] if len(tg) == 3 else None
    return cuda_source.translation_unit(data["name"], data["header"], data["body"],
                                        [x for x in inputs if x[0] not in by_value], outputs,
                                        threads, [x for x in inputs if x[0] in by_value],
                                        launch.get("min_blocks", 0))


def compile_cuda(source: str, arch: str) -> tuple[bool, str]:
    """(success, NVRTC log) for `source` compiled for `arch` (e.g. "sm_90"), uncached."""
    ok, log, _ = nvrtc.run_nvrtc(source, arch)
    return ok, log


def cubin(source: str, arch: str, extra=()) -> tuple[bytes, str]:
    """(cubin, NVRTC's log) of `source` for `arch`; fails the caller's test on an error."""
    from metile.runtime.nvrtc import run_nvrtc
    ok, log, data = run_nvrtc(source, arch, extra=tuple(extra))
    assert ok, log
    return data, log


def nvdisasm() -> str | None:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel or the PATH, or None."""
    import shutil
    try:
        import nvidia
    except ImportError:
        return shutil.which("nvdisasm")
    for base in getattr(nvidia, "__path__", []):
        for path in sorted(glob.glob(os.path.join(base, "*", "bin", "nvdisasm"))):
            return path
    return shutil.which("nvdisasm")


def disassemble(data: bytes) -> str:
    """The SASS of a cubin, as nvdisasm prints it."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        return subprocess.run([nvdisasm(), f.name], capture_output=True, text=True,
                              check=True).stdout


def mlx_translation_unit(dispatch) -> tuple[str, str]:
    """(name expression, source) of a dispatch prepared with backend="cuda" as MLX
    0.32.4's `cuda_kernel` builds it (mlx/backend/cuda/custom_kernel.cpp,
    build_kernel): the header metile hands MLX (with its launch bounds), then
    `__global__ void custom_kernel_<name>(const T* in..., T* out...)` in namespace
    mlx::core::cu, which NVRTC is asked to lower by name.  metile's prelude stands
    in for MLX's device headers (not installed here); metile's bodies read no
    `<input>_shape`, so MLX adds no shape parameters."""
    kernel = dispatch.variant.callable()
    kw = dispatch.call_kwargs
    in_dtypes = [as_array(a, n, "nvrtc").dtype for n, a in zip(kernel.input_names, kw["inputs"])]
    assert not any(f"{n}_shape" in kernel.source or f"{n}_strides" in kernel.source
                   for n in kernel.input_names), "MLX would add shape parameters"
    name, header = kernel.mlx_source(in_dtypes, kw["output_dtypes"], [], kw["threadgroup"])
    symbol = cuda_source.mlx_kernel_symbol(name)
    params = [f"    const {cuda_source.cuda_type(d)}* {n}" for n, d in zip(kernel.input_names, in_dtypes)]
    params += [f"    {cuda_source.cuda_type(d)}* {n}" for n, d in zip(kernel.output_names, kw["output_dtypes"])]
    source = (cuda_source.PRELUDE + header + "namespace mlx::core::cu {\n\n"
              f"__global__ void {symbol}(\n" + ",\n".join(params) + ") {\n" + kernel.source
              + "\n}\n\n} // namespace mlx::core::cu\n")
    return f"mlx::core::cu::{symbol}", source


def compile_named(source: str, arch: str, name_expression: str, extra=()) -> tuple[str, str]:
    """(lowered symbol, NVRTC's log) of `source` compiled for `arch` with
    `name_expression` registered, as MLX's JIT does; fails the caller's test on an
    error."""
    import ctypes
    toolkit = nvrtc.find_toolkit()
    lib = nvrtc._load(toolkit.library)
    program = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"mlx.cu", 0, None, None) == 0
    try:
        assert lib.nvrtcAddNameExpression(program, name_expression.encode()) == 0
        status, text = nvrtc.compile_program(lib, program, (*nvrtc.options(arch, toolkit), *extra))
        assert status == 0, text
        lowered = ctypes.c_char_p()
        assert lib.nvrtcGetLoweredName(program, name_expression.encode(), ctypes.byref(lowered)) == 0
        return lowered.value.decode(), text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
