"""The llama-style decoder block of examples/decoder_block.py (issue 14 item 6, issue 17's
last must-show): converted to metile against unconverted, forward and forward+backward.

    python -m benchmarks.decoder_block [--dtypes float16 bfloat16] [--tokens 512 2048] \
        [--blocks 1] --output benchmarks/results/h200-decoder-block.json
    python -m benchmarks.decoder_block --quick        # tiny sizes: checks the script runs (CPU)

Sizes: hidden 4096, gated-MLP width 11008, 32 query heads on 8 k/v heads (head
dimension 128), batch 1, T tokens; one block's weights are ~350 MB in 16 bits.
Only the blocks run (no embedding or LM head): input (1, T, hidden) activations.

Variants, all sharing the same weight arrays:
  unconverted  the MLX model as written (mx.fast.rope / scaled_dot_product_attention,
               nn.Linear, nn.RMSNorm, silu(gate(x)) * up(x), `+` residuals);
  auto         convert_all(model, "auto"): every op routed by measurement, measured
               once per signature (metile.ops.tuning) before compiling;
  metile       convert_all(model, "metile"): every op forced onto its metile kernel;
  mlx-again    the unconverted model compiled a second time (a control: its speedup is
               what this run's noise alone gives a variant that runs the same kernels,
               the band a converted block routed to MLX falls in).

--residual-add (a probe): the residual linears' MLX composite as `x @ w.T + r` instead
of mx.addmm(r, x, w.T), for every variant of the run.

"forward" is blocks(x); "forward+backward" is nn.value_and_grad of
sum(blocks(x) * cotangent) over every parameter.  Each is mx.compile'd (the model
state as compile inputs), checked against the unconverted model before timing
(relative Frobenius error of the output, the loss and the first block's gate_proj
gradient; a variant outside the tolerance is reported and not timed unless
--time-anyway), then timed as benchmarks/model_ops.py: a sample enqueues `launches`
calls and synchronises once; the variants rotate order every round and each
latency is the median over rounds.  speedup = unconverted / variant.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

import metile
from benchmarks.common import (
    machine, rotate, sample, write_report, positive_int, positive_float, output_path)
from metile import attention_ops
from metile.runtime import cache

_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "decoder_block.py"
_spec = importlib.util.spec_from_file_location("decoder_block", _EXAMPLE)
db = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("decoder_block", db)   # dataclasses look their module up by name
_spec.loader.exec_module(db)

# relative Frobenius error against the unconverted model
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
FULL = dict(dims=4096, heads=32, kv_heads=8, hidden=11008, tokens=[512, 2048])
QUICK = dict(dims=64, heads=4, kv_heads=2, hidden=96, tokens=[16, 33])
MODES = ("forward", "forward+backward")


def relative_error(got, want) -> float:
    a = np.array(got.astype(mx.float32)).astype(np.float64)
    b = np.array(want.astype(mx.float32)).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compiled_pair(model, cotangent):
    """(forward, forward+backward), each mx.compile'd with the model's state as inputs."""
    def loss(x):
        return (model.blocks(x).astype(mx.float32) * cotangent).sum()

    grad = nn.value_and_grad(model, loss)
    forward = mx.compile(lambda x: model.blocks(x), inputs=model.state)
    backward = mx.compile(grad, inputs=model.state, outputs=model.state)
    return forward, backward


def check(outputs, reference, tol) -> dict:
    """Errors of a variant's forward output, loss and one weight gradient."""
    (out, (loss, grads)), (ref_out, (ref_loss, ref_grads)) = outputs, reference
    name = "layers.0.mlp.gate_proj.weight"
    g = dict(tree_flatten(grads))[name]
    ref_g = dict(tree_flatten(ref_grads))[name]
    errors = {"output": relative_error(out, ref_out), "loss": relative_error(loss, ref_loss),
              "grad " + name: relative_error(g, ref_g)}
    return {"relative_errors": errors, "within_tolerance": max(errors.values()) <= tol,
            "tolerance": tol}


def routes(model, x) -> dict:
    """Which path `auto` chose for the first block's GEMMs and attention (explain_*)."""
    a, m = model.layers[0].attention, model.layers[0].mlp
    t, cfg = x.shape[1], a
    q = mx.zeros((1, cfg.heads, t, cfg.head_dim), x.dtype)
    k = mx.zeros((1, cfg.kv_heads, t, cfg.head_dim), x.dtype)
    hidden = mx.zeros((*x.shape[:2], m.down_proj.weight.shape[1]), x.dtype)
    found = {
        "q_proj": metile.ops.explain_linear(x, a.q_proj.weight),
        "k_proj": metile.ops.explain_linear(x, a.k_proj.weight),
        "o_proj+residual": metile.ops.explain_linear(x, a.o_proj.weight, residual=x),
        "gated_mlp": metile.ops.explain_gated_mlp(x, m.gate_proj.weight, m.up_proj.weight),
        "down_proj+residual": metile.ops.explain_linear(hidden, m.down_proj.weight,
                                                        residual=x),
        "attention": json.loads(attention_ops.explain_attention(q, k, k, scale=a.scale,
                                                                 mask="causal")),
    }
    out = {}
    for name, info in found.items():
        info = json.loads(info) if isinstance(info, str) else info
        route = info.get("route", {})
        out[name] = {"path": info.get("path"), "winner": route.get("winner"),
                     "reason": info.get("reason") or route.get("reason")}
    return out


def run_case(cfg, tokens: int, variants, args) -> dict:
    reference = db.build(cfg, seed=args.seed)
    models = {"unconverted": reference}
    for v in variants:
        m = db.Decoder(cfg)   # its random initialisation is lazy and replaced, never computed
        m.update(reference.parameters())        # the same arrays: no second copy
        if v != "mlx-again":
            db.convert_all(m, v)
        models[v] = m
    dtype = getattr(mx, cfg.dtype)
    keys = mx.random.split(mx.random.key(args.seed + tokens), 2)
    x = mx.random.normal((1, tokens, cfg.dims), key=keys[0]).astype(dtype)
    cotangent = mx.random.normal((1, tokens, cfg.dims), key=keys[1])
    mx.eval(x, cotangent)
    case = {"tokens": tokens, "dtype": cfg.dtype, "variants": {}}
    if "auto" in models:
        start = time.perf_counter()
        with metile.ops.tuning(args.tune_budget_s):
            mx.eval(models["auto"].blocks(x))     # measures each op signature once
        case["auto_tuning_s"] = time.perf_counter() - start
        case["auto_routes"] = routes(models["auto"], x)
    fns, results = {}, {}
    for name, m in models.items():
        try:
            fwd, fwd_bwd = compiled_pair(m, cotangent)
            results[name] = (fwd(x), fwd_bwd(x))
            mx.eval(results[name])
            fns[name] = (fwd, fwd_bwd)
        except Exception as e:   # a variant that fails is reported, the others still run
            case["variants"][name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"T={tokens} {cfg.dtype} {name}: {case['variants'][name]['error'][:300]}")
    if "unconverted" not in fns:
        return case
    timed = {}
    for name in fns:
        entry = case["variants"].setdefault(name, {})
        if name != "unconverted":
            entry.update(check(results[name], results["unconverted"], TOLERANCE[cfg.dtype]))
            if not entry["within_tolerance"] and not args.time_anyway:
                print(f"T={tokens} {cfg.dtype} {name}: outside tolerance {entry}")
                continue
        timed[name] = fns[name]
    for i, mode in enumerate(MODES):
        one = sample(timed["unconverted"][i], x, 1)
        launches = int(min(args.max_launches, max(2, args.target_ms / 1e3 / max(one, 1e-7))))
        medians = rotate({n: f[i] for n, f in timed.items()}, x, launches, args.rounds)
        base = medians["unconverted"]
        for name, seconds in medians.items():
            entry = case["variants"][name].setdefault(mode, {})
            entry.update({"us": seconds * 1e6, "launches_per_sample": launches})
            if name != "unconverted":
                entry["speedup"] = base / seconds
        print(f"T={tokens:>5} {cfg.dtype:<8} {mode:<16} " + "  ".join(
            f"{n} {s * 1e6:9.1f} us" + ("" if n == "unconverted" else f" ({base / s:.2f}x)")
            for n, s in medians.items()))
    return case


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"],
                        choices=sorted(TOLERANCE))
    parser.add_argument("--tokens", nargs="*", type=positive_int)
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--variants", nargs="*", default=["auto", "metile"],
                        choices=["auto", "metile", "mlx-again"])
    parser.add_argument("--residual-add", action="store_true",
                        help="probe: residual linears routed to MLX as matmul + add, not addmm")
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-ms", type=positive_float, default=60.0, help="wall time per sample")
    parser.add_argument("--max-launches", type=positive_int, default=50)
    parser.add_argument("--tune-budget-s", type=float, default=None,
                        help="measurement budget per op signature for 'auto' (routing default)")
    parser.add_argument("--time-anyway", action="store_true",
                        help="time variants outside the tolerance too (marked in the JSON)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run on CPU)")
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args()
    if args.residual_add:
        from metile import ops

        def matmul_then_add(x2, w, bias, act, slope, residual=None):
            z = ops._linear_mlx(x2, w, bias, act, slope)
            return z if residual is None else z + residual
        ops._linear_mlx_residual = matmul_then_add
    sizes = QUICK if args.quick else FULL
    tokens = args.tokens or sizes["tokens"]
    cases = []
    for dtype in args.dtypes:
        cfg = db.Config(vocab=8, dims=sizes["dims"], heads=sizes["heads"],
                        kv_heads=sizes["kv_heads"], hidden=sizes["hidden"], layers=args.blocks,
                        dtype=dtype)
        for t in tokens:
            cases.append(run_case(cfg, t, args.variants, args))
            mx.clear_cache()
    summary = {}
    for case in cases:
        for name, entry in case["variants"].items():
            for mode in MODES:
                if name != "unconverted" and "speedup" in entry.get(mode, {}):
                    summary.setdefault(name, []).append(
                        {"dtype": case["dtype"], "tokens": case["tokens"], "mode": mode,
                         "speedup": entry[mode]["speedup"]})
    never_slower = [s["speedup"] >= 1.0 for s in summary.get("auto", [])]
    report = {
        **machine(),
        "metile_version": metile.__version__,
        "compiler_implementation": cache.compiler_fingerprint(),
        "benchmark_source_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "example_source_sha256": hashlib.sha256(_EXAMPLE.read_bytes()).hexdigest(),
        "environment": {k: os.environ.get(k) for k in ("MLX_ENABLE_TF32", "METILE_OPS_TUNE")},
        "metric": "rotating-order, per-invocation synchronized wall latency of mx.compile'd "
                  "calls (several launches per sync), median over rounds; setup, compilation "
                  "and auto's measurement excluded",
        "configuration": {"dims": sizes["dims"], "heads": sizes["heads"],
                          "kv_heads": sizes["kv_heads"], "hidden": sizes["hidden"],
                          "blocks": args.blocks, "batch": 1, "tokens": tokens,
                          "dtypes": args.dtypes, "variants": args.variants,
                          "rounds": args.rounds, "seed": args.seed, "target_ms": args.target_ms,
                          "tune_budget_s": args.tune_budget_s, "quick": args.quick,
                          "residual_add": args.residual_add,
                          "time_anyway": args.time_anyway},
        # tiny sizes on a CPU say nothing about the target (and auto keeps MLX's ops there)
        "targets": {"auto_never_slower": {"target": "speedup >= 1.0 in every case",
                                          "met": None if args.quick else
                                          bool(never_slower) and all(never_slower)}},
        "summary": summary,
        "cases": cases,
    }
    print(f"auto never slower (>= 1.0x everywhere): {report['targets']['auto_never_slower']}")
    write_report(args.output, report)


if __name__ == "__main__":
    main()
