typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/limits>
__device__ __forceinline__ unsigned long long metile_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return static_cast<unsigned long long>((a & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
__device__ __forceinline__ void metile_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void metile_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void metile_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void metile_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
template <int N> __device__ __forceinline__ void metile_wgmma_hold(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
__device__ __forceinline__ void metile_cp_async16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void metile_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void metile_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ bool metile_aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}
__device__ __forceinline__ void metile_wgmma_m64n256k16_f16_tb(float (&d)[128], unsigned long long da, unsigned long long db, int sd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(da), "l"(db), "r"(sd));
}


// Stage-timing probe for the warpgroup GEMM (issue 13): the loop metile emits for
// 128x256x64 float16 tiles, written by hand so stages can be left out (-D NO_COPY,
// NO_MMA, NO_EPILOGUE) and timed against the whole kernel.
__device__ __forceinline__ void probe_zfill(void* dst, const void* src, unsigned n) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(n) : "memory");
}
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
      probe_zfill(&sa[s * 8192 + r * 64 + ((ch ^ (r % 8)) * 8)], A + (ok ? gr * K + gk : 0), ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int c = tid + 256 * i, r = c / 32, ch = c % 32, gk = kt * 64 + r, gn = n0 + ch * 8;
      bool ok = gk < K && gn < N;
      probe_zfill(&sb[s * 16384 + (ch / 8) * 4096 + r * 64 + (((ch % 8) ^ (r % 8)) * 8)], B + (ok ? gk * N + gn : 0), ok ? 16 : 0);
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
