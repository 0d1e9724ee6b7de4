"""How a GEMM's time follows its waves: x @ w.T at N=11008, K=4096 (the MLP's gate and
the int4 prefill's dense product) for rows M = 256 ... 1024, at 128x256 (M/128 x 43 tiles:
M=384 is 129 tiles, under one wave of 132 SMs; M=512 is 172, 1.3 waves), 128x192 and
128x128 7 stages, against MLX's product in the same run.  If the second, partial wave
costs a whole tile time (stream-K's premise), M=512 takes about twice M=384; if the
machine is held by power, less.  Each mx.compile'd, alternating, median of rounds.

    python3 tools/probes/gemm_waves.py [out.json] [--rounds 5]
"""
import argparse
import json
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "tools/probes")
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402
from mlp_gemm_tiles import tile  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rows", type=int, nargs="+", default=[256, 384, 512, 640, 768, 1024])
    p.add_argument("--n", type=int, default=11008)
    p.add_argument("--k", type=int, default=4096)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    dtype = mx.float16
    n, k = args.n, args.k
    w = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(dtype)
    report = {**machine(), "probe": "tools/probes/gemm_waves.py", "dtype": "float16",
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "n": n, "k": k, "cases": []}
    variants = {"128x256": tile(128, 256), "128x192": tile(128, 192),
                "128x128 7 stages": tile(128, 128, 7)}
    for m in args.rows:
        x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
        mx.eval(x, w)
        fns = {"mlx": mx.compile(lambda x: x @ w.T)}
        for name, block in variants.items():
            fns[name] = mx.compile(
                lambda x, b=block: ops._launch_linear(x, w, None, None, None, 0.0, b))
        want = np.array(fns["mlx"](x).astype(mx.float32), np.float64)
        case = {"m": m, "variants": {}}
        ok = {}
        for name, fn in fns.items():
            try:
                got = np.array(fn(x).astype(mx.float32), np.float64)
            except Exception as e:   # a tile the compiler refuses: say so, time the rest
                case["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{m:5d}x{n}x{k} {name:18s} {case['variants'][name]['error'][:150]}")
                continue
            err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
            case["variants"][name] = {"relative_error_vs_mlx": err}
            if err < 1e-2:
                ok[name] = fn
        times = rotate_sized(ok, x, args.rounds)
        for name, s in times.items():
            flops = 2.0 * m * n * k / s / 1e12
            case["variants"][name].update(us=round(s * 1e6, 1), tflops=round(flops, 1))
            print(f"{m:5d}x{n}x{k} {name:18s} {s * 1e6:8.1f} us {flops:6.1f} TFLOP/s", flush=True)
        report["cases"].append(case)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
