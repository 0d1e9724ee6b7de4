"""The second-order gradient of sum(rope(x)^3) on the default device, metile's op and MLX's,
against MLX's on the CPU stream (s83: the two disagreed on the H200)."""

import mlx.core as mx
import numpy as np

import metile

x = mx.array(np.random.default_rng(0).standard_normal((1, 2, 4, 16)).astype(np.float32))


def second(f):
    return np.array(mx.grad(lambda q: mx.grad(lambda q: (f(q) ** 3).sum())(q).sum())(x))


for trad in (False, True):
    kw = dict(traditional=trad, base=1e4, scale=1.0, offset=5)
    ours = second(lambda q: metile.ops.rope(q, 16, backend="metile", **kw))
    theirs = second(lambda q: mx.fast.rope(q, 16, **kw))
    with mx.stream(mx.cpu):
        cpu = second(lambda q: mx.fast.rope(q, 16, **kw))
    first = np.array(mx.grad(lambda q: (metile.ops.rope(q, 16, backend="metile", **kw) ** 3).sum())(x))
    with mx.stream(mx.cpu):
        first_cpu = np.array(mx.grad(lambda q: (mx.fast.rope(q, 16, **kw) ** 3).sum())(x))
    print(f"traditional={trad}: metile vs CPU {np.abs(ours - cpu).max():.3g}, MLX vs CPU "
          f"{np.abs(theirs - cpu).max():.3g}; first order metile vs CPU "
          f"{np.abs(first - first_cpu).max():.3g}")
