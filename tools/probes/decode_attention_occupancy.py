"""Decode attention at more resident programs an SM (issue 17): the default attention_decode
launch (1x32x4096x128 float16, one query; 8 keys, 2 warps, 32 splits) holds 128 registers a
thread - 8 programs, 25% occupancy, 64% of DRAM (s97 ncu).  Here the same kernel is compiled
with `__launch_bounds__` asking for 12 and 16 programs an SM (ptxas caps its registers at 85
and 64), each its own kernel object and cache folder, and timed as benchmarks.attention times
the op: compiled calls chained on their output, MLX's op alternating.  With --ncu each
variant is launched a few times for ncu (registers, duration, DRAM throughput).

    python3 tools/probes/decode_attention_occupancy.py [out.json]
    ncu --section SpeedOfLight --section LaunchStats -k regex:attention_decode \
        python3 tools/probes/decode_attention_occupancy.py --ncu
"""
import argparse
import json
import math
import os
import sys
import tempfile
import types

import mlx.core as mx
import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "kernels")
import metile  # noqa: E402
from benchmarks.attention import seconds_per_call  # noqa: E402
from benchmarks.common import machine  # noqa: E402
from metile import attention_ops  # noqa: E402
from metile.passes import lower_tiles  # noqa: E402
from metile_kernels import attention as kernels  # noqa: E402

CONFIG = {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 2, "SPLITS": 32}


def variant(blocks: int, q, k, v, scale):
    """A compiled decode step whose attention_decode asks for `blocks` programs an SM (0:
    the compiler's own choice), compiled now, under its own cache folder."""
    os.environ["METILE_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"occupancy{blocks}-")
    own = metile.kernel(kernels.attention_decode.fn)
    ns = types.SimpleNamespace(**{n: getattr(kernels, n) for n in dir(kernels)
                                  if not n.startswith("__")})
    ns.attention_decode = own
    original = lower_tiles.Lowering.occupancy_hint

    def hint(self):
        if blocks and self.language == "cuda" and self.fn.name.startswith("attention_decode"):
            return blocks
        return original(self)

    def step(q, k, v):
        out = attention_ops._launch_rows(ns, q, k, (k, v, 0, 0), q, "none", [0, 0, 0, 0],
                                         scale * math.log2(math.e), CONFIG)
        return out.astype(q.dtype)

    lower_tiles.Lowering.occupancy_hint = hint
    try:
        fn = mx.compile(step)
        mx.eval(fn(q, k, v))
        eager = step
        mx.eval(eager(q, k, v))
    finally:
        lower_tiles.Lowering.occupancy_hint = original
    return fn, eager


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--launches", type=int, default=100)
    p.add_argument("--ncu", action="store_true")
    args = p.parse_args()
    keys = mx.random.split(mx.random.key(0), 3)
    q = mx.random.normal((1, 32, 1, 128), key=keys[0]).astype(mx.float16)
    k = mx.random.normal((1, 32, 4096, 128), key=keys[1]).astype(mx.float16)
    v = mx.random.normal((1, 32, 4096, 128), key=keys[2]).astype(mx.float16)
    mx.eval(q, k, v)
    scale = 128 ** -0.5
    want = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale).astype(mx.float32))
    fns, report = {}, {**machine(), "probe": "tools/probes/decode_attention_occupancy.py",
                       "config": CONFIG, "variants": {}}
    fns["mlx"] = mx.compile(lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v,
                                                                                 scale=scale))
    eagers = {}
    for blocks in (0, 12, 16):
        name = f"attention_decode min_blocks {blocks or 'auto'}"
        try:
            fn, eager = variant(blocks, q, k, v, scale)
        except Exception as e:
            print(name, type(e).__name__, str(e)[:200], flush=True)
            continue
        err = float(np.abs(np.array(fn(q, k, v).astype(mx.float32)) - want).max())
        report["variants"][name] = {"max_error_vs_mlx": err}
        print(name, f"max error {err:.2e}", "WRONG" if err > 1e-2 else "", flush=True)
        if err <= 1e-2:
            fns[name], eagers[name] = fn, eager
    if args.ncu:
        for name, eager in eagers.items():
            print("side", name, flush=True)
            for _ in range(3):
                mx.eval(eager(q, k, v))
                mx.synchronize()
        return
    times = {n: [] for n in fns}
    for fn in fns.values():
        seconds_per_call(fn, q, k, v, 2)
    order = list(fns)
    for r in range(args.rounds):
        for n in (order if r % 2 == 0 else order[::-1]):
            times[n].append(seconds_per_call(fns[n], q, k, v, args.launches))
    mlx_us = float(np.median(times["mlx"])) * 1e6
    for n, t in times.items():
        us = float(np.median(t)) * 1e6
        report["variants"].setdefault(n, {}).update(us=round(us, 1), mlx_over=round(mlx_us / us, 3))
        print(f"{n:34s} {us:7.1f} us  mlx/this {mlx_us / us:5.2f}", flush=True)
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
