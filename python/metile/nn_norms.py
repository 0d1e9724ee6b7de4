"""`metile.nn.RMSNorm` and `metile.nn.LayerNorm`: drop-ins for `mlx.nn.RMSNorm` and
`mlx.nn.LayerNorm` whose forward is `metile.ops.rms_norm` / `layer_norm` (the
metile kernels where routing chose them, else MLX's op).  Same parameters and
names (`weight`, `bias`), so checkpoints load unchanged; `metile.nn.convert`
swaps them into an existing model (see `swap_norm`)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mlx_nn

from . import model_ops
from .op_routing import FLOAT_DTYPES, check_backend


def carry_attributes(old, new) -> None:
    """What a user attached to `old` beyond its layer's own (an array `scale`, a name):
    kept by the layer that replaces it, so parameters(), save_weights and load_weights
    keep their keys."""
    for key, value in old.items():
        if key not in new:
            new[key] = value
    for key, value in vars(old).items():
        if key not in vars(new):
            setattr(new, key, value)


def _adopt(new, layer):
    """Give `new` the frozen parameters, training mode and attached attributes of the
    layer it replaces."""
    new._no_grad = set(layer._no_grad)
    new._training = layer._training
    carry_attributes(layer, new)
    return new


def _mlx_dtype(x) -> bool:
    """Whether `x` is an array of a dtype metile's norm kernels do not take (an integer,
    float64): the layer then computes what the mlx.nn layer does, promoting as MLX does,
    whatever its backend - as metile.nn.Linear hands over an x of another dtype."""
    return isinstance(x, mx.array) and x.dtype not in FLOAT_DTYPES


class RMSNorm(mlx_nn.RMSNorm):
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, as `mlx.nn.RMSNorm`."""

    def __init__(self, dims: int, eps: float = 1e-5, backend: str = "auto"):
        check_backend("metile.nn.RMSNorm", backend)
        super().__init__(dims, eps)
        self.backend = backend

    @classmethod
    def from_module(cls, layer: mlx_nn.RMSNorm, backend: str = "auto") -> "RMSNorm":
        """A metile.nn.RMSNorm holding `layer`'s own weight array (no copy)."""
        # eps after construction: MLX's constructor refuses eps <= 0, which a layer's eps
        # set later may be (and MLX's op, like metile's, runs with it)
        new = cls(layer.weight.shape[0], 1e-5, backend)
        new.eps = layer.eps
        new.weight = layer.weight   # the fresh ones(...) is lazy, so never computed
        return _adopt(new, layer)

    def __call__(self, x):
        if _mlx_dtype(x):
            return super().__call__(x)
        return model_ops.rms_norm(x, self["weight"], self.eps, backend=self.backend)

    def _extra_repr(self) -> str:
        return f"{super()._extra_repr()}, backend={self.backend}"


class LayerNorm(mlx_nn.LayerNorm):
    """(x - mean) * rsqrt(var + eps) * weight + bias over the last axis, as
    `mlx.nn.LayerNorm` (weight and bias present as `affine` and `bias` say)."""

    def __init__(self, dims: int, eps: float = 1e-5, affine: bool = True, bias: bool = True,
                 backend: str = "auto"):
        check_backend("metile.nn.LayerNorm", backend)
        super().__init__(dims, eps, affine, bias)
        self.backend = backend

    @classmethod
    def from_module(cls, layer: mlx_nn.LayerNorm, backend: str = "auto") -> "LayerNorm":
        """A metile.nn.LayerNorm holding `layer`'s own weight and bias arrays (no copy)."""
        new = cls(layer.dims, 1e-5, "weight" in layer, "bias" in layer, backend)
        new.eps = layer.eps            # (as RMSNorm.from_module's)
        if "weight" in layer:
            new.weight = layer.weight
        if "bias" in layer:
            new.bias = layer.bias
        return _adopt(new, layer)

    def __call__(self, x):
        if _mlx_dtype(x):
            return super().__call__(x)
        return model_ops.layer_norm(x, self.get("weight"), self.get("bias"), self.eps,
                                    backend=self.backend)

    def _extra_repr(self) -> str:
        return f"{super()._extra_repr()}, backend={self.backend}"


_SWAPS = ((mlx_nn.RMSNorm, RMSNorm), (mlx_nn.LayerNorm, LayerNorm))


def is_norm(module) -> bool:
    return isinstance(module, (mlx_nn.RMSNorm, mlx_nn.LayerNorm))


def swap_norm(parent, key, path: str, module, backend: str, predicate, report) -> None:
    """`convert`'s step for an mlx.nn.RMSNorm / LayerNorm at parent[key]: replace it by
    the metile layer holding the same arrays, or record in `report` why not."""
    if isinstance(module, (RMSNorm, LayerNorm)):
        report.skipped[path] = f"already a metile.nn.{type(module).__name__}"
        return
    for mlx_type, metile_type in _SWAPS:
        if type(module) is mlx_type:
            break
    else:
        base = "RMSNorm" if isinstance(module, mlx_nn.RMSNorm) else "LayerNorm"
        report.skipped[path] = (f"{type(module).__name__} subclasses mlx.nn.{base}; its own "
                                f"__call__ may compute something else")
        return
    if predicate is not None and not predicate(path, module):
        report.skipped[path] = "class_predicate returned False"
        return
    weight = module.get("weight")
    if weight is not None and weight.dtype not in FLOAT_DTYPES:
        report.skipped[path] = (f"weight dtype {weight.dtype} (metile's norm kernels take "
                                f"float32/float16/bfloat16)")
        return
    parent[key] = metile_type.from_module(module, backend)
    report.converted[path] = repr(parent[key])
