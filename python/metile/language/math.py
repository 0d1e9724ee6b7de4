"""`metile.math`: the names of Triton's `tl.math` that metile builds, plus metile's
extra float math.  Each is the same marker as the top-level `metile.<name>`, so
`metile.math.exp2(x)` and `metile.exp2(x)` compile to the same op.  Float math
runs in float32; float16 and bfloat16 operands convert around it."""

from .core import (abs, acos, asin, atan, atan2, ceil, cos, div_rn, erf, exp, exp2, fdiv, floor,
                   fma, log, log2, pow, rsqrt, sigmoid, sin, sqrt, sqrt_rn, tan, tanh, umulhi)

__all__ = ["abs", "acos", "asin", "atan", "atan2", "ceil", "cos", "div_rn", "erf", "exp", "exp2",
           "fdiv", "floor", "fma", "log", "log2", "pow", "rsqrt", "sigmoid", "sin", "sqrt",
           "sqrt_rn", "tan", "tanh", "umulhi"]
