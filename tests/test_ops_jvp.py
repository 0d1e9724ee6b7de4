"""Forward-mode derivatives (mx.jvp) of metile.ops on the metile kernels: each op's jvp is
its MLX composite's (runtime/op_function.jvp_rule; replayed calls too), checked against MLX's own
op's jvp; a bare kernel launch refuses by name."""

import mlx.core as mx
import numpy as np
import pytest

import metile
import metile.ops as ops


def _a(rng, *shape):
    return mx.array(rng.standard_normal(shape).astype(np.float32))


def _cases(rng):
    x, w1, w2, g = _a(rng, 5, 16), _a(rng, 8, 16), _a(rng, 8, 16), _a(rng, 16)
    q, k, v = _a(rng, 1, 2, 5, 16), _a(rng, 1, 2, 7, 16), _a(rng, 1, 2, 7, 16)
    wq, s, b = mx.quantize(_a(rng, 32, 64), group_size=32, bits=4)
    xq = _a(rng, 3, 64)
    m = "metile"
    return {
        "rms_norm": (x, lambda a: ops.rms_norm(a, g, 1e-5, backend=m),
                     lambda a: mx.fast.rms_norm(a, g, 1e-5)),
        "layer_norm": (x, lambda a: ops.layer_norm(a, g, g, 1e-5, backend=m),
                       lambda a: mx.fast.layer_norm(a, g, g, 1e-5)),
        "add_rms_norm": (x, lambda a: ops.add_rms_norm(a, x, g, 1e-5, backend=m)[1],
                         lambda a: mx.fast.rms_norm(a + x, g, 1e-5)),
        "softmax": (x, lambda a: ops.softmax(a, backend=m), lambda a: mx.softmax(a, axis=-1)),
        "linear": (x, lambda a: ops.linear(a, w1, g[:8], "relu", backend=m),
                   lambda a: mx.maximum(a @ w1.T + g[:8], 0)),
        "matmul": (x, lambda a: ops.matmul(a, w1.T, backend=m), lambda a: a @ w1.T),
        "gated_mlp": (x, lambda a: ops.gated_mlp(a, w1, w2, backend=m),
                      lambda a: (a @ w1.T) * mx.sigmoid(a @ w1.T) * (a @ w2.T)),
        "quantized_matmul": (xq, lambda a: ops.quantized_matmul(a, wq, s, b, group_size=32, bits=4,
                                                               backend=m),
                             lambda a: mx.quantized_matmul(a, wq, s, b, group_size=32, bits=4)),
        "attention": (q, lambda a: ops.scaled_dot_product_attention(a, k, v, scale=0.25,
                                                                    mask="causal", backend=m),
                      lambda a: mx.fast.scaled_dot_product_attention(a, k, v, scale=0.25,
                                                                     mask="causal")),
    }


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "add_rms_norm", "softmax", "linear",
                                  "matmul", "gated_mlp", "quantized_matmul", "attention"])
def test_jvp_matches_mlx(rng, name):
    # (found by a hostile test: mx.jvp of every op failed in MLX's Primitive::jvp)
    x, ours, theirs = _cases(rng)[name]
    t = mx.array(rng.standard_normal(x.shape).astype(np.float32))
    want_y, want_t = mx.jvp(theirs, [x], [t])
    for _ in range(2):   # the first call takes the op's full path, the second its replay
        mx.eval(ours(x))
        y, got_t = mx.jvp(ours, [x], [t])
        np.testing.assert_allclose(np.array(y[0]), np.array(want_y[0]), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.array(got_t[0]), np.array(want_t[0]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("offset", ["int", "array", "per_batch"])
@pytest.mark.parametrize("freqs", [False, True])
def test_rope_jvp_matches_mlx(rng, offset, freqs):
    # (refused by name before: rope's composite is MLX's op on the kernel's rows)
    q = _a(rng, 2, 3, 5, 16)
    t = _a(rng, 2, 3, 5, 16)
    off = {"int": 3, "array": mx.array(3), "per_batch": mx.array([1, 4])}[offset]
    kw = dict(traditional=False, base=None, scale=0.5, offset=off,
              freqs=mx.array(np.linspace(1.0, 40.0, 6).astype(np.float32))) if freqs else \
        dict(traditional=True, base=1e4, scale=0.5, offset=off)
    want_y, want_t = mx.jvp(lambda a: mx.fast.rope(a, 12, **kw), [q], [t])
    for _ in range(2):
        y, got_t = mx.jvp(lambda a: ops.rope(a, 12, backend="metile", **kw), [q], [t])
        np.testing.assert_allclose(np.array(y[0]), np.array(want_y[0]), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.array(got_t[0]), np.array(want_t[0]), rtol=1e-5, atol=1e-5)


def test_a_bare_kernel_refuses_jvp_by_name(rng):

    @metile.kernel
    def doubled(X, Y, n, BLOCK: metile.constexpr):
        i = metile.arange(0, BLOCK)
        metile.store(Y + i, metile.load(X + i, mask=i < n) * 2.0, mask=i < n)

    x = mx.ones((4,))
    with pytest.raises(metile.LaunchError, match="kernel 'doubled' has no forward-mode "
                                                 r"derivative \(mx.jvp\)"):
        mx.eval(mx.jvp(lambda a: doubled[(1,)](a, mx.zeros_like(a), 4, BLOCK=8), [x], [x]))
