// Which inputs a launch must make row-contiguous before its kernel reads them.
#pragma once

#include <cstring>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace metile {

// Whether `x` is, or once evaluated will be, row-contiguous: evaluated, its flags say; lazy,
// only when its primitive always writes fresh row-contiguous outputs - metile's own
// kernels (their eval allocates every output) and MLX's matrix products.  Anything else is
// unknown until evaluated, and gets a contiguous() node (a buffer share when it turns out
// row-contiguous, a copy when not).  An eager model feeds most launches lazy arrays, and
// the node costs as much host time as an MLX op.  Should a listed primitive ever produce
// another layout, the launch's eval refuses the input with an error naming the kernel.
inline bool row_contiguous_when_evaluated(const mx::array& x) {
  if (x.is_available()) return x.flags().row_contiguous;
  if (!x.has_primitive()) return false;
  const char* name = x.primitive().name();
  for (const char* known : {"MetileCudaKernel", "MetileMslCpuKernel", "Matmul"}) {
    if (std::strcmp(name, known) == 0) return true;
  }
  return false;
}

}  // namespace metile
