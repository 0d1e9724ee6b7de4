"""Whether a kernel's first call onto freshly allocated memory is slow (ncu durations): the
causal prefill op (1x32xLx128 float16, output proven whole, so the kernel is the first to
write its output buffer) three times, then after mx.clear_cache() twice more; MLX's SDPA the
same way; then an elementwise MLX op (x * 2) after clear_cache, as a control.

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/first_call_cost.py [L]"""
import sys

import mlx.core as mx

import metile

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
keys = mx.random.split(mx.random.key(0), 3)
q, k, v = (mx.random.normal((1, 32, n, 128), key=kk).astype(mx.float16) for kk in keys)
mx.eval(q, k, v)
scale = 128 ** -0.5


def ours():
    return metile.ops.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal",
                                                   backend="metile")


def theirs():
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


for fn in (ours, theirs, lambda: q * 2):
    for _ in range(3):
        mx.eval(fn())
    mx.clear_cache()
    for _ in range(2):
        mx.eval(fn())
    mx.clear_cache()
