"""Why `ops.gated_mlp(backend="metile")` measures slower than the same dual-GEMM kernel
launched directly (benchmarks/results README: float16 compiled 245 us through the op where
mlp_parts' direct launch takes 151; bfloat16 unaffected - "not found why").  One process,
one harness (benchmarks.common.rotate_sized), the forms from the kernel up to the op, each
mx.compile'd, alternating:

  mlx       silu(x @ wg.T) * (x @ wu.T)
  launch    ops._launch_gated on mlp_parts' default dual tile (no custom function)
  function  ops._fused_gated(...) on that tile (the op's custom function, vjp attached)
  op        ops.gated_mlp(x, wg, wu, backend="metile") (routing, replays)
  op_tile   the tile the op resolves, launched as `launch` is (printed with it)

    python3 tools/probes/gated_forms.py [out.json] [--tokens 512] [--dtypes float16 bfloat16]
    python3 tools/probes/gated_forms.py --tokens 16 --dims 64 --hidden 96 --rounds 1   # CPU
"""
import argparse
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path[:0] = [".", "tools/probes"]
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402
from probe_report import add_case, save  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--tokens", nargs="*", type=int, default=[512])
    p.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dims", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=11008)
    # "mlx": weights and x as benchmarks.model_layers makes them (mx.random, scaled, then
    # cast), which measured the op at 0.71x where this probe's NumPy ones gave 1.06x (s136)
    p.add_argument("--weights", choices=["numpy", "mlx"], default="numpy")
    args = p.parse_args()
    report = {**machine(), "probe": "tools/probes/gated_forms.py",
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "cases": []}
    rng = np.random.default_rng(0)
    for dname in args.dtypes:
        dtype = getattr(mx, dname)

        def rand(*shape, scale=1.0):
            return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)
        if args.weights == "mlx":
            def rand(*shape, scale=1.0, _n=[0]):
                _n[0] += 1
                return (scale * mx.random.normal(shape, key=mx.random.key(_n[0]))).astype(dtype)
        wg = rand(args.hidden, args.dims, scale=args.dims ** -0.5)
        wu = rand(args.hidden, args.dims, scale=args.dims ** -0.5)
        for t in args.tokens:
            x = rand(t, args.dims)
            mx.eval(wg, wu, x)
            default = ops._dual_block(ops._block(t, args.hidden, dtype, transpose_b=True,
                                                 k=args.dims))
            x2, g2, u2 = ops._gated_args(x, wg, wu, "silu")
            resolved = ops._route("gated_mlp", (x2, g2, u2), "silu", ops.LEAKY_SLOPE,
                                  "metile").block
            forms = {
                "mlx": lambda x: nn.silu(x @ wg.T) * (x @ wu.T),
                "launch": lambda x: ops._launch_gated(x, wg, wu, "silu", default),
                "function": lambda x: ops._fused_gated("silu", default)(x, wg, wu),
                "op": lambda x: ops.gated_mlp(x, wg, wu, backend="metile"),
                "op_tile": lambda x: ops._launch_gated(x, wg, wu, "silu", resolved),
            }
            fns = {n: mx.compile(f) for n, f in forms.items()}
            want = np.array(fns["mlx"](x).astype(mx.float32))
            errors = {}
            for n, f in fns.items():
                got = np.array(f(x).astype(mx.float32))
                errors[n] = float(np.abs(got - want).max() / np.abs(want).max())
            times = rotate_sized(fns, x, args.rounds)
            case = {"dtype": dname, "tokens": t, "weights": args.weights, "default_tile": default,
                    "op_tile": resolved, "errors": errors,
                    "us": {n: round(s * 1e6, 1) for n, s in times.items()},
                    "mlx_over": {n: round(times["mlx"] / s, 3) for n, s in times.items()}}
            add_case(report, case)
    save(report, args.output or "")   # ("": no file; argv[1] may be an option here)


if __name__ == "__main__":
    main()
