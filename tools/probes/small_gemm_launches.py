"""Where a small fused GEMM's time goes on the GPU: the benchmark's mx.compile'd variants
(benchmarks/compiler/schedule_fusion.py) at one size, for several warpgroup tiles, timed
per invocation the benchmark's way (many launches per sync) and run a few times more so
that a profiler wrapped around this script (ncu, tools/device_profile.sh) reports each
kernel's GPU duration: the difference is host and launch cost, not the kernel.

    python3 tools/probes/small_gemm_launches.py [N] [--profile]
"""
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, ".")
from benchmarks.compiler.schedule_fusion import sample, variants  # noqa: E402

TILES = {"128x256x64 w8": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_simdgroups=8),
         "128x128x64 w8": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_simdgroups=8),
         "64x128x64 w4": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_simdgroups=4)}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 1024
    profile = "--profile" in sys.argv
    rng = np.random.default_rng(0)
    a = mx.array(rng.standard_normal((n, n)).astype(np.float16))
    b = mx.array(rng.standard_normal((n, n)).astype(np.float16))
    for label, tile in TILES.items():
        try:
            fns = variants((n, n, n), mx.float16, tile)
            mx.eval(fns["fused"](a, b))
        except Exception as e:  # a tile the planner refuses is reported, not fatal
            print(f"{label}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        for name in ("fused", "mlx_compile"):
            fn = fns[name]
            if profile:
                for _ in range(3):
                    mx.eval(fn(a, b))
                mx.synchronize()
                continue
            sample(fn, a, b, 20)
            us = min(sample(fn, a, b, 200) for _ in range(3)) * 1e6
            print(f"{n}^3 {label} {name}: {us:.1f} us per invocation", flush=True)


if __name__ == "__main__":
    main()
