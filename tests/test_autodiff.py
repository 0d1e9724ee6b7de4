"""Expression vjp: @metile.kernel(differentiable=True) on pointwise kernels."""

import math

import mlx.core as mx
import numpy as np
import pytest

import metile


@metile.kernel(differentiable=True)
def gelu_bias(X, B, Y, scale, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    z = metile.load(X + offs, mask=mask) * scale + metile.load(B + offs, mask=mask)
    y = 0.5 * z * (1.0 + metile.erf(z * 0.7071067811865476))
    metile.store(Y + offs, metile.where(z > 3.0, z, y), mask=mask)


@metile.kernel(differentiable=True)
def row_sum(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, x * metile.sum(x), mask=offs < n)


def reference_grads(x, b, scale):
    z = x.astype(np.float64) * scale + b
    erf = np.vectorize(math.erf)
    dy = 0.5 * (1 + erf(z / math.sqrt(2))) + z * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    dz = np.where(z > 3.0, 1.0, dy)
    return dz * scale, dz


@pytest.mark.parametrize("n", [1, 65, 1000])
def test_gradients_match_numpy(rng, n):
    x = rng.standard_normal(n).astype(np.float32) * 2
    b = rng.standard_normal(n).astype(np.float32)

    def loss(x, b):
        y = gelu_bias[(metile.cdiv(n, 256),)](x, b, mx.zeros((n,)), 0.75, n, BLOCK=256)
        return (y * mx.arange(n)).sum()

    gx, gb = mx.grad(loss, argnums=(0, 1))(mx.array(x), mx.array(b))
    rx, rb = reference_grads(x, b, 0.75)
    weights = np.arange(n)
    np.testing.assert_allclose(np.array(gx), rx * weights, rtol=3e-4, atol=3e-5 * max(n, 1))
    np.testing.assert_allclose(np.array(gb), rb * weights, rtol=3e-4, atol=3e-5 * max(n, 1))
    # the same inside mx.compile, against NumPy: compile fuses MLX's own ops around the
    # kernel (the cotangent product), so on a GPU the last bits may differ from eager
    cx = mx.compile(mx.grad(loss))(mx.array(x), mx.array(b))
    np.testing.assert_allclose(np.array(cx), rx * weights, rtol=3e-4, atol=3e-5 * max(n, 1))


def test_forward_values_are_the_kernels(rng):
    x = rng.standard_normal(300).astype(np.float32)
    y = gelu_bias[(2,)](mx.array(x), mx.zeros((300,)), mx.zeros((300,)), 1.0, 300, BLOCK=256)
    z = x.astype(np.float64)
    ref = np.where(z > 3, z, 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2))))
    np.testing.assert_allclose(np.array(y), ref, rtol=3e-4, atol=3e-5)


def test_non_pointwise_kernels_are_rejected():
    with pytest.raises(metile.CompilationError) as info:
        row_sum[(1,)](mx.ones((8,)), mx.zeros((8,)), 8, BLOCK=8)
    message = str(info.value)
    assert "differentiable=True needs a pointwise kernel: 'reduce' is not an elementwise operation" in message
    assert "test_autodiff.py:25:" in message.splitlines()[0]  # the metile.sum line


def test_partial_launches_are_rejected():
    with pytest.raises(metile.CompilationError, match="write every output element"):
        gelu_bias[(1,)](mx.ones((300,)), mx.ones((300,)), mx.zeros((300,)), 1.0, 300, BLOCK=256)
