"""Time the warpgroup GEMM's stages on the H200 by leaving stages out: the hand-written
probe (wgmma_stages.cu, the loop metile emits for 128x256x64 float16) whole and with one
stage left out, metile's kernels as emitted for METILE_CUDA_WGMMA=1 and =whole, a hand
edit of the first without its per-tile copy test, and cuBLAS through CuPy, at 4096^3,
CUDA events over many launches.  (The hand edits of older emitted sources that the
2026-11-30 results name, variant_*.cu, are in git at 1972b57.)

    python3 tools/probes/wgmma_stage_timing.py [out.json] [--only KEY]

--only KEY times just the kernels whose name starts with KEY (e.g. "metile whole", "probe
S=4 whole"), so that a profiler sees one kernel's launches (tools/device_profile.sh).
"""
import json
import os
import re
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


def without_copy_test(source):
    """The emitted source with each per-tile test of a thread's copy addresses taken as
    true (correct here: the problem's operands are aligned)."""
    return re.sub(r"if \((_v\d+)\) \{\n(\s+const int32_t _v\d+ = \(_v\d+ \* 2\);\n"
                  r"\s+metile_cp_async16_fill)", r"if (true || \1) {\n\2", source)


def tensor_map(address, dims, row_stride_bytes, box):
    """A 2-D float16 CUtensorMap (128 bytes) with 128-byte swizzle and zero fill, encoded by
    the driver (cuTensorMapEncodeTiled, called through ctypes)."""
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    buf = np.zeros(256, np.uint8)
    at = (-buf.ctypes.data) % 64
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rc = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(buf.ctypes.data + at), 6, u32(2), ctypes.c_void_p(address),
        (u64 * 2)(*dims), (u64 * 1)(row_stride_bytes), (u32 * 2)(*box), (u32 * 2)(1, 1),
        0, 3, 3, 0)
    assert rc == 0, f"cuTensorMapEncodeTiled: CUresult {rc}"
    return buf[at:at + 128].copy()


def metile_kernel(variant):
    """(translation unit, kernel name, launch record) of the library GEMM as emitted under
    METILE_CUDA_WGMMA=variant."""
    import mlx.core as mx
    sys.path.insert(0, "kernels")
    from metile_kernels.gemm import grid, matmul
    os.environ["METILE_CUDA_WGMMA"] = variant
    d = matmul[grid(M, N, 128, 256)].prepare(
        mx.zeros((M, K), dtype=mx.float16), mx.zeros((K, N), dtype=mx.float16),
        mx.zeros((M, N), dtype=mx.float16), M, N, K, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
        backend="cuda")
    return nvrtc.translation_unit(d), d.variant.data["name"], d.variant.data["lowering"]["launch"]


def main():
    argv = sys.argv[1:]
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    paths = [a for i, a in enumerate(argv) if a != "--only" and (i == 0 or argv[i - 1] != "--only")]
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16))
    b = cp.asarray(rng.standard_normal((K, N), dtype=np.float32).astype(np.float16))
    c = cp.zeros((M, N), cp.float16)
    ref = (a.astype(cp.float32) @ b.astype(cp.float32))
    grid = (M // 128, N // 256)
    results = {}

    def measure(key, source, name, threads, smem, args):
        if only and not key.startswith(only):
            return
        fn = load(source, name)
        fn.max_dynamic_shared_size_bytes = smem
        us = timed(lambda: fn(grid, (threads,), args, shared_mem=smem))
        entry = {"us": round(us, 1), "tflops": round(FLOP / us / 1e6, 1)}
        c.fill(0)
        fn(grid, (threads,), args, shared_mem=smem)
        entry["max_error_over_max"] = float(cp.abs(c.astype(cp.float32) - ref).max()
                                            / cp.abs(ref).max())
        results[key] = entry
        print(key, entry, flush=True)

    kernels = {variant: metile_kernel(variant) for variant in ("1", "whole")}
    tu = kernels["1"][0]
    # the probe uses the helpers (wgmma, cp.async) of the source metile emits
    probe = tu[:tu.index('extern "C"')] + open("tools/probes/wgmma_stages.cu").read()
    stages = 4
    smem = stages * (128 * 64 + 64 * 256) * 2
    scalars = (np.int32(M), np.int32(N), np.int32(K))
    for leave_out in ("", "NO_COPY", "NO_MMA", "NO_EPILOGUE"):
        defs = f"#define S {stages}\n" + (f"#define {leave_out}\n" if leave_out else "")
        measure(f"probe S={stages} {leave_out or 'whole'}", defs + probe, "probe", 256, smem,
                (a, b, c, *scalars))

    dims = [cp.asarray(np.array([v], np.int32)) for v in (M, N, K)]
    for variant, (tu, name, launch) in kernels.items():
        sources = {f"metile {variant}": tu}
        if variant == "1":
            sources["metile 1 without the per-tile copy test"] = without_copy_test(tu)
        for key, source in sources.items():
            measure(key, source, name, launch["threads"], launch["shared_memory"],
                    (a, b, *dims, c))

    if not only:
        us = timed(lambda: cp.matmul(a, b, out=c))
        results["cupy cuBLAS"] = {"us": round(us, 1), "tflops": round(FLOP / us / 1e6, 1)}
        print("cupy cuBLAS", results["cupy cuBLAS"])
    # Last, as a fault here ends the process: the TMA form (wgmma_tma.cu).  Maps of A (K x M,
    # box 64 x 128) and B (N x K, box 64 x 64); "dims" encodes a template with other sizes
    # and a stand-in address, all replaced in the kernel.
    tma = tu[:tu.index('extern "C"')] + open("tools/probes/wgmma_tma.cu").read()
    scratch = cp.zeros(grid[0] * grid[1] * 256, cp.uint8)
    tma_smem = smem + 256 + 8 * stages
    for form, dims_a, dims_b, addr_a, addr_b in (
            ("addr", (K, M), (N, K), a.data.ptr, b.data.ptr),
            ("dims", (128, 256), (256, 128), 1 << 20, 1 << 20)):
        tmpl = cp.asarray(np.concatenate([
            tensor_map(addr_a, dims_a, 2 * dims_a[0], (64, 128)),
            tensor_map(addr_b, dims_b, 2 * dims_b[0], (64, 64))]))
        defs = f"#define S {stages}\n" + ("#define TMA_DIMS\n" if form == "dims" else "")
        measure(f"probe S={stages} tma {form}", defs + tma, "probe_tma", 256, tma_smem,
                (a, b, c, *scalars, tmpl, scratch))

    if paths and not only:
        json.dump({"machine": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "shape": [M, N, K], "dtype": "float16",
                   "cupy": cp.__version__, "results": results}, open(paths[0], "w"), indent=1)


if __name__ == "__main__":
    main()
