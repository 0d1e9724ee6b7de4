// The parts of Metal 4's tensor API that the runtime shim (tensor.h,
// tensor_ops.h) and the strict model (include_strict/metile_msl_strict/
// tensor.h, tensor_ops.h) share: metal::array, extents / dextents,
// dynamic_extent, the tensor descriptor tags, the execution scopes,
// mpp::tensor_ops::matmul2d_descriptor and the rules run() checks at compile
// time.  C++14, because the strict model compiles it; no address spaces,
// because they mean different things in the two.
//
// Spellings and semantics come from public sources, recorded in
// python/metile/codegen/README.md ("Metal 4 tensor ops: API facts").
#pragma once

namespace metal {

// std::dynamic_extent's value; descriptors take it as static_cast<int>(...)
// (that is, -1) to ask for a K read from the operand tensors.
constexpr size_t dynamic_extent = static_cast<size_t>(-1);

#ifndef METILE_METAL_ARRAY_DEFINED
#define METILE_METAL_ARRAY_DEFINED
// Metal's fixed-size array (<metal_array>): an aggregate, so
// `array<int32_t, 2>({1, ld})` and `array<int32_t, 2>{1, ld}` both build one.
template <typename T, size_t N>
struct array {
  T metile_elems[N];
  constexpr T& operator[](size_t i) { return metile_elems[i]; }
  constexpr const T& operator[](size_t i) const { return metile_elems[i]; }
  static constexpr size_t size() { return N; }
  constexpr T* begin() { return metile_elems; }
  constexpr T* end() { return metile_elems + N; }
  constexpr const T* begin() const { return metile_elems; }
  constexpr const T* end() const { return metile_elems + N; }
};
#endif

// extents<IndexType, E...>: a shape whose entries are static (a number) or
// dynamic (dynamic_extent, given at construction), like std::extents.  Index
// 0 is the innermost dimension: a row-major R x C matrix has extents (C, R).
template <typename IndexType, size_t... Extents>
struct extents {
  using index_type = IndexType;
  using size_type = size_t;
  using rank_type = size_t;

  static constexpr size_t rank() { return sizeof...(Extents); }
  static constexpr size_t rank_dynamic() {
    size_t n = 0;
    for (size_t e : {size_t(0), Extents...}) n += e == dynamic_extent;
    return n;
  }
  static constexpr size_t static_extent(size_t i) {
    const size_t e[] = {size_t(0), Extents...};
    return e[i + 1];
  }

  constexpr extents() : metile_e{} {
    for (size_t i = 0; i < rank(); ++i)
      metile_e[i] = static_extent(i) == dynamic_extent ? IndexType(0) : IndexType(static_extent(i));
  }
  // Either every extent or only the dynamic ones, in order (std::extents' rule).
  template <typename... I, typename std::enable_if<sizeof...(I) != 0 &&
                                                       (sizeof...(I) == sizeof...(Extents) ||
                                                        sizeof...(I) == rank_dynamic()),
                                                   int>::type = 0>
  constexpr extents(I... values) : metile_e{} {
    const IndexType v[] = {IndexType(values)...};
    size_t next = 0;
    for (size_t i = 0; i < rank(); ++i) {
      if (static_extent(i) != dynamic_extent)
        metile_e[i] = IndexType(static_extent(i));
      else
        metile_e[i] = sizeof...(I) == rank() ? v[i] : v[next++];
    }
  }

  constexpr index_type extent(size_t i) const { return metile_e[i]; }

  IndexType metile_e[sizeof...(Extents) == 0 ? 1 : sizeof...(Extents)];
};

template <typename IndexType, size_t Rank, typename Seq = std::make_index_sequence<Rank>>
struct metile_dextents;
template <typename IndexType, size_t Rank, size_t... Is>
struct metile_dextents<IndexType, Rank, std::index_sequence<Is...>> {
  using type = extents<IndexType, (static_cast<void>(Is), dynamic_extent)...>;
};
template <typename IndexType, size_t Rank>
using dextents = typename metile_dextents<IndexType, Rank>::type;

// The three kinds of tensor: bound by the host (handle), a handle with a
// shifted origin (offset, what slice() of a handle gives), and a view built
// inside the kernel over a pointer (inline).
struct tensor_handle {};
struct tensor_offset {};
struct tensor_inline {};

// Who runs an operation: all threads of N SIMD-groups together, or one thread.
template <size_t Size>
class execution_simdgroups {
  static_assert(Size != 0, "metal: execution_simdgroups<0> is not a scope");

 public:
  static constexpr size_t static_size = Size;
  constexpr uint size() const { return uint(Size); }
};
template <size_t Size>
class execution_threads {
  static_assert(Size == 1, "metal: execution_threads<N> exists only for N = 1 (execution_thread)");

 public:
  static constexpr size_t static_size = Size;
  constexpr uint size() const { return uint(Size); }
};
using execution_simdgroup = execution_simdgroups<1>;
using execution_thread = execution_threads<1>;

}  // namespace metal

namespace metile_rt {

// matmul2d takes its descriptor as a template argument.  Metal 4 declares it
// as a class-type non-type template parameter (C++20); C++14, which the
// strict model checks, has none, so the descriptor converts to this integral
// code and both models take the code.  `matmul2d<desc, ...>` reads the same.
enum class matmul2d_code : unsigned long long {};

constexpr unsigned long long kMatmulInvalid = ~0ull;
constexpr unsigned kMatmulDynamicK = 0xFFFFFu;

// k <= 0, static_cast<int>(dynamic_extent) (-1) and INT_MAX
// (dynamic_length_v<int>) all mean "K from the operand tensors": public
// kernels pass each of these.
constexpr bool matmul_k_dynamic(int k) { return k <= 0 || k == __INT_MAX__; }

constexpr matmul2d_code matmul_encode(int m, int n, int k, bool tl, bool tr, bool relaxed, bool accumulate) {
  return (m < 1 || m > 0xFFFF || n < 1 || n > 0xFFFF || (!matmul_k_dynamic(k) && k >= int(kMatmulDynamicK)))
             ? matmul2d_code(kMatmulInvalid)
             : matmul2d_code(static_cast<unsigned long long>(m) | static_cast<unsigned long long>(n) << 16 |
                             static_cast<unsigned long long>(matmul_k_dynamic(k) ? kMatmulDynamicK : unsigned(k))
                                 << 32 |
                             static_cast<unsigned long long>(tl) << 52 | static_cast<unsigned long long>(tr) << 53 |
                             static_cast<unsigned long long>(relaxed) << 54 |
                             static_cast<unsigned long long>(accumulate) << 55);
}
constexpr unsigned long long matmul_bits(matmul2d_code c) { return static_cast<unsigned long long>(c); }
constexpr bool matmul_valid(matmul2d_code c) { return matmul_bits(c) != kMatmulInvalid; }
constexpr int matmul_m(matmul2d_code c) { return int(matmul_bits(c) & 0xFFFF); }
constexpr int matmul_n(matmul2d_code c) { return int(matmul_bits(c) >> 16 & 0xFFFF); }
constexpr bool matmul_dynamic_k(matmul2d_code c) { return (matmul_bits(c) >> 32 & 0xFFFFF) == kMatmulDynamicK; }
// -1 for a dynamic K.
constexpr int matmul_k(matmul2d_code c) { return matmul_dynamic_k(c) ? -1 : int(matmul_bits(c) >> 32 & 0xFFFFF); }
constexpr bool matmul_tl(matmul2d_code c) { return matmul_bits(c) >> 52 & 1; }
constexpr bool matmul_tr(matmul2d_code c) { return matmul_bits(c) >> 53 & 1; }
constexpr bool matmul_relaxed(matmul2d_code c) { return matmul_bits(c) >> 54 & 1; }
constexpr bool matmul_accumulate(matmul2d_code c) { return matmul_bits(c) >> 55 & 1; }

// Which operand a cooperative tensor of a matmul2d holds.
enum class mm_role { left, right, destination };

// The part of a descriptor a cooperative tensor's layout depends on: M and N
// for the destination, the operand's two dimensions and transpose flag for an
// input.  Destinations of operations that differ only in mode, K or
// precision have one type, so one accumulator can serve a `multiply` first
// step and `multiply_accumulate` steps after it.
constexpr matmul2d_code mm_layout_code(matmul2d_code c, mm_role role) {
  return matmul2d_code(role == mm_role::destination ? matmul_bits(c) & 0xFFFFFFFFull
                       : role == mm_role::left      ? matmul_bits(c) & (0xFFFFull | 0xFFFFFull << 32 | 1ull << 52)
                                                    : matmul_bits(c) & (0xFFFFull << 16 | 0xFFFFFull << 32 | 1ull << 53));
}

// The layout tag of a matmul2d cooperative tensor (defined by the runtime
// shim; the strict model only names it).  It carries the element types of
// the left and right operands it was made for: Metal's run refuses a
// cooperative tensor made for other input types ("Input types must match
// cooperative tensor types").
template <matmul2d_code LayoutCode, size_t Simdgroups, mm_role Role, typename LeftValue, typename RightValue>
struct mm_layout;

// Element kinds of matmul2d operands.
template <typename T>
constexpr int mm_kind = std::is_same<T, half>::value     ? 1
                        : std::is_same<T, bfloat>::value ? 2
                        : std::is_same<T, float>::value  ? 3
                        : std::is_same<T, int8_t>::value ? 4
                        : std::is_same<T, uint8_t>::value ? 5
                        : std::is_same<T, int32_t>::value ? 6
                                                          : 0;
template <typename T>
constexpr bool mm_input_type = mm_kind<T> >= 1 && mm_kind<T> <= 5;
template <typename T>
constexpr bool mm_int8_type = mm_kind<T> == 4 || mm_kind<T> == 5;
// Apple's MPPTensorOpsMatMul2d.h lists the supported (left, right,
// destination) triples; they follow one rule, taken here as the check:
// inputs half/bfloat/float/int8/uint8, an int32 destination exactly for two
// 8-bit integer inputs, else a half/bfloat/float destination.  (4-bit
// formats are not modelled.)
template <typename L, typename R, typename D>
constexpr bool mm_types_ok = mm_input_type<L> && mm_input_type<R> &&
                             (mm_kind<D> == 6 ? (mm_int8_type<L> && mm_int8_type<R>)
                                              : (mm_kind<D> >= 1 && mm_kind<D> <= 3));

// The compile-time rules of matmul2d::run shared by both models.
template <matmul2d_code C, typename LV, typename RV, typename DV, bool LeftCoop, bool RightCoop, bool DestConst>
struct mm_run_rules {
  static_assert(mm_types_ok<LV, RV, DV>,
                "mpp::tensor_ops::matmul2d: unsupported (left, right, destination) element types; inputs are "
                "half, bfloat, float, int8_t or uint8_t, the destination half, bfloat or float, or int32_t for "
                "two 8-bit integer inputs");
  static_assert(!(LeftCoop || RightCoop) || !matmul_dynamic_k(C),
                "mpp::tensor_ops::matmul2d: cooperative-tensor inputs need a static k in the descriptor");
  static_assert(!DestConst, "mpp::tensor_ops::matmul2d: the destination tensor has const elements");
  static constexpr bool ok = true;
};

}  // namespace metile_rt

namespace mpp {
namespace tensor_ops {

struct matmul2d_descriptor {
  enum class mode {
    multiply,
    multiply_accumulate,
  };

  int m, n, k;
  bool transpose_left, transpose_right;
  bool relaxed_precision;
  mode matmul_mode;

  constexpr matmul2d_descriptor(int m_, int n_, int k_ = static_cast<int>(metal::dynamic_extent),
                                bool transpose_left_ = false, bool transpose_right_ = false,
                                bool relaxed_precision_ = false, mode matmul_mode_ = mode::multiply)
      : m(m_),
        n(n_),
        k(k_),
        transpose_left(transpose_left_),
        transpose_right(transpose_right_),
        relaxed_precision(relaxed_precision_),
        matmul_mode(matmul_mode_) {}

  // See metile_rt::matmul2d_code.
  constexpr operator metile_rt::matmul2d_code() const {
    return metile_rt::matmul_encode(m, n, k, transpose_left, transpose_right, relaxed_precision,
                                    matmul_mode == mode::multiply_accumulate);
  }
};

constexpr matmul2d_descriptor metile_decode(metile_rt::matmul2d_code c) {
  return matmul2d_descriptor(metile_rt::matmul_m(c), metile_rt::matmul_n(c), metile_rt::matmul_k(c),
                             metile_rt::matmul_tl(c), metile_rt::matmul_tr(c), metile_rt::matmul_relaxed(c),
                             metile_rt::matmul_accumulate(c) ? matmul2d_descriptor::mode::multiply_accumulate
                                                             : matmul2d_descriptor::mode::multiply);
}

}  // namespace tensor_ops
}  // namespace mpp
