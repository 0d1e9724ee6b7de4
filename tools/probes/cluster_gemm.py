"""The warpgroup GEMM in clusters of two blocks (Schedule(cluster_size=2): each K step's
shared operand tile copied half by each block and multicast to both) against the same tile
without clusters and MLX's product, in one run (issues 14 and 17: the T=512 products read
their operands through L2 at ~6.2 TB/s, `wave_remainder.py`; a pair sharing the weight
tile reads 2/3 of those bytes).

Shapes (MxNxK, hidden 4096, MLP 11008): the gate projection x @ w.T at T=512 (the int4
prefill's dense product) and T=2048, the down projection at T=512 and 2048, and the dual
GEMM (gated MLP) at T=512.  Each variant mx.compile'd and checked against MLX's result
first; then alternating rounds, many calls a sync (benchmarks.common.rotate_sized).

    python3 tools/probes/cluster_gemm.py [out.json] [--rounds 5] [--only 512]

Needs the cluster implementation of commit 1694832, reverted by the commit after it (see
benchmarks/results/README.md, twenty-eighth session): on main, Schedule has no cluster_size.
"""
import argparse
import json
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, ".")
import metile  # noqa: E402
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402


def tile(bm, bn, cluster=None, stages=None):
    block = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_simdgroups=8, TRANSPOSE_B=True)
    if cluster or stages:
        block["SCHEDULE"] = metile.Schedule(cluster_size=cluster, num_stages=stages)
    return block


def cases():
    wide = {"128x256": tile(128, 256), "128x256 cluster 2": tile(128, 256, 2)}
    narrow = {"128x128 7 stages": tile(128, 128, None, 7),
              "128x128 7 stages cluster 2": tile(128, 128, 2, 7)}
    return [
        ("linear", 512, 11008, 4096, {**wide, **narrow}),
        ("linear", 512, 4096, 11008, {**narrow, **wide}),
        ("gated", 512, 11008, 4096, {"128x128": tile(128, 128),
                                      "128x128 cluster 2": tile(128, 128, 2)}),
        ("linear", 2048, 11008, 4096, {**wide, **narrow}),
        ("linear", 2048, 4096, 11008, {**wide, **narrow}),
        ("linear", 4096, 4096, 4096, wide),
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", type=int, help="only shapes of this many rows")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    dtype = mx.float16

    def rand(*shape, scale=1.0):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)

    report = {**machine(), "probe": "tools/probes/cluster_gemm.py", "dtype": "float16",
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "cases": []}
    for kind, m, n, k, variants in cases():
        if args.only and m != args.only:
            continue
        x, w, w2 = rand(m, k), rand(n, k, scale=k ** -0.5), rand(n, k, scale=k ** -0.5)
        mx.eval(x, w, w2)
        if kind == "linear":
            fns = {"mlx x @ w.T": lambda x: x @ w.T}
            for name, block in variants.items():
                fns[name] = lambda x, b=block: ops._launch_linear(x, w, None, None, None, 0.0, b)
        else:
            fns = {"mlx silu(x @ wg.T) * (x @ wu.T)": lambda x: nn.silu(x @ w.T) * (x @ w2.T)}
            for name, block in variants.items():
                fns[name] = lambda x, b=block: ops._launch_gated(x, w, w2, "silu", b)
        case = {"kind": kind, "shape": [m, n, k], "variants": {}}
        ok, want = {}, None
        for name, fn in fns.items():
            try:
                c = mx.compile(fn)
                got = c(x).astype(mx.float32)
                mx.eval(got)
                if want is None:
                    want = np.array(got, np.float64)
                err = float(np.linalg.norm(np.array(got, np.float64) - want)
                            / max(np.linalg.norm(want), 1e-30))
                case["variants"][name] = {"relative_error_vs_mlx": err}
                print(f"{kind:6s} {m}x{n}x{k} {name:30s} error vs MLX {err:.2e}", flush=True)
                if err < 1e-2:
                    ok[name] = c
            except Exception as e:   # a variant refused: say so, time the rest
                case["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{kind:6s} {m}x{n}x{k} {name:30s} {case['variants'][name]['error']}",
                      flush=True)
        times = rotate_sized(ok, x, args.rounds)
        base = times[next(iter(ok))]
        for name, s in times.items():
            case["variants"][name].update(us=round(s * 1e6, 1), vs_mlx=round(base / s, 3))
            print(f"{kind:6s} {m}x{n}x{k} {name:30s} {s * 1e6:8.1f} us  {base / s:5.2f}x",
                  flush=True)
        report["cases"].append(case)
        if args.output:
            json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
