// simdgroup_matrix<T, 8, 8>: an 8x8 matrix spread over the 32 lanes of a
// SIMD-group, two elements per lane.
//
// Lane -> element mapping (Apple does not document it; this is the layout
// MLX's steel mma.h, metal-flash-attention and tinygrad assume, and
// thread_elements() exposes it): lane l, q = l / 4,
//   row = (q & 4) + (l / 2) % 4
//   col = (q & 2) * 2 + (l % 2) * 2
// and the lane holds M[row][col], M[row][col + 1] as thread_elements()[0..1].
//
// Loads and stores are per lane (each lane touches only its own elements),
// so they need no synchronisation; multiplies exchange the operands once.
// Matrix multiplies need all 32 lanes of the SIMD-group live.
#pragma once

namespace metile_rt {

constexpr unsigned mat_row(unsigned l) { return ((l / 4) & 4) + (l / 2) % 4; }
constexpr unsigned mat_col(unsigned l) { return ((l / 4) & 2) * 2 + (l % 2) * 2; }

// The lane holding M[r][c] (c even: the pair c, c + 1).
struct lane_table {
  unsigned char lane[8][4];
  constexpr lane_table() : lane{} {
    for (unsigned l = 0; l < 32; ++l) lane[mat_row(l)][mat_col(l) / 2] = static_cast<unsigned char>(l);
  }
};
inline constexpr lane_table kLaneOf{};

}  // namespace metile_rt

namespace metal {

template <typename T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "metile: only 8x8 simdgroup_matrix is supported");
  using value_type = T;
  vec<T, 2> elements;

  simdgroup_matrix() = default;
  // Metal: a diagonal matrix with `d` on the diagonal.
  explicit simdgroup_matrix(T d) {
    unsigned l = metile_rt::current_lane->thread_index_in_simdgroup;
    unsigned r = metile_rt::mat_row(l), c = metile_rt::mat_col(l);
    elements[0] = r == c ? d : T(0);
    elements[1] = r == c + 1 ? d : T(0);
  }
  thread vec<T, 2>& thread_elements() thread { return elements; }
  const thread vec<T, 2>& thread_elements() const thread { return elements; }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <typename T, int Rows, int Cols>
inline simdgroup_matrix<T, Rows, Cols> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, Rows, Cols> m;
  m.elements = vec<T, 2>(value);
  return m;
}

// Loads this lane's elements of the 8x8 matrix whose top-left element is at
// (column matrix_origin.x, row matrix_origin.y) of a row-major source with
// `elements_per_row` elements per row; with `transpose` the matrix is the
// transpose of that source block.
template <typename T, typename P>
inline void simdgroup_load(thread simdgroup_matrix<T, 8, 8>& m, P src, ulong elements_per_row = 8,
                           vec<ulong, 2> matrix_origin = vec<ulong, 2>(0), bool transpose = false) {
  unsigned l = metile_rt::current_lane->thread_index_in_simdgroup;
  ulong r = metile_rt::mat_row(l), c = metile_rt::mat_col(l);
  for (ulong k = 0; k < 2; ++k) {
    ulong sr = transpose ? c + k : r, sc = transpose ? r : c + k;
    m.elements[k] = static_cast<T>(src[(matrix_origin.y + sr) * elements_per_row + matrix_origin.x + sc]);
  }
}

template <typename T, typename P>
inline void simdgroup_store(const thread simdgroup_matrix<T, 8, 8>& m, P dst, ulong elements_per_row = 8,
                            vec<ulong, 2> matrix_origin = vec<ulong, 2>(0), bool transpose = false) {
  using E = std::remove_cvref_t<decltype(dst[0])>;
  unsigned l = metile_rt::current_lane->thread_index_in_simdgroup;
  ulong r = metile_rt::mat_row(l), c = metile_rt::mat_col(l);
  for (ulong k = 0; k < 2; ++k) {
    ulong sr = transpose ? c + k : r, sc = transpose ? r : c + k;
    dst[(matrix_origin.y + sr) * elements_per_row + matrix_origin.x + sc] = static_cast<E>(m.elements[k]);
  }
}

// D = A * B + C.  Each lane computes its own two elements of D from A's row
// and B's two columns; products and sums are formed in float (double for
// nothing: Metal has no double matrices) with one rounding per step to D's
// element type, so a half result accumulates in half and a float result of
// half inputs accumulates in float, as the GPU does.
template <typename TD, typename TA, typename TB, typename TC>
inline void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8>& d, const thread simdgroup_matrix<TA, 8, 8>& a,
                                          const thread simdgroup_matrix<TB, 8, 8>& b,
                                          const thread simdgroup_matrix<TC, 8, 8>& c,
                                          std::source_location loc = std::source_location::current()) {
  struct Operands {
    vec<TA, 2> a;
    vec<TB, 2> b;
  };
  vec<TC, 2> cin = c.elements;
  d.elements = metile_rt::exchange(
      Operands{a.elements, b.elements}, metile_rt::site_of(loc),
      [&](metile_rt::Lane* me, std::uint32_t mask, const auto& slots) {
        if (mask != 0xffffffffu)
          me->rt->fail(me, "simdgroup_matrix operations need all 32 threads of the SIMD-group; "
                           "some have exited or the threadgroup size is not a multiple of 32");
        unsigned l = me->thread_index_in_simdgroup;
        unsigned r = metile_rt::mat_row(l), col = metile_rt::mat_col(l);
        float arow[8];
        for (unsigned j = 0; j < 8; j += 2) {
          auto p = metile_rt::slot_value<Operands>(slots[metile_rt::kLaneOf.lane[r][j / 2]]);
          arow[j] = static_cast<float>(p.a[0]);
          arow[j + 1] = static_cast<float>(p.a[1]);
        }
        vec<TD, 2> out;
        for (unsigned k = 0; k < 2; ++k) {
          TD acc = static_cast<TD>(cin[k]);
          for (unsigned j = 0; j < 8; ++j) {
            auto p = metile_rt::slot_value<Operands>(slots[metile_rt::kLaneOf.lane[j][col / 2]]);
            acc = static_cast<TD>(__builtin_fmaf(arow[j], static_cast<float>(p.b[k]), static_cast<float>(acc)));
          }
          out[k] = acc;
        }
        return out;
      });
}

template <typename TD, typename TA, typename TB>
inline void simdgroup_multiply(thread simdgroup_matrix<TD, 8, 8>& d, const thread simdgroup_matrix<TA, 8, 8>& a,
                               const thread simdgroup_matrix<TB, 8, 8>& b,
                               std::source_location loc = std::source_location::current()) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<TD, 8, 8>(TD(0)), loc);
}

}  // namespace metal
