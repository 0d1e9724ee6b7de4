"""Compile metile's generated CUDA with NVRTC on a machine without a GPU.

The pip wheels nvidia-cuda-nvrtc (the compiler library), nvidia-cuda-runtime
(cuda_fp16.h / cuda_bf16.h) and nvidia-cuda-cccl (cuda::std) are enough: NVRTC
compiles for any architecture without a device.  The translation unit
approximates what MLX's cuda_kernel builds around a body: the fixed-width
integer names and cuda::std limits MLX's device headers provide, the
half/bfloat16 headers, metile's header, and a signature of
`const T*` inputs (0-d arrays for scalars) and `T*` outputs.  It checks what
metile emits, not MLX's own preamble."""

from __future__ import annotations

import ctypes
import glob
import os

from metile.runtime.source_kernel import as_array

_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
          "int32": "int32_t", "uint32": "uint32_t", "bool": "bool"}
_PRELUDE = ("typedef int int32_t;\ntypedef unsigned int uint32_t;\n"
            "typedef long long int64_t;\ntypedef unsigned long long uint64_t;\n"
            "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda/std/limits>\n")


def _toolkit() -> tuple[str, list[str]] | None:
    """(libnvrtc path, include dirs) from the nvidia-* wheels, or None."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for lib in sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*"))):
            include = os.path.join(os.path.dirname(os.path.dirname(lib)), "include")
            cccl = os.path.join(include, "cccl")
            if os.path.exists(os.path.join(include, "cuda_fp16.h")) and \
                    os.path.exists(os.path.join(cccl, "cuda", "std", "limits")):
                return lib, [include, cccl]
    return None


TOOLKIT = _toolkit()


def _dtype(d) -> str:
    return _TYPES[str(d).split(".")[-1]]


def translation_unit(dispatch) -> str:
    """The standalone CUDA source of a dispatch prepared with backend="cuda"."""
    data = dispatch.variant.data
    params = [f"const {_dtype(as_array(a, n, 'nvrtc').dtype)}* __restrict__ {n}"
              for n, a in zip(data["inputs"], dispatch.call_kwargs["inputs"])]
    params += [f"{_dtype(d)}* __restrict__ {n}"
               for n, d in zip(data["outputs"], dispatch.call_kwargs["output_dtypes"])]
    return (_PRELUDE + data["header"] + f'\nextern "C" __global__ void {data["name"]}('
            + ", ".join(params) + ") {\n" + data["body"] + "\n}\n")


def compile_cuda(source: str, arch: str) -> tuple[bool, str]:
    """(success, NVRTC log) for `source` compiled for `arch` (e.g. "sm_90")."""
    lib_path, includes = TOOLKIT
    lib = ctypes.CDLL(lib_path)
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"metile.cu", 0, None,
                              None) != 0:
        return False, "nvrtcCreateProgram failed"
    options = [f"--gpu-architecture={arch}".encode(), b"-std=c++17",
               *(f"-I{d}".encode() for d in includes)]
    status = lib.nvrtcCompileProgram(program, len(options),
                                     (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    lib.nvrtcDestroyProgram(ctypes.byref(program))
    return status == 0, log.value.decode(errors="replace")

