// metile's own CUDA launch primitive (cuda_launch.cpp): a cubin loaded once per device,
// launched as a lazy MLX node.  Built only against MLX's CUDA backend.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include <cuda.h>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace metile::cuda {

namespace mx = mlx::core;

using Dims = std::array<int, 3>;
using Scalar = std::variant<bool, int, float>;   // mx::fast::ScalarArg

// One kernel of a cubin; its module is loaded when the first launch on each device is
// built, and stays loaded.
class CudaFunction {
 public:
  CudaFunction(std::string name, std::string image, int shared_memory);
  CUfunction function(int device);
  const std::string& name() const { return name_; }
  int shared_memory() const { return shared_memory_; }
  std::size_t image_bytes() const { return image_.size(); }

 private:
  std::string name_, image_;
  int shared_memory_;
  std::mutex mutex_;
  std::unordered_map<int, CUfunction> loaded_;
};

// Everything about a launch but its arrays and stream, checked once (`configure`) and
// shared by every launch of a bound signature and the primitives it makes: a launch then
// copies no strings or vectors.
struct LaunchConfig {
  std::shared_ptr<CudaFunction> fn;
  Dims blocks{}, threads{};
  std::vector<Scalar> scalars;
  bool ensure_row_contiguous = true;
  std::string no_vjp;
  std::vector<mx::Shape> shapes;   // the outputs'
  std::vector<mx::Dtype> dtypes;
};

// A launch of `fn` over `grid` threads in blocks of `threads`: arguments are each input's
// pointer, then each output's, then `scalars` by value (the order of
// mx.fast.precompiled_cuda_kernel).  `no_vjp`: raised (metile::NoVjp) when a gradient
// reaches the launch; empty: MLX's own refusal.  Throws on sizes that cannot launch.
std::shared_ptr<const LaunchConfig> configure(std::shared_ptr<CudaFunction> fn,
                                              std::vector<mx::Shape> output_shapes,
                                              std::vector<mx::Dtype> output_dtypes, Dims grid,
                                              Dims threads, std::vector<Scalar> scalars,
                                              bool ensure_row_contiguous, std::string no_vjp);

// The outputs of the configured launch on `inputs`.
std::vector<mx::array> launch(const std::shared_ptr<const LaunchConfig>& config,
                              std::vector<mx::array> inputs, mx::Stream stream);

}  // namespace metile::cuda
