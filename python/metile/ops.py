"""Array-level ops built from metile's kernel library, for use inside MLX models.

    y = metile.ops.linear(x, weight, bias, activation="gelu_tanh")
    y = metile.ops.matmul(a, b, epilogue="relu")
    h = metile.ops.gated_mlp(x, w_gate, w_up, activation="silu")   # act(x@wg.T) * (x@wu.T)

All three take and return lazy mx.arrays, work inside mx.compile, and are
differentiable (runtime/op_function.OpFunction: under a transform one MLX node carrying the
op's vjp, as mx.custom_function would with two more nodes; the backward pass uses MLX
ops, recomputing the pre-activation where the activation's derivative needs it).

The GEMM epilogue is fused into the kernel's output store: the activation, and
for `linear` the bias vector and the residual matrix, which the epilogue reads
per output element (`linear_epilogue` in metile_kernels/gemm.py; the compiler's
contract for epilogue reads is passes/gemm_epilogue_reads.py):

    y = metile.ops.linear(x, weight, bias, "gelu_tanh", residual=h)   # act(x @ w.T + b) + h

`gated_mlp` is a gated MLP's gate and up projections as one dual GEMM (`gated_mlp` in
metile_kernels/gemm.py): each K step reads the x tile once for both weights, and the
activation and the product are its fused epilogue; the down projection stays a `linear`.

Shapes are MLX's: `linear` takes x of any rank >= 1 (..., K) and runs one GEMM over
all its rows; `matmul` follows MLX's matmul (batch dimensions broadcast, 1-D operands
promoted), as one GEMM over all rows when b has no batch, else the batched kernel
(matmul_shapes.py).  Flattening leading dimensions into rows is a free reshape for a
row-contiguous array; a strided view (a transpose, a slice) is copied to row-major
once, as the custom-kernel call would copy it anyway.

Operands are read where they lie: `linear` gives the kernel the weight as stored,
(out_features, in_features), and the kernel reads it through strides as the (K, N)
right operand (TRANSPOSE_B), so no transposed copy is made; `matmul(a, w.T,
backend="metile")` does the same for a `w.T` it can see in the lazy graph
(lazy_graph.py; an already-evaluated transposed view is copied to row-major, as MLX
0.32 shows Python no strides; `auto` calls do not look, since the export walks b's
whole lazy graph).

Which path runs (`backend=`): "metile" forces the kernel, "mlx" MLX's own
composite, and "auto" (the default) routes by measurement (runtime/routing.py):
each call signature (dtype, rows rounded up to a power of two, exact N and K,
layout, epilogue, device) runs the metile kernel only if a recorded measurement
on this machine found it faster than MLX's composite.  Without a recorded
decision the cost model picks MLX's composite: on the CPU the kernel would run
in the MSL CPU runtime (an emulator); on a GPU nothing says the kernel is
faster.  Measuring is explicit (`tune_matmul`/`tune_linear`, `with tuning():`
or METILE_OPS_TUNE=1).  `explain_linear` / `explain_matmul` say which path a
call takes, why, and the measured times behind the decision.
"""

from __future__ import annotations

import numbers

import functools
import json
import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from . import lazy_graph, matmul_shapes, op_replay
from .runtime import routing
from .op_routing import (
    FLOAT_DTYPES as _DTYPES,
    rows as _rows,
    check_backend,
    mlx_takes_it,
    config_name as _op_config_name,
    m_bucket,
    device_description as _device_description,
    validate as _validate,
    measurement_operands as _operands,
    on_stream,
    CPU_REASON,
    cost_model,
    broadcasts_to,
    dtype_name)

ACTIVATIONS = {None: "none", "relu": "relu", "gelu_tanh": "gelu_tanh", "silu": "sigmoid_gated",
               "leaky_relu": "affine_leaky"}
BLOCK = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16)
# NVIDIA, 16-bit operands: the cp.async / ldmatrix / register-epilogue GEMM (gemm_async).
# Measured on the H200 (benchmarks/results/h200-gemm-*.json): 128x128x32 on 8 warps
# (64x32 per warp, three 16 KiB stages) led 4096^3 among 128x128/4 warps, 256x128,
# 128x256 and 128x64; a grid of fewer tiles than SMs takes 64x64x32 tiles instead.
CUDA_BLOCK = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_simdgroups=8)
CUDA_SMALL_BLOCK = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_simdgroups=4)
# Hopper (unless METILE_CUDA_WGMMA=0): two warpgroups of wgmma m64n256k16 per 128x256x64
# tile (passes/gemm_wgmma.py; 357 TFLOP/s float16 at 4096^3 on the H200).
CUDA_WGMMA_BLOCK = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_simdgroups=8)
# ...and 128x128x64 where the 128x256 grid leaves SMs idle: at 1024^3 float16 it led
# 64x64, 64x128, 128x64 and 64x256 tiles (benchmarks/results/h200-gemm-float16-1024-*);
# with metile's own CUDA launch it ran 1.44-1.53x mx.compile at 1024^3 and 1.14-1.24x at
# 2048^3, float16 and bfloat16 (h200-gemm-*-own-launch-128x128x64-2026-12-01.json).
CUDA_WGMMA_SMALL_BLOCK = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_simdgroups=8)
# (128x192x64, chosen where its whole waves over the SMs took less work than 128x256's,
# was no faster on the H200: 512x4096x11008 93.0 us against 91.6, 2048x4096x11008 323.7
# against 324.7, 512x4096x12288 99.8 against 94.9; h200-wave-tiles-s27-2026-12-02.json)
CUDA_SMS = 132
# Strict float32 on NVIDIA: 8x8 (64x64: 8x4) scalar-FMA micro-tiles per thread, operands
# through the cp.async ring and read 16 bytes at a time (passes/lower_matmul.py).  At
# 4096^3 on the H200 the kernel alone: 128x64x16 on 4 warps (3 stages) 3128 us, 128x128x16
# on 8 warps 3256, 64x128 3275, 64x64 3297, cuBLAS 2682 (h200-ffma-variants-4096-*.json).
CUDA_F32_BLOCK = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=16, num_simdgroups=4)
CUDA_F32_SMALL_BLOCK = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, num_simdgroups=4)
# leaky_relu's slope for negative inputs when none is given: MLX's default
# (mlx.nn.leaky_relu), so a drop-in gives the same numbers.
LEAKY_SLOPE = 0.01


def _gelu_tanh(z):
    return 0.5 * z * (1 + mx.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))


def activate(z, activation, slope=LEAKY_SLOPE):
    """activation(z) as MLX ops (the composite path and quantized layers)."""
    if activation is None:
        return z
    if activation == "relu":
        return mx.maximum(z, 0)
    if activation == "leaky_relu":
        # (>=: the same values, and autodiff's derivative at 0 is 1, as for MLX's
        # max(slope * z, z); float: an int past int64 is one)
        return mx.where(z >= 0, z, float(slope) * z)
    if activation == "silu":
        return z * mx.sigmoid(z)
    return _gelu_tanh(z)


def _activation_grad(z, activation, slope):
    """d activation / dz, in float32."""
    if activation is None:
        return mx.ones_like(z)
    if activation == "relu":
        return (z > 0).astype(z.dtype)
    if activation == "leaky_relu":
        # 1 at z = 0, as MLX's max(slope * z, z) differentiates (its maximum's vjp takes
        # the second argument on ties)
        return mx.where(z >= 0, 1.0, float(slope)).astype(z.dtype)
    if activation == "silu":
        s = mx.sigmoid(z)
        return s * (1 + z * (1 - s))
    c = 0.7978845608028654
    inner = c * (z + 0.044715 * z**3)
    t = mx.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)


def _upstream(cotangent, activation, slope, output, pre_activation):
    """cotangent * activation'(z) in the cotangent's (the operands') dtype, computed in
    float32.  The backward GEMMs then run in the operand dtype, as MLX's own autodiff of
    the composite runs them: float32 GEMMs there were ~10x slower on the H200 (strict
    float32 has no tensor cores) and made a converted model's training step 0.66x of
    MLX's.  relu and leaky_relu (positive slope) read the sign of z from `output` (act(z);
    None where the op's output is not, e.g. a residual was added); otherwise
    `pre_activation()` recomputes z."""
    if activation is None:
        return cotangent
    if output is not None and (activation == "relu" or
                               (activation == "leaky_relu" and slope > 0)):
        # (a positive slope keeps z's sign in the output: leaky_relu's derivative is 1
        # where z >= 0, as MLX's; relu's is 0 at 0, as MLX's)
        if activation == "relu":
            d = mx.where(output > 0, 1.0, 0.0)
        else:
            # a -0.0 output is a negative z whose slope * z underflowed (in float16 below
            # |z| ~6e-6 at slope 0.01), which takes the slope as in MLX: the zero's sign
            # tells (1 / -0.0 is -inf)
            nonnegative = (output > 0) | ((output == 0) & (1 / output > 0))
            d = mx.where(nonnegative, 1.0, float(slope))
    else:
        d = _activation_grad(pre_activation().astype(mx.float32), activation, slope)
    return (cotangent.astype(mx.float32) * d).astype(cotangent.dtype)


def slope_value(slope, arrays: bool = False) -> float | None:
    """A leaky slope as a float: Python and NumPy numbers, and with `arrays` 0-d arrays
    (what mlx.nn.LeakyReLU may hold, a constant to `convert`); None for anything else
    (bools included).  The ops take no array slope: as a float it would leave the graph,
    and its gradient would be zero where MLX's leaky_relu has one."""
    if isinstance(slope, (bool, np.bool_)):
        return None
    if isinstance(slope, numbers.Real):
        try:
            return float(slope)
        except OverflowError:   # (an int past float's range: _check_activation names it)
            return math.inf
    if arrays and isinstance(slope, mx.array) and slope.ndim == 0 and \
            slope.dtype != mx.bool_ and not mx.issubdtype(slope.dtype, mx.complexfloating):
        return float(slope.item())
    return None


def _check_activation(activation, slope, where: str = "metile.ops", name: str = "activation"):
    """Refuses an activation metile has no kernel for and a slope that is not a finite-width
    number; `where` names the caller in the message (nn's layers check with this too),
    `name` the argument (matmul's is `epilogue`)."""
    if not (activation is None or isinstance(activation, str)) or activation not in ACTIVATIONS:
        choices = ", ".join(["None"] + sorted(repr(a) for a in ACTIVATIONS if a is not None))
        raise ValueError(f"[{where}] {name} must be one of {choices}, got {activation!r}")
    if slope_value(slope) is None:
        why = (" (an mx.array slope would get no gradient here; pass float(slope), or use "
               "mlx.nn.leaky_relu to differentiate it)" if isinstance(slope, mx.array) else "")
        raise TypeError(f"[{where}] negative_slope must be a number, got "
                        f"{type(slope).__name__} {slope!r}{why}")
    try:
        float(slope)
    except OverflowError:
        raise ValueError(f"[{where}] negative_slope {slope} does not fit in a float") from None


def _promoted(*arrays):
    """The float operands in their common dtype, as MLX's matmul and addmm promote them
    (float16 @ float32 is float32: MLX converts the narrower operand); anything else is
    returned as given, for the checks to name."""
    present = [a for a in arrays if isinstance(a, mx.array)]
    if (len({a.dtype for a in present}) < 2
            or any(a.dtype not in _DTYPES for a in present)):
        return arrays
    common = mx.result_type(*present)
    return tuple(a.astype(common) if isinstance(a, mx.array) and a.dtype != common else a
                 for a in arrays)


def _check_arrays(a, b, names=("a", "b")):
    for name, x in zip(names, (a, b)):
        if not isinstance(x, mx.array):
            raise TypeError(f"[metile.ops] {name} must be an mx.array, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"[metile.ops] {name} has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if a.dtype != b.dtype:
        raise TypeError(f"[metile.ops] operands must share a dtype, got {a.dtype} and {b.dtype}")


def _check(a, b, activation, slope=LEAKY_SLOPE, names=("a", "b")):
    """linear's (..., K) @ (K, N); `names` as the caller's arguments are called."""
    _check_activation(activation, slope)
    _check_arrays(a, b, names)
    if a.ndim < 1 or b.ndim != 2:
        raise ValueError(f"[metile.ops] expected a (..., K) and b (K, N), got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"[metile.ops] inner dimensions differ: {a.shape} @ {b.shape}")


def _matmul_plan(a, b, activation, slope) -> matmul_shapes.Plan:
    _check_activation(activation, slope)
    _check_arrays(a, b)
    return matmul_shapes.plan(a.shape, b.shape)


def _columns(b, block) -> int:
    return b.shape[0] if block.get("TRANSPOSE_B") else b.shape[1]


def _as_rhs(b, block):
    """The (K, N) right operand as MLX ops (the backward pass): a TRANSPOSE_B block's
    operand is the (N, K) matrix whose transpose is multiplied."""
    return b.T if block.get("TRANSPOSE_B") else b


def split_k_count(m: int, n: int, k: int, block: dict, programs: int = 2 * CUDA_SMS) -> int:
    """Splits of the K loop for a skinny product (issue 13 item 8): enough to give about
    `programs` programs when the output has few tiles, each split at least 4 K tiles
    long, at most 16; 1 (no split) when the output already fills the machine."""
    tiles = math.ceil(m / block["BLOCK_M"]) * math.ceil(n / block["BLOCK_N"])
    if tiles * 2 > programs:
        return 1
    return max(1, min(16, programs // max(tiles, 1), k // (4 * block["BLOCK_K"])))


def _kernel_block(block: dict) -> dict:
    return {key: v for key, v in block.items() if key != "SPLIT_K"}


def _launch_split_k(a2, b, bias, residual, activation, slope, block, dispatch_only=False):
    """act(a2 @ b + bias) (+ residual) as SPLIT_K partial products over K, summed (with
    the epilogue) by a second kernel: for outputs too small to fill the GPU."""
    from metile_kernels.gemm import (matmul_split_k, split_k_chunk, split_k_epilogue,
                                     split_k_epilogue_grid, split_k_grid)

    m, k = a2.shape
    n = _columns(b, block)
    splits = block["SPLIT_K"]
    kb = _kernel_block(block)
    chunk = split_k_chunk(k, splits, kb["BLOCK_K"])
    product = split_k_grid(splits, m, n, kb["BLOCK_M"], kb["BLOCK_N"])
    args = (a2, b, mx.zeros((splits, m, n), mx.float32), m, n, k, chunk)
    if dispatch_only:
        return matmul_split_k[product].prepare(*args, **kb)
    partial = op_replay.launch(matmul_split_k, product, args, kb)
    # a row's columns a program, 4 of them a thread (16-byte reads of the float32
    # partials; one a thread, 1024 threads a program, read 1 TB/s on the H200, s97)
    columns = min(1024, 1 << max(n - 1, 1).bit_length())
    return op_replay.launch(
        split_k_epilogue, split_k_epilogue_grid(m, n, columns),
        (partial, mx.zeros((m, n), a2.dtype), a2 if bias is None else bias,
         a2 if residual is None else residual, m, n, splits),
        dict(BLOCK=columns, num_warps=max(1, columns // 128),
             BIAS="none" if bias is None else "columns", RESIDUAL=residual is not None,
             EPILOGUE=ACTIVATIONS[activation], NEGATIVE_SLOPE=float(slope)))


def _run(kernel, grid_, args, kw, dispatch_only):
    """kernel[grid_](*args, **kw), or its Dispatch when `dispatch_only`.  A repeated
    signature takes the launcher's own reuse (the last launch's C++ guard, then its launch
    cache): measured against the ops' former key-and-trusted-relaunch layer, ~1.3 us less
    host time per eager op with the stand-in CUDA bindings and ~2 us on the CPU runtime
    (tools/probes/eager_host_cost.py)."""
    if dispatch_only:
        return kernel[grid_].prepare(*args, **kw)
    return op_replay.launch(kernel, grid_, args, kw)


# Where _launch and _launch_linear put the op's arrays among the kernel's arguments
# (what a replay of the op swaps: op_replay.remember).
MATMUL_ARRAYS = (0, 1)
LINEAR_ARRAYS = {"x": 0, "w": 1, "bias": 3, "residual": 4}
# ... and where _launch_split_k puts them: (launch, position), the merge reading bias and
# residual
SPLIT_K_ARRAYS = {"x": (0, 0), "w": (0, 1), "bias": (1, 2), "residual": (1, 3)}


def _launch(a2, b, activation, slope, block, dispatch_only=False):
    from metile_kernels.gemm import grid, matmul_epilogue

    if block.get("SPLIT_K", 1) > 1:
        return _launch_split_k(a2, b, None, None, activation, slope, block, dispatch_only)
    m, k = a2.shape
    n = _columns(b, block)
    args = (a2, b, mx.zeros((m, n), a2.dtype), m, n, k, 1.0, 0.0)
    kw = dict(EPILOGUE=ACTIVATIONS[activation], NEGATIVE_SLOPE=float(slope), **block)
    return _run(matmul_epilogue, grid(m, n, block["BLOCK_M"], block["BLOCK_N"]), args, kw,
                dispatch_only)


def _block(m: int, n: int, dtype, transpose_b: bool = False, batch: int = 1,
           k: int = 0) -> dict:
    """The GEMM tile for this launch: on MLX's CUDA backend the fast configuration for
    16-bit operands or for strict float32, else the portable 64x64x16; with `transpose_b` the
    kernel reads the right operand as stored (N, K).  On CUDA a grid of few tiles over a
    long K splits the K loop (SPLIT_K, `split_k_count`)."""
    if not _on_cuda():
        block = BLOCK
    elif dtype == mx.float32:
        # strict float32: scalar FMA micro-tiles from the cp.async ring (8x8 per thread)
        block = CUDA_F32_BLOCK if math.ceil(m / 128) * math.ceil(n / 64) * batch >= CUDA_SMS \
            else CUDA_F32_SMALL_BLOCK
    elif _warpgroup_gemm() and math.ceil(m / 128) * math.ceil(n / 256) * batch >= CUDA_SMS:
        block = _wgmma_block()
    elif _warpgroup_gemm() and m >= 128:
        block = _wgmma_block(CUDA_WGMMA_SMALL_BLOCK)
    elif math.ceil(m / 128) * math.ceil(n / 128) * batch < CUDA_SMS:
        block = CUDA_SMALL_BLOCK
        splits = split_k_count(m, n, k, block) if batch == 1 and k else 1
        if splits > 1:
            block = {**block, "SPLIT_K": splits}
    else:
        block = CUDA_BLOCK
    return _transposed(block) if transpose_b else block


def _transposed(block: dict) -> dict:
    # the flag is part of the configuration, so candidate names and routing decisions
    # tell the two layouts (different kernels) apart
    return {**block, "TRANSPOSE_B": True}


def _wgmma_block(block: dict = CUDA_WGMMA_BLOCK) -> dict:
    """A warpgroup tile (CUDA_WGMMA_BLOCK unless named), with the producer warpgroup of the
    warp-specialized variant."""
    from . import settings
    return {**block, "num_simdgroups": 12} if settings.wgmma_variant() == "ws" else block


def _warpgroup_gemm() -> bool:
    """Whether GEMMs on this device may take the warpgroup MMA path (sm_90 with
    METILE_CUDA_WGMMA=1): the backend record lists its unit."""
    from . import settings
    return _warpgroup_unit_on(settings.wgmma_enabled(), str(mx.default_device()))


@functools.lru_cache(maxsize=None)
def _warpgroup_unit_on(enabled: bool, device: str) -> bool:
    # resolving the backend reads the device: once per (setting, device), not per call
    from .compiler.backend import resolve_backend
    return enabled and any(u.warpgroup for u in resolve_backend().matrix_units)


def _on_cuda() -> bool:
    return mx.default_device().type == mx.gpu and mx.cuda.is_available()


def _reused(make):
    """One result of `make`, a pure function, per distinct arguments (tiles compared by
    their items): building an mx.custom_function and its vjp, or formatting a tile's name,
    is microseconds of every eager call."""
    made: dict = {}

    @functools.wraps(make)
    def get(*args):
        key = tuple(tuple(a.items()) if isinstance(a, dict) else a for a in args)
        found = made.get(key)
        if found is None:
            found = made[key] = make(*args)
        return found
    return get


@_reused
def _matmul_vjp(activation, slope, block):
    """The backward of _fused_matmul's act(a2 @ b) (also what its replays call)."""

    def f_vjp(primals, cotangent, output):
        a2, b = primals
        rhs = _as_rhs(b, block)
        g = _upstream(cotangent, activation, slope, output, lambda: a2 @ rhs)
        return g @ rhs.T, _as_rhs(a2.T @ g, block)
    return f_vjp


@_reused
def _fused_matmul(activation, slope, block):
    """A differentiable act(a @ b) whose forward is one metile kernel; with a
    TRANSPOSE_B block, `b` is (N, K) and the kernel computes act(a @ b.T)."""

    @op_replay.op_function
    def f(a2, b):
        return _launch(a2, b, activation, slope, block)

    f.vjp(_matmul_vjp(activation, slope, block))
    transposed = bool(block.get("TRANSPOSE_B"))
    op_replay.composite_rules(
        f, lambda a2, b: _matmul_mlx(a2, b.T if transposed else b, activation, slope))
    return f


def _launch_batched(a3, b3, activation, slope, block, dispatch_only=False):
    """a3 (batch or 1, M, K) @ b3 (batch or 1, K, N): extent 1 is batch stride 0."""
    from metile_kernels.gemm import batched_grid, batched_matmul_epilogue

    _, m, k = a3.shape
    n = b3.shape[2]
    batch = matmul_shapes.batch_count(a3, b3)
    args = (a3, b3, mx.zeros((batch, m, n), a3.dtype), m, n, k,
            0 if a3.shape[0] == 1 else m * k, 0 if b3.shape[0] == 1 else k * n)
    kw = dict(EPILOGUE=ACTIVATIONS[activation], NEGATIVE_SLOPE=float(slope), **block)
    return _run(batched_matmul_epilogue,
                batched_grid(batch, m, n, block["BLOCK_M"], block["BLOCK_N"]), args, kw,
                dispatch_only)


def _batch_sum(g, like):
    """g summed over the batch axis where `like` is shared by every batch index."""
    return g.sum(axis=0, keepdims=True) if like.shape[0] == 1 and g.shape[0] != 1 else g


@_reused
def _fused_bmm(activation, slope, block):
    """A differentiable act(a3 @ b3) over a batch whose forward is one batched metile
    kernel; an operand of batch extent 1 is shared by every batch index (its gradient
    sums over the batch)."""

    @op_replay.op_function
    def f(a3, b3):
        return _launch_batched(a3, b3, activation, slope, block)

    op_replay.composite_rules(f, lambda a3, b3: activate(a3 @ b3, activation, slope))

    @f.vjp
    def f_vjp(primals, cotangent, output):
        a3, b3 = primals
        g = _upstream(cotangent, activation, slope, output, lambda: a3 @ b3)
        return (_batch_sum(g @ b3.swapaxes(1, 2), a3).astype(a3.dtype),
                _batch_sum(a3.swapaxes(1, 2) @ g, b3).astype(b3.dtype))

    return f


# -- the two implementations of each op ---------------------------------------------------------

# The composites compute as the unconverted MLX layers do (mlx.nn.Linear, nn.silu, ...):
# the activation in the operands' dtype.  With it in float32 (one rounding, like the
# kernel's epilogue) a converted block routed wholly to MLX moved float32 intermediates
# and trained 0.91x as fast as the unconverted one (H200, T=512/2048).

def _matmul_mlx(a2, b, epilogue, slope):
    return activate(a2 @ b, epilogue, slope)


def _linear_mlx(x2, weight, bias, activation, slope):
    # mx.addmm as mlx.nn.Linear computes it, so a converted layer routed to MLX gives
    # the unconverted layer's numbers.
    z = x2 @ weight.T if bias is None else mx.addmm(bias, x2, weight.T)
    return activate(z, activation, slope)


def _linear_mlx_residual(x2, weight, bias, activation, slope, residual=None):
    if residual is not None and bias is None and activation is None:
        # The residual as the product's C (beta = 1): cuBLAS adds it in its epilogue,
        # where `x @ w.T + r` writes the product and reads it back in a second kernel
        # (a decoder block's o_proj and down_proj routed to MLX).
        return mx.addmm(residual, x2, weight.T)
    z = _linear_mlx(x2, weight, bias, activation, slope)
    return z if residual is None else z + residual


def _launch_linear(x2, w, bias, residual, activation, slope, block, dispatch_only=False):
    """w: the weight as stored (N, K) with a TRANSPOSE_B block, else its (K, N) transpose."""
    from metile_kernels.gemm import grid, linear_epilogue

    if block.get("SPLIT_K", 1) > 1:
        return _launch_split_k(x2, w, bias, residual, activation, slope, block, dispatch_only)
    m, k = x2.shape
    n = _columns(w, block)
    # An absent bias/residual is never read; any array fills its slot.
    args = (x2, w, mx.zeros((m, n), x2.dtype), x2 if bias is None else bias,
            x2 if residual is None else residual, m, n, k)
    kw = dict(BIAS="none" if bias is None else "columns", RESIDUAL=residual is not None,
              EPILOGUE=ACTIVATIONS[activation], NEGATIVE_SLOPE=float(slope), **block)
    return _run(linear_epilogue, grid(m, n, block["BLOCK_M"], block["BLOCK_N"]), args, kw,
                dispatch_only)


def _linear_composite(has_bias, has_residual, activation, slope):
    """linear(x, weight[, bias][, residual]) on MLX's composite, as `linear` runs it: on x
    as given, never reshaped (under mx.compile(shapeless=True) a reshape keeps the traced
    shape: a replay that reshaped to its recorded rows returned the first call's shape for
    every later input)."""
    def run(x, weight, *rest):
        bias = rest[0] if has_bias else None
        residual = rest[-1] if has_residual else None
        return _linear_mlx_residual(x, weight, bias, activation, slope, residual)
    return run


def _linear_parts(arrays, has_bias, has_residual):
    """(x2, w, bias or None, residual or None) of _fused_linear's arrays."""
    rest = list(arrays[2:])
    bias = rest.pop(0) if has_bias else None
    return arrays[0], arrays[1], bias, (rest.pop(0) if has_residual else None)


@_reused
def _fused_linear(activation, slope, block, has_bias, has_residual):
    """A differentiable act(x2 @ w.T + bias) + residual whose forward is one metile
    kernel; `w` is the stored (N, K) weight with a TRANSPOSE_B block, else (K, N)."""

    @op_replay.op_function
    def f(*arrays):
        x2, w, bias, residual = _linear_parts(arrays, has_bias, has_residual)
        return _launch_linear(x2, w, bias, residual, activation, slope, block)

    f.vjp(_linear_vjp(activation, slope, block, has_bias, has_residual))
    op_replay.composite_rules(f, _linear_rows(activation, slope, has_bias, has_residual,
                                              bool(block.get("TRANSPOSE_B"))))
    return f


def _linear_rows(activation, slope, has_bias, has_residual, transposed=True):
    """MLX's computation of _fused_linear's arrays (its vmap rule, its replays')."""
    def composite(*arrays):
        x2, w, bias, residual = _linear_parts(arrays, has_bias, has_residual)
        return _linear_mlx_residual(x2, w if transposed else w.T, bias, activation, slope,
                                    residual)
    return composite


@_reused
def _linear_vjp(activation, slope, block, has_bias, has_residual):
    """The backward of _fused_linear (also what its replays call)."""

    def f_vjp(primals, cotangent, output):
        x2, w, bias, residual = _linear_parts(primals, has_bias, has_residual)
        rhs = _as_rhs(w, block)

        def pre_activation():
            z = x2 @ rhs
            return z if bias is None else z.astype(mx.float32) + bias.astype(mx.float32)
        # with a residual the output is act(z) + residual, not act(z)
        g = _upstream(cotangent, activation, slope, output if residual is None else None,
                      pre_activation)
        grads = [g @ rhs.T, _as_rhs(x2.T @ g, block)]
        if bias is not None:
            grads.append(g.astype(mx.float32).sum(axis=0).astype(bias.dtype))
        if residual is not None:
            grads.append(cotangent.astype(residual.dtype))
        return tuple(grads)
    return f_vjp


def _linear_operand(weight, block):
    return weight if block.get("TRANSPOSE_B") else weight.T


def _linear_metile(x2, weight, bias, activation, slope, block, residual=None, shapes=None):
    # A TRANSPOSE_B kernel reads the weight as stored; any other block multiplies
    # weight.T, which the custom-kernel call copies to row-major.
    w = _linear_operand(weight, block)
    if bias is None and residual is None:
        return _fused_matmul(activation, slope, block)(x2, w, shapes=shapes)
    extra = [a for a in (bias, residual) if a is not None]
    return _fused_linear(activation, slope, block, bias is not None,
                         residual is not None)(x2, w, *extra, shapes=shapes)


# -- routing ------------------------------------------------------------------------------------

@dataclass
class _Route:
    path: str                    # "metile" or "mlx"
    block: dict | None           # the metile kernel's tile when path == "metile"
    decision: routing.Decision


@_reused
def _config_name(block: dict) -> str:
    # asked by every routed call (a decision names its tile): formatted once a tile
    return _op_config_name(block)


# Layouts of the right operand: row-major (K, N), or the transpose of a row-major
# (N, K) matrix (a Linear's weight, a `w.T` view given to matmul).
ROW_MAJOR_LAYOUTS = ("a@b",)
TRANSPOSED_LAYOUTS = ("a@b.T", "x@w.T")


def metile_configs(dtype, layout: str = "a@b", shape=None) -> list[dict]:
    """The metile kernel configurations `auto` measures against MLX for a dtype and
    right-operand layout on the default device: the measured CUDA tiles for 16-bit
    operands or strict float32 on NVIDIA, else the portable tile.  A transposed layout takes the
    TRANSPOSE_B kernels, which read the operand as stored; on NVIDIA the row-major
    kernels (after MLX copies the operand to row-major) stay candidates too, since
    only they stage the operand with 16-byte asynchronous copies."""
    cuda = _on_cuda()
    if not cuda:
        base = [BLOCK]
    elif dtype == mx.float32:
        base = [CUDA_F32_BLOCK, CUDA_F32_SMALL_BLOCK]
    else:
        base = ([_wgmma_block(), _wgmma_block(CUDA_WGMMA_SMALL_BLOCK)]
                if _warpgroup_gemm() else []) + [CUDA_BLOCK, CUDA_SMALL_BLOCK]
    if shape is not None:
        # (rows bucket, N, K) of an unbatched call: split-K variants of the tiles whose
        # grid leaves most of the machine idle (rows bucketed as in the routing key, so
        # the names a decision records are the names this call generates).
        m, n, k = shape
        base = base + [{**c, "SPLIT_K": s} for c in base
                       if (s := split_k_count(m, n, k, c)) > 1]
    if layout in ROW_MAJOR_LAYOUTS:
        return base
    if layout not in TRANSPOSED_LAYOUTS:
        raise ValueError(f"[metile.ops] unknown layout {layout!r}")
    return [_transposed(c) for c in base] + (base if cuda else [])


@functools.lru_cache(maxsize=1)
def _fingerprints() -> dict:
    from metile_kernels.gemm import matmul_epilogue

    from .runtime import cache
    return {"compiler": cache.compiler_fingerprint(),
            "kernel": cache.source_fingerprint(matmul_epilogue.fn)}


@functools.lru_cache(maxsize=1)
def _split_k_fingerprint() -> str:
    from metile_kernels.gemm import matmul_split_k, split_k_epilogue

    from .runtime import cache
    return cache.source_fingerprint(matmul_split_k.fn) + cache.source_fingerprint(
        split_k_epilogue.fn)


@functools.lru_cache(maxsize=1)
def _batched_fingerprint() -> str:
    from metile_kernels.gemm import batched_matmul_epilogue

    from .runtime import cache
    return cache.source_fingerprint(batched_matmul_epilogue.fn)


@functools.lru_cache(maxsize=1)
def _linear_fingerprint() -> str:
    from metile_kernels.gemm import linear_epilogue

    from .runtime import cache
    return cache.source_fingerprint(linear_epilogue.fn)


@functools.lru_cache(maxsize=1)
def _gated_fingerprint() -> str:
    from metile_kernels.gemm import gated_mlp as kernel

    from .runtime import cache
    return cache.source_fingerprint(kernel.fn)


def gated_configs(dtype) -> list[dict]:
    """gated_mlp's candidate tiles for `auto`: linear's warp-MMA tiles (the weights read
    as stored, and on NVIDIA also copied to row-major, which 16-byte asynchronous copies
    take), never split-K (the two products meet in the epilogue).

    Not the warpgroup dual tile (`_dual_block`), which `backend="metile"` runs.  Measured
    alone it beats MLX's composite (H200, float16, T 512/2048: 1.09x/1.04x, s77), but
    offered to auto it made a converted decoder block slower: s78 (2026-12-03) routed
    gated_mlp to it at T=2048 and the block's forward+backward took 5747 us against the
    unconverted 4745 (0.83x; forward 0.99x) - its vjp recomputes both products, which
    MLX's composite keeps from the forward, and the forward cannot tell whether a
    gradient follows (mx.compile and mx.grad both trace).  Auto, which must never be
    slower, does not offer it.  (Its slower float16 times in `benchmarks.model_layers`,
    245/826 us in s78 and 0.59-0.71x on the H100, were the benchmark's: two variants ran
    in one order every round.  Alternated (s138, H100): 0.99x / 1.14x at T 512 / 2048;
    alternated with a lead-in before every sample (s141, H100): float16 0.94x / 0.99x,
    bfloat16 0.78x / 0.95x - no faster than the composite, so a forward that also writes
    both products for the vjp (a fused GEMM with three stores, which passes/gemm.py takes
    since the fortieth session) would have nothing to win back; not built.)"""
    # (no shape: metile_configs adds no SPLIT_K variants)
    return [c for c in metile_configs(dtype, "x@w.T") if not _is_warpgroup_tile(c)]


def _is_warpgroup_tile(block: dict) -> bool:
    core = {k: v for k, v in block.items() if k != "TRANSPOSE_B"}
    return core in (CUDA_WGMMA_BLOCK, CUDA_WGMMA_SMALL_BLOCK, _wgmma_block(),
                    _wgmma_block(CUDA_WGMMA_SMALL_BLOCK))


def _dual_block(block: dict) -> dict:
    """The tile a dual GEMM (gated_mlp with backend="metile") takes for `block`, without
    SPLIT_K: a warpgroup tile 128 columns wide in place of the 256-wide one (each product
    keeps a 64x128 accumulator tile per warpgroup in registers: together one m64n256
    product's 128 floats per thread; passes/gemm_wgmma.py)."""
    block = _kernel_block(block)
    core = {k: v for k, v in block.items() if k != "TRANSPOSE_B"}
    layout = {k: v for k, v in block.items() if k == "TRANSPOSE_B"}
    if core == CUDA_WGMMA_BLOCK:
        return {**CUDA_WGMMA_SMALL_BLOCK, **layout}
    if core == _wgmma_block():
        return {**_wgmma_block(CUDA_WGMMA_SMALL_BLOCK), **layout}
    return block


def _signature(op, dtype, m, n, k, layout, epilogue, has_bias,
               has_residual=False, batch=None) -> tuple[str, dict]:
    """(decision key, key parts) of a call; memoised, since every auto call needs it.
    `batch`: (batch count, shared operands) of a batched matmul, None for one GEMM
    (a flattened batch is one GEMM of its rows, keyed as such)."""
    device = mx.default_device().type
    device_type = "gpu" if device == mx.gpu else "cpu"
    env = routing.environment()
    batch_parts = None if batch is None else (m_bucket(batch[0]), batch[1])
    memo = (op, str(dtype), m_bucket(m), n, k, layout, epilogue, has_bias, has_residual,
            device_type, env, batch_parts)

    def parts() -> dict:
        cfgs = gated_configs(dtype) if op == "gated_mlp" else \
            metile_configs(dtype, layout, None if batch is not None else (m_bucket(m), n, k))
        made = {"op": op, "dtype": dtype_name(dtype), "m_bucket": m_bucket(m), "n": n, "k": k,
                "layout": layout, "epilogue": epilogue or "none", "bias": has_bias,
                "device": _device_description(device_type),
                "candidates": [routing.REFERENCE] + [_config_name(c) for c in cfgs],
                "environment": dict(env), "toolchain": routing.tuning.toolchain(),
                **_fingerprints()}
        if has_bias or has_residual:   # these calls run linear_epilogue (epilogue reads)
            made["residual"] = has_residual
            made["linear_kernel"] = _linear_fingerprint()
        if op == "gated_mlp":   # these run the dual-GEMM kernel
            made["gated_kernel"] = _gated_fingerprint()
        if any("SPLIT_K" in c for c in cfgs):   # candidates that run the split-K kernels
            made["split_k_kernels"] = _split_k_fingerprint()
        if batch_parts is not None:   # these run batched_matmul_epilogue, one GEMM a batch index
            made["batch_bucket"], made["batch_shared"] = batch_parts
            made["batched_kernel"] = _batched_fingerprint()
        return made
    return routing.signature_key(memo, parts)


def _cost_model() -> routing.Decision:
    return cost_model(CPU_REASON + "; MLX's native CPU matmul is faster",
                      "MLX's composite until a measurement on this machine finds a metile kernel "
                      "faster (metile.ops.tune_linear / tune_matmul, `with metile.ops.tuning():` "
                      "or METILE_OPS_TUNE=1)")


def _candidates(op, activation, slope, dtype, layout, has_bias, has_residual=False,
                batched=False, shape=None):
    if op == "gated_mlp":   # (x2, w_gate, w_up), the weights as stored (N, K)
        return [routing.Candidate(routing.REFERENCE,
                                  lambda x, wg, wu: _gated_mlx(x, wg, wu, activation))] + [
            routing.Candidate(_config_name(c), lambda x, wg, wu, c=c: _fused_gated(
                activation, c)(x, wg, wu)) for c in gated_configs(dtype)]
    if op == "matmul" and batched:   # a3 (batch or 1, M, K), b3 (batch or 1, K, N)
        ref = routing.Candidate(routing.REFERENCE, lambda a, b: _matmul_mlx(a, b, activation, slope))
        return [ref] + [routing.Candidate(_config_name(c),
                                          lambda a, b, c=c: _fused_bmm(activation, slope, c)(a, b))
                        for c in metile_configs(dtype, layout)]
    if op == "matmul":   # b: the (K, N) operand, a transposed view in a transposed layout
        ref = routing.Candidate(routing.REFERENCE, lambda a, b: _matmul_mlx(a, b, activation, slope))
        return [ref] + [routing.Candidate(_config_name(c),
                                          lambda a, b, c=c: _fused_matmul(activation, slope, c)(
                                              a, _as_rhs(b, c)))
                        for c in metile_configs(dtype, layout, shape)]

    def split(extra):
        extra = list(extra)
        bias = extra.pop(0) if has_bias else None
        return bias, (extra.pop(0) if has_residual else None)

    def ref_run(x, w, *extra):
        bias, residual = split(extra)
        return _linear_mlx_residual(x, w, bias, activation, slope, residual)

    def kernel_run(c):
        def run(x, w, *extra):
            bias, residual = split(extra)
            return _linear_metile(x, w, bias, activation, slope, c, residual)
        return run

    return ([routing.Candidate(routing.REFERENCE, ref_run)]
            + [routing.Candidate(_config_name(c), kernel_run(c))
               for c in metile_configs(dtype, layout, shape)])


def _route(op, arrays, activation, slope, backend, *, measure=None, force=False,
           residual=None, layout=None) -> _Route:
    """Which implementation runs.  `arrays`: (a2, b) for matmul (b (K, N); with layout
    "a@b.T" a transposed view), or a batched matmul's (a3, b3) (matmul_shapes.batched);
    (x2, weight[, bias]) for linear; `residual` (rows, N) for linear's residual add.
    measure: None = when a tuning scope or METILE_OPS_TUNE asks."""
    check_backend("metile.ops", backend)
    a2, b = arrays[0], arrays[1]
    m, k = a2.shape[-2:]
    n = b.shape[-1] if op == "matmul" else b.shape[0]
    gated = op == "gated_mlp"   # arrays (x2, w_gate, w_up): no bias, no split-K kernels
    batch = None
    if a2.ndim == 3:
        batch = (matmul_shapes.batch_count(a2, b), matmul_shapes.sharing(a2, b))
    if backend == "mlx":
        return _Route("mlx", None, routing.Decision("mlx", "requested", "backend='mlx' requested"))
    if layout is None:
        layout = "a@b" if op == "matmul" else "x@w.T"
    if backend == "metile":
        block = _block(m, n, a2.dtype, transpose_b=layout in TRANSPOSED_LAYOUTS,
                       batch=1 if batch is None else batch[0], k=k)
        block = _dual_block(block) if gated else block
        return _Route("metile", block, routing.Decision(_config_name(block), "requested",
                                                        "backend='metile' requested"))
    has_bias = len(arrays) > 2 and not gated
    has_residual = residual is not None
    shape = None if batch is not None or gated else (m_bucket(m), n, k)
    key, parts = _signature(op, a2.dtype, m, n, k, layout, activation, has_bias, has_residual,
                            batch)
    decision = routing.recorded(key, lambda: map(_config_name, gated_configs(a2.dtype) if gated
                                                 else metile_configs(a2.dtype, layout, shape)),
                                force)
    if decision is None:
        measure = routing.measuring_requested() if measure is None else measure
        extra = (residual,) if has_residual else ()
        if measure and routing.can_evaluate(*arrays, *extra):
            view = layout == "a@b.T"   # measured on a transposed view, as called
            shapes = [tuple(a2.shape), (n, k) if view else tuple(b.shape)] \
                + ([tuple(arrays[2].shape)] if has_bias else []) + ([(m, n)] if has_residual else [])
            if gated:
                shapes = [tuple(x.shape) for x in arrays]
            operands = _operands(shapes, a2.dtype)
            if view:
                operands[1] = operands[1].T
            decision = routing.measure(
                key, parts,
                _candidates(op, activation, slope, a2.dtype, layout, has_bias, has_residual,
                            batch is not None, shape),
                operands, _validate, budget_s=routing.budget(), clock=routing.scope_clock())
        else:
            decision = _cost_model()
    if decision.winner == routing.REFERENCE:
        return _Route("mlx", None, decision)
    by_name = {_config_name(c): c for c in (gated_configs(a2.dtype) if gated else
                                            metile_configs(a2.dtype, layout, shape))}
    if decision.winner not in by_name:   # a decision naming a tile this version lacks
        return _Route("mlx", None, _cost_model())
    return _Route("metile", by_name[decision.winner], decision)


# -- public ops ---------------------------------------------------------------------------------

def _layout(b) -> str:
    """matmul's right-operand layout: "a@b.T" when `b` is, unevaluated, a transposed
    view (b = w.T): then the kernel reads w in place, where passing b would copy it.
    MLX 0.32 shows Python neither strides nor contiguity, so an already-evaluated
    transposed view is not recognised and is copied as before (lazy_graph.py).
    Looked up for backend="metile" only: the graph export walks all of b's lazy
    graph, a cost an `auto` call (usually MLX's composite) must not pay on every call
    of an eager model; `linear` knows its weight's layout without it."""
    return "a@b.T" if lazy_graph.is_transposed_view(b) else "a@b"


def _matmul_operands(a, b, p: matmul_shapes.Plan, backend: str):
    """(arrays, layout) for _route: a flattened call's (rows, K) and (K, N) operands, or
    a batched call's (batch or 1, M, K) and (batch or 1, K, N) ones."""
    if not p.flattened:
        return matmul_shapes.batched(a, b, p), "a@b"
    a2, b2 = matmul_shapes.flattened(a, b, p)
    return (a2, b2), (_layout(b2) if backend == "metile" else "a@b")


@op_replay.entry(("a", "b"), ("epilogue", "negative_slope", "backend", "stream"))
def matmul(a, b, *, epilogue=None, negative_slope: float = LEAKY_SLOPE, backend: str = "auto",
           stream=None):
    """epilogue(a @ b) with `epilogue` one of None, "relu", "leaky_relu", "gelu_tanh",
    "silu", and the operands as MLX's matmul takes them: a (..., M, K) @ b (..., K, N)
    with broadcast batch dimensions, a 1-D operand promoted as NumPy does.  A `b` with
    no batch (the (B, T, K) @ (K, N) of a model) runs as one GEMM over all of a's rows;
    a batched `b` runs the batched kernel (matmul_shapes.py says what each costs).
    `stream`: as MLX's ops take it (op_routing.on_stream)."""
    if stream is not None:
        return on_stream("matmul", stream, lambda: matmul(
            a, b, epilogue=epilogue, negative_slope=negative_slope, backend=backend))
    _check_activation(epilogue, negative_slope, name="epilogue")
    if mlx_takes_it(backend, a, b):   # an int or float64 operand: MLX's composite
        return _matmul_mlx(a, b, epilogue, negative_slope)
    a, b = _promoted(a, b)
    options = (epilogue, negative_slope, backend)   # (a repeated call replays: op_replay.py)
    key = op_replay.key("matmul", (*options, None), a, b) if a is not None and \
        b is not None and _plain_options(*options) else None
    p = _matmul_plan(a, b, epilogue, negative_slope)
    composite = functools.partial(_matmul_mlx, epilogue=epilogue, slope=negative_slope)
    if backend == "mlx":   # the operands as given: MLX broadcasts without copies
        out = composite(a, b)
        op_replay.remember_requested(key, composite)
        return out
    arrays, layout = _matmul_operands(a, b, p, backend)
    route = _route("matmul", arrays, epilogue, negative_slope, backend, layout=layout)
    if route.path == "mlx":
        # (no reshape after it: under mx.compile(shapeless=True) a reshape keeps the traced
        # shape, where MLX's own ops follow the input's)
        op_replay.remember_composite(key, composite, route.decision)
        return composite(a, b)
    elif p.flattened:
        a2, rhs = arrays[0], _as_rhs(arrays[1], route.block)
        with op_replay.recording() as launches:
            out = _fused_matmul(epilogue, negative_slope, route.block)(
                a2, rhs, shapes=(p.out_shape,))
        if key is not None and layout == "a@b" and not route.block.get("TRANSPOSE_B"):
            # (the row-major layout only: a transposed view's kernel reads its source)
            rows = (a2.shape[0], rhs.shape[-1])
            op_replay.remember(key, launches, MATMUL_ARRAYS, (a, b),
                               _matmul_vjp(epilogue, negative_slope, route.block),
                               _reshapes((a, b), (a2, rhs)),
                               None if rows == tuple(p.out_shape) else p.out_shape, composite)
    else:
        out = _fused_bmm(epilogue, negative_slope, route.block)(*arrays)
    return out.reshape(p.out_shape)


def _plain_options(activation, slope, backend) -> bool:
    """The options can key a replay: hashable, and of the types the full path accepts (a
    bad one takes the full path, which names it)."""
    return (activation is None or type(activation) is str) and \
        type(slope) in (int, float) and type(backend) is str


def _reshapes(given, primals) -> list:
    """Per primal of a replay, the shape the op reshaped its array to (None: as given)."""
    return [None if x.shape == y.shape else y.shape for x, y in zip(given, primals)]


def _linear_args(x, weight, bias, activation, negative_slope, residual):
    """`linear`'s arguments checked and flattened to rows: (arrays, residual as rows x N)."""
    _check_activation(activation, negative_slope)
    _check_linear(x, weight, bias, activation, negative_slope)
    residual = _check_residual(x, weight, residual)
    x2 = _rows(x)
    r2 = None if residual is None else residual.reshape(x2.shape[0], weight.shape[0])
    return ((x2, weight) if bias is None else (x2, weight, bias)), r2


def _check_residual(x, weight, residual):
    """The residual checked and broadcast to the output's shape (as `x @ w.T + residual`
    broadcasts; MLX's autodiff sums the broadcast back for its gradient)."""
    if residual is None:
        return None
    if not isinstance(residual, mx.array):
        raise TypeError(f"[metile.ops] residual must be an mx.array or None, got "
                        f"{type(residual).__name__}")
    want = (*x.shape[:-1], weight.shape[0])
    if tuple(residual.shape) != want:
        if not broadcasts_to(tuple(residual.shape), want):
            raise ValueError(f"[metile.ops] residual shape {tuple(residual.shape)} does not "
                             f"broadcast to the output shape {want}")
        residual = mx.broadcast_to(residual, want)
    if residual.dtype != x.dtype:
        raise TypeError(f"[metile.ops] residual has dtype {residual.dtype}; expected x's "
                        f"dtype {x.dtype}")
    return residual


def bias_is_vector(shape: tuple, n: int) -> bool:
    """Whether a bias of `shape` adds one vector of `n` outputs to every row: 0-d, (1,),
    (N,) or (1, ..., 1, N)."""
    return all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (1, n))


def _bias_vector(x, weight, bias):
    """`bias` as the (N,) vector the fused epilogue reads, where MLX's `x @ w.T + bias`
    broadcasts it as one: a 0-d, (1,) or (1, ..., 1, N) bias (of no more dimensions than
    the output) - a free reshape, or a broadcast_to whose gradient MLX sums back.  Any
    other bias is returned as given (_check_linear names it)."""
    if not (isinstance(bias, mx.array) and isinstance(weight, mx.array) and weight.ndim == 2
            and isinstance(x, mx.array)) or bias.shape == (weight.shape[0],):
        return bias
    n = weight.shape[0]
    shape = tuple(bias.shape)
    if len(shape) > max(x.ndim, 1) or not bias_is_vector(shape, n):
        return bias
    return mx.broadcast_to(bias.reshape(-1), (n,)) if not shape or shape[-1] == 1 \
        else bias.reshape(n)


def _bias_broadcasts(x, weight, bias) -> bool:
    """Whether `bias` is no (N,) vector but broadcasts to the output as MLX's addmm takes
    it (a (T, N) bias: each row its own) - MLX's composite computes it.  One that would
    widen the output (more dimensions than it) is not: addmm, and so mlx.nn.Linear,
    refuses it."""
    if not (isinstance(bias, mx.array) and isinstance(weight, mx.array) and weight.ndim == 2
            and isinstance(x, mx.array) and x.ndim >= 1) or bias.shape == (weight.shape[0],):
        return False
    out = (*x.shape[:-1], weight.shape[0])
    try:
        return np.broadcast_shapes(tuple(bias.shape), out) == out
    except ValueError:
        return False


def _check_linear(x, weight, bias, activation, slope):
    if not isinstance(weight, mx.array) or weight.ndim != 2:
        raise ValueError("[metile.ops] weight must be a 2-D mx.array (out_features, in_features)")
    if isinstance(x, mx.array) and x.ndim >= 1 and x.shape[-1] != weight.shape[1]:
        # (named on the weight as given: the product's (K, N) operand is its transpose)
        raise ValueError(f"[metile.ops] x's last dimension is {x.shape[-1]}, but weight "
                         f"{tuple(weight.shape)} (out_features, in_features) takes "
                         f"{weight.shape[1]} input features")
    if isinstance(x, mx.array) and x.ndim < 1:
        # (the product's message named a and b, and the weight transposed)
        raise ValueError(f"[metile.ops] x must have at least one dimension (..., in_features), "
                         f"got shape {tuple(x.shape)}")
    _check(x, weight.T, activation, slope, names=("x", "weight"))
    if bias is None:
        return
    if not isinstance(bias, mx.array):
        raise TypeError(f"[metile.ops] bias must be an mx.array or None, got {type(bias).__name__}")
    if bias.shape != (weight.shape[0],):
        if _bias_broadcasts(x, weight, bias):
            raise ValueError(f"[metile.ops] bias shape {tuple(bias.shape)}: metile's kernels "
                             f"add one bias vector of {weight.shape[0]} output features to "
                             f"every row; pass a per-row bias as residual= (added after the "
                             f"activation), or use backend='auto' or 'mlx'")
        out = (*x.shape[:-1], weight.shape[0]) if isinstance(x, mx.array) else None
        raise ValueError(f"[metile.ops] bias shape {tuple(bias.shape)} does not broadcast to "
                         f"the {weight.shape[0]} output features"
                         + (f" of the output shape {out} (a bias may not widen the output: "
                            f"MLX's addmm, which mlx.nn.Linear uses, refuses that too)"
                            if out is not None else ""))
    if bias.dtype != x.dtype:
        # as for x, weight and residual: one dtype (the fused epilogue would round a wider
        # bias to x's dtype where MLX promotes the result)
        raise TypeError(f"[metile.ops] bias has dtype {bias.dtype}; expected x's dtype "
                        f"{x.dtype}")


@op_replay.entry(("x", "weight", "bias", "residual"), ("activation", "negative_slope", "backend"))
def linear(x, weight, bias=None, activation=None, *, residual=None, backend: str = "auto",
           negative_slope: float = LEAKY_SLOPE):
    """activation(x @ weight.T + bias) + residual, weight stored (out_features,
    in_features) as in MLX; x is (..., in_features) of any rank >= 1, the result
    (..., out_features); `residual` (optional) broadcasts to the output's shape (the
    transformer's residual add; one that would widen it is refused).  Operands of different
    float dtypes promote as MLX's addmm promotes them.  On the metile path bias, activation
    and residual are one fused epilogue."""
    if mlx_takes_it(backend, x, weight, bias, residual):
        # an int or float64 operand: MLX's composite, as mlx.nn.Linear computes it
        _check_activation(activation, negative_slope)
        return _linear_mlx_residual(x, weight, bias, activation, negative_slope, residual)
    x, weight, bias, residual = _promoted(x, weight, bias, residual)
    bias = _bias_vector(x, weight, bias)
    if _bias_broadcasts(x, weight, bias) and backend in ("auto", "mlx"):
        # a bias of more than one row ((T, N), say): MLX's composite, which broadcasts it
        _check_activation(activation, negative_slope)
        return _linear_mlx_residual(x, weight, bias, activation, negative_slope, residual)
    options = (activation, negative_slope, backend)   # (a repeated call replays: op_replay.py)
    key = op_replay.key("linear", options, x, weight, bias, residual) \
        if weight is not None and x is not None and _plain_options(*options) else None
    arrays, r2 = _linear_args(x, weight, bias, activation, negative_slope, residual)
    if r2 is not None and residual.shape != (*x.shape[:-1], weight.shape[0]):
        key = None   # a broadcast residual: replays reshape their arrays, never broadcast
    x2 = arrays[0]
    route = _route("linear", arrays, activation, negative_slope, backend, residual=r2)
    if route.path == "mlx":
        op_replay.remember_composite(
            key, _linear_composite(bias is not None, residual is not None, activation,
                                   negative_slope),
            route.decision)
        # on x as given, not its rows, and not reshaped: under mx.compile(shapeless=True)
        # a reshape keeps the traced shape (a converted model returned the first call's
        # shape for every later input), where MLX's ops follow the input's
        return _linear_mlx_residual(x, weight, bias, activation, negative_slope, residual)
    else:
        shape = (*x.shape[:-1], weight.shape[0])
        with op_replay.recording() as launches:
            out = _linear_metile(x2, weight, bias, activation, negative_slope, route.block, r2,
                                 shapes=(shape,))
        if key is not None and route.block.get("TRANSPOSE_B"):
            # (a TRANSPOSE_B kernel reads the weight as stored; others read weight.T)
            given = (x, weight) + tuple(a for a in (bias, residual) if a is not None)
            primals = (x2, weight) + tuple(a for a in (bias, r2) if a is not None)
            composite = _linear_rows(activation, negative_slope, bias is not None,
                                     residual is not None)
            if bias is None and residual is None:
                vjp, at = _matmul_vjp(activation, negative_slope, route.block), MATMUL_ARRAYS
            else:
                vjp = _linear_vjp(activation, negative_slope, route.block, bias is not None,
                                  residual is not None)
                places = SPLIT_K_ARRAYS if route.block.get("SPLIT_K", 1) > 1 else LINEAR_ARRAYS
                at = [places[n] for n, a in zip(("x", "w", "bias", "residual"),
                                                (x, weight, bias, residual))
                      if a is not None]
            op_replay.remember(key, launches, at, given, vjp, _reshapes(given, primals),
                               None if (x2.shape[0], weight.shape[0]) == shape else shape,
                               composite)
    return out


GATED_ACTIVATIONS = ("silu", "gelu_tanh", "relu")


def _gated_mlx(x2, w_gate, w_up, activation):
    """MLX's composite, as a gated MLP written with mlx.nn computes it."""
    return activate(x2 @ w_gate.T, activation) * (x2 @ w_up.T)


def _launch_gated(x2, w_gate, w_up, activation, block, dispatch_only=False):
    """The weights as stored (N, K); a block without TRANSPOSE_B multiplies their
    transposes, which the custom-kernel call copies to row-major."""
    from metile_kernels.gemm import gated_mlp as kernel, grid

    m, k = x2.shape
    n = w_gate.shape[0]
    transpose = bool(block.get("TRANSPOSE_B"))
    tile = {key: v for key, v in block.items() if key != "TRANSPOSE_B"}
    args = (x2, _linear_operand(w_gate, block), _linear_operand(w_up, block),
            mx.zeros((m, n), x2.dtype), m, n, k)
    kw = dict(ACTIVATION=activation, TRANSPOSE_B=transpose, **tile)
    return _run(kernel, grid(m, n, block["BLOCK_M"], block["BLOCK_N"]), args, kw,
                dispatch_only)


@_reused
def _fused_gated(activation, block):
    """A differentiable act(x2 @ w_gate.T) * (x2 @ w_up.T) whose forward is one dual-GEMM
    kernel; the backward pass is MLX's, recomputing both products (GEMMs in the operand
    dtype, the elementwise part in float32)."""

    @op_replay.op_function
    def f(x2, w_gate, w_up):
        return _launch_gated(x2, w_gate, w_up, activation, block)

    f.vjp(_gated_vjp(activation))
    op_replay.composite_rules(f, functools.partial(_gated_mlx, activation=activation))
    return f


@_reused
def _gated_vjp(activation):
    """_fused_gated's backward (also what its replays call: op_replay.py)."""

    def f_vjp(primals, cotangent, output):
        x2, w_gate, w_up = primals
        g = (x2 @ w_gate.T).astype(mx.float32)
        u = (x2 @ w_up.T).astype(mx.float32)
        c = cotangent.astype(mx.float32)
        # elementwise in float32, the GEMMs in the operand dtype (see _upstream)
        d_gate = (c * u * _activation_grad(g, activation, LEAKY_SLOPE)).astype(x2.dtype)
        d_up = (c * activate(g, activation)).astype(x2.dtype)
        return d_gate @ w_gate + d_up @ w_up, d_gate.T @ x2, d_up.T @ x2
    return f_vjp


def _check_gated_activation(activation):
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"[metile.ops] gated_mlp's activation must be one of "
                         f"{', '.join(GATED_ACTIVATIONS)}, got {activation!r}")


def _gated_args(x, w_gate, w_up, activation):
    _check_gated_activation(activation)
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not isinstance(w, mx.array) or w.ndim != 2:
            raise ValueError(f"[metile.ops] {name} must be a 2-D mx.array (hidden, in_features)")
    if w_gate.shape != w_up.shape:
        raise ValueError(f"[metile.ops] w_gate {w_gate.shape} and w_up {w_up.shape} differ in "
                         "shape")
    _check_arrays(x, w_gate, ("x", "w_gate"))
    _check_arrays(x, w_up, ("x", "w_up"))
    if x.ndim < 1:
        raise ValueError("[metile.ops] x must have at least one dimension (..., in_features), "
                         "got a 0-d array")
    if x.shape[-1] != w_gate.shape[1]:
        # (named on the weights as given, as linear does: the product takes their transpose)
        raise ValueError(f"[metile.ops] x's last dimension is {x.shape[-1]}, but w_gate and "
                         f"w_up {tuple(w_gate.shape)} (hidden, in_features) take "
                         f"{w_gate.shape[1]} input features")
    return _rows(x), w_gate, w_up


@op_replay.entry(("x", "w_gate", "w_up"), ("activation", "backend"))
def gated_mlp(x, w_gate, w_up, activation: str = "silu", *, backend: str = "auto"):
    """activation(x @ w_gate.T) * (x @ w_up.T): a gated MLP's (llama's SwiGLU, GeGLU) gate
    and up projections, weights stored (hidden, in_features) as in mlx.nn.Linear (no
    bias), x (..., in_features) of any rank >= 1, the result (..., hidden) in their dtype.
    `activation`: "silu" (x * sigmoid(x)), "gelu_tanh" or "relu".  On the metile path
    it is one dual-GEMM kernel (both products from one read of x, the gate fused into
    the store); routed like `linear` (`backend=`).  Call it explicitly in a model's
    MLP (`nn.convert` cannot see a gated MLP in the module tree: the gating is in the
    forward code):  down_proj(metile.ops.gated_mlp(x, gate.weight, up.weight)).
    Operands of different float dtypes are promoted as MLX's matmul promotes them."""
    if mlx_takes_it(backend, x, w_gate, w_up):   # an int or float64 operand: MLX's composite
        _check_gated_activation(activation)
        return _gated_mlx(x, w_gate, w_up, activation)
    x, w_gate, w_up = _promoted(x, w_gate, w_up)
    key = op_replay.key("gated_mlp", (activation, backend), x, w_gate, w_up) \
        if all(a is not None for a in (x, w_gate, w_up)) and \
        _plain_options(activation, LEAKY_SLOPE, backend) else None
    given = (x, w_gate, w_up)
    x2, w_gate, w_up = _gated_args(x, w_gate, w_up, activation)
    shape = (*x.shape[:-1], w_gate.shape[0])
    route = _route("gated_mlp", (x2, w_gate, w_up), activation, LEAKY_SLOPE, backend)
    if route.path == "mlx":
        op_replay.remember_composite(
            key, lambda x, w_gate, w_up: _gated_mlx(x, w_gate, w_up, activation),
            route.decision)
        # on x as given and not reshaped (as in `linear`: shapeless compile)
        return _gated_mlx(x, w_gate, w_up, activation)
    else:
        with op_replay.recording() as launches:
            out = _fused_gated(activation, route.block)(x2, w_gate, w_up, shapes=(shape,))
        if key is not None and route.block.get("TRANSPOSE_B"):
            # (a TRANSPOSE_B kernel reads the weights as stored: x2, w_gate, w_up first)
            op_replay.remember(key, launches, (0, 1, 2), given, _gated_vjp(activation),
                               _reshapes(given, (x2, w_gate, w_up)),
                               None if (x2.shape[0], w_gate.shape[0]) == shape else shape,
                               functools.partial(_gated_mlx, activation=activation))
    return out


def tune_gated_mlp(x, w_gate, w_up, activation: str = "silu", *, budget_s: float | None = None,
                   force: bool = False, clock=None) -> dict:
    """tune_linear for `gated_mlp`'s signature."""
    x, w_gate, w_up = _promoted(x, w_gate, w_up)
    arrays = _gated_args(x, w_gate, w_up, activation)
    with routing.tuning_scope(budget_s, clock):
        route = _route("gated_mlp", arrays, activation, LEAKY_SLOPE, "auto", measure=True,
                       force=force)
    return route.decision.to_dict()


def explain_gated_mlp(x, w_gate, w_up, activation: str = "silu", *,
                      backend: str = "auto") -> str:
    """Which path `gated_mlp` takes, why, and the kernel's report; never measures."""
    x, w_gate, w_up = _promoted(x, w_gate, w_up)
    arrays = _gated_args(x, w_gate, w_up, activation)
    route = _route("gated_mlp", arrays, activation, LEAKY_SLOPE, backend, measure=False)
    d = route.decision
    info = {"op": "gated_mlp", "path": "metile_kernel" if route.path == "metile" else
            "mlx_composite", "reason": d.reason, "activation": activation, "route": d.to_dict()}
    if route.path == "metile":
        dispatch = _launch_gated(*arrays, activation, route.block, dispatch_only=True)
        info["config"] = dict(route.block)
        info["execution_report"] = dispatch.execution_report.to_dict()
    return json.dumps(info, indent=2)


# -- measuring on request -----------------------------------------------------------------------

def tuning(budget_s: float | None = None, clock=None):
    """`with metile.ops.tuning(): model(x)`: every eager `auto` call inside whose
    signature has no recorded decision measures it (about `budget_s` seconds of timing,
    default METILE_OPS_TUNE_BUDGET_S or 0.25, plus compiling kernels not yet cached)
    and records the winner for every later process on this machine.  Calls traced
    by mx.compile/mx.vmap inside the block are not measured.  `clock` replaces
    time.perf_counter (tests)."""
    return routing.tuning_scope(budget_s, clock)


def tune_matmul(a, b, *, epilogue=None, negative_slope: float = LEAKY_SLOPE,
                budget_s: float | None = None, force: bool = False, clock=None) -> dict:
    """Measure (or, unless `force`, read the recorded) routing decision for this call
    signature now; returns it as explain_matmul's "route" dict."""
    a, b = _promoted(a, b)
    p = _matmul_plan(a, b, epilogue, negative_slope)
    arrays, layout = _matmul_operands(a, b, p, "auto")
    with routing.tuning_scope(budget_s, clock):
        route = _route("matmul", arrays, epilogue, negative_slope, "auto", measure=True,
                       force=force, layout=layout)
    return route.decision.to_dict()


def tune_linear(x, weight, bias=None, activation=None, *, residual=None,
                negative_slope: float = LEAKY_SLOPE, budget_s: float | None = None,
                force: bool = False, clock=None) -> dict:
    """tune_matmul for `linear`'s signature."""
    x, weight, bias, residual = _promoted(x, weight, bias, residual)
    arrays, r2 = _linear_args(x, weight, bias, activation, negative_slope, residual)
    with routing.tuning_scope(budget_s, clock):
        route = _route("linear", arrays, activation, negative_slope, "auto", measure=True,
                       force=force, residual=r2)
    return route.decision.to_dict()


# -- explaining ---------------------------------------------------------------------------------

def _explain(op, arrays, activation, slope, backend, residual=None, layout=None) -> dict:
    route = _route(op, arrays, activation, slope, backend, measure=False, residual=residual,
                   layout=layout)
    d = route.decision
    info = {"op": op, "path": "metile_kernel" if route.path == "metile" else "mlx_composite",
            "reason": d.reason, "epilogue": activation, "route": d.to_dict()}
    if route.path == "metile":
        a2, b = arrays[0], arrays[1]
        # matmul's b is (K, N); linear's is the stored (N, K) weight
        rhs = _as_rhs(b, route.block) if op == "matmul" else _linear_operand(b, route.block)
        bias = arrays[2] if len(arrays) > 2 else None
        if a2.ndim == 3:
            dispatch = _launch_batched(a2, b, activation, slope, route.block, dispatch_only=True)
        elif bias is None and residual is None:
            dispatch = _launch(a2, rhs, activation, slope, route.block, dispatch_only=True)
        else:
            dispatch = _launch_linear(a2, rhs, bias, residual, activation, slope, route.block,
                                      dispatch_only=True)
        info["config"] = dict(route.block)   # TRANSPOSE_B: the right operand read as stored
        # what the fused epilogue reads besides the accumulator (bias, residual)
        info["epilogue_reads"] = dispatch.variant.data["lowering"]["matmul"]["epilogue_reads"]
        info["execution_report"] = dispatch.execution_report.to_dict()
    return info


def explain_matmul(a, b, *, epilogue=None, negative_slope: float = LEAKY_SLOPE,
                   backend: str = "auto") -> str:
    """Which path `matmul` takes for these arguments, why (the routing decision with
    its measured times per candidate, in microseconds), and the kernel's report.
    Never measures: a call with no recorded decision reports the cost model."""
    a, b = _promoted(a, b)
    p = _matmul_plan(a, b, epilogue, negative_slope)
    arrays, layout = _matmul_operands(a, b, p, backend)
    info = _explain("matmul", arrays, epilogue, negative_slope, backend, layout=layout)
    info["batch"] = {"shape": list(p.batch_shape),
                     "how": "flattened into rows (one GEMM)" if p.flattened else
                            f"batched kernel, shared operands: {matmul_shapes.sharing(*arrays)}"}
    return json.dumps(info, indent=2)


def explain_linear(x, weight, bias=None, activation=None, *, residual=None,
                   backend: str = "auto", negative_slope: float = LEAKY_SLOPE) -> str:
    """Which path `linear` takes for these arguments, why (the routing decision with its
    measured times per candidate, in microseconds), and the kernel's report, as JSON text.
    Never measures: a call with no recorded decision reports the cost model."""
    x, weight, bias, residual = _promoted(x, weight, bias, residual)
    bias = _bias_vector(x, weight, bias)
    if _bias_broadcasts(x, weight, bias) and backend in ("auto", "mlx"):
        return json.dumps({"op": "linear", "path": "mlx_composite", "reason":
                           f"bias of shape {tuple(bias.shape)} is no vector of the output "
                           f"features: MLX's x @ w.T + bias broadcasts it"}, indent=2)
    arrays, r2 = _linear_args(x, weight, bias, activation, negative_slope, residual)
    return json.dumps(_explain("linear", arrays, activation, negative_slope, backend, r2),
                      indent=2)

# The model kernel library's ops (their own modules: they cannot import this one back).
from .attention_ops import (explain_attention, scaled_dot_product_attention,  # noqa: E402,F401
                            tune_attention)
from .model_ops import add_rms_norm, layer_norm, rms_norm, rope, softmax  # noqa: E402,F401
from .quantized_ops import (explain_quantized_matmul, quantized_matmul,  # noqa: E402,F401
                            tune_quantized_matmul, _use_dense_products)

# quantized_ops' dequantize-then-GEMM candidate, and its test for the warpgroup MMA (read
# when called, so a test's monkeypatch of _warpgroup_gemm reaches it)
_use_dense_products(linear, matmul, lambda: _warpgroup_gemm())
