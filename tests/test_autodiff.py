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


# -- hostile tests (twenty-ninth session) ---------------------------------------------------

def _grad(kernel, *arrays, argnums=0, **kw):
    return mx.grad(lambda *a: kernel[(1,)](*a, **kw).sum(), argnums=argnums)(*arrays)


@metile.kernel(differentiable=True)
def _masked_other(X, Y, n, m, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < m, other=0.5)
    metile.store(Y + offs, x * x, mask=offs < n)


def test_a_loads_own_mask_and_other_are_replayed():
    # (the backward pass read the whole input for every load: gradient 2x past the load's
    # bound, where the kernel squared `other`)
    x = mx.arange(1, 11).astype(mx.float32)
    out = _masked_other[(1,)](x, mx.zeros((10,)), 10, 5, BLOCK=16)
    assert out.tolist() == [1, 4, 9, 16, 25] + [0.25] * 5
    g = _grad(_masked_other, x, mx.zeros((10,)), 10, 5, BLOCK=16)
    assert g.tolist() == [2, 4, 6, 8, 10, 0, 0, 0, 0, 0]


@metile.kernel(differentiable=True)
def _converts(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, x.to(metile.float16).to(metile.float32) * 2.0, mask=offs < n)


@metile.kernel(differentiable=True)
def _integer_factors(X, I, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    i = metile.load(I + offs, mask=offs < n)
    metile.store(Y + offs, x * (i // 2).to(metile.float32) + x * (i % 3).to(metile.float32),
                 mask=offs < n)


def test_conversions_and_truncating_integer_division_in_the_backward_pass():
    # (every conversion crashed the backward pass: 'TileType' object has no attribute 'dtype';
    # // and % were replayed with Python's floor rounding, the kernel's truncate)
    assert _grad(_converts, mx.ones((4,)), mx.zeros((4,)), 4, BLOCK=4).tolist() == [2.0] * 4
    i = mx.array([-7, 7, -8, 5], mx.int32)
    trunc = [int(v / 2) + (v - int(v / 3) * 3) for v in (-7, 7, -8, 5)]
    g = _grad(_integer_factors, mx.ones((4,)), i, mx.zeros((4,)), 4, BLOCK=4)
    assert g.tolist() == trunc


def test_an_input_larger_than_the_outputs_gets_zero_gradient_past_them(rng):
    # (reshape error: the gradients, already the inputs' size, were padded once more)
    @metile.kernel(differentiable=True)
    def square(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + offs, mask=offs < n)
        metile.store(Y + offs, x * x, mask=offs < n)

    g = _grad(square, mx.arange(5).astype(mx.float32), mx.zeros((3,)), 3, BLOCK=4)
    assert g.tolist() == [0, 2, 4, 0, 0]


@metile.kernel(differentiable=True)
def _larger(X, Y, Z, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    y = metile.load(Y + offs, mask=offs < n)
    metile.store(Z + offs, metile.maximum(x, y) * 3.0, mask=offs < n)


def test_maximum_with_a_nan_operand_differentiates_the_number_it_gives():
    # (the replay used MLX's NaN-propagating maximum: the chosen operand got no gradient)
    x, y = mx.array([2.0, float("nan"), 1.0]), mx.array([float("nan"), 5.0, 4.0])
    gx, gy = _grad(_larger, x, y, mx.zeros((3,)), 3, argnums=(0, 1), BLOCK=4)
    assert gx.tolist() == [3, 0, 0] and gy.tolist() == [0, 3, 3]


def test_constant_outputs_and_refusals_that_name_the_cause():
    @metile.kernel(differentiable=True)
    def constant(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + offs, mask=offs < n)
        metile.store(Y + offs, metile.full((BLOCK,), 2.0, metile.float32), mask=offs < n)

    # (a constant output failed in the vjp: "Output shape () does not match cotangent shape")
    x = mx.array([1.0, 2.0, 3.0, 4.0])
    g = mx.grad(lambda x: (constant[(1,)](x, mx.zeros((4,)), 4, BLOCK=4) * x).sum())(x)
    assert g.tolist() == [2.0] * 4

    @metile.kernel(differentiable=True)
    def positional(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + offs, mask=offs < n)
        metile.store(Y + offs, metile.where(offs < 2, x * x, x), mask=offs < n)

    # (passed the check, then a bare KeyError in the backward pass)
    with pytest.raises(metile.CompilationError, match="the stored value depends on the "
                                                      "element's position"):
        _grad(positional, x, mx.zeros((4,)), 4, BLOCK=4)

    @metile.kernel(differentiable=True)
    def in_place(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + offs, mask=offs < n)
        y = metile.load(Y + offs, mask=offs < n)
        metile.store(Y + offs, x * y, mask=offs < n)

    # (refused as a launch that does not write every output element, which it does)
    with pytest.raises(metile.CompilationError, match=r"does not take an output the kernel "
                                                      r"also loads \('Y': a read-modify-write\)"):
        _grad(in_place, x, mx.ones((4,)), 4, BLOCK=4)
