// Metal vector construction: `float4(x, y, z, w)`, `float4(a.xy, b.zw)`,
// `float4(v3, w)`, `float4(x)` (splat) and `float4(int4)` (element-wise
// conversion; clang's own cast would reinterpret the bits).
//
// Each vector type name is also a function-like macro.  A function-like
// macro only expands when the next token is `(`, so `float4 x;`,
// `device float4* p`, `sizeof(float4)`, `vec<float, 4>` and template
// arguments such as `as_type<float4>(x)` keep naming the type, while
// `float4(...)` becomes a call to metile_rt::make_vec.  Not covered (they
// need rewrite.py): `vec<T, N>(...)`, `static_cast<float4>(int4)`; and a
// qualified `metal::float4(...)` does not compile.
//
// Included last by metal_shim.h so the shim's own code never sees the macros.
#pragma once

#define bool2(...) ::metile_rt::make_vec<signed char, 2>(__VA_ARGS__)
#define bool3(...) ::metile_rt::make_vec<signed char, 3>(__VA_ARGS__)
#define bool4(...) ::metile_rt::make_vec<signed char, 4>(__VA_ARGS__)
#define char2(...) ::metile_rt::make_vec<char, 2>(__VA_ARGS__)
#define char3(...) ::metile_rt::make_vec<char, 3>(__VA_ARGS__)
#define char4(...) ::metile_rt::make_vec<char, 4>(__VA_ARGS__)
#define uchar2(...) ::metile_rt::make_vec<unsigned char, 2>(__VA_ARGS__)
#define uchar3(...) ::metile_rt::make_vec<unsigned char, 3>(__VA_ARGS__)
#define uchar4(...) ::metile_rt::make_vec<unsigned char, 4>(__VA_ARGS__)
#define short2(...) ::metile_rt::make_vec<short, 2>(__VA_ARGS__)
#define short3(...) ::metile_rt::make_vec<short, 3>(__VA_ARGS__)
#define short4(...) ::metile_rt::make_vec<short, 4>(__VA_ARGS__)
#define ushort2(...) ::metile_rt::make_vec<unsigned short, 2>(__VA_ARGS__)
#define ushort3(...) ::metile_rt::make_vec<unsigned short, 3>(__VA_ARGS__)
#define ushort4(...) ::metile_rt::make_vec<unsigned short, 4>(__VA_ARGS__)
#define int2(...) ::metile_rt::make_vec<int, 2>(__VA_ARGS__)
#define int3(...) ::metile_rt::make_vec<int, 3>(__VA_ARGS__)
#define int4(...) ::metile_rt::make_vec<int, 4>(__VA_ARGS__)
#define uint2(...) ::metile_rt::make_vec<unsigned int, 2>(__VA_ARGS__)
#define uint3(...) ::metile_rt::make_vec<unsigned int, 3>(__VA_ARGS__)
#define uint4(...) ::metile_rt::make_vec<unsigned int, 4>(__VA_ARGS__)
#define long2(...) ::metile_rt::make_vec<long, 2>(__VA_ARGS__)
#define long3(...) ::metile_rt::make_vec<long, 3>(__VA_ARGS__)
#define long4(...) ::metile_rt::make_vec<long, 4>(__VA_ARGS__)
#define ulong2(...) ::metile_rt::make_vec<unsigned long, 2>(__VA_ARGS__)
#define ulong3(...) ::metile_rt::make_vec<unsigned long, 3>(__VA_ARGS__)
#define ulong4(...) ::metile_rt::make_vec<unsigned long, 4>(__VA_ARGS__)
#define half2(...) ::metile_rt::make_vec<_Float16, 2>(__VA_ARGS__)
#define half3(...) ::metile_rt::make_vec<_Float16, 3>(__VA_ARGS__)
#define half4(...) ::metile_rt::make_vec<_Float16, 4>(__VA_ARGS__)
#define float2(...) ::metile_rt::make_vec<float, 2>(__VA_ARGS__)
#define float3(...) ::metile_rt::make_vec<float, 3>(__VA_ARGS__)
#define float4(...) ::metile_rt::make_vec<float, 4>(__VA_ARGS__)
#define bfloat2(...) ::metile_rt::make_vec<__bf16, 2>(__VA_ARGS__)
#define bfloat3(...) ::metile_rt::make_vec<__bf16, 3>(__VA_ARGS__)
#define bfloat4(...) ::metile_rt::make_vec<__bf16, 4>(__VA_ARGS__)
