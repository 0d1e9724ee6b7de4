"""Decode attention with one or two key blocks loaded ahead (attention_decode's AHEAD):
the s97 profile read the default launch (8 keys on 2 warps, 32 splits, 1x32x4096x128
float16) as latency-bound at 64% of DRAM, ~31 KB in flight an SM with one block ahead.
Compiled calls of the op's kernels with each configuration against MLX's op, chained
(each output the next query), 100 a sync, alternating, median of 9 rounds; validated
against MLX's op first.

    python3 tools/probes/decode_ahead.py [out.json]

k and v are captured in the compiled calls: on the H200 (s121/s122) MLX's op ran 1.2-1.75x
slower that way than with them as arguments (`benchmarks.attention`'s form), so this probe's
ratios against MLX overstate metile - compare its configurations with each other only.
Even that misleads for few splits: reading the one cache again and again, 8 splits on 4
warps ran at 3.3 TB/s on an H100 (s124), past its HBM; decode_chain_configs.py (eight
caches a call, none read twice) ranks them last (s125).
"""
import os
import platform
import sys

sys.path.insert(0, "tools/probes")
import mlx.core as mx   # noqa: E402

from decode_attention import alternating      # noqa: E402 (this folder)
from decode_attention_ncu import operands     # noqa: E402
from metile import attention_ops              # noqa: E402
from probe_report import add_case, check_close, kv_bandwidth, mlx_over, save   # noqa: E402

# DECODE_SET=warps: the warp and split counts around the 4-warp form (the first run, on
# an H100, s116: 4 warps 30.6 us against 2 warps' 40.3 and MLX's 36.5 at 4096 keys)
WARPS = {"w2": {"path": "decode_rows", "BLOCK_N": 8},
         "w4": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4},
         "w4_s32": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4, "SPLITS": 32},
         "w4_s8": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4, "SPLITS": 8},
         "w8": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 8},
         "k16_w4": {"path": "decode_rows", "BLOCK_N": 16, "num_warps": 4},
         "k16_w8": {"path": "decode_rows", "BLOCK_N": 16, "num_warps": 8}}
CONFIGS = {"ahead1": {"path": "decode_rows", "BLOCK_N": 8},
           "ahead2": {"path": "decode_rows", "BLOCK_N": 8, "AHEAD": 2},
           "ahead2_16keys": {"path": "decode_rows", "BLOCK_N": 16, "AHEAD": 2},
           # 4 warps on 8 keys: one 16-byte run a thread, half the registers' tiles (the
           # split count follows the warps: 16 splits at 32 heads)
           "ahead1_4warps": {"path": "decode_rows", "BLOCK_N": 8, "num_warps": 4},
           "ahead2_4warps": {"path": "decode_rows", "BLOCK_N": 8, "AHEAD": 2, "num_warps": 4}}


def main():
    scale = 128 ** -0.5
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device())},
              "metric": "us per compiled call, 100 chained calls a sync, median of 9 "
                        "alternating rounds", "cases": []}
    configs = WARPS if os.environ.get("DECODE_SET") == "warps" else CONFIGS
    for keys in (4096, 16384):
        q, k, v = operands(keys)
        fns = {name: mx.compile(lambda q, c=c: attention_ops._run(q, k, v, scale, None, c))
               for name, c in configs.items()}
        fns["mlx"] = mx.compile(lambda q: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale))
        want = fns["mlx"](q)
        for name in configs:
            check_close(fns[name](q).astype(mx.float32), want.astype(mx.float32), keys, name)
        us = alternating(fns, q, 9, 100)
        add_case(report, {"keys": keys, "us_per_call": us,
                          "mlx_over": mlx_over(us, configs),
                          "tb_per_s": kv_bandwidth(us, keys)})
    save(report)


if __name__ == "__main__":
    main()
