// Metal 4's <metal_tensor> on the CPU runtime: metal::tensor (a view over
// device, threadgroup or thread memory with extents, strides and an origin)
// and metal::cooperative_tensor (thread-private elements of a tensor spread
// over the threads of an operation's execution scope, in a layout the
// operation defines; tensor_ops.h has matmul2d's).
//
// Coordinates are (x, y, ...) with x the innermost dimension, as in Metal:
// element (x, y) of a rank-2 tensor is data[x * stride(0) + y * stride(1)],
// so a row-major R x C matrix with leading dimension ld has extents (C, R)
// and strides (1, ld).
//
// What the shim assumes where Apple's text is silent (a Mac would confirm):
//  * slice(x, y) keeps the parent's extents and shifts the origin (Apple
//    says so for slices of handles; the shim does the same for inline
//    tensors); an element is in bounds while origin + coordinate is below the
//    parent's extent, so a dynamic slice is edge-checked against the tensor
//    it came from;
//  * slice<E0, E1>(x, y) / static_slice<E0, E1>(x, y) make the static extents
//    the bounds themselves (Apple: static slices skip edge checks), so a
//    static slice past the data reads past it here too (the bounds check
//    names the buffer);
//  * cooperative_tensor::load zero-fills its elements outside the source's
//    bounds; store skips them.  Both are per-thread (no synchronisation).
//
// Not provided: tensor_handle kernel parameters (metile binds buffers, not
// MTLTensor objects), element access on metal::tensor, map_iterator and the
// row/column reduction helpers.
#pragma once

#include "tensor_common.h"

namespace metal {

// Address spaces are erased in the runtime shim (metal_shim.h).
template <typename T>
struct remove_addrspace {
  using type = T;
};
template <typename T>
using remove_addrspace_t = typename remove_addrspace<T>::type;

template <typename ElementType, typename Extents, typename Descriptor = tensor_handle, typename... Tags>
struct tensor;

}  // namespace metal

namespace metile_rt {

template <typename T>
constexpr bool is_tensor_descriptor = std::is_same_v<T, metal::tensor_handle> ||
                                      std::is_same_v<T, metal::tensor_offset> ||
                                      std::is_same_v<T, metal::tensor_inline>;

template <typename T>
struct is_tensor : std::false_type {};
template <typename E, typename X, typename D, typename... Tags>
struct is_tensor<metal::tensor<E, X, D, Tags...>> : std::true_type {};

struct tensor_state_tag {};

}  // namespace metile_rt

namespace metal {

template <typename ElementType, typename Extents, typename Descriptor, typename... Tags>
struct tensor {
  static_assert(metile_rt::is_tensor_descriptor<Descriptor>,
                "metal::tensor: the descriptor is tensor_handle, tensor_offset or tensor_inline");
  using element_type = ElementType;
  using value_type = std::remove_cv_t<ElementType>;
  using extents_type = Extents;
  using index_type = typename Extents::index_type;
  using descriptor_type = Descriptor;
  static constexpr size_t metile_rank = Extents::rank();
  using metile_coords = array<index_type, metile_rank>;
  // What slice() of this tensor gives.
  using metile_slice_descriptor = std::conditional_t<std::is_same_v<Descriptor, tensor_inline>, tensor_inline, tensor_offset>;

  // Inline tensors over memory the kernel already has; packed strides
  // (stride(0) = 1, stride(d) = stride(d-1) * extent(d-1)) unless given.
  tensor(ElementType* data, const Extents& ext) : tensor(data, ext, packed_strides(ext)) {}
  tensor(ElementType* data, const Extents& ext, const metile_coords& strides)
      : metile_base(data), metile_extents(ext), metile_stride(strides), metile_origin{}, metile_limit{} {
    static_assert(std::is_same_v<Descriptor, tensor_inline>,
                  "metal::tensor: only tensor_inline tensors are built in a kernel (handles come from the host)");
    for (size_t d = 0; d < metile_rank; ++d) metile_limit[d] = ext.extent(d);
  }
  tensor(metile_rt::tensor_state_tag, ElementType* base, const Extents& ext, const metile_coords& stride,
         const metile_coords& origin, const metile_coords& limit)
      : metile_base(base), metile_extents(ext), metile_stride(stride), metile_origin(origin), metile_limit(limit) {}

  Extents extents() const { return metile_extents; }

  // The same extents, the origin moved by the offsets (one per dimension).
  template <typename... I, std::enable_if_t<sizeof...(I) == metile_rank, int> = 0>
  tensor<ElementType, Extents, metile_slice_descriptor, Tags...> slice(I... offsets) const {
    const index_type off[] = {index_type(offsets)...};
    metile_coords origin = metile_origin;
    for (size_t d = 0; d < metile_rank; ++d) origin[d] += off[d];
    return {metile_rt::tensor_state_tag{}, metile_base, metile_extents, metile_stride, origin, metile_limit};
  }
  // Static extents E...; a dynamic_extent entry keeps the parent's extent
  // and bounds in that dimension.
  template <size_t... E, typename... I, std::enable_if_t<sizeof...(E) == metile_rank && sizeof...(I) == metile_rank, int> = 0>
  tensor<ElementType, ::metal::extents<index_type, E...>, metile_slice_descriptor, Tags...> slice(I... offsets) const {
    const index_type off[] = {index_type(offsets)...};
    constexpr size_t stat[] = {E...};
    metile_coords origin = metile_origin, limit = metile_limit;
    index_type values[metile_rank];
    for (size_t d = 0; d < metile_rank; ++d) {
      origin[d] += off[d];
      values[d] = stat[d] == dynamic_extent ? metile_extents.extent(d) : index_type(stat[d]);
      if (stat[d] != dynamic_extent) limit[d] = origin[d] + index_type(stat[d]);
    }
    return {metile_rt::tensor_state_tag{}, metile_base, make_extents<E...>(values, std::make_index_sequence<metile_rank>{}),
            metile_stride, origin, limit};
  }
  template <size_t... E, typename... I, std::enable_if_t<sizeof...(E) == metile_rank && sizeof...(I) == metile_rank, int> = 0>
  tensor<ElementType, ::metal::extents<index_type, E...>, metile_slice_descriptor, Tags...> static_slice(I... offsets) const {
    return slice<E...>(offsets...);
  }

  // The element at local coordinates c, if inside the bounds.
  bool metile_in_bounds(const long* c) const {
    for (size_t d = 0; d < metile_rank; ++d) {
      long g = long(metile_origin[d]) + c[d];
      if (c[d] < 0 || g < 0 || g >= long(metile_limit[d])) return false;
    }
    return true;
  }
  ElementType* metile_at(const long* c) const {
    long off = 0;
    for (size_t d = 0; d < metile_rank; ++d) off += (long(metile_origin[d]) + c[d]) * long(metile_stride[d]);
    return metile_base + off;
  }
  bool metile_same_view(const tensor& o) const {
    for (size_t d = 0; d < metile_rank; ++d)
      if (metile_stride[d] != o.metile_stride[d] || metile_origin[d] != o.metile_origin[d] ||
          metile_limit[d] != o.metile_limit[d])
        return false;
    return metile_base == o.metile_base;
  }

  ElementType* metile_base;
  Extents metile_extents;
  metile_coords metile_stride, metile_origin, metile_limit;

 private:
  static metile_coords packed_strides(const Extents& ext) {
    metile_coords s{};
    index_type step = 1;
    for (size_t d = 0; d < metile_rank; ++d) {
      s[d] = step;
      step *= ext.extent(d);
    }
    return s;
  }
  template <size_t... E, size_t... Is>
  static ::metal::extents<index_type, E...> make_extents(const index_type* v, std::index_sequence<Is...>) {
    return ::metal::extents<index_type, E...>(v[Is]...);
  }
};

// `tensor(data, extents[, strides])` without template arguments (class
// template argument deduction) builds an inline tensor.
template <typename E, typename X>
tensor(E*, X) -> tensor<E, X, tensor_inline>;
template <typename E, typename X, typename I, size_t R>
tensor(E*, X, array<I, R>) -> tensor<E, X, tensor_inline>;

// Thread-private elements of a tensor spread over the threads of an
// operation's scope.  Layout (from the operation) says how many elements a
// thread holds, which of them are real (not padding) and where each sits:
//   static constexpr uint16_t capacity;
//   static bool valid(uint16_t i);                 // for the calling thread
//   static void coordinate(uint16_t i, long* xy);  // (x, y) in the tensor
template <typename ElementType, typename Extents, typename Layout>
struct cooperative_tensor {
  using element_type = ElementType;
  using value_type = ElementType;
  using extents_type = Extents;
  using index_type = typename Extents::index_type;
  using layout = Layout;
  using thread_index_type = uint16_t;
  using metile_index = array<index_type, 2>;

  template <bool Const>
  struct iterator_t {
    using tensor_ref = std::conditional_t<Const, const cooperative_tensor&, cooperative_tensor&>;
    tensor_ref ct;
    uint16_t index;
    auto& operator*() const { return ct[index]; }
    iterator_t& operator++() {
      ++index;
      return *this;
    }
    iterator_t operator++(int) {
      iterator_t old = *this;
      ++index;
      return old;
    }
    bool operator==(const iterator_t& o) const { return index == o.index; }
    bool operator!=(const iterator_t& o) const { return index != o.index; }
    metile_index get_multidimensional_index() const { return ct.get_multidimensional_index(index); }
  };
  using iterator = iterator_t<false>;
  using const_iterator = iterator_t<true>;

  static constexpr uint16_t get_capacity() { return Layout::capacity; }

  element_type& operator[](uint16_t i) { return metile_elems[checked(i)]; }
  const element_type& operator[](uint16_t i) const { return metile_elems[checked(i)]; }

  // Whether element i of this thread is part of the tensor (the layout may
  // pad a thread's storage).
  bool get_mask(uint16_t i) const { return Layout::valid(checked(i)); }
  bool is_valid_element(uint16_t i) const { return Layout::valid(checked(i)); }

  // (x, y) of element i in the tensor's coordinates: [0] the column, [1] the row.
  metile_index get_multidimensional_index(uint16_t i) const {
    long xy[2];
    Layout::coordinate(checked(i), xy);
    return metile_index{{index_type(xy[0]), index_type(xy[1])}};
  }
  template <bool C>
  metile_index get_multidimensional_index(const iterator_t<C>& it) const {
    return get_multidimensional_index(it.index);
  }

  iterator begin() { return iterator{*this, 0}; }
  iterator end() { return iterator{*this, Layout::capacity}; }
  const_iterator begin() const { return const_iterator{*this, 0}; }
  const_iterator end() const { return const_iterator{*this, Layout::capacity}; }

  // This thread's elements from / to `t`, element (x, y) of the layout at
  // local coordinate (x, y) of t.
  template <typename E, typename X, typename D, typename... Tags>
  void load(const tensor<E, X, D, Tags...>& t) {
    for (uint16_t i = 0; i < Layout::capacity; ++i) {
      if (!Layout::valid(i)) continue;
      long xy[2];
      Layout::coordinate(i, xy);
      metile_elems[i] = t.metile_in_bounds(xy) ? element_type(*t.metile_at(xy)) : element_type(0);
    }
  }
  template <typename E, typename X, typename D, typename... Tags>
  void store(const tensor<E, X, D, Tags...>& t) const {
    static_assert(!std::is_const_v<E>, "metal::cooperative_tensor::store: the tensor has const elements");
    for (uint16_t i = 0; i < Layout::capacity; ++i) {
      if (!Layout::valid(i)) continue;
      long xy[2];
      Layout::coordinate(i, xy);
      if (t.metile_in_bounds(xy)) *t.metile_at(xy) = static_cast<std::remove_cv_t<E>>(metile_elems[i]);
    }
  }

  element_type metile_elems[Layout::capacity];

 private:
  static uint16_t checked(uint16_t i) {
    if (i >= Layout::capacity) metile_rt::fail("metal::cooperative_tensor: element index past get_capacity()");
    return i;
  }
};

}  // namespace metal

namespace metile_rt {

template <typename T>
struct is_cooperative_tensor : std::false_type {};
template <typename E, typename X, typename L>
struct is_cooperative_tensor<metal::cooperative_tensor<E, X, L>> : std::true_type {};

}  // namespace metile_rt
