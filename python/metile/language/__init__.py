"""What a kernel may call: dtypes, constexpr and the builtin functions."""

from .core import *  # noqa: F401,F403
from .core import BUILTINS, constexpr
from . import math
from .random import *  # noqa: F401,F403  (Philox: rand, randn, randint, ...)
from .random import __all__ as _random_all
from .dtypes import (DType, bfloat16, bool_, float8e4nv, float8e5, float16, float32, int1, int8,
                     int16, int32, int64, to_dtype, uint8, uint16, uint32, uint64)

__all__ = ["DType", "bfloat16", "bool_", "float16", "float32", "int1", "int32", "uint32",
           "int64", "uint64", "int8", "uint8", "int16", "uint16", "float8e4nv", "float8e5",
           "to_dtype", "constexpr", "math", *BUILTINS, *_random_all]
