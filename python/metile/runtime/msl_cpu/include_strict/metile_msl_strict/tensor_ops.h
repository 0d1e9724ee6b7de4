// The strict model of mpp::tensor_ops::matmul2d (Metal Performance
// Primitives): the operation, its cooperative-tensor getters and run(), with
// the compile-time rules the runtime shim (metile_msl/tensor_ops.h) enforces
// too: the scope, the operand kinds and element types, cooperative operands
// of this operation's layout, a writable destination, no constant-space
// operands.
#pragma once

#include "tensor.h"

namespace metile_strict {

template <typename T>
struct mm_operand {
  static constexpr bool coop = false, tensor = false, is_const = false, constant_space = false;
  static constexpr size_t rank = 2;
  using value_type = float;
  using layout = void;
};
template <typename T>
struct is_constant_space : std::false_type {};
template <typename T>
struct is_constant_space<constant T> : std::true_type {};
template <typename T>
struct is_constant_space<const constant T> : std::true_type {};
template <typename E, typename X, typename D, typename... Tags>
struct mm_operand<metal::tensor<E, X, D, Tags...>> {
  static constexpr bool coop = false, tensor = true;
  static constexpr bool is_const = std::is_const<metal::remove_addrspace_t<E>>::value;
  static constexpr bool constant_space = is_constant_space<E>::value;
  static constexpr size_t rank = X::rank();
  using value_type = std::remove_cv_t<metal::remove_addrspace_t<E>>;
  using layout = void;
};
template <typename E, typename X, typename L>
struct mm_operand<metal::cooperative_tensor<E, X, L>> {
  static constexpr bool coop = true, tensor = false, is_const = false, constant_space = false;
  static constexpr size_t rank = 2;
  using value_type = E;
  using layout = L;
};
template <typename T>
using mm_traits = mm_operand<std::remove_cv_t<T>>;

template <typename T>
struct scope_size {
  static constexpr size_t value = 0;
};
template <size_t N>
struct scope_size<metal::execution_simdgroups<N>> {
  static constexpr size_t value = N;
};
template <>
struct scope_size<metal::execution_thread> {
  static constexpr size_t value = 1;
};

}  // namespace metile_strict

namespace mpp {
namespace tensor_ops {

template <metile_rt::matmul2d_code Descriptor, typename Scope, class... Args>
class matmul2d {
  static_assert(metile_rt::matmul_valid(Descriptor),
                "mpp::tensor_ops::matmul2d_descriptor: m and n must be 1..65535 and k below 1048575 (or dynamic)");
  static_assert(metile_strict::scope_size<Scope>::value != 0,
                "mpp::tensor_ops::matmul2d: the scope is metal::execution_simdgroup, execution_simdgroups<N> or "
                "execution_thread");
  static constexpr size_t S = metile_strict::scope_size<Scope>::value;
  template <metile_rt::mm_role Role, typename LV, typename RV>
  using layout = metile_rt::mm_layout<metile_rt::mm_layout_code(Descriptor, Role), S, Role, LV, RV>;

 public:
  static constexpr matmul2d_descriptor descriptor = metile_decode(Descriptor);
  using scope = Scope;

  matmul2d() = default;

  template <typename LeftOperand, typename RightOperand, typename ElementType, typename CoordType = int>
  using cooperative_tensor_destination_t =
      metal::cooperative_tensor<ElementType, metal::dextents<CoordType, 2>,
                                layout<metile_rt::mm_role::destination, typename metile_strict::mm_traits<LeftOperand>::value_type,
                                       typename metile_strict::mm_traits<RightOperand>::value_type>>;
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int>
  using cooperative_tensor_left_input_t =
      metal::cooperative_tensor<LeftElementType, metal::dextents<CoordType, 2>,
                                layout<metile_rt::mm_role::left, LeftElementType, RightElementType>>;
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int>
  using cooperative_tensor_right_input_t =
      metal::cooperative_tensor<RightElementType, metal::dextents<CoordType, 2>,
                                layout<metile_rt::mm_role::right, LeftElementType, RightElementType>>;

  template <typename LeftOperand, typename RightOperand, typename ElementType, typename CoordType = int,
            typename std::enable_if<(metile_strict::mm_traits<LeftOperand>::coop ||
                                     metile_strict::mm_traits<LeftOperand>::tensor) &&
                                        (metile_strict::mm_traits<RightOperand>::coop ||
                                         metile_strict::mm_traits<RightOperand>::tensor) &&
                                        std::is_integral<CoordType>::value,
                                    int>::type = 0>
  cooperative_tensor_destination_t<LeftOperand, RightOperand, ElementType, CoordType>
  get_destination_cooperative_tensor() const {
    static_assert(metile_rt::mm_types_ok<typename metile_strict::mm_traits<LeftOperand>::value_type,
                                         typename metile_strict::mm_traits<RightOperand>::value_type, ElementType>,
                  "get_destination_cooperative_tensor: unsupported (left, right, destination) element types");
    return {};
  }
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int,
            typename std::enable_if<std::is_integral<CoordType>::value, int>::type = 0>
  cooperative_tensor_left_input_t<LeftElementType, RightElementType, ElementType, CoordType>
  get_left_input_cooperative_tensor() const {
    static_assert(metile_rt::mm_types_ok<LeftElementType, RightElementType, ElementType>,
                  "get_left_input_cooperative_tensor<Left, Right, Destination>: unsupported element types");
    static_assert(!metile_rt::matmul_dynamic_k(Descriptor), "matmul2d: input cooperative tensors need a static k");
    return {};
  }
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int,
            typename std::enable_if<std::is_integral<CoordType>::value, int>::type = 0>
  cooperative_tensor_right_input_t<LeftElementType, RightElementType, ElementType, CoordType>
  get_right_input_cooperative_tensor() const {
    static_assert(metile_rt::mm_types_ok<LeftElementType, RightElementType, ElementType>,
                  "get_right_input_cooperative_tensor<Left, Right, Destination>: unsupported element types");
    static_assert(!metile_rt::matmul_dynamic_k(Descriptor), "matmul2d: input cooperative tensors need a static k");
    return {};
  }

  template <typename LeftOperand, typename RightOperand, typename DestinationOperand>
  void run(LeftOperand& left, RightOperand& right, DestinationOperand& destination) const {
    using LT = metile_strict::mm_traits<LeftOperand>;
    using RT = metile_strict::mm_traits<RightOperand>;
    using DT = metile_strict::mm_traits<DestinationOperand>;
    static_assert(LT::coop || LT::tensor, "matmul2d::run: the left operand is not a tensor or cooperative tensor");
    static_assert(RT::coop || RT::tensor, "matmul2d::run: the right operand is not a tensor or cooperative tensor");
    static_assert(DT::coop || DT::tensor, "matmul2d::run: the destination is not a tensor or cooperative tensor");
    static_assert(LT::rank == 2 && RT::rank == 2 && DT::rank == 2, "matmul2d::run: operands are rank-2 tensors");
    static_assert(!LT::constant_space && !RT::constant_space && !DT::constant_space,
                  "matmul2d::run: tensor operands live in device, threadgroup or thread memory, not constant");
    static_assert(metile_rt::mm_run_rules<Descriptor, typename LT::value_type, typename RT::value_type,
                                          typename DT::value_type, LT::coop, RT::coop, DT::is_const>::ok,
                  "");
    using LV = typename LT::value_type;
    using RV = typename RT::value_type;
    static_assert(!LT::coop || std::is_same<typename LT::layout, layout<metile_rt::mm_role::left, LV, RV>>::value,
                  "matmul2d::run: a cooperative left operand must come from this operation's "
                  "get_left_input_cooperative_tensor<Left, Right, ...> for this run's element types (same m, k, "
                  "transpose_left and scope)");
    static_assert(!RT::coop || std::is_same<typename RT::layout, layout<metile_rt::mm_role::right, LV, RV>>::value,
                  "matmul2d::run: a cooperative right operand must come from this operation's "
                  "get_right_input_cooperative_tensor<Left, Right, ...> for this run's element types (same k, n, "
                  "transpose_right and scope)");
    static_assert(!DT::coop || std::is_same<typename DT::layout, layout<metile_rt::mm_role::destination, LV, RV>>::value,
                  "matmul2d::run: a cooperative destination must come from get_destination_cooperative_tensor<"
                  "Left, Right, ...> of an operation with the same m, n and scope, with Left and Right of this "
                  "run's element types, in this order (Metal: input types must match cooperative tensor types)");
    (void)left;
    (void)right;
    (void)destination;
  }
};

template <metile_rt::matmul2d_code Descriptor, typename Scope, class... Args>
constexpr matmul2d_descriptor matmul2d<Descriptor, Scope, Args...>::descriptor;

}  // namespace tensor_ops
}  // namespace mpp
