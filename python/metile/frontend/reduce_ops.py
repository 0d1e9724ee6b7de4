"""Triton's `xor_sum`, `reduce_or` and `reduce` (with an @metile.inline combine function).

xor_sum and reduce_or are `reduce{kind="xor"|"or"}`: block reductions like sum (SIMD-group
collectives, then threadgroup memory).  A bool tile reduces as int32 and converts back,
as Triton's int1.

reduce builds `reduce{kind="combine", axis}` over n tiles of one shape with the combine
region of associative_scan (frontend/scans.py): n results, scalars for axis=None.  The
lowering folds each result serially and in order (the first element combined with each
next one), so the combine need only be associative; the operands are in threadgroup
memory (passes/lower_reductions.py).
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Value
from ..ir.types import ScalarType, TileType, dtype_of, with_shape
from ..language import dtypes as dt
from .builtins import _keep_dims, builtin
from .scans import _axis, combine_region, tile_operands
from .semantics import describe


def _bitwise(kind: str, name: str):
    @builtin("input, axis=None, keep_dims=False", name)
    def impl(gen, input, axis, keep_dims):
        what = f"{name}()"
        if not isinstance(input, Value) or not isinstance(input.type, TileType):
            raise CompilationError(f"{what} needs a tile, got {describe(input)}")
        d = dtype_of(input.type)
        if d.is_float:
            raise CompilationError(f"{what} needs integer or bool elements, got {d}")
        x = gen.sem.cast(input, dt.int32) if d.is_bool else input
        r = gen.sem.reduce(kind, x, axis)
        if d.is_bool:
            r = gen.sem.cast(r, dt.bool_)
        return _keep_dims(gen, input, r, axis, keep_dims)


_bitwise("xor", "xor_sum")
_bitwise("or", "reduce_or")


@builtin("input, axis, combine_fn, keep_dims=False")
def reduce(gen, input, axis, combine_fn, keep_dims):
    what = "reduce()"
    single, tiles, shape = tile_operands(input, what)
    if axis is not None:
        axis = _axis(axis, len(shape), what)
    if not isinstance(keep_dims, bool):
        raise CompilationError(f"{what} keep_dims must be a constexpr bool")
    dtypes = [dtype_of(t.type) for t in tiles]
    region = combine_region(gen, combine_fn, dtypes, what)
    ir_axis = None if len(shape) == 1 else axis
    rshape = () if ir_axis is None else shape[:ir_axis] + shape[ir_axis + 1:]
    op = gen.b.op("reduce", list(tiles), [with_shape(ScalarType(d), rshape) for d in dtypes],
                  {"kind": "combine", "axis": ir_axis}, [region])
    outs = tuple(_keep_dims(gen, tiles[0], r, axis, keep_dims) for r in op.results)
    return outs[0] if single else outs
