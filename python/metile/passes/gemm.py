"""gemm: recognise the canonical GEMM recurrence and its pointwise epilogue (tile form).

The canonical shape is

    acc = zeros((BM, BN), float32)
    for k in tile_range(lo, hi, BK):          # top level, carries only acc
        acc = dot(<(BM, BK) tile>, <(BK, BN) tile>, acc)
    store(<pointer tile>, <epilogue of acc>, <mask>)   # the kernel's stores, each
                                                       # into an output of its own

where the operand tiles are computed in the loop body from loads and index
arithmetic (Triton-style pointers + masks, or `tensor(...).load(...)` views,
which lower to the same ops; Triton's advanced pointers and `acc += dot(a, b)`
reach this form through `pointer_recurrence`).  `find_gemm` returns a
`GemmPattern` for such a kernel, `None` for a kernel without a dot recurrence
(its dots keep the reference lowering), and raises a `CompilationError` naming
the reason for a kernel that has the recurrence but cannot be lowered as one
fused GEMM.

The epilogue is the backward slice of the stored value over values that depend
on the accumulator (shared subexpressions are evaluated once per element).
It may use float32 arithmetic, comparisons, `where`, maximum/minimum, the
unary math functions and one final cast to the output dtype; its other leaves
are constants, runtime scalar parameters and the reads `gemm_epilogue_reads`
admits (a bias vector along rows or columns, a matrix at the store's
coordinates).  The scalars are captured at kernel entry under compiler-generated
names (`_epi_<name>`).  Several stores, each of its own pointwise function of
the accumulators into an output of its own (a gated MLP's result and both
products, kept for the backward pass), are one epilogue evaluated per element
at the last of them; an epilogue that reads memory stores once.  Rejected, each
with its own message: other memory reads (of the output, indirect, of another
shape), reductions, control flow, two stores into one buffer, a second matrix
recurrence, intermediate narrowing casts, and dimension parameters (scalars
that bound loops, addresses or masks) as leaves.

Dual GEMM (a gated MLP's two products).  A K loop carrying exactly two
accumulators, each `acc_i = dot(a, b_i, acc_i)` from zeros, with the same left
operand (one value, or two equal load expressions) and same-shaped right
operands, followed by one pointwise epilogue of both results (stored once or more), is
one fused GEMM with two products: `GemmPattern.dots` / `results` hold both, the
lowering stages A once and both B tiles.  Any other kernel with several dots
(attention's product of a product, two products of different left operands, a
dual whose epilogue or loop breaks a rule above) is not one fused GEMM:
`find_gemm` returns None and the general tile lowering computes every product.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CompilationError
from ..ir.core import Block, Function, Op, Param, Value, walk
from ..ir.ops import COMPARE, CONTROL
from ..ir.types import dtype_of, elem_type
from ..language import dtypes as dt
from .gemm_epilogue_reads import EpilogueRead, check_epilogue_reads, leaf_cone

# Pointwise ops an epilogue may contain (besides a final cast).
EPILOGUE_OPS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "neg", "abs", "exp",
                          "exp2", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "where",
                          "cast", "and", "or", "not"}) | COMPARE
# Ops allowed in the K loop body besides the dot (operand computation).
_BODY_FORBIDDEN = {"store": "a store", "reduce": "a reduction", "barrier": "a barrier",
                   "shared_alloc": "a shared() allocation"}

PREFIX = "cannot lower the GEMM"


def relaxed_precision(fn: Function) -> bool:
    """The kernel's precision policy: a constexpr RELAXED_PRECISION=True allows reduced-
    precision matrix units (e.g. TF32 for float32 operands)."""
    return any(p.kind == "constexpr" and p.name == "RELAXED_PRECISION" and p.constant is True
               for p in fn.params)


@dataclass
class GemmPattern:
    loop: Op
    dot: Op
    store: Op
    result: Value                       # the accumulator after the K loop
    epilogue: list[Op]                  # ops from `result` to the stored value, program order
    dependent: set[int]                 # ids of every value that depends on the accumulator
    captured: list[Param] = field(default_factory=list)   # runtime scalars the epilogue reads
    dimension_params: list[str] = field(default_factory=list)
    reads: list[EpilogueRead] = field(default_factory=list)  # bias / residual loads
    fused_reads: set[int] = field(default_factory=set)  # tile values evaluated at the store
    # Every product of the K loop and its accumulator after the loop: (dot,) and (result,)
    # for one GEMM, two of each for a dual GEMM (module docstring).
    dots: tuple[Op, ...] = ()
    results: tuple[Value, ...] = ()
    # every store of the epilogue (`store` is the first): a kernel may write several
    # pointwise functions of the accumulators at the same tile coordinates
    stores: tuple[Op, ...] = ()

    def __post_init__(self):
        self.dots = self.dots or (self.dot,)
        self.results = self.results or (self.result,)
        self.stores = self.stores or (self.store,)

    @property
    def a(self) -> Value:
        return self.dot.operands[0]

    @property
    def b(self) -> Value:
        return self.dot.operands[1]

    @property
    def bs(self) -> list[Value]:
        """The right operand of each product (the left one is shared)."""
        return [d.operands[1] for d in self.dots]

    @property
    def operands(self) -> list[Value]:
        """The operand tiles staged per K step: A, then each product's B."""
        return [self.a, *self.bs]

    @property
    def products(self) -> int:
        return len(self.dots)

    @property
    def tile(self) -> tuple[int, int, int]:
        (bm, bk), (_, bn) = self.a.type.shape, self.b.type.shape
        return bm, bn, bk

    @property
    def operand_dtype(self) -> dt.DType:
        return dtype_of(self.a.type)

    @property
    def out_dtype(self) -> dt.DType:
        return dtype_of(self.store.operands[1].type)

    @property
    def k_loop_masked(self) -> bool:
        return any(op.name == "load" and len(op.operands) > 1 for op in walk(self.loop.regions[0]))

    @property
    def outer_bounds_proven(self) -> bool:
        return all(len(st.operands) < 3 for st in self.stores)

    @property
    def epilogue_regions(self) -> int:
        return 1 if self.epilogue else 0


def _reject(message: str, op: Op | None) -> CompilationError:
    return CompilationError(f"{PREFIX}: {message}", op.loc if op is not None else None)


def _backward(values, stop=lambda v: False):
    """Every value reachable backwards from `values` through defining ops."""
    seen, todo = {}, list(values)
    while todo:
        v = todo.pop()
        if v.id in seen or stop(v):
            continue
        seen[v.id] = v
        if isinstance(v.owner, Op):
            todo.extend(v.owner.operands)
    return seen


def _dimension_params(fn: Function) -> dict[int, Param]:
    """Scalar parameters that bound a loop or enter an address or mask."""
    roots = []
    for op in walk(fn.body):
        if op.name == "for":
            roots += op.operands[:3]
        elif op.name in ("load", "store"):
            roots += [op.operands[0]] + op.operands[2 if op.name == "store" else 1:]
    reach = _backward(roots)
    return {p.value.id: p for p in fn.params
            if p.kind == "scalar" and p.value is not None and p.value.id in reach}


def _is_zero_splat(v: Value) -> bool:
    op = v.owner
    if not isinstance(op, Op) or op.name != "splat":
        return False
    src = op.operands[0].owner
    return isinstance(src, Op) and src.name == "const" and src.attrs["value"] == 0


def _same_value(u: Value, v: Value, memo: dict) -> bool:
    """`u` and `v` are the same value or equal expressions (same ops, attributes and
    operands, recursively); loads count as equal when their operands are, since the K
    loop body has no store between them."""
    if u is v:
        return True
    key = (u.id, v.id)
    if key in memo:
        return memo[key]
    ou, ov = u.owner, v.owner
    memo[key] = False   # cycles (loop-carried values) are not equal
    same = (isinstance(ou, Op) and isinstance(ov, Op) and ou.name == ov.name
            and ou.name not in CONTROL and ou.attrs == ov.attrs
            and len(ou.operands) == len(ov.operands) and len(ou.results) == len(ov.results)
            and ou.results.index(u) == ov.results.index(v) and u.type == v.type
            and all(_same_value(x, y, memo) for x, y in zip(ou.operands, ov.operands)))
    memo[key] = same
    return same


def _dual(recurrences, dots) -> bool:
    """Two dot recurrences of one loop sharing the left operand (module docstring)."""
    if len(dots) != 2 or len(recurrences) != 2 or recurrences[0][1] is not recurrences[1][1]:
        return False
    (d1, loop), (d2, _) = recurrences
    if len(loop.results) != 2 or d1.operands[2] is d2.operands[2]:
        return False
    a1, b1 = d1.operands[:2]
    a2, b2 = d2.operands[:2]
    return (b1.type == b2.type and d1.result.type == d2.result.type
            and _same_value(a1, a2, {}))


def find_gemm(fn: Function) -> GemmPattern | None:
    dots = [op for op in walk(fn.body) if op.name == "dot"]
    parent: dict[int, Op] = {}
    for op in walk(fn.body):
        for region in op.regions:
            parent[id(region)] = op
    recurrences = []
    for d in dots:
        acc = d.operands[2]
        block = acc.owner
        loop = parent.get(id(block)) if isinstance(block, Block) else None
        if loop is None or loop.name != "for":
            continue
        index = block.args.index(acc) - 1
        if index >= 0 and block.ops and block.ops[-1].operands[index] is d.result:
            recurrences.append((d, loop))
    if not recurrences:
        return None
    dot, loop = recurrences[0]
    if len(dots) > 1:
        if not _dual(recurrences, dots):
            # Attention-like kernels (a product feeding another recurrence): not one fused
            # GEMM; the general tile lowering computes every product, as for `acc + dot`.
            return None
        try:
            return _match(fn, loop, [d for d, _ in recurrences])
        except CompilationError:
            return None   # a dual GEMM's rules broken: the general lowering is still right
    return _match(fn, loop, [dot])


def _match(fn: Function, loop: Op, products: list[Op]) -> GemmPattern:
    """The GemmPattern of `loop`'s products (one, or a dual GEMM's two); a
    CompilationError names the first rule the kernel breaks."""
    dot = products[0]
    if not any(op is loop for op in fn.body.ops):
        raise _reject("the K loop is nested inside control flow; it must be at the top level of "
                      "the kernel (not inside a persistent loop over tiles, nor after an early "
                      "return: mask the tail instead) - written `acc += metile.dot(a, b)`, such a "
                      "loop runs on the general lowering, without the fused GEMM's tiling", loop)
    if len(loop.results) != len(products):
        accs = [d.operands[2] for d in products]
        others = ", ".join(f"{a.hint or 'a value'!r} ({a.type})"
                           for a in loop.regions[0].args[1:] if not any(a is c for c in accs))
        raise _reject(f"the K loop carries other values besides the accumulator: {others}; "
                      f"only pointers or int32/int64 offsets advanced by a loop-invariant amount "
                      f"(p += c) and unused after the loop are rewritten away", loop)
    if not all(_is_zero_splat(v) for v in loop.operands[3:]):
        raise _reject("the accumulator must start from metile.zeros((BLOCK_M, BLOCK_N))", loop)
    for op in walk(loop.regions[0]):
        if op.name in _BODY_FORBIDDEN:
            raise _reject(f"{_BODY_FORBIDDEN[op.name]} inside the K loop", op)
        if op.name in CONTROL:
            raise _reject("control flow inside the K loop", op)

    carried = loop.regions[0].args
    # The loop result of each product, in product order.
    results = [loop.results[carried.index(d.operands[2]) - 1] for d in products]
    result = results[0]
    stores = [op for op in walk(fn.body) if op.name == "store"]
    if not stores:
        raise _reject("the kernel never stores the accumulator", loop)
    for store in stores:
        if not any(op is store for op in fn.body.ops):
            raise _reject("the output store is inside control flow (an epilogue has no "
                          "control flow)", store)
    roots = [getattr(elem_type(st.operands[0].type), "root", None) for st in stores]
    if len(stores) > 1 and (None in roots or len(set(roots)) < len(roots)):
        raise _reject("a fused GEMM's stores write one output each; two of them store "
                      "through one buffer", stores[1])
    store = stores[0]

    # Values that depend on the accumulator, in program order after the loop.
    dependent = {r.id for r in results}
    after = fn.body.ops[fn.body.ops.index(loop) + 1:]
    for op in after:
        if op.name in CONTROL:
            inner = {v.id for o in walk_regions(op) for v in o.operands}
            if dependent & (inner | {v.id for v in op.operands}):
                raise _reject("control flow in the epilogue (the accumulator is used inside "
                              "if/for/while)", op)
            continue
        if any(v.id in dependent for v in op.operands):
            if any(op is st for st in stores):
                continue
            dependent |= {r.id for r in op.results}
    for st in stores:
        ptr, value, *mask = st.operands
        if value.id not in dependent:
            raise _reject("the stored value does not depend on the accumulator", st)
        if any(v.id in dependent for v in [ptr, *mask]):
            raise _reject("the store's address or mask depends on the accumulator", st)
    values = [st.operands[1] for st in stores]

    # The epilogue: the stored values' backward slice within the dependent values.
    slice_ = _backward(values, stop=lambda v: v.id not in dependent
                       or any(v is r for r in results))
    epilogue = [op for op in after if not any(op is st for st in stores)
                and any(r.id in slice_ for r in op.results)]
    dims = _dimension_params(fn)
    leaves = []
    for op in epilogue:
        _check_epilogue_op(op, any(op.result is v for v in values))
        for v in op.operands:
            if v.id not in dependent:
                _check_leaf(v, op, dims)
                leaves.append(v)
    uses: dict[int, list] = {}
    for op in walk(fn.body):
        for i, v in enumerate(op.operands):
            uses.setdefault(v.id, []).append((op, i))
    reads, fused = check_epilogue_reads(fn, epilogue, dependent, store, uses, leaves)
    if reads and len(stores) > 1:
        # (a read is checked against one store's coordinates and bounds)
        raise _reject("an epilogue that reads memory (a bias, a residual) stores one output",
                      stores[1])
    names = [p.name for p in fn.params if p.value is not None and p.value.id in dims]
    g = GemmPattern(loop, dot, store, result, epilogue, dependent, [], names, reads, fused,
                    tuple(products), tuple(results), tuple(stores))
    g.captured = captured_params(fn, g)
    return g


def walk_regions(op: Op):
    for region in op.regions:
        yield from walk(region)


def _check_epilogue_op(op: Op, final: bool) -> None:
    if op.name == "reduce":
        raise _reject("a reduction of the accumulator is not a pointwise epilogue", op)
    if op.name == "load":
        raise _reject("extra memory read in the epilogue (a load whose address depends on the "
                      "accumulator)", op)
    if op.name not in EPILOGUE_OPS:
        raise _reject(f"'{op.name}' is not a supported epilogue operation", op)
    d = dtype_of(op.result.type)
    if final and op.name == "cast" and not d.is_float:
        # (an int output: the cast may be the store's own conversion, written nowhere)
        raise _reject(f"a fused GEMM stores a float output (float32, float16 or bfloat16); "
                      f"converting its result to {d} (a cast, or the store's conversion to its buffer) "
                      f"is not fused - store to a float buffer and convert after", op)
    if d not in (dt.float32, dt.bool_) and not (final and op.name == "cast" and d.is_float):
        raise _reject(f"the epilogue computes in float32 until the final conversion; this "
                      f"{op.name} produces {d} before the end", op)


def _check_leaf(v: Value, user: Op, dims: dict) -> None:
    """A non-accumulator operand of an epilogue op: constants, runtime scalars and loads
    (whose contract `gemm_epilogue_reads` checks; their addresses and masks may use
    positions and dimension parameters)."""
    for w in leaf_cone(v).values():
        op = w.owner
        if op is None:
            if w.id in dims:
                raise _reject(f"dimension parameter {dims[w.id].name!r} used in the epilogue "
                              f"(scalars that bound loops, addresses or masks cannot be epilogue "
                              f"leaves)", user)
            continue
        if isinstance(op, Block):
            raise _reject("a loop-carried or branch value used in the epilogue", user)
        if op.name == "load":
            continue
        if op.name == "reduce":
            raise _reject("a reduction in the epilogue", op)
        if op.name in ("arange", "program_id", "num_programs", "thread_id", "num_threads"):
            raise _reject(f"a position-dependent value ({op.name}) in the epilogue", user)
        if op.name not in EPILOGUE_OPS | {"const", "splat", "broadcast", "expand_dims"}:
            raise _reject(f"'{op.name}' is not a supported epilogue operand", user)


def captured_params(fn: Function, g: GemmPattern) -> list[Param]:
    """The runtime scalar parameters the epilogue reads, in parameter order."""
    leaves = set()
    for op in g.epilogue:
        for v in op.operands:
            if v.id not in g.dependent:
                leaves |= set(leaf_cone(v))
    return [p for p in fn.params if p.kind == "scalar" and p.value is not None
            and p.value.id in leaves]
