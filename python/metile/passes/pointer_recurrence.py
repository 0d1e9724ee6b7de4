"""pointer_recurrence: a dot loop's carried pointers and offsets in closed form (tile form).

Triton's canonical matmul advances its operand pointers every iteration and may
accumulate with `acc += dot(a, b)`:

    for k in range(lo, hi, step):               # carries acc, a_ptrs, b_ptrs
        a = load(a_ptrs, ...); b = load(b_ptrs, ...)
        acc += dot(a, b)                         # or acc = dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

The GEMM lowering (`passes.gemm`) stages the operands of any K step on its own:
it needs each operand load to be a function of the induction variable, not of
the previous iteration.  This pass changes, in every `for` loop that carries a
dot accumulator (`yield` of `dot(a, b, acc)` for its own carried `acc`):

* **accumulation**: a carried `acc` yielded as `acc + dot(a, b)` (either operand
  order; `dot` without an accumulator, used only there) becomes `dot(a, b, acc)`:
  the same sum, accumulated inside the product as every dot lowering does;
* **index recurrences**: a carried pointer or integer value `p` yielded as `p`
  advanced by a chain of `ptr_add` / integer `add` / `sub` ops whose other
  operands are loop-invariant (computed outside the loop or from such values
  only, by pure ops) is no longer carried.  Inside the body `p` is replaced by
  `p0 + t * c`, where `p0` is its initial value, `c` the total increment and
  `t = (iv - lo) / step` the trip index.  In wrapping int32 arithmetic that is
  exactly the value the t-th iteration sees; where an increment is int64 (a user's
  64-bit strides) the sum is formed in int64.  The pure ops computing `c` move to
  the front of the body (they depend on nothing carried).
* **invariant slots**: a carried value yielded unchanged (a block pointer's offset
  advanced by 0, frontend/block_pointers.py) is replaced by its initial value.

Only kernels shaped like a GEMM are touched: one `dot`, in a loop at the top
level of the kernel (what `passes.gemm` lowers), or a dual GEMM's two dots whose
results are only yielded (directly or through `acc + dot`) by one top-level loop.
Any other kernel, e.g. one with two products whose `acc += dot(p, v)` runs
through the reference lowering, keeps its loops exactly as written.

What it proves before rewriting a carried value: the increment is invariant,
every link of the chain is an integer or pointer op (float sums are not
reassociated), and the loop's result for that slot is unused after the loop
(the closed form is only needed inside).  Anything else stays carried, so
`passes.gemm` reports it by name.  Loops without a dot recurrence are left
alone.  The rewrite happens in place; it returns one line per rewritten loop
(the execution report's detail for this step), empty when nothing changed.
"""

from __future__ import annotations

from ..ir.core import Block, Function, Op, Value, walk
from ..ir.ops import ELEMENTWISE
from ..ir.types import PointerType, ScalarType, TileType, dtype_of, elem_type
from ..language import dtypes as dt

I32 = ScalarType(dt.int32)
# Ops free of memory effects and control: safe to move within a body or to drop unused.
_PURE = ELEMENTWISE | {"const", "splat", "broadcast", "expand_dims", "arange", "permute",
                       "reshape", "program_id", "num_programs"}


def rewrite_pointer_recurrences(fn: Function) -> list[str]:
    """Rewrite `fn`'s GEMM-shaped K loop in place (module docstring); one line per loop
    that changed, naming what it rewrote."""
    dots = [op for op in walk(fn.body) if op.name == "dot"]
    if len(dots) != 1 and not _dual_shaped(fn, dots):
        return []   # not a GEMM (passes.gemm): kernels with several products keep their loops
    notes = []
    for op in list(fn.body.ops):
        if op.name == "for" and op.regions and len(op.regions[0].args) > 1:
            note = _rewrite_loop(fn, op)
            if note:
                notes.append(note)
    return notes


def _dual_shaped(fn: Function, dots: list[Op]) -> bool:
    """Two dots in the body of one top-level loop, each result used only by the loop's
    yield or by one `add` the yield takes (`acc += dot(a, b)`): a dual GEMM's products
    (passes.gemm checks the rest), not a product feeding another."""
    if len(dots) != 2:
        return False
    loop = next((op for op in fn.body.ops if op.name == "for" and op.regions
                 and all(any(d is o for o in op.regions[0].ops) for d in dots)), None)
    if loop is None:
        return False
    body = loop.regions[0]
    y = body.ops[-1]
    for d in dots:
        users = _uses(body, d.result)
        if users == [y]:
            continue
        if not (len(users) == 1 and users[0].name == "add"
                and _uses(body, users[0].result) == [y]):
            return False
    return True


def _rewrite_loop(fn: Function, loop: Op) -> str | None:
    body = loop.regions[0]
    carried = body.args[1:]
    folded = [arg for arg in carried if _fold_accumulation(body, arg)]
    accumulators = {id(a) for a in carried if _is_dot_recurrence(body, a)}
    if not accumulators:
        return None
    inside = _defined_inside(body)
    rewritten, invariant = [], []
    for j, arg in reversed(list(enumerate(carried))):
        if id(arg) in accumulators or _used_after(fn, loop.results[j]):
            continue
        increments = _increment_chain(body, arg, inside)
        if increments is None:
            continue
        _close_form(loop, j, increments, inside)
        (rewritten if increments else invariant).append(arg.hint or f"carried value {j}")
    if not rewritten and not invariant and not folded:
        return None
    _drop_dead(body)
    where = f"loop at line {loop.loc.line}" if loop.loc else "loop"
    parts = []
    if rewritten:
        parts.append(f"{', '.join(reversed(rewritten))} advanced in closed form "
                     f"(start + trip * increment)")
    if invariant:
        parts.append(f"{', '.join(reversed(invariant))} unchanged (the initial value)")
    if folded:
        parts.append(f"{', '.join(a.hint or 'accumulator' for a in folded)} += dot(a, b) "
                     f"accumulated as dot(a, b, acc)")
    return f"{where}: " + "; ".join(parts)


# -- accumulation --------------------------------------------------------------------------------

def _is_zero(v: Value) -> bool:
    op = v.owner
    while isinstance(op, Op) and op.name in ("splat", "broadcast"):
        op = op.operands[0].owner
    return isinstance(op, Op) and op.name == "const" and op.attrs["value"] == 0


def _uses(block: Block, v: Value) -> list[Op]:
    return [op for op in walk(block) if any(o is v for o in op.operands)]


def _fold_accumulation(body: Block, arg: Value) -> bool:
    """`yield acc + dot(a, b)` -> `yield dot(a, b, acc)` for carried `acc` (see the
    module docstring); True when it rewrote."""
    y = body.ops[-1]
    j = body.args.index(arg) - 1
    add = y.operands[j].owner
    if not (isinstance(add, Op) and add.name == "add" and any(o is arg for o in add.operands)):
        return False
    other = add.operands[1] if add.operands[0] is arg else add.operands[0]
    dot = other.owner
    if not (isinstance(dot, Op) and dot.name == "dot" and _is_zero(dot.operands[2])
            and dot.result.type == arg.type and len(_uses(body, other)) == 1
            and any(o is add for o in body.ops)):
        return False
    dot.operands[2] = arg
    _replace_uses(body, add.result, dot.result)
    body.ops.remove(add)
    return True


def _is_dot_recurrence(body: Block, arg: Value) -> bool:
    j = body.args.index(arg) - 1
    d = body.ops[-1].operands[j].owner
    return isinstance(d, Op) and d.name == "dot" and d.operands[2] is arg


# -- index recurrences ---------------------------------------------------------------------------

def _defined_inside(body: Block) -> set[int]:
    ids = {a.id for a in body.args}
    for op in walk(body):
        ids |= {r.id for r in op.results}
        for region in op.regions:
            ids |= {a.id for a in region.args}
    return ids


def _invariant(v: Value, body: Block, inside: set[int], memo: dict) -> bool:
    """`v` is the same in every iteration: defined outside the loop, or by pure ops of the
    body (not nested deeper) over invariant values."""
    if v.id not in inside:
        return True
    if v.id in memo:
        return memo[v.id]
    op = v.owner
    ok = (isinstance(op, Op) and op.name in _PURE and any(o is op for o in body.ops)
          and all(_invariant(o, body, inside, memo) for o in op.operands))
    memo[v.id] = ok
    return ok


_OFFSETS = (dt.int32, dt.int64)


def _offset_or_pointer(v: Value) -> bool:
    return isinstance(elem_type(v.type), PointerType) or dtype_of(v.type) in _OFFSETS


def _increment_chain(body: Block, arg: Value, inside: set[int]):
    """[(sign, increment)] when the yielded value is `arg` advanced by invariant int32
    increments (module docstring; [] when it is `arg` itself), else None."""
    j = body.args.index(arg) - 1
    v, chain, memo = body.ops[-1].operands[j], [], {}
    while v is not arg:
        op = v.owner
        if not (isinstance(op, Op) and op.name in ("ptr_add", "add", "sub") and _offset_or_pointer(v)
                and any(o is op for o in body.ops)):
            return None
        x, y = op.operands
        if op.name == "add" and _invariant(x, body, inside, memo) \
                and not _invariant(y, body, inside, memo):
            x, y = y, x
        if not _invariant(y, body, inside, memo) or x.type != v.type \
                or dtype_of(y.type) not in _OFFSETS \
                or (isinstance(y.type, TileType) and y.type.shape != v.type.shape):
            return None
        chain.append((-1 if op.name == "sub" else 1, y))
        v = x
    return chain


def _close_form(loop: Op, j: int, increments, inside: set[int]) -> None:
    """Replace carried slot j (block argument j + 1) by start + trip * increment (by start
    when there are no increments)."""
    body = loop.regions[0]
    arg, start = body.args[j + 1], loop.operands[3 + j]
    if not increments:
        _replace_uses(body, arg, start)
        _drop_slot(loop, j)
        return
    _hoist_to_front(body, [y for _, y in increments], inside)
    at = _front_after(body, [y for _, y in increments])
    new: list[Op] = []

    def emit(name, operands, type_, **attrs):
        op = Op(name, list(operands), [], attrs, [], loop.loc)
        op.results = [Value(type_, op)]
        new.append(op)
        return op.result

    # Every increment at the carried value's shape (int32 elements, int64 if any increment
    # is): they add up exactly.
    shape = arg.type.shape if isinstance(arg.type, TileType) else None
    index = ScalarType(dt.int64) if any(dtype_of(y.type) == dt.int64 for _, y in increments) \
        else I32

    def widen(y):
        if dtype_of(y.type) == index.dtype:
            return y
        return emit("cast", [y], TileType(y.type.shape, index) if isinstance(y.type, TileType)
                    else index, to=index.dtype)

    total = None
    for sign, y in increments:
        y = widen(y)
        if shape is not None and not isinstance(y.type, TileType):
            y = emit("splat", [y], TileType(shape, index), shape=shape)
        if sign < 0:
            y = emit("neg", [y], y.type)
        total = y if total is None else emit("add", [total, y], y.type)
    trip = widen(_trip_index(loop, emit))
    if shape is not None:
        trip = emit("splat", [trip], TileType(shape, index), shape=shape)
    offset = emit("mul", [trip, total], total.type)
    closed = emit("ptr_add" if isinstance(elem_type(arg.type), PointerType) else "add",
                  [start, offset], arg.type)
    body.ops[at:at] = new
    _replace_uses(body, arg, closed)
    _drop_slot(loop, j)


def _drop_slot(loop: Op, j: int) -> None:
    body = loop.regions[0]
    del loop.operands[3 + j]
    del body.args[j + 1]
    del body.ops[-1].operands[j]
    del loop.results[j]


def _trip_index(loop: Op, emit) -> Value:
    iv = loop.regions[0].args[0]
    lo, step = loop.operands[0], loop.operands[2]
    t = iv if _const(lo) == 0 else emit("sub", [iv, lo], I32)
    return t if _const(step) == 1 else emit("idiv", [t, step], I32)


def _const(v: Value):
    op = v.owner
    return op.attrs["value"] if isinstance(op, Op) and op.name == "const" else None


def _hoist_to_front(body: Block, values, inside: set[int]) -> None:
    """Move the body ops computing `values` (pure, invariant) to the front, in order."""
    need: set[int] = set()
    todo = [v for v in values if v.id in inside]
    while todo:
        v = todo.pop()
        if id(v.owner) in need:
            continue
        need.add(id(v.owner))
        todo += [o for o in v.owner.operands if o.id in inside]
    moved = [op for op in body.ops if id(op) in need]
    body.ops[:] = moved + [op for op in body.ops if id(op) not in need]


def _front_after(body: Block, values) -> int:
    """The first body position after every op defining `values`."""
    owners = {id(v.owner) for v in values}
    last = -1
    for i, op in enumerate(body.ops):
        if id(op) in owners:
            last = i
    return last + 1


def _replace_uses(block: Block, old: Value, new: Value) -> None:
    for op in walk(block):
        op.operands = [new if o is old else o for o in op.operands]


def _used_after(fn: Function, result: Value) -> bool:
    return any(o is result for op in walk(fn.body) for o in op.operands)


def _drop_dead(body: Block) -> None:
    """Remove pure ops of the body whose results nothing uses (the old increments)."""
    while True:
        used = {o.id for op in walk(body) for o in op.operands}
        dead = [op for op in body.ops if op.name in _PURE and op.results
                and not any(r.id in used for r in op.results)]
        if not dead:
            return
        body.ops[:] = [op for op in body.ops if op not in dead]
