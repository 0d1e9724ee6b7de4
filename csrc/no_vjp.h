// The error a metile primitive raises when mx.grad / mx.vjp reaches a kernel without a
// vjp, or mx.vmap any kernel.  ext.cpp translates it to Python's
// metile.errors.LaunchError, with the message Python wrote (runtime/dispatch.py) for a
// vjp: the same error the launch's mx.custom_function guard gave, without that guard's
// cost on every launch of the primitives metile owns.
#pragma once

#include <cctype>
#include <stdexcept>
#include <string>

namespace metile {

class NoVjp : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What mx.vmap meets in a metile launch: a kernel is compiled for its arrays' shapes and
// launched over its grid, so it has no batching rule.
inline std::string no_vmap(const std::string& symbol) {
  // the kernel's Python name in its symbol, metile_<name>_<12 hex digits of its hash>_...
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
  return "[metile] kernel '" + kernel + "' cannot be batched by mx.vmap (a metile launch "
         "has no vmap rule): launch it over the batched arrays with a grid that covers the "
         "batch, or, inside mx.vmap, call metile.ops with backend=\"mlx\"";
}

}  // namespace metile
