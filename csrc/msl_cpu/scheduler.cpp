#include "scheduler.h"

#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <chrono>
#include <functional>
#include <mutex>
#include <pthread.h>
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

std::size_t stack_bytes() {
  static const std::size_t bytes = [] {
    const char* env = std::getenv("METILE_MSL_STACK_KB");
    std::size_t kb = env ? std::strtoul(env, nullptr, 10) : 0;
    return (kb >= 16 ? kb : 128) * 1024;
  }();
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
// buffer, a stack overflow into a fiber's guard page) must not take the Python
// process down: while a worker runs kernel code, SIGSEGV/SIGBUS jump back to
// the group's scheduler, which reports the fault as a kernel error.  Signals
// raised outside kernel code go to the handler that was installed before.
thread_local sigjmp_buf* t_fault_jump = nullptr;
thread_local volatile sig_atomic_t t_in_kernel = 0;
thread_local void* t_fault_address = nullptr;
struct sigaction g_previous_segv, g_previous_bus;

void fault_handler(int sig, siginfo_t* info, void* context) {
  if (t_in_kernel && t_fault_jump) {
    t_in_kernel = 0;
    t_fault_address = info->si_addr;
    siglongjmp(*t_fault_jump, sig);
  }
  const struct sigaction& previous = sig == SIGSEGV ? g_previous_segv : g_previous_bus;
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
    signal(sig, SIG_DFL);
    raise(sig);
  } else {
    previous.sa_handler(sig);
  }
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
    std::size_t n = std::thread::hardware_concurrency();
    if (const char* env = std::getenv("METILE_MSL_THREADS")) n = std::strtoul(env, nullptr, 10);
    n = std::max<std::size_t>(1, n);
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
}

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
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;

  // METILE_MSL_TIMEOUT_S bounds a dispatch's wall time: a kernel that never
  // finishes (an endless loop) is interrupted and reported instead of hanging.
  const char* limit_env = std::getenv("METILE_MSL_TIMEOUT_S");
  const double limit = limit_env ? std::strtod(limit_env, nullptr) : 0.0;
  std::mutex threads_mutex;
  std::vector<pthread_t> threads;
  std::mutex done_mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::atomic<bool> timed_out{false};
  std::thread watchdog;
  if (limit > 0) {
    watchdog = std::thread([&] {
      std::unique_lock<std::mutex> lock(done_mutex);
      if (done_cv.wait_for(lock, std::chrono::duration<double>(limit), [&] { return done; })) return;
      timed_out = true;
      failed = true;
      std::lock_guard<std::mutex> t(threads_mutex);
      for (pthread_t thread : threads) pthread_kill(thread, watchdog_signal());
    });
  }

  Pool::get().run([&](std::size_t) {
    install_fault_guard();
    {
      std::lock_guard<std::mutex> lock(threads_mutex);
      threads.push_back(pthread_self());
    }
    Worker& w = worker_for_thread();
    w.entry = lib.entry();
    w.buffers = buffers;
    w.failed = false;
    w.error.clear();
    w.rng.seed(0x6d65746c);
    for (std::uint64_t g; !failed.load(std::memory_order_relaxed) && (g = next.fetch_add(1)) < total;) {
      std::array<std::uint32_t, 3> gid{
          static_cast<std::uint32_t>(g % groups[0]),
          static_cast<std::uint32_t>((g / groups[0]) % groups[1]),
          static_cast<std::uint32_t>(g / (std::uint64_t(groups[0]) * groups[1]))};
      sigjmp_buf fault;
      if (sigsetjmp(fault, 1) == 0) {
        t_fault_jump = &fault;
        t_in_kernel = 1;
        run_group(w, d, gid, groups);
        t_in_kernel = 0;
      } else if (timed_out) {
        w.fail("kernel exceeded METILE_MSL_TIMEOUT_S=" + std::string(limit_env) + " s in " +
               group_name(gid) + " (a loop that never ends?)");
      } else {
        std::string what = describe_fault ? describe_fault(t_fault_address) : std::string();
        if (!what.empty()) {
          w.fail("out-of-bounds access in " + group_name(gid) + ": " + what);
        } else {
          char where[64];
          std::snprintf(where, sizeof where, "%p", t_fault_address);
          w.fail("invalid memory access at address " + std::string(where) + " in " +
                 group_name(gid) + " (an index outside its buffer, or a fiber stack overflow: "
                 "see METILE_MSL_STACK_KB; METILE_MSL_BOUNDS_CHECK=1 names the buffer)");
        }
      }
      t_fault_jump = nullptr;
      if (w.failed) {
        failed = true;
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = w.error;
        break;
      }
    }
    std::lock_guard<std::mutex> lock(threads_mutex);
    threads.erase(std::find(threads.begin(), threads.end(), pthread_self()));
  });
  if (watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> lock(done_mutex);
      done = true;
    }
    done_cv.notify_all();
    watchdog.join();
  }
  if (failed && error.empty() && timed_out) {
    error = "kernel exceeded METILE_MSL_TIMEOUT_S=" + std::string(limit_env) + " s";
  }
  if (failed) throw KernelError("[metal_kernel] " + error);
}

}  // namespace metile::msl_cpu
