"""GEMM epilogue fusion: one fused metile dispatch against the same matmul plus a
separate pointwise dispatch, and against MLX under mx.compile.

    MLX_ENABLE_TF32=0 python -m benchmarks.compiler.schedule_fusion --sizes 64 256 1024 \
        [--dtype float32|float16|bfloat16] [--rounds 5] --output results.json

The operation is out = leaky_relu(alpha * (A @ B) + beta) on square matrices
(alpha=1.25, beta=-0.5, slope 0.1).  Before timing, every variant is checked
against NumPy (float64 reference of the same rounded inputs); float32 uses the
strict rtol=3e-4, atol=3e-5 and needs MLX_ENABLE_TF32=0 set before Python
starts (MLX's CUDA default is TF32), otherwise the benchmark refuses to run.

Timing: each variant is an mx.compile'd function over resident inputs (so a
call costs a few microseconds of host time for metile and MLX alike); a sample
enqueues `launches` independent calls and synchronises once; variants of a
pair alternate in ABAB/BABA order and each reported latency is the median over
rounds.  The two pairs (fused vs two launches, fused vs mx.compile) are timed
separately, like the recorded M5 report this file's JSON follows.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

import metile
from benchmarks.common import machine, write_report, positive_int, positive_float, output_path
from metile.runtime import cache
from metile_kernels.gemm import grid, matmul, matmul_epilogue

ALPHA, BETA, SLOPE = 1.25, -0.5, 0.1
TOLERANCE = {"float32": (3e-4, 3e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}


@metile.kernel
def affine_leaky(X, Y, alpha, beta, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    scaled = metile.load(X + offs, mask=mask).to(metile.float32) * alpha + beta
    metile.store(Y + offs, metile.where(scaled > 0, scaled, scaled * SLOPE).to(Y.dtype), mask=mask)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    z = ALPHA * (a.astype(np.float64) @ b.astype(np.float64)) + BETA
    return np.where(z > 0, z, SLOPE * z)


def variants(shape, dtype, tile: dict, schedule: metile.Schedule | None = None):
    m, n, k = shape
    out = mx.zeros((m, n), dtype)
    g = grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])
    plain = {k: v for k, v in tile.items() if k != "SCHEDULE"}

    def fused(a, b):
        return matmul_epilogue[g](a, b, out, m, n, k, ALPHA, BETA, EPILOGUE="affine_leaky",
                                  NEGATIVE_SLOPE=SLOPE, **tile)

    def fused_automatic(a, b):  # the same launch without the requested Schedule
        return matmul_epilogue[g](a, b, out, m, n, k, ALPHA, BETA, EPILOGUE="affine_leaky",
                                  NEGATIVE_SLOPE=SLOPE, **plain)

    def two_launches(a, b):
        product = matmul[g](a, b, mx.zeros((m, n), mx.float32), m, n, k, **tile)
        return affine_leaky[(metile.cdiv(m * n, 1024),)](product, out, ALPHA, BETA, m * n, BLOCK=1024)

    def mlx(a, b):
        z = (a @ b).astype(mx.float32) * ALPHA + BETA
        return mx.where(z > 0, z, SLOPE * z).astype(dtype)

    fns = {"fused": mx.compile(fused), "two_launches": mx.compile(two_launches),
           "mlx_compile": mx.compile(mlx)}
    if schedule is not None:
        fns["fused_automatic"] = mx.compile(fused_automatic)
    return fns


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is not MxNxK (e.g. 16x4096x4096)") from None
    if min(m, n, k) < 1:
        raise SystemExit(f"--shapes: {text!r} has a zero or negative extent")
    return m, n, k


def sample(fn, a, b, launches: int) -> float:
    mx.synchronize()
    start = time.perf_counter()
    mx.eval([fn(a, b) for _ in range(launches)])
    mx.synchronize()
    return (time.perf_counter() - start) / launches


def pair(first, second, a, b, launches: int, rounds: int) -> tuple[float, float, dict]:
    """Medians of `rounds` alternating samples of each, and every sample (microseconds,
    in the JSON: an outlier round shows there)."""
    times = ([], [])
    for r in range(rounds):
        order = [(first, times[0]), (second, times[1])]
        for fn, sink in order if r % 2 == 0 else order[::-1]:
            sink.append(sample(fn, a, b, launches))
    samples = {"first": [t * 1e6 for t in times[0]], "second": [t * 1e6 for t in times[1]]}
    return float(np.median(times[0])), float(np.median(times[1])), samples


def reports(shape, dtype, a, b, tile: dict) -> dict:
    m, n, k = shape
    g = grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])
    fused = matmul_epilogue[g].prepare(a, b, mx.zeros((m, n), dtype), m, n, k, ALPHA, BETA,
                                       EPILOGUE="affine_leaky", NEGATIVE_SLOPE=SLOPE, **tile)
    product = matmul[g].prepare(a, b, mx.zeros((m, n), mx.float32), m, n, k, **tile)
    pointwise = affine_leaky[(metile.cdiv(m * n, 1024),)].prepare(
        mx.zeros((m, n)), mx.zeros((m, n), dtype), ALPHA, BETA, m * n, BLOCK=1024)
    return {"fused": fused.execution_report.to_dict(), "product": product.execution_report.to_dict(),
            "separate_epilogue": pointwise.execution_report.to_dict()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=positive_int, nargs="*", default=[64, 256, 1024])
    parser.add_argument("--shapes", nargs="*", default=[], metavar="MxNxK",
                        help="non-square problems, e.g. 16x4096x4096 512x4096x11008")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-ms", type=positive_float, default=50.0, help="wall time per sample")
    parser.add_argument("--tile", type=positive_int, nargs=3, default=[64, 64, 16], metavar=("BM", "BN", "BK"))
    parser.add_argument("--num-simdgroups", type=int, default=None)
    parser.add_argument("--time-anyway", action="store_true",
                        help="also time variants that fail the tolerance gate (marked in the JSON)")
    parser.add_argument("--vector-width", type=int, choices=(1, 4), default=None,
                        help="require Schedule(vector_width=...) for the metile GEMMs")
    parser.add_argument("--double-buffer", choices=("on", "off"), default=None,
                        help="require Schedule(double_buffer=...) for the metile GEMMs")
    parser.add_argument("--num-stages", type=int, default=None,
                        help="require Schedule(num_stages=...) for the metile GEMMs")
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args()
    if args.dtype == "float32" and os.environ.get("MLX_ENABLE_TF32") != "0":
        sys.exit("strict float32 comparison: set MLX_ENABLE_TF32=0 before starting Python "
                 "(MLX would otherwise use TF32 for its matmul)")
    dtype = getattr(mx, args.dtype)
    rtol, atol = TOLERANCE[args.dtype]
    tile = dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), args.tile))
    if args.num_simdgroups:
        tile["num_simdgroups"] = args.num_simdgroups
    schedule = None
    if args.vector_width is not None or args.double_buffer is not None or args.num_stages:
        # A required schedule also pairs the fused kernel against itself without it.
        schedule = metile.Schedule(vector_width=args.vector_width,
                                   double_buffer=None if args.double_buffer is None
                                   else args.double_buffer == "on", num_stages=args.num_stages)
        tile["SCHEDULE"] = schedule
    cases = []
    shapes = [(n, n, n) for n in args.sizes] + [parse_shape(s) for s in args.shapes]
    for shape in shapes:
        m, n, k = shape
        label = f"{n}^3" if m == n == k else f"{m}x{n}x{k}"
        rng = np.random.default_rng(args.seed + m + n + k)
        a = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
        b = mx.array(rng.standard_normal((k, n)).astype(np.float32)).astype(dtype)
        ref = reference(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))
        fns = variants(shape, dtype, tile, schedule)
        errors, failures = {}, {}
        for name, fn in fns.items():
            got = np.array(fn(a, b).astype(mx.float32)).astype(np.float64)
            errors[name] = float(np.abs(got - ref).max())
            bad = np.abs(got - ref) > atol + rtol * np.abs(ref)
            if bad.any():
                # A variant outside the unchanged tolerance is reported, not timed.
                failures[name] = {"mismatched": int(bad.sum()), "of": int(bad.size),
                                  "max_absolute_error": errors[name],
                                  "max_relative_error": float((np.abs(got - ref) / np.maximum(
                                      np.abs(ref), 1e-30))[bad].max())}
                print(f"{label} {args.dtype}: {name} fails rtol={rtol}, atol={atol}: {failures[name]}")
        case = {"shape": [m, n, k], "seed": args.seed + m + n + k,
                "max_absolute_error": {"metile_fused": errors["fused"],
                                       "metile_two_launches": errors["two_launches"],
                                       "mlx_compile": errors["mlx_compile"]}}
        if failures:
            case["tolerance_failures"] = failures
        # Enough launches per sample to fill ~target-ms of wall time.
        one = sample(fns["fused"], a, b, 2)
        launches = int(min(500, max(3, args.target_ms / 1e3 / max(one, 1e-6))))
        case["launches_per_sample"] = launches
        timed = set() if args.time_anyway else set(failures)
        if failures and args.time_anyway:
            case["timed_despite_tolerance_failure"] = sorted(failures)
        if "fused" not in timed and "two_launches" not in timed:
            fused_us, two_us, seen = pair(fns["fused"], fns["two_launches"], a, b, launches, args.rounds)
            case["fusion_pair_us"] = {"fused": fused_us * 1e6, "two_launches": two_us * 1e6,
                                      "speedup": two_us / fused_us,
                                      "samples": {"fused": seen["first"], "two_launches": seen["second"]}}
        if "fused" not in timed and "mlx_compile" not in timed:
            fused2_us, mlx_us, seen = pair(fns["fused"], fns["mlx_compile"], a, b, launches, args.rounds)
            case["mlx_pair_us"] = {"fused": fused2_us * 1e6, "mlx_compile": mlx_us * 1e6,
                                   "speedup": mlx_us / fused2_us,
                                   "samples": {"fused": seen["first"], "mlx_compile": seen["second"]}}
        if schedule is not None and not {"fused", "fused_automatic"} & timed:
            req_us, auto_us, _ = pair(fns["fused"], fns["fused_automatic"], a, b, launches, args.rounds)
            case["schedule_pair_us"] = {"required_schedule": req_us * 1e6,
                                        "automatic": auto_us * 1e6, "speedup": auto_us / req_us}
            print(f"{label:>14} {schedule}: {req_us * 1e6:9.1f} us vs automatic {auto_us * 1e6:9.1f} us")
        case["execution_reports"] = reports(shape, dtype, a, b, tile)
        cases.append(case)
        fp, mp = case.get("fusion_pair_us"), case.get("mlx_pair_us")
        print(f"{label:>14} {args.dtype} [{case['execution_reports']['fused']['plan']['backend']}]: "
              + (f"fused {fp['fused']:9.1f} us vs two launches {fp['two_launches']:9.1f} us "
                 f"({fp['speedup']:.2f}x)" if fp else "fusion pair not timed") + "  |  "
              + (f"fused {mp['fused']:9.1f} us vs mx.compile {mp['mlx_compile']:9.1f} us "
                 f"({mp['speedup']:.2f}x)" if mp else "mlx pair not timed"))

    source = Path(__file__).read_bytes()
    report = {
        **machine(),
        "compiler_implementation": cache.compiler_fingerprint(),
        "benchmark_source_sha256": hashlib.sha256(source).hexdigest(),
        "environment": {k: os.environ.get(k) for k in ("MLX_ENABLE_TF32", "METILE_CUDA_WGMMA")},
        "metric": "alternating, per-invocation synchronized wall latency of mx.compile'd calls; "
                  "setup excluded",
        "precision_comparison": {
            "class": "same_storage_precision",
            "storage": f"{args.dtype} inputs and outputs; float32 accumulation and epilogue",
            "metile": "FP32 accumulation, RELAXED_PRECISION=False",
            "mlx": f"mx.compile with {args.dtype} inputs and MLX_ENABLE_TF32="
                   f"{os.environ.get('MLX_ENABLE_TF32')}",
            "reference": "NumPy float64 matmul and epilogue of the same rounded inputs; "
                         "tolerance, not bitwise equivalence",
            "rtol": rtol, "atol": atol, "bitwise_exact": False,
        },
        "configuration": {"sizes": args.sizes, "shapes": [list(x) for x in shapes], "dtype": args.dtype, "seed": args.seed,
                          "tile": {k: v for k, v in tile.items() if k != "SCHEDULE"},
                          "schedule": None if schedule is None else repr(schedule),
                          "time_anyway": args.time_anyway,
                          "rounds": args.rounds, "target_ms": args.target_ms,
                          "output": args.output},
        "cases": cases,
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
