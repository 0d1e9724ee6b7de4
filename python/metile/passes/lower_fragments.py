"""lower_fragments: thread-form lowering of `simdgroup_inline` kernels.

In these kernels every (8, 8) tile value is a matrix fragment owned by one
SIMD-group (each SIMD-group computes its own copy).  Scalar code, loops and
scalar loads/stores go through the ordinary `lower_tiles.Lowering`; this
subclass takes the fragment ops:

* `frag_view_load` / `frag_view_store` on threadgroup memory: one matrix
  load/store (`frag_load` / `frag_store`, transposed for column-major views).
  `passes.shared_hazards` has already proven the tile in bounds.
* the same on device memory: a complete tile is a matrix load/store; an
  incomplete one (runtime extents) goes through the SIMD-group's 64-element
  slice of the kernel's scratch tensor with bounded scalar copies (invalid
  loads read zero, invalid stores are skipped) between SIMD-group barriers.
  The scalar copies index scratch by their own element number (lane + 32 s),
  never by which lane holds which fragment element.
* `dot(a, b, acc)`: `frag_mma` with a float32 accumulator fragment.
* pointwise ops (elementwise, `where`, casts, splats of SIMD-uniform scalars)
  are virtual: they are evaluated element by element, through `frag_get` /
  `frag_set` over the FRAGMENT_ELEMENTS values a lane holds, when a dot or a
  store needs the fragment.  Pointwise results do not depend on the mapping.
* `metile.loop_state` fragments carried by loops or branches live in one named
  fragment (`_FragSlot`), assigned through temporaries (parallel assignment).
* a zero-start, step-8 loop whose every device tile access has the loop index
  as origin and the loop bound as extent on one axis (and a proven-complete
  other axis) is split: iterations below (ub // 8) * 8 need no guard, the
  remainder keeps them; carried values continue through both loops.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Block, Builder, Function, Op, Value, walk
from ..ir.ops import ELEMENTWISE, FRAGMENT_ELEMENTS
from ..ir.types import ScalarType, TileType, elem_type
from ..language import dtypes as dt
from .lane_layout import BOOL, I32
from .lower_tiles import Lowering
from .shared_hazards import Checker, constant_value, check_shared_contract

F32 = ScalarType(dt.float32)
SHAPE = (8, 8)
PER_GROUP = 64  # scratch elements per SIMD-group: one 8x8 tile


def is_fragment(v) -> bool:
    return isinstance(getattr(v, "type", None), TileType) and tuple(v.type.shape) == SHAPE


def fragment_threads(fn: Function, constexprs: dict, requested: int | None) -> int:
    """Threads of a simdgroup_inline kernel: num_simdgroups if given, else the BLOCK
    constexpr (a multiple of 32), else one SIMD-group."""
    if requested is not None:
        return requested
    block = constexprs.get("BLOCK")
    if isinstance(block, int) and not isinstance(block, bool):
        if block <= 0 or block % 32:
            raise CompilationError(f"simdgroup_inline kernels need BLOCK to be a positive "
                                   f"multiple of 32, got {block}")
        return block
    return 32


class FragmentLowering(Lowering):
    def __init__(self, fn: Function, threads: int, buffers: dict, matrix_units=()):
        super().__init__(fn, threads, buffers, ())
        ranges = Checker(fn, threads)
        ranges._divergence(fn.body)
        self.ranges = ranges  # loop-index intervals for tile completeness proofs
        self.gemm = None  # a dot over a loop here is the kernel's own program, not a GEMM
        self.frags: dict[int, tuple[str, dt.DType]] = {}
        self.proven: set[int] = set()  # device accesses proven complete by loop splitting
        self.split_loops = 0

    # A fragment materialized inside a region (a branch, a loop body) exists only there:
    # forget it when the region ends, so a later use outside materializes its own.
    def lower_block(self, src: Block, b: Builder):
        before = set(self.frags)
        inside = {r.id for o in walk(src) for r in o.results}
        out = super().lower_block(src, b)
        for k in set(self.frags) - before:
            if k not in inside:
                del self.frags[k]
        return out

    # -- loop splitting ---------------------------------------------------------------------
    def _split_accesses(self, op: Op) -> set[int] | None:
        """Ids of the device tile accesses that are complete in every iteration below
        (ub // 8) * 8 of a zero-start, step-8 loop; None unless every access qualifies."""
        lb, ub, step = op.operands[:3]
        if constant_value(lb) != 0 or constant_value(step) != 8:
            return None
        iv = op.regions[0].args[0]
        nested = {id(x) for o in walk(op.regions[0]) if o.name in ("for", "while")
                  for x in walk_regions(o)}
        proven = set()
        for inner in walk(op.regions[0]):
            if inner.name not in ("frag_view_load", "frag_view_store") \
                    or elem_type(inner.operands[0].type).space != "device":
                continue
            r0, c0, rows, cols = inner.operands[1:5]
            ok = False
            for (o, e), (o2, e2) in (((r0, rows), (c0, cols)), ((c0, cols), (r0, rows))):
                other, extent = self.ranges._interval(o2), constant_value(e2)
                if o is iv and e is ub and other is not None and extent is not None \
                        and other[0] >= 0 and other[1] + 8 <= extent:
                    ok = True
            if not ok or id(inner) in nested:
                return None
            proven.add(id(inner))
        return proven or None

    def lower_for(self, op: Op, b: Builder) -> None:
        proven = self._split_accesses(op)
        if proven is None:
            return super().lower_for(op, b)
        # complete iterations [0, (ub // 8) * 8) without guards, then the guarded remainder;
        # carried values (scalars and fragments) continue through both loops' slots
        lb, ub, step, *inits = op.operands
        body = op.regions[0]
        slots = self._slots(list(body.args[1:]), b, inits)
        full = self._i(b, "mul", self._i(b, "idiv", self.s(ub), 8), 8)
        inside = {r.id for o in walk(body) for r in o.results}
        for lo, hi, ids in ((self.s(lb), full, proven), (full, self.s(ub), set())):
            for k in inside:
                self.frags.pop(k, None)
            new_body = Block()
            iv = new_body.add_arg(I32, body.args[0].hint)
            self.scalars[body.args[0].id] = iv
            inner = Builder(new_body)
            inner.loc = op.loc
            self._bind(body.args[1:], slots, inner)
            self.proven = ids
            self.loop_depth += 1
            ys = self.lower_block(body, inner)
            self.loop_depth -= 1
            self._assign(slots, ys, inner, body.args[1:])
            self.proven = set()
            b.op("for", [lo, hi, self.s(step)], [], dict(op.attrs), [new_body])
        self.split_loops += 1
        self._bind(list(op.results), slots, b)

    # -- fragments ------------------------------------------------------------------------
    def new_fragment(self, dtype: dt.DType) -> str:
        name = self.fresh("_fr")
        self.decls.append(Op("decl", [], [], {"name": name, "storage": "fragment", "role": "acc",
                                               "dtype": dtype, "size": 1, "shape": (8, 8, 8)}, []))
        return name

    def felem(self, v: Value, e: Value, b: Builder, memo: dict) -> Value:
        """Element `e` (of those this lane holds) of fragment-valued `v`, or scalar `v`."""
        hit = memo.get(v.id)
        if hit is not None:
            return hit
        if not isinstance(v.type, TileType):
            out = self.s(v)
        elif v.id in self.frags:
            name, d = self.frags[v.id]
            out = b.value("frag_get", [e], ScalarType(d), name=name, index=0)
        else:
            op = v.owner if isinstance(v.owner, Op) else None
            if op is None or not is_fragment(v):
                raise CompilationError(
                    "cannot honour backend='simdgroup_inline': this tile is not an 8x8 matrix "
                    "fragment (such a kernel multiplies 8x8 views of its tensors; a whole-tile "
                    "dot is lowered under backend 'auto' or 'simdgroup')", op and op.loc)
            if op.name in ("splat", "broadcast") and not isinstance(op.operands[0].type, TileType):
                out = self.s(op.operands[0])
            elif op.name in ELEMENTWISE and op.name != "ptr_add":
                out = b.value(op.name, [self.felem(o, e, b, memo) for o in op.operands],
                              ScalarType(v.type.elem.dtype), **op.attrs)
            else:
                raise CompilationError(f"{op.name} is not supported on matrix fragments "
                                       "(pointwise ops, casts, where and dot are)", op.loc)
        memo[v.id] = out
        return out

    def materialize(self, v: Value, b: Builder, dtype: dt.DType | None = None) -> str:
        """The name of a fragment holding `v` (converted to `dtype`)."""
        dtype = dtype or v.type.elem.dtype
        have = self.frags.get(v.id)
        if have is not None and have[1] == dtype:
            return have[0]
        name = self.new_fragment(dtype)
        op = v.owner
        if have is None and isinstance(op, Op) and op.name == "splat" and dtype == dt.float32 \
                and isinstance(op.operands[0].owner, Op) \
                and op.operands[0].owner.name == "const":
            b.op("frag_fill", [], [], {"name": name, "index": 0,
                                       "value": float(op.operands[0].owner.attrs["value"])})
        else:
            self.copy_fragment(b, name, dtype, v)
        if have is None:
            self.frags[v.id] = (name, dtype)
        return name

    def copy_fragment(self, b: Builder, name: str, dtype: dt.DType, v: Value) -> None:
        def body(inner: Builder, e: Value) -> None:
            x = self.felem(v, e, inner, {})
            if x.type.dtype != dtype:
                x = inner.value("cast", [x], ScalarType(dtype))
            inner.op("frag_set", [e, x], [], {"name": name, "index": 0})
        self._for(b, 0, FRAGMENT_ELEMENTS, 1, "_e", body, unroll=True)

    # -- loop state (metile.loop_state): a carried fragment lives in one named fragment ---
    def _slots(self, values, b, inits=None):
        slots = []
        for i, v in enumerate(values):
            if is_fragment(v):
                slot = _FragSlot(self.new_fragment(v.type.elem.dtype), v.type.elem.dtype)
                if inits is not None:
                    self.copy_fragment(b, slot.name, slot.dtype, inits[i])
                slots.append(slot)
            else:
                slots.extend(super()._slots([v], b, None if inits is None else [inits[i]]))
        return slots

    def _bind(self, values, slots, b) -> None:
        for v, slot in zip(values, slots):
            if isinstance(slot, _FragSlot):
                self.frags[v.id] = (slot.name, slot.dtype)
            else:
                super()._bind([v], [slot], b)

    def _assign(self, slots, values, b, carried=()) -> None:
        carried = list(carried) + [None] * len(values)
        frag = [(s, v) for s, v, c in zip(slots, values, carried)
                if isinstance(s, _FragSlot) and v is not c]
        # parallel assignment: take every new value before any slot is overwritten
        temps = []
        for s, v in frag:
            tmp = self.new_fragment(s.dtype)
            self.copy_fragment(b, tmp, s.dtype, v)
            temps.append(tmp)
        for (s, _), tmp in zip(frag, temps):
            self.copy_fragment(b, s.name, s.dtype, _Named(tmp, s.dtype, self))
        rest = [(s, v, c) for s, v, c in zip(slots, values, carried)
                if not isinstance(s, _FragSlot)]
        if rest:
            super()._assign([r[0] for r in rest], [r[1] for r in rest], b,
                            [r[2] for r in rest])

    # -- ops ------------------------------------------------------------------------------
    def lower_op(self, op: Op, b: Builder) -> None:
        name = op.name
        if name == "frag_view_load":
            return self.view_load(op, b)
        if name == "frag_view_store":
            return self.view_store(op, b)
        if name == "dot" and is_fragment(op.results[0]):
            return self.fragment_dot(op, b)
        if name in ("for", "if", "while"):
            return super().lower_op(op, b)  # carried fragments: _slots/_bind/_assign below
        if any(is_fragment(r) for r in op.results):
            if name in ELEMENTWISE or name in ("splat", "broadcast"):
                return  # virtual: evaluated where a dot or store needs it
            if name == "reduce":
                raise CompilationError("row reductions of a fragment go through a shared-memory "
                                       "bridge: store it to a shared matrix view first", op.loc)
            if name == "load":
                # (a plain 8x8 load meeting a fragment in a dot: "load is not supported on
                # matrix fragments" read as if the fragment's own load were refused)
                raise CompilationError("this 8x8 tile is used as a matrix fragment (a dot "
                                       "operand or combined with one), which must come from a "
                                       "block_shape view's load: metile.tensor(..., "
                                       "block_shape=(8, 8)).load(origin), not metile.load",
                                       op.loc)
            raise CompilationError(f"{name} is not supported on matrix fragments", op.loc)
        return super().lower_op(op, b)

    def fragment_dot(self, op: Op, b: Builder) -> None:
        a, bv, acc = op.operands
        na = self.materialize(a, b)
        nb = self.materialize(bv, b)
        nc = self.materialize(acc, b, dt.float32)
        d = self.new_fragment(dt.float32)
        b.op("frag_mma", [], [], {"d": (d, 0), "a": (na, 0), "b": (nb, 0), "c": (nc, 0)})
        self.frags[op.results[0].id] = (d, dt.float32)

    # -- view accesses ----------------------------------------------------------------------
    def _geometry(self, op: Op, b: Builder):
        base, r0, c0, rows, cols = op.operands[:5]
        s0, s1 = op.attrs["strides"]
        transpose = s1 != 1
        ld = s1 if transpose else s0
        off = self.add(b, self.s(base), self.add(b, self._i(b, "mul", self.s(r0), s0),
                                                 self._i(b, "mul", self.s(c0), s1)))
        return off, ld, transpose, [self.s(x) for x in (r0, c0, rows, cols)]

    def _complete(self, op: Op, b: Builder, g) -> Value | None:
        """None when the tile is provably complete, else the runtime condition."""
        if id(op) in self.proven:
            return None
        e = op.attrs["extent"]
        o = [self.ranges._interval(v) for v in op.operands[1:3]]
        if None not in (*o, *e) and o[0][0] >= 0 and o[1][0] >= 0 \
                and o[0][1] + 8 <= e[0] and o[1][1] + 8 <= e[1]:
            return None
        r0, c0, rows, cols = g
        zero = self.const(b, 0)
        conds = [b.value("le", [self._i(b, "add", r0, 8), rows], BOOL),
                 b.value("le", [self._i(b, "add", c0, 8), cols], BOOL),
                 b.value("ge", [r0, zero], BOOL), b.value("ge", [c0, zero], BOOL)]
        out = conds[0]
        for c in conds[1:]:
            out = b.value("and", [out, c], BOOL)
        return out

    def _elements(self, b: Builder, body) -> None:
        """body(builder, e, row, col) for the scratch elements this lane copies."""
        lane = b.value("simd_lane", [], I32)

        def step(inner: Builder, s: Value) -> None:
            e = self.add(inner, lane, self._i(inner, "mul", s, 32))
            body(inner, e, self._i(inner, "idiv", e, 8), self._i(inner, "mod", e, 8))
        self._for(b, 0, PER_GROUP // 32, 1, "_q", step, unroll=True)

    def _device_index(self, b: Builder, op: Op, g, row: Value, col: Value):
        r0, c0, rows, cols = g
        s0, s1 = op.attrs["strides"]
        gr, gc = self.add(b, r0, row), self.add(b, c0, col)
        zero = self.const(b, 0)
        valid = b.value("and", [b.value("lt", [gr, rows], BOOL),
                                b.value("lt", [gc, cols], BOOL)], BOOL)
        valid = b.value("and", [valid, b.value("and", [b.value("ge", [gr, zero], BOOL),
                                                       b.value("ge", [gc, zero], BOOL)],
                                               BOOL)], BOOL)
        index = self.add(b, self.s(op.operands[0]), self.add(b, self._i(b, "mul", gr, s0),
                                                             self._i(b, "mul", gc, s1)))
        return index, valid

    def _scratch_base(self, b: Builder) -> Value:
        return self._i(b, "mul", b.value("simd_group", [], I32), PER_GROUP)

    def _guarded(self, op: Op, b: Builder, complete: Value | None, fast, slow) -> None:
        if complete is None:
            return fast(b)
        if "scratch" not in op.attrs:
            raise CompilationError("this device tile may be incomplete (runtime extents or "
                                   "origin): pass scratch= (a shared tensor of shape "
                                   "(BLOCK // 4, 8)) for the masked tail", op.loc)
        if op.attrs["scratch_rows"] * 8 != self.T * 2:
            raise CompilationError(f"scratch misuse: the scratch tensor has "
                                   f"{op.attrs['scratch_rows']} rows; with BLOCK={self.T} "
                                   f"threads it needs BLOCK // 4 = {self.T // 4}", op.loc)
        then, other = Block(), Block()
        for blk, fn in ((then, fast), (other, slow)):
            inner = Builder(blk)
            inner.loc = op.loc
            fn(inner)
        b.op("if", [complete], [], {}, [then, other])

    def view_load(self, op: Op, b: Builder) -> None:
        dtype = op.results[0].type.elem.dtype
        name = self.new_fragment(dtype)
        self.frags[op.results[0].id] = (name, dtype)
        ptr = elem_type(op.operands[0].type)
        off, ld, transpose, g = self._geometry(op, b)
        if ptr.space == "threadgroup":
            b.op("frag_load", [off], [], {"name": name, "index": 0, "root": ptr.root, "ld": ld,
                                          "transpose": transpose})
            return
        root = self.buffers[(ptr.root, "read")]

        def fast(inner: Builder) -> None:
            inner.op("frag_load", [off], [], {"name": name, "index": 0, "root": root, "ld": ld,
                                              "transpose": transpose})

        def slow(inner: Builder) -> None:
            scratch, base = op.attrs["scratch"], self._scratch_base(inner)
            inner.op("simd_barrier")  # earlier matrix reads of this scratch slice are done

            def copy(bb: Builder, e, row, col) -> None:
                index, valid = self._device_index(bb, op, g, row, col)
                zero = self.const(bb, 0.0, dtype)
                v = bb.value("mem_load", [index, valid, zero], ScalarType(dtype), root=root,
                             space="device")
                bb.op("mem_store", [self.add(bb, base, e), v], [],
                      {"root": scratch, "space": "threadgroup"})
            self._elements(inner, copy)
            inner.op("simd_barrier")
            inner.op("frag_load", [base], [], {"name": name, "index": 0, "root": scratch,
                                               "ld": 8})
        self._guarded(op, b, self._complete(op, b, g), fast, slow)

    def view_store(self, op: Op, b: Builder) -> None:
        ptr = elem_type(op.operands[0].type)
        value = op.operands[5]
        name = self.materialize(value, b, ptr.dtype)
        off, ld, transpose, g = self._geometry(op, b)
        zero = self.const(b, 0)
        if ptr.space == "threadgroup":
            b.op("frag_store", [zero, off], [], {"name": name, "root": ptr.root, "ld": ld,
                                                 "transpose": transpose})
            return
        root = self.buffers[(ptr.root, "out")]
        written = self.buffers.get((ptr.root, "written"))

        def mark(inner: Builder, masked: bool) -> None:
            if written is None:
                return

            def flag(bb: Builder, e, row, col) -> None:
                index, valid = self._device_index(bb, op, g, row, col)
                bb.op("mem_store", [index, self.const(bb, True, dt.bool_)]
                      + ([valid] if masked else []), [], {"root": written, "space": "device"})
            self._elements(inner, flag)

        def fast(inner: Builder) -> None:
            inner.op("frag_store", [zero, off], [], {"name": name, "root": root, "ld": ld,
                                                     "transpose": transpose})
            mark(inner, False)

        def slow(inner: Builder) -> None:
            scratch, base = op.attrs["scratch"], self._scratch_base(inner)
            inner.op("simd_barrier")
            inner.op("frag_store", [zero, base], [], {"name": name, "root": scratch, "ld": 8})
            inner.op("simd_barrier")

            def copy(bb: Builder, e, row, col) -> None:
                index, valid = self._device_index(bb, op, g, row, col)
                v = bb.value("mem_load", [self.add(bb, base, e)], ScalarType(ptr.dtype),
                             root=scratch, space="threadgroup")
                bb.op("mem_store", [index, v, valid], [], {"root": root, "space": "device"})
                if written is not None:
                    bb.op("mem_store", [index, self.const(bb, True, dt.bool_), valid], [],
                          {"root": written, "space": "device"})
            self._elements(inner, copy)
        self._guarded(op, b, self._complete(op, b, g), fast, slow)


def walk_regions(op: Op):
    for region in op.regions:
        yield from walk(region)


class _FragSlot:
    def __init__(self, name: str, dtype: dt.DType):
        self.name, self.dtype = name, dtype


class _Named(Value):
    """A fragment already held under `name` (the source of a slot copy)."""

    def __init__(self, name: str, dtype: dt.DType, lowering: FragmentLowering):
        super().__init__(TileType(SHAPE, ScalarType(dtype)), None, name)
        lowering.frags[self.id] = (name, dtype)


def lower_fragments(fn: Function, threads: int, buffers: dict) -> Function:
    check_shared_contract(fn, threads)  # again here: the plan may have come from the disk cache
    lowering = FragmentLowering(fn, threads, buffers)
    out = lowering.run()
    out.meta["split_loops"] = lowering.split_loops
    return out
