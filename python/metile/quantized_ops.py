"""`metile.ops.quantized_matmul`: a drop-in for `mx.quantized_matmul` on weights from
`mx.quantize` (affine mode, bits 4 and 8, group sizes 32, 64, 128).

    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    y = metile.ops.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=64, bits=4)

x may have any leading dimensions (they flatten into rows); the result has MLX's
dtype (x's promoted with the scales'), and x is converted to it before the kernel
runs, as MLX does.  The kernels (kernels/metile_kernels/quantized.py):

* up to DECODE_ROWS rows (decode): a GEMV that reads every packed word once and
  dequantizes in registers (`quantized_matvec`; `quantized_matvec_n` for
  transpose=False), and candidates written along K in runs (`quantized_matvec_runs`,
  and `quantized_matvec_rows`, several rows a warp: 1.27x and 1.22x MLX at 1x4096x11008
  int4 in the s21 run), and, for float16 4/8-bit and bfloat16 4-bit weights, the GEMV in
  packed 16-bit pairs (kernels/metile_kernels/quantized_pairs.py: on the H200 the fastest
  since 2026-12-04, 1.78x MLX a product in a compiled decode step);
* more rows (prefill): a tiled GEMM that dequantizes the weight tile while staging
  it and multiplies on matrix units (`quantized_matmul`);
* a routing candidate besides: `dequantize` into a temporary float weight, then
  metile.ops' dense GEMM on it as stored (on the H200 the faster prefill path: 2.95x
  MLX at 512x4096x11008 int4 in s21, where the fused GEMM is 0.11x).

Which path runs (`backend=`) follows ops.py: "mlx" MLX's op, "metile" the kernel
chosen by row count, "auto" (the default) a metile kernel only where a recorded
measurement on this machine found it faster (runtime/routing.py), keyed by the
dtypes, rows rounded up to a power of two, N, K, bits, group size and layout;
without a recorded decision MLX's op runs.  Measuring is explicit:
`with metile.ops.tuning():` or METILE_OPS_TUNE=1, on eager calls.  Settings the
kernels do not implement (bits other than 4 and 8, modes other than "affine")
run MLX's op under "auto" and are refused by name under "metile".

Differentiable (`runtime/op_function.OpFunction`, mx.custom_function's rules on one
node): the gradient w.r.t. x is `mx.quantized_matmul` of the cotangent with the other
transpose (what MLX's own vjp computes); scales and biases get MLX's gradients (the
dequantized weight's gradient summed per group, times q for the scales); the packed
weight's gradient is an array whose evaluation raises, where MLX raises at once ("no
gradient wrt the quantized weights"), since a vjp in mx.custom_function's form is not told
which inputs were asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import mlx.core as mx

from . import op_replay
from .language import dtypes as dt
from .runtime import routing
from .op_routing import (
    rows as _rows,
    FLOAT_DTYPES as _DTYPES,
    check_backend,
    config_name,
    is_integer,
    m_bucket,
    device_description as _device_description,
    validate as _validate,
    on_stream,
    CPU_REASON,
    cost_model,
    TUNING,
    dtype_name)

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
MLX_BITS = (1, 2, 3, 4, 5, 6, 8)   # what mx.quantize takes in affine mode
# Up to this many rows run the GEMV kernels (rows are a grid axis there, each row
# reading the weight again, from cache after the first).
DECODE_ROWS = 8
MATVEC = {"kernel": "matvec", "BLOCK_N": 4, "BLOCK_W": 128}
# The GEMV written along K (quantized_matvec_runs): x read in 16-byte runs, each packed
# word, scale and bias once per run; one output per program.  On the H200 (int4, group
# 64, 1x4096x11008 float16; benchmarks/results/h200-quantized-parts-sweep-2026-12-01.txt)
# 512/1 warp 29.6 us, 256/1 31.8, 1024/2 33.2, larger blocks 36-45 (a per-block running
# sum instead of the held accumulator was no faster: 32-45); MLX 33.4.  Without load masks
# where K is a multiple of the block (EVEN_K, s33, ncu kernel time with caches flushed,
# h200-ncu-gemv-s33-*.csv): 512/1 22.7 -> 20.5 us, 1024/1 19.0-19.5, 2048/1 23.5 (16%
# occupancy); MLX 29.8-30.3.
MATVEC_RUNS = [{"kernel": "matvec_runs", "BLOCK_K": 1024, "num_warps": 1},
               {"kernel": "matvec_runs", "BLOCK_K": 512, "num_warps": 1},
               {"kernel": "matvec_runs", "BLOCK_K": 256, "num_warps": 1}]
# Several outputs a program on one warp (quantized_matvec_rows), on the H200
# (h200-device-log-s15-2026-12-02.txt): 8x512 28.6 us, 4x512 29.2, 16x256 29.3, 2x512
# 30.3, 4x1024 34.0; quantized_matvec_runs 512/1 32.0, MLX 35.2.  After the shifts were
# folded (s16) the two kernels are level: 25.8 and 25.7 us in benchmarks.quantized
# (MLX 38.1), 30.2 and 30.7 in the probe (16x256: 29.0).
# With each row's index clamped instead of masked (s30: quantized_matvec_rows says why)
# 4x512 took 24.0 us of kernel time, 8x512 46.6, and 29.6 against 34.8 for 8x512 in the
# decode benchmark's compiled calls (MLX 34.2).  Without load masks (s33, ncu): 2x1024
# 20.2-20.4, 2x512 20.7-20.9, 4x512 22.9 (as masked: 2752 one-warp programs hold 24% of
# the SMs' warp slots), 8x512 36.7-37.0 and 16x256 74.9 (1376 and 688 programs: 16% and 8%
# occupancy): 2x1024 is the candidate.
MATVEC_ROWS = [{"kernel": "matvec_rows", "BLOCK_K": 1024, "ROWS": 2, "num_warps": 1},
               {"kernel": "matvec_rows", "BLOCK_K": 512, "ROWS": 4, "num_warps": 1},
               {"kernel": "matvec_rows", "BLOCK_K": 512, "ROWS": 8, "num_warps": 1}]
# One output a warp, ROWS warps a program (quantized_matvec_warps): past the 32 one-warp
# programs an SM holds.  Not a candidate: slower on the H200 (s28, 1x4096x11008 int4,
# ncu kernel time 29.1-33.5 us against 22.5 for the 512/1 runs GEMV and MLX's 30.4).
MATVEC_WARPS = [{"kernel": "matvec_warps", "BLOCK_K": 256, "ROWS": 4, "num_warps": 4},
                {"kernel": "matvec_warps", "BLOCK_K": 256, "ROWS": 8, "num_warps": 8},
                {"kernel": "matvec_warps", "BLOCK_K": 512, "ROWS": 4, "num_warps": 4}]
# The GEMV in packed 16-bit pair arithmetic (quantized_matvec_pairs: two weights an
# instruction, x's pairs shared by ROWS rows a lane, SPAN words a lane a step): float16 4/8-
# bit and bfloat16 4-bit weights, transpose=True (metile_kernels.quantized_pairs.PAIR_FORMS).
# On the H200 (1x4096x11008 int4 group 64 float16, ncu kernel time, s89): 8 rows / 4 words
# 13.2 us, 4 / 2 13.9, 4 / 4 14.8, against 18.8 for the runs GEMV and ~30 for MLX's qmv; 8
# products a compiled call: 20.0 us a product against 24.6 and MLX's 32.4.  (SPAN 4 needs
# groups of 4 words: every mx.quantize group at 4 and 8 bits.)
# Its reads bound it: with the products replaced by XORs its grid and loads take as long
# (H200 14.0 against 14.1 us a product, s154).  K split over 2 or 4 warps of a program
# (LANES 64 / 128, 8 rows a warp) for more warps an SM: no faster (H100, s155:
# tools/probes/gemv_warps_chain.py).
MATVEC_PAIRS = [{"kernel": "matvec_pairs", "ROWS": 8, "SPAN": 4, "num_warps": 1},
                {"kernel": "matvec_pairs", "ROWS": 4, "SPAN": 2, "num_warps": 1}]
# ...reading x as its 16-bit values, four loads joined into each 64-bit word, where the form
# above views x as uint64: an x that is a view at an odd element offset (which the uint64
# view's loads would fault on, on CUDA) reads right.  Not a candidate: 21.1 us a product
# against 17.4 (H100, 8 a compiled call, 1x4096x11008 float16, s152), and MLX's CUDA view of
# such an x reached the uint64 form aligned there (benchmarks/results/README.md).
MATVEC_PAIRS_HALVES = {**MATVEC_PAIRS[0], "X_HALVES": True}
# ...with the K loop's steps unrolled (UNROLL: the launch passes the row's step count, at most
# MAX_UNROLLED_STEPS, where a row's words are whole steps; the rest loop): ptxas then spreads
# a later step's loads through an earlier step's arithmetic (sm_90 SASS: 128 registers
# against 96, no spills), the carried-tuple form of that which was measured at 12.9 against
# 13.3 us (s93) done by the GPU compiler.  Not a candidate: 17.8 us a product against 17.4
# (H100, s152).
MATVEC_PAIRS_UNROLLED = {**MATVEC_PAIRS[0], "UNROLL": True}
MAX_UNROLLED_STEPS = 8
# ...reading a lane's packed words two a 64-bit load of the weights' uint64 view (W64; where
# a row's words are whole steps, else the 32-bit loads).  Its probe form took 13.9-14.0 us a
# product against 14.4-14.6 in four runs (H100, 8 a compiled call, 1x4096x11008 float16,
# s156); this library form, with the same SASS loop counts, took 15.2 / 16.6 against 14.6 /
# 15.0 in two runs on another H100 (s157).  No H200 has timed it: a candidate `auto`
# measures, not the default.
MATVEC_PAIRS_W64 = {**MATVEC_PAIRS[0], "W64": True}
MATVEC_N = {"kernel": "matvec_n", "BLOCK_N": 256, "BLOCK_K": 8}
GEMM = {"kernel": "gemm", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
# NVIDIA, 16-bit operands: the dense GEMM's measured 8-warp tile (ops.CUDA_BLOCK).
CUDA_GEMM = {"kernel": "gemm", "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32,
             "num_simdgroups": 8}
DEQUANTIZE_GEMM = {"kernel": "dequantize+gemm"}
# ...with MLX's own dense product (cuBLAS on CUDA) after metile's dequantize: on the H200
# (512x4096x11008 int4, weights from DRAM) 128.3-129.3 us against 152.1-167.0 with
# metile's dense product and MLX's quantized_matmul 355-357 (s29; the metile form took
# 126-129 on the hosts of s26/s27).  `auto` measures both.
DEQUANTIZE_MLX_GEMM = {"kernel": "dequantize+gemm", "DENSE": "mlx"}
# Hopper, 16-bit x, transpose=True: the fused GEMM on warpgroup MMA, its weight tile
# dequantized by the threads into the K-major stage (gemm_async.computed_axis) while the
# tensor cores multiply the previous tiles.  Not a candidate: on the H200 (s24, 512x4096x
# 11008 int4, weights out of L2) it took 486.7 us against 121.6 for dequantize+gemm and
# MLX's 346.2 (3241 us for the mma.sync GEMM before it): each element of a staged tile is
# evaluated on its own, its packed word, scale and bias loaded again for each of the 8
# elements a 16-byte group holds.  With each group's word, scale and bias loaded once
# (gemm_async._GroupInvariant) 301.1 us against 126.3 (s26): still not a candidate.
WGMMA_GEMM = {"kernel": "gemm", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
              "num_simdgroups": 8}
# ...with the weight tile dequantized in packed 16-bit pairs (quantized.dequantized_pairs:
# 4-bit weights, float16/bfloat16 x, K and N whole tiles): ~3 SASS instructions a weight in
# the staging loop instead of ~20 (473 a K step and thread against ~1570, NVRTC sm_90a,
# 512x4096x11008).  Among auto's prefill candidates where it fits (`_pair_prefill`), not
# backend="metile"'s default: on an H100 (s142/s143, x4096x11008 int4 group 64, 4 weights
# cycled) 128 rows 47.4 us against 82.6 for dequantize + GEMM and MLX's 91.1; 512 rows
# 151.9 (the 256x128 tile below 123.7) against 121.8-122.9; 2048 rows 565.9 (472.7) against
# 312.3 - each row block dequantizes the whole weight again.  Measured at one N only.
WGMMA_PAIRS = {**WGMMA_GEMM, "PAIRS": True}
# ...on a 256x128 tile: half the weight tile a K step for the same products (two m64n128
# products a warpgroup), so half the staging work per tensor-core cycle; x by bulk tensor
# copies (BULK_X: `_bulk_x_backend`) beside the threads' weight stores, 313 SASS
# instructions a K step and thread against 402.  H100 (s149, x4096x11008 int4 group 64,
# 4 weights cycled, one run alternating): 512 rows float16 110.4 us against 113.9 with
# x by cp.async (MLX 339.0), bfloat16 107.3 against 113.0 (MLX 372.7); at 128 rows 75.2
# against 63.5, where the 128x256 tile (51.0; 53.3 with BULK_X) takes the call.
WGMMA_PAIRS_TALL = {"kernel": "gemm", "BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64,
                    "num_simdgroups": 8, "PAIRS": True, "BULK_X": True}
# ...its warp-specialized form (METILE_CUDA_WGMMA=ws): a producer warpgroup evaluates the
# weight tiles while the two others multiply (the form above has every warp do both);
# slower still: 502.3 us (s29)
WGMMA_GEMM_WS = {**WGMMA_GEMM, "num_simdgroups": 12}
# 4096 columns a program on 8 warps: two runs of 8 (16 bytes of float16) a thread.  The
# thread count must be named: traced from the arange it would be one element a thread,
# no runs (387 us for a 4096x11008 int4 weight on the H200 against 98.8 for
# mx.dequantize).  Measured (tools/probes/quantized_parts.py): 4096/8 warps 66.8 us,
# 2048/2 72.7, 1024/4 74.1, 4096/4 76.3, 4096/2 91.2.  Kernel time alone (ncu, caches
# flushed, s35): 4096/8 29.4 us, ~3.9 TB/s, against mx.dequantize's 85.3.
DEQUANTIZE_BLOCK = 4096
DEQUANTIZE_WARPS = 8


# -- argument checks ----------------------------------------------------------------------------

def _fail(kind, message):
    return kind(f"[metile.ops.quantized_matmul] {message}")


def _integer(value):
    """A NumPy integer as the int MLX's op takes it as; anything else as given (checked)."""
    return int(value) if is_integer(value) else value


def _check(x, w, scales, biases, transpose, group_size, bits, mode, backend
           ) -> tuple[int, int, str | None]:
    """(N, K, None) of the product, or a clear error; the checks MLX makes, plus the
    settings metile's kernels implement when `backend` asks for them.  A call only MLX's
    op takes (under "auto" or "mlx") gives (-1, -1, why)."""
    check_backend("metile.ops.quantized_matmul", backend)
    for name, a in (("x", x), ("w", w), ("scales", scales)):
        if not isinstance(a, mx.array):
            raise _fail(TypeError, f"{name} must be an mx.array, got {type(a).__name__}")
    if not isinstance(transpose, bool):
        raise _fail(TypeError, f"transpose must be True or False, got {transpose!r}")
    for name, v in (("group_size", group_size), ("bits", bits)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _fail(TypeError, f"{name} must be an int, got {v!r}")
    if mode != "affine" and bits == 0:
        # before MLX's op sees it, as affine's bits are checked below: it divides by bits
        # in every mode (found by a hostile test: mode="mxfp4", bits=0 under "auto" or
        # "mlx" - SIGFPE, the process died); other bits it refuses by itself
        raise _fail(ValueError, f"bits=0: mode={mode!r} quantizes to at least 1 bit (MLX's "
                                f"op divides by bits)")
    if mode != "affine":
        if backend == "metile":
            raise _fail(ValueError, f"mode={mode!r}: metile's kernels implement 'affine' "
                                    f"quantization only; use backend='mlx' or 'auto'")
        return -1, -1, f"mode={mode!r}: MLX's op (metile's kernels implement 'affine' quantization)"
    if biases is None:
        raise _fail(ValueError, "biases must be provided for affine quantization")
    if not isinstance(biases, mx.array):
        raise _fail(TypeError, f"biases must be an mx.array, got {type(biases).__name__}")
    if backend != "metile" and x.dtype not in _DTYPES:   # (MLX's op takes integer x)
        return -1, -1, (f"x has dtype {x.dtype}: MLX's op (the kernels take float32, "
                        f"float16 and bfloat16 x)")
    if backend != "metile" and w.ndim != 2:   # (and batched weights)
        return -1, -1, f"w has {w.ndim} dimensions: MLX's op (the kernels take one 2-D weight)"
    if x.dtype not in _DTYPES:
        raise _fail(TypeError, f"x has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if x.ndim < 1:
        raise _fail(ValueError, "x must have at least one dimension")
    if w.dtype != mx.uint32 or w.ndim != 2:
        raise _fail(ValueError, f"w must be a 2-D uint32 array of packed values (mx.quantize's "
                                f"first result), got shape {tuple(w.shape)} dtype {w.dtype}")
    if (backend != "metile" and scales.dtype in _DTYPES and biases.dtype in _DTYPES
            and biases.dtype != scales.dtype):
        return -1, -1, (f"scales ({scales.dtype}) and biases ({biases.dtype}) differ in dtype: "
                        f"MLX's op (the kernels take one)")
    if scales.dtype not in _DTYPES or biases.dtype != scales.dtype:
        raise _fail(TypeError, f"scales and biases must share a float dtype, got {scales.dtype} "
                               f"and {biases.dtype}")
    if bits not in MLX_BITS:
        # before MLX's op sees it: bits=0 divides by zero there (SIGFPE, the process dies)
        raise _fail(ValueError, f"bits={bits}: affine quantization takes bits {MLX_BITS}")
    if bits not in BITS:
        if backend == "metile":
            raise _fail(ValueError, f"bits={bits}: metile's kernels take bits 4 and 8 (MLX's "
                                    f"op takes others: backend='mlx' or 'auto')")
        return -1, -1, f"bits={bits}: MLX's op (metile's kernels take bits 4 and 8)"
    if group_size not in GROUP_SIZES:
        raise _fail(ValueError, f"group_size={group_size}: affine quantization takes group "
                                f"sizes {GROUP_SIZES}")
    per_word = 32 // bits
    quantized_axis = w.shape[1] * per_word     # elements along the packed axis
    outer = w.shape[0]
    if tuple(scales.shape) != tuple(biases.shape):
        raise _fail(ValueError, f"scales {tuple(scales.shape)} and biases "
                                f"{tuple(biases.shape)} differ in shape")
    if quantized_axis % group_size:
        raise _fail(ValueError, f"the quantized axis has {quantized_axis} elements, not a "
                                f"multiple of group_size={group_size}")
    want = (outer, quantized_axis // group_size)
    if tuple(scales.shape) != want:
        raise _fail(ValueError, f"w {tuple(w.shape)} with bits={bits} and group_size="
                                f"{group_size} needs scales and biases of shape {want}, got "
                                f"{tuple(scales.shape)}")
    n, k = (outer, quantized_axis) if transpose else (quantized_axis, outer)
    if x.shape[-1] != k:
        raise _fail(ValueError, f"x's last dimension is {x.shape[-1]}, but the quantized matrix "
                                f"has K={k} (w {tuple(w.shape)}, bits={bits}, transpose="
                                f"{transpose})" + (
                                    f"; K must be a multiple of group_size={group_size}"
                                    if transpose and x.shape[-1] % group_size else ""))
    return n, k, None


def _out_dtype(x, scales):
    # float dtypes that differ promote to float32 (float16 with bfloat16 too), as in MLX
    return x.dtype if x.dtype == scales.dtype else mx.float32


# -- kernels ------------------------------------------------------------------------------------

def _launch(x2, w, scales, biases, n, k, transpose, group_size, bits, config,
            dispatch_only=False):
    """x2 (rows, K), already in the output dtype, times the dequantized weight."""
    from metile_kernels import quantized as kernels

    m = x2.shape[0]
    out = mx.zeros((m, n), x2.dtype)
    params = {key: v for key, v in config.items() if key != "kernel"}
    meta = dict(BITS=bits, GROUP=group_size, **params)
    kind = config["kernel"]
    extra = ()                      # scalars some kernels take after (x, w, ..., m, n, k)
    if kind == "dequantize+gemm":
        return _dequantize_gemm(x2, w, scales, biases, n, k, transpose, group_size, bits,
                                params.get("DENSE", "metile"))
    if kind == "matvec":
        kernel, grid = kernels.quantized_matvec, kernels.matvec_grid(m, n, params["BLOCK_N"])
    elif kind == "matvec_runs":
        kernel, grid = kernels.quantized_matvec_runs, kernels.matvec_grid(m, n, 1)
        meta["EVEN_K"] = params.get("EVEN_K", True) and k % params["BLOCK_K"] == 0
    elif kind == "matvec_rows":
        kernel, grid = kernels.quantized_matvec_rows, kernels.matvec_grid(m, n, params["ROWS"])
        meta["EVEN_K"] = params.get("EVEN_K", True) and k % params["BLOCK_K"] == 0
    elif kind == "matvec_warps":
        kernel, grid = kernels.quantized_matvec_warps, kernels.matvec_grid(m, n, params["ROWS"])
    elif kind == "matvec_n":
        kernel, grid = kernels.quantized_matvec_n, kernels.matvec_grid(m, n, params["BLOCK_N"])
    elif kind == "matvec_pairs":
        from metile_kernels import quantized_pairs as pairs
        kernel, grid = pairs.quantized_matvec_pairs, kernels.matvec_grid(m, n, params["ROWS"])
        name = _pair_dtype(x2.dtype, bits, transpose)
        if name is None:
            raise ValueError(f"quantized_matmul: the matvec_pairs kernel takes float16 (4 or "
                             f"8 bits) or bfloat16 (4 bits) with transpose=True, got "
                             f"{x2.dtype} with {bits} bits, transpose={transpose}")
        span = params.get("SPAN", 4)
        if group_size * bits // 32 % span:
            raise ValueError(f"quantized_matmul: matvec_pairs with SPAN={span} needs groups of "
                             f"a multiple of {span} packed words, got group_size={group_size} "
                             f"at {bits} bits")
        words, step = k * bits // 32, params.get("LANES", 32) * span
        meta.update(pairs.pair_constants(name, bits), DTYPE=dt.to_dtype(name),
                    EVEN=words % step == 0)
        if params.get("UNROLL"):
            meta["UNROLL"] = min(words // step, MAX_UNROLLED_STEPS) if meta["EVEN"] else 0
        if params.get("W64"):
            # (whole steps of an even SPAN: a lane's words pair up within its own run)
            meta["W64"] = meta["EVEN"] and span % 2 == 0
            if meta["W64"]:
                w = w.view(mx.uint64)
        # x's 16-bit values as 64-bit words (a view, no copy): K is a multiple of the group
        # (X_HALVES: the kernel joins them from 16-bit loads, for an x at any offset)
        if not params.get("X_HALVES"):
            x2 = x2.view(mx.uint64)
        extra = (meta["MAGIC"],)
    else:
        kernel = kernels.quantized_matmul
        grid = kernels.matmul_grid(m, n, params["BLOCK_M"], params["BLOCK_N"])
        meta["TRANSPOSE"] = transpose
        # (`magic` always passed, 0 where unused: a launch whose scalar took its default
        # was not replayed - op_replay records the arguments the op passes)
        extra = (0,)
        if params.get("PAIRS"):
            from metile_kernels import quantized_pairs as pairs
            if not pair_gemm_fits(params, x2.dtype, transpose, bits, n, k, group_size):
                raise ValueError(
                    f"quantized_matmul: the gemm kernel with PAIRS takes 4-bit weights with "
                    f"transpose=True, float16 or bfloat16 x, K a multiple of BLOCK_K "
                    f"({params['BLOCK_K']}) and N of BLOCK_N ({params['BLOCK_N']}), groups of "
                    f"a power of two >= 8; got {x2.dtype}, {bits} bits, transpose={transpose}, "
                    f"K={k}, N={n}, group_size={group_size}")
            constants = pairs.unpack_constants(_pair_dtype(x2.dtype, bits, transpose))
            extra = (constants.pop("MAGIC"),)   # (a launch argument: see the kernel)
            meta.update(constants, GROUP_SHIFT=group_size.bit_length() - 1)
        if meta.pop("BULK_X", False):
            meta["backend"] = _bulk_x_backend()
    args = (x2, w, scales, biases, out, m, n, k, *extra)
    if dispatch_only:
        return kernel[grid].prepare(*args, **meta)
    return op_replay.launch(kernel, grid, args, meta)


# The dense products of the dequantize-then-GEMM candidate: metile.ops.linear and matmul
# with backend="metile" (ops' tile for the shape: warpgroup MMA on Hopper, split-K for
# few tiles).  ops.py re-exports this module, so this one cannot import it back; ops.py
# hands them over when it is imported (`_use_dense_products`, at its end).
_DENSE: dict = {}


def _use_dense_products(linear, matmul, warpgroup) -> None:
    """`warpgroup()`: whether GEMMs here take the warpgroup MMA (ops._warpgroup_gemm)."""
    _DENSE["linear"], _DENSE["matmul"], _DENSE["warpgroup"] = linear, matmul, warpgroup


def _dequantize_gemm(x2, w, scales, biases, n, k, transpose, group_size, bits,
                     dense_backend="metile"):
    from metile_kernels import quantized as kernels

    rows, columns = (n, k) if transpose else (k, n)
    dense = kernels.dequantize[(math.ceil(columns / DEQUANTIZE_BLOCK), rows)](
        w, scales, biases, mx.zeros((rows, columns), x2.dtype), rows, columns, BITS=bits,
        GROUP=group_size, BLOCK=DEQUANTIZE_BLOCK, num_warps=DEQUANTIZE_WARPS)
    # the dense product as metile.ops.matmul runs it with `dense_backend` (metile: its tile
    # for this shape, warpgroup MMA on Hopper; mlx: MLX's own product); transposed, the
    # (N, K) dense weight is read as stored, no copy
    if transpose:
        return _DENSE["linear"](x2, dense, backend=dense_backend)
    return _DENSE["matmul"](x2, dense, backend=dense_backend)


@functools.lru_cache(maxsize=256)
def _differentiable(n, k, transpose, group_size, bits, config: tuple):
    """The kernel as an mx.custom_function of (x2, w, scales, biases) (`config` as items:
    built once a signature, not on every eager call)."""

    @op_replay.op_function
    def f(x2, w, scales, biases):
        return _launch(x2, w, scales, biases, n, k, transpose, group_size, bits, dict(config))

    f.vjp(_vjp(transpose, group_size, bits))
    op_replay.composite_rules(f, _composite(transpose, group_size, bits))
    return f


def _composite(transpose, group_size, bits, mode="affine"):
    """MLX's product of (x, w, scales, biases): the MLX route's replay, the kernel's vmap
    rule and its replays' (the kernels implement the affine mode only)."""
    return lambda x, w, scales, biases: mx.quantized_matmul(
        x, w, scales, biases, transpose=transpose, group_size=group_size, bits=bits, mode=mode)


@functools.lru_cache(maxsize=None)
def _vjp(transpose, group_size, bits):
    """The backward of the product (also what its replays call: op_replay.py)."""

    def f_vjp(primals, cotangent, output):
        x2, w, scales, biases = primals
        dx = mx.quantized_matmul(cotangent, w, scales, biases, transpose=not transpose,
                                 group_size=group_size, bits=bits)
        c, x32 = cotangent.astype(mx.float32), x2.astype(mx.float32)
        # the gradient of the dequantized weight, in w's layout (rows, packed axis)
        grad = c.T @ x32 if transpose else x32.T @ c
        rows, columns = grad.shape
        q = mx.dequantize(w, mx.ones(scales.shape, mx.float32), mx.zeros(scales.shape, mx.float32),
                          group_size=group_size, bits=bits)
        per_group = (rows, columns // group_size, group_size)
        dscales = (grad * q).reshape(per_group).sum(axis=-1)
        dbiases = grad.reshape(per_group).sum(axis=-1)
        return (dx.astype(x2.dtype), _no_weight_gradient(w), dscales.astype(scales.dtype),
                dbiases.astype(biases.dtype))
    return f_vjp


def _no_weight_gradient(w):
    """The packed weight's gradient: MLX's op refuses it; this vjp returns every primal's
    (it cannot tell which were asked for), so it is an array whose evaluation raises - an
    unfrozen quantized layer's optimizer step fails by name instead of rounding the packed
    words through float32 (a zero gradient did that under Adam or weight decay)."""
    from . import _ext
    return _ext.refused_array(list(w.shape), w.dtype, (
        "[metile.ops.quantized_matmul] no gradient with respect to the quantized weight w "
        "(MLX's QuantizedMatmul::vjp refuses it too): differentiate x, scales and biases "
        "only - freeze the quantized layers (model.freeze(), then unfreeze what you train, "
        "as QLoRA does)"))


def _metile(x2, w, scales, biases, n, k, transpose, group_size, bits, config, shape=None):
    return _differentiable(n, k, transpose, group_size, bits, tuple(config.items()))(
        x2, w, scales, biases, shapes=None if shape is None else (shape,))


# -- routing ------------------------------------------------------------------------------------

def _on_cuda() -> bool:
    return mx.default_device().type == mx.gpu and mx.cuda.is_available()


def _gemm(dtype) -> dict:
    return CUDA_GEMM if dtype != mx.float32 and _on_cuda() else GEMM


def pair_gemm_fits(config: dict, dtype, transpose: bool, bits: int, n: int | None,
                   k: int | None, group_size: int | None) -> bool:
    """Whether a PAIRS gemm configuration takes this call: its tiles carry no masks along
    K and N, a group of 8 weights along K shares one packed word, scale and bias, and the
    group index is a shift."""
    return n is not None and k is not None and group_size is not None and bits == 4 and \
        _pair_dtype(dtype, bits, transpose) is not None and k % config["BLOCK_K"] == 0 and \
        n % config["BLOCK_N"] == 0 and config["BLOCK_K"] % 8 == 0 and group_size >= 8 and \
        group_size & (group_size - 1) == 0


def _bulk_x_backend(language: str | None = None):
    """The backend resolved for `language` (None: the device's), on CUDA with x by bulk
    tensor copies (TMA) while the threads store the dequantized weight tile
    (Backend.mixed_bulk; settings.mixed_bulk turns it on for every fused GEMM): a config's
    "BULK_X" asks it for that config's launches."""
    from .compiler.backend import resolve_backend
    backend = resolve_backend(language)
    return dataclasses.replace(backend, mixed_bulk=True) if backend.language == "cuda" \
        else backend


def _pair_prefill(dtype, transpose, bits, n, k, group_size) -> list[dict]:
    """The pair-dequantizing fused GEMMs that take this call on a warpgroup-MMA GPU."""
    if not (_on_cuda() and _DENSE.get("warpgroup", bool)()):
        return []
    return [c for c in (WGMMA_PAIRS, WGMMA_PAIRS_TALL)
            if pair_gemm_fits(c, dtype, transpose, bits, n, k, group_size)]


def default_config(rows: int, dtype, transpose: bool, bits: int = 4) -> dict:
    """What backend="metile" runs: the GEMV for up to DECODE_ROWS rows, else the GEMM.
    Since s89 the GEMV in packed pairs where it applies (MATVEC_PAIRS[0]: float16 4/8-bit,
    bfloat16 4-bit; on the H200 13.2 us of kernel time against 18.8 for the runs GEMV).
    On CUDA with 16-bit x, the kernels measured faster on the H200
    (h200-quantized-int4-float16-runs-2026-12-01.json, h200-device-log-s15-2026-12-02.txt;
    int4 group 64, 4096 -> 11008): the GEMV in runs, one row a program - level with
    several rows a warp in a compiled call on a weight that stays in L2 (25.7 and 25.8 us
    against 49-59 for `quantized_matvec`; MLX 38.1), the fastest from DRAM (ncu kernel
    time with caches flushed, s19/s20: 21.8-23.0 us against 28.4-28.7 for 4 rows a warp,
    44.0-45.1 for 8, MLX's 29.9-30.0), as a model's layers read their weights - and, for prefill,
    dequantize then the dense GEMM (151 us against 3.2 ms for the fused GEMM), which holds a
    dense copy of the weight for the call (N * K elements of x's dtype, freed after it).
    Elsewhere (Metal, the CPU runtime, float32) nothing was measured: the GEMV and fused
    GEMM.  (The GEMV in runs is MATVEC_RUNS[0]: 1024 deep since s33, 19.0-19.5 us of kernel
    time without load masks against MLX's 29.8-30.3.)"""
    measured = dtype != mx.float32 and _on_cuda()
    if rows <= DECODE_ROWS:
        if not transpose:
            return MATVEC_N
        if measured and _pair_dtype(dtype, bits, transpose):
            return MATVEC_PAIRS[0]
        return MATVEC_RUNS[0] if measured else MATVEC
    return DEQUANTIZE_GEMM if measured else _gemm(dtype)


def _pair_dtype(dtype, bits: int, transpose: bool) -> str | None:
    """The 16-bit float name quantized_matvec_pairs computes x of `dtype` in, or None."""
    from metile_kernels.quantized_pairs import PAIR_FORMS
    name = dtype_name(dtype)
    return name if transpose and (name, bits) in PAIR_FORMS else None


def configs(rows_bucket: int, dtype, transpose: bool, bits: int = 4, n: int | None = None,
            k: int | None = None, group_size: int | None = None) -> list[dict]:
    """The metile candidates `auto` measures against MLX for a row bucket (with the call's
    N, K and group size, the pair-dequantizing fused GEMMs where they take it)."""
    gemm = _gemm(dtype)
    if rows_bucket <= DECODE_ROWS:
        pairs = [*MATVEC_PAIRS, MATVEC_PAIRS_W64] if _pair_dtype(dtype, bits, transpose) else []
        return [MATVEC, *MATVEC_RUNS[:2], MATVEC_ROWS[0], *pairs, gemm] if transpose else \
            [MATVEC_N, gemm]
    return [gemm, DEQUANTIZE_GEMM, DEQUANTIZE_MLX_GEMM,
            *_pair_prefill(dtype, transpose, bits, n, k, group_size)]


@functools.lru_cache(maxsize=1)
def _fingerprints() -> dict:
    from metile_kernels import quantized as kernels
    from metile_kernels import quantized_pairs as pairs

    from metile_kernels.gemm import matmul_epilogue

    from .runtime import cache
    own = "".join(cache.source_fingerprint(kern.fn) for kern in (
        kernels.quantized_matvec, kernels.quantized_matvec_runs, kernels.quantized_matvec_rows,
        kernels.quantized_matvec_n, pairs.quantized_matvec_pairs, kernels.quantized_matmul,
        kernels.dequantize, matmul_epilogue))
    return {"compiler": cache.compiler_fingerprint(), "kernels": own}


def _signature(dtype, scales_dtype, m, n, k, transpose, group_size, bits):
    device = "gpu" if mx.default_device().type == mx.gpu else "cpu"
    bucket = m_bucket(m)
    parts = {"op": "quantized_matmul", "dtype": dtype_name(dtype),
             "scales_dtype": dtype_name(scales_dtype), "m_bucket": bucket,
             "n": n, "k": k, "transpose": transpose, "group_size": group_size, "bits": bits,
             "device": _device_description(device),
             "candidates": [routing.REFERENCE] + [config_name(c)
                                                  for c in configs(bucket, dtype, transpose,
                                                                   bits, n, k, group_size)],
             "environment": dict(routing.environment()), "toolchain": routing.tuning.toolchain(),
             **_fingerprints()}
    return routing.decision_key(parts), parts


def _cost_model() -> routing.Decision:
    return cost_model(CPU_REASON, "MLX's op until a measurement on this machine finds a metile "
                                  "kernel faster " + TUNING)


def _measure_operands(m, n, k, dtype, scales_dtype, transpose, group_size, bits):
    """Fresh operands of the call's shapes from a fixed key (the caller's arrays may be
    traced, and the global random state must not move)."""
    kx, kw = mx.random.split(mx.random.key(0), 2)
    x = mx.random.normal((m, k), key=kx).astype(dtype)
    shape = (n, k) if transpose else (k, n)
    weight = (mx.random.normal(shape, key=kw) / math.sqrt(k)).astype(scales_dtype)
    return [x, *mx.quantize(weight, group_size=group_size, bits=bits)]


def _route(x2, scales, n, k, transpose, group_size, bits, backend, force=False):
    """(config or None for MLX's op, routing.Decision)."""
    m, dtype = x2.shape[0], x2.dtype
    if backend == "mlx":
        return None, routing.Decision(routing.REFERENCE, "requested", "backend='mlx' requested")
    if backend == "metile":
        config = default_config(m, dtype, transpose, bits)
        return config, routing.Decision(config_name(config), "requested",
                                        "backend='metile' requested")
    key, parts = _signature(dtype, scales.dtype, m, n, k, transpose, group_size, bits)
    candidates = configs(parts["m_bucket"], dtype, transpose, bits, n, k, group_size)
    decision = routing.recorded(key, lambda: map(config_name, candidates), force)
    if decision is None and routing.measuring_requested() and routing.can_evaluate(x2, scales):
        operands = _measure_operands(m, n, k, dtype, scales.dtype, transpose, group_size, bits)

        def reference(x, w, s, b):
            return mx.quantized_matmul(x, w, s, b, transpose=transpose, group_size=group_size,
                                       bits=bits)

        def kernel(config):
            return lambda x, w, s, b: _launch(x, w, s, b, n, k, transpose, group_size, bits,
                                              config)

        decision = routing.measure(
            key, parts, [routing.Candidate(routing.REFERENCE, reference)]
            + [routing.Candidate(config_name(c), kernel(c)) for c in candidates],
            operands, _validate, budget_s=routing.budget(), clock=routing.scope_clock())
    elif decision is None:
        decision = _cost_model()
    by_name = {config_name(c): c for c in candidates}
    if decision.winner not in by_name:   # MLX, or a configuration this version lacks
        return None, decision if decision.winner == routing.REFERENCE else _cost_model()
    return by_name[decision.winner], decision


# -- the op -------------------------------------------------------------------------------------

# MLX's defaults of (group_size, bits) by mode, for a None of either (mx.quantize's too)
_MODE_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}


def _settings(mode, group_size, bits) -> tuple[int, int]:
    """(group_size, bits) as given, a None of either the mode's default as MLX's op takes
    it (an unknown mode gets affine's here, and _check's error)."""
    default_group, default_bits = _MODE_DEFAULTS.get(mode if isinstance(mode, str) else "",
                                                     _MODE_DEFAULTS["affine"])
    return (default_group if group_size is None else _integer(group_size),
            default_bits if bits is None else _integer(bits))


@op_replay.entry(("x", "w", "scales", "biases"),
                 ("transpose", "group_size", "bits", "mode", "backend", "stream"))
def quantized_matmul(x, w, scales, biases=None, transpose: bool = True, group_size=None,
                     bits=None, mode: str = "affine", *, backend: str = "auto", stream=None):
    """x @ dequantize(w).T (transpose=True, mlx.nn.QuantizedLinear's layout) or
    x @ dequantize(w), with `w, scales, biases = mx.quantize(weight, group_size, bits)`;
    MLX's signature and results (see the module docstring for the paths)."""
    if stream is not None:   # (MLX's StreamOrDevice: op_routing.on_stream)
        return on_stream("quantized_matmul", stream, lambda: quantized_matmul(
            x, w, scales, biases, transpose, group_size, bits, mode, backend=backend))
    # (a repeated call replays, keyed by the options as given: op_replay.py)
    options = (transpose, group_size, bits, mode, backend)
    key = op_replay.key("quantized_matmul", (*options, None), x, w, scales, biases) \
        if all(a is not None for a in (x, w, scales, biases)) and \
        all(o is None or type(o) in (bool, int, str) for o in options) else None
    group_size, bits = _settings(mode, group_size, bits)
    n, k, mlx_only = _check(x, w, scales, biases, transpose, group_size, bits, mode, backend)

    def mlx_op():
        out = mx.quantized_matmul(x, w, scales, biases, transpose=transpose,
                                  group_size=group_size, bits=bits, mode=mode)
        if x.size == 0 or w.size == 0 or out.size == 0:
            # MLX 0.32.4's op divides by zero evaluating an empty product (SIGFPE: the
            # process dies); its shape and dtype are right, and an empty sum is zero
            return mx.zeros(out.shape, out.dtype)
        return out

    if backend == "mlx" or mlx_only:
        out = mlx_op()   # (recorded once it has run without an error)
        if x.size and w.size and n:   # (not the empty product's stand-in)
            op_replay.remember_requested(key, _composite(transpose, group_size, bits, mode))
        return out
    out_dtype = _out_dtype(x, scales)
    lead = tuple(x.shape[:-1])
    rows = math.prod(lead)
    if rows == 0 or n == 0 or k == 0:
        return mx.zeros((*lead, n), out_dtype)
    x2 = _rows(x).astype(out_dtype)
    config, decision = _route(x2, scales, n, k, transpose, group_size, bits, backend)
    if config is None:
        out = mlx_op()
        op_replay.remember_composite(key, _composite(transpose, group_size, bits, mode),
                                     decision)
        return out
    with op_replay.recording() as launches:
        out = _metile(x2, w, scales, biases, n, k, transpose, group_size, bits, config,
                      (*lead, n))
    if key is not None and x.dtype == out_dtype and config["kernel"] != "dequantize+gemm":
        # (one kernel: dequantize+gemm launches two); its arguments are x2, w, scales,
        # biases first
        op_replay.remember(key, launches, (0, 1, 2, 3), (x, w, scales, biases),
                           _vjp(transpose, group_size, bits),
                           [None if x2.shape == x.shape else x2.shape, None, None, None],
                           None if x.ndim == 2 else (*lead, n),
                           _composite(transpose, group_size, bits))
    return out


def explain_quantized_matmul(x, w, scales, biases=None, transpose: bool = True,
                             group_size: int | None = None, bits: int | None = None,
                             mode: str = "affine", *,
                             backend: str = "auto") -> str:
    """Which path `quantized_matmul` takes for these arguments and why (never
    measures), with the kernel's execution report on the metile path: JSON text like the
    other ops' explain_* (it returned a dict)."""
    return json.dumps(_explained(x, w, scales, biases, transpose, group_size, bits, mode,
                                 backend), indent=2)


def _explained(x, w, scales, biases, transpose, group_size, bits, mode, backend) -> dict:
    group_size, bits = _settings(mode, group_size, bits)
    n, k, mlx_only = _check(x, w, scales, biases, transpose, group_size, bits, mode, backend)
    if mlx_only:
        return {"path": "mlx", "reason": mlx_only}
    if backend != "mlx" and 0 in (math.prod(x.shape[:-1]), n, k):
        # (as the op: an empty product is zeros, no kernel; explain reported a kernel)
        return {"path": "zeros", "reason": "an empty product: zeros of the output's shape, "
                                           "no kernel"}
    x2 = x.reshape(math.prod(x.shape[:-1]), k).astype(_out_dtype(x, scales))
    config, decision = _route(x2, scales, n, k, transpose, group_size, bits,
                              backend)
    info = {"path": "mlx" if config is None else "metile", "route": decision.to_dict()}
    if config is not None and config["kernel"] != "dequantize+gemm":
        dispatch = _launch(x2, w, scales, biases, n, k, transpose, group_size, bits, config,
                           dispatch_only=True)
        info["config"] = dict(config)
        info["execution_report"] = dispatch.execution_report.to_dict()
    return info


def tune_quantized_matmul(x, w, scales, biases=None, transpose: bool = True, group_size=None,
                          bits=None, *, budget_s: float | None = None, force: bool = False,
                          clock=None) -> dict:
    """Measure (or, unless `force`, read the recorded) routing decision for this call's
    signature now; returns it as a dict (winner, reason, timings in microseconds)."""
    group_size, bits = _settings("affine", group_size, bits)
    n, k, _ = _check(x, w, scales, biases, transpose, group_size, bits, "affine", "metile")
    x2 = x.reshape(math.prod(x.shape[:-1]), k).astype(_out_dtype(x, scales))
    with routing.tuning_scope(budget_s, clock):
        _, decision = _route(x2, scales, n, k, transpose, group_size, bits, "auto", force)
    return decision.to_dict()
