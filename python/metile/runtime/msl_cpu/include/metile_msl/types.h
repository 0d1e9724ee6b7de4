// Scalar and vector types of MSL, type traits, numeric_limits, as_type.
//
// Vectors are clang ext_vector_type vectors: they give Metal's sizes and
// alignments (float3 is 16 bytes), swizzles (.xy, .wzyx, .rgba, swizzle
// assignment), element-wise operators and vector-scalar operators.  What
// clang does differently from Metal, and how the shim deals with it:
//  * `float4(a, b)` does not compile and `float4(int4)` reinterprets bits:
//    vector_ctors.h turns `floatN(...)` into a function-like macro that
//    converts element-wise; `vec<T, N>(...)` and `static_cast<floatN>(...)`
//    need the source rewrite in rewrite.py.
//  * comparisons give integer masks (-1 / 0) of the operand's element width,
//    not bool vectors; select/all/any accept either.
//  *  * boolN is a vector of `signed char` holding 0 or 1 (clang's own bool
//    vectors are bit-packed and have no .xyzw): Metal's size (bool4 is 4
//    bytes), swizzles work, `if (m.x)` works.  Construction and conversion
//    to it (`bool4(a < b)`) map nonzero to 1; `bool4 m = a < b;` does not
//    compile (the mask is an int4).  The price: vec<int8_t, N> is the same
//    type as boolN and converts like it (Metal code says charN, which is a
//    vector of `char`, a distinct type).
#pragma once

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
typedef __bf16 bfloat;
typedef half float16_t;
typedef bfloat bfloat16_t;

template <typename T, int N>
using vec = T __attribute__((ext_vector_type(N)));

#define METILE_VEC_TYPES(T, NAME) \
  typedef vec<T, 2> NAME##2;      \
  typedef vec<T, 3> NAME##3;      \
  typedef vec<T, 4> NAME##4;
METILE_VEC_TYPES(signed char, bool)
METILE_VEC_TYPES(char, char)
METILE_VEC_TYPES(unsigned char, uchar)
METILE_VEC_TYPES(short, short)
METILE_VEC_TYPES(unsigned short, ushort)
METILE_VEC_TYPES(int, int)
METILE_VEC_TYPES(unsigned int, uint)
METILE_VEC_TYPES(long, long)
METILE_VEC_TYPES(unsigned long, ulong)
METILE_VEC_TYPES(half, half)
METILE_VEC_TYPES(float, float)
METILE_VEC_TYPES(bfloat, bfloat)
#undef METILE_VEC_TYPES

// Metal's half literal suffix: `1.0h`.  (The bfloat suffix `1.0bf` cannot be
// a user-defined literal in clang; rewrite.py turns it into a cast.)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wuser-defined-literals"
constexpr half operator""h(long double x) { return static_cast<half>(static_cast<float>(x)); }
constexpr half operator""h(unsigned long long x) { return static_cast<half>(x); }
#pragma clang diagnostic pop

namespace metal {
template <typename T, int N>
struct packed_vec;
}

namespace metile_rt {

// C++14 throughout (no if constexpr, folds, inline variables or concepts
// outside the #if below): the strict Metal model (include_strict/) includes
// this header, and Metal Shading Language is C++14.

template <typename T>
using remove_cvref_t = typename std::remove_cv<typename std::remove_reference<T>::type>::type;

// Folds over packs of constants, for C++14.
constexpr bool all_of() { return true; }
template <typename... B>
constexpr bool all_of(bool first, B... rest) {
  return first && all_of(rest...);
}
constexpr bool any_of() { return false; }
template <typename... B>
constexpr bool any_of(bool first, B... rest) {
  return first || any_of(rest...);
}
constexpr int sum_of() { return 0; }
template <typename... I>
constexpr int sum_of(int first, I... rest) {
  return first + sum_of(rest...);
}

// packed_floatN & co. take part in vector construction and conversion as
// the aligned vector they hold: `float4(p)`, `ushort2(packed_ushort2)`.
template <typename T>
struct packed_traits {
  static constexpr int size = 0;
};
template <typename T, int N>
struct packed_traits<metal::packed_vec<T, N>> {
  static constexpr int size = N;
  using vector = vec<T, N>;
};
template <typename T>
constexpr bool is_packed = packed_traits<remove_cvref_t<T>>::size != 0;

// The aligned vector for a packed one; anything else unchanged.
template <typename A, typename std::enable_if<!is_packed<A>, int>::type = 0>
constexpr const A& unpack(const A& a) {
  return a;
}
template <typename A, typename std::enable_if<is_packed<A>, int>::type = 0>
constexpr typename packed_traits<A>::vector unpack(const A& a) {
  return typename packed_traits<A>::vector(a);
}
template <typename A>
using unpacked_t = remove_cvref_t<decltype(unpack(std::declval<const A&>()))>;

template <typename T>
struct vec_traits {
  static constexpr int size = 0;
  using elem = T;
};
template <typename T, int N>
struct vec_traits<vec<T, N>> {
  static constexpr int size = N;
  using elem = T;
};
template <typename T>
constexpr bool is_vec = vec_traits<remove_cvref_t<T>>::size != 0;
template <typename T>
using elem_t = typename vec_traits<remove_cvref_t<T>>::elem;
template <typename T>
constexpr int vec_size = vec_traits<remove_cvref_t<T>>::size;

// True when the pack is exactly one argument of type V (cv and references
// ignored).
template <typename V, typename... A>
constexpr bool is_just = false;
template <typename V, typename A>
constexpr bool is_just<V, A> = std::is_same<V, remove_cvref_t<A>>::value;

template <typename T>
constexpr bool is_float_scalar =
    std::is_floating_point<T>::value || std::is_same<T, half>::value || std::is_same<T, bfloat>::value;
template <typename T>
constexpr bool is_int_scalar = std::is_integral<T>::value;
template <typename T>
constexpr bool is_arith_scalar = is_float_scalar<T> || is_int_scalar<T>;

#if __cplusplus >= 202002L
// Scalars and vectors of scalars: what the element-wise library accepts.
// Only the runtime shim's library (C++20) uses these; the strict model
// declares Metal's own signatures.
template <typename T>
concept Arith = is_arith_scalar<remove_cvref_t<T>> ||
                (is_vec<T> && is_arith_scalar<elem_t<T>>);
template <typename T>
concept FloatArith = Arith<T> && is_float_scalar<elem_t<T>>;
template <typename T>
concept IntArith = Arith<T> && is_int_scalar<elem_t<T>>;
#endif

// The type a math function computes in for an argument of type T: integer
// arguments become float (Metal would reject some of these calls as
// ambiguous; accepting them is harmless).
template <typename T, bool = is_vec<T>>
struct float_of_impl {
  using type = std::conditional_t<is_float_scalar<T>, T, float>;
};
template <typename T>
struct float_of_impl<T, true> {
  using type = vec<typename float_of_impl<elem_t<T>, false>::type, vec_size<T>>;
};
template <typename T>
using float_of = typename float_of_impl<remove_cvref_t<T>>::type;

template <typename T>
constexpr int float_rank = std::is_same<T, bfloat>::value ? 1
                           : std::is_same<T, half>::value ? 2
                           : std::is_same<T, float>::value ? 3
                                                           : 4;

// The common type of a mixed-type call such as max(x, 0) or pow(v, 2.0f):
// a vector wins over a scalar (which is splatted), a floating type over an
// integer one (so max(half, 0) stays half), else the usual C++ rules.  half
// with bfloat gives float, as neither converts to the other on Metal.
template <typename A, typename B>
struct promote_scalar {
  using type = std::conditional_t<
      std::is_same<A, B>::value, A,
      std::conditional_t<
          is_float_scalar<A> && !is_float_scalar<B>, A,
          std::conditional_t<
              is_float_scalar<B> && !is_float_scalar<A>, B,
              std::conditional_t<
                  is_float_scalar<A> && is_float_scalar<B>,
                  std::conditional_t<(float_rank<A> + float_rank<B> == 3), float,
                                     std::conditional_t<(float_rank<A> > float_rank<B>), A, B>>,
                  std::common_type_t<A, B>>>>>;
};
template <typename A, typename B, bool VA = is_vec<A>, bool VB = is_vec<B>>
struct promote_impl {
  using type = typename promote_scalar<A, B>::type;
};
template <typename A, typename B>
struct promote_impl<A, B, true, false> {
  using type = A;
};
template <typename A, typename B>
struct promote_impl<A, B, false, true> {
  using type = B;
};
template <typename A, typename B>
struct promote_impl<A, B, true, true> {
  static_assert(std::is_same<A, B>::value, "metal: vector arguments of different types");
  using type = A;
};
template <typename... Ts>
struct promote;
template <typename A>
struct promote<A> {
  using type = A;
};
template <typename A, typename B, typename... R>
struct promote<A, B, R...> {
  using type = typename promote<typename promote_impl<A, B>::type, R...>::type;
};
template <typename... Ts>
using promote_t = typename promote<remove_cvref_t<Ts>...>::type;

// Converts one element as Metal's explicit conversions do; to bool means
// "nonzero", which also turns comparison masks (-1/0) into true/false.
template <typename To, typename From>
constexpr To convert_elem_impl(From x, std::true_type /* to bool */) {
  return x != From(0);
}
template <typename To, typename From>
constexpr To convert_elem_impl(From x, std::false_type) {
  return static_cast<To>(x);
}
template <typename To, typename From>
constexpr To convert_elem(From x) {
  return convert_elem_impl<To>(
      x, std::integral_constant<bool, std::is_same<To, bool>::value || std::is_same<To, signed char>::value>());
}

// Scalar or vector of type T from a scalar (splat) or a same-size vector
// (element-wise conversion).
template <typename T, typename U>
constexpr T convert(U x);

// How convert<T>(U) proceeds: 0 through the aligned vector of a packed one,
// 1 to a scalar, 2 splat of a scalar, 3 to its own type, 4 to a bool vector,
// 5 between vector types.
template <typename T, typename U>
constexpr int convert_kind = is_packed<U>  ? 0
                             : !is_vec<T> ? 1
                             : !is_vec<U> ? 2
                             : std::is_same<T, remove_cvref_t<U>>::value ? 3
                             : std::is_same<elem_t<T>, bool>::value || std::is_same<elem_t<T>, signed char>::value
                                 ? 4
                                 : 5;
template <typename T, typename U, int Kind = convert_kind<T, U>>
struct converter;
template <typename T, typename U>
struct converter<T, U, 0> {
  static constexpr T run(U x) { return convert<T>(unpack(x)); }
};
template <typename T, typename U>
struct converter<T, U, 1> {
  static_assert(!is_vec<U>, "metal: cannot convert a vector to a scalar");
  static constexpr T run(U x) { return convert_elem<T>(x); }
};
template <typename T, typename U>
struct converter<T, U, 2> {
  static constexpr T run(U x) { return T(convert_elem<elem_t<T>>(x)); }
};
template <typename T, typename U>
struct converter<T, U, 3> {
  static constexpr T run(U x) { return x; }
};
template <typename T, typename U>
struct converter<T, U, 4> {
  static_assert(vec_size<T> == vec_size<U>, "metal: vector conversion between different sizes");
  static constexpr T run(U x) {
    T r;
    for (int i = 0; i < vec_size<T>; ++i) r[i] = x[i] != elem_t<U>(0);
    return r;
  }
};
template <typename T, typename U>
struct converter<T, U, 5> {
  static_assert(vec_size<T> == vec_size<U>, "metal: vector conversion between different sizes");
  static constexpr T run(U x) { return __builtin_convertvector(x, T); }
};
template <typename T, typename U>
constexpr T convert(U x) {
  return converter<T, U>::run(x);
}

template <typename T, int N>
struct vec_builder {
  T e[N] = {};
  int n = 0;
  template <typename A, typename std::enable_if<is_vec<A>, int>::type = 0>
  constexpr void put(const A& a) {
    for (int i = 0; i < vec_size<A>; ++i) e[n++] = convert_elem<T>(a[i]);
  }
  template <typename A, typename std::enable_if<!is_vec<A>, int>::type = 0>
  constexpr void put(const A& a) {
    e[n++] = convert_elem<T>(a);
  }
  template <int... I>
  constexpr vec<T, N> build(std::integer_sequence<int, I...>) const {
    return vec<T, N>{e[I]...};
  }
};

template <typename A>
constexpr int component_count = is_vec<unpacked_t<A>> ? vec_size<unpacked_t<A>> : 1;

// Metal vector construction: `float4(x)` splats a scalar, `float4(int4)`
// converts element-wise, `float4(a.xy, 1, b.w)` concatenates; the component
// count must match (a scalar alone splats), as Metal requires.
template <typename T, int N, typename... A>
constexpr vec<T, N> make_vec(const A&... a);

// How make_vec proceeds: 0 through the aligned vectors of packed arguments,
// 1 zero, 2 one argument with another component count (a scalar splats),
// 3 one vector (element-wise conversion), 4 concatenation.
template <int N, typename... A>
constexpr int make_vec_kind = any_of(is_packed<A>...)                                     ? 0
                              : sizeof...(A) == 0                                         ? 1
                              : sizeof...(A) == 1 && sum_of(component_count<A>...) != N ? 2
                              : sizeof...(A) == 1 && all_of(is_vec<A>...)                ? 3
                                                                                          : 4;
template <typename T, int N, int Kind>
struct vec_maker;
template <typename T, int N>
struct vec_maker<T, N, 0> {
  template <typename... A>
  static constexpr vec<T, N> run(const A&... a) {
    return make_vec<T, N>(unpack(a)...);
  }
};
template <typename T, int N>
struct vec_maker<T, N, 1> {
  static constexpr vec<T, N> run() { return vec<T, N>(T(0)); }
};
template <typename T, int N>
struct vec_maker<T, N, 2> {
  template <typename A>
  static constexpr vec<T, N> run(const A& a) {
    static_assert(!is_vec<A>, "metal: vector constructor given a vector of the wrong size");
    return convert<vec<T, N>>(a);
  }
};
template <typename T, int N>
struct vec_maker<T, N, 3> {
  template <typename A>
  static constexpr vec<T, N> run(const A& a) {
    return convert<vec<T, N>>(a);
  }
};
template <typename T, int N>
struct vec_maker<T, N, 4> {
  template <typename... A>
  static constexpr vec<T, N> run(const A&... a) {
    static_assert(sum_of(component_count<A>...) == N,
                  "metal: vector constructor arguments have the wrong number of components");
    vec_builder<T, N> b;
    int expand[] = {(b.put(a), 0)...};
    (void)expand;
    return b.build(std::make_integer_sequence<int, N>{});
  }
};
template <typename T, int N, typename... A>
constexpr vec<T, N> make_vec(const A&... a) {
  return vec_maker<T, N, make_vec_kind<N, A...>>::run(a...);
}

}  // namespace metile_rt

namespace metal {

using ::vec;  // Metal spells it metal::vec too

// as_type<T>(x): reinterpret the bits of x as T (same size, as in Metal).
template <typename T, typename U>
constexpr T as_type(const U& x) {
  static_assert(sizeof(T) == sizeof(U), "metal: as_type between types of different sizes");
  return __builtin_bit_cast(T, x);
}

// Metal's <metal_type_traits>: std's, except that half and bfloat count as
// floating-point (libstdc++ does not say so for clang's _Float16/__bf16).
using std::add_const;
using std::add_const_t;
using std::add_pointer_t;
using std::common_type;
using std::common_type_t;
using std::conditional;
using std::conditional_t;
using std::decay;
using std::decay_t;
using std::declval;
using std::enable_if;
using std::enable_if_t;
using std::false_type;
using std::integral_constant;
using std::is_base_of;
using std::is_const;
using std::is_convertible;
using std::is_integral;
using std::is_pointer;
using std::is_same;
using std::is_signed;
using std::is_unsigned;
using std::is_void;
using std::make_signed;
using std::make_signed_t;
using std::make_unsigned;
using std::make_unsigned_t;
using std::remove_const;
using std::remove_const_t;
using std::remove_cv;
using std::remove_cv_t;
using std::remove_reference;
using std::remove_reference_t;
using std::true_type;
// Defined here rather than taken from std: std has them from C++17 only.
template <bool B>
using bool_constant = integral_constant<bool, B>;
template <typename B, typename D>
constexpr bool is_base_of_v = is_base_of<B, D>::value;
template <typename T>
constexpr bool is_const_v = is_const<T>::value;
template <typename F, typename T>
constexpr bool is_convertible_v = is_convertible<F, T>::value;
template <typename T>
constexpr bool is_integral_v = is_integral<T>::value;
template <typename T>
constexpr bool is_pointer_v = is_pointer<T>::value;
template <typename T, typename U>
constexpr bool is_same_v = is_same<T, U>::value;
template <typename T>
constexpr bool is_signed_v = is_signed<T>::value;
template <typename T>
constexpr bool is_unsigned_v = is_unsigned<T>::value;
template <typename T>
constexpr bool is_void_v = is_void<T>::value;

template <typename T>
struct is_floating_point : bool_constant<metile_rt::is_float_scalar<remove_cv_t<T>>> {};
template <typename T>
constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <typename T>
struct is_arithmetic : bool_constant<metile_rt::is_arith_scalar<remove_cv_t<T>>> {};
template <typename T>
constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <typename T>
struct is_scalar : bool_constant<is_arithmetic_v<T> || std::is_scalar<T>::value> {};
template <typename T>
constexpr bool is_scalar_v = is_scalar<T>::value;
template <typename T>
struct is_vector : bool_constant<metile_rt::is_vec<T>> {};
template <typename T>
constexpr bool is_vector_v = is_vector<T>::value;

template <typename T>
struct numeric_limits : std::numeric_limits<T> {};

template <>
struct numeric_limits<half> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 11;
  static constexpr int radix = 2;
  static constexpr half min() { return __builtin_bit_cast(half, (unsigned short)0x0400); }
  static constexpr half max() { return __builtin_bit_cast(half, (unsigned short)0x7bff); }
  static constexpr half lowest() { return __builtin_bit_cast(half, (unsigned short)0xfbff); }
  static constexpr half epsilon() { return __builtin_bit_cast(half, (unsigned short)0x1400); }
  static constexpr half infinity() { return __builtin_bit_cast(half, (unsigned short)0x7c00); }
  static constexpr half quiet_NaN() { return __builtin_bit_cast(half, (unsigned short)0x7e00); }
  static constexpr half signaling_NaN() { return __builtin_bit_cast(half, (unsigned short)0x7d00); }
  static constexpr half denorm_min() { return __builtin_bit_cast(half, (unsigned short)0x0001); }
};

template <>
struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 8;
  static constexpr int radix = 2;
  static constexpr bfloat min() { return __builtin_bit_cast(bfloat, (unsigned short)0x0080); }
  static constexpr bfloat max() { return __builtin_bit_cast(bfloat, (unsigned short)0x7f7f); }
  static constexpr bfloat lowest() { return __builtin_bit_cast(bfloat, (unsigned short)0xff7f); }
  static constexpr bfloat epsilon() { return __builtin_bit_cast(bfloat, (unsigned short)0x3c00); }
  static constexpr bfloat infinity() { return __builtin_bit_cast(bfloat, (unsigned short)0x7f80); }
  static constexpr bfloat quiet_NaN() { return __builtin_bit_cast(bfloat, (unsigned short)0x7fc0); }
  static constexpr bfloat signaling_NaN() { return __builtin_bit_cast(bfloat, (unsigned short)0x7fa0); }
  static constexpr bfloat denorm_min() { return __builtin_bit_cast(bfloat, (unsigned short)0x0001); }
};

// Metal's packed vectors (no padding: packed_float3 is 12 bytes).  They
// convert to and from the aligned vectors; arithmetic goes through those.
template <typename T, int N>
struct packed_vec;
#define METILE_PACKED_BODY(N)                                                       \
  using value_type = T;                                                             \
  packed_vec() = default;                                                           \
  constexpr packed_vec(vec<T, N> v) { *this = v; }                                  \
  /* packed_float4(x, y, z, w), packed_float4(int4), packed_half2(packed_float2) */ \
  template <typename... A,                                                          \
            typename std::enable_if<(sizeof...(A) > 0) && !::metile_rt::is_just<vec<T, N>, A...>, int>::type = 0> \
  constexpr explicit packed_vec(const A&... a) {                                    \
    *this = ::metile_rt::make_vec<T, N>(a...);                                      \
  }                                                                                 \
  constexpr packed_vec& operator=(vec<T, N> v) {                                    \
    for (int i = 0; i < N; ++i) (*this)[i] = v[i];                                  \
    return *this;                                                                   \
  }                                                                                 \
  constexpr operator vec<T, N>() const {                                            \
    vec<T, N> v;                                                                    \
    for (int i = 0; i < N; ++i) v[i] = (*this)[i];                                  \
    return v;                                                                       \
  }                                                                                 \
  constexpr T& operator[](int i) { return (&x)[i]; }                                \
  constexpr const T& operator[](int i) const { return (&x)[i]; }
template <typename T>
struct packed_vec<T, 2> {
  T x, y;
  METILE_PACKED_BODY(2)
};
template <typename T>
struct packed_vec<T, 3> {
  T x, y, z;
  METILE_PACKED_BODY(3)
};
template <typename T>
struct packed_vec<T, 4> {
  T x, y, z, w;
  METILE_PACKED_BODY(4)
};
#undef METILE_PACKED_BODY

// Metal's packed vectors take the arithmetic operators too; here they compute
// in the aligned vector type, which converts back on assignment to a packed one.
#define METILE_PACKED_OP(op)                                                          \
  template <typename T, int N, typename U>                                            \
  constexpr auto operator op(const packed_vec<T, N>& a, const U& b)                   \
      -> decltype(vec<T, N>() op ::metile_rt::unpack(b)) {                            \
    return vec<T, N>(a) op ::metile_rt::unpack(b);                                    \
  }                                                                                   \
  template <typename U, typename T, int N,                                            \
            typename std::enable_if<!::metile_rt::is_packed<U>, int>::type = 0>        \
  constexpr auto operator op(const U& a, const packed_vec<T, N>& b)                   \
      -> decltype(a op vec<T, N>()) {                                                 \
    return a op vec<T, N>(b);                                                         \
  }                                                                                   \
  template <typename T, int N, typename U>                                            \
  constexpr packed_vec<T, N>& operator op##=(packed_vec<T, N>& a, const U& b) {       \
    a = vec<T, N>(a) op ::metile_rt::unpack(b);                                       \
    return a;                                                                         \
  }
METILE_PACKED_OP(+)
METILE_PACKED_OP(-)
METILE_PACKED_OP(*)
METILE_PACKED_OP(/)
#undef METILE_PACKED_OP
template <typename T, int N>
constexpr vec<T, N> operator-(const packed_vec<T, N>& a) {
  return -vec<T, N>(a);
}

}  // namespace metal

#define METILE_PACKED_TYPES(T, NAME)                      \
  typedef metal::packed_vec<T, 2> packed_##NAME##2;       \
  typedef metal::packed_vec<T, 3> packed_##NAME##3;       \
  typedef metal::packed_vec<T, 4> packed_##NAME##4;
METILE_PACKED_TYPES(char, char)
METILE_PACKED_TYPES(uchar, uchar)
METILE_PACKED_TYPES(short, short)
METILE_PACKED_TYPES(ushort, ushort)
METILE_PACKED_TYPES(int, int)
METILE_PACKED_TYPES(uint, uint)
METILE_PACKED_TYPES(half, half)
METILE_PACKED_TYPES(float, float)
METILE_PACKED_TYPES(bfloat, bfloat)
#undef METILE_PACKED_TYPES

// Metal's limit macros (<metal_types> defines them; C++'s <climits>/<cfloat>
// are not included, so the names are free).  MSL's long is 64 bits, as on
// this host.  Values are exact (decimal, not hexadecimal floating literals,
// which C++14 does not have) so `x == FLT_MAX` and `as_type<uint>(FLT_MIN)`
// agree with the GPU.
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-127 - 1)
#define UCHAR_MAX 255
#define CHAR_MAX SCHAR_MAX
#define CHAR_MIN SCHAR_MIN
#define USHRT_MAX 65535
#define SHRT_MAX 32767
#define SHRT_MIN (-32767 - 1)
#define UINT_MAX 0xffffffffu
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define ULONG_MAX 0xfffffffffffffffful
#define LONG_MAX 0x7fffffffffffffffl
#define LONG_MIN (-0x7fffffffffffffffl - 1)

#define FLT_DIG 6
#define FLT_MANT_DIG 24
#define FLT_MAX_10_EXP 38
#define FLT_MAX_EXP 128
#define FLT_MIN_10_EXP (-37)
#define FLT_MIN_EXP (-125)
#define FLT_RADIX 2
#define FLT_MAX 3.40282346638528859812e+38f
#define FLT_MIN 1.17549435082228750797e-38f
#define FLT_EPSILON 1.1920928955078125e-07f

#define HALF_DIG 3
#define HALF_MANT_DIG 11
#define HALF_MAX_10_EXP 4
#define HALF_MAX_EXP 16
#define HALF_MIN_10_EXP (-4)
#define HALF_MIN_EXP (-13)
#define HALF_RADIX 2
#define HALF_MAX (static_cast<half>(65504.0f))
#define HALF_MIN (static_cast<half>(6.103515625e-05f))
#define HALF_EPSILON (static_cast<half>(9.765625e-04f))
