"""Does int4 prefill get faster with the dequantize split along K into parts, each part's
product accumulated onto the last (`out = x_0 @ W_0.T`, then `addmm(out, x_i, W_i.T)`)?
Part i+1's dequantize depends on nothing before it, so MLX's CUDA graph may run it while
part i's product runs (independent nodes overlapped in s135), hiding all but the first
part's dequantize behind the products.  The parts' packed weights are split ahead
(contiguous copies, not timed): the bytes each part's dequantize reads are the ones a
kernel reading a column window of the whole weight would.

Sides, 512x4096x11008 int4 group 64 (float16 by default), 4 weights cycled (read from
DRAM), each mx.compile'd, benchmarks/quantized.py's timing (50 launches a sync,
alternating, median of rounds): MLX's quantized_matmul, dequantize + MLX's product (the
op's prefill path), the same in 2, 4 and 8 parts along K.

    python3 tools/probes/int4_prefill_split.py [out.json] [--rows 512] [--parts 2 4 8]
"""
import argparse
import math
import platform
import sys

sys.path[:0] = ["kernels", ".", "tools/probes"]
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

from benchmarks.quantized import seconds_per_call   # noqa: E402
from metile import quantized_ops                     # noqa: E402
from probe_report import add_case, save              # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rows", type=int, nargs="*", default=[512])
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=11008)
    p.add_argument("--parts", type=int, nargs="*", default=[2, 4, 8])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--launches", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    from metile_kernels import quantized as kernels
    dtype, n, k, group, bits = getattr(mx, args.dtype), args.n, args.k, 64, 4
    per = 32 // bits
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device())},
              "probe": "tools/probes/int4_prefill_split.py", "dtype": args.dtype,
              "metric": "us per product, 50 a sync, 4 weights cycled, alternating, median",
              "cases": []}
    keys = mx.random.split(mx.random.key(0), 1 + args.copies)
    weights = []
    for key in keys[1:]:
        w = (mx.random.normal((n, k), key=key) / math.sqrt(k)).astype(dtype)
        wq, s, b = mx.quantize(w, group_size=group, bits=bits)
        split = {}
        for parts in args.parts:
            kp = k // parts
            split[parts] = [tuple(mx.contiguous(a[:, i * kp // d:(i + 1) * kp // d])
                                  for a, d in ((wq, per), (s, group), (b, group)))
                            for i in range(parts)]
        mx.eval(wq, s, b, *[a for v in split.values() for t in v for a in t])
        weights.append((wq, s, b, split))

    def deq(wq, s, b, columns):
        return kernels.dequantize[(math.ceil(columns / quantized_ops.DEQUANTIZE_BLOCK), n)](
            wq, s, b, mx.zeros((n, columns), dtype), n, columns, BITS=bits, GROUP=group,
            BLOCK=quantized_ops.DEQUANTIZE_BLOCK, num_warps=quantized_ops.DEQUANTIZE_WARPS)

    def split_side(parts):
        kp = k // parts

        def f(x, wq, s, b, *flat):
            out = None
            for i in range(parts):
                dense = deq(*flat[3 * i:3 * i + 3], kp)
                xi = x[:, i * kp:(i + 1) * kp]
                out = xi @ dense.T if out is None else mx.addmm(out, xi, dense.T)
            return out
        return f

    sides = {
        "mlx": lambda x, wq, s, b, *flat: mx.quantized_matmul(x, wq, s, b, transpose=True,
                                                              group_size=group, bits=bits),
        "dequantize+mlx": lambda x, wq, s, b, *flat: x @ deq(wq, s, b, k).T,
    }
    for parts in args.parts:
        sides[f"split {parts}"] = split_side(parts)
    for rows in args.rows:
        x = mx.random.normal((rows, k), key=keys[0]).astype(dtype)
        mx.eval(x)
        per_side = {}
        for name, fn in sides.items():
            parts = int(name.split()[1]) if name.startswith("split") else None
            args_of = [(wq, s, b, *([a for t in split[parts] for a in t] if parts else []))
                       for wq, s, b, split in weights]
            per_side[name] = (mx.compile(fn), args_of)
        want = np.array(sides["mlx"](x, *weights[0][:3]).astype(mx.float32))
        errors = {}
        for name, (fn, args_of) in per_side.items():
            got = np.array(fn(x, *args_of[0]).astype(mx.float32))
            errors[name] = float(np.abs(got - want).max() / np.abs(want).max())
        for name, (fn, args_of) in per_side.items():
            seconds_per_call(fn, x, 2, args_of)
        times = {name: [] for name in per_side}
        order = list(per_side)
        for r in range(args.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                fn, args_of = per_side[name]
                times[name].append(seconds_per_call(fn, x, args.launches, args_of))
        us = {name: round(float(np.median(t)) * 1e6, 1) for name, t in times.items()}
        case = {"rows": rows, "k": k, "n": n, "us": us, "errors": errors,
                "mlx_over": {name: round(us["mlx"] / t, 3) for name, t in us.items()}}
        add_case(report, case)
    save(report, args.output or "")   # ("": no file; argv[1] may be an option here)


if __name__ == "__main__":
    main()
