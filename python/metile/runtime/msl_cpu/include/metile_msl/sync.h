// Everything that talks to the scheduler: the current lane, threadgroup
// memory, threadgroup/SIMD-group barriers and the SIMD-group and quad-group
// collectives.
//
// Each synchronising function takes a defaulted std::source_location so the
// scheduler can tell which barrier or collective each lane waits at (lanes
// waiting at different sites are divergent and reported).
//
// After any call into the scheduler another fiber may have run on this OS
// thread and changed `current_lane`, so every call saves the lane before and
// restores it after.
#pragma once

namespace metile_rt {

// The GPU thread running on this OS thread; set by the generated
// metile_lane_main wrapper and by the scheduler's switches.
inline thread_local Lane* current_lane;

inline Lane* lane() { return current_lane; }

inline Site site_of(const std::source_location& loc) {
  return Site{loc.function_name(), static_cast<unsigned>(loc.line()), static_cast<unsigned>(loc.column())};
}

[[noreturn]] inline void fail(const char* message) {
  Lane* me = current_lane;
  me->rt->fail(me, message);
  __builtin_unreachable();  // Runtime::fail never returns
}

// Appends the decimal digits of v at p; for error messages (no <cstdio>).
inline char* append_uint(char* p, unsigned long v) {
  char digits[24];
  int n = 0;
  do digits[n++] = char('0' + v % 10); while ((v /= 10) != 0);
  while (n) *p++ = digits[--n];
  return p;
}
inline char* append_str(char* p, const char* s) {
  while (*s) *p++ = *s++;
  return p;
}

[[noreturn]] inline void fail_tg_overflow(Lane* me, std::size_t need) {
  static thread_local char msg[200];
  char* p = append_str(msg, "threadgroup memory exhausted: the kernel's threadgroup variables need at least ");
  p = append_uint(p, need);
  p = append_str(p, " bytes, more than Metal's limit of 32 KiB (32768 bytes) per threadgroup");
  *p = 0;
  me->rt->fail(me, msg);
  __builtin_unreachable();
}


// A type named through a template argument: `ident<float4[32]>&` declares a reference to
// an array of vectors without writing `float4 (&x)[32]`, which the float4(...) macro of
// vector_ctors.h would expand.
template <typename T>
using ident = T;

// The storage of the threadgroup variable numbered `slot` in the kernel
// (the source generator numbers each `threadgroup T name...;` declaration):
// the first lane of the group to get here allocates it from the group's
// arena; the others find it in `slots`.  The runtime resets the arena between
// groups and fills it with a poison pattern, so the memory starts out
// garbage, as on the GPU.  `Align`: the declaration's alignas/aligned (at least 16).
template <typename T, std::size_t Align = 16>
inline T& tg_storage(unsigned slot) {
  Lane* me = current_lane;
  GroupShared* g = me->group;
  if (slot >= kMaxThreadgroupSlots) me->rt->fail(me, "too many threadgroup variables in one kernel (limit 256)");
  void* p = g->slots[slot];
  if (!p) {
    constexpr std::size_t align = alignof(T) > Align ? alignof(T) : Align;
    std::size_t off = (g->used + align - 1) & ~(align - 1);
    if (off + sizeof(T) > kThreadgroupMemoryBytes) fail_tg_overflow(me, off + sizeof(T));
    p = g->arena + off;
    g->used = off + sizeof(T);
    g->slots[slot] = p;
  }
  return *(T*)p;
}

// One SIMD-group exchange, following the protocol the scheduler implements:
// publish x in this lane's slot of the current exchange buffer, wait for the
// live lanes, then let `read` look at the live lanes' slots before flipping
// to the other buffer.  read(me, mask, slots) gets the live-lane mask.
template <typename T, typename F>
inline auto exchange(const T& x, Site site, F read) {
  static_assert(sizeof(T) <= kExchangeBytes, "metal: SIMD-group operation on a value larger than 64 bytes");
  Lane* me = current_lane;
  unsigned p = me->parity;
  __builtin_memcpy(me->simd->slot[p][me->thread_index_in_simdgroup], &x, sizeof x);
  me->rt->simd_sync(me, site, p);
  current_lane = me;
  std::uint32_t mask = me->simd->mask[p];
  auto result = read(me, mask, me->simd->slot[p]);
  me->parity = p ^ 1;
  return result;
}

template <typename T>
inline T slot_value(const unsigned char* slot) {
  T v;
  __builtin_memcpy(&v, slot, sizeof v);
  return v;
}

// Live lanes of this lane's segment: the whole SIMD-group (W = 32) or its
// quad (W = 4).
template <unsigned W>
inline std::uint32_t segment_mask(unsigned lane, std::uint32_t mask) {
  if constexpr (W == kSimdWidth)
    return mask;
  else
    return mask & (((1u << W) - 1) << (lane & ~(W - 1)));
}

// Reduces over the live lanes in the segment in ascending lane order, so
// every lane gets the same bits.
template <unsigned W, typename T, typename Op>
inline T reduce(const T& x, Site site, Op op) {
  return exchange(x, site, [&](Lane* me, std::uint32_t mask, const auto& slots) {
    std::uint32_t m = segment_mask<W>(me->thread_index_in_simdgroup, mask);
    T acc = slot_value<T>(slots[__builtin_ctz(m)]);
    for (m &= m - 1; m; m &= m - 1) acc = op(acc, slot_value<T>(slots[__builtin_ctz(m)]));
    return acc;
  });
}

// Prefix over the live lanes of the segment below (exclusive) or up to and
// including (inclusive) this lane; `identity` for an empty exclusive prefix.
template <unsigned W, bool Inclusive, typename T, typename Op>
inline T prefix(const T& x, Site site, T identity, Op op) {
  return exchange(x, site, [&](Lane* me, std::uint32_t mask, const auto& slots) {
    unsigned i = me->thread_index_in_simdgroup;
    std::uint32_t below = Inclusive ? (i == 31 ? ~0u : (2u << i) - 1) : (1u << i) - 1;
    std::uint32_t m = segment_mask<W>(i, mask) & below;
    T acc = identity;
    bool first = true;
    for (; m; m &= m - 1) {
      T v = slot_value<T>(slots[__builtin_ctz(m)]);
      acc = first ? v : op(acc, v);
      first = false;
    }
    return acc;
  });
}

// Reads lane `src` (an index into the SIMD-group) if it is live, else keeps
// the caller's own value.  Metal leaves reads of inactive or out-of-range
// lanes undefined; keeping the own value is what shuffle_up/down do on
// Metal for the lanes with no source, so all shuffles behave alike.
template <typename T>
inline T shuffle_from(const T& x, Site site, unsigned (*src_of)(unsigned, unsigned, unsigned), unsigned arg,
                      unsigned width) {
  return exchange(x, site, [&](Lane* me, std::uint32_t mask, const auto& slots) {
    unsigned src = src_of(me->thread_index_in_simdgroup, arg, width);
    if (src < kSimdWidth && (mask >> src & 1u)) return slot_value<T>(slots[src]);
    return x;
  });
}

inline unsigned src_index(unsigned i, unsigned a, unsigned w) { return (i & ~(w - 1)) + a; }
inline unsigned src_xor(unsigned i, unsigned a, unsigned w) {
  unsigned j = i ^ a;
  return (j & ~(w - 1)) == (i & ~(w - 1)) ? j : ~0u;
}
inline unsigned src_up(unsigned i, unsigned a, unsigned w) { return (i & (w - 1)) >= a ? i - a : ~0u; }
inline unsigned src_down(unsigned i, unsigned a, unsigned w) { return (i & (w - 1)) + a < w ? i + a : ~0u; }
inline unsigned src_rot_up(unsigned i, unsigned a, unsigned w) { return (i & ~(w - 1)) + ((i - a) & (w - 1)); }
inline unsigned src_rot_down(unsigned i, unsigned a, unsigned w) { return (i & ~(w - 1)) + ((i + a) & (w - 1)); }

template <typename T>
struct plus {
  T operator()(T a, T b) const { return a + b; }
};
template <typename T>
struct times {
  T operator()(T a, T b) const { return a * b; }
};
template <typename T>
struct maximum {
  T operator()(T a, T b) const { return metal::max(a, b); }
};
template <typename T>
struct minimum {
  T operator()(T a, T b) const { return metal::min(a, b); }
};
template <typename T>
struct bit_and {
  T operator()(T a, T b) const { return a & b; }
};
template <typename T>
struct bit_or {
  T operator()(T a, T b) const { return a | b; }
};
template <typename T>
struct bit_xor {
  T operator()(T a, T b) const { return a ^ b; }
};

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
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}

// Every lane of the threadgroup waits here.  Memory needs no fence on the CPU:
// the fibers of a group share one OS thread, and the call is opaque to the
// compiler, so nothing is cached in registers across it.
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none,
                                std::source_location loc = std::source_location::current()) {
  metile_rt::Lane* me = metile_rt::current_lane;
  me->rt->threadgroup_barrier(me, metile_rt::site_of(loc));
  metile_rt::current_lane = me;
}

// Every live lane of the SIMD-group waits here.
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none,
                              std::source_location loc = std::source_location::current()) {
  metile_rt::exchange(0, metile_rt::site_of(loc), [](auto*, unsigned, const auto&) { return 0; });
}

// Metal's simd_vote: a ballot of the SIMD-group (bit i = lane i).
struct simd_vote {
  typedef std::uint64_t vote_t;
  constexpr explicit simd_vote(vote_t v = 0, vote_t live = ~vote_t(0)) : v_(v), live_(live) {}
  constexpr explicit operator vote_t() const { return v_; }
  // All live lanes voted true.
  constexpr bool all() const { return (v_ & live_) == live_; }
  constexpr bool any() const { return (v_ & live_) != 0; }

 private:
  vote_t v_, live_;
};
typedef simd_vote quad_vote;

#define METILE_SITE std::source_location loc = std::source_location::current()
#define METILE_AT metile_rt::site_of(loc)

template <typename T>
concept SimdValue = sizeof(T) <= metile_rt::kExchangeBytes && std::is_trivially_copyable_v<T>;

// Reductions and scans: W lanes (32: simd_*, 4: quad_*).
#define METILE_COLLECTIVES(P, W)                                                                              \
  template <SimdValue T>                                                                                      \
  inline T P##_sum(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::plus<T>{}); }     \
  template <SimdValue T>                                                                                      \
  inline T P##_product(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::times<T>{}); } \
  template <SimdValue T>                                                                                      \
  inline T P##_max(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::maximum<T>{}); }  \
  template <SimdValue T>                                                                                      \
  inline T P##_min(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::minimum<T>{}); }  \
  template <SimdValue T>                                                                                      \
  inline T P##_and(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::bit_and<T>{}); }  \
  template <SimdValue T>                                                                                      \
  inline T P##_or(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::bit_or<T>{}); }    \
  template <SimdValue T>                                                                                      \
  inline T P##_xor(T x, METILE_SITE) { return metile_rt::reduce<W>(x, METILE_AT, metile_rt::bit_xor<T>{}); }  \
  template <SimdValue T>                                                                                      \
  inline T P##_prefix_inclusive_sum(T x, METILE_SITE) {                                                       \
    return metile_rt::prefix<W, true>(x, METILE_AT, T(0), metile_rt::plus<T>{});                              \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_prefix_exclusive_sum(T x, METILE_SITE) {                                                       \
    return metile_rt::prefix<W, false>(x, METILE_AT, T(0), metile_rt::plus<T>{});                             \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_prefix_inclusive_product(T x, METILE_SITE) {                                                   \
    return metile_rt::prefix<W, true>(x, METILE_AT, T(1), metile_rt::times<T>{});                             \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_prefix_exclusive_product(T x, METILE_SITE) {                                                   \
    return metile_rt::prefix<W, false>(x, METILE_AT, T(1), metile_rt::times<T>{});                            \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_shuffle(T x, ushort lane, METILE_SITE) {                                                       \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_index, lane < W ? lane : 255u, W);            \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_shuffle_xor(T x, ushort mask, METILE_SITE) {                                                   \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_xor, mask, W);                                \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_shuffle_up(T x, ushort delta, METILE_SITE) {                                                   \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_up, delta, W);                                \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_shuffle_down(T x, ushort delta, METILE_SITE) {                                                 \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_down, delta, W);                              \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_shuffle_rotate_up(T x, ushort delta, METILE_SITE) {                                            \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_rot_up, delta, W);                            \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_shuffle_rotate_down(T x, ushort delta, METILE_SITE) {                                          \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_rot_down, delta, W);                          \
  }                                                                                                           \
  template <SimdValue T>                                                                                      \
  inline T P##_broadcast(T x, ushort lane, METILE_SITE) {                                                     \
    return metile_rt::shuffle_from(x, METILE_AT, metile_rt::src_index, lane < W ? lane : 255u, W);            \
  }                                                                                                           \
  /* The value of the segment's lowest live lane. */                                                          \
  template <SimdValue T>                                                                                      \
  inline T P##_broadcast_first(T x, METILE_SITE) {                                                            \
    return metile_rt::exchange(x, METILE_AT, [](metile_rt::Lane* me, std::uint32_t mask, const auto& slots) { \
      std::uint32_t m = metile_rt::segment_mask<W>(me->thread_index_in_simdgroup, mask);                      \
      return metile_rt::slot_value<T>(slots[__builtin_ctz(m)]);                                               \
    });                                                                                                       \
  }                                                                                                           \
  inline simd_vote P##_ballot(bool pred, METILE_SITE) {                                                       \
    return metile_rt::exchange(pred, METILE_AT, [](metile_rt::Lane* me, std::uint32_t mask, const auto& slots) { \
      std::uint32_t m = metile_rt::segment_mask<W>(me->thread_index_in_simdgroup, mask), v = 0;               \
      for (std::uint32_t k = m; k; k &= k - 1)                                                                \
        if (slots[__builtin_ctz(k)][0]) v |= 1u << __builtin_ctz(k);                                          \
      unsigned shift = W == 32 ? 0 : (me->thread_index_in_simdgroup & ~(W - 1));                              \
      return simd_vote(v >> shift, m >> shift);                                                               \
    });                                                                                                       \
  }                                                                                                           \
  inline simd_vote P##_active_threads_mask(METILE_SITE) { return P##_ballot(true, loc); }                     \
  inline bool P##_all(bool pred, METILE_SITE) { return P##_ballot(pred, loc).all(); }                         \
  inline bool P##_any(bool pred, METILE_SITE) { return P##_ballot(pred, loc).any(); }                         \
  inline bool P##_is_first(METILE_SITE) {                                                                     \
    return metile_rt::exchange(0, METILE_AT, [](metile_rt::Lane* me, std::uint32_t mask, const auto&) {       \
      unsigned i = me->thread_index_in_simdgroup;                                                             \
      return unsigned(__builtin_ctz(metile_rt::segment_mask<W>(i, mask))) == i;                               \
    });                                                                                                       \
  }

METILE_COLLECTIVES(simd, 32u)
METILE_COLLECTIVES(quad, 4u)
#undef METILE_COLLECTIVES

// simd_shuffle_and_fill_up/down(data, filling, delta[, modulo]): within each
// segment of `modulo` lanes (default: the SIMD-group), lane j takes data
// from lane j - delta (up) or j + delta (down); lanes whose source falls off
// the segment take `filling` from the other end, as Metal specifies.
template <SimdValue T>
inline T simd_shuffle_and_fill_up(T data, T filling, ushort delta, ushort modulo, METILE_SITE) {
  struct Pair { T d, f; };
  return metile_rt::exchange(Pair{data, filling}, METILE_AT,
                             [&](metile_rt::Lane* me, std::uint32_t mask, const auto& slots) {
                               unsigned i = me->thread_index_in_simdgroup, m = modulo ? modulo : 32;
                               unsigned j = i % m, base = i - j;
                               bool fill = j < delta;
                               unsigned src = fill ? base + m - delta + j : i - delta;
                               if (src >= 32 || !(mask >> src & 1u)) return fill ? filling : data;
                               Pair p = metile_rt::slot_value<Pair>(slots[src]);
                               return fill ? p.f : p.d;
                             });
}
template <SimdValue T>
inline T simd_shuffle_and_fill_up(T data, T filling, ushort delta, METILE_SITE) {
  return simd_shuffle_and_fill_up(data, filling, delta, ushort(32), loc);
}
template <SimdValue T>
inline T simd_shuffle_and_fill_down(T data, T filling, ushort delta, ushort modulo, METILE_SITE) {
  struct Pair { T d, f; };
  return metile_rt::exchange(Pair{data, filling}, METILE_AT,
                             [&](metile_rt::Lane* me, std::uint32_t mask, const auto& slots) {
                               unsigned i = me->thread_index_in_simdgroup, m = modulo ? modulo : 32;
                               unsigned j = i % m, base = i - j;
                               bool fill = j + delta >= m;
                               unsigned src = fill ? base + j + delta - m : i + delta;
                               if (src >= 32 || !(mask >> src & 1u)) return fill ? filling : data;
                               Pair p = metile_rt::slot_value<Pair>(slots[src]);
                               return fill ? p.f : p.d;
                             });
}
template <SimdValue T>
inline T simd_shuffle_and_fill_down(T data, T filling, ushort delta, METILE_SITE) {
  return simd_shuffle_and_fill_down(data, filling, delta, ushort(32), loc);
}

inline bool simd_is_helper_thread() { return false; }

}  // namespace metal
