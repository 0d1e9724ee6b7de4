"""Schedule and Config validation, cache keys, and the legacy NUM_SG / WM / WN checks."""

import pytest

from metile.schedule import (TARGETS, Config, KernelTraits, Schedule, ScheduleError,
                             check_legacy_geometry, plan_schedule)


def test_defaults_are_automatic():
    s = Schedule()
    assert (s.backend, s.num_simdgroups, s.staging, s.vector_width, s.double_buffer) == \
        ("auto", None, "auto", None, None)
    assert s.is_automatic
    assert not Schedule(vector_width=1).is_automatic


@pytest.mark.parametrize("backend", ["auto", "simdgroup", "simdgroup_inline", "tensor_ops", "nax",
                                     "elementwise"])
def test_every_backend_is_accepted(backend):
    assert Schedule(backend=backend).backend == backend


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(backend="metal"), ValueError, "unknown backend 'metal'; expected one of auto, simdgroup, "
                                        "simdgroup_inline, tensor_ops, nax, elementwise"),
    (dict(backend=None), TypeError, "backend must be a string"),
    (dict(staging="shared"), ValueError, "unknown staging 'shared'; expected one of auto, device, "
                                         "threadgroup"),
    (dict(num_simdgroups=0), ValueError, "num_simdgroups must be from 1 through 32, got 0"),
    (dict(num_simdgroups=33), ValueError, "num_simdgroups must be from 1 through 32, got 33"),
    (dict(num_simdgroups=4.0), TypeError,
     "num_simdgroups must be an int from 1 through 32 or None"),
    (dict(num_simdgroups=True), TypeError, "got bool True"),
    (dict(vector_width=2), ValueError, "vector_width must be None, 1 or 4, got 2"),
    (dict(vector_width=True), TypeError, "vector_width must be None, 1 or 4, got bool"),
    (dict(double_buffer=1), TypeError, "double_buffer must be None, True or False, got int 1"),
])
def test_invalid_values_name_the_field(kwargs, exc, message):
    with pytest.raises(exc) as err:
        Schedule(**kwargs)
    assert type(err.value) is exc
    assert "Schedule: " in str(err.value) and message in str(err.value)


def test_schedule_is_frozen_and_hashable():
    s = Schedule(backend="simdgroup", num_simdgroups=4)
    with pytest.raises(AttributeError):
        s.backend = "nax"
    assert {s: 1}[Schedule(backend="simdgroup", num_simdgroups=4)] == 1
    assert s != Schedule(backend="simdgroup", num_simdgroups=2)


def test_schedule_key_is_stable_and_distinguishes_fields():
    s = Schedule(backend="simdgroup", num_simdgroups=4, staging="threadgroup", vector_width=4,
                 double_buffer=False)
    assert s.key() == ("Schedule(backend='simdgroup',num_simdgroups=4,staging='threadgroup',"
                       "vector_width=4,double_buffer=False)")
    keys = {Schedule().key(), Schedule(vector_width=1).key(), Schedule(double_buffer=False).key(),
            Schedule(double_buffer=None).key(), Schedule(staging="device").key()}
    assert len(keys) == 4  # double_buffer=None is the default


def test_config_maps_num_simdgroups_to_num_sg():
    c = Config(num_simdgroups=4, BLOCK_M=64, BLOCK_N=32)
    assert c.num_simdgroups == 4
    assert c.launch_kwargs() == {"BLOCK_M": 64, "BLOCK_N": 32, "NUM_SG": 4}
    assert Config(BLOCK=256).launch_kwargs() == {"BLOCK": 256}
    assert Config(NUM_SG=2).num_simdgroups == 2
    assert Config(num_simdgroups=2, BLOCK=8) == Config(BLOCK=8, NUM_SG=2)
    assert hash(Config(num_simdgroups=2, BLOCK=8)) == hash(Config(BLOCK=8, NUM_SG=2))
    assert Config(BLOCK=8) != Config(BLOCK=16)
    assert repr(c) == "Config(num_simdgroups=4, BLOCK_M=64, BLOCK_N=32)"
    with pytest.raises(AttributeError, match="immutable"):
        c.BLOCK_M = 1


def test_config_rejects_contradictions_and_bad_values():
    with pytest.raises(ValueError, match="NUM_SG=2 contradicts num_simdgroups=4"):
        Config(num_simdgroups=4, NUM_SG=2)
    with pytest.raises(ValueError, match="Config: num_simdgroups must be from 1 through 32, "
                                         "got 64"):
        Config(num_simdgroups=64)
    with pytest.raises(TypeError, match="meta-parameter SHAPE=\\[1, 2\\] must be hashable"):
        Config(SHAPE=[1, 2])


def _gemm_plan(**schedule):
    traits = KernelTraits("matmul", (64, 64, 16), operand_dtypes=("float32", "float32"),
                          accumulator_dtype="float32", extents_divisible=(True, True, True))
    return plan_schedule(traits, TARGETS["apple9"], Schedule(**schedule))


def test_legacy_geometry_that_agrees_passes():
    plan = _gemm_plan(num_simdgroups=4)
    assert plan.simdgroup_grid == (2, 2)
    check_legacy_geometry({"NUM_SG": 4, "WM": 2, "WN": 2, "BLOCK_M": 64}, plan)
    check_legacy_geometry({}, plan)


@pytest.mark.parametrize("meta, message", [
    ({"NUM_SG": 8}, "cannot honour NUM_SG=8: the simdgroup plan launches 4 SIMD-groups "
                    "(threadgroup [128, 1, 1])"),
    ({"WM": 4, "WN": 1}, "cannot honour WM=4, WN=1: the plan's SIMD-group grid is [2, 2]; "
                         "WM (rows) must be 2"),
    ({"WN": 4}, "WN (columns) must be 2"),
])
def test_legacy_geometry_contradicting_the_plan(meta, message):
    with pytest.raises(ScheduleError) as err:
        check_legacy_geometry(meta, _gemm_plan())
    assert message in str(err.value)


def test_legacy_num_sg_contradicting_the_schedule():
    s = Schedule(num_simdgroups=4)
    with pytest.raises(ScheduleError, match=r"NUM_SG=2: contradicts Schedule\(num_simdgroups=4\)"):
        check_legacy_geometry({"NUM_SG": 2}, _gemm_plan(num_simdgroups=4), s)


def test_legacy_wm_wn_on_a_lane_kernel():
    plan = plan_schedule(KernelTraits("elementwise", (256,), lanes=256), TARGETS["cpu_msl"])
    check_legacy_geometry({"NUM_SG": 8}, plan)
    with pytest.raises(ScheduleError, match="the elementwise plan has no SIMD-group grid"):
        check_legacy_geometry({"WM": 2}, plan)


def test_schedule_error_is_a_value_error_with_parts():
    err = ScheduleError("vector_width=4", "misaligned")
    assert isinstance(err, ValueError)
    assert (err.requirement, err.reason, str(err)) == \
        ("vector_width=4", "misaligned", "cannot honour vector_width=4: misaligned")


def test_numpy_integer_counts_are_taken_as_ints():
    # (a count read from a config as np.int64 was refused)
    import numpy as np
    s = Schedule(num_simdgroups=np.int64(4), num_stages=np.int32(2), group_size=np.int16(8))
    assert (s.num_simdgroups, s.num_stages, s.group_size) == (4, 2, 8)
    assert type(s.num_simdgroups) is int and s.key() == Schedule(num_simdgroups=4, num_stages=2,
                                                                  group_size=8).key()
    with pytest.raises(TypeError, match="num_simdgroups must be an int"):
        Schedule(num_simdgroups=np.True_)


def test_numpy_strings_and_config_counts_are_the_python_values_they_hold():
    # (np.str_ went into the keys as np.str_('simdgroup'); Config refused NumPy counts that
    # Schedule takes, and Config(BLOCK=np.int64(64)) was another candidate than BLOCK=64)
    import numpy as np
    s = Schedule(backend=np.str_("simdgroup"), staging=np.str_("threadgroup"))
    assert type(s.backend) is str and s.key() == Schedule(backend="simdgroup",
                                                          staging="threadgroup").key()
    c = Config(num_simdgroups=np.int64(4), BLOCK=np.int64(64), num_stages=np.int32(2))
    assert c == Config(num_simdgroups=4, BLOCK=64, num_stages=2)
    assert type(c.num_simdgroups) is int and type(c.meta["BLOCK"]) is int
    assert Config(NUM_SG=np.int8(2)).num_simdgroups == 2
    assert Config({"BLOCK": np.int64(32)}, num_warps=np.int64(4)).num_warps == 4
    with pytest.raises(ValueError, match="num_warps must be an int"):
        Config(num_warps=np.float64(4.0))
