#include "primitive.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace metile::msl_cpu {

namespace {

// What the kernel signature receives for one launch: the arrays' data and,
// per input, the shape/strides/ndim values MLX would bind as constants.
struct Bindings {
  std::vector<std::vector<int>> shapes;
  std::vector<std::vector<std::int64_t>> strides;
  std::vector<int> ndims;
  std::vector<void*> pointers;
};

std::vector<void*> data_of(const std::vector<mx::array>& arrays) {
  std::vector<void*> data;
  for (const auto& a : arrays) data.push_back(const_cast<void*>(static_cast<const void*>(a.data<char>())));
  return data;
}

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
// Ends are rounded up to 16 bytes so 4-wide accesses stay aligned: overruns of
// fewer bytes than that rounding pass.
class GuardedBuffers {
 public:
  explicit GuardedBuffers(bool at_end) : at_end_(at_end), page_(sysconf(_SC_PAGESIZE)) {}
  ~GuardedBuffers() {
    for (auto& r : regions_) munmap(r.map, r.map_bytes);
  }
  GuardedBuffers(const GuardedBuffers&) = delete;
  GuardedBuffers& operator=(const GuardedBuffers&) = delete;

  char* add(const void* source, std::size_t bytes, std::string name) {
    std::size_t rounded = (bytes + 15) / 16 * 16;
    std::size_t body = std::max<std::size_t>((rounded + page_ - 1) / page_ * page_, page_);
    std::size_t total = body + 2 * page_;
    void* map = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) throw std::runtime_error("[metal_kernel] bounds check: mmap failed");
    char* m = static_cast<char*>(map);
    if (mprotect(m + page_, body, PROT_READ | PROT_WRITE) != 0) {
      munmap(map, total);
      throw std::runtime_error("[metal_kernel] bounds check: mprotect failed");
    }
    char* data = m + page_ + (at_end_ ? body - rounded : 0);
    if (bytes) std::memcpy(data, source, bytes);
    regions_.push_back({m, total, data, bytes, std::move(name)});
    return data;
  }

  std::string describe(const void* address) const {
    const char* a = static_cast<const char*>(address);
    for (const auto& r : regions_) {
      if (a < r.map || a >= r.map + r.map_bytes) continue;
      std::ostringstream msg;
      msg << "'" << r.name << "' (" << r.bytes << " bytes) accessed at byte offset " << (a - r.data)
          << (a < r.data ? ", before its start" : ", past its end");
      return msg.str();
    }
    return "";
  }

 private:
  struct Region {
    char* map;
    std::size_t map_bytes;
    char* data;
    std::size_t bytes;
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
  for (bool at_end : {true, false}) {
    GuardedBuffers guarded(at_end);
    std::vector<void*> in_data, out_data;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      in_data.push_back(guarded.add(inputs[i].data<char>(), inputs[i].nbytes(),
                                    buffer_name(spec, i, inputs.size())));
    }
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      out_data.push_back(guarded.add(outputs[o].data<char>(), outputs[o].nbytes(),
                                     buffer_name(spec, inputs.size() + o, inputs.size())));
    }
    Bindings b = bind_arguments(spec, inputs, in_data, out_data);
    run_dispatch(lib, spec.dispatch, b.pointers.data(),
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

void run(const KernelLibrary& lib, const LaunchSpec& spec, const std::vector<mx::array>& inputs,
         std::vector<mx::array>& outputs) {
  std::vector<void*> data;
  for (auto& out : outputs) {
    data.push_back(out.data<char>());
    initialise(data.back(), out, spec.init_value);
  }
  if (spec.bounds_check) {
    run_bounds_checked(lib, spec, inputs, outputs);
  } else {
    Bindings b = bind_arguments(spec, inputs, data_of(inputs), data);
    run_dispatch(lib, spec.dispatch, b.pointers.data());
  }
  if (!spec.race_check) return;

  // Re-run with the other lane orders into scratch outputs and compare: a
  // kernel whose result depends on the order of its threads has a race.
  for (LaneOrder order : {LaneOrder::reverse, LaneOrder::shuffle}) {
    std::vector<std::vector<char>> scratch;
    std::vector<void*> scratch_data;
    for (auto& out : outputs) {
      scratch.emplace_back(out.nbytes());
      scratch_data.push_back(scratch.back().data());
      initialise(scratch_data.back(), out, spec.init_value);
    }
    Bindings sb = bind_arguments(spec, inputs, data_of(inputs), scratch_data);
    Dispatch d = spec.dispatch;
    d.order = order;
    run_dispatch(lib, d, sb.pointers.data());
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      const char* expected = outputs[o].data<char>();
      std::size_t item = outputs[o].itemsize();
      for (std::size_t i = 0; i < outputs[o].nbytes(); i += item) {
        if (std::memcmp(expected + i, scratch[o].data() + i, item) != 0) {
          std::ostringstream msg;
          msg << "[metal_kernel] race detected in kernel '" << spec.name << "': output " << o
              << " differs at element " << i / item << " between forward and " << order_name(order)
              << " thread order (missing threadgroup_barrier, or threads writing the same location)";
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
    out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.set_output_array(out);
  }
  for (auto& in : inputs) encoder.set_input_array(in);
  std::vector<mx::array> ins, outs;
  for (auto& in : inputs) ins.push_back(mx::array::unsafe_weak_copy(in));
  for (auto& out : outputs) outs.push_back(mx::array::unsafe_weak_copy(out));
  // Errors thrown here are stored by MLX's scheduler and re-raised at the
  // next eval/synchronize of this stream.
  encoder.dispatch([library = library_, spec = spec_, ins = std::move(ins), outs = std::move(outs)]() mutable {
    run(*library, spec, ins, outs);
  });
}

void MslCpuKernel::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "[metal_kernel] metile's MSL CPU runtime runs on the CPU stream only; use a Metal device for the GPU");
}

bool MslCpuKernel::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const MslCpuKernel*>(&other);
  return o && o->library_ == library_ && o->spec_.shape_infos == spec_.shape_infos &&
         o->spec_.dispatch.grid == spec_.dispatch.grid &&
         o->spec_.dispatch.threadgroup == spec_.dispatch.threadgroup &&
         o->spec_.dispatch.order == spec_.dispatch.order && o->spec_.init_value == spec_.init_value &&
         o->spec_.race_check == spec_.race_check && o->spec_.bounds_check == spec_.bounds_check;
}

std::vector<mx::array> launch(std::shared_ptr<KernelLibrary> library, LaunchSpec spec,
                              const std::vector<mx::array>& inputs,
                              const std::vector<mx::Shape>& output_shapes,
                              const std::vector<mx::Dtype>& output_dtypes, mx::Stream stream) {
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument("[metal_kernel] the MSL CPU runtime needs a CPU stream");
  }
  if (spec.shape_infos.size() != inputs.size()) {
    throw std::invalid_argument("[metal_kernel] internal error: shape info count differs from inputs");
  }
  check_dispatch(spec.dispatch);
  auto primitive = std::make_shared<MslCpuKernel>(stream, std::move(library), std::move(spec));
  return mx::array::make_arrays(output_shapes, output_dtypes, primitive, inputs);
}

}  // namespace metile::msl_cpu
