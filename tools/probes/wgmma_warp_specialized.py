"""Probe (not part of metile; a record for gemm_wgmma's pipelines): which structure of a
warpgroup GEMM ptxas keeps pipelined.  Builds a kernel from codegen/cuda.py's own wgmma and
cp.async helpers, compiles it with NVRTC for sm_90a and prints ptxas's warnings and the
HGMMA / WARPGROUP lines of its SASS.  Run: python tools/probes/wgmma_warp_specialized.py
(needs the nvidia-cuda-nvrtc and -nvdisasm wheels, as the test suite's NVRTC tests do).

Found on 2026-11-30 with NVRTC 13.5:
 * metile's warpgroup GEMM keeps one product group in flight across K steps only if no
   other code sits between a wgmma and its wait: with the cp.async issue code there,
   ptxas serializes every wgmma (C7514), so gemm_wgmma drains each step (wait_group 0).
 * Roles by warpgroup in ONE loop with `if (tid < 128)` → C7518 (serialized: divergent path).
   The role made warp-uniform (`__shfl_sync(..., tid / 128, 0)`) but one shared loop → C7517
   (a wait_group 0 injected at the merge).
 * This kernel: warp-uniform roles, a separate loop per role, __syncthreads as the hand-off
   (consumer warpgroup: wgmma + wait_group 1; producer warp: cp.async for tile t+2, wait,
   fence.proxy.async) → no warning; SASS: 4 HGMMA back to back, WARPGROUP.DEPBAR.LE gsb0 0x1.
   METILE_CUDA_WGMMA=ws is built on it.  A compile probe only: its copy indexing is a
   placeholder, never run.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from metile.codegen.cuda import _ASYNC, _WGMMA, wgmma_product  # noqa: E402
import nvrtc  # noqa: E402

KERNEL = r"""extern "C" __global__ void __launch_bounds__(160, 1) k(const __half* a, float* out, int n, int lda) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wg == 0) {
    float acc[128];
    #pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int t = 0; t < n; ++t) {
      __syncthreads();
      metile_wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        NAME(acc, metile_wgmma_desc(smem + (t & 3) * 49152 + kk * 32, 16, 1024), metile_wgmma_desc(smem + (t & 3) * 49152 + 16384 + kk * 2048, 8192, 1024));
      metile_wgmma_commit();
      metile_wgmma_wait<1>();
    }
    metile_wgmma_wait<0>();
    metile_wgmma_hold(acc);
    #pragma unroll
    for (int i = 0; i < 128; ++i) out[tid * 128 + i] = acc[i] * 2.0f + (float)i;
  } else {
    const int p = tid - 128;
    for (int t = 0; t < n; ++t) {
      __syncthreads();
      for (int g = p; g < 3072; g += 32) {
        const int row = g / 8, chunk = g % 8;
        const __half* src = a + (size_t)(t + 2) * 64 + row * lda + chunk * 8;
        if (((row * lda + chunk * 8) & 7) == 0 && row < n) metile_cp_async16(smem + ((t + 2) & 3) * 49152 + row * 128 + ((chunk ^ (row & 7)) * 16), src);
        else { for (int e = 0; e < 8; ++e) ((__half*)(smem + ((t + 2) & 3) * 49152 + row * 128))[e] = (row < n) ? src[e] : __float2half(0.f); }
      }
      metile_cp_async_commit();
      metile_cp_async_wait<1>();
      metile_fence_proxy_async();
    }
  }
}
"""


def main():
    name, product = wgmma_product(256, "float16", 1)
    source = "#include <cuda_fp16.h>\n" + "\n".join((_ASYNC, _WGMMA, product)) + "\n" + \
        KERNEL.replace("NAME", name)
    cubin, log = nvrtc.cubin(source, "sm_90a", ["--ptxas-options=-v"])
    print("\n".join(line for line in log.splitlines() if "C75" in line or "registers" in line))
    print("\n".join(line.strip() for line in nvrtc.disassemble(cubin).splitlines()
                    if re.search("HGMMA|WARPGROUP", line)))


if __name__ == "__main__":
    main()
