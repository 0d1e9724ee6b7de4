"""metile example: a small llama-style decoder, converted to metile ops.

    python examples/decoder_block.py [--backend metile|auto|mlx] [--dtype float32|float16|bfloat16] [--tokens N]

No downloads: the model is defined here (token embedding; N blocks of RMSNorm ->
grouped-query attention with RoPE and a causal mask -> residual, RMSNorm -> gated
MLP down(silu(gate(x)) * up(x)) -> residual; final RMSNorm; LM head) with random
weights.  `convert_all(model, backend)` puts metile into it in two steps:

1. `metile.nn.convert(model)` swaps the layers it can see in the module tree:
   every `nn.Linear` becomes a `metile.nn.Linear` and every `nn.RMSNorm` a
   `metile.nn.RMSNorm`, holding the same weight arrays.
2. What is *forward code*, not module structure, convert cannot see: the gating
   `silu(gate_proj(x)) * up_proj(x)` is arithmetic inside `MLP.__call__` (there is
   no `nn.Sequential` that says "these two Linears share an input and are
   multiplied"), RoPE and attention are `mx.fast` function calls, and the residual
   adds are `+` in `Block.__call__`.  So the modules here carry an `ops_backend`
   flag: None runs the plain MLX code; a backend string makes the forward call
   `metile.ops.gated_mlp` (one dual GEMM for gate and up), `metile.ops.rope`,
   `metile.ops.scaled_dot_product_attention`, and `metile.ops.linear(...,
   residual=)` for o_proj and down_proj (the residual add in the GEMM's epilogue).

Every metile op takes `backend="auto"|"metile"|"mlx"`: "auto" routes each call
by measurement (MLX's op until a measurement recorded on this machine says the
kernel is faster; on the CPU, where kernels run in metile's MSL CPU runtime, it
keeps MLX's ops), "metile" forces the kernels.  The script prints the conversion
report and how far the converted model's logits are from the unconverted model's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

import metile

# converted against unconverted logits: the 16-bit types round the fused products
# (gate*up, the residual epilogue) once where MLX's composite rounds twice
TOLERANCE = {"float32": (3e-4, 3e-5), "float16": (2e-2, 2e-2), "bfloat16": (6e-2, 6e-2)}

@dataclass(frozen=True)
class Config:
    vocab: int = 97
    dims: int = 64
    heads: int = 4
    kv_heads: int = 2          # grouped-query: heads / kv_heads query heads share a k/v head
    hidden: int = 96           # the gated MLP's width
    layers: int = 2
    rope_base: float = 10000.0
    eps: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self):
        if self.dims % self.heads:
            raise ValueError(f"dims {self.dims} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if (self.dims // self.heads) % 2:
            raise ValueError(f"the head dimension {self.dims // self.heads} must be even (RoPE "
                             f"rotates pairs)")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.dims // self.heads


def _linear_residual(layer: nn.Linear, x, residual, backend):
    """layer(x) + residual; with a backend, one GEMM whose epilogue adds the residual."""
    if backend is None:
        y = layer(x)
        return y if residual is None else y + residual
    return metile.ops.linear(x, layer.weight, layer.get("bias"), residual=residual,
                             backend=backend)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.rope_base = cfg.rope_base
        self.scale = cfg.head_dim ** -0.5
        self.q_proj = nn.Linear(cfg.dims, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dims, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dims, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.dims, bias=False)
        self.ops_backend = None

    def _rope(self, x):
        kw = dict(traditional=False, base=self.rope_base, scale=1.0, offset=0)
        if self.ops_backend is None:
            return mx.fast.rope(x, self.head_dim, **kw)
        return metile.ops.rope(x, self.head_dim, backend=self.ops_backend, **kw)

    def _attend(self, q, k, v):
        if self.ops_backend is None:
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask="causal")
        return metile.ops.scaled_dot_product_attention(q, k, v, scale=self.scale, mask="causal",
                                                       backend=self.ops_backend)

    def __call__(self, x, residual=None):
        """o_proj(attention(x)) (+ residual)."""
        b, t, _ = x.shape

        def split(y, heads):   # (B, T, heads * D) -> (B, heads, T, D)
            return y.reshape(b, t, heads, self.head_dim).transpose(0, 2, 1, 3)

        q = self._rope(split(self.q_proj(x), self.heads))
        k = self._rope(split(self.k_proj(x), self.kv_heads))
        v = split(self.v_proj(x), self.kv_heads)
        out = self._attend(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        return _linear_residual(self.o_proj, out, residual, self.ops_backend)


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dims, cfg.hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dims, cfg.hidden, bias=False)
        self.down_proj = nn.Linear(cfg.hidden, cfg.dims, bias=False)
        self.ops_backend = None

    def __call__(self, x, residual=None):
        """down_proj(silu(gate_proj(x)) * up_proj(x)) (+ residual)."""
        if self.ops_backend is None:
            h = nn.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            # The gate and up products share x: one dual-GEMM kernel reads it once and
            # applies silu and the product before its single store.
            h = metile.ops.gated_mlp(x, self.gate_proj.weight, self.up_proj.weight, "silu",
                                     backend=self.ops_backend)
        return _linear_residual(self.down_proj, h, residual, self.ops_backend)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.dims, eps=cfg.eps)
        self.attention = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dims, eps=cfg.eps)
        self.mlp = MLP(cfg)

    def __call__(self, x):
        h = self.attention(self.attention_norm(x), residual=x)
        return self.mlp(self.mlp_norm(h), residual=h)


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.dims)
        self.layers = [Block(cfg) for _ in range(cfg.layers)]
        self.norm = nn.RMSNorm(cfg.dims, eps=cfg.eps)
        self.lm_head = nn.Linear(cfg.dims, cfg.vocab, bias=False)

    def blocks(self, h):
        """The decoder blocks alone: (B, T, dims) -> (B, T, dims)."""
        for layer in self.layers:
            h = layer(h)
        return h

    def __call__(self, tokens):
        return self.lm_head(self.norm(self.blocks(self.embed_tokens(tokens))))


def build(cfg: Config = Config(), seed: int = 0) -> Decoder:
    """A Decoder with random weights (seeded) in cfg.dtype, evaluated."""
    mx.random.seed(seed)
    model = Decoder(cfg)
    model.set_dtype(getattr(mx, cfg.dtype))
    mx.eval(model.parameters())
    return model


def convert_all(model: nn.Module, backend: str = "auto"):
    """metile.nn.convert(model, backend=backend), then every module with an
    `ops_backend` flag switched to the metile ops.  Returns (convert's
    ConversionReport, {module path: the ops its forward now calls})."""
    if backend not in ("auto", "metile", "mlx"):
        raise ValueError(f"backend must be 'auto', 'metile' or 'mlx', got {backend!r}")
    report = metile.nn.convert(model, backend=backend)
    switched = {}
    for path, module in model.named_modules():
        if isinstance(module, Attention):
            switched[path] = "metile.ops.rope, scaled_dot_product_attention, linear(residual=)"
        elif isinstance(module, MLP):
            switched[path] = "metile.ops.gated_mlp, linear(residual=)"
        else:
            continue
        module.ops_backend = backend
    return report, switched


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="metile", choices=["auto", "metile", "mlx"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--tokens", type=positive_int, default=12)
    args = parser.parse_args()
    cfg = Config(dtype=args.dtype)
    reference, model = build(cfg), build(cfg)   # same seed: the same weights
    report, switched = convert_all(model, args.backend)
    print(report)
    for path, ops in sorted(switched.items()):
        print(f"  forward of {path} calls {ops}")
    tokens = mx.array(np.random.default_rng(0).integers(0, cfg.vocab, (2, args.tokens)),
                      dtype=mx.int32)
    want = np.array(reference(tokens).astype(mx.float32)).astype(np.float64)
    rtol, atol = TOLERANCE[args.dtype]
    for name, fn in (("eager", model), ("mx.compile", mx.compile(model))):
        got = np.array(fn(tokens).astype(mx.float32)).astype(np.float64)
        err = np.abs(got - want).max()
        print(f"{name:>10}: logits {got.shape}, max |converted - unconverted| = {err:.3g} "
              f"(logits up to {np.abs(want).max():.3g}), same argmax for "
              f"{(got.argmax(-1) == want.argmax(-1)).mean():.0%} of tokens")
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    print("OK")


if __name__ == "__main__":
    main()
