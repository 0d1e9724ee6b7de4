"""Reductions, scans and `dot` for `lower_tiles` (a mixin of `Lowering`).

* Full reduction to a scalar: each thread folds the elements it owns, then
  `simd_reduce` combines the 32 lanes of a SIMD-group, lane 0 of each group
  writes its partial to threadgroup memory, and after a barrier every thread
  folds the partials (so every thread holds the result; no broadcast step).
  A trailing barrier lets the next reduction reuse the scratch.
* Reduction along the last axis (sum, max, min of floats), `rows_reduce`: where the
  lane layout puts each row in one aligned group of lanes, one run (or element) a lane
  - a row of C elements in runs of V on C / V lanes - every thread folds its run, the
  group combines by `C / V`-lane shuffles, and the group's first lane writes the row's
  result to threadgroup memory; a row on several whole SIMD-groups combines each
  group's shuffled partial in a second fold, a row a thread.  The operand is read where it is
  (registers or recomputed: placement does not force it into threadgroup memory).  A row
  that is one run (C = V) is one thread's: folded there and held in a register, where the
  lane layout puts the result's element (`_rows_in_lanes`), unless a use reads the result
  elsewhere.  A result read only broadcast back over its operand (`placement.row_held`,
  `r[:, None]` in an expression of the operand's shape) on rows of at most 32 lanes stays
  on the lanes that hold each row - the shuffles leave the total on all of them - in the
  register slot of its run (`_rows_held`): no threadgroup memory, no barrier.
  Where the layout does not allow that (rows wider than a SIMD-group's runs, a tile
  that does not fill whole slots), the operand is copied to threadgroup memory and each
  result element folds its row there.
* Reduction along another axis of a rank >= 2 tile (and argmax/argmin along an
  axis): the operand is copied to threadgroup memory (unless it is held there) and
  each result element is a serial fold over the axis.
* argmax/argmin: to a scalar, two block reductions (the extreme value, then the
  smallest index holding it); along an axis, a serial scan keeping (value, index).
  Either way ties give the smallest index (Triton's tie_break_left) on every
  backend, independent of the order lanes combine in.
* cumsum/cumprod and associative_scan (`scan`): the operands are in threadgroup
  memory and each result element folds its line along the axis up to itself, in
  order (O(n) per element, not a log-depth scan); associative_scan's combine
  region is inlined into that fold.
* `dot`: operands in threadgroup memory, each output element a serial fold
  over K in float32.  This is the reference lowering; SIMD-group matrix and
  tensor-core lowerings replace it where a schedule selects them.
Float reductions accumulate in float32 and round back to the operand dtype.
"""

from __future__ import annotations

from math import prod

from ..ir.core import Block, Builder, Op, Value
from ..ir.types import ScalarType, TileType, dtype_of
from ..language import dtypes as dt
from .lane_layout import BOOL, I32, Ctx, Storage


def rows_reducible(op: Op) -> bool:
    """Whether a reduce is one `rows_reduce` lowers where it stands (its operand read in
    place, not from threadgroup memory): sum, max or min of floats along the last axis."""
    if op.name != "reduce" or op.attrs["kind"] not in ("sum", "max", "min"):
        return False
    x = op.operands[0]
    axis = op.attrs["axis"]
    return isinstance(x.type, TileType) and axis is not None and \
        axis == len(x.type.shape) - 1 and len(x.type.shape) >= 2 and dtype_of(x.type).is_float


class ReductionLowering:
    @staticmethod
    def _acc_dtype(d: dt.DType) -> dt.DType:
        return dt.float32 if d.is_float else d

    def _identity(self, b: Builder, kind: str, d: dt.DType) -> Value:
        if kind in ("sum", "xor", "or"):
            return self.const(b, 0.0 if d.is_float else 0, d)
        big = {"f": float("inf"), "i": 2**(d.bits - 1) - 1, "u": 2**d.bits - 1}[d.kind]
        if kind == "max":
            big = {"f": float("-inf"), "i": -2**(d.bits - 1), "u": 0}[d.kind]
        return self.const(b, big, d)

    @staticmethod
    def _skips_nan(kind: str, d: dt.DType) -> bool:
        """A float max/min fold: its combine skips a NaN operand, so a fold that starts
        from an element (not from the identity) would return NaN for an all-NaN line."""
        return kind in ("max", "min") and d.is_float

    def _combine(self, b: Builder, kind: str, a: Value, x: Value) -> Value:
        name = {"sum": "add", "max": "maximum", "min": "minimum", "xor": "xor", "or": "or"}[kind]
        return b.value(name, [a, x], a.type)

    def _cast(self, b: Builder, v: Value, d: dt.DType) -> Value:
        return v if v.type.dtype == d else b.value("cast", [v], ScalarType(d), to=d)

    def full_reduce(self, op: Op, b: Builder) -> Value:
        (x,) = op.operands
        kind, d = op.attrs["kind"], dtype_of(x.type)
        if kind in ("argmax", "argmin"):
            return self.full_arg_reduce(op, b)
        acc_d = self._acc_dtype(d)
        r = self._fold_all(b, x.type.shape, kind, acc_d,
                           lambda ctx: self._cast(ctx.b, self.elem(x, ctx), acc_d))
        return self._cast(b, r, d)

    def full_arg_reduce(self, op: Op, b: Builder) -> Value:
        """Two block reductions: the extreme value, then the smallest (tie_break_left=False:
        largest) row-major index holding it, so ties resolve the same on every backend
        whatever order lanes combine in."""
        (x,) = op.operands
        d = dtype_of(x.type)
        acc_d = self._acc_dtype(d)
        value_kind = op.attrs["kind"][3:]
        best = self._fold_all(b, x.type.shape, value_kind, acc_d,
                              lambda ctx: self._cast(ctx.b, self.elem(x, ctx), acc_d))
        left = op.attrs.get("tie_break_left", True)
        index_kind = "min" if left else "max"
        none = self._identity(b, index_kind, dt.int32)

        def index(ctx: Ctx) -> Value:
            e = self._cast(ctx.b, self.elem(x, ctx), acc_d)
            hit = ctx.b.value("eq", [e, best], BOOL)
            return ctx.b.value("where", [hit, ctx.linear(ctx.shape), none], I32)

        i = self._fold_all(b, x.type.shape, index_kind, dt.int32, index)
        # Only NaN can match nothing (its order is unspecified, as in Triton): keep the
        # index inside the tile rather than return the fold's identity.
        last = self.const(b, x.type.numel - 1)
        clamp = "minimum" if left else "maximum"
        return b.value(clamp, [i, last if left else self.const(b, 0)], I32)

    def _fold_all(self, b: Builder, shape, kind: str, acc_d: dt.DType, element) -> Value:
        """Fold `element(ctx)` over every element of a tile of `shape`: per thread, across a
        SIMD-group, then across SIMD-groups through threadgroup memory.  Every thread gets
        the result."""
        acc = self.decl("var", acc_d, prefix="_acc")
        b.op("var_set", [self._identity(b, kind, acc_d)], [], {"name": acc})

        def body(ctx: Ctx):
            e = element(ctx)
            cur = ctx.b.value("var_get", [], ScalarType(acc_d), name=acc)
            ctx.b.op("var_set", [self._combine(ctx.b, kind, cur, e)], [], {"name": acc})

        self.lane_loop(b, shape, body)
        part = b.value("var_get", [], ScalarType(acc_d), name=acc)
        r = b.value("simd_reduce", [part], ScalarType(acc_d), kind=kind)
        groups = self.T // 32
        if groups > 1:
            scratch = self.decl("shared", acc_d, groups, "_red")
            then = Block()
            tb = Builder(then)
            tb.op("mem_store", [self.geom(b, "simd_group"), r], [], {"root": scratch,
                                                                     "space": "threadgroup"})
            first = b.value("eq", [self.geom(b, "simd_lane"), self.const(b, 0)], BOOL)
            b.op("if", [first], [], regions=[then, Block()])
            self.barrier(b)
            b.op("var_set", [self._identity(b, kind, acc_d)], [], {"name": acc})
            loop = Block()
            j = loop.add_arg(I32, "j")
            lb = Builder(loop)
            part = lb.value("mem_load", [j], ScalarType(acc_d), root=scratch, space="threadgroup")
            cur = lb.value("var_get", [], ScalarType(acc_d), name=acc)
            lb.op("var_set", [self._combine(lb, kind, cur, part)], [], {"name": acc})
            b.op("for", [self.const(b, 0), self.const(b, groups), self.const(b, 1)], [],
                 regions=[loop])
            r = b.value("var_get", [], ScalarType(acc_d), name=acc)
            if self.loop_depth:
                # the next iteration's partials overwrite this scratch: every thread must
                # have read it first.  (Each reduction has its own scratch, so one run
                # once per program needs no second barrier: a row kernel's reduction is
                # one barrier, not two.)
                self.barrier(b)
        return r

    def rows_reduce(self, op: Op, b: Builder) -> None:
        """A reduction along the last axis (`rows_reducible`) lowered where it stands (module
        docstring): its result is held in threadgroup memory, one element a row."""
        (x,) = op.operands
        kind, d, shape = op.attrs["kind"], dtype_of(x.type), x.type.shape
        acc_d = self._acc_dtype(d)
        result = op.results[0]
        numel, columns = prod(shape), shape[-1]
        v = self.runs_for(numel)
        lanes = columns // v
        slots = numel // (self.T * v) if numel % (self.T * v) == 0 else 0
        if columns % v or lanes & (lanes - 1) or not slots or slots > 64 or \
                (self.T * v) % columns:
            return self.axis_reduce_in_shared(op, b)
        rows = numel // columns
        if lanes == 1 and self.runs_for(rows) == 1 and \
                self.place.kind.get(result.id) != "shared":
            return self._rows_in_lanes(op, b, v, slots)
        if lanes <= 32 and result.id in self.place.row_held:
            return self._rows_held(op, b, v, lanes, slots)
        out = self.decl("shared", d, rows, "_rows")
        parts = self._run_partials(b, x, kind, acc_d, v, slots)
        # a row wider than a SIMD-group's lanes: each SIMD-group of the row combines its
        # lanes, writes its partial, and a second fold combines the row's partials
        # (attention's 64-key score rows on 1024 threads folded each row serially in one
        # thread, all 32 lanes of a warp reading one bank)
        groups = max(1, lanes // 32)
        partials = self.decl("shared", acc_d, rows * groups, "_rowparts") if groups > 1 else None
        if self.loop_depth:
            # the last iteration's readers of `out` must be done before it is rewritten
            self.barrier(b)
        # the lanes combine outside the lane loop: its whole-runs test may send the lanes
        # of one SIMD-group down different copies, and every lane must reach one shuffle
        tid = self.geom(b, "thread_id")
        group_lanes = min(lanes, 32)
        first = b.value("eq", [b.value("mod", [tid, self.const(b, group_lanes)], I32),
                               self.const(b, 0)], BOOL)
        for s in range(slots):
            part = self._lanes_total(b, parts, s, kind, acc_d, group_lanes)
            start = self.add(b, b.value("mul", [tid, self.const(b, v)], I32),
                             self.const(b, s * self.T * v))
            row = b.value("idiv", [start, self.const(b, columns)], I32)
            then = Block()
            tb = Builder(then)
            if partials is None:
                tb.op("mem_store", [row, self._cast(tb, part, d)], [],
                      {"root": out, "space": "threadgroup"})
            else:   # the row's partial number (thread's lane group within the row)
                at = tb.value("idiv", [tb.value("mod", [tid, self.const(tb, lanes)], I32),
                                       self.const(tb, 32)], I32)
                tb.op("mem_store", [self.add(tb, tb.value("mul", [row, self.const(tb, groups)],
                                                          I32), at), part], [],
                      {"root": partials, "space": "threadgroup"})
            b.op("if", [first], [], regions=[then, Block()])
        self.barrier(b)
        if partials is not None:
            self._fold_partials(b, kind, acc_d, d, partials, groups, rows, out)
        self.storage[result.id] = Storage("shared", out, tuple(result.type.shape), d)

    def _rows_in_lanes(self, op: Op, b: Builder, v: int, slots: int) -> None:
        """rows_reduce where each row is one run of one thread (the last axis V wide): the
        thread folds its run and keeps the result in a register.  Why it may: the run of row
        r sits on thread r % T at run slot r // T, which is where the lane layout puts
        element r of the (rows,) result - so no lanes combine, nothing goes through
        threadgroup memory and no barrier is needed, provided the result is laid out one
        element a lane (not in runs itself) and no use reads it elsewhere (placement)."""
        (x,) = op.operands
        kind, d = op.attrs["kind"], dtype_of(x.type)
        acc_d = self._acc_dtype(d)
        result = op.results[0]
        held = self.decl("local", d, slots, "_rowred")

        def fold(ctxs):
            lb, slot, acc = self._fold_run(x, kind, acc_d, v, ctxs)
            lb.op("local_set", [slot, self._cast(lb, acc, d)], [], {"name": held})

        self._each_run(b, x.type.shape, v, fold)
        self.storage[result.id] = Storage("local", held, tuple(result.type.shape), d)

    def _rows_held(self, op: Op, b: Builder, v: int, lanes: int, slots: int) -> None:
        """rows_reduce whose result is read only broadcast back over its operand's shape
        (placement.row_held: `sum(x, axis=-1)[:, None]` in an expression of x's shape), each
        row on at most 32 lanes: every lane holding a run of a row folds it and the row's
        lanes combine by butterfly shuffles, which leave the row's total on each of them -
        in the register slot of that run (Storage kind `rows`), where the broadcast's
        element code reads it.  No threadgroup memory and no barrier: a loop that reduces
        each block's rows (decode attention's scores) keeps its lanes independent."""
        (x,) = op.operands
        kind, d = op.attrs["kind"], dtype_of(x.type)
        acc_d = self._acc_dtype(d)
        result = op.results[0]
        parts = self._run_partials(b, x, kind, acc_d, v, slots)
        held = self.decl("local", d, slots, "_rowheld")
        # (outside the lane loop, as in rows_reduce: every lane reaches the shuffles)
        for s in range(slots):
            part = self._lanes_total(b, parts, s, kind, acc_d, lanes)
            b.op("local_set", [self.const(b, s), self._cast(b, part, d)], [], {"name": held})
        self.storage[result.id] = Storage("rows", held, tuple(result.type.shape), d,
                                          parent=tuple(x.type.shape), width=v)

    def _run_partials(self, b: Builder, x, kind: str, acc_d, v: int, slots: int) -> str:
        """The register array of each thread's folded runs of `x` (slot s: its run slot s),
        for the lanes of each row to combine."""
        parts = self.decl("local", acc_d, slots, "_part")

        def fold(ctxs):
            lb, slot, acc = self._fold_run(x, kind, acc_d, v, ctxs)
            lb.op("local_set", [slot, acc], [], {"name": parts})

        self._each_run(b, x.type.shape, v, fold)
        return parts

    def _lanes_total(self, b: Builder, parts: str, s: int, kind: str, acc_d, lanes: int):
        """Slot `s` of `parts` combined over each aligned group of `lanes` lanes (on every
        lane of the group: butterfly shuffles)."""
        part = b.value("local_get", [self.const(b, s)], ScalarType(acc_d), name=parts)
        if lanes > 1:
            part = b.value("simd_reduce", [part], ScalarType(acc_d), kind=kind, lanes=lanes)
        return part

    def _fold_run(self, x, kind: str, acc_d, v: int, ctxs):
        """(builder, register slot of the run, fold) of `x` over one run's element contexts
        (a run of v elements, or one element where v is 1)."""
        # float max/min start from the fold's -inf/+inf as the other paths do: a run of
        # only NaN then gives that start, not NaN (README; fmax skips a NaN operand)
        acc = self._identity(ctxs[0].b, kind, acc_d) if self._skips_nan(kind, acc_d) else None
        for ctx in ctxs:
            e = self._cast(ctx.b, self.elem(x, ctx), acc_d)
            acc = e if acc is None else self._combine(ctx.b, kind, acc, e)
        lb = ctxs[0].b
        # a run's first element sits at register slot (its slot) * v
        slot = ctxs[0].slot if v == 1 else lb.value("idiv", [ctxs[0].slot,
                                                             self.const(lb, v)], I32)
        return lb, slot, acc

    def _each_run(self, b: Builder, shape, v: int, fold) -> None:
        """`fold(ctxs)` once per run of a tile of `shape` in runs of v (per element where v
        is 1)."""
        if v > 1:
            self.run_lane_loop(b, shape, None, group=fold)
        else:
            self.lane_loop(b, shape, lambda ctx: fold([ctx]))

    def _fold_partials(self, b: Builder, kind: str, acc_d, d, partials: str, groups: int,
                       rows: int, out: str) -> None:
        """out[row] = the fold of partials[row * groups : (row + 1) * groups], a row a
        thread, then a barrier (rows_reduce's rows wider than a SIMD-group)."""
        def body(ctx: Ctx) -> None:
            lb = ctx.b
            row = ctx.linear((rows,))
            base = lb.value("mul", [row, self.const(lb, groups)], I32)
            acc = None
            for g in range(groups):
                e = lb.value("mem_load", [self.add(lb, base, self.const(lb, g))],
                             ScalarType(acc_d), root=partials, space="threadgroup")
                acc = e if acc is None else self._combine(lb, kind, acc, e)
            lb.op("mem_store", [row, self._cast(lb, acc, d)], [],
                  {"root": out, "space": "threadgroup"})

        self.lane_loop(b, (rows,), body)
        self.barrier(b)

    def axis_reduce_in_shared(self, op: Op, b: Builder) -> None:
        """A reduction along an axis as serial folds (`rows_reduce` where the layout puts no
        row on one group of lanes, and every other axis reduction): the operand copied to
        threadgroup memory unless it is held there, each result element a fold along its
        line there."""
        (x,) = op.operands
        held = self.storage.get(x.id)
        # (one copy for every reduction of x later in the same block: x along both axes)
        self.storage[x.id] = self.shared_copy(x, b)
        try:
            self.materialize(op.results[0], b)
        finally:
            if held is None:
                self.storage.pop(x.id, None)
            else:
                self.storage[x.id] = held

    def axis_reduce(self, op: Op, ctx: Ctx) -> Value:
        (x,) = op.operands
        kind, axis, d = op.attrs["kind"], op.attrs["axis"], dtype_of(x.type)
        if kind in ("argmax", "argmin"):
            return self.axis_arg_reduce(op, ctx)
        acc_d = self._acc_dtype(d)
        acc = self.decl("var", acc_d, prefix="_acc")
        ctx.b.op("var_set", [self._identity(ctx.b, kind, acc_d)], [], {"name": acc})

        def step(lb, j, e):
            cur = lb.value("var_get", [], ScalarType(acc_d), name=acc)
            lb.op("var_set", [self._combine(lb, kind, cur, e)], [], {"name": acc})

        self._along_axis(ctx, x, axis, acc_d, step)
        b = ctx.b
        return self._cast(b, b.value("var_get", [], ScalarType(acc_d), name=acc), d)

    def _along_axis(self, ctx: Ctx, x, axis: int, acc_d, step) -> None:
        """A loop over `axis` of tile `x` at this element's other coordinates: `step(lb, j,
        e)` builds the body, `e` being the element at index j (cast to `acc_d`)."""
        loop = Block()
        j = loop.add_arg(I32, "j")
        lb = Builder(loop)
        coords = list(ctx.coords())
        coords.insert(axis, j)
        e = self._cast(lb, self.elem(x, Ctx(self, lb, x.type.shape, coords=coords,
                                             identity=False)), acc_d)
        step(lb, j, e)
        b = ctx.b
        b.op("for", [self.const(b, 0), self.const(b, x.type.shape[axis]), self.const(b, 1)], [],
             regions=[loop])

    def axis_arg_reduce(self, op: Op, ctx: Ctx) -> Value:
        """A serial scan along the axis keeping (best value, its index): a strictly better
        element replaces the best, so ties keep the first index (`>=`/`<=`: the last)."""
        (x,) = op.operands
        kind, axis, d = op.attrs["kind"], op.attrs["axis"], dtype_of(x.type)
        acc_d = self._acc_dtype(d)
        value_kind = kind[3:]
        left = op.attrs.get("tie_break_left", True)
        better = {("max", True): "gt", ("max", False): "ge",
                  ("min", True): "lt", ("min", False): "le"}[value_kind, left]
        best = self.decl("var", acc_d, prefix="_best")
        at = self.decl("var", dt.int32, prefix="_at")
        ctx.b.op("var_set", [self._identity(ctx.b, value_kind, acc_d)], [], {"name": best})
        ctx.b.op("var_set", [self.const(ctx.b, 0)], [], {"name": at})

        def step(lb, j, e):
            cur = lb.value("var_get", [], ScalarType(acc_d), name=best)
            take = lb.value(better, [e, cur], BOOL)
            lb.op("var_set", [lb.value("where", [take, e, cur], ScalarType(acc_d))], [],
                  {"name": best})
            old = lb.value("var_get", [], I32, name=at)
            lb.op("var_set", [lb.value("where", [take, j, old], I32)], [], {"name": at})

        self._along_axis(ctx, x, axis, acc_d, step)
        return ctx.b.value("var_get", [], I32, name=at)

    def lower_scan(self, op: Op, b: Builder) -> None:
        """Every result of a scan written by one lane loop (a tuple scan folds its parts
        together)."""
        sts = [self.storage_for(r) for r in op.results]
        shared = any(st.kind == "shared" for st in sts)
        if shared:
            self.barrier(b)

        def body(ctx: Ctx):
            for st, v in zip(sts, self.scan_values(op, ctx)):
                self.write(st, ctx, v)

        self.lane_loop(b, op.results[0].type.shape, body)
        if shared:
            self.barrier(b)

    def scan_values(self, op: Op, ctx: Ctx) -> list[Value]:
        """Inclusive scan of the element's line along the axis: the line's first element
        (reverse: its last) combined in order with each next one up to this element, so an
        associative combine need not commute.  cumsum/cumprod add/multiply in the
        accumulation dtype; associative_scan inlines its combine region in the operands'
        dtypes.  The operands are in threadgroup memory (placement)."""
        xs, axis = op.operands, op.attrs["axis"]
        reverse, kind = op.attrs.get("reverse", False), op.attrs["kind"]
        dtypes = [dtype_of(x.type) for x in xs]
        if kind == "combine":
            acc_ds = dtypes

            def combine(lb, acc, e):
                return self.inline_region(op.regions[0], lb, acc + e)
        else:
            acc_ds = [self._acc_dtype(dtypes[0])]
            name = {"sum": "add", "prod": "mul"}[kind]

            def combine(lb, acc, e):
                return [lb.value(name, [acc[0], e[0]], acc[0].type)]
        b = ctx.b
        shape, n = xs[0].type.shape, xs[0].type.shape[axis]

        def line(bb, j):
            coords = list(ctx.coords())
            coords[axis] = j
            at = Ctx(self, bb, shape, coords=coords, identity=False)
            return [self._cast(bb, self.elem(x, at), d) for x, d in zip(xs, acc_ds)]

        accs = [self.decl("var", d, prefix="_acc") for d in acc_ds]
        for acc, v in zip(accs, line(b, self.const(b, n - 1 if reverse else 0))):
            b.op("var_set", [v], [], {"name": acc})
        here, one = ctx.coords()[axis], self.const(b, 1)
        if reverse:  # k counts down from the line's last-but-one element to this one
            lo, hi = self.const(b, 0), b.value("sub", [self.const(b, n - 1), here], I32)
        else:
            lo, hi = one, b.value("add", [here, one], I32)
        loop = Block()
        k = loop.add_arg(I32, "j")
        lb = Builder(loop)
        j = lb.value("sub", [self.const(lb, n - 2), k], I32) if reverse else k
        cur = [lb.value("var_get", [], ScalarType(d), name=a) for a, d in zip(accs, acc_ds)]
        for acc, v in zip(accs, combine(lb, cur, line(lb, j))):
            lb.op("var_set", [v], [], {"name": acc})
        b.op("for", [lo, hi, one], [], regions=[loop])
        return [self._cast(b, b.value("var_get", [], ScalarType(a_d), name=a), d)
                for a, a_d, d in zip(accs, acc_ds, dtypes)]

    def lower_combine_reduce(self, op: Op, b: Builder) -> None:
        """reduce() with a combine region: scalar results are folded by every thread over the
        whole operand (read from threadgroup memory); tile results element by element."""
        if isinstance(op.results[0].type, TileType):
            for r in op.results:
                if self.place.kind[r.id] != "recompute":
                    self.materialize(r, b)
            return
        xs = op.operands
        shape = xs[0].type.shape

        def element(bb, j):
            at = Ctx(self, bb, shape, lin=j, identity=False)
            return [self.elem(x, at) for x in xs]

        for r, v in zip(op.results, self._fold_in_order(op, b, xs[0].type.numel, element)):
            self.scalars[r.id] = v

    def combine_values(self, op: Op, ctx: Ctx) -> list[Value]:
        """reduce() along an axis: this element's line folded in order."""
        xs, axis = op.operands, op.attrs["axis"]
        shape = xs[0].type.shape

        def element(bb, j):
            coords = list(ctx.coords())
            coords.insert(axis, j)
            at = Ctx(self, bb, shape, coords=coords, identity=False)
            return [self.elem(x, at) for x in xs]

        return self._fold_in_order(op, ctx.b, shape[axis], element)

    def _fold_in_order(self, op: Op, b: Builder, n: int, element) -> list[Value]:
        """element(0) combined with element(1), ..., element(n - 1) through the region."""
        dtypes = [dtype_of(x.type) for x in op.operands]
        accs = [self.decl("var", d, prefix="_acc") for d in dtypes]
        for acc, v in zip(accs, element(b, self.const(b, 0))):
            b.op("var_set", [v], [], {"name": acc})
        if n > 1:
            loop = Block()
            j = loop.add_arg(I32, "j")
            lb = Builder(loop)
            lb.loc = b.loc
            cur = [lb.value("var_get", [], ScalarType(d), name=a) for a, d in zip(accs, dtypes)]
            for acc, v in zip(accs, self.inline_region(op.regions[0], lb, cur + element(lb, j))):
                lb.op("var_set", [v], [], {"name": acc})
            b.op("for", [self.const(b, 1), self.const(b, n), self.const(b, 1)], [],
                 regions=[loop])
        return [b.value("var_get", [], ScalarType(d), name=a) for a, d in zip(accs, dtypes)]

    def inline_region(self, region: Block, b: Builder, args: list[Value]) -> list[Value]:
        """A combine region's scalar ops emitted into `b` on `args`; its yielded values."""
        for a, v in zip(region.args, args):
            self.scalars[a.id] = v
        return [self.s(y) for y in self.lower_block(region, b)]

    def dot(self, op: Op, ctx: Ctx) -> Value:
        a, bm, acc_in = op.operands
        f32 = ScalarType(dt.float32)
        acc = self.decl("var", dt.float32, prefix="_acc")
        ctx.b.op("var_set", [self.elem(acc_in, ctx)], [], {"name": acc})
        m, n = ctx.coords()
        loop = Block()
        k = loop.add_arg(I32, "k")
        lb = Builder(loop)
        av = self.elem(a, Ctx(self, lb, a.type.shape, coords=[m, k], identity=False))
        bv = self.elem(bm, Ctx(self, lb, bm.type.shape, coords=[k, n], identity=False))
        prod_ = lb.value("mul", [self._cast(lb, av, dt.float32), self._cast(lb, bv, dt.float32)], f32)
        cur = lb.value("var_get", [], f32, name=acc)
        lb.op("var_set", [lb.value("add", [cur, prod_], f32)], [], {"name": acc})
        b = ctx.b
        b.op("for", [self.const(b, 0), self.const(b, a.type.shape[1]), self.const(b, 1)], [],
             regions=[loop])
        return b.value("var_get", [], f32, name=acc)

    def geom(self, b: Builder, name: str) -> Value:
        return b.value(name, [], I32)
