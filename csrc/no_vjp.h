// The error a metile primitive raises when mx.grad / mx.vjp reaches a kernel without a
// vjp, or mx.vmap any kernel.  ext.cpp translates it to Python's
// metile.errors.LaunchError, with the message Python wrote (runtime/dispatch.py) for a
// vjp: the same error the launch's mx.custom_function guard gave, without that guard's
// cost on every launch of the primitives metile owns.
#pragma once

#include <cctype>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace metile {

class NoVjp : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A kernel's Python name in its symbol, metile_<name>_<12 hex digits of its hash>_...
inline std::string kernel_name(const std::string& symbol) {
  std::string kernel = symbol.rfind("metile_", 0) == 0 ? symbol.substr(7) : symbol;
  for (std::size_t at = kernel.find('_'); at != std::string::npos; at = kernel.find('_', at + 1)) {
    if (kernel.size() < at + 14 || kernel[at + 13] != '_') continue;
    bool hex = true;
    for (std::size_t i = at + 1; i <= at + 12; ++i) hex = hex && std::isxdigit(kernel[i]);
    if (hex) {
      kernel.resize(at);
      break;
    }
  }
  return kernel;
}

// What mx.vmap meets in a metile launch: a kernel is compiled for its arrays' shapes and
// launched over its grid, so it has no batching rule.
inline std::string no_vmap(const std::string& symbol) {
  std::string kernel = kernel_name(symbol);
  return "[metile] kernel '" + kernel + "' cannot be batched by mx.vmap (a metile launch "
         "has no vmap rule): launch it over the batched arrays with a grid that covers the "
         "batch, or, inside mx.vmap, call metile.ops with backend=\"mlx\"";
}

// Stand-in outputs of a transform a metile launch has no rule for (refused_vmap,
// refused_jvp): evaluating one raises the refusal.  Inside an mx.custom_function with a
// rule (the metile ops' MLX composites) MLX still asks the kernel, then uses the rule's
// outputs, so these are never evaluated; a bare launch under the transform fails by name.
class RefusedTransform : public mlx::core::Primitive {
 public:
  RefusedTransform(mlx::core::Stream stream, std::string message)
      : mlx::core::Primitive(stream), message_(std::move(message)) {}
  void eval_cpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw NoVjp(message_);
  }
  void eval_gpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw NoVjp(message_);
  }
  const char* name() const override { return "MetileRefusedTransform"; }

 private:
  std::string message_;
};

inline std::pair<std::vector<mlx::core::array>, std::vector<int>> refused_vmap(
    mlx::core::Stream stream, const std::string& symbol, const std::vector<mlx::core::array>& inputs,
    const std::vector<int>& axes, const std::vector<mlx::core::Shape>& shapes,
    const std::vector<mlx::core::Dtype>& dtypes) {
  int batch = 1;
  for (std::size_t i = 0; i < inputs.size() && i < axes.size(); ++i) {
    if (axes[i] >= 0) {
      batch = inputs[i].shape(axes[i]);
      break;
    }
  }
  std::vector<mlx::core::Shape> batched;
  for (auto shape : shapes) {
    shape.insert(shape.begin(), batch);
    batched.push_back(std::move(shape));
  }
  auto outs = mlx::core::array::make_arrays(
      batched, dtypes, std::make_shared<RefusedTransform>(stream, no_vmap(symbol)), inputs);
  return {outs, std::vector<int>(outs.size(), 0)};
}

// What mx.jvp meets in a metile launch: a kernel has no forward-mode derivative.
inline std::string no_jvp(const std::string& symbol) {
  return "[metile] kernel '" + kernel_name(symbol) + "' has no forward-mode derivative "
         "(mx.jvp): compute the tangent with MLX ops, or call metile.ops, whose jvp is "
         "their MLX composite's";
}

// What a metile launch gives mx.jvp: output tangents whose evaluation raises the refusal.
// Inside an mx.custom_function with a jvp rule (the metile ops' MLX composites) MLX walks
// the forward's graph too and then takes the rule's tangents, so these are never
// evaluated; a bare launch under mx.jvp fails by name.
inline std::vector<mlx::core::array> refused_jvp(
    mlx::core::Stream stream, const std::string& symbol, const std::vector<mlx::core::array>& primals,
    const std::vector<mlx::core::Shape>& shapes, const std::vector<mlx::core::Dtype>& dtypes) {
  return mlx::core::array::make_arrays(
      shapes, dtypes, std::make_shared<RefusedTransform>(stream, no_jvp(symbol)), primals);
}

// What mx.compile(shapeless=True) asks a metile launch for (Primitive::output_shapes): a
// kernel is built for the shapes it was traced with - its grid, its constants and often
// its code follow from them - so rerunning it on other shapes would compute something
// else.  Refused by name (MLX's default said only that the shapes cannot be inferred).
[[noreturn]] inline void refuse_shapeless(const std::string& symbol) {
  throw std::invalid_argument(
      "[metile] kernel '" + kernel_name(symbol) + "' is built for the shapes it was traced "
      "with, so mx.compile(shapeless=True) cannot take it (MLX asks a shapeless graph's "
      "nodes for shapes they do not know, on the first call too); compile without "
      "shapeless=True (each new shape then traces its own kernel), or call metile.ops with "
      "backend=\"mlx\" there");
}

}  // namespace metile
