"""What the DSL costs on top of a hand-written kernel.

1. Cold compile: frontend (AST -> Tile IR) + lowering + MSL emission for a
   few kernels, with the disk cache off and the backend compiler excluded.
2. Launch overhead per call, once compiled: `kernel[grid](...)`, a prepared
   `dispatch()`, and a raw `metile.metal_kernel` call running the same MSL
   (plus `mx.fast.metal_kernel` where Metal exists).  Each call only builds
   the lazy MLX node, so this is the Python-side cost; one variant with
   `mx.eval` per call is shown for scale.  Variants alternate to share drift.

    python -m benchmarks.dsl_overhead [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import mlx.core as mx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import metile  # noqa: E402
from metile.frontend import source as frontend_source  # noqa: E402
from dsl_kernels import layernorm, matmul, softmax_rows, vector_add  # noqa: E402
from benchmarks.common import positive_int  # noqa: E402


def cold_compile(reps: int) -> None:
    os.environ["METILE_DISABLE_DISK_CACHE"] = "1"
    cases = [
        ("vector_add", vector_add, (1,), lambda: (mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8), dict(BLOCK=256)),
        ("softmax_rows", softmax_rows, (1,), lambda: (mx.zeros((2, 8)), mx.zeros((2, 8)), 8, 8),
         dict(BLOCK=1024)),
        ("layernorm", layernorm, (1,), lambda: (mx.zeros((2, 8)), mx.zeros((8,)), mx.zeros((8,)),
                                                mx.zeros((2, 8)), 8, 8, 1e-5), dict(BLOCK=1024)),
        ("matmul", matmul, (1, 1), lambda: (mx.zeros((8, 8)), mx.zeros((8, 8)), mx.zeros((8, 8)), 8, 8, 8),
         dict(BM=16, BN=16, BK=8)),
    ]
    print("cold compile (frontend + lowering + MSL, no backend compiler), median of", reps)
    for name, k, grid, args, kw in cases:
        times = []
        for _ in range(reps):
            frontend_source._cache.clear()
            fresh = metile.kernel(k.fn, num_simdgroups=k.num_simdgroups)
            t = time.perf_counter()
            d = fresh[grid].prepare(*args(), **kw)
            times.append(time.perf_counter() - t)
        lines = d.source.count("\n")
        print(f"  {name:14s} {statistics.median(times) * 1e3:8.2f} ms   ({lines} MSL lines)")
    del os.environ["METILE_DISABLE_DISK_CACHE"]


def launch_overhead(calls: int, rounds: int = 5) -> None:
    n = 4096
    x, y, z = mx.ones((n,)), mx.ones((n,)), mx.zeros((n,))
    mx.eval(x, y, z)
    grid = (metile.cdiv(n, 256),)
    d = vector_add[grid].prepare(x, y, z, n, BLOCK=256)
    data = d.variant.data
    raw = metile.metal_kernel(data["name"], data["inputs"], data["outputs"], data["body"],
                              header=data["header"])
    raw_kwargs = dict(d.call_kwargs)
    variants = {
        "kernel[grid](...)": lambda: vector_add[grid](x, y, z, n, BLOCK=256),
        "prepared dispatch()": lambda: d(),
        "raw metile.metal_kernel": lambda: raw(**raw_kwargs)[0],
    }
    if mx.metal.is_available():
        fast = mx.fast.metal_kernel(name="raw_add", input_names=data["inputs"],
                                    output_names=data["outputs"], source=data["body"],
                                    header=data["header"])
        variants["mx.fast.metal_kernel"] = lambda: fast(**raw_kwargs)[0]
    mx.eval(*(f() for f in variants.values()))  # compile everything first
    results = {k: [] for k in variants}
    for _ in range(rounds):
        for name, f in (list(variants.items()) if _ % 2 == 0 else list(variants.items())[::-1]):
            t = time.perf_counter()
            for _ in range(calls):
                f()
            results[name].append((time.perf_counter() - t) / calls)
    base = statistics.median(results["raw metile.metal_kernel"])
    print(f"\nlaunch overhead per call (build the lazy node only; median of {rounds} x {calls}):")
    for name, ts in results.items():
        m = statistics.median(ts)
        print(f"  {name:26s} {m * 1e6:8.2f} us   {m / base:5.2f}x raw")
    t = time.perf_counter()
    for _ in range(50):
        mx.eval(d())
    print(f"\nfor scale: prepared dispatch() + mx.eval on the CPU runtime, {n} elements: "
          f"{(time.perf_counter() - t) / 50 * 1e6:.1f} us per call")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=positive_int, default=2000)
    p.add_argument("--reps", type=positive_int, default=5)
    a = p.parse_args()
    cold_compile(a.reps)
    launch_overhead(a.calls)


if __name__ == "__main__":
    main()
