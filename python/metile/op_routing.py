"""What the op modules (ops.py, model_ops.py, attention_ops.py, quantized_ops.py) share
for measured routing (runtime/routing.py): the parts of a decision key that describe the
device and the row bucket, the check that a candidate computed MLX's result, and the fresh
operands a measurement runs on.  Its own module because ops.py re-exports the others,
which therefore cannot import ops.py back."""

from __future__ import annotations

import functools
import math
import numbers

import mlx.core as mx
import numpy as np

from .runtime import routing

# The float dtypes the op kernels take (operands, weights, scales)
FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
BACKENDS = ("auto", "metile", "mlx")


def check_backend(where: str, backend) -> None:
    """Refuse a `backend=` the ops and layers do not take; `where` names the caller in the
    message ("metile.ops.rms_norm", "metile.nn.Linear", ...)."""
    if backend not in BACKENDS:
        raise ValueError(f"[{where}] backend must be 'auto', 'metile' or 'mlx', got {backend!r}")


def is_real(value) -> bool:
    """A real number as MLX's ops take one - a Python or NumPy scalar (a config's value) -
    and not a bool (True is an int to Python, never an eps or a scale to a caller)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def plain_number(value):
    """A one-element numeric or bool mx.array, or a 0-d NumPy array (what np.load gives
    for a saved scalar), as the Python number MLX's ops convert it to (they take eps,
    scale and base through float(), which evaluates the array); anything else as given,
    for the checks to take or name.  (A bool comes back a bool: MLX's op computes with
    it, as with a Python True, and the kernels' checks refuse it; both were refused
    under every backend, found by a hostile test.)"""
    if (isinstance(value, mx.array) and value.size == 1
            and (value.dtype == mx.bool_ or mx.issubdtype(value.dtype, mx.floating)
                 or mx.issubdtype(value.dtype, mx.integer))):
        return value.item()
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
        # (float() takes only a 0-d one: MLX's ops refuse a (1,)-shaped NumPy array)
        return value.item()
    return value


def plain_integer(value):
    """A 0-d integer mx.array or NumPy array as the int MLX's ops take it as (their int
    arguments - rope's dims, softmax's axis - accept one; metile refused it as "not an
    int", found by a hostile test); anything else as given."""
    if isinstance(value, (mx.array, np.ndarray)) and value.ndim == 0 and (
            np.issubdtype(value.dtype, np.integer) if isinstance(value, np.ndarray)
            else mx.issubdtype(value.dtype, mx.integer)):
        return int(value.item())
    return value


def mlx_takes_it(backend, *arrays) -> bool:
    """Whether a drop-in op hands this call to MLX's own op before its checks: under
    backend "auto" or "mlx", an array of a dtype metile's kernels do not take (an int or
    bool x, weight or query; float64), which MLX promotes, computes or refuses by itself.
    backend="metile" keeps the op's own error naming the dtype."""
    return backend in ("auto", "mlx") and any(
        isinstance(a, mx.array) and a.dtype not in FLOAT_DTYPES for a in arrays)


def mlx_takes_values(backend, *values) -> bool:
    """Whether a drop-in op hands this call to MLX's own op because a scalar argument is a
    number its kernels do not take: `values` are (value, taken) pairs, and under backend
    "auto" or "mlx" a number (bool included: MLX converts it) that is not `taken` (an
    infinite eps, a bool scale, a zero base) goes to MLX's op, which computes with it;
    anything else not taken (a string) keeps the op's own clearer error, as does
    backend="metile"."""
    return backend in ("auto", "mlx") and any(
        isinstance(plain_number(v), numbers.Real) and not taken for v, taken in values)


def is_integer(value) -> bool:
    """An integer as MLX's ops take one (a Python or NumPy integer), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def on_stream(op: str, stream, call):
    """call() with `stream` (MLX's StreamOrDevice: an mx.Stream, mx.Device or mx.cpu) as the
    default, as MLX's ops take `stream=`: the op's kernels launch there (a replay too:
    its launch takes the default device's stream) and MLX's op runs there."""
    try:   # (what mx.stream takes, as MLX's ops take it: their conversions too)
        scope = mx.stream(stream)
    except TypeError:
        raise TypeError(f"[metile.ops.{op}] stream must be an mx.Stream or a device, got "
                        f"{type(stream).__name__}") from None
    with scope:
        return call()


# Tolerance of a candidate against MLX's result, relative to the largest value: the
# rounding a different accumulation order gives in each dtype.
TOLERANCE = {mx.float32: 2e-3, mx.float16: 1e-2, mx.bfloat16: 5e-2}


def rows(a):
    """`a` (..., K) as rows (prod(...), K): by flatten, whose shape follows its input's,
    where a reshape keeps the traced shape - under mx.compile(shapeless=True) a reshape
    failed on the second shape before the kernel could say why it cannot go there; a 1-D
    `a` is one row."""
    return mx.flatten(a, 0, -2) if a.ndim > 1 else a[None]


def broadcasts_to(shape, want) -> bool:
    """Whether numpy broadcasting takes `shape` to exactly `want` (the output's rank and
    sizes: a residual never widens the output)."""
    if len(shape) > len(want):
        return False
    return all(s in (1, w) for s, w in zip(shape[::-1], want[::-1]))


def type_name(value) -> str:
    """`value`'s type as a message names it: module-qualified unless a builtin (a NumPy
    bool is `numpy.bool`, which a bare `bool` in "must be a bool, got bool" hid)."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def dtype_name(dtype) -> str:
    """An MLX dtype's short name ("float16"), as routing keys, reports and kernel
    constants spell it."""
    return str(dtype).removeprefix("mlx.core.")


def config_name(config: dict) -> str:
    """A kernel configuration's name in routing decisions and reports."""
    return "metile:" + ",".join(f"{k}={v}" for k, v in config.items())


def m_bucket(m: int) -> int:
    """Rows rounded up to a power of two: calls whose row counts share a bucket share
    a routing decision (decoding steps and prefill lengths vary; N and K do not)."""
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


@functools.lru_cache(maxsize=None)
def device_description(device_type: str) -> dict:
    """The device part of a decision key ("gpu" or "cpu", the backend, the device name)."""
    if device_type == "gpu":
        backend = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "gpu"
    else:
        backend = "cpu"
    try:
        name = mx.device_info().get("device_name", "")
    except Exception:  # noqa: BLE001  (the name only narrows the key)
        name = ""
    return {"type": device_type, "backend": backend, "name": str(name)}


def _validate_one(out, reference):
    tol = TOLERANCE[reference.dtype]
    if out.shape != reference.shape or out.dtype != reference.dtype:
        return f"result {out.shape} {out.dtype}, expected {reference.shape} {reference.dtype}"
    o, r = out.astype(mx.float32), reference.astype(mx.float32)
    if not mx.array_equal(mx.isfinite(o), mx.isfinite(r)).item():
        return "non-finite values where MLX has finite ones (or the reverse)"
    scale = max(mx.abs(r).max().item(), 1.0) if r.size else 1.0
    err = (mx.abs(o - r).max().item() if r.size else 0.0) / scale
    return None if err <= tol else f"max error {err:.2e} of the largest value > {tol:g}"


def validate(out, reference):
    """None if `out` (an array, or a tuple of arrays for ops with several results) agrees
    with MLX's result to the dtype's accumulation-order rounding, else what differs."""
    if isinstance(reference, (tuple, list)):
        for o, r in zip(out, reference):
            problem = _validate_one(o, r)
            if problem:
                return problem
        return None
    return _validate_one(out, reference)


def measurement_operands(shapes, dtype):
    """Fresh operands for a measurement, from a fixed key: the caller's arrays may be
    traced, and the global random state must not move."""
    keys = mx.random.split(mx.random.key(0), len(shapes))
    return [(mx.random.normal(s, key=keys[i]) / math.sqrt(max(s[-1], 1))).astype(dtype)
            for i, s in enumerate(shapes)]


CPU_REASON = ("the default device is the CPU, where metile kernels run in the MSL CPU runtime "
              "(an emulator)")
TUNING = "(`with metile.ops.tuning():` or METILE_OPS_TUNE=1)"


def cost_model(on_cpu: str, on_gpu: str) -> routing.Decision:
    """The decision without a recorded measurement: MLX's path, with why, on the CPU and
    on a GPU (each op says it in its own words)."""
    why = on_cpu if mx.default_device().type == mx.cpu else on_gpu
    return routing.Decision(routing.REFERENCE, "cost_model",
                            f"cost model (no measurement recorded): {why}")
