// Strict model of Metal Performance Primitives' tensor operations; see
// metile_msl_strict/tensor_ops.h.
#pragma once
#include "../metile_msl_strict/model.h"
#include "../metile_msl_strict/tensor.h"
#include "../metile_msl_strict/tensor_ops.h"
