"""One causal prefill (1x32xLx128 float16) through metile's op and through MLX's SDPA, for
ncu's kernel durations (every kernel each launches, the inputs made and evaluated first).

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/attention_kernels_ncu.py [L]"""
import sys

import mlx.core as mx

import metile

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
keys = mx.random.split(mx.random.key(0), 3)
q, k, v = (mx.random.normal((1, 32, n, 128), key=kk).astype(mx.float16) for kk in keys)
mx.eval(q, k, v)
scale = 128 ** -0.5
for _ in range(2):
    mx.eval(metile.ops.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal",
                                                     backend="metile"))
    mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal"))
