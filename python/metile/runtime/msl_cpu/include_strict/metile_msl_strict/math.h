// Metal's function library (math, common, integer, relational, geometric) as
// declarations with Metal's argument rules: see traits.h for what each family
// accepts.  A call the rules refuse finds no matching function, which is how
// Metal's compiler reports it too.
#pragma once

#define METILE_FP1(name) \
  template <typename T>  \
  metile_strict::fp_common<T> name(T x);
#define METILE_FP2(name)            \
  template <typename T, typename U> \
  metile_strict::fp_common<T, U> name(T x, U y);
#define METILE_FP3(name)                        \
  template <typename T, typename U, typename V> \
  metile_strict::fp_common<T, U, V> name(T x, U y, V z);

// The floating-point functions that metal::fast:: and metal::precise:: repeat.
#define METILE_FP_FUNCTIONS                                                                                        \
  METILE_FP1(acos) METILE_FP1(acosh) METILE_FP1(asin) METILE_FP1(asinh) METILE_FP1(atan) METILE_FP1(atanh)         \
  METILE_FP1(cbrt) METILE_FP1(ceil) METILE_FP1(cos) METILE_FP1(cosh) METILE_FP1(cospi) METILE_FP1(exp)              \
  METILE_FP1(exp2) METILE_FP1(exp10) METILE_FP1(fabs) METILE_FP1(floor) METILE_FP1(fract) METILE_FP1(log)           \
  METILE_FP1(log2) METILE_FP1(log10) METILE_FP1(rint) METILE_FP1(round) METILE_FP1(rsqrt) METILE_FP1(sin)           \
  METILE_FP1(sinh) METILE_FP1(sinpi) METILE_FP1(sqrt) METILE_FP1(tan) METILE_FP1(tanh) METILE_FP1(tanpi)            \
  METILE_FP1(trunc) METILE_FP1(saturate) METILE_FP1(normalize)                                                      \
  METILE_FP2(atan2) METILE_FP2(copysign) METILE_FP2(divide) METILE_FP2(fdim) METILE_FP2(fmax) METILE_FP2(fmin)      \
  METILE_FP2(fmod) METILE_FP2(pow) METILE_FP2(powr) METILE_FP2(nextafter) METILE_FP2(step)                         \
  METILE_FP3(fma) METILE_FP3(mix) METILE_FP3(smoothstep) METILE_FP3(fmax3) METILE_FP3(fmin3) METILE_FP3(fmedian3)  \
  template <typename T>                                                                                             \
  metile_strict::fp_common<T> sincos(T x, thread T& cosval);                                                        \
  template <typename T, typename U>                                                                                 \
  metile_strict::elem_t<metile_strict::fp_common<T, U>> dot(T x, U y);                                              \
  template <typename T, typename U>                                                                                 \
  metile_strict::elem_t<metile_strict::fp_common<T, U>> distance(T x, U y);                                         \
  template <typename T>                                                                                             \
  metile_strict::elem_t<metile_strict::fp_common<T>> length(T x);                                                   \
  template <typename T>                                                                                             \
  metile_strict::elem_t<metile_strict::fp_common<T>> length_squared(T x);

namespace metal {
METILE_FP_FUNCTIONS
namespace fast {
METILE_FP_FUNCTIONS
}
namespace precise {
METILE_FP_FUNCTIONS
}

template <typename T>
metile_strict::fp_common<T> ldexp(T x, int e);
template <typename T, int N>
vec<T, N> ldexp(vec<T, N> x, vec<int, N> e);
template <typename T>
metile_strict::fp_common<T> frexp(T x, thread int& e);
template <typename T, int N>
vec<T, N> frexp(vec<T, N> x, thread vec<int, N>& e);
template <typename T>
metile_strict::fp_common<T> modf(T x, thread T& integral);
template <typename T>
vec<metile_strict::fp_common<T>, 3> cross(vec<T, 3> x, vec<T, 3> y);
template <typename T, typename U>
metile_strict::fp_common<T, U> reflect(T i, U n);
template <typename T, typename U, typename E>
metile_strict::fp_common<T, U> refract(T i, U n, E eta);
template <typename T, typename U, typename V>
metile_strict::fp_common<T, U, V> faceforward(T n, U i, V nref);
template <typename T>
metile_strict::fp_common<T> sign(T x);

// Common to floating-point and integer types (one kind per call).
template <typename T, typename U>
metile_strict::arith_common<T, U> max(T x, U y);
template <typename T, typename U>
metile_strict::arith_common<T, U> min(T x, U y);
template <typename T, typename U, typename V>
metile_strict::arith_common<T, U, V> clamp(T x, U lo, V hi);
template <typename T, typename U, typename V>
metile_strict::arith_common<T, U, V> max3(T x, U y, V z);
template <typename T, typename U, typename V>
metile_strict::arith_common<T, U, V> min3(T x, U y, V z);
template <typename T, typename U, typename V>
metile_strict::arith_common<T, U, V> median3(T x, U y, V z);
template <typename T>
metile_strict::arith_common<T> abs(T x);

// Integer functions.
#define METILE_INT1(name) \
  template <typename T>   \
  metile_strict::int_common<T> name(T x);
#define METILE_INT2(name)           \
  template <typename T, typename U> \
  metile_strict::int_common<T, U> name(T x, U y);
#define METILE_INT3(name)                       \
  template <typename T, typename U, typename V> \
  metile_strict::int_common<T, U, V> name(T x, U y, V z);
METILE_INT1(clz)
METILE_INT1(ctz)
METILE_INT1(popcount)
METILE_INT1(reverse_bits)
METILE_INT2(absdiff)
METILE_INT2(addsat)
METILE_INT2(subsat)
METILE_INT2(hadd)
METILE_INT2(rhadd)
METILE_INT2(mul24)
METILE_INT2(mulhi)
METILE_INT2(rotate)
METILE_INT3(mad24)
METILE_INT3(madhi)
METILE_INT3(madsat)
#undef METILE_INT1
#undef METILE_INT2
#undef METILE_INT3
template <typename T>
metile_strict::int_common<T> extract_bits(T x, uint offset, uint bits);
template <typename T, typename U>
metile_strict::int_common<T, U> insert_bits(T base, U insert, uint offset, uint bits);

// Relational functions.
template <typename T, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T>>::type>
R isnan(T x);
template <typename T, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T>>::type>
R isinf(T x);
template <typename T, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T>>::type>
R isfinite(T x);
template <typename T, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T>>::type>
R isnormal(T x);
template <typename T, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T>>::type>
R signbit(T x);
template <typename T, typename U, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T, U>>::type>
R isordered(T x, U y);
template <typename T, typename U, typename R = typename metile_strict::bool_of<metile_strict::fp_common<T, U>>::type>
R isunordered(T x, U y);
// all/any take Metal's bool vectors; clang's comparisons give integer masks
// where Metal gives bool vectors, so those are accepted too.
bool all(bool x);
bool any(bool x);
template <typename T, int N>
std::enable_if_t<std::is_integral<T>::value, bool> all(vec<T, N> x);
template <typename T, int N>
std::enable_if_t<std::is_integral<T>::value, bool> any(vec<T, N> x);
template <typename T>
std::enable_if_t<!metile_strict::is_vec<T> && std::is_arithmetic<T>::value, T> select(T a, T b, bool c);
template <typename T, int N, typename M>
std::enable_if_t<std::is_integral<M>::value, vec<T, N>> select(vec<T, N> a, vec<T, N> b, vec<M, N> c);
template <typename T, int N>
vec<T, N> select(vec<T, N> a, vec<T, N> b, bool c);

}  // namespace metal

#undef METILE_FP1
#undef METILE_FP2
#undef METILE_FP3
#undef METILE_FP_FUNCTIONS

// MSL's constants (<metal_math>'s macros); the shim may define some already.
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#ifndef HUGE_VALF
#define HUGE_VALF __builtin_huge_valf()
#endif
#ifndef HUGE_VALH
#define HUGE_VALH ((half)__builtin_inff())
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 3.40282346638528859812e+38f
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.40282346638528859812e+38f
#endif
#ifndef FLT_MIN
#define FLT_MIN 1.17549435082228750797e-38f
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 1.1920928955078125e-07f
#endif
#ifndef MAXHALF
#define MAXHALF ((half)65504.0f)
#endif
#ifndef HALF_MAX
#define HALF_MAX ((half)65504.0f)
#endif
#ifndef HALF_MIN
#define HALF_MIN ((half)6.103515625e-05f)
#endif
#ifndef HALF_EPSILON
#define HALF_EPSILON ((half)9.765625e-04f)
#endif
#ifndef M_PI_F
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
#endif
#ifndef M_PI_H
#define M_E_H ((half)M_E_F)
#define M_LOG2E_H ((half)M_LOG2E_F)
#define M_LOG10E_H ((half)M_LOG10E_F)
#define M_LN2_H ((half)M_LN2_F)
#define M_LN10_H ((half)M_LN10_F)
#define M_PI_H ((half)M_PI_F)
#define M_PI_2_H ((half)M_PI_2_F)
#define M_PI_4_H ((half)M_PI_4_F)
#define M_1_PI_H ((half)M_1_PI_F)
#define M_2_PI_H ((half)M_2_PI_F)
#define M_2_SQRTPI_H ((half)M_2_SQRTPI_F)
#define M_SQRT2_H ((half)M_SQRT2_F)
#define M_SQRT1_2_H ((half)M_SQRT1_2_F)
#endif
