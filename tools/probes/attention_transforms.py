"""mx.jvp and mx.vmap of metile's attention op on the GPU, at the shapes tests/test_ops_jvp.py
and tests/test_ops_vmap.py take (which skip attention on CUDA): each case's result against
MLX's op, or its error.  Run with METILE_DEBUG=op_nodes to name the node that keeps the op
from being one MetileOp.

    METILE_DEBUG=op_nodes python3 tools/probes/attention_transforms.py
"""

import mlx.core as mx
import numpy as np

import metile.ops as ops


def _a(rng, *shape):
    return mx.array(rng.standard_normal(shape).astype(np.float32))


def case(name, run):
    try:
        err = run()
        print(f"{name}: ok, max error {err:.2e}")
    except Exception as e:   # (a probe: every case runs and says what happened)
        print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}")


def jvp_case(qlen, klen, dim, mask):
    rng = np.random.default_rng(0)
    q, k, v = _a(rng, 1, 2, qlen, dim), _a(rng, 1, 2, klen, dim), _a(rng, 1, 2, klen, dim)
    t = _a(rng, *q.shape)

    def run():
        want = mx.jvp(lambda a: mx.fast.scaled_dot_product_attention(a, k, v, scale=0.25,
                                                                     mask=mask), [q], [t])[1][0]
        err = 0.0
        for _ in range(2):
            got = mx.jvp(lambda a: ops.scaled_dot_product_attention(a, k, v, scale=0.25, mask=mask,
                                                                    backend="metile"), [q], [t])[1][0]
            err = max(err, float(mx.abs(got - want).max()))
        return err
    case(f"jvp q{qlen} k{klen} d{dim} mask={mask}", run)


def vmap_case(shape):
    xs = mx.random.normal((3, *shape), key=mx.random.key(9))

    def fn(v, be):
        return ops.scaled_dot_product_attention(v, v * 0.5, v, scale=0.25, mask="causal",
                                                backend=be)

    def run():
        want = mx.vmap(lambda v: fn(v, "mlx"))(xs)
        got = mx.vmap(lambda v: fn(v, "metile"))(xs)
        return float(mx.abs(got - want).max())
    case(f"vmap {shape}", run)


if __name__ == "__main__":
    print("device:", mx.default_device())
    jvp_case(64, 64, 64, "causal")
    jvp_case(5, 7, 16, "causal")
    jvp_case(5, 7, 16, None)
    jvp_case(7, 7, 16, "causal")
    jvp_case(5, 7, 64, "causal")
    vmap_case((1, 2, 5, 16))
    vmap_case((1, 2, 64, 64))
