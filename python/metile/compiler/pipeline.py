"""The compile pipeline: a kernel specialization in, typed results out.

    frontend -> verify -> uniformity [-> pointer_recurrence, verify] -> buffer_usage
      -> plan_schedule                                                    (analyze)
      -> lower_tiles | lower_fragments (+ the lowering's own steps) -> verify -> emit_<language>
                                                                       (generate)

`analyze` runs once per specialization (argument kinds, constexprs, schedule,
backend) and returns an `Analysis`: which buffers are outputs, the coverage
proofs of their stores, the schedule plan and the thread count.  `generate`
runs once per variant (which outputs are proven fully written) and returns a
`CompiledKernel`: the source pair, its call signature and the execution
report.  Both record the steps that ran, in order, as `Step`s; the execution
report's `passes` and `explain()` list exactly those.  `METILE_DEBUG=<step>`
prints what a step produced (the older words tile_ir, thread_ir, msl, cuda and
schedule name the same dumps).

Both results serialize to JSON for the disk cache (`to_json` / `from_json`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from ..errors import CompilationError, ScheduleError
from ..frontend import build_tile_ir
from ..ir.core import Function, Loc, walk
from ..ir.ops import TMA_SLOTS, TMA_TEMPLATE
from ..ir.printer import format_function
from ..ir.verifier import verify
from ..passes.buffer_usage import (atomic_roots, buffer_roles, coverage_from_json,
                                   load_extents, order_dependent, store_coverage)
from ..passes.lower_fragments import lower_fragments
from ..passes.lower_matmul import GemmPlan
from ..passes.lower_tiles import lower_tiles
from ..passes.pointer_recurrence import rewrite_pointer_recurrences
from ..passes.uniformity import check_uniformity
from ..passes.wide_offsets import narrowing_casts, wide_indexed
from ..schedule import ExecutionReport, Schedule, SchedulePlan
from ..settings import debug_flags
from . import planning
from .backend import Backend
from .debug_support import check_debug_support

# How buffer_usage proved that a launch writes every element of an output (checked
# against the grid at launch), as explain() words it.
_COVERAGE = {"Coverage": "full coverage provable from the grid: 1-D block stores",
             "TileCoverage": "full coverage provable from the grid: 2-D tile stores",
             "FirstElementCoverage": "full coverage of a one-element output: a scalar store"}


def _coverage_words(rule) -> str:
    unproven = "no coverage proof: a written-mask keeps unwritten elements"
    if rule is None:
        return unproven
    if getattr(rule, "shift", (0, ())) != (0, ()):
        # (the rule still bounds the range the launch checks against the array)
        return f"{unproven} (its offsets are moved by a term of no index)"
    return _COVERAGE.get(type(rule).__name__, "coverage proof")


# What METILE_DEBUG prints after a step, and the older word for the same dump.
DUMP_ALIASES = {"uniformity": "tile_ir", "lower_tiles": "thread_ir",
                "lower_fragments": "thread_ir", "emit_msl": "msl", "emit_cuda": "cuda",
                "plan_schedule": "schedule"}


def dumps(step: str) -> bool:
    flags = debug_flags()
    return step in flags or DUMP_ALIASES.get(step) in flags


@dataclass(frozen=True)
class Request:
    """What to compile: a kernel function specialized for one launch signature."""
    fn: object                       # the Python function
    param_names: tuple[str, ...]
    specs: dict                      # runtime name -> (kind, DType, ndim)
    constexprs: dict
    threads_req: int | None
    schedule: Schedule | None
    int_values: dict                 # runtime ints specialized by an explicit schedule
    backend: Backend
    differentiable: bool = False
    loc: Loc | None = None
    debug: bool = False              # device_assert checked (frontend/debug_ops.py)

    @property
    def fragments(self) -> bool:
        return self.schedule is not None and self.schedule.backend == "simdgroup_inline"


@dataclass
class Analysis:
    """What a specialization's tile form proves and plans (once per specialization)."""
    outputs: list[str]
    atomic_outputs: list[str]
    loaded_outputs: list[str]
    coverage: dict                   # output name -> coverage proof (passes.buffer_usage)
    plan: SchedulePlan
    threads: int
    steps: list[str]
    # A GEMM's fragment plan: the matrix unit by name (None: FFMA micro-tiles) and the
    # SIMD-group (or thread) grid, as planned; the lowering reads it.
    gemm: dict | None = None
    details: dict = field(default_factory=dict)   # step -> what it proved or decided
    # outputs whose contents may depend on thread order (buffer_usage.order_dependent)
    order_dependent: dict = field(default_factory=dict)
    # input name -> rules bounding what its top-level loads read (buffer_usage.load_extents)
    reads: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"outputs": self.outputs, "atomic_outputs": self.atomic_outputs,
                "loaded_outputs": self.loaded_outputs,
                "coverage": {k: c.to_json() for k, c in self.coverage.items()},
                "plan": self.plan.to_dict(), "threads": self.threads, "steps": self.steps,
                "gemm": self.gemm, "details": self.details,
                "order_dependent": self.order_dependent,
                "reads": {k: [r.to_json() for r in rules] for k, rules in self.reads.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "Analysis":
        return cls(d["outputs"], d["atomic_outputs"], d["loaded_outputs"],
                   {k: coverage_from_json(v) for k, v in d["coverage"].items()},
                   SchedulePlan.from_dict(d["plan"]), d["threads"], d["steps"], d["gemm"],
                   d["details"], d.get("order_dependent", {}),
                   {k: [coverage_from_json(r) for r in rules]
                    for k, rules in d.get("reads", {}).items()})

    def gemm_plan(self, units) -> GemmPlan | None:
        if self.gemm is None:
            return None
        unit = next(u for u in units if u.name == self.gemm["unit"]) if self.gemm["unit"] \
            else None
        return GemmPlan(unit, self.gemm["threads"], tuple(self.gemm["grid"]))


@dataclass
class CompiledKernel:
    """One generated kernel (a variant of a specialization): MLX's custom-kernel
    call signature and source, and what lowering materialized."""
    name: str
    header: str
    body: str
    inputs: list[str]                # argument names of the kernel source, in order
    outputs: list[str]
    input_roles: list[list[str]]     # ["in", parameter] for each input, in order
    tracked: list[str]               # outputs with a written-mask (not proven covered)
    lowering: dict                   # matmul / loops / allocations the lowering recorded
    report: ExecutionReport
    language: str
    steps: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)   # step -> what it proved or produced

    def step_log(self) -> list[dict]:
        """The steps that ran, in order, each with what it proved or produced."""
        return [{"step": s, **({"detail": self.details[s]} if s in self.details else {})}
                for s in self.steps]

    @property
    def source(self) -> str:
        return self.header + "\n" + self.body

    def to_json(self) -> dict:
        return {"name": self.name, "header": self.header, "body": self.body,
                "inputs": self.inputs, "outputs": self.outputs, "input_roles": self.input_roles,
                "tracked": self.tracked, "lowering": self.lowering, "passes": self.steps,
                "report": self.report.to_dict(), "language": self.language,
                "details": self.details}

    @classmethod
    def from_json(cls, d: dict) -> "CompiledKernel":
        return cls(d["name"], d["header"], d["body"], d["inputs"], d["outputs"],
                   d["input_roles"], d["tracked"], d["lowering"],
                   planning.report_from_dict(d["report"]), d["language"], d["passes"],
                   d["details"])


# -- analyze --------------------------------------------------------------------------------

def tile_form(req: Request) -> tuple[Function, list[str]]:
    """frontend -> verify -> uniformity: the kernel's Tile IR, checked."""
    try:
        fn, _ = build_tile_ir(req.fn, {k: v[:2] for k, v in req.specs.items()}, req.constexprs,
                              req.fragments, req.debug)
    except CompilationError as e:
        _name_constexprs(e, req.constexprs)
        raise
    verify(fn)
    asserts = check_debug_support(fn, req.backend)
    if asserts:
        fn.meta["device_assert"] = asserts
    check_uniformity(fn)
    steps = ["frontend", "verify", "uniformity"]
    # Triton-style K loops (advanced pointers, acc += dot) in the form passes.gemm matches;
    # simdgroup_inline kernels have no GEMM pattern and keep their loops as written.
    rewritten = [] if fn.meta.get("fragments") else rewrite_pointer_recurrences(fn)
    if rewritten:
        fn.meta["pointer_recurrence"] = "; ".join(rewritten)
        verify(fn)
        steps += ["pointer_recurrence", "verify"]
    if dumps("uniformity") or dumps("pointer_recurrence"):
        print(format_function(fn), file=sys.stdout)
    return fn, steps


def analyze(req: Request, fn: Function, steps: list[str]) -> Analysis:
    """buffer_usage -> plan_schedule on a kernel's tile form."""
    loaded, stored = buffer_roles(fn)
    name = getattr(req.fn, "__name__", "kernel")
    outputs = [n for n in req.param_names if n in stored]
    if not outputs:
        consts = ", ".join(f"{k}={v!r}" for k, v in req.constexprs.items()
                           if k in req.param_names)
        raise CompilationError(
            f"kernel {name!r} stores to no buffer, so it has no result: a kernel's outputs "
            f"are the buffers it writes with metile.store, a tensor view's store or atomic_add"
            + (f" - with {consts}, a store a constexpr branch leaves out (or an early return "
               f"before it) does not count; skip such a launch on the host, where its result "
               f"is the arrays passed" if consts else ""), req.loc)
    atomic = atomic_roots(fn)
    if atomic:
        first = next(iter(atomic.values()))
        why = ("differentiable=True kernels" if req.differentiable else
               "kernels with dot" if any(op.name == "dot" for op in walk(fn.body)) else
               "simdgroup_inline kernels" if fn.meta.get("fragments") else None)
        if why:
            raise CompilationError(f"atomic_add is not supported in {why}", first.loc)
    cov = store_coverage(fn, loaded)
    try:
        bounds = tuple(sorted({c.bound for c in cov.values() if getattr(c, "bound", None)}))
        tiles = [c.bounds for c in cov.values() if hasattr(c, "bounds")]
        plan, threads, gemm = planning.make_plan(
            fn, req.constexprs, req.int_values, req.schedule, req.backend.target,
            threads_req=req.threads_req, units=req.backend.matrix_units, mask_bounds=bounds,
            tile_bounds=tiles[0] if tiles else None)
    except ScheduleError as e:
        raise CompilationError(str(e), req.loc) from None
    gemm_json = None if gemm is None else {
        "unit": gemm.unit.name if gemm.unit else None, "threads": gemm.threads,
        "grid": list(gemm.grid)}
    ops = list(walk(fn.body))
    once = sum(1 for op in ops if op.attrs.get("once_per_program"))
    details = {
        "frontend": f"{len(ops)} tile-form ops",
        "uniformity": "no barrier or tile op under thread-dependent control"
                      + (f"; {once} uniform scalar store(s) once per program" if once else ""),
        "buffer_usage": "outputs " + ", ".join(
            f"{n} ({_coverage_words(cov.get(n))})" for n in outputs),
        "plan_schedule": f"{plan.backend}, {threads} threads"
                         + (f", {gemm.fragment} on a {gemm.grid[0]}x{gemm.grid[1]} grid" if gemm else ""),
    }
    if "pointer_recurrence" in fn.meta:
        details["pointer_recurrence"] = fn.meta["pointer_recurrence"]
    if "device_assert" in fn.meta:
        details["device_assert"] = fn.meta["device_assert"]
    return Analysis(outputs, [n for n in outputs if n in atomic], sorted(loaded & stored), cov,
                    plan, threads, steps + ["buffer_usage", "plan_schedule"], gemm_json, details,
                    order_dependent(fn, outputs), load_extents(fn))


def _name_constexprs(error: CompilationError, constexprs: dict) -> None:
    """Say which constexpr a constant in the message came from: `BLOCK=8.0` reaches
    the compiler as the bare constant 8.0."""
    # whole numbers only: `constant 4` is not in "constant 4294967295" (an `other=` literal
    # was blamed on BLOCK=4), nor `constant 8.0` in "constant 8.05"
    named = [f"{k}={v!r}" for k, v in constexprs.items()
             if (isinstance(v, (int, float, str)) or v is None)
             and re.search(rf"(constant|{type(v).__name__}) {re.escape(repr(v))}(?![\w]|\.\d)",
                           error.message)]
    if named:
        error.message += f" (the constant is constexpr {', '.join(named)})"


# -- generate -------------------------------------------------------------------------------

def generate(req: Request, fn: Function, analysis: Analysis, proven: tuple, name: str,
             reserved: frozenset) -> CompiledKernel:
    """lower -> verify -> emit for one variant: `proven[i]` says output i is proven
    fully written (else the kernel also records which elements it wrote)."""
    signature = _signature(req, analysis, proven, reserved)
    buffers, inputs, outputs, roles, tracked = signature
    backend = req.backend
    if fn.meta.get("fragments"):
        lowered = ["shared_hazards", "lower_fragments"]
        thread_fn = lower_fragments(fn, analysis.threads, buffers)
    else:
        thread_fn = lower_tiles(fn, analysis.threads, buffers, backend.matrix_units,
                                plan=analysis.plan, scalars=req.int_values,
                                shared_limit=backend.shared_memory_bytes,
                                shared_optin=backend.shared_memory_optin_bytes,
                                gemm_plan=analysis.gemm_plan(backend.matrix_units),
                                language=backend.language, dot_fragments=backend.dot_fragments,
                                mma_layout=backend.mma_layout,
                                wgmma_carry=backend.wgmma_carry,
                                wgmma_dual=backend.wgmma_dual,
                                wgmma_refill=backend.wgmma_refill,
                                staging_ahead=backend.staging_ahead,
                                mixed_bulk=backend.mixed_bulk)
        lowered = ["placement", "lower_tiles", *_lowering_steps(thread_fn)]
    verify(thread_fn)
    scalar_ids = {p.value.id for p in fn.params if p.kind == "scalar" and p.value is not None}
    thread_fn.meta["wide_offsets"] = {
        "buffers": wide_indexed(thread_fn, buffers),
        "narrowing_casts": [f"{op.loc.file}:{op.loc.line}" if op.loc else "?"
                            for op in narrowing_casts(fn, scalar_ids)]}
    if dumps(lowered[-1]) or dumps("lower_tiles"):
        print(format_function(thread_fn), file=sys.stdout)
    scalars = {buffers[(n, "scalar")] for n, s in req.specs.items() if s[0] == "scalar"}
    by_value = _scalars_by_value(req, thread_fn, buffers)
    if by_value:
        thread_fn.meta["launch"]["scalars_by_value"] = by_value
        scalars -= set(by_value)
    if (thread_fn.meta.get("launch") or {}).get("tensor_maps"):
        # bulk tensor copies (gemm_wgmma.bulk_tensor_form): the maps' template comes in
        # last, each block's encoded maps go out to a scratch output (runtime/tensor_maps.py)
        inputs, outputs = inputs + [TMA_TEMPLATE], outputs + [TMA_SLOTS]
        roles = roles + [["tensor_maps", TMA_TEMPLATE]]
    header, body = backend.emit(thread_fn, scalars)
    emit = f"emit_{backend.language}"
    if dumps(emit):
        print(f"// metile kernel {fn.name} ({name})\n{header}\n{body}", file=sys.stdout)
    steps = analysis.steps + lowered + ["verify", emit]
    report = planning.make_report(analysis.plan, thread_fn, steps, backend.target)
    details = dict(analysis.details)
    details[lowered[-1] if fn.meta.get("fragments") else "lower_tiles"] = (
        f"{len(report.loops)} loop(s), {len(report.allocations)} threadgroup allocation(s), "
        f"{analysis.threads} threads")
    details[emit] = f"{len(header) + len(body)} characters of {backend.language.upper()}"
    if dumps("plan_schedule"):
        planning.dump(fn.name, analysis.plan, report)
    return CompiledKernel(
        name, header, body, inputs, outputs, roles, tracked,
        {k: thread_fn.meta[k] for k in ("matmul", "loops", "allocations", "launch", "wide_offsets")
         if k in thread_fn.meta},
        report, backend.language, steps, details)


# The scalar types MLX's precompiled_cuda_kernel passes by value (its ScalarArg).
BY_VALUE_SCALARS = ("int32", "float32", "bool")


def _scalars_by_value(req, thread_fn: Function, buffers: dict) -> list[str]:
    """The kernel parameters a CUDA kernel takes by value under METILE_CUDA_SCALARS=value
    (the backend record's `scalars`, settings.cuda_scalars): its int32/float32/bool runtime
    scalars, in parameter order.
    MLX's own cuda_kernel passes arrays only, so such a kernel is compiled by metile and
    launched precompiled: one without an arch of its own (the warpgroup GEMM's sm_90a)
    gets its target's (recorded in the launch record).  So does a kernel without such
    scalars: under this setting every kernel is metile's to compile, and its launch is
    metile's own primitive (csrc/cuda_launch.cpp), not MLX's cuda_kernel, whose launch
    cost more host time - on the H200 (s33) a one-element kernel without scalars built in
    3.26 us through MLX's cuda_kernel binding, an ops.matmul replay through metile's own
    launch in 1.84.  None for other settings."""
    if req.backend.language != "cuda" or req.backend.scalars != "value":
        return []
    launch = thread_fn.meta.setdefault("launch", {})
    if launch.get("arch") is None:   # (a launch record may name it None)
        launch["arch"] = req.backend.target.name
    return [buffers[(n, "scalar")] for n, s in req.specs.items()
            if s[0] == "scalar" and s[1].name in BY_VALUE_SCALARS]


def _lowering_steps(thread_fn: Function) -> list[str]:
    """The steps the tile lowering ran inside itself, in the order they ran: bounds
    proofs feed the GEMM lowering, which then splits, vectorizes and buffers its
    staging (recorded by the lowering in `meta["lowering_passes"]`)."""
    matmul = thread_fn.meta.get("matmul") or {}
    extra = thread_fn.meta.get("lowering_passes", [])
    steps = [p for p in extra if p == "prove_gemm_bounds"]
    if matmul:
        steps += ["lower_matmul"] + (["fuse_epilogue"] if matmul.get("epilogue_regions") else [])
    return steps + [p for p in extra if p != "prove_gemm_bounds"]


def _signature(req: Request, analysis: Analysis, proven: tuple, reserved: frozenset):
    """The generated kernel's argument names: inputs (read buffers, scalars, and the
    passed contents of tracked outputs), outputs (and their written-masks)."""
    used: set[str] = set()

    def unique(base: str) -> str:
        # A Python parameter named like an MSL/C++ keyword is renamed, never refused.
        stem = f"arg_{base}" if base in reserved or base.startswith("_") else base
        out, i = stem, 1
        while out in used:
            i += 1
            out = f"{stem}{i}"
        used.add(out)
        return out

    buffers, inputs, roles = {}, [], []
    tracked = {o for o, p in zip(analysis.outputs, proven) if not p}
    for name in req.param_names:
        spec = req.specs.get(name)
        if spec is None:
            continue
        if spec[0] == "scalar":
            buffers[(name, "scalar")] = unique(name)
            inputs.append(buffers[(name, "scalar")])
            roles.append(["in", name])
        elif name not in analysis.outputs:
            buffers[(name, "read")] = unique(name)
            inputs.append(buffers[(name, "read")])
            roles.append(["in", name])
    for name in analysis.outputs:
        buffers[(name, "out")] = unique(name)
    for name in analysis.outputs:
        if name in tracked:
            buffers[(name, "read")] = unique(f"{name}_in")
            inputs.append(buffers[(name, "read")])
            roles.append(["in", name])
            buffers[(name, "written")] = unique(f"{name}_written")
    outputs = [buffers[(n, "out")] for n in analysis.outputs]
    outputs += [buffers[(n, "written")] for n in analysis.outputs if n in tracked]
    return buffers, inputs, outputs, roles, [n for n in analysis.outputs if n in tracked]
