"""Array-level ops built from metile's kernel library, for use inside MLX models.

    y = metile.ops.linear(x, weight, bias, activation="gelu_tanh")
    y = metile.ops.matmul(a, b, epilogue="relu")

Both take and return lazy mx.arrays, work inside mx.compile, and are
differentiable (mx.custom_function; the backward pass uses MLX ops, recomputing
the pre-activation where the activation's derivative needs it).

The GEMM epilogue (the activation) is fused into the kernel's output store.  A
bias vector is an extra memory read, which GEMM epilogue fusion does not take
(see the compiler's epilogue rules), so `linear` with a bias runs the GEMM
without an epilogue and adds the bias and activation as MLX ops.

`backend="auto"` runs metile's kernel on GPUs; on the CPU the kernel would run
in the MSL CPU runtime, an emulator, so "auto" picks the MLX composite there.
`backend="metile"` forces the kernel, `backend="mlx"` the composite.
`explain_linear` / `explain_matmul` say which path a call takes and why, with
the kernel's execution report when the kernel runs.
"""

from __future__ import annotations

import json
import math

import mlx.core as mx

ACTIVATIONS = {None: "none", "relu": "relu", "gelu_tanh": "gelu_tanh", "silu": "sigmoid_gated",
               "leaky_relu": "affine_leaky"}
_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
BLOCK = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16)
# NVIDIA, 16-bit operands: the cp.async / ldmatrix / register-epilogue GEMM (gemm_async).
# Measured on the H200 (benchmarks/results/h200-gemm-*.json): 128x128x32 on 8 warps
# (64x32 per warp, three 16 KiB stages) led 4096^3 among 128x128/4 warps, 256x128,
# 128x256 and 128x64; a grid of fewer tiles than SMs takes 64x64x32 tiles instead.
CUDA_BLOCK = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_simdgroups=8)
CUDA_SMALL_BLOCK = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_simdgroups=4)
CUDA_SMS = 132
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
        return mx.where(z > 0, z, slope * z)
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
        return mx.where(z > 0, 1.0, slope).astype(z.dtype)
    if activation == "silu":
        s = mx.sigmoid(z)
        return s * (1 + z * (1 - s))
    c = 0.7978845608028654
    inner = c * (z + 0.044715 * z**3)
    t = mx.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)


def _check_activation(activation, slope):
    if activation not in ACTIVATIONS:
        raise ValueError(f"[metile.ops] activation must be one of {sorted(map(str, ACTIVATIONS))}, "
                         f"got {activation!r}")
    if isinstance(slope, bool) or not isinstance(slope, (int, float)):
        raise TypeError(f"[metile.ops] negative_slope must be a number, got "
                        f"{type(slope).__name__} {slope!r}")


def _check(a, b, activation, slope=LEAKY_SLOPE):
    _check_activation(activation, slope)
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, mx.array):
            raise TypeError(f"[metile.ops] {name} must be an mx.array, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"[metile.ops] {name} has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if a.dtype != b.dtype:
        raise TypeError(f"[metile.ops] operands must share a dtype, got {a.dtype} and {b.dtype}")
    if a.ndim < 1 or b.ndim != 2:
        raise ValueError(f"[metile.ops] expected a (..., K) and b (K, N), got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"[metile.ops] inner dimensions differ: {a.shape} @ {b.shape}")


def _resolve(backend: str) -> tuple[str, str]:
    if backend not in ("auto", "metile", "mlx"):
        raise ValueError(f"[metile.ops] backend must be 'auto', 'metile' or 'mlx', got {backend!r}")
    if backend != "auto":
        return backend, f"backend={backend!r} requested"
    if mx.default_device().type == mx.cpu:
        return "mlx", ("the default device is the CPU, where metile kernels run in the MSL CPU "
                       "runtime (an emulator); MLX's native CPU matmul is faster")
    return "metile", "GPU default device: metile's GEMM kernel with a fused epilogue"


def _launch(a2, b, activation, slope, dispatch_only=False):
    from metile_kernels.gemm import grid, matmul_epilogue

    m, k = a2.shape
    n = b.shape[1]
    block = _block(m, n, a2.dtype)
    launcher = matmul_epilogue[grid(m, n, block["BLOCK_M"], block["BLOCK_N"])]
    args = (a2, b, mx.zeros((m, n), a2.dtype), m, n, k, 1.0, 0.0)
    kw = dict(EPILOGUE=ACTIVATIONS[activation], NEGATIVE_SLOPE=float(slope), **block)
    return launcher.prepare(*args, **kw) if dispatch_only else launcher(*args, **kw)


def _block(m: int, n: int, dtype) -> dict:
    """The GEMM tile for this launch: the measured fast configuration on MLX's CUDA
    backend for 16-bit operands, else the portable 64x64x16."""
    if dtype == mx.float32 or mx.default_device().type != mx.gpu or not mx.cuda.is_available():
        return BLOCK
    if math.ceil(m / 128) * math.ceil(n / 128) < CUDA_SMS:
        return CUDA_SMALL_BLOCK
    return CUDA_BLOCK


def _fused_matmul(activation, slope):
    """A differentiable act(a @ b) whose forward is one metile kernel."""

    @mx.custom_function
    def f(a2, b):
        return _launch(a2, b, activation, slope)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        a2, b = primals
        z = (a2.astype(mx.float32) @ b.astype(mx.float32))
        g = cotangent.astype(mx.float32) * _activation_grad(z, activation, slope)
        return (g @ b.astype(mx.float32).T).astype(a2.dtype), (a2.astype(mx.float32).T @ g).astype(b.dtype)

    return f


def matmul(a, b, *, epilogue=None, negative_slope: float = LEAKY_SLOPE, backend: str = "auto"):
    """epilogue(a @ b) with `epilogue` one of None, "relu", "leaky_relu", "gelu_tanh",
    "silu"; `a` may have leading batch dimensions."""
    _check(a, b, epilogue, negative_slope)
    path, _ = _resolve(backend)
    lead = a.shape[:-1]
    # an explicit row count: reshape(-1, 0) cannot infer it when K is 0
    a2 = a.reshape(math.prod(lead), a.shape[-1])
    if path == "mlx":
        out = activate((a2 @ b).astype(mx.float32), epilogue, negative_slope).astype(a.dtype)
    else:
        out = _fused_matmul(epilogue, negative_slope)(a2, b)
    return out.reshape(*lead, b.shape[1])


def linear(x, weight, bias=None, activation=None, *, backend: str = "auto",
           negative_slope: float = LEAKY_SLOPE):
    """activation(x @ weight.T + bias), weight stored (out_features, in_features) as in MLX."""
    if not isinstance(weight, mx.array) or weight.ndim != 2:
        raise ValueError("[metile.ops] weight must be a 2-D mx.array (out_features, in_features)")
    _check_activation(activation, negative_slope)
    if bias is None:
        return matmul(x, weight.T, epilogue=activation, backend=backend,
                      negative_slope=negative_slope)
    if not isinstance(bias, mx.array):
        raise TypeError(f"[metile.ops] bias must be an mx.array or None, got {type(bias).__name__}")
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"[metile.ops] bias shape {bias.shape} does not match {weight.shape[0]} "
                         "output features")
    # The bias is an extra memory read: not part of the fused epilogue.
    y = matmul(x, weight.T, backend=backend)
    return activate((y + bias).astype(mx.float32), activation, negative_slope).astype(x.dtype)


def explain_matmul(a, b, *, epilogue=None, negative_slope: float = LEAKY_SLOPE,
                   backend: str = "auto") -> str:
    """Which path `matmul` takes for these arguments, why, and the kernel's report."""
    _check(a, b, epilogue, negative_slope)
    path, reason = _resolve(backend)
    info = {"op": "matmul", "path": "metile_kernel" if path == "metile" else "mlx_composite",
            "reason": reason, "epilogue": epilogue}
    if path == "metile":
        a2 = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
        d = _launch(a2, b, epilogue, negative_slope, dispatch_only=True)
        info["execution_report"] = d.execution_report.to_dict()
    return json.dumps(info, indent=2)


def explain_linear(x, weight, bias=None, activation=None, *, backend: str = "auto",
                   negative_slope: float = LEAKY_SLOPE) -> str:
    info = json.loads(explain_matmul(x, weight.T, epilogue=None if bias is not None else activation,
                                     backend=backend, negative_slope=negative_slope))
    info["op"] = "linear"
    if bias is not None:
        info["unfused"] = (f"bias add{' and ' + activation if activation else ''} run as MLX ops: "
                           "a bias vector is an extra memory read, which the GEMM epilogue does not fuse")
    return json.dumps(info, indent=2)
