"""plan_schedule: a Schedule plus what a kernel needs, on a target -> a SchedulePlan.

The plan is decided before lowering and never changed by it: lowering's passes
choose buffering, vectorization and traversal inside the plan's constraints
and record what they materialized in the ExecutionReport.  In the plan,
`vector_width`, `double_buffer` and `num_stages` are constraints for those
passes: None lets them choose, a value is a requirement (or, where the planner
proved a feature impossible, a prohibition with a reason).  `program_order` and
`group_size` say in which order a GEMM's programs take their output tiles.

`KernelTraits` is everything the planner reads about a kernel.  The compiler
computes it from Tile IR; the planner never sees IR, which keeps it a pure
function that is cheap to test for every target.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from ..errors import ScheduleError
from .schedule import Schedule
from .targets import Lowering, MatrixPath, Target

KINDS = ("elementwise", "reduction", "matmul", "fragments")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "int64": 8,
             "uint64": 8, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "bool": 1}
_DEFAULT_SIMDGROUPS = (4, 2, 8, 1, 16, 32)  # automatic GEMM preference, first that tiles


class FragmentShapeError(ScheduleError):
    """The tile is not made of whole fragments of a matrix path."""


class OperandDtypeError(ScheduleError):
    """A matrix path has no operands of the kernel's dtype (at its precision)."""


def dtype_name(dtype) -> str:
    """"float32" for a metile DType, an mx.Dtype or an alias string."""
    name = str(getattr(dtype, "name", dtype))
    name = name.removeprefix("mlx.core.")
    return {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "half": "float16",
            "i32": "int32", "u32": "uint32"}.get(name, name)


@dataclass(frozen=True)
class KernelTraits:
    """What plan_schedule needs to know about one specialized kernel.

    kind:  "elementwise" (scalar lanes), "reduction" (scalar lanes with block
           reductions), "matmul" (the canonical dot-over-K-tiles GEMM) or
           "fragments" (kernel-written 8x8 fragment programs).
    lanes: the traced lane geometry (threads per program) when the kernel fixes
           it: arange/BLOCK for lane kernels, kernel(num_simdgroups=) or NUM_SG.
           None for a GEMM whose geometry the planner may choose.
    tile_shape: (BLOCK_M, BLOCK_N, BLOCK_K) for matmul, (BLOCK,) for lane kernels.
    extents_divisible: per tile axis, whether the problem extent is provably a
           multiple of the tile (True), provably not (False), or unknown (None:
           an unspecialized runtime scalar).
    vector_aligned: whether interior accesses are provably aligned to 4
           elements (contiguous inner axis, row pitches and offsets multiples of 4).
    shared_bytes: threadgroup memory the kernel allocates itself (metile.shared).
    products: matrix products sharing the left operand tile (2: a dual GEMM, whose
           operand stage holds one A tile and two B tiles).
    """

    kind: str
    tile_shape: tuple[int, ...] = ()
    lanes: int | None = None
    operand_dtypes: tuple[str, ...] = ()
    accumulator_dtype: str | None = None
    extents_divisible: tuple[bool | None, ...] = ()
    vector_aligned: bool | None = None
    relaxed_precision: bool = False
    uses_shared: bool = False
    shared_bytes: int = 0
    epilogue_stores: int = 0
    products: int = 1
    dots: bool = False     # a lane kernel with matrix products that are no whole-tile GEMM

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"KernelTraits: kind must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")
        object.__setattr__(self, "tile_shape", tuple(int(t) for t in self.tile_shape))
        object.__setattr__(self, "operand_dtypes",
                           tuple(dtype_name(d) for d in self.operand_dtypes))
        if self.accumulator_dtype is not None:
            object.__setattr__(self, "accumulator_dtype", dtype_name(self.accumulator_dtype))
        if self.kind == "matmul" and len(self.tile_shape) != 3:
            raise ValueError("KernelTraits: a matmul needs tile_shape (BLOCK_M, BLOCK_N, BLOCK_K), "
                             f"got {self.tile_shape}")
        if self.kind == "matmul" and not self.operand_dtypes:
            raise ValueError("KernelTraits: a matmul needs operand_dtypes")
        if self.kind in ("elementwise", "reduction") and self.lanes is None:
            raise ValueError(f"KernelTraits: a {self.kind} kernel needs its traced lanes")
        if any(t <= 0 for t in self.tile_shape):
            raise ValueError(f"KernelTraits: tile_shape must be positive, got {self.tile_shape}")

    @property
    def has_dot(self) -> bool:
        return self.kind in ("matmul", "fragments")

    def divisible(self, axis: int) -> bool | None:
        return self.extents_divisible[axis] if axis < len(self.extents_divisible) else None


@dataclass(frozen=True)
class SchedulePlan:
    """Immutable pre-lowering decisions; field names match the recorded report format."""

    backend: str
    threadgroup_size: tuple[int, int, int]
    simdgroup_grid: tuple[int, int] | None
    tile_shape: tuple[int, ...]
    staging: str
    vector_width: int | None
    double_buffer: bool | None
    reasons: tuple[str, ...]
    cooperative_layout: str
    outer_bounds_proven: bool
    # Added after the recorded format (optional in REPORT_SCHEMA; older plans read back
    # with these defaults).
    num_stages: int | None = None
    program_order: str = "linear"
    group_size: int | None = None

    @property
    def num_simdgroups(self) -> int:
        if self.simdgroup_grid is not None:
            return prod(self.simdgroup_grid)
        return -(-prod(self.threadgroup_size) // 32)

    def to_dict(self) -> dict:
        grid = self.simdgroup_grid
        return {"backend": self.backend, "threadgroup_size": list(self.threadgroup_size),
                "simdgroup_grid": None if grid is None else list(grid),
                "tile_shape": list(self.tile_shape), "staging": self.staging,
                "vector_width": self.vector_width, "double_buffer": self.double_buffer,
                "reasons": list(self.reasons), "cooperative_layout": self.cooperative_layout,
                "outer_bounds_proven": self.outer_bounds_proven,
                "num_stages": self.num_stages, "program_order": self.program_order,
                "group_size": self.group_size}

    @classmethod
    def from_dict(cls, d: dict) -> "SchedulePlan":
        grid = d["simdgroup_grid"]
        return cls(d["backend"], tuple(d["threadgroup_size"]),
                   None if grid is None else tuple(grid), tuple(d["tile_shape"]), d["staging"], d["vector_width"], d["double_buffer"],
                   tuple(d["reasons"]), d["cooperative_layout"], d["outer_bounds_proven"],
                   d.get("num_stages"), d.get("program_order", "linear"), d.get("group_size"))


def plan_schedule(traits: KernelTraits, target: Target, schedule: Schedule | None = None,
                  lowering: Lowering | None = None) -> SchedulePlan:
    """The plan for `traits` on `target` honouring every explicit field of `schedule`,
    or a ScheduleError naming the first requirement that cannot be honoured.
    `lowering`: what the code generators implement (None: the hardware alone)."""
    schedule = Schedule() if schedule is None else schedule
    if traits.kind == "matmul":
        return _plan_matmul(traits, target, schedule, lowering)
    if traits.kind == "fragments":
        return _plan_fragments(traits, target, schedule)
    return _plan_lanes(traits, target, schedule)


# -- lane kernels (elementwise, reduction) -------------------------------------------------

def _lane_geometry(traits: KernelTraits, target: Target, s: Schedule, backend: str) -> tuple:
    lanes = traits.lanes
    if lanes > target.max_threads_per_threadgroup:
        raise ScheduleError(f"backend={backend!r}",
                            f"the traced geometry has {lanes} lanes; {target.name} allows at most "
                            f"{target.max_threads_per_threadgroup} threads per threadgroup")
    if s.num_simdgroups is not None and s.num_simdgroups * target.simd_width != lanes:
        wanted = s.num_simdgroups * target.simd_width
        raise ScheduleError(s.requirement("num_simdgroups"),
                            f"{s.num_simdgroups} SIMD-groups are {wanted} lanes, but the kernel's "
                            f"traced lane geometry is {lanes} lanes; {traits.kind} kernels keep the "
                            "geometry they were traced with")
    return (lanes, 1, 1)


def _kernel_staging(traits: KernelTraits, s: Schedule) -> str:
    """Staging of kernels that manage their own memory: it must match what they declare."""
    actual = "threadgroup" if traits.uses_shared else "device"
    if s.staging not in ("auto", actual):
        has = ("allocates threadgroup memory (shared())" if traits.uses_shared else
               "allocates no threadgroup memory of its own (shared())")
        scratch = (" - its block reductions' partials use threadgroup scratch whatever the "
                   "staging, which is not a staging of the kernel's data"
                   if traits.kind == "reduction" and not traits.uses_shared else "")
        raise ScheduleError(s.requirement("staging"),
                            "staging must match the kernel's memory operations; "
                            f"this {traits.kind} kernel {has}{scratch}")
    return actual


def _plan_lanes(traits: KernelTraits, target: Target, s: Schedule) -> SchedulePlan:
    if s.backend not in ("auto", "elementwise"):
        # (a kernel with dots was told it "contains no dot")
        what = ("has dots, but no whole-tile GEMM a matrix backend lowers (8x8 fragment "
                "products take backend 'simdgroup_inline')" if traits.dots else
                "contains no dot for a matrix backend")
        raise ScheduleError(s.requirement("backend"),
                            f"this {traits.kind} kernel {what}; it runs on scalar lanes "
                            "(backend 'elementwise')")
    tg = _lane_geometry(traits, target, s, "elementwise")
    staging = _kernel_staging(traits, s)
    if s.double_buffer:
        raise ScheduleError("double_buffer=True",
                            f"this {traits.kind} kernel has no staged K-loop to double buffer")
    _no_gemm_controls(s, f"this {traits.kind} kernel")
    reasons = ["Lanes follow the geometry traced from the kernel (arange/BLOCK or num_simdgroups)."]
    if traits.dots:
        reasons.append("Its dots are no whole-tile GEMM: the lanes compute them "
                       "(Schedule(backend='simdgroup_inline') puts 8x8 fragment products on "
                       f"{target.group_word} matrices).")
    if traits.kind == "reduction":
        reasons.append(f"Block reductions combine per-{target.group_word} partials in "
                       f"{target.shared_word}.")
    if s.vector_width == 4:
        _check_aligned(traits)
        numel = prod(traits.tile_shape) if traits.tile_shape else tg[0]
        per_lane = numel // tg[0]
        if numel % (4 * tg[0]):
            raise ScheduleError("vector_width=4",
                                f"the {numel}-element tile over {tg[0]} lanes gives "
                                f"{numel / tg[0]:g} elements per lane; width 4 needs each lane to "
                                "own whole groups of 4 elements")
        reasons.append(f"Each lane owns {per_lane} elements, loaded as aligned 4-wide vectors; "
                       "masked tails stay scalar.")
    bounds = bool(traits.extents_divisible) and all(d is True for d in traits.extents_divisible)
    return SchedulePlan("elementwise", tg, None, traits.tile_shape or (tg[0],), staging,
                        s.vector_width, s.double_buffer,
                        tuple(reasons), "scalar lanes", bounds)


def _no_gemm_controls(s: Schedule, what: str) -> None:
    """num_stages and the program order act on the GEMM lowering's staged K loop and
    output-tile grid; other kernels have neither, so a request is refused, not ignored."""
    if s.num_stages is not None:
        raise ScheduleError(s.requirement("num_stages"),
                            f"{what} has no staged K loop; operand stages exist only in "
                            "metile's GEMM lowering (a dot over K tiles)")
    if s.program_order == "grouped" or s.group_size is not None:
        named = s.requirement("group_size") if s.group_size is not None else \
            s.requirement("program_order")
        raise ScheduleError(named, f"{what} is not a GEMM; grouped program order remaps the "
                                   "output-tile grid of metile's GEMM lowering only")


def _check_aligned(traits: KernelTraits) -> None:
    if traits.vector_aligned is False:
        # (a transposed operand is contiguous along K, not along its tile's inner axis: no
        # size makes it 4-wide, so the advice to pass multiples of 4 did not apply)
        raise ScheduleError("vector_width=4", "an interior access cannot be an aligned 4-wide "
                                              "load (misaligned, or not contiguous along its "
                                              "tile's inner axis, as a transposed operand "
                                              "is); use vector_width=None")
    if traits.vector_aligned is not True:
        raise ScheduleError("vector_width=4", "alignment of the interior accesses is not "
                                              "provable (ragged or unspecialized extents, "
                                              "strides or offsets); pass sizes that are "
                                              "multiples of 4 with Schedule(...) so they "
                                              "specialize, or use vector_width=None")


# -- kernel-written fragments (simdgroup_inline) --------------------------------------------

def _plan_fragments(traits: KernelTraits, target: Target, s: Schedule) -> SchedulePlan:
    if s.backend not in ("auto", "simdgroup_inline"):
        raise ScheduleError(s.requirement("backend"),
                            "this kernel computes its own 8x8 fragment products, which only "
                            "backend 'simdgroup_inline' lowers")
    path = target.matrix_path("simdgroup_inline")
    if path is None:
        raise _missing_backend("simdgroup_inline", target)
    if traits.lanes is None or traits.lanes % target.simd_width:
        raise ScheduleError("backend='simdgroup_inline'",
                            f"the traced lane geometry ({traits.lanes} lanes) must be a multiple "
                            f"of {target.simd_width}: each SIMD-group owns whole fragments")
    tg = _lane_geometry(traits, target, s, "simdgroup_inline")
    for d in dict.fromkeys(traits.operand_dtypes):
        _check_dtype(path, d, traits.relaxed_precision, target)
    _check_accumulator(traits, "simdgroup_inline")
    if s.vector_width == 4:
        raise ScheduleError("vector_width=4", "simdgroup_inline kernels place their own loads; "
                                              "forced vectorization is unsupported")
    if s.double_buffer:
        raise ScheduleError("double_buffer=True", "simdgroup_inline kernels stage memory "
                                                  "explicitly; automatic double buffering is "
                                                  "unsupported")
    _no_gemm_controls(s, "this simdgroup_inline kernel (it stages memory and places its "
                         "programs itself)")
    staging = _kernel_staging(traits, s)
    _check_capacity(traits.shared_bytes, target, s.requirement("staging") if s.staging != "auto"
                    else "backend='simdgroup_inline'", "the kernel's shared allocations")
    g = target.group_word
    reasons = (f"Each {g} owns opaque 8x8 register fragments; dot is a {g} matrix "
               "multiply-accumulate with a float32 accumulator.",
               f"The kernel assigns work to {g}s; no whole-GEMM grid is placed.")
    return SchedulePlan("simdgroup_inline", tg, None, (8, 8), staging, s.vector_width,
                        s.double_buffer, reasons,
                        path.layout, all(d is True for d in traits.extents_divisible)
                        if traits.extents_divisible else False)


# -- canonical GEMM -------------------------------------------------------------------------

def _not_lowered(backend: str, target: Target) -> str:
    return (f"metile does not lower {backend} yet (not implemented; {target.name} supports it, "
            "metile's GEMM lowering emits simdgroup fragments)")


def _plan_matmul(traits: KernelTraits, target: Target, s: Schedule,
                 lowering: Lowering | None) -> SchedulePlan:
    if s.backend in ("elementwise", "simdgroup_inline"):
        raise ScheduleError(s.requirement("backend"),
                            f"this kernel is a whole-tile GEMM (dot over K tiles); backend "
                            f"{s.backend!r} does not lower it; use simdgroup, tensor_ops or nax")
    if s.backend != "auto":
        path = target.matrix_path(s.backend)
        if path is None:
            raise _missing_backend(s.backend, target)
        if lowering is not None and not lowering.plans(s.backend):
            raise ScheduleError(s.requirement("backend"), _not_lowered(s.backend, target))
        return _matmul_with(path, traits, target, s, explicit=True, lowering=lowering)
    skipped, errors = [], []
    for path in target.matrix_paths:
        if path.backend == "simdgroup_inline":
            continue
        if lowering is not None and not lowering.plans(path.backend):
            skipped.append(f"{path.backend} not selected: {_not_lowered(path.backend, target)}.")
            continue
        try:
            plan = _matmul_with(path, traits, target, s, explicit=False, lowering=lowering)
        except ScheduleError as e:
            skipped.append(f"{path.backend} not selected: {e.reason}.")
            errors.append(e)
            continue
        return _with_reasons(plan, skipped + list(plan.reasons))
    # A path refusing the dtype does not stand in the way of the scalar fallback (apple10's
    # nax refuses strict float32 where its tensor_ops and simdgroup paths refuse the tile)
    if any(isinstance(e, FragmentShapeError) for e in errors) and \
            all(isinstance(e, (FragmentShapeError, OperandDtypeError)) for e in errors):
        return _scalar_matmul(traits, target, s, skipped)
    raise errors[-1] if errors else _missing_backend("simdgroup", target)


def _scalar_matmul(traits: KernelTraits, target: Target, s: Schedule, skipped: list[str]
                   ) -> SchedulePlan:
    """Automatic fallback when no matrix unit fits the tile: each thread keeps a
    register micro-tile and multiplies with scalar FMAs (staged operands)."""
    nsg = s.num_simdgroups or (traits.lanes // target.simd_width if traits.lanes else 4)
    threads = nsg * target.simd_width
    if threads > target.max_threads_per_threadgroup:
        raise ScheduleError(s.requirement("num_simdgroups"),
                            f"{threads} threads exceed {target.name}'s limit of "
                            f"{target.max_threads_per_threadgroup}")
    bm, bn, bk = traits.tile_shape
    reasons = skipped + ["No matrix unit fits the tile: threads multiply register micro-tiles "
                         "with scalar FMAs."]
    # The FFMA lowering always stages operands, and stages them like the fragment path.
    staging, vw, db, stages = _controllable(traits, target, s, reasons, Lowering(),
                                            scalar_fma=True)
    order, group = _program_order(s, reasons)
    bounds = traits.divisible(0) is True and traits.divisible(1) is True
    return SchedulePlan("elementwise", (threads, 1, 1), None, (bm, bn, bk), staging, vw, db,
                        tuple(reasons), "scalar FMA register micro-tiles", bounds, stages,
                        order, group)


def _with_reasons(plan: SchedulePlan, reasons: list[str]) -> SchedulePlan:
    return replace(plan, reasons=tuple(reasons))


def _missing_backend(backend: str, target: Target) -> ScheduleError:
    return ScheduleError(f"backend={backend!r}",
                         f"target {target.name} ({target.description}) has no {backend} backend; "
                         f"it supports {', '.join(target.backends)}")


def _scalar_fma(path: MatrixPath, dtype: str, relaxed: bool) -> bool:
    """`dtype` operands run as scalar FMAs: strict precision the matrix unit would round."""
    return dtype not in path.dtypes and dtype in path.fallback_dtypes and \
        not (relaxed and dtype in path.relaxed_dtypes)


def _check_dtype(path: MatrixPath, dtype: str, relaxed: bool, target: Target) -> str | None:
    """None when the matrix unit computes `dtype` exactly, else the reason it still runs."""
    if dtype in path.dtypes:
        return None
    if relaxed and dtype in path.relaxed_dtypes:
        return f"Relaxed precision: {dtype} operands run on the matrix unit at reduced precision."
    if _scalar_fma(path, dtype, relaxed):
        how = " (relaxed precision would use the matrix unit)" if dtype in path.relaxed_dtypes \
            else ""
        return f"Strict {dtype} operands use scalar FMA instead of the matrix unit{how}."
    if dtype in path.relaxed_dtypes:
        raise OperandDtypeError(f"backend={path.backend!r}",
                            f"{path.backend} computes {dtype} products at reduced precision on "
                            f"{target.name}; it needs RELAXED_PRECISION=True")
    allowed = ", ".join(path.dtypes + path.relaxed_dtypes)
    raise OperandDtypeError(f"backend={path.backend!r}",
                            f"{path.backend} on {target.name} has no {dtype} matrix operands "
                            f"(supports {allowed})")


def _check_accumulator(traits: KernelTraits, backend: str) -> None:
    if traits.accumulator_dtype not in (None, "float32"):
        raise ScheduleError(f"backend={backend!r}",
                            f"accumulator dtype {traits.accumulator_dtype}: matrix backends "
                            "accumulate in float32")


def _check_capacity(nbytes: int, target: Target, requirement: str, what: str) -> None:
    if nbytes > target.threadgroup_memory_bytes:
        raise ScheduleError(requirement, f"{what} need {nbytes} bytes of {target.shared_word}; "
                                         f"{target.name} has {target.threadgroup_memory_bytes}")


def _factor_grid(nsg: int, bm: int, bn: int, fm: int, fn: int) -> tuple[int, int] | None:
    """SIMD-group grid (rows, columns) splitting a bm x bn tile into whole fragments,
    preferring square per-SIMD-group tiles."""
    options = [(wm, nsg // wm) for wm in range(1, nsg + 1)
               if nsg % wm == 0 and bm % (wm * fm) == 0 and bn % ((nsg // wm) * fn) == 0]
    if not options:
        return None
    return min(options, key=lambda g: (abs(bm // g[0] - bn // g[1]), -g[0]))


def _matmul_with(path: MatrixPath, traits: KernelTraits, target: Target, s: Schedule,
                 explicit: bool, lowering: Lowering | None = None) -> SchedulePlan:
    name = path.backend
    req = f"backend={name!r}" if explicit else "backend='auto'"
    reasons = []
    if path.opaque:
        # Opaque SDK paths load straight into cooperative tensors: no access of
        # theirs can be forced to a width, and there is no staging to buffer.
        if s.vector_width is not None:
            raise ScheduleError(f"{req} with {s.requirement('vector_width')}",
                                f"{name} accesses are opaque and cannot satisfy an explicit "
                                "vector width")
        if s.double_buffer:
            raise ScheduleError(f"{req} with double_buffer=True",
                                f"{name} loads device memory directly into cooperative tensors; "
                                "no software double buffer can materialize")
        if s.staging == "threadgroup":
            raise ScheduleError(f"{req} with staging='threadgroup'",
                                f"{name} supports only device staging")
        if s.num_stages is not None:
            raise ScheduleError(f"{req} with {s.requirement('num_stages')}",
                                f"{name} loads device memory directly into cooperative tensors; "
                                "there are no operand stages")
    for d in dict.fromkeys(traits.operand_dtypes):
        why = _check_dtype(path, d, traits.relaxed_precision, target)
        if why:
            reasons.append(why)
    scalar_fma = any(_scalar_fma(path, d, traits.relaxed_precision) for d in traits.operand_dtypes)
    _check_accumulator(traits, name)
    bm, bn, bk = traits.tile_shape
    fm, fn, fk = path.fragment_for(traits.operand_dtypes, traits.relaxed_precision)
    if bm % fm or bn % fn or bk % fk:
        raise FragmentShapeError(req, f"the {bm}x{bn}x{bk} tile is not made of whole "
                                      f"{fm}x{fn}x{fk} {name} fragments")

    nsg = s.num_simdgroups
    lanes_nsg = None if traits.lanes is None else traits.lanes // target.simd_width
    if nsg is not None and lanes_nsg is not None and nsg != lanes_nsg:
        raise ScheduleError(s.requirement("num_simdgroups"),
                            f"the kernel fixes {traits.lanes} lanes ({lanes_nsg} SIMD-groups)")
    nsg = nsg if nsg is not None else lanes_nsg
    named_count = nsg is not None
    if nsg is None:
        nsg = next((n for n in _DEFAULT_SIMDGROUPS if _factor_grid(n, bm, bn, fm, fn)), None)
    multiplying = nsg
    ws = None if scalar_fma or not named_count else _warpgroup_unit(traits, target)
    if ws is not None:
        multiplying = nsg - ws.producer_threads // target.simd_width   # copiers hold no fragments
    grid = None if nsg is None or multiplying < 1 else _factor_grid(multiplying, bm, bn, fm, fn)
    if grid is None:
        named = s.requirement("num_simdgroups") if s.num_simdgroups is not None else req
        error = FragmentShapeError if s.num_simdgroups is None else ScheduleError
        raise error(named, f"no SIMD-group grid WM x WN = {nsg} divides the {bm}x{bn} tile "
                           f"into whole {fm}x{fn} fragments")
    threads = nsg * target.simd_width
    if threads > target.max_threads_per_threadgroup:
        raise ScheduleError(s.requirement("num_simdgroups"),
                            f"{threads} threads exceed {target.name}'s limit of "
                            f"{target.max_threads_per_threadgroup}")

    if path.opaque:
        staging = "device"
        dtypes = "/".join(dict.fromkeys(traits.operand_dtypes))
        reasons += [f"{path.summary} accept {dtypes} operands, the {bm}x{bn}x{bk} tile and the "
                    f"{grid[0]}x{grid[1]} SIMD-group grid.",
                    "Operands go from device memory straight into register cooperative tensors.",
                    "The SDK does not expose which lane owns which element."]
        # (an explicit double_buffer=False is honoured - there is no software double buffer -
        # and recorded as asked; it was recorded as automatic, None)
        vw, db, stages = None, (False if s.double_buffer is False else None), None
    else:
        g = target.group_word
        if not scalar_fma:
            reasons.insert(0, f"{path.summary} on a {grid[0]}x{grid[1]} "
                              f"{g} grid ({bm // grid[0]}x{bn // grid[1]} per {g}).")
        unit = None if scalar_fma else path.unit_for(traits.operand_dtypes,
                                                     traits.relaxed_precision)
        wg = None if scalar_fma else _warpgroup_unit(traits, target)
        if wg is not None and not _warpgroup_accumulators_fit(
                traits, multiplying if named_count else None):
            wg = None   # the lowering takes the warp MMA (passes/lower_matmul._warpgroup_plan)
        if not scalar_fma and traits.products > 1 and wg is None and \
                _warpgroup_unit(replace(traits, products=1), target) is not None:
            reasons.append(f"Dual GEMM ({traits.products} products sharing the left operand): "
                           f"the warp MMA: on the warpgroup MMA the {traits.products} "
                           f"products' accumulator tiles would need more than "
                           f"{WGMMA_MAX_ACCUMULATORS} floats per thread (at most "
                           f"{WGMMA_DUAL_COLUMNS} columns together, on 64 rows per warpgroup).")
        elif wg is not None and traits.products > 1:
            reasons.append(f"Dual GEMM ({traits.products} products sharing the left operand): "
                           "each K step stages the left tile once and issues each product's "
                           "warpgroup MMAs on it, into one accumulator tile per product.")
        staged_on = target
        if wg is not None:
            # The warpgroup path lays out its own dynamic shared memory: stages up to the
            # block's opt-in limit.
            unit = wg
            staged_on = replace(target, threadgroup_memory_bytes=target.shared_memory_optin_bytes)
            reasons.insert(0, f"Warpgroup MMA ({wg.name}, {wg.arch}) when both operand loads "
                              "are contiguous: 128-thread warpgroups own 64-row slices of the "
                              "tile, operands read from 128-byte-swizzled shared memory.")
        staging, vw, db, stages = _controllable(traits, staged_on, s, reasons, lowering,
                                                scalar_fma, unit)
    order, group = _program_order(s, reasons)
    bounds = traits.divisible(0) is True and traits.divisible(1) is True
    layout = "scalar FMA register micro-tiles (per-thread)" if scalar_fma else path.layout
    return SchedulePlan(name, (threads, 1, 1), None if scalar_fma else grid, (bm, bn, bk), staging,
                        vw, db, tuple(reasons), layout, bounds, stages, order, group)


DEFAULT_GROUP_SIZE = 8
# The widest accumulator tile a warpgroup holds in registers (one m64n256 product):
# a dual GEMM's products share it.
WGMMA_DUAL_COLUMNS = 256
# Float accumulators one thread may hold for warpgroup products (the rest of the
# 255-register budget holds addresses and the epilogue); the lowering reads it too.
WGMMA_MAX_ACCUMULATORS = 128


def _warpgroup_unit(traits, target: Target):
    """The target's warpgroup MMA unit when it takes these operands and this tile."""
    from .. import settings
    from .targets import units_for
    if traits.products > 1 and traits.products * traits.tile_shape[1] > WGMMA_DUAL_COLUMNS:
        # each product's accumulators stay in registers: together at most one m64n256
        # product's (128 floats per thread with a warpgroup per 64 rows)
        return None
    for u in units_for(target.language, target.name, settings.wgmma_variant()):
        if u.warpgroup and u.fits_tile(traits.tile_shape) and \
                target.shared_memory_optin_bytes and \
                all(u.takes(d, traits.relaxed_precision) for d in traits.operand_dtypes):
            return u
    return None


def _warpgroup_accumulators_fit(traits, warps: int | None) -> bool:
    """Whether some warpgroup count keeps every product's accumulators within the
    lowering's register budget (WGMMA_MAX_ACCUMULATORS floats per thread): `warps`
    multiplying warps when the kernel names them, else any of 4, 2 or 1 warpgroups
    (passes/lower_matmul._warpgroup_plan decides the same way)."""
    bm, bn, _ = traits.tile_shape
    rows = bm // 64
    if warps is not None:
        options = [warps // 4] if warps % 4 == 0 else []
    else:
        options = [w for w in (4, 2, 1) if w <= rows]
    return any(w >= 1 and rows % w == 0 and
               traits.products * (rows // w) * bn // 2 <= WGMMA_MAX_ACCUMULATORS
               for w in options)


def _program_order(s: Schedule, reasons: list[str]) -> tuple[str, int | None]:
    """The order in which a GEMM's programs take output tiles (applied by the lowering:
    passes/lower_matmul.py remaps program ids at kernel entry)."""
    if s.program_order == "linear" or (s.program_order == "auto" and s.group_size is None):
        how = "required" if s.program_order == "linear" else (
            "the automatic default: grouped order was not measured on a GPU when it was "
            "built, so the default stays the order measured so far")
        reasons.append(f"Programs take output tiles in launch order (program_order='linear', "
                       f"{how}).")
        return "linear", None
    group = s.group_size or DEFAULT_GROUP_SIZE
    reasons.append(f"Grouped program order: consecutive programs take {group} output tiles along "
                   "grid axis 0 for each step along axis 1, so programs running together share "
                   f"operand panels in cache (program ids remapped at kernel entry; group_size="
                   f"{group}{'' if s.group_size else ', the default'}).")
    return "grouped", group


def _ffma_async_copies(target: Target) -> bool:
    """Whether scalar-FMA float32 GEMMs on `target` stage through the cp.async ring
    (targets.ffma_async_copies: the target's warp MMA copies asynchronously)."""
    from .targets import ffma_async_copies, units_for
    return ffma_async_copies(units_for(target.language, target.name, None))


def _path_words(target: Target, unit, scalar_fma: bool) -> str:
    what = "scalar FMA" if scalar_fma or unit is None else unit.name
    return f"the ordinary-load staged GEMM path ({what} on {target.name})"


def _controllable(traits, target, s, reasons, lowering=None, scalar_fma=False, unit=None):
    """Staging, vector width, double buffering and operand stage count of staged GEMM
    operands (loaded into per-thread registers with `scalar_fma`, else into the matrix
    unit's fragments).  A unit with asynchronous copies stages through a ring of up to 5
    stages (passes/gemm_async.py); the ordinary-load paths have 1 or 2 (double buffering)."""
    bm, bn, bk = traits.tile_shape
    itemsize = max(_ITEMSIZE.get(d, 4) for d in traits.operand_dtypes)
    products = traits.products
    stage = (bm * bk + products * bk * bn) * itemsize
    tiles = f"{bm}x{bk} + {bk}x{bn}" if products == 1 else f"{bm}x{bk} + {products} {bk}x{bn}"
    n = s.num_stages
    if s.double_buffer is True and n not in (None, 2):
        raise ScheduleError(f"double_buffer=True with num_stages={n}",
                            "double buffering is exactly 2 operand stages")
    if s.double_buffer is False and n is not None and n > 1:
        raise ScheduleError(f"double_buffer=False with num_stages={n}",
                            f"{n} operand stages buffer the next K step while the current one "
                            "is multiplied; double_buffer=False allows only num_stages=1")
    copies = (unit is not None and unit.async_copy and not scalar_fma) or \
        (scalar_fma and itemsize == 4 and _ffma_async_copies(target))
    ring = bool(copies and s.vector_width != 4 and not s.double_buffer)
    if n is not None and n > 2 and not ring:
        why = ("vector_width=4 selects ordinary 4-wide loads" if s.vector_width == 4 and copies
               else "double_buffer=True selects ordinary loads" if s.double_buffer and copies
               else "only CUDA's mma.sync units and strict float32 on CUDA stage with "
               "asynchronous copies")
        raise ScheduleError(s.requirement("num_stages"),
                            f"more than 2 operand stages are not implemented for "
                            f"{_path_words(target, unit, scalar_fma)}: it has single staging or "
                            f"double buffering (num_stages 1 or 2); {why}")
    # On the ordinary-load paths 2 stages are the double_buffer_staging pass and 1 stage
    # prohibits it; on a ring the count goes to the lowering as is.
    want_db = s.double_buffer
    if want_db is None and n is not None and not ring:
        want_db = n == 2
    if n == 1:
        want_db = False
    if s.vector_width == 4 and want_db:
        named = "double_buffer=True" if s.double_buffer else s.requirement("num_stages")
        raise ScheduleError(f"vector_width=4 with {named}",
                            "4-wide staging loads and software double buffering cannot currently "
                            "be combined")
    staging = s.staging
    if staging == "device" and (s.vector_width == 4 or s.double_buffer or n is not None):
        what = "vector_width=4" if s.vector_width == 4 else "double_buffer=True" \
            if s.double_buffer else s.requirement("num_stages")
        raise ScheduleError(f"staging='device' with {what}",
                            f"{what} acts on threadgroup staging copies; device staging has none")
    staged_only = lowering is not None and not lowering.device_staged_gemm
    if staging == "device" and staged_only:
        raise ScheduleError(s.requirement("staging"),
                            "metile's GEMM lowering stages operands through "
                            f"{target.shared_word}; fragments loaded straight from device memory "
                            "are not implemented")
    if staging == "auto":
        fits = stage + traits.shared_bytes <= target.threadgroup_memory_bytes
        staging = "threadgroup" if fits or s.vector_width == 4 or s.double_buffer or \
            n is not None or staged_only else "device"
        if staging == "device":
            reasons.append(f"A {stage}-byte operand stage does not fit {target.name}'s "
                           f"{target.shared_word}; fragments load directly from device memory.")
    if staging == "threadgroup":
        # (what was asked: the staging, a backend, or - asking for neither - the tile itself;
        # "backend='simdgroup'" was named to a launch that named no backend)
        bm, bn, bk = traits.tile_shape
        asked = s.requirement("staging") if s.staging != "auto" else \
            s.requirement("backend") if s.backend != "auto" else f"the {bm}x{bn}x{bk} tile"
        _check_capacity(stage + traits.shared_bytes, target, asked,
                        f"one {tiles} operand stage and the kernel's allocations")
        into = "per-thread registers" if scalar_fma else f"{target.group_word} fragments"
        reasons.append(f"Operand tiles are staged through {target.shared_word} ({stage} bytes "
                       f"per stage) and loaded into {into}.")
    if n is not None and staging == "threadgroup":
        _check_capacity(n * stage + traits.shared_bytes, target, s.requirement("num_stages"),
                        f"{n} operand stages of {stage} bytes and the kernel's allocations")
    db = want_db
    if db:
        named = "double_buffer=True" if s.double_buffer else s.requirement("num_stages")
        _check_capacity(2 * stage + traits.shared_bytes, target, named,
                        "two operand stages and the kernel's allocations")
        reasons.append("Software double buffering is required: two stages alternate over K; "
                       "the next stage is loaded with ordinary loads (no asynchronous copies) "
                       "while the current one is multiplied, one barrier per step"
                       + ("." if s.double_buffer else f" ({named} on this path)."))
    elif db is None and staging == "threadgroup" and \
            2 * stage + traits.shared_bytes > target.threadgroup_memory_bytes:
        db = False
        reasons.append(f"Two {stage}-byte stages exceed {target.name}'s {target.shared_word}; "
                       "double buffering is prohibited.")
    stages = _stage_count(traits, target, s, reasons, stage, staging, db, ring, scalar_fma)
    vw = s.vector_width
    if vw == 4:
        _check_aligned(traits)
        reasons.append("Aligned interior staging loads are 4-wide; masked tails stay scalar.")
    if not (traits.divisible(0) is True and traits.divisible(1) is True):
        reasons.append("Row/column tiles are not proven complete; edge loads and stores keep "
                       "their bounds checks.")
    return staging, vw, db, stages


def _stage_count(traits, target, s, reasons, stage, staging, db, ring,
                 scalar_fma: bool = False) -> int | None:
    """The plan's num_stages: the requirement (explicit, or implied by double_buffer), the
    count the ordinary-load path will use, or None when the lowering picks the ring depth."""
    if staging != "threadgroup":
        return None
    n = s.num_stages
    if n is None and db is not None:
        n = 2 if db else 1
    if ring:
        if n is None:
            from .targets import ring_depth, ring_depth_limit
            room = target.threadgroup_memory_bytes - traits.shared_bytes
            auto = ring_depth(room, stage, scalar_fma)
            most = ring_depth_limit(scalar_fma)
            reasons.append(f"Operand stages are the lowering's choice: a ring of as many "
                           f"{stage}-byte stages as fit {target.shared_word} (2 to {most}; {auto} "
                           "here) filled by 16-byte asynchronous copies (cp.async) when both "
                           "operand loads are contiguous, else one stage with ordinary loads.")
        elif n >= 2:
            reasons.append(f"num_stages={n} is required: a ring of {n} {stage}-byte "
                           f"{target.shared_word} stages filled by 16-byte asynchronous copies "
                           "(cp.async); operand loads the copies cannot take are refused.")
        else:
            reasons.append("One operand stage (num_stages=1): ordinary loads, no asynchronous "
                           "copies; each K step copies, synchronises and multiplies.")
        return n
    if n is None:
        n = 1
        reasons.append("One operand stage (the automatic choice of the ordinary-load path; "
                       "num_stages=2 or double_buffer=True double-buffers).")
    elif n == 1 and s.num_stages == 1:
        reasons.append("One operand stage (num_stages=1 is required): each K step copies, "
                       "synchronises and multiplies.")
    return n
