"""The llama-style decoder of examples/decoder_block.py (issue 14 item 6), converted
with metile.nn.convert plus its ops flags: logits, mx.compile and training steps
against the unconverted model, the unconverted model against NumPy float64."""

import importlib.util
import math
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

import metile
from metile import _ext, attention_ops, model_ops, op_replay, ops
from test_convert import training_losses

_spec = importlib.util.spec_from_file_location(
    "decoder_block", Path(__file__).resolve().parents[1] / "examples" / "decoder_block.py")
db = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("decoder_block", db)   # dataclasses look their module up by name
_spec.loader.exec_module(db)

# dims 32-64, 2 blocks, grouped-query heads (4 query heads on 2 k/v heads)
SMALL = dict(vocab=37, dims=32, heads=4, kv_heads=2, hidden=48, layers=2)
TOLERANCE = db.TOLERANCE


def tokens(rng, cfg, length):
    return mx.array(rng.integers(0, cfg.vocab, (2, length)), dtype=mx.int32)


def f64(a):
    return np.array(a.astype(mx.float32)).astype(np.float64)


def numpy_decoder(model, cfg, toks):
    """The decoder in float64 NumPy from the model's weights."""
    p = {k: f64(v) for k, v in tree_flatten(model.parameters())}

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.eps) * w

    def rope(x):   # (B, H, T, D), rotating halves (traditional=False)
        d = cfg.head_dim
        inv = cfg.rope_base ** (-np.arange(0, d, 2) / d)
        angle = np.arange(x.shape[2])[:, None] * inv[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        a, b = x[..., :d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    t = toks.shape[1]
    h = p["embed_tokens.weight"][np.array(toks)]
    causal = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(cfg.layers):
        w = {k[len(f"layers.{i}."):]: v for k, v in p.items() if k.startswith(f"layers.{i}.")}
        x = rms(h, w["attention_norm.weight"])

        def heads(y, n):
            return y.reshape(y.shape[0], t, n, cfg.head_dim).transpose(0, 2, 1, 3)

        q = rope(heads(x @ w["attention.q_proj.weight"].T, cfg.heads))
        k = rope(heads(x @ w["attention.k_proj.weight"].T, cfg.kv_heads))
        v = heads(x @ w["attention.v_proj.weight"].T, cfg.kv_heads)
        group = cfg.heads // cfg.kv_heads
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(cfg.head_dim) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        h = h + o.transpose(0, 2, 1, 3).reshape(h.shape) @ w["attention.o_proj.weight"].T
        x = rms(h, w["mlp_norm.weight"])
        g = x @ w["mlp.gate_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * (x @ w["mlp.up_proj.weight"].T)) @ \
            w["mlp.down_proj.weight"].T
    return rms(h, p["norm.weight"]) @ p["lm_head.weight"].T


def twins(dtype="float32"):
    cfg = db.Config(**SMALL, dtype=dtype)
    return cfg, db.build(cfg), db.build(cfg)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts of the metile kernel paths taken (each op's fused/differentiable kernel)."""
    counts = {}
    for module, name in ((ops, "_fused_gated"), (ops, "_linear_metile"),
                         (attention_ops, "_run"), (model_ops, "_rope_fn"),
                         (model_ops, "_rms_fn")):
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    def replayed(op, kernel):
        # a repeated call replays its launch (op_replay.py) instead of taking the path
        # counted above: counted with it when a kernel's replay runs
        name = {"linear": "_linear_metile", "rms_norm": "_rms_fn",
                "gated_mlp": "_fused_gated"}.get(op)
        if kernel and name is not None:
            counts[name] = counts.get(name, 0) + 1

    monkeypatch.setattr(op_replay._REPLAYS, "observer", replayed)
    return counts


def test_the_unconverted_model_matches_numpy(rng):
    cfg, model, _ = twins()
    t = tokens(rng, cfg, 11)
    np.testing.assert_allclose(f64(model(t)), numpy_decoder(model, cfg, t), rtol=1e-4, atol=1e-5)


def test_convert_all_reports_layers_and_switched_forwards():
    _, reference, model = twins()
    keys = [k for k, _ in tree_flatten(reference.parameters())]
    weight = model.layers[0].mlp.gate_proj.weight
    report, switched = db.convert_all(model, "metile")
    per_block = ["attention_norm", "attention.q_proj", "attention.k_proj", "attention.v_proj",
                 "attention.o_proj", "mlp_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert sorted(report.converted) == sorted(
        [f"layers.{i}.{p}" for i in range(2) for p in per_block] + ["norm", "lm_head"])
    assert report.skipped == {"embed_tokens": "not an mlx.nn.Linear (Embedding)"}
    assert sorted(switched) == ["layers.0.attention", "layers.0.mlp", "layers.1.attention",
                                "layers.1.mlp"]
    assert isinstance(model.layers[1].mlp.gate_proj, metile.nn.Linear)
    assert isinstance(model.norm, metile.nn.RMSNorm)
    assert model.layers[1].attention.ops_backend == "metile"
    assert model.layers[0].mlp.gate_proj.weight is weight
    assert [k for k, _ in tree_flatten(model.parameters())] == keys
    with pytest.raises(ValueError, match="backend must be 'auto', 'metile' or 'mlx'"):
        db.convert_all(model, "cuda")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("backend", ["metile", "auto"])
def test_converted_logits_match_eager_and_compiled(rng, backend, dtype, kernel_calls):
    cfg, reference, model = twins(dtype)
    db.convert_all(model, backend)
    rtol, atol = TOLERANCE[dtype]
    for length in (7, 16):
        t = tokens(rng, cfg, length)
        want = f64(reference(t))
        np.testing.assert_allclose(f64(model(t)), want, rtol=rtol, atol=atol)
        compiled, compiled_reference = mx.compile(model), mx.compile(reference)
        np.testing.assert_allclose(f64(compiled(t)), f64(compiled_reference(t)), rtol=rtol,
                                   atol=atol)
    if dtype == "float32":
        np.testing.assert_allclose(want, numpy_decoder(reference, cfg, t), rtol=1e-4, atol=1e-5)
    if backend == "metile":
        # every metile path ran: per block 3 projections eager + o/down with the residual
        # epilogue, plus the head; two RMSNorms per block plus the final one
        assert kernel_calls["_fused_gated"] >= 2 and kernel_calls["_run"] >= 2
        assert kernel_calls["_rope_fn"] >= 4 and kernel_calls["_rms_fn"] >= 5
        assert kernel_calls["_linear_metile"] >= 11
    elif mx.default_device().type == mx.cpu:
        # auto on the CPU keeps MLX's ops (cost model: kernels would run in the emulator)
        assert kernel_calls == {}


@pytest.mark.parametrize("backend", ["metile", "auto"])
def test_training_steps_give_the_unconverted_losses(rng, backend, kernel_calls):
    cfg, reference, model = twins()
    db.convert_all(model, backend)
    t = tokens(rng, cfg, 9)
    inputs, targets = t[:, :-1], t[:, 1:]

    def run(m):
        return training_losses(
            m, optim.AdamW(learning_rate=3e-3),
            lambda m: nn.losses.cross_entropy(m(inputs), targets, reduction="mean"), steps=4)

    ours, theirs = run(model), run(reference)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    assert ours[-1] < ours[0]
    if backend == "metile":
        assert kernel_calls["_fused_gated"] >= 2 and kernel_calls["_run"] >= 2
    for (key, a), (_, b) in zip(tree_flatten(model.parameters()),
                                tree_flatten(reference.parameters())):
        np.testing.assert_allclose(f64(a), f64(b), rtol=1e-3, atol=1e-5, err_msg=key)


def test_bad_config_is_refused_early():
    with pytest.raises(ValueError, match="heads 4 is not a multiple of kv_heads 3"):
        db.Config(dims=32, heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="head dimension 5 must be even"):
        db.Config(dims=20, heads=4, kv_heads=2)
