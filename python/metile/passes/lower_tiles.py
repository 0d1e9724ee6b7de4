"""lower_tiles: tile form -> thread form.

What it does.  Each tile op becomes code run by every thread for the
elements it owns; after this pass every value is a per-thread scalar and the
function is printable by any C-like backend.

Lane layout.  A program has T threads (a multiple of 32, at most 1024).  A
tile of N elements is linearised row-major; element i belongs to thread
i % T, slot i // T.  A 1-D tile of N <= T elements is one element per thread;
larger tiles give each thread ceil(N / T) slots (`lane_loop`).  For a 2-D tile
(M, N) consecutive threads own consecutive columns of a row, so loads and
stores along the contiguous axis are coalesced.  Where vectorize_rows.py proves
it invisible, a thread owns runs of V consecutive elements instead, read and
written as vectors.

Placement (see `placement.py`) decides whether each tile is recomputed at its
uses, kept in registers ("local") or in threadgroup memory ("shared").
Writes to shared tiles are bracketed by threadgroup barriers; a block
reduction to a scalar is a per-thread partial, `simd_reduce`, and a pass over
per-SIMD-group partials in threadgroup memory.

Preconditions (not yet checked here): tile ops and barriers execute in
uniform control flow, as with any threadgroup barrier.
"""

from __future__ import annotations

from math import ceil, prod

from ..errors import CompilationError
from ..ir.core import Block, Builder, Function, Op, Value, walk
from ..ir.ops import DEBUG, ELEMENTWISE
from ..ir.types import PointerType, ScalarType, TileType, elem_type, is_pointer
from ..language import dtypes as dt
from .lane_layout import BOOL, I32, Ctx, Storage, scalar_of
from .buffer_usage import atomic_buffers
from .gemm import find_gemm
from .lower_debug import lower_debug
from .lower_dot_fragments import DotFragmentLowering
from .lower_matmul import MatmulLowering, plan_gemm, relaxed_precision
from .lower_mma_layout import FragCtx, MmaLayoutLowering
from . import mma_layout
from .lower_reductions import ReductionLowering, rows_reducible
from .lower_sort import SortLowering
from .vectorize_elementwise import ElementwiseVectorLowering
from .vectorize_rows import RowVectorLowering
from .placement import analyze

SHARED_BYTES = 32 * 1024  # Apple's threadgroup memory; callers pass their target's capacity


class SharedOverflow(CompilationError):
    """The tiles a lowering holds in threadgroup memory pass the target's limit."""


class Lowering(ReductionLowering, SortLowering, MatmulLowering, ElementwiseVectorLowering,
               RowVectorLowering, DotFragmentLowering, MmaLayoutLowering):
    def __init__(self, fn: Function, threads: int, buffers: dict, matrix_units=(), plan=None,
                 scalars=None, shared_limit: int = SHARED_BYTES, gemm_plan=None,
                 shared_optin: int = 0, language: str | None = None, mma: bool = False):
        self.fn = fn
        self.loc = None      # the source op being lowered (lower_block): errors point at it
        self.shared_limit = shared_limit
        # What a kernel laying out dynamic shared memory itself may use (gemm_wgmma).
        self.shared_optin = max(shared_optin, shared_limit)
        self.dynamic_shared = False
        self.matrix_units = tuple(matrix_units)
        self.T = threads
        self.buffers = buffers  # (root, role) -> backend name; roles: read, out, written
        self.place = analyze(fn)
        self.decls: list[Op] = []
        self.scalars: dict[int, Value] = {}
        self._loaded_roots: set | None = None   # buffers a load reads (once-per-program stores)
        self.atomic_buffers = atomic_buffers(fn)   # a plain load of one is an atomic read
        self.storage: dict[int, Storage] = {}
        # (value id, block id) -> its copy in threadgroup memory (shared_copy)
        self.shared_copies: dict[tuple[int, int], Storage] = {}
        self.group_storage: dict[int, Storage] = {}
        # threadgroup arrays of tiles defined in a finished loop body (none is read after its
        # loop: values leave a loop only through carried storage), by (dtype, size, pitch,
        # align), for later tiles of the same size (`shared_array`); and the arrays each
        # enclosing loop body allocated so far
        self.shared_pool: dict[tuple, list[str]] = {}
        # loads of a loop body copied one iteration ahead: value id -> its buffer this
        # iteration (lower_mma_layout.prefetch)
        self.prefetched: dict[int, Storage] = {}
        self.loop_arrays: list[list[tuple]] = []
        self.counter = 0
        self.shared_bytes = 0
        self.geometry: dict[str, Value] = {}
        self.loops: list[dict] = []
        self.loop_depth = 0   # loops of the program around the op being lowered
        # simdgroup_inline kernels write their own fragment program (no GEMM pattern)
        self.gemm = None if fn.meta.get("fragments") else find_gemm(fn)
        # products and their softmax held where the matrix unit leaves them (mma_layout.py)
        self.mma = mma_layout.plan(fn, self.place, threads, self.matrix_units) \
            if mma and self.gemm is None else None
        if self.mma is not None:
            # warpgroup MMA's swizzled operand tiles start 1024-byte aligned, and its
            # instructions need the launch's sm_90a: the arrays go in the dynamic buffer,
            # whose launch record names the architecture (_dynamic_shared_layout)
            self.dynamic_shared = self.mma.warpgroup is not None
            for vid in self.mma.to_shared:
                self.place.kind[vid] = "shared"
            for vid in self.mma.tiles | self.mma.row_values:
                if self.place.kind.get(vid) == "shared":
                    self.place.kind[vid] = "local"
        # The planner's fragment plan (compiler/planning.py) when it made one; callers
        # without a plan (tests lowering IR directly) get the same rule applied here.
        self.gemm_plan = gemm_plan
        if self.gemm is not None and gemm_plan is None:
            self.gemm_plan = plan_gemm(self.gemm, matrix_units, relaxed_precision(fn), threads)
        self.prepare_gemm(plan, scalars)  # schedule plan + specialized scalars (lower_matmul)
        if self.mma is not None:
            self.lowering_passes.append("mma_layout")
        self.prepare_elementwise_vector(plan, scalars)
        self.prepare_row_runs(plan, language)  # vectorize_rows.py (None: plain lanes)

    # -- helpers ---------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, b: Builder, value, dtype=dt.int32) -> Value:
        return b.value("const", [], ScalarType(dtype), value=value)

    @staticmethod
    def add(b: Builder, x: Value, y: Value) -> Value:
        """x + y for index math (int32; int64 when a user's int64 offset takes part), folding
        a literal zero (keeps emitted code readable)."""
        wide = next((v.type for v in (x, y) if v.type.dtype == dt.int64), None)
        for u, v in ((x, y), (y, x)):
            if isinstance(u.owner, Op) and u.owner.name == "const" and u.owner.attrs["value"] == 0:
                return v if wide is None or v.type == wide else b.value("cast", [v], wide, to=dt.int64)
        return b.value("add", [x, y], wide or I32)

    def barrier(self, b: Builder, device: bool = False) -> None:
        """A barrier (`device`: one that orders device memory too, a kernel's barrier());
        one right after another adds nothing, or only its device ordering."""
        last = b.block.ops[-1] if b.block.ops else None
        if last is not None and last.name == "barrier":
            if device:
                last.attrs["device"] = True
            return
        if self.mma is not None and self.mma.warpgroup is not None:
            # the threads' writes to threadgroup memory ordered before the async proxy's
            # reads (warpgroup MMA reads its operands through it) - each writer fences
            # before the barrier that publishes its writes
            b.op("fence_proxy_async")
        b.op("barrier", [], [], {"device": True} if device else {})

    def shared_array(self, dtype: dt.DType, size: int, prefix: str, align: int = 0,
                     pitch: int | None = None) -> str:
        """A threadgroup array for a tile: one a finished loop body left free where one of
        the same shape is (its every write is bracketed by barriers like any other), else a
        new one."""
        key = (dtype.name, size, pitch, align)
        free = self.shared_pool.get(key)
        name = free.pop() if free else self.decl("shared", dtype, size, prefix, align=align)
        if self.loop_arrays:
            self.loop_arrays[-1].append((key, name))
        return name

    def decl(self, storage: str, dtype: dt.DType, size: int = 1, prefix="_t", align=0) -> str:
        name = self.fresh(prefix)
        if storage == "shared":
            self.shared_bytes += size * dtype.itemsize
            if not self._fits_shared():
                # at the op whose tile passed the limit (the source line a user can shrink)
                raise SharedOverflow(
                    f"tiles held in threadgroup memory need {self.shared_bytes} bytes, more than "
                    f"the {self.shared_optin} a threadgroup has; use smaller blocks", self.loc)
        attrs = {"name": name, "storage": storage, "dtype": dtype, "size": size}
        if align:
            attrs["align"] = align
        self.decls.append(Op("decl", [], [], attrs, []))
        return name

    def _fits_shared(self) -> bool:
        """Whether the shared arrays so far fit.  Past the static limit, a target with an
        opt-in limit (CUDA: dynamic shared memory up to cudaFuncAttribute
        MaxDynamicSharedMemorySize) lays its arrays out in one dynamic buffer."""
        if self.shared_bytes <= self.shared_limit:
            return True
        if self.shared_bytes <= self.shared_optin:
            self.dynamic_shared = True
            return True
        return False

    def new_storage(self, kind: str, shape, t) -> Storage:
        dtype = scalar_of(t).dtype
        n = prod(shape)
        size = n if kind == "shared" else ceil(n / self.T)
        # 16-byte aligned where runs may write it a vector at a time (write)
        wide = kind == "shared" and self.row_runs is not None and self.language == "cuda"
        name = self.shared_array(dtype, size, "_sh", 16 if wide else 0) if kind == "shared" \
            else self.decl(kind, dtype, size, "_r")
        st = Storage(kind, name, tuple(shape), dtype)
        st.vector_runs = wide
        return st

    def storage_for(self, v: Value) -> Storage:
        if self.mma is not None and v.id in self.mma.padded and \
                self.place.kind.get(v.id) == "shared" and v.id not in self.place.group:
            st = self.storage[v.id] = self.padded_storage(v)
            return st
        gid = self.place.group.get(v.id)
        if gid is not None:
            if gid not in self.group_storage:
                self.group_storage[gid] = self.mma_storage(v) or \
                    self.new_storage(self.place.kind[v.id], v.type.shape, v.type)
            st = self.group_storage[gid]
        else:
            st = self.mma_storage(v) or \
                self.new_storage(self.place.kind[v.id], v.type.shape, v.type)
        self.storage[v.id] = st
        return st

    def s(self, v: Value) -> Value:
        """The thread-form value of a scalar (pointers: their int32 or int64 offset)."""
        return self.scalars[v.id]

    def lane_loop(self, b: Builder, shape, fn) -> None:
        numel = prod(shape)
        if self.runs_for(numel) > 1:
            return self.run_lane_loop(b, shape, fn)  # vectorize_rows.py
        block = Block()
        lin = block.add_arg(I32, "i")
        slot = block.add_arg(I32, "slot")
        op = b.op("lane_loop", [], [], {"numel": numel, "slots": ceil(numel / self.T),
                                        "threads": self.T}, [block])
        inner = Builder(block)
        inner.loc = b.loc
        fn(Ctx(self, inner, shape, lin, slot))
        return op

    # -- element evaluation ------------------------------------------------------------
    def elem(self, v: Value, ctx: Ctx) -> Value:
        if isinstance(v, _Stored):
            return self.read(v.st, ctx)
        if not isinstance(v.type, TileType):
            return self.s(v)
        hit = ctx.memo.get(v.id)
        if hit is not None:
            return hit
        st = self.storage.get(v.id)
        out = self.read(st, ctx) if st is not None else self.compute(v, ctx)
        ctx.memo[v.id] = out
        return out

    def read(self, st: Storage, ctx: Ctx) -> Value:
        if st.layout is not None:
            return self.mma_read(st, ctx)   # lower_mma_layout.py
        if st.kind == "local" and isinstance(ctx.origin, FragCtx):
            raise AssertionError("lower_tiles: a lane-layout register tile read in the "
                                 "accumulator layout")
        if st.kind == "rows":
            o = ctx.origin
            if o is None or o.shape != st.parent:
                raise AssertionError("lower_tiles: a row-held reduction read outside its rows")
            slot = o.slot if st.width == 1 else \
                ctx.b.value("idiv", [o.slot, self.const(ctx.b, st.width)], I32)
            return ctx.b.value("local_get", [slot], ScalarType(st.dtype), name=st.name)
        if st.kind == "local":
            if not (ctx.identity and ctx.shape == st.shape):
                raise AssertionError("lower_tiles: register tile read at a foreign coordinate")
            return ctx.b.value("local_get", [ctx.slot], ScalarType(st.dtype), name=st.name)
        return ctx.b.value("mem_load", [self.shared_at(st, ctx)], ScalarType(st.dtype),
                           root=st.name, space="threadgroup")

    def shared_at(self, st: Storage, ctx: Ctx) -> Value:
        """The element of threadgroup tile `st` at ctx: row-major, rows `st.pitch` elements
        apart where the tile's rows are padded (mma_layout.padded)."""
        if st.swizzled:   # gemm_wgmma's atoms; the element within its 16-byte chunk
            row, col = ctx.coords()
            at = self.add(ctx.b, self.atom_offset(ctx.b, row, col, st.shape[0]),
                          self._i(ctx.b, "and", col, 7))
        elif st.pitch is None:
            at = ctx.linear(st.shape)
        else:
            row, col = ctx.coords()
            at = self.add(ctx.b, self._i(ctx.b, "mul", row, st.pitch), col)
        return at if st.base is None else self.add(ctx.b, at, st.base)

    def write(self, st: Storage, ctx: Ctx, value: Value) -> None:
        if st.kind == "local" and (st.layout is not None) != isinstance(ctx, FragCtx):
            raise AssertionError("lower_tiles: a register tile written from the other layout")
        if st.kind == "local" and ctx.run is not None and ctx.identity:
            # in runs (vectorize_rows.py) slots 2k and 2k+1 are one register word of a
            # 16-bit array: written together, two halves of a loaded word are that word
            pending = ctx.run.pending
            if ctx.run_index % 2 == 0:
                pending[st.name] = (ctx.slot, value)
            else:
                slot, first = pending.pop(st.name)
                ctx.b.op("local_set_pair", [slot, first, value], [], {"name": st.name})
        elif st.kind == "local":
            ctx.b.op("local_set", [ctx.slot, value], [], {"name": st.name})
        elif getattr(st, "vector_runs", False) and ctx.run is not None and ctx.identity and \
                ctx.shape == st.shape and st.shape[-1] % len(ctx.run.ctxs) == 0:
            # a run's V elements are consecutive in the row-major array: one 16-byte store
            # (a lane's 2-byte stores 16 bytes apart hit the same banks 8 lanes at a time)
            pending = ctx.run.shared_pending
            if ctx.run_index == 0:
                pending[st.name] = (self.shared_at(st, ctx), [value])
            elif st.name in pending:
                index, values = pending[st.name]
                values.append(value)
                if len(values) == len(ctx.run.ctxs):
                    del pending[st.name]
                    ctx.b.op("vec_store", [index, *values], [], {"root": st.name,
                                                                 "space": "threadgroup"})
            else:
                ctx.b.op("mem_store", [self.shared_at(st, ctx), value], [],
                         {"root": st.name, "space": "threadgroup"})
        else:
            ctx.b.op("mem_store", [self.shared_at(st, ctx), value], [], {"root": st.name,
                                                                      "space": "threadgroup"})

    def compute(self, v: Value, ctx: Ctx) -> Value:
        op: Op = v.owner
        b = ctx.b
        st = scalar_of(v.type)
        if op.name == "arange":
            return self.add(b, ctx.coords()[0], self.const(b, op.attrs["start"]))
        if op.name == "splat":
            return self.s(op.operands[0])
        if op.name == "broadcast":
            src = op.operands[0]
            zero = self.const(b, 0)
            coords = [zero if s == 1 and t != 1 else c
                      for c, s, t in zip(ctx.coords(), src.type.shape, ctx.shape)]
            return self.elem(src, ctx.derived(src.type.shape, coords))
        if op.name == "expand_dims":
            # a unit axis leaves the row-major order, so the lane layout, as it was: the
            # operand's element is this one (placement.py reads register tiles through it)
            return self.elem(op.operands[0], ctx.reshaped(op.operands[0].type.shape))
        if op.name == "permute":
            src = op.operands[0]
            coords = [None] * len(src.type.shape)
            for c, d in zip(ctx.coords(), op.attrs["dims"]):
                coords[d] = c
            return self.elem(src, ctx.derived(src.type.shape, coords))
        if op.name == "reshape":
            src = op.operands[0]
            return self.elem(src, ctx.reshaped(src.type.shape))
        if op.name == "scan":
            return self.scan_values(op, ctx)[op.results.index(v)]
        if op.name == "join":  # result[..., k] is operand k at the leading coordinates
            coords = ctx.coords()
            a, c = (self.elem(o, ctx.derived(o.type.shape, coords[:-1])) for o in op.operands)
            first = b.value("eq", [coords[-1], self.const(b, 0)], BOOL)
            return b.value("where", [first, a, c], st)
        if op.name == "split":
            src = op.operands[0]
            coords = [*ctx.coords(), self.const(b, op.attrs["index"])]
            return self.elem(src, ctx.derived(src.type.shape, coords))
        if op.name == "flip":
            src, axis = op.operands[0], op.attrs["axis"]
            coords = list(ctx.coords())
            coords[axis] = b.value("sub", [self.const(b, src.type.shape[axis] - 1), coords[axis]],
                                   I32)
            return self.elem(src, ctx.derived(src.type.shape, coords))
        if op.name == "cat":  # both operands read, each at a row clamped into its extent
            (a, c), coords = op.operands, ctx.coords()
            n = a.type.shape[0]
            first = b.value("lt", [coords[0], self.const(b, n)], BOOL)
            row_a = b.value("minimum", [coords[0], self.const(b, n - 1)], I32)
            row_c = b.value("maximum", [b.value("sub", [coords[0], self.const(b, n)], I32),
                                        self.const(b, 0)], I32)
            va = self.elem(a, ctx.derived(a.type.shape, [row_a, *coords[1:]]))
            vc = self.elem(c, ctx.derived(c.type.shape, [row_c, *coords[1:]]))
            return b.value("where", [first, va, vc], st)
        if op.name == "ptr_add":
            a, off = (self.elem(o, ctx) for o in op.operands)
            return self.add(b, a, off)
        if op.name == "load":
            if self.load_rewrite is not None:  # guards reduced by proofs (lower_matmul)
                return self.load_rewrite(op, ctx)
            return self.emit_load(b, op, [self.elem(o, ctx) for o in op.operands])
        if op.name in ELEMENTWISE:
            return b.value(op.name, [self.elem(o, ctx) for o in op.operands], st, **op.attrs)
        if op.name == "reduce":
            if op.attrs["kind"] == "combine":
                return self.combine_values(op, ctx)[op.results.index(v)]
            return self.axis_reduce(op, ctx)
        if op.name == "dot":
            return self.dot(op, ctx)
        if op.name.startswith("frag_"):
            # (an AssertionError without a line: `sum(f)`, `max(f, axis=1)` or a plain store
            # of an 8x8 fragment `f` in a simdgroup_inline kernel)
            raise CompilationError(
                "a matrix fragment (a view's 8x8 block_shape load) is opaque: it cannot be "
                "reduced, indexed or stored as a tile here; store it through a block_shape "
                "view (a scratch or output tensor) and load that as ordinary values", op.loc)
        raise AssertionError(f"lower_tiles: cannot compute {op.name} per element")

    def emit_load(self, b: Builder, op: Op, operands: list[Value]) -> Value:
        ptr: PointerType = elem_type(op.operands[0].type)
        index, rest = operands[0], operands[1:]
        rtype = ScalarType(ptr.dtype)
        if ptr.space == "threadgroup":
            return b.value("mem_load", [index, *rest], rtype, root=ptr.root, space="threadgroup")
        written = self.buffers.get((ptr.root, "written"))
        if ptr.root in self.atomic_buffers:
            return self.atomic_read(b, ptr, index, rest)
        value = b.value("mem_load", [index, *rest], rtype, root=self.buffers[(ptr.root, "read")],
                        space="device")
        if written is None:
            return value
        # The buffer is also an output whose untouched elements keep the input's
        # values: read what this launch wrote where it wrote, else the input.
        mask_other = [rest[0], self.const(b, False, dt.bool_)] if rest else []
        w = b.value("mem_load", [index, *mask_other], BOOL, root=written, space="device")
        new = b.value("mem_load", [index, *rest], rtype, root=self.buffers[(ptr.root, "out")],
                      space="device")
        return b.value("where", [w, new, value], rtype)

    def atomic_read(self, b: Builder, ptr: PointerType, index: Value, rest: list) -> Value:
        """A plain load of a buffer the kernel updates with atomics: a relaxed atomic read of
        the element's current contents, as a load of such a buffer is on a GPU under Triton
        (the atomics act on the buffer itself there).  The element is copied in from the
        passed contents first, as before an atomic, so an untouched one reads as passed and
        one another thread is copying in is waited for (buffer_usage.atomic_roots leaves
        every such buffer initialised from its contents).  A masked-off element is `other`."""
        rtype = ScalarType(ptr.dtype)
        attrs = {"root": self.buffers[(ptr.root, "out")], "kind": "read", "sem": "relaxed",
                 "scope": "gpu"}
        state = self.buffers[(ptr.root, "written")]   # (never an add-from-zero buffer)
        attrs.update(init=self.buffers[(ptr.root, "read")], state=state)
        value = b.value("mem_atomic", [index, *rest[:1]], rtype, **attrs)
        return b.value("where", [rest[0], value, rest[1]], rtype) if rest else value

    def once_per_program(self, b: Builder, dtype, emit, device: bool = False) -> Value:
        """The scalar `emit(builder)` computes, by the program's first thread and handed to
        every thread through threadgroup memory (`device`: the barrier before it also
        orders every thread's device writes before the one thread's access)."""
        slot = self.decl("shared", dtype, 1, "_old")
        then = Block()
        tb = Builder(then)
        tb.loc = b.loc
        tb.op("mem_store", [self.const(tb, 0), emit(tb)], [],
              {"root": slot, "space": "threadgroup"})
        first = b.value("eq", [self.geom(b, "thread_id"), self.const(b, 0)], BOOL)
        # a loop's previous iteration may still read the slot
        self.barrier(b, device=device)
        b.op("if", [first], [], regions=[then, Block()])
        self.barrier(b)
        return b.value("mem_load", [self.const(b, 0)], ScalarType(dtype), root=slot,
                       space="threadgroup")

    def emit_store(self, b: Builder, op: Op, operands: list[Value]) -> None:
        ptr: PointerType = elem_type(op.operands[0].type)
        index, value, rest = operands[0], operands[1], operands[2:]
        if ptr.space == "threadgroup":
            b.op("mem_store", [index, value, *rest], [], {"root": ptr.root, "space": "threadgroup"})
            return
        attrs = {"root": self.buffers[(ptr.root, "out")], "space": "device"}
        if op.attrs.get("atomic"):
            return self.emit_atomic(b, op, ptr, operands)
        b.op("mem_store", [index, value, *rest], [], attrs)
        written = self.buffers.get((ptr.root, "written"))
        if written is not None:
            b.op("mem_store", [index, self.const(b, True, dt.bool_), *rest], [],
                 {"root": written, "space": "device"})

    def emit_atomic(self, b: Builder, op: Op, ptr: PointerType, operands: list[Value]) -> Value:
        """mem_atomic: the old value.  A buffer initialised from its passed contents
        (buffer_usage.atomic_roots) is tracked: `init`/`state` name its input and its
        written-mask, which the emitter's atomic_init uses to copy each element in
        before its first atomic (and marks it written)."""
        attrs = {"root": self.buffers[(ptr.root, "out")], "kind": op.attrs["atomic"],
                 "sem": op.attrs["sem"], "scope": op.attrs["scope"]}
        state = self.buffers.get((ptr.root, "written"))
        if state is not None:
            attrs.update(init=self.buffers[(ptr.root, "read")], state=state)
        return b.value("mem_atomic", operands, ScalarType(ptr.dtype), **attrs)

    def lower_atomic(self, op: Op, b: Builder) -> None:
        """A tile atomic writes its old values into the result's storage; a scalar one done
        once per program (uniformity.py) hands thread 0's old value to every thread."""
        result = op.results[0]
        if isinstance(op.operands[0].type, TileType):
            st = self.storage_for(result) if self.place.kind.get(result.id, "local") != \
                "recompute" else None
            if st is not None and st.kind == "shared":
                self.barrier(b)

            def body(ctx):
                old = self.emit_store(ctx.b, op, [self.elem(o, ctx) for o in op.operands])
                if st is not None:
                    self.write(st, ctx, old)

            self.lane_loop(b, op.operands[0].type.shape, body)
            if st is not None and st.kind == "shared":
                self.barrier(b)
            return
        operands = [self.s(o) for o in op.operands]
        if not op.attrs.get("once_per_program"):
            self.scalars[result.id] = self.emit_store(b, op, operands)
            return
        # a release also publishes what every thread of the program wrote before it
        self.scalars[result.id] = self.once_per_program(
            b, result.type.dtype, lambda tb: self.emit_store(tb, op, operands),
            device=op.attrs["sem"] in ("release", "acq_rel"))

    # -- statements ------------------------------------------------------------------------
    def shared_copy(self, v: Value, b: Builder) -> Storage:
        """v row-major in threadgroup memory, for a use that reads other threads' elements
        (an axis reduction, a product on the matrix unit): where placement holds it there,
        else a copy made at the first such use in the block - later uses in the block read
        the same copy, as v never changes."""
        held = self.storage.get(v.id)
        if held is not None and held.kind == "shared":
            return held
        key = (v.id, id(b.block))
        copy = self.shared_copies.get(key)
        if copy is None:
            copy = self.shared_copies[key] = self.padded_storage(v) if self.mma is not None \
                and v.id in self.mma.padded else self.new_storage("shared", v.type.shape, v.type)
            self.copy_into(b, copy, v)
        return copy

    def shared_copy_bytes(self, v: Value, b: Builder) -> int:
        """The threadgroup bytes shared_copy(v, b) would add (0: held there or copied)."""
        held = self.storage.get(v.id)
        if held is not None and held.kind == "shared" or (v.id, id(b.block)) in self.shared_copies:
            return 0
        return prod(v.type.shape) * scalar_of(v.type).dtype.itemsize

    def materialize(self, v: Value, b: Builder) -> None:
        if v.id in self.prefetched:   # copied ahead by lower_mma_layout.prefetch
            self.storage[v.id] = self.prefetched[v.id]
            return
        st = self.storage_for(v)
        if st.layout is not None:
            return self.mma_fill(b, st, lambda ctx: self.compute(v, ctx))
        if st.kind == "shared":
            self.barrier(b)
        if not self.async_run_copy(v, st, b):   # vectorize_rows.py
            self.lane_loop(b, v.type.shape, lambda ctx: self.write(st, ctx,
                                                                   self.compute(v, ctx)))
        if st.kind == "shared":
            self.barrier(b)

    def copy_into(self, b: Builder, st: Storage, v: Value) -> None:
        if st.layout is not None:
            return self.mma_fill(b, st, lambda ctx: self.elem(v, ctx))
        if st.kind == "shared":
            self.barrier(b)
        self.lane_loop(b, st.shape, lambda ctx: self.write(st, ctx, self.elem(v, ctx)))
        if st.kind == "shared":
            self.barrier(b)

    def lower_block(self, src: Block, b: Builder) -> list[Value] | None:
        """Lower `src` into `b`; returns the operands of its terminator, if any."""
        for op in src.ops:
            b.loc = self.loc = op.loc
            if op.name in ("yield", "condition"):
                return op.operands
            self.lower_op(op, b)
        return None

    def lower_op(self, op: Op, b: Builder) -> None:
        name = op.name
        if self.mma is not None and self.lower_mma_op(op, b):
            return   # lower_mma_layout.py
        g = self.gemm
        if g is not None:
            if op is g.loop:
                return self.lower_gemm_loop(op, b)
            if any(op is st for st in g.stores):
                # every output at the last store, where all their addresses are defined
                return self.lower_gemm_store(op, b) if op is g.stores[-1] else None
            if any(r.id in g.dependent or r.id in g.fused_reads for r in op.results):
                return  # epilogue values and reads: evaluated per element at the store
        if name == "for":
            return self.lower_for(op, b)
        if name == "if":
            return self.lower_if(op, b)
        if name == "while":
            return self.lower_while(op, b)
        if name == "barrier":
            self.barrier(b, device=bool(op.attrs.get("device")))
            return
        if name in DEBUG:
            return lower_debug(self, op, b)  # device_print / device_assert (lower_debug.py)
        if name == "scan":
            return self.lower_scan(op, b)  # lower_reductions.py
        if name == "sort":
            return self.lower_sort(op, b)  # lower_sort.py
        if name == "reduce" and op.attrs["kind"] == "combine":
            return self.lower_combine_reduce(op, b)  # lower_reductions.py
        if rows_reducible(op):
            return self.rows_reduce(op, b)  # lower_reductions.py
        if name == "reduce" and op.attrs["axis"] is not None:
            return self.axis_reduce_in_shared(op, b)
        if name == "store" and op.attrs.get("atomic"):
            return self.lower_atomic(op, b)
        if name == "store":
            if self.elementwise_vector is not None and op is self.elementwise_vector.store:
                return self.lower_vector_store(op, b)  # vectorize_elementwise.py
            if self.row_runs is not None and self.lower_run_store(op, b):
                return  # vectorize_rows.py
            if isinstance(op.operands[0].type, TileType):
                shape = op.operands[0].type.shape
                self.lane_loop(b, shape, lambda ctx: self.emit_store(
                    ctx.b, op, [self.elem(o, ctx) for o in op.operands]))
            elif op.attrs.get("once_per_program"):
                # every thread holds the same update (passes/uniformity.py): it happens
                # once per program, as in Triton, by the program's first thread
                operands = [self.s(o) for o in op.operands]
                then = Block()
                tb = Builder(then)
                tb.loc = b.loc
                self.emit_store(tb, op, operands)
                first = b.value("eq", [self.geom(b, "thread_id"), self.const(b, 0)], BOOL)
                b.op("if", [first], [], regions=[then, Block()])
                if self._loaded_roots is None:
                    self._loaded_roots = {elem_type(o.operands[0].type).root
                                          for o in walk(self.fn.body) if o.name == "load"}
                if elem_type(op.operands[0].type).root in self._loaded_roots:
                    # the other threads read the buffer later: the one thread's write
                    # ordered before their reads (every thread of the source wrote it, so
                    # each would have read its own write; the reads raced the one store)
                    b.op("barrier", [], [], {"device": True})
            else:
                self.emit_store(b, op, [self.s(o) for o in op.operands])
            return
        result = op.results[0] if op.results else None
        if name == "dot" and (unit := self.dot_unit(op, b)) is not None:
            return self.lower_dot_fragments(op, b, unit)  # lower_dot_fragments.py
        if result is not None and isinstance(result.type, TileType):
            if self.place.kind[result.id] != "recompute":
                self.materialize(result, b)
            return
        if name == "reduce":
            self.scalars[result.id] = self.full_reduce(op, b)
        elif name == "shared_alloc":
            ptr: PointerType = result.type
            self.shared_bytes += op.attrs["size"] * ptr.dtype.itemsize
            self._fits_shared()   # past every limit: the report's check names the arrays
            self.decls.append(Op("decl", [], [], {"name": ptr.root, "storage": "shared",
                                                  "dtype": ptr.dtype, "size": op.attrs["size"]}, []))
            self.scalars[result.id] = self.const(b, 0)
        elif name == "load" and op.attrs.get("once_per_program"):
            # a uniform read of a buffer atomics update (passes/uniformity.py)
            operands = [self.s(o) for o in op.operands]
            self.scalars[result.id] = self.once_per_program(
                b, result.type.dtype, lambda tb: self.emit_load(tb, op, operands))
        elif name == "load":
            self.scalars[result.id] = self.emit_load(b, op, [self.s(o) for o in op.operands])
        elif name == "ptr_add":
            self.scalars[result.id] = self.add(b, *(self.s(o) for o in op.operands))
        elif name == "num_threads":
            self.scalars[result.id] = self.const(b, self.T)
        elif name == "program_id" and self.program_ids is not None:
            self.scalars[result.id] = self.program_id(b, op.attrs["axis"])
        else:
            new = b.op(name, [self.s(o) for o in op.operands], [scalar_of(r.type) for r in op.results],
                       op.attrs)
            for r, n in zip(op.results, new.results):
                self.scalars[r.id] = n

    # -- control flow ------------------------------------------------------------------------
    def _slots(self, values: list[Value], b: Builder, inits=None) -> list:
        """A var (scalars) or storage (tiles) for each carried value; initialised from `inits`."""
        slots = []
        for i, v in enumerate(values):
            if isinstance(v.type, TileType):
                slot = self.storage_for(v)
                if inits is not None:
                    self.copy_into(b, slot, inits[i])
            else:
                slot = self.decl("var", scalar_of(v.type).dtype, prefix="_c")
                if inits is not None:
                    b.op("var_set", [self.s(inits[i])], [], {"name": slot})
            slots.append(slot)
        return slots

    def _bind(self, values: list[Value], slots: list, b: Builder) -> None:
        for v, slot in zip(values, slots):
            if isinstance(slot, Storage):
                self.storage[v.id] = slot
            else:
                self.scalars[v.id] = b.value("var_get", [], scalar_of(v.type), name=slot)

    def _assign(self, slots: list, values: list[Value], b: Builder, carried=()) -> None:
        """Parallel assignment of yielded values into carried slots."""
        # (a value already in its slot - a product accumulated in place - is not copied)
        pairs = [(s, v) for s, v, c in zip(slots, values, list(carried) + [None] * len(values))
                 if v is not c and not (isinstance(s, Storage) and self.storage.get(v.id) is s)]
        tiles = [(s, v) for s, v in pairs if isinstance(s, Storage)]
        if len(tiles) == 1 and tiles[0][0].kind == "local" or not carried:
            for st, v in tiles:
                self.copy_into(b, st, v)
        elif tiles:
            temps = []
            for st, v in tiles:
                if st.layout is not None:
                    tmp = self.mma_like(st, v.type)
                    self.copy_into(b, tmp, v)
                else:
                    tmp = self.new_storage("local", st.shape, v.type)
                    self.lane_loop(b, st.shape, lambda ctx, tmp=tmp, v=v: self.write(
                        tmp, ctx, self.elem(v, ctx)))
                temps.append(tmp)
            for (st, _), tmp in zip(tiles, temps):
                self.copy_into(b, st, _Stored(tmp))
        for slot, v in pairs:
            if not isinstance(slot, Storage):
                b.op("var_set", [self.s(v)], [], {"name": slot})

    def lower_for(self, op: Op, b: Builder) -> None:
        lb, ub, step, *inits = op.operands
        body = op.regions[0]
        slots = self._slots(list(body.args[1:]), b, inits)
        new_body = Block()
        iv = new_body.add_arg(I32, body.args[0].hint)
        self.scalars[body.args[0].id] = iv
        inner = Builder(new_body)
        self._bind(body.args[1:], slots, inner)
        self.loop_depth += 1
        self.loop_arrays.append([])
        # an accumulator-layout loop's operand blocks copied one iteration ahead, and its
        # products left in flight round the back edge (lower_mma_layout.py)
        ahead = self.prefetch(op, b, inner, iv) if self.mma is not None else None
        in_flight = self.carried_products(op, slots) if self.mma is not None else []
        if in_flight:   # (an enclosing loop's products in flight stay pending too)
            self.wgmma_pending = (self.wgmma_pending or []) + in_flight
        ys = self.lower_block(body, inner)
        self.loop_depth -= 1
        self._assign(slots, ys, inner, body.args[1:])
        for key, name in self.loop_arrays.pop():   # free once the loop is done
            self.shared_pool.setdefault(key, []).append(name)
        if ahead:
            self.prefetch_done(ahead, inner)
        b.op("for", [self.s(lb), self.s(ub), self.s(step)], [], dict(op.attrs), [new_body])
        if in_flight:
            self.wgmma_wait_all(b, [])
        for res, slot in zip(op.results, slots):
            if isinstance(slot, Storage):
                self.storage[res.id] = slot
        self._bind([r for r in op.results], slots, b)

    def lower_if(self, op: Op, b: Builder) -> None:
        slots = self._slots(op.results, b)
        regions = []
        for src in op.regions:
            block = Block()
            inner = Builder(block)
            ys = self.lower_block(src, inner) or []
            self._assign(slots, ys, inner)
            regions.append(block)
        b.op("if", [self.s(op.operands[0])], [], {}, regions)
        self._bind(op.results, slots, b)

    def lower_while(self, op: Op, b: Builder) -> None:
        cond_src, body_src = op.regions
        slots = self._slots(list(cond_src.args), b, op.operands)
        cond_block, body_block = Block(), Block()
        cb = Builder(cond_block)
        self._bind(cond_src.args, slots, cb)
        self.loop_depth += 1
        (c,) = self.lower_block(cond_src, cb)
        cb.op("condition", [self.s(c)], [])
        bb = Builder(body_block)
        self._bind(body_src.args, slots, bb)
        ys = self.lower_block(body_src, bb)
        self.loop_depth -= 1
        self._assign(slots, ys, bb, body_src.args)
        b.op("while", [], [], {}, [cond_block, body_block])
        self._bind(op.results, slots, b)

    def run(self) -> Function:
        body = Block()
        b = Builder(body)
        captured = {p.name for p in self.gemm.captured} if self.gemm else set()
        for p in self.fn.params:
            if p.value is not None and is_pointer(p.value.type):
                self.scalars[p.value.id] = self.const(b, 0)
            elif p.value is not None:
                # Epilogue coefficients are bound at kernel entry under compiler-generated
                # names, so no later local or alias can shadow them.
                extra = {"capture": f"_epi_{p.name}"} if p.name in captured else {}
                self.scalars[p.value.id] = b.value("param", [], p.value.type,
                                                   name=self.buffers[(p.name, "scalar")], **extra)
        self.remap_program_ids(b)  # grouped GEMM program order (lower_matmul.py)
        self.lower_block(self.fn.body, b)
        launch = self._dynamic_shared_layout() if self.dynamic_shared else None
        occupancy = self.occupancy_hint() or self.mma_occupancy()  # vectorize_rows.py
        if occupancy:
            launch = dict(launch or {}, min_blocks=occupancy)
        meta = dict(self.fn.meta, threads=self.T, shared_bytes=self.shared_bytes,
                    loops=self.loops, allocations=[
                        {"name": d.attrs["name"], "space": "threadgroup",
                         "dtype": d.attrs["dtype"].name, "elements": d.attrs["size"],
                         "bytes": d.attrs["size"] * d.attrs["dtype"].itemsize}
                        for d in self.decls if d.attrs["storage"] == "shared"])
        if self.gemm is not None:
            meta["matmul"] = self.matmul_meta()
        if launch is not None:
            if self.tensor_maps:   # gemm_wgmma.bulk_tensor_form
                launch["tensor_maps"] = self.tensor_maps
            meta["launch"] = launch
        meta.update(self.schedule_meta())
        meta["row_runs"] = self.row_runs_record(occupancy)  # vectorize_rows.py (or None)
        if self.mma is not None:
            meta["mma_layout"] = self.mma_record()      # lower_mma_layout.py
        return Function(self.fn.name, self.fn.params, Block(ops=self.decls + body.ops), "thread",
                        meta)


    def _dynamic_shared_layout(self) -> dict:
        """Offsets of the shared arrays in one dynamic shared-memory buffer (each at its
        alignment), and what the launch needs: the buffer's bytes, the threads per block
        (`__launch_bounds__`) and the architecture the kernel's instructions need."""
        offset = 0
        for d in self.decls:
            if d.attrs["storage"] != "shared":
                continue
            align = max(16, d.attrs.get("align", 0))
            offset = -(-offset // align) * align
            d.attrs["offset"] = offset
            offset += d.attrs["size"] * d.attrs["dtype"].itemsize
        unit = self.gemm_plan.unit if self.gemm is not None else \
            (self.mma.warpgroup if self.mma is not None else None)
        return {"shared_memory": offset, "threads": self.T,
                "arch": unit.arch if unit is not None else None}


class _Stored:
    """A tile value already held in storage (used for copies out of temporaries)."""

    def __init__(self, st: Storage):
        self.type = TileType(st.shape, ScalarType(st.dtype))
        self.id = -id(self)
        self.st = st


def largest_tile(fn: Function) -> int:
    """Elements of the kernel's largest tile value (0 without tiles)."""
    return max((r.type.numel for op in walk(fn.body) for r in op.results
                if isinstance(r.type, TileType)), default=0)


def choose_threads(fn: Function, requested: int | None = None) -> int:
    """T: the requested SIMD-group count x 32, else the largest tile rounded up to 32 lanes
    (capped at 1024), else one SIMD-group."""
    if requested is not None:
        return requested
    largest = largest_tile(fn)
    if largest == 0:
        return 32
    return min(1024, -(-largest // 32) * 32)


def lower_tiles(fn: Function, threads: int, buffers: dict, matrix_units=(), plan=None,
                scalars=None, shared_limit: int = SHARED_BYTES, gemm_plan=None,
                shared_optin: int = 0, language: str | None = None,
                dot_fragments: bool = False, mma_layout: bool = False,
                wgmma_carry: bool = True, wgmma_dual: str = "split",
                wgmma_refill: str = "empty", staging_ahead: bool = True,
                mixed_bulk: bool = False) -> Function:
    """Tile form -> thread form for kernels without kernel-written fragments
    (`simdgroup_inline` kernels lower through passes/lower_fragments.py).  `language`
    ("msl" | "cuda") sets the widest vector access (vectorize_rows.py); None keeps the
    plain lane layout.  `dot_fragments` (the backend's) lets general products take the
    matrix unit (lower_dot_fragments.py); `mma_layout` lets them and the code around them
    stay in its accumulator layout (mma_layout.py, lower_mma_layout.py); `wgmma_carry`
    lets a warpgroup product there run round a loop's back edge (carried_products);
    `wgmma_dual` is how a dual GEMM's products take the warpgroup unit, `wgmma_refill`
    what orders its bulk-tensor loop's refills (gemm_wgmma.py), `staging_ahead` whether a
    computed operand tile loads its words a K step ahead (gemm_async.carried_loads), and
    `mixed_bulk` whether its GEMM takes the loaded operands by bulk tensor copies."""
    assert not fn.meta.get("fragments"), "fragment kernels lower through lower_fragments"
    args = (fn, threads, buffers, matrix_units, plan, scalars, shared_limit, gemm_plan,
            shared_optin, language)
    # the GEMM lowering's switches, the same for both attempts (wgmma_carry concerns the
    # mma layout the second has not)
    switches = {"wgmma_dual": wgmma_dual, "wgmma_refill": wgmma_refill,
                "staging_ahead": staging_ahead, "mixed_bulk": mixed_bulk}
    first = Lowering(*args, mma=dot_fragments and mma_layout)
    first.dot_fragments_allowed = dot_fragments
    first.wgmma_carry = wgmma_carry
    first.__dict__.update(switches)
    try:
        return first.run()
    except SharedOverflow:
        if not first.dot_fragments_used and first.mma is None:
            raise
    # products on the matrix unit hold more in threadgroup memory (operand copies, a
    # scratch) than per-element products: where that passes the limit, the latter
    later = Lowering(*args)
    later.dot_fragments_allowed = False
    later.__dict__.update(switches)
    return later.run()
