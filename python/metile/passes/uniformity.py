"""uniformity: reject barriers and tile ops under thread-dependent control flow.

A value is *divergent* when it may differ between the threads of one program:
`thread_id()`, anything computed from a divergent value (including loads
through divergent addresses), and results of control flow whose condition or
bounds are divergent.  Code under a divergent `if` / loop runs on a subset of
the threads, so it must not contain:

* `barrier()` — every thread of the program must reach it;
* tile operations — they are executed cooperatively by all threads (they
  use barriers and SIMD-group collectives internally).

A tile computed from a divergent scalar is rejected too: each thread would see
a different tile.  Violations are CompilationErrors at the offending line.

The pass also marks each scalar `atomic_add` and scalar device-memory store whose
operands and enclosing control are uniform with `once_per_program`: every thread
holds the same update, which lowering performs once (by thread 0), as Triton
does; a divergent one is each thread's own.  For a plain store this is what
makes `store(X, load(X) + 1)` add one: were every thread to store, later threads
would read earlier threads' results.  (Threadgroup stores stay per thread: a
thread may read back its own uniform write without a barrier.)

A scalar plain load of a buffer the kernel updates with atomics is marked the same way:
each thread reading it on its own could see another value (another program's atomic may
land between their reads), so a uniform one is read once per program and shared, which
keeps a branch or loop condition on it uniform (a spin on a flag, Triton's layer-norm
backward's `if count == 0`); one under thread-dependent control is each thread's own,
and divergent.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Block, Function, Op
from ..ir.types import TileType, elem_type
from .buffer_usage import atomic_buffers


def _is_tile_op(op: Op) -> bool:
    return any(isinstance(r.type, TileType) for r in op.results) or \
        any(isinstance(o.type, TileType) for o in op.operands)


def check_uniformity(fn: Function) -> Function:
    divergent: set[int] = set()
    atomic = frozenset(atomic_buffers(fn))
    # Loop-carried values feed back into their loops: iterate to a fixed point (the set
    # only grows, so this ends; a cap of 8 rounds missed a value that became thread-dependent
    # ten loop-carried hops away, and its barrier or per-thread atomic passed as uniform)
    while True:
        before = len(divergent)
        _scan(fn.body, divergent, None, False, atomic)
        if len(divergent) == before:
            break
    # simdgroup_inline kernels assign work to SIMD-groups: their fragment ops need only
    # SIMD-uniform control and operands, which passes/shared_hazards.py checks.
    _scan(fn.body, divergent, None, "barriers" if fn.meta.get("fragments") else True, atomic)
    return fn


def _cause(why: Op) -> str:
    """Where the divergence comes from; a guard made for a return / break / continue
    (frontend.desugar_control) names that statement."""
    exit_ = why.attrs.get("exit")
    if exit_:
        return f"the {exit_} depends on it, so some threads skip the code after it"
    return f"line {why.loc.line if why.loc else '?'}"


def _scan(block: Block, div: set[int], why: Op | None, check: bool, atomic=frozenset()) -> None:
    for op in block.ops:
        if check and why is not None:
            if op.name == "barrier":
                raise CompilationError(
                    f"barrier() under control flow that depends on thread_id() ({_cause(why)}): "
                    f"every thread of the program must reach it", op.loc)
            if _is_tile_op(op) and check is True:
                raise CompilationError(
                    f"tile operation under control flow that depends on thread_id() "
                    f"({_cause(why)}): tile operations run on all threads of the program", op.loc)
        if check is True and op.name == "splat" and op.operands[0].id in div:
            raise CompilationError("a tile cannot be built from a value that depends on "
                                   "thread_id(); each thread would see a different tile", op.loc)
        inputs_div = any(o.id in div for o in op.operands)
        if check and op.name == "store" and not _is_tile_op(op) and (
                op.attrs.get("atomic") or getattr(op.operands[0].type, "space", None) == "device"):
            op.attrs["once_per_program"] = why is None and not inputs_div
        if check and op.name in ("device_print", "device_assert") and not _is_tile_op(op):
            op.attrs["once_per_program"] = why is None and not inputs_div  # lower_debug.py
        atomic_read = op.name == "load" and not _is_tile_op(op) and \
            getattr(elem_type(op.operands[0].type), "root", None) in atomic
        if check and atomic_read:
            op.attrs["once_per_program"] = why is None and not inputs_div
        if op.name == "thread_id" or (inputs_div and op.name not in ("for", "while", "if")) \
                or (atomic_read and why is not None):
            div.update(r.id for r in op.results)
        if op.name == "for":
            lb, ub, step, *inits = op.operands
            body = op.regions[0]
            bounds_div = any(v.id in div for v in (lb, ub, step))
            if bounds_div:
                div.update(a.id for a in body.args)
            for init, arg in zip(inits, body.args[1:]):
                if init.id in div:
                    div.add(arg.id)
            _scan(body, div, why or (op if bounds_div else None), check, atomic)
            ys = body.ops[-1].operands if body.ops and body.ops[-1].name == "yield" else []
            for y, arg, res in zip(ys, body.args[1:], op.results):
                if y.id in div or arg.id in div or bounds_div:
                    div.update((arg.id, res.id))
        elif op.name == "if":
            cond_div = op.operands[0].id in div
            for region in op.regions:
                _scan(region, div, why or (op if cond_div else None), check, atomic)
                ys = region.ops[-1].operands if region.ops and region.ops[-1].name == "yield" else []
                for y, res in zip(ys, op.results):
                    if y.id in div or cond_div:
                        div.add(res.id)
        elif op.name == "while":
            cond, body = op.regions
            for init, a, b in zip(op.operands, cond.args, body.args):
                if init.id in div:
                    div.update((a.id, b.id))
            _scan(cond, div, why, check, atomic)
            c = cond.ops[-1].operands[0] if cond.ops and cond.ops[-1].name == "condition" else None
            c_div = c is not None and c.id in div
            _scan(body, div, why or (op if c_div else None), check, atomic)
            ys = body.ops[-1].operands if body.ops and body.ops[-1].name == "yield" else []
            for y, a, b, res in zip(ys, cond.args, body.args, op.results):
                if y.id in div or c_div:
                    div.update((a.id, b.id, res.id))
