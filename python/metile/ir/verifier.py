"""Structural checks on Tile IR, run after every pass when METILE_DEBUG is set.

A verifier failure is a compiler bug, not a user error: it raises
`IRVerificationError` naming the op.  What it checks:
  * every op belongs to the function's form (tile or thread);
  * SSA: operands are defined before use, in an enclosing scope;
  * elementwise operands share the result's shape (the frontend broadcasts);
  * thread form holds only scalars (no tile-typed value survives lowering);
  * region terminators match the op's result / carried types.
"""

from __future__ import annotations

from .core import Block, Function, Op
from .ops import ELEMENTWISE, THREAD_FORM, TILE_FORM
from .types import TileType, shape_of


class IRVerificationError(AssertionError):
    pass


def _fail(op: Op, msg: str):
    where = f" (line {op.loc.line})" if op.loc else ""
    raise IRVerificationError(f"[verifier] {op.name}{where}: {msg}")


def verify(fn: Function) -> None:
    allowed = TILE_FORM if fn.form == "tile" else THREAD_FORM
    defined: set[int] = {p.value.id for p in fn.params if p.value is not None}
    _verify_block(fn.body, fn, allowed, defined)


def _verify_block(block: Block, fn: Function, allowed, defined: set[int]) -> None:
    scope = set(defined) | {a.id for a in block.args}
    for op in block.ops:
        if op.name not in allowed:
            _fail(op, f"not an op of the {fn.form} form")
        for v in op.operands:
            if v.id not in scope:
                _fail(op, f"operand {v!r} used before its definition or out of scope")
        if fn.form == "thread":
            for r in op.results:
                if isinstance(r.type, TileType):
                    _fail(op, "tile value in thread form")
        elif op.name in ELEMENTWISE and op.name != "ptr_add":
            shape = shape_of(op.results[0].type)
            for v in op.operands:
                if shape_of(v.type) != shape:
                    _fail(op, f"operand shape {shape_of(v.type)} != result shape {shape}")
        if fn.form == "tile":
            _verify_terminators(op)
        for region in op.regions:
            _verify_block(region, fn, allowed, scope)
        scope |= {r.id for r in op.results}


def _verify_terminators(op: Op) -> None:
    if op.name == "for" and op.regions:
        body = op.regions[0]
        if not body.ops or body.ops[-1].name != "yield":
            _fail(op, "loop body must end with yield")
        ys = body.ops[-1].operands
        if [y.type for y in ys] != [r.type for r in op.results]:
            _fail(op, "yield types differ from the loop's carried types")
    if op.name == "if":
        for region in op.regions:
            ys = region.ops[-1].operands if region.ops and region.ops[-1].name == "yield" else []
            if [y.type for y in ys] != [r.type for r in op.results]:
                _fail(op, "branch yield types differ from the if's result types")
