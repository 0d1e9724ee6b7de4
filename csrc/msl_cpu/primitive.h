// The MLX primitive that runs an MSL kernel library on the CPU stream.  It is
// an ordinary lazy node: nothing runs before mx.eval, and it traces through
// mx.compile like any MLX op.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"
#include "no_vjp.h"
#include "scheduler.h"

namespace metile::msl_cpu {

namespace mx = mlx::core;

// How the race check compares one output across thread orders.
struct RaceCompare {
  bool compare = true;  // false: the output may legitimately depend on order
  double rtol = 0.0;    // both zero: bit-exact
  double atol = 0.0;    // else |a - b| <= atol + rtol * |a|, element-wise
  bool operator==(const RaceCompare&) const = default;
};

struct LaunchSpec {
  // Per input: does the signature take {name}_shape, _strides, _ndim?
  std::vector<std::tuple<bool, bool, bool>> shape_infos;
  Dispatch dispatch;
  std::optional<float> init_value;
  // Run forward, reversed and shuffled lane orders and require equal outputs.
  bool race_check = false;
  std::vector<RaceCompare> race_compare;  // per output; empty: all bit-exact
  // Run on copies of every buffer fenced by inaccessible pages (see primitive.cpp).
  bool bounds_check = false;
  std::string name;
  std::vector<std::string> buffer_names;  // inputs, then outputs (for bounds-check messages)
  // Raised (metile::NoVjp) when a gradient reaches this launch; empty: MLX's own refusal.
  std::string no_vjp;
  std::vector<mx::Shape> output_shapes;
  std::vector<mx::Dtype> output_dtypes;
  // Every input of rank > 0 must arrive row-contiguous: the launch made contiguous each one
  // it could not prove so (input_layout.h), so one that is not means that rule was wrong.
  bool require_row_contiguous = false;
};

class MslCpuKernel : public mx::Primitive {
 public:
  MslCpuKernel(mx::Stream stream, std::shared_ptr<KernelLibrary> library,
               std::shared_ptr<const LaunchSpec> spec)
      : mx::Primitive(stream), library_(std::move(library)), spec_(std::move(spec)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "MetileMslCpuKernel"; }
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    return metile::refused_vmap(stream(), spec_->name, inputs, axes, spec_->output_shapes,
                                spec_->output_dtypes);
  }
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>&, const std::vector<int>&) override {
    return metile::refused_jvp(stream(), spec_->name, primals, spec_->output_shapes,
                               spec_->output_dtypes);
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override {
    metile::refuse_shapeless(spec_->name);
  }

 private:
  std::shared_ptr<KernelLibrary> library_;
  // shared by every launch of a bound signature and the evaluations it queues: a launch
  // copies no strings
  std::shared_ptr<const LaunchSpec> spec_;
};

// The outputs (spec's shapes and dtypes) of launching the kernel on `inputs`.
std::vector<mx::array> launch(std::shared_ptr<KernelLibrary> library,
                              std::shared_ptr<const LaunchSpec> spec,
                              const std::vector<mx::array>& inputs, mx::Stream stream);

}  // namespace metile::msl_cpu
