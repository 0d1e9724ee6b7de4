// The `metal::` function library: math, common, relational, geometric and
// integer functions, plus metal::fast:: and metal::precise:: (the same
// functions: the CPU computes every variant at full float precision).
//
// Every function is a constrained template, for two reasons: a user's own
// non-template function of the same name (a kernel that defines
// `float erf(float)`) always wins overload resolution instead of being
// ambiguous under `using namespace metal;`, and mixed argument types
// (`max(x, 0)`, `pow(v, 2.0f)`, `min(uint, int)`) resolve by one promotion
// rule (metile_rt::promote_t) instead of by overload sets that differ from
// Metal's in corner cases.  <cmath> is deliberately not included: it would put
// `exp(double)` & co. into the global namespace and make `exp(1)` ambiguous.
//
// half and bfloat compute in float and round the result, which matches the GPU
// to within its documented ULP bounds.  double arguments (an unsuffixed
// literal such as `exp(1.0)`) compute in double.
#pragma once

namespace metile_rt {

template <typename E>
using compute_t = std::conditional_t<std::is_same_v<E, double>, double, float>;

// Applies f element-wise in compute precision; R is the result type (scalar
// or vector), x has R's shape.
template <typename R, typename T, typename F>
inline R map1(const T& x, F f) {
  using E = elem_t<R>;
  using C = compute_t<E>;
  if constexpr (is_vec<R>) {
    R r;
    for (int i = 0; i < vec_size<R>; ++i) r[i] = static_cast<E>(f(static_cast<C>(x[i])));
    return r;
  } else {
    return static_cast<E>(f(static_cast<C>(x)));
  }
}

template <typename R, typename F>
inline R map2(const R& x, const R& y, F f) {
  using E = elem_t<R>;
  using C = compute_t<E>;
  if constexpr (is_vec<R>) {
    R r;
    for (int i = 0; i < vec_size<R>; ++i)
      r[i] = static_cast<E>(f(static_cast<C>(x[i]), static_cast<C>(y[i])));
    return r;
  } else {
    return static_cast<E>(f(static_cast<C>(x), static_cast<C>(y)));
  }
}

template <typename R, typename F>
inline R map3(const R& x, const R& y, const R& z, F f) {
  using E = elem_t<R>;
  using C = compute_t<E>;
  if constexpr (is_vec<R>) {
    R r;
    for (int i = 0; i < vec_size<R>; ++i)
      r[i] = static_cast<E>(f(static_cast<C>(x[i]), static_cast<C>(y[i]), static_cast<C>(z[i])));
    return r;
  } else {
    return static_cast<E>(f(static_cast<C>(x), static_cast<C>(y), static_cast<C>(z)));
  }
}

// Element-wise in the element type itself (integers; comparisons).
template <typename R, typename F>
inline R map_elem(const R& x, F f) {
  if constexpr (is_vec<R>) {
    R r;
    for (int i = 0; i < vec_size<R>; ++i) r[i] = f(elem_t<R>(x[i]));
    return r;
  } else {
    return f(x);
  }
}
template <typename R, typename F>
inline R map_elem2(const R& x, const R& y, F f) {
  if constexpr (is_vec<R>) {
    R r;
    for (int i = 0; i < vec_size<R>; ++i) r[i] = f(elem_t<R>(x[i]), elem_t<R>(y[i]));
    return r;
  } else {
    return f(x, y);
  }
}

// The result of a relational function: bool for a scalar, a comparison mask
// (what `x == x` gives) for a vector, so that it mixes with `a < b`.
template <typename T, typename F>
inline auto predicate(const T& x, F f) {
  if constexpr (is_vec<T>) {
    auto m = x != x;
    for (int i = 0; i < vec_size<T>; ++i) m[i] = f(static_cast<compute_t<elem_t<T>>>(x[i])) ? -1 : 0;
    return m;
  } else {
    return static_cast<bool>(f(static_cast<compute_t<T>>(x)));
  }
}

template <typename T>
inline bool truthy(const T& m, int i) {
  if constexpr (is_vec<T>)
    return m[i] != 0;
  else
    return static_cast<bool>(m);
}

template <typename T>
concept Integer = IntArith<T>;

}  // namespace metile_rt

namespace metal {

#define METILE_MATH1(name, ef, ed)                                             \
  template <::metile_rt::Arith T>                                              \
  inline ::metile_rt::float_of<T> name(T x) {                                  \
    return ::metile_rt::map1<::metile_rt::float_of<T>>(x, [](auto v) {        \
      if constexpr (sizeof(v) == 8)                                            \
        return ed;                                                             \
      else                                                                     \
        return ef;                                                             \
    });                                                                        \
  }
#define METILE_MATH2(name, ef, ed)                                             \
  template <::metile_rt::Arith A, ::metile_rt::Arith B>                        \
  inline ::metile_rt::float_of<::metile_rt::promote_t<A, B>> name(A a, B b) {  \
    using R = ::metile_rt::float_of<::metile_rt::promote_t<A, B>>;             \
    return ::metile_rt::map2<R>(::metile_rt::convert<R>(a),                    \
                                ::metile_rt::convert<R>(b), [](auto v, auto w) { \
                                  if constexpr (sizeof(v) == 8)                \
                                    return ed;                                 \
                                  else                                         \
                                    return ef;                                 \
                                });                                            \
  }

METILE_MATH1(exp, __builtin_expf(v), __builtin_exp(v))
METILE_MATH1(exp2, __builtin_exp2f(v), __builtin_exp2(v))
METILE_MATH1(exp10, __builtin_exp10f(v), __builtin_exp10(v))
METILE_MATH1(log, __builtin_logf(v), __builtin_log(v))
METILE_MATH1(log2, __builtin_log2f(v), __builtin_log2(v))
METILE_MATH1(log10, __builtin_log10f(v), __builtin_log10(v))
METILE_MATH1(sqrt, __builtin_sqrtf(v), __builtin_sqrt(v))
METILE_MATH1(rsqrt, 1.0f / __builtin_sqrtf(v), 1.0 / __builtin_sqrt(v))
METILE_MATH1(cbrt, __builtin_cbrtf(v), __builtin_cbrt(v))
METILE_MATH1(sin, __builtin_sinf(v), __builtin_sin(v))
METILE_MATH1(cos, __builtin_cosf(v), __builtin_cos(v))
METILE_MATH1(tan, __builtin_tanf(v), __builtin_tan(v))
METILE_MATH1(sinpi, __builtin_sinf(v * 3.14159265358979323846f), __builtin_sin(v * 3.14159265358979323846))
METILE_MATH1(cospi, __builtin_cosf(v * 3.14159265358979323846f), __builtin_cos(v * 3.14159265358979323846))
METILE_MATH1(tanpi, __builtin_tanf(v * 3.14159265358979323846f), __builtin_tan(v * 3.14159265358979323846))
METILE_MATH1(asin, __builtin_asinf(v), __builtin_asin(v))
METILE_MATH1(acos, __builtin_acosf(v), __builtin_acos(v))
METILE_MATH1(atan, __builtin_atanf(v), __builtin_atan(v))
METILE_MATH1(sinh, __builtin_sinhf(v), __builtin_sinh(v))
METILE_MATH1(cosh, __builtin_coshf(v), __builtin_cosh(v))
METILE_MATH1(tanh, __builtin_tanhf(v), __builtin_tanh(v))
METILE_MATH1(asinh, __builtin_asinhf(v), __builtin_asinh(v))
METILE_MATH1(acosh, __builtin_acoshf(v), __builtin_acosh(v))
METILE_MATH1(atanh, __builtin_atanhf(v), __builtin_atanh(v))
METILE_MATH1(floor, __builtin_floorf(v), __builtin_floor(v))
METILE_MATH1(ceil, __builtin_ceilf(v), __builtin_ceil(v))
METILE_MATH1(round, __builtin_roundf(v), __builtin_round(v))
METILE_MATH1(rint, __builtin_rintf(v), __builtin_rint(v))
METILE_MATH1(trunc, __builtin_truncf(v), __builtin_trunc(v))
METILE_MATH1(fabs, __builtin_fabsf(v), __builtin_fabs(v))
METILE_MATH1(fract, __builtin_fminf(v - __builtin_floorf(v), 0x1.fffffep-1f),
             __builtin_fmin(v - __builtin_floor(v), 0x1.fffffffffffffp-1))
METILE_MATH1(saturate, __builtin_fminf(__builtin_fmaxf(v, 0.0f), 1.0f),
             __builtin_fmin(__builtin_fmax(v, 0.0), 1.0))
// Not in Metal's library, but common enough in ported code (MLX defines its
// own erf/erfinv in erf.h; a user definition wins over these templates).
METILE_MATH1(erf, __builtin_erff(v), __builtin_erf(v))
METILE_MATH1(erfc, __builtin_erfcf(v), __builtin_erfc(v))

METILE_MATH2(pow, __builtin_powf(v, w), __builtin_pow(v, w))
METILE_MATH2(powr, __builtin_powf(v, w), __builtin_pow(v, w))
METILE_MATH2(atan2, __builtin_atan2f(v, w), __builtin_atan2(v, w))
METILE_MATH2(fmod, __builtin_fmodf(v, w), __builtin_fmod(v, w))
METILE_MATH2(fmin, __builtin_fminf(v, w), __builtin_fmin(v, w))
METILE_MATH2(fmax, __builtin_fmaxf(v, w), __builtin_fmax(v, w))
METILE_MATH2(fdim, __builtin_fdimf(v, w), __builtin_fdim(v, w))
METILE_MATH2(copysign, __builtin_copysignf(v, w), __builtin_copysign(v, w))
METILE_MATH2(divide, v / w, v / w)
#undef METILE_MATH1
#undef METILE_MATH2

// nextafter must step in the argument's own format, not in float.
template <metile_rt::FloatArith A, metile_rt::Arith B>
inline metile_rt::promote_t<A, B> nextafter(A a, B b) {
  using R = metile_rt::promote_t<A, B>;
  return metile_rt::map_elem2<R>(metile_rt::convert<R>(a), metile_rt::convert<R>(b), [](auto x, auto y) {
    using E = decltype(x);
    if constexpr (std::is_same_v<E, float>) {
      return __builtin_nextafterf(x, y);
    } else if constexpr (std::is_same_v<E, double>) {
      return __builtin_nextafter(x, y);
    } else {
      if (x != x || y != y) return static_cast<E>(x + y);
      if (x == y) return y;
      unsigned short bits = __builtin_bit_cast(unsigned short, x);
      if ((bits & 0x7fff) == 0) return __builtin_bit_cast(E, (unsigned short)((y > x ? 0 : 0x8000) | 1));
      bool up = (y > x) == !(bits & 0x8000);
      return __builtin_bit_cast(E, (unsigned short)(up ? bits + 1 : bits - 1));
    }
  });
}

template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::float_of<metile_rt::promote_t<A, B, C>> fma(A a, B b, C c) {
  using R = metile_rt::float_of<metile_rt::promote_t<A, B, C>>;
  using E = metile_rt::elem_t<R>;
  if constexpr (sizeof(E) == 2) {
    // 16-bit floats rounded once, as Metal's half fma: in double (map3 would compute in
    // float, whose rounding of 3 * 683 + 2^-24 to 2049 left a tie that half broke down)
    const R x = metile_rt::convert<R>(a), y = metile_rt::convert<R>(b), z = metile_rt::convert<R>(c);
    auto one = [](E p, E q, E r) {
      return static_cast<E>(__builtin_fma(static_cast<double>(p), static_cast<double>(q),
                                          static_cast<double>(r)));
    };
    if constexpr (metile_rt::is_vec<R>) {
      R out;
      for (int i = 0; i < metile_rt::vec_size<R>; ++i) out[i] = one(x[i], y[i], z[i]);
      return out;
    } else {
      return one(x, y, z);
    }
  }
  return metile_rt::map3<R>(metile_rt::convert<R>(a), metile_rt::convert<R>(b), metile_rt::convert<R>(c),
                            [](auto x, auto y, auto z) {
                              if constexpr (sizeof(x) == 8)
                                return __builtin_fma(x, y, z);
                              else
                                return __builtin_fmaf(x, y, z);
                            });
}

template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::float_of<metile_rt::promote_t<A, B, C>> mix(A x, B y, C a) {
  using R = metile_rt::float_of<metile_rt::promote_t<A, B, C>>;
  return metile_rt::map3<R>(metile_rt::convert<R>(x), metile_rt::convert<R>(y), metile_rt::convert<R>(a),
                            [](auto u, auto v, auto t) { return u + (v - u) * t; });
}

template <metile_rt::Arith A, metile_rt::Arith B>
inline metile_rt::float_of<metile_rt::promote_t<A, B>> step(A edge, B x) {
  using R = metile_rt::float_of<metile_rt::promote_t<A, B>>;
  return metile_rt::map2<R>(metile_rt::convert<R>(edge), metile_rt::convert<R>(x),
                            [](auto e, auto v) { return v < e ? decltype(v)(0) : decltype(v)(1); });
}

template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::float_of<metile_rt::promote_t<A, B, C>> smoothstep(A e0, B e1, C x) {
  using R = metile_rt::float_of<metile_rt::promote_t<A, B, C>>;
  return metile_rt::map3<R>(metile_rt::convert<R>(e0), metile_rt::convert<R>(e1), metile_rt::convert<R>(x),
                            [](auto a, auto b, auto v) {
                              using C2 = decltype(v);
                              C2 t = (v - a) / (b - a);
                              t = t < 0 ? C2(0) : (t > 1 ? C2(1) : t);
                              return t * t * (C2(3) - C2(2) * t);
                            });
}

template <metile_rt::Arith T>
inline metile_rt::float_of<T> sign(T x) {
  return metile_rt::map1<metile_rt::float_of<T>>(x, [](auto v) {
    using C = decltype(v);
    return v > 0 ? C(1) : (v < 0 ? C(-1) : (v == 0 ? v : C(0)));
  });
}

// abs keeps integer types (Metal's abs on int returns int); fabs does not
// take integers on Metal either.
template <metile_rt::Arith T>
inline std::remove_cvref_t<T> abs(T x) {
  using R = std::remove_cvref_t<T>;
  if constexpr (metile_rt::is_float_scalar<metile_rt::elem_t<R>>)
    return metile_rt::map1<R>(x, [](auto v) {
      if constexpr (sizeof(v) == 8)
        return __builtin_fabs(v);
      else
        return __builtin_fabsf(v);
    });
  else
    return metile_rt::map_elem<R>(x, [](auto v) { return static_cast<decltype(v)>(v < 0 ? -v : v); });
}

// min/max keep the (promoted) argument type, floating or integer; on
// floats they are fmin/fmax (a NaN argument loses), as on Metal.
template <metile_rt::Arith A, metile_rt::Arith B>
inline metile_rt::promote_t<A, B> max(A a, B b) {
  using R = metile_rt::promote_t<A, B>;
  if constexpr (metile_rt::is_float_scalar<metile_rt::elem_t<R>>)
    return fmax(metile_rt::convert<R>(a), metile_rt::convert<R>(b));
  else
    return metile_rt::map_elem2<R>(metile_rt::convert<R>(a), metile_rt::convert<R>(b),
                                   [](auto x, auto y) { return x < y ? y : x; });
}
template <metile_rt::Arith A, metile_rt::Arith B>
inline metile_rt::promote_t<A, B> min(A a, B b) {
  using R = metile_rt::promote_t<A, B>;
  if constexpr (metile_rt::is_float_scalar<metile_rt::elem_t<R>>)
    return fmin(metile_rt::convert<R>(a), metile_rt::convert<R>(b));
  else
    return metile_rt::map_elem2<R>(metile_rt::convert<R>(a), metile_rt::convert<R>(b),
                                   [](auto x, auto y) { return y < x ? y : x; });
}
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::promote_t<A, B, C> clamp(A x, B lo, C hi) {
  using R = metile_rt::promote_t<A, B, C>;
  return min(max(metile_rt::convert<R>(x), metile_rt::convert<R>(lo)), metile_rt::convert<R>(hi));
}
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::promote_t<A, B, C> max3(A x, B y, C z) {
  return max(max(x, y), z);
}
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::promote_t<A, B, C> min3(A x, B y, C z) {
  return min(min(x, y), z);
}
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline metile_rt::promote_t<A, B, C> median3(A x, B y, C z) {
  return max(min(x, y), min(max(x, y), z));
}
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline auto fmax3(A x, B y, C z) { return fmax(fmax(x, y), z); }
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline auto fmin3(A x, B y, C z) { return fmin(fmin(x, y), z); }
template <metile_rt::Arith A, metile_rt::Arith B, metile_rt::Arith C>
inline auto fmedian3(A x, B y, C z) { return fmax(fmin(x, y), fmin(fmax(x, y), z)); }

template <metile_rt::FloatArith T>
inline T sincos(T x, thread T& cosval) {
  cosval = cos(x);
  return sin(x);
}
template <metile_rt::FloatArith T>
inline T modf(T x, thread T& intpart) {
  intpart = trunc(x);
  return metile_rt::map2<T>(x, intpart, [](auto v, auto i) {
    return __builtin_isinf(v) ? __builtin_copysignf(0.0f, v) : v - i;
  });
}

template <metile_rt::FloatArith T, typename I>
inline T frexp(T x, thread I& exponent) {
  if constexpr (metile_rt::is_vec<T>) {
    T r;
    for (int i = 0; i < metile_rt::vec_size<T>; ++i) {
      int e;
      r[i] = static_cast<metile_rt::elem_t<T>>(__builtin_frexpf(static_cast<float>(x[i]), &e));
      exponent[i] = e;
    }
    return r;
  } else {
    int e;
    T r = static_cast<T>(__builtin_frexp(static_cast<double>(x), &e));
    exponent = e;
    return r;
  }
}

template <metile_rt::FloatArith T, metile_rt::IntArith K>
inline T ldexp(T x, K k) {
  if constexpr (metile_rt::is_vec<T>) {
    T r;
    for (int i = 0; i < metile_rt::vec_size<T>; ++i)
      r[i] = static_cast<metile_rt::elem_t<T>>(
          __builtin_ldexp(static_cast<double>(x[i]), static_cast<int>(metile_rt::is_vec<K> ? k[i] : k)));
    return r;
  } else {
    return static_cast<T>(__builtin_ldexp(static_cast<double>(x), static_cast<int>(k)));
  }
}

// Relational functions.
template <metile_rt::FloatArith T>
inline auto isnan(T x) { return metile_rt::predicate(x, [](auto v) { return v != v; }); }
template <metile_rt::FloatArith T>
inline auto isinf(T x) { return metile_rt::predicate(x, [](auto v) { return __builtin_isinf(v); }); }
template <metile_rt::FloatArith T>
inline auto isfinite(T x) { return metile_rt::predicate(x, [](auto v) { return __builtin_isfinite(v); }); }
template <metile_rt::FloatArith T>
inline auto isnormal(T x) {
  // Normality depends on the format: a small float may be a half subnormal.
  if constexpr (metile_rt::is_vec<T>) {
    auto m = x != x;
    for (int i = 0; i < metile_rt::vec_size<T>; ++i) m[i] = isnormal(metile_rt::elem_t<T>(x[i])) ? -1 : 0;
    return m;
  } else {
    T a = x < T(0) ? T(-x) : x;
    return a >= metal::numeric_limits<T>::min() && a <= metal::numeric_limits<T>::max();
  }
}
template <metile_rt::FloatArith T>
inline auto signbit(T x) { return metile_rt::predicate(x, [](auto v) { return __builtin_signbit(v) != 0; }); }
template <metile_rt::FloatArith T>
inline auto isordered(T x, T y) { return (x == x) && (y == y); }
template <metile_rt::FloatArith T>
inline auto isunordered(T x, T y) { return (x != x) || (y != y); }

template <typename T>
inline bool all(T m) {
  if constexpr (metile_rt::is_vec<T>) {
    for (int i = 0; i < metile_rt::vec_size<T>; ++i)
      if (!(m[i] != 0)) return false;
    return true;
  } else {
    return static_cast<bool>(m);
  }
}
template <typename T>
inline bool any(T m) {
  if constexpr (metile_rt::is_vec<T>) {
    for (int i = 0; i < metile_rt::vec_size<T>; ++i)
      if (m[i] != 0) return true;
    return false;
  } else {
    return static_cast<bool>(m);
  }
}

// select(a, b, c): b where c is true, else a.  c may be a bool, a bool
// vector or a comparison mask.
template <metile_rt::Arith A, metile_rt::Arith B, typename C>
inline metile_rt::promote_t<A, B> select(A a, B b, C c) {
  using R = metile_rt::promote_t<A, B>;
  R x = metile_rt::convert<R>(a), y = metile_rt::convert<R>(b);
  if constexpr (!metile_rt::is_vec<C>) {
    return c ? y : x;
  } else {
    static_assert(metile_rt::vec_size<C> == metile_rt::vec_size<R>, "metal: select condition size");
    for (int i = 0; i < metile_rt::vec_size<R>; ++i)
      if (c[i] != 0) x[i] = y[i];
    return x;
  }
}

// Geometric functions (float vectors; half computes with half rounding).
template <metile_rt::FloatArith T>
inline metile_rt::elem_t<T> dot(T a, T b) {
  if constexpr (metile_rt::is_vec<T>) {
    metile_rt::elem_t<T> s = a[0] * b[0];
    for (int i = 1; i < metile_rt::vec_size<T>; ++i) s += a[i] * b[i];
    return s;
  } else {
    return a * b;
  }
}
template <metile_rt::FloatArith T>
inline metile_rt::elem_t<T> length_squared(T x) { return dot(x, x); }
template <metile_rt::FloatArith T>
inline metile_rt::elem_t<T> length(T x) { return sqrt(dot(x, x)); }
template <metile_rt::FloatArith T>
inline metile_rt::elem_t<T> distance(T a, T b) { return length(a - b); }
template <metile_rt::FloatArith T>
inline metile_rt::elem_t<T> distance_squared(T a, T b) { return length_squared(a - b); }
template <metile_rt::FloatArith T>
inline T normalize(T x) { return x * rsqrt(dot(x, x)); }
template <metile_rt::FloatArith T>
  requires(metile_rt::vec_size<T> == 3)
inline T cross(T a, T b) {
  return T{a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}
template <metile_rt::FloatArith T>
inline T faceforward(T n, T i, T nref) { return dot(nref, i) < 0 ? n : T(-n); }
template <metile_rt::FloatArith T>
inline T reflect(T i, T n) { return i - 2 * dot(n, i) * n; }

// Integer functions.
template <metile_rt::Integer T>
inline T popcount(T x) {
  return metile_rt::map_elem<T>(x, [](auto v) {
    return static_cast<decltype(v)>(__builtin_popcountg(static_cast<std::make_unsigned_t<decltype(v)>>(v)));
  });
}
template <metile_rt::Integer T>
inline T clz(T x) {
  return metile_rt::map_elem<T>(x, [](auto v) {
    using U = std::make_unsigned_t<decltype(v)>;
    return static_cast<decltype(v)>(__builtin_clzg(static_cast<U>(v), int(sizeof(U) * 8)));
  });
}
template <metile_rt::Integer T>
inline T ctz(T x) {
  return metile_rt::map_elem<T>(x, [](auto v) {
    using U = std::make_unsigned_t<decltype(v)>;
    return static_cast<decltype(v)>(__builtin_ctzg(static_cast<U>(v), int(sizeof(U) * 8)));
  });
}
template <metile_rt::Integer T>
inline T reverse_bits(T x) {
  return metile_rt::map_elem<T>(x, [](auto v) {
    using E = decltype(v);
    if constexpr (sizeof(E) == 1) return static_cast<E>(__builtin_bitreverse8(v));
    else if constexpr (sizeof(E) == 2) return static_cast<E>(__builtin_bitreverse16(v));
    else if constexpr (sizeof(E) == 4) return static_cast<E>(__builtin_bitreverse32(v));
    else return static_cast<E>(__builtin_bitreverse64(v));
  });
}
template <metile_rt::Integer T, metile_rt::Integer S>
inline T rotate(T x, S s) {
  return metile_rt::map_elem2<T>(x, metile_rt::convert<T>(s), [](auto v, auto n) {
    using U = std::make_unsigned_t<decltype(v)>;
    constexpr unsigned bits = sizeof(U) * 8;
    unsigned k = static_cast<unsigned>(n) % bits;
    U u = static_cast<U>(v);
    return static_cast<decltype(v)>(k ? U((u << k) | (u >> (bits - k))) : u);
  });
}
template <metile_rt::Integer T>
inline T mulhi(T x, T y) {
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    using E = decltype(a);
    if constexpr (sizeof(E) == 8) {
      using W = std::conditional_t<std::is_signed_v<E>, __int128, unsigned __int128>;
      return static_cast<E>((W(a) * W(b)) >> 64);
    } else {
      using W = std::conditional_t<std::is_signed_v<E>, long long, unsigned long long>;
      return static_cast<E>((W(a) * W(b)) >> (sizeof(E) * 8));
    }
  });
}
template <metile_rt::Integer T>
inline T absdiff(T x, T y) {
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) { return static_cast<decltype(a)>(a > b ? a - b : b - a); });
}
// Saturating and halving arithmetic, 24-bit products, bit fields (<metal_integer>): in a
// wider type (or with overflow builtins for 64-bit elements), so no step overflows.
template <metile_rt::Integer T>
inline T addsat(T x, T y) {
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    using E = decltype(a);
    E r;
    if (!__builtin_add_overflow(a, b, &r)) return r;
    return (std::is_signed_v<E> && a < 0) ? std::numeric_limits<E>::min() : std::numeric_limits<E>::max();
  });
}
template <metile_rt::Integer T>
inline T subsat(T x, T y) {
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    using E = decltype(a);
    E r;
    if (!__builtin_sub_overflow(a, b, &r)) return r;
    return (!std::is_signed_v<E> || a < 0) ? std::numeric_limits<E>::min() : std::numeric_limits<E>::max();
  });
}
template <metile_rt::Integer T>
inline T hadd(T x, T y) {
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    return static_cast<decltype(a)>((static_cast<__int128>(a) + static_cast<__int128>(b)) >> 1);
  });
}
template <metile_rt::Integer T>
inline T rhadd(T x, T y) {
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    return static_cast<decltype(a)>((static_cast<__int128>(a) + static_cast<__int128>(b) + 1) >> 1);
  });
}
template <metile_rt::Integer T>
inline T mul24(T x, T y) {
  // Metal defines the product for operands that fit in 24 bits; the full product wraps
  return metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    using U = std::make_unsigned_t<decltype(a)>;
    return static_cast<decltype(a)>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  });
}
template <metile_rt::Integer T>
inline T mad24(T x, T y, T z) { return mul24(x, y) + z; }
template <metile_rt::Integer T>
inline T madhi(T x, T y, T z) { return mulhi(x, y) + z; }
template <metile_rt::Integer T>
inline T madsat(T x, T y, T z) {
  T p = metile_rt::map_elem2<T>(x, y, [](auto a, auto b) {
    using E = decltype(a);
    E r;
    if (!__builtin_mul_overflow(a, b, &r)) return r;
    return (std::is_signed_v<E> && ((a < 0) != (b < 0))) ? std::numeric_limits<E>::min()
                                                         : std::numeric_limits<E>::max();
  });
  // (a saturated product plus z, saturated again: Metal's madsat of an overflowing product)
  return addsat(p, z);
}
template <metile_rt::Integer T>
inline T extract_bits(T x, uint offset, uint bits) {
  return metile_rt::map_elem<T>(x, [offset, bits](auto v) {
    using E = decltype(v);
    using U = std::make_unsigned_t<E>;
    constexpr uint width = sizeof(E) * 8;
    if (bits == 0 || offset >= width) return E(0);
    uint n = bits > width - offset ? width - offset : bits;
    U field = static_cast<U>(static_cast<U>(v) >> offset);
    if (n < width) field &= static_cast<U>((U(1) << n) - 1);
    if constexpr (std::is_signed_v<E>) {   // sign-extended from the field's top bit
      if (n < width && (field >> (n - 1)) & 1) field |= static_cast<U>(~((U(1) << n) - 1));
    }
    return static_cast<E>(field);
  });
}
template <metile_rt::Integer T>
inline T insert_bits(T base, T insert, uint offset, uint bits) {
  return metile_rt::map_elem2<T>(base, insert, [offset, bits](auto b, auto i) {
    using E = decltype(b);
    using U = std::make_unsigned_t<E>;
    constexpr uint width = sizeof(E) * 8;
    if (bits == 0 || offset >= width) return b;
    uint n = bits > width - offset ? width - offset : bits;
    U mask = n < width ? static_cast<U>(((U(1) << n) - 1) << offset) : static_cast<U>(~U(0));
    return static_cast<E>((static_cast<U>(b) & ~mask) | ((static_cast<U>(i) << offset) & mask));
  });
}

// Metal's fast:: and precise:: variants compute the same values here.
#define METILE_MATH_NAMES(X)                                                                        \
  X(exp) X(exp2) X(exp10) X(log) X(log2) X(log10) X(sqrt) X(rsqrt) X(cbrt) X(sin) X(cos) X(tan)  \
  X(sinpi) X(cospi) X(tanpi) X(asin) X(acos) X(atan) X(sinh) X(cosh) X(tanh) X(asinh) X(acosh)   \
  X(atanh) X(floor) X(ceil) X(round) X(rint) X(trunc) X(fabs) X(abs) X(fract) X(saturate) X(pow) \
  X(powr) X(atan2) X(fmod) X(fmin) X(fmax) X(fdim) X(copysign) X(divide) X(nextafter) X(fma)     \
  X(max) X(min) X(clamp) X(max3) X(min3) X(median3) X(fmax3) X(fmin3) X(fmedian3) X(sign)        \
  X(modf) X(frexp) X(ldexp) X(dot) X(length) X(length_squared) X(distance) X(distance_squared)    \
  X(normalize) X(cross) X(mix) X(step) X(smoothstep) X(erf) X(erfc)
#define METILE_USING(name) using metal::name;
namespace fast {
METILE_MATH_NAMES(METILE_USING)
}
namespace precise {
METILE_MATH_NAMES(METILE_USING)
}
#undef METILE_USING
#undef METILE_MATH_NAMES

}  // namespace metal

// Metal's math constants (<metal_math>): float ones with an _F suffix, half
// ones with _H, each the argument's value rounded to that type.
#define MAXFLOAT 0x1.fffffep127f
#define HUGE_VALF __builtin_huge_valf()
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define MAXHALF (static_cast<half>(0x1.ffcp15f))
#define HUGE_VALH (static_cast<half>(__builtin_huge_valf()))

#define M_E_F 2.718281828459045235f
#define M_LOG2E_F 1.442695040888963407f
#define M_LOG10E_F 0.434294481903251828f
#define M_LN2_F 0.693147180559945309f
#define M_LN10_F 2.302585092994045684f
#define M_PI_F 3.141592653589793238f
#define M_PI_2_F 1.570796326794896619f
#define M_PI_4_F 0.785398163397448310f
#define M_1_PI_F 0.318309886183790672f
#define M_2_PI_F 0.636619772367581343f
#define M_2_SQRTPI_F 1.128379167095512574f
#define M_SQRT2_F 1.414213562373095049f
#define M_SQRT1_2_F 0.707106781186547524f
#define M_E_H (static_cast<half>(2.718281828459045235f))
#define M_LOG2E_H (static_cast<half>(1.442695040888963407f))
#define M_LOG10E_H (static_cast<half>(0.434294481903251828f))
#define M_LN2_H (static_cast<half>(0.693147180559945309f))
#define M_LN10_H (static_cast<half>(2.302585092994045684f))
#define M_PI_H (static_cast<half>(3.141592653589793238f))
#define M_PI_2_H (static_cast<half>(1.570796326794896619f))
#define M_PI_4_H (static_cast<half>(0.785398163397448310f))
#define M_1_PI_H (static_cast<half>(0.318309886183790672f))
#define M_2_PI_H (static_cast<half>(0.636619772367581343f))
#define M_2_SQRTPI_H (static_cast<half>(1.128379167095512574f))
#define M_SQRT2_H (static_cast<half>(1.414213562373095049f))
#define M_SQRT1_2_H (static_cast<half>(0.707106781186547524f))
