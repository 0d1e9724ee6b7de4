"""GEMM operand staging under the schedule plan (a mixin of `MatmulLowering`).

Three named passes, each appended to the execution report's `passes` when it
runs; all consume the proofs of `gemm_bounds` (specialized sizes only):

* `split_k_loop`: the K loop becomes the complete iterations (k + BK <= K, the
  staging masks' K conjuncts proven and dropped) and at most one guarded
  remainder iteration; loops are reported as "interior" / "remainder".
* `vectorize_staging` (plan.vector_width == 4): in complete iterations of
  interior output tiles, a proven, 4-aligned operand tile is copied with one
  4-wide device load per group of 4 consecutive columns; everything else keeps
  scalar masked copies.
* `double_buffer_staging` (plan.double_buffer is True): two threadgroup stages
  alternate over K; step t copies tile t + 1 while multiplying tile t, with one
  barrier per step.

Edge output tiles (program ids past `gemm_bounds`' p_max) take a separate copy
with their row/column guards: a uniform branch per threadgroup.
"""

from __future__ import annotations

from math import prod

from ..ir.core import Block, Builder, Op, Value
from ..ir.types import ScalarType, TileType, elem_type
from .gemm_bounds import staging_load
from .lane_layout import BOOL, I32, Ctx, Storage


class GemmStaging:
    """Expects the `MatmulLowering` state: gemm, gemm_plan, gemm_bounds, schedule_plan,
    stage_a / stage_b, k_body, interior_tile, and the fragment / FFMA steps."""

    def _bind_k(self, b: Builder, k: Value) -> None:
        """Bind the K induction variable to `k` and lower the body's scalar work there."""
        body = self.k_body
        self.scalars[body.args[0].id] = k
        for bop in body.ops:  # scalar work of the body; tiles are evaluated where staged
            if bop.name in ("yield", "dot") or any(isinstance(r.type, TileType)
                                                    for r in bop.results):
                continue
            b.loc = bop.loc
            self.lower_op(bop, b)

    def _interior_predicate(self, b: Builder):
        """A uniform bool: this threadgroup's output tile is interior (see gemm_bounds),
        None when every tile is (no row/column conjunct), False when none is."""
        bounds = self.gemm_bounds
        if not bounds.any_interior_tile:
            return False
        axes = bounds.predicate_axes
        if not axes:
            return None
        cond = None
        for axis, p in sorted(axes.items()):
            pid = self.program_id(b, axis)
            c = b.value("le", [pid, self.const(b, p)], BOOL)
            cond = c if cond is None else b.value("and", [cond, c], BOOL)
        return cond

    def _stage(self, b: Builder, k: Value, facts, stage: int | Value = 0) -> None:
        """Copy the operand tiles of the K step at `k` into stage `stage` (0 or 1), with
        the guards `facts` cannot prove; interior tiles and edge tiles get separate copies
        when the proofs differ."""
        self._bind_k(b, k)
        bounds = self.gemm_bounds
        if bounds is None:
            return self._copy(b, None, stage)
        pred = self.interior_tile
        edge = bounds.with_edge(facts)
        same = all(bounds.remaining(ld, facts) == bounds.remaining(ld, edge)
                   for ld in bounds.loads)
        if pred is None or same:
            return self._copy(b, facts if pred is not False else edge, stage)
        if pred is False:
            return self._copy(b, edge, stage)
        then, other = Block(), Block()
        tb, eb = Builder(then), Builder(other)
        tb.loc = eb.loc = b.loc
        self._copy(tb, facts, stage)
        self._copy(eb, edge, stage)
        b.op("if", [pred], [], {}, [then, other])

    def _copy(self, b: Builder, facts, stage) -> None:
        bounds = self.gemm_bounds
        for value, st, shape in self.operand_stages():   # A, then each product's B
            base = (self._i(b, "mul", stage, prod(shape)) if isinstance(stage, Value)
                    else self.const(b, stage * prod(shape)))
            keep = {}
            if bounds is not None and facts is not None:
                keep = {id(ld): bounds.remaining(ld, facts) for ld in bounds.loads}
            ld = staging_load(value)
            if (ld is not None and keep.get(id(ld)) == [] and self._vector_ok(ld)):
                self.vectorize_staging(b, ld, st, shape, base)
                continue
            self.load_rewrite = (lambda op, ctx, keep=keep: self._guarded_load(op, ctx, keep)) \
                if keep else None
            try:
                self.lane_loop(b, shape, lambda ctx, st=st, value=value, base=base: ctx.b.op(
                    "mem_store", [self.add(ctx.b, base, ctx.linear(shape)), self.elem(value, ctx)],
                    [], {"root": st.name, "space": "threadgroup"}))
            finally:
                self.load_rewrite = None

    def _guarded_load(self, op: Op, ctx: Ctx, keep: dict) -> Value:
        """A staging load with only the unproven conjuncts of its mask."""
        b = ctx.b
        if id(op) not in keep:
            return self.emit_load(b, op, [self.elem(o, ctx) for o in op.operands])
        index = self.elem(op.operands[0], ctx)
        mask = None
        for c in keep[id(op)]:
            coords = [self.const(b, 0) if s == 1 and t != 1 else x
                      for x, s, t in zip(ctx.coords(), c.type.shape, ctx.shape)]
            m = self.elem(c, ctx.derived(c.type.shape, coords))
            mask = m if mask is None else b.value("and", [mask, m], BOOL)
        if mask is None:
            return self.emit_load(b, op, [index])
        return self.emit_load(b, op, [index, mask, self.elem(op.operands[2], ctx)])

    def _vector_ok(self, ld: Op) -> bool:
        sp, bounds = self.schedule_plan, self.gemm_bounds
        if sp is None or sp.vector_width != 4 or not bounds.aligned.get(id(ld)):
            return False
        root = elem_type(ld.operands[0].type).root
        return self.buffers.get((root, "written")) is None and (root, "read") in self.buffers

    def vectorize_staging(self, b: Builder, ld: Op, st: Storage, shape, base: Value) -> None:
        """Pass `vectorize_staging`: a proven-in-bounds, 4-aligned operand tile is copied
        with one 4-wide device load per lane and group of 4 consecutive columns (element
        (r, 4c + e) of the tile goes to lane (r * C/4 + c) % T, element e of its vector)."""
        rows, cols = shape
        groups = cols // 4
        dtype = st.dtype
        if "vectorize_staging" not in self.lowering_passes:
            self.lowering_passes.append("vectorize_staging")

        def body(ctx: Ctx) -> None:
            lb = ctx.b
            row = self._i(lb, "idiv", ctx.lin, groups)
            col = self._i(lb, "mul", self._i(lb, "mod", ctx.lin, groups), 4)
            view = Ctx(self, lb, shape, coords=[row, col], identity=False)
            index = self.elem(ld.operands[0], view)
            root = self.buffers[(elem_type(ld.operands[0].type).root, "read")]
            vec = lb.op("vec_load", [index], [ScalarType(dtype)] * 4,
                        {"root": root, "space": "device", "width": 4})
            self.vector_loads += 1
            dst = self.add(lb, base, self._i(lb, "add", self._i(lb, "mul", row, cols), col))
            for e, r in enumerate(vec.results):
                lb.op("mem_store", [self.add(lb, dst, self.const(lb, e)), r], [],
                      {"root": st.name, "space": "threadgroup"})

        self.lane_loop(b, (rows, groups), body)
        self.loops.append({"induction_variable": f"stage_{'a' if st is self.stage_a else 'b'}", "kind": "interior",
                           "lanes": self.T, "elements_per_lane": 4,
                           "iteration_step": 4 * self.T})

    def _compute(self, b: Builder, stage: int | Value = 0) -> None:
        g = self.gemm
        bm, bn, bk = g.tile
        if isinstance(stage, Value):
            ba, bb = self._i(b, "mul", stage, bm * bk), self._i(b, "mul", stage, bk * bn)
        else:
            ba, bb = self.const(b, stage * bm * bk), self.const(b, stage * bk * bn)
        if self.gemm_plan.unit:
            self._fragment_step(b, ba, bb)
        else:
            self._ffma_step(b, ba, bb)

    def _unsplit_k_loop(self, op: Op, b: Builder) -> None:
        """No proofs (extents unknown): one loop, every staging load keeps its mask."""
        bk = self.gemm.tile[2]
        lb, ub, step = (self.s(v) for v in op.operands[:3])
        self._for_k(b, lb, ub, step, "loop", lambda inner, k: (
            self.barrier(inner), self._stage(inner, k, None), inner.op("barrier"),
            self._compute(inner)))
        self.report_loop(self.k_body.args[0].hint or "k", "loop", bk)
        self._report_inner()

    def _for_k(self, b: Builder, lo, hi, step, kind: str, body) -> None:
        block = Block()
        k = block.add_arg(I32, self.k_body.args[0].hint)
        inner = Builder(block)
        inner.loc = b.loc
        body(inner, k)
        as_value = [x if isinstance(x, Value) else self.const(b, x) for x in (lo, hi, step)]
        b.op("for", as_value, [], {"kind": "tile_range" if kind == "loop" else kind}, [block])

    def split_k_loop(self, b: Builder) -> None:
        """Pass `split_k_loop`: complete K iterations (k + BK <= K: the K conjuncts of the
        staging masks are proven and dropped) in one loop, then at most one guarded
        remainder iteration at k = k_full.  Row/column guards stay unless proven."""
        bounds = self.gemm_bounds
        bk, iv = bounds.step, self.k_body.args[0].hint or "k"
        self.lowering_passes.append("split_k_loop")
        if bounds.n_full:
            self._for_k(b, bounds.lo, bounds.k_full, bk, "interior", lambda inner, k: (
                self.barrier(inner), self._stage(inner, k, bounds.interior_facts),
                inner.op("barrier"), self._compute(inner)))
            self.report_loop(iv, "interior", bk)
        if bounds.has_remainder:
            self.barrier(b)
            self._stage(b, self.const(b, bounds.k_full), bounds.remainder_facts)
            b.op("barrier")
            self._compute(b)
            self.report_loop(iv, "remainder", bk)
        self._report_inner()

    def double_buffer_staging(self, b: Builder) -> None:
        """Pass `double_buffer_staging`: canonical two-stage software pipelining.  Tile t
        lives in stage t % 2; step t copies tile t + 1 into the other stage while the
        SIMD-groups multiply tile t, then one barrier (it orders both this step's copies
        before the next step's reads and this step's reads before the next step's copies
        into the same stage).  Complete/remainder tiles keep their split guards."""
        bounds = self.gemm_bounds
        bk, lo, iv = bounds.step, bounds.lo, self.k_body.args[0].hint or "k"
        self.lowering_passes += ["split_k_loop", "double_buffer_staging"]
        n_full, rem = bounds.n_full, bounds.has_remainder
        n_tiles = n_full + (1 if rem else 0)
        if n_tiles == 0:
            return self._report_inner()

        def facts(t: int):
            return bounds.interior_facts if t < n_full else bounds.remainder_facts

        self._stage(b, self.const(b, lo), facts(0), 0)
        b.op("barrier")
        if n_full > 1:
            # Steps 0 .. n_full - 2 prefetch complete tiles.
            def step(inner: Builder, k: Value) -> None:
                t = self._i(inner, "idiv", self._i(inner, "sub", k, self.const(inner, lo)), bk)
                cur = self._i(inner, "mod", t, 2)
                nxt = self._i(inner, "sub", self.const(inner, 1), cur)
                self._stage(inner, self._i(inner, "add", k, bk), bounds.interior_facts, nxt)
                self._compute(inner, cur)
                inner.op("barrier")

            self._for_k(b, lo, bounds.k_full - bk, bk, "interior", step)
            self.report_loop(iv, "interior", bk)
        for t in range(max(0, n_full - 1), n_tiles):   # the last one or two steps, unrolled
            if t + 1 < n_tiles:
                self._stage(b, self.const(b, lo + (t + 1) * bk), facts(t + 1), (t + 1) % 2)
            self._compute(b, t % 2)
            if t + 1 < n_tiles:
                b.op("barrier")
            self.report_loop(iv, "interior" if t < n_full else "remainder", bk)
        self._report_inner()

    def _report_inner(self) -> None:
        unit = self.gemm_plan.unit
        self.report_loop("kk", "loop", unit.shape[2] if unit else 1)
