// simdgroup_matrix: loads and stores move elements of exactly the matrix's
// type between the matrix and device or threadgroup memory; multiplies take
// matrices of Metal's floating-point types (mixed precision allowed, as
// Apple GPUs accumulate half or bfloat products in float).
#pragma once

namespace metal {

template <typename T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(metile_strict::fp_scalar<T>, "metal: simdgroup_matrix elements are half, bfloat or float");
  static_assert(Cols == 8 && Rows == 8, "metal: simdgroup_matrix is 8x8");
  using value_type = T;
  simdgroup_matrix() = default;
  explicit simdgroup_matrix(T diagonal);
  thread vec<T, 2>& thread_elements() thread;
  const thread vec<T, 2>& thread_elements() const thread;
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <typename T, int Cols, int Rows>
simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value);

#define METILE_MATRIX_SPACE(S)                                                                                   \
  template <typename T, int Cols, int Rows>                                                                      \
  void simdgroup_load(thread simdgroup_matrix<T, Cols, Rows>& d, const S T* src, ulong elements_per_row = Cols, \
                      ulong2 matrix_origin = 0, bool transpose_matrix = false);                                  \
  template <typename T, int Cols, int Rows>                                                                      \
  void simdgroup_store(thread const simdgroup_matrix<T, Cols, Rows>& a, S T* dst,                                \
                       ulong elements_per_row = Cols, ulong2 matrix_origin = 0, bool transpose_matrix = false);
METILE_MATRIX_SPACE(device)
METILE_MATRIX_SPACE(threadgroup)
#undef METILE_MATRIX_SPACE

template <typename TD, typename TA, typename TB, typename TC, int C, int R, int K>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, C, R>& d, thread const simdgroup_matrix<TA, K, R>& a,
                                   thread const simdgroup_matrix<TB, C, K>& b,
                                   thread const simdgroup_matrix<TC, C, R>& c);
template <typename TD, typename TA, typename TB, int C, int R, int K>
void simdgroup_multiply(thread simdgroup_matrix<TD, C, R>& d, thread const simdgroup_matrix<TA, K, R>& a,
                        thread const simdgroup_matrix<TB, C, K>& b);

}  // namespace metal
