"""The standalone CUDA translation unit of a `cuda_kernel` body.

MLX's `cuda_kernel` wraps a body in its own source (its device headers, a
signature of typed pointers) before NVRTC sees it.  Where metile compiles the
body itself (`CudaKernel(arch=...)`, and the NVRTC tests) it builds the
equivalent here: the fixed-width integer names and cuda::std limits MLX's
headers provide, the half/bfloat16 headers, the kernel's header, then an
`extern "C"` kernel (a fixed symbol name, which the precompiled launch looks
up) with `const T*` inputs (0-d arrays for scalars) and `T*` outputs.

Where MLX compiles the body, the signature is MLX's and carries no
`__launch_bounds__`: ptxas may then give a thread up to 255 registers, and a
block of 1024 threads needing more than 64 fails at launch ("too many
resources requested for launch", from cudaGraphInstantiate under MLX's
graphs).  `launch_bounds_header` is the header line that puts the bounds into
MLX's signature.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

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


def bounds(threads: int | None, min_blocks: int = 0) -> str:
    """`__launch_bounds__` for a block of `threads` (and, given, `min_blocks` resident
    blocks per SM, which caps the registers ptxas gives a thread)."""
    if not threads:
        return ""
    return f"__launch_bounds__({threads}{f', {min_blocks}' if min_blocks > 1 else ''}) "


def translation_unit(name: str, header: str, body: str, inputs: Sequence[tuple[str, object]],
                     outputs: Sequence[tuple[str, object]], threads: int | None = None,
                     values: Sequence[tuple[str, object]] = (), min_blocks: int = 0) -> str:
    """The source of kernel `name`; `inputs`/`outputs` are (argument name, dtype)
    pairs in launch order, `values` the scalars passed by value after them (MLX's
    precompiled_cuda_kernel appends its `scalars` there).  `threads`, the block size the
    kernel is always launched with, becomes `__launch_bounds__`, so ptxas may budget
    registers for exactly that many threads."""
    params = [f"const {cuda_type(d)}* __restrict__ {n}" for n, d in inputs]
    params += [f"{cuda_type(d)}* __restrict__ {n}" for n, d in outputs]
    params += [f"{cuda_type(d)} {n}" for n, d in values]
    return (PRELUDE + header + f'\nextern "C" __global__ void {bounds(threads, min_blocks)}{name}('
            + ", ".join(params) + ") {\n" + body + "\n}\n")


# MLX 0.32.4 (mlx/backend/cuda/custom_kernel.cpp, build_kernel) names the kernel
# "custom_kernel_" + name + one suffix per template argument, and spells dtypes
# in that suffix with get_type_string (mlx/backend/common/compiled.cpp).
MLX_KERNEL_PREFIX = "custom_kernel_"
MLX_TEMPLATE_TYPES = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t",
                      "float64": "double", "complex64": "complex64_t", "bool": "bool",
                      "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
                      "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
                      "uint64": "uint64_t"}


def mlx_kernel_symbol(name: str, template=()) -> str:
    """The function name MLX's `cuda_kernel` gives the kernel `name` launched with
    `template` ((name, value) pairs)."""
    suffix = ""
    for key, value in template:
        if isinstance(value, bool):
            suffix += "_t" if value else "_f"
        elif isinstance(value, int):
            suffix += f"_{value}"
        elif isinstance(value, mx.Dtype) and str(value).split(".")[-1] in MLX_TEMPLATE_TYPES:
            suffix += "_" + MLX_TEMPLATE_TYPES[str(value).split(".")[-1]]
        else:
            raise TypeError(f"[cuda_kernel] template argument {key!r} is {value!r}; MLX takes "
                            f"an int, a bool or an mx.Dtype")
    return MLX_KERNEL_PREFIX + name + suffix


def launch_bounds_header(symbol: str, threads: int, min_blocks: int = 0) -> str:
    """A header line giving kernel `symbol` `__launch_bounds__(threads)` inside
    MLX's signature `__global__ void <symbol>(...)`, which the header precedes.
    A function-like macro: MLX also hands NVRTC the name expression
    `mlx::core::cu::<symbol>` (no parentheses), which an object-like macro would
    rewrite into an invalid one.  The macro does not expand itself again."""
    return f"\n#define {symbol}(...) {bounds(threads, min_blocks)}{symbol}(__VA_ARGS__)\n"
