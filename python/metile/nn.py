"""`metile.nn.Linear`: a drop-in for `mlx.nn.Linear` whose matmul (and
activation, when fused) runs as a metile kernel; see `metile.ops.linear`."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mlx_nn

from . import ops


class Linear(mlx_nn.Linear):
    """y = activation(x @ weight.T + bias), with the parameters and initialisation
    of `mlx.nn.Linear` (so existing weights load unchanged)."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True, activation=None,
                 backend: str = "auto"):
        super().__init__(input_dims, output_dims, bias=bias)
        if activation not in ops.ACTIVATIONS:
            raise ValueError(f"[metile.nn.Linear] unknown activation {activation!r}")
        self.activation = activation
        self.backend = backend

    def __call__(self, x: mx.array) -> mx.array:
        return ops.linear(x, self.weight, self.get("bias"), self.activation, backend=self.backend)

    def explain(self, x: mx.array) -> str:
        return ops.explain_linear(x, self.weight, self.get("bias"), self.activation,
                                  backend=self.backend)

    def _extra_repr(self) -> str:
        return f"{super()._extra_repr()}, activation={self.activation}, backend={self.backend}"
