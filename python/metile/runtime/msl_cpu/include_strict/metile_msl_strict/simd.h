// Barriers and SIMD-group / quad-group collectives, plus the two runtime
// hooks the generated kernel wrapper uses (threadgroup storage, current lane).
#pragma once

namespace metile_rt {
extern thread_local Lane* current_lane;
template <typename T, unsigned long Align = 16>
threadgroup T& tg_storage(unsigned slot);
template <typename T>
using ident = T;   // (the runtime's: a declared type written as a template argument)
}  // namespace metile_rt

namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }

void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

struct simd_vote {
  using vote_t = uint64_t;
  explicit constexpr simd_vote(vote_t v = 0);
  explicit operator vote_t() const;
  bool all() const;
  bool any() const;
};
typedef simd_vote quad_vote;

}  // namespace metal

#define METILE_V1(name)                                                \
  template <typename T, typename = std::enable_if_t<metile_strict::simd_value<T>>> \
  T name(T data);
#define METILE_VL(name)                                                \
  template <typename T, typename = std::enable_if_t<metile_strict::simd_value<T>>> \
  T name(T data, ushort lane_or_delta);
#define METILE_ARITH1(name)                                                               \
  template <typename T, typename = std::enable_if_t<metile_strict::fp_type<T> || metile_strict::int_type<T>>> \
  T name(T data);
#define METILE_INT1(name)                                             \
  template <typename T, typename = std::enable_if_t<metile_strict::int_type<T>>> \
  T name(T data);
#define METILE_COLLECTIVES(P)                                                                         \
  METILE_ARITH1(P##_sum) METILE_ARITH1(P##_product) METILE_ARITH1(P##_min) METILE_ARITH1(P##_max) \
  METILE_ARITH1(P##_prefix_inclusive_sum) METILE_ARITH1(P##_prefix_exclusive_sum)                 \
  METILE_ARITH1(P##_prefix_inclusive_product) METILE_ARITH1(P##_prefix_exclusive_product)         \
  METILE_INT1(P##_and) METILE_INT1(P##_or) METILE_INT1(P##_xor)                                    \
  METILE_V1(P##_broadcast_first) METILE_VL(P##_broadcast) METILE_VL(P##_shuffle)                  \
  METILE_VL(P##_shuffle_up) METILE_VL(P##_shuffle_down) METILE_VL(P##_shuffle_xor)                \
  METILE_VL(P##_shuffle_rotate_up) METILE_VL(P##_shuffle_rotate_down)                             \
  bool P##_all(bool expr);                                                                         \
  bool P##_any(bool expr);                                                                         \
  P##_vote P##_ballot(bool expr);                                                                  \
  P##_vote P##_active_threads_mask();                                                              \
  bool P##_is_first();

namespace metal {
METILE_COLLECTIVES(simd)
METILE_COLLECTIVES(quad)
bool simd_is_helper_thread();
template <typename T, typename = std::enable_if_t<metile_strict::simd_value<T>>>
T simd_shuffle_and_fill_up(T data, T filling, ushort delta);
template <typename T, typename = std::enable_if_t<metile_strict::simd_value<T>>>
T simd_shuffle_and_fill_down(T data, T filling, ushort delta);
template <typename T, typename = std::enable_if_t<metile_strict::simd_value<T>>>
T simd_shuffle_and_fill_up(T data, T filling, ushort delta, ushort modulo);
template <typename T, typename = std::enable_if_t<metile_strict::simd_value<T>>>
T simd_shuffle_and_fill_down(T data, T filling, ushort delta, ushort modulo);
}  // namespace metal

#undef METILE_V1
#undef METILE_VL
#undef METILE_ARITH1
#undef METILE_INT1
#undef METILE_COLLECTIVES
