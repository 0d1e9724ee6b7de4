// Metal's matrix types (<metal_matrix>): floatCxR and halfCxR for C, R in 2..4, C
// columns of R-element vectors (column-major; sizes and alignments follow the
// vectors', as Metal's table gives them).  Constructed from one scalar (the
// diagonal, zeros elsewhere), from C column vectors, or from a matrix of the same
// shape; a list of scalars is not a constructor Metal has, nor here.  m[c] is
// column c, m[c][r] one element; *, +, - as MSL defines them (matrix * vector,
// vector * matrix, matrix * matrix, with a scalar), transpose and determinant.
// C++14, so the strict model includes it too (it is already as strict as Metal).
#pragma once

namespace metal {

template <typename T, int C, int R>
struct matrix {
  static_assert(C >= 2 && C <= 4 && R >= 2 && R <= 4, "Metal matrices are 2x2 to 4x4");
  typedef ::vec<T, R> column_type;
  column_type columns[C];

  matrix() = default;
  explicit matrix(T diagonal) {
    for (int c = 0; c < C; ++c) {
      columns[c] = T(0);
      if (c < R) columns[c][c] = diagonal;
    }
  }
  template <typename... V, typename std::enable_if<sizeof...(V) == C && C >= 2, int>::type = 0>
  matrix(V... cols) : columns{cols...} {}
  template <typename U>
  explicit matrix(const matrix<U, C, R>& other) {
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r) columns[c][r] = static_cast<T>(other.columns[c][r]);
  }

  column_type& operator[](int c) { return columns[c]; }
  const column_type& operator[](int c) const { return columns[c]; }
};

#define METILE_MATRIX_TYPES(T, NAME)                                             \
  typedef matrix<T, 2, 2> NAME##2x2;                                            \
  typedef matrix<T, 2, 3> NAME##2x3;                                            \
  typedef matrix<T, 2, 4> NAME##2x4;                                            \
  typedef matrix<T, 3, 2> NAME##3x2;                                            \
  typedef matrix<T, 3, 3> NAME##3x3;                                            \
  typedef matrix<T, 3, 4> NAME##3x4;                                            \
  typedef matrix<T, 4, 2> NAME##4x2;                                            \
  typedef matrix<T, 4, 3> NAME##4x3;                                            \
  typedef matrix<T, 4, 4> NAME##4x4;
METILE_MATRIX_TYPES(float, float)
METILE_MATRIX_TYPES(half, half)
#undef METILE_MATRIX_TYPES

// matrix * vector: the columns weighted by the vector's elements
template <typename T, int C, int R>
::vec<T, R> operator*(const matrix<T, C, R>& m, ::vec<T, C> v) {
  ::vec<T, R> out = m.columns[0] * v[0];
  for (int c = 1; c < C; ++c) out += m.columns[c] * v[c];
  return out;
}
// vector * matrix: the vector's dot product with each column
template <typename T, int C, int R>
::vec<T, C> operator*(::vec<T, R> v, const matrix<T, C, R>& m) {
  ::vec<T, C> out;
  for (int c = 0; c < C; ++c) {
    T s = v[0] * m.columns[c][0];
    for (int r = 1; r < R; ++r) s += v[r] * m.columns[c][r];
    out[c] = s;
  }
  return out;
}
template <typename T, int K, int R, int C>
matrix<T, C, R> operator*(const matrix<T, K, R>& a, const matrix<T, C, K>& b) {
  matrix<T, C, R> out;
  for (int c = 0; c < C; ++c) out.columns[c] = a * b.columns[c];
  return out;
}
template <typename T, int C, int R>
matrix<T, C, R> operator*(const matrix<T, C, R>& m, T s) {
  matrix<T, C, R> out;
  for (int c = 0; c < C; ++c) out.columns[c] = m.columns[c] * s;
  return out;
}
template <typename T, int C, int R>
matrix<T, C, R> operator*(T s, const matrix<T, C, R>& m) { return m * s; }
template <typename T, int C, int R>
matrix<T, C, R> operator+(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> out;
  for (int c = 0; c < C; ++c) out.columns[c] = a.columns[c] + b.columns[c];
  return out;
}
template <typename T, int C, int R>
matrix<T, C, R> operator-(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> out;
  for (int c = 0; c < C; ++c) out.columns[c] = a.columns[c] - b.columns[c];
  return out;
}
template <typename T, int C, int R>
matrix<T, R, C> transpose(const matrix<T, C, R>& m) {
  matrix<T, R, C> out;
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out.columns[r][c] = m.columns[c][r];
  return out;
}
template <typename T>
T determinant(const matrix<T, 2, 2>& m) {
  return m[0][0] * m[1][1] - m[1][0] * m[0][1];
}
template <typename T>
T determinant(const matrix<T, 3, 3>& m) {
  return m[0][0] * (m[1][1] * m[2][2] - m[2][1] * m[1][2]) -
         m[1][0] * (m[0][1] * m[2][2] - m[2][1] * m[0][2]) +
         m[2][0] * (m[0][1] * m[1][2] - m[1][1] * m[0][2]);
}
template <typename T>
T determinant(const matrix<T, 4, 4>& m) {
  // expansion along the first column, by 3x3 minors
  T det = T(0);
  for (int i = 0; i < 4; ++i) {
    matrix<T, 3, 3> minor;
    for (int c = 1; c < 4; ++c)
      for (int r = 0, k = 0; r < 4; ++r)
        if (r != i) minor.columns[c - 1][k++] = m[c][r];
    T term = m[0][i] * determinant(minor);
    det += (i % 2) ? -term : term;
  }
  return det;
}

}  // namespace metal
