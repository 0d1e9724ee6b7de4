"""warpgroup_mma: the K loop of a GEMM on Hopper's warpgroup MMA (a mixin of
`MatmulLowering`, used when the plan's unit is the `wgmma` unit of an sm_90 target).

Geometry.  The block is W warpgroups of 4 warps (128 threads).  Warpgroup w owns
the rows w * BM/W ... of the BM x BN output tile, as FR = BM / (64 W) products of
shape m64 x nBN; each thread holds FR arrays of BN/2 float accumulators in
wgmma's register layout (warp q of the warpgroup, lane l: rows 16q + l/4 and
16q + l/4 + 8, columns 8j + 2(l%4) and + 1 for j < BN/8).

Shared layout.  Both operand tiles are stored as 128-byte-swizzled atoms of 64
16-bit elements per row (the canonical SW128 layouts wgmma's descriptors name):
a tile of R rows and C columns is C/64 atoms of R rows; element (r, c) lives at
(c / 64) * 64R + 64r + ((c % 64) / 8 XOR r % 8) * 8 + c % 8.  A (BM x BK,
contiguous along K) is then K-major: one descriptor per 16-wide K step, start at
the step's first column inside its atom, stride between 8-row groups 1024 bytes.
B (BK x BN, contiguous along N) is N-major (imm-trans-b = 1): start at the step's
first row, 1024 bytes between 8-row groups along K, BK * 128 bytes between the
64-column atoms along N.  A right operand stored (N, K) (a Linear's weight read as
its transpose) is contiguous along K: it is stored like A, as BN rows of K-major
atoms (imm-trans-b = 0), its copies grouped along K.  Every stage starts 1024-byte aligned (the swizzle is a
function of the address bits), so the operand tiles live in dynamic shared memory
(up to the target's opt-in limit, more than CUDA's 48 KiB of static shared memory).

Copies.  The operand tiles arrive by the same 16-byte cp.async groups as the
mma.sync pipeline (gemm_async: masks tested per group, zero fill at the edges,
element copies for misaligned views), into the layout above; or, on the bulk_tensor
unit where `bulk_tensor_form` proves each operand a strided 2-D tensor bounded by its
masks, by bulk tensor copies (TMA) whose 128-byte swizzle is that layout
(`_wgmma_tma_steps`).

Pipeline.  S stages, W_p wgmma groups left in flight per step (1 from three stages
up, 0 with two), prefetch distance D = S - 1 - W_p.  Prologue: tiles 0..D-1.  Step t:
wait until tile t has landed (cp.async.wait_group D-1), fence.proxy.async (the
tensor cores read through the async proxy what the threads' copies wrote), one
barrier; wgmma.fence, FR x BK/16 products on stage t, commit; copy tile t+D into
its stage, commit; wgmma.wait_group W_p.  The stage tile t+D overwrites last held
tile t+D-S <= t-1-W_p, whose products every warpgroup had finished before the
barrier (its wait at step t-1), so no product reads a stage being refilled.

Epilogue.  From registers (no shared-memory round trip): each accumulator is
evaluated at its (row, column) and stored through the user's pointer and mask.
"""

from __future__ import annotations

from math import prod

from ..errors import CompilationError
from ..ir.core import Builder, Op, Value
from ..ir.types import ScalarType, elem_type
from ..language import dtypes as dt
from .gemm_async import _axis_coeffs, _block, _iv_affine, _strip_broadcast
from .lane_layout import BOOL, I32, Ctx, Storage

F32 = ScalarType(dt.float32)
ATOM = 64          # 16-bit elements in one 128-byte swizzle row
# Output dtypes whose adjacent-column pairs the epilogue stores as one vector (vec_store):
# half2 / bfloat162 / float2.  One 2-byte store per element made the wgmma epilogue a
# quarter of the 4096^3 kernel's warp-stall samples (ncu, H200), against an eighth for
# the hand-written loop's 4-byte stores (benchmarks/results/ncu/).
PAIRED_STORE_DTYPES = ("float16", "bfloat16", "float32")
EPILOGUE_READ_PAIRS = 16
MAX_AUTO_STAGES = 7   # the most measured (s77); 8 would fit only 24 KiB stages


class WarpgroupGemm:
    """Expects the `MatmulLowering` state (gemm, gemm_plan, schedule_plan, T, ...)."""

    # The maps a bulk-tensor K loop takes ({"dtype", "box"} each; `_wgmma_tma_steps`),
    # listed in the launch record (lower_tiles); none for every other loop.
    tensor_maps: tuple = ()
    # A dual GEMM's products: "split" or "joined" (the backend's, METILE_WGMMA_DUAL;
    # `_joined_dual`)
    wgmma_dual = "split"
    # what orders the bulk-tensor loop's refills: "barrier" or "empty" (METILE_WGMMA_REFILL)
    wgmma_refill = "empty"
    # whether a computed operand tile loads its words a K step ahead (METILE_STAGING_AHEAD)
    staging_ahead = True
    # whether a GEMM with a computed operand tile takes its loaded ones by bulk tensor
    # copies, the threads staging the computed one beside them (METILE_MIXED_BULK)
    mixed_bulk = False
    # joined: the up projection's accumulator index past the gate's (BN/2), else None
    wg_split = None

    def wgmma_loop(self, op: Op, b: Builder) -> None:
        g, plan = self.gemm, self.gemm_plan
        bm, bn, bk = g.tile
        od = g.operand_dtype
        nwg = plan.grid[0]
        self.wg_rows = bm // nwg
        self.wg_fr = self.wg_rows // 64
        self.use_async = True
        self.dynamic_shared = True
        self.shared_limit = max(self.shared_limit, self.shared_optin)
        products = len(g.bs)
        stage_bytes = (bm * bk + products * bk * bn) * od.itemsize
        requested = getattr(self.schedule_plan, "num_stages", None)
        room = self.shared_limit - self.shared_bytes - 2048   # alignment of the two rings
        # As many stages as fit: a 128x128x64 tile (32 KiB a stage) took 98.0 us for
        # 512x4096x11008 with 4 stages, 83.3 with 6 and 82.5 with 7 (MLX 85.3; H200, s77,
        # tools/probes/mlp_gemm_tiles.py): its K steps are too short for 3 copies in
        # flight to cover the load latency.  48 KiB tiles (128x256, dual 128x128) fit 4.
        stages = requested or max(2, min(MAX_AUTO_STAGES, room // stage_bytes))
        if stages * stage_bytes > room:
            raise CompilationError(
                f"num_stages={stages}: {stages} stages of {bm}x{bk} and {products} {bk}x{bn} "
                f"{od.name} tiles need {stages * stage_bytes} bytes of shared memory, more than "
                f"the {room} this block can opt in to; use fewer stages or a smaller tile",
                op.loc)
        self.num_stages = stages
        self.stage_a = self._wg_storage(od, stages * bm * bk, (bm, bk))
        # B as loaded: contiguous along N (N-major atoms of BK rows, imm-trans-b) or, a
        # right operand stored (N, K) such as a Linear's weight, along K (K-major atoms of
        # BN rows, read like A).
        self.b_k_majors = [self.async_entry(v)[2] == 0 for v in g.bs]
        self.b_k_major = self.b_k_majors[0]
        joined = self._joined_dual(plan)
        self.wg_split = bn // 2 if joined else None
        if joined:
            # both B tiles in one stage array, the up projection's rows after the gate's:
            # one (2BN x BK) K-major tile, SW128 atoms of 2BN rows
            shared = self._wg_storage(od, stages * bk * 2 * bn, (bk, 2 * bn))
            self.stage_bs = []
            for part in range(2):
                view = Storage("shared", shared.name, (bk, bn), od)
                view.stage_size, view.stage_offset = 2 * bk * bn, part * ATOM * bn
                self.stage_bs.append(view)
            self.lowering_passes.append("joined_dual_products")
        else:
            # One stage array per product's B (a dual GEMM, a gated MLP's gate and up
            # projections, has two sharing the A tile).
            self.stage_bs = [self._wg_storage(od, stages * bk * bn, (bk, bn)) for _ in g.bs]
        self.stage_b = self.stage_bs[0]
        rows = 2 * bn if joined else bn
        self.swizzles = {self.stage_a.name: ("atoms", bm), **{
            st.name: ("atoms_t", rows) if k_major else ("atoms", bk)
            for st, k_major in zip(self.stage_bs, self.b_k_majors)}}
        self.lowering_passes.append("warpgroup_mma")
        self.k_body = op.regions[0]

        tid = b.value("thread_id", [], I32)
        wg = self._i(b, "idiv", tid, 128)
        self.wg_row0 = self._i(b, "mul", wg, self.wg_rows)
        # per product, one accumulator array per 64-row slice; wg_acc: all of them (what
        # the fences and waits name).  Joined: one product of 2BN columns.
        self.wg_acc_size = bn if joined else bn // 2
        self.wg_accs = [[self.decl("local", dt.float32, self.wg_acc_size, "_wacc")
                         for _ in range(self.wg_fr)] for _ in (g.bs[:1] if joined else g.bs)]
        self.wg_acc = [acc for accs in self.wg_accs for acc in accs]
        self.wg_consumer = None
        if plan.unit.warp_specialized:
            if stages < 3:
                raise CompilationError(
                    f"num_stages={stages}: the warp-specialized warpgroup GEMM "
                    "(METILE_CUDA_WGMMA=ws) refills a stage two K steps after its products "
                    "were issued, so it needs at least 3 stages", op.loc)
            return self._wgmma_specialized(op, b, tid, nwg)
        self._wgmma_pipeline(op, b)

    def _joined_dual(self, plan) -> bool:
        """Whether a dual GEMM's two products run as one (METILE_WGMMA_DUAL=joined): two
        m64nBN products re-read the A tile from shared memory for each B tile, where one
        m64n(2BN) product over both B tiles stored adjacent reads it once, as a single
        GEMM of that width does.  Where both B tiles are K-major (weights read as stored)
        with BK 64, the two BN-row tiles one after the other are one 2BN-row SW128 tile
        (one atom column: no atom stride between them), so the copies only place the up
        tile BN rows on; each thread then holds the up product's accumulator for a column
        at the gate's index + BN/2 (m64n(2BN)'s register layout: column group j at 4j).
        Not under warp specialization, nor for B tiles the threads compute."""
        g = self.gemm
        bn, bk = g.tile[1], g.tile[2]
        return (self.wgmma_dual == "joined" and len(g.bs) == 2 and all(self.b_k_majors)
                and bk == ATOM and 2 * bn <= 256 and not plan.unit.warp_specialized
                and all(self.async_entry(v)[0] is not None for v in g.bs))

    def _zero_accumulators(self, b: Builder) -> None:
        zero = self.const(b, 0.0, dt.float32)
        for acc in self.wg_acc:
            self._for(b, 0, self.wg_acc_size, 1, "z", lambda lb, z, acc=acc: lb.op(
                "local_set", [z, zero], [], {"name": acc}), unroll=True)

    def _wgmma_specialized(self, op: Op, b: Builder, tid: Value, nwg: int) -> None:
        """Warp-specialized pipeline: warpgroups 0..W-1 only multiply, one producer warpgroup
        after them only copies.  The role is read from lane 0 (`warp_uniform`) and each role
        runs its own loop, so ptxas sees no divergence around a wgmma and no copy code
        between a product and its wait: one product group stays in flight
        (wait_group 1; tools/probes/wgmma_warp_specialized.cu).

        Hand-off, one barrier per K step in both loops: before barrier t the producer has
        waited for tile t (cp.async.wait_group D-1) and fenced it for the async proxy; after
        it, the consumers multiply tile t and wait for tile t-1's products, while the
        producer refills the stage of tile t+D-S with tile t+D.  D = S-2: every warpgroup
        finished tile t-2 before barrier t (its wait at step t-1), so that stage is free."""
        bk = self.gemm.tile[2]
        s = self.num_stages
        dist = s - 2
        self.lowering_passes += ["async_pipeline_staging", "warp_specialization"]
        n, issue = self.k_tiles(op, b)
        role = b.value("warp_uniform", [self._i(b, "idiv", tid, 128)], I32)
        self.wg_consumer = b.value("lt", [role, self.const(b, nwg)], BOOL)
        branch = b.op("if", [self.wg_consumer], [], {}, [_block(), _block()])
        cb, pb = Builder(branch.regions[0]), Builder(branch.regions[1])
        cb.loc = pb.loc = b.loc

        # consumers
        self._zero_accumulators(cb)

        def consume(lb: Builder, t: Value) -> None:
            lb.op("barrier")
            lb.op("wgmma_fence", [], [], {"acc": list(self.wg_acc)})
            self._wgmma_products(lb, self._i(lb, "mod", t, s))
            lb.op("wgmma_commit")
            lb.op("wgmma_wait", [], [], {"pending": 1, "acc": list(self.wg_acc)})

        self._for(cb, 0, n, 1, "t", consume)
        cb.op("wgmma_wait", [], [], {"pending": 0, "acc": list(self.wg_acc)})

        # the producer warpgroup
        self.copiers = (self._i(pb, "sub", tid, nwg * 128), self.gemm_plan.unit.producer_threads)
        for t in range(dist):
            issue(pb, self.const(pb, t), t)
            pb.op("cp_async_commit")
        pb.op("cp_async_wait", [], [], {"pending": dist - 1})
        pb.op("fence_proxy_async")

        def produce(lb: Builder, t: Value) -> None:
            lb.op("barrier")
            nxt = self._i(lb, "add", t, dist)
            issue(lb, nxt, self._i(lb, "mod", nxt, s))
            lb.op("cp_async_commit")
            lb.op("cp_async_wait", [], [], {"pending": dist - 1})
            lb.op("fence_proxy_async")

        self._for(pb, 0, n, 1, "t", produce)
        pb.op("cp_async_wait", [], [], {"pending": 0})
        self.copiers = None
        self.report_loop(self.k_body.args[0].hint or "k", "loop", bk)
        self.report_loop("kk", "loop", 16)

    def _wg_storage(self, od, size: int, shape):
        return Storage("shared", self.decl("shared", od, size, "_sw", align=1024), shape, od)

    def _wgmma_pipeline(self, op: Op, b: Builder) -> None:
        """One product group in flight across K steps (wait_group 1) from 3 stages up
        (2 stages drain every step).  The accumulators are never written by anything but
        wgmma before the loop ends: step 0's first product overwrites them (scale-d = 0)
        instead of adding to zeros stored ahead of the loop, and a loop of no steps
        zeroes them after it.  Zeros stored ahead (or copy code that makes ptxas move
        accumulator registers) made ptxas serialize every wgmma (C7514/C7515: "non wgmma
        instructions reading/defining accumulator registers"), which is why this loop used
        to drain each step; tests/test_gemm_wgmma.py checks the SASS keeps depth 1."""
        bk = self.gemm.tile[2]
        self.lowering_passes.append("async_pipeline_staging")
        n, issue = self.k_tiles(op, b)
        lo, step = self.s(op.operands[0]), self.s(op.operands[2])
        rest = b   # where the cp.async loops go
        if self.gemm_plan.unit.bulk_tensor:
            form = self.bulk_tensor_form(b, lo, step)
            if form is not None:
                self.lowering_passes.append("bulk_tensor_copies")
                branch = b.op("if", [form[0]], [], {}, [_block(), _block()])
                tb, rest = Builder(branch.regions[0]), Builder(branch.regions[1])
                tb.loc = rest.loc = b.loc
                self._wgmma_tma_steps(tb, n, form[1], issue)
        if self.gemm_plan.unit.whole_copies:
            self.steps_with_whole_copies(op, rest, n, issue, self._wgmma_steps)
        else:
            self._wgmma_steps(rest, n, issue)
        empty = b.op("if", [b.value("eq", [n, self.const(b, 0)], BOOL)], [], {},
                     [_block(), _block()])
        eb = Builder(empty.regions[0])
        eb.loc = b.loc
        self._zero_accumulators(eb)
        self.report_loop(self.k_body.args[0].hint or "k", "loop", bk)
        self.report_loop("kk", "loop", 16)

    def bulk_tensor_form(self, b: Builder, lo: Value, step: Value):
        """(a block-uniform bool, the operands' maps) under which every K tile of every
        operand may arrive by bulk tensor copies (TMA) with zero fill at the edges instead
        of the masked copies; None when the kernel's form does not allow the proof.

        Static half, per operand: the staged index is affine in the tile coordinates with
        slope 1 along the contiguous axis and affine in the K variable (`_iv_affine`), the
        tile is at most 256 along the other axis (a box's limit), and the mask is a
        conjunction of `f < X` / `f <= X` with f of slope 1 in exactly one tile axis and X
        free of both; each axis has one at least.  Such an operand read at K tile t is a
        2-D tensor: element (r, c) of the tile is I0 + (r + t*dr)*ld + (c + t*dc) from its
        origin I0 at tile 0, in bounds iff r + t*dr < Ro and c + t*dc < Rc, where Ro, Rc
        are the masks' rooms at tile 0 (`_room`) and dr, dc their decrease per tile
        (affine in t, so tiles 0 and 1 give them).  The masked copies then read exactly
        what a tensor map of that origin, extents (Rc, Ro) and row stride ld reads, and
        both fill zeros elsewhere.

        Run-time half (uniform across the block: origins and rooms depend on program ids
        and scalars only): I0's address 16-byte aligned, ld a positive multiple of 16
        bytes, Ro, Rc >= 1, dr, dc >= 0, and I(tile 1) - I0 = dc + dr*ld (the index steps
        as the coordinates do).  Otherwise the cp.async loops run."""
        iv = self.k_body.args[0]
        operands = []
        for value, st, shape in self.operand_stages():
            ld, checks, axis = self.async_entry(value)
            if ld is None:   # a computed operand is no tensor the bulk copies can read:
                if not self.mixed_bulk:   # the threads stage it beside them (mixed_bulk)
                    return None
                continue
            memo = {}
            coeffs = _axis_coeffs(ld.operands[0], {})
            if coeffs is False or coeffs.get(axis) != 1 or shape[1 - axis] > 256 \
                    or shape[axis] % ATOM or not _iv_affine(ld.operands[0], iv, memo):
                return None
            per_axis = {0: [], 1: []}
            for c, _ in checks:
                cmp = _strip_broadcast(c)
                if cmp.name not in ("lt", "le"):
                    return None
                lhs, rhs = (_axis_coeffs(o, {}) for o in cmp.operands)
                if lhs is False or rhs is False or rhs.get(0) or rhs.get(1):
                    return None
                axes = [x for x in (0, 1) if lhs.get(x)]
                if len(axes) != 1 or lhs[axes[0]] != 1 or \
                        not all(_iv_affine(o, iv, memo) for o in cmp.operands):
                    return None
                per_axis[axes[0]].append(c)
            if not per_axis[0] or not per_axis[1]:
                return None
            operands.append((ld, st, shape, axis, per_axis))
        if not operands:
            return None

        zero = self.const(b, 0)
        ok, maps, prepare = None, [], []

        def both(x):
            nonlocal ok
            ok = x if ok is None else b.value("and", [ok, x], BOOL)

        def ge(x, y):
            return b.value("ge", [x, y], BOOL)

        for ld, st, shape, axis, per_axis in operands:
            root = self.buffers[(elem_type(ld.operands[0].type).root, "read")]

            def index(r, c, ld=ld, shape=shape):
                return self.elem(ld.operands[0], Ctx(self, b, shape, coords=[
                    self.const(b, r), self.const(b, c)], identity=False))

            def room(ax, per_axis=per_axis, shape=shape):
                def conj(lb, c, row, col):
                    return self.tile_value_at(lb, c, shape, row, col)
                rooms = [self._room(b, c, (zero, zero), conj) for c in per_axis[ax]]
                out = rooms[0]
                for r in rooms[1:]:
                    out = b.value("minimum", [out, r], I32)
                return out

            found = []
            for t in (0, 1):
                self._bind_k(b, self.add(b, lo, b.value("mul", [self.const(b, t), step], I32)))
                found.append((index(0, 0), room(axis), room(1 - axis)))
                if t == 0:
                    stride = self._i(b, "sub", index(1, 0) if axis == 1 else index(0, 1),
                                     found[0][0])
            (i0, inner0, outer0), (i1, inner1, outer1) = found
            d_inner, d_outer = self._i(b, "sub", inner0, inner1), self._i(b, "sub", outer0, outer1)
            group = 16 // st.dtype.itemsize
            both(b.value("aligned16", [i0], BOOL, root=root))
            both(b.value("gt", [stride, zero], BOOL))
            both(b.value("eq", [self._i(b, "mod", stride, group), zero], BOOL))
            for x in (inner0, outer0):
                both(ge(x, self.const(b, 1)))
            for x in (d_inner, d_outer):
                both(ge(x, zero))
            steps = self._i(b, "add", d_inner, self._i(b, "mul", d_outer, stride))
            both(b.value("eq", [self._i(b, "sub", i1, i0), steps], BOOL))
            maps.append({"dtype": st.dtype.name, "box": [ATOM, shape[1 - axis]],
                         "st": st, "shape": shape, "axis": axis, "d": (d_inner, d_outer)})
            prepare.append((root, st.dtype.itemsize, [i0, inner0, outer0, stride]))
        return b.value("block_all", [ok], BOOL), (maps, prepare)

    def _wgmma_tma_steps(self, b: Builder, n: Value, form, staged) -> None:
        """`_wgmma_steps` with bulk tensor copies: before the loop the block encodes its
        maps (tma_prepare: one thread, then a barrier) and thread 0 arms each stage's
        mbarrier with the tile's bytes and issues its boxes (one per 64-element atom
        along the contiguous axis; the box is the stage's SW128 atom layout).  Step t:
        wait for tile t's barrier phase (t / S) % 2, one barrier (every warpgroup has
        passed step t-1's wait: the stage of tile t+D-S <= t-1-W_p is free), refill it
        with tile t+D, then the products as in `_wgmma_steps`.

        With a computed operand tile (mixed_bulk; `staged`: k_tiles' issue) the threads
        evaluate it into the stage after the step's products, as `_wgmma_steps` does, and
        fence their writes for the async proxy before the step's barrier; the refill waits
        on that barrier ("barrier" order: the threads' stores need it every step)."""
        maps, prepare = form
        s = self.num_stages
        pending = 1 if s >= 3 else 0
        dist = s - 1 - pending
        count = len(maps)
        computed = any(self.async_entry(v)[0] is None for v, _, _ in self.operand_stages())
        empty = self.wgmma_refill == "empty" and not computed
        if computed and "mixed_bulk_staging" not in self.lowering_passes:
            self.lowering_passes.append("mixed_bulk_staging")
        if empty:
            self.lowering_passes.append("empty_barrier_refills")
        # 16 words a map (its encoded map), each stage's barrier, then (empty) each
        # stage's empty barrier: one arrival a warp
        smem = self.decl("shared", dt.uint64, 16 * count + (2 if empty else 1) * s, "_tma",
                         align=128)
        self.tensor_maps = [{"dtype": m["dtype"], "box": m["box"]} for m in maps]
        b.op("tma_prepare", [v for _, _, vs in prepare for v in vs], [],
             {"roots": [r for r, _, _ in prepare], "sizes": [z for _, z, _ in prepare],
              "smem": smem, "stages": s, **({"empty": self.T // 32} if empty else {})})
        b.op("barrier")
        tid = b.value("thread_id", [], I32)
        first = b.value("eq", [tid, self.const(b, 0)], BOOL)
        tile_bytes = sum(prod(m["shape"]) * m["st"].dtype.itemsize for m in maps)

        def issue(lb: Builder, t: Value, stage: Value, refill: bool = True) -> None:
            go = lb.value("and", [first, lb.value("lt", [t, n], BOOL)], BOOL)
            then = lb.op("if", [go], [], {}, [_block(), _block()])
            tb = Builder(then.regions[0])
            tb.loc = lb.loc
            if empty and refill:
                # the stage's last tile (t - S) released by every warp: phase t / S - 1 of
                # its empty barrier
                drained = tb.op("if", [tb.value("ge", [t, self.const(tb, s)], BOOL)], [], {},
                                [_block(), _block()])
                db = Builder(drained.regions[0])
                db.loc = lb.loc
                parity = self._i(db, "mod", self._i(db, "add", self._i(db, "idiv", t, s), 1), 2)
                db.op("tma_empty_wait", [stage, parity], [],
                      {"smem": smem, "maps": count, "stages": s})
            tb.op("tma_expect", [stage], [], {"smem": smem, "maps": count, "bytes": tile_bytes})
            for i, m in enumerate(maps):
                shape, axis = m["shape"], m["axis"]
                d_inner, d_outer = m["d"]
                base = self.stage_base(tb, m["st"], shape, stage)
                outer = self._i(tb, "mul", t, d_outer)
                pitch = self.swizzles[m["st"].name][1]   # rows of an atom column
                for j in range(shape[axis] // ATOM):
                    inner = self._i(tb, "add", self._i(tb, "mul", t, d_inner), j * ATOM)
                    dst = self._i(tb, "add", base, j * ATOM * pitch)
                    tb.op("tma_copy", [dst, inner, outer, stage], [],
                          {"dst": m["st"].name, "map": i, "smem": smem, "maps": count})

        for t in range(dist):
            issue(b, self.const(b, t), self.const(b, t), refill=False)
            if computed:
                staged(b, self.const(b, t), t, "computed")
        ahead = computed and self._words_ahead(b, staged, dist)

        def body(lb: Builder, t: Value) -> None:
            stage = self._i(lb, "mod", t, s)
            parity = self._i(lb, "mod", self._i(lb, "idiv", t, s), 2)
            lb.op("tma_wait", [stage, parity], [], {"smem": smem, "maps": count})
            nxt = self._i(lb, "add", t, dist)
            if computed:   # this thread's stores of tile t, for the tensor cores' reads
                lb.op("fence_proxy_async")
            if not empty:
                lb.op("barrier")
                issue(lb, nxt, self._i(lb, "mod", nxt, s))
            lb.op("wgmma_fence", [], [], {"acc": list(self.wg_acc)})
            self._wgmma_products(lb, stage, lb.value("ne", [t, self.const(lb, 0)], BOOL))
            lb.op("wgmma_commit")
            if computed:
                self._stage_next(lb, staged, nxt, ahead, "computed")
            if empty:
                # after this step's products are issued: thread 0's wait for the stage's
                # release (tile t-1-W_p, released at the end of step t-1) overlaps the
                # tensor cores' work on the tiles in flight
                issue(lb, nxt, self._i(lb, "mod", nxt, s))
            lb.op("wgmma_wait", [], [], {"pending": pending, "acc": list(self.wg_acc)})
            if empty:   # this warp is done with tile t - W_p
                done = self._i(lb, "sub", t, pending)
                rel = lb.op("if", [lb.value("ge", [done, self.const(lb, 0)], BOOL)], [], {},
                            [_block(), _block()])
                rb = Builder(rel.regions[0])
                rb.loc = lb.loc
                rb.op("tma_release", [self._i(rb, "mod", done, s)], [],
                      {"smem": smem, "maps": count, "stages": s})

        self._for(b, 0, n, 1, "t", body)
        b.op("wgmma_wait", [], [], {"pending": 0, "acc": list(self.wg_acc)})

    def _wgmma_steps(self, b: Builder, n: Value, issue) -> None:
        """The prologue, the K steps and the final waits of `_wgmma_pipeline`."""
        s = self.num_stages
        pending = 1 if s >= 3 else 0
        dist = s - 1 - pending
        for t in range(dist):
            issue(b, self.const(b, t), t)
            b.op("cp_async_commit")
        ahead = self._words_ahead(b, issue, dist)

        def body(lb: Builder, t: Value) -> None:
            lb.op("cp_async_wait", [], [], {"pending": dist - 1})
            lb.op("fence_proxy_async")
            lb.op("barrier")
            lb.op("wgmma_fence", [], [], {"acc": list(self.wg_acc)})
            self._wgmma_products(lb, self._i(lb, "mod", t, s),
                                 lb.value("ne", [t, self.const(lb, 0)], BOOL))
            lb.op("wgmma_commit")
            # The stage refilled holds tile t+dist-S <= t-1-pending, whose products every
            # warpgroup finished before this step's barrier (its wait at step t-1).
            nxt = self._i(lb, "add", t, dist)
            self._stage_next(lb, issue, nxt, ahead)
            lb.op("cp_async_commit")
            lb.op("wgmma_wait", [], [], {"pending": pending, "acc": list(self.wg_acc)})

        self._for(b, 0, n, 1, "t", body)
        b.op("wgmma_wait", [], [], {"pending": 0, "acc": list(self.wg_acc)})
        b.op("cp_async_wait", [], [], {"pending": 0})

    def _words_ahead(self, b: Builder, issue, first: int) -> bool:
        """Whether a weight tile the threads evaluate (dequantized while staged) reads its
        packed words a K step ahead into registers (staging_ahead, `carried_loads`): its
        loads then wait behind a step's products instead of holding up the stores the next
        products need.  If so, loads those of step `first`, as every K loop must before
        its first step (the whole-copies loop, its checked twin and a bulk-tensor loop are
        alternatives: each reads only what it loaded)."""
        ahead = self.staging_ahead and self.loads_ahead()
        if ahead:
            if "staging_loads_ahead" not in self.lowering_passes:
                self.lowering_passes.append("staging_loads_ahead")
            issue(b, self.const(b, first), None, "ahead")
        return ahead

    def _stage_next(self, lb: Builder, issue, nxt: Value, ahead: bool,
                    mode: str | None = None) -> None:
        """Stage tile `nxt` into its stage (`mode`: see gemm_async._async_copy), from the
        words loaded ahead where `ahead`, and load tile nxt+1's."""
        issue(lb, nxt, self._i(lb, "mod", nxt, self.num_stages), mode, carried=ahead)
        if ahead:
            issue(lb, self._i(lb, "add", nxt, 1), None, "ahead")

    def _wgmma_products(self, b: Builder, stage: Value, accumulate: Value | None = None) -> None:
        """The step's BK/16 x FR products on `stage`; `accumulate` (a bool) is the first
        products' scale-d (false: overwrite the accumulators), the rest add."""
        g = self.gemm
        bm, bn, bk = g.tile
        size = g.operand_dtype.itemsize
        a_stage = self._i(b, "mul", stage, bm * bk)
        joined = self.wg_split is not None
        width = 2 * bn if joined else bn   # one product's columns
        b_stage = self._i(b, "mul", stage, bk * width)   # the same offset in every B's array
        products = list(zip(self.stage_bs, self.b_k_majors, self.wg_accs))   # (joined: one)
        for kk in range(bk // 16):
            k0 = kk * 16
            a_offs = []
            for i in range(self.wg_fr):
                # A rows row0 + 64i.. of the atom holding columns k0..k0+15
                a_row = self._i(b, "add", self.wg_row0, i * 64)
                a_offs.append(self._i(b, "add", a_stage, self._i(
                    b, "add", self._i(b, "mul", a_row, ATOM), (k0 // ATOM) * bm * ATOM + k0 % ATOM)))
            first = accumulate if kk == 0 and accumulate is not None else None
            for st_b, k_major, accs in products:
                if k_major:   # columns k0.. of the atom holding them, all BN rows
                    b_off = self._i(b, "add", b_stage, (k0 // ATOM) * width * ATOM + k0 % ATOM)
                    b_desc = {"b_lbo": 16, "b_sbo": 8 * ATOM * size, "trans_b": 0}
                else:         # rows k0.. of every N atom
                    b_off = self._i(b, "add", b_stage, k0 * ATOM)
                    b_desc = {"b_lbo": bk * ATOM * size, "b_sbo": 8 * ATOM * size, "trans_b": 1}
                for a_off, acc in zip(a_offs, accs):
                    b.op("wgmma", [a_off, b_off] + ([first] if first is not None else []), [], {
                        "acc": acc, "n": width, "dtype": g.operand_dtype.name,
                        "a": self.stage_a.name, "b": st_b.name,
                        "a_lbo": 16, "a_sbo": 8 * ATOM * size, **b_desc})

    def _paired_stores(self, b: Builder, row: Value, col: Value, store: Op) -> Value | None:
        """A bool under which this thread may store each pair of adjacent accumulator
        columns (c, c+1), c even, with one 2-element vector store; None when the store's
        form does not allow it (then every element is stored alone).

        Static half: the stored index is affine in the tile coordinates with column slope
        exactly 1 (`_axis_coeffs`), so a pair's second element follows its first; a plain
        device store of a 16- or 32-bit float.  Run-time half: the addresses of this
        thread's first pair and of the one a row below are both aligned to the pair's size,
        so (affine, columns stepping by even numbers) every pair's is.  Masks stay per
        element: a pair whose two elements are not both in bounds is stored alone."""
        ptr = elem_type(store.operands[0].type)
        coeffs = _axis_coeffs(store.operands[0], {})
        if (store.attrs.get("atomic") or ptr.space == "threadgroup"
                or (ptr.root, "written") in self.buffers
                or ptr.dtype.name not in PAIRED_STORE_DTYPES
                or coeffs is False or coeffs.get(1) != 1):
            return None
        if "paired_epilogue_stores" not in self.lowering_passes:   # (once for every store)
            self.lowering_passes.append("paired_epilogue_stores")
        root, size = self.buffers[(ptr.root, "out")], 2 * ptr.dtype.itemsize
        first = b.value("aligned16", [self.store_index(b, row, col, store)], BOOL, root=root,
                        bytes=size)
        below = b.value("aligned16", [self.store_index(b, self._i(b, "add", row, 1), col, store)],
                        BOOL, root=root, bytes=size)
        return b.value("and", [first, below], BOOL)

    def _epilogue_pair_values(self, b: Builder, row: Value, col: Value, values: list,
                              store: Op) -> list:
        """(store index, value, guard) of the epilogue's `store` at (row, col) and (row,
        col + 1): its reads (bias, residual) are loaded here."""
        return [self._epilogue_value(b, row, self._i(b, "add", col, dc), v, store)
                for dc, v in enumerate(values)]

    def _epilogue_pair(self, b: Builder, parts: list, pairable: Value | None,
                       store: Op) -> None:
        """Stores a pair's `_epilogue_pair_values` for `store`: as one vector where
        `pairable` and both elements are in bounds, else element by element."""
        if pairable is None:
            for index, stored, guard in parts:
                self.emit_store(b, store, [index, stored] + guard)
            return
        ok = pairable
        for _, _, guard in parts:
            for m in guard:
                ok = b.value("and", [ok, m], BOOL)
        branch = b.op("if", [ok], [], {}, [_block(), _block()])
        tb, eb = Builder(branch.regions[0]), Builder(branch.regions[1])
        tb.loc = eb.loc = b.loc
        ptr = elem_type(store.operands[0].type)
        tb.op("vec_store", [parts[0][0], parts[0][1], parts[1][1]], [],
              {"root": self.buffers[(ptr.root, "out")], "space": "device"})
        for index, stored, guard in parts:
            self.emit_store(eb, store, [index, stored] + guard)

    def atom_offset(self, b: Builder, row: Value, col: Value, rows: int) -> Value:
        """Element offset of (row, col) (col a multiple of 8) in the swizzled atom layout of
        an R = `rows`-row tile: (col / 64) 64 R + 64 row + ((col / 8) % 8 ^ row % 8) 8.
        Tile coordinates are never negative: the divisions and remainders by powers of two
        are shifts and masks (signed division would add its correction for negatives)."""
        chunk = self._i(b, "shr", col, 3)
        moved = self._i(b, "mul", b.value("xor", [self._i(b, "and", chunk, 7),
                                                  self._i(b, "and", row, 7)], I32), 8)
        atom = self._i(b, "mul", self._i(b, "shr", chunk, 3), rows * ATOM)
        return self._i(b, "add", atom, self._i(b, "add", self._i(b, "mul", row, ATOM), moved))

    def _wgmma_epilogue(self, b: Builder) -> None:
        """Each accumulator evaluated and stored at its (row, column): rows 16q + l/4
        (+8 for elements 2, 3 of each group of four), columns 8j + 2(l%4) (+1 for odd).
        Under warp specialization only the warpgroups store (the producer warpgroup holds none)."""
        if self.wg_consumer is not None:
            guard = b.op("if", [self.wg_consumer], [], {}, [_block(), _block()])
            gb = Builder(guard.regions[0])
            gb.loc = b.loc
            consumer, self.wg_consumer = self.wg_consumer, None
            self._wgmma_epilogue(gb)
            self.wg_consumer = consumer
            return
        bn = self.gemm.tile[1]
        self.lowering_passes.append("register_epilogue")
        tid = b.value("thread_id", [], I32)
        quad = self._i(b, "mod", self._i(b, "idiv", tid, 32), 4)
        lane = self._i(b, "mod", tid, 32)
        rbase = self._i(b, "add", self._i(b, "mul", quad, 16), self._i(b, "idiv", lane, 4))
        cbase = self._i(b, "mul", self._i(b, "mod", lane, 4), 2)
        stores = self.gemm.stores
        first_row = self._i(b, "add", self.wg_row0, rbase)
        pairables = [self._paired_stores(b, first_row, cbase, st) for st in stores]
        dual = len(self.wg_accs) > 1 or self.wg_split is not None
        split = self.wg_split
        # An epilogue that reads (bias, residual) evaluates EPILOGUE_READ_PAIRS pairs before
        # storing them: loads issued one pair at a time, each followed by its stores, left
        # one memory latency per pair exposed after the K loop (ptxas keeps that order at
        # ~250 registers)
        chunk = EPILOGUE_READ_PAIRS if self.gemm.reads and (bn // 4) % EPILOGUE_READ_PAIRS == 0 \
            else 1
        for i in range(self.wg_fr):
            row0 = self._i(b, "add", self.wg_row0, self._i(b, "add", rbase, i * 64))
            accs = [per_product[i] for per_product in self.wg_accs]

            def pair_values(eb: Builder, p: Value, store: Op, accs=accs, row0=row0) -> list:
                # elements 2p, 2p+1: one row, columns c and c+1 (a dual GEMM's epilogue
                # sees every product's accumulator there: the same register position, or,
                # joined, the gate's position + BN/2 in the one array)
                row = self._i(eb, "add", row0, self._i(eb, "mul", self._i(eb, "mod", p, 2), 8))
                col = self._i(eb, "add", cbase, self._i(eb, "mul", self._i(eb, "idiv", p, 2), 8))
                e = self._i(eb, "mul", p, 2)
                values = []
                for x in (e, self._i(eb, "add", e, 1)):
                    if split is not None:
                        got = [eb.value("local_get", [y], F32, name=accs[0])
                               for y in (x, self._i(eb, "add", x, split))]
                    else:
                        got = [eb.value("local_get", [x], F32, name=acc) for acc in accs]
                    values.append(got if dual else got[0])
                return self._epilogue_pair_values(eb, row, col, values, store)

            def per_chunk(eb: Builder, p: Value) -> None:
                # every pair's value (and read) of the chunk before any of its stores
                for store, pairable in zip(stores, pairables):
                    parts = [pair_values(eb, p if j == 0 else self._i(eb, "add", p, j), store)
                             for j in range(chunk)]
                    for pair in parts:
                        self._epilogue_pair(eb, pair, pairable, store)

            # Unrolled so the accumulator array is indexed by constants (registers).
            self._for(b, 0, bn // 4, chunk, "e", per_chunk, unroll=True)
        self.report_loop("e", "epilogue", 1)
