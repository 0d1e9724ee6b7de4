"""device_print and device_assert: Tile IR for run-time debugging output and checks.

    metile.device_print("x", x, y, hex=False)   one line per element (per program for
                                                uniform scalars)
    metile.device_assert(x >= 0, "x must be non-negative", mask=m)

Both become one tile-form op whose operands are the printed values / the condition,
broadcast to one shape; passes/lower_debug.py lowers them per element and codegen
(codegen/debug_ops.py) spells them per backend.

device_assert is checked only in debug builds (`debug=True` on the kernel or the
launch, or METILE_DEBUG=asserts), as Triton checks it only under TRITON_DEBUG: without
debug the call compiles to nothing and its arguments are not even evaluated (Python's
`assert` under -O).  A Python `assert` on a runtime condition is a device_assert.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Value
from ..ir.types import PointerType, TileType, dtype_of, elem_type
from ..language import dtypes as dt
from .builtins import IMPLS
from .semantics import describe, is_const


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise CompilationError(f"{what} must be a compile-time str, got {describe(value)}")
    return value


def _printable(gen, x, i: int) -> Value:
    if isinstance(x, Value) and isinstance(elem_type(x.type), PointerType):
        raise CompilationError(
            f"device_print() argument {i} is a pointer; pointers have no printable address "
            f"(MLX exposes none): print the offsets you added to the buffer instead")
    if isinstance(x, Value):
        return x
    if is_const(x):
        return gen.sem.to_value(x)
    raise CompilationError(f"device_print() argument {i} must be a runtime value or a number, "
                           f"got {describe(x)}")


def _common_shape(gen, values: list[Value]) -> list[Value]:
    """Tiles broadcast to one shape (scalars among them are printed as they are)."""
    tiles = [v for v in values if isinstance(v.type, TileType)]
    if not tiles:
        return values
    _, shape = gen.sem.common(*tiles)
    return [gen.sem.broadcast_to(v, shape) if isinstance(v.type, TileType) else v
            for v in values]


def device_print(gen, args, kwargs):
    extra = set(kwargs) - {"prefix", "hex"}
    if extra:
        raise CompilationError(f"metile.device_print() got an unexpected keyword argument "
                               f"{sorted(extra)[0]!r}")
    if "prefix" in kwargs:
        prefix, values = kwargs["prefix"], list(args)
    elif args:
        prefix, values = args[0], list(args[1:])
    else:
        raise CompilationError("metile.device_print() needs a prefix string: "
                               "device_print(prefix, *values)")
    prefix = _text(prefix, "device_print() prefix").rstrip()
    # "x:" and "x" print alike: the line puts ": " between the prefix and the values
    if prefix.endswith(":") and values:
        prefix = prefix[:-1].rstrip()
    hex_ = kwargs.get("hex", False)
    if not isinstance(hex_, bool):
        raise CompilationError(f"device_print() hex must be a constexpr bool, got "
                               f"{describe(hex_)}")
    vals = [_printable(gen, x, i + 1) for i, x in enumerate(values)]
    # fp8 prints as its value, or with hex=True as its byte
    vals = [(gen.sem.cast(v, dt.uint8, bitcast=True) if hex_ else gen.sem.cast(v, dt.float32))
            if dtype_of(v.type).is_fp8 else v for v in vals]
    vals = _common_shape(gen, vals)
    gen.b.op("device_print", vals, [], {"prefix": prefix, "hex": hex_})


def device_assert(gen, args, kwargs):
    names = ("cond", "msg", "mask")
    if len(args) > 3:
        raise CompilationError(f"metile.device_assert() takes at most 3 arguments (cond, "
                               f"msg='', mask=None), got {len(args)}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise CompilationError(f"metile.device_assert() got an unexpected keyword argument "
                                   f"{k!r}")
        if k in bound:
            raise CompilationError(f"metile.device_assert() got multiple values for {k!r}")
        bound[k] = v
    if "cond" not in bound:
        raise CompilationError("metile.device_assert() needs a condition")
    msg = _text(bound.get("msg", ""), "device_assert() msg")
    emit_assert(gen, bound["cond"], msg, bound.get("mask"))


def emit_assert(gen, cond, msg: str, mask=None) -> None:
    """The tile-form device_assert op (debug builds only; callers check ctx.debug)."""
    sem = gen.sem
    if isinstance(cond, Value) and isinstance(elem_type(cond.type), PointerType):
        raise CompilationError(f"device_assert() condition must be a bool or number, got "
                               f"{describe(cond)}")
    if not isinstance(cond, Value):
        if not is_const(cond):
            raise CompilationError(f"device_assert() condition must be a bool or number, got "
                                   f"{describe(cond)}")
        cond = sem.const(bool(cond), dt.bool_)
    if dtype_of(cond.type) != dt.bool_:  # a number asserts it is nonzero, as in Triton
        cond = sem.binary("ne", cond, 0)
    if mask is not None:
        cond = sem.binary("or", cond, sem.unary("not", sem._mask(mask)))
    loc = gen.b.loc
    where = f"{loc.file}:{loc.line}" if loc is not None else "?"
    gen.b.op("device_assert", [cond], [], {"msg": msg, "where": where})


IMPLS["device_print"] = device_print
IMPLS["device_assert"] = device_assert

