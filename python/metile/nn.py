"""`metile.nn.Linear`: a drop-in for `mlx.nn.Linear` whose matmul (and
activation, when fused) runs as a metile kernel; see `metile.ops.linear`."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mlx_nn

from . import ops


def _check_activation(layer: str, activation, negative_slope) -> None:
    if activation not in ops.ACTIVATIONS:
        raise ValueError(f"[metile.nn.{layer}] unknown activation {activation!r}; expected one of "
                         f"{sorted(map(str, ops.ACTIVATIONS))}")
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float)):
        raise TypeError(f"[metile.nn.{layer}] negative_slope must be a number, got "
                        f"{type(negative_slope).__name__}")


class Linear(mlx_nn.Linear):
    """y = activation(x @ weight.T + bias), with the parameters and initialisation
    of `mlx.nn.Linear` (so existing weights load unchanged).  `leaky_relu` uses
    `negative_slope` (MLX's default, 0.01)."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True, activation=None,
                 backend: str = "auto", negative_slope: float = ops.LEAKY_SLOPE):
        for name, dims in (("input_dims", input_dims), ("output_dims", output_dims)):
            if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
                raise ValueError(f"[metile.nn.Linear] {name} must be a positive int, got {dims!r}")
        if backend not in ("auto", "metile", "mlx"):
            raise ValueError(f"[metile.nn.Linear] backend must be 'auto', 'metile' or 'mlx', "
                             f"got {backend!r}")
        _check_activation("Linear", activation, negative_slope)
        super().__init__(input_dims, output_dims, bias=bias)
        self.activation = activation
        self.negative_slope = float(negative_slope)
        self.backend = backend

    def __call__(self, x: mx.array) -> mx.array:
        return ops.linear(x, self.weight, self.get("bias"), self.activation, backend=self.backend,
                          negative_slope=self.negative_slope)

    def explain(self, x: mx.array) -> str:
        return ops.explain_linear(x, self.weight, self.get("bias"), self.activation,
                                  backend=self.backend, negative_slope=self.negative_slope)

    def to_quantized(self, group_size=None, bits=None, mode: str = "affine",
                     quantize_input: bool = False):
        """What `mlx.nn.quantize` calls: MLX's quantized layer, with this layer's
        activation applied after it (MLX's own layers have none to keep)."""
        if self.activation is None:
            return super().to_quantized(group_size, bits, mode, quantize_input)
        if quantize_input:
            raise ValueError(f"[metile.nn.Linear] quantize_input=True is not supported for a "
                             f"layer with activation={self.activation!r} (MLX's QQLinear has no "
                             f"activation); quantize it with quantize_input=False or exclude it "
                             f"with class_predicate")
        q = QuantizedLinear.from_linear(self, group_size, bits, mode)
        q.activation, q.negative_slope = self.activation, self.negative_slope
        return q

    def _extra_repr(self) -> str:
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return (f"{super()._extra_repr()}, activation={self.activation}{slope}, "
                f"backend={self.backend}")


class QuantizedLinear(mlx_nn.QuantizedLinear):
    """`mlx.nn.QuantizedLinear` followed by a metile.nn.Linear's activation: what
    `mlx.nn.quantize` turns a `metile.nn.Linear` with an activation into.  The
    parameters are MLX's, so quantized checkpoints load unchanged."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True, group_size=None,
                 bits=None, mode: str = "affine", activation=None,
                 negative_slope: float = ops.LEAKY_SLOPE):
        super().__init__(input_dims, output_dims, bias, group_size, bits, mode=mode)
        _check_activation("QuantizedLinear", activation, negative_slope)
        self.activation = activation
        self.negative_slope = float(negative_slope)

    def __call__(self, x: mx.array) -> mx.array:
        y = super().__call__(x)
        return ops.activate(y.astype(mx.float32), self.activation,
                            self.negative_slope).astype(y.dtype)

    def _extra_repr(self) -> str:
        return f"{super()._extra_repr()}, activation={self.activation}"
