// Metal's atomics: atomic<T> objects in device or threadgroup memory (never
// thread or constant), operated on by the *_explicit functions with an
// explicit memory order.  The operand has the atomic's value type.
#pragma once

namespace metal {

template <typename T>
struct atomic {
  static_assert(std::is_same<T, int>::value || std::is_same<T, uint>::value || std::is_same<T, bool>::value ||
                    std::is_same<T, float>::value || std::is_same<T, ulong>::value || std::is_same<T, long>::value,
                "metal: atomic<T> is defined for int, uint, bool, float, ulong and long");
  using value_type = T;
  T __value;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

enum memory_order {
  memory_order_relaxed,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst,
};
enum class thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };
constexpr thread_scope thread_scope_thread = thread_scope::thread_scope_thread;
constexpr thread_scope thread_scope_simdgroup = thread_scope::thread_scope_simdgroup;
constexpr thread_scope thread_scope_threadgroup = thread_scope::thread_scope_threadgroup;
constexpr thread_scope thread_scope_device = thread_scope::thread_scope_device;
void atomic_thread_fence(mem_flags flags, memory_order order,
                         thread_scope scope = thread_scope::thread_scope_device);

#define METILE_ATOMIC_SPACE(S)                                                                                     \
  template <typename T>                                                                                            \
  T atomic_load_explicit(const volatile S atomic<T>* object, memory_order order);                                  \
  template <typename T>                                                                                            \
  void atomic_store_explicit(volatile S atomic<T>* object, typename metile_strict::identity<T>::type desired,      \
                             memory_order order);                                                                  \
  template <typename T>                                                                                            \
  T atomic_exchange_explicit(volatile S atomic<T>* object, typename metile_strict::identity<T>::type desired,      \
                             memory_order order);                                                                  \
  template <typename T>                                                                                            \
  bool atomic_compare_exchange_weak_explicit(volatile S atomic<T>* object,                                        \
                                             thread typename metile_strict::identity<T>::type* expected,          \
                                             typename metile_strict::identity<T>::type desired,                   \
                                             memory_order success, memory_order failure);                         \
  template <typename T>                                                                                            \
  bool atomic_compare_exchange_strong_explicit(volatile S atomic<T>* object,                                      \
                                               thread typename metile_strict::identity<T>::type* expected,        \
                                               typename metile_strict::identity<T>::type desired,                 \
                                               memory_order success, memory_order failure);                       \
  METILE_ATOMIC_RMW(S, add)                                                                                        \
  METILE_ATOMIC_RMW(S, sub)                                                                                        \
  METILE_ATOMIC_RMW(S, min)                                                                                        \
  METILE_ATOMIC_RMW(S, max)                                                                                        \
  METILE_ATOMIC_RMW(S, and)                                                                                        \
  METILE_ATOMIC_RMW(S, or)                                                                                         \
  METILE_ATOMIC_RMW(S, xor)
#define METILE_ATOMIC_RMW(S, op)                                                                                   \
  template <typename T>                                                                                            \
  T atomic_fetch_##op##_explicit(volatile S atomic<T>* object, typename metile_strict::identity<T>::type operand, \
                                 memory_order order);                                                              \
  template <typename T>                                                                                            \
  T atomic_fetch_##op##_explicit(volatile S atomic<T>* object, typename metile_strict::identity<T>::type operand, \
                                 memory_order order, thread_scope scope);
METILE_ATOMIC_SPACE(device)
METILE_ATOMIC_SPACE(threadgroup)
#undef METILE_ATOMIC_SPACE
#undef METILE_ATOMIC_RMW

}  // namespace metal
