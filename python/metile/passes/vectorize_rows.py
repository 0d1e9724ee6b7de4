"""vectorize_rows: lanes own runs of consecutive elements, read and written as vectors.

The plain lane layout (lane_layout.py) gives thread t the elements t, t + T, t + 2T, ...
of a tile: a warp's access is coalesced, but every element is its own load or store
(a 2-byte load per element of a float16 row).  Row kernels (norms, softmax, anything
that holds a row in registers and reduces it) are bandwidth-bound, and there the
instruction count and the bytes in flight per thread decide the speed.

Runs.  Where it applies, a tile of N elements, N a multiple of T*V, is laid out in runs
of V: element i belongs to thread (i // V) % T, slot (i // (T*V)) * V + i % V.  A lane
loop over it walks the thread's runs and, inside a run, its V elements one after the
other (`lane_loop` still yields one element per body call).  What this pass proves
(`row_runs`), so that relabelling which thread owns which element cannot change the
program's result:
- no operation of the kernel depends on the plain layout: no dot (the GEMM lowering
  has its own layouts), scan or sort (warp-level orders), atomic, shared() array or
  already-vectorized elementwise store; register tiles are read only at the element
  being computed in a lane loop of the same size, and the layout depends on the size
  alone, so every such read still finds its element; tiles read at other coordinates
  live in threadgroup memory, addressed by element; whole-tile reductions fold a
  thread's elements and then the threads in some order: only the order of the float
  additions changes, as with another thread count;
- every device load and store of a tile of such a size either has unit stride along the
  tile's last axis (the last axis a multiple of V, so a run is V consecutive, in-order
  addresses) or does not move along it (one address per run): runs never turn a
  coalesced access into a strided one.
V is 16 bytes of the narrowest such access on CUDA (8 float16, 4 float32), 4 elements
on Metal (its widest vector).

Vector accesses.  A load that does not move along a run (a per-row value broadcast
along it) from a buffer the kernel does not write is read once per run.  A unit-stride
load from a buffer the kernel does not write is read once per run, at its first
evaluation: one V-wide load when all V masks hold (and, on CUDA, the first address is
aligned to the vector: MLX may pass a row-contiguous slice at any element offset), else
V masked scalar loads.  A unit-stride store collects the
run's values and is written the same way after the run's last element.  Metal reads
and writes through packed vectors, which need element alignment only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from ..ir.core import Block, Builder, Function, Op, Value, walk
from ..ir.ops import ELEMENTWISE
from ..ir.types import PointerType, ScalarType, TileType, elem_type
from ..language import dtypes as dt
from .gemm_async import _conjuncts, _int_const
from .gemm_bounds import affine_form
from .lane_layout import BOOL, I32, Ctx, scalar_of

_FLOATS = {"float32", "float16", "bfloat16"}
# Resident blocks per SM on sm_80 and sm_90 (a one-warp block cannot ask for 64).
MAX_BLOCKS_PER_SM = 32
# Tile ops a run test may evaluate ahead of its loop (`_index_math`).
_INDEX_OPS = {"arange", "splat", "broadcast", "expand_dims", "add", "sub", "mul", "ptr_add",
              "lt", "le", "gt", "ge", "eq", "ne", "and", "const", "full"}
_FORBIDDEN = {"dot": "a dot", "scan": "a scan", "sort": "a sort",
              "shared_alloc": "a shared() array"}


def stride(v: Value, axis: int, memo: dict, breaks: list | None = None):
    """How much v grows when coordinate `axis` of its tile grows by one, the others held:
    an int (0: v does not depend on that coordinate), or None where v is not provably
    affine along it.  With `breaks` (a list), `where(c, a, b)` whose a and b have one
    stride counts as affine with it, and (c, axis) is appended: affine within every run
    only if c keeps its value along each run (`constant_on_runs`, once the width is
    known)."""
    if not isinstance(v.type, TileType):
        return 0
    key = (v.id, axis)
    if key in memo:
        return memo[key]
    op = v.owner
    out = None
    if isinstance(op, Op):
        n, args = op.name, op.operands
        if n == "where" and breaks is not None:
            c, a, b = (stride(x, axis, memo, breaks) for x in args)
            if a is not None and a == b:
                out = a
                if c != 0:
                    breaks.append((args[0], axis))
        elif n == "arange":
            out = 1
        elif n == "splat":
            out = 0
        elif n == "broadcast":
            src = args[0]
            out = 0 if src.type.shape[axis] == 1 and v.type.shape[axis] != 1 else \
                stride(src, axis, memo, breaks)
        elif n == "expand_dims":
            d = op.attrs["axis"]
            out = 0 if axis == d else stride(args[0], axis - (axis > d), memo, breaks)
        elif n in ("add", "sub", "ptr_add"):
            a, b = (stride(x, axis, memo, breaks) for x in args)
            out = None if a is None or b is None else (a - b if n == "sub" else a + b)
        elif n == "mul":
            a, b = (stride(x, axis, memo, breaks) for x in args)
            if a == 0 and b == 0:
                out = 0
            elif a is not None and b == 0 and _int_const(args[1]) is not None:
                out = a * _int_const(args[1])
            elif b is not None and a == 0 and _int_const(args[0]) is not None:
                out = b * _int_const(args[0])
        elif n in ELEMENTWISE or n == "load":
            # independent of the coordinate when every operand is
            if all(stride(x, axis, memo, breaks) == 0 for x in args):
                out = 0
    memo[key] = out
    return out


_FLIP = {"lt": 0, "ge": 0, "le": 1, "gt": 1}   # u OP K changes between u = K + flip - 1 and K + flip
_MIRROR = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}


def constant_on_runs(c: Value, axis: int, width: int) -> bool:
    """Whether condition tile `c` keeps one value along every run of `width` along `axis`:
    `u OP K` (OP one of < <= > >=) with u moving by one along the axis, zero modulo the
    width at every run's first element (`_aligned`), and K an int constant at which the
    comparison changes only between runs (K, or K + 1 for <= and >, a multiple of the
    width).  Rope's `where(col < D/2, col + D/2, col - D/2)` partner address is one."""
    op = c.owner
    if not isinstance(op, Op) or op.name not in _FLIP:
        return False
    memo: dict = {}
    name, (p, q) = op.name, op.operands
    if stride(q, axis, memo) == 1 and stride(p, axis, memo) == 0:
        name, (p, q) = _MIRROR[name], (q, p)
    k = _int_const(q)
    return stride(p, axis, memo) == 1 and stride(q, axis, memo) == 0 and k is not None \
        and (k + _FLIP[name]) % width == 0 and _aligned(p, axis, width)


def runs_constant(v: Value, axis: int, width: int, memo: dict) -> bool:
    """Whether tile `v` keeps one value along every run of `width` along `axis`: it does not
    move along the axis, or it is `u // D` with D an int constant multiple of the width and
    u aligned to runs and never negative (`_aligned(..., nonnegative=True)`: C's division
    truncates, so a run below zero could straddle a quotient), or an elementwise op (a
    comparison, a sum, a pointer offset) of such values.  A packed word's index
    `k // (32 // bits)` is one: a load at it serves a whole run."""
    key = (v.id, axis, width)
    if key in memo:
        return memo[key]
    out = stride(v, axis, {}) == 0
    op = v.owner
    if not out and isinstance(op, Op):
        if op.name == "idiv":
            d = _int_const(op.operands[1])
            out = d is not None and d > 0 and d % width == 0 and \
                _aligned(op.operands[0], axis, width, nonnegative=True)
        elif op.name == "expand_dims":
            d = op.attrs["axis"]
            out = runs_constant(op.operands[0], axis - (axis > d), width, memo)
        elif op.name in ELEMENTWISE or op.name in ("ptr_add", "broadcast"):
            # same-rank operands (a broadcast source of extent 1 along the axis has stride 0)
            out = all(runs_constant(o, axis, width, memo) for o in op.operands)
    memo[key] = out
    return out


def _aligned(v: Value, axis: int, width: int, nonnegative: bool = False) -> bool:
    """Whether v minus its coordinate along `axis` is a multiple of `width` at every
    element: v's affine form (gemm_bounds.affine_form) has coefficient 1 on that
    coordinate and multiples of `width` on the rest (program_id(0) * BLOCK + arange)."""
    form = affine_form(v, {}, None, {})
    return form is not None and form.get(("axis", axis)) == 1 and \
        all(c % width == 0 for key, c in form.items() if key != ("axis", axis)) and \
        (not nonnegative or all(c >= 0 for c in form.values()))


def _under_views(c: Value, axis: int) -> tuple[Value, int]:
    """The value under `c`'s broadcasts and expand_dims, and the axis of it that `axis`
    of `c` is."""
    op = c.owner
    while isinstance(op, Op) and op.name in ("broadcast", "expand_dims"):
        if op.name == "expand_dims":
            d = op.attrs["axis"]
            if axis == d:
                break
            axis -= axis > d
        c = op.operands[0]
        op = c.owner
    return c, axis


def _tightest(c: Value, axis: int, memo: dict) -> str | None:
    """Where along a run conjunct `c` is hardest to satisfy: "first", "last", or None
    when its form does not say (read it at every element)."""
    if stride(c, axis, memo) == 0:
        return "first"
    op = c.owner
    if isinstance(op, Op) and op.name in ("lt", "le", "gt", "ge"):
        a, b = (stride(o, axis, memo) for o in op.operands)
        if a is None or b is None:
            return None
        grows = a - b >= 0    # a - b grows (or stays) along the run
        return ("last" if grows else "first") if op.name in ("lt", "le") else \
            ("first" if grows else "last")
    return None


@dataclass
class RowRuns:
    width: int                                     # V
    unit: dict[int, bool] = field(default_factory=dict)   # id(load/store) -> unit stride
    sizes: set = field(default_factory=set)        # tile sizes laid out in runs
    # id(load) of loads that do not move along a run (address, mask and fill), from a
    # buffer the kernel does not write: one read per run serves its V elements
    still: set = field(default_factory=set)


def row_runs(fn: Function, threads: int, language: str, buffers: dict,
             dots_elsewhere: bool = False) -> RowRuns | str:
    """The run width and the accesses read/written as vectors, or why the kernel keeps the
    plain layout (a sentence).  `dots_elsewhere`: every dot and the code around it is held in
    the accumulator layout (mma_layout.py), which reads lane-layout tiles only from
    threadgroup memory, by element - runs cannot change what it reads."""
    ops = list(walk(fn.body))
    for op in ops:
        if op.name == "dot" and dots_elsewhere:
            continue
        if op.name in _FORBIDDEN:
            return f"the kernel contains {_FORBIDDEN[op.name]}"
        if op.name == "store" and op.attrs.get("atomic"):
            return "the kernel uses atomics"
    accesses = [op for op in ops if op.name in ("load", "store")
                and isinstance(op.operands[0].type, TileType)
                and elem_type(op.operands[0].type).space != "threadgroup"]
    if not accesses:
        return "the kernel has no tile loads or stores"
    memo: dict = {}
    strides, breaks = {}, []
    for op in accesses:
        shape = op.operands[0].type.shape
        strides[id(op)] = stride(op.operands[0], len(shape) - 1, memo, breaks)
    moving = [op for op in accesses if strides[id(op)] == 1
              and elem_type(op.operands[0].type).dtype.name in _FLOATS]
    if not moving:
        return "no tile load or store has unit stride along its last axis"
    if language == "cuda":
        width = 16 // min(elem_type(op.operands[0].type).dtype.itemsize for op in moving)
    else:
        width = 4
    sizes = {prod(op.operands[0].type.shape) for op in moving
             if prod(op.operands[0].type.shape) % (threads * width) == 0
             and op.operands[0].type.shape[-1] % width == 0}
    if not sizes:
        return (f"no unit-stride tile fills whole runs of {width} over {threads} threads "
                f"(its size a multiple of {threads * width}, its last axis of {width})")
    # narrower runs where a wider one would split a packed word's elements between runs
    # (8-bit weights beside float16 data: four elements a word, runs of 8)
    # (4 at the least: the emitters' narrowest vectors; a float32 run is already 4)
    while True:
        found, narrower = _runs_of(accesses, strides, breaks, width, sizes, buffers)
        if not narrower:
            return found
        width //= 2
        sizes = {n for n in sizes if n % (threads * width) == 0}


def _runs_of(accesses, strides, breaks, width, sizes, buffers) -> tuple[RowRuns | str, bool]:
    """The RowRuns of `row_runs` at one width, or why not, and whether half the width could
    remove that reason (a load at a quotient that splits runs of this width only)."""
    if not all(constant_on_runs(c, axis, width) for c, axis in breaks):
        return (f"an address chooses between pieces (where) at a point inside a run of "
                f"{width}: runs could straddle it"), False
    unit, still, constant = {}, set(), {}
    for op in accesses:
        shape = op.operands[0].type.shape
        if prod(shape) not in sizes:
            continue
        s = strides[id(op)]
        root = elem_type(op.operands[0].type).root
        if s == 1 and shape[-1] % width == 0 and \
                elem_type(op.operands[0].type).dtype.name in _FLOATS:
            unit[id(op)] = buffers.get((root, "written")) is None
        elif op.name == "load" and buffers.get((root, "written")) is None and \
                all(runs_constant(o, len(shape) - 1, width, constant)
                    for i, o in enumerate(op.operands) if i != 1) and \
                (shape[-1] % width == 0 or s == 0):
            # the mask may move along the run (`i < n`): `_run_load` reads once where any
            # element's mask holds and gives masked elements their `other`
            still.add(id(op))
        elif s == 1:
            dtype = elem_type(op.operands[0].type).dtype.name
            return (f"a unit-stride {dtype} access would be read element by element across "
                    "a run (strided): only float32, float16 and bfloat16 runs are vectors"), False
        elif s is None:
            narrower = width >= 8 and op.name == "load" and all(
                runs_constant(o, len(shape) - 1, width // 2, {})
                for i, o in enumerate(op.operands) if i != 1)
            return ("a tile access of the kernel is not provably affine along its last axis "
                    "(a gathered or computed address): runs could make it strided"), narrower
        elif s != 0:
            return (f"a tile access of the kernel has stride {s} along its last axis: runs "
                    "would turn it from coalesced to strided"), False
    return RowRuns(width, unit, sizes, still), False


class _Run:
    """One run of a lane loop: the V element contexts and what was read for all of them."""

    def __init__(self, ctxs: list[Ctx]):
        self.ctxs = ctxs
        self.loads: dict[int, list[Value]] = {}
        # register-tile writes of an even element awaiting the odd one (lower_tiles.write)
        self.pending: dict[str, tuple[Value, Value]] = {}
        # threadgroup-tile writes of the run's first elements awaiting the rest (one vector
        # store when the last arrives: lower_tiles.write)
        self.shared_pending: dict[str, tuple[Value, list[Value]]] = {}


class RowVectorLowering:
    """Mixin of `Lowering`: runs in `lane_loop`, vector loads through `load_rewrite`,
    vector stores in `lower_run_store`."""

    def prepare_row_runs(self, plan, language) -> None:
        self.row_runs, self.language = None, None
        # the accesses of the run loop being built (`_run_access_test`), and whether it is
        # the copy a whole-runs test guards
        self.run_accesses, self.runs_unchecked = None, False
        self.whole_run_tests = 0      # lane loops guarded by `_whole_runs_test`
        self.row_runs_reason = "not applied (no target language given)"
        if language is None or self.gemm is not None or self.elementwise_vector is not None:
            return
        self.language = language
        if plan is not None and plan.vector_width == 1:
            self.row_runs_reason = "vector_width=1 asked for scalar lanes"
            return
        found = row_runs(self.fn, self.T, language, self.buffers,
                         dots_elsewhere=self.mma is not None)
        if isinstance(found, str):
            self.row_runs_reason = found
            return
        if plan is not None and plan.vector_width == 4 and found.width > 4:
            found.width = 4
            found.sizes = {n for n in found.sizes if n % (4 * self.T) == 0}
        self.row_runs = found

    def occupancy_hint(self) -> int:
        """Blocks per SM for `__launch_bounds__` of a row kernel in runs on CUDA (0: none).
        A row kernel's speed is the rows in flight per SM; its registers are the held
        tiles (16-bit elements two to a word) and ~24 of index math, reduction state and
        the next run's loads.  Where that fits 32 registers a thread, ask for the whole
        register file's worth of blocks (2048 threads); within 64, half of it; else leave
        ptxas its choice.  (ptxas 13 for sm_90, unbounded: rms_norm of 8192 float16
        columns takes 32 registers at 512 threads (8 words held), 44 at 256 (16 words):
        forced to 32 the latter spilled.)"""
        if self.row_runs is None or self.language != "cuda":
            return 0
        words = sum(d.attrs["size"] * d.attrs["dtype"].itemsize / 4 for d in self.decls
                    if d.attrs["storage"] == "local")
        for budget, threads in ((32, 2048), (64, 1024)):
            if words + 24 <= budget and threads // self.T > 1:
                return min(threads // self.T, MAX_BLOCKS_PER_SM)
        return 0

    def row_runs_record(self, occupancy: int) -> dict | None:
        """What the execution report says of runs: their width and the occupancy bound,
        or why the kernel kept the plain layout (None where the pass did not look)."""
        if self.row_runs is not None:
            return {"width": self.row_runs.width, "min_blocks": occupancy,
                    "whole_run_tests": self.whole_run_tests}
        return None if self.language is None else {"refused": self.row_runs_reason}

    def async_copyable(self, v: Value) -> bool:
        """Whether load `v` may be copied into a threadgroup tile with `async_copy`: CUDA, a
        unit-stride load in runs of 16 bytes from a buffer the kernel does not write,
        masked elements filled with 0 (or no mask)."""
        op = v.owner
        rr = self.row_runs
        if self.language != "cuda" or rr is None or not isinstance(op, Op) or \
                op.name != "load" or not rr.unit.get(id(op)):
            return False
        shape = tuple(v.type.shape)
        if prod(shape) not in rr.sizes or rr.width * scalar_of(v.type).dtype.itemsize != 16 \
                or shape[-1] % rr.width:
            return False
        if len(op.operands) > 2:
            fill = op.operands[2].owner
            const = fill.operands[0].owner if isinstance(fill, Op) and fill.name == "splat" \
                else None
            return isinstance(const, Op) and const.name == "const" and \
                const.attrs.get("value") == 0
        return True

    def async_copy(self, v: Value, st, b: Builder) -> None:
        """Load `v` into threadgroup tile `st` (at its `base`) by 16-byte asynchronous copies
        (cp.async, no registers on the way), uncommitted: each run whose V masks all hold,
        or all fail (zero-filled, nothing read), from an address aligned to 16 bytes is one
        copy; any other run is read and written element by element."""
        op = v.owner
        mask = op.operands[1] if len(op.operands) > 1 else None
        ptr: PointerType = elem_type(op.operands[0].type)
        root = self.buffers[(ptr.root, "read")]

        def issue(cb: Builder, dst: Value, index: Value, whole: Value | None) -> None:
            # one 16-byte copy; with `whole`, its 16 bytes where it holds, else zero fill
            if whole is None:
                cb.op("cp_async", [dst, index], [], {"dst": st.name, "src": root, "bytes": 16})
            else:
                size = cb.value("where", [whole, self.const(cb, 16), self.const(cb, 0)], I32)
                cb.op("cp_async", [dst, index, size], [], {"dst": st.name, "src": root,
                                                           "bytes": 16})

        def copy(ctxs):
            cb = ctxs[0].b
            index = self.elem(op.operands[0], ctxs[0])
            dst = self.shared_at(st, ctxs[0])
            ok = cb.value("aligned16", [index], BOOL, root=root)
            if mask is None:
                whole = None
            else:
                masks = [self.elem(mask, c) for c in ctxs]
                whole, any_ = masks[0], masks[0]
                for m in masks[1:]:
                    whole = cb.value("and", [whole, m], BOOL)
                    any_ = cb.value("or", [any_, m], BOOL)
                none = cb.value("not", [any_], BOOL)
                ok = cb.value("and", [ok, cb.value("or", [whole, none], BOOL)], BOOL)
            then, other = Block(), Block()
            tb, eb = Builder(then), Builder(other)
            tb.loc = eb.loc = cb.loc
            issue(tb, dst, index, whole)
            for c in ctxs:
                fc = self._fallback_ctx(c, eb)
                value = self.emit_load(eb, op, [self.elem(o, fc) for o in op.operands])
                eb.op("mem_store", [self.shared_at(st, fc), value], [],
                      {"root": st.name, "space": "threadgroup"})
            cb.op("if", [ok], [], {}, [then, other])
        def copy_whole(ctxs):
            # the chunk test's proof: aligned, and whole or empty as its first element says
            index = self.elem(op.operands[0], ctxs[0])
            dst = self.shared_at(st, ctxs[0])
            issue(ctxs[0].b, dst, index, None if mask is None else self.elem(mask, ctxs[0]))

        def copy_strided(fb: Builder, rows) -> bool:
            # chunk s of this thread is its chunk 0 moved s * row_step rows down (the chunks
            # test: T * V a multiple of the columns): its source `rows` (the pointer's row
            # stride, proven affine) times that many elements further, its place in the
            # tile too where the layout moves by whole rows (padded or plain rows; swizzle
            # atoms when the step keeps the row's phase of 8) - one add each, the address
            # arithmetic done once (from chunk coordinates it was ~15 instructions a chunk)
            width = self.row_runs.width
            slots = prod(shape) // (self.T * width)
            row_step = self.T * width // shape[1]
            if not isinstance(rows, int) or slots > 16 or \
                    (st.swizzled and row_step % 8):
                return False
            unit = 64 if st.swizzled else (st.pitch or shape[1])
            lin = self._i(fb, "mul", self.geom(fb, "thread_id"), width)
            ctxs = [Ctx(self, fb, shape, lin if s == 0 else
                        self.add(fb, lin, self.const(fb, s * self.T * width)), self.const(fb, 0))
                    for s in range(slots)]
            index = self.elem(op.operands[0], ctxs[0])
            dst = self.shared_at(st, ctxs[0])
            for s, ctx in enumerate(ctxs):
                at = index if s == 0 else self.add(fb, index,
                                                   self.const(fb, s * row_step * rows))
                to = dst if s == 0 else self.add(fb, dst, self.const(fb, s * row_step * unit))
                issue(fb, to, at, None if mask is None else self.elem(mask, ctx))
            return True

        shape = tuple(v.type.shape)
        test, rows = self._whole_chunks_test(v, b) if self.language == "cuda" else (None, None)
        if test is not None:
            fast, slow = Block(), Block()
            fb, sb = Builder(fast), Builder(slow)
            fb.loc = sb.loc = b.loc
            # a copy a 16-byte chunk and nothing else: unrolled, its addresses are one add
            # apart (a per-chunk test and element fallback cost ~30 instructions a chunk)
            if not copy_strided(fb, rows):
                self._run_loop(fb, shape, None, group=copy_whole).attrs["unroll"] = True
            b.op("if", [test], [], {}, [fast, slow])
            b = sb
        loop = self.run_lane_loop(b, shape, None, group=copy)
        # copies in flight need no registers: unrolled, the loop only held more addresses
        # (ptxas: 255 registers and a spill for attention's 128x64 block, 166 rolled)
        loop.attrs["unroll"] = False
        if "async_copy_runs" not in self.lowering_passes:
            self.lowering_passes.append("async_copy_runs")

    def _whole_chunks_test(self, v: Value, b: Builder) -> tuple:
        """(test, row stride): a per-thread bool under which every 16-byte chunk of load `v`
        this thread copies is one aligned cp.async, whole or empty as its first element's
        mask says (None where the form does not allow the proof), and the pointer's
        elements from one row to the next (an int, or None where not constant).  Static half: a 2-D tile whose every
        thread's chunks lie in one column (T * V a multiple of the columns), an address
        rising by one element along the row and by a whole number of 16-byte units from
        one of the thread's chunks to the next, each mask conjunct a function of the row
        alone (one value along a chunk) or a monotone one of the column alone.  Run-time
        half, at the thread's first chunk: the address 16-byte aligned, and each column
        conjunct equal at the chunk's first and last element - the same column, so the
        same at every chunk of the thread."""
        op = v.owner
        shape = tuple(v.type.shape)
        width = self.row_runs.width if self.row_runs is not None else 1
        if len(shape) != 2 or width * elem_type(op.operands[0].type).dtype.itemsize != 16 \
                or (self.T * width) % shape[1] or prod(shape) % (self.T * width):
            return None, None
        ptr, mask = op.operands[0], (op.operands[1] if len(op.operands) > 1 else None)
        memo = {}
        itemsize = elem_type(ptr.type).dtype.itemsize
        row_step = self.T * width // shape[1]
        rows = stride(ptr, 0, memo)
        if stride(ptr, 1, memo) != 1 or not self._index_math(ptr) or (
                row_step * itemsize % 16 and (rows is None or row_step * rows * itemsize % 16)):
            return None, None
        columns = []
        for c in ([] if mask is None else _conjuncts(mask)):
            if not self._index_math(c):
                return None, None
            if stride(c, 1, memo) == 0:
                continue                     # the row's: one value along a chunk
            if stride(c, 0, memo) != 0 or _tightest(*_under_views(c, 1), memo) is None:
                return None, None
            columns.append(c)
        tid = self.geom(b, "thread_id")
        first = Ctx(self, b, shape, self._i(b, "mul", tid, width), self.const(b, 0))
        last = Ctx(self, b, shape, self.add(b, self._i(b, "mul", tid, width),
                                            self.const(b, width - 1)),
                   self.const(b, width - 1))
        root = self.buffers[(elem_type(ptr.type).root, "read")]
        test = b.value("aligned16", [self.elem(ptr, first)], BOOL, root=root)
        for c in columns:
            same = b.value("eq", [self.elem(c, first), self.elem(c, last)], BOOL)
            test = b.value("and", [test, same], BOOL)
        return test, rows

    def async_run_copy(self, v: Value, st, b: Builder) -> bool:
        """Materialize load `v` into threadgroup tile `st` by `async_copy`, waited for (the
        caller's barrier follows); False (nothing emitted) where not `async_copyable`."""
        if st.kind != "shared" or not getattr(st, "vector_runs", False) or \
                not self.async_copyable(v):
            return False
        self.async_copy(v, st, b)
        b.op("cp_async_commit", [], [], {})
        b.op("cp_async_wait", [], [], {"pending": 0})
        return True

    def runs_for(self, numel: int) -> int:
        rr = self.row_runs
        return rr.width if rr is not None and numel in rr.sizes else 1

    def run_lane_loop(self, b: Builder, shape, fn, group=None):
        """A lane loop over runs (module docstring): `fn(ctx)` per element, or `group(ctxs)`
        once per run with the V element contexts.  Where the thread's runs of a one-row
        tile can be tested whole (`_whole_runs_test`), two copies: every access a bare
        vector when the test holds, each run tested on its own otherwise."""
        checked = Block()
        cb = Builder(checked)
        cb.loc = b.loc
        outer, self.run_accesses = self.run_accesses, []
        try:
            op = self._run_loop(cb, shape, fn, group)
            accesses = self.run_accesses
        finally:
            self.run_accesses = outer
        test = self._whole_runs_test(b, shape, op, accesses) if accesses else None
        if test is None:
            b.block.ops.extend(checked.ops)
            return op
        fast = Block()
        fb = Builder(fast)
        fb.loc = b.loc
        self.runs_unchecked = True
        try:
            # the report counts the loop once (compiler/planning.py `_loops`)
            self._run_loop(fb, shape, fn, group).attrs["unchecked_copy"] = True
        finally:
            self.runs_unchecked = False
        b.op("if", [test], [], {}, [fast, checked])
        self.whole_run_tests += 1
        return op

    def _whole_runs_test(self, b: Builder, shape, loop: Op, accesses) -> Value | None:
        """One test, before the loop, that every run of this thread passes every access's
        own test (None where that cannot be shown).  Why it is enough: the tile is one row
        (leading extents 1), so a conjunct that `_tightest` reads at a run's first or last
        element is constant or monotone along the whole row, and the thread's runs are in
        row order: reading it at the first element of its first run and the last element
        of its last run covers every run.  Alignment: consecutive runs of a thread are T*V
        elements apart, a multiple of the 16-byte vector, so the first run's address
        decides.  Addresses and conjuncts built from anything but index arithmetic (a
        load, a held tile) are not read outside the loop: such a loop keeps its per-run
        tests."""
        v = self.row_runs.width
        if prod(shape[:-1]) != 1:
            return None
        memo: dict = {}
        for op, mask in accesses:
            if prod(op.operands[0].type.shape[:-1]) != 1 or not self._index_math(op.operands[0]):
                return None
            if mask is not None:
                axis = len(mask.type.shape) - 1
                for c in _conjuncts(mask):
                    if _tightest(c, axis, memo) is None or not self._index_math(c):
                        return None
        tid = self.geom(b, "thread_id")
        last_run = self.add(b, tid, self.const(b, (loop.attrs["slots"] - 1) * self.T))
        first = Ctx(self, b, shape, self._i(b, "mul", tid, v), self.const(b, 0))
        end = Ctx(self, b, shape, self.add(b, self._i(b, "mul", last_run, v),
                                           self.const(b, v - 1)),
                  self.const(b, loop.attrs["slots"] * v - 1))
        ends = _Run([first, end])
        test = None
        for op, mask in accesses:
            ptr: PointerType = elem_type(op.operands[0].type)
            role = "out" if op.name == "store" else "read"
            ok = self._run_vector_ok(b, self.elem(op.operands[0], first),
                                     self.buffers[(ptr.root, role)], ptr.dtype.itemsize,
                                     mask, ends)
            if ok is not None:
                test = ok if test is None else b.value("and", [test, ok], BOOL)
        return test

    def _index_math(self, v: Value) -> bool:
        """Whether tile `v` is computed from indices and scalars alone (no load, no tile
        held in storage): safe to evaluate ahead of the loop at any element."""
        if not isinstance(v.type, TileType):
            return True
        if v.id in self.storage or not isinstance(v.owner, Op) or v.owner.name == "load":
            return False
        return v.owner.name in _INDEX_OPS and all(self._index_math(o) for o in v.owner.operands)

    def _run_loop(self, b: Builder, shape, fn, group=None):
        v, numel = self.runs_for(prod(shape)), prod(shape)
        block = Block()
        run = block.add_arg(I32, "i")
        slot = block.add_arg(I32, "slot")
        op = b.op("lane_loop", [], [], {"numel": numel // v, "slots": numel // (v * self.T),
                                        "threads": self.T, "run": v}, [block])
        inner = Builder(block)
        inner.loc = b.loc
        if "vectorize_rows" not in self.lowering_passes:
            self.lowering_passes.append("vectorize_rows")
        first = self._i(inner, "mul", run, v)
        base = self._i(inner, "mul", slot, v)
        ctxs = []
        for e in range(v):
            lin = first if e == 0 else self.add(inner, first, self.const(inner, e))
            at = base if e == 0 else self.add(inner, base, self.const(inner, e))
            ctx = Ctx(self, inner, shape, lin, at)
            ctx.run_index = e
            ctxs.append(ctx)
        state = _Run(ctxs)
        for ctx in ctxs:
            ctx.run = state
        outer, self.load_rewrite = self.load_rewrite, self._run_load
        try:
            if group is not None:
                group(ctxs)
            else:
                for ctx in ctxs:
                    fn(ctx)
        finally:
            self.load_rewrite = outer
        for name, (index, values) in state.shared_pending.items():
            for e, value in enumerate(values):   # (a run not written whole: element stores)
                inner.op("mem_store", [self.add(inner, index, self.const(inner, e)), value], [],
                         {"root": name, "space": "threadgroup"})
        if state.pending:   # lower_tiles.write pairs a run's writes: none may be left over
            raise AssertionError(f"vectorize_rows: register writes of {sorted(state.pending)} "
                                 "were not paired within their run")
        return op

    def _run_access_test(self, b: Builder, op: Op, index: Value, root: str,
                         mask: Value | None, run: _Run) -> Value | None:
        """The test of one V-wide access of a run (None: none needed): none in the copy of
        a loop that `_whole_runs_test` guards; else `_run_vector_ok`, and the access is
        recorded for the whole-runs test."""
        if self.runs_unchecked:
            return None
        if self.run_accesses is not None:
            self.run_accesses.append((op, mask))
        return self._run_vector_ok(b, index, root, elem_type(op.operands[0].type).dtype.itemsize,
                                   mask, run)

    def _run_vector_ok(self, b: Builder, index: Value, root: str, itemsize: int,
                       mask: Value | None, run: _Run) -> Value | None:
        """The condition for one V-wide access (None: always): the mask at every element
        of the run (`_mask_over_run`), and on CUDA the first address aligned to the
        vector (capped at 16 bytes, the widest access)."""
        cond = None if mask is None else self._mask_over_run(mask, run)
        if self.language == "cuda":
            size = min(16, self.row_runs.width * itemsize)
            ok = b.value("aligned16", [index], BOOL, root=root, bytes=size)
            cond = ok if cond is None else b.value("and", [cond, ok], BOOL)
        return cond

    def _mask_over_run(self, mask: Value, run: _Run) -> Value:
        """Whether `mask` holds at all V elements of the run, from as few elements as the
        mask's form allows: a conjunct that does not move along the last axis is read at
        the first element; a comparison whose sides move affinely (`col < columns`) is
        monotone along the run, so it holds everywhere iff it holds at the end where it
        is tightest; any other conjunct is read at every element."""
        b, ctxs = run.ctxs[0].b, run.ctxs
        axis = len(mask.type.shape) - 1
        memo: dict = {}
        cond = None
        for c in _conjuncts(mask):
            where = _tightest(c, axis, memo)
            at = [ctxs[0]] if where == "first" else [ctxs[-1]] if where == "last" else ctxs
            for ctx in at:
                v = self.elem(c, ctx)
                cond = v if cond is None else b.value("and", [cond, v], BOOL)
        return cond

    def _fallback_ctx(self, ctx: Ctx, b: Builder) -> Ctx:
        """The element of `ctx` seen from the scalar fallback branch: a context of its own
        (values built in the branch must not be remembered for the run's main path)."""
        return Ctx(self, b, ctx.shape, ctx.lin, ctx.slot)

    def _run_load(self, op: Op, ctx: Ctx) -> Value:
        run = ctx.run
        if run is not None and id(op) in self.row_runs.still and \
                prod(op.operands[0].type.shape) in self.row_runs.sizes:
            if id(op) not in run.loads:
                run.loads[id(op)] = self._still_load(op, run)
            return run.loads[id(op)][ctx.run_index]
        if run is None or not self.row_runs.unit.get(id(op)) or \
                prod(op.operands[0].type.shape) not in self.row_runs.sizes:
            return self.emit_load(ctx.b, op, [self.elem(o, ctx) for o in op.operands])
        if id(op) not in run.loads:
            run.loads[id(op)] = self._load_run(op, run)
        return run.loads[id(op)][ctx.run_index]

    def _still_load(self, op: Op, run: _Run) -> list[Value]:
        """A load whose address keeps its value along the run: one read, at the run's first
        element.  A mask that moves along the run (`i < n`) guards the read by whether any
        element's mask holds (the address is that element's, so it is in bounds), and each
        element whose own mask fails takes the load's `other`."""
        ctxs = run.ctxs
        b = ctxs[0].b
        operands = [self.elem(o, ctxs[0]) for o in op.operands]
        mask = op.operands[1] if len(op.operands) > 1 else None
        axis = len(op.operands[0].type.shape) - 1
        if mask is None or runs_constant(mask, axis, self.row_runs.width, {}):
            return [self.emit_load(b, op, operands)] * len(ctxs)
        masks = [self.elem(mask, ctx) for ctx in ctxs]   # (ctxs[0]'s: operands[1])
        any_ = masks[0]
        for m in masks[1:]:
            any_ = b.value("or", [any_, m], BOOL)
        value = self.emit_load(b, op, [operands[0], any_, *operands[2:]])
        if len(op.operands) < 3:   # no `other`: a masked element's value is unspecified
            return [value] * len(ctxs)
        return [b.value("where", [m, value, self.elem(op.operands[2], ctx)], value.type)
                for m, ctx in zip(masks, ctxs)]

    def _load_run(self, op: Op, run: _Run) -> list[Value]:
        b = run.ctxs[0].b
        ptr: PointerType = elem_type(op.operands[0].type)
        rtype = scalar_of(op.results[0].type)
        root = self.buffers[(ptr.root, "read")]
        index = self.elem(op.operands[0], run.ctxs[0])
        mask = op.operands[1] if len(op.operands) > 1 else None
        cond = self._run_access_test(b, op, index, root, mask, run)
        width = len(run.ctxs)
        unchecked = self.runs_unchecked
        self.vector_loads += not unchecked
        if cond is None:   # under the whole-runs test, CUDA's address is tested aligned
            return b.op("vec_load", [index], [rtype] * width,
                        {"root": root, "space": "device", "width": width,
                         "aligned": unchecked and self.language == "cuda"}).results
        then, other = Block(), Block()
        tb, eb = Builder(then), Builder(other)
        tb.loc = eb.loc = b.loc
        # on CUDA the condition tested the address (the emitter needs no second test)
        vec = tb.op("vec_load", [index], [rtype] * width,
                    {"root": root, "space": "device", "width": width,
                     "aligned": self.language == "cuda"})
        scalars = [eb.value("mem_load", [self.elem(o, self._fallback_ctx(ctx, eb))
                                         for o in op.operands], rtype, root=root, space="device")
                   for ctx in run.ctxs]
        if self.language == "cuda" and rtype.dtype.itemsize == 2:
            # held as the loaded words: taking 16-bit elements out inside the branch would
            # make the branch wait for its load, and the next run's load wait behind it
            word = ScalarType(dt.uint32)
            names = [self.decl("var", dt.uint32, prefix="_xw") for _ in range(width // 2)]
            for j, name in enumerate(names):
                for bb, xs in ((tb, vec.results), (eb, scalars)):
                    bb.op("var_set", [bb.value("pack_pair", xs[2 * j:2 * j + 2], word)], [],
                          {"name": name})
            b.op("if", [cond], [], {}, [then, other])
            words = [b.value("var_get", [], word, name=n) for n in names]
            return [b.value("unpack_half", [words[e // 2]], rtype, half=e % 2)
                    for e in range(width)]
        names = [self.decl("var", rtype.dtype, prefix="_x") for _ in range(width)]
        for name, r, x in zip(names, vec.results, scalars):
            tb.op("var_set", [r], [], {"name": name})
            eb.op("var_set", [x], [], {"name": name})
        b.op("if", [cond], [], {}, [then, other])
        return [b.value("var_get", [], rtype, name=n) for n in names]

    def lower_run_store(self, op: Op, b: Builder) -> bool:
        """A unit-stride tile store in runs: V values, one vector store (module docstring).
        False when the store is not one (the caller emits it element by element, a scalar
        store to one address as it is)."""
        shape = getattr(op.operands[0].type, "shape", None)
        if shape is None:
            return False
        if self.runs_for(prod(shape)) == 1 or not self.row_runs.unit.get(id(op)):
            return False
        ptr: PointerType = elem_type(op.operands[0].type)
        root = self.buffers[(ptr.root, "out")]

        def group(ctxs):
            values = [self.elem(op.operands[1], c) for c in ctxs]
            lb = ctxs[0].b
            index = self.elem(op.operands[0], ctxs[0])
            mask = op.operands[2] if len(op.operands) > 2 else None
            cond = self._run_access_test(lb, op, index, root, mask, ctxs[0].run)
            attrs = {"root": root, "space": "device"}
            if cond is None:
                lb.op("vec_store", [index, *values], [], attrs)
                return
            then, other = Block(), Block()
            tb, eb = Builder(then), Builder(other)
            tb.loc = eb.loc = lb.loc
            tb.op("vec_store", [index, *values], [], attrs)
            for ctx, value in zip(ctxs, values):
                at = self._fallback_ctx(ctx, eb)
                rest = [self.elem(op.operands[2], at)] if mask is not None else []
                eb.op("mem_store", [self.elem(op.operands[0], at), value, *rest], [], dict(attrs))
            lb.op("if", [cond], [], {}, [then, other])

        self.run_lane_loop(b, shape, None, group)
        return True
