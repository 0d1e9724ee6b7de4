"""Bandwidth of a metile elementwise kernel against MLX's own fused kernel.

    python -m benchmarks.cuda_bandwidth [--sizes-mib 16 64 256] [--output results.json]

The kernel is a fused scale + bias + leaky-ReLU over float32 vectors
(reads x and b, writes y: 12 bytes per element).  The peer is the same
expression as MLX ops, which `mx.compile` fuses into one kernel.  Both steps
are `mx.compile`d functions (the metile one wraps its launch), so a call costs
a few microseconds of host time for either; each measurement chains
`--launches` dependent calls (y <- f(y, b)) and synchronises once, amortising
the ~80 us eval round trip.  (Tracing the whole chain into one compiled
function would let MLX fuse consecutive steps into one kernel, which is not
a per-launch comparison.)  metile and MLX alternate; each number is the
median over `--rounds`.  Results: GB/s, fraction of the HBM peak
(`--peak-gbs`, H200: 4800), the metile/MLX bandwidth ratio, and separately
the host cost of one eager (uncompiled) launch of each.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

import metile
from benchmarks.common import machine, write_report, positive_int, output_path

SCALE = 0.5


@metile.kernel
def scale_bias_leaky(X, B, Y, scale, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    z = metile.load(X + offs, mask=mask) * scale + metile.load(B + offs, mask=mask)
    metile.store(Y + offs, metile.where(z > 0, z, 0.1 * z), mask=mask)


@mx.compile
def mlx_fused(x, b):
    z = x * SCALE + b
    return mx.where(z > 0, z, 0.1 * z)


RAW_BODY = """
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n[0]) {
        float z = x[i] * scale[0] + b[i];
        y[i] = z > 0.0f ? z : 0.1f * z;
    }
"""


def raw_peers(n: int) -> dict:
    """The same computation as hand-written CUDA through MLX's custom-kernel path
    (mx.fast.cuda_kernel) and through metile's C++ layer (metile.cuda_kernel): where
    these trail MLX's fused kernel too, the gap is the custom-kernel launch path,
    not metile's generated code."""
    scale, count = mx.array(SCALE, mx.float32), mx.array(n, mx.uint32)
    kernels = {"mx_fast_cuda_kernel": mx.fast.cuda_kernel, "metile_cuda_kernel": metile.cuda_kernel}
    steps = {}
    for label, make in kernels.items():
        k = make(name=f"bandwidth_raw_{label}", input_names=["x", "b", "scale", "n"],
                 output_names=["y"], source=RAW_BODY)

        def step(y, bias, k=k):
            return k(inputs=[y, bias, scale, count], output_shapes=[(n,)],
                     output_dtypes=[mx.float32], grid=(metile.cdiv(n, 256) * 256, 1, 1),
                     threadgroup=(256, 1, 1))[0]
        steps[label] = mx.compile(step)
    return steps


def chain(step, x, b, launches):
    y = x
    for _ in range(launches):
        y = step(y, b)
    return y


def seconds_per_launch(step, x, b, launches) -> float:
    mx.synchronize()
    start = time.perf_counter()
    mx.eval(chain(step, x, b, launches))
    mx.synchronize()
    return (time.perf_counter() - start) / launches


def host_seconds_per_launch(step, x, b, launches) -> float:
    """Graph-building time of eager launches (no evaluation inside the timer)."""
    mx.synchronize()
    start = time.perf_counter()
    y = chain(step, x, b, launches)
    elapsed = time.perf_counter() - start
    mx.eval(y)
    return elapsed / launches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=positive_int, nargs="+", default=[16, 64, 256],
                        help="size of one float32 vector")
    parser.add_argument("--launches", type=positive_int, default=50)
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 4096],
                        help="BLOCK values to measure (elements per program)")
    parser.add_argument("--vector-width", type=int, default=None, choices=[1, 4],
                        help="launch with SCHEDULE=metile.Schedule(vector_width=...)")
    parser.add_argument("--num-simdgroups", type=int, nargs="+", default=[0],
                        help="threads per program / 32 to measure; 0 lets metile choose")
    parser.add_argument("--raw-peers", action="store_true",
                        help="also time the same kernel hand-written through mx.fast.cuda_kernel "
                             "and metile.cuda_kernel (once per size, alternating with MLX)")
    parser.add_argument("--peak-gbs", type=float, default=4800.0)
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    cases = []
    for mib in args.sizes_mib:
        n = mib * 2**20 // 4
        x = mx.array(rng.standard_normal(n).astype(np.float32))
        b = mx.array(rng.standard_normal(n).astype(np.float32))
        out = mx.zeros((n,), mx.float32)
        z = np.array(x).astype(np.float64) * SCALE + np.array(b)
        ref = np.where(z > 0, z, 0.1 * z)
        np.testing.assert_allclose(np.array(mlx_fused(x, b)), ref, rtol=3e-4, atol=3e-5)
        if args.raw_peers:
            steps = {"mlx_compile": mlx_fused, **raw_peers(n)}
            times = {label: [] for label in steps}
            for label, step in steps.items():
                np.testing.assert_allclose(np.array(step(x, b)), ref, rtol=3e-4, atol=3e-5)
                seconds_per_launch(step, x, b, args.launches)
            order = list(steps)
            for r in range(args.rounds):  # rotate who goes first
                for label in order[r % len(order):] + order[:r % len(order)]:
                    times[label].append(seconds_per_launch(steps[label], x, b, args.launches))
            us = {label: float(np.median(t)) * 1e6 for label, t in times.items()}
            cases.append({"vector_mib": mib, "raw_peers_us": us,
                          "over_mlx": {k: us["mlx_compile"] / v for k, v in us.items()}})
            print(f"{mib:4d} MiB raw peers (us/launch): " +
                  ", ".join(f"{k} {v:.1f}" for k, v in us.items()))
        for block, nsg in [(b_, s_) for b_ in args.blocks for s_ in args.num_simdgroups]:
            grid = (metile.cdiv(n, block),)
            options = {"num_simdgroups": nsg} if nsg else {}
            if args.vector_width:
                options["SCHEDULE"] = metile.Schedule(vector_width=args.vector_width)

            def ours(y, bias, grid=grid, block=block, options=options):
                return scale_bias_leaky[grid](y, bias, out, SCALE, n, BLOCK=block, **options)

            # Correctness before timing: one step against NumPy (float64).
            np.testing.assert_allclose(np.array(ours(x, b)), ref, rtol=3e-4, atol=3e-5)
            ours_compiled = mx.compile(ours)
            for step in (ours_compiled, mlx_fused):  # warm-up: trace, compile, allocate
                seconds_per_launch(step, x, b, args.launches)
            t_ours, t_mlx = [], []
            for r in range(args.rounds):
                order = [(ours_compiled, t_ours), (mlx_fused, t_mlx)]
                for step, sink in order if r % 2 == 0 else order[::-1]:
                    sink.append(seconds_per_launch(step, x, b, args.launches))
            host_ours = host_seconds_per_launch(ours, x, b, args.launches)
            host_mlx = host_seconds_per_launch(mlx_fused, x, b, args.launches)
            bytes_moved = 3 * n * 4
            ours_gbs = bytes_moved / float(np.median(t_ours)) / 1e9
            mlx_gbs = bytes_moved / float(np.median(t_mlx)) / 1e9
            case = {
                "vector_mib": mib,
                "block": block,
                "num_simdgroups": nsg or "auto",
                "vector_width": args.vector_width,
                "elements": n,
                "bytes_per_launch": bytes_moved,
                "metile_us": float(np.median(t_ours)) * 1e6,
                "mlx_compile_us": float(np.median(t_mlx)) * 1e6,
                "metile_gbs": ours_gbs,
                "mlx_compile_gbs": mlx_gbs,
                "metile_fraction_of_peak": ours_gbs / args.peak_gbs,
                "mlx_fraction_of_peak": mlx_gbs / args.peak_gbs,
                "metile_over_mlx": ours_gbs / mlx_gbs,
                "eager_host_us_per_launch": {"metile_uncompiled": host_ours * 1e6, "mlx_compile": host_mlx * 1e6},
            }
            cases.append(case)
            print(f"{mib:4d} MiB BLOCK={block:5d} SG={nsg or 'auto':>4}  metile {ours_gbs:6.0f} GB/s "
                  f"({case['metile_fraction_of_peak']:.0%} of peak)  mx.compile {mlx_gbs:6.0f} GB/s "
                  f"({case['mlx_fraction_of_peak']:.0%})  metile/mlx = {case['metile_over_mlx']:.3f}  "
                  f"eager host us/launch: metile {host_ours * 1e6:.0f}, mlx {host_mlx * 1e6:.0f}")

    report = {
        **machine(),
        "metric": "median over rounds of (synchronized wall time / launches) for a chain of dependent "
                  "calls of an mx.compile'd step, one sync per chain; metile and MLX alternate",
        "configuration": vars(args),
        "cases": cases,
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
