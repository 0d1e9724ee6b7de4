"""metile.ops under mx.vmap: a kernel has no batching rule, so each op's custom function
(and its replay) batches its MLX composite instead, and the results are MLX's - for the
op's first call of a signature and for a replay recorded eagerly."""

import mlx.core as mx
import numpy as np
import pytest

from metile import ops


def _close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.array(a.astype(mx.float32)),
                                   np.array(b.astype(mx.float32)), rtol=2e-4, atol=2e-4)


def _cases():
    k = mx.random.split(mx.random.key(5), 4)
    w = mx.random.normal((8, 4), key=k[0])
    wl = mx.random.normal((4, 8), key=k[1])
    b = mx.random.normal((4,), key=k[2])
    g = mx.random.normal((8,), key=k[3])
    return {
        "matmul": (lambda v, be: ops.matmul(v, w, epilogue="relu", backend=be), (5, 8)),
        "linear": (lambda v, be: ops.linear(v, wl, b, "gelu_tanh", backend=be), (5, 8)),
        "gated_mlp": (lambda v, be: ops.gated_mlp(v, wl, wl, backend=be), (5, 8)),
        "rms_norm": (lambda v, be: ops.rms_norm(v, g, 1e-5, backend=be), (5, 8)),
        "layer_norm": (lambda v, be: ops.layer_norm(v, g, g, 1e-5, backend=be), (5, 8)),
        "softmax": (lambda v, be: ops.softmax(v, backend=be), (5, 8)),
        "add_rms_norm": (lambda v, be: ops.add_rms_norm(v, v * 0.5, g, 1e-5, backend=be),
                         (5, 8)),
        "attention": (lambda v, be: ops.scaled_dot_product_attention(
            v, v * 0.5, v, scale=0.25, mask="causal", backend=be), (1, 2, 5, 16)),
        "rope": (lambda v, be: ops.rope(v, 12, traditional=False, base=1e4, scale=0.5,
                                        offset=mx.array([2, 7]), backend=be), (2, 3, 5, 16)),
    }


@pytest.mark.parametrize("op", list(_cases()))
def test_ops_batch_under_vmap_as_mlx_does(op):
    fn, shape = _cases()[op]
    xs = mx.random.normal((3, *shape), key=mx.random.key(9))
    want = mx.vmap(lambda v: fn(v, "mlx"))(xs)
    _close(mx.vmap(lambda v: fn(v, "metile"))(xs), want)     # the op's full path
    for _ in range(2):                                       # a replay of the signature
        fn(xs[0], "metile")
    _close(mx.vmap(lambda v: fn(v, "metile"))(xs), want)


def test_vmap_over_another_axis_and_a_batched_weight():
    a = mx.random.normal((5, 3, 8), key=mx.random.key(1))
    w = mx.random.normal((3, 8, 4), key=mx.random.key(2))
    got = mx.vmap(lambda v, u: ops.matmul(v, u, backend="metile"), in_axes=(1, 0))(a, w)
    _close(got, mx.vmap(lambda v, u: v @ u, in_axes=(1, 0))(a, w))


def test_quantized_matmul_under_vmap_fails_as_mlx_does():
    # MLX 0.32's quantized_matmul has no vmap ("NYI"); the metile op's rule is MLX's
    # composite, so it says the same (rather than refusing a metile kernel)
    w = mx.random.normal((16, 64), key=mx.random.key(3))
    wq, s, b = mx.quantize(w, group_size=32, bits=4)
    xs = mx.random.normal((3, 2, 64), key=mx.random.key(4))
    with pytest.raises(RuntimeError, match=r"QuantizedMatmul::vmap"):
        mx.vmap(lambda v: mx.quantized_matmul(v, wq, s, b, group_size=32, bits=4))(xs)
    for _ in range(2):   # the full path, then a replay
        with pytest.raises(RuntimeError, match=r"QuantizedMatmul::vmap"):
            mx.eval(mx.vmap(lambda v: ops.quantized_matmul(
                v, wq, s, b, group_size=32, bits=4, backend="metile"))(xs))
        for _ in range(2):
            ops.quantized_matmul(xs[0], wq, s, b, group_size=32, bits=4, backend="metile")
