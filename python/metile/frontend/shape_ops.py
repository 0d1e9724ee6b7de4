"""Triton's smaller shape helpers: flip, ravel, squeeze, unsqueeze, cat, broadcast,
zeros_like and swizzle2d.

ravel/squeeze/unsqueeze are reshapes (row-major order kept); broadcast and zeros_like
build on broadcast_to.  flip and cat read their operands at other coordinates, so they
are IR ops of their own (`flip(t){axis}`, `cat(a, b)`) that the lowering evaluates per
element (passes/lower_tiles.py).  swizzle2d is Triton's index arithmetic, on scalars or
tiles alike.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Value
from ..ir.types import TileType, dtype_of, elem_type, is_pointer, shape_of
from .builtins import IMPLS, builtin, need_constexpr
from .semantics import broadcast_shapes, describe, is_const, promote


def _tile(x, what: str) -> Value:
    if not isinstance(x, Value) or not isinstance(x.type, TileType):
        raise CompilationError(f"{what} needs a tile, got {describe(x)}")
    return x


def _axis(dim, rank: int, what: str) -> int:
    need_constexpr(dim, f"{what} dim")
    if not -rank <= dim < rank:
        raise CompilationError(f"{what} dim {dim} is out of range for a rank-{rank} tile")
    return dim % rank


@builtin("x, dim=None")
def flip(gen, x, dim):
    what = "flip()"
    x = _tile(x, what)
    shape = x.type.shape
    axis = len(shape) - 1 if dim is None else _axis(dim, len(shape), what)
    if shape[axis] == 1:
        return x
    return gen.b.value("flip", [x], x.type, axis=axis)


@builtin("x, can_reorder=False")
def ravel(gen, x, can_reorder):
    # can_reorder=True lets Triton pick any order; the row-major one is one of them
    x = _tile(x, "ravel()")
    return gen.sem.reshape(x, (x.type.numel,), "ravel")


@builtin("x, dim")
def squeeze(gen, x, dim):
    what = "squeeze()"
    x = _tile(x, what)
    shape = x.type.shape
    axis = _axis(dim, len(shape), what)
    if shape[axis] != 1:
        raise CompilationError(f"{what} dim {dim} has extent {shape[axis]} in a tile of shape "
                               f"{shape}; only an axis of extent 1 can be removed")
    if len(shape) == 1:
        raise CompilationError(f"{what} of a (1,) tile would give a scalar; metile tiles keep "
                               f"at least one axis (use metile.sum or metile.max to get the "
                               f"element)")
    return gen.sem.reshape(x, shape[:axis] + shape[axis + 1:], "squeeze")


@builtin("x, dim")
def unsqueeze(gen, x, dim):
    return IMPLS["expand_dims"](gen, [x, dim], {})


@builtin("input, other, can_reorder=False")
def cat(gen, input, other, can_reorder):
    what = "cat()"
    if not isinstance(can_reorder, bool):
        raise CompilationError(f"{what} can_reorder must be a constexpr bool, got "
                               f"{describe(can_reorder)}")
    a, b = _tile(input, what), _tile(other, what)
    sa, sb = a.type.shape, b.type.shape
    if len(sa) != len(sb) or sa[1:] != sb[1:]:
        raise CompilationError(f"{what} concatenates along axis 0 tiles whose other extents "
                               f"agree, got shapes {sa} and {sb}")
    d = promote(dtype_of(a.type), dtype_of(b.type))
    a, b = gen.sem.convert(a, d), gen.sem.convert(b, d)
    return gen.b.value("cat", [a, b], TileType((sa[0] + sb[0],) + sa[1:], elem_type(a.type)))


@builtin("input, other")
def broadcast(gen, input, other):
    vals = []
    for name, v in (("input", input), ("other", other)):
        if isinstance(v, Value) and is_pointer(v.type):
            vals.append(v)
        elif isinstance(v, Value) or is_const(v):
            vals.append(gen.sem.to_value(v))
        else:
            raise CompilationError(f"broadcast() {name} must be a tile or a scalar, got "
                                   f"{describe(v)}")
    shape = broadcast_shapes(shape_of(vals[0].type), shape_of(vals[1].type))
    return tuple(gen.sem.broadcast_to(v, shape) for v in vals)


@builtin("input")
def zeros_like(gen, input):
    if not isinstance(input, Value) or is_pointer(input.type):
        raise CompilationError(f"zeros_like() needs a tile or a runtime scalar, got "
                               f"{describe(input)}")
    zero = gen.sem.const(0, dtype_of(input.type))
    shape = shape_of(input.type)
    return gen.sem.broadcast_to(zero, shape) if shape else zero


@builtin("i, j, size_i, size_j, size_g")
def swizzle2d(gen, i, j, size_i, size_j, size_g):
    """Triton's formula step by step: groups of size_g rows (the last group may be shorter),
    numbered column-major inside a group."""
    sem = gen.sem
    for name, v in (("i", i), ("j", j), ("size_i", size_i), ("size_j", size_j),
                    ("size_g", size_g)):
        if not (is_const(v) and not isinstance(v, (bool, float))) and not (
                isinstance(v, Value) and not is_pointer(v.type) and dtype_of(v.type).is_int):
            raise CompilationError(f"swizzle2d() {name} must be an integer, got {describe(v)}")
    group = size_g
    ij = sem.binary("add", sem.binary("mul", i, size_j), j)
    size_gj = sem.binary("mul", size_g, size_j)
    group_id = sem.binary("idiv", ij, size_gj)
    off_i = sem.binary("mul", group_id, size_g)
    size_g = sem.binary("minimum", sem.binary("sub", size_i, off_i), size_g)
    ij = sem.binary("mod", ij, size_gj)
    new_i = sem.binary("add", off_i, sem.binary("mod", ij, size_g))
    new_j = sem.binary("idiv", ij, size_g)
    _mark_program_order(i, j, size_i, size_j, group, new_i, new_j)
    return new_i, new_j


def _mark_program_order(i, j, size_i, size_j, size_g, new_i, new_j) -> None:
    """Tag swizzle2d's results when they permute the grid itself - i, j program ids of
    two axes, the sizes their num_programs, size_g a positive constant: (new_i, new_j)
    then take every (i, j) pair once, so a store addressed by them covers what one
    addressed by the program ids would (passes/buffer_usage.py reads the tag)."""
    def axis_of(v, name):
        op = v.owner if isinstance(v, Value) else None
        return op.attrs["axis"] if op is not None and op.name == name else None

    a, b = axis_of(i, "program_id"), axis_of(j, "program_id")
    if a is None or b is None or a == b or axis_of(size_i, "num_programs") != a or \
            axis_of(size_j, "num_programs") != b or type(size_g) is not int or size_g < 1:
        return
    serial = id(new_i.owner)
    new_i.owner.attrs["program_order"] = [a, b, 0, serial]
    new_j.owner.attrs["program_order"] = [a, b, 1, serial]
