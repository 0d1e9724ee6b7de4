#include "primitive.h"
#include "no_vjp.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace metile::msl_cpu {

namespace {

// Metal binds an array at its byte offset into a buffer whose contents are
// aligned to at least 16 bytes (Metal's largest alignment for a device-memory
// argument), so kernels cast a buffer's start to float4* or uint4*.  MLX's CPU
// allocator gives data only 8-byte aligned, and clang compiles those casts to
// aligned 16-byte moves, which fault there.  So each buffer is bound where
// Metal would put it: outputs 16-byte aligned, and an input whose address
// disagrees with its offset into its buffer modulo 16 is copied to where it
// agrees.  A view at an odd offset stays exactly as aligned as on Metal, so a
// vector access that Metal does not allow there still faults.
constexpr std::int64_t kMetalBufferAlign = 16;

std::int64_t mod_align(std::int64_t x) {
  return ((x % kMetalBufferAlign) + kMetalBufferAlign) % kMetalBufferAlign;
}

std::int64_t address_phase(const void* p) {
  return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p) % kMetalBufferAlign);
}

// Where `a`'s data pointer sits modulo the alignment on Metal.
std::int64_t metal_phase(const mx::array& a) { return mod_align(a.offset()); }

// The bytes a kernel may reach from an array's data pointer, [lo, hi): what
// its strides span (a sliced or transposed view, a broadcast, a negative
// stride), which is not its element count.
struct Extent {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::size_t bytes() const { return static_cast<std::size_t>(hi - lo); }
};

Extent extent_of(const mx::array& a) {
  if (a.size() == 0) return {};
  std::int64_t lo = 0, hi = 0;
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    std::int64_t reach = a.strides()[i] * static_cast<std::int64_t>(a.shape(i) - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  auto item = static_cast<std::int64_t>(a.itemsize());
  return {lo * item, (hi + 1) * item};
}

// Aligned host memory that lives as long as one launch.
class Scratch {
 public:
  char* allocate(std::size_t bytes) {
    std::size_t rounded = std::max<std::size_t>((bytes + kMetalBufferAlign - 1) / kMetalBufferAlign, 1) *
                          kMetalBufferAlign;
    void* p = std::aligned_alloc(kMetalBufferAlign, rounded);
    if (!p) throw std::bad_alloc();
    blocks_.emplace_back(static_cast<char*>(p));
    return blocks_.back().get();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<char, Free>> blocks_;
};

// The pointer an input is bound with: its own data when aligned as on Metal,
// else a copy of everything its strides reach, placed at Metal's alignment.
void* metal_aligned_input(const mx::array& a, Scratch& scratch) {
  char* data = const_cast<char*>(a.data<char>());
  std::int64_t phase = metal_phase(a);
  if (address_phase(data) == phase) return data;
  Extent e = extent_of(a);
  // The copy's data pointer is base + d, d >= -lo and d = phase (mod 16).
  std::int64_t d = -e.lo + mod_align(phase + e.lo);
  char* base = scratch.allocate(static_cast<std::size_t>(d + e.hi));
  if (e.bytes()) std::memcpy(base + d + e.lo, data + e.lo, e.bytes());
  return base + d;
}

std::vector<void*> metal_aligned_inputs(const std::vector<mx::array>& inputs, Scratch& scratch) {
  std::vector<void*> data;
  for (const auto& a : inputs) data.push_back(metal_aligned_input(a, scratch));
  return data;
}

// An output buffer starting where Metal's would (kMetalBufferAlign): MLX's
// allocation is over-sized and the array starts at an offset into it.
void allocate_metal_aligned(mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes() + kMetalBufferAlign));
  std::int64_t shift = mod_align(-address_phase(out.data<char>()));
  if (shift % static_cast<std::int64_t>(out.itemsize()) == 0 && shift) {
    out.copy_shared_buffer(out, out.strides(), out.flags(), out.data_size(),
                           shift / static_cast<std::int64_t>(out.itemsize()));
  }
  if (address_phase(out.data<char>()) != 0) {
    throw std::runtime_error("[metal_kernel] internal error: could not align an output buffer");
  }
}

std::string buffer_name(const LaunchSpec& spec, std::size_t i, std::size_t n_inputs);

// A buffer with no elements is bound to the middle of two inaccessible pages
// (Metal binds no memory behind it either), so any access through it faults and
// is reported; writing through the few bytes MLX allocates for it corrupted the
// heap and aborted the process.
char* empty_buffer_address() {
  static char* const address = [] {
    std::size_t page = sysconf(_SC_PAGESIZE);
    void* map = mmap(nullptr, 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) throw std::runtime_error("[metal_kernel] mmap of the empty-buffer page failed");
    return static_cast<char*>(map) + page;
  }();
  return address;
}

// Rebinds the buffers of arrays with no elements to empty_buffer_address();
// returns the names of those buffers, for the fault message.
std::vector<std::string> bind_empty_buffers(const LaunchSpec& spec, const std::vector<mx::array>& arrays,
                                            std::size_t first, std::size_t n_inputs, std::vector<void*>& data) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i].size() != 0) continue;
    data[i] = empty_buffer_address();
    names.push_back(buffer_name(spec, first + i, n_inputs));
  }
  return names;
}

// Describes a fault on the empty-buffer pages, naming the buffers bound there.
FaultDescriber describe_empty(std::vector<std::string> names) {
  if (names.empty()) return {};
  return [names = std::move(names)](const void* address) -> std::string {
    std::size_t page = sysconf(_SC_PAGESIZE);
    const char* a = static_cast<const char*>(address);
    const char* e = empty_buffer_address();
    if (a < e - page || a >= e + page) return "";
    std::string which;
    for (const auto& n : names) which += (which.empty() ? "'" : ", '") + n + "'";
    return "a buffer with no elements (" + which + ") accessed at byte offset " + std::to_string(a - e);
  };
}

// What the kernel signature receives for one launch: the arrays' data and,
// per input, the shape/strides/ndim values MLX would bind as constants.
struct Bindings {
  std::vector<std::vector<int>> shapes;
  std::vector<std::vector<std::int64_t>> strides;
  std::vector<int> ndims;
  std::vector<void*> pointers;
};

Bindings bind_arguments(const LaunchSpec& spec, const std::vector<mx::array>& inputs,
                        const std::vector<void*>& input_data, const std::vector<void*>& output_data) {
  Bindings b;
  b.shapes.reserve(inputs.size());
  b.strides.reserve(inputs.size());
  b.ndims.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const mx::array& in = inputs[i];
    b.pointers.push_back(input_data[i]);
    if (in.ndim() == 0) continue;
    auto [shape, strides, ndim] = spec.shape_infos[i];
    if (shape) {
      b.shapes.emplace_back(in.shape().begin(), in.shape().end());
      b.pointers.push_back(b.shapes.back().data());
    }
    if (strides) {
      b.strides.emplace_back(in.strides().begin(), in.strides().end());
      b.pointers.push_back(b.strides.back().data());
    }
    if (ndim) {
      b.ndims.push_back(static_cast<int>(in.ndim()));
      b.pointers.push_back(&b.ndims.back());
    }
  }
  for (void* p : output_data) b.pointers.push_back(p);
  return b;
}

template <typename T>
void fill_as(void* data, std::size_t n, float value) {
  T v = static_cast<T>(value);
  auto* p = static_cast<T*>(data);
  for (std::size_t i = 0; i < n; ++i) p[i] = v;
}

// Outputs start either at init_value or, when the caller gave none, as NaN /
// all-ones bytes: Metal leaves them uninitialised, and a kernel that forgets
// to write an element should not be rescued by a zeroed allocation.
void initialise(void* data, const mx::array& out, const std::optional<float>& init) {
  std::size_t n = out.size();
  if (!init) {
    std::memset(data, 0xFF, out.nbytes());
    return;
  }
  switch (out.dtype()) {
    case mx::bool_: fill_as<bool>(data, n, *init); break;
    case mx::uint8: fill_as<std::uint8_t>(data, n, *init); break;
    case mx::uint16: fill_as<std::uint16_t>(data, n, *init); break;
    case mx::uint32: fill_as<std::uint32_t>(data, n, *init); break;
    case mx::uint64: fill_as<std::uint64_t>(data, n, *init); break;
    case mx::int8: fill_as<std::int8_t>(data, n, *init); break;
    case mx::int16: fill_as<std::int16_t>(data, n, *init); break;
    case mx::int32: fill_as<std::int32_t>(data, n, *init); break;
    case mx::int64: fill_as<std::int64_t>(data, n, *init); break;
    case mx::float16: fill_as<mx::float16_t>(data, n, *init); break;
    case mx::bfloat16: fill_as<mx::bfloat16_t>(data, n, *init); break;
    case mx::float32: fill_as<float>(data, n, *init); break;
    case mx::float64: fill_as<double>(data, n, *init); break;
    default: throw std::invalid_argument("[metal_kernel] unsupported output dtype for init_value");
  }
}

// Bounds-check mode: every buffer is copied into its own mapping between two
// inaccessible pages, once against the trailing page (an index past the end
// faults) and once against the leading one (an index before the start faults),
// and the fault is reported with the buffer's name.  Without it a small overrun
// lands in memory MLX's allocator pooled nearby, unnoticed, as it may on a GPU.
// A buffer's fenced span is what its strides reach (extent_of), and it keeps
// Metal's alignment, so an end that is not a multiple of 16 bytes is followed
// by a few accessible bytes: overruns smaller than that pass.
class GuardedBuffers {
 public:
  explicit GuardedBuffers(bool at_end) : at_end_(at_end), page_(sysconf(_SC_PAGESIZE)) {}
  ~GuardedBuffers() {
    for (auto& r : regions_) munmap(r.map, r.map_bytes);
  }
  GuardedBuffers(const GuardedBuffers&) = delete;
  GuardedBuffers& operator=(const GuardedBuffers&) = delete;

  // Copies [data + e.lo, data + e.hi) and returns the copy's data pointer,
  // which is `phase` modulo kMetalBufferAlign.
  char* add(const char* data, Extent e, std::int64_t phase, std::string name) {
    std::size_t span = e.bytes() + kMetalBufferAlign;
    std::size_t body = std::max<std::size_t>((span + page_ - 1) / page_ * page_, page_);
    std::size_t total = body + 2 * page_;
    void* map = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) throw std::runtime_error("[metal_kernel] bounds check: mmap failed");
    char* m = static_cast<char*>(map);
    if (mprotect(m + page_, body, PROT_READ | PROT_WRITE) != 0) {
      munmap(map, total);
      throw std::runtime_error("[metal_kernel] bounds check: mprotect failed");
    }
    // Offsets from the (page-aligned) body start: the data pointer as late
    // (at_end) or as early as its phase allows.
    auto body_bytes = static_cast<std::int64_t>(body);
    std::int64_t d = at_end_ ? body_bytes - e.hi - mod_align(body_bytes - e.hi - phase)
                             : -e.lo + mod_align(phase + e.lo);
    char* copy = m + page_ + d;
    if (e.bytes()) std::memcpy(copy + e.lo, data + e.lo, e.bytes());
    regions_.push_back({m, total, copy, e, std::move(name)});
    return copy;
  }

  std::string describe(const void* address) const {
    const char* a = static_cast<const char*>(address);
    for (const auto& r : regions_) {
      if (a < r.map || a >= r.map + r.map_bytes) continue;
      std::ostringstream msg;
      msg << "'" << r.name << "' (" << r.extent.bytes() << " bytes) accessed at byte offset " << (a - r.data)
          << (a < r.data + r.extent.lo ? ", before its start" : ", past its end");
      return msg.str();
    }
    return "";
  }

 private:
  struct Region {
    char* map;
    std::size_t map_bytes;
    char* data;
    Extent extent;
    std::string name;
  };
  bool at_end_;
  std::size_t page_;
  std::vector<Region> regions_;
};

std::string buffer_name(const LaunchSpec& spec, std::size_t i, std::size_t n_inputs) {
  if (i < spec.buffer_names.size()) return spec.buffer_names[i];
  return i < n_inputs ? "input " + std::to_string(i) : "output " + std::to_string(i - n_inputs);
}

void run_bounds_checked(const KernelLibrary& lib, const LaunchSpec& spec,
                        const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  // Both runs start from the outputs' initial contents: the second must not start from the
  // first's results (a program waiting on a counter earlier programs' atomics moved would
  // wait past the value it waits for, forever).
  std::vector<std::vector<char>> initial;
  for (const auto& out : outputs) {
    initial.emplace_back(out.data<char>(), out.data<char>() + out.nbytes());
  }
  for (bool at_end : {true, false}) {
    GuardedBuffers guarded(at_end);
    std::vector<void*> in_data, out_data;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      in_data.push_back(guarded.add(inputs[i].data<char>(), extent_of(inputs[i]), metal_phase(inputs[i]),
                                    buffer_name(spec, i, inputs.size())));
    }
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      Extent whole{0, static_cast<std::int64_t>(outputs[o].nbytes())};
      out_data.push_back(guarded.add(initial[o].data(), whole, 0,
                                     buffer_name(spec, inputs.size() + o, inputs.size())));
    }
    Bindings b = bind_arguments(spec, inputs, in_data, out_data);
    Dispatch d = spec.dispatch;
    d.quiet = !at_end;  // the kernel's output was printed by the first run
    run_dispatch(lib, d, b.pointers.data(),
                 [&guarded](const void* address) { return guarded.describe(address); });
    if (at_end) {  // the second run only looks for accesses before the start
      for (std::size_t o = 0; o < outputs.size(); ++o) {
        std::memcpy(outputs[o].data<char>(), out_data[o], outputs[o].nbytes());
      }
    }
  }
}

const char* order_name(LaneOrder o) {
  return o == LaneOrder::forward ? "forward" : o == LaneOrder::reverse ? "reversed" : "shuffled";
}

double element_value(const char* p, mx::Dtype dtype) {
  switch (dtype) {
    case mx::bool_: return *reinterpret_cast<const bool*>(p);
    case mx::uint8: return *reinterpret_cast<const std::uint8_t*>(p);
    case mx::uint16: return *reinterpret_cast<const std::uint16_t*>(p);
    case mx::uint32: return *reinterpret_cast<const std::uint32_t*>(p);
    case mx::uint64: return static_cast<double>(*reinterpret_cast<const std::uint64_t*>(p));
    case mx::int8: return *reinterpret_cast<const std::int8_t*>(p);
    case mx::int16: return *reinterpret_cast<const std::int16_t*>(p);
    case mx::int32: return *reinterpret_cast<const std::int32_t*>(p);
    case mx::int64: return static_cast<double>(*reinterpret_cast<const std::int64_t*>(p));
    case mx::float16: return static_cast<float>(*reinterpret_cast<const mx::float16_t*>(p));
    case mx::bfloat16: return static_cast<float>(*reinterpret_cast<const mx::bfloat16_t*>(p));
    case mx::float32: return *reinterpret_cast<const float*>(p);
    case mx::float64: return *reinterpret_cast<const double*>(p);
    default: throw std::invalid_argument("[metal_kernel] race check: unsupported output dtype");
  }
}

bool same_element(const char* a, const char* b, const mx::array& out, const RaceCompare& how) {
  if (how.rtol == 0.0 && how.atol == 0.0) return std::memcmp(a, b, out.itemsize()) == 0;
  double x = element_value(a, out.dtype()), y = element_value(b, out.dtype());
  if (x == y || (std::isnan(x) && std::isnan(y))) return true;
  return std::fabs(x - y) <= how.atol + how.rtol * std::fabs(x);
}

void run(const KernelLibrary& lib, const LaunchSpec& spec, const std::vector<mx::array>& inputs,
         std::vector<mx::array>& outputs) {
  std::vector<void*> data;
  for (auto& out : outputs) {
    data.push_back(out.data<char>());
    initialise(data.back(), out, spec.init_value);
  }
  Scratch scratch;
  std::vector<void*> input_data;
  if (!spec.bounds_check || spec.race_check) input_data = metal_aligned_inputs(inputs, scratch);
  std::vector<std::string> empty;
  if (!input_data.empty()) {
    empty = bind_empty_buffers(spec, inputs, 0, inputs.size(), input_data);
    for (auto& n : bind_empty_buffers(spec, outputs, inputs.size(), inputs.size(), data)) empty.push_back(n);
  }
  if (spec.bounds_check) {
    run_bounds_checked(lib, spec, inputs, outputs);
  } else {
    Bindings b = bind_arguments(spec, inputs, input_data, data);
    run_dispatch(lib, spec.dispatch, b.pointers.data(), describe_empty(empty));
  }
  if (!spec.race_check) return;

  // Re-run with the other lane orders into scratch outputs and compare: a
  // kernel whose result depends on the order of its threads has a race,
  // unless the caller declared that output order-dependent.
  for (LaneOrder order : {LaneOrder::reverse, LaneOrder::shuffle}) {
    std::vector<void*> scratch_data;
    for (auto& out : outputs) {
      scratch_data.push_back(scratch.allocate(out.nbytes()));
      initialise(scratch_data.back(), out, spec.init_value);
    }
    bind_empty_buffers(spec, outputs, inputs.size(), inputs.size(), scratch_data);
    Bindings sb = bind_arguments(spec, inputs, input_data, scratch_data);
    Dispatch d = spec.dispatch;
    d.order = order;
    d.quiet = true;
    run_dispatch(lib, d, sb.pointers.data(), describe_empty(empty));
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      RaceCompare how = o < spec.race_compare.size() ? spec.race_compare[o] : RaceCompare{};
      if (!how.compare) continue;
      const char* expected = outputs[o].data<char>();
      const char* got = static_cast<const char*>(scratch_data[o]);
      std::size_t item = outputs[o].itemsize();
      for (std::size_t i = 0; i < outputs[o].nbytes(); i += item) {
        if (!same_element(expected + i, got + i, outputs[o], how)) {
          std::ostringstream msg;
          msg.precision(9);
          msg << "[metal_kernel] race detected in kernel '" << spec.name << "': output "
              << buffer_name(spec, inputs.size() + o, inputs.size()) << " differs at element " << i / item
              << " between forward and " << order_name(order) << " thread order ("
              << element_value(expected + i, outputs[o].dtype()) << " vs "
              << element_value(got + i, outputs[o].dtype())
              << "): missing threadgroup_barrier, or threads writing the same location; if the kernel "
                 "means this output to depend on thread order (float atomics, hash inserts), declare "
                 "it with order_dependent_outputs=";
          throw KernelError(msg.str());
        }
      }
    }
  }
}

}  // namespace

void MslCpuKernel::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& out : outputs) {
    allocate_metal_aligned(out);
    encoder.set_output_array(out);
  }
  for (auto& in : inputs) {
    // as the CUDA launch refuses one (cuda_launch.cpp): the launch made every input it could
    // not prove row-contiguous so (input_layout.h); a kernel indexing a view by the
    // row-major layout would read the wrong elements silently
    if (spec_->require_row_contiguous && in.ndim() > 0 && in.size() > 0 &&
        !in.flags().row_contiguous) {
      throw std::runtime_error("[metile] kernel '" + spec_->name +
                               "': an input reached the launch without row-contiguous layout");
    }
    encoder.set_input_array(in);
  }
  std::vector<mx::array> ins, outs;
  for (auto& in : inputs) ins.push_back(mx::array::unsafe_weak_copy(in));
  for (auto& out : outputs) outs.push_back(mx::array::unsafe_weak_copy(out));
  // Errors thrown here are stored by MLX's scheduler and re-raised at the
  // next eval/synchronize of this stream.
  encoder.dispatch([library = library_, spec = spec_, ins = std::move(ins), outs = std::move(outs)]() mutable {
    run(*library, *spec, ins, outs);
  });
}

void MslCpuKernel::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "[metal_kernel] metile's MSL CPU runtime runs on the CPU stream only; use a Metal device for the GPU");
}

std::vector<mx::array> MslCpuKernel::vjp(const std::vector<mx::array>& primals,
                                         const std::vector<mx::array>& cotangents,
                                         const std::vector<int>& argnums,
                                         const std::vector<mx::array>& outputs) {
  if (!spec_->no_vjp.empty()) throw metile::NoVjp(spec_->no_vjp);
  return mx::Primitive::vjp(primals, cotangents, argnums, outputs);
}

bool MslCpuKernel::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const MslCpuKernel*>(&other);
  if (!o || o->library_ != library_) return false;
  const LaunchSpec &a = *o->spec_, &b = *spec_;
  return a.shape_infos == b.shape_infos && a.dispatch.grid == b.dispatch.grid &&
         a.dispatch.threadgroup == b.dispatch.threadgroup && a.dispatch.order == b.dispatch.order &&
         a.init_value == b.init_value && a.race_check == b.race_check &&
         a.race_compare == b.race_compare && a.bounds_check == b.bounds_check;
}

std::vector<mx::array> launch(std::shared_ptr<KernelLibrary> library,
                              std::shared_ptr<const LaunchSpec> spec,
                              const std::vector<mx::array>& inputs, mx::Stream stream) {
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument("[metal_kernel] the MSL CPU runtime needs a CPU stream");
  }
  if (spec->shape_infos.size() != inputs.size()) {
    throw std::invalid_argument("[metal_kernel] internal error: shape info count differs from inputs");
  }
  check_dispatch(spec->dispatch);
  const LaunchSpec& s = *spec;
  return mx::array::make_arrays(s.output_shapes, s.output_dtypes,
                                std::make_shared<MslCpuKernel>(stream, std::move(library),
                                                               std::move(spec)),
                                inputs);
}

}  // namespace metile::msl_cpu
