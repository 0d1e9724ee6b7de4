"""int4 prefill with a switch of the fused GEMM's staging on and off, in one process,
alternating: each side is compiled (its kernel resolved) under its setting, then timed
beside the others.  --switch METILE_STAGING_AHEAD (the default: the packed words read a K
step ahead, on since the forty-second session, against read in the step that stores the
dequantized tile) or METILE_MIXED_BULK (x by bulk tensor copies beside the threads' stores,
against every thread's cp.async copies).

Sides (x4096x11008, group 64, 4 weights cycled, benchmarks.quantized's timing): MLX's
quantized_matmul, the dense product x @ w.T, the op's candidates for the shape (auto's),
and each of --tiles (quantized_ops names), each with the switch on and off.

    python3 tools/probes/staging_ahead.py [out.json] [--rows 512 128] [--dtype float16]
        [--switch METILE_MIXED_BULK]
"""
import argparse
import math
import os
import platform
import sys

sys.path[:0] = ["kernels", ".", "tools/probes"]
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

from benchmarks.quantized import seconds_per_call, sides   # noqa: E402
from metile import quantized_ops                            # noqa: E402
from probe_report import add_case, alternating_us, save     # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rows", type=int, nargs="*", default=[512, 128])
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=11008)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--tiles", nargs="*", default=["WGMMA_PAIRS_TALL", "WGMMA_PAIRS"])
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--launches", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--switch", default="METILE_STAGING_AHEAD",
                   choices=["METILE_STAGING_AHEAD", "METILE_MIXED_BULK"])
    args = p.parse_args()
    names = {"METILE_STAGING_AHEAD": ("inline", "ahead"), "METILE_MIXED_BULK": ("copies", "bulk")}
    if args.switch == "METILE_MIXED_BULK":
        # the switch alone decides x's copies: the 256x128 tile's BULK_X (its config's
        # bulk form since the forty-third session) would take the copies side's too
        for name in ("WGMMA_PAIRS_TALL", "WGMMA_PAIRS"):
            setattr(quantized_ops, name, {key: v for key, v in getattr(quantized_ops, name).items()
                                          if key != "BULK_X"})
    off_on = names[args.switch]
    dtype, n, k, group, bits = getattr(mx, args.dtype), args.n, args.k, 64, 4
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device()),
                          "device_name": mx.device_info().get("device_name", "")},
              "probe": "tools/probes/staging_ahead.py", "dtype": args.dtype,
              "switch": args.switch,
              "metric": f"us per product, {args.launches} a sync, {args.copies} weights "
                        "cycled, alternating, median", "cases": []}
    keys = mx.random.split(mx.random.key(0), 1 + args.copies)
    weights = []
    for key in keys[1:]:
        w = (mx.random.normal((n, k), key=key) / math.sqrt(k)).astype(dtype)
        weights.append((w, *mx.quantize(w, group_size=group, bits=bits)))
        mx.eval(*weights[-1])
    for rows in args.rows:
        x = mx.random.normal((rows, k), key=keys[0]).astype(dtype)
        mx.eval(x)
        fns = {}
        for on in ("0", "1"):
            os.environ[args.switch] = on
            made = sides(n, k, group, bits, rows, dtype, args.tiles)
            for name, fn in made.items():
                if name in ("mlx", "dense"):
                    fns.setdefault(name, fn)
                    continue
                label = f"{name} {off_on[int(on)]}"
                fn(x, *weights[0])   # traced (its kernel resolved) under this setting
                fns[label] = fn
        os.environ.pop(args.switch)
        want = np.array(fns["mlx"](x, *weights[0]).astype(mx.float32))
        errors = {}
        reference = fns["mlx"](x, *weights[0])
        for name, fn in fns.items():
            got = fn(x, *weights[0])
            errors[name] = float(np.abs(np.array(got.astype(mx.float32)) - want).max()
                                 / np.abs(want).max())
            # (as benchmarks.quantized: a side that differs from MLX's op is not timed)
            problem = None if name == "dense" else quantized_ops._validate(got, reference)
            if problem:
                raise SystemExit(f"{name} differs from MLX at {rows} rows: {problem}")
            seconds_per_call(fn, x, 2, weights)
        us = alternating_us(list(fns), lambda name: seconds_per_call(
            fns[name], x, args.launches, weights), args.rounds)
        case = {"rows": rows, "k": k, "n": n, "us": us, "errors": errors,
                "mlx_over": {name: round(us["mlx"] / t, 3) for name, t in us.items()}}
        add_case(report, case)
    save(report, args.output or "")


if __name__ == "__main__":
    main()
