// The source and bounds of an unevaluated basic slice (a KV cache's prefix view).
#pragma once

#include <cstring>
#include <optional>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace metile {

namespace mx = mlx::core;

// (source, start, end, steps) of an unevaluated basic slice `x` (MLX's Slice: named so,
// and cast by name - libmlx does not export its type info for a dynamic_cast; its state()
// is inline in the pinned MLX's header); nullopt for anything else.
struct LazySlice {
  mx::array source;
  mx::Shape start, end, steps;
};

inline std::optional<LazySlice> lazy_slice(const mx::array& x) {
  if (x.is_available() || !x.has_primitive() || x.inputs().size() != 1 ||
      std::strcmp(x.primitive().name(), "Slice") != 0) {
    return std::nullopt;
  }
  auto [start, end, steps] = static_cast<const mx::Slice&>(x.primitive()).state();
  return LazySlice{x.inputs()[0], start, end, steps};
}

}  // namespace metile
