"""Split-K for skinny products (issue 13 item 8): `matmul_split_k` multiplies slices of
K in separate programs (grid axis 2) into float32 partials, `split_k_epilogue` adds them
up with the bias / activation / residual epilogue.  Numbers on the CPU runtime against
NumPy (ragged shapes, splits that leave the last ones empty, both layouts); the ops route
to it through SPLIT_K configurations (candidates for measured routing, the forced CUDA
default for few tiles over a long K); gradients as for the unsplit kernels."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import ops
from metile_kernels.gemm import (matmul_split_k, split_k_chunk, split_k_epilogue,
                                 split_k_epilogue_grid, split_k_grid)
from test_gemm import OUTPUT_TOL, operands

TILE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)


def run_split(a, b, splits, bias=None, residual=None, epilogue="none", transpose_b=False):
    m, k = a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    chunk = split_k_chunk(k, splits, TILE["BLOCK_K"])
    partial = matmul_split_k[split_k_grid(splits, m, n, 32, 32)](
        a, b, mx.zeros((splits, m, n)), m, n, k, chunk, **TILE, TRANSPOSE_B=transpose_b)
    return split_k_epilogue[split_k_epilogue_grid(m, n, 32)](
        partial, mx.zeros((m, n), a.dtype), a if bias is None else bias,
        a if residual is None else residual, m, n, splits, BLOCK=32,
        BIAS="none" if bias is None else "columns", RESIDUAL=residual is not None,
        EPILOGUE=epilogue)


def as64(x):
    return np.array(x.astype(mx.float32)).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,splits", [((16, 70, 300), 4), ((5, 33, 1000), 8),
                                          ((1, 1, 1), 2), ((64, 64, 64), 3), ((3, 40, 50), 16)])
def test_split_products_sum_to_the_product(rng, dtype, shape, splits):
    m, n, k = shape
    a, b, ref = operands(rng, m, n, k, dtype)
    out = run_split(a, b, splits)
    assert out.dtype == getattr(mx, dtype)
    np.testing.assert_allclose(as64(out), ref, **OUTPUT_TOL[dtype])


def test_epilogue_bias_residual_and_transposed_right_operand(rng):
    m, n, k = 9, 45, 257
    a, b, ref = operands(rng, m, n, k, "float32")
    bias = mx.array(rng.standard_normal((n,)).astype(np.float32))
    residual = mx.array(rng.standard_normal((m, n)).astype(np.float32))
    out = run_split(a, mx.array(np.array(b).T.copy()), 5, bias, residual, "relu",
                    transpose_b=True)
    want = np.maximum(ref + as64(bias), 0) + as64(residual)
    np.testing.assert_allclose(as64(out), want, **OUTPUT_TOL["float32"])


def test_split_count_only_for_few_tiles_over_a_long_k():
    block = ops.CUDA_SMALL_BLOCK
    assert ops.split_k_count(16, 4096, 4096, block) > 1        # decode-shaped: 64 tiles
    assert ops.split_k_count(4096, 4096, 4096, block) == 1     # the grid fills the GPU
    assert ops.split_k_count(16, 4096, 64, block) == 1         # K too short to split
    assert ops.split_k_count(1, 64, 1 << 20, block) == 16      # capped


def test_configs_offer_split_variants_for_skinny_shapes():
    names = [ops._config_name(c) for c in ops.metile_configs(mx.float32, "a@b", (16, 64, 4096))]
    assert any("SPLIT_K=" in n for n in names)
    square = ops.metile_configs(mx.float32, "a@b", (4096, 4096, 4096))
    assert not any("SPLIT_K" in c for c in square)


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_ops_split_configuration_numbers_and_gradients(rng, activation):
    m, n, k = 6, 40, 200
    x, w_t, ref = operands(rng, m, n, k, "float32")
    w = mx.array(np.array(w_t).T.copy())               # (N, K) as a Linear stores it
    bias = mx.array(rng.standard_normal((n,)).astype(np.float32))
    block = {**ops.BLOCK, "SPLIT_K": 4}

    def metile_linear(x, w, bias):
        return ops._linear_metile(x, w, bias, activation, ops.LEAKY_SLOPE, block)

    def mlx_linear(x, w, bias):
        return ops._linear_mlx(x, w, bias, activation, ops.LEAKY_SLOPE)

    np.testing.assert_allclose(as64(metile_linear(x, w, bias)), as64(mlx_linear(x, w, bias)),
                               rtol=3e-4, atol=3e-5)
    loss = lambda f: (lambda *p: (f(*p) ** 2).sum())  # noqa: E731
    got = mx.grad(loss(metile_linear), argnums=(0, 1, 2))(x, w, bias)
    want = mx.grad(loss(mlx_linear), argnums=(0, 1, 2))(x, w, bias)
    for g, h in zip(got, want):
        np.testing.assert_allclose(as64(g), as64(h), rtol=1e-3, atol=1e-3)


def test_split_kernel_compiles_for_cuda():
    nvrtc = pytest.importorskip("nvrtc")
    if nvrtc.TOOLKIT is None:
        pytest.skip("needs the nvidia-cuda-* wheels")
    a = mx.zeros((16, 512), mx.float16)
    b = mx.zeros((512, 256), mx.float16)
    d = matmul_split_k[split_k_grid(4, 16, 256, 64, 64)].prepare(
        a, b, mx.zeros((4, 16, 256)), 16, 256, 512, 128, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32,
        num_simdgroups=4, backend="cuda")
    ok, log = nvrtc.compile_cuda(nvrtc.translation_unit(d), "sm_90")
    assert ok, log


@pytest.mark.parametrize("backend", [None, "cuda"])
def test_the_epilogue_store_covers_its_output(backend):
    # each program's (row, columns) store is proven to cover the output, so the launch does
    # not zero-fill it, write a mask of what was stored and merge (three extra passes over
    # the output: 38 us at 512x2560 on the H200 before this form)
    m, n, splits = 7, 70, 3
    p = mx.zeros((splits, m, n))
    kw = {} if backend is None else {"backend": backend}
    d = split_k_epilogue[split_k_epilogue_grid(m, n, 32)].prepare(
        p, mx.zeros((m, n), mx.float16), p, p, m, n, splits, BLOCK=32, **kw)
    assert d.variant.data["outputs"] == ["output"] and not d.tracked


def test_epilogue_with_a_bias_per_row(rng):
    # BIAS="rows": one bias a row (program r's), broadcast along its columns
    m, n, splits = 9, 70, 3
    partial = mx.array(rng.standard_normal((splits, m, n)).astype(np.float32))
    bias = mx.array(rng.standard_normal((m,)).astype(np.float32))
    out = split_k_epilogue[split_k_epilogue_grid(m, n, 32)](
        partial, mx.zeros((m, n)), bias, partial, m, n, splits, BLOCK=32, BIAS="rows")
    want = np.array(partial).astype(np.float64).sum(0) + np.array(bias)[:, None]
    np.testing.assert_allclose(as64(out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["matmul", "linear", "linear_bias_residual"])
def test_a_repeated_split_call_replays_its_two_launches(rng, monkeypatch, op):
    # (decode-sized products on the H200 split K: the split product and its merge replay
    # as one chain, the merge reading the bias and residual: op_replay.remember)
    from metile import op_replay
    real = ops._block
    monkeypatch.setattr(ops, "_block", lambda *a, **kw: {**real(*a, **kw), "SPLIT_K": 3})
    native = []
    monkeypatch.setattr(op_replay._REPLAYS, "observer", lambda name, kernel: native.append(kernel))
    m, n, k = 3, 40, 200
    for _ in range(3):
        x, w_t, ref = operands(rng, m, n, k, "float32")
        w = mx.array(np.array(w_t).T.copy())
        bias = mx.array(rng.standard_normal((n,)).astype(np.float32))
        residual = mx.array(rng.standard_normal((m, n)).astype(np.float32))
        if op == "matmul":
            out = ops.matmul(x, w_t, epilogue="relu", backend="metile")
            want = np.maximum(ref, 0)
        elif op == "linear":
            out = ops.linear(x, w, None, "gelu_tanh", backend="metile")
            want = as64(ops._linear_mlx(x, w, None, "gelu_tanh", 0.0))
        else:
            out = ops.linear(x, w, bias, "relu", residual=residual, backend="metile")
            want = np.maximum(ref + as64(bias), 0) + as64(residual)
        np.testing.assert_allclose(as64(out), want, rtol=3e-4, atol=3e-4)
    assert native == [True, True]
    if op == "linear_bias_residual":
        got = mx.grad(lambda x, b: (ops.linear(x, w, b, "relu", residual=residual,
                                               backend="metile") ** 2).sum(),
                      argnums=(0, 1))(x, bias)
        want = mx.grad(lambda x, b: ((mx.maximum(x @ w.T + b, 0) + residual) ** 2).sum(),
                       argnums=(0, 1))(x, bias)
        for g, h in zip(got, want):
            np.testing.assert_allclose(as64(g), as64(h), rtol=1e-3, atol=1e-3)
