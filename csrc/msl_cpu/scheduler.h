// The MSL CPU runtime's scheduler: runs a compiled kernel library over a
// Metal-style dispatch (grid counted in threads, possibly partial edge
// threadgroups).  Threadgroups run in parallel on a pool of OS threads; the
// threads of one group run as cooperative fibers that switch only at
// threadgroup barriers and SIMD-group collectives.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "metile_msl/abi.h"

namespace metile::msl_cpu {

// The order in which a group's fibers are resumed.  A correct kernel gives
// the same result for every order; a kernel that races on threadgroup memory
// usually does not, which is how the race-exposing mode finds it.
enum class LaneOrder { forward, reverse, shuffle };

LaneOrder parse_lane_order(const std::string& name);

struct Dispatch {
  std::array<std::uint32_t, 3> grid;         // threads
  std::array<std::uint32_t, 3> threadgroup;  // requested threads per group
  LaneOrder order = LaneOrder::forward;
  std::string kernel;                        // the kernel's name, for error messages
  bool quiet = false;                        // a check re-run: device_print prints nothing
};

// A dlopen'd kernel library; closed when the last launch using it is gone.
class KernelLibrary {
 public:
  explicit KernelLibrary(const std::string& path);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  const std::string& path() const { return path_; }
  metile_lane_main_fn entry() const { return entry_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
  metile_lane_main_fn entry_ = nullptr;
};

// Raised for anything the kernel did wrong at run time (divergent barrier,
// threadgroup memory overflow, ...); the message says what and where.
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Validates the dispatch against Metal's limits, and the METILE_MSL_* settings
// the runtime reads (an unparsable value is an error naming the variable, not a
// silent default); throws std::invalid_argument.
void check_dispatch(const Dispatch& d);

// Ctrl-C during a dispatch stops it with a KernelError whose message contains
// this text; MLX re-raises it at mx.eval as a plain runtime_error, so the
// Python layer recognises it by is_interrupt and raises KeyboardInterrupt.
inline constexpr const char kInterruptedText[] = "interrupted by SIGINT (Ctrl-C)";
bool is_interrupt(const char* message);

// Names what a faulting address belongs to ("4 bytes past the end of 'y'"), or
// returns "" when it does not know (bounds-check mode supplies one).
using FaultDescriber = std::function<std::string(const void*)>;

// Runs every threadgroup of the dispatch to completion.  Throws KernelError.
void run_dispatch(const KernelLibrary& lib, const Dispatch& d, void* const* buffers,
                  const FaultDescriber& describe_fault = {});

}  // namespace metile::msl_cpu
