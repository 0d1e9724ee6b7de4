"""lower_debug: device_print and device_assert, tile form -> thread form.

A tile operand is visited element by element, in the lane layout: each thread
prints (checks) the elements it owns, passing the element's coordinates in the
tile, so output names elements, not threads.  Scalars are one value per thread:
a scalar print whose operands and control are uniform across the program
(passes/uniformity.py marks it `once_per_program`) is printed once, by thread 0;
otherwise each thread prints its own, naming the thread.  A uniform scalar
assertion names no thread (all would fail alike).

Every thread-form op takes the program id (after any grouped-order remapping, so it
is the id the kernel computed with) as its first three index operands.
"""

from __future__ import annotations

from ..ir.core import Block, Builder, Op
from ..ir.types import TileType
from .lane_layout import BOOL


def lower_debug(low, op: Op, b: Builder) -> None:
    """Lower one tile-form device_print / device_assert with the tile lowering `low`."""
    pids = [low.program_id(b, axis) for axis in range(3)]
    tiles = [v for v in op.operands if isinstance(v.type, TileType)]
    attrs = _thread_attrs(low, op)
    if tiles:
        shape = tiles[0].type.shape

        def body(ctx):
            values = [low.elem(v, ctx) for v in op.operands]
            _emit(ctx.b, op.name, values, pids, ctx.coords(),
                  {**attrs, "index": "element", "rank": len(shape)})

        low.lane_loop(b, shape, body)
        return
    values = [low.s(v) for v in op.operands]
    uniform = bool(op.attrs.get("once_per_program"))
    if not uniform:
        _emit(b, op.name, values, pids, [low.geom(b, "thread_id")],
              {**attrs, "index": "thread", "rank": 1})
    elif op.name == "device_assert":
        _emit(b, op.name, values, pids, [], {**attrs, "index": "none", "rank": 0})
    else:
        then = Block()
        tb = Builder(then)
        tb.loc = b.loc
        _emit(tb, op.name, values, pids, [], {**attrs, "index": "none", "rank": 0})
        first = b.value("eq", [low.geom(b, "thread_id"), low.const(b, 0)], BOOL)
        b.op("if", [first], [], regions=[then, Block()])


def _thread_attrs(low, op: Op) -> dict:
    if op.name == "device_print":
        return {"prefix": op.attrs["prefix"], "hex": op.attrs["hex"]}
    # what the failure message starts with: the kernel and the source line of the call
    return {"head": f"device_assert failed in kernel '{low.fn.name}' ({op.attrs['where']})",
            "msg": op.attrs["msg"]}


def _emit(b: Builder, name: str, values, pids, index, attrs: dict) -> None:
    if name == "device_print":
        b.op(name, [*pids, *index, *values], [], attrs)
    else:
        b.op(name, [values[0], *pids, *index], [], attrs)
