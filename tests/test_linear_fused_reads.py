"""metile.ops.linear with a fused bias + activation + residual epilogue (one
linear_epilogue kernel on the metile path) against NumPy, the MLX composite computing
the same, and gradients against NumPy and MLX.  CPU runtime, race and bounds checked."""

import json

import mlx.core as mx
import numpy as np
import pytest

from metile import ops

TOL = {"float32": dict(rtol=3e-4, atol=3e-5), "float16": dict(rtol=2e-3, atol=2e-3),
       "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}


@pytest.fixture(autouse=True)
def race_check(monkeypatch):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")


def arrays(rng, shape, dtype):
    x = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, dtype))
    return x, np.array(x.astype(mx.float32)).astype(np.float64)


def gelu(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_bias_activation_residual_both_backends(rng, dtype):
    for lead, k, n in [((1,), 7, 1), ((2, 65), 33, 70)]:
        x, xr = arrays(rng, (*lead, k), dtype)
        w, wr = arrays(rng, (n, k), dtype)
        b, br = arrays(rng, (n,), dtype)
        r, rr = arrays(rng, (*lead, n), dtype)
        ref = gelu(xr @ wr.T + br) + rr
        for backend in ("metile", "mlx"):
            y = ops.linear(x, w, b, "gelu_tanh", residual=r, backend=backend)
            assert y.shape == (*lead, n) and y.dtype == x.dtype
            np.testing.assert_allclose(np.array(y.astype(mx.float32)), ref, **TOL[dtype])


def test_residual_without_bias_and_bias_without_activation(rng):
    x, xr = arrays(rng, (9, 17), "float32")
    w, wr = arrays(rng, (13, 17), "float32")
    b, br = arrays(rng, (13,), "float32")
    r, rr = arrays(rng, (9, 13), "float32")
    y = ops.linear(x, w, residual=r, activation="relu", backend="metile")
    np.testing.assert_allclose(np.array(y), np.maximum(xr @ wr.T, 0) + rr, **TOL["float32"])
    y = ops.linear(x, w, b, backend="metile")
    np.testing.assert_allclose(np.array(y), xr @ wr.T + br, **TOL["float32"])
    info = json.loads(ops.explain_linear(x, w, b, "relu", residual=r, backend="metile"))
    assert [e["buffer"] for e in info["epilogue_reads"]] == ["bias", "residual"]


@pytest.mark.parametrize("activation", ["silu", "leaky_relu"])
def test_gradients_bias_residual_against_numpy_and_mlx(rng, activation):
    x, xr = arrays(rng, (6, 10), "float32")
    w, wr = arrays(rng, (5, 10), "float32")
    b, br = arrays(rng, (5,), "float32")
    r, rr = arrays(rng, (6, 5), "float32")
    g, gr = arrays(rng, (6, 5), "float32")

    def loss(backend):
        return lambda x, w, b, r: (ops.linear(x, w, b, activation, residual=r,
                                              backend=backend) * g).sum()

    got = mx.grad(loss("metile"), argnums=(0, 1, 2, 3))(x, w, b, r)
    mlx = mx.grad(loss("mlx"), argnums=(0, 1, 2, 3))(x, w, b, r)
    z = xr @ wr.T + br
    if activation == "silu":
        s = 1 / (1 + np.exp(-z))
        d = s * (1 + z * (1 - s))
    else:
        d = np.where(z > 0, 1.0, ops.LEAKY_SLOPE)
    up = gr * d
    want = [up @ wr, up.T @ xr, up.sum(axis=0), gr]
    for got_i, mlx_i, want_i in zip(got, mlx, want):
        np.testing.assert_allclose(np.array(got_i), want_i, rtol=3e-4, atol=3e-5)
        np.testing.assert_allclose(np.array(mlx_i), want_i, rtol=3e-4, atol=3e-5)


def test_residual_is_checked():
    x, w = mx.zeros((4, 8)), mx.zeros((3, 8))
    with pytest.raises(ValueError, match=r"residual shape \(4, 4\) does not broadcast to the "
                                         r"output shape \(4, 3\)"):
        ops.linear(x, w, residual=mx.zeros((4, 4)))
    # a residual of another float dtype promotes as MLX's add (test_ops.py)
    assert ops.linear(x, w, residual=mx.zeros((4, 3), mx.float16)).dtype == mx.float32


@pytest.mark.parametrize("backend", ["auto", "mlx", "metile"])
def test_a_bias_that_would_widen_the_output_is_refused_by_name(backend):
    # (a hostile trial: metile's message called a (1, 1, N) bias per-row and advised
    # backend='auto' or 'mlx', where MLX's addmm failed with its own message)
    x, w, b = mx.zeros((5, 8)), mx.zeros((4, 8)), mx.zeros((1, 1, 4))
    with pytest.raises(ValueError, match=r"bias shape \(1, 1, 4\) does not broadcast to the 4 "
                                         r"output features of the output shape \(5, 4\)"):
        ops.linear(x, w, b, backend=backend)
