// The matmul2d header of Metal Performance Primitives; the shim has one unit.
#pragma once
#include "MetalPerformancePrimitives.h"
