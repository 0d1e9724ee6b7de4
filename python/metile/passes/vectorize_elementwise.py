"""vectorize_elementwise: 4-wide interiors for canonical 1-D elementwise kernels.

Canonical form: every tile is 1-D with the block's length N and can be evaluated
where it is stored (no threadgroup tiles, reductions, dots or control flow; tiles
placement would keep in registers are recomputed per element instead, their
subexpressions shared by the element's memo), one tile store to a buffer the
kernel does not read, and loads/stores addressed `base + program_id(0) * BLOCK +
arange(0, BLOCK)` (affine, unit stride; known scalars folded).  With the
launch's integer scalars specialized, `gemm_bounds`' interval proofs give P, the
last program whose block is complete (every mask conjunct holds).

Lane mapping (this case only).  Element i of the block belongs to lane
(i // 4) % T, in group slot (i // 4) // T: each lane owns runs of 4
consecutive elements, so a run is one aligned 4-wide load per operand.  The
lowering emits one uniform branch per threadgroup:

    if (program_id(0) <= P)  groups of 4: vec_load per proven load, scalar math,
                             unguarded stores                   (loop kind "interior")
    else                     the ordinary scalar lane loop, every mask kept
                             (lane i % T; loop kind "remainder")

Loads whose mask is not proven or whose address is not provably 4-aligned stay
scalar (with their masks) inside the interior branch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Block, Builder, Function, Op, Value, walk
from ..ir.types import TileType, elem_type
from .gemm_bounds import BIG, Facts, affine_form, mask_conjuncts, depends_on, Intervals, largest_proven
from .lane_layout import BOOL, I32, Ctx, scalar_of
from .placement import analyze

_FORBIDDEN = {"dot": "a dot", "reduce": "a reduction", "shared_alloc": "a shared() allocation",
              "barrier": "a barrier", "for": "a loop", "if": "an if", "while": "a while loop"}


@dataclass
class ElementwiseVector:
    store: Op
    numel: int
    p_max: int                        # last complete program along axis 0 (BIG: all)
    proven: dict[int, bool]           # id(load/store) -> mask proven in interior programs
    aligned: dict[int, bool]          # id(load) -> address 4-aligned


def vectorizable(fn: Function, scalars: dict) -> ElementwiseVector | str:
    """The analysis, or the reason the kernel cannot be vectorized (a sentence)."""
    ops = list(walk(fn.body))
    for op in ops:
        if op.name in _FORBIDDEN:
            return f"the kernel contains {_FORBIDDEN[op.name]} (only canonical 1-D elementwise " \
                   f"kernels are vectorized)"
    stores = [op for op in ops if op.name == "store"]
    if any(op.attrs.get("atomic") for op in stores):
        return "the kernel uses atomic_add (atomic updates stay scalar)"
    if len(stores) != 1 or not isinstance(stores[0].operands[0].type, TileType):
        return "the kernel must store one tile"
    store = stores[0]
    shape = store.operands[0].type.shape
    if len(shape) != 1 or shape[0] % 4:
        return f"the stored tile has shape {shape}; width 4 needs a 1-D block of a multiple of 4"
    for op in ops:
        for r in op.results:
            if isinstance(r.type, TileType) and r.type.shape != shape:
                return f"a tile of shape {r.type.shape} differs from the block {shape}"
    place = analyze(fn)
    if any(k == "shared" for k in place.kind.values()):
        return "a tile is kept in threadgroup memory (not a pure stream)"
    stored = elem_type(store.operands[0].type).root
    params = {p.value.id: (scalars.get(p.name) if p.kind == "scalar" else "ptr")
              for p in fn.params if p.value is not None}
    loads = [op for op in ops if op.name == "load" and isinstance(op.results[0].type, TileType)]
    if any(elem_type(op.operands[0].type).root == stored for op in loads):
        return "the kernel reads the buffer it stores to"
    conj = {id(op): (mask_conjuncts(op.operands[1]) if len(op.operands) > 1 else []) for op in loads}
    conj[id(store)] = mask_conjuncts(store.operands[2]) if len(store.operands) > 2 else []
    every = [c for cs in conj.values() for c in cs]
    if any(depends_on(c, None) - {("pid", 0)} for c in every):
        return "a mask depends on more than program_id(0) and the block's positions"
    p_max = largest_proven(fn, scalars, None, every, 0) if every else BIG
    if p_max < 0:
        return "no program's block is complete for these sizes (every element is a tail)"
    interior = Facts((0, 0), ((0, p_max), (0, BIG), (0, BIG)))
    ev = Intervals(fn, scalars, None, interior)
    proven = {k: all(ev.get(c) == (1, 1) for c in cs) for k, cs in conj.items()}
    aligned = {}
    for op in loads:
        f = affine_form(op.operands[0], params, None, {})
        aligned[id(op)] = f is not None and f.get(("axis", 0), 0) == 1 and all(
            c % 4 == 0 for k, c in f.items() if k != ("axis", 0))
    if not any(aligned[id(op)] and proven[id(op)] for op in loads):
        return "no load of the kernel is both provably in bounds and 4-aligned in its interior"
    return ElementwiseVector(store, shape[0], p_max, proven, aligned)


class ElementwiseVectorLowering:
    """Mixin of `Lowering`: `lower_vector_store` replaces the canonical kernel's store."""

    def prepare_elementwise_vector(self, plan, scalars) -> None:
        self.elementwise_vector = None
        if plan is not None and plan.vector_width == 4 and self.gemm is None:
            found = vectorizable(self.fn, dict(scalars or {}))
            if isinstance(found, ElementwiseVector):
                self.elementwise_vector = found
                # Every element is evaluated where it is stored (the per-element memo
                # shares subexpressions), so no tile needs the i % T register layout.
                for vid in self.place.kind:
                    self.place.kind[vid] = "recompute"

    def lower_vector_store(self, op: Op, b: Builder) -> None:
        """Pass `vectorize_elementwise` (see the module docstring)."""
        ev = self.elementwise_vector
        self.lowering_passes.append("vectorize_elementwise")
        n = ev.numel
        then = Block()
        tb = Builder(then)
        tb.loc = b.loc
        self.lane_loop(tb, (n // 4,), lambda ctx: self._vector_group(ctx, op))
        self.loops.append({"induction_variable": "i", "kind": "interior", "lanes": self.T,
                           "elements_per_lane": 4, "iteration_step": 4 * self.T})
        if ev.p_max == BIG:
            b.block.ops.extend(then.ops)
            return
        other = Block()
        eb = Builder(other)
        eb.loc = b.loc
        shape = op.operands[0].type.shape
        self.lane_loop(eb, shape, lambda ctx: self.emit_store(
            ctx.b, op, [self.elem(o, ctx) for o in op.operands]))
        # (scalar: the report's elements_per_lane is the emitted width, as every other
        # pass reports it; this said the lane's slot count, 4 for a loop of scalar steps)
        self.loops.append({"induction_variable": "i", "kind": "remainder", "lanes": self.T,
                           "elements_per_lane": 1, "iteration_step": self.T})
        pid = b.value("program_id", [], I32, axis=0)
        pred = b.value("le", [pid, self.const(b, ev.p_max)], BOOL)
        b.op("if", [pred], [], {}, [then, other])

    def _vector_group(self, ctx: Ctx, store: Op) -> None:
        ev, lb = self.elementwise_vector, ctx.b
        first = self._i(lb, "mul", ctx.lin, 4)
        loaded: dict[int, list[Value]] = {}
        shape = (ev.numel,)
        base_ctx = Ctx(self, lb, shape, coords=[first], identity=False)

        def load(op: Op, ectx: Ctx) -> Value:
            e = ectx.group_element
            if ev.aligned.get(id(op)) and ev.proven.get(id(op)) and \
                    self.buffers.get((elem_type(op.operands[0].type).root, "written")) is None:
                if id(op) not in loaded:
                    root = self.buffers[(elem_type(op.operands[0].type).root, "read")]
                    vec = lb.op("vec_load", [self.elem(op.operands[0], base_ctx)],
                                [scalar_of(op.results[0].type)] * 4,
                                {"root": root, "space": "device", "width": 4})
                    self.vector_loads += 1
                    loaded[id(op)] = vec.results
                return loaded[id(op)][e]
            return self.emit_load(lb, op, [self.elem(o, ectx) for o in op.operands])

        self.load_rewrite = load
        try:
            for e in range(4):
                coord = first if e == 0 else self.add(lb, first, self.const(lb, e))
                ectx = Ctx(self, lb, shape, coords=[coord], identity=False)
                ectx.group_element = e
                ptr, value, *mask = store.operands
                operands = [self.elem(ptr, ectx), self.elem(value, ectx)]
                if mask and not ev.proven[id(store)]:
                    operands.append(self.elem(mask[0], ectx))
                self.emit_store(lb, store, operands)
        finally:
            self.load_rewrite = None
