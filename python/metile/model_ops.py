"""Model ops with MLX's own signatures, written as metile kernels: drop-ins for
`mx.fast.rms_norm`, `mx.fast.layer_norm`, `mx.softmax` and `mx.fast.rope`, plus the
fused residual add + RMS norm of a transformer block.

    y = metile.ops.rms_norm(x, weight, 1e-5)
    h, y = metile.ops.add_rms_norm(x, residual, weight, 1e-5)   # h = x + residual, y = rms_norm(h)
    p = metile.ops.softmax(scores, axis=-1)
    q = metile.ops.rope(q, 64, traditional=False, base=10000.0, scale=1.0, offset=cache_len)

Kernels: kernels/metile_kernels/norms.py, softmax.py and rope.py (one program per
row with the row in registers; rope elementwise).  x may have any leading
dimensions: they flatten into rows (a free reshape of a row-contiguous array; a
strided view is copied to row-major once, as the kernel call would copy it).
softmax reduces over any axis or axes: they are moved last by MLX (a transpose)
and back.  Dtypes: float32, float16, bfloat16; statistics in float32; the result
has MLX's dtype (x's promoted with weight's and bias's).  Rows longer than
MAX_COLUMNS do not fit the single-pass kernels' registers: `auto` runs MLX's op
for them and `backend="metile"` refuses them by name.

Which path runs (`backend=`) follows ops.py: "mlx" MLX's op, "metile" the
kernel, "auto" (the default) the kernel only where a recorded measurement on this
machine found it faster (runtime/routing.py), keyed by op, dtypes, rows rounded up
to a power of two, row length and the op's flags; without a recorded decision
MLX's op runs.  Measuring is explicit: `with metile.ops.tuning():` or
METILE_OPS_TUNE=1, on eager calls.  The candidates are the kernel at a few
thread counts (`configs`).

Differentiable as one node carrying each op's vjp (`runtime/op_function.OpFunction`, as
`mx.custom_function` would with two more nodes): the backward passes are MLX ops in
float32 (the closed forms of each op's vjp), except rope's, which is the rope
kernel with the angle negated (the inverse rotation); rope's `freqs` get MLX's op's
gradient for them, integer offsets none.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .errors import AxisError
from . import op_replay
from .runtime import routing
from .op_routing import (
    FLOAT_DTYPES as _DTYPES,
    rows as _rows,
    mlx_takes_it,
    mlx_takes_values,
    type_name,
    plain_number,
    plain_integer,
    check_backend,
    config_name as _config_name,
    is_integer,
    is_real,
    m_bucket,
    on_stream,
    device_description as _device_description,
    validate as _validate,
    measurement_operands as _operands,
    CPU_REASON,
    cost_model,
    TUNING,
    dtype_name)

# The widest row the single-pass kernels hold in registers: 32 float32 values per
# thread at 1024 threads.
MAX_COLUMNS = 32768
# Flattened indices are int32 in the kernels.
MAX_ELEMENTS = 2**31 - 2**20


# -- argument checks ----------------------------------------------------------------------------

def _check_x(op: str, x, min_ndim: int = 1):
    # (a wrong dtype is a ValueError, as MLX's own ops raise it: drop-in `except` clauses)
    if not isinstance(x, mx.array):
        raise TypeError(f"[metile.ops.{op}] x must be an mx.array, got {type(x).__name__}")
    if x.ndim < min_ndim:
        raise ValueError(f"[metile.ops.{op}] x must have at least {min_ndim} dimension"
                         f"{'s' if min_ndim > 1 else ''}, got shape {tuple(x.shape)}")
    if not mx.issubdtype(x.dtype, mx.floating):
        raise ValueError(f"[metile.ops.{op}] x has dtype {x.dtype}; expected a floating type")


def _check_vector(op: str, name: str, v, x):
    if v is None:
        return
    if not isinstance(v, mx.array):
        raise TypeError(f"[metile.ops.{op}] {name} must be an mx.array or None, got "
                        f"{type(v).__name__}")
    if tuple(v.shape) != (x.shape[-1],):
        raise ValueError(f"[metile.ops.{op}] {name} has shape {tuple(v.shape)}; expected "
                         f"({x.shape[-1]},), the size of x's last axis")
    if not mx.issubdtype(v.dtype, mx.floating):
        raise ValueError(f"[metile.ops.{op}] {name} has dtype {v.dtype}; expected a floating type")


def _eps_taken(eps) -> bool:
    """Whether the kernels take `eps` (MLX's op takes any number; see _check_eps)."""
    eps = plain_number(eps)
    return is_real(eps) and math.isfinite(eps)


def _check_eps(op: str, eps) -> float:
    # (is_real: MLX's ops take NumPy scalars too, an eps read from a config or checkpoint,
    # and one-element arrays)
    eps = plain_number(eps)
    if not _eps_taken(eps):
        raise TypeError(f"[metile.ops.{op}] eps must be a finite number, got {eps!r}")
    return float(eps)


def _kernel_refusal(rows: int, columns: int, *arrays) -> str | None:
    """Why the kernels cannot take this call (None if they can)."""
    for a in arrays:
        if a is not None and a.dtype not in _DTYPES:
            return f"dtype {a.dtype} (the kernels take float32, float16, bfloat16)"
    if columns > MAX_COLUMNS:
        return (f"rows of {columns} elements are longer than the single-pass kernels hold in "
                f"registers ({MAX_COLUMNS})")
    if rows * columns > MAX_ELEMENTS:
        return f"{rows * columns} elements pass the kernels' int32 indices"
    return None


# -- kernel configurations ----------------------------------------------------------------------

def _block(columns: int) -> int:
    return 1 << max(columns - 1, 0).bit_length()


def _row_warps(block: int) -> int:
    """Threads for a one-row program: about 8 elements per thread (16 bytes of a
    16-bit row), 1 to 32 SIMD-groups."""
    return max(1, min(32, block // 256))


# Rows of up to this many columns (a power of two) run several a program: a 16-bit row
# then lies on at most 32 lanes in runs of 8, where its statistics combine by shuffles
NARROW = 256


def configs(op: str, columns: int) -> list[dict]:
    """The kernel configurations `auto` measures against MLX: the default first."""
    block = _block(columns)
    if op == "rope":
        rows = max(1, 4096 // block)
        warps = max(1, min(16, rows * block // 256))
        out = [{"ROWS": rows, "num_warps": warps}, {"ROWS": rows, "num_warps": max(1, warps // 2)},
               {"ROWS": max(1, rows // 4), "num_warps": max(1, warps // 4)}]
    elif block <= NARROW:
        # Several rows a program (a per-head norm's 128 columns): one row a warp or less
        # left 131072x128 float16 at 0.42 TB/s on the H200 (MLX: 0.45).  About 8 elements
        # a thread; each row's statistics are summed on the lanes that hold it.
        out = [{"ROWS": max(1, n // block), "num_warps": max(1, n // 256)}
               for n in (2048, 4096, 1024)] + [{"num_warps": _row_warps(block)}]
    else:
        # Fewer, fuller threads too (up to 64 elements each): on the H200 the 1024-thread
        # programs of the default left the rows at 0.4-0.7x of MLX's bandwidth
        # (benchmarks/results/h200-model-ops-float16.json), two programs per SM in flight.
        w = _row_warps(block)
        if op == "softmax" and block >= 4096:
            # 32 elements a thread: fewer programs' worth of reductions for softmax's two
            # (H200, 16-bit rows with held exponentials, s39: 4096 columns 1.66x MLX on 4
            # warps against 1.40 on 16; 8192 columns 1.80-1.83x on 8 or 4 against 0.98 on 32)
            w = max(1, w // 4)
        out = [{"num_warps": w}] + [{"num_warps": v} for v in (w // 2, w * 2, w // 4, w // 8)
                                    if 1 <= v <= 32 and v * 32 <= max(block, 32)
                                    and block // (v * 32) <= 64]
    unique = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique


def _frozen(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


# -- launches -----------------------------------------------------------------------------------

def _result_dtype(*arrays):
    d = None
    for a in arrays:
        if a is not None:
            d = a.dtype if d is None else mx.result_type(d, a.dtype)
    return d


def _fit_rows(cfg: dict, rows: int, columns: int) -> dict:
    """A several-rows configuration for a call of fewer rows (a decoding step): a tile of
    the call's own row count, its warps cut to match."""
    tile_rows = cfg.get("ROWS", 1)
    if tile_rows <= 1 or rows >= tile_rows:
        return cfg
    tile_rows = m_bucket(rows)
    return {**cfg, "ROWS": tile_rows,
            "num_warps": max(1, min(cfg["num_warps"], tile_rows * _block(columns) // 256))}


def _launch_rms(x2, w, eps, cfg):
    from metile_kernels import norms
    rows, columns = x2.shape
    cfg = _fit_rows(cfg, rows, columns)
    out = mx.zeros((rows, columns), _result_dtype(x2, w))
    return op_replay.launch(norms.rms_norm, norms.grid(rows, cfg.get("ROWS", 1)), (
        x2, x2 if w is None else w, out, rows, columns, eps), dict(
        BLOCK=_block(columns), HAS_WEIGHT=w is not None, **cfg))


def _launch_layer(x2, w, b, eps, cfg):
    from metile_kernels import norms
    rows, columns = x2.shape
    cfg = _fit_rows(cfg, rows, columns)
    # MLX's rule: without a weight the output keeps x's dtype, whatever the bias's
    out = mx.zeros((rows, columns), x2.dtype if w is None else _result_dtype(x2, w, b))
    return op_replay.launch(norms.layer_norm, norms.grid(rows, cfg.get("ROWS", 1)), (
        x2, x2 if w is None else w, x2 if b is None else b, out, rows, columns, eps), dict(
        BLOCK=_block(columns), HAS_WEIGHT=w is not None, HAS_BIAS=b is not None, **cfg))


def _launch_add_rms(x2, r2, w, eps, cfg):
    from metile_kernels import norms
    rows, columns = x2.shape
    cfg = _fit_rows(cfg, rows, columns)
    sum_dtype = _result_dtype(x2, r2)
    s, y = norms.add_rms_norm[norms.grid(rows, cfg.get("ROWS", 1))](
        x2, r2, x2 if w is None else w, mx.zeros((rows, columns), sum_dtype),
        mx.zeros((rows, columns), _result_dtype(x2, r2, w)), rows, columns, eps,
        BLOCK=_block(columns), HAS_WEIGHT=w is not None, **cfg)
    return s, y


def _launch_softmax(x2, cfg, hold):
    from metile_kernels import softmax as kernels
    rows, columns = x2.shape
    cfg = _fit_rows(cfg, rows, columns)
    return op_replay.launch(kernels.softmax, kernels.grid(rows, cfg.get("ROWS", 1)), (
        x2, mx.zeros((rows, columns), x2.dtype), rows, columns),
        dict(BLOCK=_block(columns), HOLD=hold, **cfg))


@dataclass(frozen=True)
class _Rope:
    """rope's static arguments (everything but the arrays)."""
    dims: int
    traditional: bool
    base: float | None
    scale: float
    offset: int | None        # None: the offset is an array operand
    offset_kind: str          # "scalar", "array" or "per_batch"
    seq: int
    per_batch: int


def _launch_rope(x2, spec: _Rope, offset_array, freqs, cfg):
    from metile_kernels import rope as kernels
    rows, columns = x2.shape
    cfg = dict(_fit_rows(cfg, rows, columns))
    tile_rows = cfg.pop("ROWS")
    placeholder = offset_array if offset_array is not None else x2
    return kernels.rope[kernels.grid(rows, tile_rows)](
        x2, placeholder, x2 if freqs is None else freqs, mx.zeros((rows, columns), x2.dtype),
        rows, spec.seq, spec.per_batch, columns, 0 if spec.offset is None else spec.offset,
        float(spec.scale),
        0.0 if spec.base is None else math.log2(spec.base),
        DIMS=spec.dims, BLOCK=_block(columns), ROWS=tile_rows, TRADITIONAL=spec.traditional,
        OFFSET=spec.offset_kind, FREQS=freqs is not None, **cfg)


# -- differentiable kernels ---------------------------------------------------------------------

def _f32(a):
    return a.astype(mx.float32)


def _primals(primals) -> tuple:
    # a custom_function called with one array gives its vjp that array, not a 1-tuple
    return tuple(primals) if isinstance(primals, (tuple, list)) else (primals,)


def _rms_backward(x, w, g, eps):
    """(dx, dw) of y = x * rsqrt(mean(x^2) + eps) * w, float32; dw None without w."""
    r = mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps)
    gw = g if w is None else g * w
    dx = r * gw - x * (r ** 3) * mx.mean(gw * x, axis=-1, keepdims=True)
    dw = None if w is None else mx.sum(g * x * r, axis=0)
    return dx, dw


# Op functions kept per eps and configuration: bounded, as a sweep over eps values kept
# one per value (~1.5 KB each, never freed).
_FN_CACHE = 256


@functools.lru_cache(maxsize=_FN_CACHE)
def _rms_fn(eps: float, has_weight: bool, cfg: tuple):
    @op_replay.op_function
    def f(*arrays):
        return _launch_rms(arrays[0], arrays[1] if has_weight else None, eps, dict(cfg))

    f.vjp(_rms_vjp(eps, has_weight))
    op_replay.composite_rules(f, _rms_composite(eps, has_weight))
    return f


def _rms_composite(eps: float, has_weight: bool):
    """mx.fast.rms_norm of (x[, weight]): the MLX route, the kernel's vmap rule, replays'."""
    return lambda x2, *w: mx.fast.rms_norm(x2, w[0] if has_weight else None, eps)


@functools.lru_cache(maxsize=_FN_CACHE)
def _rms_vjp(eps: float, has_weight: bool):
    """_rms_fn's backward (also its replays': op_replay.py)."""

    def f_vjp(primals, cotangent, output):
        primals = _primals(primals)
        x, w = primals[0], (primals[1] if has_weight else None)
        dx, dw = _rms_backward(_f32(x), None if w is None else _f32(w), _f32(cotangent), eps)
        return (dx.astype(x.dtype),) + (() if w is None else (dw.astype(w.dtype),))
    return f_vjp


@functools.lru_cache(maxsize=_FN_CACHE)
def _layer_fn(eps: float, has_weight: bool, has_bias: bool, cfg: tuple):
    @op_replay.op_function
    def f(*arrays):
        rest = list(arrays[1:])
        w = rest.pop(0) if has_weight else None
        b = rest.pop(0) if has_bias else None
        return _launch_layer(arrays[0], w, b, eps, dict(cfg))

    f.vjp(_layer_vjp(eps, has_weight, has_bias))
    op_replay.composite_rules(f, _layer_composite(eps, has_weight, has_bias))
    return f


def _layer_composite(eps: float, has_weight: bool, has_bias: bool):
    """mx.fast.layer_norm of (x[, weight][, bias]), as _rms_composite."""
    def composite(x2, *params):
        rest = list(params)
        w = rest.pop(0) if has_weight else None
        return mx.fast.layer_norm(x2, w, rest.pop(0) if has_bias else None, eps)
    return composite


@functools.lru_cache(maxsize=_FN_CACHE)
def _layer_vjp(eps: float, has_weight: bool, has_bias: bool):
    """_layer_fn's backward (also its replays')."""

    def f_vjp(primals, cotangent, output):
        primals = _primals(primals)
        rest = list(primals[1:])
        w = rest.pop(0) if has_weight else None
        b = rest.pop(0) if has_bias else None
        x, g = _f32(primals[0]), _f32(cotangent)
        centred = x - mx.mean(x, axis=-1, keepdims=True)
        r = mx.rsqrt(mx.mean(centred * centred, axis=-1, keepdims=True) + eps)
        xhat = centred * r
        gw = g if w is None else g * _f32(w)
        dx = r * (gw - mx.mean(gw, axis=-1, keepdims=True)
                  - xhat * mx.mean(gw * xhat, axis=-1, keepdims=True))
        grads = [dx.astype(primals[0].dtype)]
        if w is not None:
            grads.append(mx.sum(g * xhat, axis=0).astype(w.dtype))
        if b is not None:
            grads.append(mx.sum(g, axis=0).astype(b.dtype))
        return tuple(grads)
    return f_vjp


@functools.lru_cache(maxsize=_FN_CACHE)
def _add_rms_fn(eps: float, has_weight: bool, cfg: tuple):
    @op_replay.op_function
    def f(*arrays):
        return _launch_add_rms(arrays[0], arrays[1], arrays[2] if has_weight else None, eps,
                               dict(cfg))

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        x, res = primals[0], primals[1]
        w = primals[2] if has_weight else None
        g_sum, g_norm = cotangents
        s = _f32(outputs[0])   # the rounded sum the kernel normalised
        g = _f32(g_norm)
        # A row whose normalised cotangent is all zero (the loss uses only the sum) adds
        # nothing: with eps=0 and a zero row its rsqrt is inf and 0 * inf made the sum's
        # gradient NaN, where MLX's autodiff of the composite never visits rms_norm.
        quiet = mx.all(g == 0, axis=-1, keepdims=True)
        dx, dw = _rms_backward(mx.where(quiet, 1.0, s), None if w is None else _f32(w), g, eps)
        total = mx.where(quiet, 0.0, dx) + _f32(g_sum)
        return (total.astype(x.dtype), total.astype(res.dtype)) + \
            (() if w is None else (dw.astype(w.dtype),))

    def composite(x, res, *w):
        total = x + res
        return total, mx.fast.rms_norm(total, w[0] if has_weight else None, eps)

    op_replay.composite_rules(f, composite)
    return f


@functools.lru_cache(maxsize=_FN_CACHE)
def _softmax_fn(cfg: tuple, hold: bool):
    @op_replay.op_function
    def f(x2):
        return _launch_softmax(x2, dict(cfg), hold)

    f.vjp(_softmax_vjp)
    op_replay.composite_rules(f, _softmax_composite)
    return f


def _softmax_composite(x2):
    # (the kernel computes in float32; with `precise` False it rounds the exponentials once
    # more, within 1.5 units in the last place)
    return mx.softmax(x2, axis=-1, precise=True)


def _softmax_vjp(primals, cotangent, output):
    """_softmax_fn's backward (also its replays')."""
    (x2,) = _primals(primals)
    y = mx.softmax(_f32(x2), axis=-1)
    g = _f32(cotangent)
    return (y * (g - mx.sum(g * y, axis=-1, keepdims=True))).astype(x2.dtype)


def _freqs_grad_device():
    """Where MLX's rope can differentiate its freqs: its CUDA backend's RoPE::vjp refuses
    them, its CPU (and Metal) one takes them; CUDA arrays are readable from the CPU stream."""
    gpu = mx.default_device().type == mx.gpu
    return mx.cpu if gpu and mx.cuda.is_available() else mx.default_device()


# bounded: an int offset is part of the spec, and a decoding loop moves it every step
@functools.lru_cache(maxsize=512)
def _rope_fn(spec: _Rope, has_offset_array: bool, has_freqs: bool, cfg: tuple):
    def unpack(arrays):
        rest = list(arrays[1:])
        offset = rest.pop(0) if has_offset_array else None
        return arrays[0], offset, (rest.pop(0) if has_freqs else None)

    @op_replay.op_function
    def f(*arrays):
        x2, offset, freqs = unpack(arrays)
        return _launch_rope(x2, spec, offset, freqs, dict(cfg))

    def composite(*arrays):
        # MLX's op on one call's rows: (batch, heads, T, D), the heads being every axis
        # between the batch and T (rope treats them alike), offsets per batch entry
        x2, offset, freqs = unpack(arrays)
        x4 = x2.reshape(x2.shape[0] // spec.per_batch, spec.per_batch // spec.seq, spec.seq,
                        x2.shape[1])
        return mx.fast.rope(x4, spec.dims, traditional=spec.traditional, base=spec.base,
                            scale=spec.scale, freqs=freqs,
                            offset=spec.offset if offset is None else offset).reshape(x2.shape)

    # mx.vmap and mx.jvp through that composite (the kernel has neither rule)
    op_replay.composite_rules(f, composite)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        primals = _primals(primals)
        x2, offset, freqs = unpack(primals)
        # a rotation's transpose is the rotation by the negated angle: the op of the
        # negated scale, itself differentiable (a second-order gradient goes through it)
        inverse = _rope_fn(dataclasses.replace(spec, scale=-spec.scale), has_offset_array,
                           has_freqs, cfg)
        dx = inverse(cotangent.astype(x2.dtype), *primals[1:])
        grads = [mx.zeros_like(a) for a in primals[1:]]
        if has_freqs:
            # the angle is position / freqs[i]: its gradient through MLX's op (the composite),
            # on the CPU stream under MLX's CUDA backend, whose RoPE::vjp refuses freqs
            # ("vjp for offset or frequencies not supported", MLX 0.32.4; H200, s108)
            rest = list(primals[1:-1])
            with mx.stream(_freqs_grad_device()):
                _, (dfreqs,) = mx.vjp(lambda fr: composite(x2, *rest, fr), [freqs], [cotangent])
            grads[-1] = dfreqs.astype(freqs.dtype)
        return (dx, *grads)

    return f


# -- routing ------------------------------------------------------------------------------------

@dataclass
class _Route:
    path: str                    # "metile" or "mlx"
    config: dict | None
    decision: routing.Decision


@functools.lru_cache(maxsize=None)
def _kernel_fingerprint(op: str) -> str:
    from metile_kernels import norms, rope, softmax

    from .runtime import cache
    fn = {"rms_norm": norms.rms_norm, "layer_norm": norms.layer_norm,
          "add_rms_norm": norms.add_rms_norm, "softmax": softmax.softmax, "rope": rope.rope}[op]
    return cache.source_fingerprint(fn.fn)


@functools.lru_cache(maxsize=1)
def _compiler_fingerprint() -> str:
    from .runtime import cache
    return cache.compiler_fingerprint()


def _signature(op: str, dtypes: tuple, rows: int, columns: int, flags: tuple):
    device = "gpu" if mx.default_device().type == mx.gpu else "cpu"
    env = routing.environment()
    memo = (op, dtypes, m_bucket(rows), columns, flags, device, env)
    return routing.signature_key(memo, lambda: {
        "op": op, "dtypes": list(dtypes), "m_bucket": m_bucket(rows), "columns": columns,
        "flags": [list(f) for f in flags], "device": _device_description(device),
        "candidates": [routing.REFERENCE] + [_config_name(c) for c in configs(op, columns)],
        "environment": dict(env), "toolchain": routing.tuning.toolchain(),
        "compiler": _compiler_fingerprint(), "kernel": _kernel_fingerprint(op)})


def _cost_model(why: str | None = None) -> routing.Decision:
    if why is not None:
        return routing.Decision(routing.REFERENCE, "cost_model", f"MLX's op: the kernel cannot "
                                                                 f"take this call: {why}")
    return cost_model(CPU_REASON + "; MLX's CPU op is faster",
                      "MLX's op until a measurement on this machine finds the metile kernel "
                      "faster " + TUNING)


def _route(op: str, backend: str, arrays: tuple, rows: int, columns: int, flags: tuple,
           reference, kernel, shapes: list, extra=()) -> _Route:
    """Which implementation runs.  `reference(*operands)` is MLX's op and
    `kernel(cfg)(*operands)` the metile one, on operands of `shapes` (the call's
    arrays, measured on fresh random ones); `extra` are arrays the candidates close
    over (rope's offset and freqs), evaluated before a measurement."""
    check_backend(f"metile.ops.{op}", backend)
    if backend == "mlx":
        return _Route("mlx", None, routing.Decision("mlx", "requested", "backend='mlx' requested"))
    refusal = _kernel_refusal(rows, columns, *arrays)
    if backend == "metile":
        if refusal is not None:
            raise ValueError(f"[metile.ops.{op}] backend='metile' cannot run this call: {refusal}")
        cfg = configs(op, columns)[0]
        return _Route("metile", cfg, routing.Decision(_config_name(cfg), "requested",
                                                      "backend='metile' requested"))
    if refusal is not None or rows == 0 or columns == 0:
        return _Route("mlx", None, _cost_model(refusal or "an empty array"))
    dtypes = tuple(dtype_name(a.dtype) if a is not None else "none"
                   for a in arrays)
    key, parts = _signature(op, dtypes, rows, columns, flags)
    decision = routing.recorded(key, lambda: map(_config_name, configs(op, columns)))
    if decision is None and routing.measuring_requested() and \
            routing.can_evaluate(*(a for a in arrays if a is not None), *extra):
        operands = _operands(shapes, arrays[0].dtype)
        candidates = [routing.Candidate(routing.REFERENCE, reference)] + [
            routing.Candidate(_config_name(c), kernel(c)) for c in configs(op, columns)]
        decision = routing.measure(key, parts, candidates, operands, _validate,
                                   budget_s=routing.budget(), clock=routing.scope_clock())
    elif decision is None:
        decision = _cost_model()
    if decision.winner == routing.REFERENCE:
        return _Route("mlx", None, decision)
    by_name = {_config_name(c): c for c in configs(op, columns)}
    if decision.winner not in by_name:   # a decision naming a configuration this version lacks
        return _Route("mlx", None, _cost_model())
    return _Route("metile", by_name[decision.winner], decision)


# -- public ops ---------------------------------------------------------------------------------

def _remember(key, launches, at, vjp, given, rows_shape, composite):
    """Record a row kernel's replay: the op's arrays `given` at kernel argument positions
    `at`, x reshaped to the kernel's rows and the result back; `composite` MLX's
    computation of the rows (the replay's vmap rule)."""
    if key is not None:
        op_replay.remember(key, launches, at, given, vjp,
                           [None if rows_shape == given[0].shape else rows_shape] +
                           [None] * (len(given) - 1),
                           None if rows_shape == given[0].shape else given[0].shape, composite)


@op_replay.entry(("x", "weight"), ("eps", "backend", "stream"))
def rms_norm(x, weight, eps, *, backend: str = "auto", stream=None):
    """`mx.fast.rms_norm(x, weight, eps)`: x * rsqrt(mean(x^2, -1) + eps) * weight, over
    x's last axis; weight (x.shape[-1],) or None."""
    if stream is not None:   # (MLX's StreamOrDevice: op_routing.on_stream)
        return on_stream("rms_norm", stream, lambda: rms_norm(x, weight, eps, backend=backend))
    if mlx_takes_it(backend, x, weight) or mlx_takes_values(backend, (eps, _eps_taken(eps))):
        return mx.fast.rms_norm(x, weight, eps)
    key = op_replay.key("rms_norm", (eps, backend, None), x, weight)
    w = () if weight is None else (weight,)
    _check_x("rms_norm", x)
    _check_vector("rms_norm", "weight", weight, x)
    eps = _check_eps("rms_norm", eps)
    rows, columns = math.prod(x.shape[:-1]), x.shape[-1]
    reference = _rms_composite(eps, weight is not None)
    route = _route("rms_norm", backend, (x, weight), rows, columns,
                   (("weight", weight is not None),), reference,
                   lambda c: lambda a, *v: _rms_fn(eps, bool(v), _frozen(c))(a, *v),
                   [(rows, columns)] + [(columns,)] * len(w))
    if route.path == "mlx":
        op_replay.remember_composite(key, reference, route.decision)
        return mx.fast.rms_norm(x, weight, eps)
    with op_replay.recording() as launches:
        rows_x = _rows(x)
        out = _rms_fn(eps, weight is not None, _frozen(route.config))(rows_x, *w,
                                                                       shapes=(x.shape,))
    _remember(key, launches, (0, 1)[:1 + len(w)], _rms_vjp(eps, weight is not None),
              (x, *w), rows_x.shape, reference)
    return out


@op_replay.entry(("x", "weight", "bias"), ("eps", "backend", "stream"))
def layer_norm(x, weight, bias, eps, *, backend: str = "auto", stream=None):
    """`mx.fast.layer_norm(x, weight, bias, eps)`: (x - mean) * rsqrt(var + eps) * weight
    + bias over x's last axis; weight and bias (x.shape[-1],) or None."""
    if stream is not None:
        return on_stream("layer_norm", stream,
                         lambda: layer_norm(x, weight, bias, eps, backend=backend))
    if mlx_takes_it(backend, x, weight, bias) or \
            mlx_takes_values(backend, (eps, _eps_taken(eps))):
        return mx.fast.layer_norm(x, weight, bias, eps)
    key = op_replay.key("layer_norm", (eps, backend, None), x, weight, bias)
    params = tuple(p for p in (weight, bias) if p is not None)
    _check_x("layer_norm", x)
    _check_vector("layer_norm", "weight", weight, x)
    _check_vector("layer_norm", "bias", bias, x)
    eps = _check_eps("layer_norm", eps)
    rows, columns = math.prod(x.shape[:-1]), x.shape[-1]
    has_w, has_b = weight is not None, bias is not None
    reference = _layer_composite(eps, has_w, has_b)
    route = _route("layer_norm", backend, (x, weight, bias), rows, columns,
                   (("weight", has_w), ("bias", has_b)), reference,
                   lambda c: lambda a, *v: _layer_fn(eps, has_w, has_b, _frozen(c))(a, *v),
                   [(rows, columns)] + [(columns,)] * len(params))
    if route.path == "mlx":
        op_replay.remember_composite(key, reference, route.decision)
        return mx.fast.layer_norm(x, weight, bias, eps)
    with op_replay.recording() as launches:
        rows_x = _rows(x)
        out = _layer_fn(eps, has_w, has_b, _frozen(route.config))(rows_x, *params,
                                                                   shapes=(x.shape,))
    # (the kernel's arguments: x, weight, bias)
    _remember(key, launches, (0,) + ((1,) if has_w else ()) + ((2,) if has_b else ()),
              _layer_vjp(eps, has_w, has_b), (x, *params), rows_x.shape, reference)
    return out


@op_replay.entry(("x", "residual", "weight"), ("eps", "backend", "stream"))
def add_rms_norm(x, residual, weight, eps, *, backend: str = "auto", stream=None):
    """(h, rms_norm(h, weight, eps)) with h = x + residual: a transformer block's residual
    add and the next norm in one kernel (one read of x and residual, two writes).
    residual has x's shape or broadcasts to it (as `x + residual`); the sum has MLX's dtype
    for `x + residual`.  `stream` as the
    other ops take it (op_routing.on_stream)."""
    if stream is not None:
        return on_stream("add_rms_norm", stream,
                         lambda: add_rms_norm(x, residual, weight, eps, backend=backend))
    # (a repeated call replays its path from Python, skipping the checks and routing: its
    # two outputs are more than a native replay returns)
    key = op_replay.key("add_rms_norm", (eps, backend, None), x, residual, weight)
    if isinstance(x, mx.array) and isinstance(residual, mx.array) and \
            tuple(residual.shape) != tuple(x.shape):
        try:
            want = tuple(mx.broadcast_shapes(x.shape, residual.shape))
        except ValueError:
            raise ValueError(f"[metile.ops.add_rms_norm] x {tuple(x.shape)} and residual "
                             f"{tuple(residual.shape)} do not broadcast together (as "
                             f"x + residual)") from None
        # (as x + residual broadcasts, either way; the kernel reads the broadcast rows,
        # MLX's autodiff sums each operand's gradient back)
        x, residual = mx.broadcast_to(x, want), mx.broadcast_to(residual, want)
    if mlx_takes_it(backend, x, residual, weight):
        # (an int or bool operand or weight, float64: MLX's add and rms_norm promote,
        # compute or refuse it, as the composite this op replaces does)
        h = x + residual
        return h, mx.fast.rms_norm(h, weight, eps)
    _check_x("add_rms_norm", x)
    if not isinstance(residual, mx.array):
        raise TypeError(f"[metile.ops.add_rms_norm] residual must be an mx.array, got "
                        f"{type(residual).__name__}")
    if not mx.issubdtype(residual.dtype, mx.floating):
        raise ValueError(f"[metile.ops.add_rms_norm] residual has dtype {residual.dtype}; "
                         f"expected a floating type")
    _check_vector("add_rms_norm", "weight", weight, x)
    if mlx_takes_values(backend, (eps, _eps_taken(eps))):
        check_backend("metile.ops.add_rms_norm", backend)
        h = x + residual
        return h, mx.fast.rms_norm(h, weight, eps)
    eps = _check_eps("add_rms_norm", eps)
    rows, columns = math.prod(x.shape[:-1]), x.shape[-1]
    w = () if weight is None else (weight,)

    def reference(a, r, *v):
        h = a + r
        return h, mx.fast.rms_norm(h, v[0] if v else None, eps)

    route = _route("add_rms_norm", backend, (x, residual, weight), rows, columns,
                   (("weight", weight is not None),), reference,
                   lambda c: lambda a, r, *v: tuple(_add_rms_fn(eps, bool(v), _frozen(c))(a, r, *v)),
                   [(rows, columns), (rows, columns)] + [(columns,)] * len(w))
    if route.path == "mlx":
        out = reference(x, residual, *w)
        op_replay.remember_composite(key, reference, route.decision)
        return out
    fused = _add_rms_fn(eps, weight is not None, _frozen(route.config))
    shape = x.shape

    def run(x, residual, *w):
        # (a replay passes the call's arrays as given: either may broadcast)
        x, residual = (a if tuple(a.shape) == tuple(shape) else mx.broadcast_to(a, shape)
                       for a in (x, residual))
        s, y = fused(_rows(x), _rows(residual), *w, shapes=(shape, shape))
        return s, y
    out = run(x, residual, *w)
    op_replay.remember_composite(key, run, route.decision)
    return out


def _softmax_axes(x, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    # (is_integer: MLX's softmax takes NumPy integers too)
    axes = (axis,) if is_integer(axis) else axis
    if not isinstance(axes, (tuple, list)) or not all(
            is_integer(a) for a in axes):
        raise TypeError(f"[metile.ops.softmax] axis must be None, an int or a sequence of ints, "
                        f"got {axis!r}")
    out = []
    for a in map(int, axes):
        if not -x.ndim <= a < x.ndim:
            raise AxisError(f"[metile.ops.softmax] axis {a} is out of range for x of shape "
                             f"{tuple(x.shape)}")
        out.append(a % x.ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"[metile.ops.softmax] axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def _axes_as_rows(moved, kept: int):
    """`moved` (its `kept` leading axes, then the reduced ones) as (rows, columns) by
    flattens (shapeless-compile safe, as op_routing.rows)."""
    if moved.ndim == 0:
        return moved.reshape(1, 1)
    a = mx.flatten(moved, kept, -1) if moved.ndim - kept > 1 else moved
    return _rows(a) if kept != 1 else a


@op_replay.entry(("x",), ("axis", "precise", "backend", "stream"))
def softmax(x, axis=-1, *, precise: bool = False, backend: str = "auto", stream=None):
    """`mx.softmax(x, axis, precise=precise)` (here axis defaults to the last one, the
    attention case).  The kernel computes in float32; with `precise` False (MLX's
    default) a float16/bfloat16 row's exponentials are rounded to its dtype before they
    are scaled by the sum (one rounding more: within 1.5 units in the last place; MLX's own
    precise=False computes in the row's dtype), with `precise` True each output is
    rounded once.  MLX's op is called with `precise` as given.  Reducing axes other
    than the last ones moves them last with a transpose (and back)."""
    if stream is not None:
        return on_stream("softmax", stream,
                         lambda: softmax(x, axis, precise=precise, backend=backend))
    if mlx_takes_it(backend, x):
        return mx.softmax(x, axis=axis, precise=precise)
    key = op_replay.key("softmax", (axis, precise, backend, None), x)
    axis = plain_integer(axis)   # (a 0-d integer array, as MLX's op takes it)
    if type(precise) is not bool:   # (MLX's op takes a bool only)
        raise TypeError(f"[metile.ops.softmax] precise must be a bool, got "
                        f"{type_name(precise)} {precise!r}")
    _check_x("softmax", x, min_ndim=0)
    axes = _softmax_axes(x, axis)
    mlx_axis = axis if axis is None or isinstance(axis, numbers.Integral) else list(axis)
    if backend == "mlx" or (x.ndim == 0 and backend != "metile") or (x.ndim and not axes):
        # (axis=(): a softmax over no axes, each element its own row of one - MLX's op under
        # every backend; the kernel path took the last axis as the row)
        check_backend("metile.ops.softmax", backend)
        out = mx.softmax(x, axis=mlx_axis, precise=precise)
        op_replay.remember_requested(
            key, lambda x: mx.softmax(x, axis=mlx_axis, precise=precise))
        return out
    kept = [a for a in range(x.ndim) if a not in axes]
    order = kept + list(axes)
    moved = x if order == list(range(x.ndim)) else mx.transpose(x, order)
    columns = math.prod(x.shape[a] for a in axes)
    rows = math.prod(x.shape[a] for a in kept)
    # the exponentials held in x's dtype between the sum and the output (kernels' softmax.py,
    # HOLD: half the exponentials, one rounding more) unless precise; float32 the same either way
    hold = not precise or x.dtype == mx.float32
    route = _route("softmax", backend, (x,), rows, columns, (("hold", hold),),
                   lambda a: mx.softmax(a, axis=-1, precise=precise),
                   lambda c: _softmax_fn(_frozen(c), hold), [(rows, columns)])
    if route.path == "mlx":
        op_replay.remember_composite(
            key, lambda x: mx.softmax(x, axis=mlx_axis, precise=precise), route.decision)
        return mx.softmax(x, axis=mlx_axis, precise=precise)
    with op_replay.recording() as launches:
        rows_x = _axes_as_rows(moved, len(kept))
        y = _softmax_fn(_frozen(route.config), hold)(rows_x, shapes=(moved.shape,))
    if moved is x:   # (the last axes: no transposes around the kernel)
        _remember(key, launches, (0,), _softmax_vjp, (x,), rows_x.shape, _softmax_composite)
    if moved is x:
        return y
    inverse = [0] * x.ndim
    for i, a in enumerate(order):
        inverse[a] = i
    return mx.transpose(y, inverse)


_WIDE_OFFSETS = (mx.int64, mx.uint32, mx.uint64)


def _rope_offset(x, offset):
    """(int offset or None, int32 offset array or None, kind)."""
    if not (is_integer(offset) or isinstance(offset, mx.array)):
        raise TypeError(f"[metile.ops.rope] offset must be an int or an integer mx.array, got "
                        f"{type(offset).__name__}")
    if isinstance(offset, numbers.Integral):   # (a NumPy integer too, as MLX's op takes;
        return int(offset), None, "scalar"     # its positions are range-checked in rope())
    if not mx.issubdtype(offset.dtype, mx.integer):
        raise ValueError(f"[metile.ops.rope] offset must be an integer array, got dtype "
                        f"{offset.dtype}")
    if offset.dtype in _WIDE_OFFSETS:
        # the kernels' positions are int32 and an array's values are not known before it
        # runs: a wider offset would wrap silently (an int offset is range-checked above)
        raise ValueError(f"[metile.ops.rope] backend='metile' takes int32 offset arrays, got "
                        f"dtype {offset.dtype}; pass offset.astype(mx.int32) (values below "
                        "2**31), or backend='auto' or 'mlx' (MLX's op takes it)")
    if offset.size == 1 and offset.ndim <= 1:
        return None, offset.reshape(1).astype(mx.int32), "array"
    if offset.ndim == 1 and offset.size == x.shape[0]:
        return None, offset.astype(mx.int32), "per_batch"
    raise ValueError(f"[metile.ops.rope] offset must be a scalar or a vector of {x.shape[0]} "
                     f"offsets (one per batch entry), got shape {tuple(offset.shape)}")


@op_replay.entry(("x", "freqs"), ("dims", "traditional", "base", "scale", "backend", "stream"),
                 values=("offset",))
def rope(x, dims: int, *, traditional: bool, base, scale: float, offset, freqs=None,
         backend: str = "auto", stream=None):
    """`mx.fast.rope`: x (B, *, T, D); the first `dims` features of position t rotate by
    (offset + t) * scale * base^(-2i/dims) (or / freqs[i]) in pairs (i, i + dims/2), or
    (2i, 2i+1) with `traditional`; offset an int, a scalar int array or B offsets."""
    if stream is not None:
        return on_stream("rope", stream, lambda: rope(
            x, dims, traditional=traditional, base=base, scale=scale, offset=offset,
            freqs=freqs, backend=backend))
    # (a repeated call with an int offset replays its path from Python with the call's
    # offset - a decoding loop moves it every token - skipping the checks and routing)
    key = op_replay.key("rope", (dims, traditional, base, scale, backend, None), x, freqs) \
        if type(offset) is int else None
    _check_x("rope", x, min_ndim=3)
    # NumPy scalars as MLX's op takes them (a config's values), as Python numbers
    dims = plain_integer(dims)   # (a 0-d integer array too, as MLX's op takes it)
    if is_integer(dims):
        dims = int(dims)
    if not is_integer(dims) or dims <= 0 or dims % 2:
        raise ValueError(f"[metile.ops.rope] dims must be a positive even int, got {dims!r}")
    if dims > x.shape[-1]:
        raise ValueError(f"[metile.ops.rope] dims {dims} exceeds x's last axis {x.shape[-1]}")
    if (base is None) == (freqs is None):
        raise ValueError("[metile.ops.rope] exactly one of base and freqs must be given")
    base, scale = plain_number(base), plain_number(scale)
    if isinstance(offset, np.ndarray):   # (as MLX's op converts it)
        offset = mx.array(offset)
    if mlx_takes_values(backend, (base, base is None or (is_real(base) and base > 0)),
                        (scale, is_real(scale))):
        check_backend("metile.ops.rope", backend)
        return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                            offset=offset, freqs=freqs)
    if base is not None and (not is_real(base) or not base > 0):
        raise ValueError(f"[metile.ops.rope] base must be a positive number, got {base!r}")
    if not is_real(scale):
        raise TypeError(f"[metile.ops.rope] scale must be a number, got {scale!r}")
    if freqs is not None and (not isinstance(freqs, mx.array)
                              or tuple(freqs.shape) != (dims // 2,)):
        raise ValueError(f"[metile.ops.rope] freqs must be an mx.array of shape ({dims // 2},), "
                         f"got {getattr(freqs, 'shape', type(freqs).__name__)}")
    if not isinstance(traditional, bool):   # as MLX's op (1 or "yes" would pass a bool())
        raise TypeError(f"[metile.ops.rope] traditional must be a bool, got "
                        f"{type_name(traditional)}")
    # positions offset .. offset + T - 1 must be int32: the kernels' type
    wide_int = is_integer(offset) and not -2**31 <= int(offset) <= 2**31 - x.shape[-2]
    if backend != "metile" and (wide_int or (isinstance(offset, mx.array)
                                             and offset.dtype in _WIDE_OFFSETS)):
        # the kernels' positions are int32, and a lazy array's values cannot be
        # range-checked before it runs: MLX's op takes the wide offsets, and an int past
        # int32 (a drop-in keeps working with NumPy's int64 positions); backend="metile"
        # refuses them
        check_backend("metile.ops.rope", backend)
        return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                            offset=offset, freqs=freqs)
    if wide_int:
        raise ValueError(f"[metile.ops.rope] positions {int(offset)} to "
                         f"{int(offset) + x.shape[-2] - 1} do not fit in int32 (the kernels' "
                         f"positions); backend='auto' or 'mlx' runs MLX's op")
    start, offset_array, kind = _rope_offset(x, offset)
    # the kernel reads float frequencies; MLX's op gets the array as given
    kernel_freqs = freqs if freqs is None or freqs.dtype in _DTYPES else freqs.astype(mx.float32)
    rows, columns = math.prod(x.shape[:-1]), x.shape[-1]
    spec = _Rope(dims, bool(traditional), None if base is None else float(base), float(scale),
                 start, kind, x.shape[-2], math.prod(x.shape[1:-1]))

    def reference(a):
        return mx.fast.rope(a.reshape(x.shape), dims, traditional=traditional, base=base,
                            scale=scale, offset=offset, freqs=freqs).reshape(a.shape)

    extra = tuple(a for a in (offset_array, kernel_freqs) if a is not None)

    def kernel(c, shapes=None):
        f = _rope_fn(spec, offset_array is not None, freqs is not None, _frozen(c))
        return lambda a: f(a, *extra, shapes=shapes)

    flags = (("dims", dims), ("traditional", bool(traditional)), ("offset", kind),
             ("freqs", freqs is not None))
    route = _route("rope", backend, (x,), rows, columns, flags, reference, kernel,
                   [(rows, columns)], extra)
    if route.path == "mlx":
        out = mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                           offset=offset, freqs=freqs)
        if key is not None:   # (an int offset)
            op_replay.remember_composite(key, _rope_mlx_replay(
                dims, traditional, base, scale, freqs is not None), route.decision)
        return out
    out = kernel(route.config, (x.shape,))(_rows(x))
    if key is not None:
        op_replay.remember_composite(key, _rope_kernel_replay(spec, freqs is not None,
                                                              _frozen(route.config)),
                                     route.decision)
    return out


def _rope_mlx_replay(dims, traditional, base, scale, has_freqs):
    """rope's MLX route replayed: (x[, freqs], offset) -> MLX's op."""
    def run(x, *rest):
        return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                            offset=rest[-1], freqs=rest[0] if has_freqs else None)
    return run


def _rope_kernel_replay(spec: _Rope, has_freqs: bool, cfg: tuple):
    """rope's kernel route replayed: (x[, freqs], offset) -> the kernel at that offset, or
    None (the full path) where its positions do not fit in int32.  The offset goes to the
    kernel as a one-element array (the "array" offset kind: the same positions), so every
    offset shares one custom function and one launch - a launch keys its int scalars by
    value (they take part in coverage proofs), and a new one cost ~250 us a token on this
    CPU.  (The thirty-second session launched the scalar kernel at each offset off the CPU
    runtime, reading a failed GPU test as this form rotating wrongly on CUDA; the failing
    assertion was the test's gradient against MLX's own, which differed there after the
    test's calls at other offsets - in a fresh process MLX's and metile's gradients are both
    the rotation's transpose, H100 s118 - and this form matches MLX's op at every offset on
    the H100, s116.)"""
    shared = _rope_fn(dataclasses.replace(spec, offset=None, offset_kind="array"), True,
                      has_freqs, cfg)

    def run(x, *rest):
        offset = rest[-1]
        if not -2**31 <= offset <= 2**31 - spec.seq:
            return None
        freqs = rest[0] if has_freqs else None
        extra = () if freqs is None else (
            freqs if freqs.dtype in _DTYPES else freqs.astype(mx.float32),)
        return shared(_rows(x), mx.array([offset], mx.int32), *extra, shapes=(x.shape,))
    return run
