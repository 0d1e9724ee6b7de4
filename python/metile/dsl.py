"""The public names of metile's kernel language (re-exported by `metile`)."""

from .errors import CompilationError, LaunchError
from .language import (BUILTINS, DType, bfloat16, bool_, constexpr, float8e4nv, float8e5, float16,
                       float32, int1, int8, int16, int32, int64, math, uint8, uint16, uint32, uint64)
from .language.core import *  # noqa: F401,F403
from .language.random import *  # noqa: F401,F403
from .language.random import __all__ as _random_all
from .runtime.dispatch import Dispatch
from .runtime.kernel import Kernel, inline, kernel

__all__ = ["kernel", "inline", "constexpr", "CompilationError", "LaunchError", "Kernel",
           "Dispatch", "DType", "float32", "float16", "bfloat16", "int32", "uint32", "bool_", "int1",
           "int64", "uint64", "int8", "uint8", "int16", "uint16", "float8e4nv", "float8e5", "math", "PropagateNan", "TRITON_MAX_TENSOR_NUMEL",
           *BUILTINS, *_random_all]
