// Which inputs a launch must make row-contiguous before its kernel reads them.
#pragma once

#include <cstring>
#include <optional>

#include "mlx/array.h"
#include "mlx/primitives.h"
#include "lazy_slice.h"
#include "op_node.h"

namespace mx = mlx::core;

namespace metile {

// Whether `x` is, or once evaluated will be, row-contiguous: evaluated, its flags say; lazy,
// only when its primitive always writes fresh row-contiguous outputs - metile's own
// kernels (their eval allocates every output) and MLX's matrix products.  Anything else is
// unknown until evaluated, and gets a contiguous() node (a buffer share when it turns out
// row-contiguous, a copy when not).  An eager model feeds most launches lazy arrays, and
// the node costs as much host time as an MLX op.  Should a listed primitive ever produce
// another layout, the launch's eval refuses the input with an error naming the kernel.
//
// Also through the two nodes mx.custom_function puts after the function it wraps, which
// take their outputs' buffers, strides and flags from their inputs (copy_shared_buffer):
// StopGradient (its one input) and CustomTransforms (output i, the function's output i:
// the last outputs().size() inputs).  So the output of a metile op under a transform
// (compile, grad), when it is a metile kernel's, feeds the next launch without a node.
inline bool row_contiguous_when_evaluated(const mx::array& x, int depth = 0) {
  if (x.is_available()) return x.flags().row_contiguous;
  if (!x.has_primitive() || depth > 8) return false;
  const char* name = x.primitive().name();
  if (metile_launch(name) || std::strcmp(name, "Matmul") == 0) return true;
  const auto& inputs = x.inputs();
  // SliceUpdate writes into a copy of its input that keeps the input's layout (or a
  // row-contiguous one), as a KV cache's update does
  if (std::strcmp(name, "SliceUpdate") == 0 && !inputs.empty()) {
    return row_contiguous_when_evaluated(inputs[0], depth + 1);
  }
  if (std::strcmp(name, "StopGradient") == 0 && inputs.size() == 1) {
    return row_contiguous_when_evaluated(inputs[0], depth + 1);
  }
  // a metile op under a transform (op_node.h): its output when a launch writes it
  if (std::strcmp(name, "MetileOp") == 0) {
    const auto& node = static_cast<const OpNode&>(x.primitive());
    auto outputs = x.outputs();
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].id() == x.id()) return node.row_contiguous_output(i);
    }
    return false;
  }
  if (std::strcmp(name, "CustomTransforms") == 0) {
    auto outputs = x.outputs();
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].id() != x.id()) continue;
      if (inputs.size() < outputs.size()) return false;
      return row_contiguous_when_evaluated(inputs[inputs.size() - outputs.size() + i], depth + 1);
    }
  }
  return false;
}

}  // namespace metile
