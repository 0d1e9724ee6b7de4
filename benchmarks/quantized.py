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

`--weights N` gives each call the next of N independently drawn weights (same shapes):
with N = 1 (the default) every call reads the one weight, which a 4096x11008 int4 matrix
(25 MB with its scales) leaves in the H200's 50 MB L2; N >= 3 keeps the next call's
weight out of it, as a model's layers read theirs from DRAM once per token.
"""

from __future__ import annotations

import argparse
import math
import time

import mlx.core as mx
import numpy as np

from benchmarks.common import machine, write_report, positive_int, output_path
from metile import quantized_ops

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
SHORTEST_SAMPLE_MS = 4.0


def sides(n, k, group_size, bits, rows, dtype, also=(), chain=1):
    """Each side a compiled call of (x, w, wq, scales, biases) - with `chain` > 1 of x and
    `chain` such weight tuples, the op applied to each (a decode step's layers in one
    graph, so the call's host time is shared by `chain` products); `also`: configurations
    to time beside the op's candidates (quantized_ops names, e.g. WGMMA_GEMM)."""
    def mlx(x, w, wq, scales, biases):
        return mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group_size,
                                   bits=bits)

    def dense(x, w, wq, scales, biases):
        return x @ w.T

    def chained(op):
        if chain == 1:
            return op
        return lambda x, *weights: [op(x, *weights[4 * i:4 * i + 4]) for i in range(chain)]

    fns = {}
    extra = []
    for name in also:   # a configuration, or a list of them
        value = getattr(quantized_ops, name)
        extra += value if isinstance(value, list) else [value]
    for config in quantized_ops.configs(quantized_ops.m_bucket(rows), dtype, True, bits, n, k,
                                         group_size) + extra:
        def kernel(x, w, wq, scales, biases, config=config):
            return quantized_ops._metile(x, wq, scales, biases, n, k, True, group_size, bits,
                                         config)
        fns[quantized_ops.config_name(config)] = mx.compile(chained(kernel))
    fns["mlx"] = mx.compile(chained(mlx))
    fns["dense"] = mx.compile(chained(dense))
    return fns


def seconds_per_call(fn, x, launches, weights=None, chain=1) -> float:
    """Wall time per product of `launches` calls issued together and evaluated at once;
    with `weights` (a list of argument tuples), call i passes weights[i % len(weights)] -
    with `chain` > 1, `chain` tuples from there on (each call `chain` products)."""
    mx.synchronize()
    start = time.perf_counter()
    if weights is None:
        outs = [fn(x) for _ in range(launches)]
    elif chain == 1:
        outs = [fn(x, *weights[i % len(weights)]) for i in range(launches)]
    else:
        outs = [fn(x, *[a for j in range(chain) for a in weights[(i + j) % len(weights)]])
                for i in range(launches)]
    mx.eval(*outs)
    mx.synchronize()
    return (time.perf_counter() - start) / (launches * chain)


def measure(name, rows, k, n, dtype, group_size, bits, launches, rounds, copies=1,
            also=(), chain=1) -> dict:
    keys = mx.random.split(mx.random.key(0), 1 + copies)
    x = mx.random.normal((rows, k), key=keys[0]).astype(dtype)
    weights = []
    for key in keys[1:]:
        w = (mx.random.normal((n, k), key=key) / math.sqrt(k)).astype(dtype)
        weights.append((w, *mx.quantize(w, group_size=group_size, bits=bits)))
        mx.eval(*weights[-1])
    mx.eval(x)
    fns = sides(n, k, group_size, bits, rows, dtype, also, chain)
    for i, args in enumerate(weights):
        args = [a for j in range(chain) for a in weights[(i + j) % len(weights)]]
        reference = fns["mlx"](x, *args)
        for side, fn in fns.items():
            if side.startswith("metile"):
                got = fn(x, *args)
                for g, want in (zip(got, reference) if chain > 1 else [(got, reference)]):
                    problem = quantized_ops._validate(g, want)
                    if problem:
                        raise SystemExit(f"{side} differs from MLX for {name}: {problem}")
    for fn in fns.values():   # warm-up: compile, first launch
        seconds_per_call(fn, x, 1, weights, chain)
    times = {side: [] for side in fns}
    order = list(fns)
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            times[side].append(seconds_per_call(fns[side], x, launches, weights, chain))
    us = {side: float(np.median(t)) * 1e6 for side, t in times.items()}
    # a sample shorter than a few milliseconds is dominated by the synchronisation around
    # it: on the H200, 10 launches a sync (1-2 ms) read every prefill side 1.5-3x slower
    # than 50 did (s93 against s94)
    sample_ms = min(us.values()) * launches * chain / 1e3
    if sample_ms < SHORTEST_SAMPLE_MS:
        print(f"warning: {name} {rows}x{k}x{n}: a sample lasts {sample_ms:.1f} ms (under "
              f"{SHORTEST_SAMPLE_MS} ms); raise --launches for numbers that are not the "
              f"synchronisation's", flush=True)
    _, wq, scales, biases = weights[0]
    weight_bytes = wq.nbytes + scales.nbytes + biases.nbytes
    return {"name": name, "rows": rows, "k": k, "n": n, "dtype": str(dtype).removeprefix("mlx.core."),
            "bits": bits, "group_size": group_size, "weights": copies, "chain": chain,
            "us_per_call": us, "shortest_sample_ms": sample_ms,
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
    parser.add_argument("--launches", type=positive_int, default=50)
    parser.add_argument("--weights", type=int, default=1,
                        help="calls cycle through this many weights (>= 3: out of the L2)")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--chain", type=int, default=1,
                        help="products a compiled call (each on the next weight): times per "
                             "product with the call's host time shared, as in a model's step")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 2 launches, 2 rounds (the CPU runtime)")
    parser.add_argument("--also", nargs="*", default=[], metavar="CONFIG",
                        help="prefill configurations to time beside the candidates "
                             "(quantized_ops names: WGMMA_GEMM)")
    parser.add_argument("--also-decode", nargs="*", default=[], metavar="CONFIG",
                        help="decode configurations (or lists of them) to time beside the "
                             "candidates (quantized_ops names: MATVEC_ROWS)")
    parser.add_argument("--decode-off", action="store_true", help="time prefill only")
    parser.add_argument("--prefill-off", action="store_true", help="time decode only")
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args()
    for name in args.also + args.also_decode:
        value = getattr(quantized_ops, name, None)
        if not (isinstance(value, dict) or isinstance(value, list) and value
                and all(isinstance(v, dict) for v in value)):
            parser.error(f"--also {name}: not a configuration (or a list of them) in "
                         f"metile.quantized_ops")
    if args.weights < 1:
        parser.error(f"--weights must be at least 1, got {args.weights}")
    if args.chain < 1:
        parser.error(f"--chain must be at least 1, got {args.chain}")
    decode = args.decode or [[1, 4096, 11008]]
    prefill = args.prefill or [[512, 4096, 11008]]
    if args.quick:
        decode, prefill = [[1, 256, 320]], [[64, 256, 320]]
        args.launches, args.rounds = 2, 2
    dtype = DTYPES[args.dtype]
    results = []
    for name, shapes in (("decode", [] if args.decode_off else decode),
                         ("prefill", [] if args.prefill_off else prefill)):
        for rows, k, n in shapes:
            r = measure(name, rows, k, n, dtype, args.group_size, args.bits, args.launches,
                        args.rounds, args.weights,
                        args.also if name == "prefill" else args.also_decode, args.chain)
            line = ", ".join(f"{s} {t:.1f} us" for s, t in r["us_per_call"].items())
            ratios = ", ".join(f"{s} {v:.2f}" for s, v in r["mlx_over"].items())
            print(f"{name} {rows}x{k}x{n} int{args.bits} g{args.group_size} {args.dtype} "
                  f"weights {args.weights} chain {args.chain}: {line}"
                  f"  | mlx/side: {ratios}")
            results.append(r)
    write_report(args.output, {"machine": machine(), "benchmark": "quantized_matmul",
                               "launches": args.launches, "rounds": args.rounds,
                               "weights": args.weights, "chain": args.chain,
                               "cases": results})


if __name__ == "__main__":
    main()
