"""Decode attention's kernels one by one, for ncu (kernel time with caches flushed): MLX's
op and metile's attention_decode configurations (each with its combine), one query of 32
heads over 4096 and 16384 keys, float16, head dim 128; each launched --repeat times.

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/decode_attention_ncu.py > t.csv
    python3 tools/probes/decode_kernels_ncu.py --summarize t.csv
"""

import argparse
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

from metile import attention_ops   # noqa: E402

CONFIGS = [(8, 2, 32), (4, 1, 64), (8, 4, 32), (64, None, None)]


def operands(keys: int):
    """(q, k, v), evaluated: one float16 query of 32 heads over `keys` keys, head dim 128."""
    rk = mx.random.split(mx.random.key(keys), 3)
    q = mx.random.normal((1, 32, 1, 128), key=rk[0]).astype(mx.float16)
    k = mx.random.normal((1, 32, keys, 128), key=rk[1]).astype(mx.float16)
    v = mx.random.normal((1, 32, keys, 128), key=rk[2]).astype(mx.float16)
    mx.eval(q, k, v)
    return q, k, v


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for keys in (4096, 16384):
        q, k, v = operands(keys)
        scale = 128 ** -0.5
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
        mx.eval(want)
        for _ in range(args.repeat):
            mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale))
        for n, warps, splits in CONFIGS:
            cfg = {"path": "decode_rows", "BLOCK_N": n, "num_warps": warps, "SPLITS": splits}
            try:
                for _ in range(args.repeat):
                    out = attention_ops._launch(q, k, v, None, scale, cfg)
                    mx.eval(out)
            except Exception as e:   # a block the device refuses: say so, keep the rest
                print(f"decode_attention_ncu N{n}: {type(e).__name__} {str(e)[:160]}", flush=True)
                continue
            err = float(np.abs(np.array(out.astype(mx.float32)) - np.array(want.astype(mx.float32))).max())
            print(f"decode_attention_ncu keys {keys} N{n} w{warps} s{splits}: max error {err:.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
