"""What a launch argument is to a kernel: a buffer, a runtime scalar, or an error."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..errors import LaunchError
from ..language import dtypes as dt
from .source_kernel import as_array

# Element offsets are int32 unless a kernel computes them in int64; program_id * BLOCK +
# arange stays below 2**31 for buffers up to this size (a block of the last program may run
# past n).  Larger buffers need 64-bit offsets (`check_buffer_sizes`).
MAX_BUFFER_ELEMENTS = 2**31 - 2**20


def check_buffer_sizes(kernel: str, runtime: dict, wide: dict | None) -> None:
    """Refuse a buffer past MAX_BUFFER_ELEMENTS unless the compiled kernel addresses it
    with 64-bit offsets throughout (`wide`: the variant's passes/wide_offsets record)."""
    for name, value in runtime.items():
        if not isinstance(value, mx.array) or value.size <= MAX_BUFFER_ELEMENTS:
            continue
        if wide is not None and name in wide["buffers"] and not wide["narrowing_casts"]:
            continue
        head = (f"kernel {kernel!r}: argument {name!r} has {value.size} elements, more than "
                f"the {MAX_BUFFER_ELEMENTS} that 32-bit offsets address")
        if wide is not None and name in wide["buffers"]:
            raise LaunchError(f"{head}; the kernel widens a computed 32-bit value to 64 bits "
                              f"(at {', '.join(wide['narrowing_casts'])}), which has wrapped "
                              f"already for such sizes: cast program_id, the loop variable or "
                              f"the scalar to metile.int64 before computing offsets from it")
        raise LaunchError(f"{head}: compute its offsets in int64, e.g. "
                          f"`pid = metile.program_id(0).to(metile.int64)` before "
                          f"`pid * BLOCK + metile.arange(0, BLOCK)`, and the loop variable "
                          f"of a K loop likewise (metile's library kernels index in 32 bits: "
                          f"split the array, or launch on views of it)")


def int_scalar_dtype(name: str, value: int) -> dt.DType:
    """Triton's type for a Python int argument: int32 when it fits, else uint64 in
    [2**63, 2**64), else int64."""
    if -2**31 <= value < 2**31:
        return dt.int32
    if 2**63 <= value < 2**64:
        return dt.uint64
    if -2**63 <= value < 2**63:
        return dt.int64
    raise LaunchError(f"argument {name!r}: {value} does not fit in 64 bits")


def scalar_array(value, name: str) -> mx.array:
    """The 0-d array a runtime scalar is passed as: MLX's rule (bool, int32, float32), except
    that an int beyond int32 keeps its value as int64/uint64 (`int_scalar_dtype`)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -2**31 <= value < 2**31:
        # through NumPy: mx.array(int) cannot build a uint64 past 2**63
        return mx.array(np.array(value, dtype=int_scalar_dtype(name, value).name))
    return as_array(value, name, "metile")


def arg_spec(name: str, value):
    """(kind, dtype, ndim) of a runtime argument, or a LaunchError."""
    if isinstance(value, mx.array):
        d = dt.to_dtype(value.dtype)
        if d is None:
            raise LaunchError(f"argument {name!r}: dtype {value.dtype} is not supported "
                              f"(metile kernels take float32, float16, bfloat16, int32, uint32, int64, "
                              f"uint64, int8, uint8, int16, uint16, bool)")
        if value.ndim == 0:
            return ("scalar", d, 0)
        return ("buffer", d, value.ndim)
    if isinstance(value, bool):
        return ("scalar", dt.bool_, 0)
    if isinstance(value, int):
        return ("scalar", int_scalar_dtype(name, value), 0)
    if isinstance(value, float):
        return ("scalar", dt.float32, 0)
    raise LaunchError(f"argument {name!r}: expected an mx.array or a Python int/float/bool, "
                      f"got {type(value).__name__}")
