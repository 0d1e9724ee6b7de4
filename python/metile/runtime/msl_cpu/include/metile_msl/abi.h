// The contract between metile's MSL CPU runtime (the scheduler inside
// metile._ext) and every kernel library it compiles from MSL.
//
// A kernel library is the user's MSL compiled as C++ against metal_stdlib.h
// (the shim).  It exports one C function, `metile_lane_main(Lane*)`, which runs
// one GPU thread to completion.  The runtime runs each thread of a
// threadgroup as a fiber and passes it a Lane describing where it sits; the
// shim calls back into the runtime (through `Runtime`) whenever a thread must
// wait for others: threadgroup barriers and SIMD-group collectives.
//
// Bump METILE_MSL_ABI_VERSION on any layout change: it is part of the
// compile-cache key and is checked when a library is loaded.
#pragma once

#include <cstddef>
#include <cstdint>

#define METILE_MSL_ABI_VERSION 2

namespace metile_rt {

constexpr unsigned kSimdWidth = 32;
// Bytes one lane may publish per collective (a float4x2 fits; so do the
// A/B/C element pairs of a simdgroup_matrix multiply).
constexpr unsigned kExchangeBytes = 64;
// Metal's limit on threadgroup memory per threadgroup.
constexpr std::size_t kThreadgroupMemoryBytes = 32 * 1024;
constexpr unsigned kMaxThreadgroupSlots = 256;

struct Lane;

// Where a synchronising call sits in the kernel source; lanes that wait at
// different sites are divergent and reported as an error.
struct Site {
  const char* function;
  unsigned line;
  unsigned column;
};

struct Runtime {
  // Blocks until every thread of the threadgroup reaches the same barrier.
  void (*threadgroup_barrier)(Lane*, Site);
  // Blocks until every live lane of the SIMD-group reaches the same
  // collective; then publishes the live-lane mask into simd->mask[parity].
  void (*simd_sync)(Lane*, Site, unsigned parity);
  // Aborts the launch with a message; never returns to the kernel.
  void (*fail)(Lane*, const char* message);
};

// State shared by the lanes of one SIMD-group.  Collectives alternate between
// two exchange buffers so a lane released early cannot overwrite values a
// slower lane has not read yet.
struct SimdShared {
  std::uint32_t mask[2];
  alignas(16) unsigned char slot[2][kSimdWidth][kExchangeBytes];
};

// State shared by the lanes of one threadgroup: the threadgroup-memory arena
// that `threadgroup T name[N];` declarations in the kernel body resolve to.
struct GroupShared {
  unsigned char* arena;  // kThreadgroupMemoryBytes, 16-byte aligned
  std::size_t used;
  void* slots[kMaxThreadgroupSlots];
};

struct Lane {
  const Runtime* rt;
  void* const* buffers;  // kernel arguments in signature order
  GroupShared* group;
  SimdShared* simd;
  unsigned parity;  // next exchange buffer of this lane

  std::uint32_t thread_position_in_grid[3];
  std::uint32_t thread_position_in_threadgroup[3];
  std::uint32_t threadgroup_position_in_grid[3];
  std::uint32_t threads_per_grid[3];
  std::uint32_t threads_per_threadgroup[3];
  std::uint32_t threadgroups_per_grid[3];
  std::uint32_t thread_index_in_threadgroup;
  std::uint32_t simdgroup_index_in_threadgroup;
  std::uint32_t thread_index_in_simdgroup;
  std::uint32_t simdgroups_per_threadgroup;
  // The threadgroup size the dispatch asked for; threads_per_threadgroup is
  // smaller in partial edge groups.
  std::uint32_t dispatch_threads_per_threadgroup[3];
  // Nonzero in a re-run made only to check the kernel (bounds check, race
  // check): its device_print output was printed by the first run.
  std::uint32_t quiet;

  void* runtime_private;
};

}  // namespace metile_rt

extern "C" {
// Exported by each kernel library.
typedef void (*metile_lane_main_fn)(metile_rt::Lane*);
typedef int (*metile_abi_version_fn)();
}
