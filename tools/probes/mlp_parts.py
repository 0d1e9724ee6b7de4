"""Where the MLP forward's time goes against MLX (issue 14's 1.1x target): the gate/up half
(MLX's composite, metile's dual GEMM at its default and other warpgroup tiles, its default
tile with METILE_WGMMA_DUAL=joined (one m64n256 product over both weights), two single
metile GEMMs with the activation fused into the gate's) and the down projection with the
residual add (MLX's addmm, metile's linear with and without the residual), each
mx.compile'd, alternating, `launches` calls a synchronization, median of `rounds`.

    python3 tools/probes/mlp_parts.py [out.json] [--tokens 512 2048] [--dtype float16]
    python3 tools/probes/mlp_parts.py --tokens 16 --dims 64 --hidden 96 --rounds 1   # CPU smoke
"""
import argparse
import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, ".")
from benchmarks.common import machine, rotate_sized  # noqa: E402
from metile import ops  # noqa: E402

DIMS, HIDDEN = 4096, 11008
DUAL_TILES = {
    "dual 128x64": dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_simdgroups=8),
    "dual 64x128 (one warpgroup)": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_simdgroups=4),
    "dual 128x128 k32": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_simdgroups=8),
}


def rel(got, want) -> float:
    a = np.array(got.astype(mx.float32), np.float64)
    b = np.array(want.astype(mx.float32), np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--tokens", nargs="*", type=int, default=[512, 2048])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dims", type=int, default=DIMS)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    args = p.parse_args()
    dims, hidden = args.dims, args.hidden
    dtype = getattr(mx, args.dtype)
    rng = np.random.default_rng(0)

    def rand(*shape, scale=1.0):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)

    wg, wu = rand(hidden, dims, scale=dims ** -0.5), rand(hidden, dims, scale=dims ** -0.5)
    wd = rand(dims, hidden, scale=hidden ** -0.5)
    mx.eval(wg, wu, wd)
    report = {**machine(), "probe": "tools/probes/mlp_parts.py", "dtype": args.dtype,
              "metric": "median us per mx.compile'd call, alternating, many calls a sync",
              "cases": []}
    for t in args.tokens:
        x, h, r = rand(t, dims), rand(t, hidden, scale=0.1), rand(t, dims)
        mx.eval(x, h, r)
        f32 = lambda a: a.astype(mx.float32)  # noqa: E731
        want_gate = nn.silu(f32(x) @ f32(wg).T) * (f32(x) @ f32(wu).T)
        want_down = f32(h) @ f32(wd).T + f32(r)
        default = ops._dual_block(ops._block(t, hidden, dtype, transpose_b=True, k=dims))
        gate = {
            "mlx composite": lambda x: nn.silu(x @ wg.T) * (x @ wu.T),
            f"dual default {default}": lambda x, b=default: ops._launch_gated(
                x, wg, wu, "silu", b),
        }
        gate[f"dual default, METILE_WGMMA_DUAL=joined"] = lambda x, b=default: ops._launch_gated(
            x, wg, wu, "silu", b)
        for name, tile in DUAL_TILES.items():
            gate[name] = lambda x, b={**tile, "TRANSPOSE_B": True}: ops._launch_gated(
                x, wg, wu, "silu", b)
        gate["two metile GEMMs (silu in the gate's)"] = lambda x: ops.linear(
            x, wg, activation="silu", backend="metile") * ops.linear(x, wu, backend="metile")
        gate["one metile GEMM (x @ wg.T)"] = lambda x: ops.linear(x, wg, backend="metile")
        gate["one mlx GEMM (x @ wg.T)"] = lambda x: x @ wg.T
        down = {
            "mlx addmm(r, h, wd.T)": lambda h: mx.addmm(r, h, wd.T),
            "mlx h @ wd.T": lambda h: h @ wd.T,
            "metile linear + residual": lambda h: ops.linear(h, wd, residual=r, backend="metile"),
            "metile linear": lambda h: ops.linear(h, wd, backend="metile"),
        }
        case = {"tokens": t, "gate_up": {}, "down": {}}
        for part, fns, arg, want in (("gate_up", gate, x, want_gate), ("down", down, h, want_down)):
            ok = {}
            for name, fn in fns.items():
                # (a variant named with a setting is traced under it: the compiled graph
                # keeps the kernel resolved then)
                setting = name.split(", ")[-1] if "METILE_" in name else None
                try:
                    if setting:
                        os.environ[setting.split("=")[0]] = setting.split("=")[1]
                    c = mx.compile(fn)
                    got = c(arg)
                    mx.eval(got)
                    error = rel(got, want) if "GEMM (x @ wg.T)" not in name and \
                        name not in ("mlx h @ wd.T", "metile linear") else None
                    case[part][name] = {"relative_error": error}
                    ok[name] = c
                except Exception as e:   # a tile the compiler refuses: say so, time the rest
                    case[part][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                finally:
                    if setting:
                        del os.environ[setting.split("=")[0]]
            times = rotate_sized(ok, arg, args.rounds)
            base = times[next(iter(ok))]
            for name, s in times.items():
                case[part][name].update(us=round(s * 1e6, 1), vs_mlx=round(base / s, 3))
                print(f"T={t:5d} {part:8s} {name:45s} {s * 1e6:8.1f} us  {base / s:5.2f}x",
                      flush=True)
        report["cases"].append(case)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
