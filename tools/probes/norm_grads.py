"""Which of test_model_ops_norms.test_gradients_match_mlx's pairs disagrees with MLX on
this device: forward and each gradient's largest error per pair, shape (3, 7) float32.

    python3 tools/probes/norm_grads.py
"""
import mlx.core as mx
import numpy as np

from metile import ops


def main():
    rng = np.random.default_rng(0)
    arr = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))
    x, w, b, cot = arr(3, 7), arr(7), arr(7), arr(3, 7)
    pairs = {
        "rms_w": (lambda a, ww: ops.rms_norm(a, ww, 1e-5, backend="metile"),
                  lambda a, ww: mx.fast.rms_norm(a, ww, 1e-5), (x, w)),
        "rms": (lambda a: ops.rms_norm(a, None, 1e-5, backend="metile"),
                lambda a: mx.fast.rms_norm(a, None, 1e-5), (x,)),
        "layer_wb": (lambda a, ww, bb: ops.layer_norm(a, ww, bb, 1e-5, backend="metile"),
                     lambda a, ww, bb: mx.fast.layer_norm(a, ww, bb, 1e-5), (x, w, b)),
        "layer_b": (lambda a, bb: ops.layer_norm(a, None, bb, 1e-5, backend="metile"),
                    lambda a, bb: mx.fast.layer_norm(a, None, bb, 1e-5), (x, b)),
        "softmax_-1": (lambda a: ops.softmax(a, axis=-1, backend="metile"),
                       lambda a: mx.softmax(a, axis=-1), (x,)),
        "softmax_0": (lambda a: ops.softmax(a, axis=0, backend="metile"),
                      lambda a: mx.softmax(a, axis=0), (x,)),
    }
    for name, (ours, theirs, args) in pairs.items():
        fwd = float(mx.abs(ours(*args) - theirs(*args)).max())
        loss = lambda f: (lambda *a: (f(*a) * cot).sum())
        argnums = tuple(range(len(args)))
        g1 = mx.grad(loss(ours), argnums=argnums)(*args)
        g2 = mx.grad(loss(theirs), argnums=argnums)(*args)
        errs = [float(mx.abs(p - q).max()) for p, q in zip(g1, g2)]
        print(f"{name:12s} forward {fwd:.2e}  grads " + " ".join(f"{e:.2e}" for e in errs),
              flush=True)
    # layer_norm's dx against float64 central differences of the forward in NumPy
    xs, ws, bs, cs = (np.array(a).astype(np.float64) for a in (x, w, b, cot))

    def loss64(v):
        c = v - v.mean(axis=-1, keepdims=True)
        return ((c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5) * ws + bs) * cs).sum()

    num = np.zeros_like(xs)
    for i in np.ndindex(xs.shape):
        d = np.zeros_like(xs)
        d[i] = 1e-6
        num[i] = (loss64(xs + d) - loss64(xs - d)) / 2e-6
    loss = lambda f: (lambda *a: (f(*a) * cot).sum())
    ours = mx.grad(loss(lambda a: ops.layer_norm(a, w, b, 1e-5, backend="metile")))(x)
    theirs = mx.grad(loss(lambda a: mx.fast.layer_norm(a, w, b, 1e-5)))(x)
    print(f"layer dx vs float64 differences: metile {np.abs(np.array(ours) - num).max():.2e}  "
          f"mlx {np.abs(np.array(theirs) - num).max():.2e}", flush=True)


if __name__ == "__main__":
    main()
