"""Tensor-map templates for kernels whose GEMM operands arrive by bulk tensor copies (TMA;
passes/gemm_wgmma.py, bulk_tensor_form).

A TMA copy names a 128-byte CUtensorMap whose format only the driver knows
(cuTensorMapEncodeTiled).  MLX's custom kernels take arrays and int/float/bool scalars,
so the map cannot be a kernel parameter, and the operand's address is known only on the
GPU.  The launch therefore passes a template per map, encoded here once per (dtype, box)
with a stand-in address and extents; each block of the kernel replaces the address,
extents and row stride (tensormap.replace) and publishes its copy to a scratch output
(codegen/cuda.py, _TMA).  Every template: 2-D, 128-byte swizzle (the SW128 atoms the
warpgroup MMA descriptors read), zero fill out of bounds, 256-byte L2 promotion."""

from __future__ import annotations

import ctypes
import functools

import mlx.core as mx
import numpy as np

from ..errors import LaunchError

MAP_BYTES = 128
# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
_DTYPES = {"float16": 6, "bfloat16": 9}
_SWIZZLE_128B, _L2_256B, _INTERLEAVE_NONE, _FILL_ZERO = 3, 3, 0, 0
# A stand-in address (16-byte aligned, never read: each block replaces it).
_STAND_IN = 1 << 20


@functools.lru_cache(maxsize=1)
def _driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        encode = lib.cuTensorMapEncodeTiled
    except (OSError, AttributeError) as e:
        raise LaunchError(
            f"this kernel stages its GEMM operands with bulk tensor copies "
            f"(METILE_CUDA_WGMMA=tma), which need the CUDA driver's cuTensorMapEncodeTiled "
            f"(libcuda.so.1, CUDA 12+): {e}; set METILE_CUDA_WGMMA=whole") from None
    lib.cuInit(0)
    return encode


def encode(dtype: str, box: tuple[int, int]) -> np.ndarray:
    """One template: 128 bytes of a 2-D map of `dtype` with box (inner, outer)."""
    inner, outer = box
    size = 2                                     # float16 and bfloat16
    buf = np.zeros(2 * MAP_BYTES, np.uint8)
    at = (-buf.ctypes.data) % 64                 # CUtensorMap is 64-byte aligned
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rc = _driver()(ctypes.c_void_p(buf.ctypes.data + at), _DTYPES[dtype], u32(2),
                   ctypes.c_void_p(_STAND_IN), (u64 * 2)(inner, outer), (u64 * 1)(inner * size),
                   (u32 * 2)(inner, outer), (u32 * 2)(1, 1), _INTERLEAVE_NONE, _SWIZZLE_128B,
                   _L2_256B, _FILL_ZERO)
    if rc != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled refused a {dtype} map with box {box} "
                          f"(CUresult {rc}); set METILE_CUDA_WGMMA=whole")
    return buf[at:at + MAP_BYTES].copy()


@functools.lru_cache(maxsize=64)
def _templates(maps: tuple) -> mx.array:
    return mx.array(np.concatenate([encode(d, box) for d, box in maps]))


def templates(maps: list[dict], encoded: bool = True) -> mx.array:
    """The launch's template input: one map per entry of the launch record's
    `tensor_maps` ({"dtype", "box"}), concatenated (uint8); zeros of that size unless
    `encoded` (a launch prepared where it cannot run: its source can still be read)."""
    if not encoded:
        return mx.zeros((MAP_BYTES * len(maps),), dtype=mx.uint8)
    return _templates(tuple((m["dtype"], tuple(m["box"])) for m in maps))


def slots_shape(maps: list[dict], grid: tuple[int, int, int]) -> tuple[int]:
    """The scratch output's shape: each block's maps, in block order."""
    return (grid[0] * grid[1] * grid[2] * MAP_BYTES * len(maps),)
