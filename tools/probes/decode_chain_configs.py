"""Decode attention's launch configurations against each other and MLX's op with no cache
reused: CHAIN attentions a compiled call, each over its own k and v (a decode step's
layers), the output the next query, 20 calls a sync, alternating, median of 7 rounds.

decode_ahead.py reads one cache again and again, so at 4096 keys (67 MB of k and v) part of
it may stay in the 50 MB L2 between calls, and its H100 runs (s117, s124) read 8 splits on
4 warps at 3.3-3.95 TB/s, at or past an H100's HBM.  This form cannot reuse the cache.

    CHAIN=8 KEYS="4096 16384" python3 tools/probes/decode_chain_configs.py [out.json]
"""
import os
import platform
import sys

import mlx.core as mx

from metile import attention_ops

sys.path[:0] = ["tools/probes", "."]
from benchmarks.attention import seconds_per_call as per_attention   # noqa: E402
# (card: imported from here by the other decode probes)
from probe_report import card, check_close, decode_case, save   # noqa: E402,F401

CONFIGS = {"w2": {"path": "decode_rows", "BLOCK_N": 8},
           "w4": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4},
           "w4_s8": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4, "SPLITS": 8},
           "w4_s16": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4, "SPLITS": 16},
           "w2_s8": {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": 8},
           "w2_s16": {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": 16},
           "w2_s64": {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": 64},
           # the combine on fewer warps than the plan's one thread an element (s39)
           "w2_c1": {"path": "decode_rows", "BLOCK_N": 8, "combine_warps": 1},
           "w2_c2": {"path": "decode_rows", "BLOCK_N": 8, "combine_warps": 2},
           "w2_c4": {"path": "decode_rows", "BLOCK_N": 8, "combine_warps": 4}}
# CONFIGS="w2 w2_c1" (the environment): only those
if os.environ.get("CONFIGS"):
    CONFIGS = {n: CONFIGS[n] for n in os.environ["CONFIGS"].split()}


def decode_inputs(keys: int, chain: int):
    """A query (1x32x1x128 float16) and `chain` caches (k, v, each 1x32xkeysx128), evaluated."""
    rk = mx.random.split(mx.random.key(keys), 1 + 2 * chain)
    q = mx.random.normal((1, 32, 1, 128), key=rk[0]).astype(mx.float16)
    kv = [mx.random.normal((1, 32, keys, 128), key=rk[1 + i]).astype(mx.float16)
          for i in range(2 * chain)]
    mx.eval(q, *kv)
    return q, kv


def chained(op, chain):
    def step(q, *kv):
        out = q
        for i in range(chain):
            out = op(out, kv[2 * i], kv[2 * i + 1])
        return out
    return mx.compile(step)


def main():
    chain = int(os.environ.get("CHAIN", "8"))
    lengths = [int(n) for n in os.environ.get("KEYS", "4096 16384").split()]
    scale = 128 ** -0.5
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device()), "card": card()},
              "metric": f"us per attention, {chain} a compiled call each over its own cache, "
                        "20 calls a sync, median of 7 alternating rounds", "cases": []}
    for keys in lengths:
        q, kv = decode_inputs(keys, chain)

        def mlx_op(a, b, c):
            return mx.fast.scaled_dot_product_attention(a, b, c, scale=scale)
        ops = {n: (lambda a, b, c, cfg=cfg: attention_ops._run(a, b, c, scale, None, cfg))
               for n, cfg in CONFIGS.items()}
        ops["mlx"] = mlx_op
        want = mlx_op(q, kv[0], kv[1]).astype(mx.float32)
        for name, op in ops.items():
            got = op(q, kv[0], kv[1]).astype(mx.float32)
            check_close(got, want, keys, name)
        fns = {n: chained(op, chain) for n, op in ops.items()}
        decode_case(report, fns, lambda n: per_attention(fns[n], q, kv, 20, chain),
                    lambda n: per_attention(fns[n], q, kv, 2, chain), keys,
                    {"keys": keys, "chain": chain}, CONFIGS)
    save(report)


if __name__ == "__main__":
    main()
