"""Throughput of metile's MSL CPU runtime next to MLX's own CPU ops.

    python -m benchmarks.msl_cpu_runtime [--repeats 20] [--output results.json]

Two kernels: a 1M-element elementwise exp (one thread per element, no
synchronisation: measures fiber and dispatch overhead) and the 64x64-tile
simdgroup_matrix GEMM from the test suite (barriers and matrix collectives:
measures fiber switching).  Each is timed against the MLX CPU op computing the
same thing, in alternating order, after a warm-up that also compiles.  The
emulator is a correctness tool; the ratio says how much slower than native
CPU code it is, it is not a performance target.
"""

import argparse
import os
import time

import mlx.core as mx
import numpy as np

import metile
from benchmarks.common import machine, write_report, positive_int, output_path
from metile_kernels.msl_reference import GEMM_SOURCE

EXP_SOURCE = """
    uint i = thread_position_in_grid.x;
    out[i] = metal::exp(inp[i]);
"""


def timed(fn, repeats):
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def compare(name, ours, theirs, repeats, work, unit):
    mx.eval(ours(), theirs())  # warm-up (and compile)
    t_ours, t_theirs = [], []
    for i in range(repeats):
        pair = [(ours, t_ours), (theirs, t_theirs)]
        for fn, sink in pair if i % 2 == 0 else pair[::-1]:
            sink.append(timed(fn, 1))
    ours_s, theirs_s = float(np.median(t_ours)), float(np.median(t_theirs))
    row = {
        "case": name,
        "metile_msl_cpu_ms": ours_s * 1e3,
        "mlx_cpu_ms": theirs_s * 1e3,
        f"metile_{unit}": work / ours_s,
        f"mlx_{unit}": work / theirs_s,
        "slowdown_vs_mlx": ours_s / theirs_s,
    }
    print(f"{name:28s} metile {ours_s * 1e3:9.2f} ms  mlx {theirs_s * 1e3:8.3f} ms  "
          f"({work / ours_s:.3g} vs {work / theirs_s:.3g} {unit}; metile/mlx time = {ours_s / theirs_s:.1f}x)")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=10)
    parser.add_argument("--gemm-size", type=positive_int, default=256)
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args()
    if args.gemm_size % 64:
        parser.error(f"--gemm-size must be a multiple of 64 (the kernel's tile), "
                     f"got {args.gemm_size}")
    mx.set_default_device(mx.cpu)
    rng = np.random.default_rng(0)

    n = 1 << 20
    x = mx.array(rng.standard_normal(n).astype(np.float32))
    exp = metile.metal_kernel("bench_exp", ["inp"], ["out"], EXP_SOURCE)
    rows = [compare(
        "elementwise exp, 1M float32",
        lambda: exp(inputs=[x], grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)],
                    output_dtypes=[mx.float32])[0],
        lambda: mx.exp(x), args.repeats, n, "elements_per_s")]

    s = args.gemm_size
    a = mx.array(rng.standard_normal((s, s)).astype(np.float32))
    b = mx.array(rng.standard_normal((s, s)).astype(np.float32))
    gemm = metile.metal_kernel("gemm64", ["A", "B", "K", "N"], ["C"], GEMM_SOURCE)
    rows.append(compare(
        f"simdgroup GEMM {s}^3 float32",
        lambda: gemm(inputs=[a, b, s, s], grid=(s // 64 * 128, s // 64, 1), threadgroup=(128, 1, 1),
                     output_shapes=[(s, s)], output_dtypes=[mx.float32])[0],
        lambda: a @ b, args.repeats, 2 * s**3, "flop_per_s"))

    write_report(args.output, {
        **machine(), "configuration": {"repeats": args.repeats, "gemm_size": args.gemm_size,
                                       "METILE_MSL_THREADS": os.environ.get("METILE_MSL_THREADS")},
        "cases": rows})


if __name__ == "__main__":
    main()
