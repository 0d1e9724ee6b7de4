"""Runtime scalars of CUDA kernels passed by value (the default where metile finds NVRTC;
METILE_CUDA_SCALARS=value / array chooses).

MLX hands a kernel's 0-d scalar arrays over as pointers into a managed-memory pool; the
setting makes CUDA kernels take their int32/float32/bool scalars as kernel parameters
instead, compiled by metile and launched precompiled (the warpgroup GEMM already is).  On this machine: the
setting's validation, the emitted body and signature, NVRTC compiling it, the launch's
split of arrays and values.  On an H200: the numbers against NumPy.
"""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.runtime.cuda_kernel import split_value_inputs
from metile_kernels.gemm import grid, matmul, matmul_epilogue
from test_gemm import check, operands

nvrtc = pytest.importorskip("nvrtc")
WG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)
on_gpu = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                            reason="runs on MLX's CUDA backend (sm_90)")


@pytest.fixture(autouse=True)
def whole_variant(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "whole")


def prepare(m=1000, n=1000, k=1000, kernel=matmul, extra=(), tile=WG, **kw):
    a, b = mx.zeros((m, k), dtype=mx.float16), mx.zeros((k, n), dtype=mx.float16)
    return kernel[grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])].prepare(
        a, b, mx.zeros((m, n), dtype=mx.float16), m, n, k, *extra, **tile, backend="cuda", **kw)


def signature(source: str) -> str:
    return re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?\w+\(([^)]*)\)',
                     source).group(1)


def test_unknown_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "registers")
    with pytest.raises(ValueError, match="METILE_CUDA_SCALARS='registers' is not one of array, value"):
        prepare()


def test_by_value_by_default_where_nvrtc_is_found(monkeypatch):
    from metile.runtime import nvrtc as runtime_nvrtc
    monkeypatch.delenv("METILE_CUDA_SCALARS", raising=False)
    d = prepare()
    assert d.variant.data["lowering"]["launch"]["scalars_by_value"] == ["rows", "columns", "inner"]
    assert "rows[0]" not in d.variant.data["body"] and d.call_kwargs["scalars"] == [1000] * 3

    def missing():
        raise runtime_nvrtc.NvrtcUnavailable("no NVRTC here")
    monkeypatch.setattr(runtime_nvrtc, "find_toolkit", missing)
    d = prepare()   # without metile's NVRTC, MLX compiles the kernel: pointers
    assert "scalars_by_value" not in d.variant.data["lowering"]["launch"]
    assert "rows[0]" in d.variant.data["body"] and "scalars" not in d.call_kwargs


def test_precompiled_kernel_takes_scalars_by_value(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    d = prepare(1000, 999, 998, matmul_epilogue, (1.25, -0.5), EPILOGUE="affine_leaky",
                NEGATIVE_SLOPE=0.1)
    data = d.variant.data
    assert data["lowering"]["launch"]["scalars_by_value"] == ["rows", "columns", "inner",
                                                              "alpha", "beta"]
    assert "rows[0]" not in data["body"] and "alpha[0]" not in data["body"]
    # the launch passes the Python values; the 0-d arrays stay aligned with the inputs
    assert d.call_kwargs["scalars"] == [1000, 999, 998, 1.25, -0.5]
    assert len(d.call_kwargs["inputs"]) == len(data["inputs"])
    kernel = d.variant.callable()
    name, source = kernel.translation_unit([x.dtype for x in d.call_kwargs["inputs"]],
                                           d.call_kwargs["output_dtypes"],
                                           d.call_kwargs["threadgroup"])
    # MLX's precompiled_cuda_kernel passes inputs, outputs, then the scalars by value
    assert signature(source).split(", ") == [
        "const __half* __restrict__ left", "const __half* __restrict__ right",
        "__half* __restrict__ output", "int32_t rows", "int32_t columns", "int32_t inner",
        "float alpha", "float beta"]
    if nvrtc.TOOLKIT is not None:
        assert nvrtc.compile_cuda(source, "sm_90a")[0]
    # the other setting is another specialization, not the cached one
    monkeypatch.setenv("METILE_CUDA_SCALARS", "array")
    assert "rows[0]" in prepare(1000, 999, 998, matmul_epilogue, (1.25, -0.5),
                                EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.1).variant.data["body"]


@metile.kernel
def axpy(X, Y, Out, alpha, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Out + offs, alpha * metile.load(X + offs, mask=mask) + metile.load(Y + offs, mask=mask),
                 mask=mask)


@pytest.mark.parametrize("case", ["mma.sync tile", "elementwise"])
def test_other_kernels_are_precompiled_for_their_target(case, monkeypatch):
    # MLX's own cuda_kernel passes arrays only: with scalars by value metile compiles the
    # kernel for the target's architecture (sm_90 for the reference target) and launches it
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    if case == "elementwise":
        x, y, out = (mx.zeros((1000,), dtype=mx.float32) for _ in range(3))
        d = axpy[(4,)].prepare(x, y, out, 2.0, 1000, BLOCK=256, backend="cuda")
        expected = ["alpha", "n"]
    else:
        d = prepare(tile=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32))
        expected = ["rows", "columns", "inner"]
    launch = d.variant.data["lowering"]["launch"]
    assert launch["arch"] == "sm_90" and launch["scalars_by_value"] == expected
    kernel = d.variant.callable()
    assert kernel.arch == "sm_90"
    name, source = kernel.translation_unit([x.dtype for x in d.call_kwargs["inputs"]],
                                           d.call_kwargs["output_dtypes"],
                                           d.call_kwargs["threadgroup"])
    assert all(f"{n}[0]" not in source for n in expected)
    if nvrtc.TOOLKIT is not None:
        ok, log = nvrtc.compile_cuda(source, "sm_90")
        assert ok, log
    monkeypatch.setenv("METILE_CUDA_SCALARS", "array")
    if case == "mma.sync tile":
        assert not (prepare(tile=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32))
                    .variant.data["lowering"].get("launch") or {}).get("arch")


@metile.kernel
def plus_one(X, Y):
    metile.store(Y, metile.load(X) + 1.0)


def test_a_kernel_without_scalars_is_precompiled_too(monkeypatch):
    # every kernel metile compiles runs on its own launch primitive under "value", not only
    # those with a scalar to pass: MLX's cuda_kernel binding costs more host time a launch
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    x, y = mx.zeros((1,), dtype=mx.float32), mx.zeros((1,), dtype=mx.float32)
    d = plus_one[(1,)].prepare(x, y, backend="cuda")
    launch = d.variant.data["lowering"]["launch"]
    assert launch["arch"] == "sm_90" and not launch.get("scalars_by_value")
    kernel = d.variant.callable()
    assert kernel.arch == "sm_90"
    if nvrtc.TOOLKIT is not None:
        name, source = kernel.translation_unit([x.dtype], d.call_kwargs["output_dtypes"],
                                               d.call_kwargs["threadgroup"])
        ok, log = nvrtc.compile_cuda(source, "sm_90")
        assert ok, log
    monkeypatch.setenv("METILE_CUDA_SCALARS", "array")   # MLX compiles it: no arch
    d = plus_one[(1,)].prepare(x, y, backend="cuda")
    assert not (d.variant.data["lowering"].get("launch") or {}).get("arch")


def test_a_zero_d_array_scalar_is_read_on_the_host(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    m = n = k = 300
    a, b = mx.zeros((m, k), dtype=mx.float16), mx.zeros((k, n), dtype=mx.float16)
    d = matmul[grid(m, n, 128, 256)].prepare(a, b, mx.zeros((m, n), dtype=mx.float16),
                                             mx.array(m), n, k, **WG, backend="cuda")
    assert d.call_kwargs["scalars"] == [m, n, k]
    assert d._key is None   # its value is not part of the launch key: never reused by key


@pytest.mark.skipif(nvrtc.TOOLKIT is None, reason="needs the nvidia-cuda-* wheels")
def test_launch_hands_arrays_and_values_to_the_binding(monkeypatch, stand_in_gpu):
    # No GPU here: stand in for the device check and record what the binding gets.
    from metile import _ext
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")   # this tests MLX's precompiled binding
    seen = []
    monkeypatch.setattr(_ext, "launch_precompiled_cuda", lambda *args: seen.append(args) or
                        [mx.zeros((130, 70), dtype=mx.float16)])
    d = prepare(130, 70, 90, matmul_epilogue, (2.0, 0.25), EPILOGUE="affine", NEGATIVE_SLOPE=0.1)
    d.variant.callable()(**d.call_kwargs)   # what Dispatch._launch calls on a GPU
    name, cubin, inputs, shapes, dtypes, grid_, threads, smem, init, contiguous, stream, \
        scalars = seen[-1]
    assert [x.shape for x in inputs] == [(130, 90), (90, 70)]   # the operands only
    assert scalars == [130, 70, 90, 2.0, 0.25] and shapes == [[130, 70]]
    assert cubin[:4] == b"\x7fELF" and stream is stand_in_gpu


def test_split_value_inputs():
    arrays = [mx.zeros((2,)), mx.array(7), mx.zeros((3,)), mx.array(2.5), mx.array(True)]
    kept, values = split_value_inputs(arrays, (1, 3, 4))
    assert [x.shape for x in kept] == [(2,), (3,)] and values == [7, 2.5, True]
    kept, values = split_value_inputs(arrays, (1,), [np.int32(9)])
    assert len(kept) == 4 and values == [9] and type(values[0]) is int
    assert split_value_inputs(arrays, ()) == (arrays, [])
    with pytest.raises(ValueError, match="expected 2 scalars passed by value, got 1"):
        split_value_inputs(arrays, (1, 3), [1])


def test_value_inputs_need_a_precompiled_kernel():
    with pytest.raises(ValueError, match="must name inputs of a kernel with an arch"):
        metile.cuda_kernel("k", ["x", "n"], ["y"], "y[0] = x[0] * n;", value_inputs=["n"])
    with pytest.raises(ValueError, match="must name inputs of a kernel with an arch"):
        metile.cuda_kernel("k", ["x", "n"], ["y"], "y[0] = x[0] * n;", arch="sm_90a",
                           value_inputs=["m"])


@on_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_by_value_scalars_on_the_gpu(rng, dtype, monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    for m, n, k in [(129, 257, 65), (1000, 1000, 1000), (300, 700, 200), (1, 1, 1)]:
        a, b, ref = operands(rng, m, n, k, dtype)
        out = matmul_epilogue[grid(m, n, 128, 256)](
            a, b, mx.zeros((m, n), dtype=getattr(mx, dtype)), m, n, k, 1.25, -0.5, **WG,
            EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.1)
        z = 1.25 * ref - 0.5
        check(out, np.where(z > 0, z, 0.1 * z), dtype)


@on_gpu
def test_by_value_elementwise_on_the_gpu(rng, monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    x, y = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    out = axpy[(4,)](mx.array(x), mx.array(y), mx.zeros((1000,)), 2.5, 1000, BLOCK=256)
    np.testing.assert_allclose(np.array(out), 2.5 * x + y, rtol=1e-6, atol=1e-6)


def test_the_binding_takes_scalars_after_the_stream():
    # the real extension (no GPU needed to reach its argument checks): a list of values
    # converts, and anything but bool/int/float is refused before MLX sees it
    from metile import _ext
    args = ("k", b"\x7fELF", [mx.zeros((2,))], [[2]], [mx.float32], (2, 1, 1), (2, 1, 1), 0,
            None, True, mx.default_stream(mx.cpu))
    with pytest.raises(ValueError, match="a scalar passed by value must be a bool, int or float"):
        _ext.launch_precompiled_cuda(*args, ["x"])
    if not mx.cuda.is_available():
        for values in ([], [3, 2.5, True]):
            with pytest.raises(RuntimeError, match="CUDA"):   # converted: MLX's own refusal
                _ext.launch_precompiled_cuda(*args, values)
