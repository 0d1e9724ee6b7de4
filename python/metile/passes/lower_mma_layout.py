"""Tiles in the matrix unit's accumulator layout, for `lower_tiles` (a mixin of `Lowering`).

`mma_layout.plan` chose the values (`tiles`, `rows`); here they are held and computed
where the matrix unit leaves a product.  SIMD-group w owns row slabs w, w + W, ... of
fm rows (fm x fn x fk: the unit's shape); a lane holds, of each fm x fn block of a
layout tile, the `per_lane` elements `acc_coord` names.  Register slot of element e of
block nb in slab r: (r * blocks + nb) * per_lane + e; of a row value: r * lane_rows +
unit.acc_rows[e].  All of it is emitted unrolled, so every slot is a constant and the
arrays stay in registers.

* a planned `dot` runs fragment by fragment: the accumulator fragments are set from the
  accumulator operand's elements (or filled with 0), the left operand is packed from
  registers (a layout tile: its block kk is the fragment's k-step kk) or loaded from
  threadgroup memory, the right one loaded from threadgroup memory (as its transpose
  where it is `trans(t)`), and the results written to the slots of the result;
* with `MmaLayout.warpgroup` (Hopper) the same dot is K/16 warpgroup MMAs into the 64 x N
  accumulators of the thread's warpgroup - the same elements in the same slots - reading
  operands by descriptor from tiles in 128-byte swizzle atoms (`shared_at`), a left
  operand in registers packed a k-step a fragment before the first product; a proxy fence
  precedes every barrier (threads' writes before the tensor cores' reads);
* a last-axis reduction folds a lane's elements of each of its rows, then the lanes
  holding the row (`unit.row_xor`) combine by shuffles: every lane ends with the row's
  value, so no threadgroup memory and no barrier;
* a `[:, None]` read of a row value in a layout element reads the slot of that element's
  row (`FragCtx.rows_slot`);
* a store of a layout tile stores each element from the lane holding it.

Reading a register array from a context of the other layout is a compiler bug (raised
as one, never a silent wrong value): `read` checks it.
"""

from __future__ import annotations

from ..ir.core import Block, Builder, Op, Value, walk as walk_ops
from ..ir.types import ScalarType, TileType
from ..language import dtypes as dt
from .lane_layout import BOOL, I32, Ctx, Storage, scalar_of
from .lower_dot_fragments import _untransposed
from .mma_layout import MmaLayout, _zero_splat

F32 = ScalarType(dt.float32)


def _ldmatrix_aligned(st: Storage, step: int) -> bool:
    """Whether every fragment a product reads from `st` starts 16 bytes aligned: the array
    and its rows are (Storage.rows_aligned), and the column steps between fragments
    (`step` elements; the row offsets are whole rows) keep it."""
    return st.rows_aligned and step * st.dtype.itemsize % 16 == 0


class FragCtx(Ctx):
    """An element of a layout tile (or a row value) at a constant register slot."""

    def __init__(self, low, b, shape, row, col, slot: int, rows_slot: int):
        lin = row if col is None else low._i(b, "add", low._i(b, "mul", row, shape[1]), col)
        coords = [row] if col is None else [row, col]
        super().__init__(low, b, shape, lin, low.const(b, slot), coords)
        self.slot_number, self.rows_slot = slot, rows_slot


class MmaLayoutLowering:
    mma: MmaLayout | None = None
    # warpgroup products accumulating in place into a loop's carried tile (result id ->
    # its Storage), and the accumulator arrays possibly still in flight: the next wait
    # for every product holds them (see carried_products)
    mma_inplace: dict | None = None
    wgmma_pending: list | None = None
    wgmma_carry = True      # the backend's (METILE_WGMMA_CARRY)

    # -- geometry -----------------------------------------------------------------------
    def _mma_row0(self, b: Builder, r: int) -> Value:
        fm = self.mma.unit.shape[0]
        sg = b.value("simd_group", [], I32)
        return self._i(b, "mul", self._i(b, "add", sg, r * self.mma.warps), fm)

    def _mma_elements(self, b: Builder, shape):
        """FragCtx of every element this lane holds of a layout tile of `shape`, in slot
        order."""
        lay = self.mma
        fm, fn, _ = lay.unit.shape
        blocks = shape[1] // fn
        out = []
        for r in range(lay.slabs):
            row0 = self._mma_row0(b, r)
            for nb in range(blocks):
                for e in range(lay.per_lane):
                    row = self._i(b, "add", row0, b.value("acc_coord", [], I32, e=e, axis=0))
                    col = self._i(b, "add", b.value("acc_coord", [], I32, e=e, axis=1), nb * fn)
                    out.append(FragCtx(self, b, shape, row, col,
                                       (r * blocks + nb) * lay.per_lane + e,
                                       r * lay.lane_rows + lay.unit.acc_rows[e]))
        return out

    def _mma_rows(self, b: Builder, shape):
        """FragCtx of every row value slot this lane holds."""
        lay = self.mma
        out = []
        for r in range(lay.slabs):
            row0 = self._mma_row0(b, r)
            for h in range(lay.lane_rows):
                e = lay.unit.acc_rows.index(h)
                row = self._i(b, "add", row0, b.value("acc_coord", [], I32, e=e, axis=0))
                s = r * lay.lane_rows + h
                out.append(FragCtx(self, b, shape, row, None, s, s))
        return out

    def mma_contexts(self, b: Builder, st: Storage):
        return self._mma_elements(b, st.shape) if st.layout == "tiles" else \
            self._mma_rows(b, st.shape)

    # -- storage --------------------------------------------------------------------------
    def padded_storage(self, v: Value) -> Storage:
        """A threadgroup tile for a product's operand with 16 bytes more a row: the unit's
        fragment loads (ldmatrix, simdgroup_load) read 8 rows at one column, which a row of
        a multiple of 128 bytes puts in the same banks (an 8-way conflict each)."""
        rows, cols = v.type.shape
        dtype = scalar_of(v.type).dtype
        pitch, size, prefix, align = self._operand_layout(rows, cols, dtype)
        return self._operand_tile(self.shared_array(dtype, size, prefix, align, pitch),
                                  (rows, cols), dtype, pitch,
                                  self.row_runs is not None and self.language == "cuda")

    def _operand_layout(self, rows: int, cols: int, dtype) -> tuple:
        """(pitch or None, elements, array prefix, alignment) of a products-only operand
        tile: 128-byte swizzle atoms on warpgroup MMA (1024-byte aligned: the swizzle is a
        function of the address), else rows padded by 16 bytes."""
        if self.mma.warpgroup is not None:
            return None, rows * cols, "_sw", 1024
        pitch = cols + 16 // dtype.itemsize
        return pitch, rows * pitch, "_sh", 16

    @staticmethod
    def _operand_tile(name: str, shape, dtype, pitch, vector_runs: bool, base=None) -> Storage:
        """The Storage of an operand tile laid out by `_operand_layout` (at element `base`
        of its array)."""
        st = Storage("shared", name, shape, dtype)
        st.pitch, st.vector_runs, st.base = pitch, vector_runs, base
        st.swizzled = pitch is None
        # (a double buffer's halves are whole tiles from the aligned array's start)
        st.rows_aligned = pitch is not None and pitch * dtype.itemsize % 16 == 0
        return st

    def mma_storage(self, v: Value) -> Storage | None:
        lay = self.mma
        if lay is None or (v.id not in lay.tiles and v.id not in lay.row_values):
            return None
        kind = "tiles" if v.id in lay.tiles else "rows"
        if kind == "tiles":
            size = lay.slabs * (v.type.shape[1] // lay.unit.shape[1]) * lay.per_lane
        else:
            size = lay.slabs * lay.lane_rows
        dtype = scalar_of(v.type).dtype
        st = Storage("local", self.decl("local", dtype, size, "_m"), tuple(v.type.shape), dtype)
        st.layout = kind
        return st

    def mma_like(self, st: Storage, t) -> Storage:
        """A register array of `st`'s layout and shape (a parallel assignment's temporary)."""
        out = Storage("local", self.decl("local", st.dtype, self._mma_size(st), "_m"),
                      st.shape, st.dtype)
        out.layout = st.layout
        return out

    def _mma_size(self, st: Storage) -> int:
        lay = self.mma
        if st.layout == "tiles":
            return lay.slabs * (st.shape[1] // lay.unit.shape[1]) * lay.per_lane
        return lay.slabs * lay.lane_rows

    def mma_read(self, st: Storage, ctx: Ctx) -> Value:
        origin = ctx.origin
        if not isinstance(origin, FragCtx):
            raise AssertionError("lower_tiles: an accumulator-layout tile read outside its "
                                 "layout")
        if st.layout == "tiles":
            if not (ctx.identity and ctx.shape == st.shape):
                raise AssertionError("lower_tiles: an accumulator-layout tile read at a "
                                     "foreign coordinate")
            slot = origin.slot_number
        else:
            slot = origin.rows_slot
        return ctx.b.value("local_get", [self.const(ctx.b, slot)], ScalarType(st.dtype),
                           name=st.name)

    def mma_fill(self, b: Builder, st: Storage, value) -> None:
        """Every slot of `st` from `value(ctx)`."""
        for ctx in self.mma_contexts(b, st):
            ctx.b.op("local_set", [ctx.slot, value(ctx)], [], {"name": st.name})

    # -- ops --------------------------------------------------------------------------------
    def lower_mma_op(self, op: Op, b: Builder) -> bool:
        """Lower `op` if the layout takes it (a product, a row reduction or a store of a
        layout tile); False leaves it to the lane-layout lowering."""
        lay = self.mma
        if op.name == "dot" and id(op) in lay.dots:
            if any(d is op for d, _ in lay.fused.values()):
                return True     # computed at its add
            self._mma_dot(op, b, op.operands[2], op.results[0])
            return True
        if op.name == "add" and id(op) in lay.fused:
            d, x = lay.fused[id(op)]
            self._mma_dot(d, b, x, op.results[0])
            return True
        if op.name == "reduce" and op.operands and op.operands[0].id in lay.tiles:
            self._mma_reduce(op, b)
            return True
        if op.name == "store" and self._mma_reaches(op.operands[1]):
            for ctx in self._mma_elements(b, tuple(op.operands[0].type.shape)):
                self.emit_store(ctx.b, op, [self.elem(o, ctx) for o in op.operands])
            return True
        return False

    def _mma_reaches(self, v: Value) -> bool:
        lay = self.mma
        if v.id in lay.tiles or v.id in lay.row_values:
            return True
        op = v.owner
        return isinstance(op, Op) and self.place.kind.get(v.id) == "recompute" and \
            any(isinstance(o.type, TileType) and self._mma_reaches(o) for o in op.operands)

    # -- products left in flight across a loop's back edge -------------------------------
    def carried_products(self, loop: Op, slots: list) -> list:
        """Warpgroup products of `loop`'s body that accumulate in place into a carried
        tile and are not waited for in their iteration: `acc = f(acc) + dot(p, v)` (f
        elementwise, as attention's rescale) where the carried `acc` is read only by that
        chain, the sum only yielded, and another planned product precedes it in the body.
        The product's accumulators are then the carried registers themselves (set from
        f(acc) element by element, in place); it is committed without a wait, so it runs
        while the warpgroup goes round the loop (the copies' wait, the barrier, the next
        blocks' copies) - a wait before the next iteration's first product (which precedes
        every read of acc) and one after the loop complete it.  Sets mma_inplace and
        returns the carried arrays that may be in flight at the body's top.
        METILE_WGMMA_CARRY=0 waits for every product where it is issued.

        Only where the kernel has no two-blocks-an-SM register bound (mma_occupancy; the
        operand tiles are allocated by now): measured on the H200 in one run against
        METILE_WGMMA_CARRY=0 (tools/probes/attention_prefill_variants.py, s55), causal
        1x32xLx128 float16, attention's 128x64 block under the bound lost (4096: 506 us
        against 498, 8192: 1656 against 1586) and its 128x128 block without one gained
        (545 against 560, 1655 against 1703)."""
        lay = self.mma
        if lay is None or lay.warpgroup is None or not self.wgmma_carry or \
                self.mma_occupancy() > 1:
            return []
        body = loop.regions[0]
        term = body.ops[-1] if body.ops else None
        if term is None or term.name != "yield":
            return []
        uses = self.place.uses
        order = {id(o): i for i, o in enumerate(body.ops)}
        waited = [order[id(o)] for o in body.ops if o.name == "dot" and id(o) in lay.dots
                  and not any(d is o for d, _ in lay.fused.values())]
        names = []
        for arg, slot, y in zip(body.args[1:], slots, term.operands):
            add = y.owner
            if not (isinstance(slot, Storage) and slot.layout == "tiles"
                    and slot.dtype == dt.float32 and isinstance(add, Op)
                    and id(add) in lay.fused and order.get(id(add)) is not None
                    and any(w < order[id(add)] for w in waited)
                    and [u for u, _ in uses.get(y.id, [])] == [term]
                    and sum(t is y for t in term.operands) == 1):
                continue
            x = lay.fused[id(add)][1]     # acc, or an elementwise op of it feeding only the add
            if x is not arg:
                users = [u for u, _ in uses.get(arg.id, [])]
                if not (users == [x.owner] and [u for u, _ in uses.get(x.id, [])] == [add]
                        and self.place.kind.get(x.id) == "recompute"):
                    continue
            elif [u for u, _ in uses.get(arg.id, [])] != [add]:
                continue
            self.mma_inplace = {**(self.mma_inplace or {}), y.id: slot}
            names.append(slot.name)
        return names

    def wgmma_wait_all(self, b: Builder, accs: list) -> None:
        """Wait for every product in flight; hold `accs` and any carried accumulators a
        product left pending (their registers are read after this point only)."""
        held = list(accs) + [n for n in (self.wgmma_pending or []) if n not in accs]
        self.wgmma_pending = []
        b.op("wgmma_wait", [], [], {"pending": 0, "acc": held})

    def _wgmma_dot(self, op: Op, b: Builder, acc: Value, result: Value) -> None:
        """A planned product as warpgroup MMA (MmaLayout.warpgroup): the warpgroup's 64 x N
        accumulators (the layout's elements, element e of 16-wide block nb at nb * 8 + e)
        set from `acc` (or overwritten by the first product), K/16 products issued - the
        left operand packed from registers or read by descriptor from its swizzled tile,
        the right one by descriptor (N-major, wgmma's transpose bit, where stored K x N) -
        committed and waited for, then written to the result's slots.  A product
        carried_products chose accumulates in the carried registers and is not waited for."""
        lay = self.mma
        a, bm, _ = op.operands
        (m, k), n = a.type.shape, bm.type.shape[1]
        if self.wgmma_pending:
            # a carried product still in flight is waited for before this one's registers
            # are set: its accumulators and P fragments are then dead before this product's
            # are live (left in flight through it, ptxas serialized every product, C7512)
            self.wgmma_wait_all(b, [])
        inplace = (self.mma_inplace or {}).get(result.id)
        out = inplace or self.storage_for(result)
        if inplace is not None:
            self.storage[result.id] = inplace
        in_regs = a.id in lay.tiles
        st_a = None if in_regs else self.shared_copy(a, b)
        source = _untransposed(bm)
        st_b = self.shared_copy(source, b)
        dtype = a.type.elem.dtype
        size = dtype.itemsize
        wacc = inplace.name if inplace is not None else \
            self.decl("local", dt.float32, n // 2, "_wacc")
        zero = _zero_splat(acc)
        out_ctxs = self._mma_elements(b, (m, n))
        per_block = lay.per_lane
        if not zero:
            for i, ctx in enumerate(out_ctxs):
                b.op("local_set", [self.const(b, i), self._cast(b, self.elem(acc, ctx),
                                                               dt.float32)], [], {"name": wacc})
        # a left operand from registers: every k-step's fragment packed before the first
        # product, each its own registers (a product in flight still reads its fragment:
        # rewriting it before the wait is undefined, and ptxas serializes the products)
        frags = []
        if in_regs:
            a_ctxs = self._mma_elements(b, (m, k))
            for kk in range(k // 16):
                frags.append(self._fragment("a", dtype, lay.unit))
                for i in range(per_block // 2):
                    lo = self.elem(a, a_ctxs[kk * per_block + 2 * i])
                    hi = self.elem(a, a_ctxs[kk * per_block + 2 * i + 1])
                    b.op("frag_set_pair", [lo, hi], [], {"name": frags[-1], "index": 0,
                                                         "pair": i})
        # the warpgroup's first row: warp q of warpgroup w holds rows 64w + 16q..
        wg_row0 = self._i(b, "mul", self._i(b, "idiv", b.value("simd_group", [], I32), 4), 64)
        b.op("wgmma_fence")
        for kk in range(k // 16):
            k0 = kk * 16
            head = [self.const(b, 0 if zero and kk == 0 else 1)]
            attrs = {"acc": wacc, "n": n, "dtype": dtype.name, "b": st_b.name,
                     "desc_add": True}
            if in_regs:
                attrs["a_frag"] = frags[kk]
                operands = []
            else:
                at = self.add(b, self._i(b, "mul", wg_row0, 64),
                              self.const(b, (k0 // 64) * m * 64 + k0 % 64))
                operands = [at if st_a.base is None else self.add(b, at, st_a.base)]
                attrs.update(a=st_a.name, a_lbo=16, a_sbo=8 * 64 * size)
            if source is bm:   # stored K x N: rows k0.. of every 64-column atom
                off = k0 * 64
                attrs.update(b_lbo=k * 64 * size, b_sbo=8 * 64 * size, trans_b=1)
            else:              # stored N x K: columns k0.. of the atom holding them
                off = (k0 // 64) * n * 64 + k0 % 64
                attrs.update(b_lbo=16, b_sbo=8 * 64 * size, trans_b=0)
            operands.append(self._based(b, st_b, off))
            b.op("wgmma", operands + head, [], attrs)
        b.op("wgmma_commit")
        if inplace is not None:
            self.wgmma_pending = (self.wgmma_pending or []) + [wacc]
            return
        self.wgmma_wait_all(b, [wacc])
        for i, ctx in enumerate(out_ctxs):
            got = b.value("local_get", [self.const(b, i)], F32, name=wacc)
            self.write(out, ctx, self._cast(b, got, out.dtype))

    def _mma_dot(self, op: Op, b: Builder, acc: Value, result: Value) -> None:
        lay = self.mma
        if lay.warpgroup is not None:
            return self._wgmma_dot(op, b, acc, result)
        a, bm, _ = op.operands
        (m, k), n = a.type.shape, bm.type.shape[1]
        fm, fn, fk = lay.unit.shape
        blocks, steps = n // fn, k // fk
        out = self.storage_for(result)
        in_regs = a.id in lay.tiles
        st_a = None if in_regs else self.shared_copy(a, b)
        source = _untransposed(bm)
        st_b = self.shared_copy(source, b)
        frag_a = self._fragment("a", a.type.elem.dtype, lay.unit)
        frag_b = self._fragment("b", bm.type.elem.dtype, lay.unit)
        frag_c = self.fresh("_dc")
        self.decls.append(Op("decl", [], [], {"name": frag_c, "storage": "fragment",
                                              "role": "acc", "dtype": dt.float32,
                                              "size": blocks, "shape": lay.unit.shape}, []))
        a_ctxs = self._mma_elements(b, (m, k)) if in_regs else None
        per_slab_a = (k // fn) * lay.per_lane
        zero = _zero_splat(acc)
        out_ctxs = self._mma_elements(b, (m, n))
        per_slab = blocks * lay.per_lane
        for r in range(lay.slabs):
            row0 = self._mma_row0(b, r)
            for nb in range(blocks):
                if zero:
                    b.op("frag_fill", [], [], {"name": frag_c, "index": nb, "value": 0.0})
                    continue
                for e in range(lay.per_lane):
                    ctx = out_ctxs[r * per_slab + nb * lay.per_lane + e]
                    value = self._cast(b, self.elem(acc, ctx), dt.float32)
                    b.op("frag_set", [self.const(b, e), value], [], {"name": frag_c, "index": nb})
            for kk in range(steps):
                if in_regs:
                    base = r * per_slab_a + kk * lay.per_lane
                    for i in range(lay.per_lane // 2):
                        lo = self.elem(a, a_ctxs[base + 2 * i])
                        hi = self.elem(a, a_ctxs[base + 2 * i + 1])
                        b.op("frag_set_pair", [lo, hi], [], {"name": frag_a, "index": 0,
                                                             "pair": i})
                else:
                    lda = st_a.pitch or k
                    at = self._i(b, "add", self._i(b, "mul", row0, lda), kk * fk)
                    at = at if st_a.base is None else self.add(b, at, st_a.base)
                    b.op("frag_load", [at], [], {"name": frag_a, "index": 0, "root": st_a.name,
                                                 "ld": lda, "convert": None,
                                                 "aligned": _ldmatrix_aligned(st_a, fk)})
                for nb in range(blocks):
                    if source is bm:
                        ldb = st_b.pitch or n
                        at = self._based(b, st_b, kk * fk * ldb + nb * fn)
                        b.op("frag_load", [at], [], {"name": frag_b, "index": 0,
                                                     "root": st_b.name, "ld": ldb, "convert": None,
                                                     "aligned": _ldmatrix_aligned(st_b, fn)})
                    else:  # element (kk, nb) of bm is element (nb, kk) of the (n, k) source
                        ldb = st_b.pitch or k
                        at = self._based(b, st_b, nb * fn * ldb + kk * fk)
                        b.op("frag_load", [at], [], {"name": frag_b, "index": 0,
                                                     "root": st_b.name, "ld": ldb, "convert": None,
                                                     "transpose": True,
                                                     "aligned": _ldmatrix_aligned(st_b, fk)})
                    b.op("frag_mma", [], [], {"d": (frag_c, nb), "a": (frag_a, 0),
                                              "b": (frag_b, 0), "c": (frag_c, nb)})
            for nb in range(blocks):
                for e in range(lay.per_lane):
                    ctx = out_ctxs[r * per_slab + nb * lay.per_lane + e]
                    got = b.value("frag_get", [self.const(b, e)], F32, name=frag_c, index=nb)
                    self.write(out, ctx, self._cast(b, got, out.dtype))

    def mma_record(self) -> dict:
        """What the execution report says of the accumulator layout: the instruction the
        products run as, the rows a SIMD-group owns, the operand tiles' layout, and whether
        a loop's operand blocks were copied one iteration ahead."""
        lay = self.mma
        # (the warpgroup unit's variants name the GEMM's copy forms, not this lowering's)
        unit = lay.unit.name if lay.warpgroup is None else lay.warpgroup.name.split(" (")[0]
        return {"unit": unit, "warpgroup": lay.warpgroup is not None,
                "products": len(lay.dots), "rows_per_simdgroup": lay.unit.shape[0] * lay.slabs,
                "operand_layout": "128-byte swizzle atoms" if lay.warpgroup is not None
                else "rows padded by 16 bytes",
                "prefetched": "prefetch_operands" in self.lowering_passes}

    def mma_occupancy(self) -> int:
        """Blocks an SM for `__launch_bounds__` on CUDA (0: none): 16 warps' worth (128
        registers a thread) where threadgroup memory holds that many.  ptxas left to itself
        gave attention's 128x64 block 130 registers (one block an SM); bounded, 128 and no
        spill for every prefill tile (sm_90, NVRTC)."""
        if self.mma is None or self.language != "cuda":
            return 0
        per_block = self.shared_bytes + 1024          # (the driver's reserve a block)
        fit = (self.shared_optin + 1024) // per_block if per_block else 16
        return max(0, min(16 // self.mma.warps, fit)) if min(16 // self.mma.warps, fit) > 1 \
            else 0

    def _based(self, b: Builder, st: Storage, offset: int) -> Value:
        at = self.const(b, offset)
        return at if st.base is None else self.add(b, at, st.base)

    # -- operand blocks one iteration ahead ---------------------------------------------------
    def prefetch(self, loop: Op, b: Builder, inner: Builder, iv: Value):
        """Copy the loop body's threadgroup operand loads (planned products' operands whose
        address and mask are index arithmetic of the induction variable and of values from
        outside the loop) one iteration ahead, into the other half of a double buffer:
        before the loop the first iteration's copies; at the top of each iteration a wait
        for this iteration's copies and one barrier - after it every thread's copies of this
        iteration are visible, and every warp is done with the previous iteration, so with
        the other half - then the next iteration's copies into that half, where there is one.
        The loads themselves are then free: their value is this iteration's half.  (Two
        barriers an iteration, one before the next copies and one after the wait, made the
        barrier attention's first stall reason on the H200.)  None where no load qualifies
        (CUDA cp.async only)."""
        body = loop.regions[0]
        inside = {r.id for o in walk_ops(body) for r in o.results} | {a.id for a in body.args}
        loads = [o.results[0] for o in body.ops if o.name == "load" and o.results
                 and o.results[0].id in self.mma.padded
                 and self.place.kind.get(o.results[0].id) == "shared"
                 and self.async_copyable(o.results[0])
                 and all(self._index_only(x, body.args[0], inside) for x in o.operands)]
        if not loads:
            return None
        lb, ub, step = (self.s(x) for x in loop.operands[:3])
        buffers = {}
        for v in loads:
            rows, cols = v.type.shape
            dtype = scalar_of(v.type).dtype
            pitch, size, prefix, align = self._operand_layout(rows, cols, dtype)
            # (a swizzled half is a whole number of 1024-byte swizzle periods)
            name = self.shared_array(dtype, 2 * size, prefix, align, pitch)
            buffers[v.id] = (name, size, pitch, dtype)

        def half(bb: Builder, v: Value, base: Value) -> Storage:
            name, _, pitch, dtype = buffers[v.id]
            return self._operand_tile(name, tuple(v.type.shape), dtype, pitch, True, base)

        consts = [o for o in body.ops if o.name == "const"]

        def copies(bb: Builder, at: Value, base) -> None:
            """The loads' copies for the iteration at `at` into the half at `base(v)`; the
            body's constants (not lowered yet) bound in `bb` for the while."""
            saved = self.scalars[body.args[0].id]
            self.scalars[body.args[0].id] = at
            bound = []
            for o in consts:
                if o.results[0].id not in self.scalars:
                    self.scalars[o.results[0].id] = bb.value(
                        "const", [], scalar_of(o.results[0].type), **o.attrs)
                    bound.append(o.results[0].id)
            try:
                for v in loads:
                    self.async_copy(v, half(bb, v, base(bb, v)), bb)
            finally:
                self.scalars[body.args[0].id] = saved
                for k in bound:
                    del self.scalars[k]

        # before the loop: the first iteration's blocks into half 0 (once every warp is done
        # with the arrays: an earlier loop's last iteration may have read them)
        self.barrier(b)
        first = Block()
        fb = Builder(first)
        fb.loc = b.loc
        copies(fb, lb, lambda bb, v: self.const(bb, 0))
        b.op("if", [b.value("lt", [lb, ub], BOOL)], [], {}, [first, Block()])
        b.op("cp_async_commit", [], [], {})
        # each iteration: its half, and the next iteration's blocks into the other
        n = inner.value("idiv", [inner.value("sub", [iv, lb], I32), step], I32)
        parity = inner.value("and", [n, self.const(inner, 1)], I32)
        inner.op("cp_async_wait", [], [], {"pending": 0})
        self.barrier(inner)
        nxt = inner.value("add", [iv, step], I32)
        ahead = Block()
        ab = Builder(ahead)
        ab.loc = b.loc
        # (issued after the iteration's first warpgroup product instead, the copies'
        # addresses and that product's accumulators were live at once: 324 bytes of spill
        # loads for attention's 128x64 block under 128 registers)
        copies(ab, nxt, lambda bb, v: bb.value(
            "mul", [bb.value("sub", [self.const(bb, 1), parity], I32),
                    self.const(bb, buffers[v.id][1])], I32))
        inner.op("if", [inner.value("lt", [nxt, ub], BOOL)], [], {}, [ahead, Block()])
        inner.op("cp_async_commit", [], [], {})
        for v in loads:
            base = inner.value("mul", [parity, self.const(inner, buffers[v.id][1])], I32)
            self.prefetched[v.id] = half(inner, v, base)
        if "prefetch_operands" not in self.lowering_passes:
            self.lowering_passes.append("prefetch_operands")
        return loads

    def prefetch_done(self, loads, inner: Builder) -> None:
        for v in loads:
            self.prefetched.pop(v.id, None)

    def _index_only(self, v: Value, iv: Value, inside: set) -> bool:
        """v is index arithmetic of the induction variable and of values from outside the
        loop body (no load, no held tile): evaluable for another iteration."""
        if not isinstance(v.type, TileType):
            return v is iv or v.id not in inside or (
                isinstance(v.owner, Op) and v.owner.name == "const")
        op = v.owner
        if not isinstance(op, Op) or op.name == "load" or v.id in self.storage:
            return False
        if self.place.kind.get(v.id) != "recompute":
            return False
        return all(self._index_only(o, iv, inside) for o in op.operands)

    def _pairwise(self, b: Builder, kind: str, vs: list[Value], chains: int = 4) -> Value:
        """vs combined as `chains` interleaved chains, then those pairwise: n / chains + 2
        dependent steps with `chains` values live (a full tree kept 16 more registers live
        and spilled under attention's 128-register bound)."""
        parts = [vs[i] for i in range(min(chains, len(vs)))]
        for i in range(len(parts), len(vs)):
            parts[i % chains] = self._combine(b, kind, parts[i % chains], vs[i])
        while len(parts) > 1:
            parts = [self._combine(b, kind, parts[i], parts[i + 1]) if i + 1 < len(parts)
                     else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]

    def _mma_reduce(self, op: Op, b: Builder) -> None:
        lay = self.mma
        (x,) = op.operands
        kind = op.attrs["kind"]
        d = scalar_of(x.type).dtype
        acc_d = self._acc_dtype(d)
        out = self.storage_for(op.results[0])
        terms: dict[int, list[Value]] = {}
        for ctx in self._mma_elements(b, tuple(x.type.shape)):
            terms.setdefault(ctx.rows_slot, []).append(
                self._cast(b, self.elem(x, ctx), acc_d))
        # a lane's elements of a row in four chains (not one chain of 32 maxima and 32 sums
        # a 64-wide score row: fixed-latency dependency stalls were ncu's first stall
        # reason for attention on the H200)
        if self._skips_nan(kind, acc_d):   # (an all-NaN row gives -inf/+inf, as elsewhere)
            terms = {slot: [self._identity(b, kind, acc_d)] + vs for slot, vs in terms.items()}
        folds = {slot: self._pairwise(b, kind, vs) for slot, vs in terms.items()}
        for ctx in self._mma_rows(b, tuple(op.results[0].type.shape)):
            total = b.value("simd_reduce", [folds[ctx.rows_slot]], ScalarType(acc_d), kind=kind,
                            xor=tuple(lay.unit.row_xor))
            self.write(out, ctx, self._cast(b, total, out.dtype))
