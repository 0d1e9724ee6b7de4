"""The warpgroup GEMM's bulk-tensor loop with its refills ordered by a block barrier a K
step (the default) or by per-stage "empty" mbarriers (METILE_WGMMA_REFILL=empty: no block
barrier in the loop; thread 0 waits for the stage's release after issuing the step's
products), against MLX's product in one run.  The step's barrier was the top stall of the
512x11008x4096 float16 product (ncu, H200, s107).

Each variant is traced (mx.compile) with its setting in the environment, checked against
MLX's result, then all are timed alternating, many calls a sync.

    python3 tools/probes/refill_order.py [out.json] [--rounds 5] [--only 512]
"""
import argparse
import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, ".")
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402


def tile(bm, bn):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_simdgroups=8, TRANSPOSE_B=True)


CASES = [("linear", 512, 11008, 4096, (128, 256)), ("linear", 512, 4096, 11008, (128, 256)),
         ("linear", 512, 4096, 11008, (128, 128)), ("gated", 512, 11008, 4096, (128, 128)),
         ("linear", 2048, 11008, 4096, (128, 256)), ("linear", 2048, 4096, 11008, (128, 256)),
         ("gated", 2048, 11008, 4096, (128, 128)), ("linear", 4096, 4096, 4096, (128, 256))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", type=int)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    f16 = mx.float16

    def rand(*shape, scale=1.0):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(f16)

    report = {**machine(), "probe": "tools/probes/refill_order.py", "dtype": "float16",
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "cases": []}
    for kind, m, n, k, (bm, bn) in CASES:
        if args.only and m != args.only:
            continue
        x, w, w2 = rand(m, k), rand(n, k, scale=k ** -0.5), rand(n, k, scale=k ** -0.5)
        mx.eval(x, w, w2)
        block = tile(bm, bn)
        if kind == "linear":
            mlx_fn = lambda x: x @ w.T  # noqa: E731
            ours = lambda x: ops._launch_linear(x, w, None, None, None, 0.0, block)  # noqa: E731
        else:
            mlx_fn = lambda x: nn.silu(x @ w.T) * (x @ w2.T)  # noqa: E731
            ours = lambda x: ops._launch_gated(x, w, w2, "silu", block)  # noqa: E731
        fns = {"mlx": mx.compile(mlx_fn)}
        want = np.array(fns["mlx"](x).astype(mx.float32), np.float64)
        case = {"kind": kind, "shape": [m, n, k], "tile": [bm, bn], "variants": {}}
        for refill in ("barrier", "empty"):
            os.environ["METILE_WGMMA_REFILL"] = refill
            c = mx.compile(ours)
            got = np.array(c(x).astype(mx.float32), np.float64)
            err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
            case["variants"][refill] = {"relative_error_vs_mlx": err}
            print(f"{kind} {m}x{n}x{k} {bm}x{bn} {refill}: error vs MLX {err:.2e}", flush=True)
            if err < 1e-2:
                fns[refill] = c
        os.environ.pop("METILE_WGMMA_REFILL")
        times = rotate_sized(fns, x, args.rounds)
        case["variants"]["mlx"] = {}
        for name, s in times.items():
            case["variants"][name].update(us=round(s * 1e6, 1), vs_mlx=round(times["mlx"] / s, 3))
            print(f"{kind:6s} {m}x{n}x{k} {bm}x{bn} {name:8s} {s * 1e6:8.1f} us  "
                  f"{times['mlx'] / s:5.2f}x", flush=True)
        report["cases"].append(case)
        if args.output:
            json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
