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
    return cuda_source.translation_unit(data["name"], data["header"], data["body"], inputs, outputs)


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
