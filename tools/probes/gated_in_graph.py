"""The metile dual GEMM (gated_mlp, backend="metile") in three mx.compile'd forms at
T=2048, hidden 4096, width 11008, float16, against MLX's composite in the same forms:
weights captured as constants, weights passed as inputs, and the input made by an
RMSNorm inside the graph (the decoder block's form).  20 calls per synchronization.

    python3 tools/probes/gated_in_graph.py [normed inputs constants ...]   # the order
"""
import time

import mlx.core as mx

from metile import ops


def timed(fn, *args):
    mx.eval(fn(*args))
    mx.synchronize()
    start = time.perf_counter()
    mx.eval([fn(*args) for _ in range(20)])
    mx.synchronize()
    return (time.perf_counter() - start) / 20 * 1e6


def main():
    t, d, h = 2048, 4096, 11008
    k = mx.random.split(mx.random.key(0), 3)
    x = (mx.random.normal((t, d), key=k[0])).astype(mx.float16)
    wg = (d ** -0.5 * mx.random.normal((h, d), key=k[1])).astype(mx.float16)
    wu = (d ** -0.5 * mx.random.normal((h, d), key=k[2])).astype(mx.float16)
    mx.eval(x, wg, wu)
    import sys
    order = sys.argv[1:] or ["constants", "inputs", "normed"]
    for backend in ("mlx", "metile"):
        forms = {
            "constants": (mx.compile(lambda x: ops.gated_mlp(x, wg, wu, backend=backend)), (x,)),
            "inputs": (mx.compile(lambda x, a, b: ops.gated_mlp(x, a, b, backend=backend)),
                       (x, wg, wu)),
            "normed": (mx.compile(lambda x, a, b: ops.gated_mlp(
                mx.fast.rms_norm(x, None, 1e-5), a, b, backend=backend)), (x, wg, wu))}
        print(f"{backend:6s} " + "  ".join(
            f"{name} {timed(forms[name][0], *forms[name][1]):8.1f} us" for name in order),
            flush=True)


if __name__ == "__main__":
    main()
