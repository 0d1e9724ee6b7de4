"""mma_layout: which tiles a kernel holds in the matrix unit's accumulator layout.

A kernel with products outside the fast GEMM lowering (attention: scores = Q Kᵀ, an
online softmax over them, then P V) otherwise passes every product through threadgroup
memory (lower_dot_fragments): the fragments are stored, a barrier, the softmax reads
them back in the lane layout, and P is stored again for the second product.  Here the
products' results stay where the matrix unit leaves them - each SIMD-group owns whole
rows (its slab of `unit.shape[0]` rows, slabs taken round-robin), each lane the
accumulator elements `acc_coord` names - and the code around them runs in that layout:

* `tiles`: (M, X) values held or evaluated per accumulator element (a product, its
  elementwise consequences, the carried accumulator);
* `rows`: (M,) values held per row a lane's elements lie in - last-axis reductions of
  `tiles` (the lanes sharing a row combine by `unit.row_xor` shuffles) and their
  elementwise consequences (the running maximum and sum);
* a product whose left operand is in `tiles` takes it from registers (the accumulator
  layout of a 16-wide block is the left-operand layout of the next product), its right
  operand from threadgroup memory; `fused`: `x + dot(a, b)` starts the product's
  accumulator at x instead of adding afterwards.

What it proves.  `plan` returns a layout only when every consumer of a `tiles` or
`rows` value is evaluated in that layout: elementwise ops whose result is again in
`tiles`/`rows`, last-axis sum/max/min, the left operand or accumulator of a planned
product, `[:, None]` broadcasts of `rows` into `tiles` expressions, a store of the
(M, X) result, or a loop carrying it.  Anything else (a transpose, another axis, a
store of a row statistic, control flow other than `for`) returns None and the kernel
keeps the lane layout.  Stored values of the lane layout that code in this layout reads
(a mask tile loaded once) are moved to threadgroup memory (`to_shared`), which any
coordinate may read.  Nothing changes where it returns None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.core import Function, Op, Value, walk
from ..ir.ops import ELEMENTWISE
from ..ir.types import TileType, dtype_of
from .placement import Placement

# index views the element code of a layout tile reads through (coordinates only)
_VIEWS = frozenset({"expand_dims", "broadcast"})


@dataclass
class MmaLayout:
    unit: object                 # the MatrixUnit (lane_coords, row_xor, acc_rows)
    rows: int                    # M: the rows every planned product and layout tile has
    warps: int
    tiles: set[int] = field(default_factory=set)
    row_values: set[int] = field(default_factory=set)
    dots: set[int] = field(default_factory=set)          # id(op) of planned products
    fused: dict[int, tuple[Op, Value]] = field(default_factory=dict)  # id(add) -> (dot, x)
    to_shared: set[int] = field(default_factory=set)
    # threadgroup operands read only by planned products: rows padded by 16 bytes (or, with
    # `warpgroup`, laid out in 128-byte swizzle atoms for wgmma's descriptors)
    padded: set[int] = field(default_factory=set)
    # Hopper: the products issued as warpgroup MMA (m64nNk16, 4 warps a product, the right
    # operand - and a left one not in registers - read by shared-memory descriptors); the
    # accumulator layout is the same (warp q of a warpgroup holds rows 16q.. as mma.sync's
    # m16n8 fragments), so only the products and the operands' shared layout change
    warpgroup: object = None

    @property
    def slabs(self) -> int:
        return self.rows // (self.unit.shape[0] * self.warps)

    @property
    def per_lane(self) -> int:
        fm, fn, _ = self.unit.shape
        return fm * fn // 32

    @property
    def lane_rows(self) -> int:
        return max(self.unit.acc_rows) + 1


def _tile(v) -> bool:
    return isinstance(getattr(v, "type", None), TileType)


def _zero_splat(v: Value) -> bool:
    op = v.owner
    if not isinstance(op, Op) or op.name != "splat":
        return False
    c = op.operands[0].owner
    return isinstance(c, Op) and c.name == "const" and c.attrs.get("value") == 0


def plan(fn: Function, place: Placement, threads: int, units) -> MmaLayout | None:
    """The accumulator layout for `fn`'s products (module docstring), or None."""
    ops = list(walk(fn.body))
    dots = [op for op in ops if op.name == "dot"]
    if not dots or threads % 32:
        return None
    warps = threads // 32
    unit, rows = None, None
    for op in dots:
        a, bm, acc = op.operands
        if not all(_tile(v) and len(v.type.shape) == 2 for v in (a, bm, acc)):
            return None
        d = dtype_of(a.type)
        if dtype_of(bm.type) != d or dtype_of(acc.type).name != "float32":
            return None
        (m, k), n = a.type.shape, bm.type.shape[1]
        chosen = next((u for u in units if u.row_xor and not u.warpgroup and u.path is None
                       and u.convert is None and u.takes(d.name, False)
                       and u.shape[1] == u.shape[2]), None)
        if chosen is None or (unit is not None and chosen is not unit) or \
                (rows is not None and m != rows):
            return None
        fm, fn_, fk = chosen.shape
        if m % (fm * warps) or n % fn_ or k % fk:
            return None
        unit, rows = chosen, m
    lay = MmaLayout(unit, rows, warps, dots={id(op) for op in dots})
    fn_width = unit.shape[1]

    def layout_shape(v: Value) -> str | None:
        shape = tuple(v.type.shape)
        if len(shape) == 2 and shape[0] == rows and shape[1] % fn_width == 0:
            return "tiles"
        if shape == (rows,):
            return "rows"
        return None

    def held(v: Value) -> bool:
        return v.id in lay.tiles or v.id in lay.row_values

    def reaches(v: Value) -> bool:
        """v is a layout value or an index view of one (m[:, None] broadcast)."""
        if held(v):
            return True
        op = v.owner
        return isinstance(op, Op) and op.name in _VIEWS and reaches(op.operands[0])

    def add(v: Value) -> bool:
        kind = layout_shape(v)
        if kind is None:
            return False
        (lay.tiles if kind == "tiles" else lay.row_values).add(v.id)
        return True

    for op in dots:
        lay.tiles.add(op.results[0].id)
    # forward closure to a fixpoint (loops carry values back to their block arguments)
    changed = True
    while changed:
        changed = False
        before = (len(lay.tiles), len(lay.row_values))
        for op in ops:
            if op.name in ELEMENTWISE and op.results and _tile(op.results[0]) and \
                    any(_tile(o) and reaches(o) for o in op.operands):
                if not add(op.results[0]):
                    return None
            elif op.name == "reduce" and held(op.operands[0]):
                x = op.operands[0]
                if x.id not in lay.tiles or op.attrs.get("kind") not in ("sum", "max", "min") \
                        or op.attrs.get("axis") != 1 or not dtype_of(x.type).is_float:
                    return None
                lay.row_values.add(op.results[0].id)
            elif op.name == "for":
                body = op.regions[0]
                ys = body.ops[-1].operands if body.ops and body.ops[-1].name == "yield" else []
                for i, (arg, res) in enumerate(zip(body.args[1:], op.results)):
                    if (i < len(ys) and held(ys[i])) or held(arg) or held(res):
                        for v in (arg, res, *([ys[i]] if i < len(ys) else [])):
                            if _tile(v) and not held(v) and not add(v):
                                return None
        changed = (len(lay.tiles), len(lay.row_values)) != before

    # every consumer of a layout value is evaluated in the layout
    for op in ops:
        touched = [i for i, o in enumerate(op.operands) if _tile(o) and reaches(o)]
        if not touched:
            continue
        if op.name in ELEMENTWISE:
            continue           # closure above: results are layout values
        if op.name == "reduce":
            if op.operands[0].id not in lay.tiles:
                return None
            continue
        if op.name in _VIEWS:
            if op.name == "expand_dims" and (op.operands[0].id not in lay.row_values
                                             or op.attrs.get("axis") != 1):
                return None
            if op.name == "broadcast" and tuple(op.results[0].type.shape[:1]) != (rows,):
                return None
            continue
        if op.name == "dot":
            if 1 in touched:
                return None
            continue
        if op.name == "store":
            if layout_shape(op.operands[0]) != "tiles":
                return None
            continue
        if op.name in ("for", "yield"):
            continue
        return None
    # views of rows reach only element code of layout tiles
    for op in ops:
        if op.name in _VIEWS and op.results and reaches(op.results[0]) and \
                not held(op.results[0]):
            for use, _ in place.uses.get(op.results[0].id, []):
                if use.name in _VIEWS:
                    continue
                if not (use.results and use.results[0].id in lay.tiles) and use.name != "store":
                    return None
    # `if`/`while` carrying or computing layout values: not planned
    for op in ops:
        if op.name in ("if", "while") and any(
                held(v) for r in op.regions for o in walk(r) for v in o.results):
            return None

    evaluated = set(lay.tiles) | set(lay.row_values)
    evaluated |= {op.results[0].id for op in ops if op.results and op.name == "dot"}
    # lane-layout tiles read by layout element code move to threadgroup memory
    seen: set[int] = set()

    def leaves(v: Value):
        if v.id in seen or not _tile(v):
            return
        seen.add(v.id)
        if held(v):
            return
        if place.kind.get(v.id) == "local":
            lay.to_shared.add(v.id)
            return
        if place.kind.get(v.id) == "recompute" and isinstance(v.owner, Op):
            for o in v.owner.operands:
                leaves(o)

    for op in ops:
        if op.name == "dot" or not op.results:
            if op.name == "store" and reaches(op.operands[1]):
                for o in op.operands:
                    leaves(o)
            continue
        if op.results[0].id in evaluated and isinstance(op, Op):
            for o in op.operands:
                if _tile(o) and not held(o):
                    leaves(o)
    for op in dots:
        if not held(op.operands[2]):
            leaves(op.operands[2])
    # operands in threadgroup memory read by nothing but planned products (a `trans` of
    # one feeding the right side): their rows may be padded
    from .lower_dot_fragments import _untransposed
    for op in dots:
        a, bm, _ = op.operands
        for v, ok_uses in ((a, {("dot", 0)}), (_untransposed(bm), {("dot", 1), ("permute", 0)})):
            if held(v) or len(v.type.shape) != 2:
                continue
            uses = place.uses.get(v.id, [])
            if uses and all((u.name, i) in ok_uses and (u.name != "dot" or id(u) in lay.dots)
                            and (u.name != "permute" or all(
                                w.name == "dot" and j == 1 and id(w) in lay.dots
                                for w, j in place.uses.get(u.results[0].id, [])))
                            for u, i in uses):
                lay.padded.add(v.id)
    lay.warpgroup = _warpgroup_unit(dots, lay, units)
    # x + dot(a, b): the product accumulates onto x
    for op in dots:
        r = op.results[0]
        uses = place.uses.get(r.id, [])
        if len(uses) == 1 and uses[0][0].name == "add" and _zero_splat(op.operands[2]):
            use = uses[0][0]
            other = use.operands[1 - uses[0][1]]
            if _tile(other) and tuple(other.type.shape) == tuple(r.type.shape) and \
                    other.owner is not op:
                lay.fused[id(use)] = (op, other)
    return lay


def _warpgroup_unit(dots, lay: MmaLayout, units):
    """The warpgroup MMA unit the products can be issued as, or None: an sm_90 unit for
    the operands' dtype, whole warpgroups each owning 64 rows (one 16-row slab a warp),
    every product N <= 256 wide, and each operand read from threadgroup memory a padded
    (products-only) tile of whole 64-element swizzle atoms along its contiguous axis
    (K for the left operand and a transposed right one, N for a right one stored K x N)."""
    from .lower_dot_fragments import _untransposed
    if lay.warps % 4 or lay.unit.shape[0] != 16 or lay.slabs != 1:
        return None
    d = dtype_of(dots[0].operands[0].type)
    wg = next((u for u in units if u.warpgroup and u.producer_threads == 0
               and u.takes(d.name, False)), None)
    if wg is None:
        return None
    for op in dots:
        a, bm, _ = op.operands
        (m, k), n = a.type.shape, bm.type.shape[1]
        if n % 8 or n > 256 or k % 16:
            return None
        if a.id not in lay.tiles and (a.id not in lay.padded or k % 64 or m % 8):
            return None
        src = _untransposed(bm)
        if src.id not in lay.padded or len(src.type.shape) != 2:
            return None
        rows, cols = src.type.shape
        if cols % 64 or rows % 8:
            return None
    return wg
