"""Schedule(num_stages=...) and grouped program order for GEMMs (issue 13, items 1 and 5).

Numbers: ragged GEMMs (sizes not multiples of the 32x32x16 tile) on the MSL CPU runtime
with METILE_RACE_CHECK=1 and bounds checking (conftest), against NumPy from the
rounded operands.  The program-id remap is IR shared by both emitters, so these runs
check the index math the CUDA kernels also execute; its formula is also evaluated
straight from the lowered IR over many grids.  CUDA: source shape and report through
prepare(backend="cuda") (compiles, never launches); tests/test_cuda_nvrtc.py compiles
the same kernels with NVRTC.  The CUDA kernels are not run here (no GPU).
"""

import json
import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError, Schedule
from metile.schedule import TARGETS, KernelTraits, ScheduleError, plan_schedule
from metile_kernels.gemm import grid, matmul, matmul_epilogue
from test_gemm import check, operands

ON_CUDA = mx.cuda.is_available() and mx.default_device().type == mx.gpu
TILE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
RAGGED = (75, 45, 37)        # grid 3 x 2, edge tiles on both axes, K remainder of 5
WIDE = (150, 90, 37)         # grid 5 x 3: room for groups that do not divide it


@pytest.fixture(autouse=True)
def race_check(monkeypatch):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")


def run(rng, shape, dtype, schedule, kernel=matmul, backend=None):
    m, n, k = shape
    a, b, ref = operands(rng, m, n, k, dtype)
    extra = (1.25, -0.5) if kernel is matmul_epilogue else ()
    kw = dict(EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.1) if kernel is matmul_epilogue else {}
    d = kernel[grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), m, n, k, *extra, **TILE,
                                           **kw, SCHEDULE=schedule,
                                           **({"backend": backend} if backend else {}))
    if kernel is matmul_epilogue:
        z = 1.25 * ref - 0.5
        ref = np.where(z > 0, z, 0.1 * z)
    return d, ref


# -- numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("stages", [1, 2])
def test_stage_counts_on_ragged_shapes(rng, dtype, stages):
    d, ref = run(rng, RAGGED, dtype, Schedule(num_stages=stages))
    check(d(), ref)
    report = d.execution_report
    assert report.plan.num_stages == stages and report.num_stages == stages
    # On CUDA two stages are the cp.async ring (gemm_async; strict float32 too, for its
    # scalar FMAs), not the double-buffered ordinary loads the other backends use.
    ring = "async_pipeline_staging" in report.passes
    assert ring is (stages == 2 and d.variant.data["language"] == "cuda")
    assert report.double_buffered is (stages == 2 and not ring)
    assert ("double_buffer_staging" in report.passes) is (stages == 2 and not ring)


@pytest.mark.parametrize("dtype,group", [("float32", 1), ("float32", 2), ("float32", 3),
                                         ("float32", 8), ("float16", 2), ("bfloat16", 4)])
def test_grouped_order_on_ragged_shapes(rng, dtype, group):
    # grid 5 x 3: groups of 2 and 3 leave a short last group, 8 is larger than the grid
    d, ref = run(rng, WIDE, dtype, Schedule(program_order="grouped", group_size=group))
    check(d(), ref)
    report = d.execution_report
    assert (report.plan.program_order, report.plan.group_size) == ("grouped", group)
    assert "grouped_program_order" in report.passes


def test_grouped_order_with_two_stages_and_a_fused_epilogue(rng):
    d, ref = run(rng, WIDE, "float16", Schedule(num_stages=2, group_size=2), matmul_epilogue)
    check(d(), ref)
    staging = "async_pipeline_staging" if d.variant.data["language"] == "cuda" else "double_buffer_staging"
    assert {"grouped_program_order", staging} <= set(d.execution_report.passes)


def test_grouped_order_on_a_one_dimensional_grid(rng):
    # one column of tiles: the remap must still cover every row tile exactly once
    m, n, k = 100, 20, 19
    a, b, ref = operands(rng, m, n, k, "float32")
    out = matmul[grid(m, n, 32, 32)](a, b, mx.zeros((m, n)), m, n, k, **TILE,
                                     SCHEDULE=Schedule(program_order="grouped", group_size=3))
    check(out, ref)


# -- the remap's index math, evaluated from the lowered IR -------------------------------------

def _remap_ir(monkeypatch, group):
    """The program-id values the GEMM lowering computes at kernel entry (IR Values)."""
    from metile.passes.lower_matmul import MatmulLowering
    captured = {}
    original = MatmulLowering.remap_program_ids

    def spy(self, b):
        original(self, b)
        captured.update(self.program_ids or {})

    monkeypatch.setattr(MatmulLowering, "remap_program_ids", spy)
    monkeypatch.setenv("METILE_DISABLE_DISK_CACHE", "1")

    @metile.kernel
    def fresh(left, right, output, rows, columns, inner, BLOCK_M: metile.constexpr = 32,
              BLOCK_N: metile.constexpr = 32, BLOCK_K: metile.constexpr = 16):
        a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                          block_shape=(BLOCK_M, BLOCK_K), access="read")
        b = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                          block_shape=(BLOCK_K, BLOCK_N), access="read")
        c = metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                          block_shape=(BLOCK_M, BLOCK_N), access="write")
        r0 = metile.program_id(0) * BLOCK_M
        c0 = metile.program_id(1) * BLOCK_N
        acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
        for k in metile.tile_range(0, inner, BLOCK_K):
            acc = metile.dot(a.load((r0, k)), b.load((k, c0)), acc)
        c.store((r0, c0), acc)

    m = n = k = 64
    fresh[(2, 2)].prepare(mx.zeros((m, k)), mx.zeros((k, n)), mx.zeros((m, n)), m, n, k,
                          SCHEDULE=Schedule(program_order="grouped", group_size=group))
    assert set(captured) == {0, 1}
    return captured


def _evaluate(v, pid, nprog):
    op = v.owner
    args = [_evaluate(o, pid, nprog) for o in op.operands]
    return {"program_id": lambda: pid[op.attrs["axis"]],
            "num_programs": lambda: nprog[op.attrs["axis"]],
            "const": lambda: op.attrs["value"],
            "add": lambda: args[0] + args[1], "sub": lambda: args[0] - args[1],
            "mul": lambda: args[0] * args[1], "idiv": lambda: args[0] // args[1],
            "mod": lambda: args[0] % args[1], "minimum": lambda: min(args)}[op.name]()


@pytest.mark.parametrize("group", [1, 3, 4])
def test_remap_is_a_grouped_permutation_of_the_grid(monkeypatch, group):
    ids = _remap_ir(monkeypatch, group)
    for n0, n1 in [(1, 1), (1, 5), (7, 1), (4, 4), (5, 3), (9, 2), (2, 9)]:
        order = []
        for p1 in range(n1):
            for p0 in range(n0):   # launch order: axis 0 fastest
                order.append(tuple(_evaluate(ids[a], (p0, p1), (n0, n1)) for a in (0, 1)))
        assert sorted(order) == [(r, c) for r in range(n0) for c in range(n1)], (n0, n1)
        # within a group the programs walk down its rows, then across the columns
        for start in range(0, n0, group):
            rows = min(group, n0 - start)
            chunk = order[start * n1:(start + rows) * n1]
            assert chunk == [(start + i % rows, i // rows) for i in range(rows * n1)]
        if group >= n0:
            assert order == [(p0, p1) for p1 in range(n1) for p0 in range(n0)]  # identity


# -- plans, explain, errors --------------------------------------------------------------------

def gemm_traits(dtype="float32", tile=(64, 64, 16), shared=0):
    return KernelTraits("matmul", tile, operand_dtypes=(dtype,) * 2, accumulator_dtype="float32",
                        extents_divisible=(False, False, False), shared_bytes=shared)


def test_strict_float32_on_cuda_stages_through_the_asynchronous_ring():
    # scalar FMA (no matrix unit computes strict float32) still takes cp.async stages on
    # CUDA: a ring of any count up to 5, reported as such
    plan = plan_schedule(gemm_traits(), TARGETS["sm_90"], Schedule(num_stages=3))
    assert plan.num_stages == 3
    assert any("ring of 3" in r and "cp.async" in r for r in plan.reasons), plan.reasons
    auto = plan_schedule(gemm_traits(), TARGETS["sm_90"])
    assert auto.num_stages is None and any("ring of as many" in r for r in auto.reasons)


def test_plan_records_stages_and_reasons():
    msl = TARGETS["cpu_msl"]
    auto = plan_schedule(gemm_traits(), msl)
    assert auto.num_stages == 1 and auto.double_buffer is None
    assert any(r.startswith("One operand stage (the automatic choice") for r in auto.reasons)
    two = plan_schedule(gemm_traits(), msl, Schedule(num_stages=2))
    assert (two.num_stages, two.double_buffer) == (2, True)
    assert any("(num_stages=2 on this path)" in r for r in two.reasons)
    one = plan_schedule(gemm_traits(), msl, Schedule(num_stages=1))
    assert (one.num_stages, one.double_buffer) == (1, False)
    assert plan_schedule(gemm_traits(), msl, Schedule(double_buffer=True)).num_stages == 2
    assert plan_schedule(gemm_traits(), msl, Schedule(double_buffer=False)).num_stages == 1
    # CUDA, 16-bit: the cp.async ring takes the count as is; automatic leaves it to lowering
    cuda = TARGETS["sm_90"]
    ring = plan_schedule(gemm_traits("float16"), cuda, Schedule(num_stages=4))
    assert (ring.num_stages, ring.double_buffer) == (4, None)
    assert "num_stages=4 is required: a ring of 4 4096-byte shared memory stages" in \
        " ".join(ring.reasons)
    auto = plan_schedule(gemm_traits("float16"), cuda)
    assert auto.num_stages is None
    assert any("(2 to 4; 4 here)" in r for r in auto.reasons)
    big = plan_schedule(gemm_traits("float16", (128, 128, 32)), cuda)
    assert any("(2 to 4; 3 here)" in r for r in big.reasons)


def test_plan_round_trips_and_old_plans_read_back():
    from metile.schedule import SchedulePlan
    p = plan_schedule(gemm_traits("float16"), TARGETS["sm_90"],
                      Schedule(num_stages=3, program_order="grouped", group_size=6))
    d = p.to_dict()
    assert (d["num_stages"], d["program_order"], d["group_size"]) == (3, "grouped", 6)
    assert SchedulePlan.from_dict(d) == p
    for key in ("num_stages", "program_order", "group_size"):
        del d[key]
    old = SchedulePlan.from_dict(d)
    assert (old.num_stages, old.program_order, old.group_size) == (None, "linear", None)


def test_program_order_plans():
    msl = TARGETS["cpu_msl"]
    auto = plan_schedule(gemm_traits(), msl)
    assert (auto.program_order, auto.group_size) == ("linear", None)
    assert any("the automatic default: grouped order was not measured on a GPU" in r
               for r in auto.reasons)
    grouped = plan_schedule(gemm_traits(), msl, Schedule(program_order="grouped"))
    assert (grouped.program_order, grouped.group_size) == ("grouped", 8)
    assert any("take 8 output tiles along grid axis 0" in r and "the default" in r
               for r in grouped.reasons)
    implied = plan_schedule(gemm_traits(), msl, Schedule(group_size=5))
    assert (implied.program_order, implied.group_size) == ("grouped", 5)
    linear = plan_schedule(gemm_traits(), msl, Schedule(program_order="linear"))
    assert linear.program_order == "linear"


def test_explain_shows_stages_and_order(rng):
    d, _ = run(rng, RAGGED, "float32", Schedule(num_stages=2, group_size=4))
    data = json.loads(d.explain())
    assert data["num_stages"] == 2
    assert (data["plan"]["num_stages"], data["plan"]["program_order"],
            data["plan"]["group_size"]) == (2, "grouped", 4)
    staged = "async_pipeline_staging" if ON_CUDA else "double_buffer_staging"
    assert data["passes"].index("grouped_program_order") < data["passes"].index(staged)
    metile.schedule.check_schema(data)


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(num_stages=0), ValueError, "Schedule: num_stages must be from 1 through 8, got 0"),
    (dict(num_stages=9), ValueError, "Schedule: num_stages must be from 1 through 8, got 9"),
    (dict(num_stages=2.0), TypeError,
     "Schedule: num_stages must be an int from 1 through 8 or None, got float 2.0"),
    (dict(num_stages=True), TypeError,
     "Schedule: num_stages must be an int from 1 through 8 or None, got bool True"),
    (dict(program_order="row"), ValueError,
     "Schedule: unknown program_order 'row'; expected one of auto, linear, grouped"),
    (dict(program_order=1), TypeError, "Schedule: program_order must be a string"),
    (dict(group_size=0), ValueError, "Schedule: group_size must be from 1 through 4096, got 0"),
    (dict(group_size="8"), TypeError,
     "Schedule: group_size must be an int from 1 through 4096 or None, got str '8'"),
    (dict(program_order="linear", group_size=4), ValueError,
     "Schedule: group_size=4 contradicts program_order='linear'"),
])
def test_bad_values_name_the_field(kwargs, exc, message):
    with pytest.raises(exc) as err:
        Schedule(**kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize("traits, target, schedule, message", [
    (gemm_traits(), "cpu_msl", Schedule(double_buffer=True, num_stages=3),
     "cannot honour double_buffer=True with num_stages=3: double buffering is exactly 2 "
     "operand stages"),
    (gemm_traits(), "cpu_msl", Schedule(double_buffer=True, num_stages=1),
     "cannot honour double_buffer=True with num_stages=1"),
    (gemm_traits(), "cpu_msl", Schedule(double_buffer=False, num_stages=2),
     "cannot honour double_buffer=False with num_stages=2: 2 operand stages buffer the next K "
     "step while the current one is multiplied; double_buffer=False allows only num_stages=1"),
    (gemm_traits(), "cpu_msl", Schedule(num_stages=3),
     "cannot honour num_stages=3: more than 2 operand stages are not implemented for the "
     "ordinary-load staged GEMM path (simdgroup_matrix 8x8 on cpu_msl)"),
    (gemm_traits(), "sm_90", Schedule(num_stages=3, double_buffer=True),
     "cannot honour double_buffer=True with num_stages=3"),
    (gemm_traits("float16"), "sm_90", Schedule(num_stages=3, vector_width=4),
     "vector_width=4 selects ordinary 4-wide loads"),
    (gemm_traits(), "cpu_msl", Schedule(num_stages=2, vector_width=4),
     "cannot honour vector_width=4 with num_stages=2"),
    (gemm_traits(), "cpu_msl", Schedule(num_stages=2, staging="device"),
     "cannot honour staging='device' with num_stages=2"),
    (gemm_traits("float16", (128, 128, 32)), "sm_90", Schedule(num_stages=4),
     "cannot honour num_stages=4: 4 operand stages of 16384 bytes and the kernel's allocations "
     "need 65536 bytes of shared memory; sm_90 has 49152"),
    (gemm_traits(tile=(64, 64, 32), shared=1024), "cpu_msl", Schedule(num_stages=2),
     "cannot honour num_stages=2: 2 operand stages of 16384 bytes and the kernel's allocations "
     "need 33792 bytes of threadgroup memory; cpu_msl has 32768"),
    (KernelTraits("elementwise", (256,), lanes=256), "cpu_msl", Schedule(num_stages=1),
     "cannot honour num_stages=1: this elementwise kernel has no staged K loop"),
    (KernelTraits("elementwise", (256,), lanes=256), "cpu_msl",
     Schedule(program_order="grouped"),
     "cannot honour program_order='grouped': this elementwise kernel is not a GEMM"),
    (KernelTraits("reduction", (256,), lanes=256), "cpu_msl", Schedule(group_size=2),
     "cannot honour group_size=2: this reduction kernel is not a GEMM"),
    (gemm_traits(), "apple10", Schedule(backend="tensor_ops", num_stages=2),
     "cannot honour backend='tensor_ops' with num_stages=2: tensor_ops loads device memory "
     "directly into cooperative tensors; there are no operand stages"),
])
def test_plan_refusals_by_name(traits, target, schedule, message):
    with pytest.raises(ScheduleError) as err:
        plan_schedule(traits, TARGETS[target], schedule)
    assert message in str(err.value)


@pytest.mark.skipif(ON_CUDA, reason="on CUDA strict float32 takes the cp.async ring, which "
                    "has 3 stages (test_float32_ring_of_three_stages_on_cuda)")
def test_a_kernel_refusal_names_the_line(rng):
    with pytest.raises(CompilationError, match="num_stages=3: more than 2 operand stages are "
                                               "not implemented"):
        run(rng, RAGGED, "float32", Schedule(num_stages=3))


@pytest.mark.skipif(not ON_CUDA, reason="the cp.async ring runs on MLX's CUDA backend")
def test_float32_ring_of_three_stages_on_cuda(rng):
    d, ref = run(rng, RAGGED, "float32", Schedule(num_stages=3), matmul_epilogue)
    check(d(), ref)
    assert d.execution_report.num_stages == 3 and "async_pipeline_staging" in d.execution_report.passes


# -- CUDA source shape (compiled, not launched) -------------------------------------------------

def cuda_gemm(dtype, schedule, shape=(200, 136, 72), tile=(64, 64, 32)):
    m, n, k = shape
    a, b = mx.zeros((m, k), dtype), mx.zeros((k, n), dtype)
    bm, bn, bk = tile
    return matmul_epilogue[grid(m, n, bm, bn)].prepare(
        a, b, mx.zeros((m, n), dtype), m, n, k, 1.0, 0.0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        EPILOGUE="relu", SCHEDULE=schedule, backend="cuda")


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_cuda_ring_has_exactly_the_required_stages(stages):
    d = cuda_gemm(mx.float16, Schedule(num_stages=stages))
    src, mm = d.source, d.variant.data["lowering"]["matmul"]
    assert mm["stages"] == stages and mm["async_copy"] and not mm["double_buffered"]
    assert d.execution_report.num_stages == stages
    # 64x32 + 32x64 half operands per stage, one array per operand
    assert f"__shared__ __align__(128) __half _sa1[{stages * 64 * 32}];" in src
    assert f"__shared__ __align__(128) __half _sb2[{stages * 32 * 64}];" in src
    assert f"metile_cp_async_wait<{stages - 2}>();" in src


def test_cuda_one_stage_uses_ordinary_loads():
    d = cuda_gemm(mx.bfloat16, Schedule(num_stages=1))
    mm = d.variant.data["lowering"]["matmul"]
    assert (mm["stages"], mm["async_copy"], mm["double_buffered"]) == (1, False, False)
    assert "metile_cp_async_wait<" not in d.source
    assert "__half _sa1[" not in d.source and "__nv_bfloat16 _sa1[2048];" in d.source


@metile.kernel
def matmul_bt(left, right_t, output, rows, columns, inner, BLOCK_M: metile.constexpr = 32,
              BLOCK_N: metile.constexpr = 32, BLOCK_K: metile.constexpr = 16):
    """output = left @ right_t.T: the right operand's tile is strided along its columns,
    which 16-byte asynchronous copies cannot take."""
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = metile.tensor(right_t, shape=(inner, columns), strides=(1, inner),
                      block_shape=(BLOCK_K, BLOCK_N), access="read")
    c = metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                      block_shape=(BLOCK_M, BLOCK_N), access="write")
    r0 = metile.program_id(0) * BLOCK_M
    c0 = metile.program_id(1) * BLOCK_N
    acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in metile.tile_range(0, inner, BLOCK_K):
        acc = metile.dot(a.load((r0, k)), b.load((k, c0)), acc)
    c.store((r0, c0), acc)


def _bt(schedule, backend=None, rng=None):
    m, n, k = RAGGED
    if rng is None:
        a, bt = mx.zeros((m, k), mx.float16), mx.zeros((n, k), mx.float16)
    else:
        a, b, ref = operands(rng, m, n, k, "float16")
        bt = mx.contiguous(b.T)
    d = matmul_bt[grid(m, n, 32, 32)].prepare(a, bt, mx.zeros((m, n)), m, n, k,
                                              SCHEDULE=schedule, backend=backend)
    return (d, ref) if rng is not None else d


def test_cuda_stages_where_asynchronous_copies_cannot_stage_the_operands():
    with pytest.raises(CompilationError, match="num_stages=3: more than 2 operand stages are not "
                                               "implemented for the ordinary-load staged GEMM "
                                               "path .*not plain loads contiguous"):
        _bt(Schedule(num_stages=3), backend="cuda")
    two = _bt(Schedule(num_stages=2), backend="cuda").variant.data["lowering"]["matmul"]
    assert (two["stages"], two["async_copy"], two["double_buffered"]) == (2, False, True)
    auto = _bt(Schedule(), backend="cuda").variant.data["lowering"]["matmul"]
    assert (auto["stages"], auto["async_copy"]) == (1, False)


def test_strided_operand_numbers_with_two_stages(rng):
    d, ref = _bt(Schedule(num_stages=2, group_size=2), rng=rng)
    check(d(), ref)


def test_cuda_grouped_order_source():
    d = cuda_gemm(mx.float16, Schedule(program_order="grouped", group_size=8))
    src = d.source
    assert "grouped_program_order" in d.execution_report.passes
    assert "gridDim.x" in src and "gridDim.y" in src
    assert re.search(r"\(_v\d+ < 8 \? _v\d+ : 8\)", src)  # rows of the (last) group
    # the remapped ids feed everything: blockIdx appears only in the remap
    assert src.count("blockIdx.x") == 1 and src.count("blockIdx.y") == 1


def test_msl_grouped_order_source(rng):
    d, _ = run(rng, RAGGED, "float32", Schedule(program_order="grouped", group_size=2),
               backend="msl")
    body = d.source
    assert "threadgroups_per_grid.x" in body and "threadgroups_per_grid.y" in body
    assert re.search(r"metal::min\(_v\d+, 2\)", body)
    assert body.count("threadgroup_position_in_grid.x") == 1
    assert body.count("threadgroup_position_in_grid.y") == 1


@metile.kernel
def trip_count_matmul(A, B, C, M, N, K, BLOCK_M: metile.constexpr, BLOCK_N: metile.constexpr,
                      BLOCK_K: metile.constexpr):
    rm = metile.program_id(0) * BLOCK_M + metile.arange(0, BLOCK_M)
    rn = metile.program_id(1) * BLOCK_N + metile.arange(0, BLOCK_N)
    rk = metile.arange(0, BLOCK_K)
    a_ptrs, b_ptrs = A + rm[:, None] * K + rk[None, :], B + rk[:, None] * N + rn[None, :]
    acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in range(0, metile.cdiv(K, BLOCK_K)):     # Triton's tutorial loop: a trip count
        a = metile.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BLOCK_K), other=0.0)
        b = metile.load(b_ptrs, mask=(rk[:, None] < K - k * BLOCK_K) & (rn[None, :] < N), other=0.0)
        acc = metile.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * N
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def test_a_trip_count_k_loop_names_the_loop_form_double_buffering_takes():
    # (a hostile trial: the refusal said "start, end and step are not known integers" of a
    # loop whose every value was known under the explicit Schedule - the step, 1, is not
    # BLOCK_K); without a schedule the same kernel runs and is right
    m, n, k = RAGGED
    a, b, want = operands(np.random.default_rng(3), m, n, k, "float32")
    with pytest.raises(CompilationError, match=r"cannot honour double_buffer=True: the K loop is "
                                               r"not one the bounds proofs take - `for k in "
                                               r"range\(0, K, BLOCK_K\)`.*a loop over the trip "
                                               r"count, `range\(0, cdiv\(K, BLOCK_K\)\)`, is not"):
        trip_count_matmul[grid(m, n, 32, 32)](a, b, mx.zeros((m, n)), m, n, k, **TILE,
                                              SCHEDULE=Schedule(double_buffer=True))
    check(trip_count_matmul[grid(m, n, 32, 32)](a, b, mx.zeros((m, n)), m, n, k, **TILE),
          want, "float32")
