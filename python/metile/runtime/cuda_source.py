"""The standalone CUDA translation unit of a `cuda_kernel` body.

MLX's `cuda_kernel` wraps a body in its own source (its device headers, a
signature of typed pointers) before NVRTC sees it.  Where metile compiles the
body itself (`CudaKernel(arch=...)`, and the NVRTC tests) it builds the
equivalent here: the fixed-width integer names and cuda::std limits MLX's
headers provide, the half/bfloat16 headers, the kernel's header, then an
`extern "C"` kernel (a fixed symbol name, which the precompiled launch looks
up) with `const T*` inputs (0-d arrays for scalars) and `T*` outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codegen.cuda import CUDAEmitter

# What metile's CUDA codegen spells, plus the other integer and float dtypes
# MLX can hand a kernel (MLX's dtype_to_cuda_type spells them the same).
CUDA_TYPES = {**CUDAEmitter.TYPES, "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
              "uint16": "uint16_t", "int64": "int64_t", "uint64": "uint64_t", "float64": "double"}

# NVRTC has no <cstdint>; MLX's device headers give these names, so bodies use them.
PRELUDE = ("typedef signed char int8_t;\ntypedef unsigned char uint8_t;\n"
           "typedef short int16_t;\ntypedef unsigned short uint16_t;\n"
           "typedef int int32_t;\ntypedef unsigned int uint32_t;\n"
           "typedef long long int64_t;\ntypedef unsigned long long uint64_t;\n"
           "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda/std/limits>\n")


def cuda_type(dtype) -> str:
    """The CUDA spelling of an MLX dtype (or its name, e.g. "float16")."""
    name = str(dtype).split(".")[-1]
    try:
        return CUDA_TYPES[name]
    except KeyError:
        raise ValueError(f"[cuda_kernel] no CUDA type for dtype {name}; supported: "
                         f"{', '.join(sorted(CUDA_TYPES))}") from None


def translation_unit(name: str, header: str, body: str, inputs: Sequence[tuple[str, object]],
                     outputs: Sequence[tuple[str, object]], threads: int | None = None) -> str:
    """The source of kernel `name`; `inputs`/`outputs` are (argument name, dtype)
    pairs in launch order.  `threads`, the block size the kernel is always
    launched with, becomes `__launch_bounds__`, so ptxas may budget registers
    for exactly that many threads."""
    params = [f"const {cuda_type(d)}* __restrict__ {n}" for n, d in inputs]
    params += [f"{cuda_type(d)}* __restrict__ {n}" for n, d in outputs]
    bounds = f"__launch_bounds__({threads}) " if threads else ""
    return (PRELUDE + header + f'\nextern "C" __global__ void {bounds}{name}('
            + ", ".join(params) + ") {\n" + body + "\n}\n")
