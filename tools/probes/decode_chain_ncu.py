"""Where a compiled decode step's time goes between kernels: 8 int4 products (1x4096x11008,
group 64, 4 weights cycled) in one mx.compile'd call, as benchmarks.quantized --chain 8
times them, for MLX's quantized_matmul and metile's pair GEMV (through the op's
custom_function, and launched directly).  Prints each side's wall time per product (many
calls a sync, alternating) - run it under ncu to list every kernel a call launches
(fills, copies) and their durations:

    python3 tools/probes/decode_chain_ncu.py --wall
    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/decode_chain_ncu.py
"""

import argparse
import math
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
import mlx.core as mx   # noqa: E402

from benchmarks.quantized import seconds_per_call   # noqa: E402
from metile import quantized_ops                    # noqa: E402

PAIRS = quantized_ops.MATVEC_PAIRS[0]


def sides(n=11008, k=4096, chain=8):
    keys = mx.random.split(mx.random.key(0), 5)
    x = mx.random.normal((1, k), key=keys[0]).astype(mx.float16)
    weights = []
    for key in keys[1:]:
        w = (mx.random.normal((n, k), key=key) / math.sqrt(k)).astype(mx.float16)
        weights.append(mx.quantize(w, group_size=64, bits=4))
    mx.eval(x, weights)

    def mlx(x, wq, s, b):
        return mx.quantized_matmul(x, wq, s, b, group_size=64, bits=4)

    def op(x, wq, s, b):
        return quantized_ops._metile(x, wq, s, b, n, k, True, 64, 4, PAIRS)

    def direct(x, wq, s, b):
        return quantized_ops._launch(x, wq, s, b, n, k, True, 64, 4, PAIRS)

    def chained(f):
        return mx.compile(lambda x, *ws: [f(x, *ws[3 * i:3 * i + 3]) for i in range(chain)])

    flat = [[a for j in range(chain) for a in weights[(i + j) % 4]] for i in range(4)]
    return x, flat, {"mlx": chained(mlx), "metile op": chained(op), "metile direct": chained(direct)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--wall", action="store_true", help="time the sides, no ncu")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    x, flat, fns = sides()
    if not args.wall:
        for name, fn in fns.items():
            print("side", name, flush=True)
            for i in range(3):
                mx.eval(fn(x, *flat[i]))
                mx.synchronize()
        return
    import numpy as np
    times = {name: [] for name in fns}
    for fn in fns.values():
        mx.eval(fn(x, *flat[0]))
    for r in range(args.rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            fn = fns[name]
            mx.synchronize()
            import time
            t = time.perf_counter()
            outs = [fn(x, *flat[i % 4]) for i in range(20)]
            mx.eval(outs)
            mx.synchronize()
            times[name].append((time.perf_counter() - t) / (20 * 8))
    for name, v in times.items():
        print(f"wall {name}: {np.median(v) * 1e6:.1f} us a product")


if __name__ == "__main__":
    main()
