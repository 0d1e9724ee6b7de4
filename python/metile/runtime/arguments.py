"""What a launch argument is to a kernel: a buffer, a runtime scalar, or an error."""

from __future__ import annotations

import mlx.core as mx

from ..errors import LaunchError
from ..language import dtypes as dt

# Element offsets in generated code are int32; program_id * BLOCK + arange stays below
# 2**31 for buffers up to this size (a block of the last program may run past n).
MAX_BUFFER_ELEMENTS = 2**31 - 2**20


def arg_spec(name: str, value):
    """(kind, dtype, ndim) of a runtime argument, or a LaunchError."""
    if isinstance(value, mx.array):
        d = dt.to_dtype(value.dtype)
        if d is None:
            raise LaunchError(f"argument {name!r}: dtype {value.dtype} is not supported "
                              f"(metile kernels take float32, float16, bfloat16, int32, uint32, bool)")
        if value.ndim == 0:
            return ("scalar", d, 0)
        if value.size > MAX_BUFFER_ELEMENTS:
            # Generated kernels compute element offsets in 32-bit integers: a larger
            # buffer would wrap around silently, so it is refused until 64-bit offsets
            # are lowered.
            raise LaunchError(f"argument {name!r} has {value.size} elements; metile kernels "
                              f"index buffers of at most {MAX_BUFFER_ELEMENTS} elements (32-bit "
                              f"offsets; 64-bit offsets are not implemented yet): split the "
                              f"array, or launch on views of it")
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
