// Metal atomics.  Threadgroups run in parallel on OS threads, so device
// atomics must be real CPU atomics; threadgroup atomics use the same code.
//
// `atomic<T>` is layout-compatible with T: MLX's atomic_outputs hand the
// kernel a plain T array as `device atomic<T>*`.  The functions are templates
// over the pointer type so that, in the address-space checking mode, they
// accept device and threadgroup pointers alike.
#pragma once

namespace metal {

template <typename T>
struct atomic {
  using value_type = T;
  T __value;
};
static_assert(sizeof(atomic<float>) == sizeof(float) && alignof(atomic<float>) == alignof(float));

typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

enum memory_order {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};

enum class thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };
// Metal spells the scopes metal::thread_scope_device, ...
constexpr thread_scope thread_scope_thread = thread_scope::thread_scope_thread;
constexpr thread_scope thread_scope_simdgroup = thread_scope::thread_scope_simdgroup;
constexpr thread_scope thread_scope_threadgroup = thread_scope::thread_scope_threadgroup;
constexpr thread_scope thread_scope_device = thread_scope::thread_scope_device;

// Metal 3.2's fence: threadgroups run on OS threads here, so it is the CPU's fence.
inline void atomic_thread_fence(mem_flags, memory_order order,
                                thread_scope = thread_scope::thread_scope_device) {
  __atomic_thread_fence(order);
}

}  // namespace metal

namespace metile_rt {

template <typename A>
using atomic_value_t = typename std::remove_cv_t<A>::value_type;

// The underlying T*, stripped of any address space and volatile.
template <typename A>
inline atomic_value_t<A>* atomic_ptr(A* p) {
  return (atomic_value_t<A>*)(p);
}

// Read-modify-write through a CAS loop: float add/sub/min/max (there is no
// native instruction for them on x86).
template <typename T, typename F>
inline T atomic_rmw(T* p, F f, int order) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  for (;;) {
    T desired = f(old);
    if (__atomic_compare_exchange(p, &old, &desired, true, order, __ATOMIC_RELAXED)) return old;
  }
}

}  // namespace metile_rt

namespace metal {

template <typename A>
inline metile_rt::atomic_value_t<A> atomic_load_explicit(A* obj, memory_order order = memory_order_relaxed) {
  metile_rt::atomic_value_t<A> v;
  __atomic_load(metile_rt::atomic_ptr(obj), &v, order);
  return v;
}
template <typename A, typename V>
inline void atomic_store_explicit(A* obj, V desired, memory_order order = memory_order_relaxed) {
  auto v = static_cast<metile_rt::atomic_value_t<A>>(desired);
  __atomic_store(metile_rt::atomic_ptr(obj), &v, order);
}
template <typename A, typename V>
inline metile_rt::atomic_value_t<A> atomic_exchange_explicit(A* obj, V desired,
                                                             memory_order order = memory_order_relaxed) {
  auto v = static_cast<metile_rt::atomic_value_t<A>>(desired), old = v;
  __atomic_exchange(metile_rt::atomic_ptr(obj), &v, &old, order);
  return old;
}
template <typename A, typename E, typename V>
inline bool atomic_compare_exchange_weak_explicit(A* obj, E* expected, V desired,
                                                  memory_order success = memory_order_relaxed,
                                                  memory_order failure = memory_order_relaxed) {
  using T = metile_rt::atomic_value_t<A>;
  T d = static_cast<T>(desired);
  return __atomic_compare_exchange(metile_rt::atomic_ptr(obj), (T*)expected, &d, true, success, failure);
}
template <typename A, typename E, typename V>
inline bool atomic_compare_exchange_strong_explicit(A* obj, E* expected, V desired,
                                                    memory_order success = memory_order_relaxed,
                                                    memory_order failure = memory_order_relaxed) {
  using T = metile_rt::atomic_value_t<A>;
  T d = static_cast<T>(desired);
  return __atomic_compare_exchange(metile_rt::atomic_ptr(obj), (T*)expected, &d, false, success, failure);
}

#define METILE_ATOMIC_RMW(name, builtin, float_expr)                                                     \
  template <typename A, typename V>                                                                      \
  inline metile_rt::atomic_value_t<A> name(A* obj, V operand, memory_order order = memory_order_relaxed) { \
    using T = metile_rt::atomic_value_t<A>;                                                              \
    T* p = metile_rt::atomic_ptr(obj);                                                                   \
    T v = static_cast<T>(operand);                                                                       \
    if constexpr (std::is_integral_v<T>)                                                                 \
      return builtin(p, v, order);                                                                       \
    else                                                                                                 \
      return metile_rt::atomic_rmw(p, [v](T old) { return float_expr; }, order);                         \
  }
METILE_ATOMIC_RMW(atomic_fetch_add_explicit, __atomic_fetch_add, old + v)
METILE_ATOMIC_RMW(atomic_fetch_sub_explicit, __atomic_fetch_sub, old - v)
METILE_ATOMIC_RMW(atomic_fetch_min_explicit, __atomic_fetch_min, __builtin_fminf(old, v))
METILE_ATOMIC_RMW(atomic_fetch_max_explicit, __atomic_fetch_max, __builtin_fmaxf(old, v))
METILE_ATOMIC_RMW(atomic_fetch_and_explicit, __atomic_fetch_and, old)
METILE_ATOMIC_RMW(atomic_fetch_or_explicit, __atomic_fetch_or, old)
METILE_ATOMIC_RMW(atomic_fetch_xor_explicit, __atomic_fetch_xor, old)
#undef METILE_ATOMIC_RMW

// Metal's thread_scope overloads take the scope as an extra argument.
template <typename A, typename V>
inline auto atomic_fetch_add_explicit(A* obj, V operand, memory_order order, thread_scope) {
  return atomic_fetch_add_explicit(obj, operand, order);
}

}  // namespace metal
