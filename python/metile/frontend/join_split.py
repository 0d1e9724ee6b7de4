"""Triton's `join`, `split` and `interleave`: a new or removed last axis of extent 2.

join(a, b)[..., 0] = a, [..., 1] = b (a and b broadcast to one shape first; two scalars
give a (2,) tile); split(x) with x of shape (..., 2) gives (x[..., 0], x[..., 1]);
interleave(a, b) is join then reshape to (..., 2 * n).  Both ops read their operand at
other coordinates, which the lowering does per element (passes/lower_tiles.py).
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Value
from ..ir.types import TileType, elem_type, is_pointer
from .builtins import builtin
from .semantics import describe, promote


def join_values(gen, a, b, what: str = "join()") -> Value:
    for name, v in (("a", a), ("b", b)):
        if not isinstance(v, Value) or is_pointer(v.type):
            raise CompilationError(f"{what} operand {name} must be a tile or scalar of values, "
                                   f"got {describe(v)}")
    sem = gen.sem
    d = promote(elem_type(a.type).dtype, elem_type(b.type).dtype)
    (a, b), shape = sem.common(sem.convert(a, d), sem.convert(b, d))
    if not shape:  # two scalars: Triton gives a (2,) tile
        a, b = sem.broadcast_to(a, (1,)), sem.broadcast_to(b, (1,))
        return sem.reshape(join_values(gen, a, b, what), (2,), what)
    return gen.b.value("join", [a, b], TileType(shape + (2,), elem_type(a.type)))


@builtin("a, b")
def join(gen, a, b):
    return join_values(gen, a, b)


@builtin("a")
def split(gen, a):
    if not isinstance(a, Value) or not isinstance(a.type, TileType):
        raise CompilationError(f"split() needs a tile, got {describe(a)}")
    shape = a.type.shape
    if shape[-1] != 2:
        raise CompilationError(f"split() needs a last axis of extent 2, got a tile of shape "
                               f"{shape}")
    if len(shape) == 1:
        raise CompilationError("split() of a (2,) tile would give two scalars; metile splits "
                               "tiles of rank 2 or more (reshape to (1, 2) first)")
    rtype = TileType(shape[:-1], elem_type(a.type))
    return tuple(gen.b.value("split", [a], rtype, index=k) for k in (0, 1))


@builtin("a, b")
def interleave(gen, a, b):
    c = join_values(gen, a, b, "interleave()")
    shape = c.type.shape
    if len(shape) == 1:  # two scalars: already (a, b)
        return c
    return gen.sem.reshape(c, shape[:-2] + (2 * shape[-2],), "interleave")
