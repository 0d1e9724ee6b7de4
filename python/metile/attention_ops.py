"""metile.ops.scaled_dot_product_attention: a drop-in for mx.fast's, on metile kernels.

    out = metile.ops.scaled_dot_product_attention(q, k, v, scale=d ** -0.5, mask="causal")

q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D) with Hq a multiple of Hkv (grouped-query
heads), mask None, "causal" (the last query aligned with the last key) or an array
broadcastable to (B, Hq, Lq, Lk): boolean (False removes the key) or additive (its
dtype must promote to the output's).  The output has the promoted dtype of q, k, v.

Kernels (metile_kernels/attention.py): `attention_forward` (flash attention, one
program per query block and head) for prefill; for few rows per key/value head (G x Lq
<= DECODE_ROWS: decoding) `attention_split` spreads the keys over programs and
`attention_combine` merges the chunks; for a few queries `attention_decode` does
the split's work per query head and query without matrix products (path "decode_rows",
the first candidate for up to ROWS_QUERIES queries).  Inputs are read row-major: a strided view
(e.g. a (B, L, H, D) projection transposed to (B, H, L, D)) is copied once, as the
custom-kernel call copies any non-contiguous input.

Gradients (the op's vjp, carried by its one node: runtime/op_function.OpFunction) come
from MLX's own attention composite in float32, recomputed from q, k, v: softmax(scale q
kᵀ + mask) v differentiated by MLX, so the gradients are MLX's (for an additive mask
too; a boolean mask gets zeros).

`backend`: "mlx" runs mx.fast.scaled_dot_product_attention, "metile" the kernels, and
"auto" (the default) routes as metile's other ops (runtime/routing.py): the kernels
only where a recorded measurement on this machine found them faster than MLX's op
(`tune_attention`, `with metile.ops.tuning():` or METILE_OPS_TUNE=1); without one,
MLX's op.
"""

from __future__ import annotations

import json

import functools
import math

import mlx.core as mx

from . import _ext, op_replay
from .runtime.arguments import MAX_BUFFER_ELEMENTS
from .runtime import routing
from .op_routing import (
    FLOAT_DTYPES as _DTYPES,
    mlx_takes_it,
    mlx_takes_values,
    type_name,
    plain_number,
    check_backend,
    config_name as _config_name,
    is_real,
    on_stream,
    device_description as _device_description,
    validate as _validate,
    CPU_REASON,
    cost_model,
    dtype_name)

LOG2E = 1.4426950408889634
# Rows (query heads per key/value head x queries) that one split program holds: the
# decode path's BLOCK_M.
DECODE_ROWS = 16
# Programs the split path aims for: enough to cover every SM of a large GPU twice.
TARGET_PROGRAMS = 264


def _fail(kind, message):
    return kind(f"[metile.ops.scaled_dot_product_attention] {message}")


def _check(q, k, v, scale, mask) -> float:
    """Refuse what the op cannot take; return `scale` as a Python float (MLX's op takes a
    NumPy scalar too)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, mx.array):
            raise _fail(TypeError, f"{name} must be an mx.array, got {type(x).__name__}")
        if x.ndim != 4:
            raise _fail(ValueError, f"{name} must have rank 4 (B, heads, length, D), got shape "
                                    f"{tuple(x.shape)}")
        if x.dtype not in _DTYPES:
            raise _fail(TypeError, f"{name} has dtype {x.dtype}; supported: float32, float16, "
                                   f"bfloat16")
    if q.shape[-1] != k.shape[-1]:
        raise _fail(ValueError, f"head dimensions differ: q {q.shape[-1]}, k {k.shape[-1]} "
                                f"(the scores' product needs them equal)")
    if k.shape[:3] != v.shape[:3]:
        raise _fail(ValueError, f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in "
                                f"batch, heads and length")
    if q.shape[0] != k.shape[0]:
        raise _fail(ValueError, f"batch sizes differ: q {q.shape[0]}, k/v {k.shape[0]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise _fail(ValueError, f"query heads ({q.shape[1]}) must be a multiple of key/value "
                                f"heads ({k.shape[1]})")
    scale = plain_number(scale)
    if not is_real(scale):
        raise _fail(TypeError, f"scale must be a number, got {type(scale).__name__} {scale!r}")
    if isinstance(mask, str):
        if mask != "causal":
            raise _fail(ValueError, f"mask must be None, 'causal' or an array, got {mask!r}")
    elif mask is not None:
        if not isinstance(mask, mx.array):
            raise _fail(TypeError, f"mask must be None, 'causal' or an mx.array, got "
                                   f"{type(mask).__name__}")
        full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if mask.ndim > 4 or any(m not in (1, f) for m, f in
                                zip(mask.shape[::-1], full[::-1])):
            raise _fail(ValueError, f"mask shape {tuple(mask.shape)} does not broadcast to "
                                    f"(B, Hq, Lq, Lk) = {full}")
        if mask.dtype != mx.bool_:
            out = _result_dtype(q, k, v)
            if _promote(mask.dtype, out) != out:
                # (ValueError, as MLX's op raises it: code catching that catches this)
                raise _fail(ValueError, f"an additive mask's dtype must promote to the output "
                                       f"dtype {out}; got {mask.dtype}")
    return float(scale)


@functools.lru_cache(maxsize=64)
def _promote(a, b):
    # MLX's promotion, read off a zero-size expression (lazy: nothing is computed; 4 us
    # of array building, once a pair of dtypes)
    return (mx.zeros((0,), a) + mx.zeros((0,), b)).dtype


def _result_dtype(q, k, v):
    return _promote(_promote(q.dtype, k.dtype), v.dtype)


def _mask_kind(mask) -> str:
    if mask is None:
        return "none"
    if isinstance(mask, str):
        return "causal"
    return "bool" if mask.dtype == mx.bool_ else "additive"


def _mask_strides(mask) -> list[int]:
    """Element strides (batch, head, query, key) of the row-major mask broadcast to
    `full`: 0 along an axis of extent 1."""
    shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(0 if extent == 1 else step)
        step *= extent
    return strides[::-1]


def _head_block(d: int) -> int:
    return 1 if d <= 1 else 1 << (d - 1).bit_length()


def is_decode(q, k) -> bool:
    return (q.shape[1] // k.shape[1]) * q.shape[2] <= DECODE_ROWS


def shared_bytes(block_m: int, block_n: int, block_d: int, itemsize: int) -> int:
    """Threadgroup memory the general lowering gives a configuration (an upper bound of
    what the execution report lists): q, kᵀ and v in the input dtype, the float32 scores
    (the row maximum reads them) and probabilities (a dot operand), and row vectors."""
    return itemsize * (block_m * block_d + 2 * block_n * block_d) + 8 * block_m * block_n \
        + 16 * block_m


def mma_shared_bytes(block_m: int, block_n: int, block_d: int, itemsize: int) -> int:
    """Threadgroup memory of attention_forward in the accumulator layout: q, k and v in the
    input dtype, each row 16 bytes longer (mma_layout.padded)."""
    return itemsize * (block_m + 2 * block_n) * (block_d + 16 // itemsize)


def _shared_limit() -> int:
    # Metal (and the CPU runtime that checks Metal's limit): 32 KiB; CUDA kernels past
    # 48 KiB take dynamic shared memory up to the opt-in limit
    return 96 * 1024 if _on_cuda() else 32 * 1024


def _on_cuda() -> bool:
    return mx.default_device().type == mx.gpu and mx.cuda.is_available()


def tiles(d: int, itemsize: int, decode: bool, rows: int = DECODE_ROWS) -> list[dict]:
    """The tile configurations that fit threadgroup memory, largest first.  A decode
    tile holds the `rows` (query heads per key/value head x queries) its program
    computes, rounded up to a power of two: the general lowering's products do the work
    of every row of the tile, padding included (one query of multi-head attention in a
    16-row tile did 16 times the work)."""
    shapes = ([(_bucket(rows), n) for n in (64, 32, 16)] if decode else
              [(64, 64), (64, 32), (32, 32), (32, 16), (16, 16)])
    size = shared_bytes
    if not decode and _on_cuda() and forward_warps(128, itemsize):
        # products and softmax in the accumulator layout (passes/mma_layout.py) hold only
        # q, k and v there, rows padded by 16 bytes; H200 s45, 1x32x4096x4096x128 causal
        # float16: 128x64 on 8 warps 2537 us, 128x128 2498, 64x64 on 4 warps 3517
        shapes = [(128, 64), (128, 128), (64, 64), (64, 32), (32, 32), (16, 16)]
        size = mma_shared_bytes
    fit = [{"path": "decode" if decode else "prefill", "BLOCK_M": m, "BLOCK_N": n}
           for m, n in shapes if size(m, n, _head_block(d), itemsize) <= _shared_limit()]
    if not fit:
        m, n = shapes[-1]
        raise _fail(ValueError, f"head dimension {d} with {itemsize}-byte elements is not "
                                f"supported by metile's kernels: their smallest tile ({m}x{n}) "
                                f"needs {size(m, n, _head_block(d), itemsize)} bytes of "
                                f"threadgroup memory, more than the {_shared_limit()} a "
                                f"program has; use backend='auto' or 'mlx' (MLX's op)")
    return fit


def rows_shared_bytes(block_n: int, block_d: int, run: int) -> int:
    """Threadgroup memory of attention_decode: the float32 value accumulator copied there
    once to be summed over the keys, the block's scores and probabilities, scratch; and
    where a key's row is wider than a SIMD-group's runs of `run` elements (lanes cannot
    combine it in place), the float32 products it is summed from."""
    wide = block_d > 32 * run
    return 4 * block_n * block_d * (2 if wide else 1) + 8 * block_n + 64


# Bytes of keys and values the heads running at once may share in L2 (half an H100/H200's
# 50 MB): causal prefill hands programs out in runs of heads that fit it (head_group).
L2_SHARE = 24 << 20


def head_group(q_heads: int, kv_len: int, d: int, itemsize: int, group: int = 1) -> int:
    """attention_forward's HEAD_GROUP for causal prefill: the most query heads (a power of
    two, at most q_heads) whose keys and values fit L2_SHARE - `group` query heads share one
    key/value head.  The kernel starts each run's longest query blocks first."""
    per_head = 2 * kv_len * d * itemsize / max(1, group)
    fit = max(1, int(L2_SHARE // max(1, per_head)))
    return min(q_heads, 1 << (fit.bit_length() - 1))


def forward_warps(block_m: int, itemsize: int = 2) -> int | None:
    """attention_forward's warps: one 16-row slab of the query block each, where its
    products and softmax stay in the matrix unit's accumulator layout (passes/mma_layout.py,
    the default; on Metal's 8x8 unit each warp takes two 8-row slabs); None (the plan's own
    count, a thread an element of the largest tile) where METILE_MMA_LAYOUT=0 or CUDA's
    METILE_DOT_FRAGMENTS=0 leave the lane layout, or CUDA has no unit for the operands
    (strict float32)."""
    from . import settings
    if not settings.flag("METILE_MMA_LAYOUT", default=True) or \
            (_on_cuda() and (itemsize != 2
                             or not settings.flag("METILE_DOT_FRAGMENTS", default=True))):
        return None
    return max(1, block_m // 16)


def rows_tiles(d: int, itemsize: int) -> list[dict]:
    """attention_decode's key blocks that fit threadgroup memory: on CUDA the 8-key
    block first (two warps for a 128-wide head, many programs over many splits), elsewhere
    largest first (not measured).  H200, 1x32x4096x128 float16, ncu kernel time (s20):
    8 keys on 2 warps over 32 splits 22.2 us + 4.5 the combine, one 512-thread program of
    64 keys per (split, head) 27.9, MLX's 43.9 + 3.2 (32.6 in s19); a compiled call 40.0
    against 79.4 and MLX's 38.4."""
    run = 16 // itemsize if _on_cuda() else 4     # vectorize_rows' run on each backend
    blocks = (8, 16, 32, 64) if _on_cuda() else (64, 32, 16, 8)
    return [{"path": "decode_rows", "BLOCK_N": n} for n in blocks
            if rows_shared_bytes(n, _head_block(d), run) <= _shared_limit()]


# queries attention_decode takes first (each its own row, the keys read once per query)
ROWS_QUERIES = 4
# splits attention_combine_splits reads at once; more go through attention_combine's loop
COMBINE_SPLITS = 64
# warps of attention_combine_splits' programs: the plan's own count is a thread an element
# of its (splits, 32) block, 1024 threads and six barriers for 32 splits.  Four warps (H100,
# 8 attentions a compiled call, s134/s135): 1024 keys 18.4 -> 16.9 and 17.3 -> 16.0 us,
# 4096 keys 33.6 -> 33.1 and 33.4 -> 32.9 us (1/2 warps between).
COMBINE_WARPS = 4
# warps attention_decode's splits aim for: 32 splits of 32 heads on 2 warps.  H200 (s121,
# 1x32xLx128 float16, compiled chained calls): 4096 keys 35.0 us at 32 splits against 55.3
# at 8 and 36.8 at 64.  (H100 runs that read one cache again and again ranked 8 splits
# first, s117 and s124, at 3.3-3.95 TB/s - past the HBM, so partly from L2.  With eight
# caches a call, none read twice (s125, H100): 8 splits 0.65-0.73x of MLX's op, this rule
# 1.00-1.02x at 4096-32768 keys.)
ROWS_TARGET_WARPS = 2048
# and keys a split covers at most, up to 4x the warps: 16384 keys 83.1 us at 64 splits of
# 256 keys against 89.8 at 32 (H200, s121)
ROWS_SPLIT_KEYS = 256


def rows_warps(block_n: int, d: int) -> int:
    """attention_decode's warps: two runs of the (keys, head dim) block a thread, a count
    the block fills whole (the lanes of a row combine in place only then)."""
    return min(32, max(1, block_n * _head_block(d) // (16 * 32)))


def rows_split_count(rows: int, kv_len: int, block_n: int, warps: int) -> int:
    """Key splits for attention_decode: ROWS_TARGET_WARPS warps over the rows' programs,
    or splits of ROWS_SPLIT_KEYS keys where that is more (up to 4x the warps); at most
    COMBINE_SPLITS (merged in one read) and each split at least four key blocks."""
    most = max(1, math.ceil(kv_len / (4 * block_n)))
    per_split = max(1, rows * warps)
    want = max(math.ceil(ROWS_TARGET_WARPS / per_split),
               min(math.ceil(kv_len / ROWS_SPLIT_KEYS), math.ceil(4 * ROWS_TARGET_WARPS / per_split)))
    return max(1, min(most, want, COMBINE_SPLITS))


def split_count(batch: int, kv_heads: int, kv_len: int, block_n: int) -> int:
    """Key splits for the decode path: enough programs to fill the GPU, each at least
    two key blocks long."""
    most = max(1, math.ceil(kv_len / (2 * block_n)))
    return max(1, min(most, math.ceil(TARGET_PROGRAMS / max(1, batch * kv_heads))))


# -- the kernels --------------------------------------------------------------------------------

def _launch(q, k, v, mask, scale, config):
    """The metile kernels' forward output for already-promoted q, k, v."""
    from metile_kernels import attention as kernels

    batch, q_heads, q_len, d = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    kind = _mask_kind(mask)
    if kind in ("bool", "additive"):
        strides = _mask_strides(mask)
        # (a 0-d array would reach the kernel as a scalar argument: one element, all strides 0)
        mask_buffer = mask.reshape(1) if mask.ndim == 0 else mask
    else:
        # (no mask to read: q stands in for the buffer - a fresh array would be one more
        # node, and on CUDA one more fill kernel, in every call's graph)
        strides, mask_buffer = [0, 0, 0, 0], q
    # what the kernels read for k and v: a cache's buffers, or the arrays (kv_pad, kv_start 0)
    read_k, read_v, cache = _cache_buffers(k, v)
    cache = cache or (0, 0)
    if config.get("path") == "decode_rows":
        return _launch_rows(kernels, q, k, (read_k, read_v, *cache), mask_buffer, kind,
                            strides, float(scale) * LOG2E, config)
    common = dict(HEAD_DIM=d, BLOCK_D=_head_block(d), MASK=kind,
                  BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"])
    group = q_heads // kv_heads
    scale_log2 = float(scale) * LOG2E
    if config.get("path") != "decode":
        grid = kernels.forward_grid(q_len, q_heads, batch, config["BLOCK_M"])
        warps = config.get("num_warps") or forward_warps(config["BLOCK_M"], q.dtype.size)
        order = config.get("HEAD_GROUP", head_group(q_heads, kv_len, d, q.dtype.size, group)) \
            if kind == "causal" else 0
        return op_replay.launch(
            kernels.attention_forward, grid,
            (q, read_k, read_v, mask_buffer, mx.zeros(q.shape, q.dtype), q_len, kv_len, group,
             scale_log2, *strides, *cache),
            dict(common, POSITIVE_SCALE=scale_log2 > 0, HEAD_GROUP=order,
                 **({"num_warps": warps} if warps else {})))
    splits = config.get("SPLITS") or split_count(batch, kv_heads, kv_len, config["BLOCK_N"])
    chunk = kernels.split_chunk(kv_len, splits, config["BLOCK_N"])
    splits = math.ceil(kv_len / chunk)       # no split without keys
    rows = batch * q_heads * q_len
    # (a configuration may name the split kernel's warps; else the plan's own count)
    warps = {"num_warps": config["num_warps"]} if config.get("num_warps") else {}
    partial, stats = op_replay.launch(
        kernels.attention_split, kernels.split_grid(splits, kv_heads, batch),
        (q, read_k, read_v, mask_buffer, mx.zeros((splits, rows, d), mx.float32),
         mx.zeros((splits, rows, 2), mx.float32), q_len, kv_len, group, chunk, scale_log2,
         *strides, *cache), dict(common, **warps))
    return _combine(kernels, partial, stats, rows, splits, d, q.dtype, config, q.shape)


def _launch_rows(kernels, q, k, read, mask_buffer, kind, strides, scale_log2, config):
    """attention_decode (each query of each head its own row) over key splits, then the
    combine; `read` the k and v arrays it reads and their kv_pad, kv_start (_cache_buffers),
    k the keys as attended."""
    batch, q_heads, q_len, d = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    block_n = config["BLOCK_N"]
    rows = batch * q_heads * q_len
    # (1024 threads, the plan's own count for a 64x128 block, would leave runs of a
    # 32-key block unfilled)
    warps = config.get("num_warps") or rows_warps(block_n, d)
    if config.get("AHEAD", 1) not in (1, 2):
        raise _fail(ValueError, f"AHEAD (key blocks loaded ahead) must be 1 or 2, got "
                                f"{config['AHEAD']!r}")
    splits = config.get("SPLITS") or rows_split_count(rows, kv_len, block_n, warps)
    chunk = kernels.split_chunk(kv_len, splits, block_n)
    splits = math.ceil(kv_len / chunk)
    read_k, read_v, *cache = read
    partial, stats = op_replay.launch(
        kernels.attention_decode, kernels.decode_grid(splits, rows),
        (q, read_k, read_v, mask_buffer, mx.zeros((splits, rows, d), mx.float32),
         mx.zeros((splits, rows, 2), mx.float32), kv_len, q_len, q_heads, q_heads // kv_heads,
         chunk, scale_log2, rows, splits * rows, *strides, *cache),
        dict(HEAD_DIM=d, BLOCK_D=_head_block(d), BLOCK_N=block_n,
             # (the last query sees every key: one query's causal mask removes nothing)
             MASK="none" if kind == "causal" and q_len == 1 else kind, num_warps=warps,
             **({"AHEAD": config["AHEAD"]} if config.get("AHEAD", 1) != 1 else {})))
    return _combine(kernels, partial, stats, rows, splits, d, q.dtype, config, q.shape)


def _cache_view(x):
    """(buffer, pad, start) where `x` is an unevaluated slice x = buffer[:, :, start:start +
    L, :] of a (B, H, L + pad, D) buffer that is not known to be laid out otherwise than
    row-contiguous, as a KV cache allocated ahead hands attention its prefix (mlx_lm's
    caches do); else None.  The attention kernels read such a buffer in place: the launch
    would otherwise copy the prefix first, every key and value of every layer at every
    step, more bytes than the kernel reads.  (A buffer whose layout is known only once
    evaluated - a compiled call's argument - goes through the launch's contiguous(),
    which shares a row-contiguous buffer and copies any other.)"""
    found = _ext.slice_source(x)
    if found is None:
        return None
    buffer, start, end, steps = found
    if buffer.ndim != 4 or any(s != 1 for s in steps) or _ext.row_contiguity(buffer) is False:
        return None
    whole = all(start[a] == 0 and end[a] == buffer.shape[a] for a in (0, 1, 3))
    # (the kernels address a buffer with 32-bit offsets: a larger one than the launch takes
    # is read through the prefix's copy, as before)
    if not whole or buffer.size > MAX_BUFFER_ELEMENTS:
        return None
    return buffer, buffer.shape[2] - (end[2] - start[2]), start[2]


def _cache_buffers(k, v):
    """k and v as attention_decode reads them, and its (kv_pad, kv_start): the caches'
    buffers in place where both are such slices of one layout (_cache_view), else the
    arrays as given (the launch makes them row-contiguous)."""
    views = [_cache_view(x) for x in (k, v)]
    if None in views or views[0][1:] != views[1][1:]:
        return k, v, None
    (kb, pad, start), (vb, _, _) = views
    return kb, vb, (pad, start)


def _combine(kernels, partial, stats, rows, splits, d, dtype, config, shape):
    """The output (of `shape`: rows x d elements, row-major, which the kernels index flat -
    no reshape node after them) merged from the splits' partial outputs and statistics:
    every split of a row at once (attention_combine_splits: a (splits, 32) block of
    columns a program) where there are at most COMBINE_SPLITS, else attention_combine's
    loop over the splits; a configuration may name it (combine="loop"|"splits")."""
    out = mx.zeros(shape, dtype)
    how = config.get("combine") or ("splits" if splits <= COMBINE_SPLITS else "loop")
    if how not in ("splits", "loop"):
        raise _fail(ValueError, f"combine must be 'splits' or 'loop', got {how!r}")
    if how == "splits" and splits > COMBINE_SPLITS:
        raise _fail(ValueError, f"combine='splits' merges at most {COMBINE_SPLITS} splits, "
                                f"got {splits}; use combine='loop'")
    # (a configuration may name the combine's warps; COMBINE_WARPS for the splits' form, the
    # plan's own count for the loop's)
    warps = config.get("combine_warps", COMBINE_WARPS if how == "splits" else None)
    if warps is not None and (not isinstance(warps, int) or isinstance(warps, bool) or
                              warps < 1 or warps > 32 or warps & (warps - 1)):
        raise _fail(ValueError, f"combine_warps must be a power of two from 1 to 32, got "
                                f"{warps!r}")
    options = {"num_warps": warps} if warps else {}
    if how == "splits":
        block_s = 1 << max(0, (splits - 1).bit_length())
        block_d = min(32, _head_block(d))
        return op_replay.launch(
            kernels.attention_combine_splits, kernels.combine_grid(rows, d, block_d),
            (partial, stats, out, rows, splits),
            dict(HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=block_s, **options))
    return op_replay.launch(kernels.attention_combine, (math.ceil(rows / 8),),
                            (partial, stats, out, rows, splits),
                            dict(HEAD_DIM=d, BLOCK_D=_head_block(d), BLOCK_R=8, **options))


def reference(q, k, v, scale, mask):
    """softmax(scale q kᵀ + mask) v as MLX ops in float32 (the vjp's forward), with MLX's
    mask conventions: removed keys score float32's lowest finite value."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = mx.repeat(k, group, axis=1), mx.repeat(v, group, axis=1)
    s = (q * scale) @ k.swapaxes(-1, -2)
    lowest = mx.array(mx.finfo(mx.float32).min, mx.float32)
    if isinstance(mask, str):
        lq, lk = q.shape[2], k.shape[2]
        keep = mx.arange(lk)[None, :] <= mx.arange(lq)[:, None] + (lk - lq)
        s = mx.where(keep, s, lowest)
    elif mask is not None and mask.dtype == mx.bool_:
        s = mx.where(mask, s, lowest)
    elif mask is not None:
        s = s + mask.astype(mx.float32)
    return mx.softmax(s, axis=-1, precise=True) @ v


def _differentiable(kind: str, scale: float, config: dict):
    """A custom_function over (q, k, v[, mask]) whose forward is the metile kernels."""
    def unpack(primals):
        q, k, v = primals[:3]
        return q, k, v, (primals[3] if kind in ("bool", "additive") else
                         "causal" if kind == "causal" else None)

    @op_replay.op_function
    def f(*primals):
        q, k, v, mask = unpack(primals)
        return _launch(q, k, v, mask, scale, config)

    def composite(*primals):
        q, k, v, mask = unpack(primals)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    op_replay.composite_rules(f, composite)   # mx.jvp and mx.vmap through MLX's op
    f.vjp(_backward(kind, scale))
    return f


def _backward(kind: str, scale: float):
    """The op's vjp over (q, k, v[, mask]): MLX's differentiation of `reference` in
    float32 (a boolean mask gets zeros)."""
    def f_vjp(primals, cotangent, output):
        q, k, v = primals[:3]
        mask = primals[3] if kind in ("bool", "additive") else \
            "causal" if kind == "causal" else None
        f32 = [x.astype(mx.float32) for x in (q, k, v)]
        if kind == "additive":
            _, grads = mx.vjp(lambda a, b, c, m: reference(a, b, c, scale, m),
                              [*f32, mask.astype(mx.float32)], [cotangent.astype(mx.float32)])
        else:
            _, grads = mx.vjp(lambda a, b, c: reference(a, b, c, scale, mask), f32,
                              [cotangent.astype(mx.float32)])
        out = tuple(g.astype(x.dtype) for g, x in zip(grads, primals))
        if kind == "bool":
            out = out + (mx.zeros_like(primals[3]),)
        return out
    return f_vjp


# -- routing ------------------------------------------------------------------------------------

def configs(q, k, v, kind: str = "none") -> list[dict]:
    """The kernel configurations `auto` measures against MLX for these shapes and mask
    kind (_mask_kind)."""
    decode = is_decode(q, k)
    # up to ROWS_QUERIES queries: the product-free kernel first (one query of 32 heads
    # over 4096 keys: 1.11x of MLX on the H200 where the split kernel's general products
    # gave 0.23x), the split kernel as the other candidate where its tiles fit; not where
    # a causal query sees no key (q_len > kv_len: MLX averages every value there)
    few = decode and q.shape[2] <= ROWS_QUERIES and not (kind == "causal"
                                                         and q.shape[2] > k.shape[2])
    # (the smallest and the largest key block: on the H200 with a softmax per key slot the
    # two were within ~15% of each other either way between runs, s40/s42)
    blocks = rows_tiles(q.shape[-1], _result_dtype(q, k, v).size) if few else []
    one_query = blocks[:1] + blocks[1:][-1:]
    try:
        split = tiles(q.shape[-1], _result_dtype(q, k, v).size, decode,
                      (q.shape[1] // k.shape[1]) * q.shape[2] if decode else DECODE_ROWS)
    except ValueError:
        if not one_query:
            raise
        split = []
    return one_query + split[:1] if one_query else split[:2]


def _bucket(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=1)
def _fingerprints() -> dict:
    from metile_kernels import attention as kernels

    from .runtime import cache
    return {"compiler": cache.compiler_fingerprint(),
            "kernel": "".join(cache.source_fingerprint(f.fn) for f in (
                kernels.attention_forward, kernels.attention_split, kernels.attention_decode,
                kernels.attention_combine, kernels.attention_combine_splits)),
            # how the decode launches split the keys: a decision measured under another
            # rule (s33's 8 splits ran 1.5x slower on the H200) is not this one's
            "splits": [ROWS_TARGET_WARPS, ROWS_SPLIT_KEYS, COMBINE_SPLITS, ROWS_QUERIES,
                       COMBINE_WARPS]}


def _signature(q, k, kind, cfgs) -> tuple[str, dict]:
    device_type = "gpu" if mx.default_device().type == mx.gpu else "cpu"
    env = routing.environment()
    names = tuple(_config_name(c) for c in cfgs)
    memo = ("scaled_dot_product_attention", q.dtype, q.shape[0], q.shape[1], k.shape[1],
            _bucket(q.shape[2]), _bucket(k.shape[2]), q.shape[3], kind, names, device_type, env)
    return routing.signature_key(memo, lambda: {
        "op": "scaled_dot_product_attention",
        "dtype": dtype_name(q.dtype), "batch": q.shape[0],
        "q_heads": q.shape[1], "kv_heads": k.shape[1], "q_bucket": _bucket(q.shape[2]),
        "kv_bucket": _bucket(k.shape[2]), "head_dim": q.shape[3], "mask": kind,
        "device": _device_description(device_type),
        "candidates": [routing.REFERENCE, *names],
        "environment": dict(env), "toolchain": routing.tuning.toolchain(),
        **_fingerprints()})


def _cost_model() -> routing.Decision:
    return cost_model(CPU_REASON + "; MLX's op",
                      "nothing measured on this machine says the kernels are faster; MLX's op")


def _route(q, k, v, scale, mask, backend, *, measure=None, force=False):
    """(config or None for MLX's op, routing.Decision)."""
    check_backend("metile.ops.scaled_dot_product_attention", backend)
    if backend == "mlx":
        return None, routing.Decision("mlx", "requested", "backend='mlx' requested")
    # what MLX's op takes and these kernels do not: backend="metile" says so, "auto" runs
    # MLX's op (a model with 256-wide heads must not break on the default path)
    try:
        if v.shape[-1] != k.shape[-1]:
            raise _fail(ValueError, f"the kernels take one head dimension for q, k and v; v's "
                                    f"is {v.shape[-1]}, q and k's {k.shape[-1]}")
        cfgs = configs(q, k, v, _mask_kind(mask))
    except ValueError as e:
        if backend == "metile":
            raise
        return None, routing.Decision("mlx", "unsupported", str(e))
    if backend == "metile":
        return cfgs[0], routing.Decision(_config_name(cfgs[0]), "requested",
                                         "backend='metile' requested")
    kind = _mask_kind(mask)
    key, parts = _signature(q, k, kind, cfgs)
    decision = routing.recorded(key, lambda: map(_config_name, cfgs), force)
    if decision is None:
        measure = routing.measuring_requested() if measure is None else measure
        arrays = (q, k, v) + ((mask,) if kind in ("bool", "additive") else ())
        if measure and routing.can_evaluate(*arrays):
            keys = mx.random.split(mx.random.key(0), 3)
            operands = [mx.random.normal(x.shape, key=kk).astype(x.dtype)
                        for x, kk in zip((q, k, v), keys)]
            extra = (mask,) if kind in ("bool", "additive") else ()
            ref = routing.Candidate(routing.REFERENCE, lambda a, b, c, *m: mx.fast.
                                    scaled_dot_product_attention(a, b, c, scale=scale,
                                                                 mask=m[0] if m else mask))
            cands = [ref] + [routing.Candidate(_config_name(c), lambda a, b, c_, *m, c=c:
                                               _run(a, b, c_, scale, m[0] if m else mask, c))
                             for c in cfgs]
            decision = routing.measure(key, parts, cands, operands + list(extra), _validate,
                                       budget_s=routing.budget(), clock=routing.scope_clock())
        else:
            decision = _cost_model()
    if decision.winner == routing.REFERENCE:
        return None, decision
    by_name = {_config_name(c): c for c in cfgs}
    if decision.winner not in by_name:
        return None, _cost_model()
    return by_name[decision.winner], decision


def _run(q, k, v, scale, mask, config):
    dtype = _result_dtype(q, k, v)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    kind = _mask_kind(mask)
    f = _differentiable_for(kind, float(scale), tuple(sorted(config.items())))
    return f(q, k, v, mask) if kind in ("bool", "additive") else f(q, k, v)


@functools.lru_cache(maxsize=256)
def _differentiable_for(kind: str, scale: float, config: tuple):
    """_differentiable, one custom function a (mask kind, scale, configuration): a decode
    loop calls the op with the same ones every token."""
    return _differentiable(kind, scale, dict(config))


# -- public -------------------------------------------------------------------------------------

def _too_large(q, k, mask) -> bool:
    # the kernels index with int32 element offsets
    arrays = (q, k) + ((mask,) if isinstance(mask, mx.array) else ())
    return any(x.size >= 2**31 for x in arrays)


@op_replay.entry(("q", "k", "v"), ("scale", "mask", "sinks", "force_fused", "backend", "stream"))
def scaled_dot_product_attention(q, k, v, *, scale, mask=None, sinks=None,
                                 force_fused: bool = False, backend: str = "auto", stream=None):
    """mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask) on metile
    kernels (see the module docstring); differentiable in q, k, v (and an additive mask).
    Empty inputs, and with backend="auto" inputs of 2**31 elements or more, run MLX's op;
    so do attention sinks (`sinks`, one logit a query head: the kernels have none), which
    backend="metile" refuses by name.  `force_fused` and `stream` as MLX's op takes them:
    the first is passed to MLX's op wherever that runs (metile's kernels are fused), the
    second makes the call run with that stream or device as the default
    (op_routing.on_stream)."""
    if stream is not None:
        return on_stream("scaled_dot_product_attention", stream,
                         lambda: scaled_dot_product_attention(
                             q, k, v, scale=scale, mask=mask, sinks=sinks,
                             force_fused=force_fused, backend=backend))
    if type(force_fused) is not bool:
        raise _fail(TypeError, f"force_fused must be a bool, got {type_name(force_fused)} "
                               f"{force_fused!r}")
    # (a repeated call replays, keyed by the options as given: op_replay.py; a mask or sinks
    # array, or a scale that is not a plain number, keys none)
    key = op_replay.key("scaled_dot_product_attention",
                        (scale, mask, sinks, force_fused, backend, None), q, k, v)
    why, scale = _before_routing(q, k, v, scale, mask, sinks, backend)
    # (each path is recorded once it has run without an error)
    if why is not None:
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask,
                                                   sinks=sinks, force_fused=force_fused)
        op_replay.remember_composite(key, _mlx_call(scale, mask, force_fused),
                                     routing.Decision(routing.REFERENCE, "unsupported", why))
        return out
    config, decision = _route(q, k, v, scale, mask, backend)
    if config is None:
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask,
                                                   force_fused=force_fused)
        op_replay.remember_composite(key, _mlx_call(scale, mask, force_fused), decision)
        return out
    with op_replay.recording() as launches:
        out = _run(q, k, v, scale, mask, config)
    # (a decode call's split kernel and its merge replay as one: op_replay.remember; a
    # call whose launches cannot - q, k, v of mixed dtypes cast first - replays from Python,
    # skipping the checks and routing)
    if not op_replay.remember(key, launches, (0, 1, 2), (q, k, v),
                              _backward(_mask_kind(mask), float(scale)), [None] * 3, None,
                              _mlx_call(scale, mask, False)):
        op_replay.remember_composite(key, lambda q, k, v: _run(q, k, v, scale, mask, config),
                                     decision)
    return out


def _mlx_call(scale, mask, force_fused):
    """MLX's op on (q, k, v) with these options (a call without sinks: one with a sinks
    array has no replay key)."""
    return lambda q, k, v: mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask=mask, force_fused=force_fused)


def _before_routing(q, k, v, scale, mask, sinks, backend):
    """(why MLX's op takes the call before any routing, or None; the scale): what the op
    and explain_attention decide alike (explain reported a metile kernel for calls that ran
    MLX's op).  Refuses what backend="metile" cannot take."""
    if mlx_takes_it(backend, q, k, v) or mlx_takes_values(
            backend, (scale, is_real(plain_number(scale)))):
        check_backend("metile.ops.scaled_dot_product_attention", backend)
        return ("MLX's op: an argument the kernels do not take (a dtype other than float32, "
                "float16, bfloat16, or a scale that is not a number)", plain_number(scale))
    scale = _check(q, k, v, scale, mask)
    if sinks is not None:
        check_backend("metile.ops.scaled_dot_product_attention", backend)
        if backend == "metile":
            raise _fail(ValueError, "sinks: the metile attention kernels have no attention "
                                    "sinks; backend='auto' or 'mlx' runs MLX's op with them")
        return "MLX's op: attention sinks (the kernels have none)", scale
    if _too_large(q, k, mask):
        if backend == "metile":
            raise _fail(ValueError, f"the kernels index with int32 offsets; q {tuple(q.shape)}, "
                                    f"k {tuple(k.shape)} or the mask has 2**31 elements or more")
        check_backend("metile.ops.scaled_dot_product_attention", backend)
        return "MLX's op: 2**31 elements or more (the kernels index with int32)", scale
    if 0 in q.shape or k.shape[2] == 0:
        check_backend("metile.ops.scaled_dot_product_attention", backend)
        return "MLX's op: an empty input (nothing for a kernel to compute)", scale
    return None, scale


def tune_attention(q, k, v, *, scale, mask=None, budget_s=None, force=False, clock=None) -> dict:
    """Measure (or, unless `force`, read the recorded) routing decision for this call."""
    scale = _check(q, k, v, scale, mask)
    with routing.tuning_scope(budget_s, clock):
        _, decision = _route(q, k, v, scale, mask, "auto", measure=True, force=force)
    return decision.to_dict()


def explain_attention(q, k, v, *, scale, mask=None, sinks=None, backend: str = "auto") -> str:
    """Which path a call takes and why (never measures), as JSON text like the other ops'
    explain_* (it returned a dict): "path", "config", "route"."""
    return json.dumps(_explained(q, k, v, scale, mask, sinks, backend), indent=2)


def _explained(q, k, v, scale, mask, sinks, backend) -> dict:
    why, scale = _before_routing(q, k, v, scale, mask, sinks, backend)
    if why is not None:
        return {"path": "mlx", "config": None,
                "route": routing.Decision(routing.REFERENCE, "unsupported", why).to_dict()}
    config, decision = _route(q, k, v, scale, mask, backend, measure=False)
    out = {"path": "mlx" if config is None else "metile", "config": config,
           "route": decision.to_dict()}
    if config is not None:
        # how the kernels get k and v: a cache's buffer read in place, or the arrays (a
        # launch copies one it cannot prove row-contiguous)
        cache = _cache_buffers(k, v)[2]
        out["kv"] = ({"read": "cache buffer in place", "kv_pad": cache[0], "kv_start": cache[1]}
                     if cache else {"read": "as given", "copied_unless_row_contiguous": True})
    return out
