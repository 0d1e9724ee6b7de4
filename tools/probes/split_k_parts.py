"""Where a split-K product's time goes (issue 14's skinny GEMMs): 512x2560x4096 float16
(x @ w.T, 40 tiles of 128x256 - under a third of the H200's SMs, so ops splits K), timed as
compiled calls against MLX's product (alternating, many calls a sync), then - with --ncu, run
under ncu - each side evaluated a few times so ncu lists every kernel with its duration (the
partial products and the epilogue that sums them).

    python3 tools/probes/split_k_parts.py [out.json]
    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/split_k_parts.py --ncu
"""
import argparse
import json
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "kernels")
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402


def tile(bm, bn, **extra):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_simdgroups=8, TRANSPOSE_B=True, **extra)


def sides(m, n, k):
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.float16)
    w = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(mx.float16)
    mx.eval(x, w)

    def linear(block):
        return lambda x: ops._launch_linear(x, w, None, None, None, 0.0, block)

    fns = {"mlx x @ w.T": lambda x: x @ w.T,
           "ops.linear backend=metile": lambda x: ops.linear(x, w, backend="metile"),
           "128x256": linear(tile(128, 256)), "128x128": linear(tile(128, 128))}
    for s in (2, 3, 6):
        fns[f"128x256 split {s}"] = linear(tile(128, 256, SPLIT_K=s))
    fns["128x128 split 2"] = linear(tile(128, 128, SPLIT_K=2))
    return x, fns


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ncu", action="store_true")
    p.add_argument("--shape", type=int, nargs=3, default=[512, 2560, 4096])
    args = p.parse_args()
    m, n, k = args.shape
    x, fns = sides(m, n, k)
    want = np.array(fns["mlx x @ w.T"](x).astype(mx.float32), np.float64)
    ok = {}
    report = {**machine(), "probe": "tools/probes/split_k_parts.py", "shape": [m, n, k],
              "variants": {}}
    for name, fn in fns.items():
        try:
            got = np.array(fn(x).astype(mx.float32), np.float64)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            report["variants"][name] = {"relative_error_vs_mlx": err}
            if err > 1e-2:
                print(f"{name}: WRONG, relative error {err:.2e}", flush=True)
                continue
            ok[name] = fn if args.ncu else mx.compile(fn)
        except Exception as e:
            report["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name}: {type(e).__name__} {str(e)[:200]}", flush=True)
    if args.ncu:
        for name, fn in ok.items():
            print("side", name, flush=True)
            for _ in range(3):
                mx.eval(fn(x))
                mx.synchronize()
        return
    times = rotate_sized(ok, x, args.rounds)
    base = times[next(iter(ok))]
    for name, s in times.items():
        report["variants"][name].update(us=round(s * 1e6, 1), vs_mlx=round(base / s, 3))
        print(f"{m}x{n}x{k} {name:30s} {s * 1e6:8.1f} us  {base / s:5.2f}x", flush=True)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
