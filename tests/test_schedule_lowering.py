"""Lowering honours the schedule plan through named passes (issue 5, item 3):
GEMM bounds proofs, K-loop splitting into complete and remainder iterations,
4-wide aligned staging loads and two-stage software double buffering.

Numerical tests run the MSL on the CPU runtime against NumPy (float64 from the
rounded operands; strict FP32 output tolerance rtol=3e-4, atol=3e-5).  Source-
text tests name an emitter with backend= and never launch, so the CUDA
checks run here too.  Tiles are 32x32x16 to keep each compile small; every
launch with a Schedule specializes its sizes, so each shape is one compile.
"""

import json
import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError, Schedule
from metile.schedule import ScheduleError
from metile.passes.gemm import find_gemm
from metile.passes.gemm_bounds import prove_gemm_bounds, staging_load
from metile.passes.vectorize_elementwise import vectorizable
from metile_kernels.gemm import grid, matmul, matmul_epilogue
from test_gemm import check, operands

TILE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
RAGGED = (75, 45, 37)      # edge tiles on both axes, a 5-deep K remainder
ALIGNED4 = (72, 40, 44)    # ragged against the tile but every row stride a multiple of 4


def prepare(rng, m, n, k, dtype="float32", schedule=None, backend=None):
    a, b, ref = operands(rng, m, n, k, dtype)
    extra = {} if schedule is None else {"SCHEDULE": schedule}
    d = matmul[grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), m, n, k, **TILE, **extra,
                                           backend=backend)
    return d, ref


def kinds(report):
    return [lp.kind for lp in report.loops if lp.induction_variable == "k"]


def stage_bytes(report):
    return {a.name[:3]: a.bytes for a in report.allocations}


# -- numerics: ragged GEMMs with and without double buffering --------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("double_buffer", [False, True])
def test_ragged_gemm_matches_numpy(rng, dtype, double_buffer):
    d, ref = prepare(rng, *RAGGED, dtype, Schedule(double_buffer=double_buffer))
    check(d(), ref)
    report = d.execution_report
    if "async_pipeline_staging" in report.passes:
        # CUDA, 16-bit operands, no stage count required: cp.async through a ring of
        # stages (passes/gemm_async.py; tests/test_gemm_async.py checks its structure)
        assert not double_buffer and dtype != "float32"
        assert "prove_gemm_bounds" in report.passes
        assert d.variant.data["lowering"]["matmul"]["stages"] >= 2
        return
    assert {"prove_gemm_bounds", "split_k_loop"} <= set(report.passes)
    assert ("double_buffer_staging" in report.passes) is double_buffer
    assert report.double_buffered is double_buffer
    assert kinds(report)[-1] == "remainder" and "interior" in kinds(report)
    itemsize = 4 if dtype == "float32" else 2
    stages = 2 if double_buffer else 1
    assert stage_bytes(report)["_sa"] == stages * 32 * 16 * itemsize
    assert stage_bytes(report)["_sb"] == stages * 16 * 32 * itemsize
    assert d.variant.data["lowering"]["matmul"]["stages"] == stages


@pytest.mark.parametrize("schedule,shape", [(Schedule(double_buffer=True), (77, 43, 37)),
                                            (Schedule(vector_width=4), (76, 44, 44))])
def test_ffma_path_honours_the_plan(monkeypatch, tmp_path, rng, schedule, shape):
    # CUDA's strict-float32 GEMM multiplies register micro-tiles with FFMA; hiding the
    # MSL matrix unit runs that path here.  Own cache directory and shapes: no other
    # test may pick these specializations up.
    import metile.schedule.targets as targets
    monkeypatch.setitem(targets.MATRIX_UNITS, "msl", ())
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    d, ref = prepare(rng, *shape, schedule=schedule)
    check(d(), ref)
    assert d.variant.data["lowering"]["matmul"]["fragment"] == "ffma"
    report = d.execution_report
    assert report.double_buffered is bool(schedule.double_buffer)
    assert (report.vectorized_loads > 0) is (schedule.vector_width == 4)


@pytest.mark.parametrize("shape", [(20, 12, 7), (64, 64, 48)])
def test_double_buffering_edge_cases(rng, shape):
    # Only a remainder tile (K < BLOCK_K, no interior output tile); only complete tiles.
    d, ref = prepare(rng, *shape, schedule=Schedule(double_buffer=True))
    check(d(), ref)
    report = d.execution_report
    assert report.double_buffered
    expected = {"remainder"} if shape[2] < 16 else {"interior"}
    assert set(kinds(report)) == expected


def test_fused_epilogue_with_double_buffering(rng):
    m, n, k = RAGGED
    a, b, ref = operands(rng, m, n, k, "float16")
    d = matmul_epilogue[grid(m, n, 32, 32)].prepare(
        a, b, mx.zeros((m, n)), m, n, k, 1.25, -0.5, **TILE, EPILOGUE="affine_leaky",
        SCHEDULE=Schedule(double_buffer=True))
    s = ref * 1.25 - 0.5
    check(d(), np.where(s > 0, s, s * 0.1))
    assert d.execution_report.double_buffered and d.execution_report.epilogue_regions == 1
    assert "fuse_epilogue" in d.execution_report.passes


def test_without_a_schedule_every_guard_stays(rng):
    d, ref = prepare(rng, *RAGGED)
    check(d(), ref)
    report = d.execution_report
    assert "prove_gemm_bounds" not in report.passes and "split_k_loop" not in report.passes
    assert kinds(report) == ["loop"]


# -- bounds proofs ------------------------------------------------------------------------------

def proofs(rng, m, n, k):
    d, _ = prepare(rng, m, n, k, schedule=Schedule())
    fn = d.spec.tile_ir()
    g = find_gemm(fn)
    return prove_gemm_bounds(fn, g, {"rows": m, "columns": n, "inner": k}), g


def names(conjuncts):
    """Which extent each unproven conjunct compares against."""
    out = set()
    for c in conjuncts:
        bound = c.owner.operands[1].owner.operands[0]   # lt(x, splat(extent))
        out.add(bound.hint or repr(bound))
    return out


def test_aligned_k_never_drops_row_and_column_checks(rng):
    # K is a multiple of BLOCK_K: every K conjunct is proven; rows (70) and columns (50)
    # are ragged, so edge tiles keep their row/column guards.
    b, g = proofs(rng, 70, 50, 32)
    assert (b.n_full, b.has_remainder) == (2, False)
    assert b.p_max == {0: 1, 1: 0}           # row tiles 0-1 and column tile 0 are interior
    a_load, b_load = staging_load(g.a), staging_load(g.b)
    interior = b.interior_facts
    assert b.remaining(a_load, interior) == [] and b.remaining(b_load, interior) == []
    edge = b.with_edge(interior)
    assert len(b.remaining(a_load, edge)) == 1    # the row check of A
    assert len(b.remaining(b_load, edge)) == 1    # the column check of B
    remainder = b.with_edge(b.remainder_facts)
    assert len(b.remaining(a_load, remainder)) == 2   # a remainder keeps the K check too


def test_edge_tiles_keep_guards_in_the_source(rng):
    d, _ = prepare(rng, 70, 50, 32, schedule=Schedule(), backend="msl")
    src = d.source
    # One uniform interior test per threadgroup, then unguarded and guarded copies.
    assert re.search(r"threadgroup_position_in_grid\.x\);\s*const bool \w+ = \(\w+ <= 1\);", src)
    assert re.search(r"= left\[\w+\];", src) and re.search(r"\? left\[\w+\] : 0\.0f\)", src)
    assert re.search(r"= right\[\w+\];", src) and re.search(r"\? right\[\w+\] : 0\.0f\)", src)
    assert d.execution_report.loops[0].kind == "interior"


# -- width 4 ---------------------------------------------------------------------------------------

# The 4-wide load each backend spells (CUDA moves 16-bit types as uint2 bit patterns).
_CUDA_VECTOR = {"float4": "float4", "half4": "uint2", "bfloat4": "uint2"}


def vector_loads(d, vector: str) -> int:
    """The 4-wide loads in a dispatch's source, spelled for the backend it compiled for."""
    if d.variant.backend == "cuda":
        v = _CUDA_VECTOR[vector]
        return len(re.findall(rf"const {v} \w+ = metile_load_vec<{v}>", d.source))
    return len(re.findall(rf"const {vector} \w+ = metile_vload_{vector}\(", d.source))


@pytest.mark.parametrize("dtype,vector", [("float32", "float4"), ("float16", "half4")])
def test_vector_width_four_on_aligned_shapes(rng, dtype, vector):
    d, ref = prepare(rng, *ALIGNED4, dtype, Schedule(vector_width=4))
    check(d(), ref)
    report = d.execution_report
    assert "vectorize_staging" in report.passes
    assert report.vectorized_loads == vector_loads(d, vector) == 2  # one per operand, interior only
    assert [lp.elements_per_lane for lp in report.loops if lp.kind == "interior"][:2] == [4, 4]
    assert kinds(report) == ["interior", "remainder"]
    assert not report.double_buffered


def test_vector_width_four_is_rejected_on_ragged_strides(rng):
    with pytest.raises(CompilationError, match="vector_width=4: an interior access cannot be "
                                               "an aligned 4-wide load"):
        prepare(rng, *RAGGED, schedule=Schedule(vector_width=4))


def test_vector_width_four_without_a_complete_tile_is_rejected(rng):
    with pytest.raises(CompilationError, match="vector_width=4: no output tile is complete"):
        prepare(rng, 8, 8, 8, schedule=Schedule(vector_width=4))
    with pytest.raises(CompilationError, match="vector_width=4: no K step is complete"):
        prepare(rng, 64, 64, 12, schedule=Schedule(vector_width=4))


def test_vector_width_one_emits_no_vector_loads(rng):
    d, _ = prepare(rng, *ALIGNED4, schedule=Schedule(vector_width=1), backend="msl")
    assert d.execution_report.vectorized_loads == 0
    assert "float4" not in d.source and "vectorize_staging" not in d.execution_report.passes


def test_width_four_with_double_buffering_is_rejected(rng):
    with pytest.raises(CompilationError, match="vector_width=4 with double_buffer=True"):
        prepare(rng, *ALIGNED4, schedule=Schedule(vector_width=4, double_buffer=True))


# -- explain() -------------------------------------------------------------------------------------

def test_explain_shows_the_passes_and_loops(rng):
    d, _ = prepare(rng, *RAGGED, schedule=Schedule(double_buffer=True), backend="msl")
    data = json.loads(d.explain())
    passes = data["passes"]
    assert passes.index("prove_gemm_bounds") < passes.index("lower_matmul") < \
        passes.index("split_k_loop") < passes.index("double_buffer_staging")
    assert passes[-2:] == ["verify", "emit_msl"]
    assert data["double_buffered"] is True and data["plan"]["double_buffer"] is True
    k = [lp for lp in data["loops"] if lp["induction_variable"] == "k"]
    assert [lp["kind"] for lp in k] == ["interior", "interior", "remainder"]
    assert all(lp["iteration_step"] == 16 for lp in k)
    assert "No software double buffer was materialized." not in data["notes"]


# -- source text: both backends --------------------------------------------------------------------

def _block_after(src: str, header: str) -> str:
    """The text of the `{ ... }` block that follows `header` (brace-matched)."""
    start = src.index(header)
    i = src.index("{", start)
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[i:j + 1]
    raise AssertionError("unbalanced braces")


@pytest.mark.parametrize("backend,barrier,decl", [
    ("msl", "threadgroup_barrier(mem_flags::mem_threadgroup);", "threadgroup float {}[1024];"),
    ("cuda", "__syncthreads();", "__shared__ float {}[1024];"),
])
def test_double_buffer_source_has_two_stages_and_one_barrier_per_step(rng, backend, barrier, decl):
    d, _ = prepare(rng, 96, 96, 64, schedule=Schedule(double_buffer=True), backend=backend)
    src = d.source
    for name in re.findall(r"(_s[ab]\d+)\[1024\]", src):
        assert decl.format(name) in src                     # 2 x 32x16 float stages
    assert len(re.findall(r"(_s[ab]\d+)\[1024\]", src)) == 2
    loop = re.search(r"for \(int (_k\d+) = 0; \1 < 48; \1 \+= 16\)", src)
    assert loop, "the steady-state loop runs over all but the last complete tile"
    body = _block_after(src, loop.group(0))
    assert body.count(barrier) == 1
    assert d.execution_report.double_buffered


@pytest.mark.parametrize("dtype,pattern", [
    ("float32", r"const float4 \w+ = metile_load_vec<float4>\(&\w+\[\w+\]\);"),
    ("float16", r"const uint2 \w+ = metile_load_vec<uint2>\(&\w+\[\w+\]\);"),
    ("bfloat16", r"const uint2 \w+ = metile_load_vec<uint2>\(&\w+\[\w+\]\);"),
])
def test_cuda_vector_loads(rng, dtype, pattern):
    d, _ = prepare(rng, *ALIGNED4, dtype, Schedule(vector_width=4), backend="cuda")
    assert len(re.findall(pattern, d.source)) == d.execution_report.vectorized_loads == 2
    if dtype != "float32":
        t = "half" if dtype == "float16" else "bfloat16"
        # elements are shifted out of the 32-bit words (no address taken, no local memory)
        assert len(re.findall(rf"__ushort_as_{t}\(static_cast<unsigned short>\(_w\d+\.[xy] >> (0|16)\)\)",
                              d.source)) == 8


def test_msl_bfloat_vector_loads(rng):
    d, _ = prepare(rng, *ALIGNED4, "bfloat16", Schedule(vector_width=4), backend="msl")
    assert d.source.count("= metile_vload_bfloat4(") == 2


# -- elementwise: width 4 with scalar masked tails, and bounds ------------------------------------

@metile.kernel
def axpy(X, Y, Z, alpha, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(X + offs, mask=mask).to(metile.float32)
    y = metile.load(Y + offs, mask=mask).to(metile.float32)
    metile.store(Z + offs, (alpha * x + y).to(Z.dtype), mask=mask)


@metile.kernel
def double_in_place(X, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(X + offs, metile.load(X + offs, mask=offs < n) * 2.0, mask=offs < n)


def axpy_launch(rng, n, dtype="float32", schedule=None, block=512, backend=None):
    d = getattr(mx, dtype)
    x = mx.array(rng.standard_normal(n).astype(np.float32)).astype(d)
    y = mx.array(rng.standard_normal(n).astype(np.float32)).astype(d)
    extra = {} if schedule is None else {"SCHEDULE": schedule}
    disp = axpy[(metile.cdiv(n, block),)].prepare(x, y, mx.zeros((n,), dtype=d), 1.5, n,
                                                   BLOCK=block, num_simdgroups=4, **extra,
                                                   backend=backend)
    ref = 1.5 * np.array(x.astype(mx.float32)) + np.array(y.astype(mx.float32))
    return disp, ref


@pytest.mark.parametrize("n", [2048, 1500, 516, 1001, 515])
def test_elementwise_width_four_with_scalar_tails(rng, n, monkeypatch):
    # 2048: every block complete; 1500, 516: a masked scalar tail block (516 = 512 + 4);
    # 1001, 515: sizes of no multiple of 4, whose complete blocks are aligned all the same
    # (they were refused as "provably misaligned")
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "1")
    d, ref = axpy_launch(rng, n, schedule=Schedule(vector_width=4))
    np.testing.assert_allclose(np.array(d()), ref, rtol=1e-6, atol=1e-6)
    report = d.execution_report
    assert "vectorize_elementwise" in report.passes
    assert report.vectorized_loads == 2 == vector_loads(d, "float4")
    # the remainder is the scalar lane loop: width 1, a step of the lane count
    assert [(lp.kind, lp.elements_per_lane, lp.iteration_step) for lp in report.loops] == \
        [("interior", 4, 512), ("remainder", 1, 128)]


def test_elementwise_width_four_half(rng):
    d, ref = axpy_launch(rng, 1000, "float16", Schedule(vector_width=4))
    np.testing.assert_allclose(np.array(d().astype(mx.float32)), ref, rtol=2e-3, atol=2e-3)
    assert vector_loads(d, "half4") == d.execution_report.vectorized_loads == 2


def test_elementwise_width_four_source_text(rng):
    d, _ = axpy_launch(rng, 1500, schedule=Schedule(vector_width=4), backend="cuda")
    src = d.source
    assert len(re.findall(r"const float4 \w+ = metile_load_vec<float4>\(&X\[", src)) == 1
    assert len(re.findall(r"const float4 \w+ = metile_load_vec<float4>\(&Y\[", src)) == 1
    assert "(sizeof(V) - 1)) == 0" in src  # misaligned slices fall back to an unaligned copy
    # Interior programs (0 and 1 of 3) store unguarded; the tail keeps the mask.
    assert re.search(r"const bool \w+ = \(\w+ <= 1\);\nif \(\w+\) \{", src)
    assert re.search(r"if \(\w+\) Z\[\w+\] = ", src) and re.search(r"\n    Z\[\w+\] = ", src)


@pytest.mark.parametrize("block,lanes", [(2048, 512), (4096, 1024), (96, 0)])
def test_elementwise_width_four_chooses_lanes(rng, block, lanes):
    # num_simdgroups left open: metile picks lanes that each own whole groups of 4;
    # with an explicit count that splits the tile unevenly it refuses instead.
    n = block * 3
    x, y = (mx.array(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    launch = axpy[(3,)]
    if not lanes:  # 96 elements: 24 lanes would be needed, less than one SIMD-group
        with pytest.raises(CompilationError, match="whole groups of 4 elements"):
            launch.prepare(x, y, mx.zeros((n,)), 1.5, n, BLOCK=block,
                           SCHEDULE=Schedule(vector_width=4))
        return
    d = launch.prepare(x, y, mx.zeros((n,)), 1.5, n, BLOCK=block, SCHEDULE=Schedule(vector_width=4))
    np.testing.assert_allclose(np.array(d()), 1.5 * np.array(x) + np.array(y), rtol=1e-6, atol=1e-6)
    assert d.schedule_plan.threadgroup_size == (lanes, 1, 1)
    assert d.execution_report.vectorized_loads == vector_loads(d, "float4") == 2
    if block // 64 <= 32:  # block / 2 lanes, if a threadgroup can have them
        with pytest.raises(CompilationError, match="gives 2 elements per lane"):
            launch.prepare(x, y, mx.zeros((n,)), 1.5, n, BLOCK=block, num_simdgroups=block // 64,
                           SCHEDULE=Schedule(vector_width=4))


def test_elementwise_width_four_rejections(rng):
    with pytest.raises(CompilationError, match="vector_width=4: no program's block is complete"):
        axpy_launch(rng, 511, schedule=Schedule(vector_width=4))
    with pytest.raises(CompilationError, match="vector_width=4: no program's block is complete"):
        axpy_launch(rng, 256, schedule=Schedule(vector_width=4))
    x = mx.ones((1024,))
    with pytest.raises(CompilationError, match="vector_width=4: alignment of the interior "
                                               "accesses is not provable"):
        double_in_place[(2,)].prepare(x, 1024, BLOCK=512, num_simdgroups=4,
                                      SCHEDULE=Schedule(vector_width=4))
    # The lowering's own analysis names the reason too.
    fn = double_in_place[(2,)].prepare(x, 1024, BLOCK=512, num_simdgroups=4).spec.tile_ir()
    assert vectorizable(fn, {"n": 1024}) == "the kernel reads the buffer it stores to"


@pytest.mark.parametrize("n", [1500, 2048])
def test_elementwise_bounds_without_vectors(rng, n):
    # A Schedule specializes n; width 1 keeps the scalar path and every tail guard.
    d, ref = axpy_launch(rng, n, schedule=Schedule(vector_width=1))
    np.testing.assert_allclose(np.array(d()), ref, rtol=1e-6, atol=1e-6)
    assert d.execution_report.vectorized_loads == 0 and "float4" not in d.source
    assert "< _v" in d.source or "< n" in d.source      # the tail guard stays
    # Width None leaves it to the compiler: lanes in runs of 4 (passes/vectorize_rows.py),
    # each run one packed load per operand where its masks hold, the masked scalar
    # loads (the tail guard) where they do not.
    d, ref = axpy_launch(rng, n, schedule=Schedule())
    np.testing.assert_allclose(np.array(d()), ref, rtol=1e-6, atol=1e-6)
    assert "vectorize_rows" in d.execution_report.passes
    assert d.execution_report.vectorized_loads == 2 and "packed_float4" in d.source
    assert "< _v" in d.source or "< n" in d.source


def test_cuda_explain_reports_its_own_geometry(rng):
    # The recorded field names stay; the words inside are CUDA's, and strict FP32
    # says it runs on FFMA register micro-tiles rather than warp MMA.
    d, _ = prepare(rng, 96, 96, 64, schedule=Schedule(double_buffer=True), backend="cuda")
    data = json.loads(d.explain())
    plan = data["plan"]
    assert plan["cooperative_layout"] == "scalar FMA register micro-tiles (per-thread)"
    assert plan["simdgroup_grid"] is None and plan["threadgroup_size"] == [128, 1, 1]
    # a 32x16 + 16x32 float32 stage is 4096 bytes; two stages of each operand are allocated
    assert "Operand tiles are staged through shared memory (4096 bytes per stage) and loaded " \
           "into per-thread registers." in plan["reasons"]
    assert any("ordinary loads (no asynchronous copies)" in r for r in plan["reasons"])
    assert not any("MMA" in r for r in plan["reasons"])
    assert data["passes"][-1] == "emit_cuda" and data["double_buffered"] is True
    assert [a["bytes"] for a in data["allocations"]] == [4096, 4096]
    assert any(n.startswith("On sm_") and "a SIMD-group a warp" in n for n in data["notes"])
    half, _ = prepare(rng, 96, 96, 64, "float16", Schedule(), backend="cuda")
    assert half.schedule_plan.reasons[0].startswith("Warp-level MMA instructions (tensor cores)")
    assert "2x2 warp grid" in half.schedule_plan.reasons[0]


@pytest.mark.parametrize("backend", ["cuda", "msl"])
def test_threadgroup_capacity_is_the_targets(backend):
    # A 128x128x32 half tile, double-buffered: 32 KiB of operand stages, exactly Apple's
    # threadgroup memory (both emitters apply the epilogue to accumulator registers, so
    # no scratch is added); one more stage does not fit on Metal.
    from metile_kernels.gemm import matmul_epilogue
    n = 256
    a = mx.zeros((n, n), mx.float16)
    launch = matmul_epilogue[grid(n, n, 128, 128)]
    args = (a, a, mx.zeros((n, n), mx.float16), n, n, n, 1.0, 0.0)
    kwargs = dict(EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.1, BLOCK_M=128, BLOCK_N=128,
                  BLOCK_K=32, num_simdgroups=8, SCHEDULE=Schedule(double_buffer=True),
                  backend=backend)
    d = launch.prepare(*args, **kwargs)
    assert sum(x.bytes for x in d.execution_report.allocations) == 32768
    if backend == "msl":
        kwargs["BLOCK_K"] = 48
        with pytest.raises((CompilationError, ScheduleError), match=r"32768"):
            launch.prepare(*args, **kwargs)


@pytest.mark.parametrize("shape,schedule", [
    ((70, 50, 37), Schedule(double_buffer=True)),    # ragged: guarded edges and K remainder
    ((64, 64, 48), Schedule(double_buffer=True)),
    ((64, 64, 48), Schedule(vector_width=4)),
    ((68, 36, 44), Schedule(vector_width=4)),        # multiples of 4, edge tiles stay scalar
])
def test_scalar_fma_fallback_honours_width_and_double_buffer(rng, shape, schedule):
    # BLOCK_K=4 is no whole 8-deep simdgroup fragment (and no 16-deep warp MMA): the plan
    # falls back to FFMA register micro-tiles, whose staging takes the same controls.
    m, n, k = shape
    a, b, ref = operands(rng, m, n, k, "float32")
    d = matmul[grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=32,
                                           BLOCK_N=32, BLOCK_K=4, SCHEDULE=schedule)
    check(d(), ref)
    plan, report = d.schedule_plan, d.execution_report
    assert plan.cooperative_layout.startswith("scalar FMA register micro-tiles")
    if schedule.double_buffer:
        assert plan.double_buffer and report.double_buffered
        assert "double_buffer_staging" in report.passes
    else:
        assert plan.vector_width == 4 and report.vectorized_loads == vector_loads(d, "float4") > 0
