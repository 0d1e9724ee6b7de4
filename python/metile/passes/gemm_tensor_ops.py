"""tensor_ops and nax: a GEMM's K loop on Metal 4 tensor ops (a mixin of `MatmulLowering`,
used when the plan's backend is "tensor_ops" or "nax" on apple10).

What it changes.  Instead of staging operand tiles through threadgroup memory and
multiplying simdgroup_matrix fragments, every SIMD-group multiplies its sub-tile with
`mpp::tensor_ops::matmul2d<descriptor, execution_simdgroup>` straight from device
memory: per K step, an inline tensor over each operand's device buffer
(`tensor<const device T, dextents<int32_t, 2>, tensor_inline>(pointer, extents, strides)`)
and `run(left, right, destination)` into a float32 cooperative destination, zero-filled
before the loop, in multiply_accumulate mode.  No threadgroup memory, no barriers.

  * tensor_ops: one product per SIMD-group, the descriptor (BM/WM, BN/WN, BK); the
    threadgroup's WM x WN SIMD-group grid is the plan's (2x2 for a 64x64 tile).
  * nax: the same sub-tile decomposed into 16x16x16 products, the NAX fragment MLX's
    nax.h multiplies (`decompose_nax_fragments`): (BM/WM/16) x (BN/WN/16) destinations
    per SIMD-group, one left tensor per fragment row and one right tensor per fragment
    column each K step.  Besides the descriptor and the number of products nothing
    differs (relaxed_precision follows RELAXED_PRECISION on both; the planner requires it
    for float32 operands on nax, as MLX gates them on TF32); MLX's own NAX kernels
    instead load operands into cooperative input tensors element by element through
    the fragment layout, which metile does not rely on.

What it proves (at planning, `tensor_operands`): each operand tile is exactly one
plain load from device memory (not a buffer the kernel also writes) whose address is
affine in the tile coordinates with unit stride along one axis (the last: row-major
like the tile; the first: stored transposed, the descriptor's transpose flag) and a
nonzero stride along the other, masked-off elements reading 0, and every conjunct of
its mask either independent of the tile coordinates or of the form
`index < bound` (<=, or the mirrored >, >=) with `index` affine in one tile axis with
coefficient 1 and `bound` independent of the coordinates.  Then the valid elements of
the tile are a rectangle from its origin, and a tensor anchored at the SIMD-group's
origin with extents min(bound - index, size) (0 when an axis-free conjunct fails)
reads exactly the elements the user's load reads, and 0 for the others: the tensor
op edge-checks its operands against their extents.  Origin, strides and bounds are
the user's own expressions evaluated at tile coordinates (the stride as the address
difference of neighbouring elements), so tensor views and pointer arithmetic with
runtime strides, offsets (batch strides, pointer recurrences) and K masks all qualify.
Otherwise automatic selection keeps the SIMD-group lowering, saying why in the plan
reasons, and an explicit Schedule(backend="tensor_ops" | "nax") is refused with the
reason (compiler/planning.py).

Epilogue.  Each valid element of a destination (`is_valid_element`) is evaluated at
the tile coordinates `get_multidimensional_index` names for it, through the same
scalar epilogue program and the user's store mask as every other GEMM path
(`MatmulLowering._epilogue_store`); which lane holds which element stays the SDK's.

Operands in constant memory.  MLX passes an input of fewer than 8 elements as
`constant` memory, which Metal tensors cannot view; the emitted step
(`metile_mpp_step`, codegen/msl_tensor_ops.py) is overloaded on the operands' address
space and multiplies such operands per destination element instead.

Report.  One K loop (kind "loop", step BK); the element loop over each destination's
capacity is the SDK's layout and not reported; no allocations.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Block, Builder, Function, Op, Value, walk
from ..ir.types import ScalarType, TileType, elem_type
from ..language import dtypes as dt
from .gemm_async import _axes, _axis_coeffs, _float_zero, _int_const
from .gemm_bounds import mask_conjuncts, staging_load
from .lane_layout import BOOL, I32, Ctx

F32 = ScalarType(dt.float32)
NAX_FRAGMENT = 16
_MIRROR = {"lt": ("lt", False), "le": ("lt", True), "gt": ("gt", False), "ge": ("gt", True)}


@dataclass(frozen=True)
class Bound:
    """One mask conjunct of an operand load."""
    conjunct: Value
    axis: int | None          # the tile axis it bounds; None: independent of the coordinates
    index: Value | None       # the side affine in `axis` with coefficient 1
    limit: Value | None       # the side independent of the coordinates
    inclusive: bool           # <= (or >=): the limit itself is valid


@dataclass(frozen=True)
class Operand:
    load: Op
    contiguous: int           # the tile axis with unit stride (1: as the tile; 0: transposed)
    bounds: tuple[Bound, ...]

    @property
    def transposed(self) -> bool:
        return self.contiguous == 0


def _strip(c: Value) -> Value:
    op = c.owner
    while isinstance(op, Op) and op.name == "broadcast" and isinstance(op.operands[0].type, TileType) \
            and len(op.operands[0].type.shape) == len(c.type.shape):
        c = op.operands[0]
        op = c.owner
    return c


def _bound(c: Value, role: str) -> Bound | str:
    c = _strip(c)
    if not _axes(c, {}):
        return Bound(c, None, None, None, False)
    op = c.owner
    text = f"a mask conjunct of the {role} operand ({getattr(op, 'name', 'a value')})"
    if not (isinstance(op, Op) and op.name in _MIRROR) or len(c.type.shape) != 2:
        return (f"{text} is not a comparison `index < bound` along one tile axis, so the valid "
                "elements are not a rectangle from the tile's origin")
    kind, inclusive = _MIRROR[op.name]
    index, limit = op.operands if kind == "lt" else op.operands[::-1]
    ci, cl = _axis_coeffs(index, {}), _axis_coeffs(limit, {})
    if ci is False or cl is False or cl or len(ci) != 1 or next(iter(ci.values())) != 1:
        return (f"{text} is not of the form `index < bound` with the index affine in one tile "
                "axis (coefficient 1) and the bound independent of the tile coordinates")
    return Bound(c, next(iter(ci)), index, limit, inclusive)


def _operand(fn: Function, v: Value, role: str, written: set) -> Operand | str:
    ld = staging_load(v)
    if ld is None or len(ld.results[0].type.shape) != 2:
        what = getattr(v.owner, "name", "a loop value")
        return f"the {role} operand is computed ({what}), not exactly one load"
    ptr = elem_type(ld.operands[0].type)
    if ptr.space == "threadgroup":
        return f"the {role} operand is read from threadgroup memory, not device memory"
    if ptr.root in written:
        return (f"the kernel also writes {ptr.root!r}, the {role} operand's buffer; tensor "
                "operations read device memory that no thread of the launch writes")
    if len(ld.operands) == 3 and _int_const(ld.operands[2]) != 0:
        other = ld.operands[2].owner
        if not (isinstance(other, Op) and other.name in ("const", "splat", "broadcast")
                and _float_zero(other)):
            return (f"masked-off elements of the {role} operand read a value other than 0; "
                    "tensor operations read 0 outside a tensor's extents")
    coeffs = _axis_coeffs(ld.operands[0], {})
    if coeffs is False:
        return (f"the {role} operand's address is not affine in the tile coordinates (a gather, "
                "a wrap-around % or a product of coordinates); a tensor needs one stride per axis")
    if coeffs.get(1) == 1 and coeffs.get(0, 0) != 0:
        contiguous = 1
    elif coeffs.get(0) == 1 and coeffs.get(1, 0) != 0:
        contiguous = 0
    else:
        return (f"the {role} operand's address has no unit stride along one tile axis and a "
                "nonzero stride along the other (strides "
                f"{[coeffs.get(a, 0) for a in (0, 1)]}, None: a runtime value)")
    bounds = []
    if len(ld.operands) > 1:
        for c in mask_conjuncts(ld.operands[1]):
            b = _bound(c, role)
            if isinstance(b, str):
                return b
            bounds.append(b)
    return Operand(ld, contiguous, tuple(bounds))


def tensor_operands(fn: Function, g) -> tuple[Operand, Operand] | str:
    """The GEMM's operands as tensor views (module docstring), or why they are not."""
    written = {elem_type(op.operands[0].type).root for op in walk(fn.body) if op.name == "store"}
    out = []
    for v, role in ((g.a, "left"), (g.b, "right")):
        got = _operand(fn, v, role, written)
        if isinstance(got, str):
            return got
        out.append(got)
    da, db = (elem_type(o.load.results[0].type).dtype for o in out)
    if da != db:
        return f"the operands are {da.name} and {db.name}; the tensor_ops lowering takes one dtype"
    return tuple(out)


class TensorOpsGemm:
    """Expects the `MatmulLowering` state (gemm, gemm_plan, schedule_plan, buffers, T, ...)."""

    def tensor_ops_loop(self, op: Op, b: Builder) -> None:
        g, plan = self.gemm, self.gemm_plan
        bm, bn, bk = g.tile
        wm, wn = plan.grid
        sub_m, sub_n = bm // wm, bn // wn
        nax = plan.unit.path == "nax"
        fm, fn = (NAX_FRAGMENT, NAX_FRAGMENT) if nax else (sub_m, sub_n)
        self.mpp_shape, self.mpp_frags = (fm, fn), (sub_m // fm, sub_n // fn)
        fr, fc = self.mpp_frags
        found = tensor_operands(self.fn, g)
        assert not isinstance(found, str), found   # planning checked it (compiler/planning.py)
        self.mpp_operands = found
        left, right = found
        self.num_stages = None       # operands go straight from device memory: no stages
        self.lowering_passes.append("decompose_nax_fragments" if nax else "tensor_ops_matmul")
        sg = b.value("simd_group", [], I32)
        self.mpp_row0 = self._i(b, "mul", self._i(b, "idiv", sg, wn), sub_m)
        self.mpp_col0 = self._i(b, "mul", self._i(b, "mod", sg, wn), sub_n)
        self.mpp_op = self.fresh("_mpo")
        self.mpp_accs = [self.fresh("_mpc") for _ in range(fr * fc)]
        dtype = lambda o: elem_type(o.load.results[0].type).dtype   # noqa: E731
        # The descriptor's relaxed_precision follows the kernel's precision policy on both
        # paths (MLX's NAX kernels always set it; metile relaxes only when asked).
        relaxed = _relaxed(self.fn)
        b.op("mpp_setup", [], [], {
            "op": self.mpp_op, "accs": list(self.mpp_accs), "m": fm, "n": fn, "k": bk,
            "transpose_left": left.transposed, "transpose_right": right.transposed,
            "relaxed": relaxed, "left": dtype(left), "right": dtype(right)})
        self.k_body = op.regions[0]
        lo, hi, step = (self.s(v) for v in op.operands[:3])
        a_root = self.buffers[(elem_type(left.load.operands[0].type).root, "read")]
        b_root = self.buffers[(elem_type(right.load.operands[0].type).root, "read")]

        def body(lb: Builder, k: Value) -> None:
            self._bind_k(lb, k)
            rows = [self._tensor_args(lb, left, self._i(lb, "add", self.mpp_row0, i * fm),
                                      self.const(lb, 0), fm, bk) for i in range(fr)]
            cols = [self._tensor_args(lb, right, self.const(lb, 0),
                                      self._i(lb, "add", self.mpp_col0, j * fn), bk, fn)
                    for j in range(fc)]
            for i in range(fr):
                for j in range(fc):
                    lb.op("mpp_step", rows[i] + cols[j], [], {
                        "op": self.mpp_op, "acc": self.mpp_accs[i * fc + j], "a": a_root,
                        "b": b_root, "transpose_left": left.transposed,
                        "transpose_right": right.transposed, "k": bk})

        self._for_k(b, lo, hi, step, "loop", body)
        self.report_loop(self.k_body.args[0].hint or "k", "loop", bk)

    def _tensor_args(self, b: Builder, operand: Operand, r0: Value, c0: Value, rows: int,
                     cols: int) -> list[Value]:
        """(offset, x extent, y extent, leading dimension) of the inline tensor over the
        rows x cols block of `operand`'s tile at tile coordinates (r0, c0), in the stored
        orientation (x: the unit-stride axis)."""
        ld = operand.load
        shape = ld.results[0].type.shape

        def at(v: Value, r: Value, c: Value) -> Value:
            if not isinstance(v.type, TileType):
                return self.s(v)
            vs = v.type.shape
            coords = [x if s == t or s != 1 else self.const(b, 0)
                      for x, s, t in zip((r, c), vs, shape)]
            return self.elem(v, Ctx(self, b, vs, coords=coords, identity=False))

        ptr = ld.operands[0]
        offset = at(ptr, r0, c0)
        extent = [self.const(b, rows), self.const(b, cols)]
        gate = None
        for bd in operand.bounds:
            if bd.axis is None:
                ok = at(bd.conjunct, r0, c0)
                gate = ok if gate is None else b.value("and", [gate, ok], BOOL)
                continue
            room = self._i(b, "sub", at(bd.limit, r0, c0), at(bd.index, r0, c0))
            if bd.inclusive:
                room = self._i(b, "add", room, 1)
            extent[bd.axis] = b.value("minimum", [extent[bd.axis], room], I32)
        zero = self.const(b, 0)
        extent = [b.value("maximum", [e, zero], I32) if not _is_const(e) else e for e in extent]
        if gate is not None:
            extent = [b.value("where", [gate, e, zero], I32) for e in extent]
        unit = operand.contiguous
        nxt = (self._i(b, "add", r0, 1), c0) if unit == 1 else (r0, self._i(b, "add", c0, 1))
        lead = self._i(b, "sub", at(ptr, *nxt), offset)
        return [offset, extent[unit], extent[1 - unit], lead]

    def tensor_ops_epilogue(self, b: Builder) -> None:
        """Each valid destination element, at the tile coordinates the SDK names for it."""
        fm, fn = self.mpp_shape
        fr, fc = self.mpp_frags
        for i in range(fr):
            row_f = self._i(b, "add", self.mpp_row0, i * fm)
            for j in range(fc):
                col_f = self._i(b, "add", self.mpp_col0, j * fn)
                acc = self.mpp_accs[i * fc + j]
                capacity = b.value("mpp_capacity", [], I32, acc=acc)

                def element(eb: Builder, e: Value, acc=acc, row_f=row_f, col_f=col_f) -> None:
                    then = Block()
                    tb = Builder(then)
                    tb.loc = eb.loc
                    row = self._i(tb, "add", row_f, tb.value("mpp_coord", [e], I32, acc=acc,
                                                              axis=0))
                    col = self._i(tb, "add", col_f, tb.value("mpp_coord", [e], I32, acc=acc,
                                                              axis=1))
                    value = tb.value("mpp_get", [e], F32, acc=acc)
                    self._epilogue_store(tb, row, col, value)
                    eb.op("if", [eb.value("mpp_valid", [e], BOOL, acc=acc)], [], {},
                          [then, Block()])

                self._for(b, 0, capacity, 1, "e", element)


def _is_const(v: Value) -> bool:
    return isinstance(v.owner, Op) and v.owner.name == "const"


def _relaxed(fn: Function) -> bool:
    from .gemm import relaxed_precision
    return relaxed_precision(fn)
