// A C++14 model of the Metal Shading Language API, as strict as Metal's own
// compiler where the MSL specification is clear, for checking (never running)
// kernel sources: `clang++ -std=c++14 -fsyntax-only` against this directory,
// ahead of the runtime shim's include/ on the include path
// (metile/runtime/msl_cpu/strict.py).  MSL is C++14, so the model and the
// shim headers it includes are C++14 too: the check makes every C++17+
// feature an error, in these headers as in the kernel.
//
// What it rejects that the runtime shim accepts:
//  * C++ after C++14 (if constexpr, structured bindings, fold expressions,
//    inline variables, concepts, ...): the runtime compiles as C++20;
//  * address spaces are distinct types: device, constant and threadgroup are
//    clang address spaces, so a pointer of one never converts to another or to
//    a thread pointer;
//  * math functions take floating-point arguments of one type (exp(int),
//    max(float, half), pow(half4, float) fail), integer functions integer
//    arguments of one type; a vector may meet a scalar of its own element type;
//  * simdgroup_load/store take a device or threadgroup pointer to exactly the
//    matrix's element type; simd_* collectives take scalars and vectors only;
//  * atomics operate on device or threadgroup atomic<T> with an explicit
//    memory order;
//  * vectors convert only explicitly (with -flax-vector-conversions=none):
//    no float4 -> float3, no int4 -> float4, no vector of another length.
//
// Declarations only: nothing here runs, so most functions have no body.  The
// scalar and vector types, as_type, numeric_limits and the vector constructors
// are the shim's own (types.h, vector_ctors.h): those already follow Metal's
// rules, except packed vectors, which are modelled here as element-aligned
// vectors so that a `device packed_float4` object converts like Metal's does
// (a C++ class cannot offer a conversion to an object in another address
// space).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

#include <metile_msl/abi.h>

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define threadgroup_imageblock __attribute__((address_space(3)))
#define thread
#define ray_data
#define object_data
#define kernel
#define METAL_FUNC inline
#define METAL_INTERNAL
#define METAL_ASM

// The shim's class-based packed vectors are defined under other names and
// replaced below (see the header comment).
#define packed_vec metile_strict_unused_packed_vec
#define packed_char2 metile_strict_unused_packed_char2
#define packed_char3 metile_strict_unused_packed_char3
#define packed_char4 metile_strict_unused_packed_char4
#define packed_uchar2 metile_strict_unused_packed_uchar2
#define packed_uchar3 metile_strict_unused_packed_uchar3
#define packed_uchar4 metile_strict_unused_packed_uchar4
#define packed_short2 metile_strict_unused_packed_short2
#define packed_short3 metile_strict_unused_packed_short3
#define packed_short4 metile_strict_unused_packed_short4
#define packed_ushort2 metile_strict_unused_packed_ushort2
#define packed_ushort3 metile_strict_unused_packed_ushort3
#define packed_ushort4 metile_strict_unused_packed_ushort4
#define packed_int2 metile_strict_unused_packed_int2
#define packed_int3 metile_strict_unused_packed_int3
#define packed_int4 metile_strict_unused_packed_int4
#define packed_uint2 metile_strict_unused_packed_uint2
#define packed_uint3 metile_strict_unused_packed_uint3
#define packed_uint4 metile_strict_unused_packed_uint4
#define packed_half2 metile_strict_unused_packed_half2
#define packed_half3 metile_strict_unused_packed_half3
#define packed_half4 metile_strict_unused_packed_half4
#define packed_float2 metile_strict_unused_packed_float2
#define packed_float3 metile_strict_unused_packed_float3
#define packed_float4 metile_strict_unused_packed_float4
#define packed_bfloat2 metile_strict_unused_packed_bfloat2
#define packed_bfloat3 metile_strict_unused_packed_bfloat3
#define packed_bfloat4 metile_strict_unused_packed_bfloat4
#include <metile_msl/types.h>
#undef packed_vec
#undef packed_char2
#undef packed_char3
#undef packed_char4
#undef packed_uchar2
#undef packed_uchar3
#undef packed_uchar4
#undef packed_short2
#undef packed_short3
#undef packed_short4
#undef packed_ushort2
#undef packed_ushort3
#undef packed_ushort4
#undef packed_int2
#undef packed_int3
#undef packed_int4
#undef packed_uint2
#undef packed_uint3
#undef packed_uint4
#undef packed_half2
#undef packed_half3
#undef packed_half4
#undef packed_float2
#undef packed_float3
#undef packed_float4
#undef packed_bfloat2
#undef packed_bfloat3
#undef packed_bfloat4

namespace metal {
template <typename T, int N>
using packed_vec = T __attribute__((ext_vector_type(N), aligned(sizeof(T))));
}
#define METILE_STRICT_PACKED(T, NAME)                 \
  typedef metal::packed_vec<T, 2> packed_##NAME##2; \
  typedef metal::packed_vec<T, 3> packed_##NAME##3; \
  typedef metal::packed_vec<T, 4> packed_##NAME##4;
METILE_STRICT_PACKED(char, char)
METILE_STRICT_PACKED(uchar, uchar)
METILE_STRICT_PACKED(short, short)
METILE_STRICT_PACKED(ushort, ushort)
METILE_STRICT_PACKED(int, int)
METILE_STRICT_PACKED(uint, uint)
METILE_STRICT_PACKED(half, half)
METILE_STRICT_PACKED(float, float)
METILE_STRICT_PACKED(bfloat, bfloat)
#undef METILE_STRICT_PACKED

#include "traits.h"
#include "math.h"
#include "simd.h"
#include "atomics.h"
#include "matrix.h"
#include <metile_msl/mlx_utils.h>
#include <metile_msl/vector_ctors.h>
#include <metile_msl/matrix_types.h>

// packed_float4(x, y, z, w) and friends: Metal's packed vectors construct like
// the aligned ones (the result converts to the packed type).
#define packed_char2(...) ::metile_rt::make_vec<char, 2>(__VA_ARGS__)
#define packed_char3(...) ::metile_rt::make_vec<char, 3>(__VA_ARGS__)
#define packed_char4(...) ::metile_rt::make_vec<char, 4>(__VA_ARGS__)
#define packed_uchar2(...) ::metile_rt::make_vec<uchar, 2>(__VA_ARGS__)
#define packed_uchar3(...) ::metile_rt::make_vec<uchar, 3>(__VA_ARGS__)
#define packed_uchar4(...) ::metile_rt::make_vec<uchar, 4>(__VA_ARGS__)
#define packed_short2(...) ::metile_rt::make_vec<short, 2>(__VA_ARGS__)
#define packed_short3(...) ::metile_rt::make_vec<short, 3>(__VA_ARGS__)
#define packed_short4(...) ::metile_rt::make_vec<short, 4>(__VA_ARGS__)
#define packed_ushort2(...) ::metile_rt::make_vec<ushort, 2>(__VA_ARGS__)
#define packed_ushort3(...) ::metile_rt::make_vec<ushort, 3>(__VA_ARGS__)
#define packed_ushort4(...) ::metile_rt::make_vec<ushort, 4>(__VA_ARGS__)
#define packed_int2(...) ::metile_rt::make_vec<int, 2>(__VA_ARGS__)
#define packed_int3(...) ::metile_rt::make_vec<int, 3>(__VA_ARGS__)
#define packed_int4(...) ::metile_rt::make_vec<int, 4>(__VA_ARGS__)
#define packed_uint2(...) ::metile_rt::make_vec<uint, 2>(__VA_ARGS__)
#define packed_uint3(...) ::metile_rt::make_vec<uint, 3>(__VA_ARGS__)
#define packed_uint4(...) ::metile_rt::make_vec<uint, 4>(__VA_ARGS__)
#define packed_half2(...) ::metile_rt::make_vec<half, 2>(__VA_ARGS__)
#define packed_half3(...) ::metile_rt::make_vec<half, 3>(__VA_ARGS__)
#define packed_half4(...) ::metile_rt::make_vec<half, 4>(__VA_ARGS__)
#define packed_float2(...) ::metile_rt::make_vec<float, 2>(__VA_ARGS__)
#define packed_float3(...) ::metile_rt::make_vec<float, 3>(__VA_ARGS__)
#define packed_float4(...) ::metile_rt::make_vec<float, 4>(__VA_ARGS__)
#define packed_bfloat2(...) ::metile_rt::make_vec<bfloat, 2>(__VA_ARGS__)
#define packed_bfloat3(...) ::metile_rt::make_vec<bfloat, 3>(__VA_ARGS__)
#define packed_bfloat4(...) ::metile_rt::make_vec<bfloat, 4>(__VA_ARGS__)
