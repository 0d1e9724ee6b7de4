"""Shared memory past CUDA's 48 KiB static limit (issue 15 item 10): a kernel whose
shared() arrays need more lays them out in one dynamic buffer up to the target's opt-in
limit (227 KiB on sm_90) and its launch asks for that many bytes; past the opt-in limit,
and on Metal past 32 KiB, a compile error."""

import mlx.core as mx
import numpy as np
import pytest

import metile


@metile.kernel
def reverse_through_shared(X, O, n, SIZE: metile.constexpr, BLOCK: metile.constexpr):
    s = metile.shared(SIZE)
    i = metile.arange(0, BLOCK)
    metile.store(s + i, metile.load(X + i, mask=i < n, other=0.0))
    metile.debug_barrier()
    metile.store(O + i, metile.load(s + (BLOCK - 1 - i)), mask=i < n)


def prepare(size, backend):
    x = mx.arange(256).astype(mx.float32)
    return reverse_through_shared[(1,)].prepare(x, mx.zeros((256,)), 256, SIZE=size, BLOCK=256,
                                               backend=backend)


@pytest.mark.parametrize("scalars", ["array", "value"])
def test_cuda_opts_in_to_dynamic_shared_memory(monkeypatch, scalars):
    monkeypatch.setenv("METILE_CUDA_SCALARS", scalars)
    d = prepare(16384, "cuda")          # 64 KiB of float32
    # by value, `n` is a kernel parameter: metile compiles the kernel for its target
    by_value = {"arch": d.spec.backend.target.name, "scalars_by_value": ["n"]}
    assert d.variant.data["lowering"]["launch"] == {"shared_memory": 65536, "threads": 256,
                                                    **({"arch": None} if scalars == "array" else by_value)}
    assert "extern __shared__" in d.variant.data["body"]
    small = prepare(1024, "cuda")
    assert "shared_memory" not in small.variant.data["lowering"].get("launch", {})
    assert "extern __shared__" not in small.variant.data["body"]


def test_past_the_opt_in_limit_is_an_error():
    with pytest.raises(Exception, match=r"240000 bytes of threadgroup memory; the target has 232448"):
        prepare(60000, "cuda")


def test_metal_keeps_its_32_kib():
    with pytest.raises((metile.CompilationError, Exception), match=r"32768"):
        prepare(16384, "msl")


def test_small_kernel_still_runs_on_the_cpu_runtime():
    x = mx.arange(256).astype(mx.float32)
    out = reverse_through_shared[(1,)](x, mx.zeros((256,)), 256, SIZE=512, BLOCK=256)
    np.testing.assert_array_equal(np.array(out), np.arange(256)[::-1])


def test_dynamic_shared_kernel_compiles_with_nvrtc():
    nvrtc = pytest.importorskip("nvrtc")
    if nvrtc.TOOLKIT is None:
        pytest.skip("needs the nvidia-cuda-* wheels")
    ok, log = nvrtc.compile_cuda(nvrtc.translation_unit(prepare(16384, "cuda")), "sm_90")
    assert ok, log
