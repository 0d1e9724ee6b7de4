"""Time the warpgroup GEMM's stages on the H200 without hardware counters (the one-GPU
machine's gVisor runtime has no ncu): the hand-written probe (wgmma_stages.cu, the loop
metile emits for 128x256x64 float16) whole and with one stage left out, metile's own
generated kernel, and cuBLAS through CuPy, at 4096^3, CUDA events over many launches.

    python3 tools/probes/wgmma_stage_timing.py [out.json]
"""
import json
import sys
import tempfile

import cupy as cp
import numpy as np

sys.path.insert(0, "tests")
import nvrtc  # noqa: E402  (tests/nvrtc.py: metile's NVRTC helpers)

M = N = K = 4096
FLOP = 2 * M * N * K


def load(source, name):
    data, log = nvrtc.cubin(source, "sm_90a")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(data)
    return cp.RawModule(path=f.name).get_function(name)


def timed(launch, n=40):
    for _ in range(3):
        launch()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    best = []
    for _ in range(3):
        start.record()
        for _ in range(n):
            launch()
        stop.record()
        stop.synchronize()
        best.append(cp.cuda.get_elapsed_time(start, stop) * 1000 / n)
    return min(best)


def main():
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16))
    b = cp.asarray(rng.standard_normal((K, N), dtype=np.float32).astype(np.float16))
    c = cp.zeros((M, N), cp.float16)
    ref = (a.astype(cp.float32) @ b.astype(cp.float32))
    probe = open("tools/probes/wgmma_stages.cu").read()
    grid = (M // 128, N // 256)
    results = {}
    for stages in (4,):
        smem = stages * (128 * 64 + 64 * 256) * 2
        for leave_out in ("", "NO_COPY", "NO_MMA", "NO_EPILOGUE"):
            defs = f"#define S {stages}\n" + (f"#define {leave_out}\n" if leave_out else "")
            fn = load(defs + probe, "probe")
            fn.max_dynamic_shared_size_bytes = smem
            args = (a, b, c, np.int32(M), np.int32(N), np.int32(K))
            us = timed(lambda: fn(grid, (256,), args, shared_mem=smem))
            key = f"probe S={stages} {leave_out or 'whole'}"
            entry = {"us": round(us, 1), "tflops": round(FLOP / us / 1e6, 1)}
            if not leave_out:
                c.fill(0)
                fn(grid, (256,), args, shared_mem=smem)
                err = float(cp.abs(c.astype(cp.float32) - ref).max() / cp.abs(ref).max())
                entry["max_error_over_max"] = err
            results[key] = entry
            print(key, entry, flush=True)
    # metile's generated kernel for the same problem
    import mlx.core as mx
    sys.path.insert(0, "kernels")
    from metile_kernels.gemm import grid as mgrid, matmul
    d = matmul[mgrid(M, N, 128, 256)].prepare(
        mx.zeros((M, K), dtype=mx.float16), mx.zeros((K, N), dtype=mx.float16),
        mx.zeros((M, N), dtype=mx.float16), M, N, K, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
        backend="cuda")
    tu = nvrtc.translation_unit(d)
    name = d.variant.data["name"]
    fn = load(tu, name)
    launch = d.variant.data["lowering"]["launch"]
    smem = launch["shared_memory"]
    fn.max_dynamic_shared_size_bytes = smem
    dims = [cp.asarray(np.array([v], np.int32)) for v in (M, N, K)]
    args = (a, b, *dims, c)
    us = timed(lambda: fn(grid, (launch["threads"],), args, shared_mem=smem))
    c.fill(0)
    fn(grid, (launch["threads"],), args, shared_mem=smem)
    err = float(cp.abs(c.astype(cp.float32) - ref).max() / cp.abs(ref).max())
    results["metile generated"] = {"us": round(us, 1), "tflops": round(FLOP / us / 1e6, 1),
                                   "max_error_over_max": err}
    print("metile generated", results["metile generated"], flush=True)
    # hand edits of that generated source (tools/probes/variant_*.cu), same launch
    import glob
    import re
    for path in sorted(glob.glob("tools/probes/variant_*.cu")):
        text = open(path).read()
        fn = load(text, re.search(r'extern "C" __global__ void (\w+)', text).group(1))
        fn.max_dynamic_shared_size_bytes = smem
        us = timed(lambda: fn(grid, (launch["threads"],), args, shared_mem=smem))
        c.fill(0)
        fn(grid, (launch["threads"],), args, shared_mem=smem)
        err = float(cp.abs(c.astype(cp.float32) - ref).max() / cp.abs(ref).max())
        key = path.split("/")[-1]
        results[key] = {"us": round(us, 1), "tflops": round(FLOP / us / 1e6, 1),
                        "max_error_over_max": err}
        print(key, results[key], flush=True)
    us = timed(lambda: cp.matmul(a, b, out=c))
    results["cupy cuBLAS"] = {"us": round(us, 1), "tflops": round(FLOP / us / 1e6, 1)}
    print("cupy cuBLAS", results["cupy cuBLAS"])
    if len(sys.argv) > 1:
        json.dump({"machine": "H200", "shape": [M, N, K], "dtype": "float16",
                   "cupy": cp.__version__, "results": results}, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
