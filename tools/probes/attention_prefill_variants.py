"""Causal attention prefill (attention_forward, 1x32xLx128 float16) per tile, warps and
program order (HEAD_GROUP) against MLX's SDPA, timed as benchmarks.attention times the op:
compiled calls taking q, k, v, each output the next call's q, one synchronisation per chain,
variants and MLX alternating (the first of each round rotating), medians over rounds.  Every
variant is checked against MLX's output before it is timed.

    python3 tools/probes/attention_prefill_variants.py [--lengths 1024 4096 8192]
        [--min-blocks-off] [out.json]

--min-blocks-off: attention_forward without `__launch_bounds__`' second argument (ptxas may
then give a thread up to 255 registers, one 8-warp block an SM), compiled into a fresh
kernel cache so no launch compiled with the bound is reused."""
import argparse
import json
import os
import statistics
import sys
import tempfile

import mlx.core as mx

sys.path[:0] = ["kernels", "."]
from metile_kernels import attention as kernels  # noqa: E402
from metile import attention_ops  # noqa: E402
from benchmarks.attention import seconds_per_call  # noqa: E402

# (BLOCK_M, BLOCK_N, warps, HEAD_GROUP); None: attention_ops.head_group's choice
# (192-row blocks on 12 warps, three warpgroups, ran 4x slower than 128x64 at s53: not
# pursued, see the results README)
VARIANTS = [(128, 64, 8, None), (128, 128, 8, None)]
# each also compiled under these settings (traced under them, so each compiled call keeps
# its own kernel)
SETTINGS = [{}, {"METILE_WGMMA_CARRY": "0"}]


def per_call(fn, q, k, v, launches):
    return seconds_per_call(fn, q, k, v, launches) * 1e6


def variant(n, h, d, bm, bn, warps, order):
    scale_log2 = d ** -0.5 * kernels.LOG2E

    def run(x, k, v):
        return kernels.attention_forward[kernels.forward_grid(n, h, 1, bm)](
            x, k, v, x, mx.zeros(x.shape, x.dtype), n, n, 1, scale_log2, 0, 0, 0, 0, 0, 0,
            HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn, MASK="causal", POSITIVE_SCALE=True,
            HEAD_GROUP=order, num_warps=warps)
    return mx.compile(run)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-blocks-off", action="store_true")
    p.add_argument("output", nargs="?")
    args = p.parse_args()
    tag = ""
    if args.min_blocks_off:
        from metile.passes import lower_mma_layout
        lower_mma_layout.MmaLayoutLowering.mma_occupancy = lambda self: 0
        os.environ["METILE_CACHE_DIR"] = tempfile.mkdtemp()
        tag = " unbounded"
    h, d = 32, 128
    # every variant first against MLX at a ragged length (the last query and key blocks
    # partial), on 4 heads
    n = 1000
    keys = mx.random.split(mx.random.key(1), 3)
    q, k, v = (mx.random.normal((1, 4, n, d), key=kk).astype(mx.float16) for kk in keys)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=d ** -0.5, mask="causal")
    for bm, bn, warps, order in VARIANTS:
        order = attention_ops.head_group(4, n, d, 2) if order is None else order
        try:
            out = variant(n, 4, d, bm, bn, warps, order)(q, k, v)
            err = float(mx.abs(out.astype(mx.float32) - ref.astype(mx.float32)).max())
            print(f"ragged {n} {bm}x{bn} w{warps}{tag}: max error {err:.2e}",
                  "ok" if err < 2e-2 else "WRONG", flush=True)
        except Exception as e:
            print(f"ragged {n} {bm}x{bn} w{warps}{tag}: {type(e).__name__}: {str(e)[:160]}")
    report = {"shape": [1, h, "L", d], "dtype": "float16", "mask": "causal",
              "min_blocks_off": args.min_blocks_off, "us_per_call": {}}
    for n in args.lengths:
        keys = mx.random.split(mx.random.key(0), 3)
        q, k, v = (mx.random.normal((1, h, n, d), key=kk).astype(mx.float16) for kk in keys)
        scale = d ** -0.5
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
        fns = {"mlx": mx.compile(lambda x, k, v: mx.fast.scaled_dot_product_attention(
            x, k, v, scale=scale, mask="causal"))}
        for (bm, bn, warps, order), env in [(v, e) for v in VARIANTS for e in SETTINGS]:
            order = attention_ops.head_group(h, n, d, 2) if order is None else order
            name = f"{bm}x{bn} w{warps} group={order}{tag}" + "".join(
                f" {key}={value}" for key, value in env.items())
            try:
                saved = {key: os.environ.get(key) for key in env}
                os.environ.update(env)
                fn = variant(n, h, d, bm, bn, warps, order)
                try:
                    err = float(mx.abs(fn(q, k, v).astype(mx.float32)
                                       - ref.astype(mx.float32)).max())
                finally:
                    for key, value in saved.items():
                        if value is None:
                            os.environ.pop(key)
                        else:
                            os.environ[key] = value
                if err < 2e-2:
                    fns[name] = fn
                else:
                    print(n, name, f"wrong: max error {err}", flush=True)
            except Exception as e:   # a variant that does not fit: say why, keep going
                print(n, name, f"{type(e).__name__}: {str(e)[:160]}", flush=True)
        launches = max(4, min(40, int(40 * 4096 / n)))
        times = {name: [] for name in fns}
        names = list(fns)
        for name in names:
            per_call(fns[name], q, k, v, 2)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(per_call(fns[name], q, k, v, launches))
        flops = 4 * h * n * n * d / 2
        mlx = statistics.median(times["mlx"])
        for name, ts in times.items():
            us = statistics.median(ts)
            report["us_per_call"][f"{n} {name}"] = us
            print(n, name, f"{us:.1f} us {flops / us / 1e6:.1f} TFLOP/s mlx/this {mlx / us:.3f}",
                  flush=True)
    if args.output:
        from benchmarks.common import machine
        report["machine"] = machine()
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
