"""Connects compiled kernels to `metile.schedule`: traits from Tile IR, the plan
for the backend's target, and the execution report of what lowering emitted.

The planner never sees IR (it reads `KernelTraits`); the report never trusts
the plan (it is rebuilt from the thread-form IR that the emitter printed), so
`validate_report` compares two independent accounts of the kernel.
"""

from __future__ import annotations

import dataclasses

from ..ir.core import Function, walk
from ..passes.gemm import find_gemm
from ..passes.gemm_bounds import prove_gemm_bounds, staging_load
from ..passes.vectorize_elementwise import vectorizable
from ..passes.gemm_tensor_ops import tensor_operands
from ..passes.lower_matmul import GemmPlan, plan_gemm
from ..passes.lower_fragments import fragment_threads
from ..passes.lower_tiles import choose_threads, largest_tile, relaxed_precision
from ..passes.shared_hazards import check_shared_contract
from ..schedule import (AllocationReport, ExecutionReport, KernelTraits, LoopReport, Schedule,
                        SchedulePlan, ScheduleError, check_legacy_geometry, plan_schedule)
from ..schedule.report import debug_dump, validate_report
from ..schedule.targets import LOWERING, MATRIX_UNITS, Target


_REDUCING = ("reduce", "simd_reduce")


def _dot_dtypes(fn: Function) -> tuple[str, ...]:
    for op in walk(fn.body):
        if op.name == "dot":
            return tuple(v.type.dtype.name for v in op.operands[:2])
    return ()


def kernel_traits(fn: Function, threads: int, constexprs: dict, scalars: dict,
                  mask_bounds: tuple[str, ...] = ()) -> KernelTraits:
    """What the planner needs to know about a specialized tile-form kernel.

    `scalars` holds runtime scalar values when the launch specialized them
    (an explicit Schedule), else is empty: extents are then unknown (None).
    `mask_bounds` names the scalars that 1-D store masks compare against
    (`offs < n`), from `passes.buffer_usage`.
    """
    ops = list(walk(fn.body))
    names = {op.name for op in ops}
    relaxed = bool(constexprs.get("RELAXED_PRECISION", False))
    shared = [op for op in ops if op.name == "shared_alloc"]
    shared_bytes = sum(op.attrs["size"] * op.results[0].type.dtype.bits // 8 for op in shared)
    kind = "reduction" if names & set(_REDUCING) else "elementwise"
    largest = largest_tile(fn) or threads
    divisible, aligned = (), None
    if mask_bounds and all(b in scalars for b in mask_bounds):
        divisible = (all(scalars[b] % largest == 0 for b in mask_bounds),)
        # The canonical 1-D access (program_id * BLOCK + arange) over contiguous buffers is
        # 4-aligned when BLOCK is a multiple of 4; a bound that is not only leaves the last
        # block incomplete (its scalar remainder) - vectorizable() decides whether any block
        # is complete.  (Requiring bounds of multiples of 4 refused n=1001 as "provably
        # misaligned".)
        aligned = largest % 4 == 0
    elif mask_bounds:
        divisible = (None,)
    return KernelTraits(kind, (largest,), threads, (), None, divisible, aligned, relaxed,
                        bool(shared), shared_bytes, 0, dots="dot" in names)


def _reject_unmaterialized(plan: SchedulePlan, fn: Function, scalars: dict) -> None:
    # Requirements the lowering cannot materialize for non-GEMM kernels are
    # rejected here, by name, instead of being silently ignored.  (GEMMs: see
    # _gemm_plan; passes.gemm_bounds / lower_matmul materialize both.)
    if plan.vector_width == 4:
        found = vectorizable(fn, scalars)
        if isinstance(found, str):
            raise ScheduleError("vector_width=4", found)
    if plan.double_buffer:
        raise ScheduleError("double_buffer=True", "metile's lowering double-buffers only GEMM "
                                                  "operand staging (not implemented for this "
                                                  "kernel)")


def _gemm_plan(fn: Function, g, constexprs: dict, scalars: dict, schedule, target: Target,
               units, threads_req, tile_bounds) -> tuple[SchedulePlan, int, GemmPlan]:
    params = {id(p.value): p.name for p in fn.params if p.value is not None}
    k_extent = params.get(id(g.loop.operands[1]))
    extents = (*(tile_bounds or (None, None)), k_extent)
    divisible = tuple(scalars[p] % t == 0 if isinstance(p, str) and p in scalars else None
                      for p, t in zip(extents, g.tile))
    shared = [op for op in walk(fn.body) if op.name == "shared_alloc"]
    bounds = prove_gemm_bounds(fn, g, scalars) if scalars else None
    loads = [staging_load(v) for v in g.operands]
    # 4-alignment of every staging load (None: unknown without specialized scalars).
    aligned = None if bounds is None else all(
        ld is not None and bounds.aligned.get(id(ld), False) for ld in loads)
    traits = KernelTraits("matmul", g.tile, threads_req, (g.operand_dtype.name,) * 2, "float32",
                          divisible, aligned, relaxed_precision(fn), True,
                          sum(op.attrs["size"] * op.results[0].type.dtype.bits // 8 for op in shared),
                          1, g.products)
    plan = plan_schedule(traits, target, schedule, LOWERING)
    check_legacy_geometry(constexprs, plan, schedule)
    if plan.double_buffer and bounds is None:
        named = "double_buffer=True" if schedule is None or schedule.num_stages is None else \
            schedule.requirement("num_stages")
        raise ScheduleError(named, "the K loop is not one the bounds proofs take - `for k "
                                   "in range(0, K, BLOCK_K)`, stepping by BLOCK_K between "
                                   "integers known at launch (an explicit Schedule "
                                   "specializes the int arguments); a loop over the trip "
                                   "count, `range(0, cdiv(K, BLOCK_K))`, is not - so its "
                                   "tiles cannot be scheduled over two stages")
    if plan.vector_width == 4 and bounds is not None and \
            not (bounds.any_interior_tile and bounds.n_full):
        what = "output tile" if not bounds.any_interior_tile else "K step"
        raise ScheduleError("vector_width=4", f"no {what} is complete for these sizes, so every "
                                              "staging load keeps its scalar guards")
    if plan.backend in LOWERING.planned_backends:
        # An SDK path planned ahead of its lowering: the planner's own geometry stands;
        # the simdgroup fragment placement below does not apply, and generation refuses
        # (`unlowered`).
        return plan, plan.threadgroup_size[0], None
    if plan.backend in _TENSOR_BACKENDS and g.products > 1:
        why = (f"a dual GEMM ({g.products} products sharing the left operand) is lowered on the "
               f"SIMD-group path; the {plan.backend} lowering takes one product")
        if schedule is not None and schedule.backend == plan.backend:
            raise ScheduleError(f"backend={plan.backend!r}", why)
        plan = _without_tensor_ops(traits, target, schedule, plan.backend, why)
        check_legacy_geometry(constexprs, plan, schedule)
    elif plan.backend in _TENSOR_BACKENDS:
        tensor = _tensor_ops_plan(fn, g, plan, schedule)
        if tensor is not None:
            return tensor
        plan = _without_tensor_ops(traits, target, schedule, plan.backend, tensor_operands(fn, g))
        check_legacy_geometry(constexprs, plan, schedule)
    # The GEMM lowering places fragments for the backend's own matrix unit
    # within the planned thread count; the plan records what it chose.
    gp = plan_gemm(g, units, relaxed_precision(fn), plan.threadgroup_size[0],
                   planned_threads=threads_req is None)
    why = (f"Lowered with {gp.fragment} on a {gp.grid[0]}x{gp.grid[1]} "
           f"{'SIMD-group' if gp.unit else 'thread'} grid.")
    reasons, layout = plan.reasons, plan.cooperative_layout
    if gp.unit is not None and gp.unit.warpgroup:
        # The planner also described the warp-MMA fallback; the lowering took the
        # warpgroup unit, which reads its operands from shared memory, not fragments.
        reasons = tuple(r.replace("loaded into warp fragments.", "read by the tensor cores "
                                  "through shared-memory matrix descriptors.")
                        for r in reasons if not r.startswith("Warp-level MMA"))
        layout = "warpgroup MMA accumulators (wgmma's register layout)"
    plan = dataclasses.replace(plan, threadgroup_size=(gp.threads, 1, 1),
                               simdgroup_grid=tuple(gp.grid) if gp.unit else None,
                               reasons=reasons + (why,), cooperative_layout=layout)
    return plan, gp.threads, gp


_TENSOR_BACKENDS = ("tensor_ops", "nax")


def _tensor_ops_plan(fn: Function, g, plan: SchedulePlan, schedule
                     ) -> tuple[SchedulePlan, int, GemmPlan] | None:
    """The tensor_ops / nax lowering's plan (passes/gemm_tensor_ops.py) when the operand loads
    are tensor views; None when they are not and the backend was chosen automatically;
    ScheduleError when they are not and the schedule asked for this backend."""
    found = tensor_operands(fn, g)
    if isinstance(found, str):
        if schedule is not None and schedule.backend == plan.backend:
            raise ScheduleError(f"backend={plan.backend!r}", f"{found}; {plan.backend} reads "
                                "each operand tile as a Metal tensor straight from device "
                                "memory")
        return None
    unit = next(u for u in MATRIX_UNITS["msl"] if u.path == plan.backend)
    bm, bn, bk = g.tile
    wm, wn = plan.simdgroup_grid
    what = (f"{bm // wm // 16}x{bn // wn // 16} NAX fragment products of 16x16x16"
            if plan.backend == "nax" else f"one {bm // wm}x{bn // wn}x{bk} product")
    gp = GemmPlan(unit, plan.threadgroup_size[0], (wm, wn))
    why = (f"Lowered with {unit.name} on a {wm}x{wn} SIMD-group grid: {what} per SIMD-group "
           "and K step, operands as inline tensors "
           + ("(" + ", ".join(f"{role} stored transposed" for role, o in
                               zip(("left", "right"), found) if o.transposed) + ")"
              if any(o.transposed for o in found) else "(row-major)") + ".")
    return dataclasses.replace(plan, reasons=plan.reasons + (why,)), gp.threads, gp


def _without_tensor_ops(traits: KernelTraits, target: Target, schedule, backend: str,
                        why: str) -> SchedulePlan:
    """The automatic plan when the operands cannot be tensor views: the SIMD-group path,
    its reasons led by why the tensor path was not taken."""
    lowering = dataclasses.replace(LOWERING, matrix_backends=tuple(
        b for b in LOWERING.matrix_backends if b not in _TENSOR_BACKENDS), planned_backends=())
    plan = plan_schedule(traits, target, schedule, lowering)
    kept = [r for r in plan.reasons
            if not r.startswith(tuple(f"{b} not selected" for b in _TENSOR_BACKENDS))]
    return dataclasses.replace(plan, reasons=(f"{backend} not selected: {why}.", *kept))


def _vector_lanes(fn: Function, default: int) -> int:
    """Lanes for a lane kernel that must load 4-wide when the caller left the lane
    count open: the most SIMD-groups whose lanes each own whole groups of 4
    elements of the largest tile (a 2048-element tile gets 512 lanes, not 1024
    lanes of 2).  Without such a count the default stays and the planner says why."""
    largest = largest_tile(fn)
    for lanes in range(min(1024, largest // 4) // 32 * 32, 0, -32):
        if largest % (4 * lanes) == 0:
            return lanes
    return default



def _fragment_plan(fn: Function, constexprs: dict, schedule, target: Target, threads_req):
    """The plan of a `simdgroup_inline` kernel (traits kind "fragments")."""
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

def make_plan(fn: Function, constexprs: dict, scalars: dict, schedule: Schedule | None,
              target: Target, *, threads_req: int | None, units=(), mask_bounds: tuple = (),
              tile_bounds: tuple | None = None) -> tuple[SchedulePlan, int, GemmPlan | None]:
    """(plan, threads, the GEMM lowering's fragment plan or None) for a specialized
    tile-form kernel; ScheduleError when the schedule cannot be honoured.  The
    lowering reads this answer; nothing decides the thread count again."""
    if fn.meta.get("fragments"):  # simdgroup_inline: kernel-written 8x8 fragments
        return (*_fragment_plan(fn, constexprs, schedule, target, threads_req), None)
    g = find_gemm(fn)
    if g is not None:
        return _gemm_plan(fn, g, constexprs, scalars, schedule, target, units, threads_req,
                          tile_bounds)
    threads = traced = choose_threads(fn, threads_req)
    if threads_req is None and schedule is not None and schedule.vector_width == 4:
        # The launch left the lane count open: width 4 picks one whose lanes own whole groups
        # of 4, or takes the Schedule's own count (Schedule(vector_width=4, num_simdgroups=1)
        # was refused as not the default's 128 lanes, where vector_width=4 alone ran on 32).
        threads = _vector_lanes(fn, threads) if schedule.num_simdgroups is None else \
            schedule.num_simdgroups * target.simd_width
    traits = kernel_traits(fn, threads, constexprs, scalars, mask_bounds)
    plan = plan_schedule(traits, target, schedule, LOWERING)
    if threads != traced:
        plan = dataclasses.replace(plan, reasons=tuple(
            f"Lanes: {threads}, each owning whole groups of 4 elements of the "
            f"{largest_tile(fn)}-element tile (vector_width=4 with the launch's lane count left "
            f"open; the traced default is {traced})." if r.startswith("Lanes follow") else r
            for r in plan.reasons))
    check_legacy_geometry(constexprs, plan, schedule)
    _reject_unmaterialized(plan, fn, scalars)
    if plan.threadgroup_size[0] != threads:
        raise ScheduleError("threadgroup size", f"the plan asks for {plan.threadgroup_size[0]} "
                                                f"threads but lowering traced {threads}")
    return plan, threads, None


def _loops(thread_fn: Function) -> list[LoopReport]:
    loops = []
    threads = thread_fn.meta["threads"]
    for op in walk(thread_fn.body):
        if op.name == "lane_loop" and op.attrs.get("unchecked_copy"):
            continue   # vectorize_rows' guarded copy of the loop that follows it
        if op.name == "lane_loop":
            slots, run = op.attrs["slots"], op.attrs.get("run", 1)
            if slots * run > 1:
                loops.append(LoopReport("lane", "loop", threads, slots * run, threads * run))
        elif op.name == "for":
            step = op.operands[2].owner
            step_value = step.attrs.get("value") if getattr(step, "name", None) == "const" else 0
            iv = op.regions[0].args[0].hint or "i"
            loops.append(LoopReport(iv, "loop", threads, 1, int(step_value or 0)))
        elif op.name == "while":
            loops.append(LoopReport("while", "loop", threads, 1, 0))
    return loops


def _allocations(thread_fn: Function) -> list[AllocationReport]:
    out = []
    for op in walk(thread_fn.body):
        if op.name == "decl" and op.attrs.get("storage") == "shared":
            d = op.attrs["dtype"]
            out.append(AllocationReport(op.attrs["name"], "threadgroup", d.name, op.attrs["size"],
                                        op.attrs["size"] * d.bits // 8))
    return out


def make_report(plan: SchedulePlan, thread_fn: Function, passes: list[str],
                target: Target) -> ExecutionReport:
    meta = thread_fn.meta.get("matmul") or {}
    loops = [LoopReport(**lp) for lp in thread_fn.meta.get("loops", [])] or _loops(thread_fn)
    allocations = ([AllocationReport(**a) for a in thread_fn.meta["allocations"]]
                   if "allocations" in thread_fn.meta else _allocations(thread_fn))
    report = ExecutionReport.build(
        plan, passes=passes, loops=loops, allocations=allocations,
        double_buffered=bool(meta.get("double_buffered", False)),
        vectorized_loads=int(thread_fn.meta.get("vectorized_loads", 0)),
        epilogue_regions=int(meta.get("epilogue_regions", 0)),
        notes=((target.terms_note,) if target.terms_note else ()) + _read_notes(meta)
        + _runs_notes(thread_fn.meta.get("row_runs"))
        + _mma_notes(thread_fn.meta.get("mma_layout")),
        num_stages=meta.get("stages"))
    # Past the static limit the lowering lays shared arrays out in dynamic shared memory
    # (lower_tiles._fits_shared): a target's real limit is its opt-in one, where it has one.
    validate_report(report, max(target.threadgroup_memory_bytes,
                                target.shared_memory_optin_bytes))
    return report


def unlowered(plan: SchedulePlan, target: Target) -> str | None:
    """Why a kernel with this plan cannot be generated yet (None: it can): its backend
    is planned for the target's hardware but metile's lowering does not emit it."""
    if plan.backend not in LOWERING.planned_backends or plan.backend in LOWERING.matrix_backends:
        return None
    return (f"the {target.name} plan selects backend {plan.backend!r}, which metile's lowering "
            f"does not implement yet: the plan can be inspected (prepare(...).explain(), "
            f"schedule_plan) but no kernel is generated; SCHEDULE=metile.Schedule(backend="
            f"'simdgroup') runs this GEMM with SIMD-group matrices on {target.name}")


def plan_only_report(plan: SchedulePlan, steps: list[str], target: Target) -> ExecutionReport:
    """The report of a plan whose backend is not lowered yet (`unlowered`): the plan,
    the analysis steps that ran, and nothing materialized, saying so."""
    return ExecutionReport.build(
        plan, passes=steps,
        notes=((target.terms_note,) if target.terms_note else ()) + (
            f"Plan only: no kernel was generated (the {plan.backend} lowering is not "
            "implemented yet); passes are the analysis steps that ran, and the loops, "
            "allocations and epilogue regions of the lowered kernel are not known.",))


def _runs_notes(runs: dict | None) -> tuple[str, ...]:
    """What passes/vectorize_rows.py did with the kernel's lanes, or why it did not."""
    if not runs:
        return ()
    if "refused" in runs:
        return (f"Lanes keep one element per access (vectorize_rows): {runs['refused']}.",)
    note = (f"Lanes own runs of {runs['width']} consecutive elements (vectorize_rows): one "
            "vector access per run where its masks hold and its address is aligned, "
            "scalar otherwise.")
    if runs.get("whole_run_tests"):
        note += (f" {runs['whole_run_tests']} lane loop(s) test all of a thread's runs at "
                 "once first: where every run passes, its accesses are bare vectors.")
    if runs.get("min_blocks"):
        note += (f" __launch_bounds__ asks for {runs['min_blocks']} resident blocks per SM "
                 "(the registers its held tiles leave room for).")
    return (note,)


def _mma_notes(mma: dict | None) -> tuple[str, ...]:
    """What passes/lower_mma_layout.py held in the matrix unit's accumulator layout."""
    if not mma:
        return ()
    how = ("warpgroup MMA (4 warps a 64-row product, operands by shared-memory descriptors, "
           "a left operand held in registers passed from them)" if mma["warpgroup"]
           else "fragment products of one SIMD-group each")
    note = (f"{mma['products']} product(s) and the code around them stay in the accumulator "
            f"layout (mma_layout): {mma['unit']}, {how}; each SIMD-group owns "
            f"{mma['rows_per_simdgroup']} rows; operand tiles in threadgroup memory as "
            f"{mma['operand_layout']}.")
    if mma["prefetched"]:
        note += " A loop's operand blocks are copied one iteration ahead (double buffer)."
    return (note,)


def _read_notes(matmul: dict) -> tuple[str, ...]:
    """One note per memory read fused into the GEMM epilogue (bias, residual)."""
    # (the load's own address, not the store's: a transposed or shifted read is evaluated
    # as written - "at the store's coordinates" read as if it were the store's offsets)
    return tuple(f"epilogue reads {r['buffer']!r} ({r['dtype']} {r['kind']}) per stored "
                 f"element: its load's address and mask evaluated at the element's (row, "
                 f"column), only where the store writes"
                 for r in matmul.get("epilogue_reads", []))


def report_from_dict(data: dict) -> ExecutionReport:
    return ExecutionReport(
        SchedulePlan.from_dict(data["plan"]), tuple(data["passes"]),
        tuple(LoopReport(**lp) for lp in data["loops"]),
        tuple(AllocationReport(**a) for a in data["allocations"]), data["double_buffered"],
        data["vectorized_loads"], data["epilogue_regions"], tuple(data["notes"]),
        data.get("num_stages"))


def dump(name: str, plan: SchedulePlan, report: ExecutionReport | None) -> None:
    debug_dump(name, plan, report)
