"""Strict float32 GEMM kernels as metile emits them (scalar FMA from the cp.async ring),
timed alone on the H200 with CUDA events (CuPy launches the NVRTC-compiled source, many
launches per sync), against cuBLAS's SGEMM through CuPy (CUPY_TF32 unset: strict
float32).  Variants: tiles and stage counts, and each with `__launch_bounds__(T, 2)` added
by hand (ptxas then keeps a thread under 65536 / (2 T) registers, so two blocks share an
SM), to see whether occupancy or the loop limits the kernel.

    python3 tools/probes/ffma_variants.py [out.json] [--size 4096]
    python3 tools/probes/ffma_variants.py --profile   # one launch each (cuBLAS, then the
        first variant): what ncu profiles, no timing
"""
import json
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, "tests")
sys.path.insert(0, "kernels")
import nvrtc  # noqa: E402  (tests/nvrtc.py: metile's NVRTC helpers)
from wgmma_stage_timing import timed  # noqa: E402  (CUDA events, best of 3 loops)

VARIANTS = [  # (BM, BN, BK, warps, num_stages or None, min blocks per SM or None)
    (128, 64, 16, 4, None, None),
    # 128 outputs per thread (16x8 micro-tiles, 255 registers), cuBLAS's own form on the
    # H200 (ncu: sm80_xmma_gemm_f32f32 tilesize 256x128x8, 8 warps, 254 registers)
    (128, 256, 8, 8, None, None), (256, 128, 8, 8, None, None), (128, 256, 16, 8, None, None),
    (256, 128, 16, 8, None, None), (128, 128, 8, 4, None, None), (128, 128, 16, 4, None, None),
]
# Measured 2026-12-01: 128x128x16 w8, 128x128x8 w8 (also 4 stages, minblocks=2), 128x64x8 w4
# slower than 128x64x16 w4.  Before whole-group copies' 3-stage cap (h200-ffma-variants-4096-*):
# 128x128x16 w8 with minblocks=2 (spills), 128x64x16 w4 with 4 stages or minblocks=4,
# 128x64x32 w4, 64x128x16 w4, 64x64x16 w4, 256x64x16 w8: all slower than 128x64x16 w4.


def main():
    import mlx.core as mx
    import metile
    from metile_kernels.gemm import grid, matmul_epilogue
    argv = sys.argv[1:]
    n = int(argv[argv.index("--size") + 1]) if "--size" in argv else 4096
    paths = [a for i, a in enumerate(argv) if not a.startswith("--") and
             (i == 0 or argv[i - 1] != "--size")]
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    c = cp.zeros((n, n), cp.float32)
    profile = "--profile" in argv
    if profile:
        cp.matmul(a, b, out=c)
        variants = VARIANTS[:1]
    else:
        z = a @ b
        ref = cp.where(z > 0, z, 0.01 * z)
        variants = VARIANTS
    results = {}

    us = 1.0 if profile else timed(lambda: cp.matmul(a, b, out=c))
    results["cuBLAS (cupy)"] = {"us": round(us, 1), "tflops": round(2 * n**3 / us / 1e6, 1)}
    print("cuBLAS", results["cuBLAS (cupy)"], flush=True)
    for bm, bn, bk, w, stages, min_blocks in variants:
        key = f"{bm}x{bn}x{bk} w{w}" + (f" S={stages}" if stages else "") + \
            (f" minblocks={min_blocks}" if min_blocks else "")
        try:
            kw = {"SCHEDULE": metile.Schedule(num_stages=stages)} if stages else {}
            d = matmul_epilogue[grid(n, n, bm, bn)].prepare(
                mx.zeros((n, n)), mx.zeros((n, n)), mx.zeros((n, n)), n, n, n, 1.0, 0.0,
                EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.01, BLOCK_M=bm, BLOCK_N=bn,
                BLOCK_K=bk, num_simdgroups=w, backend="cuda", **kw)
            name, launch = d.variant.data["name"], d.variant.data["lowering"].get("launch") or {}
            tu = nvrtc.translation_unit(d)
            bounds = f"__launch_bounds__({w * 32}{', ' + str(min_blocks) if min_blocks else ''}) "
            tu = tu.replace(f'extern "C" __global__ void {name}',
                            f'extern "C" __global__ void {bounds}{name}')
            data, log = nvrtc.cubin(tu, "sm_90", extra=("--ptxas-options=-v",))
            regs = [line.strip() for line in log.splitlines() if "registers" in line or "spill" in line]
            import tempfile
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(data)
            fn = cp.RawModule(path=f.name).get_function(name)
            smem = int(launch.get("shared_memory") or 0)
            if smem:
                fn.max_dynamic_shared_size_bytes = smem
            args = (a, b, c, np.int32(n), np.int32(n), np.int32(n), np.float32(1.0), np.float32(0.0))
            g = (n // bm, n // bn)
            if profile:
                fn(g, (w * 32,), args, shared_mem=smem)
                cp.cuda.runtime.deviceSynchronize()
                print(key, "launched once", regs[-2:], flush=True)
                continue
            c.fill(0)
            fn(g, (w * 32,), args, shared_mem=smem)
            err = float(cp.abs(c - ref).max() / cp.abs(ref).max())
            us = timed(lambda: fn(g, (w * 32,), args, shared_mem=smem))
            entry = {"us": round(us, 1), "tflops": round(2 * n**3 / us / 1e6, 1),
                     "vs_cublas": round(results["cuBLAS (cupy)"]["us"] / us, 3),
                     "max_error_over_max": err, "ptxas": regs[-2:],
                     "passes": d.variant.data.get("passes")}
        except Exception as e:  # a variant the planner refuses is reported, not fatal
            entry = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        results[key] = entry
        print(key, {k: v for k, v in entry.items() if k != "passes"}, flush=True)
    if paths:
        json.dump({"machine": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "size": n, "dtype": "float32 (strict)",
                   "cupy": cp.__version__, "results": results}, open(paths[0], "w"), indent=1)


if __name__ == "__main__":
    main()
