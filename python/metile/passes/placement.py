"""Placement analysis: how each tile value of a tile-form function is held.

Every tile value gets one of three placements (consumed by `lower_tiles`):

* ``recompute`` — not stored; evaluated at each element where it is used.
  Chosen for index arithmetic (arange/splat/broadcast and integer/bool/pointer
  ops over them: cheap and free of memory effects), for float widenings (the
  narrow value is held, converted at each use) and for pure values used
  exactly once in the block that defines them (fusion of elementwise chains).
* ``local`` — stored in each thread's registers in the lane layout (element
  i of the tile lives in thread i % T, slot i // T).  Legal when every use
  reads the value at the element's own coordinate.
* ``shared`` — stored in threadgroup memory, row-major.  Required when some
  use reads other coordinates: broadcasting (x[:, None]), any reduce() with a
  combine region, `dot` operands,
  `permute` (trans), `scan`, `join`, `split`, `flip` and `cat` operands, and `sort`
  results (sorted in place).  `reshape` and `expand_dims` read in place (the lane
  layout is row-major order, which a unit axis does not change).  A reduction along
  an axis reads its operand where it is held (lower_reductions.rows_reduce: lanes
  combine a row in place, or the operand is copied to threadgroup memory once, at the
  reduction): holding it there would keep a loop's accumulator, summed once after
  the loop, in threadgroup memory for the whole loop.

`row_held` names the last-axis reductions whose result is read only broadcast back over
their operand (lower_reductions may keep those in the registers of each row's lanes; their
placement stays `shared`, what they lower to where it cannot).

Reductions, scans, dot results and loop-carried / branch-result tiles are
always stored, and so are loads, which must happen once, in program order
relative to stores and barriers - except a load of a buffer the kernel never
writes whose value is evaluated at one place (`_fuse_single_loads`).  Loop-carried
values share one storage per carried slot (block argument, loop result); the group
is `shared` if any member needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.core import Block, Function, Op, Value, walk
from ..ir.ops import ELEMENTWISE
from ..ir.types import PointerType, TileType, dtype_of, elem_type

# permute reads its operand at other coordinates; reshape keeps the row-major order and so
# the lane layout (element i stays in thread i % T, slot i // T): it reads in place.
# join and split read their operands at other coordinates (the last axis added or dropped).
_INDEX_OPS = frozenset({"arange", "splat", "broadcast", "expand_dims", "permute", "reshape",
                        "join", "split", "flip", "cat"})


@dataclass
class Placement:
    kind: dict[int, str] = field(default_factory=dict)      # value id -> recompute|local|shared
    group: dict[int, int] = field(default_factory=dict)     # carried value id -> group id
    uses: dict[int, list] = field(default_factory=dict)     # value id -> [(op, operand index)]
    # last-axis reductions read only broadcast back over their operand's shape (_row_held)
    row_held: set[int] = field(default_factory=set)


def _is_tile(v: Value) -> bool:
    return isinstance(v.type, TileType)


def analyze(fn: Function) -> Placement:
    p = Placement()
    defs: dict[int, tuple[Value, Block | None]] = {}
    carried_groups: list[list[Value]] = []

    def scan(block: Block):
        for a in block.args:
            defs[a.id] = (a, block)
        for op in block.ops:
            for i, v in enumerate(op.operands):
                p.uses.setdefault(v.id, []).append((op, i))
            for r in op.results:
                defs[r.id] = (r, block)
            for region in op.regions:
                scan(region)
            if op.name == "for":
                body = op.regions[0]
                for arg, res in zip(body.args[1:], op.results):
                    carried_groups.append([arg, res])
            elif op.name == "while":
                cond, body = op.regions
                for a, b, res in zip(cond.args, body.args, op.results):
                    carried_groups.append([a, b, res])
            elif op.name == "if":
                for res in op.results:
                    carried_groups.append([res])

    scan(fn.body)

    cheap_memo: dict[int, bool] = {}

    def cheap(v: Value) -> bool:
        if v.id in cheap_memo:
            return cheap_memo[v.id]
        op = v.owner if isinstance(v.owner, Op) else None
        ok = False
        if op is not None and op.name in _INDEX_OPS:
            ok = all(cheap(o) for o in op.operands if _is_tile(o))
        elif op is not None and op.name in ELEMENTWISE:
            e = elem_type(v.type)
            integral = isinstance(e, PointerType) or not dtype_of(v.type).is_float
            ok = integral and all(cheap(o) for o in op.operands if _is_tile(o))
        cheap_memo[v.id] = ok
        return ok

    carried_ids = {v.id for g in carried_groups for v in g}
    for vid, (v, block) in defs.items():
        if not _is_tile(v) or vid in carried_ids:
            continue
        op = v.owner
        if cheap(v) or _widening(v):
            p.kind[vid] = "recompute"
        elif op.name in ELEMENTWISE or op.name in _INDEX_OPS:
            uses = p.uses.get(vid, [])
            single = len(uses) == 1 and _op_in_block(uses[0][0], block)
            p.kind[vid] = "recompute" if single else "stored"
        else:
            p.kind[vid] = "stored"  # load, reduce, dot
    _fuse_single_loads(fn, p, defs)

    remote_memo: dict[int, bool] = {}

    def remote(v: Value) -> bool:
        if v.id in remote_memo:
            return remote_memo[v.id]
        remote_memo[v.id] = False  # carried cycles resolve through groups below
        out = False
        for op, idx in p.uses.get(v.id, []):
            if op.name == "broadcast" and op.result.type.shape != v.type.shape:
                out = True
            elif op.name == "reduce":  # a combine region folds serially, even to a scalar
                # (an axis reduction reads its operand where it is, or copies it to
                # threadgroup memory first: lower_reductions.rows_reduce)
                out = out or op.attrs["kind"] == "combine"
            elif op.name in ("permute", "scan", "join", "split", "flip", "cat"):
                out = True
            elif op.name == "dot":
                out = out or idx < 2
            elif op.results and _is_tile(op.results[0]) and \
                    p.kind.get(op.results[0].id) == "recompute":
                out = out or remote(op.results[0])
            if out:
                break
        remote_memo[v.id] = out
        return out

    for vid, kind in list(p.kind.items()):
        if kind == "stored":
            # a sort result is sorted in place by a network whose threads trade elements
            in_place = getattr(defs[vid][0].owner, "name", None) == "sort"
            p.kind[vid] = "shared" if in_place or remote(defs[vid][0]) else "local"
    for gid, group in enumerate(carried_groups):
        if not _is_tile(group[0]):
            continue
        kind = "shared" if any(remote(v) for v in group) else "local"
        for v in group:
            p.kind[v.id] = kind
            p.group[v.id] = gid
    # A recompute value read remotely forces its stored operands into shared memory:
    # remote() already propagates through recompute consumers, so nothing more to do.
    _row_held(fn, p, remote)
    return p


def _row_held(fn: Function, p: Placement, remote) -> None:
    """The last-axis float sum/max/min reductions of a (rows, columns) tile whose result
    reaches its uses only broadcast back to (rows, columns): through elementwise ops with
    scalars, one expand_dims to (rows, 1) and a broadcast (`sum(x, axis=1)[:, None] * c`
    in an expression of x's shape), every value on the way evaluated where it is used and
    the broadcast read at no other coordinate.  Each use then reads row r's value in an
    element of row r of a tile laid out as the operand, so lower_reductions may hold the
    result in the registers of the lanes holding each row (`_rows_held`) instead of in
    threadgroup memory; the placement stays `shared` (what it lowers to where the lanes
    cannot)."""
    def scalar_like(v: Value) -> bool:
        return not _is_tile(v) or getattr(v.owner, "name", None) == "splat"

    def stays(v: Value, shape: tuple) -> bool:
        """Every element of `v` is read where an element of a `shape` tile is evaluated at
        the same coordinate: by stores, reductions, and same-shape elementwise ops (whose
        recomputed results stay so in turn) - not by a reshape, transpose or join, which
        read it at another tile's coordinates (a row-held value read there is out of its
        rows: the compiler failed an assertion)."""
        for use, _ in p.uses.get(v.id, []):
            if not use.results or use.name == "reduce":
                continue
            out = use.results[0]
            if use.name not in ELEMENTWISE or not _is_tile(out) or \
                    tuple(out.type.shape) != shape:
                return False
            if p.kind.get(out.id) == "recompute" and not stays(out, shape):
                return False
        return True

    def reaches(v: Value, shape: tuple, rows: int) -> bool:
        uses = p.uses.get(v.id, [])
        if not uses:
            return False
        for use, _ in uses:
            out = use.results[0] if use.results else None
            if out is None or not _is_tile(out):
                return False
            to = tuple(out.type.shape)
            if use.name == "broadcast" and len(tuple(v.type.shape)) == 2:
                if to != shape or p.kind.get(out.id) == "shared" or remote(out) or \
                        not stays(out, shape):
                    return False
                continue
            if p.kind.get(out.id) != "recompute":
                return False
            if use.name == "expand_dims" and tuple(v.type.shape) == (rows,) and to == (rows, 1):
                ok = reaches(out, shape, rows)
            elif use.name in ELEMENTWISE and to == tuple(v.type.shape) and \
                    all(o is v or scalar_like(o) for o in use.operands):
                ok = reaches(out, shape, rows)
            else:
                ok = False
            if not ok:
                return False
        return True

    for op in walk(fn.body):
        if op.name != "reduce" or op.attrs.get("kind") not in ("sum", "max", "min"):
            continue
        x = op.operands[0]
        if not _is_tile(x) or len(x.type.shape) != 2 or not dtype_of(x.type).is_float or \
                op.attrs.get("axis") != 1 or len(op.results) != 1:
            continue
        shape = tuple(x.type.shape)
        if reaches(op.results[0], shape, shape[0]):
            p.row_held.add(op.results[0].id)


def _fuse_single_loads(fn: Function, p: Placement, defs: dict) -> None:
    """Loads read where their one consumer is evaluated, instead of held.

    A device load of a buffer the kernel never writes, in a kernel without a dot (the
    GEMM lowering stages its own operands), whose value reaches exactly one evaluation
    point through same-block elementwise ops (recomputed ones used once, or one that is
    held), a store or a whole-tile reduction, reads the same memory wherever it is
    evaluated: later in program order is the same value.  Holding it cost a register
    array (a norm's weight, held across the row's reduction, took as many registers as
    the row)."""
    ops = list(walk(fn.body))
    if any(op.name == "dot" for op in ops):
        return
    written = {elem_type(op.operands[0].type).root for op in ops if op.name == "store"}

    def once(v: Value, block) -> bool:
        """Whether v is evaluated at one place: held (where it is materialized), or its
        one use is."""
        return p.kind.get(v.id) != "recompute" or used_once(v, block)

    def used_once(v: Value, block) -> bool:
        uses = p.uses.get(v.id, [])
        if len(uses) != 1 or not _op_in_block(uses[0][0], block):
            return False
        use = uses[0][0]
        if use.name == "store":
            return True
        if use.name == "reduce":
            return use.attrs["kind"] != "combine"
        return use.name in ELEMENTWISE and use.results[0].type.shape == v.type.shape and \
            once(use.results[0], block)

    for op in ops:
        if op.name != "load" or not _is_tile(op.results[0]):
            continue
        ptr = elem_type(op.operands[0].type)
        v = op.results[0]
        if ptr.space == "threadgroup" or ptr.root in written or p.kind.get(v.id) != "stored":
            continue
        if used_once(v, defs[v.id][1]):
            p.kind[v.id] = "recompute"


def _widening(v: Value) -> bool:
    """A float tile widened from a narrower float (x.to(float32) of a float16 load): one
    conversion per use is cheaper than holding the wide copy, whose registers next to
    the narrow one halve the rows a row kernel keeps in flight."""
    op = v.owner if isinstance(v.owner, Op) else None
    if op is None or op.name != "cast":
        return False
    src, dst = dtype_of(op.operands[0].type), dtype_of(v.type)
    return src.is_float and dst.is_float and src.itemsize < dst.itemsize


def _op_in_block(op: Op, block: Block | None) -> bool:
    return block is not None and any(o is op for o in block.ops)
