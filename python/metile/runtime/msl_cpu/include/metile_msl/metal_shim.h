// metile's Metal Shading Language standard library, for running MSL compute
// kernels on the CPU: the kernel source is compiled as C++20 by clang against
// this header, and each GPU thread runs as a fiber of metile's scheduler
// (see abi.h for the contract with the scheduler).
//
// What a kernel sees is meant to behave like Metal: vector types with
// swizzles, half/bfloat arithmetic that rounds after each operation, the
// `metal::` math library, SIMD-group collectives, simdgroup_matrix, atomics,
// threadgroup barriers.  What is not covered is listed in README-style notes
// at the top of each part.
//
// Address-space qualifiers (device, threadgroup, constant, thread) are empty
// macros: all memory is plain host memory.  The strict check compiles the
// same source against include_strict/, where they are distinct, as on Metal.
#pragma once

// Standard headers first: the address-space macros below would otherwise
// rewrite names such as std::thread or `constant` inside them.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <source_location>
#include <type_traits>
#include <utility>

#include "abi.h"

// Kernel code that only the CPU runtime can run (metile.device_print and
// device_assert) is emitted under `#if defined(METILE_MSL_CPU_RUNTIME)`.
#define METILE_MSL_CPU_RUNTIME 1

// Address spaces are erased here; the strict check (include_strict/) keeps
// them distinct, as Metal does.
#define device
#define constant
#define threadgroup
#define threadgroup_imageblock
#define thread
#define ray_data
#define object_data

// Kernel-qualifier keywords of MSL; the [[...]] attribute forms (kernel,
// buffer(n), thread_position_in_grid, host_name, ...) are unknown to clang
// and ignored under -Wno-unknown-attributes.
#define kernel
#define METAL_FUNC inline
#define METAL_INTERNAL
#define METAL_ASM

#include "types.h"
#include "math.h"
#include "sync.h"
#include "debug.h"
#include "atomics.h"
#include "matrix.h"
#include "mlx_utils.h"
#include "vector_ctors.h"
#include "matrix_types.h"
