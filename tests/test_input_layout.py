"""A launch makes an input row-contiguous only where it cannot know it will be.

Evaluated inputs show their layout; a lazy input's layout is known before evaluation only
when its primitive always writes fresh row-contiguous outputs (metile's kernels, MLX's
matmul), and those launch without a contiguous() node - an eager model's launches mostly
take lazy arrays, and each such node costs the host an MLX op.  Any other lazy input,
views included, still goes through contiguous() and is read correctly."""

import io

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import _ext, ops


@metile.kernel
def plus_one(x, out, n, BLOCK: metile.constexpr):
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(out + i, metile.load(x + i, mask=i < n) + 1.0, mask=i < n)


def _nodes(out, label: str) -> int:
    dot = io.StringIO()
    mx.export_to_dot(dot, out)
    return dot.getvalue().count(f'label ="{label}"')


def _rng():
    return np.random.default_rng(7)


def test_lazy_kernel_and_matmul_outputs_take_no_contiguous_node():
    x = mx.array(_rng().standard_normal(300).astype(np.float32))
    zeros = mx.zeros((300,))
    mx.eval(zeros)
    mx.eval(plus_one[(3,)](x, zeros, 300, BLOCK=128))   # (the first call resolves the launch)
    first = plus_one[(3,)](x, zeros, 300, BLOCK=128)
    second = plus_one[(3,)](first, zeros, 300, BLOCK=128)
    assert _nodes(second, "Contiguous") == 0
    np.testing.assert_allclose(np.array(second), np.array(x) + 2.0, rtol=1e-6)

    a = mx.array(_rng().standard_normal((40, 24)).astype(np.float32))
    b = mx.array(_rng().standard_normal((24, 24)).astype(np.float32))
    mx.eval(ops.matmul(a @ b, b, backend="metile"))
    product = a @ b
    out = ops.matmul(product, b, backend="metile")
    assert _nodes(out, "Contiguous") == 0
    np.testing.assert_allclose(np.array(out), (np.array(a) @ np.array(b)) @ np.array(b),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make", [
    lambda a, b: (a @ b).T,                  # a view of a matmul: not known row-contiguous
    lambda a, b: mx.transpose(a) + 0.0,      # an elementwise result: layout follows inputs
    lambda a, b: (a @ b)[:, ::2][:, :12],    # a strided slice
])
def test_other_lazy_inputs_are_made_contiguous_and_read_correctly(make):
    a = mx.array(_rng().standard_normal((24, 24)).astype(np.float32))
    b = mx.array(_rng().standard_normal((24, 24)).astype(np.float32))
    lhs = make(a, b)
    want = np.array(lhs)
    rhs = b[: lhs.shape[1]]
    out = ops.matmul(make(a, b), rhs, backend="metile")
    np.testing.assert_allclose(np.array(out), want @ np.array(rhs), rtol=1e-4, atol=1e-4)


def test_an_op_output_under_a_transform_feeds_the_next_launch_without_a_node():
    # under mx.compile (and grad) an op is one MetileOp node (op_node.h) whose output a
    # launch writes row-contiguous: the next op reads it as it is, and neither takes
    # mx.custom_function's StopGradient and CustomTransforms (s126: each node costs the
    # host ~1 us on an H100)
    x = mx.array(_rng().standard_normal((4, 256)).astype(np.float16))
    w = mx.array(_rng().standard_normal(256).astype(np.float16))
    counted = {}

    def step(a, weight):
        first = ops.rms_norm(a, weight, 1e-5, backend="metile")
        counted["layout"] = _ext.row_contiguity(first)
        second = ops.rms_norm(first, weight, 1e-5, backend="metile")
        for label in ("MetileOp", "Contiguous", "StopGradient", "CustomTransforms"):
            counted[label] = _nodes(second, label)
        return second
    out = mx.compile(step)(x, w)
    assert counted == {"layout": True, "MetileOp": 2, "Contiguous": 0, "StopGradient": 0,
                       "CustomTransforms": 0}, counted
    want = mx.fast.rms_norm(mx.fast.rms_norm(x.astype(mx.float32), w.astype(mx.float32), 1e-5),
                            w.astype(mx.float32), 1e-5)
    np.testing.assert_allclose(np.array(out.astype(mx.float32)), np.array(want),
                               rtol=2e-2, atol=2e-2)


def test_a_custom_function_returning_a_view_is_still_made_contiguous():
    # what CustomTransforms shares is its function's output: a transposed view stays a view
    @mx.custom_function
    def transposed(a):
        return a.T

    @transposed.vjp
    def _(primals, cotangent, output):
        return cotangent.T

    a = mx.array(_rng().standard_normal((24, 16)).astype(np.float32))
    b = mx.array(_rng().standard_normal((24, 8)).astype(np.float32))
    mx.eval(a, b)

    def step(lhs, rhs):
        return ops.matmul(transposed(lhs), rhs, backend="metile")
    for fn in (step, mx.compile(step)):
        out = fn(a, b)
        np.testing.assert_allclose(np.array(out), np.array(a).T @ np.array(b), rtol=1e-4,
                                   atol=1e-4)


def test_a_custom_function_returning_a_view_feeds_an_op_correctly():
    # (through an op's recorded launch, which reads the layout rule; the kernel test above
    # takes the launch's own contiguous())
    @mx.custom_function
    def transposed(a):
        return a.T

    @transposed.vjp   # (without a rule MLX's custom_function adds no nodes)
    def _(primals, cotangent, output):
        return cotangent.T

    x = mx.array(_rng().standard_normal((64, 4)).astype(np.float32))
    w = mx.array(_rng().standard_normal(64).astype(np.float32))
    mx.eval(x, w)
    xt = np.array(x).T
    want = xt / np.sqrt((xt * xt).mean(axis=-1, keepdims=True) + 1e-5) * np.array(w)

    def step(a, weight):
        return ops.rms_norm(transposed(a), weight, 1e-5, backend="metile")
    for fn in (step, step, mx.compile(step), mx.compile(step)):
        np.testing.assert_allclose(np.array(fn(x, w)), want, rtol=1e-5, atol=1e-5)


def test_a_custom_function_returning_a_strided_view_feeds_a_kernel_correctly():
    @mx.custom_function
    def every_other(a):
        return a[::2]

    @every_other.vjp
    def _(primals, cotangent, output):
        return mx.zeros_like(primals)

    x = mx.array(_rng().standard_normal(600).astype(np.float32))
    zeros = mx.zeros((300,))
    mx.eval(x, zeros)

    def step(a, z):
        return plus_one[(3,)](every_other(a), z, 300, BLOCK=128)
    for fn in (step, step, mx.compile(step)):
        np.testing.assert_allclose(np.array(fn(x, zeros)), np.array(x)[::2] + 1.0, rtol=1e-6)
