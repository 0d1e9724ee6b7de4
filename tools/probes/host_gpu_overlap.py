"""Does MLX's CUDA backend overlap the host's work for one call with the GPU's work for the
previous ones?  (H200; decides what a kernel must cost for a per-call ratio.)

A precompiled kernel spins for a given number of clock64() cycles (one block, or 132
blocks of 256 threads with 128 KB of dynamic shared memory each), called 200 times per
synchronization under mx.compile.  If the host overlaps the GPU, the wall per call is
max(host floor, spin); if it waits, floor + spin.  The slope at long spins gives the
cycles' duration; the intercept against the floor at zero spin tells which.

    python3 tools/probes/host_gpu_overlap.py [out.json]
"""
import json
import sys
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests")]
import nvrtc  # noqa: E402

SPIN = r'''
extern "C" __global__ void spin_k(const float* x, float* y, int cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  if (threadIdx.x == 0 && blockIdx.x == 0) y[0] = x[0] + 1.0f;
}
extern "C" __global__ void spin_wide(const float* x, float* y, int cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  if (threadIdx.x == 0 && blockIdx.x == 0) y[0] = x[0] + 1.0f;
}
'''


def wall(fn, x, launches=200, rounds=5):
    mx.eval(fn(x))
    best = 1e9
    for _ in range(rounds):
        mx.synchronize()
        t = time.perf_counter()
        mx.eval([fn(x) for _ in range(launches)])
        mx.synchronize()
        best = min(best, (time.perf_counter() - t) / launches * 1e6)
    return round(best, 2)


def main():
    cubin, _ = nvrtc.cubin(SPIN, "sm_90a")
    x = mx.array([1.0], dtype=mx.float32)
    mx.eval(x)
    rows = {}
    for form, (name, grid, block, smem) in {
            "1 block": ("spin_k", 1, 1, 0),
            "132 blocks x 256, 128 KB": ("spin_wide", 132 * 256, 256, 128 * 1024)}.items():
        for cycles in (0, 5000, 10000, 20000, 40000, 80000, 200000):
            def call(x, cycles=cycles):
                return mx.fast.precompiled_cuda_kernel(
                    name=name, compiled_source=cubin, inputs=[x], output_shapes=[(1,)],
                    output_dtypes=[mx.float32], scalars=[cycles], grid=(grid, 1, 1),
                    threadgroup=(block, 1, 1), shared_memory=smem)[0]
            fn = mx.compile(call)
            rows[f"{form}, {cycles} cycles"] = [wall(fn, x), wall(call, x)]
    print(f"{'':40s} {'compiled':>9s} {'eager':>9s}  (us per call, 200 per sync)")
    for k, v in rows.items():
        print(f"{k:40s} {v[0]:9.2f} {v[1]:9.2f}")
    if len(sys.argv) > 1:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "mlx": mx.__version__,
                   "columns": ["mx.compile us per call", "eager us per call"], "rows": rows},
                  open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
