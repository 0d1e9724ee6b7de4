// The helpers MLX prepends to every mx.fast.metal_kernel source (its
// kernels/utils.h with bf16.h, complex.h, defines.h and logging.h), ported so
// user kernels that call them compile here.  Ported from MLX (MIT license,
// Copyright Apple Inc.); kept close to the original so behaviour matches,
// including MLX's choice of index type (elem_to_loc with a uint element
// computes in uint).
#pragma once

// MLX's bf16.h says this too, so every MLX kernel sees it.
using namespace metal;

typedef half float16_t;
typedef bfloat bfloat16_t;

inline uint16_t bfloat16_to_uint16(const bfloat16_t x) { return as_type<uint16_t>(x); }
inline bfloat16_t uint16_to_bfloat16(const uint16_t x) { return as_type<bfloat16_t>(x); }

#define MTL_CONST constant
#define MLX_MTL_PRAGMA_UNROLL _Pragma("clang loop unroll(full)")
// clang rejects attributes on an explicit instantiation; the host name is
// irrelevant on the CPU (metile_lane_main is the entry point).
#define instantiate_kernel(name, func, ...) template decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;

static MTL_CONST constexpr int MAX_REDUCE_SPECIALIZED_DIMS = 4;
static MTL_CONST constexpr int REDUCE_N_READS = 4;
static MTL_CONST constexpr int REDUCE_N_WRITES = 4;
static MTL_CONST constexpr int SOFTMAX_N_READS = 4;
static MTL_CONST constexpr int RMS_N_READS = 4;
static MTL_CONST constexpr int RMS_LOOPED_LIMIT = 4096;

namespace mlx {
// MLX's logging stub for Metal versions without os_log.
struct os_log {
  constexpr os_log(const char*, const char*) {}
  template <typename... Args>
  void log_debug(const char*, Args...) const {}
  template <typename... Args>
  void log_info(const char*, Args...) const {}
  template <typename... Args>
  void log_error(const char*, Args...) const {}
  template <typename... Args>
  void log_fault(const char*, Args...) const {}
};
}  // namespace mlx

// complex.h, reduced to what kernels use: a value type with arithmetic.
template <typename T>
struct complex_t {
  using value_type = T;
  T real;
  T imag;
  constexpr complex_t() : real(0), imag(0) {}
  constexpr complex_t(T re, T im) : real(re), imag(im) {}
  template <typename U>
    requires metile_rt::is_arith_scalar<U>
  constexpr complex_t(U x) : real(static_cast<T>(x)), imag(0) {}
  template <typename U>
    requires(!std::is_same_v<U, T>)
  constexpr complex_t(complex_t<U> x) : real(static_cast<T>(x.real)), imag(static_cast<T>(x.imag)) {}
  constexpr complex_t(vec<T, 2> v) : real(v.x), imag(v.y) {}
  constexpr operator vec<T, 2>() const { return vec<T, 2>{real, imag}; }
  template <typename U>
    requires metile_rt::is_arith_scalar<U>
  constexpr explicit operator U() const { return static_cast<U>(real); }
};
using complex32_t = complex_t<half>;
using complex64_t = complex_t<float>;

template <typename T>
inline constexpr bool is_complex_v = false;
template <typename T>
inline constexpr bool is_complex_v<complex_t<T>> = true;

template <typename T>
constexpr complex_t<T> operator-(complex_t<T> x) { return {-x.real, -x.imag}; }
template <typename T>
constexpr bool operator>=(complex_t<T> a, complex_t<T> b) {
  return (a.real > b.real) || (a.real == b.real && a.imag >= b.imag);
}
template <typename T>
constexpr bool operator>(complex_t<T> a, complex_t<T> b) {
  return (a.real > b.real) || (a.real == b.real && a.imag > b.imag);
}
template <typename T>
constexpr bool operator<=(complex_t<T> a, complex_t<T> b) { return b >= a; }
template <typename T>
constexpr bool operator<(complex_t<T> a, complex_t<T> b) { return b > a; }
template <typename T>
constexpr bool operator==(complex_t<T> a, complex_t<T> b) { return a.real == b.real && a.imag == b.imag; }
template <typename T>
constexpr complex_t<T> operator+(complex_t<T> a, complex_t<T> b) { return {a.real + b.real, a.imag + b.imag}; }
template <typename T>
constexpr complex_t<T>& operator+=(complex_t<T>& a, complex_t<T> b) {
  a.real += b.real;
  a.imag += b.imag;
  return a;
}
template <typename T>
constexpr complex_t<T> operator-(complex_t<T> a, complex_t<T> b) { return {a.real - b.real, a.imag - b.imag}; }
template <typename T>
constexpr complex_t<T> operator*(complex_t<T> a, complex_t<T> b) {
  return {a.real * b.real - a.imag * b.imag, a.real * b.imag + a.imag * b.real};
}
template <typename T>
constexpr complex_t<T> operator/(complex_t<T> a, complex_t<T> b) {
  auto denom = b.real * b.real + b.imag * b.imag;
  auto x = a.real * b.real + a.imag * b.imag;
  auto y = a.imag * b.real - a.real * b.imag;
  return {x / denom, y / denom};
}
#define METILE_COMPLEX_SCALAR_OP(op)                                                              \
  template <typename T, typename U>                                                              \
    requires metile_rt::is_arith_scalar<U>                                                       \
  constexpr complex_t<T> operator op(complex_t<T> a, U b) { return a op complex_t<T>(b); }       \
  template <typename T, typename U>                                                              \
    requires metile_rt::is_arith_scalar<U>                                                       \
  constexpr complex_t<T> operator op(U a, complex_t<T> b) { return complex_t<T>(a) op b; }
METILE_COMPLEX_SCALAR_OP(+)
METILE_COMPLEX_SCALAR_OP(-)
METILE_COMPLEX_SCALAR_OP(*)
METILE_COMPLEX_SCALAR_OP(/)
#undef METILE_COMPLEX_SCALAR_OP

template <typename U>
struct WorkPerThread {
  static_assert(sizeof(U) <= 8, "Type too large");
  static constexpr int constant n = 8 / sizeof(U);
};

template <typename U>
struct Limits {
  static constexpr U max = metal::numeric_limits<U>::max();
  static constexpr U min = metal::numeric_limits<U>::min();
  static constexpr U finite_max = metal::numeric_limits<U>::max();
  static constexpr U finite_min = metal::numeric_limits<U>::min();
};
#define METILE_FLOAT_LIMITS(type)                                                    \
  template <>                                                                        \
  struct Limits<type> {                                                              \
    static constexpr type max = metal::numeric_limits<type>::infinity();             \
    static constexpr type min = -metal::numeric_limits<type>::infinity();            \
    static constexpr type finite_max = metal::numeric_limits<type>::max();           \
    static constexpr type finite_min = -metal::numeric_limits<type>::max();          \
  };
METILE_FLOAT_LIMITS(half)
METILE_FLOAT_LIMITS(float)
METILE_FLOAT_LIMITS(bfloat16_t)
#undef METILE_FLOAT_LIMITS
template <>
struct Limits<bool> {
  static constexpr bool max = true;
  static constexpr bool min = false;
};
template <typename T>
struct Limits<complex_t<T>> {
  static constexpr complex_t<T> max =
      complex_t<T>(metal::numeric_limits<T>::infinity(), metal::numeric_limits<T>::infinity());
  static constexpr complex_t<T> min =
      complex_t<T>(-metal::numeric_limits<T>::infinity(), -metal::numeric_limits<T>::infinity());
};

// Indexing.  Stride pointers are templated on the stride type as well
// (MLX's older kernels pass size_t strides, current ones int64_t).
template <typename IdxT = int64_t, typename S>
METAL_FUNC IdxT elem_to_loc(IdxT elem, constant const int* shape, constant const S* strides, int ndim) {
  IdxT loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += (elem % shape[i]) * IdxT(strides[i]);
    elem /= shape[i];
  }
  return loc;
}

template <typename IdxT = int64_t, typename S>
METAL_FUNC IdxT elem_to_loc(uint3 elem, constant const int* shape, constant const S* strides, int ndim) {
  IdxT loc = elem.x * IdxT(strides[ndim - 1]) + elem.y * IdxT(strides[ndim - 2]);
  for (int d = ndim - 3; d >= 0; --d) {
    loc += (elem.z % shape[d]) * IdxT(strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

template <typename IdxT = int64_t>
METAL_FUNC IdxT elem_to_loc_1(uint elem, constant const int64_t& stride) {
  return elem * IdxT(stride);
}
template <typename IdxT = int64_t>
METAL_FUNC IdxT elem_to_loc_2(uint2 elem, constant const int64_t* strides) {
  return elem.x * IdxT(strides[1]) + elem.y * IdxT(strides[0]);
}
template <typename IdxT = int64_t>
METAL_FUNC IdxT elem_to_loc_3(uint3 elem, constant const int64_t* strides) {
  return elem.x * IdxT(strides[2]) + elem.y * IdxT(strides[1]) + elem.z * IdxT(strides[0]);
}

template <int NDIM, typename S>
METAL_FUNC S elem_to_loc_nd(uint elem, constant const int* shape, constant const S* strides) {
  S loc = (elem % shape[NDIM - 1]) * strides[NDIM - 1];
  for (int d = NDIM - 2; d >= 0; --d) {
    elem /= shape[d + 1];
    loc += (elem % shape[d]) * strides[d];
  }
  return loc;
}

template <typename IdxT = int64_t>
METAL_FUNC vec<IdxT, 2> elem_to_loc_2_nd(uint3 elem, constant const int* shape, constant const int64_t* a_strides,
                                         constant const int64_t* b_strides, int ndim) {
  vec<IdxT, 2> loc = {IdxT(elem.x * IdxT(a_strides[ndim - 1]) + IdxT(elem.y) * IdxT(a_strides[ndim - 2])),
                      IdxT(elem.x * IdxT(b_strides[ndim - 1]) + elem.y * IdxT(b_strides[ndim - 2]))};
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

template <typename IdxT = int64_t>
METAL_FUNC vec<IdxT, 3> elem_to_loc_3_nd(uint3 elem, constant const int* shape, constant const int64_t* a_strides,
                                         constant const int64_t* b_strides, constant const int64_t* c_strides,
                                         int ndim) {
  vec<IdxT, 3> loc = {IdxT(elem.x * IdxT(a_strides[ndim - 1])) + IdxT(elem.y * IdxT(a_strides[ndim - 2])),
                      IdxT(elem.x * IdxT(b_strides[ndim - 1])) + IdxT(elem.y * IdxT(b_strides[ndim - 2])),
                      IdxT(elem.x * IdxT(c_strides[ndim - 1])) + IdxT(elem.y * IdxT(c_strides[ndim - 2]))};
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    loc.z += l * IdxT(c_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}

template <int DIM, typename OffsetT = size_t, bool General = true>
struct LoopedElemToLoc {
  int dim;
  LoopedElemToLoc<DIM - 1, OffsetT, General> inner_looper;
  OffsetT offset{0};
  int index{0};

  LoopedElemToLoc(int dim) : dim(dim), inner_looper(dim - 1) {}

  void next(const constant int* shape, const constant int64_t* strides) {
    if (dim == 0) return;
    index++;
    offset += OffsetT(strides[dim - 1]);
    if (index >= shape[dim - 1]) {
      index = 0;
      inner_looper.next(shape, strides);
      offset = inner_looper.offset;
    }
  }

  void next(int n, const constant int* shape, const constant int64_t* strides) {
    if (dim == 0) return;
    index += n;
    offset += n * OffsetT(strides[dim - 1]);
    if (index >= shape[dim - 1]) {
      int extra = index - shape[dim - 1];
      if (extra >= shape[dim - 1]) {
        inner_looper.next(1 + extra / shape[dim - 1], shape, strides);
        extra = extra % shape[dim - 1];
      } else {
        inner_looper.next(shape, strides);
      }
      index = 0;
      offset = inner_looper.offset;
      if (extra > 0) next(extra, shape, strides);
    }
  }

  OffsetT location() { return offset; }
};

template <typename OffsetT>
struct LoopedElemToLoc<1, OffsetT, true> {
  int dim;
  OffsetT offset{0};
  uint index{0};

  LoopedElemToLoc(int dim) : dim(dim) {}

  void next(const constant int* shape, const constant int64_t* strides) {
    index++;
    if (dim > 1)
      offset = elem_to_loc<OffsetT>(index, shape, strides, dim);
    else
      offset += OffsetT(strides[0]);
  }

  void next(int n, const constant int* shape, const constant int64_t* strides) {
    index += n;
    if (dim > 1)
      offset = elem_to_loc<OffsetT>(index, shape, strides, dim);
    else
      offset = index * OffsetT(strides[0]);
  }

  OffsetT location() { return offset; }
};

template <typename OffsetT>
struct LoopedElemToLoc<1, OffsetT, false> {
  OffsetT offset{0};

  LoopedElemToLoc(int) {}

  void next(const constant int*, const constant int64_t* strides) { offset += OffsetT(strides[0]); }
  void next(int n, const constant int*, const constant int64_t* strides) { offset += n * OffsetT(strides[0]); }

  OffsetT location() { return offset; }
};

template <typename T, typename U>
inline T ceildiv(T N, U M) {
  return (N + M - 1) / M;
}

// https://docs.oracle.com/cd/E19957-01/806-3568/ncg_goldberg.html#1202
inline float log1p(float x) {
  float xp1 = 1.0f + x;
  if (xp1 == Limits<float>::max) return Limits<float>::max;
  if (xp1 == 1.0f) return x;
  return x * (metal::log(xp1) / (xp1 - 1.0f));
}

inline bfloat16_t log1p(bfloat16_t x) {
  float xp1 = 1.0f + static_cast<float>(x);
  if (xp1 == Limits<float>::max) return Limits<bfloat16_t>::max;
  if (xp1 == 1.0f) return x;
  return bfloat16_t(static_cast<float>(x) * (metal::log(xp1) / (xp1 - 1.0f)));
}

// MLX's 64-bit/bool/complex SIMD shuffles.  The metal:: templates already
// handle these types; the non-template overloads are kept so that overload
// resolution matches MLX (an exact non-template match wins).
#define METILE_MLX_SHUFFLE(name)                                                                         \
  inline uint64_t name(uint64_t data, uint16_t delta, std::source_location loc = std::source_location::current()) { \
    return as_type<uint64_t>(metal::name(as_type<uint2>(data), delta, loc));                             \
  }                                                                                                      \
  inline int64_t name(int64_t data, uint16_t delta, std::source_location loc = std::source_location::current()) { \
    return as_type<int64_t>(metal::name(as_type<uint2>(data), delta, loc));                              \
  }                                                                                                      \
  inline bool name(bool data, uint16_t delta, std::source_location loc = std::source_location::current()) { \
    return metal::name(static_cast<uint32_t>(data), delta, loc);                                         \
  }                                                                                                      \
  inline complex64_t name(complex64_t data, uint16_t delta,                                              \
                          std::source_location loc = std::source_location::current()) {                  \
    return metal::name(data, delta, loc);                                                                \
  }
METILE_MLX_SHUFFLE(simd_shuffle_down)
METILE_MLX_SHUFFLE(simd_shuffle_up)
METILE_MLX_SHUFFLE(simd_shuffle)
#undef METILE_MLX_SHUFFLE

// std::conditional is not included with Metal
template <bool condition, typename T, typename U>
struct ConditionalType {
  using type = U;
};
template <typename T, typename U>
struct ConditionalType<true, T, U> {
  using type = T;
};

template <typename U, typename T>
inline U cast_to(T val) {
  return static_cast<U>(val);
}
template <>
inline bool cast_to<bool, float>(float val) {
  return (as_type<uint32_t>(val) & 0x7FFFFFFF) != 0;
}
template <>
inline bool cast_to<bool, bfloat16_t>(bfloat16_t val) {
  return (as_type<uint16_t>(val) & 0x7FFF) != 0;
}
template <>
inline bool cast_to<bool, complex64_t>(complex64_t val) {
  return cast_to<bool, float>(val.real) || cast_to<bool, float>(val.imag);
}
