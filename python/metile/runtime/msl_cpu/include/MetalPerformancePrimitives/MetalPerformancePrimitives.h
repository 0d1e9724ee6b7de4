// Metal Performance Primitives' tensor operations (mpp::tensor_ops::matmul2d)
// for metile's CPU runtime; see metile_msl/tensor_ops.h, whose header also
// says how metile's emitter calls it.
#pragma once
#include "../metile_msl/metal_shim.h"
#include "../metile_msl/tensor.h"
#include "../metile_msl/tensor_ops.h"
