// Metal Performance Primitives' mpp::tensor_ops::matmul2d on the CPU runtime.
//
// ===== How metile's emitter should call it ==================================
// One BM x BN output tile per threadgroup of SG SIMD-groups (SG * 32 threads),
// operands in device memory (threadgroup memory works the same way, with
// `tensor<threadgroup T, ...>`), K consumed BK at a time, the accumulator in
// registers, a per-element epilogue, bounds from the tensors' extents:
//
//   #include <metal_tensor>
//   #include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
//   using namespace mpp::tensor_ops;
//   // A: M x K row-major (lda), B: K x N row-major (ldb); transposed
//   // operands: swap the extents and set transpose_left / transpose_right.
//   constexpr auto desc = matmul2d_descriptor(BM, BN, BK, false, false, false,
//                                             matmul2d_descriptor::mode::multiply_accumulate);
//   matmul2d<desc, execution_simdgroups<SG>> op;      // SG == 1: execution_simdgroup
//   tensor<device T, dextents<int32_t, 2>, tensor_inline> tA((device T*)A, dextents<int32_t, 2>(K, M),
//                                                          array<int32_t, 2>({1, lda}));
//   tensor<device T, dextents<int32_t, 2>, tensor_inline> tB((device T*)B, dextents<int32_t, 2>(N, K),
//                                                          array<int32_t, 2>({1, ldb}));
//   const int row0 = tgid.y * BM, col0 = tgid.x * BN;
//   auto mA = tA.slice(0, row0);                      // slice(x = column, y = row)
//   auto mB = tB.slice(col0, 0);
//   auto acc = op.get_destination_cooperative_tensor<decltype(mA), decltype(mB), float>();
//   for (uint16_t i = 0; i < acc.get_capacity(); ++i) acc[i] = 0.0f;
//   for (int k = 0; k < K; k += BK) {                 // uniform over the scope
//     auto kA = tA.slice(k, row0);                    // dynamic slices: edges past M, N, K read as 0
//     auto kB = tB.slice(col0, k);
//     op.run(kA, kB, acc);                            // every thread of the scope calls it
//   }
//   for (uint16_t i = 0; i < acc.get_capacity(); ++i) {
//     if (!acc.is_valid_element(i)) continue;         // padding of the layout
//     auto idx = acc.get_multidimensional_index(i);   // idx[0] = column, idx[1] = row in the tile
//     const int r = row0 + idx[1], c = col0 + idx[0];
//     if (r < M && c < N) C[r * ldc + c] = OutT(epilogue(acc[i], r, c));
//   }
//
// (Or apply the epilogue to acc[i] in place and `acc.store(tC.slice(col0, row0))`
// through an output tensor: store writes only in-bounds elements.)  Notes:
//  * in a template (e.g. a metal_kernel with template arguments) the getter
//    is `op.template get_destination_cooperative_tensor<...>()`;
//  * the threadgroup must have exactly SG SIMD-groups; every thread of it
//    runs the same sequence of run calls (no run under a lane-dependent
//    condition, no early return before the last run);
//  * the accumulator's type is tied to the operands' element types in order:
//    get_destination_cooperative_tensor<decltype(left), decltype(right), E>
//    for run(left, right, acc);
//  * never assume which lane holds which element: use is_valid_element and
//    get_multidimensional_index (the layout below is the shim's choice);
//  * a fresh accumulator is zero; zeroing it explicitly (as Apple's example
//    does) costs nothing and does not depend on that;
//  * run is not a threadgroup barrier on a GPU: threadgroup-staged operands
//    still need threadgroup_barrier around their writes.
// ============================================================================
//
// What the shim does:
//  * run(left, right, destination) is a collective of the operation's scope:
//    every thread of it must call it at the same call site, else the launch
//    fails naming the site (a thread that returned instead, or a SIMD-group
//    at another collective: "divergent SIMD-group operation").  For
//    execution_simdgroups<N> the threadgroup must have exactly N SIMD-groups
//    (Apple: undefined otherwise; here an error), and the threads also meet
//    at a threadgroup barrier, so for N > 1 run orders threadgroup memory
//    the way a GPU need not: a missing barrier before run is caught by the
//    race check only with execution_simdgroup.
//  * Each operand is a tensor (inline, offset or handle) or a cooperative
//    tensor of this operation's layout.  Tensor operands must be the same
//    view in every thread of the scope (checked).  One thread computes the
//    whole tile: products and sums in float32 whatever the input types or
//    relaxed_precision (int32, wrapping, for 8-bit integer inputs), starting
//    from the destination under multiply_accumulate and from 0 under
//    multiply, rounded once to the destination type at the end of the run.
//    Operand elements outside a tensor's bounds read as 0; destination
//    elements outside them are neither read nor written.  K is the
//    descriptor's, or (dynamic k) the left operand's remaining extent along K.
//
// Cooperative-tensor layout (the shim's assumption: Apple leaves it
// implementation-defined; it is the layout MLX's NAX kernels,
// mlx/backend/metal/kernels/steel/gemm/nax.h, rely on for execution_simdgroup):
//  * an operand is a grid of 16 x 16 fragments in its stored orientation
//    (left M x K, or K x M when transposed; right K x N, or N x K; destination
//    M x N), padded up to whole fragments;
//  * fragments are numbered in logical order: left by (m-block, k-block),
//    right by (k-block, n-block), destination by (m-block, n-block), row-major;
//    fragment f belongs to SIMD-group f % N of an execution_simdgroups<N> scope
//    and is that SIMD-group's (f / N)-th, elements 8 (f / N) .. 8 (f / N) + 7;
//  * in a fragment, lane l holds element e (0..7) at stored row
//    r(l) + 8 (e / 4) and column c(l) + e % 4, where q = l / 4,
//    r(l) = (q & 4) | ((l / 2) & 3) and c(l) = 4 ((q & 2) | (l & 1));
//  * get_capacity() = 8 * ceil(fragments / N); elements past the operand's
//    rows/columns or past the last fragment are invalid (get_mask,
//    is_valid_element); get_multidimensional_index gives (column, row) in
//    the stored orientation.
// The layout depends on M, N (and K, transposes for inputs) and the scope,
// not on element types or mode: destinations of float and half, or of a
// multiply and a multiply_accumulate operation, index alike.  A cooperative
// tensor's type records the left and right element types it was made for
// (get_destination_cooperative_tensor<Left, Right, E>), and run accepts it
// only with operands of those types in that order, as Metal does.  Fresh
// cooperative tensors are zero (ggml's Metal matmul relies on it).
#pragma once

#include "tensor.h"

namespace metile_rt {

// Threads of an execution scope this runtime supports in one threadgroup.
constexpr unsigned kMaxMatmulThreads = 1024;

constexpr unsigned frag_row(unsigned l) { return ((l >> 2) & 4) | ((l >> 1) & 3); }
constexpr unsigned frag_col(unsigned l) { return (((l >> 2) & 2) | (l & 1)) * 4; }
// The lane holding row r (0..7) and column quad cq (0..3) of a fragment's
// upper or lower half: frag_row / frag_col solved for l.
constexpr unsigned frag_lane(unsigned r, unsigned cq) {
  return 4 * ((r & 4) | (cq & 2) | ((r >> 1) & 1)) + (((r & 1) << 1) | (cq & 1));
}
constexpr bool frag_lanes_consistent() {
  for (unsigned l = 0; l < 32; ++l)
    if (frag_lane(frag_row(l), frag_col(l) / 4) != l) return false;
  return true;
}
static_assert(frag_lanes_consistent(), "fragment lane map is not a bijection");

// Which SIMD-group of the scope and which lane the calling thread is.
template <size_t S>
inline unsigned scope_simdgroup(const Lane* me) {
  return S == 1 ? 0u : me->simdgroup_index_in_threadgroup;
}

template <matmul2d_code LC, size_t S, mm_role Role, typename LeftValue, typename RightValue>
struct mm_layout {
  static constexpr int M = matmul_m(LC), N = matmul_n(LC), K = matmul_k(LC);
  static constexpr bool swapped = (Role == mm_role::left && matmul_tl(LC)) || (Role == mm_role::right && matmul_tr(LC));
  static_assert(Role == mm_role::destination || K > 0, "matmul2d: input cooperative tensors need a static k");
  // The operand as stored.
  static constexpr int rows = Role == mm_role::left ? (swapped ? K : M) : Role == mm_role::right ? (swapped ? N : K) : M;
  static constexpr int cols = Role == mm_role::left ? (swapped ? M : K) : Role == mm_role::right ? (swapped ? K : N) : N;
  // Logical fragment grid P x Q (see the header comment).
  static constexpr int P = ((Role == mm_role::right ? K : M) + 15) / 16;
  static constexpr int Q = ((Role == mm_role::left ? K : N) + 15) / 16;
  static constexpr int fragments = P * Q;
  static constexpr uint16_t capacity = uint16_t(8 * ((fragments + int(S) - 1) / int(S)));

  struct place {
    bool valid;
    int row, col;
  };
  static constexpr place at(unsigned s, unsigned lane, unsigned i) {
    unsigned f = (i / 8) * unsigned(S) + s, e = i % 8;
    if (f >= unsigned(fragments)) return {false, 0, 0};
    unsigned p = f / Q, q = f % Q;
    unsigned fr = swapped ? q : p, fc = swapped ? p : q;
    int row = int(fr * 16 + frag_row(lane) + (e / 4) * 8), col = int(fc * 16 + frag_col(lane) + e % 4);
    return {row < rows && col < cols, row, col};
  }
  struct owner {
    unsigned simdgroup, lane, index;
  };
  static constexpr owner of(int row, int col) {
    unsigned fr = unsigned(row) / 16, fc = unsigned(col) / 16;
    unsigned p = swapped ? fc : fr, q = swapped ? fr : fc;
    unsigned f = p * Q + q, rr = unsigned(row) % 16, cc = unsigned(col) % 16;
    return {f % unsigned(S), frag_lane(rr % 8, cc / 4), (f / unsigned(S)) * 8 + (rr / 8) * 4 + cc % 4};
  }

  // The cooperative_tensor interface, for the calling thread.
  static bool valid(uint16_t i) {
    const Lane* me = current_lane;
    unsigned s = scope_simdgroup<S>(me);
    return s < S && at(s, me->thread_index_in_simdgroup, i).valid;
  }
  static void coordinate(uint16_t i, long* xy) {
    const Lane* me = current_lane;
    place p = at(scope_simdgroup<S>(me) % S, me->thread_index_in_simdgroup, i);
    xy[0] = p.col;
    xy[1] = p.row;
  }
};

template <typename T>
struct mm_operand_traits {
  static constexpr bool coop = false, tensor = false, is_const = false;
  static constexpr size_t rank = 2;
  using value_type = float;
  using layout = void;
};
template <typename E, typename X, typename D, typename... Tags>
struct mm_operand_traits<metal::tensor<E, X, D, Tags...>> {
  static constexpr bool coop = false, tensor = true, is_const = std::is_const_v<E>;
  static constexpr size_t rank = X::rank();
  using value_type = std::remove_cv_t<E>;
  using layout = void;
};
template <typename E, typename X, typename L>
struct mm_operand_traits<metal::cooperative_tensor<E, X, L>> {
  static constexpr bool coop = true, tensor = false, is_const = false;
  static constexpr size_t rank = 2;
  using value_type = E;
  using layout = L;
};

template <typename T>
using mm_traits = mm_operand_traits<std::remove_cv_t<T>>;

// What each thread of a scope hands to the thread that computes: its three
// operands.  Fibers of a threadgroup share one OS thread, and a threadgroup
// runs to completion before the next starts on it, so a thread_local table
// indexed by thread is the threadgroup's.
struct mm_slot {
  const void* operand[3];
};
inline thread_local mm_slot mm_table[kMaxMatmulThreads];

[[noreturn]] inline void mm_fail_scope(Lane* me, std::uint32_t mask, unsigned scope) {
  static thread_local char msg[400];
  unsigned here = __builtin_popcount(mask);
  unsigned first = me->simdgroup_index_in_threadgroup * kSimdWidth, n = me->threads_per_threadgroup[0] *
                                                                          me->threads_per_threadgroup[1] *
                                                                          me->threads_per_threadgroup[2];
  unsigned size = n - first < kSimdWidth ? n - first : kSimdWidth;
  char* p = append_str(msg, "mpp::tensor_ops::matmul2d::run: ");
  p = append_uint(p, here);
  p = append_str(p, " of the 32 threads of SIMD-group ");
  p = append_uint(p, me->simdgroup_index_in_threadgroup);
  if (here == size) {
    p = append_str(p, " exist (the threadgroup size is not a multiple of 32); the operation's scope (");
  } else {
    p = append_str(p, " reached this run, the others returned before it; every thread of the operation's "
                      "scope (");
  }
  p = append_str(p, scope == 1 ? "execution_simdgroup" : "execution_simdgroups<N>");
  p = append_str(p, ") must call run: Metal requires the call to be execution-scope uniform");
  *p = 0;
  me->rt->fail(me, msg);
  __builtin_unreachable();
}

// All threads of the scope meet here: every lane of the caller's SIMD-group
// (a thread that returned instead is reported), then, for several
// SIMD-groups, the whole threadgroup.
template <size_t S>
inline void mm_sync(Site site) {
  exchange(0, site, [](Lane* me, std::uint32_t mask, const auto&) {
    if (mask != 0xffffffffu) mm_fail_scope(me, mask, unsigned(S));
    return 0;
  });
  if constexpr (S > 1) {
    Lane* me = current_lane;
    me->rt->threadgroup_barrier(me, site);
    current_lane = me;
  }
}

template <typename Acc, typename T>
inline Acc mm_to_acc(const T& v) {
  return static_cast<Acc>(v);
}

// Operand element (row, col) of the stored operand, as Acc; `slot` is the
// operand's position in run's argument list, `base` the scope's first thread.
template <typename Acc, mm_role Role, matmul2d_code C, size_t S, typename T>
inline Acc mm_fetch(const T& mine, unsigned base, int row, int col) {
  using Tr = mm_traits<T>;
  if constexpr (Tr::coop) {
    using L = typename Tr::layout;
    if (row >= L::rows || col >= L::cols) return Acc(0);
    auto o = L::of(row, col);
    const T* peer = static_cast<const T*>(mm_table[base + o.simdgroup * kSimdWidth + o.lane].operand[int(Role)]);
    return mm_to_acc<Acc>(peer->metile_elems[o.index]);
  } else {
    long xy[2] = {col, row};
    return mine.metile_in_bounds(xy) ? mm_to_acc<Acc>(*mine.metile_at(xy)) : Acc(0);
  }
}

template <typename T>
inline void mm_check_uniform(const T& mine, unsigned base, unsigned count, int slot, const char* what) {
  if constexpr (mm_traits<T>::tensor) {
    for (unsigned t = 0; t < count; ++t) {
      const T* other = static_cast<const T*>(mm_table[base + t].operand[slot]);
      if (!mine.metile_same_view(*other)) {
        static thread_local char msg[300];
        char* p = append_str(msg, "mpp::tensor_ops::matmul2d::run: the threads of the execution scope passed "
                                  "different ");
        p = append_str(p, what);
        p = append_str(p, " tensors (thread ");
        p = append_uint(p, base);
        p = append_str(p, " and thread ");
        p = append_uint(p, base + t);
        p = append_str(p, " of the threadgroup); an operation's operands must be the same for its whole scope");
        *p = 0;
        fail(msg);
      }
    }
  }
}

// The whole tile, computed by one thread of the scope from every thread's
// operands.  Buffers are thread_local (per OS thread, per tile shape): a
// fiber's stack is too small for a large tile.
template <matmul2d_code C, size_t S, typename L, typename R, typename D>
inline void mm_compute(unsigned base, const L& left, const R& right, D& dest) {
  constexpr int M = matmul_m(C), N = matmul_n(C), KC = 16;
  constexpr bool TL = matmul_tl(C), TR = matmul_tr(C);
  using DV = typename mm_traits<D>::value_type;
  using Acc = std::conditional_t<std::is_same_v<DV, int32_t>, int32_t, float>;
  static thread_local Acc acc[M * N];
  static thread_local Acc abuf[M * KC];
  static thread_local Acc bbuf[KC * N];

  const unsigned count = unsigned(S) * kSimdWidth;
  mm_check_uniform(left, base, count, 0, "left");
  mm_check_uniform(right, base, count, 1, "right");
  mm_check_uniform(dest, base, count, 2, "destination");

  int K = matmul_k(C);
  if constexpr (!mm_traits<L>::coop) {
    if (K < 0) {
      // Remaining extent along K of the left operand (x when stored M x K).
      int d = TL ? 1 : 0;
      long rest = long(left.metile_limit[d]) - long(left.metile_origin[d]);
      K = rest > 0 ? int(rest) : 0;
    }
  }

  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      acc[m * N + n] = matmul_accumulate(C) ? mm_fetch<Acc, mm_role::destination, C, S>(dest, base, m, n) : Acc(0);

  for (int k0 = 0; k0 < K; k0 += KC) {
    const int kc = K - k0 < KC ? K - k0 : KC;
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < kc; ++k)
        abuf[m * KC + k] = TL ? mm_fetch<Acc, mm_role::left, C, S>(left, base, k0 + k, m)
                              : mm_fetch<Acc, mm_role::left, C, S>(left, base, m, k0 + k);
    for (int k = 0; k < kc; ++k)
      for (int n = 0; n < N; ++n)
        bbuf[k * N + n] = TR ? mm_fetch<Acc, mm_role::right, C, S>(right, base, n, k0 + k)
                             : mm_fetch<Acc, mm_role::right, C, S>(right, base, k0 + k, n);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        Acc s = acc[m * N + n];
        for (int k = 0; k < kc; ++k) {
          if constexpr (std::is_same_v<Acc, float>)
            s = __builtin_fmaf(abuf[m * KC + k], bbuf[k * N + n], s);
          else  // int32 products and sums wrap, without undefined behaviour
            s = int32_t(uint32_t(s) + uint32_t(abuf[m * KC + k]) * uint32_t(bbuf[k * N + n]));
        }
        acc[m * N + n] = s;
      }
  }

  if constexpr (mm_traits<D>::coop) {
    using Lay = typename mm_traits<D>::layout;
    for (unsigned s = 0; s < S; ++s)
      for (unsigned lane = 0; lane < kSimdWidth; ++lane) {
        D* peer = const_cast<D*>(static_cast<const D*>(mm_table[base + s * kSimdWidth + lane].operand[2]));
        for (unsigned i = 0; i < Lay::capacity; ++i) {
          auto p = Lay::at(s, lane, i);
          if (p.valid) peer->metile_elems[i] = static_cast<DV>(acc[p.row * N + p.col]);
        }
      }
  } else {
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        long xy[2] = {n, m};
        if (dest.metile_in_bounds(xy)) *dest.metile_at(xy) = static_cast<DV>(acc[m * N + n]);
      }
  }
}

}  // namespace metile_rt

namespace mpp {
namespace tensor_ops {

template <metile_rt::matmul2d_code Descriptor, typename Scope, class... Args>
class matmul2d;

namespace metile_detail {
template <typename T>
struct scope_size {
  static constexpr size_t value = 0;
};
template <size_t N>
struct scope_size<metal::execution_simdgroups<N>> {
  static constexpr size_t value = N;
};
}  // namespace metile_detail

template <metile_rt::matmul2d_code Descriptor, typename Scope, class... Args>
class matmul2d {
  static_assert(metile_rt::matmul_valid(Descriptor),
                "mpp::tensor_ops::matmul2d_descriptor: m and n must be 1..65535 and k below 1048575 (or dynamic)");
  static_assert(std::is_same_v<Scope, metal::execution_simdgroups<metile_detail::scope_size<Scope>::value>> ||
                    std::is_same_v<Scope, metal::execution_thread>,
                "mpp::tensor_ops::matmul2d: the scope is metal::execution_simdgroup, execution_simdgroups<N> or "
                "execution_thread");
  static_assert(!std::is_same_v<Scope, metal::execution_thread>,
                "metile's CPU runtime: matmul2d with execution_thread is not supported (use execution_simdgroup)");
  static constexpr size_t S = metile_detail::scope_size<Scope>::value;
  static_assert(S * metile_rt::kSimdWidth <= metile_rt::kMaxMatmulThreads, "matmul2d: more than 1024 threads");

  template <metile_rt::mm_role Role, typename LV, typename RV>
  using layout = metile_rt::mm_layout<metile_rt::mm_layout_code(Descriptor, Role), S, Role, LV, RV>;

 public:
  static constexpr matmul2d_descriptor descriptor = metile_decode(Descriptor);
  using scope = Scope;

  matmul2d() = default;

  template <typename LeftOperand, typename RightOperand, typename ElementType, typename CoordType = int>
  using cooperative_tensor_destination_t =
      metal::cooperative_tensor<ElementType, metal::dextents<CoordType, 2>,
                                layout<metile_rt::mm_role::destination, typename metile_rt::mm_traits<LeftOperand>::value_type,
                                       typename metile_rt::mm_traits<RightOperand>::value_type>>;
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int>
  using cooperative_tensor_left_input_t =
      metal::cooperative_tensor<LeftElementType, metal::dextents<CoordType, 2>,
                                layout<metile_rt::mm_role::left, LeftElementType, RightElementType>>;
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int>
  using cooperative_tensor_right_input_t =
      metal::cooperative_tensor<RightElementType, metal::dextents<CoordType, 2>,
                                layout<metile_rt::mm_role::right, LeftElementType, RightElementType>>;

  template <typename LeftOperand, typename RightOperand, typename ElementType, typename CoordType = int>
  cooperative_tensor_destination_t<LeftOperand, RightOperand, ElementType, CoordType>
  get_destination_cooperative_tensor() const {
    using LT = metile_rt::mm_traits<LeftOperand>;
    using RT = metile_rt::mm_traits<RightOperand>;
    static_assert((LT::coop || LT::tensor) && (RT::coop || RT::tensor),
                  "get_destination_cooperative_tensor<Left, Right, Element>: Left and Right are the operand "
                  "types (tensors or cooperative tensors), e.g. decltype(mA)");
    static_assert(metile_rt::mm_types_ok<typename LT::value_type, typename RT::value_type, ElementType>,
                  "get_destination_cooperative_tensor: unsupported (left, right, destination) element types");
    return zeroed<cooperative_tensor_destination_t<LeftOperand, RightOperand, ElementType, CoordType>>();
  }
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int>
  cooperative_tensor_left_input_t<LeftElementType, RightElementType, ElementType, CoordType>
  get_left_input_cooperative_tensor() const {
    static_assert(metile_rt::mm_types_ok<LeftElementType, RightElementType, ElementType>,
                  "get_left_input_cooperative_tensor<Left, Right, Destination>: unsupported element types");
    return zeroed<cooperative_tensor_left_input_t<LeftElementType, RightElementType, ElementType, CoordType>>();
  }
  template <typename LeftElementType, typename RightElementType, typename ElementType, typename CoordType = int>
  cooperative_tensor_right_input_t<LeftElementType, RightElementType, ElementType, CoordType>
  get_right_input_cooperative_tensor() const {
    static_assert(metile_rt::mm_types_ok<LeftElementType, RightElementType, ElementType>,
                  "get_right_input_cooperative_tensor<Left, Right, Destination>: unsupported element types");
    return zeroed<cooperative_tensor_right_input_t<LeftElementType, RightElementType, ElementType, CoordType>>();
  }

  // Apple's run takes its operands by non-const reference (so a temporary
  // such as A.slice(...) cannot be passed directly, on Metal either).
  template <typename LeftOperand, typename RightOperand, typename DestinationOperand>
  void run(LeftOperand& left, RightOperand& right, DestinationOperand& destination,
           std::source_location loc = std::source_location::current()) const {
    using LT = metile_rt::mm_traits<LeftOperand>;
    using RT = metile_rt::mm_traits<RightOperand>;
    using DT = metile_rt::mm_traits<DestinationOperand>;
    static_assert(LT::coop || LT::tensor, "matmul2d::run: the left operand is not a tensor or cooperative tensor");
    static_assert(RT::coop || RT::tensor, "matmul2d::run: the right operand is not a tensor or cooperative tensor");
    static_assert(DT::coop || DT::tensor,
                  "matmul2d::run: the destination is not a tensor or cooperative tensor");
    static_assert(LT::rank == 2 && RT::rank == 2 && DT::rank == 2, "matmul2d::run: operands are rank-2 tensors");
    static_assert(metile_rt::mm_run_rules<Descriptor, typename LT::value_type, typename RT::value_type,
                                          typename DT::value_type, LT::coop, RT::coop, DT::is_const>::ok);
    using LV = typename LT::value_type;
    using RV = typename RT::value_type;
    static_assert(!LT::coop || std::is_same_v<typename LT::layout, layout<metile_rt::mm_role::left, LV, RV>>,
                  "matmul2d::run: a cooperative left operand must come from this operation's "
                  "get_left_input_cooperative_tensor<Left, Right, ...> for this run's element types (same m, k, "
                  "transpose_left and scope)");
    static_assert(!RT::coop || std::is_same_v<typename RT::layout, layout<metile_rt::mm_role::right, LV, RV>>,
                  "matmul2d::run: a cooperative right operand must come from this operation's "
                  "get_right_input_cooperative_tensor<Left, Right, ...> for this run's element types (same k, n, "
                  "transpose_right and scope)");
    static_assert(!DT::coop || std::is_same_v<typename DT::layout, layout<metile_rt::mm_role::destination, LV, RV>>,
                  "matmul2d::run: a cooperative destination must come from get_destination_cooperative_tensor<"
                  "Left, Right, ...> of an operation with the same m, n and scope, with Left and Right of this "
                  "run's element types, in this order (Metal: input types must match cooperative tensor types)");

    using namespace metile_rt;
    Lane* me = current_lane;
    const Site site = site_of(loc);
    if constexpr (S > 1) {
      if (me->simdgroups_per_threadgroup != S) {
        static thread_local char msg[300];
        char* p = append_str(msg, "mpp::tensor_ops::matmul2d::run: the operation's scope is execution_simdgroups<");
        p = append_uint(p, S);
        p = append_str(p, "> but the threadgroup has ");
        p = append_uint(p, me->simdgroups_per_threadgroup);
        p = append_str(p, " SIMD-groups (Metal: undefined unless they match)");
        *p = 0;
        fail(msg);
      }
    }
    const unsigned tid = me->thread_index_in_threadgroup;
    if (tid >= kMaxMatmulThreads) fail("mpp::tensor_ops::matmul2d::run: more than 1024 threads in the threadgroup");
    mm_table[tid] = mm_slot{{&left, &right, &destination}};
    mm_sync<S>(site);
    me = current_lane;
    const bool leader = S == 1 ? me->thread_index_in_simdgroup == 0 : tid == 0;
    if (leader) {
      const unsigned base = S == 1 ? me->simdgroup_index_in_threadgroup * kSimdWidth : 0;
      mm_compute<Descriptor, S>(base, left, right, destination);
    }
    // Nobody may change its operands before the computing thread has read them.
    mm_sync<S>(site);
  }

 private:
  // A fresh cooperative tensor is zero: ggml's Metal matmul (llama.cpp,
  // kernel_mul_mm's tensor path) accumulates into one without initialising
  // it, and the operation's header declares an initialiser for destinations.
  template <typename CT>
  static CT zeroed() {
    CT ct;
    for (unsigned i = 0; i < CT::get_capacity(); ++i) ct.metile_elems[i] = typename CT::element_type(0);
    return ct;
  }
};

}  // namespace tensor_ops
}  // namespace mpp
