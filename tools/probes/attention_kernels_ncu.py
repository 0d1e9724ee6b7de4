"""Causal prefill (1x32xLx128 float16) through metile's op and through MLX's SDPA, for ncu's
kernel durations (every kernel each launches; the inputs made and evaluated first).

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/attention_kernels_ncu.py [L]
        [--first-call]

Two calls of each; --first-call: three calls of each then two more after mx.clear_cache(),
and an elementwise MLX op (q * 2) the same way as a control (whether a first call, or one
onto fresh memory, is slow)."""
import argparse

import mlx.core as mx

import metile

p = argparse.ArgumentParser()
p.add_argument("length", type=int, nargs="?", default=1024)
p.add_argument("--first-call", action="store_true")
args = p.parse_args()
n = args.length
keys = mx.random.split(mx.random.key(0), 3)
q, k, v = (mx.random.normal((1, 32, n, 128), key=kk).astype(mx.float16) for kk in keys)
mx.eval(q, k, v)
scale = 128 ** -0.5


def ours():
    return metile.ops.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal",
                                                   backend="metile")


def theirs():
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


if not args.first_call:
    for _ in range(2):
        mx.eval(ours())
        mx.eval(theirs())
else:
    for fn in (ours, theirs, lambda: q * 2):
        for _ in range(3):
            mx.eval(fn())
        mx.clear_cache()
        for _ in range(2):
            mx.eval(fn())
        mx.clear_cache()
