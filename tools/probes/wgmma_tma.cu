// TMA form of the stage-timing probe (wgmma_stages.cu), compiled after the helpers of the
// translation unit metile emits for the same GEMM: the operand tiles arrive by bulk tensor
// copies (cp.async.bulk.tensor, one thread, 1 copy for A and 4 for B per stage) completing
// on one mbarrier per stage, instead of 12 cp.async per thread per stage.  MLX's custom
// kernels take arrays and int/float/bool scalars only, so the tensor maps cannot be kernel
// parameters: a template (host-encoded once, any address) comes in as an array, and each
// block writes its own copy with the operand's address (and, under TMA_DIMS, its sizes and
// row stride) into a scratch array through shared memory (tensormap.replace,
// tensormap.cp_fenceproxy), the CUDA guide's device-side encoding.  The shared layout is
// the one metile's wgmma descriptors read (128-byte swizzle atoms of 64 halves), which is
// TMA's SWIZZLE_128B for a box whose rows are 128 bytes.
#ifndef S
#define S 4
#endif
__device__ __forceinline__ unsigned probe_smem(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void probe_tma2d(void* dst, const void* map, int c0, int c1, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];"
               :: "r"(probe_smem(dst)), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void probe_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}

extern "C" __global__ void __launch_bounds__(256) probe_tma(
    const __half* __restrict__ A, const __half* __restrict__ B, __half* __restrict__ C,
    int M, int N, int K, const int4* __restrict__ tmpl, unsigned char* __restrict__ scratch) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __half* sa = reinterpret_cast<__half*>(smem);
  __half* sb = reinterpret_cast<__half*>(smem + S * 128 * 64 * 2);
  unsigned char* tail = smem + S * (128 * 64 + 64 * 256) * 2;
  int4* tm = reinterpret_cast<int4*>(tail);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(tail + 256);
  float acc[128];
  const int tid = threadIdx.x, wg = tid / 128;
  const int m0 = blockIdx.x * 128, n0 = blockIdx.y * 256;
  const int nk = (K + 63) / 64;
  unsigned char* maps = scratch + (static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x) * 256;
  if (tid < 32) {
    if (tid == 0) {
      for (int i = 0; i < 16; ++i) tm[i] = tmpl[i];
      const unsigned ta = probe_smem(tm), tb = probe_smem(tm + 8);
      asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" :: "r"(ta), "l"(A) : "memory");
      asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" :: "r"(tb), "l"(B) : "memory");
#ifdef TMA_DIMS
      asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" :: "r"(ta), "r"(K) : "memory");
      asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" :: "r"(ta), "r"(M) : "memory");
      asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" :: "r"(ta), "l"(2ll * K) : "memory");
      asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" :: "r"(tb), "r"(N) : "memory");
      asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" :: "r"(tb), "r"(K) : "memory");
      asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" :: "r"(tb), "l"(2ll * N) : "memory");
#endif
      for (int s = 0; s < S; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(probe_smem(&bars[s])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;"
                 :: "l"(maps), "r"(probe_smem(tm)) : "memory");
    asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;"
                 :: "l"(maps + 128), "r"(probe_smem(tm + 8)) : "memory");
    if (tid == 0) {
      asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(maps) : "memory");
      asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(maps + 128) : "memory");
    }
  }
  __syncthreads();
  auto issue = [&](int kt, int s) {
    const unsigned bar = probe_smem(&bars[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"((128 * 64 + 64 * 256) * 2) : "memory");
    probe_tma2d(&sa[s * 8192], maps, kt * 64, m0, bar);
#pragma unroll
    for (int j = 0; j < 4; ++j) probe_tma2d(&sb[s * 16384 + j * 4096], maps + 128, n0 + 64 * j, kt * 64, bar);
  };
  const int D = S - 2;
  if (tid == 0)
    for (int t = 0; t < D && t < nk; ++t) issue(t, t);
  for (int t = 0; t < nk; ++t) {
    const int s = t % S;
    probe_wait(probe_smem(&bars[s]), (t / S) & 1);
    // every warpgroup has passed step t-1's wait: tile t-2's stage is free for tile t+D
    __syncthreads();
    if (tid == 0 && t + D < nk) issue(t + D, (t + D) % S);
    metile_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      metile_wgmma_m64n256k16_f16_tb(acc, metile_wgmma_desc(&sa[s * 8192 + wg * 64 * 64 + kk * 16], 16, 1024),
                                     metile_wgmma_desc(&sb[s * 16384 + kk * 16 * 64], 8192, 1024), (t | kk) != 0);
    metile_wgmma_commit();
    metile_wgmma_wait<1>();
  }
  metile_wgmma_wait<0>();
  metile_wgmma_hold(acc);
  const int lane = tid % 32, q = (tid / 32) % 4;
#pragma unroll
  for (int e = 0; e < 128; e += 2) {
    int row = m0 + wg * 64 + q * 16 + lane / 4 + ((e / 2) % 2) * 8;
    int col = n0 + (lane % 4) * 2 + (e / 4) * 8;
    if (row < M && col + 1 < N) *reinterpret_cast<__half2*>(&C[row * N + col]) = __floats2half2_rn(acc[e], acc[e + 1]);
  }
}
