"""SCHEDULE= on @metile.kernel launches: plans, reports, explain() and the
requirements lowering cannot honour."""

import json

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.frontend.errors import CompilationError, LaunchError
from metile.schedule import Schedule
from dsl_kernels import softmax_rows, vector_add
from conftest import requires_msl_device

PLAN_FIELDS = ["backend", "threadgroup_size", "simdgroup_grid", "tile_shape", "staging", "vector_width",
               "double_buffer", "reasons", "cooperative_layout", "outer_bounds_proven",
               "num_stages", "program_order", "group_size"]
REPORT_FIELDS = ["plan", "passes", "loops", "allocations", "double_buffered", "vectorized_loads",
                 "epilogue_regions", "notes", "num_stages"]


def add_args(n):
    return mx.arange(n).astype(mx.float32), mx.ones((n,)), mx.zeros((n,)), n


def test_explain_is_the_report_as_json():
    d = vector_add[(4,)].prepare(*add_args(1000), BLOCK=256)
    report = json.loads(d.explain())
    assert list(report) == REPORT_FIELDS
    assert list(report["plan"]) == PLAN_FIELDS
    assert report["plan"]["backend"] == "elementwise"
    assert report["plan"]["threadgroup_size"] == [256, 1, 1]
    assert report["passes"][0] == "frontend" and report["passes"][-1] in ("emit_msl", "emit_cuda")
    assert report == d.execution_report.to_dict()
    assert d.schedule_plan.to_dict() == report["plan"]


def test_reduction_report_lists_threadgroup_allocations():
    d = softmax_rows[(2,)].prepare(mx.zeros((2, 100)), mx.zeros((2, 100)), 100, 100, BLOCK=128)
    report = d.execution_report
    assert report.plan.backend == "elementwise"
    assert report.allocations and all(a.space == "threadgroup" for a in report.allocations)
    # 128 lanes = 4 SIMD-groups: one float partial per SIMD-group, per reduction
    assert [a.bytes for a in report.allocations] == [16, 16]


def test_schedule_specializes_integer_scalars_for_shape_proofs():
    proven = vector_add[(4,)].prepare(*add_args(1024), BLOCK=256, SCHEDULE=Schedule())
    ragged = vector_add[(4,)].prepare(*add_args(1000), BLOCK=256, SCHEDULE=Schedule())
    assert proven.schedule_plan.outer_bounds_proven is True
    assert ragged.schedule_plan.outer_bounds_proven is False
    assert proven.spec.key != ragged.spec.key
    # without a schedule, n stays a runtime value: one specialization serves both
    a = vector_add[(4,)].prepare(*add_args(1024), BLOCK=256)
    b = vector_add[(4,)].prepare(*add_args(1000), BLOCK=256)
    assert a.spec is b.spec and a.schedule_plan.outer_bounds_proven is False


def test_scheduled_launch_computes_the_same_numbers():
    x, y, z, n = add_args(1000)
    out = vector_add[(4,)](x, y, z, n, BLOCK=256, SCHEDULE=Schedule(backend="elementwise", num_simdgroups=8))
    np.testing.assert_array_equal(np.array(out), np.arange(1000) + 1.0)


@pytest.mark.parametrize("schedule,message", [
    (Schedule(vector_width=4, num_simdgroups=8), "cannot honour vector_width=4: the 256-element tile over 256 lanes gives 1 elements per lane"),
    (Schedule(backend="tensor_ops"), "cannot honour backend='tensor_ops': this elementwise kernel contains no dot"),
    (Schedule(staging="threadgroup"), "cannot honour staging='threadgroup': staging must match the kernel's memory operations"),
    (Schedule(double_buffer=True), "cannot honour double_buffer=True: this elementwise kernel has no staged K-loop"),
])
def test_unsatisfiable_schedules_are_compile_errors_at_the_kernel(schedule, message):
    with pytest.raises(CompilationError) as info:
        vector_add[(4,)].prepare(*add_args(1000), BLOCK=256, SCHEDULE=schedule)
    text = str(info.value)
    assert message in text
    assert "dsl_kernels.py:" in text.splitlines()[0]


@pytest.mark.parametrize("count", [1, 4, 8])
def test_a_schedules_simdgroup_count_is_the_launchs_as_num_warps_is(count):
    # (a hostile trial: Schedule(num_simdgroups=4) on this 256-element block was refused -
    # "the kernel's traced lane geometry is 256 lanes" - where num_warps=4 ran on 128 lanes)
    x, y, z, n = add_args(1000)
    d = vector_add[(4,)].prepare(x, y, z, n, BLOCK=256, SCHEDULE=Schedule(num_simdgroups=count))
    assert d.spec.threads == 32 * count
    assert vector_add[(4,)].prepare(x, y, z, n, BLOCK=256, num_warps=count).spec.threads == \
        d.spec.threads
    np.testing.assert_array_equal(np.array(d()), np.arange(1000) + 1.0)


def test_width_four_without_a_complete_block_is_rejected():
    with pytest.raises(CompilationError, match="vector_width=4: no program's block is complete "
                                               "for these sizes"):
        vector_add[(1,)].prepare(*add_args(1001), BLOCK=1024, num_simdgroups=8, SCHEDULE=Schedule(vector_width=4))


def test_width_four_on_a_ragged_size_vectorizes_the_complete_blocks(monkeypatch):
    # (n=1001 was refused as "provably misaligned": its complete blocks are aligned, and only
    # the last is a scalar remainder)
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "1")
    args = add_args(1001)
    d = vector_add[(8,)].prepare(*args, BLOCK=128, SCHEDULE=Schedule(vector_width=4))
    assert d.execution_report.vectorized_loads == 2
    np.testing.assert_array_equal(np.array(d()), np.array(args[0]) + np.array(args[1]))


def test_width_four_on_aligned_shapes_is_materialized():
    # 1024 = whole groups of 4 per lane: passes/vectorize_elementwise.py emits them
    # (tests/test_schedule_lowering.py checks the source and the tails).
    d = vector_add[(1,)].prepare(*add_args(1024), BLOCK=1024, num_simdgroups=8, SCHEDULE=Schedule(vector_width=4))
    assert d.execution_report.vectorized_loads == 2
    np.testing.assert_array_equal(np.array(d()), np.arange(1024) + 1.0)


def test_schedule_argument_must_be_a_schedule():
    with pytest.raises(LaunchError, match="SCHEDULE must be a metile.Schedule, got dict"):
        vector_add[(4,)].prepare(*add_args(1000), BLOCK=256, SCHEDULE={"backend": "auto"})


def test_kernel_level_explain_follows_the_last_launch():
    @metile.kernel
    def copy(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        metile.store(Y + offs, metile.load(X + offs, mask=offs < n), mask=offs < n)

    with pytest.raises(RuntimeError, match="has not been launched or prepared yet"):
        copy.explain()
    copy[(1,)](mx.ones((8,)), mx.zeros((8,)), 8, BLOCK=64)
    assert json.loads(copy.explain())["plan"]["threadgroup_size"] == [64, 1, 1]


def test_debug_schedule_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("METILE_DEBUG", "schedule")
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path / "cache"))
    vector_add[(2,)].prepare(*add_args(300), BLOCK=160)
    files = list((tmp_path / "debug_output" / "schedule").glob("*.json"))
    assert len(files) == 1
    dumped = json.loads(files[0].read_text())
    assert dumped["plan"]["threadgroup_size"] == [160, 1, 1]
    assert "elementwise" in capsys.readouterr().out


@pytest.fixture
def m5_target():
    """Plan as on an M5-class GPU (apple10: Metal 4 tensor ops and NAX in hardware),
    while the MSL still runs here (CPU runtime) or on whatever the default device is."""
    from metile.compiler import resolve_backend
    return resolve_backend("msl", target="apple10")


@pytest.mark.skipif(not (mx.default_device().type == mx.cpu or mx.metal.is_available()),
                    reason="runs the MSL it plans for")
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_m5_gemm_plans_tensor_ops_and_runs_it(m5_target, rng, dtype):
    # The automatic M5 plan is the hardware's (tensor ops, as in the recorded M5 report),
    # lowered to Metal 4 tensor ops (the CPU runtime runs them through its shim); the
    # SIMD-group path runs the same GEMM on apple10 when asked for.
    from test_gemm import check
    from test_schedule_lowering import prepare
    d, ref = prepare(rng, 70, 50, 40, dtype, backend=m5_target)
    assert (d.schedule_plan.backend, d.schedule_plan.staging) == ("tensor_ops", "device")
    check(d(), ref)
    d, ref = prepare(rng, 70, 50, 40, dtype, Schedule(backend="simdgroup"), backend=m5_target)
    assert (d.schedule_plan.backend, d.schedule_plan.staging) == ("simdgroup", "threadgroup")
    check(d(), ref)


@pytest.mark.parametrize("schedule,message", [
    (Schedule(backend="nax"), "cannot honour backend='nax': nax computes float32 products at "
                              "reduced precision on apple10; it needs RELAXED_PRECISION=True"),
    (Schedule(backend="simdgroup", staging="device"),
     "cannot honour staging='device': metile's GEMM lowering stages operands through threadgroup "
     "memory; fragments loaded straight from device memory are not implemented"),
])
def test_unhonoured_requirements_are_compile_errors(m5_target, rng, schedule, message):
    from test_schedule_lowering import prepare
    with pytest.raises(CompilationError) as info:
        d, _ = prepare(rng, 70, 50, 40, "float32", schedule, backend=m5_target)
        d()
    assert message in str(info.value) and "gemm.py:" in str(info.value).splitlines()[0]


def test_a_stage_too_large_for_threadgroup_memory_is_refused_not_device_staged(rng):
    # 128x64 + 64x128 float32 = 64 KiB: the hardware could load fragments from device
    # memory, metile's lowering cannot, so the plan refuses instead of failing later.
    from metile_kernels.gemm import grid, matmul
    a, b = mx.zeros((128, 128)), mx.zeros((128, 128))
    with pytest.raises(CompilationError, match="need 65536 bytes of (threadgroup|shared) memory"):
        matmul[grid(128, 128, 128, 128)].prepare(a, b, mx.zeros((128, 128)), 128, 128, 128,
                                                 BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)


# -- hostile tests (twenty-ninth session) ---------------------------------------------------

def test_a_prepared_launch_called_with_new_arrays_keeps_its_schedule():
    # (the call dropped SCHEDULE=: it ran a 128-lane launch while explain() still reported
    # the prepared 256-lane plan)
    x, y, z, n = add_args(1024)
    d = vector_add[(1,)].prepare(x, y, z, n, BLOCK=1024, num_simdgroups=8,
                                 SCHEDULE=Schedule(vector_width=4))
    out = d(x * 2, y, z, n)
    np.testing.assert_array_equal(np.array(out), 2 * np.arange(1024) + 1.0)
    ran = vector_add.last_dispatch
    assert ran.schedule_plan.vector_width == 4 and ran.execution_report.vectorized_loads == 2
    assert ran.schedule_plan.threadgroup_size == d.schedule_plan.threadgroup_size == (256, 1, 1)
    # the same schedule on a ragged size is refused, as a fresh launch with it is
    with pytest.raises(CompilationError, match="vector_width=4: no program's block is "
                                               "complete"):
        d(*add_args(1001))
    # a call naming its own options gets them
    d(x, y, z, n, SCHEDULE=Schedule())
    assert vector_add.last_dispatch.schedule_plan.vector_width is None


@requires_msl_device   # (apple10's MSL runs on Metal or the CPU only)
def test_a_prepared_launch_called_with_new_arrays_keeps_its_target():
    from metile_kernels.gemm import grid, matmul_epilogue
    m = n = k = 64
    x, w = mx.random.normal((m, k)), mx.random.normal((k, n))
    d = matmul_epilogue[grid(m, n)].prepare(x, w, mx.zeros((m, n)), m, n, k, 1.5, -0.25,
                                            target="apple10")
    x2 = mx.random.normal((m, k))
    out = d(x2, w, mx.zeros((m, n)), m, n, k, 1.5, -0.25)
    z = 1.5 * (np.array(x2, np.float64) @ np.array(w, np.float64)) - 0.25
    np.testing.assert_allclose(np.array(out), np.where(z > 0, z, 0.1 * z), rtol=2e-3, atol=2e-3)
    assert matmul_epilogue.last_dispatch.schedule_plan.backend == d.schedule_plan.backend


def test_kernel_explain_describes_the_launch_that_ran_last():
    # (a reused launch did not become the kernel's last_dispatch: after BLOCK 256, 128, 256
    # the kernel's explain() described the 128 launch)
    x, y, z, n = add_args(1024)
    for block in (256, 128, 256):
        vector_add[(1024 // block,)](x, y, z, n, BLOCK=block)
        assert json.loads(vector_add.explain())["plan"]["tile_shape"] == [block]
    vector_add[(8,)].prepare(x, y, z, n, BLOCK=128)
    vector_add[(4,)](x, y, z, n, BLOCK=256)   # a cached launch after a prepare()
    assert vector_add.schedule_plan.tile_shape == (256,)


def test_launch_options_contradicting_the_schedule_name_both_sides():
    # (num_simdgroups=2 with Schedule(num_simdgroups=4) was refused as "the kernel fixes 64
    # lanes", naming one side; num_warps already named both)
    from metile_kernels.gemm import grid, matmul
    a = mx.ones((40, 40))
    args = (a, a, mx.zeros((40, 40)), 40, 40, 40)
    for option in ({"num_simdgroups": 2}, {"NUM_SG": 2}, {"num_warps": 2}):
        name = next(iter(option))
        with pytest.raises(LaunchError, match=rf"{name}=2 contradicts the SCHEDULE's "
                                              r"num_simdgroups=4"):
            matmul[grid(40, 40, 32, 32)].prepare(*args, BLOCK_M=32, BLOCK_N=32, **option,
                                                 SCHEDULE=Schedule(num_simdgroups=4))


def test_a_tile_too_large_without_a_schedule_names_the_tile():
    # (it said "cannot honour backend='simdgroup'" to a launch that named no backend)
    from metile_kernels.gemm import grid, matmul
    a = mx.ones((40, 40))
    with pytest.raises(CompilationError, match=r"cannot honour the 128x128x64 tile: one "
                                               r"128x64 \+ 64x128 operand stage"):
        matmul[grid(40, 40, 128, 128)].prepare(a, a, mx.zeros((40, 40)), 40, 40, 40,
                                              BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)


def test_relaxed_precision_and_double_buffer_take_bools():
    # (RELAXED_PRECISION=1 ran strict - the policy reads `is True` - and a backend needing it
    # then asked for what was given; a NumPy bool was refused where NumPy ints are taken)
    from metile_kernels.gemm import grid, matmul
    a = mx.ones((40, 40))
    for value in (1, "True"):
        with pytest.raises(LaunchError, match=rf"RELAXED_PRECISION must be True or False, got "
                                              rf"{value!r}"):
            matmul[grid(40, 40, 32, 32)](a, a, mx.zeros((40, 40)), 40, 40, 40, BLOCK_M=32,
                                         BLOCK_N=32, RELAXED_PRECISION=value)
    assert Schedule(double_buffer=np.True_).double_buffer is True
    assert Schedule(double_buffer=np.False_) == Schedule(double_buffer=False)


@pytest.mark.parametrize("options, message", [
    # (a hostile trial: neither message named the control the caller had set)
    (dict(SCHEDULE=Schedule(backend="simdgroup_inline")),
     "cannot honour backend='simdgroup_inline': this tile is not an 8x8 matrix fragment"),
    (dict(num_warps=3), "cannot be split over 96 threads (num_warps / num_simdgroups=3)"),
])
def test_a_library_gemm_refusing_a_control_names_it(options, message):
    from metile_kernels.gemm import grid, matmul
    n = 32
    with pytest.raises(CompilationError) as info:
        matmul[grid(n, n, 32, 32)].prepare(mx.ones((n, n)), mx.ones((n, n)), mx.zeros((n, n)),
                                           n, n, n, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, **options)
    assert message in str(info.value)


@requires_msl_device
def test_numpy_launch_counts_are_ints():
    # (num_warps=np.int64(8) was refused as no int, and num_stages=np.int64(2) on a kernel
    # with no K loop failed where num_stages=2 is ignored with a warning, as Triton does)
    n = 1000
    for options in (dict(num_warps=np.int64(8)), dict(num_simdgroups=np.int32(8))):
        out = vector_add[(4,)](*add_args(n)[:2], mx.zeros((n,)), n, BLOCK=256, **options)
        np.testing.assert_array_equal(np.array(out), np.arange(n) + 1.0)
    with pytest.warns(UserWarning, match="num_stages=2 is not honoured"):
        out = vector_add[(4,)](*add_args(n)[:2], mx.zeros((n,)), n, BLOCK=256,
                               num_stages=np.int64(2))
    np.testing.assert_array_equal(np.array(out), np.arange(n) + 1.0)
