// Type predicates of the strict model: which argument types a Metal function
// family accepts, and the result type of a call.
#pragma once

namespace metile_strict {

using metile_rt::all_of;
using metile_rt::elem_t;
using metile_rt::is_vec;
using metile_rt::vec_size;

template <typename T>
using bare = std::remove_cv_t<std::remove_reference_t<T>>;

// Metal's floating-point element types: half and float, plus bfloat (MLX's
// header gives bfloat the math library on every metal_kernel).  Not double:
// Metal has none.
template <typename T>
constexpr bool fp_scalar =
    std::is_same<T, half>::value || std::is_same<T, float>::value || std::is_same<T, bfloat>::value;
template <typename T>
constexpr bool int_scalar = std::is_integral<T>::value && !std::is_same<T, bool>::value;

template <typename T>
constexpr bool fp_type = fp_scalar<elem_t<bare<T>>>;
template <typename T>
constexpr bool int_type = int_scalar<elem_t<bare<T>>>;

// The result of an element-wise call on arguments As...: all of one element
// type, all vectors of one length; a scalar of the element type may meet the
// vectors (it is splatted).  No result (a substitution failure, i.e. "no
// matching function") otherwise.
template <bool Ok, typename... As>
struct common_impl {};
template <typename... As>
struct common_impl<true, As...> {
  static constexpr int n = std::max({vec_size<As>...});
  using type = std::conditional_t<n == 0, elem_t<std::tuple_element_t<0, std::tuple<As...>>>,
                                  vec<elem_t<std::tuple_element_t<0, std::tuple<As...>>>, (n == 0 ? 2 : n)>>;
};
template <typename A0, typename... As>
constexpr bool same_shape = all_of(std::is_same<elem_t<A0>, elem_t<As>>::value...) &&
                            all_of((vec_size<As> == 0 || vec_size<A0> == 0 || vec_size<As> == vec_size<A0>)...);

template <typename... As>
using fp_common = typename common_impl<same_shape<bare<As>...> && all_of(fp_type<As>...), bare<As>...>::type;
template <typename... As>
using int_common = typename common_impl<same_shape<bare<As>...> && all_of(int_type<As>...), bare<As>...>::type;
template <typename... As>
using arith_common = typename common_impl<same_shape<bare<As>...> && (all_of(fp_type<As>...) || all_of(int_type<As>...)),
                                          bare<As>...>::type;

// The boolean result of a relational function on T.
template <typename T, int N = vec_size<T>>
struct bool_of {
  using type = vec<signed char, N>;
};
template <typename T>
struct bool_of<T, 0> {
  using type = bool;
};

// Values a SIMD-group collective can move: scalars and vectors of Metal's
// arithmetic types (64-bit integers and bool included: MLX's header adds
// shuffles for them to every metal_kernel).
template <typename T>
constexpr bool simd_value =
    std::is_arithmetic<elem_t<bare<T>>>::value && !std::is_same<elem_t<bare<T>>, double>::value;

template <typename T>
struct identity {
  using type = T;
};

}  // namespace metile_strict
