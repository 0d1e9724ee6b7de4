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

#include <deque>
#include <stdexcept>

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
  CudaLaunch(mx::Stream stream, std::shared_ptr<CudaFunction> fn, Dims blocks, Dims threads,
             std::vector<Scalar> scalars, bool ensure_row_contiguous, std::string no_vjp,
             std::vector<mx::Shape> shapes, std::vector<mx::Dtype> dtypes)
      : mx::Primitive(stream), fn_(std::move(fn)), blocks_(blocks), threads_(threads),
        scalars_(std::move(scalars)), ensure_row_contiguous_(ensure_row_contiguous),
        no_vjp_(std::move(no_vjp)), shapes_(std::move(shapes)), dtypes_(std::move(dtypes)) {}

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override {
    if (!no_vjp_.empty()) throw metile::NoVjp(no_vjp_);
    return mx::Primitive::vjp(primals, cotangents, argnums, outputs);
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    return metile::refused_vmap(stream(), fn_->name(), inputs, axes, shapes_, dtypes_);
  }

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[metile] a CUDA kernel runs on the GPU stream only");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& s = stream();
    auto& encoder = mx::cu::get_command_encoder(s);
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    // Argument storage: each element's address is handed to the node, which copies the
    // values when it is created.
    std::deque<std::variant<void*, bool, int, float>> storage;
    std::vector<void*> params;
    for (const auto& in : inputs) {
      if (ensure_row_contiguous_ && !in.flags().row_contiguous) {
        throw std::runtime_error("[metile] kernel '" + fn_->name() +
                                 "': an input reached the launch without row-contiguous "
                                 "layout (launch() makes such inputs contiguous)");
      }
      params.push_back(&std::get<void*>(storage.emplace_back(device_pointer(in))));
    }
    for (const auto& out : outputs) {
      params.push_back(&std::get<void*>(storage.emplace_back(device_pointer(out))));
    }
    for (const auto& v : scalars_) {
      auto& slot = storage.emplace_back();
      std::visit([&](auto x) { slot = x; }, v);
      params.push_back(std::visit([](auto& x) -> void* { return &x; }, slot));
    }
    CUfunction fn = fn_->function(s.device.index);
    for (const auto& in : inputs) encoder.set_input_array(in);
    for (const auto& out : outputs) encoder.set_output_array(out);
    encoder.add_kernel_node_raw(fn, dim3(blocks_[0], blocks_[1], blocks_[2]),
                                dim3(threads_[0], threads_[1], threads_[2]), dim3(),
                                static_cast<uint32_t>(fn_->shared_memory()), params.data());
  }

  const char* name() const override { return "MetileCudaKernel"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CudaLaunch*>(&other);
    return o && o->fn_ == fn_ && o->blocks_ == blocks_ && o->threads_ == threads_ &&
           o->scalars_ == scalars_ && o->ensure_row_contiguous_ == ensure_row_contiguous_;
  }

 private:
  std::shared_ptr<CudaFunction> fn_;
  Dims blocks_, threads_;
  std::vector<Scalar> scalars_;
  bool ensure_row_contiguous_;
  std::string no_vjp_;
  std::vector<mx::Shape> shapes_;   // the outputs' (for vmap's stand-ins)
  std::vector<mx::Dtype> dtypes_;
};

std::vector<mx::array> launch(std::shared_ptr<CudaFunction> fn, std::vector<mx::array> inputs,
                              const std::vector<mx::Shape>& output_shapes,
                              const std::vector<mx::Dtype>& output_dtypes, Dims grid, Dims threads,
                              std::vector<Scalar> scalars, bool ensure_row_contiguous,
                              mx::Stream stream, std::string no_vjp) {
  if (stream.device.type != mx::Device::gpu) {
    throw std::invalid_argument("[metile] a CUDA kernel needs a GPU stream");
  }
  if (output_shapes.empty() || output_shapes.size() != output_dtypes.size()) {
    throw std::invalid_argument("[metile] a launch needs one dtype per output, and an output");
  }
  Dims blocks{};
  for (int i = 0; i < 3; ++i) {
    if (threads[i] <= 0 || grid[i] <= 0) {
      throw std::invalid_argument("[metile] grid and threadgroup sizes must be positive");
    }
    // MLX's custom kernels take the grid in threads (as precompiled_cuda_kernel does)
    blocks[i] = (grid[i] + threads[i] - 1) / threads[i];
  }
  // Whether most lazy inputs will be row-contiguous is known only once they are evaluated:
  // contiguous() is a no-op there when it is (it shares the buffer), a copy when not.
  if (ensure_row_contiguous) {
    for (auto& in : inputs) {
      if (!metile::row_contiguous_when_evaluated(in)) in = mx::contiguous(in, false, stream);
    }
  }
  fn->function(stream.device.index);
  auto primitive = std::make_shared<CudaLaunch>(stream, std::move(fn), blocks, threads,
                                                std::move(scalars), ensure_row_contiguous,
                                                std::move(no_vjp), output_shapes, output_dtypes);
  return mx::array::make_arrays(output_shapes, output_dtypes, primitive, inputs);
}

}  // namespace metile::cuda
