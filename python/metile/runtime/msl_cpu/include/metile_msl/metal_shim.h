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
// Two modes:
//  * default: address-space qualifiers (device, threadgroup, constant,
//    thread) are empty macros, all memory is plain host memory.
//  * METILE_MSL_ADDRESS_SPACES defined (use with -fsyntax-only only): device,
//    threadgroup and constant become distinct clang address spaces, so
//    passing a threadgroup pointer where a device pointer is expected is a
//    compile error, as on Metal.  The shim never runs in this mode.
#pragma once

// Standard headers first: the address-space macros below would otherwise
// rewrite names such as std::thread or `constant` inside them.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <source_location>
#include <type_traits>
#include <utility>

#include "abi.h"

#ifdef METILE_MSL_ADDRESS_SPACES
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define threadgroup_imageblock __attribute__((address_space(3)))
#else
#define device
#define constant
#define threadgroup
#define threadgroup_imageblock
#endif
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
#include "atomics.h"
#include "matrix.h"
#include "mlx_utils.h"
#include "vector_ctors.h"
