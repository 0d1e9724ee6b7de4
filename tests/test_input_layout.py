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
from metile import ops


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
