"""Causal attention prefill (1x32xLxLx128 float16): the software-pipelined whole-block loop
(attention_forward PIPELINE=True: block j's key product, block j-1's value product, block
j's softmax - the value product left in flight across the softmax where
lower_mma_layout.carried_products allows) against the plain loop, per tile, and MLX's SDPA.
Compiled calls chained on their output, 10 a synchronisation, the variants alternating
over rounds, median; each variant checked against MLX first.

    python3 tools/probes/attention_pipeline_ab.py [--lengths 1024 4096 8192] [out.json]
"""
import argparse
import json
import statistics
import sys
import time

import mlx.core as mx

sys.path.insert(0, "kernels")
from metile_kernels import attention as kernels  # noqa: E402

# (BLOCK_M, BLOCK_N, warps, PIPELINE)
VARIANTS = [(128, 64, 8, False), (128, 64, 8, True), (128, 128, 8, False), (128, 128, 8, True)]


def chain(fn, q, launches=10):
    mx.synchronize()
    t = time.perf_counter()
    out = q
    for _ in range(launches):
        out = fn(out)
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - t) / launches * 1e6


def measure(n, rounds):
    b, h, d = 1, 32, 128
    keys = mx.random.split(mx.random.key(0), 3)
    q, k, v = (mx.random.normal((b, h, n, d), key=kk).astype(mx.float16) for kk in keys)
    scale = d ** -0.5
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")

    def ours(bm, bn, warps, pipe):
        def run(x):
            return kernels.attention_forward[kernels.forward_grid(n, h, b, bm)](
                x, k, v, x, mx.zeros(x.shape, x.dtype), n, n, 1, scale * 1.4426950408889634,
                0, 0, 0, 0, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn, MASK="causal",
                POSITIVE_SCALE=True, PIPELINE=pipe, num_warps=warps)
        return run

    fns = {"mlx": mx.compile(lambda x: mx.fast.scaled_dot_product_attention(
        x, k, v, scale=scale, mask="causal"))}
    status = {}
    for bm, bn, warps, pipe in VARIANTS:
        name = f"{bm}x{bn} w{warps}" + (" pipelined" if pipe else "")
        try:
            fn = mx.compile(ours(bm, bn, warps, pipe))
            err = float(mx.abs(fn(q).astype(mx.float32) - ref.astype(mx.float32)).max())
        except Exception as e:
            status[name] = f"{type(e).__name__}: {str(e)[:160]}"
            continue
        if not err < 2e-2:
            status[name] = f"wrong: max error {err}"
            continue
        fns[name] = fn
    for fn in fns.values():
        chain(fn, q, 2)
    samples = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for name in order:
            samples[name].append(chain(fns[name], q))
    us = {name: statistics.median(s) for name, s in samples.items()}
    flops = 4 * b * h * n * n * d / 2
    for name, t in us.items():
        print(f"L={n} {name:24s} {t:9.1f} us {flops / t / 1e6:6.1f} TFLOP/s "
              f"mlx/this {us['mlx'] / t:.3f}", flush=True)
    for name, why in status.items():
        print(f"L={n} {name:24s} {why}", flush=True)
    return {"us_per_call": us, "samples": samples, "not_timed": status}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096, 8192])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("output", nargs="?")
    args = p.parse_args()
    report = {"machine": "H200", "mlx": mx.__version__, "dtype": "float16", "mask": "causal",
              "heads": 32, "head_dim": 128, "lengths": {}}
    for n in args.lengths:
        report["lengths"][str(n)] = measure(n, args.rounds)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
