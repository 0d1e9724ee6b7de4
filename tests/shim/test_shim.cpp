// Tests of the Metal shim (python/metile/runtime/msl_cpu/include): kernels
// written as MLX custom kernels would be, run on a small fiber scheduler
// (fiber_sched.h).  Built and run by tests/test_msl_shim.py; prints one line
// per failed check and exits nonzero if any failed.
// Host headers first: the shim's address-space macros (device, constant,
// thread) must not reach them, as in a kernel library.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "fiber_sched.h"

#include <metal_stdlib>
using namespace metal;

static int g_failures = 0;
#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
      ++g_failures;                                                        \
    }                                                                      \
  } while (0)

static bool close(float a, float b, float tol) { return std::fabs(a - b) <= tol * (1 + std::fabs(b)); }

#define U3(a) uint3((a)[0], (a)[1], (a)[2])

// ---------------------------------------------------------------------------
// Compile-time checks: overload resolution of typical kernel lines.

static_assert(std::is_same_v<decltype(max(1.0f, 2)), float>);
static_assert(std::is_same_v<decltype(max(half(1), 0)), half>);
static_assert(std::is_same_v<decltype(max(half(1), 0.0f)), float>);
static_assert(std::is_same_v<decltype(min(1u, 2u)), uint>);
static_assert(std::is_same_v<decltype(metal::max(1.0f, 0.0f)), float>);
static_assert(std::is_same_v<decltype(exp(half(1))), half>);
static_assert(std::is_same_v<decltype(exp(bfloat(1))), bfloat>);
static_assert(std::is_same_v<decltype(exp(1.0f)), float>);
static_assert(std::is_same_v<decltype(exp(1)), float>);
static_assert(std::is_same_v<decltype(abs(-3)), int>);
static_assert(std::is_same_v<decltype(clamp(float4(0), 0.0f, 1.0f)), float4>);
static_assert(std::is_same_v<decltype(pow(float4(2), 2.0f)), float4>);
static_assert(std::is_same_v<decltype(fast::exp(half4(0))), half4>);
static_assert(std::is_same_v<decltype(precise::sqrt(2.0f)), float>);
static_assert(std::is_same_v<decltype(dot(float3(1), float3(2))), float>);
static_assert(std::is_same_v<decltype(select(1.0f, 2.0f, true)), float>);
static_assert(std::is_same_v<decltype(as_type<uint>(1.0f)), uint>);
static_assert(std::is_same_v<vec<float, 4>, float4>);
static_assert(sizeof(bool4) == 4 && sizeof(bool3) == 4);
static_assert(sizeof(float3) == 16 && alignof(float3) == 16 && sizeof(half4) == 8);
static_assert(sizeof(packed_float3) == 12);
static_assert(metal::is_floating_point_v<half> && metal::is_floating_point_v<bfloat>);
static_assert(Limits<float>::max == __builtin_inff());
static_assert(numeric_limits<half>::max() == half(65504.0f));
static_assert(numeric_limits<bfloat>::lowest() < bfloat(-1e38f));
constexpr float4 kConstVec = float4(1, 2, 3, 4);  // constexpr construction

// A user's own non-template function wins over the shim's template.
static float erf(float) { return 42.0f; }

// ---------------------------------------------------------------------------
// Host-only value checks (no lanes needed).

static void test_values() {
  int4 i4 = int4(1, -2, 3, 2000000000);
  float4 f4 = float4(i4);  // converts, does not reinterpret
  CHECK(f4.x == 1.0f && f4.y == -2.0f && f4.w == 2e9f);
  float4 a = float4(1, 2, 3, 4), b = float4(5, 6, 7, 8);
  float4 c = float4(a.xy, b.zw);
  CHECK(c.x == 1 && c.y == 2 && c.z == 7 && c.w == 8);
  float4 d = float4(a.xyz, 9.0f);
  CHECK(d.z == 3 && d.w == 9);
  float4 e = float4(2.5f);
  CHECK(e.x == 2.5f && e.w == 2.5f);
  float2 f = float2(1, 2.5);
  CHECK(f.y == 2.5f);
  CHECK(all(float4() == 0.0f));
  uint2 u = uint2(float2(3.7f, 1.2f));
  CHECK(u.x == 3 && u.y == 1);
  half4 h = half4(a);
  CHECK(float(h.w) == 4.0f);
  bfloat4 bf = bfloat4(a * 1.001f);
  CHECK(float(bf.x) == 1.0f);  // 1.001 rounds to 1 in bfloat
  CHECK(a.wzyx.x == 4 && a.rgba.g == 2);
  a.xy = float2(7, 8);
  CHECK(a.x == 7 && a.y == 8);

  // comparisons, select, all, any
  float4 x = float4(1, 5, 3, 0), y = float4(2, 2, 2, 2);
  float4 s = select(x, y, x < y);
  CHECK(s.x == 2 && s.y == 5 && s.z == 3 && s.w == 2);
  bool4 m = bool4(x < y);
  CHECK(m.x && !m.y && !m.z && m.w);
  CHECK(any(x < y) && !all(x < y) && all(x < 10.0f));
  CHECK(any(isnan(float4(0, NAN, 0, 0))) && !any(isinf(float4(1))));
  CHECK(all(select(float4(0), float4(1), bool4(true, true, true, true)) == 1.0f));

  // half / bfloat rounding after each operation
  half h1 = half(2048), one = half(1);
  CHECK(float(h1 + one) == 2048.0f);  // 2049 is not a half
  CHECK(as_type<ushort>(half(1.0f / 3.0f)) == 0x3555);
  half third = one / half(3);
  CHECK(as_type<ushort>(third) == 0x3555);
  CHECK(float(1.5h) == 1.5f);
  bfloat b1 = bfloat(1.0f);
  CHECK(float(b1 + bfloat(0.001f)) == 1.0f);
  CHECK(as_type<ushort>(bfloat(3.0f)) == 0x4040);
  half hx = half(0.1f);
  CHECK(float(exp(hx)) == float(half(std::exp(float(hx)))));

  // math
  CHECK(max(1.0f, 2) == 2.0f && min(3u, 2u) == 2u && abs(-3) == 3);
  CHECK(max(NAN, 1.0f) == 1.0f);  // fmax semantics
  CHECK(clamp(5, 0, 3) == 3 && clamp(float4(-1, 0.5f, 2, 1), 0.0f, 1.0f).z == 1.0f);
  CHECK(close(pow(2.0f, 10), 1024.0f, 1e-6f) && close(exp2(3.0f), 8.0f, 1e-6f));
  CHECK(close(rsqrt(4.0f), 0.5f, 1e-6f) && fract(-0.25f) == 0.75f);
  CHECK(close(metal::precise::tanh(0.5f), std::tanh(0.5f), 1e-6f));
  CHECK(erf(1.0f) == 42.0f && close(metal::erf(1.0f), 0.8427008f, 1e-6f));
  CHECK(log1p(0.0f) == 0.0f && close(log1p(1e-3f), std::log1p(1e-3f), 1e-6f));
  CHECK(popcount(0xF0u) == 4 && clz(1u) == 31 && ctz(8u) == 3 && clz(0u) == 32);
  CHECK(close(length(float3(3, 4, 0)), 5.0f, 1e-6f) && cross(float3(1, 0, 0), float3(0, 1, 0)).z == 1.0f);
  CHECK(sign(-2.0f) == -1.0f && step(1.0f, 2.0f) == 1.0f && mix(0.0f, 10.0f, 0.25f) == 2.5f);
  int ex;
  CHECK(frexp(8.0f, ex) == 0.5f && ex == 4 && ldexp(0.5f, 4) == 8.0f);
  float ip;
  CHECK(modf(2.75f, ip) == 0.75f && ip == 2.0f);
  CHECK(nextafter(half(1), half(2)) > half(1) && float(nextafter(half(1), half(2))) == 1.0f + 1.0f / 1024);
  CHECK(as_type<float>(as_type<uint>(1.5f)) == 1.5f);
  CHECK(ceildiv(10, 3) == 4);
  CHECK(fmod(7.5f, 2.0f) == 1.5f && atan2(1.0f, 1.0f) > 0.78f);
  packed_float3 pf = float3(1, 2, 3);
  float3 back = pf;
  CHECK(back.z == 3 && pf.y == 2);
}

// ---------------------------------------------------------------------------
// The exp example of MLX's custom-kernel docs.

template <typename T>
[[kernel]] void custom_kernel_myexp(const device T* inp [[buffer(0)]], const constant int* inp_shape [[buffer(1)]],
                                    const constant int64_t* inp_strides [[buffer(2)]],
                                    const constant int& inp_ndim [[buffer(3)]], device T* out [[buffer(4)]],
                                    uint3 thread_position_in_grid [[thread_position_in_grid]]) {
  uint elem = thread_position_in_grid.x;
  uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
  T tmp = inp[loc];
  out[elem] = metal::exp(tmp);
}

static void lane_myexp(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  custom_kernel_myexp<half>((const half*)l->buffers[0], (const int*)l->buffers[1], (const int64_t*)l->buffers[2],
                            *(const int*)l->buffers[3], (half*)l->buffers[4], U3(l->thread_position_in_grid));
}

static void test_exp() {
  // A transposed 4x8 view of an 8x4 array.
  std::vector<half> in(32), out(32);
  for (int i = 0; i < 32; ++i) in[i] = half(i * 0.1f - 1.0f);
  int shape[2] = {4, 8}, ndim = 2;
  int64_t strides[2] = {1, 4};
  void* bufs[] = {in.data(), shape, strides, &ndim, out.data()};
  CHECK(testsched::run(lane_myexp, {{32, 1, 1}, {32, 1, 1}}, bufs) == "");
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 8; ++c)
      CHECK(float(out[r * 8 + c]) == float(half(std::exp(float(in[c * 4 + r])))));
}

// ---------------------------------------------------------------------------
// Softmax over rows: one threadgroup per row, simd_max/simd_sum and
// threadgroup memory for the cross-SIMD-group step.

[[kernel]] void softmax_kernel(const device float* inp [[buffer(0)]], device float* out [[buffer(1)]],
                               const constant int& n [[buffer(2)]],
                               uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]],
                               uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
                               uint threads_per_threadgroup_x [[threads_per_threadgroup]],
                               uint simdgroup_index_in_threadgroup [[simdgroup_index_in_threadgroup]],
                               uint thread_index_in_simdgroup [[thread_index_in_simdgroup]]) {
  // threadgroup float partial[32];  (as rewritten by the source generator)
  threadgroup float(&partial)[32] = ::metile_rt::tg_storage<float[32]>(0);
  threadgroup float& row_max = ::metile_rt::tg_storage<float>(1);
  uint row = threadgroup_position_in_grid.x;
  uint lid = thread_index_in_threadgroup;
  uint nsimd = (threads_per_threadgroup_x + 31) / 32;
  const device float* x = inp + row * n;
  float m = -INFINITY;
  for (int i = lid; i < n; i += threads_per_threadgroup_x) m = max(m, x[i]);
  m = simd_max(m);
  if (thread_index_in_simdgroup == 0) partial[simdgroup_index_in_threadgroup] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid == 0) {
    float mm = partial[0];
    for (uint s = 1; s < nsimd; ++s) mm = max(mm, partial[s]);
    row_max = mm;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  m = row_max;
  float sum = 0;
  for (int i = lid; i < n; i += threads_per_threadgroup_x) sum += fast::exp(x[i] - m);
  sum = simd_sum(sum);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (thread_index_in_simdgroup == 0) partial[simdgroup_index_in_threadgroup] = sum;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0;
  for (uint s = 0; s < nsimd; ++s) total += partial[s];
  for (int i = lid; i < n; i += threads_per_threadgroup_x) out[row * n + i] = exp(x[i] - m) / total;
}

static void lane_softmax(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  softmax_kernel((const float*)l->buffers[0], (float*)l->buffers[1], *(const int*)l->buffers[2],
                 U3(l->threadgroup_position_in_grid), l->thread_index_in_threadgroup, l->threads_per_threadgroup[0],
                 l->simdgroup_index_in_threadgroup, l->thread_index_in_simdgroup);
}

static void test_softmax() {
  const int rows = 3, n = 300;
  std::vector<float> in(rows * n), out(rows * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : in) v = nd(rng) * 3;
  int nn = n;
  void* bufs[] = {in.data(), out.data(), &nn};
  for (bool rev : {false, true}) {
    // 100 threads per group: the last SIMD-group has 4 live lanes.
    CHECK(testsched::run(lane_softmax, {{rows * 100, 1, 1}, {100, 1, 1}}, bufs, rev) == "");
    for (int r = 0; r < rows; ++r) {
      double mx = -1e30, s = 0;
      for (int i = 0; i < n; ++i) mx = std::max<double>(mx, in[r * n + i]);
      for (int i = 0; i < n; ++i) s += std::exp(in[r * n + i] - mx);
      for (int i = 0; i < n; ++i) CHECK(close(out[r * n + i], float(std::exp(in[r * n + i] - mx) / s), 1e-5f));
    }
  }
}

// ---------------------------------------------------------------------------
// SIMD-group collectives on a partial SIMD-group (40 threads: lanes 0..7 of
// the second SIMD-group are live).

[[kernel]] void simd_kernel(device int* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]]) {
  int v = int(lane) + 1;
  device int* o = out + tid * 17;
  o[0] = simd_sum(v);
  o[1] = simd_prefix_inclusive_sum(v);
  o[2] = simd_prefix_exclusive_sum(v);
  o[3] = simd_shuffle(v, 3);
  o[4] = simd_shuffle_xor(v, 1);
  o[5] = simd_shuffle_up(v, 2);
  o[6] = simd_shuffle_down(v, 2);
  o[7] = simd_broadcast_first(v);
  o[8] = int(uint64_t(simd_ballot(lane % 2 == 0)));
  o[9] = simd_all(v > 0) + 2 * simd_any(v > 7);
  o[10] = simd_is_first();
  o[11] = quad_sum(v);
  o[12] = simd_max(v * (lane % 5 == 3 ? 10 : 1));
  float4 fv = float4(float(lane), 1, 2, 3);
  o[13] = int(simd_sum(fv).x);
  o[14] = int(simd_shuffle_rotate_down(v, 1));
  o[15] = simd_product(lane < 4 ? v : 1) + int(simd_prefix_exclusive_product(half(2)));
  o[16] = simd_shuffle_and_fill_up(v, v + 100, 2);
  simdgroup_barrier(mem_flags::mem_none);
}

static void lane_simd(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  simd_kernel((int*)l->buffers[0], l->thread_index_in_threadgroup, l->thread_index_in_simdgroup);
}

static void test_simd() {
  std::vector<int> out(40 * 17, -1);
  void* bufs[] = {out.data()};
  CHECK(testsched::run(lane_simd, {{40, 1, 1}, {40, 1, 1}}, bufs) == "");
  for (int t = 0; t < 40; ++t) {
    int lane = t % 32, live = t < 32 ? 32 : 8;
    int* o = &out[t * 17];
    int v = lane + 1;
    CHECK(o[0] == live * (live + 1) / 2);
    CHECK(o[1] == v * (v + 1) / 2);
    CHECK(o[2] == lane * (lane + 1) / 2);
    CHECK(o[3] == 4);
    CHECK(o[4] == (lane ^ 1) + 1);
    CHECK(o[5] == (lane >= 2 ? v - 2 : v));
    CHECK(o[6] == (lane + 2 < live ? v + 2 : v));  // inactive source: own value
    CHECK(o[7] == 1);
    CHECK(o[8] == int(live == 32 ? 0x55555555u : 0x55u));
    CHECK(o[9] == 1 + 2 * (live > 7));
    CHECK(o[10] == (lane == 0));
    int q = lane & ~3;
    CHECK(o[11] == 4 * q + 10);
    int mx = 0;
    for (int j = 0; j < live; ++j) mx = std::max(mx, (j + 1) * (j % 5 == 3 ? 10 : 1));
    CHECK(o[12] == mx);
    CHECK(o[13] == live * (live - 1) / 2);
    CHECK(o[14] == (lane + 1 < live ? v + 1 : (live == 32 ? 1 : v)));
    if (lane < 15) CHECK(o[15] == 24 + (1 << lane));
    CHECK(o[16] == (lane >= 2 ? v - 2 : (live == 32 ? 30 + lane + 1 + 100 : v + 100)));  // 2^lane overflows half beyond
  }
}

// ---------------------------------------------------------------------------
// simdgroup_matrix GEMM: C = A * B, A is MxK, B is KxN, one SIMD-group per
// 8x8 output tile, staged through threadgroup memory.

template <typename T, typename U>
[[kernel]] void gemm_kernel(const device T* A [[buffer(0)]], const device T* B [[buffer(1)]],
                            device U* C [[buffer(2)]], const constant int& K [[buffer(3)]],
                            const constant int& N [[buffer(4)]],
                            uint3 tgid [[threadgroup_position_in_grid]],
                            uint sgid [[simdgroup_index_in_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]]) {
  // Two SIMD-groups per threadgroup, side by side along N.
  threadgroup T(&As)[8][8] = ::metile_rt::tg_storage<T[8][8]>(0);
  int row0 = tgid.y * 8, col0 = (tgid.x * 2 + sgid) * 8;
  simdgroup_matrix<U, 8, 8> acc = make_filled_simdgroup_matrix<U, 8, 8>(U(0));
  for (int k = 0; k < K; k += 8) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sgid == 0)
      for (int i = lane; i < 64; i += 32) As[i / 8][i % 8] = A[(row0 + i / 8) * K + k + i % 8];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_matrix<T, 8, 8> a, b;
    simdgroup_load(a, &As[0][0], 8);
    simdgroup_load(b, B, N, ulong2(col0, k));
    simdgroup_multiply_accumulate(acc, a, b, acc);
  }
  simdgroup_store(acc, C, N, ulong2(col0, row0));
  // The documented layout: lane l holds M[row][col], M[row][col+1].
  (void)acc.thread_elements()[1];
}

template <typename T, typename U>
static void lane_gemm(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  gemm_kernel<T, U>((const T*)l->buffers[0], (const T*)l->buffers[1], (U*)l->buffers[2], *(const int*)l->buffers[3],
                    *(const int*)l->buffers[4], U3(l->threadgroup_position_in_grid), l->simdgroup_index_in_threadgroup,
                    l->thread_index_in_simdgroup);
}

template <typename T, typename U>
static void test_gemm(float tol) {
  const int M = 16, K = 24, N = 32;
  std::vector<T> A(M * K), B(K * N);
  std::vector<U> C(M * N);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> ud(-1, 1);
  for (auto& v : A) v = T(ud(rng));
  for (auto& v : B) v = T(ud(rng));
  int k = K, n = N;
  void* bufs[] = {A.data(), B.data(), C.data(), &k, &n};
  // Grid: N/16 groups along x (2 SIMD-groups each), M/8 along y.
  CHECK(testsched::run(lane_gemm<T, U>, {{N / 16 * 64, M / 8, 1}, {64, 1, 1}}, bufs) == "");
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int kk = 0; kk < K; ++kk) ref += double(float(A[i * K + kk])) * double(float(B[kk * N + j]));
      CHECK(close(float(C[i * N + j]), float(ref), tol));
    }
}

// Transposed load/store and the lane layout.
[[kernel]] void layout_kernel(const device float* in [[buffer(0)]], device float* out [[buffer(1)]],
                              device float* elems [[buffer(2)]], uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  simdgroup_load(m, in, 8, ulong2(0, 0), true);
  elems[lane * 2] = m.thread_elements()[0];
  elems[lane * 2 + 1] = m.thread_elements()[1];
  simdgroup_store(m, out, 8);
}
static void lane_layout(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  layout_kernel((const float*)l->buffers[0], (float*)l->buffers[1], (float*)l->buffers[2],
                l->thread_index_in_simdgroup);
}
static void test_layout() {
  std::vector<float> in(64), out(64), elems(64);
  for (int i = 0; i < 64; ++i) in[i] = float(i);
  void* bufs[] = {in.data(), out.data(), elems.data()};
  CHECK(testsched::run(lane_layout, {{32, 1, 1}, {32, 1, 1}}, bufs) == "");
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) CHECK(out[r * 8 + c] == in[c * 8 + r]);
  for (int l = 0; l < 32; ++l) {
    int q = l / 4, row = (q & 4) + (l / 2) % 4, col = (q & 2) * 2 + (l % 2) * 2;
    CHECK(elems[l * 2] == in[col * 8 + row] && elems[l * 2 + 1] == in[(col + 1) * 8 + row]);
  }
  // A matrix multiply on a partial SIMD-group is an error.
  std::vector<float> A(64, 1.0f), C(8 * 16);
  int k = 8, n = 16;
  void* gbufs[] = {A.data(), A.data(), C.data(), &k, &n};
  CHECK(testsched::run(lane_gemm<float, float>, {{16, 1, 1}, {16, 1, 1}}, gbufs).find("32 threads") !=
        std::string::npos);
}

// ---------------------------------------------------------------------------
// Atomics on device and threadgroup memory.

[[kernel]] void atomic_kernel(device atomic<float>* fsum [[buffer(0)]], device atomic_int* isum [[buffer(1)]],
                              device atomic_uint* umax [[buffer(2)]], device int* tg_out [[buffer(3)]],
                              uint tid [[thread_index_in_threadgroup]], uint gid [[thread_position_in_grid]]) {
  threadgroup atomic_int& counter = ::metile_rt::tg_storage<atomic_int>(0);
  if (tid == 0) atomic_store_explicit(&counter, 0, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(fsum, 0.5f, memory_order_relaxed);
  atomic_fetch_add_explicit(&isum[gid % 2], 1, memory_order_relaxed);
  atomic_fetch_max_explicit(umax, gid, memory_order_relaxed);
  int expected = 0;
  atomic_compare_exchange_weak_explicit(&isum[2], &expected, 7, memory_order_relaxed, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0) tg_out[gid / 64] = atomic_load_explicit(&counter, memory_order_relaxed);
}
static void lane_atomic(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  atomic_kernel((atomic<float>*)l->buffers[0], (atomic_int*)l->buffers[1], (atomic_uint*)l->buffers[2],
                (int*)l->buffers[3], l->thread_index_in_threadgroup, l->thread_position_in_grid[0]);
}
static void test_atomics() {
  float fsum = 0;
  int isum[3] = {0, 0, 0}, tg_out[4] = {};
  uint umax = 0;
  void* bufs[] = {&fsum, isum, &umax, tg_out};
  CHECK(testsched::run(lane_atomic, {{200, 1, 1}, {64, 1, 1}}, bufs) == "");
  CHECK(fsum == 100.0f && isum[0] == 100 && isum[1] == 100 && isum[2] == 7 && umax == 199);
  CHECK(tg_out[0] == 64 && tg_out[3] == 8);
}

// ---------------------------------------------------------------------------
// Threadgroup memory beyond Metal's 32 KiB fails with a clear message.

[[kernel]] void big_tg_kernel(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float(&a)[6000] = ::metile_rt::tg_storage<float[6000]>(0);
  threadgroup float(&b)[4000] = ::metile_rt::tg_storage<float[4000]>(1);
  a[tid] = 1;
  b[tid] = 2;
  out[tid] = a[tid] + b[tid];
}
static void lane_big(metile_rt::Lane* l) {
  metile_rt::current_lane = l;
  big_tg_kernel((float*)l->buffers[0], l->thread_index_in_threadgroup);
}
static void test_tg_overflow() {
  float out[4];
  void* bufs[] = {out};
  std::string err = testsched::run(lane_big, {{4, 1, 1}, {4, 1, 1}}, bufs);
  CHECK(err.find("threadgroup memory") != std::string::npos && err.find("32 KiB") != std::string::npos);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  test_values();
  test_exp();
  test_softmax();
  test_simd();
  test_gemm<float, float>(1e-5f);
  test_gemm<half, float>(1e-5f);
  test_gemm<half, half>(2e-2f);
  test_gemm<bfloat, float>(1e-5f);
  test_layout();
  test_atomics();
  test_tg_overflow();
  if (g_failures) {
    std::printf("%d checks failed\n", g_failures);
    return 1;
  }
  std::printf("all shim tests passed\n");
  return 0;
}
