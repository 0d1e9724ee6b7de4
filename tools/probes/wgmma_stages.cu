// Stage-timing probe for the warpgroup GEMM (issue 13), compiled after the helpers of the
// translation unit metile emits for the same GEMM (wgmma_stage_timing.py): the loop metile emits for
// 128x256x64 float16 tiles, written by hand so stages can be left out (-D NO_COPY,
// NO_MMA, NO_EPILOGUE) and timed against the whole kernel.
#ifndef S
#define S 4
#endif
extern "C" __global__ void __launch_bounds__(256) probe(const __half* __restrict__ A, const __half* __restrict__ B, __half* __restrict__ C, int M, int N, int K) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __half* sa = reinterpret_cast<__half*>(smem);
  __half* sb = reinterpret_cast<__half*>(smem + S * 128 * 64 * 2);
  float acc[128];
  const int tid = threadIdx.x, wg = tid / 128;
  const int m0 = blockIdx.x * 128, n0 = blockIdx.y * 256;
  const int nk = (K + 63) / 64;
  auto issue = [&](int kt, int s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int c = tid + 256 * i, r = c / 8, ch = c % 8, gr = m0 + r, gk = kt * 64 + ch * 8;
      bool ok = gr < M && gk < K;
      metile_cp_async16_fill(&sa[s * 8192 + r * 64 + ((ch ^ (r % 8)) * 8)], A + (ok ? gr * K + gk : 0), ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int c = tid + 256 * i, r = c / 32, ch = c % 32, gk = kt * 64 + r, gn = n0 + ch * 8;
      bool ok = gk < K && gn < N;
      metile_cp_async16_fill(&sb[s * 16384 + (ch / 8) * 4096 + r * 64 + (((ch % 8) ^ (r % 8)) * 8)], B + (ok ? gk * N + gn : 0), ok ? 16 : 0);
    }
  };
  const int D = S - 2;
  for (int t = 0; t < D; ++t) { issue(t, t); metile_cp_async_commit(); }
  for (int t = 0; t < nk; ++t) {
    metile_cp_async_wait<S - 3>();
    metile_fence_proxy_async();
    __syncthreads();
    const int s = t % S;
#ifndef NO_MMA
    metile_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      metile_wgmma_m64n256k16_f16_tb(acc, metile_wgmma_desc(&sa[s * 8192 + wg * 64 * 64 + kk * 16], 16, 1024),
                                     metile_wgmma_desc(&sb[s * 16384 + kk * 16 * 64], 8192, 1024), (t | kk) != 0);
    metile_wgmma_commit();
#endif
#ifndef NO_COPY
    const int nt = t + D;
    if (nt < nk) issue(nt, nt % S);
#endif
    metile_cp_async_commit();
#ifndef NO_MMA
    metile_wgmma_wait<1>();
#endif
  }
#ifndef NO_MMA
  metile_wgmma_wait<0>();
  metile_wgmma_hold(acc);
#else
  for (int i = 0; i < 128; ++i) acc[i] = __half2float(sa[(tid + i) % 8192]);
#endif
  const int lane = tid % 32, q = (tid / 32) % 4;
#ifdef NO_EPILOGUE
  if (acc[0] == 12345.f && acc[127] == 1.f) C[tid] = __float2half(acc[5]);
#else
#pragma unroll
  for (int e = 0; e < 128; e += 2) {
    int row = m0 + wg * 64 + q * 16 + lane / 4 + ((e / 2) % 2) * 8;
    int col = n0 + (lane % 4) * 2 + (e / 4) * 8;
    if (row < M && col + 1 < N) *reinterpret_cast<__half2*>(&C[row * N + col]) = __floats2half2_rn(acc[e], acc[e + 1]);
  }
#endif
}
