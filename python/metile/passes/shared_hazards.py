"""shared_hazards: the shared-memory contract of `simdgroup_inline` kernels,
checked on tile-form IR before planning.

Structure rules
  * shared allocations sit at the top level of the kernel body;
  * threadgroup pointers come from a `shared()` allocation through offsets
    only: no selection between pointers (`where`, if/loop results);
  * a shared matrix view fits its allocation and each matrix tile is provably
    inside the view (constant origin, a loop index over constant bounds, or an
    origin affine in the SIMD-group index `thread_id() // 32`, checked for every
    SIMD-group of the launch);
  * matrix origins, extents and bases are uniform within a SIMD-group, and so is
    the control flow around matrix operations (if conditions, for bounds, while
    conditions, values carried around loops);
  * a scratch allocation is used by no other access (the compiler owns it);
  * a device buffer touched by matrix operations is not both read and written.

Hazards.  A walk in program order keeps the shared accesses issued since the
last `barrier()`, each with the element interval it may touch (unknown
offsets cover the whole allocation).  These transitions need a barrier
between overlapping accesses: scalar write -> matrix read, matrix store ->
scalar read, matrix read -> any overwrite.  A tile whose origin is affine in
the SIMD-group index g covers [lo + step * g, hi + step * g]; two such
accesses are disjoint only when that holds for every pair of SIMD-groups
(the same group included).  Loops are walked until the state
at their head is stable, so accesses reaching around a backedge are caught
and reported as such.  Every violation is a CompilationError at the later
access's line that names the earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import CompilationError
from ..ir.core import Block, Function, Op, Value, walk
from ..ir.types import PointerType, ScalarType, TileType, elem_type

MATRIX = ("frag_view_load", "frag_view_store")


@dataclass(frozen=True)
class Access:
    kind: str            # "scalar_write" | "scalar_read" | "matrix_store" | "matrix_read"
    root: str
    lo: int | None       # element interval [lo, hi]; None: the whole allocation
    hi: int | None
    op_id: int
    line: int | None
    backedge: bool = False
    step: int = 0        # SIMD-group g touches [lo + step * g, hi + step * g]

    def span(self, groups: int):
        top = self.step * (groups - 1)
        return self.lo + min(0, top), self.hi + max(0, top)

    def overlaps(self, other: "Access", groups: int = 1) -> bool:
        if self.root != other.root:
            return False
        if None in (self.lo, self.hi, other.lo, other.hi):
            return True
        if self.step != other.step:
            (a, b), (c, d) = self.span(groups), other.span(groups)
            return a <= d and c <= b
        # group g against group g + k, for every k (0: the same SIMD-group)
        return any(self.lo <= other.hi + self.step * k and other.lo + self.step * k <= self.hi
                   for k in range(1 - groups, groups))


# (earlier kind, later kind) -> what the barrier would have done
RULES = {
    ("scalar_write", "matrix_read"): "publish the scalar write before the matrix read",
    ("matrix_store", "scalar_read"): "publish the matrix store before the scalar read",
    ("matrix_read", "scalar_write"): "finish the matrix read before the storage is overwritten",
    ("matrix_read", "matrix_store"): "finish the matrix read before the storage is overwritten",
}


def _def(v: Value) -> Op | None:
    return v.owner if isinstance(v.owner, Op) else None  # block arguments: None


def constant_value(v: Value):
    op = _def(v)
    if op is not None and op.name == "const" and isinstance(op.attrs["value"], int) \
            and not isinstance(op.attrs["value"], bool):
        return op.attrs["value"]
    return None


def pointer_origin(v: Value):
    """(shared_alloc op, constant element offset or None) of a threadgroup pointer."""
    offset = 0
    while _def(v) is not None and v.owner.name == "ptr_add":
        c = constant_value(v.owner.operands[1])
        offset = None if offset is None or c is None else offset + c
        v = v.owner.operands[0]
    if _def(v) is None or v.owner.name != "shared_alloc":
        return None, None
    return v.owner, offset


def _is_fragment_op(op: Op) -> bool:
    return op.name in MATRIX or any(
        isinstance(v.type, TileType) and tuple(v.type.shape) == (8, 8)
        for v in (*op.results, *op.operands))


def _line(op: Op):
    return op.loc.line if op.loc else None


def _yields(block: Block):
    return block.ops[-1].operands if block.ops and block.ops[-1].name == "yield" else []


class Checker:
    def __init__(self, fn: Function, threads: int | None = None):
        self.fn = fn
        self.groups = None if threads is None else max(1, threads // 32)  # SIMD-groups
        self.scratch = {op.attrs["scratch"] for op in walk(fn.body)
                        if op.name in MATRIX and op.attrs.get("scratch")}
        self.ranges: dict[int, tuple[int, int]] = {}   # loop iv -> [lo, hi]
        self.lane_divergent: set[int] = set()
        self.checking = False

    # -- structure ----------------------------------------------------------------------
    def structure(self) -> None:
        top = set(id(op) for op in self.fn.body.ops)
        for op in walk(self.fn.body):
            if op.name == "shared_alloc" and id(op) not in top:
                raise CompilationError("shared allocations belong at the top of the kernel, not "
                                       "inside a loop or branch", op.loc)
            if op.name not in ("shared_alloc", "ptr_add") and any(
                    isinstance(elem_type(r.type), PointerType)
                    and elem_type(r.type).space == "threadgroup" for r in op.results):
                raise CompilationError("conditional shared-pointer selection is unsupported: "
                                       "shared pointers must resolve to one allocation through "
                                       "offsets only", op.loc)
        while True:  # loop-carried values: to a fixed point (the set only grows), then check
            before = len(self.lane_divergent)
            self._divergence(self.fn.body)
            if len(self.lane_divergent) == before:
                break
        self.checking = True
        self._divergence(self.fn.body)
        reads, writes, matrix = set(), set(), set()
        for op in walk(self.fn.body):
            if op.name in ("load", "store", *MATRIX):
                p = elem_type(op.operands[0].type)
                if p.space == "device":
                    (reads if op.name.endswith("load") else writes).add(p.root)
                    if op.name in MATRIX:
                        matrix.add(p.root)
                else:
                    alloc, _ = pointer_origin(op.operands[0])
                    if alloc is not None and alloc.attrs["root"] in self.scratch:
                        raise CompilationError(
                            "scratch misuse: the scratch allocation is owned by the compiler; "
                            "do not access it through scalar operations, another matrix view "
                            "or an offset alias", op.loc)
            if op.name in MATRIX:
                self._matrix_rules(op)
        both = matrix & reads & writes
        if both:
            op = next(o for o in walk(self.fn.body) if o.name in MATRIX
                      and elem_type(o.operands[0].type).root in both)
            raise CompilationError(
                f"device buffer {sorted(both)[0]!r} is both read and written in this kernel and "
                f"used by matrix operations; barrier() only orders threadgroup memory, so use "
                f"separate input and output buffers", op.loc)

    def _divergence(self, block: Block, why: Op | None = None) -> None:
        """Values that may differ between the lanes of one SIMD-group; `why`: the
        enclosing loop or branch whose condition or bounds do."""
        for op in block.ops:
            if why is not None and self.checking and _is_fragment_op(op):
                what = ("the while loop at line {} has a condition that" if why.name == "while"
                        else "the loop or branch at line {}").format(_line(why))
                raise CompilationError(
                    f"matrix operations need control flow that is uniform within each "
                    f"SIMD-group; {what} depends on thread_id()", op.loc)
            if self.checking and op.name == "splat" and op.operands[0].id in self.lane_divergent \
                    and _is_fragment_op(op):
                raise CompilationError("scalar operands of fragment arithmetic must be uniform "
                                       "within each SIMD-group", op.loc)
            if op.name == "thread_id":
                self.lane_divergent.add(op.result.id)
            elif op.name == "idiv" and op.operands[0].id in self.lane_divergent \
                    and (constant_value(op.operands[1]) or 1) % 32 == 0 \
                    and _def(op.operands[0]) is not None \
                    and op.operands[0].owner.name == "thread_id":
                pass  # thread_id() // (32 k) is the same on every lane of a SIMD-group
            elif any(o.id in self.lane_divergent for o in op.operands):
                self.lane_divergent.update(r.id for r in op.results)
                for region in op.regions:
                    self.lane_divergent.update(a.id for a in region.args)
            if op.name == "while":
                self._while_divergence(op, why)
                continue
            if op.name == "for":
                lb, ub, step = (constant_value(v) for v in op.operands[:3])
                if None not in (lb, ub, step) and step > 0 and ub > lb:
                    self.ranges[op.regions[0].args[0].id] = (lb, lb + (ub - lb - 1) // step * step)
            control = op.operands[:3] if op.name == "for" else op.operands[:1]
            inner = why
            if op.name in ("for", "if") and any(v.id in self.lane_divergent for v in control):
                inner = why or op
            for region in op.regions:
                self._divergence(region, inner)
            # values carried around a loop or out of a branch
            if op.name == "for":
                body = op.regions[0]
                for y, arg, res in zip(_yields(body), body.args[1:], op.results):
                    if y.id in self.lane_divergent:
                        self.lane_divergent.update((arg.id, res.id))
            elif op.name == "if":
                for region in op.regions:
                    for y, res in zip(_yields(region), op.results):
                        if y.id in self.lane_divergent:
                            self.lane_divergent.add(res.id)

    def _while_divergence(self, op: Op, why: Op | None) -> None:
        """A while loop whose condition may differ between the lanes of a SIMD-group runs
        its body on a subset of them: no matrix operation may sit there."""
        cond, body = op.regions
        self._divergence(cond, why)
        c = cond.ops[-1].operands[0] if cond.ops and cond.ops[-1].name == "condition" else None
        lanes = c is not None and c.id in self.lane_divergent
        self._divergence(body, why or (op if lanes else None))
        for y, a, b, res in zip(_yields(body), cond.args, body.args, op.results):
            if lanes or y.id in self.lane_divergent:
                self.lane_divergent.update((a.id, b.id, res.id))

    def _affine(self, v: Value, depth: int = 0):
        """(k, lo, hi) with v in k * g + [lo, hi] for the SIMD-group index
        g = thread_id() // 32 in [0, groups - 1]; None when not provable."""
        c = constant_value(v)
        if c is not None:
            return 0, c, c
        r = self.ranges.get(v.id)
        if r is not None:
            return 0, r[0], r[1]
        op = _def(v)
        if op is None or depth > 32:
            return None
        if op.name == "idiv":
            src, d = _def(op.operands[0]), constant_value(op.operands[1])
            if src is None or src.name != "thread_id" or self.groups is None \
                    or not d or d <= 0 or d % 32:
                return None
            return (1, 0, 0) if d == 32 else (0, 0, (self.groups - 1) // (d // 32))
        if op.name in ("add", "sub", "mul") and isinstance(op.results[0].type, ScalarType) \
                and op.results[0].type.dtype.is_int:
            x, y = (self._affine(o, depth + 1) for o in op.operands[:2])
            if x is None or y is None:
                return None
            if op.name == "add":
                return x[0] + y[0], x[1] + y[1], x[2] + y[2]
            if op.name == "sub":
                return x[0] - y[0], x[1] - y[2], x[2] - y[1]
            if y[0] == 0 and y[1] == y[2]:
                x, y = y, x
            if x[0] == 0 and x[1] == x[2]:  # constant * affine
                m = x[1]
                return m * y[0], min(m * y[1], m * y[2]), max(m * y[1], m * y[2])
        return None

    def _interval(self, v: Value):
        """[lo, hi] of an integer value over every lane and SIMD-group, or None."""
        a = self._affine(v)
        if a is None:
            return None
        k, lo, hi = a
        top = k * ((self.groups or 1) - 1)
        return lo + min(0, top), hi + max(0, top)

    def _matrix_rules(self, op: Op) -> None:
        base, r0, c0, rows, cols = op.operands[:5]
        if any(v.id in self.lane_divergent for v in (base, r0, c0, rows, cols)):
            raise CompilationError("matrix origins, extents and bases must be uniform within each "
                                   "SIMD-group (this one depends on thread_id())", op.loc)
        p = elem_type(base.type)
        if p.space != "threadgroup":
            return
        alloc, offset = pointer_origin(base)
        s0, s1 = op.attrs["strides"]
        e0, e1 = op.attrs["extent"]
        size = alloc.attrs["size"]
        if offset is None or e0 is None or e1 is None:
            raise CompilationError("shared matrix views need a constant base offset and shape",
                                   op.loc)
        if offset + (e0 - 1) * s0 + (e1 - 1) * s1 >= size:
            raise CompilationError(f"the matrix view (shape ({e0}, {e1}), strides ({s0}, {s1}), "
                                   f"offset {offset}) does not fit its {size}-element shared "
                                   f"allocation", op.loc)
        for v, extent, axis in ((r0, e0, "row"), (c0, e1, "column")):
            span = self._interval(v)
            if span is None or span[0] < 0 or span[1] + 8 > extent:
                a = self._affine(v)
                every = (f" for every one of the {self.groups} SIMD-groups"
                         if a is not None and a[0] != 0 else "")
                raise CompilationError(
                    f"out-of-bounds shared tile: the 8x8 tile's {axis} origin is not provably "
                    f"within [0, {extent - 8}]{every} (matrix loads and stores need complete, "
                    f"in-bounds shared tiles)", op.loc)

    # -- hazards ------------------------------------------------------------------------
    def accesses(self, op: Op) -> list[Access]:
        if op.name not in ("load", "store", *MATRIX):
            return []
        p = elem_type(op.operands[0].type)
        if p.space != "threadgroup" or p.root in self.scratch:
            return []
        alloc, offset = pointer_origin(op.operands[0])
        root = alloc.attrs["root"] if alloc else p.root
        lo = hi = None
        step = 0
        if op.name in MATRIX:
            kind = "matrix_read" if op.name == "frag_view_load" else "matrix_store"
            s0, s1 = op.attrs["strides"]
            o = [self._affine(v) for v in op.operands[1:3]]
            if offset is not None and None not in o:
                lo = offset + o[0][1] * s0 + o[1][1] * s1
                hi = offset + (o[0][2] + 7) * s0 + (o[1][2] + 7) * s1
                step = o[0][0] * s0 + o[1][0] * s1
        else:
            kind = "scalar_read" if op.name == "load" else "scalar_write"
            if offset is not None and not isinstance(op.operands[0].type, TileType):
                lo = hi = offset
        return [Access(kind, root, lo, hi, id(op), _line(op), step=step)]

    def run(self, block: Block, pending: frozenset) -> frozenset:
        for op in block.ops:
            if op.name == "barrier":
                pending = frozenset()
                continue
            for acc in self.accesses(op):
                for prev in pending:
                    why = RULES.get((prev.kind, acc.kind))
                    if why and prev.overlaps(acc, self.groups or 1):
                        where = " across the loop backedge" if prev.backedge else ""
                        raise CompilationError(
                            f"missing barrier(){where}: {why} (the {prev.kind.replace('_', ' ')} "
                            f"at line {prev.line} overlaps this "
                            f"{acc.kind.replace('_', ' ')})", op.loc)
                pending = pending | {acc}
            if op.name == "for" or op.name == "while":
                body = op.regions[-1]
                head = pending
                while True:   # (to a fixed point: the pending set only grows)
                    if op.name == "while":
                        self.run(op.regions[0], head)
                    end = self.run(body, head)
                    new = head | frozenset(replace(a, backedge=True)
                                           for a in end if a not in head)
                    if new == head:
                        break
                    head = new
                # after the loop its accesses reach the code below through the exit, not
                # round the backedge (a write in the loop read after it was reported
                # "missing barrier() across the loop backedge")
                pending = frozenset(replace(a, backedge=False) for a in head)
            elif op.name == "if":
                pending = frozenset().union(*(self.run(r, pending) for r in op.regions))
        return pending


def check_shared_contract(fn: Function, threads: int | None = None) -> Function:
    """`threads`: the launch's thread count (SIMD-groups = threads / 32), which bounds
    origins computed from `thread_id() // 32`."""
    c = Checker(fn, threads)
    c.structure()
    c.run(fn.body, frozenset())
    return fn
