"""metile.ops.quantized_matmul against mx.quantized_matmul (and the dense product).

    python -m benchmarks.quantized [--bits 4] [--group-size 64] [--output results.json]
    python -m benchmarks.quantized --quick          # tiny shapes, for the CPU runtime

Cases (rows x K x N, x @ W.T with W (N, K) from mx.quantize, QuantizedLinear's layout):
decode 1x4096x11008 and prefill 512x4096x11008 (and --decode / --prefill shapes).
Sides, each an `mx.compile`d call: every metile candidate `auto` would measure for
the row count (quantized_ops.configs: the GEMV and the GEMM for decode, the GEMM and
dequantize-then-dense-GEMM for prefill), MLX's quantized_matmul, and the dense
product x @ w.T of the float weight (the bytes a quantized kernel saves).  Each
measurement issues `--launches` independent calls and synchronises once (the ~80 us
eval round trip amortised); the sides alternate, the order reversing every round;
each number is the median over `--rounds`.  Every metile output is checked against
MLX's first (the routing validation tolerance).  Reports microseconds per call,
TFLOP/s (2 rows K N), the weight bytes read per second (packed words, scales and
biases), and MLX's time over each side's (> 1: faster than MLX).
"""

from __future__ import annotations

import argparse
import math
import time

import mlx.core as mx
import numpy as np

from benchmarks.common import machine, write_report
from metile import quantized_ops

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def sides(w, wq, scales, biases, group_size, bits, rows, dtype):
    def mlx(x):
        return mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group_size,
                                   bits=bits)

    def dense(x):
        return x @ w.T

    n, k = w.shape
    fns = {}
    for config in quantized_ops.configs(quantized_ops.m_bucket(rows), dtype, True):
        def kernel(x, config=config):
            return quantized_ops._metile(x, wq, scales, biases, n, k, True, group_size, bits,
                                         config)
        fns[quantized_ops.config_name(config)] = mx.compile(kernel)
    fns["mlx"] = mx.compile(mlx)
    fns["dense"] = mx.compile(dense)
    return fns


def seconds_per_call(fn, x, launches) -> float:
    mx.synchronize()
    start = time.perf_counter()
    outs = [fn(x) for _ in range(launches)]
    mx.eval(*outs)
    mx.synchronize()
    return (time.perf_counter() - start) / launches


def measure(name, rows, k, n, dtype, group_size, bits, launches, rounds) -> dict:
    kx, kw = mx.random.split(mx.random.key(0), 2)
    x = mx.random.normal((rows, k), key=kx).astype(dtype)
    w = (mx.random.normal((n, k), key=kw) / math.sqrt(k)).astype(dtype)
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    mx.eval(x, w, wq, scales, biases)
    fns = sides(w, wq, scales, biases, group_size, bits, rows, dtype)
    reference = fns["mlx"](x)
    for side, fn in fns.items():
        if side.startswith("metile"):
            problem = quantized_ops._validate(fn(x), reference)
            if problem:
                raise SystemExit(f"{side} differs from MLX for {name}: {problem}")
    for fn in fns.values():   # warm-up: compile, first launch
        seconds_per_call(fn, x, 1)
    times = {side: [] for side in fns}
    order = list(fns)
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            times[side].append(seconds_per_call(fns[side], x, launches))
    us = {side: float(np.median(t)) * 1e6 for side, t in times.items()}
    weight_bytes = wq.nbytes + scales.nbytes + biases.nbytes
    return {"name": name, "rows": rows, "k": k, "n": n, "dtype": str(dtype).removeprefix("mlx.core."),
            "bits": bits, "group_size": group_size, "us_per_call": us,
            "tflops": {s: 2 * rows * k * n / (t * 1e-6) / 1e12 for s, t in us.items()},
            "quantized_weight_tb_per_s": {s: weight_bytes / (t * 1e-6) / 1e12
                                          for s, t in us.items() if s != "dense"},
            "mlx_over": {s: us["mlx"] / t for s, t in us.items() if s != "mlx"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    parser.add_argument("--bits", type=int, default=4, choices=quantized_ops.BITS)
    parser.add_argument("--group-size", type=int, default=64, choices=quantized_ops.GROUP_SIZES)
    parser.add_argument("--decode", type=int, nargs=3, action="append", metavar=("ROWS", "K", "N"))
    parser.add_argument("--prefill", type=int, nargs=3, action="append",
                        metavar=("ROWS", "K", "N"))
    parser.add_argument("--launches", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 2 launches, 2 rounds (the CPU runtime)")
    parser.add_argument("--output")
    args = parser.parse_args()
    decode = args.decode or [[1, 4096, 11008]]
    prefill = args.prefill or [[512, 4096, 11008]]
    if args.quick:
        decode, prefill = [[1, 256, 320]], [[64, 256, 320]]
        args.launches, args.rounds = 2, 2
    dtype = DTYPES[args.dtype]
    results = []
    for name, shapes in (("decode", decode), ("prefill", prefill)):
        for rows, k, n in shapes:
            r = measure(name, rows, k, n, dtype, args.group_size, args.bits, args.launches,
                        args.rounds)
            line = ", ".join(f"{s} {t:.1f} us" for s, t in r["us_per_call"].items())
            ratios = ", ".join(f"{s} {v:.2f}" for s, v in r["mlx_over"].items())
            print(f"{name} {rows}x{k}x{n} int{args.bits} g{args.group_size} {args.dtype}: {line}"
                  f"  | mlx/side: {ratios}")
            results.append(r)
    write_report(args.output, {"machine": machine(), "benchmark": "quantized_matmul",
                               "launches": args.launches, "rounds": args.rounds,
                               "cases": results})


if __name__ == "__main__":
    main()
