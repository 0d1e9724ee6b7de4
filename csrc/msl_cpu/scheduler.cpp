#include "scheduler.h"

#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <chrono>
#include <functional>
#include <mutex>
#include <pthread.h>
#include <semaphore.h>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <boost/context/detail/fcontext.hpp>

namespace fc = boost::context::detail;

namespace metile::msl_cpu {

using metile_rt::Lane;
using metile_rt::Site;

LaneOrder parse_lane_order(const std::string& name) {
  if (name == "forward") return LaneOrder::forward;
  if (name == "reverse") return LaneOrder::reverse;
  if (name == "shuffle") return LaneOrder::shuffle;
  throw std::invalid_argument(
      "[metal_kernel] lane order must be 'forward', 'reverse' or 'shuffle', got '" + name + "'");
}

KernelLibrary::KernelLibrary(const std::string& path) : path_(path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    throw std::runtime_error(std::string("[metal_kernel] cannot load kernel library: ") + dlerror());
  }
  auto version = reinterpret_cast<metile_abi_version_fn>(dlsym(handle_, "metile_abi_version"));
  entry_ = reinterpret_cast<metile_lane_main_fn>(dlsym(handle_, "metile_lane_main"));
  if (!version || !entry_ || version() != METILE_MSL_ABI_VERSION) {
    dlclose(handle_);
    handle_ = nullptr;
    throw std::runtime_error("[metal_kernel] kernel library " + path +
                             " was built for another runtime ABI; clear the metile cache");
  }
}

KernelLibrary::~KernelLibrary() {
  if (handle_) dlclose(handle_);
}

namespace {

constexpr std::uint32_t kMaxThreadsPerThreadgroup = 1024;

// METILE_MSL_* settings.  A value that does not parse is an error naming the
// variable, its value and what is accepted: silently running with the default
// would hide the user's mistake (a timeout that never fires, say).
double env_number(const char* name, double fallback, double lo, double hi, bool whole,
                  const char* accepted) {
  const char* raw = std::getenv(name);
  if (!raw || !*raw) return fallback;
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(raw, &end);
  while (end && std::isspace(static_cast<unsigned char>(*end))) ++end;
  bool ok = end != raw && *end == '\0' && errno == 0 && std::isfinite(value) && value >= lo &&
            value <= hi && (!whole || value == std::floor(value));
  if (!ok) {
    throw std::invalid_argument(std::string("[metal_kernel] invalid ") + name + "='" + raw +
                                "': expected " + accepted);
  }
  return value;
}

std::size_t env_threads() {
  // glibc answers hardware_concurrency() by reading /sys/devices/system/cpu/online: about
  // 5 of the 7.7 us of a cached launch's binding call when asked per launch (perf, on
  // the 2-core CI machine), so the default is read once per process.
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<std::size_t>(env_number(
      "METILE_MSL_THREADS", cores, 1, 4096, true,
      "a whole number of CPU runtime worker threads from 1 to 4096 (unset: one per core)"));
}

std::size_t env_stack_kb() {
  return static_cast<std::size_t>(env_number(
      "METILE_MSL_STACK_KB", 128, 16, 65536, true,
      "a whole number of KiB per fiber stack from 16 to 65536 (unset: 128)"));
}

double env_timeout_s() {
  return env_number("METILE_MSL_TIMEOUT_S", 0, 0, 1e9, false,
                    "a number of seconds >= 0 (0 or unset: no limit)");
}

std::size_t stack_bytes() {
  static const std::size_t bytes = env_stack_kb() * 1024;
  return bytes;
}

std::string describe(const Site& s) {
  std::ostringstream out;
  out << "line " << s.line << ":" << s.column;
  return out.str();
}

bool same_site(const Site& a, const Site& b) {
  return a.line == b.line && a.column == b.column &&
         (a.function == b.function || (a.function && b.function && !std::strcmp(a.function, b.function)));
}

enum class State : std::uint8_t { runnable, at_barrier, at_simd, exited };

struct Worker;

struct Fiber {
  Lane lane;
  Worker* worker;
  fc::fcontext_t context;
  State state;
  Site site;
  unsigned parity;
};

// One per OS thread: fiber stacks, lane records and threadgroup memory, all
// reused from group to group.
struct Worker {
  metile_lane_main_fn entry = nullptr;
  void* const* buffers = nullptr;
  fc::fcontext_t scheduler = nullptr;
  bool failed = false;
  std::string error;

  std::vector<Fiber> fibers;
  std::vector<metile_rt::SimdShared> simds;
  metile_rt::GroupShared group{};
  std::size_t poisoned_high_water = 0;

  char* stacks = nullptr;
  std::size_t stack_count = 0;
  std::vector<std::uint32_t> order;
  std::mt19937 rng{12345};

  Worker() {
    group.arena = static_cast<unsigned char*>(std::aligned_alloc(64, metile_rt::kThreadgroupMemoryBytes));
    std::memset(group.arena, 0xFF, metile_rt::kThreadgroupMemoryBytes);
  }
  ~Worker() {
    std::free(group.arena);
    if (stacks) munmap(stacks, stack_count * stack_bytes());
  }

  void ensure_stacks(std::size_t n) {
    if (n <= stack_count) return;
    if (stacks) munmap(stacks, stack_count * stack_bytes());
    // Reserve without committing; a guard page under each stack turns an
    // overflow into a fault instead of silent corruption of the neighbour.
    void* p = mmap(nullptr, n * stack_bytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    stacks = static_cast<char*>(p);
    stack_count = n;
    long page = sysconf(_SC_PAGESIZE);
    for (std::size_t i = 0; i < n; ++i) mprotect(stacks + i * stack_bytes(), page, PROT_NONE);
  }
  void* stack_top(std::size_t i) { return stacks + (i + 1) * stack_bytes(); }
  // Every address of the stack mapping is readable except the guard pages, so
  // a fault inside it is a stack overflow.
  bool owns_stack(const void* address) const {
    const char* a = static_cast<const char*>(address);
    return stacks && a >= stacks && a < stacks + stack_count * stack_bytes();
  }

  void fail(std::string message) {
    if (!failed) {
      failed = true;
      error = std::move(message);
    }
  }
};

Fiber* fiber_of(Lane* lane) { return static_cast<Fiber*>(lane->runtime_private); }

// Switches from a fiber back to its worker's scheduler loop.
void suspend(Fiber* f) {
  fc::transfer_t t = fc::jump_fcontext(f->worker->scheduler, nullptr);
  f->worker->scheduler = t.fctx;
}

void fiber_main(fc::transfer_t t) {
  auto* f = static_cast<Fiber*>(t.data);
  f->worker->scheduler = t.fctx;
  f->worker->entry(&f->lane);
  f->state = State::exited;
  fc::jump_fcontext(f->worker->scheduler, nullptr);
  __builtin_unreachable();
}

void hook_threadgroup_barrier(Lane* lane, Site site) {
  Fiber* f = fiber_of(lane);
  f->state = State::at_barrier;
  f->site = site;
  suspend(f);
}

void hook_simd_sync(Lane* lane, Site site, unsigned parity) {
  Fiber* f = fiber_of(lane);
  f->state = State::at_simd;
  f->site = site;
  f->parity = parity;
  suspend(f);
}

[[noreturn]] void hook_fail(Lane* lane, const char* message) {
  Fiber* f = fiber_of(lane);
  f->worker->fail(message);
  // The fiber is abandoned here; its stack is reused by the next group.
  fc::jump_fcontext(f->worker->scheduler, nullptr);
  __builtin_unreachable();
}

const metile_rt::Runtime kRuntime{hook_threadgroup_barrier, hook_simd_sync, hook_fail};

std::string group_name(const std::array<std::uint32_t, 3>& g) {
  std::ostringstream out;
  out << "threadgroup (" << g[0] << ", " << g[1] << ", " << g[2] << ")";
  return out.str();
}

// After every live fiber has blocked: releases each SIMD-group whose live
// lanes all wait at one collective, else the threadgroup if every thread
// waits at one barrier.  Anything else can never make progress on a GPU
// either (it would hang or be undefined), so it becomes an error.
bool release_waiters(Worker& w, std::size_t n, const std::array<std::uint32_t, 3>& gid) {
  bool released = false;
  std::size_t simd_count = (n + metile_rt::kSimdWidth - 1) / metile_rt::kSimdWidth;
  for (std::size_t s = 0; s < simd_count; ++s) {
    std::size_t begin = s * metile_rt::kSimdWidth, end = std::min(n, begin + metile_rt::kSimdWidth);
    std::uint32_t mask = 0;
    Fiber* first = nullptr;
    bool all_waiting = true;
    for (std::size_t i = begin; i < end; ++i) {
      Fiber& f = w.fibers[i];
      if (f.state == State::exited) continue;
      if (f.state != State::at_simd) { all_waiting = false; break; }
      if (!first) first = &f;
      if (!same_site(f.site, first->site) || f.parity != first->parity) {
        w.fail("divergent SIMD-group operation in " + group_name(gid) + ", SIMD-group " +
               std::to_string(s) + ": lanes wait at different collectives (" + describe(first->site) +
               " and " + describe(f.site) + "); metile's CPU runtime requires every live lane of a "
               "SIMD-group to take part in each collective");
        return false;
      }
      mask |= 1u << (i - begin);
    }
    if (!all_waiting || !first) continue;
    w.simds[s].mask[first->parity] = mask;
    for (std::size_t i = begin; i < end; ++i)
      if (w.fibers[i].state == State::at_simd) w.fibers[i].state = State::runnable;
    released = true;
  }
  if (released) return true;

  std::size_t waiting = 0, exited = 0;
  Fiber* first = nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = w.fibers[i];
    if (f.state == State::exited) { ++exited; continue; }
    if (f.state == State::at_barrier) {
      if (!first) first = &f;
      if (!same_site(f.site, first->site)) {
        w.fail("divergent threadgroup barrier in " + group_name(gid) + ": threads wait at different "
               "threadgroup_barrier calls (" + describe(first->site) + " and " + describe(f.site) + ")");
        return false;
      }
      ++waiting;
    }
  }
  if (waiting && waiting + exited == n) {
    if (exited) {
      w.fail("divergent threadgroup barrier in " + group_name(gid) + ": " + std::to_string(exited) +
             " of " + std::to_string(n) + " threads returned without reaching the threadgroup_barrier at " +
             describe(first->site) + " (every thread of a threadgroup must reach each barrier)");
      return false;
    }
    for (std::size_t i = 0; i < n; ++i) w.fibers[i].state = State::runnable;
    return true;
  }
  // Some threads wait at a barrier while others of the same SIMD-group wait
  // at a collective: no order of execution can finish this group.
  std::ostringstream msg;
  msg << "deadlock in " << group_name(gid) << ": ";
  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = w.fibers[i];
    if (f.state == State::at_barrier) { msg << "thread " << i << " waits at threadgroup_barrier " << describe(f.site); break; }
  }
  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = w.fibers[i];
    if (f.state == State::at_simd) { msg << "; thread " << i << " waits at a SIMD-group collective " << describe(f.site); break; }
  }
  msg << " (divergent barrier or collective)";
  w.fail(msg.str());
  return false;
}

void run_group(Worker& w, const Dispatch& d, const std::array<std::uint32_t, 3>& gid,
               const std::array<std::uint32_t, 3>& groups) {
  std::array<std::uint32_t, 3> size;
  for (int a = 0; a < 3; ++a) {
    std::uint32_t tg = std::min(d.threadgroup[a], d.grid[a]);
    size[a] = std::min(tg, d.grid[a] - gid[a] * tg);
  }
  const std::size_t n = std::size_t(size[0]) * size[1] * size[2];
  const std::size_t simd_count = (n + metile_rt::kSimdWidth - 1) / metile_rt::kSimdWidth;
  w.ensure_stacks(n);
  if (w.fibers.size() < n) w.fibers.resize(n);
  if (w.simds.size() < simd_count) w.simds.resize(simd_count);

  // Threadgroup memory starts as NaN/-1 bytes in every group so that a kernel
  // reading what it never wrote gets visibly wrong answers.
  std::memset(w.group.arena, 0xFF, std::max(w.poisoned_high_water, w.group.used));
  w.poisoned_high_water = 0;
  w.group.used = 0;
  std::memset(w.group.slots, 0, sizeof(w.group.slots));

  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = w.fibers[i];
    Lane& l = f.lane;
    std::uint32_t x = i % size[0], y = (i / size[0]) % size[1], z = i / (std::size_t(size[0]) * size[1]);
    std::uint32_t local[3] = {x, y, z};
    l.rt = &kRuntime;
    l.buffers = w.buffers;
    l.group = &w.group;
    l.simd = &w.simds[i / metile_rt::kSimdWidth];
    l.parity = 0;
    for (int a = 0; a < 3; ++a) {
      std::uint32_t tg = std::min(d.threadgroup[a], d.grid[a]);
      l.thread_position_in_threadgroup[a] = local[a];
      l.threadgroup_position_in_grid[a] = gid[a];
      l.thread_position_in_grid[a] = gid[a] * tg + local[a];
      l.threads_per_grid[a] = d.grid[a];
      l.threads_per_threadgroup[a] = size[a];
      l.threadgroups_per_grid[a] = groups[a];
      l.dispatch_threads_per_threadgroup[a] = tg;
    }
    l.thread_index_in_threadgroup = static_cast<std::uint32_t>(i);
    l.simdgroup_index_in_threadgroup = static_cast<std::uint32_t>(i / metile_rt::kSimdWidth);
    l.thread_index_in_simdgroup = static_cast<std::uint32_t>(i % metile_rt::kSimdWidth);
    l.simdgroups_per_threadgroup = static_cast<std::uint32_t>(simd_count);
    l.quiet = d.quiet;
    l.runtime_private = &f;
    f.worker = &w;
    f.state = State::runnable;
    f.context = fc::make_fcontext(w.stack_top(i), stack_bytes() - sysconf(_SC_PAGESIZE), fiber_main);
  }

  w.order.resize(n);
  for (std::size_t i = 0; i < n; ++i) w.order[i] = static_cast<std::uint32_t>(i);
  if (d.order == LaneOrder::reverse) std::reverse(w.order.begin(), w.order.end());
  if (d.order == LaneOrder::shuffle) std::shuffle(w.order.begin(), w.order.end(), w.rng);

  for (;;) {
    std::size_t live = 0;
    for (std::uint32_t i : w.order) {
      Fiber& f = w.fibers[i];
      if (f.state != State::runnable) continue;
      fc::transfer_t t = fc::jump_fcontext(f.context, &f);
      f.context = t.fctx;
      if (w.failed) return;
    }
    for (std::size_t i = 0; i < n; ++i) live += w.fibers[i].state != State::exited;
    if (!live) break;
    if (!release_waiters(w, n, gid)) return;
  }
  w.poisoned_high_water = w.group.used;
}

// Fault guard.  A kernel that dereferences a bad address (an index past its
// buffer, a stack overflow into a fiber's guard page, a misaligned vector
// move) or divides an integer by zero must not take the Python process down:
// while a worker runs kernel code, SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGTRAP jump back to the
// group's scheduler, which reports the fault as a kernel error.  Signals
// raised outside kernel code go to the handler that was installed before.
struct Fault {
  int signal = 0;
  int code = 0;
  void* address = nullptr;
};
thread_local sigjmp_buf* t_fault_jump = nullptr;
thread_local volatile sig_atomic_t t_in_kernel = 0;
thread_local Fault t_fault;
struct sigaction g_previous_segv, g_previous_bus, g_previous_fpe, g_previous_ill, g_previous_trap;

void chain(const struct sigaction& previous, int sig, siginfo_t* info, void* context) {
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler == SIG_DFL) {
    signal(sig, SIG_DFL);
    raise(sig);
  } else if (previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  }
}

void fault_handler(int sig, siginfo_t* info, void* context) {
  if (t_in_kernel && t_fault_jump) {
    t_in_kernel = 0;
    t_fault = {sig, info->si_code, info->si_addr};
    siglongjmp(*t_fault_jump, sig);
  }
  chain(sig == SIGSEGV ? g_previous_segv
        : sig == SIGBUS ? g_previous_bus
        : sig == SIGILL ? g_previous_ill
        : sig == SIGTRAP ? g_previous_trap
                         : g_previous_fpe,
        sig, info, context);
}

// What went wrong, as precisely as the signal tells: the kernel error's text.
std::string fault_message(const Worker& w, const Fault& fault, const std::string& where,
                          const FaultDescriber& describe_fault) {
  Fault f = fault;
#if defined(__x86_64__)
  // The CPU runtime compiles integer divisions with a zero check that traps with
  // `ud1 3(%eax), %eax` (67 0F B9 40 03): the same error as the hardware's own #DE.
  if (f.signal == SIGILL && f.address != nullptr) {
    const auto* code = static_cast<const unsigned char*>(f.address);
    if (code[0] == 0x67 && code[1] == 0x0F && code[2] == 0xB9 && code[3] == 0x40 && code[4] == 0x03) {
      f.signal = SIGFPE;   // (reported as the hardware's trap is, below)
      f.code = FPE_INTDIV;
    }
  }
#endif
  char address[32];
  std::snprintf(address, sizeof address, "%p", f.address);
  if (f.signal == SIGFPE) {
    if (f.code == FPE_INTDIV || f.code == FPE_INTOVF) {
      // x86 traps both; a GPU returns an unspecified value instead.  Stopping
      // is the one behaviour that cannot silently differ from the GPU's.
      return "integer division by zero (or INT_MIN / -1) in " + where +
             ": Metal leaves the result unspecified, so metile's CPU runtime stops the kernel "
             "(guard the divisor of `/` and `%`; a masked load's off lanes hold its `other`, 0 "
             "unless given, and are computed too: load the divisor with other=1, or divide by "
             "where(d != 0, d, 1))";
    }
    return "arithmetic fault (SIGFPE code " + std::to_string(f.code) + ") at " + address + " in " + where;
  }
  if (f.signal == SIGILL || f.signal == SIGTRAP) {
    // clang compiles __builtin_trap, and a non-void function that ends without
    // a return, to a trapping instruction; on a GPU the command buffer fails.
    return std::string(f.signal == SIGILL ? "illegal instruction" : "trap") + " at " + address + " in " +
           where + ": the kernel reached a trap (__builtin_trap, a non-void function that ended "
           "without `return`, or inline assembly)";
  }
  if (std::string what = describe_fault ? describe_fault(f.address) : std::string(); !what.empty()) {
    return "out-of-bounds access in " + where + ": " + what;
  }
  if (w.owns_stack(f.address)) {
    return "invalid memory access at address " + std::string(address) + " in " + where +
           ": fiber stack overflow (the thread's locals need more than METILE_MSL_STACK_KB=" +
           std::to_string(stack_bytes() / 1024) + " KiB; raise it)";
  }
  // x86 reports a general-protection fault (an aligned vector move on an
  // unaligned address, or a non-canonical pointer) as SIGSEGV from the kernel
  // with no address, unlike a page fault, which names the address.
  if (f.signal == SIGSEGV && f.code == SI_KERNEL && f.address == nullptr) {
    return "invalid memory access in " + where +
           ": a general-protection fault, most likely a misaligned vector access (a pointer cast to "
           "a 16-byte type such as float4 or uint4 on an address that is not 16-byte aligned), "
           "else a wild pointer";
  }
  return "invalid memory access at address " + std::string(address) + " in " + where +
         ": out of bounds (an index outside its buffer, or a wild pointer; "
         "METILE_MSL_BOUNDS_CHECK=1 names the buffer)";
}

// The watchdog's signal: a real-time signal nothing else in MLX uses.  It only
// interrupts a worker that is inside kernel code; elsewhere it is ignored.
int watchdog_signal() { return SIGRTMIN + 7; }

void watchdog_handler(int sig, siginfo_t*, void*) {
  if (t_in_kernel && t_fault_jump) {
    t_in_kernel = 0;
    siglongjmp(*t_fault_jump, sig);
  }
}

void install_fault_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = fault_handler;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
    sigaction(SIGBUS, &action, &g_previous_bus);
    sigaction(SIGFPE, &action, &g_previous_fpe);
    sigaction(SIGILL, &action, &g_previous_ill);
    sigaction(SIGTRAP, &action, &g_previous_trap);
    struct sigaction watchdog {};
    watchdog.sa_sigaction = watchdog_handler;
    watchdog.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&watchdog.sa_mask);
    sigaction(watchdog_signal(), &watchdog, nullptr);
  });
  // The handler must run on an alternate stack: the fault may be a fiber's
  // stack overflow.  Keep a thread's existing alternate stack if it has one.
  thread_local bool has_stack = false;
  if (!has_stack) {
    stack_t current{};
    sigaltstack(nullptr, &current);
    if (current.ss_flags & SS_DISABLE) {
      static thread_local std::vector<char> memory(1 << 16);
      stack_t ours{};
      ours.ss_sp = memory.data();
      ours.ss_size = memory.size();
      sigaltstack(&ours, nullptr);
    }
    has_stack = true;
  }
}

// Why a dispatch stopped early.  A timeout or an interrupt also signals every
// worker still inside kernel code, which jumps back to its scheduler.
enum class Stop : int { none, failed, timeout, interrupt };

struct Stopper {
  std::atomic<int> reason{int(Stop::none)};
  std::mutex mutex;
  std::vector<pthread_t> threads;  // workers taking part in the dispatch

  Stop why() const { return Stop(reason.load()); }
  bool stopped() const { return why() != Stop::none; }
  void stop(Stop why) {
    int none = int(Stop::none);
    if (!reason.compare_exchange_strong(none, int(why)) || why == Stop::failed) return;
    std::lock_guard<std::mutex> lock(mutex);
    for (pthread_t t : threads) pthread_kill(t, watchdog_signal());
  }
};

// Ctrl-C.  While a kernel runs, MLX's eval waits in C++ and Python only notes
// the signal, so a SIGINT would be acted on when the kernel ends (never, for a
// kernel that does not end).  While any dispatch runs, SIGINT first wakes a
// monitor thread (sem_post is async-signal-safe) that stops every running
// dispatch the way the watchdog does, then goes on to the handler that was
// installed before (Python's, which records the KeyboardInterrupt to raise).
// Where SIGINT is ignored or left at its default, nothing is installed.
std::mutex g_running_mutex;
std::vector<Stopper*> g_running;
struct sigaction g_previous_int;
bool g_int_installed = false;
sem_t g_interrupts;

void interrupt_handler(int sig, siginfo_t* info, void* context) {
  int saved = errno;
  sem_post(&g_interrupts);
  errno = saved;
  chain(g_previous_int, sig, info, context);
}

void interrupt_monitor() {
  for (;;) {
    if (sem_wait(&g_interrupts) != 0) continue;
    std::lock_guard<std::mutex> lock(g_running_mutex);
    for (Stopper* s : g_running) s->stop(Stop::interrupt);
  }
}

// Registers a dispatch with the Ctrl-C monitor for its lifetime.
class InterruptScope {
 public:
  explicit InterruptScope(Stopper& s) : stopper_(s) {
    static std::once_flag once;
    std::call_once(once, [] {
      sem_init(&g_interrupts, 0, 0);
      // The monitor takes no signals itself, so SIGINT's handler and the
      // watchdog's signal always land on threads that expect them.
      sigset_t all, old;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &old);
      std::thread(interrupt_monitor).detach();
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
    });
    std::lock_guard<std::mutex> lock(g_running_mutex);
    if (g_running.empty()) {
      struct sigaction current {};
      sigaction(SIGINT, nullptr, &current);
      bool handled = (current.sa_flags & SA_SIGINFO) ||
                     (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
      if (handled && current.sa_sigaction != interrupt_handler) {
        g_previous_int = current;
        struct sigaction ours = current;
        ours.sa_sigaction = interrupt_handler;
        ours.sa_flags = current.sa_flags | SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGINT, &ours, nullptr);
        g_int_installed = true;
      }
    }
    g_running.push_back(&stopper_);
  }
  ~InterruptScope() {
    std::lock_guard<std::mutex> lock(g_running_mutex);
    g_running.erase(std::find(g_running.begin(), g_running.end(), &stopper_));
    if (g_running.empty() && g_int_installed) {
      // Put the previous handler back unless someone replaced ours meanwhile.
      struct sigaction current {};
      sigaction(SIGINT, nullptr, &current);
      if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == interrupt_handler) {
        sigaction(SIGINT, &g_previous_int, nullptr);
      }
      g_int_installed = false;
    }
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  Stopper& stopper_;
};

// A small persistent pool: dispatches are frequent and short, so threads are
// kept rather than spawned per launch.
class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }
  std::size_t size() const { return workers_.size() + 1; }

  // Runs job(worker_index) on every pool thread and on the caller.
  void run(const std::function<void(std::size_t)>& job) {
    std::lock_guard<std::mutex> serial(dispatch_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      pending_ = workers_.size();
      ++generation_;
    }
    cv_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  Pool() {
    std::size_t n = env_threads();
    for (std::size_t i = 1; i < n; ++i) {
      workers_.emplace_back([this, i] { loop(i); });
    }
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void loop(std::size_t index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(std::size_t)>* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(index);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
      }
      done_cv_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_, dispatch_mutex_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

Worker& worker_for_thread() {
  static thread_local Worker worker;
  return worker;
}

}  // namespace

void check_dispatch(const Dispatch& d) {
  std::uint64_t tg = 1;
  for (int a = 0; a < 3; ++a) {
    if (d.threadgroup[a] == 0) {
      throw std::invalid_argument("[metal_kernel] threadgroup dimensions must be positive");
    }
    tg *= std::min(d.threadgroup[a], std::max<std::uint32_t>(d.grid[a], 1));
  }
  if (tg > kMaxThreadsPerThreadgroup) {
    throw std::invalid_argument("[metal_kernel] threadgroup of " + std::to_string(tg) +
                                " threads exceeds Metal's limit of 1024 threads per threadgroup");
  }
  // At the call, so a bad setting fails before anything is queued.
  env_threads();
  env_stack_kb();
  env_timeout_s();
}

bool is_interrupt(const char* message) { return message && std::strstr(message, kInterruptedText); }

void run_dispatch(const KernelLibrary& lib, const Dispatch& d, void* const* buffers,
                  const FaultDescriber& describe_fault) {
  check_dispatch(d);
  std::array<std::uint32_t, 3> groups{};
  std::uint64_t total = 1;
  for (int a = 0; a < 3; ++a) {
    if (d.grid[a] == 0) return;
    std::uint32_t tg = std::min(d.threadgroup[a], d.grid[a]);
    groups[a] = (d.grid[a] + tg - 1) / tg;
    total *= groups[a];
  }
  const std::string kernel = d.kernel.empty() ? "" : "kernel '" + d.kernel + "': ";
  std::atomic<std::uint64_t> next{0};
  Stopper stopper;
  InterruptScope interruptible(stopper);
  std::mutex error_mutex;
  std::string error;

  // METILE_MSL_TIMEOUT_S bounds a dispatch's wall time: a kernel that never
  // finishes (an endless loop) is interrupted and reported instead of hanging.
  const double limit = env_timeout_s();
  const std::string limit_text = limit > 0 ? std::getenv("METILE_MSL_TIMEOUT_S") : "";
  std::mutex done_mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::thread watchdog;
  if (limit > 0) {
    watchdog = std::thread([&] {
      std::unique_lock<std::mutex> lock(done_mutex);
      if (done_cv.wait_for(lock, std::chrono::duration<double>(limit), [&] { return done; })) return;
      stopper.stop(Stop::timeout);
    });
  }

  Pool::get().run([&](std::size_t) {
    install_fault_guard();
    {
      std::lock_guard<std::mutex> lock(stopper.mutex);
      stopper.threads.push_back(pthread_self());
    }
    Worker& w = worker_for_thread();
    w.entry = lib.entry();
    w.buffers = buffers;
    w.failed = false;
    w.error.clear();
    w.rng.seed(0x6d65746c);
    for (std::uint64_t g; !stopper.stopped() && (g = next.fetch_add(1)) < total;) {
      std::array<std::uint32_t, 3> gid{
          static_cast<std::uint32_t>(g % groups[0]),
          static_cast<std::uint32_t>((g / groups[0]) % groups[1]),
          static_cast<std::uint32_t>(g / (std::uint64_t(groups[0]) * groups[1]))};
      sigjmp_buf fault;
      t_fault = {};
      if (sigsetjmp(fault, 1) == 0) {
        t_fault_jump = &fault;
        t_in_kernel = 1;
        // A stop signalled before t_in_kernel was set found nothing to
        // interrupt; it is seen here instead.
        if (!stopper.stopped()) run_group(w, d, gid, groups);
        t_in_kernel = 0;
      } else if (t_fault.signal == 0) {  // the watchdog's signal
        if (stopper.why() == Stop::timeout) {
          w.fail("kernel exceeded METILE_MSL_TIMEOUT_S=" + limit_text + " s in " + group_name(gid) +
                 " (a loop that never ends?)");
        } else if (stopper.why() == Stop::interrupt) {
          w.fail(std::string(kInterruptedText) + " in " + group_name(gid));
        }
      } else {
        w.fail(fault_message(w, t_fault, group_name(gid), describe_fault));
      }
      t_fault_jump = nullptr;
      if (w.failed) {
        stopper.stop(Stop::failed);
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = w.error;
        break;
      }
    }
    std::lock_guard<std::mutex> lock(stopper.mutex);
    stopper.threads.erase(std::find(stopper.threads.begin(), stopper.threads.end(), pthread_self()));
  });
  if (watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> lock(done_mutex);
      done = true;
    }
    done_cv.notify_all();
    watchdog.join();
  }
  // A stop that reached no worker inside a group (it came between groups)
  // still ends the dispatch with its reason.
  if (error.empty() && stopper.why() == Stop::timeout) {
    error = "kernel exceeded METILE_MSL_TIMEOUT_S=" + limit_text + " s";
  } else if (error.empty() && stopper.why() == Stop::interrupt) {
    error = kInterruptedText;
  }
  if (!error.empty()) throw KernelError("[metal_kernel] " + kernel + error);
}

}  // namespace metile::msl_cpu
