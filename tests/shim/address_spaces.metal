// Checked against the strict Metal model (include_strict/) by
// tests/test_msl_shim.py: must compile as is, and fail with each of
// `#define BAD 1..4` (pointers of the wrong address space, as Metal rejects them).
#include <metal_stdlib>
using namespace metal;

constant float kScale = 0.5f;

inline float load_device(const device float* p, uint i) { return p[i]; }

template <typename T>
[[kernel]] void good(const device T* inp [[buffer(0)]], const constant int* inp_shape [[buffer(1)]],
                     const constant int64_t* inp_strides [[buffer(2)]], const constant int& inp_ndim [[buffer(3)]],
                     device float* out [[buffer(4)]], device atomic<float>* acc [[buffer(5)]],
                     uint3 thread_position_in_grid [[thread_position_in_grid]],
                     uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float(&buf)[64] = ::metile_rt::tg_storage<float[64]>(0);
  threadgroup atomic_int& counter = ::metile_rt::tg_storage<atomic_int>(1);
  uint elem = thread_position_in_grid.x;
  auto loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
  float v = float(inp[loc]) * kScale;
  buf[lane] = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(acc, buf[0], memory_order_relaxed);
  simdgroup_float8x8 m;
  simdgroup_load(m, &buf[0], 8);
  simdgroup_multiply_accumulate(m, m, m, m);
  simdgroup_store(m, out, 8);
  threadgroup float* tp = &buf[1];
  device float* dp = out + 1;
  *dp = *tp + load_device(out, 0);
#if BAD == 1
  device float* bad = &buf[0];  // threadgroup -> device
#elif BAD == 2
  out[0] = load_device(&buf[0], 0);  // threadgroup pointer passed as device
#elif BAD == 3
  threadgroup float* bad = out;  // device -> threadgroup
#elif BAD == 4
  device int* bad = inp_shape;  // constant -> device
#endif
}

template [[host_name("good_float")]] [[kernel]] decltype(good<float>) good<float>;
