"""CUDA C++: the spelling table for `CEmitter`.

Produces the (header, body) pair of MLX's `cuda_kernel` contract (the body
sees buffers by their input/output names; MLX wraps it in a `__global__`
function inside `namespace mlx::core::cu` and compiles it with NVRTC).
Concept map: threadgroup -> block, SIMD-group -> warp (32 lanes on every
NVIDIA GPU, as on Apple GPUs), threadgroup memory -> static `__shared__`,
barrier -> `__syncthreads`, SIMD-group reductions -> `__shfl_xor_sync`
butterflies, half/bfloat -> `__half`/`__nv_bfloat16` with math done in float.
"""

from __future__ import annotations

from ..ir.core import Function, Op
from ..ir.ops import TMA, TMA_SLOTS, TMA_TEMPLATE
from . import fp8
from .c_like import CEmitter
from .debug_ops import CUDADebug

# Butterfly reductions over a full warp.  Every lane ends with the result, as
# Metal's simd_sum/simd_max/simd_min do; the lane geometry always launches
# whole warps, so the full mask is exact.
_WARP = """\
// Within aligned groups of L lanes (a row of a tile on L lanes; L = 32: the warp): every
// lane of the warp shuffles, each group combining its own values.
template <int L, typename T> __device__ __forceinline__ T metile_lanes_sum(T v) {
  for (int o = L / 2; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int L, typename T> __device__ __forceinline__ T metile_lanes_max(T v) {
  for (int o = L / 2; o > 0; o >>= 1) { T w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; }
  return v;
}
template <int L, typename T> __device__ __forceinline__ T metile_lanes_min(T v) {
  for (int o = L / 2; o > 0; o >>= 1) { T w = __shfl_xor_sync(0xffffffffu, v, o); v = w < v ? w : v; }
  return v;
}
// One butterfly step with the lane l ^ M (the lanes holding one row of an accumulator
// fragment, passes/lower_mma_layout.py).
template <typename T> __device__ __forceinline__ T metile_xor_sum(T v, int m) {
  return v + __shfl_xor_sync(0xffffffffu, v, m);
}
template <typename T> __device__ __forceinline__ T metile_xor_max(T v, int m) {
  T w = __shfl_xor_sync(0xffffffffu, v, m);
  return w > v ? w : v;
}
template <typename T> __device__ __forceinline__ T metile_xor_min(T v, int m) {
  T w = __shfl_xor_sync(0xffffffffu, v, m);
  return w < v ? w : v;
}
template <typename T> __device__ __forceinline__ T metile_warp_sum(T v) { return metile_lanes_sum<32>(v); }
template <typename T> __device__ __forceinline__ T metile_warp_max(T v) { return metile_lanes_max<32>(v); }
template <typename T> __device__ __forceinline__ T metile_warp_min(T v) { return metile_lanes_min<32>(v); }
template <typename T> __device__ __forceinline__ T metile_warp_or(T v) {
  for (int o = 16; o > 0; o >>= 1) v = v | __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T metile_warp_xor(T v) {
  for (int o = 16; o > 0; o >>= 1) v = v ^ __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}"""


# Tensor-core fragments through PTX mma.sync (sm_80+).  NVRTC as MLX runs it
# cannot include <mma.h> (its crt/ part is missing from the CUDA wheels), so
# metile spells the fragments itself.  A 16x16 tile is held in the register
# layout of mma.sync m16n8k16 (f16/bf16) or m16n8k8 (tf32), as two n=8 halves:
# lane l, g = l / 4, t = l % 4.  This layout is private to these helpers; the
# DSL and the generated body never see it.
_MMA = """\
template <typename T> struct metile_frag_a { unsigned r[4]; };
template <typename T> struct metile_frag_b { unsigned r[4]; };
struct metile_frag_a_tf32 { unsigned r[4]; };
struct metile_frag_b_tf32 { unsigned r[4]; };
struct metile_frag_acc { float x[8]; };

template <typename T> __device__ __forceinline__ unsigned metile_pack2(const T* p, int i, int j) {
  const unsigned short* s = reinterpret_cast<const unsigned short*>(p);
  return static_cast<unsigned>(s[i]) | (static_cast<unsigned>(s[j]) << 16);
}
__device__ __forceinline__ unsigned metile_to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// ldmatrix (sm_75+) moves a 16x16 16-bit tile from shared memory straight into the
// mma.sync fragment layout below: matrix i (addressed by lanes 8i..8i+7) is rows
// 8(i%2).. and columns 8(i/2).. of the tile, i.e. registers r0..r3 in fragment order;
// .trans gives B its k-pairs.  It needs shared memory and 16-byte aligned rows (the
// tile pointer and ld are uniform across the warp, so every lane takes one path).
__device__ __forceinline__ bool metile_ldmatrix_ok(const void* p, int ld) {
  return __isShared(p) && ((reinterpret_cast<unsigned long long>(p) | (2ull * ld)) & 15) == 0;
}
// Four 8x8 16-bit matrices from the shared-memory address `a` of this lane's row.
template <bool TRANS> __device__ __forceinline__ void metile_ldmatrix_at(unsigned (&r)[4], unsigned a) {
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
template <bool TRANS, typename T> __device__ __forceinline__ void metile_ldmatrix_x4(unsigned (&r)[4], const T* p, int ld) {
  const int l = threadIdx.x & 31;
  metile_ldmatrix_at<TRANS>(r, static_cast<unsigned>(__cvta_generic_to_shared(
      p + ((l & 7) + ((l >> 3) & 1) * 8) * ld + (l >> 4) * 8)));
}
// The four matrices of a B operand stored transposed (N x K row-major at p), addressed in
// mma's register order (n 0-7/k 0-7, n 0-7/k 8-15, n 8-15/k 0-7, n 8-15/k 8-15): no moves
// between the load and the product.
template <typename T> __device__ __forceinline__ void metile_ldmatrix_x4_nk(unsigned (&r)[4], const T* p, int ld) {
  const int l = threadIdx.x & 31;
  metile_ldmatrix_at<false>(r, static_cast<unsigned>(__cvta_generic_to_shared(
      p + ((l & 7) + (l >> 4) * 8) * ld + ((l >> 3) & 1) * 8)));
}
// A: 16x16 row-major at p (leading dimension ld).
template <typename T> __device__ __forceinline__ void metile_frag_load(metile_frag_a<T>& f, const T* p, int ld) {
  if (metile_ldmatrix_ok(p, ld)) { metile_ldmatrix_x4<false>(f.r, p, ld); return; }
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  f.r[0] = metile_pack2(p, g * ld + 2 * t, g * ld + 2 * t + 1);
  f.r[1] = metile_pack2(p, (g + 8) * ld + 2 * t, (g + 8) * ld + 2 * t + 1);
  f.r[2] = metile_pack2(p, g * ld + 2 * t + 8, g * ld + 2 * t + 9);
  f.r[3] = metile_pack2(p, (g + 8) * ld + 2 * t + 8, (g + 8) * ld + 2 * t + 9);
}
// B: 16x16 row-major (K x N) at p; mma.sync wants it column-wise per n=8 half.
template <typename T> __device__ __forceinline__ void metile_frag_load(metile_frag_b<T>& f, const T* p, int ld) {
  if (metile_ldmatrix_ok(p, ld)) { metile_ldmatrix_x4<true>(f.r, p, ld); return; }
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  for (int h = 0; h < 2; ++h) {
    const int n = h * 8 + g;
    f.r[2 * h] = metile_pack2(p, (2 * t) * ld + n, (2 * t + 1) * ld + n);
    f.r[2 * h + 1] = metile_pack2(p, (2 * t + 8) * ld + n, (2 * t + 9) * ld + n);
  }
}
// B from its transpose: the 16x16 (K x N) operand whose (N x K) transpose is row-major
// at p (a key block stored a key a row, multiplied as keys^T): non-transposing ldmatrix,
// the four 8x8 matrices in mma's order.
template <typename T> __device__ __forceinline__ void metile_frag_load_t(metile_frag_b<T>& f, const T* p, int ld) {
  if (metile_ldmatrix_ok(p, ld)) { metile_ldmatrix_x4_nk(f.r, p, ld); return; }
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  for (int h = 0; h < 2; ++h) {
    const int n = h * 8 + g;
    f.r[2 * h] = metile_pack2(p, n * ld + 2 * t, n * ld + 2 * t + 1);
    f.r[2 * h + 1] = metile_pack2(p, n * ld + 2 * t + 8, n * ld + 2 * t + 9);
  }
}
// The same three loads where the lowering proved the tile shared and every row 16-byte
// aligned (lower_mma_layout: padded rows of a dynamic shared array): no runtime test, whose
// two paths ptxas interleaves under predicates (~10 issued instructions a fragment).
template <typename T> __device__ __forceinline__ void metile_frag_load_s(metile_frag_a<T>& f, const T* p, int ld) {
  metile_ldmatrix_x4<false>(f.r, p, ld);
}
template <typename T> __device__ __forceinline__ void metile_frag_load_s(metile_frag_b<T>& f, const T* p, int ld) {
  metile_ldmatrix_x4<true>(f.r, p, ld);
}
template <typename T> __device__ __forceinline__ void metile_frag_load_ts(metile_frag_b<T>& f, const T* p, int ld) {
  metile_ldmatrix_x4_nk(f.r, p, ld);
}
// TF32 A: 16x8, B: 8x16, converted with round-to-nearest when loaded.
__device__ __forceinline__ void metile_frag_load(metile_frag_a_tf32& f, const float* p, int ld) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  f.r[0] = metile_to_tf32(p[g * ld + t]);
  f.r[1] = metile_to_tf32(p[(g + 8) * ld + t]);
  f.r[2] = metile_to_tf32(p[g * ld + t + 4]);
  f.r[3] = metile_to_tf32(p[(g + 8) * ld + t + 4]);
}
__device__ __forceinline__ void metile_frag_load(metile_frag_b_tf32& f, const float* p, int ld) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  for (int h = 0; h < 2; ++h) {
    f.r[2 * h] = metile_to_tf32(p[t * ld + h * 8 + g]);
    f.r[2 * h + 1] = metile_to_tf32(p[(t + 4) * ld + h * 8 + g]);
  }
}
__device__ __forceinline__ void metile_frag_fill(metile_frag_acc& f, float v) {
  for (int i = 0; i < 8; ++i) f.x[i] = v;
}
__device__ __forceinline__ void metile_frag_store(float* p, const metile_frag_acc& f, int ld) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  for (int h = 0; h < 2; ++h) {
    const int n = h * 8 + 2 * t;
    p[g * ld + n] = f.x[4 * h];
    p[g * ld + n + 1] = f.x[4 * h + 1];
    p[(g + 8) * ld + n] = f.x[4 * h + 2];
    p[(g + 8) * ld + n + 1] = f.x[4 * h + 3];
  }
}
__device__ __forceinline__ unsigned metile_pair(__half lo, __half hi) {
  return static_cast<unsigned>(__half_as_ushort(lo)) | (static_cast<unsigned>(__half_as_ushort(hi)) << 16);
}
__device__ __forceinline__ unsigned metile_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<unsigned>(__bfloat16_as_ushort(lo)) | (static_cast<unsigned>(__bfloat16_as_ushort(hi)) << 16);
}
#define METILE_MMA_HALF(SHAPE, KIND)                                                        \
  for (int h = 0; h < 2; ++h) {                                                             \
    float* dd = d.x + 4 * h;                                                                \
    const float* cc = c.x + 4 * h;                                                          \
    asm volatile("mma.sync.aligned." SHAPE ".row.col.f32." KIND "." KIND ".f32 "           \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"                 \
                 : "=f"(dd[0]), "=f"(dd[1]), "=f"(dd[2]), "=f"(dd[3])                        \
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[2 * h]),      \
                   "r"(b.r[2 * h + 1]), "f"(cc[0]), "f"(cc[1]), "f"(cc[2]), "f"(cc[3]));      \
  }
__device__ __forceinline__ void metile_frag_mma(metile_frag_acc& d, const metile_frag_a<__half>& a,
                                                const metile_frag_b<__half>& b, const metile_frag_acc& c) {
  METILE_MMA_HALF("m16n8k16", "f16")
}
__device__ __forceinline__ void metile_frag_mma(metile_frag_acc& d, const metile_frag_a<__nv_bfloat16>& a,
                                                const metile_frag_b<__nv_bfloat16>& b, const metile_frag_acc& c) {
  METILE_MMA_HALF("m16n8k16", "bf16")
}
__device__ __forceinline__ void metile_frag_mma(metile_frag_acc& d, const metile_frag_a_tf32& a,
                                                const metile_frag_b_tf32& b, const metile_frag_acc& c) {
  METILE_MMA_HALF("m16n8k8", "tf32")
}
#undef METILE_MMA_HALF
"""

# cp.async staging (sm_80+) and ldmatrix from XOR-swizzled tiles (passes/gemm_async.py).
# The swizzle moves 16-byte chunk c of row r to c ^ ((r / U) % CM): the 8 rows one
# ldmatrix matrix reads then fall in 8 different 16-byte bank groups.
_ASYNC = """\
__device__ __forceinline__ void metile_cp_async16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(src) : "memory");
}
// The first `bytes` (0..16) bytes from src, the rest of the 16 zero-filled.
__device__ __forceinline__ void metile_cp_async16_fill(void* dst, const void* src, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void metile_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void metile_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ bool metile_aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}"""

_LDMATRIX_SW = """\
template <bool TRANS, int LD, int U, int CM, typename T>
__device__ __forceinline__ void metile_ldmatrix_sw(unsigned (&r)[4], const T* base, int row, int col) {
  const int l = threadIdx.x & 31;
  const int rr = row + (l & 7) + ((l >> 3) & 1) * 8, cc = col + (l >> 4) * 8;
  const int off = rr * LD + ((((cc >> 3) ^ ((rr / U) % CM))) << 3);
  metile_ldmatrix_at<TRANS>(r, static_cast<unsigned>(__cvta_generic_to_shared(base + off)));
}
template <int LD, int U, int CM, typename T>
__device__ __forceinline__ void metile_frag_load_sw(metile_frag_a<T>& f, const T* base, int row, int col) {
  metile_ldmatrix_sw<false, LD, U, CM>(f.r, base, row, col);
}
template <int LD, int U, int CM, typename T>
__device__ __forceinline__ void metile_frag_load_sw(metile_frag_b<T>& f, const T* base, int row, int col) {
  metile_ldmatrix_sw<true, LD, U, CM>(f.r, base, row, col);
}"""


# Warpgroup MMA (sm_90a; passes/gemm_wgmma.py).  A descriptor names a shared-memory
# operand: start address, leading/stride byte offsets (>> 4) and the 128-byte swizzle
# (mode 1 in bits 62-63).  `hold` pins the accumulators in place around the asynchronous
# products, so no register read or copy is scheduled across a fence or wait.
_WGMMA = """\
__device__ __forceinline__ unsigned long long metile_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return static_cast<unsigned long long>((a & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// A descriptor `add` 16-byte units further into its array: the start-address field (bits
// 0-13, an address below 256 KiB) of a descriptor built once outside the loop, plus one add
// (building each from its pointer cost six instructions, ~150 an attention iteration).
__device__ __forceinline__ unsigned long long metile_wgmma_desc_add(unsigned long long d, unsigned add) {
  return (d & 0xFFFFFFFF00000000ull) | static_cast<unsigned>(static_cast<unsigned>(d) + add);
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
}"""

# Bulk tensor copies (sm_90a; passes/gemm_wgmma.py, bulk_tensor_form).  MLX's kernels take
# arrays and scalars, not the 128-byte CUtensorMap a TMA copy names, so each block encodes
# its maps on the device (the CUDA guide's device-side encoding): the launch's template
# (runtime/tensor_maps.py) copied to shared memory, its address, extents and row stride
# replaced, then copied with a proxy fence to the block's slot of the launch's scratch.
_TMA = """\
__device__ __forceinline__ unsigned metile_smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned char* metile_tma_slot(unsigned char* slots, int bytes) {
  return slots + (static_cast<size_t>(blockIdx.z) * gridDim.y * gridDim.x +
                  static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x) * bytes;
}
__device__ __forceinline__ void metile_tma_encode(unsigned long long* map, const unsigned char* tmpl,
                                                  const void* base, int inner, int outer,
                                                  long long row_bytes) {
  for (int i = 0; i < 8; ++i)
    reinterpret_cast<int4*>(map)[i] = reinterpret_cast<const int4*>(tmpl)[i];
  const unsigned m = metile_smem_u32(map);
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" :: "r"(m), "l"(base) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" :: "r"(m), "r"(inner) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" :: "r"(m), "r"(outer) : "memory");
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" :: "r"(m), "l"(row_bytes) : "memory");
}
__device__ __forceinline__ void metile_tma_publish(unsigned char* slot, const unsigned long long* map) {
  asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;"
               :: "l"(slot), "r"(metile_smem_u32(map)) : "memory");
}
__device__ __forceinline__ void metile_tma_acquire(const unsigned char* slot) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(slot) : "memory");
}
__device__ __forceinline__ void metile_mbar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(metile_smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void metile_mbar_init_count(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(metile_smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void metile_mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(metile_smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void metile_mbar_expect(unsigned long long* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(metile_smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void metile_mbar_wait(unsigned long long* bar, int parity) {
  asm volatile("{\\n.reg .pred p;\\nMETILE_WAIT_%=:\\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\\n"
               "@!p bra METILE_WAIT_%=;\\n}\\n" :: "r"(metile_smem_u32(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void metile_tma_load2d(void* dst, const unsigned char* map, int c0, int c1,
                                                  unsigned long long* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];"
               :: "r"(metile_smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(metile_smem_u32(bar)) : "memory");
}"""

_WGMMA_KIND = {"float16": "f16", "bfloat16": "bf16"}


def wgmma_product(n: int, dtype: str, trans_b: int) -> tuple[str, str]:
    """(name, definition) of the helper issuing one m64nNk16 product into d[N/2]."""
    kind = _WGMMA_KIND[dtype]
    name = f"metile_wgmma_m64n{n}k16_{kind}{'_tb' if trans_b else ''}"
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    text = (f"__device__ __forceinline__ void {name}(float (&d)[{regs}], unsigned long long da, "
            f"unsigned long long db, int accumulate) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "\n'
            f'               "{{{d}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, {trans_b};\\n}}\\n"\n'
            f'               : {outs}\n'
            f'               : "l"(da), "l"(db), "r"(accumulate));\n}}')
    return name, text


def wgmma_product_ra(n: int, dtype: str, trans_b: int) -> tuple[str, str]:
    """(name, definition) of the helper issuing one m64nNk16 product whose left operand
    is in registers (four 32-bit words of 16-bit pairs a thread, mma.sync's A fragment
    layout for the warp's 16 rows: passes/lower_mma_layout.py packs them)."""
    kind = _WGMMA_KIND[dtype]
    name = f"metile_wgmma_m64n{n}k16_{kind}_ra{'_tb' if trans_b else ''}"
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))
    text = (f"__device__ __forceinline__ void {name}(float (&d)[{regs}], const unsigned (&a)[4], "
            f"unsigned long long db, int accumulate) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "\n'
            f'               "{{{d}}}, {{{a}}}, %{regs + 4}, p, 1, 1, {trans_b};\\n}}\\n"\n'
            f'               : {outs}\n'
            f'               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));\n}}')
    return name, text


# exp2 as the hardware computes it, one MUFU.EX2: a result below 2^-126 flushes to zero (as
# Metal's fast math may flush it).  exp2f keeps such results subnormal with a compare
# and two conditional multiplies around it: four instructions where one does, which bound
# softmax on the H200 (two exponentials an element, the SM at 81% of its issue rate).
_EXP2 = r"""__device__ __forceinline__ float metile_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}"""

# sigmoid as 1 / (1 + 2^(-x log2 e)) on the two special-function instructions (MUFU.EX2,
# MUFU.RCP): expf and an IEEE division compiled to ~25 instructions and a slow-path call an
# element, which made a dual GEMM's silu epilogue (64 elements a thread, after the K loop)
# ~8% of the kernel on the H200.  Relative error ~|x| 2^-24 from the scaled argument;
# results below 2^-126 flush to zero, as Metal's fast-math exp may.
_SIGMOID = r"""__device__ __forceinline__ float metile_sigmoid(float x) {
  float e, y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(1.0f + e));
  return y;
}"""

_BITCAST = """\
// the bits of x read as To (a register move once compiled; NVRTC has no memcpy builtin)
template <typename To, typename From> __device__ __forceinline__ To metile_bitcast(From x) {
  static_assert(sizeof(To) == sizeof(From), "a bitcast keeps the width");
  return *reinterpret_cast<const To*>(&x);
}
"""

# pair_fma (ir/ops.py PAIR): a uint32 word read as two 16-bit floats, one HFMA2
_PAIR_F16 = """\
__device__ __forceinline__ unsigned metile_pair_fma_f16(unsigned a, unsigned b, unsigned c) {
  const __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&a),
                            *reinterpret_cast<const __half2*>(&b),
                            *reinterpret_cast<const __half2*>(&c));
  return *reinterpret_cast<const unsigned*>(&r);
}"""
_PAIR_BF16 = """\
__device__ __forceinline__ unsigned metile_pair_fma_bf16(unsigned a, unsigned b, unsigned c) {
  const __nv_bfloat162 r = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b),
                                   *reinterpret_cast<const __nv_bfloat162*>(&c));
  return *reinterpret_cast<const unsigned*>(&r);
}"""

# 8x8 fragments of simdgroup_inline kernels (passes/lower_fragments.py), emulated
# per warp with FFMA and shuffles: lane l holds row l / 4, columns 2 (l % 4) and
# 2 (l % 4) + 1.  Private to these helpers, like the mma.sync layout above.
_FRAG8 = """\
template <typename T> struct metile_frag8 { T x[2]; };
template <typename T, typename P> __device__ __forceinline__ void metile_frag_load(metile_frag8<T>& f, const P* p, int ld) {
  const int l = threadIdx.x & 31, r = l >> 2, c = (l & 3) * 2;
  f.x[0] = static_cast<T>(static_cast<float>(p[r * ld + c]));
  f.x[1] = static_cast<T>(static_cast<float>(p[r * ld + c + 1]));
}
template <typename T, typename P> __device__ __forceinline__ void metile_frag_load_t(metile_frag8<T>& f, const P* p, int ld) {
  const int l = threadIdx.x & 31, r = l >> 2, c = (l & 3) * 2;
  f.x[0] = static_cast<T>(static_cast<float>(p[c * ld + r]));
  f.x[1] = static_cast<T>(static_cast<float>(p[(c + 1) * ld + r]));
}
template <typename T, typename P> __device__ __forceinline__ void metile_frag_store(P* p, const metile_frag8<T>& f, int ld) {
  const int l = threadIdx.x & 31, r = l >> 2, c = (l & 3) * 2;
  p[r * ld + c] = static_cast<P>(static_cast<float>(f.x[0]));
  p[r * ld + c + 1] = static_cast<P>(static_cast<float>(f.x[1]));
}
template <typename T, typename P> __device__ __forceinline__ void metile_frag_store_t(P* p, const metile_frag8<T>& f, int ld) {
  const int l = threadIdx.x & 31, r = l >> 2, c = (l & 3) * 2;
  p[c * ld + r] = static_cast<P>(static_cast<float>(f.x[0]));
  p[(c + 1) * ld + r] = static_cast<P>(static_cast<float>(f.x[1]));
}
__device__ __forceinline__ void metile_frag_fill(metile_frag8<float>& f, float v) { f.x[0] = v; f.x[1] = v; }
// d = a @ b + c in float32: A[r][k] and B[k][c] come from their owners by shuffle.
template <typename TA, typename TB> __device__ __forceinline__ void metile_frag_mma(
    metile_frag8<float>& d, const metile_frag8<TA>& a, const metile_frag8<TB>& b, const metile_frag8<float>& c) {
  const int l = threadIdx.x & 31, r = l >> 2, h = l & 3;
  float acc0 = c.x[0], acc1 = c.x[1];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float ark = __shfl_sync(0xffffffffu, static_cast<float>(a.x[k & 1]), r * 4 + (k >> 1));
    const float b0 = __shfl_sync(0xffffffffu, static_cast<float>(b.x[0]), k * 4 + h);
    const float b1 = __shfl_sync(0xffffffffu, static_cast<float>(b.x[1]), k * 4 + h);
    acc0 = fmaf(ark, b0, acc0);
    acc1 = fmaf(ark, b1, acc1);
  }
  d.x[0] = acc0;
  d.x[1] = acc1;
}"""


_VEC = """\
template <typename V, typename T> __device__ __forceinline__ V metile_load_vec(const T* p) {
  if ((reinterpret_cast<unsigned long long>(p) & (sizeof(V) - 1)) == 0) {
    return *reinterpret_cast<const V*>(p);
  }
  V v;
  memcpy(&v, p, sizeof(V));
  return v;
}"""


# Atomics (codegen/c_like.py `atomic`; the reasons are msl.py's _ATOMICS): CUDA has no float
# atomicMax/Min either, so both use the same sign-split integer order.  __threadfence orders
# the copied-in element before its ready mark.
_ATOMICS = """__device__ inline unsigned metile_u32(float x) { return __float_as_uint(x); }
__device__ inline unsigned metile_u32(int x) { return static_cast<unsigned>(x); }
__device__ inline unsigned metile_u32(unsigned x) { return x; }
template <typename T> __device__ inline T metile_from_u32(unsigned u);
template <> __device__ inline float metile_from_u32<float>(unsigned u) { return __uint_as_float(u); }
template <> __device__ inline int metile_from_u32<int>(unsigned u) { return static_cast<int>(u); }
template <> __device__ inline unsigned metile_from_u32<unsigned>(unsigned u) { return u; }
__device__ inline float metile_atomic_fmax(float* p, float v) {
  return __float_as_int(v) >= 0 ? __int_as_float(atomicMax(reinterpret_cast<int*>(p), __float_as_int(v)))
                                : __uint_as_float(atomicMin(reinterpret_cast<unsigned*>(p), __float_as_uint(v)));
}
__device__ inline float metile_atomic_fmin(float* p, float v) {
  return __float_as_int(v) >= 0 ? __int_as_float(atomicMin(reinterpret_cast<int*>(p), __float_as_int(v)))
                                : __uint_as_float(atomicMax(reinterpret_cast<unsigned*>(p), __float_as_uint(v)));
}
template <typename T>
__device__ inline T metile_atomic_cas(T* p, T c, T v) {
  return metile_from_u32<T>(atomicCAS(reinterpret_cast<unsigned*>(p), metile_u32(c), metile_u32(v)));
}
// a relaxed read (ld.volatile: not served from a stale L1 line, as a spin on it needs)
template <typename T>
__device__ inline T metile_atomic_read(const T* p) {
  return *reinterpret_cast<const volatile T*>(p);
}
template <typename T>
__device__ inline void metile_atomic_init(bool* state, T* out, const T* in, int i) {
  unsigned* w = reinterpret_cast<unsigned*>(reinterpret_cast<unsigned char*>(state) + (i & ~3));
  const unsigned shift = static_cast<unsigned>(i & 3) * 8u;
  unsigned cur = atomicAdd(w, 0u);
  while (((cur >> shift) & 0xffu) != 1u) {
    if (((cur >> shift) & 0xffu) == 0u) {
      const unsigned seen = atomicCAS(w, cur, cur | (2u << shift));
      if (seen == cur) {
        atomicExch(reinterpret_cast<unsigned*>(&out[i]), metile_u32(in[i]));
        __threadfence();
        atomicXor(w, 3u << shift);
        return;
      }
      cur = seen;
    } else {
      cur = atomicAdd(w, 0u);
    }
  }
}"""


def _call(fn: str, ctype: str) -> str:
    return f"{fn}(reinterpret_cast<{ctype}*>({{p}}), {{v}})"


class CUDAEmitter(CEmitter):
    TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int32": "int32_t",
             "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t", "int8": "int8_t",
             "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t", "float8e4nv": "uint8_t",
             "float8e5": "uint8_t", "bool": "bool"}
    ATOMIC = {
        **{(k, d): _call(fn, c) for k, fn in (("add", "atomicAdd"), ("max", "atomicMax"),
                                              ("min", "atomicMin"), ("and", "atomicAnd"),
                                              ("or", "atomicOr"), ("xor", "atomicXor"),
                                              ("xchg", "atomicExch"))
           for d, c in (("int32", "int"), ("uint32", "unsigned int"))},
        ("add", "float32"): _call("atomicAdd", "float"),
        ("xchg", "float32"): _call("atomicExch", "float"),
        ("max", "float32"): "metile_atomic_fmax(reinterpret_cast<float*>({p}), {v})",
        ("min", "float32"): "metile_atomic_fmin(reinterpret_cast<float*>({p}), {v})",
        ("cas", "int32"): "metile_atomic_cas<int>(reinterpret_cast<int*>({p}), {c}, {v})",
        ("cas", "uint32"): "metile_atomic_cas<unsigned>(reinterpret_cast<unsigned*>({p}), {c}, {v})",
        ("cas", "float32"): "metile_atomic_cas<float>(reinterpret_cast<float*>({p}), {c}, {v})",
        "read": "metile_atomic_read({p})",
    }
    ATOMIC_INIT = "metile_atomic_init({state}, {out}, {init}, {index});"
    ATOMIC_FENCE = {"gpu": "__threadfence();", "cta": "__threadfence_block();",
                    "sys": "__threadfence_system();"}
    GEOMETRY = {
        "program_id": "static_cast<int>(blockIdx.{axis})",
        "num_programs": "static_cast<int>(gridDim.{axis})",
        "thread_id": "static_cast<int>(threadIdx.x)",
        "simd_lane": "static_cast<int>(threadIdx.x & 31u)",
        "simd_group": "static_cast<int>(threadIdx.x >> 5)",
    }
    MATH_FUNCS = {"exp": "expf({x})", "exp2": "metile_exp2({x})", "log": "logf({x})", "sqrt": "sqrtf({x})",
                  "rsqrt": "rsqrtf({x})", "tanh": "tanhf({x})", "abs": "fabsf({x})", "erf": "erff({x})",
                  "sigmoid": "metile_sigmoid({x})", "log2": "log2f({x})",
                  "sin": "sinf({x})", "cos": "cosf({x})", "tan": "tanf({x})", "asin": "asinf({x})",
                  "acos": "acosf({x})", "atan": "atanf({x})", "floor": "floorf({x})",
                  "ceil": "ceilf({x})", "pow": "powf({x}, {y})", "atan2": "atan2f({x}, {y})"}
    UMULHI = "__umulhi({x}, {y})"
    SIMD_REDUCE = {"sum": "metile_warp_sum", "max": "metile_warp_max", "min": "metile_warp_min",
                   "or": "metile_warp_or", "xor": "metile_warp_xor"}
    INFINITY = "cuda::std::numeric_limits<float>::infinity()"
    NAN = "cuda::std::numeric_limits<float>::quiet_NaN()"
    BARRIER = "__syncthreads();"
    DEVICE_BARRIER = "__syncthreads();"   # (orders global memory within the block too)
    SHARED_DECL = "__shared__ {type} {name}[{size}];"
    BITCAST = "metile_bitcast<{type}>({x})"
    PAIR_FMA = {"float16": "metile_pair_fma_f16({a}, {b}, {c})",
                "bfloat16": "metile_pair_fma_bf16({a}, {b}, {c})"}
    HELPERS = {"exp2": _EXP2, "sigmoid": _SIGMOID, "bitcast": _BITCAST,
               "pair_float16": _PAIR_F16, "pair_bfloat16": _PAIR_BF16, "warp": _WARP, "mma": _MMA, "frag8": _FRAG8, "vec": _VEC,
               "z_async": _ASYNC,
               "atomics": _ATOMICS, "wgmma": _WGMMA, "z_ldmatrix_sw": _LDMATRIX_SW, "z_tma": _TMA,
               # bit arithmetic rather than __nv_fp8: the same bits as Metal and the CPU runtime
               "fp8": fp8.helpers("__device__ __forceinline__", "uint8_t", "uint32_t",
                                  "__float_as_uint", "__uint_as_float")}
    FRAGMENT = {
        "decl": "{type} {name}[{size}];",
        "fill": "metile_frag_fill({frag}, {value});",
        "load": "metile_frag_load({frag}, &{root}[{offset}], {ld});",
        # the tf32 fragment types round while loading
        "load_tf32": "metile_frag_load({frag}, &{root}[{offset}], {ld});",
        "store": "metile_frag_store(&{root}[{offset}], {frag}, {ld});",
        "mma": "metile_frag_mma({d}, {a}, {b}, {c});",
        # simdgroup_inline 8x8 fragments (metile_frag8)
        "load_t": "metile_frag_load_t({frag}, &{root}[{offset}], {ld});",
        # ldmatrix without the alignment test (the lowering's proof: frag_load's "aligned")
        "load_aligned": "metile_frag_load_s({frag}, &{root}[{offset}], {ld});",
        "load_t_aligned": "metile_frag_load_ts({frag}, &{root}[{offset}], {ld});",
        "store_t": "metile_frag_store_t(&{root}[{offset}], {frag}, {ld});",
        "get": "{frag}.x[{e}]",
        "set": "{frag}.x[{e}] = {value};",
        # a left operand from registers (passes/lower_mma_layout.py): its register i holds
        # the elements 2i and 2i + 1 of the accumulator layout of the same 16x16 block
        "set_pair": "{frag}.r[{i}] = metile_pair({lo}, {hi});",
    }
    SIMD_BARRIER = "__syncwarp();"
    DEBUG_OPS = CUDADebug()
    # 16-byte float4 / 8-byte uint2 loads; 2-byte elements are read back through the
    # element type (the alignment of the whole group was proven by the pass).
    # The 4-element alignment proof is relative to the buffer start; MLX may hand a
    # kernel a row-contiguous slice whose base is not 16-byte aligned, so the load
    # checks the address (uniform per buffer, so the branch does not diverge).
    VECTOR_LOAD = "const {vtype} {name} = metile_load_vec<{vtype}>(&{root}[{index}]);"
    # 16-bit elements are shifted out of the words: taking the vector's address to index
    # it would put it in local memory.
    VECTOR_TYPES = {"float32": ("float4", "{v}.{c}"),
                    "float16": ("uint2", "__ushort_as_half(static_cast<unsigned short>({v}.{h} >> "
                                         "{shift}))"),
                    "bfloat16": ("uint2", "__ushort_as_bfloat16(static_cast<unsigned short>({v}.{h} "
                                          ">> {shift}))")}

    # CUDA has no 16-bit registers: an array of __half takes a 32-bit register per element
    # (a float16 row held in registers cost twice the registers of its bytes, halving the
    # rows in flight).  Pairs share a word; with the slot a constant after unrolling, a
    # read is a shift (or a half-register operand) and a write one byte permute.
    PACKED_LOCALS = {
        d: ("unsigned {name}[{words}] = {{}};",
            f"{cast}(static_cast<unsigned short>({{name}}[({{s}}) >> 1] >> ((({{s}}) & 1) * 16)))",
            f"{{name}}[({{s}}) >> 1] = __byte_perm({{name}}[({{s}}) >> 1], "
            f"static_cast<unsigned>({back}({{v}})), (({{s}}) & 1) ? 0x5410 : 0x3254);")
        for d, cast, back in (("float16", "__ushort_as_half", "__half_as_ushort"),
                              ("bfloat16", "__ushort_as_bfloat16", "__bfloat16_as_ushort"))}

    # plain shifts and or: of the two halves of one word, the compiler's simplifier gives
    # back the word itself
    PACKED_PAIRS = {
        d: (f"(static_cast<unsigned>({back}({{a}})) | (static_cast<unsigned>({back}({{b}})) << 16))",
            f"{cast}(static_cast<unsigned short>({{w}} >> {{shift}}))")
        for d, cast, back in (("float16", "__ushort_as_half", "__half_as_ushort"),
                              ("bfloat16", "__ushort_as_bfloat16", "__bfloat16_as_ushort"))}

    # vectorize_rows.py tested the address aligned to the vector (capped at 16 bytes):
    # a plain load, 16 bytes per chunk (8 half words in a uint4, 4 floats in a float4).
    ALIGNED_VECTOR_LOAD = "const {vtype} {name} = *reinterpret_cast<const {vtype}*>(&{root}[{index}]);"
    VECTOR_CHUNKS = {(d, 8): ("uint4", 8, element) for d, (_, element) in VECTOR_TYPES.items()
                     if d != "float32"}
    # 16-bit pairs packed into 32-bit words; floats by four.
    VECTOR_STORES = {
        **{("float32", w): ("*reinterpret_cast<float4*>(&{root}[{index}]) = make_float4({values});",
                            4, "{x}") for w in (4, 8)},
        **{(d, w): (f"*reinterpret_cast<{v}*>(&{{root}}[{{index}}]) = make_{v}({{values}});", w,
                    f"(static_cast<unsigned>({bits}({{a}})) | "
                    f"(static_cast<unsigned>({bits}({{b}})) << 16))")
           for d, bits in (("float16", "__half_as_ushort"), ("bfloat16", "__bfloat16_as_ushort"))
           for w, v in ((4, "uint2"), (8, "uint4"))}}
    PACKED_STORES = frozenset(k for k in VECTOR_STORES if k[0] != "float32")

    # The pass proved the address aligned to the pair (a run-time test before the stores).
    PAIR_STORES = {
        "float16": "*reinterpret_cast<__half2*>(&{root}[{index}]) = __halves2half2({a}, {b});",
        "bfloat16": "*reinterpret_cast<__nv_bfloat162*>(&{root}[{index}]) = "
                    "__halves2bfloat162({a}, {b});",
        "float32": "*reinterpret_cast<float2*>(&{root}[{index}]) = make_float2({a}, {b});"}

    def statement(self, op: Op, depth: int) -> None:
        name = op.name
        if name == "cp_async":
            self.helpers_used.add("z_async")
            a = [self.ref(v) for v in op.operands]
            at = op.attrs
            if len(a) == 3:   # a byte count: the group's in-bounds prefix, zeros after it
                self.emit(f"metile_cp_async16_fill(&{at['dst']}[{a[0]}], &{at['src']}[{a[1]}], "
                          f"{a[2]});", depth)
            else:
                self.emit(f"metile_cp_async16(&{at['dst']}[{a[0]}], &{at['src']}[{a[1]}]);", depth)
        elif name == "cp_async_commit":
            self.emit("metile_cp_async_commit();", depth)
        elif name == "cp_async_wait":
            self.emit(f"metile_cp_async_wait<{op.attrs['pending']}>();", depth)
        elif name in ("wgmma", "wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_proxy_async"):
            self.helpers_used.add("wgmma")
            self.wgmma_statement(op, depth)
        elif name in TMA:
            self.helpers_used.add("z_tma")
            self.tma_statement(op, depth)
        else:
            super().statement(op, depth)

    def wgmma_statement(self, op: Op, depth: int) -> None:
        at = op.attrs
        if op.name == "wgmma" and at.get("desc_add"):   # passes/lower_mma_layout.py
            # each operand's descriptor: its array's start (loop-invariant) plus the
            # element offset in 16-byte units (offsets are multiples of 8 16-bit elements)
            def desc(arr, off, lbo, sbo):
                return (f"metile_wgmma_desc_add(metile_wgmma_desc({arr}, {lbo}, {sbo}), "
                        f"static_cast<unsigned>({off}) >> 3)")
            *offs, accumulate = (self.ref(v) for v in op.operands)
            db = desc(at["b"], offs[-1], at["b_lbo"], at["b_sbo"])
            if at.get("a_frag"):   # the left operand from registers
                fn, text = wgmma_product_ra(at["n"], at["dtype"], at["trans_b"])
                a = f"{at['a_frag']}[0].r"
            else:
                fn, text = wgmma_product(at["n"], at["dtype"], at["trans_b"])
                a = desc(at["a"], offs[0], at["a_lbo"], at["a_sbo"])
            self.products[fn] = text
            self.emit(f"{fn}({at['acc']}, {a}, {db}, {accumulate});", depth)
        elif op.name == "wgmma":
            fn, text = wgmma_product(at["n"], at["dtype"], at["trans_b"])
            self.products[fn] = text
            a, b = (self.ref(v) for v in op.operands[:2])
            # scale-d: 0 overwrites the accumulators (a GEMM's first product), 1 adds to them
            accumulate = self.ref(op.operands[2]) if len(op.operands) > 2 else "1"
            self.emit(f"{fn}({at['acc']}, metile_wgmma_desc(&{at['a']}[{a}], {at['a_lbo']}, "
                      f"{at['a_sbo']}), metile_wgmma_desc(&{at['b']}[{b}], {at['b_lbo']}, "
                      f"{at['b_sbo']}), {accumulate});", depth)
        elif op.name == "wgmma_fence":
            self.emit("metile_wgmma_fence();", depth)
        elif op.name == "wgmma_commit":
            self.emit("metile_wgmma_commit();", depth)
        elif op.name == "wgmma_wait":
            self.emit(f"metile_wgmma_wait<{at['pending']}>();", depth)
            # Only once nothing is in flight: touching the registers of a pending product
            # makes ptxas serialize every wgmma (C7514).
            for acc in at["acc"] if at["pending"] == 0 else ():
                self.emit(f"metile_wgmma_hold({acc});", depth)
        else:
            self.emit("metile_fence_proxy_async();", depth)

    def tma_statement(self, op: Op, depth: int) -> None:
        at = op.attrs
        a = [self.ref(v) for v in op.operands]
        smem = at["smem"]
        if op.name == "tma_prepare":
            n = len(at["roots"])
            slot = f"metile_tma_slot({TMA_SLOTS}, {128 * n})"
            self.emit("if (threadIdx.x < 32) {", depth)
            self.emit("if (threadIdx.x == 0) {", depth + 1)
            for i, (root, size) in enumerate(zip(at["roots"], at["sizes"])):
                index, inner, outer, ld = a[4 * i:4 * i + 4]
                self.emit(f"metile_tma_encode(&{smem}[{16 * i}], {TMA_TEMPLATE} + {128 * i}, "
                          f"&{root}[{index}], {inner}, {outer}, "
                          f"static_cast<long long>({ld}) * {size});", depth + 2)
            self.emit(f"for (int s = 0; s < {at['stages']}; ++s) metile_mbar_init(&{smem}[{16 * n} + s]);",
                      depth + 2)
            if at.get("empty"):
                self.emit(f"for (int s = 0; s < {at['stages']}; ++s) metile_mbar_init_count("
                          f"&{smem}[{16 * n + at['stages']} + s], {at['empty']});", depth + 2)
            # the barriers' initialization visible to the bulk copies' completions
            self.emit('asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");', depth + 2)
            self.emit("}", depth + 1)
            self.emit("__syncwarp();", depth + 1)
            for i in range(n):
                self.emit(f"metile_tma_publish({slot} + {128 * i}, &{smem}[{16 * i}]);", depth + 1)
            self.emit("if (threadIdx.x == 0) {", depth + 1)
            for i in range(n):
                self.emit(f"metile_tma_acquire({slot} + {128 * i});", depth + 2)
            self.emit("}", depth + 1)
            self.emit("}", depth)
        elif op.name in ("tma_release", "tma_empty_wait"):
            bar = f"&{smem}[{16 * at['maps'] + at['stages']} + {a[0]}]"
            if op.name == "tma_empty_wait":
                self.emit(f"metile_mbar_wait({bar}, {a[1]});", depth)
            else:   # lane 0 once the warp's lanes are all here
                self.emit("__syncwarp();", depth)
                self.emit(f"if ((threadIdx.x & 31u) == 0) metile_mbar_arrive({bar});", depth)
        elif op.name == "tma_expect":
            self.emit(f"metile_mbar_expect(&{smem}[{16 * at['maps']} + {a[0]}], {at['bytes']});", depth)
        elif op.name == "tma_copy":
            slot = f"metile_tma_slot({TMA_SLOTS}, {128 * at['maps']})"
            self.emit(f"metile_tma_load2d(&{at['dst']}[{a[0]}], {slot} + {128 * at['map']}, {a[1]}, "
                      f"{a[2]}, &{smem}[{16 * at['maps']} + {a[3]}]);", depth)
        else:
            self.emit(f"metile_mbar_wait(&{smem}[{16 * at['maps']} + {a[0]}], {a[1]});", depth)

    def declare(self, op: Op, depth: int) -> None:
        at = op.attrs
        if at["storage"] == "shared" and "offset" in at:
            # One dynamic buffer (lower_tiles._dynamic_shared_layout): more than the 48 KiB
            # of static shared memory, each array at its alignment.
            if not self.dynamic_declared:
                self.dynamic_declared = True
                self.emit("extern __shared__ __align__(1024) unsigned char metile_smem[];", depth)
            t = self.TYPES[at["dtype"].name]
            self.emit(f"{t}* const {at['name']} = reinterpret_cast<{t}*>(metile_smem + "
                      f"{at['offset']});", depth)
            return
        super().declare(op, depth)

    def render(self) -> tuple[str, str]:
        header, body = super().render()
        return header + "".join(t + "\n" for t in self.products.values()), body

    def fragment_op(self, op: Op, a: list[str], depth: int) -> None:
        at = op.attrs
        if op.name == "frag_load" and at.get("swizzle"):
            u, cm = at["swizzle"]
            self.helpers_used.update(("z_async", "z_ldmatrix_sw"))
            self.emit(f"metile_frag_load_sw<{at['ld']}, {u}, {cm}>({at['name']}[{at['index']}], "
                      f"&{at['root']}[{a[0]}], {a[1]}, {a[2]});", depth)
            return
        super().fragment_op(op, a, depth)

    def minmax(self, name, a, rt) -> str:
        # fmaxf/fminf have PropagateNan.NONE's rule (a NaN operand loses) in one FMNMX; the
        # generic compare-and-select is three instructions (attention's row maxima)
        if rt.dtype.name == "float32":
            return f"{'fmaxf' if name == 'maximum' else 'fminf'}({a[0]}, {a[1]})"
        return super().minmax(name, a, rt)

    def vector_load(self, op: Op, a: list[str], depth: int) -> None:
        self.helpers_used.add("vec")
        super().vector_load(op, a, depth)

    def fragment_type(self, role, dtype, shape) -> str:
        if tuple(shape) == (8, 8, 8):  # simdgroup_inline fragments
            self.helpers_used.add("frag8")
            return f"metile_frag8<{self.TYPES[dtype.name]}>"
        self.helpers_used.add("mma")
        if role == "acc":
            return "metile_frag_acc"
        if dtype.name == "float32":
            return f"metile_frag_{role}_tf32"
        return f"metile_frag_{role}<{self.TYPES[dtype.name]}>"

    def shared_decl(self, t: str, name: str, size: int, align: int) -> str:
        # Keeps fragment tiles aligned for wide loads.
        if align:
            return f"__shared__ __align__({align}) {t} {name}[{size}];"
        return super().shared_decl(t, name, size, align)

    def __init__(self, fn: Function, scalars: set[str] = frozenset()):
        super().__init__(fn)
        self.scalars = scalars
        self.products: dict[str, str] = {}
        self.dynamic_declared = False

    def bitcast(self, x: str, rt) -> str:
        self.helpers_used.add("bitcast")
        return super().bitcast(x, rt)

    def expr(self, op: Op) -> str:
        # MLX's cuda_kernel passes 0-d inputs (runtime scalars) as pointers.
        if op.name == "param" and op.attrs["name"] in self.scalars:
            return f"{op.attrs['name']}[0]"
        if op.name == "simd_reduce":
            self.helpers_used.add("warp")
            if op.attrs.get("lanes"):
                return (f"metile_lanes_{op.attrs['kind']}<{op.attrs['lanes']}>"
                        f"({self.ref(op.operands[0])})")
            if op.attrs.get("xor"):
                return _xor_reduce(op.attrs["kind"], op.attrs["xor"], self.ref(op.operands[0]))
        if op.name == "aligned16":
            address = f"&{op.attrs['root']}[{self.ref(op.operands[0])}]"
            size = op.attrs.get("bytes", 16)
            if size != 16:
                return f"((reinterpret_cast<unsigned long long>({address}) & {size - 1}ull) == 0)"
            self.helpers_used.add("z_async")
            return f"metile_aligned16({address})"
        if op.name == "block_all":
            return f"(__syncthreads_and({self.ref(op.operands[0])}) != 0)"
        if op.name == "warp_uniform":
            # the value lane 0 holds: ptxas then knows a role branch is warp-uniform (a
            # divergent-looking branch around wgmma serializes it, C7518)
            return f"__shfl_sync(0xffffffffu, {self.ref(op.operands[0])}, 0)"
        if op.name == "acc_coord":
            # element e of a metile_frag_acc: n=8 half e / 4, rows g and g + 8, column pairs
            e = op.attrs["e"]
            if op.attrs["axis"] == 0:
                return f"(static_cast<int>((threadIdx.x & 31u) >> 2) + {8 * ((e >> 1) & 1)})"
            return f"(static_cast<int>(threadIdx.x & 3u) * 2 + {8 * (e >> 2) + (e & 1)})"
        if op.name == "abs" and not op.results[0].type.dtype.is_float \
                and op.results[0].type.dtype.bits < 64:
            return f"abs({self.ref(op.operands[0])})"
        return super().expr(op)

def emit_cuda(fn: Function, scalars: set[str] = frozenset()) -> tuple[str, str]:
    """(header, body) of a thread-form function; `scalars` names the runtime
    scalar inputs (read through their pointer)."""
    return CUDAEmitter(fn, scalars).render()


def _xor_reduce(kind: str, masks, value: str) -> str:
    """`value` combined over the lanes l ^ m for each m of `masks` (butterfly steps)."""
    for m in masks:
        value = f"metile_xor_{kind}({value}, {m})"
    return value
