"""GEMM lowering for `lower_tiles` (a mixin of `Lowering`): the canonical dot
recurrence found by `passes.gemm` becomes staged matrix-fragment code.

Geometry.  The threadgroup is num_simdgroups x 32 threads.  The BM x BN output
tile is split over a SIMD-group grid (wm x wn); each SIMD-group owns a
(BM/wm) x (BN/wn) sub-tile made of fr x fc fragments of the backend's matrix
unit (`MatrixUnit`: 8x8x8 simdgroup_matrix on Metal, 16x16x16 WMMA on CUDA).

Per K step:  barrier; every thread copies its share of the (BM, BK) and
(BK, BN) operand tiles from device memory into threadgroup memory (the user's
own load expressions, masks included, so ragged edges read zero); barrier;
each SIMD-group loads operand fragments from threadgroup memory and runs
fr x fc multiply-accumulates per depth step, accumulating in float32.  With
specialized sizes (an explicit Schedule) `gemm_bounds` proves guards away and
`gemm_staging` splits the K loop, vectorizes aligned copies and double-buffers
the stages as the plan requires.

Epilogue.  No code depends on which lane holds which fragment element: each
accumulator fragment is stored to a per-SIMD-group float32 scratch in
threadgroup memory, and after a SIMD-group barrier every lane evaluates the
epilogue program for the scratch elements it picks (element e = lane + 32 s)
at their tile coordinates, then stores through the user's pointer and mask.
Epilogue reads (bias vectors, residual matrices; `gemm_epilogue_reads`) are
loaded there too, per element, under their own mask and the store's.

Program order.  With `program_order="grouped"` in the plan, the program ids are
remapped once at kernel entry (`grouped_program_order`): the launch-order
index l = p0 + p1 * n0 (axis 0 varies fastest) walks groups of G tiles along
axis 0; within a group, tiles go down the group's rows first, then across axis
1 (the last group has n0 mod G rows).  Every use of program_id(0/1) in the
kernel, the bounds predicates included, reads the remapped ids, so the kernel
computes exactly the tiles it would in launch order, in another order; the
remap is a bijection of the launched grid (axis 2 is untouched).

Without a matrix unit for the operand dtype and tile (strict float32 on CUDA,
or a tile that is not made of whole fragments) the same staging feeds an FFMA
path: each thread accumulates a TM x TN register micro-tile (rows ty + i*TY,
columns tx + j*TX, so consecutive threads store consecutive columns).  Where the
target has 16-byte asynchronous copies (CUDA) a float32 GEMM stages through the
cp.async ring in linear rows, and (TN a multiple of 4) the micro-tile's columns are
runs of four (4tx + (j/4)*4TX + j%4) so every operand read is one 16-byte chunk:
per 4 K steps one read of A per row, per K step one read of B per run
(`_ffma_vector_step`, pass `ffma_vector_reads`).

Dual GEMM (`GemmPattern.products == 2`, a gated MLP's act(A @ B1) * (A @ B2)).
A is staged once and each B into its own stage array (same layout, same
offsets); each K step loads the A fragments once and runs both products into
two accumulator sets (two register micro-tiles on the FFMA path), and the
epilogue program sees both accumulators at each element.  The warp-MMA and
FFMA paths take it, with either staging (ordinary loads or the cp.async ring);
the warpgroup (wgmma) path takes both where their accumulator tiles fit a thread's
budget together (a 128x128 tile on two warpgroups: one stage array per B, each
product's wgmma chain on the shared A stage); the tensor_ops/nax paths take one
product, so a dual GEMM is planned on the SIMD-group path there (compiler/planning.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompilationError
from ..ir.core import Block, Builder, Op, Value
from ..ir.types import ScalarType, elem_type
from ..language import dtypes as dt
from .gemm import GemmPattern, relaxed_precision  # noqa: F401 (re-exported)
from .gemm_async import AsyncStaging, swizzle_params
from ..schedule.plan import WGMMA_MAX_ACCUMULATORS
from ..schedule.targets import MatrixUnit
from .gemm_bounds import prove_gemm_bounds
from .gemm_staging import GemmStaging
from .gemm_tensor_ops import TensorOpsGemm
from .gemm_wgmma import WarpgroupGemm
from .lane_layout import BOOL, I32, Ctx, Storage

F32 = ScalarType(dt.float32)


@dataclass(frozen=True)
class GemmPlan:
    unit: MatrixUnit | None        # None: FFMA register micro-tiles
    threads: int
    grid: tuple[int, int]          # SIMD-group grid (fragments) or thread grid (FFMA)

    @property
    def fragment(self) -> str:
        return self.unit.name if self.unit else "ffma"


DEFAULT_SIMDGROUPS = (4, 2, 1)


def _factor_grid(nsg: int, bm: int, bn: int, fm: int, fn: int):
    """(wm, wn) with wm * wn = nsg splitting bm x bn into whole fm x fn fragments,
    preferring square per-SIMD-group tiles."""
    options = [(wm, nsg // wm) for wm in range(1, nsg + 1)
               if nsg % wm == 0 and bm % (wm * fm) == 0 and bn % ((nsg // wm) * fn) == 0]
    return min(options, key=lambda g: (abs(bm // g[0] - bn // g[1]), -g[0])) if options else None


def _thread_grid(threads: int, bm: int, bn: int):
    """(ty, tx) with ty * tx = threads, tx | bn, ty | bm: balanced micro-tiles, wide rows."""
    options = [(threads // tx, tx) for tx in range(1, min(threads, bn) + 1)
               if threads % tx == 0 and bn % tx == 0 and bm % (threads // tx) == 0]
    if not options:
        return None
    return min(options, key=lambda g: (abs(bm // g[0] - bn // g[1]), -g[1]))


def _warpgroup_plan(g: GemmPattern, unit, requested_threads: int | None) -> GemmPlan | None:
    """W warpgroups, each owning BM/W rows as m64 x nBN products (gemm_wgmma.py), or
    None when the tile does not fit the unit: BM, BN, BK multiples of 64 (whole swizzle
    atoms), BN <= 256 (the widest product), both operands plain loads contiguous along
    their last axis (what the swizzled cp.async copies need)."""
    from .gemm_async import plain_contiguous_operands
    bm, bn, bk = g.tile
    if not unit.fits_tile(g.tile) or not plain_contiguous_operands(g, k_major_b=True):
        return None
    rows = bm // 64
    if requested_threads:
        multiplying = requested_threads - unit.producer_threads
        if multiplying % 128:
            return None
        options = [multiplying // 128]
    else:
        options = [w for w in (4, 2, 1) if w <= rows]
    for nwg in options:
        if nwg >= 1 and rows % nwg == 0 and \
                g.products * (rows // nwg) * bn // 2 <= WGMMA_MAX_ACCUMULATORS:
            return GemmPlan(unit, nwg * 128 + unit.producer_threads, (nwg, 1))
    return None


def plan_gemm(g: GemmPattern, units, relaxed: bool, requested_threads: int | None,
              planned_threads: bool = False) -> GemmPlan:
    """The matrix unit and thread grid for `g`: the first unit of `units` that takes the
    operands and tiles the tile.  `planned_threads`: the thread count is the planner's
    default, not the caller's, so a warpgroup unit may choose its own."""
    bm, bn, bk = g.tile
    d = g.operand_dtype.name
    counts = [requested_threads // 32] if requested_threads else list(DEFAULT_SIMDGROUPS)
    for unit in units:
        # Tensor-op units (tensor_ops, nax) are planned by their backend (compiler/planning.py).
        if unit.path is not None or not unit.takes(d, relaxed):
            continue
        if unit.warpgroup:
            plan = _warpgroup_plan(g, unit, None if planned_threads else requested_threads)
            if plan is not None:
                return plan
            continue
        fm, fn, fk = unit.shape
        if bk % fk:
            continue
        for nsg in counts:
            grid = _factor_grid(nsg, bm, bn, fm, fn)
            if grid:
                return GemmPlan(unit, nsg * 32, grid)
    for nsg in counts:
        grid = _thread_grid(nsg * 32, bm, bn)
        if grid:
            return GemmPlan(None, nsg * 32, grid)
    raise CompilationError(
        f"cannot lower the GEMM: the {bm}x{bn} tile cannot be split over "
        f"{counts[0] * 32} threads (num_warps / num_simdgroups={counts[0]}): use a larger "
        f"tile or a count of SIMD-groups (warps) that divides it", g.loop.loc)


class MatmulLowering(GemmStaging, AsyncStaging, WarpgroupGemm, TensorOpsGemm):
    """Mixin of `Lowering`; expects `self.gemm` (GemmPattern) and `self.gemm_plan`."""

    # -- entry points called from Lowering.lower_op ------------------------------------------
    def prepare_gemm(self, plan=None, scalars=None) -> None:
        """Called by `Lowering.__init__`: the schedule plan and the launch's specialized
        integer scalars (empty without an explicit Schedule)."""
        self.schedule_plan = plan
        self.known_scalars = dict(scalars or {})
        self.load_rewrite = None
        self.lowering_passes: list[str] = []
        self.vector_loads = 0
        self.gemm_bounds = None
        self.num_stages = 1
        self.double_buffered = False
        self.program_ids: dict[int, Value] | None = None
        self.swizzles: dict[str, tuple | None] = {}
        if self.gemm is not None and self.known_scalars:
            self.gemm_bounds = prove_gemm_bounds(self.fn, self.gemm, self.known_scalars)
            if self.gemm_bounds is not None:
                self.lowering_passes.append("prove_gemm_bounds")

    def remap_program_ids(self, b: Builder) -> None:
        """Pass `grouped_program_order` (module docstring), emitted at kernel entry."""
        sp = self.schedule_plan
        if self.gemm is None or sp is None or sp.program_order != "grouped":
            return
        group = sp.group_size
        p0, p1 = (b.value("program_id", [], I32, axis=a) for a in (0, 1))
        n0, n1 = (b.value("num_programs", [], I32, axis=a) for a in (0, 1))
        linear = self._i(b, "add", p0, self._i(b, "mul", p1, n0))
        per_group = self._i(b, "mul", n1, group)
        first = self._i(b, "mul", self._i(b, "idiv", linear, per_group), group)
        rows = b.value("minimum", [self._i(b, "sub", n0, first), self.const(b, group)], I32)
        local = self._i(b, "mod", linear, per_group)
        self.program_ids = {0: self._i(b, "add", first, self._i(b, "mod", local, rows)),
                            1: self._i(b, "idiv", local, rows)}
        self.lowering_passes.append("grouped_program_order")

    def program_id(self, b: Builder, axis: int) -> Value:
        """The program id the kernel computes with (remapped under grouped order)."""
        if self.program_ids is not None and axis in self.program_ids:
            return self.program_ids[axis]
        return b.value("program_id", [], I32, axis=axis)

    def schedule_meta(self) -> dict:
        return {"vectorized_loads": self.vector_loads, "lowering_passes": self.lowering_passes}

    def lower_gemm_loop(self, op: Op, b: Builder) -> None:
        g, plan = self.gemm, self.gemm_plan
        bm, bn, bk = g.tile
        od = g.operand_dtype
        align = 32 if plan.unit else 0
        sp = self.schedule_plan
        bounds = self.gemm_bounds
        required = getattr(sp, "num_stages", None)
        if plan.unit and plan.unit.path is not None:
            return self.tensor_ops_loop(op, b)   # gemm_tensor_ops.py
        if plan.unit and plan.unit.warpgroup:
            if self.async_eligible():
                return self.wgmma_loop(op, b)
            # The schedule asked for ordinary-load staging (or an operand buffer is also
            # written): the warp MMA at the same thread count.
            self.gemm_plan = plan = plan_gemm(g, [u for u in self.matrix_units if not u.warpgroup],
                                              relaxed_precision(self.fn), self.T)
        self.use_async = self.async_eligible()
        if self.use_async:
            stages = self.choose_stages((bm * bk + g.products * bk * bn) * od.itemsize)
            align = 128
        else:
            if required is not None and required > 2:
                raise CompilationError(
                    f"num_stages={required}: more than 2 operand stages are not implemented for "
                    f"the ordinary-load staged GEMM path ({plan.fragment}), which this GEMM takes "
                    "because its operand tiles are not plain loads contiguous along their last "
                    "axis in 16-byte groups (what asynchronous copies need); use num_stages 1 "
                    "or 2", op.loc)
            self.double_buffered = bool(sp is not None and (sp.double_buffer or required == 2))
            if self.double_buffered and bounds is None:
                named = "double_buffer=True" if required is None else f"num_stages={required}"
                raise CompilationError(f"{named}: the K loop's start, end and step are not "
                                       "known integers, so its tiles cannot be scheduled over "
                                       "two stages", op.loc)
            stages = 2 if self.double_buffered else 1
        self.num_stages = stages
        self.stage_a = Storage("shared", self.decl("shared", od, stages * bm * bk, "_sa",
                                                   align=align), (bm, bk), od)
        # One stage array per product's B operand (a dual GEMM has two), same layout.
        self.stage_bs = [Storage("shared", self.decl("shared", od, stages * bk * bn, "_sb",
                                                     align=align), (bk, bn), od)
                         for _ in range(g.products)]
        self.stage_b = self.stage_bs[0]
        if self.use_async and plan.unit:
            group = 16 // od.itemsize
            self.swizzles = {self.stage_a.name: swizzle_params(bk, group),
                             **{st.name: swizzle_params(bn, group) for st in self.stage_bs}}
        elif self.use_async:
            # Scalar FMA reads whole 16-byte chunks (`_ffma_step`): a warp reads one chunk
            # of A in each of two rows and consecutive chunks of one B row, and copies
            # consecutive chunks, all without bank conflicts in linear rows (the XOR
            # swizzle serves ldmatrix's eight rows at one column).
            self.swizzles = {st.name: None for st in (self.stage_a, *self.stage_bs)}
        if plan.unit:
            self._fragment_setup(b)
        else:
            self._ffma_setup(b)
        self.k_body = op.regions[0]
        if self.use_async:
            return self.async_pipeline(op, b)
        self.interior_tile = self._interior_predicate(b) if bounds is not None else None
        if bounds is None:
            self._unsplit_k_loop(op, b)
        elif self.double_buffered:
            self.double_buffer_staging(b)
        else:
            self.split_k_loop(b)

    def lower_gemm_store(self, op: Op, b: Builder) -> None:
        if self.gemm_plan.unit and self.gemm_plan.unit.path is not None:
            self.tensor_ops_epilogue(b)
        elif self.gemm_plan.unit and self.gemm_plan.unit.warpgroup:
            self._wgmma_epilogue(b)
        elif self.gemm_plan.unit and self.gemm_plan.unit.lane_coords:
            self._register_epilogue(b)
        elif self.gemm_plan.unit:
            self._fragment_epilogue(b)
        else:
            self._ffma_epilogue(b)

    # -- helpers ----------------------------------------------------------------------------
    def report_loop(self, iv: str, kind: str, step: int, lanes: int | None = None) -> None:
        self.loops.append({"induction_variable": iv, "kind": kind,
                           "lanes": self.T if lanes is None else lanes, "elements_per_lane": 1,
                           "iteration_step": step})

    def _for(self, b: Builder, lo, hi, step, hint: str, body, unroll=False) -> None:
        """A counted loop whose body is built by `body(builder, iv)`."""
        block = Block()
        iv = block.add_arg(I32, hint)
        inner = Builder(block)
        inner.loc = b.loc
        body(inner, iv)
        as_value = [x if isinstance(x, Value) else self.const(b, x) for x in (lo, hi, step)]
        b.op("for", as_value, [], {"kind": "range", "unroll": unroll}, [block])

    def _i(self, b: Builder, name: str, x: Value, y) -> Value:
        y = y if isinstance(y, Value) else self.const(b, y)
        return b.value(name, [x, y], I32)

    def operand_stages(self) -> list:
        """(operand tile value, stage storage, tile shape) of each staged operand: A, then
        each product's B."""
        bm, bn, bk = self.gemm.tile
        return [(self.gemm.a, self.stage_a, (bm, bk))] + [
            (v, st, (bk, bn)) for v, st in zip(self.gemm.bs, self.stage_bs)]

    def _epilogue_store(self, b: Builder, row: Value, col: Value, acc) -> None:
        """Evaluate the epilogue at tile coordinates (row, col) and store it, into each of
        the kernel's outputs; `acc` is the accumulator element there, or a list of one per
        product (a dual GEMM)."""
        for store in self.gemm.stores:
            index, stored, guard = self._epilogue_value(b, row, col, acc, store)
            self.emit_store(b, store, [index, stored] + guard)

    def _epilogue_value(self, b: Builder, row: Value, col: Value, acc, store: Op | None = None):
        """(store index, value, guard list) of the epilogue's `store` (the first unless
        named) at tile coordinates (row, col), its reads (bias, residual) loaded within the
        guard."""
        g = self.gemm
        store = store or g.store
        bm, bn, _ = g.tile
        ctx = Ctx(self, b, (bm, bn), coords=[row, col], identity=False)
        accs = acc if isinstance(acc, (list, tuple)) else [acc]
        memo = {r.id: a for r, a in zip(g.results, accs)}

        def value(v: Value) -> Value:
            hit = memo.get(v.id)
            if hit is not None:
                return hit
            if v.id in g.dependent:
                op = v.owner
                out = b.value(op.name, [value(o) for o in op.operands],
                              ScalarType(v.type.elem.dtype), **op.attrs)
            else:
                out = self.elem(v, ctx)
            memo[v.id] = out
            return out

        ptr, val, *mask = store.operands
        guard = [self.elem(m, ctx) for m in mask]
        if g.reads:
            # Bias / residual loads happen here, per element, within the store's bounds.
            self.load_rewrite = lambda op, lctx: self._epilogue_read(op, lctx, guard)
        stored = value(val)
        self.load_rewrite = None
        return self.elem(ptr, ctx), stored, guard

    def store_index(self, b: Builder, row: Value, col: Value, store: Op | None = None) -> Value:
        """The element index the epilogue's `store` (the first unless named) writes at tile
        coordinates (row, col)."""
        bm, bn, _ = self.gemm.tile
        return self.elem((store or self.gemm.store).operands[0],
                         Ctx(self, b, (bm, bn), coords=[row, col], identity=False))

    def _epilogue_read(self, op: Op, ctx: Ctx, guard: list[Value]) -> Value:
        operands = [self.elem(o, ctx) for o in op.operands]
        if guard:
            if len(operands) == 1:
                zero = self.const(ctx.b, 0.0, elem_type(op.operands[0].type).dtype)
                operands += [guard[0], zero]
            else:
                operands[1] = ctx.b.value("and", [operands[1], guard[0]], BOOL)
        return self.emit_load(ctx.b, op, operands)

    # -- matrix-fragment path ----------------------------------------------------------------
    def _fragment_setup(self, b: Builder) -> None:
        g, plan = self.gemm, self.gemm_plan
        bm, bn, _ = g.tile
        fm, fn, _ = plan.unit.shape
        wm, wn = plan.grid
        self.fr, self.fc = bm // wm // fm, bn // wn // fn
        od = g.operand_dtype
        self.frag_a = self.decl_fragment("a", od, self.fr)
        # One B fragment set and one accumulator set per product (a dual GEMM has two).
        self.frag_bs = [self.decl_fragment("b", od, self.fc) for _ in range(g.products)]
        self.frag_cs = [self.decl_fragment("acc", dt.float32, self.fr * self.fc)
                        for _ in range(g.products)]
        self.frag_b, self.frag_c = self.frag_bs[0], self.frag_cs[0]
        sg = b.value("simd_group", [], I32)
        self.row0 = self._i(b, "mul", self._i(b, "idiv", sg, wn), bm // wm)
        self.col0 = self._i(b, "mul", self._i(b, "mod", sg, wn), bn // wn)
        self.sg = sg
        for frag_c in self.frag_cs:
            for i in range(self.fr * self.fc):
                b.op("frag_fill", [], [], {"name": frag_c, "index": i, "value": 0.0})

    def decl_fragment(self, role: str, dtype: dt.DType, count: int) -> str:
        name = self.fresh(f"_f{role}")
        self.decls.append(Op("decl", [], [], {"name": name, "storage": "fragment", "role": role,
                                              "dtype": dtype, "size": count,
                                              "shape": self.gemm_plan.unit.shape}, []))
        return name

    def _fragment_step(self, b: Builder, base_a: Value, base_b: Value) -> None:
        g, unit = self.gemm, self.gemm_plan.unit
        bm, bn, bk = g.tile
        fm, fn, fk = unit.shape

        swz_a = self.swizzles.get(self.stage_a.name, False)
        swz_b = self.swizzles.get(self.stage_b.name, False)
        products = list(zip(self.stage_bs, self.frag_bs, self.frag_cs))

        def load(lb, frag, index, st, base, row, col, ld, swz):
            if swz is False:  # linear rows
                off = self.add(lb, base, self._i(lb, "add", self._i(lb, "mul", row, ld), col))
                lb.op("frag_load", [off], [], {"name": frag, "index": index, "root": st.name,
                                               "ld": ld, "convert": unit.convert})
            else:
                lb.op("frag_load", [base, row, col], [], {
                    "name": frag, "index": index, "root": st.name, "ld": ld,
                    "convert": unit.convert, "swizzle": swz})

        def depth(lb: Builder, kk: Value) -> None:
            for i in range(self.fr):
                load(lb, self.frag_a, i, self.stage_a, base_a,
                     self._i(lb, "add", self.row0, i * fm), kk, bk, swz_a)
            for st_b, frag_b, _ in products:
                for j in range(self.fc):
                    load(lb, frag_b, j, st_b, base_b, kk,
                         self._i(lb, "add", self.col0, j * fn), bn, swz_b)
            for _, frag_b, frag_c in products:
                for i in range(self.fr):
                    for j in range(self.fc):
                        c = (frag_c, i * self.fc + j)
                        lb.op("frag_mma", [], [], {"d": c, "a": (self.frag_a, i),
                                                   "b": (frag_b, j), "c": c})

        self._for(b, 0, bk, fk, "kk", depth, unroll=True)

    def _fragment_epilogue(self, b: Builder) -> None:
        unit = self.gemm_plan.unit
        fm, fn, _ = unit.shape
        nsg = self.T // 32
        # One scratch per product (a dual GEMM's epilogue reads both accumulators).
        scratches = [self.decl("shared", dt.float32, nsg * fm * fn, "_sc", align=32)
                     for _ in self.frag_cs]
        base = self._i(b, "mul", self.sg, fm * fn)
        lane = b.value("simd_lane", [], I32)

        def per_fragment(fb: Builder, f: Value) -> None:
            for frag_c, scratch in zip(self.frag_cs, scratches):
                fb.op("frag_store", [f, base], [], {"name": frag_c, "root": scratch, "ld": fn})
            fb.op("simd_barrier")
            i, j = self._i(fb, "idiv", f, self.fc), self._i(fb, "mod", f, self.fc)
            row_f = self._i(fb, "add", self.row0, self._i(fb, "mul", i, fm))
            col_f = self._i(fb, "add", self.col0, self._i(fb, "mul", j, fn))

            def per_element(eb: Builder, e: Value) -> None:
                row = self._i(eb, "add", row_f, self._i(eb, "idiv", e, fn))
                col = self._i(eb, "add", col_f, self._i(eb, "mod", e, fn))
                accs = [eb.value("mem_load", [self._i(eb, "add", base, e)], F32, root=scratch,
                                 space="threadgroup") for scratch in scratches]
                self._epilogue_store(eb, row, col, accs)

            self._for(fb, lane, fm * fn, 32, "e", per_element)
            fb.op("simd_barrier")  # every lane has read the scratch before the next store

        self._for(b, 0, self.fr * self.fc, 1, "f", per_fragment, unroll=True)
        self.report_loop("f", "epilogue", 1)
        self.report_loop("e", "epilogue", 32)

    def _register_epilogue(self, b: Builder) -> None:
        """Epilogue from registers: each accumulator element is evaluated and stored at the
        (row, column) the emitter names for it (`acc_coord`), no shared-memory round trip."""
        fm, fn, _ = self.gemm_plan.unit.shape
        per = fm * fn // 32
        self.lowering_passes.append("register_epilogue")
        for i in range(self.fr):
            row_f = self._i(b, "add", self.row0, i * fm)
            for j in range(self.fc):
                col_f = self._i(b, "add", self.col0, j * fn)
                for e in range(per):
                    r = b.value("acc_coord", [], I32, e=e, axis=0)
                    c = b.value("acc_coord", [], I32, e=e, axis=1)
                    accs = [b.value("frag_get", [self.const(b, e)], F32, name=frag_c,
                                    index=i * self.fc + j) for frag_c in self.frag_cs]
                    self._epilogue_store(b, self._i(b, "add", row_f, r),
                                         self._i(b, "add", col_f, c), accs)
        self.report_loop("f", "epilogue", 1)

    # -- FFMA path ------------------------------------------------------------------------------
    def _ffma_setup(self, b: Builder) -> None:
        bm, bn, bk = self.gemm.tile
        ty, tx = self.gemm_plan.grid
        self.tm, self.tn = bm // ty, bn // tx
        # 4-wide operand reads (module docstring) from the cp.async ring's linear float32
        # stages, whose rows are 16-byte aligned chunks.
        self.ffma_vector = bool(self.use_async and self.tn % 4 == 0 and bk % 4 == 0
                                and self.gemm.operand_dtype.itemsize == 4)
        if self.ffma_vector:
            self.lowering_passes.append("ffma_vector_reads")
        # One register micro-tile per product (a dual GEMM has two).
        self.acc_regs_all = [self.decl("local", dt.float32, self.tm * self.tn, "_acc")
                             for _ in range(self.gemm.products)]
        self.acc_regs = self.acc_regs_all[0]
        tid = b.value("thread_id", [], I32)
        self.ty_i, self.tx_i = self._i(b, "idiv", tid, tx), self._i(b, "mod", tid, tx)
        zero = self.const(b, 0.0, dt.float32)
        for regs in self.acc_regs_all:
            self._for(b, 0, self.tm * self.tn, 1, "s", lambda lb, s, regs=regs: lb.op(
                "local_set", [s, zero], [], {"name": regs}), unroll=True)

    def _ffma_column(self, b: Builder, j) -> Value:
        """The tile column of a thread's micro-tile column j: tx_i + j * TX, or with 4-wide
        reads 4 tx_i + (j / 4) * 4 TX + j % 4 (runs of four adjacent columns)."""
        tx = self.gemm_plan.grid[1]
        if not self.ffma_vector:
            return self._i(b, "add", self.tx_i, self._i(b, "mul", j, tx) if isinstance(j, Value)
                           else j * tx)
        if isinstance(j, Value):
            run = self._i(b, "mul", self._i(b, "idiv", j, 4), 4 * tx)
            return self._i(b, "add", self._i(b, "add", self._i(b, "mul", self.tx_i, 4), run),
                           self._i(b, "mod", j, 4))
        return self._i(b, "add", self._i(b, "mul", self.tx_i, 4), (j // 4) * 4 * tx + j % 4)

    def _ffma_vector_step(self, b: Builder, base_a: Value, base_b: Value) -> None:
        """Per 4 K steps: one 16-byte read of A per micro-tile row (its 4 K values), and per
        K step one 16-byte read of B per run of 4 micro-tile columns; TM x TN x 4 FMAs.
        Against one 4-byte shared read per row and column per K step this is a quarter
        of the reads (the scalar loop issued one shared read per 4 FMAs)."""
        _, bn, bk = self.gemm.tile
        ty = self.gemm_plan.grid[0]

        def vec(lb, st, index):
            return lb.op("vec_load", [index], [F32] * 4,
                         {"root": st.name, "space": "threadgroup", "width": 4}).results

        def depth4(lb: Builder, k4: Value) -> None:
            a = [vec(lb, self.stage_a, self.add(lb, base_a, self._i(lb, "add", self._i(
                lb, "mul", self._i(lb, "add", self.ty_i, i * ty), bk), k4)))
                for i in range(self.tm)]
            for kk in range(4):
                row = self.add(lb, base_b, self._i(lb, "mul", self._i(lb, "add", k4, kk), bn))
                for st_b, regs in zip(self.stage_bs, self.acc_regs_all):
                    bv = [x for q in range(self.tn // 4) for x in vec(
                        lb, st_b, self._i(lb, "add", row, self._ffma_column(lb, 4 * q)))]
                    self._outer_product(lb, [a[i][kk] for i in range(self.tm)], bv, regs)

        self._for(b, 0, bk, 4, "k4", depth4, unroll=True)

    def _outer_product(self, lb: Builder, a: list, bv: list, regs: str) -> None:
        """acc[i][j] += a[i] * bv[j] over the thread's TM x TN micro-tile `regs`."""
        for i in range(self.tm):
            for j in range(self.tn):
                s = self.const(lb, i * self.tn + j)
                cur = lb.value("local_get", [s], F32, name=regs)
                prod = lb.value("mul", [a[i], bv[j]], F32)
                lb.op("local_set", [s, lb.value("add", [cur, prod], F32)], [], {"name": regs})

    def _ffma_step(self, b: Builder, base_a: Value, base_b: Value) -> None:
        if self.ffma_vector:
            return self._ffma_vector_step(b, base_a, base_b)
        _, bn, bk = self.gemm.tile
        ty = self.gemm_plan.grid[0]

        def to_f32(lb, v):
            return v if v.type == F32 else lb.value("cast", [v], F32, to=dt.float32)

        def depth(lb: Builder, kk: Value) -> None:
            a = [to_f32(lb, lb.value("mem_load", [self.add(lb, base_a, self._i(lb, "add", self._i(
                lb, "mul", self._i(lb, "add", self.ty_i, i * ty), bk), kk))],
                ScalarType(self.stage_a.dtype), root=self.stage_a.name, space="threadgroup"))
                for i in range(self.tm)]
            row = self.add(lb, base_b, self._i(lb, "mul", kk, bn))
            for st_b, regs in zip(self.stage_bs, self.acc_regs_all):
                bv = [to_f32(lb, lb.value("mem_load", [self._i(
                    lb, "add", row, self._ffma_column(lb, j))], ScalarType(st_b.dtype),
                    root=st_b.name, space="threadgroup")) for j in range(self.tn)]
                self._outer_product(lb, a, bv, regs)

        self._for(b, 0, bk, 1, "kk", depth, unroll=True)

    def _ffma_epilogue(self, b: Builder) -> None:
        ty, tx = self.gemm_plan.grid

        def per_element(eb: Builder, s: Value) -> None:
            i, j = self._i(eb, "idiv", s, self.tn), self._i(eb, "mod", s, self.tn)
            row = self._i(eb, "add", self.ty_i, self._i(eb, "mul", i, ty))
            col = self._ffma_column(eb, j)
            accs = [eb.value("local_get", [s], F32, name=regs) for regs in self.acc_regs_all]
            self._epilogue_store(eb, row, col, accs)

        # Unrolled so the register array is indexed by constants (no local-memory spill).
        self._for(b, 0, self.tm * self.tn, 1, "s", per_element, unroll=True)
        self.report_loop("s", "epilogue", 1)

    def matmul_meta(self) -> dict:
        g, plan = self.gemm, self.gemm_plan
        layouts = {"atoms": "128-byte-swizzled 64-element atoms (wgmma SW128)",
                   "atoms_t": "128-byte-swizzled 64-element atoms along K (wgmma SW128, K-major)"}
        tensor_ops = bool(plan.unit and plan.unit.path)
        return {"tile_shape": list(g.tile), "simdgroup_grid": list(plan.grid) if plan.unit
                else [self.T // 32, 1], "threadgroup_size": [self.T, 1, 1],
                "staging": "device" if tensor_ops else "threadgroup", "fragment": plan.fragment,
                "operand_dtype": g.operand_dtype.name, "output_dtype": g.out_dtype.name,
                "epilogue_regions": g.epilogue_regions, "products": g.products,
                "epilogue_ops": [op.name for op in g.epilogue],
                "captured_scalars": [p.name for p in g.captured],
                "epilogue_reads": [r.describe() for r in g.reads],
                "k_loop_masked": g.k_loop_masked, "outer_bounds_proven": g.outer_bounds_proven,
                "double_buffered": bool(getattr(self, "double_buffered", False)),
                "stages": self.num_stages,
                "async_copy": bool(getattr(self, "use_async", False)),
                "shared_layout": {n: (layouts[sw[0]] if sw and isinstance(sw[0], str) else
                                      "xor-swizzled 16-byte chunks" if sw else "row-major")
                                  for n, sw in self.swizzles.items()} or "row-major",
                "epilogue_from": "cooperative tensor elements" if tensor_ops
                else "registers" if plan.unit and plan.unit.lane_coords
                else ("shared-memory scratch" if plan.unit else "registers"),
                "k_split": None if self.gemm_bounds is None else {
                    "complete_iterations": self.gemm_bounds.n_full,
                    "remainder": self.gemm_bounds.has_remainder},
                **({"warpgroups": plan.grid[0], "products_per_warpgroup":
                    [self.wg_fr, 1], "product": f"m64n{g.tile[1]}k16"}
                   if plan.unit and plan.unit.warpgroup else {}),
                **({"products_per_simdgroup": list(self.mpp_frags),
                    "product": "x".join(map(str, (*self.mpp_shape, g.tile[2]))),
                    "transposed": [o.transposed for o in self.mpp_operands]}
                   if tensor_ops else {}),
                **({} if plan.unit else {"thread_grid": list(plan.grid),
                                         "micro_tile": [self.tm, self.tn]})}
