// A minimal single-OS-thread fiber scheduler implementing abi.h's Runtime,
// for testing the Metal shim without metile's real scheduler: one threadgroup
// at a time, lanes resumed round-robin (forward or reversed), barriers and
// SIMD-group syncs released when every unfinished lane waits.
#pragma once

#include <boost/context/detail/fcontext.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <metile_msl/abi.h>

namespace testsched {

namespace bc = boost::context::detail;
using metile_rt::Lane;

enum State { kRunnable, kBarrier, kSimd, kDone };

struct Fiber {
  bc::fcontext_t ctx = nullptr;
  Lane lane{};
  State state = kRunnable;
  std::vector<char> stack;
};

struct Sched {
  void (*entry)(Lane*) = nullptr;
  bc::fcontext_t main = nullptr;
  Fiber* cur = nullptr;
  std::string error;
};
inline thread_local Sched* g_sched;

inline Fiber* fiber_of(Lane* l) { return reinterpret_cast<Fiber*>(l->runtime_private); }

inline void yield_to_main(Lane* l) {
  Sched* s = g_sched;
  bc::transfer_t t = bc::jump_fcontext(s->main, nullptr);
  g_sched->main = t.fctx;  // the scheduler's context changes on every switch
  (void)l;
}

inline void hook_barrier(Lane* l, metile_rt::Site) {
  fiber_of(l)->state = kBarrier;
  yield_to_main(l);
}
inline void hook_simd(Lane* l, metile_rt::Site, unsigned) {
  fiber_of(l)->state = kSimd;
  yield_to_main(l);
}
[[noreturn]] inline void hook_fail(Lane* l, const char* msg) {
  g_sched->error = msg;
  fiber_of(l)->state = kDone;
  bc::jump_fcontext(g_sched->main, nullptr);
  __builtin_trap();  // never resumed
}
inline const metile_rt::Runtime kRuntime{hook_barrier, hook_simd, hook_fail};

inline void fiber_main(bc::transfer_t t) {
  g_sched->main = t.fctx;
  Fiber* f = static_cast<Fiber*>(t.data);
  g_sched->entry(&f->lane);
  f->state = kDone;
  bc::jump_fcontext(g_sched->main, nullptr);
}

struct Grid {
  unsigned grid[3];
  unsigned tg[3];
};

// Runs the whole dispatch; returns the first error message ("" on success).
// `reverse` resumes lanes in reversed order, which exposes races.
inline std::string run(void (*entry)(Lane*), Grid g, void* const* buffers, bool reverse = false) {
  Sched s;
  s.entry = entry;
  g_sched = &s;
  unsigned groups[3];
  for (int d = 0; d < 3; ++d) groups[d] = (g.grid[d] + g.tg[d] - 1) / g.tg[d];
  static unsigned char arena_mem[metile_rt::kThreadgroupMemoryBytes] __attribute__((aligned(16)));
  for (unsigned gz = 0; gz < groups[2]; ++gz)
    for (unsigned gy = 0; gy < groups[1]; ++gy)
      for (unsigned gx = 0; gx < groups[0]; ++gx) {
        unsigned gid[3] = {gx, gy, gz}, size[3];
        for (int d = 0; d < 3; ++d) {
          unsigned start = gid[d] * g.tg[d];
          size[d] = g.grid[d] - start < g.tg[d] ? g.grid[d] - start : g.tg[d];
        }
        unsigned n = size[0] * size[1] * size[2];
        unsigned nsimd = (n + 31) / 32;
        metile_rt::GroupShared group{};
        std::memset(arena_mem, 0xA5, sizeof arena_mem);  // poison
        group.arena = arena_mem;
        std::vector<metile_rt::SimdShared> simd(nsimd);
        std::vector<Fiber> fibers(n);
        for (unsigned i = 0; i < n; ++i) {
          Fiber& f = fibers[i];
          Lane& l = f.lane;
          l.rt = &kRuntime;
          l.buffers = buffers;
          l.group = &group;
          l.simd = &simd[i / 32];
          unsigned loc[3] = {i % size[0], (i / size[0]) % size[1], i / (size[0] * size[1])};
          for (int d = 0; d < 3; ++d) {
            l.thread_position_in_threadgroup[d] = loc[d];
            l.threadgroup_position_in_grid[d] = gid[d];
            l.thread_position_in_grid[d] = gid[d] * g.tg[d] + loc[d];
            l.threads_per_grid[d] = g.grid[d];
            l.threads_per_threadgroup[d] = size[d];
            l.threadgroups_per_grid[d] = groups[d];
          }
          l.thread_index_in_threadgroup = i;
          l.simdgroup_index_in_threadgroup = i / 32;
          l.thread_index_in_simdgroup = i % 32;
          l.simdgroups_per_threadgroup = nsimd;
          l.runtime_private = &f;
          f.stack.resize(256 * 1024);
          f.ctx = bc::make_fcontext(f.stack.data() + f.stack.size(), f.stack.size(), fiber_main);
        }
        for (;;) {
          bool progressed = false;
          for (unsigned k = 0; k < n; ++k) {
            Fiber& f = fibers[reverse ? n - 1 - k : k];
            if (f.state != kRunnable) continue;
            progressed = true;
            bc::transfer_t t = bc::jump_fcontext(f.ctx, &f);
            f.ctx = t.fctx;
            if (!s.error.empty()) return s.error;
          }
          if (progressed) continue;
          // Everyone is blocked or done: release SIMD-groups whose unfinished
          // lanes all wait at a SIMD sync, else a full threadgroup barrier.
          bool released = false;
          for (unsigned sg = 0; sg < nsimd; ++sg) {
            std::uint32_t waiting = 0, live = 0;
            for (unsigned i = sg * 32; i < n && i < sg * 32 + 32; ++i) {
              if (fibers[i].state != kDone) live |= 1u << (i % 32);
              if (fibers[i].state == kSimd) waiting |= 1u << (i % 32);
            }
            if (live && waiting == live) {
              for (unsigned i = sg * 32; i < n && i < sg * 32 + 32; ++i) {
                Fiber& f = fibers[i];
                if (f.state == kSimd) {
                  f.lane.simd->mask[f.lane.parity] = live;
                  f.state = kRunnable;
                }
              }
              released = true;
            }
          }
          if (released) continue;
          bool any_barrier = false, all_barrier = true;
          for (auto& f : fibers) {
            if (f.state == kBarrier) any_barrier = true;
            if (f.state != kBarrier && f.state != kDone) all_barrier = false;
          }
          if (any_barrier && all_barrier) {
            for (auto& f : fibers)
              if (f.state == kBarrier) f.state = kRunnable;
            continue;
          }
          if (any_barrier || !all_barrier) return "deadlock: lanes wait at different barriers/collectives";
          break;  // all done
        }
      }
  return "";
}

}  // namespace testsched
