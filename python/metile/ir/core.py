"""Tile IR: SSA values, ops with nested regions, functions, and a builder.

One set of data structures serves two levels:

* **tile form** (what the frontend builds): ops on scalars and tiles, with
  structured control flow (`for`, `if`, `while`) whose loop-carried values
  are block arguments and `yield` operands;
* **thread form** (what `passes.lower_tiles` produces and backends print):
  every value is a scalar held by one thread; tiles became `lane_loop`s over
  the elements a thread owns, register arrays and threadgroup memory.

The op vocabulary of each form is listed in `ops.py` with its verifier rules.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .types import Type

_ids = itertools.count()


@dataclass(frozen=True)
class Loc:
    file: str
    line: int
    col: int


class Value:
    __slots__ = ("type", "owner", "id", "hint")

    def __init__(self, type: Type, owner=None, hint: str = ""):
        self.type = type
        self.owner = owner  # the defining Op, or the Block for block arguments
        self.id = next(_ids)
        self.hint = hint

    def __repr__(self) -> str:
        return f"%{self.id}:{self.type}"


@dataclass(eq=False)
class Block:
    args: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    # ids of arguments the frontend proved >= 0 (a loop counter counting up from a
    # non-negative start): a view's coordinate built from one needs no lower-bound mask
    nonnegative: set = field(default_factory=set)

    def add_arg(self, type: Type, hint: str = "") -> Value:
        v = Value(type, self, hint)
        self.args.append(v)
        return v


@dataclass(eq=False)
class Op:
    name: str
    operands: list[Value]
    results: list[Value]
    attrs: dict
    regions: list[Block]
    loc: Loc | None = None

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r


@dataclass(eq=False)
class Param:
    """A kernel parameter as the frontend saw it at specialization time."""

    name: str
    kind: str  # "buffer" | "scalar" | "constexpr"
    value: Value | None = None  # buffer: PointerType value; scalar: ScalarType value
    constant: object = None     # constexpr: its Python value


@dataclass(eq=False)
class Function:
    name: str
    params: list[Param]
    body: Block
    form: str = "tile"  # "tile" | "thread"
    meta: dict = field(default_factory=dict)


class Builder:
    """Appends ops to a block; tracks the source location ops are tagged with."""

    def __init__(self, block: Block):
        self.block = block
        self.loc: Loc | None = None

    def op(self, name: str, operands=(), result_types=(), attrs=None, regions=(), hint="") -> Op:
        op = Op(name, list(operands), [], dict(attrs or {}), list(regions), self.loc)
        op.results = [Value(t, op, hint) for t in result_types]
        self.block.ops.append(op)
        return op

    def value(self, opname: str, operands, result_type: Type, hint="", **attrs) -> Value:
        return self.op(opname, operands, [result_type], attrs, hint=hint).result


def walk(block: Block):
    """Every op in `block` and its nested regions, in program order."""
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk(region)
