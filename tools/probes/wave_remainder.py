"""Whether the last, partial wave of a GEMM's tiles is worth splitting along K (issues 14 and
17): at 512x11008x4096 (T=512's gate/up projection and the int4 prefill's dense product) the
128x256 tile gives 172 tiles, 1.3 waves of the H200's 132 SMs, so the second wave runs 40
tiles on 132 SMs.  Variants, each against MLX's x @ w.T in one alternating run:

    full       the ops' 128x256 tile over every column (what runs now)
    one wave   its first 33 column tiles only (132 tiles: the first wave alone, for scale)
    hybrid s   those 132 tiles, then the other 2560 columns split S ways along K (ops'
               split-K: partial products in float32, summed by a second kernel), the two
               joined by mx.concatenate (a copy of the output, which a single-output form
               would not make)

    python3 tools/probes/wave_remainder.py [out.json] [--rounds 7]
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

WAVE_COLUMNS = 33 * 256


def tile(bm, bn, **extra):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_simdgroups=8, TRANSPOSE_B=True, **extra)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", type=int, nargs="*", default=[512])
    args = p.parse_args()
    rng = np.random.default_rng(0)
    report = {**machine(), "probe": "tools/probes/wave_remainder.py", "dtype": "float16",
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "cases": []}
    n, k = 11008, 4096
    for m in args.rows:
        x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.float16)
        w = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(
            mx.float16)
        mx.eval(x, w)
        head, rest = w[:WAVE_COLUMNS], w[WAVE_COLUMNS:]
        mx.eval(head, rest)
        big = tile(128, 256)

        def linear(x, ww, block):
            return ops._launch_linear(x, ww, None, None, None, 0.0, block)

        def head_in_place(x):
            # the first 8448 columns from the whole weight (its first rows: no slice)
            from metile_kernels.gemm import grid, linear_epilogue
            return linear_epilogue[grid(m, WAVE_COLUMNS, 128, 256)](
                x, w, mx.zeros((m, WAVE_COLUMNS), x.dtype), x, x, m, WAVE_COLUMNS, k,
                BIAS="none", RESIDUAL=False, EPILOGUE="none", NEGATIVE_SLOPE=0.0, **big)

        fns = {"mlx x @ w.T": lambda x: x @ w.T,
               "one wave, no slice": head_in_place,
               "mlx one wave x @ w[:8448].T": lambda x: x @ head.T,
               "full 128x256": lambda x: linear(x, w, big),
               "full 128x128": lambda x: linear(x, w, tile(128, 128)),
               "one wave (first 8448 columns)": lambda x: linear(x, head, big)}
        for s in (2, 3, 4):
            fns[f"hybrid split {s}"] = lambda x, s=s: mx.concatenate(
                [linear(x, head, big), linear(x, rest, tile(128, 256, SPLIT_K=s))], axis=1)
        fns["hybrid rest 128x128"] = lambda x: mx.concatenate(
            [linear(x, head, big), linear(x, rest, tile(128, 128))], axis=1)
        fns["hybrid rest 128x128 split 2"] = lambda x: mx.concatenate(
            [linear(x, head, big), linear(x, rest, tile(128, 128, SPLIT_K=2))], axis=1)
        fns["rest only, split 3"] = lambda x: linear(x, rest, tile(128, 256, SPLIT_K=3))
        fns["concatenate only"] = lambda x: mx.concatenate([x[:, :1] * head[:, 0],
                                                            x[:, :1] * rest[:, 0]], axis=1)
        case = {"shape": [m, n, k], "variants": {}}
        want = np.array((x @ w.T).astype(mx.float32), np.float64)
        ok = {}
        for name, fn in fns.items():
            try:
                c = mx.compile(fn)
                got = np.array(c(x).astype(mx.float32), np.float64)
                if "only" not in name and "one wave" not in name:
                    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    case["variants"][name] = {"relative_error_vs_mlx": err}
                    if err > 1e-2:
                        print(f"{m}x{n}x{k} {name}: WRONG, relative error {err:.2e}", flush=True)
                        continue
                else:
                    case["variants"][name] = {}
                ok[name] = c
            except Exception as e:
                case["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{m}x{n}x{k} {name}: {type(e).__name__} {str(e)[:200]}", flush=True)
        times = rotate_sized(ok, x, args.rounds)
        base = times[next(iter(ok))]
        for name, s in times.items():
            case["variants"][name].update(us=round(s * 1e6, 1), vs_mlx=round(base / s, 3))
            print(f"{m}x{n}x{k} {name:32s} {s * 1e6:8.1f} us  {base / s:5.2f}x", flush=True)
        report["cases"].append(case)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
