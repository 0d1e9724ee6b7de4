"""Decode attention (one query, 1x32x4096x128 float16, the issue's shape) on the GPU:
the split kernel (general products) and attention_decode (rows summed on lanes) at
several key blocks, warp counts and split counts, against MLX's op, each an `mx.compile`d call timed like
benchmarks/quantized.py (many launches per sync, alternating, median of rounds).

    python tools/probes/decode_attention.py [--rounds 5]
"""

import argparse
import json
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

from benchmarks.quantized import seconds_per_call   # noqa: E402
from metile import attention_ops                     # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--keys", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    args = parser.parse_args()
    keys = mx.random.split(mx.random.key(0), 3)
    q = mx.random.normal((1, args.heads, 1, 128), key=keys[0]).astype(mx.float16)
    k = mx.random.normal((1, args.kv_heads, args.keys, 128), key=keys[1]).astype(mx.float16)
    v = mx.random.normal((1, args.kv_heads, args.keys, 128), key=keys[2]).astype(mx.float16)
    mx.eval(q, k, v)
    scale = 128 ** -0.5
    fns = {"mlx": mx.compile(lambda q: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale))}
    rows = args.heads // args.kv_heads
    for m, n, warps, splits in ((rows, 64, 8, None), (rows, 128, 8, None)):
        cfg = {"path": "decode", "BLOCK_M": m, "BLOCK_N": n, "num_warps": warps,
               "SPLITS": splits}
        fns[f"split M{m} N{n} w{warps} s{splits}"] = mx.compile(
            lambda q, cfg=cfg: attention_ops._launch(q, k, v, None, scale, cfg))
    # attention_decode (no matrix products): keys a block, warps, splits, combine
    for n, warps, splits, combine in ((64, None, None, None), (8, None, None, None),
                                      (8, 2, 32, None), (8, 2, 64, None), (8, 2, 128, None),
                                      (8, 4, 64, None), (16, 4, 64, None), (16, 4, 128, None),
                                      (32, 8, 64, None), (64, 16, 16, None), (64, 16, 32, None),
                                      (4, 1, 128, None)):
        cfg = {"path": "decode_rows", "BLOCK_N": n, "num_warps": warps, "SPLITS": splits,
               "combine": combine}
        fns[f"rows N{n} w{warps} s{splits} {combine or 'auto'}"] = mx.compile(
            lambda q, cfg=cfg: attention_ops._launch(q, k, v, None, scale, cfg))
    want = np.array(fns["mlx"](q).astype(mx.float32))
    for name, fn in fns.items():
        try:
            err = float(np.abs(np.array(fn(q).astype(mx.float32)) - want).max())
        except Exception as e:   # a tile the device refuses: say so, keep timing the rest
            print("decode_attention", name, type(e).__name__, str(e)[:200], flush=True)
            fns[name] = None
            continue
        if err > 1e-2:
            print("decode_attention", name, "error", err, flush=True)
    fns = {k: f for k, f in fns.items() if f is not None}
    print("decode_attention", json.dumps(alternating(fns, q, args.rounds, 50)), flush=True)


def alternating(fns: dict, q, rounds: int, launches: int) -> dict:
    """Median us per call of each compiled call `fns[name](q)`, `launches` a sync, the
    order reversed every other round."""
    times = {k: [] for k in fns}
    for fn in fns.values():
        seconds_per_call(fn, q, 2)
    order = list(fns)
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            times[side].append(seconds_per_call(fns[side], q, launches))
    return {k: round(float(np.median(t)) * 1e6, 1) for k, t in times.items()}


if __name__ == "__main__":
    main()
