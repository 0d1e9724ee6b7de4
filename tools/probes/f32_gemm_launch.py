"""Launch metile's strict float32 GEMM (the FFMA path) a few times, for a profiler around
this script (ncu in tools/device_next.sh): 4096^3 at 31 TFLOP/s on the H200 whatever the
tile (64x64x16 and 128x128x32 within 5%), where cuBLAS's SIMT kernel reaches 47-51.
NVRTC's SASS of the 128x128x32 loop is 77% FFMA (2048 of 2664 instructions); per k step a
thread reads its 8 B values by scalar LDS and its 8 A values by LDS.128 along k (ptxas
merges 4 unrolled k steps), and a warp's two A rows lie 32 floats apart (a 2-way bank
conflict).  Shared-memory wavefronts and issue slots come close to the FFMA time there;
ncu's bank-conflict and stall counters decide.

    python3 tools/probes/f32_gemm_launch.py [N] [BM BN BK WARPS]
"""
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, "kernels")
from metile_kernels.gemm import grid, matmul  # noqa: E402


def main():
    args = [int(x) for x in sys.argv[1:]]
    n = args[0] if args else 4096
    bm, bn, bk, warps = args[1:5] if len(args) >= 5 else (128, 128, 32, 8)
    rng = np.random.default_rng(0)
    a = mx.array(rng.standard_normal((n, n)).astype(np.float32))
    b = mx.array(rng.standard_normal((n, n)).astype(np.float32))
    for _ in range(3):
        mx.eval(matmul[grid(n, n, bm, bn)](a, b, mx.zeros((n, n)), n, n, n, BLOCK_M=bm,
                                           BLOCK_N=bn, BLOCK_K=bk, num_simdgroups=warps))
    mx.synchronize()


if __name__ == "__main__":
    main()
