"""Causal attention prefill (attention_forward) per tile and warp count against MLX's SDPA:
chained calls (the output is the next call's q), one synchronisation per chain, the
kernel's result checked against MLX's once per variant.

    python3 tools/probes/attention_prefill_tiles.py [--length 4096] [out.json]

Prints microseconds per call and TFLOP/s (causal: half the square) per variant; the
default tile and warps are those the op runs (attention_ops.configs)."""
import argparse
import json
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, "kernels")
from metile_kernels import attention as kernels  # noqa: E402

# (BLOCK_M, BLOCK_N, warps); BLOCK_M // 16 warps keep the products and the softmax in the
# accumulator layout (passes/mma_layout.py), two 16-row slabs a warp at BLOCK_M // 32
VARIANTS = [(64, 64, 4), (64, 32, 4), (128, 64, 8), (128, 32, 8), (128, 64, 4), (64, 128, 4),
            (128, 128, 8), (32, 64, 2)]


def chain(fn, q, launches=10):
    mx.synchronize()
    t = time.perf_counter()
    out = q
    for _ in range(launches):
        out = fn(out)
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - t) / launches * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("output", nargs="?")
    args = p.parse_args()
    b, h, n, d = 1, 32, args.length, 128
    keys = mx.random.split(mx.random.key(0), 3)
    q, k, v = (mx.random.normal((b, h, n, d), key=kk).astype(mx.float16) for kk in keys)
    scale = d ** -0.5
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")

    def ours(bm, bn, warps):
        extra = {} if warps is None else {"num_warps": warps}

        def run(x):
            return kernels.attention_forward[kernels.forward_grid(n, h, b, bm)](
                x, k, v, x, mx.zeros(x.shape, x.dtype), n, n, 1, scale * 1.4426950408889634,
                0, 0, 0, 0, 0, 0, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn, MASK="causal",
                POSITIVE_SCALE=True,
                **extra)
        return run

    flops = 4 * b * h * n * n * d / 2
    rows = {}
    mlx_fn = mx.compile(lambda x: mx.fast.scaled_dot_product_attention(x, k, v, scale=scale,
                                                                       mask="causal"))
    chain(mlx_fn, q, 2)
    rows["mlx"] = chain(mlx_fn, q)
    for bm, bn, warps in VARIANTS:
        name = f"{bm}x{bn} warps={warps or 'plan'}"
        try:
            fn = mx.compile(ours(bm, bn, warps))
            err = float(mx.abs(fn(q).astype(mx.float32) - ref.astype(mx.float32)).max())
            if not err < 2e-2:
                rows[name] = f"wrong: max error {err}"
                continue
            chain(fn, q, 1)
            rows[name] = chain(fn, q)
        except Exception as e:   # a variant that does not fit: say why, keep going
            rows[name] = f"{type(e).__name__}: {str(e)[:160]}"
        print(name, rows[name] if isinstance(rows[name], str) else
              f"{rows[name]:.1f} us {flops / rows[name] / 1e6:.1f} TFLOP/s "
              f"mlx/metile {rows['mlx'] / rows[name]:.3f}", flush=True)
    print("mlx", f"{rows['mlx']:.1f} us {flops / rows['mlx'] / 1e6:.1f} TFLOP/s")
    if args.output:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "mlx": mx.__version__, "shape": [b, h, n, d],
                   "dtype": "float16", "mask": "causal", "us_per_call": rows},
                  open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
