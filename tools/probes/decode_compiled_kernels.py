"""Every GPU kernel one compiled int4 decode call launches (1x4096x11008, group 64,
float16), metile's GEMV candidates and MLX's quantized_matmul, as benchmarks.quantized
builds them - to see whether a compiled call runs more than its GEMV (a copy, a fill)
when its per-call time exceeds its kernel time.  Run under ncu:

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/decode_compiled_kernels.py
"""
import math

import mlx.core as mx

from metile import quantized_ops


def main():
    n, k = 11008, 4096
    w = (mx.random.normal((n, k), key=mx.random.key(1)) / math.sqrt(k)).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((1, k), key=mx.random.key(3)).astype(mx.float16)
    mx.eval(x, wq, s, b)
    sides = {"mlx": mx.compile(lambda x, wq, s, b: mx.quantized_matmul(x, wq, s, b))}
    for config in (quantized_ops.MATVEC_RUNS[0], quantized_ops.MATVEC_ROWS[0]):
        sides[quantized_ops.config_name(config)] = mx.compile(
            lambda x, wq, s, b, c=config: quantized_ops._metile(x, wq, s, b, n, k, True, 64, 4, c))
    for name, fn in sides.items():
        mx.eval(fn(x, wq, s, b))
        mx.synchronize()
        print("side", name, flush=True)
        mx.eval(*[fn(x, wq, s, b) for _ in range(3)])   # three calls in one evaluation
        mx.synchronize()


if __name__ == "__main__":
    main()
