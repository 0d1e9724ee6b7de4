"""Kernel-only GPU durations of the decode-shaped ops, for ncu: decode attention
(1x32x4096x128 float16, metile's decode_rows configurations and the split kernel, MLX's
op) and the int4 GEMV (1x4096x11008, group 64: MLX's and metile's decode kernels), each
evaluated `--repeat` times in order.  benchmarks time a compiled call, host work
included; this separates the GPU's part.

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/decode_kernels_ncu.py
    python3 tools/probes/decode_kernels_ncu.py --summarize ncu.csv
"""

import argparse
import csv
import io
import math
import sys
from collections import OrderedDict

import numpy as np

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")

ATTENTION = [{"path": "decode_rows", "BLOCK_N": 64},
             {"path": "decode_rows", "BLOCK_N": 8},
             {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 2, "SPLITS": 32},
             {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4, "SPLITS": 32},
             {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 1, "SPLITS": 64},
             {"path": "decode_rows", "BLOCK_N": 16, "num_warps": 4, "SPLITS": 32},
             {"path": "decode_rows", "BLOCK_N": 16, "num_warps": 4, "SPLITS": 64},
             {"path": "decode_rows", "BLOCK_N": 16, "num_warps": 2, "SPLITS": 64},
             {"path": "decode_rows", "BLOCK_N": 32, "num_warps": 8, "SPLITS": 32},
             {"path": "decode_rows", "BLOCK_N": 4, "num_warps": 1, "SPLITS": 64}]
# K split over several warps a program (its sum combined once, through shared memory):
# past the 32 one-warp programs an SM holds, and fewer registers a thread than one warp
# holding a 1024-deep block (48 at 1024/2 and 56 at 2048/4 against 79; ptxas, sm_90)
GEMV = [{"kernel": "matvec_runs", "BLOCK_K": 1024, "num_warps": 1},
        {"kernel": "matvec_runs", "BLOCK_K": 512, "num_warps": 1},
        {"kernel": "matvec_runs", "BLOCK_K": 1024, "num_warps": 2},
        {"kernel": "matvec_runs", "BLOCK_K": 2048, "num_warps": 2},
        {"kernel": "matvec_runs", "BLOCK_K": 2048, "num_warps": 4},
        {"kernel": "matvec_runs", "BLOCK_K": 4096, "num_warps": 4},
        {"kernel": "matvec_runs", "BLOCK_K": 4096, "num_warps": 8},
        {"kernel": "matvec_rows", "BLOCK_K": 1024, "ROWS": 2, "num_warps": 1},
        {"kernel": "matvec_rows", "BLOCK_K": 2048, "ROWS": 2, "num_warps": 2}]
# packed 16-bit pair arithmetic (quantized_matvec_pairs): rows a lane, words summed in 16
# bits before float32, lanes (groups a loop step) on LANES / 32 warps
PAIRS = [{"kernel": "matvec_pairs", "ROWS": r, "SPAN": c, "LANES": lanes, "num_warps": lanes // 32}
         for r, c, lanes in ((8, 4, 32), (4, 2, 32), (8, 4, 64), (8, 4, 128), (16, 4, 64),
                             (8, 2, 64), (8, 2, 128), (16, 2, 128), (4, 4, 128))]


# The prefill path's dequantize (4096x11008 int4 -> float16): (BLOCK, warps, ROWS).  s35,
# ncu: 4096/8/1 29.4 us; 2-D forms (ROWS 1-4 as a tile, also without masks) 310-319
DEQUANTIZE = [(4096, 8, 1), (2048, 4, 1), (4096, 8, 2)]


def run(repeat, only=None):
    import mlx.core as mx
    from metile import attention_ops, quantized_ops
    keys = mx.random.split(mx.random.key(0), 3)
    q = mx.random.normal((1, 32, 1, 128), key=keys[0]).astype(mx.float16)
    k = mx.random.normal((1, 32, 4096, 128), key=keys[1]).astype(mx.float16)
    v = mx.random.normal((1, 32, 4096, 128), key=keys[2]).astype(mx.float16)
    n, kk = 11008, 4096
    w = (mx.random.normal((n, kk), key=mx.random.key(1)) / math.sqrt(kk)).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((1, kk), key=mx.random.key(3)).astype(mx.float16)
    mx.eval(q, k, v, wq, s, b, x)
    if only == "dequantize":
        from metile_kernels import quantized as kernels
        reference = mx.dequantize(wq, s, b, group_size=64, bits=4)
        sides = [("mlx dequantize", lambda: mx.dequantize(wq, s, b, group_size=64, bits=4))]
        sides += [(f"dequantize {c}", lambda c=c: kernels.dequantize[(kk // c[0], n // c[2])](
            wq, s, b, mx.zeros((n, kk), mx.float16), n, kk, BITS=4, GROUP=64, BLOCK=c[0],
            num_warps=c[1], ROWS=c[2])) for c in DEQUANTIZE]
        for name, fn in sides:
            out = fn()
            mx.eval(out)
            error = mx.abs(out.astype(mx.float32) - reference.astype(mx.float32)).max().item()
            print("side", name, f"WRONG: max error {error}" if error > 2e-2 else "", flush=True)
            for _ in range(repeat):
                mx.eval(fn())
                mx.synchronize()
        return
    sides = [] if only in ("gemv", "pairs") else [
        ("mlx sdpa", lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=128 ** -0.5))]
    sides += [] if only in ("gemv", "pairs") else [
        (f"attention {c}", lambda c=c: attention_ops._launch(q, k, v, None, 128 ** -0.5, c))
        for c in ATTENTION]
    sides += [("mlx quantized_matmul", lambda: mx.quantized_matmul(x, wq, s, b))]
    gemv = GEMV[:1] + GEMV[-2:-1] + PAIRS if only == "pairs" else GEMV + PAIRS
    sides += [(f"gemv {c}", lambda c=c: quantized_ops._metile(x, wq, s, b, n, kk, True, 64, 4, c))
              for c in gemv]
    # float64 of the dequantized weight (MLX's CPU quantized_matmul is ~1% off in float16)
    reference = np.array(x.astype(mx.float32), np.float64) @ np.array(
        mx.dequantize(wq, s, b, group_size=64, bits=4).astype(mx.float32), np.float64).T
    for name, fn in sides:
        try:
            out = fn()             # compile outside the counted launches
            mx.eval(out)
        except Exception as e:     # a tile this device refuses: say so, run the rest
            print("side", name, type(e).__name__, str(e)[:200], flush=True)
            continue
        mx.synchronize()
        error = (np.abs(np.array(out.astype(mx.float32), np.float64) - reference).max()
                 / np.abs(reference).max()) if name.startswith("gemv") else 0.0
        print("side", name, f"WRONG: max error {error:.2e} of the largest value"
              if error > 1e-2 else "", flush=True)
        for _ in range(repeat):
            mx.eval(fn())
            mx.synchronize()


def summarize(path):
    """Median duration (us) per (kernel, grid, block), in first-launch order."""
    text = open(path).read()
    text = text[text.index('"ID"'):] if '"ID"' in text else text
    groups = OrderedDict()
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        key = (row["Kernel Name"][:60], row.get("Grid Size", ""), row.get("Block Size", ""))
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        groups.setdefault(key, []).append(value / 1000 if unit.startswith("n") else value)
    for (name, grid, block), times in groups.items():
        # (the last call too: a probe's first call of a kernel can be far slower, s56/s57,
        # and the upper median of two samples is that first call)
        last = times[-1]
        times = sorted(times)
        print(f"ncu {name:60s} grid {grid:>14s} block {block:>12s} n={len(times)} "
              f"median {times[len(times) // 2]:.1f} us last {last:.1f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--summarize")
    parser.add_argument("--only", choices=["gemv", "pairs", "dequantize"])
    args = parser.parse_args()
    summarize(args.summarize) if args.summarize else run(args.repeat, args.only)
