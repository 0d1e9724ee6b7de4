"""rope's gradient against the rotation's transpose (float64 NumPy): MLX's own
(mx.grad of mx.fast.rope) and metile's (backend="metile"), for one and five positions,
both pairings, offsets 0 and 5.  The loss is sum(rope(x) * w), so the gradient is the
rotation of w by the negated angle, whatever x is.

    python3 tools/probes/rope_grad_mlx.py
"""
import sys

import mlx.core as mx
import numpy as np

import metile

sys.path.insert(0, "tests")
from conftest import np_rope  # noqa: E402


def main():
    print("device", mx.default_device())
    rng = np.random.default_rng(0)
    for t in (1, 5):
        x = mx.array(rng.standard_normal((2, 3, t, 20)).astype(np.float32))
        w = mx.array(rng.standard_normal((2, 3, t, 20)).astype(np.float32))
        for traditional in (False, True):
            for offset in (0, 5):
                kw = dict(traditional=traditional, base=1e4, scale=0.5, offset=offset)
                want = np_rope(np.array(w, np.float64), 16, traditional, 1e4, -0.5, offset)
                for name, op in (("mlx", mx.fast.rope),
                                 ("metile", lambda a, dims, **k: metile.ops.rope(a, dims, backend="metile", **k))):
                    g = mx.grad(lambda a: (op(a, 16, **kw) * w).sum())(x)
                    err = float(np.abs(np.array(g, np.float64) - want).max())
                    print(f"T={t} traditional={traditional} offset={offset} {name:6s} "
                          f"max error against the transpose {err:.3g}", flush=True)


if __name__ == "__main__":
    main()
