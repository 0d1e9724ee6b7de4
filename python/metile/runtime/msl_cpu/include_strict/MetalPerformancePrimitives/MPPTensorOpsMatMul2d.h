// The matmul2d header of Metal Performance Primitives (strict model).
#pragma once
#include "MetalPerformancePrimitives.h"
