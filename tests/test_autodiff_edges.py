"""Gradients of differentiable kernels and ops at their edges (a hostile trial, thirty-first
session): an input shorter than the outputs, an output the loss does not use whose
derivative is singular, a runtime scalar passed as a 0-d array, elements a fragment kernel
leaves unwritten, add_rms_norm's sum alone.  Each against MLX's autodiff of the same
composite on the CPU runtime; each failed before its fix (wrong numbers, NaN or a crash).
"""

import mlx.core as mx
import numpy as np
import pytest

import metile
from test_fragments import INLINE, relu_epilogue


def grads_close(got, want, rtol=1e-5, atol=1e-6):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=rtol, atol=atol)


@metile.kernel(differentiable=True)
def pad_mul(X, Z, Y, m, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < m, other=0.0)
    z = metile.load(Z + offs, mask=offs < n)
    metile.store(Y + offs, x * z, mask=offs < n)


@pytest.mark.parametrize("m", [1, 3])
def test_an_input_shorter_than_the_outputs(m):
    # (a 1-element x was broadcast over all 8 outputs: dx 36 for 1; 3 elements raised
    # "[broadcast_shapes] Shapes (3) and (8) cannot be broadcast")
    n = 8
    x, z = mx.arange(2, 2 + m).astype(mx.float32), mx.arange(1, n + 1).astype(mx.float32)
    loss = lambda x, z: (pad_mul[(1,)](x, z, mx.zeros((n,)), m, n, BLOCK=8) * z).sum()
    ref = lambda x, z: (mx.pad(x, (0, n - m)) * z * z).sum()
    np.testing.assert_array_equal(np.array(loss(x, z)), np.array(ref(x, z)))
    grads_close(mx.grad(loss, argnums=(0, 1))(x, z), mx.grad(ref, argnums=(0, 1))(x, z))


@metile.kernel(differentiable=True)
def root_and_double(X, Y1, Y2, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y1 + offs, metile.sqrt(x), mask=offs < n)
    metile.store(Y2 + offs, x * 2.0, mask=offs < n)


def test_an_unused_output_with_a_singular_derivative_adds_nothing():
    # (Y1's zero cotangent times sqrt's derivative at 0 and below made dY2/dx NaN)
    x = mx.array([-1.0, 0.0, 1.0, 4.0])
    outs = lambda x: root_and_double[(1,)](x, mx.zeros((4,)), mx.zeros((4,)), 4, BLOCK=8)
    got = mx.grad(lambda x: outs(x)[1].sum())(x)
    np.testing.assert_array_equal(np.array(got), [2.0, 2.0, 2.0, 2.0])
    # both outputs used: each contributes where its cotangent is not zero
    got = mx.grad(lambda x: (outs(x)[0] * mx.array([0.0, 0.0, 1.0, 1.0])).sum()
                  + outs(x)[1].sum())(x)
    np.testing.assert_allclose(np.array(got), [2.0, 2.0, 2.5, 2.25])


@metile.kernel(differentiable=True)
def scale_bias_leaky(X, B, Y, scale, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    z = metile.load(X + offs, mask=mask) * scale + metile.load(B + offs, mask=mask)
    metile.store(Y + offs, metile.where(z > 0, z, 0.1 * z), mask=mask)


def test_a_scalar_passed_as_a_0d_array_gets_its_gradient():
    # (a 0-d array scalar was a constant of the derivative: mx.grad gave it 0, silently)
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal(100).astype(np.float32))
    b = mx.array(rng.standard_normal(100).astype(np.float32))
    s = mx.array(0.5)
    loss = lambda x, s: scale_bias_leaky[(2,)](x, b, mx.zeros((100,)), s, 100, BLOCK=64).sum()

    def ref(x, s):
        z = x * s + b
        return mx.where(z > 0, z, 0.1 * z).sum()
    np.testing.assert_allclose(np.array(loss(x, s)), np.array(ref(x, s)), rtol=1e-6)
    grads_close(mx.grad(loss, argnums=(0, 1))(x, s), mx.grad(ref, argnums=(0, 1))(x, s),
                rtol=1e-5)


def test_elements_a_fragment_kernel_leaves_unwritten_pass_their_gradient():
    # (the passed output's rows past `rows` reached the result unchanged, but their gradient
    # was zero: the merge read the passed array from outside the custom function)
    rng = np.random.default_rng(4)
    rows, cap = 9, 16
    s, t, w = (mx.array(rng.standard_normal((cap, 8)).astype(np.float32)) for _ in range(3))
    control = mx.array([rows], mx.int32)

    def loss(s, t):
        return (relu_epilogue[(1,)](s, control, t * 3.0, STRICT_MATH=True, SCHEDULE=INLINE) * w).sum()

    keep = (mx.arange(cap) < rows)[:, None]
    ref = lambda s, t: (mx.where(keep, mx.maximum(s * 2.0, 0.0), t * 3.0) * w).sum()
    np.testing.assert_allclose(np.array(loss(s, t)), np.array(ref(s, t)), rtol=1e-5)
    grads_close(mx.grad(loss, argnums=(0, 1))(s, t), mx.grad(ref, argnums=(0, 1))(s, t))


@pytest.mark.parametrize("backend", ["metile", "mlx"])
def test_add_rms_norms_sum_alone_is_finite_at_a_zero_row(backend):
    # (eps=0 and x + residual = 0: the normalised output's zero cotangent times rsqrt(0)
    # made the sum's gradient NaN; MLX's autodiff never visits the unused rms_norm)
    x, w = mx.array([[1.0, -2.0, 3.0, 0.5], [0.5, 1.0, 2.0, -1.0]]), mx.ones((4,))
    r = mx.array([[-1.0, 2.0, -3.0, -0.5], [0.25, 0.0, 1.0, 2.0]])
    got = mx.grad(lambda x: metile.ops.add_rms_norm(x, r, w, 0.0, backend=backend)[0].sum())(x)
    np.testing.assert_array_equal(np.array(got), np.ones((2, 4)))
    # the normalised output used on the second row only: its gradient there, ones elsewhere
    pick = mx.array([[0.0], [1.0]])
    got = mx.grad(lambda x: (metile.ops.add_rms_norm(x, r, w, 1e-5, backend=backend)[1]
                             * pick).sum())(x)
    want = mx.grad(lambda x: (mx.fast.rms_norm(x + r, w, 1e-5) * pick).sum())(x)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)


@metile.kernel(differentiable=True)
def stored_twice(X, Y, n, m, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, x, mask=offs < n)
    metile.store(Y + offs, x * 2.0, mask=offs < m)


def test_an_output_stored_twice_is_named():
    # (it was refused as a launch that does not cover its outputs; every element was written)
    with pytest.raises(metile.CompilationError, match=r"differentiable=True needs launches that "
                                                      r"write every output element exactly once "
                                                      r"\('Y' is stored more than once"):
        mx.grad(lambda x: stored_twice[(1,)](x, mx.zeros((8,)), 8, 4, BLOCK=8).sum())(
            mx.ones((8,)))

