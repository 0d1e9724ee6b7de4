// The strict model of Metal 4's <metal_tensor>: metal::tensor and
// metal::cooperative_tensor at signature level, with address spaces kept
// (a tensor over `const device half` is built from a `const device half*`,
// never from a `device float*` or a threadgroup pointer).  The runtime shim's
// metile_msl/tensor.h says what each call does; extents, array and the
// execution scopes are shared with it (metile_msl/tensor_common.h).
#pragma once

#include <metile_msl/tensor_common.h>

namespace metal {

template <typename T>
struct remove_addrspace {
  using type = T;
};
#define METILE_STRICT_SPACE(S)                  \
  template <typename T>                         \
  struct remove_addrspace<S T> {                \
    using type = T;                             \
  };                                            \
  template <typename T>                         \
  struct remove_addrspace<const S T> {          \
    using type = const T;                       \
  };
METILE_STRICT_SPACE(device)
METILE_STRICT_SPACE(constant)
METILE_STRICT_SPACE(threadgroup)
#undef METILE_STRICT_SPACE
template <typename T>
using remove_addrspace_t = typename remove_addrspace<T>::type;

template <typename ElementType, typename Extents, typename Descriptor = tensor_handle, typename... Tags>
struct tensor {
  static_assert(std::is_same<Descriptor, tensor_handle>::value || std::is_same<Descriptor, tensor_offset>::value ||
                    std::is_same<Descriptor, tensor_inline>::value,
                "metal::tensor: the descriptor is tensor_handle, tensor_offset or tensor_inline");
  using element_type = ElementType;
  using value_type = std::remove_cv_t<remove_addrspace_t<ElementType>>;
  using extents_type = Extents;
  using index_type = typename Extents::index_type;
  using descriptor_type = Descriptor;
  using metile_slice_descriptor =
      std::conditional_t<std::is_same<Descriptor, tensor_inline>::value, tensor_inline, tensor_offset>;

  template <typename D = Descriptor, typename std::enable_if<std::is_same<D, tensor_inline>::value, int>::type = 0>
  tensor(ElementType* data, const Extents& extents);
  template <typename D = Descriptor, typename std::enable_if<std::is_same<D, tensor_inline>::value, int>::type = 0>
  tensor(ElementType* data, const Extents& extents, const array<index_type, Extents::rank()>& strides);

  Extents extents() const;

  template <typename... I, typename std::enable_if<sizeof...(I) == Extents::rank() &&
                                                       metile_rt::all_of(std::is_integral<I>::value...),
                                                   int>::type = 0>
  tensor<ElementType, Extents, metile_slice_descriptor, Tags...> slice(I... offsets) const;
  template <size_t... E, typename... I,
            typename std::enable_if<sizeof...(E) == Extents::rank() && sizeof...(I) == Extents::rank() &&
                                        metile_rt::all_of(std::is_integral<I>::value...),
                                    int>::type = 0>
  tensor<ElementType, ::metal::extents<index_type, E...>, metile_slice_descriptor, Tags...> slice(I... offsets) const;
  template <size_t... E, typename... I,
            typename std::enable_if<sizeof...(E) == Extents::rank() && sizeof...(I) == Extents::rank() &&
                                        metile_rt::all_of(std::is_integral<I>::value...),
                                    int>::type = 0>
  tensor<ElementType, ::metal::extents<index_type, E...>, metile_slice_descriptor, Tags...> static_slice(
      I... offsets) const;
};

template <typename ElementType, typename Extents, typename Layout>
struct cooperative_tensor {
  static_assert(metile_rt::is_arith_scalar<ElementType>, "metal::cooperative_tensor: elements are thread scalars");
  using element_type = ElementType;
  using value_type = ElementType;
  using extents_type = Extents;
  using index_type = typename Extents::index_type;
  using layout = Layout;
  using thread_index_type = uint16_t;

  template <bool Const>
  struct iterator_t {
    std::conditional_t<Const, const element_type&, element_type&> operator*() const;
    iterator_t& operator++();
    iterator_t operator++(int);
    bool operator==(const iterator_t&) const;
    bool operator!=(const iterator_t&) const;
    array<index_type, 2> get_multidimensional_index() const;
  };
  using iterator = iterator_t<false>;
  using const_iterator = iterator_t<true>;

  uint16_t get_capacity() const;
  element_type& operator[](uint16_t i);
  const element_type& operator[](uint16_t i) const;
  bool get_mask(uint16_t i) const;
  bool is_valid_element(uint16_t i) const;
  array<index_type, 2> get_multidimensional_index(uint16_t i) const;
  template <bool C>
  array<index_type, 2> get_multidimensional_index(const iterator_t<C>& it) const;
  iterator begin();
  iterator end();
  const_iterator begin() const;
  const_iterator end() const;

  template <typename E, typename X, typename D, typename... Tags>
  void load(const tensor<E, X, D, Tags...>& source);
  template <typename E, typename X, typename D, typename... Tags,
            typename std::enable_if<!std::is_const<remove_addrspace_t<E>>::value, int>::type = 0>
  void store(const tensor<E, X, D, Tags...>& destination) const;
};

}  // namespace metal
