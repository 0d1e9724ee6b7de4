"""The place penalty behind model_layers' slow gated_mlp (s137/s138): with two variants in one
order every round, the second measured ~60% slower.  Is it the place or the variant before
it, and does a short untimed lead-in sample of the variant itself absorb it (the allocator's
cache refilled for its outputs after the other variant's larger footprint)?

gated_mlp, T=512, float16, MLX's composite (`ops.gated_mlp(backend="mlx")`) and the dual
GEMM (`backend="metile"`), each compiled; per mode, rounds in one fixed order:
  mlx_first            mlx, metile every round
  metile_first         metile, mlx every round
  mlx_first_lead_in    mlx, metile, each timed sample after 5 untimed launches of itself

    python3 tools/probes/order_penalty.py [out.json] [--tokens 512] [--rounds 7]
"""
import argparse
import json
import math
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, ".")
from benchmarks.common import machine, sample  # noqa: E402
from metile import ops  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--dims", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=11008)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--launches", type=int, default=50)
    args = p.parse_args()
    d, h = args.dims, args.hidden
    keys = mx.random.split(mx.random.key(0), 3)
    wg, wu = ((mx.random.normal((h, d), key=k) / math.sqrt(d)).astype(mx.float16)
              for k in keys[:2])
    x = mx.random.normal((args.tokens, d), key=keys[2]).astype(mx.float16)
    mx.eval(wg, wu, x)
    fns = {b: mx.compile(lambda x, b=b: ops.gated_mlp(x, wg, wu, backend=b))
           for b in ("mlx", "metile")}
    for f in fns.values():
        sample(f, x, args.launches)
    modes = {"mlx_first": (["mlx", "metile"], 0), "metile_first": (["metile", "mlx"], 0),
             "mlx_first_lead_in": (["mlx", "metile"], 5)}
    report = {**machine(), "probe": "tools/probes/order_penalty.py", "tokens": args.tokens,
              "metric": f"median us per call, {args.launches} calls a sample", "modes": {}}
    for mode, (order, lead) in modes.items():
        times = {n: [] for n in order}
        for _ in range(args.rounds):
            for n in order:
                if lead:
                    sample(fns[n], x, lead)
                times[n].append(sample(fns[n], x, args.launches))
        us = {n: round(float(np.median(t)) * 1e6, 1) for n, t in times.items()}
        report["modes"][mode] = {"us": us, "mlx_over_metile": round(us["mlx"] / us["metile"], 3),
                                 "samples_us": {n: [round(s * 1e6, 1) for s in t]
                                                for n, t in times.items()}}
        print(mode, json.dumps(report["modes"][mode]["us"]),
              report["modes"][mode]["mlx_over_metile"], flush=True)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
