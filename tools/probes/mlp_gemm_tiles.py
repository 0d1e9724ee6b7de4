"""The MLP's GEMMs at other tiles, stage counts and program orders than the ops' defaults,
against MLX's product in the same run (issue 14: which change could move the MLP forward).

Shapes (hidden 4096, MLP 11008; MxNxK): the gate projection x @ wg.T at T=2048
(2048x11008x4096: 688 tiles of 128x256 are 5.2 waves of 132 SMs, 1376 of 128x128 are 10.4)
and at T=512 (172 tiles of 128x256: 1.3 waves; the int4 prefill's dense product), the down
projection h @ wd.T at T=512 (512x4096x11008: 128 tiles of 128x128, 172 K steps each) and
at T=2048, and the dual GEMM at T=2048.  Each mx.compile'd, alternating, median of rounds;
every variant checked against MLX's result first.

    python3 tools/probes/mlp_gemm_tiles.py [out.json] [--rounds 5]
    python3 tools/probes/mlp_gemm_tiles.py --small --rounds 1     # CPU smoke (64x64 tiles)
"""
import argparse
import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, ".")
import metile  # noqa: E402
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402


def tile(bm, bn, stages=None, grouped=False, **extra):
    block = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_simdgroups=8 if bm == 128 else 4,
                 TRANSPOSE_B=True, **extra)
    if stages or grouped:
        block["SCHEDULE"] = metile.Schedule(
            num_stages=stages, **(dict(program_order="grouped", group_size=8) if grouped else {}))
    return block


def cases(small: bool):
    if small:   # the CPU runtime's portable tile
        t = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, TRANSPOSE_B=True)
        return [("linear", 96, 80, 48, {"64x64": t}), ("gated", 96, 80, 48, {"64x64": t})]
    return [
        ("linear", 2048, 11008, 4096, {
            "128x256 (default)": tile(128, 256), "128x256 grouped": tile(128, 256, grouped=True),
            "128x128": tile(128, 128), "128x128 6 stages": tile(128, 128, 6),
            "128x128 7 stages grouped": tile(128, 128, 7, True)}),
        ("linear", 512, 11008, 4096, {   # the gate at T=512, int4 prefill's dense product
            "128x256 (default)": tile(128, 256), "128x128": tile(128, 128),
            "128x128 6 stages": tile(128, 128, 6), "128x128 7 stages": tile(128, 128, 7),
            "128x192": tile(128, 192)}),
        ("linear", 512, 4096, 11008, {
            "128x128 (default)": tile(128, 128), "128x128 6 stages": tile(128, 128, 6),
            "128x128 7 stages": tile(128, 128, 7), "128x256": tile(128, 256),
            "128x128 split 2": tile(128, 128, SPLIT_K=2),
            "64x128 one warpgroup 6 stages": tile(64, 128, 6)}),
        ("linear", 2048, 4096, 11008, {
            "128x256 (default)": tile(128, 256), "128x256 grouped": tile(128, 256, grouped=True),
            "128x128 6 stages": tile(128, 128, 6)}),
        ("gated", 2048, 11008, 4096, {
            "128x128 (default)": tile(128, 128), "128x128 grouped": tile(128, 128, grouped=True)}),
    ]


def measure(cases, rounds: int, probe: str) -> dict:
    """Each case's variants mx.compile'd, checked against the case's first function (MLX's
    product), then timed alternating.  A variant is a tile dict, or (tile, settings): the
    METILE_ settings in the environment while it is traced."""
    rng = np.random.default_rng(0)
    dtype = mx.float16

    def rand(*shape, scale=1.0):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)

    report = {**machine(), "probe": probe, "dtype": "float16",
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "cases": []}
    for kind, m, n, k, variants in cases:
        x, w, w2 = rand(m, k), rand(n, k, scale=k ** -0.5), rand(n, k, scale=k ** -0.5)
        mx.eval(x, w, w2)
        if kind == "linear":
            fns = {"mlx x @ w.T": (lambda x: x @ w.T, {})}
            launch = lambda x, b: ops._launch_linear(x, w, None, None, None, 0.0, b)  # noqa: E731
        else:
            fns = {"mlx silu(x @ wg.T) * (x @ wu.T)": (lambda x: nn.silu(x @ w.T) * (x @ w2.T), {})}
            launch = lambda x, b: ops._launch_gated(x, w, w2, "silu", b)  # noqa: E731
        for name, variant in variants.items():
            block, settings = variant if isinstance(variant, tuple) else (variant, {})
            fns[name] = (lambda x, b=block: launch(x, b), settings)
        case = {"kind": kind, "shape": [m, n, k], "variants": {}}
        ok = {}
        want = None
        for name, (fn, settings) in fns.items():
            saved = {key: os.environ.get(key) for key in settings}
            os.environ.update(settings)
            try:
                c = mx.compile(fn)
                got = c(x).astype(mx.float32)
                mx.eval(got)
                if want is None:
                    want = np.array(got, np.float64)
                err = float(np.linalg.norm(np.array(got, np.float64) - want)
                            / max(np.linalg.norm(want), 1e-30))
                case["variants"][name] = {"relative_error_vs_mlx": err}
                if err < 1e-2:
                    ok[name] = c
            except Exception as e:   # a variant the compiler refuses: say so, time the rest
                case["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        times = rotate_sized(ok, x, rounds)
        base = times[next(iter(ok))]
        for name, s in times.items():
            case["variants"][name].update(us=round(s * 1e6, 1), vs_mlx=round(base / s, 3))
            print(f"{kind:6s} {m}x{n}x{k} {name:34s} {s * 1e6:8.1f} us  {base / s:5.2f}x",
                  flush=True)
        for name, v in case["variants"].items():
            if "error" in v:
                print(f"{kind:6s} {m}x{n}x{k} {name:34s} {v['error'][:120]}", flush=True)
        report["cases"].append(case)
    return report


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--small", action="store_true")
    args = p.parse_args()
    report = measure(cases(args.small), args.rounds, "tools/probes/mlp_gemm_tiles.py")
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
