"""Where int4 quantized_matmul's time goes on the GPU: the prefill candidate's two
kernels alone (row-wise dequantize, ops' GEMM on the dense weight) beside MLX's dense
product, and a sweep of quantized_matvec_runs tiles for decode.  Each side an
`mx.compile`d call timed like benchmarks/quantized.py (many launches per sync,
alternating, median of rounds).

    python tools/probes/quantized_parts.py [--rounds 5]
"""

import argparse
import json
import math
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
sys.path.insert(0, "tools/probes")
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

from benchmarks.quantized import seconds_per_call   # noqa: E402
from metile import ops, quantized_ops                # noqa: E402


def timed(fns, x, rounds, launches=50):
    times = {k: [] for k in fns}
    for fn in fns.values():
        seconds_per_call(fn, x, 2)
    order = list(fns)
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            times[side].append(seconds_per_call(fns[side], x, launches))
    return {k: round(float(np.median(v)) * 1e6, 1) for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--decode-only", action="store_true")
    args = parser.parse_args()
    from metile_kernels import quantized as kernels
    n, k = 11008, 4096
    w = (mx.random.normal((n, k), key=mx.random.key(1)) / math.sqrt(k)).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    dense = mx.dequantize(wq, s, b, group_size=64, bits=4)
    mx.eval(w, wq, s, b, dense)
    out = {}
    if not args.decode_only:
        prefill(args, kernels, n, k, wq, s, b, dense, out)
    decode(args, n, k, wq, s, b, out)


def prefill(args, kernels, n, k, wq, s, b, dense, out):
    xp = mx.random.normal((512, k), key=mx.random.key(2)).astype(mx.float16)

    def deq(_x, block=1024, warps=4, rows=1):
        return kernels.dequantize[(math.ceil(k / block), math.ceil(n / rows))](
            wq, s, b, mx.zeros((n, k), mx.float16), n, k, BITS=4, GROUP=64, BLOCK=block,
            num_warps=warps, ROWS=rows)
    fns = {f"dequantize {bl}/{wa}/rows {ro}": mx.compile(
        lambda x, bl=bl, wa=wa, ro=ro: deq(x, bl, wa, ro))
        for bl, wa, ro in ((4096, 8, 1), (4096, 4, 1), (8192, 8, 1), (2048, 4, 1), (8192, 16, 1),
                           (4096, 8, 2))}
    fns.update({
           "mx.dequantize": mx.compile(lambda x: mx.dequantize(wq, s, b, group_size=64, bits=4)),
           "metile linear(dense)": mx.compile(lambda x: ops.linear(x, dense, backend="metile")),
           "metile matmul(dense.T copy)": mx.compile(
               lambda x: ops.matmul(x, mx.contiguous(dense.T), backend="metile")),
           "mlx x@dense.T": mx.compile(lambda x: x @ dense.T),
           "dequantize+gemm": mx.compile(lambda x: quantized_ops._metile(
               x, wq, s, b, n, k, True, 64, 4, quantized_ops.DEQUANTIZE_GEMM)),
           "mlx quantized_matmul": mx.compile(lambda x: mx.quantized_matmul(x, wq, s, b))})
    out["prefill_512"] = timed(fns, xp, args.rounds)
    print("prefill", json.dumps(out["prefill_512"]), flush=True)
    print("linear:", ops.explain_linear(xp, dense, backend="metile")[:1500], flush=True)


def decode(args, n, k, wq, s, b, out):
    xd = mx.random.normal((1, k), key=mx.random.key(3)).astype(mx.float16)
    fns = {"mlx": mx.compile(lambda x: mx.quantized_matmul(x, wq, s, b))}
    # (the 2026-12-01 sweep also tried a per-block running sum, SUM_EACH_BLOCK: no faster,
    # removed)
    from decode_kernels_ncu import GEMV
    for cfg in GEMV:
        name = " ".join(f"{key}={v}" for key, v in cfg.items())
        fns[name] = mx.compile(
            lambda x, cfg=cfg: quantized_ops._metile(x, wq, s, b, n, k, True, 64, 4, cfg))
    want = np.array(mx.quantized_matmul(xd, wq, s, b)).astype(np.float64)
    for name, fn in fns.items():
        err = np.abs(np.array(fn(xd)).astype(np.float64) - want).max()
        if err > 0.02 * np.abs(want).max():
            print("decode", name, "error", float(err), flush=True)
    out["decode_1"] = timed(fns, xd, args.rounds)
    print("decode", json.dumps(out["decode_1"]), flush=True)


if __name__ == "__main__":
    main()
