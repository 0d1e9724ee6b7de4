"""Buffer roles and store coverage.

`buffer_roles` — which buffer parameters a kernel loads from and stores to.
The launch API turns stored-to parameters into outputs.

`store_coverage` — for each output, a rule under which the kernel provably
writes every element, so the launch can skip preserving the passed array's
contents.  The recognised form is the canonical 1-D block store

    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(Out + offs, value[, mask=offs < n])

as the only store to `Out`, at the top level of the kernel (not under an if
or a loop) and with `Out` never loaded.  It covers [0, grid[0] * BLOCK)
intersected with [0, n); the launch checks `grid[0] * BLOCK >= Out.size` and
`n >= Out.size` against the actual arguments.  Any other store pattern is
conservatively "not proven" (the launch then preserves unwritten elements).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Function, Op, Value, walk
from ..ir.types import PointerType, elem_type


@dataclass(frozen=True)
class Coverage:
    block: int              # elements per program along grid axis 0
    bound: str | None       # scalar parameter n in `mask = offs < n`, or None (no mask)
    bound_const: int | None = None

    def covers(self, grid0: int, size: int, args: dict) -> bool:
        if grid0 * self.block < size:
            return False
        if self.bound is not None:
            n = args.get(self.bound)
            return isinstance(n, int) and n >= size
        if self.bound_const is not None:
            return self.bound_const >= size
        return True


def _root(v: Value) -> PointerType | None:
    e = elem_type(v.type)
    return e if isinstance(e, PointerType) else None


def buffer_roles(fn: Function) -> tuple[set[str], set[str]]:
    """(loaded roots, stored roots) among device buffer parameters."""
    loaded, stored = set(), set()
    for op in walk(fn.body):
        if op.name in ("load", "store"):
            p = _root(op.operands[0])
            if p is not None and p.space == "device":
                (loaded if op.name == "load" else stored).add(p.root)
    return loaded, stored


def _def(v: Value) -> Op | None:
    return v.owner if isinstance(v.owner, Op) else None


def _strip(v: Value) -> Value:
    """Look through splat/broadcast (they do not change which elements are addressed)."""
    while (op := _def(v)) is not None and op.name in ("splat", "broadcast"):
        v = op.operands[0]
    return v


def _block_offsets(v: Value) -> int | None:
    """BLOCK if v == program_id(0) * BLOCK + arange(0, BLOCK) (either operand order)."""
    op = _def(v)
    if op is None or op.name != "add":
        return None
    for a, b in (op.operands, op.operands[::-1]):
        ar, base = _def(_strip(a)), _def(_strip(b))
        if ar is None or ar.name != "arange" or ar.attrs["start"] != 0 or base is None:
            continue
        block = ar.attrs["end"]
        if base.name != "mul":
            continue
        x, y = base.operands
        for pid, c in ((x, y), (y, x)):
            p, k = _def(pid), _def(c)
            if p is not None and p.name == "program_id" and p.attrs["axis"] == 0 \
                    and k is not None and k.name == "const" and k.attrs["value"] == block:
                return block
    return None


def store_coverage(fn: Function, loaded: set[str]) -> dict[str, Coverage]:
    stores: dict[str, list[Op]] = {}
    for op in walk(fn.body):
        if op.name == "store" and (p := _root(op.operands[0])) and p.space == "device":
            stores.setdefault(p.root, []).append(op)
    top = {id(op) for op in fn.body.ops}
    params = {id(p.value): p.name for p in fn.params if p.value is not None}
    out: dict[str, Coverage] = {}
    for root, ops in stores.items():
        if root in loaded or len(ops) != 1 or id(ops[0]) not in top:
            continue
        store = ops[0]
        ptr = _def(store.operands[0])
        if ptr is None or ptr.name != "ptr_add":
            continue
        base, offs = ptr.operands
        if id(_strip(base)) not in params:
            continue
        block = _block_offsets(offs)
        if block is None:
            continue
        if len(store.operands) == 2:
            out[root] = Coverage(block, None)
            continue
        mask = _def(store.operands[2])
        if mask is None or mask.name != "lt" or mask.operands[0] is not offs:
            continue
        n = _strip(mask.operands[1])
        if id(n) in params:
            out[root] = Coverage(block, params[id(n)])
        elif (c := _def(n)) is not None and c.name == "const":
            out[root] = Coverage(block, None, c.attrs["value"])
    return out
