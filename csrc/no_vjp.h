// The error a metile primitive raises when mx.grad / mx.vjp reaches a kernel without a
// vjp.  ext.cpp translates it to Python's metile.errors.LaunchError, with the message
// Python wrote (runtime/dispatch.py): the same error the launch's mx.custom_function guard
// gave, without that guard's cost on every launch of the primitives metile owns.
#pragma once

#include <stdexcept>
#include <string>

namespace metile {

class NoVjp : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace metile
