"""The right GEMM operand read as stored, (N, K) row-major through strides (1, K)
(TRANSPOSE_B in metile_kernels/gemm.py): an nn.Linear weight and a `w.T` view given
to ops.matmul reach the kernel without a transposed copy.  The proof is the lazy
graph (no Transpose feeding the custom-kernel call's contiguity copy) and the bytes
MLX allocates for a call with a large weight; numbers against NumPy on the CPU
runtime with race and bounds checks; gradients against MLX; CUDA staging falls back
from 16-byte asynchronous copies (source checked only: no GPU here)."""

import gc
import json
import os

import mlx.core as mx
import numpy as np
import pytest

from metile import _ext, lazy_graph, ops
from metile_kernels.gemm import grid, linear_epilogue, matmul_epilogue

TOL = {"float32": dict(rtol=3e-4, atol=3e-5), "float16": dict(rtol=2e-3, atol=2e-3),
       "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "1")


def arrays(rng, shape, dtype):
    x = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, dtype))
    return x, np.array(x.astype(mx.float32)).astype(np.float64)


def gelu(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


# -- no copy --------------------------------------------------------------------------------------

def _kernel_node() -> str:
    if mx.default_device().type != mx.gpu:
        return "MetileMslCpuKernel"
    own = getattr(_ext, "has_cuda_launch", False) and os.environ.get("METILE_CUDA_LAUNCH") != "mlx"
    return "MetileCudaKernel" if own else "CustomKernel"


def test_linear_graph_has_no_transposed_copy(rng):
    x, _ = arrays(rng, (5, 24), "float32")
    w, _ = arrays(rng, (40, 24), "float32")
    b, _ = arrays(rng, (40,), "float32")
    r, _ = arrays(rng, (5, 40), "float32")
    for args, kw in (((x, w), {}), ((x, w, b, "gelu_tanh"), {"residual": r})):
        g = lazy_graph.graph(ops.linear(*args, backend="metile", **kw))
        # metile's CUDA launch primitive (or MLX's custom-kernel node) on a GPU, the CPU
        # runtime's own primitive elsewhere
        node = _kernel_node()
        assert g.count(node) == 1
        assert g.count("Transpose") == 0 and g.feeding("Contiguous", "Transpose") == 0
    # the same count sees the copy the row-major kernel needs (the layout before TRANSPOSE_B):
    # a Contiguous node in the CPU runtime; MLX's CUDA custom kernel copies a strided input
    # inside its own evaluation, so there the transposed view feeds the kernel itself (the
    # bytes that copy allocates are measured by test_large_weight_is_not_copied)
    old = lazy_graph.graph(ops._linear_metile(x, w, b, "gelu_tanh", ops.LEAKY_SLOPE, ops.BLOCK, r))
    if _kernel_node() == "CustomKernel":
        assert old.feeding("CustomKernel", "Transpose") == 1
    else:   # the CPU runtime and metile's CUDA launch make a lazy strided input contiguous
        assert old.feeding("Contiguous", "Transpose") == 1


def _allocated(run) -> int:
    """Peak bytes MLX allocates while evaluating run() beyond what was live before.  Garbage
    from earlier tests is collected first and collection is held off during the window: a
    cycle freed inside it lowered what was live below `base` (a CI run measured the copying
    path 5 KB short of its weight and half its output)."""
    gc.collect()
    gc.disable()
    try:
        mx.synchronize()
        mx.clear_cache()
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        mx.eval(run())
        mx.synchronize()
        return mx.get_peak_memory() - base
    finally:
        gc.enable()


@pytest.mark.parametrize("op", ["linear", "matmul_of_transposed_view"])
def test_large_weight_is_not_copied(rng, monkeypatch, op):
    # The check modes copy buffers outside MLX's allocator; only the plain launch matters.
    monkeypatch.delenv("METILE_RACE_CHECK", raising=False)
    monkeypatch.delenv("METILE_MSL_BOUNDS_CHECK", raising=False)
    m, n, k = 4, 8192, 64                     # a 2 MiB weight, a 128 KiB output
    x, xr = arrays(rng, (m, k), "float32")
    w, wr = arrays(rng, (n, k), "float32")
    if op == "linear":
        def run():
            return ops.linear(x, w, backend="metile")
    else:
        def run():
            return ops.matmul(x, w.T, backend="metile")
    np.testing.assert_allclose(np.array(run()), xr @ wr.T, **TOL["float32"])   # compiled, warm
    out_bytes = m * n * 4
    assert _allocated(run) < out_bytes + w.nbytes // 4
    # the row-major kernel given w.T: MLX copies the whole weight first
    copied = _allocated(lambda: ops._fused_matmul(None, ops.LEAKY_SLOPE, ops.BLOCK)(x, w.T))
    # (on CUDA the copy's buffer may reuse a pooled block that the peak already counted up to
    # a few hundred bytes of the output's rounding: the weight's own bytes are what must show)
    assert copied >= w.nbytes + out_bytes // 2


def test_matmul_sees_a_lazy_transposed_view_only(rng):
    a, ar = arrays(rng, (9, 21), "float32")
    w, wr = arrays(rng, (13, 21), "float32")
    assert lazy_graph.is_transposed_view(w.T) and not lazy_graph.is_transposed_view(w)
    assert not lazy_graph.is_transposed_view(mx.contiguous(w.T))
    info = json.loads(ops.explain_matmul(a, w.T, backend="metile"))
    small_f32 = ops.CUDA_F32_SMALL_BLOCK if ops._on_cuda() else ops.BLOCK
    assert info["config"] == {**small_f32, "TRANSPOSE_B": True}
    # an evaluated view has no graph left: read as row-major (and copied), same numbers
    view = w.T
    mx.eval(view)
    assert not lazy_graph.is_transposed_view(view)
    assert json.loads(ops.explain_matmul(a, view, backend="metile"))["config"] == small_f32
    for b in (w.T, view, mx.contiguous(w.T)):
        np.testing.assert_allclose(np.array(ops.matmul(a, b, backend="metile")), ar @ wr.T,
                                   **TOL["float32"])


# -- numbers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_kernels_with_transposed_b_against_numpy(rng, checked, dtype):
    for (m, n, k), tile in (((37, 45, 29), (32, 32, 16)), ((70, 33, 50), (64, 64, 16))):
        a, ar = arrays(rng, (m, k), dtype)
        w, wr = arrays(rng, (n, k), dtype)
        bias, br = arrays(rng, (n,), dtype)
        res, rr = arrays(rng, (m, n), dtype)
        bm, bn, bk = tile
        tiles = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, TRANSPOSE_B=True)
        out = matmul_epilogue[grid(m, n, bm, bn)](
            a, w, mx.zeros((m, n), a.dtype), m, n, k, 1.5, -0.25, EPILOGUE="affine_leaky",
            NEGATIVE_SLOPE=0.1, **tiles)
        z = 1.5 * (ar @ wr.T) - 0.25
        np.testing.assert_allclose(np.array(out.astype(mx.float32)), np.where(z > 0, z, 0.1 * z),
                                   **TOL[dtype])
        out = linear_epilogue[grid(m, n, bm, bn)](
            a, w, mx.zeros((m, n), a.dtype), bias, res, m, n, k, BIAS="columns", RESIDUAL=True,
            EPILOGUE="gelu_tanh", **tiles)
        np.testing.assert_allclose(np.array(out.astype(mx.float32)), gelu(ar @ wr.T + br) + rr,
                                   **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_ops_on_stored_weights_against_numpy(rng, checked, dtype):
    x, xr = arrays(rng, (3, 11, 19), dtype)
    w, wr = arrays(rng, (23, 19), dtype)
    b, br = arrays(rng, (23,), dtype)
    r, rr = arrays(rng, (3, 11, 23), dtype)
    y = ops.linear(x, w, b, "relu", residual=r, backend="metile")
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), np.maximum(xr @ wr.T + br, 0) + rr,
                               **TOL[dtype])
    y = ops.matmul(x, w.T, epilogue="silu", backend="metile")
    z = xr @ wr.T
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), z / (1 + np.exp(-z)), **TOL[dtype])


def test_inside_compile(rng):
    x, xr = arrays(rng, (6, 19), "float32")
    w, wr = arrays(rng, (23, 19), "float32")
    b, br = arrays(rng, (23,), "float32")
    f = mx.compile(lambda x, w, b: ops.linear(x, w, b, "relu", backend="metile")
                   + ops.matmul(x, w.T, backend="metile"))
    np.testing.assert_allclose(np.array(f(x, w, b)), np.maximum(xr @ wr.T + br, 0) + xr @ wr.T,
                               **TOL["float32"])


def test_gradients_match_mlx(rng):
    a, _ = arrays(rng, (7, 12), "float32")
    w, _ = arrays(rng, (9, 12), "float32")
    b, _ = arrays(rng, (9,), "float32")
    g, _ = arrays(rng, (7, 9), "float32")

    def loss(backend):
        return lambda a, w, b: ((ops.matmul(a, w.T, epilogue="gelu_tanh", backend=backend)
                                 + ops.linear(a, w, b, "silu", backend=backend)) * g).sum()

    got = mx.grad(loss("metile"), argnums=(0, 1, 2))(a, w, b)
    want = mx.grad(loss("mlx"), argnums=(0, 1, 2))(a, w, b)
    for got_i, want_i in zip(got, want):
        np.testing.assert_allclose(np.array(got_i), np.array(want_i), rtol=1e-4, atol=1e-5)


# -- routing and CUDA -----------------------------------------------------------------------------

def test_transposed_layouts_are_their_own_candidates(monkeypatch):
    monkeypatch.setattr(ops, "_warpgroup_gemm", lambda: False)   # (sm_90: tested below)
    monkeypatch.setattr(ops, "_on_cuda", lambda: False)
    assert ops.metile_configs(mx.float16, "x@w.T") == [{**ops.BLOCK, "TRANSPOSE_B": True}]
    monkeypatch.setattr(ops, "_on_cuda", lambda: True)
    cuda = ops.metile_configs(mx.float16, "a@b.T")
    # the stored layout without a copy, and the row-major kernels after MLX's copy (only
    # they stage through 16-byte asynchronous copies): measured, not assumed
    assert cuda == [{**ops.CUDA_BLOCK, "TRANSPOSE_B": True},
                    {**ops.CUDA_SMALL_BLOCK, "TRANSPOSE_B": True},
                    ops.CUDA_BLOCK, ops.CUDA_SMALL_BLOCK]
    assert len({ops._config_name(c) for c in cuda}) == 4
    # on sm_90 the two warpgroup tiles lead both halves
    monkeypatch.setattr(ops, "_warpgroup_gemm", lambda: True)
    hopper = ops.metile_configs(mx.float16, "a@b.T")
    wgmma = [ops._wgmma_block(), ops._wgmma_block(ops.CUDA_WGMMA_SMALL_BLOCK)]
    assert hopper[:2] == [{**c, "TRANSPOSE_B": True} for c in wgmma]
    assert hopper[4:6] == wgmma and hopper[2:4] + hopper[6:] == cuda
    keys = {ops._signature("matmul", mx.float16, 64, 128, 64, layout, None, False)[0]
            for layout in ("a@b", "a@b.T")}
    assert len(keys) == 2
    with pytest.raises(ValueError, match=r"\[metile.ops\] unknown layout 'b@a'"):
        ops.metile_configs(mx.float16, "b@a")


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_cuda_strided_b_falls_back_from_async_copies(dtype):
    m, n, k = 200, 136, 72

    def lowering(transpose_b):
        b = mx.zeros((n, k) if transpose_b else (k, n), dtype)
        d = linear_epilogue[grid(m, n, 128, 128)].prepare(
            mx.zeros((m, k), dtype), b, mx.zeros((m, n), dtype), mx.zeros((n,), dtype),
            mx.zeros((m, n), dtype), m, n, k, BIAS="columns", RESIDUAL=True, EPILOGUE="gelu_tanh",
            TRANSPOSE_B=transpose_b, backend="cuda", **ops.CUDA_BLOCK)
        return d.variant.data["lowering"]["matmul"]

    assert lowering(False)["async_copy"] is True
    strided = lowering(True)
    assert strided["async_copy"] is False and strided["stages"] == 1


def test_default_tiles_on_sm_90(monkeypatch):
    # the measured tiles (ops.py): 128x256x64 where its grid fills the H200's SMs,
    # 128x128x64 below that for full 128-row tiles, split-K small tiles for few rows
    monkeypatch.setattr(ops, "_on_cuda", lambda: True)
    monkeypatch.setattr(ops, "_warpgroup_gemm", lambda: True)
    assert ops._block(4096, 4096, mx.float16, k=4096) == ops.CUDA_WGMMA_BLOCK
    assert ops._block(512, 11008, mx.bfloat16, k=4096) == ops.CUDA_WGMMA_BLOCK
    for m, n in ((1024, 1024), (2048, 2048), (300, 170)):
        assert ops._block(m, n, mx.float16, k=1024) == ops.CUDA_WGMMA_SMALL_BLOCK
    decode = ops._block(16, 4096, mx.float16, k=4096)
    assert decode["BLOCK_M"] == ops.CUDA_SMALL_BLOCK["BLOCK_M"] and decode.get("SPLIT_K", 1) > 1
    # strict float32: scalar FMA from the cp.async ring, 128x128 where the grid fills the SMs
    assert ops._block(1024, 1024, mx.float32, k=1024) == ops.CUDA_F32_SMALL_BLOCK
    assert ops._block(4096, 4096, mx.float32, k=4096) == ops.CUDA_F32_BLOCK
    monkeypatch.setenv("METILE_CUDA_WGMMA", "ws")
    assert ops._block(1024, 1024, mx.float16, k=1024)["num_simdgroups"] == 12
