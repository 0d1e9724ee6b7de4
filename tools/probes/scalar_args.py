"""Does reading a kernel's runtime scalars from MLX arrays cost GPU time on CUDA?

ncu of metile's 1024^3 float16 warpgroup GEMM on the H200 (2026-12-01,
benchmarks/results/ncu/h200-ncu-1024-*): 27 us of GPU time where cuBLAS takes 7, and
32% of its warp-stall samples on one instruction, the first load of a scalar argument
(`rows[0]`: LDG, long scoreboard), executed once per warp.  MLX's CUDA allocator puts
every allocation of at most 8 bytes (a 0-d scalar array) in one cudaMallocManaged pool
advised ReadMostly, so a host write to any scalar in that page (a new mx.array(3)
anywhere) invalidates the GPU's copy and the next kernel reading one faults.  MLX's
precompiled_cuda_kernel also takes `scalars` passed by value as kernel parameters.

This probe launches metile's emitted kernel (the library matmul, 128x256x64) through
mx.fast.precompiled_cuda_kernel four ways, wall time per launch over many launches per
synchronization, alternating:
  fresh   0-d int32 scalar arrays built for every launch (an uncached launch's form)
  cached  the same arrays built once and reused (metile's relaunch reuses them)
  padded  (4,)-shaped int32 arrays built once (16 bytes: outside the small pool)
  value   the kernel's signature rewritten to take the scalars by value
and metile's own launch (`matmul[grid](...)`).

    python3 tools/probes/scalar_args.py [out.json] [N ...]
"""
import json
import re
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, "tests")
sys.path.insert(0, "kernels")
import nvrtc  # noqa: E402
from metile_kernels.gemm import grid, matmul  # noqa: E402

TILE = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)


def by_value(tu: str, name: str, scalars: list[str]) -> tuple[str, str]:
    """The translation unit with `scalars` as by-value int32 parameters after the outputs
    (precompiled_cuda_kernel's order: inputs, outputs, scalars) and the kernel renamed."""
    head = re.search(r'extern "C" __global__ void (\w+)\((.*?)\) \{', tu)
    params = head.group(2).split(", ")
    kept = [p for p in params if not any(p.endswith(f" {s}") for s in scalars)]
    new_name = name + "_byvalue"
    sig = f'extern "C" __global__ void {new_name}({", ".join(kept + [f"int32_t {s}" for s in scalars])}) {{'
    body = tu[head.end():]
    for s in scalars:
        body = body.replace(f"{s}[0]", s)
    return tu[:head.start()] + sig + body, new_name


def main():
    argv = sys.argv[1:]
    path = argv[0] if argv and argv[0].endswith(".json") else None
    sizes = [int(x) for x in argv if x.isdigit()] or [1024, 4096]
    results = {}
    for n in sizes:
        rng = np.random.default_rng(0)
        a = mx.array(rng.standard_normal((n, n)).astype(np.float16))
        b = mx.array(rng.standard_normal((n, n)).astype(np.float16))
        out = mx.zeros((n, n), dtype=mx.float16)
        g = grid(n, n, 128, 256)
        d = matmul[g].prepare(a, b, out, n, n, n, **TILE, backend="cuda")
        tu, name = nvrtc.translation_unit(d), d.variant.data["name"]
        launch = d.variant.data["lowering"]["launch"]
        threads, smem = launch["threads"], launch["shared_memory"]
        scalars = ["rows", "columns", "inner"]
        cubin, _ = nvrtc.cubin(tu, "sm_90a")
        tu_v, name_v = by_value(tu, name, scalars)
        cubin_v, _ = nvrtc.cubin(tu_v, "sm_90a")
        common = dict(output_shapes=[(n, n)], output_dtypes=[mx.float16],
                      grid=(g[0] * threads, g[1], 1), threadgroup=(threads, 1, 1),
                      shared_memory=smem)
        once = [mx.array(n, dtype=mx.int32) for _ in scalars]
        padded = [mx.array([n, 0, 0, 0], dtype=mx.int32) for _ in scalars]
        mx.eval(once, padded)

        def pointer(args):
            return mx.fast.precompiled_cuda_kernel(name=name, compiled_source=cubin,
                                                   inputs=[a, b, *args], scalars=[], **common)[0]

        ways = {
            "fresh": lambda: pointer([mx.array(n, dtype=mx.int32) for _ in scalars]),
            "cached": lambda: pointer(once),
            "padded": lambda: pointer(padded),
            "value": lambda: mx.fast.precompiled_cuda_kernel(
                name=name_v, compiled_source=cubin_v, inputs=[a, b], scalars=[n, n, n],
                **common)[0],
            "metile": lambda: matmul[g](a, b, out, n, n, n, **TILE),
        }
        ref = np.array(a.astype(mx.float32)) @ np.array(b.astype(mx.float32))
        for key, fn in ways.items():
            got = np.array(fn().astype(mx.float32))
            assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max(), key
        launches = 200 if n <= 2048 else 40
        times = {k: [] for k in ways}
        for r in range(3):
            for key in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                fn = ways[key]
                mx.eval(fn())
                mx.synchronize()
                t = time.perf_counter()
                mx.eval([fn() for _ in range(launches)])
                mx.synchronize()
                times[key].append((time.perf_counter() - t) / launches * 1e6)
        results[n] = {k: round(min(v), 2) for k, v in times.items()}
        print(n, results[n], flush=True)
    if path:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "mlx": mx.__version__, "kernel": "metile matmul 128x256x64 "
                   "float16, METILE_CUDA_WGMMA default", "metric": "wall us per launch, many "
                   "launches per sync, best of 3 alternating", "results": results},
                  open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
