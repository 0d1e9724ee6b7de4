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


@metile.kernel(differentiable=True)
def _trig(X, Y, Z, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    y = metile.load(Y + offs, mask=m)
    metile.store(Z + offs, metile.sin(x) * metile.pow(y, 2.0) + metile.atan2(x, y), mask=m)


@metile.kernel(differentiable=True)
def _bits(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=m) ^ 3, mask=m)


def test_math_added_for_triton_has_gradients():
    xn = np.linspace(-1.0, 1.0, 9).astype(np.float32)
    yn = np.linspace(0.5, 2.0, 9).astype(np.float32)
    f = lambda a, b: _trig[(1,)](a, b, mx.zeros((9,)), 9, BLOCK=16).sum()  # noqa: E731
    gx, gy = mx.grad(f, argnums=(0, 1))(mx.array(xn), mx.array(yn))
    x, y = xn.astype(np.float64), yn.astype(np.float64)
    np.testing.assert_allclose(np.array(gx), np.cos(x) * y**2 + y / (x**2 + y**2), rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(gy), 2 * np.sin(x) * y - x / (x**2 + y**2), rtol=3e-4, atol=3e-5)


def test_an_op_the_backward_pass_cannot_replay_is_refused():
    with pytest.raises(metile.CompilationError, match="the backward pass cannot replay 'xor' as an MLX op"):
        mx.grad(lambda a: _bits[(1,)](a, mx.zeros((8,), mx.int32), 8, BLOCK=8).astype(mx.float32)
                .sum())(mx.arange(8, dtype=mx.int32))
