"""async_pipeline_staging: GEMM operands staged with 16-byte asynchronous copies
through a multi-stage shared-memory ring (a mixin of `MatmulLowering`).

Used when the backend's matrix unit declares `async_copy` (CUDA's mma.sync unit:
cp.async, sm_80+), or a float32 GEMM on scalar FMAs runs on such a target, and every
operand tile (A and each product's B: a dual GEMM
stages two) is a plain load whose addresses are
contiguous along the tile's last axis (coefficient 1, proven from the index
arithmetic, whatever the runtime strides of the other axis) with a zero fill.

Copies.  Each operand tile is split into 16-byte groups of G consecutive
columns.  A group whose mask holds for all G elements and whose source address
is 16-byte aligned (checked at run time: MLX may hand over an offset view) is
one cp.async; any other group (ragged edges, K tails, misaligned views) is
copied element by element with the user's mask, zeros where it fails.  A mask
conjunct that does not depend on the column is tested once per group; one of
the form `f(column) < X` (or <=) with f increasing is tested at the group's
last column, `>`/`>=` at its first; anything else at every column.

Pipeline.  S stages (2..5): tiles 0..S-2 are in flight before the loop; step t
waits until tile t has landed (cp.async.wait_group S-2), one barrier, issues
tile t+S-1 into the stage tile t-1 used (every warp has finished it: the
barrier), then multiplies tile t.  Every step commits one group, empty or not,
so the wait count stays exact.

Layout.  Rows of 16-byte chunks are XOR-swizzled (chunk ^ (row / U) % C') so
the 8 rows an ldmatrix reads hit 8 different bank groups; the copy and the
fragment loads use the same function (`swizzle_params`).
"""

from __future__ import annotations

from math import prod

from ..ir.core import Builder, Op, Value
from ..ir.types import ScalarType, TileType, elem_type
from ..language import dtypes as dt
from .gemm_bounds import staging_load
from .lane_layout import BOOL, I32, Ctx
from ..schedule.targets import ffma_async_copies, ring_depth  # (the planner's too)

# Unrolled copy slots per thread and tile (a 128x256x64 16-bit tile over the 128 threads
# of gemm_wgmma's producer warpgroup is 8 + 16; over 256 threads 4 + 8).
MAX_UNROLLED_SLOTS = 32
_MONOTONE = {"lt": "last", "le": "last", "gt": "first", "ge": "first"}


def swizzle_params(ld: int, group: int):
    """(U, C') of the chunk swizzle of a row of `ld` elements in groups of `group`, or
    None when the row is not a power-of-two number of chunks (then rows stay linear)."""
    chunks = ld // group
    if ld % group or chunks < 2 or chunks & (chunks - 1):
        return None
    return max(1, 8 // chunks), min(chunks, 8)


def _axis_coeffs(v: Value, memo: dict):
    """{tile axis: int coefficient or None (runtime)} of `v`'s affine dependence on the
    tile coordinates, or False when it is not affine in them."""
    if v.id in memo:
        return memo[v.id]
    op = v.owner
    out = {}
    if isinstance(op, Op):
        args = [_axis_coeffs(o, memo) for o in op.operands]
        n = op.name
        if any(a is False for a in args):
            out = False
        elif n == "arange":
            out = {0: 1}
        elif n in ("splat", "broadcast"):
            out = args[0] if args else {}
        elif n == "expand_dims":
            d = op.attrs["axis"]
            out = {(k + 1 if k >= d else k): c for k, c in args[0].items()}
        elif n in ("add", "ptr_add", "sub"):
            out = dict(args[0])
            for k, c in args[1].items():
                old = out.get(k, 0)
                out[k] = None if old is None or c is None else old + (-c if n == "sub" else c)
        elif n == "mul":
            if args[0] and args[1]:
                out = False
            else:
                dep, other = (0, 1) if args[0] else (1, 0)
                f = _int_const(op.operands[other])
                out = {k: (c * f if c is not None and f is not None else None)
                       for k, c in args[dep].items()}
        elif any(args):
            out = False
    memo[v.id] = out
    return out


def _axes(v: Value, memo: dict) -> frozenset:
    """The tile axes `v` depends on."""
    if v.id not in memo:
        op = v.owner
        out = frozenset()
        if isinstance(op, Op):
            args = [_axes(o, memo) for o in op.operands]
            if op.name == "arange":
                out = frozenset({0})
            elif op.name == "expand_dims":
                d = op.attrs["axis"]
                out = frozenset(k + 1 if k >= d else k for k in args[0])
            else:
                out = frozenset().union(*args)
        memo[v.id] = out
    return memo[v.id]


def _int_const(v: Value):
    op = v.owner
    while isinstance(op, Op) and op.name in ("splat", "broadcast", "expand_dims"):
        op = op.operands[0].owner
    if isinstance(op, Op) and op.name == "const" and isinstance(op.attrs["value"], int) \
            and not isinstance(op.attrs["value"], bool):
        return op.attrs["value"]
    return None


def _conjuncts(mask: Value) -> list[Value]:
    op = mask.owner
    if isinstance(op, Op) and op.name == "and" and isinstance(mask.type, TileType):
        return [c for o in op.operands for c in _conjuncts(o)]
    return [mask]


def copy_axis(value, group: int, k_major_b: bool = False) -> int | None:
    """The axis along which an operand tile is a plain 2-D load contiguous in 16-byte
    groups of `group` elements: 1 (its last axis), 0 (K, for a right operand stored
    (N, K), only where `k_major_b`: the warpgroup unit reads it K-major), else None."""
    ld = staging_load(value)
    if ld is None or len(ld.results[0].type.shape) != 2:
        return None
    coeffs = _axis_coeffs(ld.operands[0], {})
    if coeffs is False:
        return None
    shape = ld.results[0].type.shape
    for axis in ((1, 0) if k_major_b else (1,)):
        if coeffs.get(axis) == 1 and shape[axis] % group == 0:
            return axis
    return None


def computed_axis(value, group: int) -> int | None:
    """For a right operand tile that is computed from loads rather than being one (a
    weight dequantized while it is staged: `scale * ((word >> shift) & 15) + bias`), the
    axis its 16-byte groups run along for the warpgroup unit: K (0), the K-major layout a
    Linear's weight takes, where each group's elements are evaluated by one thread and
    stored as one vector (a group of 8 along K shares its packed word, scale and bias).
    None for a load (copy_axis), a tile that is not 2-D, K not whole groups, or a tile
    reading a load contiguous along N (a cast of a row-major operand: its reads would
    run down columns)."""
    if staging_load(value) is not None or not isinstance(value.type, TileType) or \
            len(value.type.shape) != 2 or value.type.shape[0] % group:
        return None
    loads = _loads_in(value, set())
    if not loads or any(_unit_along(ld.operands[0], 1) for ld in loads):
        return None
    return 0


def _unit_along(index: Value, axis: int) -> bool:
    coeffs = _axis_coeffs(index, {})
    return coeffs is not False and coeffs.get(axis) == 1


class _GroupInvariant:
    """Whether an index tile takes one value on every aligned group of `width` elements
    along `axis` of the operand tile (a K-major group of 8 reads one packed word and one
    scale): it does not move along the axis, or moves only through `x // c` with c a
    multiple of the width and x a row counter along the axis starting at a multiple of it
    (`start + arange`: the K loop's variable, from a multiple of the width in steps of
    one, plus the tile's K index).  Elementwise functions of such values are such values."""

    def __init__(self, axis: int, width: int, loop: Op):
        self.axis, self.width, self.memo = axis, width, {}
        lo, _, step = loop.operands[:3]
        self.iv = loop.regions[0].args[0]
        self.iv_aligned = all(isinstance(c, int) and c % width == 0
                              for c in (_int_const(lo), _int_const(step)))

    def __call__(self, v: Value) -> bool:
        return self._invariant(v, self.axis)

    def _invariant(self, v: Value, axis: int) -> bool:
        key = (v.id, axis)
        if key not in self.memo:
            self.memo[key] = self._decide(v, axis)
        return self.memo[key]

    def _decide(self, v: Value, axis: int) -> bool:
        if not isinstance(v.type, TileType) or axis not in _axes(v, {}):
            return True
        op = v.owner
        if not isinstance(op, Op):
            return False
        if op.name == "expand_dims":   # result axis `axis` is source axis axis (- 1 past d)
            d = op.attrs["axis"]
            return axis == d or self._invariant(op.operands[0], axis if axis < d else axis - 1)
        if op.name == "idiv":
            c = _int_const(op.operands[1])
            return c is not None and c > 0 and c % self.width == 0 and \
                self._counter(op.operands[0], axis)
        if op.name == "shr":   # x >> c of a counter from 0 up: x // 2^c
            c = _int_const(op.operands[1])
            return c is not None and 0 <= c < 31 and (1 << c) % self.width == 0 and \
                self._counter(op.operands[0], axis)
        if op.name in ("add", "sub", "mul", "ptr_add", "and", "or", "xor", "broadcast",
                       "splat"):
            return all(self._invariant(o, axis) for o in op.operands)
        return False

    def _counter(self, v: Value, axis: int) -> bool:
        """v is start + (the index along `axis`), start a multiple of the width."""
        op = v.owner
        if not isinstance(op, Op) or _axes(v, {}) != frozenset({axis}):
            return False
        if op.name == "arange":
            return axis == 0 and op.attrs.get("start", 0) % self.width == 0
        if op.name == "add":
            a, b = op.operands
            if axis in _axes(b, {}):
                a, b = b, a
            return axis not in _axes(b, {}) and self._multiple(b) and self._counter(a, axis)
        return False

    def _multiple(self, v: Value) -> bool:
        """v (constant over the tile) is a multiple of the width in every program."""
        c = _int_const(v)
        if c is not None:
            return c % self.width == 0
        if v is self.iv:
            return self.iv_aligned
        op = v.owner
        if not isinstance(op, Op):
            return False
        if op.name in ("splat", "broadcast", "expand_dims"):
            return self._multiple(op.operands[0])
        if op.name in ("add", "sub"):
            return all(self._multiple(o) for o in op.operands)
        if op.name == "mul":
            return any(self._multiple(o) for o in op.operands)
        return False


def _loads_in(v: Value, seen: set) -> list:
    """The loads `v` is computed from (its defining ops, recursively)."""
    op = v.owner
    if not isinstance(op, Op) or id(op) in seen:
        return []
    seen.add(id(op))
    found = [op] if op.name == "load" else []
    for o in op.operands:
        found += _loads_in(o, seen)
    return found


def plain_contiguous_operands(g, k_major_b: bool = False) -> bool:
    """Every operand tile of `g` is a plain 2-D load contiguous along its last axis in
    16-byte groups, or (`k_major_b`) a right operand contiguous along K or computed from
    loads (`computed_axis`) (the static half of `AsyncStaging.async_eligible`)."""
    group = 16 // g.operand_dtype.itemsize
    return copy_axis(g.a, group) == 1 and all(
        copy_axis(b, group, k_major_b) is not None or
        (k_major_b and computed_axis(b, group) is not None) for b in g.bs)


class AsyncStaging:
    """Expects the `MatmulLowering` state (gemm, gemm_plan, schedule_plan, buffers, T)."""

    def async_eligible(self) -> bool:
        """Whether this GEMM can take the cp.async pipeline (see the module docstring)."""
        unit, sp = self.gemm_plan.unit, self.schedule_plan
        od = self.gemm.operand_dtype
        if unit is None:
            # scalar FMA micro-tiles (strict float32): the ring where the target has the
            # copies; its 16-byte chunks are the 4-wide operand reads of `_ffma_step`
            if od.itemsize != 4 or not ffma_async_copies(self.matrix_units):
                return False
        elif not unit.async_copy:
            return False
        if sp is not None and (sp.double_buffer or sp.vector_width == 4 or sp.num_stages == 1):
            return False   # the plan asked for the ordinary-load passes; honour them
        group = 16 // od.itemsize
        self.async_loads = {}
        k_major_b = bool(unit and unit.warpgroup)
        for value in self.gemm.operands:
            ld = staging_load(value)
            axis = copy_axis(value, group, k_major_b and value is not self.gemm.a)
            if axis is None and k_major_b and value is not self.gemm.a:
                axis = computed_axis(value, group)
                if axis is not None:   # evaluated and stored by the threads (_computed_groups)
                    self.async_loads[id(value)] = (None, [], axis)
                    continue
            if axis is None:
                return False
            root = elem_type(ld.operands[0].type).root
            if elem_type(ld.operands[0].type).space == "threadgroup" or \
                    self.buffers.get((root, "written")) is not None:
                return False
            if len(ld.operands) == 3 and _int_const(ld.operands[2]) != 0:
                other = ld.operands[2].owner
                if not (isinstance(other, Op) and other.name in ("const", "splat")
                        and _float_zero(other)):
                    return False
            checks = []
            if len(ld.operands) > 1:
                for c in _conjuncts(ld.operands[1]):
                    checks.append((c, self._conjunct_mode(c, axis)))
            self.async_loads[id(ld)] = (ld, checks, axis)
        return True

    def _conjunct_mode(self, c: Value, axis: int = 1) -> str:
        """How a mask conjunct is tested for a 16-byte group along `axis`."""
        if axis not in _axes(c, {}):
            return "once"   # independent of the grouped axis (constant over the group)
        op = c.owner
        while isinstance(op, Op) and op.name == "broadcast":
            op = op.operands[0].owner
        if isinstance(op, Op) and op.name in _MONOTONE:
            lhs, rhs = (_axis_coeffs(o, {}) for o in op.operands)
            if lhs is not False and rhs is not False and not rhs.get(axis) \
                    and isinstance(lhs.get(axis), int) and lhs[axis] > 0:
                return _MONOTONE[op.name]
        return "each"

    # -- the pipeline ------------------------------------------------------------------------
    def choose_stages(self, stage_bytes: int) -> int:
        sp = self.schedule_plan
        requested = getattr(sp, "num_stages", None) if sp is not None else None
        if requested:
            return requested
        return ring_depth(self.shared_limit - self.shared_bytes, stage_bytes,
                          self.gemm_plan.unit is None)

    def k_tiles(self, op: Op, b: Builder):
        """(the K loop's tile count, issue) for a pipelined K loop: `issue(lb, t, stage,
        mode=None, carried=False)` copies tile t (when t is below the count) into `stage`,
        binding K there (`mode`, `carried`: see `_async_copy`)."""
        lo, hi, step = (self.s(v) for v in op.operands[:3])
        span = b.value("sub", [hi, lo], I32)
        n = b.value("idiv", [b.value("add", [span, self._i(b, "sub", step, 1)], I32), step], I32)
        n = b.value("maximum", [n, self.const(b, 0)], I32)

        def issue(lb: Builder, t: Value, stage, mode: str | None = None,
                  carried: bool = False) -> None:
            then = lb.op("if", [lb.value("lt", [t, n], BOOL)], [], {}, [_block(), _block()])
            tb = Builder(then.regions[0])
            tb.loc = lb.loc
            self._bind_k(tb, self.add(tb, lo, tb.value("mul", [t, step], I32)))
            self._async_copy(tb, stage, mode, carried)

        return n, issue

    def async_pipeline(self, op: Op, b: Builder) -> None:
        """The K loop as an S-stage cp.async pipeline (module docstring).  Scalar-FMA GEMMs
        run a second copy of the loop without per-tile copy tests where
        `whole_group_copies` proves them unneeded: in the float32 ring's loop (4096^3,
        128x128x16, one 16-K tile per step) the copies' address, alignment and edge
        tests were about 300 of the step's 1410 SASS instructions, against 1024 FFMAs,
        in a loop whose issue slots are the limit."""
        bk = self.gemm.tile[2]
        self.lowering_passes.append("async_pipeline_staging")
        n, issue = self.k_tiles(op, b)
        if self.gemm_plan.unit is None:
            self.steps_with_whole_copies(op, b, n, issue, self._ring_steps)
        else:
            self._ring_steps(b, n, issue)
        self.report_loop(self.k_body.args[0].hint or "k", "loop", bk)
        self._report_inner()

    def steps_with_whole_copies(self, op: Op, b: Builder, n: Value, issue, steps) -> None:
        """`steps(builder, n, issue)` twice under the block-uniform `whole_group_copies`
        proof: a loop whose copies are whole-group cp.async with no per-tile tests, and
        the loop with them; only the latter where the kernel's form allows no proof."""
        whole = self.whole_group_copies(op, b, self.s(op.operands[0]), self.s(op.operands[2]))
        if whole is None:
            return steps(b, n, issue)
        self.lowering_passes.append("whole_group_copies")
        branch = b.op("if", [whole], [], {}, [_block(), _block()])
        fb, sb = Builder(branch.regions[0]), Builder(branch.regions[1])
        fb.loc = sb.loc = b.loc
        steps(fb, n, lambda lb, t, stage, mode=None, carried=False:
              issue(lb, t, stage, mode or "whole", carried))
        steps(sb, n, issue)

    def _ring_steps(self, b: Builder, n: Value, issue) -> None:
        """Prologue (tiles 0..S-2), the loop over K tiles, the final drain."""
        s = self.num_stages
        for t in range(s - 1):
            issue(b, self.const(b, t), t)
            b.op("cp_async_commit")

        def body(lb: Builder, t: Value) -> None:
            lb.op("cp_async_wait", [], [], {"pending": s - 2})
            lb.op("barrier")
            nxt = self._i(lb, "add", t, s - 1)
            issue(lb, nxt, self._i(lb, "mod", nxt, s))
            lb.op("cp_async_commit")
            self._compute(lb, self._i(lb, "mod", t, s))

        self._for(b, 0, n, 1, "t", body)
        b.op("cp_async_wait", [], [], {"pending": 0})

    def _async_copy(self, b: Builder, stage, mode: str | None = None, carried: bool = False):
        """Copy every operand tile into `stage` (mode None, or "whole": see
        `whole_group_copies`), or (mode "check") return the bool that this thread's groups
        of the bound K tile satisfy that form's conditions, or (mode "ahead") only load the
        computed tiles' group-invariant words into this thread's registers
        (`_computed_groups`), or (mode "computed") evaluate only the computed tiles (the
        others arrive by bulk tensor copies: gemm_wgmma's mixed_bulk); `carried`: the
        computed tiles read those registers."""
        ok = None
        for value, st, shape in self.operand_stages():   # A, then each product's B
            ld, checks, axis = self.async_entry(value)
            if ld is None:
                if mode == "ahead":
                    self._computed_groups(b, value, st, shape, None, axis, "ahead")
                elif mode != "check":   # (computed: nothing to prove about its groups)
                    self._computed_groups(b, value, st, shape,
                                          self.stage_base(b, st, shape, stage), axis,
                                          "carried" if carried else None)
                continue
            if mode in ("ahead", "computed"):
                continue
            base = self.stage_base(b, st, shape, stage)
            part = self._copy_groups(b, ld, checks, st, shape, base, axis, mode)
            if part is not None:
                ok = part if ok is None else b.value("and", [ok, part], BOOL)
        return ok

    def stage_base(self, b: Builder, st, shape, stage) -> Value:
        """Where tile `stage` of an operand starts in its stage array `st`: stage times the
        tile's size, or, in an array whose stages hold two operands' tiles (a joined dual
        GEMM's B tiles, gemm_wgmma._joined_dual), stage times both and this operand's
        offset inside them."""
        size, offset = st.stage_size or prod(shape), st.stage_offset
        if not isinstance(stage, Value):
            return self.const(b, stage * size + offset)
        base = self._i(b, "mul", stage, size)
        return self._i(b, "add", base, offset) if offset else base

    def async_entry(self, value):
        """(load or None, its mask checks, group axis) of a staged operand tile: None for
        one computed from loads (`computed_axis`)."""
        ld = staging_load(value)
        return self.async_loads[id(ld) if ld is not None else id(value)]

    def _computed_groups(self, b: Builder, value: Value, st, shape, base: Value | None,
                         axis: int, phase: str | None = None) -> None:
        """A computed operand tile (`computed_axis`) into the stage: each thread evaluates
        the elements of its 16-byte groups along `axis` (each element with its own loads'
        masks, zero where they fail) and stores each group as one vector.  These are the
        threads' own writes: the step's fence.proxy.async before its barrier orders them
        before the tensor cores read the stage, as for the element copies of cp.async's
        misaligned groups.

        `phase` "ahead" only loads the group-invariant words (`carried_loads`) of the bound
        K tile into this thread's registers, one array a load and a slot a group, and
        "carried" evaluates the tile from those registers: a pipeline that loads tile t+1's
        words while tile t is evaluated hides their latency behind a K step (the stores
        wait on nothing but arithmetic)."""
        rows, cols = shape
        group = 16 // st.dtype.itemsize
        along, across = (cols, rows) if axis == 1 else (rows, cols)
        groups = along // group
        swz = self.swizzles.get(st.name)
        n = across * groups
        tid, count = self._copiers(b)

        invariant = _GroupInvariant(axis, group, self.gemm.loop)
        carried = self.carried_loads(value, invariant) if phase else {}

        def body(lb: Builder, lin: Value, slot: int) -> None:
            line = self._i(lb, "idiv", lin, groups)
            start = self._i(lb, "mul", self._i(lb, "mod", lin, groups), group)
            ctxs = []
            for e in range(group):
                at = self._i(lb, "add", start, e)
                row, col = (line, at) if axis == 1 else (at, line)
                ctxs.append(Ctx(self, lb, shape, coords=[row, col], identity=False))
            loaded = {}

            def once(op: Op) -> Value:
                """The load's one value for the group, under any element's mask."""
                rest = []
                if len(op.operands) > 1:
                    anyone = None
                    for c in ctxs:
                        m = self.elem(op.operands[1], c)
                        anyone = m if anyone is None else lb.value("or", [anyone, m], BOOL)
                    rest = [anyone, self.elem(op.operands[2], ctxs[0])]
                return self.emit_load(lb, op, [self.elem(op.operands[0], ctxs[0]), *rest])

            if phase == "ahead":
                for op, name in carried.values():
                    lb.op("local_set", [self.const(lb, slot), _widened(lb, once(op))], [],
                          {"name": name})
                return

            def group_load(op: Op, ctx: Ctx) -> Value:
                # A load whose address is the same for every element of the group (a
                # packed word, a group's scale) is issued once, under any element's mask
                # (or was, a step ahead: `carried`); each element keeps its own mask and
                # fill.
                if not invariant(op.operands[0]):
                    return self.emit_load(ctx.b, op, [self.elem(o, ctx) for o in op.operands])
                if id(op) not in loaded:
                    if id(op) in carried:
                        held = lb.value("local_get", [self.const(lb, slot)],
                                        ScalarType(_held_dtype(op)), name=carried[id(op)][1])
                        loaded[id(op)] = _narrowed(lb, held, op)
                    else:
                        loaded[id(op)] = once(op)
                if len(op.operands) == 1:
                    return loaded[id(op)]
                return ctx.b.value("where", [self.elem(op.operands[1], ctx), loaded[id(op)],
                                             self.elem(op.operands[2], ctx)],
                                   loaded[id(op)].type)

            self.load_rewrite = group_load
            try:
                values = [self.elem(value, c) for c in ctxs]
            finally:
                self.load_rewrite = None
            row, col = (line, start) if axis == 1 else (start, line)
            dst = self.add(lb, base, self.swizzled_offset(lb, row, col, cols, swz))
            lb.op("vec_store", [dst, *values], [], {"root": st.name, "space": "threadgroup"})

        self._each_group(b, tid, n, count, body)

    def carried_loads(self, value: Value, invariant) -> dict:
        """{id(load): (load, register array)} of the loads a computed operand tile reads
        once a group (`_GroupInvariant`) that may be read a K step early: plain device
        loads of a buffer this kernel does not write.  The arrays (a slot for each of this
        thread's groups) are declared once a tile and shared by the loops that stage it."""
        memo = self.__dict__.setdefault("_carried", {})
        if id(value) not in memo:
            rows, cols = value.type.shape
            group = 16 // self.gemm.operand_dtype.itemsize
            slots = -(-(rows * cols // group) // self._copy_threads())
            found = {}
            for op in _loads_in(value, set()):
                ptr = elem_type(op.operands[0].type)
                if ptr.space == "threadgroup" or ptr.root in self.atomic_buffers or \
                        self.buffers.get((ptr.root, "written")) is not None or \
                        not invariant(op.operands[0]):
                    continue
                found[id(op)] = (op, self.decl("local", _held_dtype(op), slots, "_ahead"))
            memo[id(value)] = found
        return memo[id(value)]

    def loads_ahead(self) -> bool:
        """Whether a computed operand tile reads words a pipeline may load a K step ahead
        (`carried_loads`): then issue(..., mode="ahead") is worth a place in its steps."""
        group = 16 // self.gemm.operand_dtype.itemsize
        return any(self.carried_loads(value, _GroupInvariant(axis, group, self.gemm.loop))
                   for value, _, _ in self.operand_stages()
                   for ld, _, axis in [self.async_entry(value)] if ld is None)

    def _each_group(self, b: Builder, tid: Value, n: int, count: int, body) -> None:
        """`body(builder, lin, slot)` for this thread's groups lin = tid + slot * count < n,
        unrolled: constant slot offsets let the compiler hoist the per-group address and
        swizzle arithmetic out of the K loop; only the last slot may test lin < n."""
        for slot in range((n + count - 1) // count):
            lin = self._i(b, "add", tid, slot * count)
            if (slot + 1) * count <= n:
                body(b, lin, slot)
            else:
                part = b.op("if", [b.value("lt", [lin, self.const(b, n)], BOOL)], [], {},
                            [_block(), _block()])
                pb = Builder(part.regions[0])
                pb.loc = b.loc
                body(pb, lin, slot)

    def _copy_groups(self, b, ld: Op, checks, st, shape, base: Value, axis: int = 1,
                     mode: str | None = None):
        """The tile's 16-byte groups along `axis` (1: rows of columns; 0: columns of
        rows, a right operand stored (N, K) for the warpgroup unit), each one cp.async or
        element copies, into the stage's layout (`swizzled_offset`); for the modes of
        `whole_group_copies`, those copies or their check."""
        rows, cols = shape
        group = 16 // st.dtype.itemsize
        along, across = (cols, rows) if axis == 1 else (rows, cols)
        groups = along // group
        root = self.buffers[(elem_type(ld.operands[0].type).root, "read")]
        swz = self.swizzles.get(st.name)

        def at(lb, row, col):
            return Ctx(self, lb, shape, coords=[row, col], identity=False)

        def conj(lb, c: Value, row, col) -> Value:
            return self.tile_value_at(lb, c, shape, row, col)

        def coords(lb, line, pos):
            """(row, col) of element `pos` along the grouped axis of line `line`."""
            return (line, pos) if axis == 1 else (pos, line)

        def group_at(lb, lin):
            """(line, start, row, col) of this thread's group number `lin`."""
            line = self._i(lb, "idiv", lin, groups)
            start = self._i(lb, "mul", self._i(lb, "mod", lin, groups), group)
            return (line, start, *coords(lb, line, start))

        def source_at(lb, row, col):
            return self.elem(ld.operands[0], at(lb, row, col))

        def dst_at(lb, row, col):
            return self.add(lb, base, self.swizzled_offset(lb, row, col, cols, swz))

        def body(lb: Builder, lin: Value, slot: int | None = None) -> None:   # (_for: no slot)
            line, start, row, col = group_at(lb, lin)
            along_e = [self._i(lb, "add", start, e) for e in range(group)]
            index = source_at(lb, row, col)
            full = None
            for c, mode in checks:
                where = {"once": [start], "first": [start], "last": [along_e[-1]],
                         "each": along_e}[mode]
                for x in where:
                    m = conj(lb, c, *coords(lb, line, x))
                    full = m if full is None else lb.value("and", [full, m], BOOL)
            dst = dst_at(lb, row, col)
            ok = lb.value("aligned16", [index], BOOL, root=root)
            if full is not None:
                ok = lb.value("and", [full, ok], BOOL)
            branch = lb.op("if", [ok], [], {}, [_block(), _block()])
            tb, eb = Builder(branch.regions[0]), Builder(branch.regions[1])
            tb.loc = eb.loc = lb.loc
            tb.op("cp_async", [dst, index], [], {"dst": st.name, "src": root, "bytes": 16})
            zero = self.const(eb, 0.0, st.dtype)
            for e in range(group):
                idx = self._i(eb, "add", index, e)
                mask = None
                for c, _ in checks:
                    m = conj(eb, c, *coords(eb, line, self._i(eb, "add", start, e)))
                    mask = m if mask is None else eb.value("and", [mask, m], BOOL)
                args = [idx] if mask is None else [idx, mask, zero]
                v = self.emit_load(eb, ld, args)
                eb.op("mem_store", [self._i(eb, "add", dst, e), v], [],
                      {"root": st.name, "space": "threadgroup"})

        n = across * groups
        tid, count = self._copiers(b)
        slots = (n + count - 1) // count
        if mode is not None:
            # an empty group's copy reads nothing at the buffer's start: aligned too
            ok = b.value("aligned16", [self.const(b, 0)], BOOL, root=root) \
                if mode == "check" else None
            for slot in range(slots):
                _, _, row, col = group_at(b, self._i(b, "add", tid, slot * count))
                index = source_at(b, row, col)
                if mode == "check":
                    # aligned, and every `f < X` conjunct X - f(start) a multiple of G:
                    # each group all in bounds or none (see whole_group_copies)
                    good = b.value("aligned16", [index], BOOL, root=root)
                    for c, cmode in checks:
                        if cmode == "once":
                            continue
                        room = self._room(b, c, (row, col), conj)
                        whole = b.value("eq", [self._i(b, "mod", room, group), self.const(b, 0)],
                                        BOOL)
                        good = b.value("and", [good, whole], BOOL)
                    ok = good if ok is None else b.value("and", [ok, good], BOOL)
                    continue
                dst = dst_at(b, row, col)
                inside = None
                for c, _ in checks:   # at the group's first element: all in or none
                    m = conj(b, c, row, col)
                    inside = m if inside is None else b.value("and", [inside, m], BOOL)
                if inside is None:
                    b.op("cp_async", [dst, index], [], {"dst": st.name, "src": root, "bytes": 16})
                    continue
                zero = self.const(b, 0, elem_type(index.type).dtype)
                src = b.value("where", [inside, index, zero], index.type)
                size = b.value("where", [inside, self.const(b, 16), self.const(b, 0)], I32)
                b.op("cp_async", [dst, src, size], [], {"dst": st.name, "src": root, "bytes": 16})
            return ok
        if _prefix_masks(checks, axis) and _unrolled_evenly(n, count):
            # This thread's groups as zero-filling copies of their in-bounds prefixes, no
            # branch per group: one test of all their addresses picks them or the copies
            # above (misaligned views).  Measured on the H200 at 4096^3 float16 (128x256x64
            # warpgroup tiles, tools/probes): 352 us with a branch per group, 341 with this
            # test per tile (267 for a hand edit with no test: whole_group_copies).
            lins = [self._i(b, "add", tid, slot * count) for slot in range(slots)]
            plan = []
            aligned = None
            for lin in lins:
                _, _, row, col = group_at(b, lin)
                index = source_at(b, row, col)
                kept = self._prefix_count(b, checks, (row, col), group, conj)
                if kept is not None:   # an empty group reads nothing, at the buffer's start
                    some = b.value("gt", [kept, self.const(b, 0)], BOOL)
                    zero = self.const(b, 0, elem_type(index.type).dtype)
                    index = b.value("where", [some, index, zero], index.type)
                plan.append((dst_at(b, row, col), index, kept))
                ok = b.value("aligned16", [index], BOOL, root=root)
                aligned = ok if aligned is None else b.value("and", [aligned, ok], BOOL)
            branch = b.op("if", [aligned], [], {}, [_block(), _block()])
            fb, sb = Builder(branch.regions[0]), Builder(branch.regions[1])
            fb.loc = sb.loc = b.loc
            for dst, index, kept in plan:
                size = [] if kept is None else [self._i(fb, "mul", kept, st.dtype.itemsize)]
                fb.op("cp_async", [dst, index] + size, [],
                      {"dst": st.name, "src": root, "bytes": 16})
            for lin in lins:
                body(sb, lin)
            return
        if slots > MAX_UNROLLED_SLOTS:
            # Too many slots to unroll (a few copying threads): a counted loop over them.
            self._for(b, tid, n, count, "g", body)
            return
        self._each_group(b, tid, n, count, body)

    def whole_group_copies(self, op: Op, b: Builder, lo: Value, step: Value):
        """A block-uniform bool under which every K tile's copies may be one zero-filling
        cp.async per 16-byte group of 16 or 0 bytes, with no test of alignment or partial
        groups in the loop; None when the kernel's form does not allow the proof.

        Static half: every staged index and every `f < X` mask operand is affine in the K
        induction variable (`_iv_affine`), each group's mask a prefix (`_unit_slope`), each
        thread's groups unrolled.  Run-time half, for this thread's groups at K tiles 0 and
        1: the address is 16-byte aligned and X - f(first element) is a multiple of G.
        Affine in the tile number (mod 8, which int32 wrap-around keeps), both then hold at
        every tile: no group is partly in bounds, so its first element decides it.  Every
        thread's answer is combined (`block_all`): the loops it selects hold barriers.

        Tried and measured (H200, 4096^3 float16): stepping each group's index and mask
        rooms from values found before the loop cut the K step from 243 to 171 SASS
        instructions and ran no faster (228.7 us against 231.4; the hand-written loop of
        252 runs 228.8), at 255 registers: the copies' instruction count does not limit
        this loop (benchmarks/results/*stepped-copies*)."""
        iv = self.k_body.args[0]
        for value, st, shape in self.operand_stages():
            ld, checks, axis = self.async_entry(value)
            if ld is None:   # computed: evaluated with its own masks, in either loop
                continue
            memo = {}
            if not (_unrolled_evenly(prod(shape) * st.dtype.itemsize // 16, self._copy_threads())
                    and _prefix_masks(checks, axis) and _iv_affine(ld.operands[0], iv, memo)
                    and all(_iv_affine(o, iv, memo) for c, mode in checks if mode == "last"
                            for o in _strip_broadcast(c).operands)):
                return None
        ok = None
        for t in (0, 1):   # _async_copy's check is never None: every operand has groups
            self._bind_k(b, self.add(b, lo, b.value("mul", [self.const(b, t), step], I32)))
            part = self._async_copy(b, 0, "check")
            ok = part if ok is None else b.value("and", [ok, part], BOOL)
        return b.value("block_all", [ok], BOOL)

    def tile_value_at(self, b: Builder, v: Value, shape, row: Value, col: Value) -> Value:
        """`v` (a mask conjunct or its operand: a tile of `shape`, or one broadcast along an
        axis of size 1) at element (row, col) of the `shape` tile."""
        coords = [self.const(b, 0) if s == 1 and t != 1 else x
                  for x, s, t in zip([row, col], v.type.shape, shape)]
        return self.elem(v, Ctx(self, b, v.type.shape, coords=coords, identity=False))

    def _copiers(self, b: Builder) -> tuple[Value, int]:
        """(this thread's index among the threads that copy, how many copy)."""
        copiers = getattr(self, "copiers", None)
        return copiers if copiers else (b.value("thread_id", [], I32), self.T)

    def _copy_threads(self) -> int:
        """How many threads share the staging copies (the producer warpgroup's under
        warp specialization, else the block's)."""
        copiers = getattr(self, "copiers", None)
        return copiers[1] if copiers else self.T

    def _room(self, b: Builder, c: Value, here, conj) -> Value:
        """X - f (+1 for <=) of a conjunct `f < X` at tile element `here`: how many
        elements from there on it keeps (_unit_slope)."""
        op = _strip_broadcast(c)
        lhs, rhs = (conj(b, o, *here) for o in op.operands)
        room = b.value("sub", [rhs, lhs], I32)
        return self._i(b, "add", room, 1) if op.name == "le" else room

    def _prefix_count(self, b: Builder, checks, here, group: int, conj) -> Value | None:
        """How many leading elements (0..G) of the group starting at tile element `here`
        the mask keeps, for conjuncts `_prefix_masks` accepts; None without a mask (all G)."""
        zero, full = self.const(b, 0), self.const(b, group)
        count = None
        for c, mode in checks:
            if mode == "once":
                kept = b.value("where", [conj(b, c, *here), full, zero], I32)
            else:
                kept = self._room(b, c, here, conj)
                kept = b.value("minimum", [b.value("maximum", [kept, zero], I32), full], I32)
            count = kept if count is None else b.value("minimum", [count, kept], I32)
        return count

    def swizzled_offset(self, b: Builder, row: Value, col: Value, ld: int, swz) -> Value:
        """Element offset of (row, col) (col a multiple of the chunk) in a swizzled tile."""
        if swz is not None and swz[0] == "atoms":   # wgmma's SW128 atoms (gemm_wgmma.py)
            return self.atom_offset(b, row, col, swz[1])
        if swz is not None and swz[0] == "atoms_t":  # the same, stored transposed (K-major B)
            return self.atom_offset(b, col, row, swz[1])
        if swz is None:
            return self._i(b, "add", self._i(b, "mul", row, ld), col)
        group, (u, cm) = 16 // self.gemm.operand_dtype.itemsize, swz
        chunk = self._i(b, "idiv", col, group)
        key = self._i(b, "mod", self._i(b, "idiv", row, u) if u > 1 else row, cm)
        moved = self._i(b, "mul", b.value("xor", [chunk, key], I32), group)
        return self._i(b, "add", self._i(b, "mul", row, ld), moved)


def _held_dtype(load: Op):
    """The dtype a register array keeps `load`'s values in (`carried_loads`): 16-bit values
    a 32-bit word each (packed two a register, CUDA's 16-bit local arrays, every write would
    be a byte permute), others as loaded."""
    d = elem_type(load.operands[0].type).dtype
    return dt.uint32 if d.bits == 16 else d


def _widened(b: Builder, v: Value) -> Value:
    """A loaded value as `_held_dtype` keeps it: a 16-bit one's bits zero-extended."""
    d = v.type.dtype
    if d.bits != 16:
        return v
    if d.kind == "f":
        v = b.value("cast", [v], ScalarType(dt.uint16), bitcast=True)
    return b.value("cast", [v], ScalarType(dt.uint32))


def _narrowed(b: Builder, held: Value, load: Op) -> Value:
    """The value `_widened` kept in `held`, as `load` reads it."""
    d = elem_type(load.operands[0].type).dtype
    if d.bits != 16:
        return held
    v = b.value("cast", [held], ScalarType(dt.uint16 if d.kind == "f" else d))
    return b.value("cast", [v], ScalarType(d), bitcast=True) if d.kind == "f" else v


_AFFINE_OPS = {"add", "sub", "ptr_add", "splat", "broadcast", "expand_dims", "cast"}


def _iv_affine(v: Value, iv: Value, memo: dict) -> bool:
    """`v` is an affine function of the loop variable `iv` (or does not depend on it):
    sums, products with a factor independent of it, broadcasts and integer casts.
    Another argument of the loop's block (a carried value) is not."""
    if v.id in memo:
        return memo[v.id]
    op = v.owner
    if v is iv:
        out = True
    elif not isinstance(op, Op):
        out = v.owner is not iv.owner     # a block argument: only the loop's own is not
    else:
        deps = [_depends(o, iv, {}) for o in op.operands]
        if not any(deps):
            out = True
        elif op.name == "cast":
            out = all(elem_type(x.type).dtype.kind in "iu"
                      for x in (op.operands[0], op.results[0])) and \
                _iv_affine(op.operands[0], iv, memo)
        elif op.name == "mul":
            out = sum(deps) == 1 and all(_iv_affine(o, iv, memo) for o in op.operands)
        else:
            out = op.name in _AFFINE_OPS and all(_iv_affine(o, iv, memo) for o in op.operands)
    memo[v.id] = out
    return out


def _depends(v: Value, iv: Value, memo: dict) -> bool:
    if v.id not in memo:
        op = v.owner
        memo[v.id] = v is iv or (v.owner is iv.owner) or (
            isinstance(op, Op) and any(_depends(o, iv, memo) for o in op.operands))
    return memo[v.id]


def _prefix_masks(checks, axis: int) -> bool:
    """Every mask conjunct keeps a prefix of each group: constant over it, or `_unit_slope`."""
    return all(mode == "once" or (mode == "last" and _unit_slope(c, axis))
               for c, mode in checks)


def _unrolled_evenly(groups: int, threads: int) -> bool:
    """A tile's groups fall evenly on the copying threads, few enough per thread to unroll."""
    return groups % threads == 0 and groups // threads <= MAX_UNROLLED_SLOTS


def _strip_broadcast(c: Value) -> Op:
    op = c.owner
    while isinstance(op, Op) and op.name == "broadcast":
        op = op.operands[0].owner
    return op


def _unit_slope(c: Value, axis: int) -> bool:
    """`c` is `f < X` or `f <= X` between 32-bit integers, f rising by exactly one per
    element along `axis` and X independent of it: the elements it keeps in a group are a
    prefix."""
    op = _strip_broadcast(c)
    if not (isinstance(op, Op) and op.name in ("lt", "le")):
        return False
    lhs, rhs = (_axis_coeffs(o, {}) for o in op.operands)
    return (lhs is not False and rhs is not False and lhs.get(axis) == 1
            and not rhs.get(axis)
            and all(elem_type(o.type).dtype.name == "int32" for o in op.operands))


def _float_zero(op: Op) -> bool:
    while op.name in ("splat", "broadcast"):
        op = op.operands[0].owner
    return op.name == "const" and op.attrs["value"] == 0


def _block():
    from ..ir.core import Block
    return Block()
