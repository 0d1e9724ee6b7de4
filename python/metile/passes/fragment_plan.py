"""The schedule plan of a `simdgroup_inline` kernel (traits kind "fragments")."""

from __future__ import annotations

from ..ir.core import Function, walk
from ..schedule import LOWERING, KernelTraits, plan_schedule
from .lower_fragments import fragment_threads
from .lower_tiles import relaxed_precision
from .shared_hazards import check_shared_contract


def fragment_plan(fn: Function, constexprs: dict, schedule, target, threads_req):
    threads = fragment_threads(fn, constexprs, threads_req)
    check_shared_contract(fn, threads)
    ops = list(walk(fn.body))
    dtypes = tuple(dict.fromkeys(v.type.elem.dtype.name for op in ops if op.name == "dot"
                                 for v in op.operands[:2]))
    shared = [op for op in ops if op.name == "shared_alloc"]
    traits = KernelTraits("fragments", (8, 8), threads, dtypes, "float32", (), None,
                          relaxed_precision(fn), bool(shared),
                          sum(op.attrs["size"] * op.results[0].type.dtype.bits // 8
                              for op in shared), 0)
    return plan_schedule(traits, target, schedule, LOWERING), threads
