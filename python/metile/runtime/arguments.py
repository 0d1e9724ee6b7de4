"""What a launch argument is to a kernel: a buffer, a runtime scalar, or an error."""

from __future__ import annotations

import mlx.core as mx

from ..errors import LaunchError
from ..language import dtypes as dt


def arg_spec(name: str, value):
    """(kind, dtype, ndim) of a runtime argument, or a LaunchError."""
    if isinstance(value, mx.array):
        d = dt.to_dtype(value.dtype)
        if d is None:
            raise LaunchError(f"argument {name!r}: dtype {value.dtype} is not supported "
                              f"(metile kernels take float32, float16, bfloat16, int32, uint32, bool)")
        if value.ndim == 0:
            return ("scalar", d, 0)
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
