"""`associative_scan` with an @metile.inline combine function, and `sort` (Triton's names).

associative_scan builds one `scan{kind="combine"}` op over n tiles of one shape; its
region is the combine function inlined once on scalars, `2n` block arguments (the
running value's n parts, then the next element's n parts) yielding n scalars of the
inputs' dtypes.  The lowering (passes/lower_reductions.py) applies it in order along
the axis, so the combine need only be associative, not commutative.

sort builds `sort{descending}` along the last axis, which the lowering sorts with a
bitonic network in threadgroup memory (passes/lower_sort.py); the axis must be a power
of two no longer than SORT_MAX.
"""

from __future__ import annotations

import inspect

from ..errors import CompilationError
from ..ir.core import Block, Builder, Value
from ..ir.ops import CONTROL, ELEMENTWISE, SCALAR_SOURCES, TERMINATORS
from ..ir.types import ScalarType, TileType, dtype_of
from .builtins import builtin
from .semantics import Semantics, describe, no_fp8

SORT_MAX = 4096  # elements along the sorted axis: log2(n)*(log2(n)+1)/2 unrolled stages
# What a combine region may hold: scalar arithmetic and control flow over its arguments.
_COMBINE_OPS = (ELEMENTWISE | CONTROL | TERMINATORS | SCALAR_SOURCES) - {"ptr_add", "thread_id"}


def _axis(axis, rank: int, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise CompilationError(f"{what} axis must be a constexpr int, got {describe(axis)}")
    if not -rank <= axis < rank:
        raise CompilationError(f"{what} axis {axis} is out of range for a rank-{rank} tile")
    return axis % rank


def tile_operands(input, what: str):
    """(single, tiles, shape) of a scan's or reduction's input: one tile or a non-empty
    tuple of tiles of one shape."""
    single = not isinstance(input, tuple)
    tiles = (input,) if single else input
    if not tiles:
        raise CompilationError(f"{what} needs a tile or a tuple of tiles, got an empty tuple")
    for t in tiles:
        if not isinstance(t, Value) or not isinstance(t.type, TileType):
            raise CompilationError(f"{what} needs tiles, got {describe(t)}")
    shape = tiles[0].type.shape
    if any(t.type.shape != shape for t in tiles):
        raise CompilationError(f"{what} inputs must have one shape, got "
                               f"{', '.join(str(t.type.shape) for t in tiles)}")
    return single, tiles, shape


@builtin("input, axis, combine_fn, reverse=False")
def associative_scan(gen, input, axis, combine_fn, reverse):
    what = "associative_scan()"
    single, tiles, shape = tile_operands(input, what)
    axis = _axis(axis, len(shape), what)
    if not isinstance(reverse, bool):
        raise CompilationError(f"{what} reverse must be a constexpr bool")
    dtypes = [dtype_of(t.type) for t in tiles]
    region = combine_region(gen, combine_fn, dtypes, what)
    attrs = {"kind": "combine", "axis": axis}
    if reverse:
        attrs["reverse"] = True
    op = gen.b.op("scan", list(tiles), [t.type for t in tiles], attrs, [region])
    return op.results[0] if single else tuple(op.results)


def combine_region(gen, combine_fn, dtypes, what: str = "associative_scan()") -> Block:
    """The combine function inlined on scalar block arguments, ending in `yield` (also
    reduce()'s, frontend/reduce_ops.py)."""
    if not getattr(combine_fn, "__metile_inline__", False):
        raise CompilationError(f"{what} combine_fn must be an @metile.inline function, got "
                               f"{describe(combine_fn)}")
    name = getattr(combine_fn, "__qualname__", "combine_fn")
    n = len(dtypes)
    try:
        inspect.signature(combine_fn).bind(*range(2 * n))
    except (TypeError, ValueError):
        raise CompilationError(f"{what}: combine_fn {name} must take {2 * n} arguments for "
                               f"{n} input tile(s): the running value's {n}, then the next "
                               f"element's {n}") from None
    region = Block()
    args = [region.add_arg(ScalarType(d), f"{side}{i}")
            for side in ("a", "b") for i, d in enumerate(dtypes)]
    saved_b, saved_sem = gen.b, gen.sem
    gen.b = Builder(region)
    gen.b.loc = saved_b.loc
    gen.sem = Semantics(gen.b)
    try:
        out = gen.inline_call(combine_fn, args, {})
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) != n:
            raise CompilationError(f"{what}: combine_fn {name} returns {len(outs)} "
                                   f"value(s) for {n} input tile(s); it must return one per "
                                   f"input")
        ys = []
        for i, (y, d) in enumerate(zip(outs, dtypes)):
            if not isinstance(y, Value):
                y = gen.sem.convert(y, d) if isinstance(y, (bool, int, float)) else y
            if not isinstance(y, Value) or y.type != ScalarType(d):
                raise CompilationError(f"{what}: combine_fn {name} result {i} is "
                                       f"{describe(y)}; it must be a {d} scalar like input {i} "
                                       f"(cast it)")
            ys.append(y)
        gen.b.op("yield", ys, [])
    finally:
        gen.b, gen.sem = saved_b, saved_sem
    _check_combine(region, name, what)
    return region


def _check_combine(block: Block, name: str, what: str) -> None:
    for op in block.ops:
        if op.name not in _COMBINE_OPS or any(isinstance(r.type, TileType) for r in op.results):
            raise CompilationError(f"{what}: combine_fn {name} may only compute on "
                                   f"its scalar arguments; it uses {op.name}", op.loc)
        for r in op.regions:
            _check_combine(r, name, what)


@builtin("x, dim=None, descending=False")
def sort(gen, x, dim, descending):
    what = "sort()"
    if not isinstance(x, Value) or not isinstance(x.type, TileType):
        raise CompilationError(f"{what} needs a tile, got {describe(x)}")
    shape = x.type.shape
    last = len(shape) - 1
    if dim is not None and _axis(dim, len(shape), what) != last:
        raise CompilationError(f"{what} sorts along the last axis only (dim={last} or -1), "
                               f"got dim={dim}; permute the tile first")
    if not isinstance(descending, bool):
        raise CompilationError(f"{what} descending must be a constexpr bool")
    d = dtype_of(x.type)
    if d.is_bool:
        raise CompilationError(f"{what} of a bool tile: cast it to int32 first")
    no_fp8(what, d)  # its bytes do not order as its values
    n = shape[-1]
    if n & (n - 1) or n > SORT_MAX:
        raise CompilationError(f"{what} sorts a power-of-two number of elements, at most "
                               f"{SORT_MAX}, along its axis (a bitonic network); got {n} in a "
                               f"tile of shape {shape}. Pad the block to a power of two (load "
                               f"with other=+inf)")
    attrs = {"descending": True} if descending else {}
    return gen.b.value("sort", [x], x.type, **attrs)
