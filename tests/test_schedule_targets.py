"""Target capability descriptions and the device -> target mapping."""

import mlx.core as mx
import pytest

from metile.compiler import resolve_backend
from metile.schedule import TARGETS, target_for


@pytest.mark.parametrize("name", ["apple7", "apple8", "apple9"])
def test_pre_m5_apple_families_have_simdgroup_matrix_only(name):
    t = TARGETS[name]
    assert t.backends == ("elementwise", "simdgroup", "simdgroup_inline")
    assert not t.has_tensor_ops and not t.has_nax
    assert (t.language, t.simd_width, t.max_threads_per_threadgroup,
            t.threadgroup_memory_bytes) == ("msl", 32, 1024, 32768)


def test_m5_family_adds_tensor_ops_and_nax():
    t = TARGETS["apple10"]
    assert t.has_tensor_ops and t.has_nax
    assert t.backends == ("elementwise", "tensor_ops", "nax", "simdgroup", "simdgroup_inline")
    assert t.matrix_path("tensor_ops").dtypes == ("float32", "float16", "bfloat16")
    nax = t.matrix_path("nax")
    assert nax.dtypes == ("float16", "bfloat16") and nax.relaxed_dtypes == ("float32",)
    assert nax.opaque and nax.stagings == ("device",)


def test_cpu_runtime_claims_the_apple_capabilities_it_emulates():
    cpu, m1 = TARGETS["cpu_msl"], TARGETS["apple7"]
    assert cpu.language == "msl"
    assert cpu.matrix_paths == m1.matrix_paths
    assert cpu.matrix_path("tensor_ops") is None and cpu.matrix_path("nax") is None
    assert cpu.threadgroup_memory_bytes == m1.threadgroup_memory_bytes


@pytest.mark.parametrize("name", ["sm_80", "sm_90", "sm_100"])
def test_nvidia_warp_mma_plays_the_simdgroup_role(name):
    t = TARGETS[name]
    assert t.language == "cuda" and t.simd_width == 32
    assert not t.has_tensor_ops and not t.has_nax
    sg = t.matrix_path("simdgroup")
    assert sg.dtypes == ("float16", "bfloat16")
    assert sg.relaxed_dtypes == ("float32",)    # TF32 only under relaxed precision
    assert sg.fallback_dtypes == ("float32",)   # strict float32 is FFMA


@pytest.mark.parametrize("kind, arch, name", [
    ("cpu", None, "cpu_msl"), ("cpu", "x86_64", "cpu_msl"),
    ("metal", "applegpu_g13g", "apple7"), ("metal", "applegpu_g14s", "apple8"),
    ("metal", "applegpu_g15d", "apple9"), ("metal", "applegpu_g16p", "apple9"),
    ("metal", "applegpu_g17s", "apple10"), ("metal", "apple10", "apple10"),
    ("cuda", "sm_80", "sm_80"), ("cuda", "8.6", "sm_80"), ("cuda", "sm_90", "sm_90"),
    ("cuda", "90", "sm_90"), ("cuda", "9.0", "sm_90"), ("cuda", "sm_90a", "sm_90"),
    ("cuda", "sm_100", "sm_100"),
])
def test_target_for(kind, arch, name):
    t = target_for(kind, arch)
    assert t.name == name
    assert t.notes == ()


def test_unknown_architectures_default_with_a_note():
    t = target_for("cuda", None)
    assert t.name == "sm_90" and "compute capability unknown; assuming sm_90" in t.notes[0]
    assert TARGETS["sm_90"].notes == ()  # the registry entry is not modified
    m = target_for("metal", None)
    assert m.name == "apple9" and "no tensor ops / NAX" in m.notes[0]
    newer = target_for("metal", "applegpu_g19s")
    assert newer.name == "apple10" and "generation 19" in newer.notes[0]


@pytest.mark.parametrize("kind, arch, message", [
    ("tpu", None, "unknown device kind 'tpu'"),
    ("metal", "m5", "unknown Apple GPU architecture 'm5'"),
    ("cuda", "sm_75", "older than sm_80"),
    ("cuda", "volta", "unknown CUDA architecture 'volta'"),
])
def test_target_for_rejects(kind, arch, message):
    with pytest.raises(ValueError, match=message):
        target_for(kind, arch)


def test_current_target_follows_the_default_device():
    t = resolve_backend().target
    if mx.default_device().type == mx.cpu:
        assert t.name == "cpu_msl"
    elif mx.cuda.is_available():
        assert t.language == "cuda"
    else:
        assert t.name.startswith("apple")
