// Names that mx.fast.metal_kernel makes visible to a kernel body and that
// kernels written for MLX call: the dtype spellings MLX's generated signature
// uses (float16_t, bfloat16_t), elem_to_loc (MLX's documented way to walk a
// strided input through `name_shape` / `name_strides` / `name_ndim`), Limits,
// ceildiv, log1p and two spelling macros.  Written for metile from the
// behaviour MLX documents; tests/test_mlx_utils.py checks each against NumPy.
//
// This file must stay valid MSL (no concepts, no std::): the strict Metal
// model (include_strict/) compiles kernels against it too.
#pragma once

using namespace metal;

typedef half float16_t;
typedef bfloat bfloat16_t;

#define MTL_CONST constant
#define MLX_MTL_PRAGMA_UNROLL _Pragma("clang loop unroll(full)")

// Offset in elements of the element with row-major position `elem` in an
// array of `ndim` dimensions.  The offset has the type of `elem` (MLX's
// rule: a `uint` index gives a `uint` offset, so an `int` index is what a
// view with negative strides needs).  The stride type is a parameter because
// older kernels declare size_t strides.
template <typename IdxT = int64_t, typename StrideT>
METAL_FUNC IdxT elem_to_loc(IdxT elem, constant const int* shape, constant const StrideT* strides, int ndim) {
  IdxT offset = 0;
  // Peel coordinates off the fastest-varying dimension first.
  for (int d = ndim - 1; d >= 0; --d) {
    IdxT extent = IdxT(shape[d]);
    offset += (elem % extent) * IdxT(strides[d]);
    elem /= extent;
  }
  return offset;
}

// The 3-D grid form: elem.x indexes the last dimension, elem.y the one
// before it, elem.z runs row-major over all leading dimensions.
template <typename IdxT = int64_t, typename StrideT>
METAL_FUNC IdxT elem_to_loc(uint3 elem, constant const int* shape, constant const StrideT* strides, int ndim) {
  IdxT offset = IdxT(elem.x) * IdxT(strides[ndim - 1]);
  if (ndim < 2) return offset;
  offset += IdxT(elem.y) * IdxT(strides[ndim - 2]);
  IdxT rest = IdxT(elem.z);
  for (int d = ndim - 3; d >= 0; --d) {
    IdxT extent = IdxT(shape[d]);
    offset += (rest % extent) * IdxT(strides[d]);
    rest /= extent;
  }
  return offset;
}

// The fixed-rank forms MLX also offers kernels (a kernel reading a 1-, 2- or 3-D input
// through its strides alone): position elem in a view of those strides, elem.x along the
// last dimension.  (They were missing: a kernel calling them did not compile.)
template <typename IdxT = int64_t>
METAL_FUNC IdxT elem_to_loc_1(uint elem, constant const int64_t& stride) {
  return IdxT(elem) * IdxT(stride);
}

template <typename IdxT = int64_t>
METAL_FUNC IdxT elem_to_loc_2(uint2 elem, constant const int64_t* strides) {  // (MLX: strides[2])
  return IdxT(elem.y) * IdxT(strides[0]) + IdxT(elem.x) * IdxT(strides[1]);
}

template <typename IdxT = int64_t>
METAL_FUNC IdxT elem_to_loc_3(uint3 elem, constant const int64_t* strides) {  // (MLX: strides[3])
  return IdxT(elem.z) * IdxT(strides[0]) + IdxT(elem.y) * IdxT(strides[1]) +
         IdxT(elem.x) * IdxT(strides[2]);
}

// MLX's Limits<T>: for floating types max/min are the infinities and
// finite_max/finite_min the largest finite magnitudes; for integers (and
// bool) all four are the type's range.
template <typename T, bool IsFloat = metal::is_floating_point<T>::value>
struct Limits {
  static constexpr T max = metal::numeric_limits<T>::max();
  static constexpr T min = metal::numeric_limits<T>::lowest();
  static constexpr T finite_max = metal::numeric_limits<T>::max();
  static constexpr T finite_min = metal::numeric_limits<T>::lowest();
};
template <typename T>
struct Limits<T, true> {
  static constexpr T max = metal::numeric_limits<T>::infinity();
  static constexpr T min = -metal::numeric_limits<T>::infinity();
  static constexpr T finite_max = metal::numeric_limits<T>::max();
  static constexpr T finite_min = metal::numeric_limits<T>::lowest();
};

template <typename T, typename U>
inline T ceildiv(T n, U d) {
  return (n + d - 1) / d;
}

// log(1 + x) without losing x when it is tiny: u = 1 + x rounds, and
// log(u) * x / (u - 1) cancels that rounding error to first order.
inline float log1p(float x) {
  float u = 1.0f + x;
  if (u == 1.0f) return x;
  if (u == metal::numeric_limits<float>::infinity()) return u;
  return metal::log(u) * (x / (u - 1.0f));
}
inline bfloat16_t log1p(bfloat16_t x) { return bfloat16_t(log1p(float(x))); }
