// A cubin metile compiled, launched as its own MLX primitive on MLX's CUDA stream.
//
// Why not mx.fast.precompiled_cuda_kernel: MLX 0.32.4 keys its module cache by the
// kernel's name and a hash of the whole image, computed on every evaluation, so each
// call pays for hashing the cubin: a no-op kernel from a 161 KB module cost 45.5 us
// per call against 8.8 us from a 3 KB one, and metile's 116 KB GEMM paid ~20 us per
// call on top of its 10 us kernel (H200, benchmarks/results/h200-memory-form-*).
// Here the module is loaded once per device, when the CudaFunction is first launched,
// and a call adds one kernel node through MLX's command encoder, as MLX's own
// CustomKernel does (inputs and outputs declared for the graph's dependencies).
//
// Only exported MLX symbols are called.  MLX's CUDA headers cannot be included here
// (device.h pulls in fmt, which the wheel does not ship), so the few declarations
// used are repeated below, matched to MLX 0.32.4 (the version metile pins).
#include "cuda_launch.h"
#include "cubin_check.h"
#include "input_layout.h"
#include "no_vjp.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlx::core::cu {
// mlx/backend/cuda/device.h (MLX_API CommandEncoder; only these members are used)
class CommandEncoder {
 public:
  void set_input_array(const array& arr);
  void set_output_array(const array& arr);
  void add_kernel_node_raw(CUfunction func, dim3 grid_dim, dim3 block_dim, dim3 cluster_dim,
                           uint32_t smem_bytes, void** params);
  void add_completed_handler(std::function<void()> task);
};
CommandEncoder& get_command_encoder(Stream s);
class Device {
 public:
  void make_current();
};
Device& device(mlx::core::Device device);
}  // namespace mlx::core::cu

namespace metile::cuda {

namespace {

// A MetileOp's temporaries (op_node.h) held until the commit that runs its kernels is done,
// as MLX's encoder holds its own primitives' (add_temporary is inline in MLX's header, over
// members this file does not declare; add_completed_handler is exported).
[[maybe_unused]] const bool kKeepAliveSet = [] {
  metile::gpu_keep_alive() = [](mx::Stream s, std::vector<mx::array> temps) {
    mx::cu::get_command_encoder(s).add_completed_handler([temps = std::move(temps)]() {});
  };
  return true;
}();

// mlx/backend/cuda/allocator.h: every CUDA buffer's handle starts with its device pointer.
struct CudaBufferHead {
  void* data;
};

void* device_pointer(const mx::array& a) {
  auto* head = static_cast<CudaBufferHead*>(a.buffer().ptr());
  return static_cast<char*>(head->data) + a.offset();
}

void check(CUresult rc, const char* what, const std::string& name) {
  if (rc == CUDA_SUCCESS) return;
  const char* text = nullptr;
  cuGetErrorString(rc, &text);
  // std::string, not an ostringstream: formatting an int through iostreams crashed in
  // this library's libstdc++ locale code on the H200 (cuda-gdb, foreign_cubin.py)
  throw std::runtime_error(std::string("[metile] ") + what + " for kernel '" + name + "' failed: " +
                           (text ? text : "unknown CUDA error") + " (CUresult " +
                           std::to_string(int(rc)) + ")");
}

}  // namespace

CudaFunction::CudaFunction(std::string name, std::string image, int shared_memory)
    : name_(std::move(name)), image_(std::move(image)), shared_memory_(shared_memory) {
  if (shared_memory_ < 0) {
    throw std::invalid_argument("[metile] shared_memory must be non-negative");
  }
  check_image(name_, image_);
}

CUfunction CudaFunction::function(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = loaded_.find(device);
  if (it != loaded_.end()) return it->second;
  // Loaded when a launch is built (launch()), on the caller's thread: a refusal is a
  // Python exception there, never an error inside MLX's evaluation.
  mx::cu::device(mx::Device(mx::Device::gpu, device)).make_current();
  CUmodule module = nullptr;
  check(cuModuleLoadData(&module, image_.data()), "cuModuleLoadData", name_);
  CUfunction fn = nullptr;
  check(cuModuleGetFunction(&fn, module, name_.c_str()), "cuModuleGetFunction", name_);
  if (shared_memory_ > 48 * 1024) {
    check(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_memory_),
          "cuFuncSetAttribute(max dynamic shared memory)", name_);
  }
  // Modules stay loaded for the process: a launch still in flight may use them.
  loaded_.emplace(device, fn);
  return fn;
}

class CudaLaunch : public mx::Primitive {
 public:
  CudaLaunch(mx::Stream stream, std::shared_ptr<const LaunchConfig> config)
      : mx::Primitive(stream), config_(std::move(config)) {}

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override {
    if (!config_->no_vjp.empty()) throw metile::NoVjp(config_->no_vjp);
    return mx::Primitive::vjp(primals, cotangents, argnums, outputs);
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    return metile::refused_vmap(stream(), config_->fn->name(), inputs, axes, config_->shapes,
                                config_->dtypes);
  }

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>&, const std::vector<int>&) override {
    return metile::refused_jvp(stream(), config_->fn->name(), primals, config_->shapes,
                               config_->dtypes);
  }

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[metile] a CUDA kernel runs on the GPU stream only");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const LaunchConfig& c = *config_;
    auto& s = stream();
    auto& encoder = mx::cu::get_command_encoder(s);
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    // Argument storage: each element's address is handed to the node, which copies the
    // values when it is created.
    std::deque<std::variant<void*, bool, int, float>> storage;
    std::vector<void*> params;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& in = inputs[i];
      if (c.ensure_row_contiguous && !in.flags().row_contiguous) {
        throw std::runtime_error("[metile] kernel '" + c.fn->name() +
                                 "': an input reached the launch without row-contiguous "
                                 "layout (launch() makes such inputs contiguous)");
      }
      void* data = device_pointer(in);
      // An array viewed as a wider dtype at an offset its elements do not divide (a float16
      // view one element in, read as uint64 words: the int4 pair GEMV's x) starts where the
      // kernel's loads fault with "misaligned address", which loses the CUDA context for the
      // process: refused here, by name, while it is still an error
      auto past = reinterpret_cast<std::uintptr_t>(data) % in.itemsize();
      if (past != 0) {
        throw std::runtime_error(
            "[metile] kernel '" + c.fn->name() + "': input " + std::to_string(i) + " starts " +
            std::to_string(past) + " bytes past a multiple of its " +
            std::to_string(in.itemsize()) + "-byte elements (a view reinterpreted as a wider "
            "dtype at such an offset); a load there faults on the GPU - pass a copy "
            "(mx.array(x)) of the view it was made from");
      }
      params.push_back(&std::get<void*>(storage.emplace_back(data)));
    }
    for (const auto& out : outputs) {
      params.push_back(&std::get<void*>(storage.emplace_back(device_pointer(out))));
    }
    for (const auto& v : c.scalars) {
      auto& slot = storage.emplace_back();
      std::visit([&](auto x) { slot = x; }, v);
      params.push_back(std::visit([](auto& x) -> void* { return &x; }, slot));
    }
    CUfunction fn = c.fn->function(s.device.index);
    for (const auto& in : inputs) encoder.set_input_array(in);
    for (const auto& out : outputs) encoder.set_output_array(out);
    encoder.add_kernel_node_raw(fn, dim3(c.blocks[0], c.blocks[1], c.blocks[2]),
                                dim3(c.threads[0], c.threads[1], c.threads[2]), dim3(),
                                static_cast<uint32_t>(c.fn->shared_memory()), params.data());
  }

  const char* name() const override { return "MetileCudaKernel"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override {
    metile::refuse_shapeless(config_->fn->name());
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CudaLaunch*>(&other);
    if (!o) return false;
    const LaunchConfig &a = *o->config_, &b = *config_;
    return a.fn == b.fn && a.blocks == b.blocks && a.threads == b.threads &&
           a.scalars == b.scalars && a.ensure_row_contiguous == b.ensure_row_contiguous;
  }

 private:
  std::shared_ptr<const LaunchConfig> config_;
};

std::shared_ptr<const LaunchConfig> configure(std::shared_ptr<CudaFunction> fn,
                                              std::vector<mx::Shape> output_shapes,
                                              std::vector<mx::Dtype> output_dtypes, Dims grid,
                                              Dims threads, std::vector<Scalar> scalars,
                                              bool ensure_row_contiguous, std::string no_vjp) {
  if (output_shapes.empty() || output_shapes.size() != output_dtypes.size()) {
    throw std::invalid_argument("[metile] a launch needs one dtype per output, and an output");
  }
  auto config = std::make_shared<LaunchConfig>();
  for (int i = 0; i < 3; ++i) {
    if (threads[i] <= 0 || grid[i] <= 0) {
      throw std::invalid_argument("[metile] grid and threadgroup sizes must be positive");
    }
    // MLX's custom kernels take the grid in threads (as precompiled_cuda_kernel does)
    config->blocks[i] = (grid[i] + threads[i] - 1) / threads[i];
  }
  config->fn = std::move(fn);
  config->threads = threads;
  config->scalars = std::move(scalars);
  config->ensure_row_contiguous = ensure_row_contiguous;
  config->no_vjp = std::move(no_vjp);
  config->shapes = std::move(output_shapes);
  config->dtypes = std::move(output_dtypes);
  return config;
}

std::vector<mx::array> launch(const std::shared_ptr<const LaunchConfig>& config,
                              std::vector<mx::array> inputs, mx::Stream stream) {
  if (stream.device.type != mx::Device::gpu) {
    throw std::invalid_argument("[metile] a CUDA kernel needs a GPU stream");
  }
  // Whether most lazy inputs will be row-contiguous is known only once they are evaluated:
  // contiguous() is a no-op there when it is (it shares the buffer), a copy when not.
  if (config->ensure_row_contiguous) {
    for (auto& in : inputs) {
      if (!metile::row_contiguous_when_evaluated(in)) in = mx::contiguous(in, false, stream);
    }
  }
  config->fn->function(stream.device.index);
  return mx::array::make_arrays(config->shapes, config->dtypes,
                                std::make_shared<CudaLaunch>(stream, config), inputs);
}

}  // namespace metile::cuda
