"""A model's GEMM layers through metile.ops against the MLX composites they replace
(issue 14's must-show: `linear` + bias + gelu and `gated_mlp` against the MLX composite,
and the MLP forward), each mx.compile'd, alternating in one run:

  gated_mlp      silu(x @ w_gate.T) * (x @ w_up.T)
  mlp            gated_mlp followed by down_proj with the residual add (a decoder
                 block's MLP half, forward)
  linear_gelu    gelu_tanh(x @ w.T + b)

Variants: `mlx` (the composite as mlx.nn computes it: ops' backend="mlx"), `metile`
(backend="metile": the op's default kernel), `auto` (what a user of the ops gets: each op
signature measured once first under metile.ops.tuning, then compiled) and, with
--configs, every candidate tile the router measures.  Shapes: hidden 4096, MLP width 11008, T tokens (default 512, 2048,
4096).  Each variant is checked against NumPy-free MLX float32 math first (relative
Frobenius error); a sample enqueues `launches` calls and synchronises once; the order
rotates each round; the latency is the median over rounds; speedup = mlx / variant.

    python -m benchmarks.model_layers [--dtypes float16 bfloat16] [--tokens 512 2048 4096] \
        [--layers gated_mlp mlp linear_gelu] [--configs] --output out.json
    python -m benchmarks.model_layers --quick      # tiny shapes (runs on the CPU)
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

import metile
from benchmarks.common import (
    machine, rotate, sample, write_report, positive_int, positive_float, output_path)
from metile import ops

TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
FULL = dict(dims=4096, hidden=11008, tokens=[512, 2048, 4096])
QUICK = dict(dims=64, hidden=96, tokens=[16, 33])


def relative_error(got, want) -> float:
    a = np.array(got.astype(mx.float32)).astype(np.float64)
    b = np.array(want.astype(mx.float32)).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def x_like(w):
    return mx.zeros((16, w.shape[1]), w.dtype)


def layer_fns(layer: str, weights: dict, configs: bool) -> tuple[dict, callable]:
    """{variant: fn(x)} and the float32 reference fn(x)."""
    wg, wu, wd, w, b = (weights[k] for k in ("gate", "up", "down", "linear", "bias"))

    def f32(a):
        return a.astype(mx.float32)

    if layer == "gated_mlp":
        def make(backend):
            return lambda x: ops.gated_mlp(x, wg, wu, backend=backend)

        def ref(x):
            g = f32(x) @ f32(wg).T
            return g * mx.sigmoid(g) * (f32(x) @ f32(wu).T)
        fns = {n: make(n) for n in ("mlx", "metile", "auto")}
        if configs:
            # auto's candidates and the tile backend="metile" runs (warpgroup dual)
            forced = ops._route("gated_mlp", (x_like(wg), wg, wu), "silu", None, "metile").block
            for c in [forced] + [c for c in ops.gated_configs(wg.dtype) if c != forced]:
                fns[ops._config_name(c)] = (
                    lambda x, c=c: ops._fused_gated("silu", c)(x, wg, wu))
        return fns, ref
    if layer == "mlp":
        def make(backend):
            return lambda x: ops.linear(ops.gated_mlp(x, wg, wu, backend=backend), wd,
                                        residual=x, backend=backend)

        def ref(x):
            g = f32(x) @ f32(wg).T
            return (g * mx.sigmoid(g) * (f32(x) @ f32(wu).T)) @ f32(wd).T + f32(x)
        return {n: make(n) for n in ("mlx", "metile", "auto")}, ref
    if layer == "linear_gelu":
        def make(backend):
            return lambda x: ops.linear(x, w, b, "gelu_tanh", backend=backend)

        def ref(x):
            return ops.activate(f32(x) @ f32(w).T + f32(b), "gelu_tanh")
        fns = {n: make(n) for n in ("mlx", "metile", "auto")}
        if configs:
            for c in ops.metile_configs(w.dtype, "x@w.T"):
                fns[ops._config_name(c)] = (
                    lambda x, c=c: ops._linear_metile(x, w, b, "gelu_tanh", 0.0, c, None))
        return fns, ref
    raise ValueError(f"unknown layer {layer!r}")


def run_case(layer, dtype, tokens, sizes, args) -> dict:
    dt = getattr(mx, dtype)
    keys = mx.random.split(mx.random.key(args.seed + tokens), 7)
    d, h = sizes["dims"], sizes["hidden"]

    def normal(shape, key, scale):
        return (scale * mx.random.normal(shape, key=key)).astype(dt)
    weights = {"gate": normal((h, d), keys[0], d ** -0.5), "up": normal((h, d), keys[1], d ** -0.5),
               "down": normal((d, h), keys[2], h ** -0.5), "linear": normal((h, d), keys[3], d ** -0.5),
               "bias": normal((h,), keys[4], 0.1)}
    x = normal((tokens, d), keys[5], 1.0)
    mx.eval(x, *weights.values())
    fns, ref = layer_fns(layer, weights, args.configs)
    if "auto" not in args.variants:
        del fns["auto"]
    if "metile" not in args.variants:
        del fns["metile"]
    want = ref(x)
    case = {"layer": layer, "dtype": dtype, "tokens": tokens, "dims": d, "hidden": h,
            "variants": {}}
    if "auto" in fns:
        # what a user of the ops gets: each op signature measured once, eagerly (a call
        # traced by mx.compile is not measured), then compiled like the others
        start = time.perf_counter()
        with metile.ops.tuning(args.tune_budget_s):
            mx.eval(fns["auto"](x))
        case["auto_tuning_s"] = time.perf_counter() - start
    timed = {}
    for name, fn in fns.items():
        entry = case["variants"].setdefault(name, {})
        try:
            compiled = mx.compile(fn)
            err = relative_error(compiled(x), want)
        except Exception as e:   # a variant that fails is reported, the others still run
            entry["error"] = f"{type(e).__name__}: {e}"[:1000]
            print(f"{layer} T={tokens} {dtype} {name}: {entry['error'][:200]}")
            continue
        entry["relative_error"] = err
        entry["within_tolerance"] = err <= TOLERANCE[dtype]
        if entry["within_tolerance"] or args.time_anyway:
            timed[name] = compiled
    if "mlx" not in timed:
        return case
    one = sample(timed["mlx"], x, 1)
    launches = max(1, min(args.max_launches, int(args.target_ms / 1e3 / max(one, 1e-6))))
    times = rotate(timed, x, launches, args.rounds)
    flops = {"gated_mlp": 4 * tokens * d * h, "mlp": 6 * tokens * d * h,
             "linear_gelu": 2 * tokens * d * h}[layer]
    for name, t in times.items():
        entry = case["variants"][name]
        entry.update(us=t * 1e6, tflops=flops / t / 1e12)
        if name != "mlx":
            entry["speedup"] = times["mlx"] / t
    case["launches_per_sample"] = launches
    line = "  ".join(f"{n} {t * 1e6:8.1f} us" + (f" ({times['mlx'] / t:.2f}x)" if n != "mlx" else "")
                     for n, t in times.items())
    print(f"{layer:12s} T={tokens:5d} {dtype:8s} {line}", flush=True)
    return case


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"],
                        choices=sorted(TOLERANCE))
    parser.add_argument("--tokens", nargs="*", type=positive_int)
    parser.add_argument("--layers", nargs="*", default=["gated_mlp", "mlp", "linear_gelu"])
    parser.add_argument("--configs", action="store_true", help="every candidate tile too")
    parser.add_argument("--variants", nargs="*", default=["metile", "auto"],
                        choices=["metile", "auto"], help="beside mlx: backend='metile', and "
                        "'auto' (measured once per op signature first, metile.ops.tuning)")
    parser.add_argument("--tune-budget-s", type=positive_float, default=None,
                        help="auto's measurement budget per op signature (routing default)")
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-ms", type=positive_float, default=30.0, help="wall time per sample")
    parser.add_argument("--max-launches", type=positive_int, default=50)
    parser.add_argument("--time-anyway", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    tokens = args.tokens or sizes["tokens"]
    cases = []
    for dtype in args.dtypes:
        for layer in args.layers:
            for t in tokens:
                cases.append(run_case(layer, dtype, t, sizes, args))
    summary = {}
    for c in cases:
        for variant in ("metile", "auto"):
            v = c["variants"].get(variant, {})
            if "speedup" in v:
                summary.setdefault(c["layer"], []).append(
                    {"variant": variant, "dtype": c["dtype"], "tokens": c["tokens"],
                     "speedup": v["speedup"]})
    mlp = [s["speedup"] for s in summary.get("mlp", []) if s["variant"] == "metile"]
    mlp_auto = [s["speedup"] for s in summary.get("mlp", []) if s["variant"] == "auto"]
    report = {**machine(), "metile_version": metile.__version__,
              "metric": "alternating, synchronized wall latency of mx.compile'd calls, many "
                        "launches per sync; median over rounds; speedup = mlx / variant",
              "configuration": {**sizes, "tokens": tokens, "dtypes": args.dtypes,
                                "layers": args.layers, "rounds": args.rounds},
              "targets": {"mlp_forward": {"target": "metile >= 1.1x the MLX composite",
                                          "speedups": mlp,
                                          "met": bool(mlp) and min(mlp) >= 1.1},
                          "mlp_forward_auto": {"target": "auto >= 1.1x the MLX composite",
                                               "speedups": mlp_auto,
                                               "met": bool(mlp_auto) and min(mlp_auto) >= 1.1}},
              "summary": summary, "cases": cases}
    write_report(args.output, report)


if __name__ == "__main__":
    main()
