"""Decode attention as mlx_lm runs it: each layer's cache allocated ahead (keys in steps of
256), this step's key and value written into it, the op handed the prefix
`buffer[..., :L, :]` - a slice that is not row-contiguous.  Eager, as mlx_lm's generate
loop calls the model: 8 layers a step, each over its own cache, 20 steps a sync, median of
7 alternating rounds; metile's op (backend="metile") against MLX's, and metile's op with
the prefix copied first (what every launch did before attention_decode read the cache's
buffer in place).

    KEYS="4096 16384" python3 tools/probes/decode_cache_ahead.py [out.json]
"""
import os
import platform
import sys
import time

import mlx.core as mx

import metile

sys.path.insert(0, "tools/probes")
from decode_chain_configs import card   # noqa: E402 (this folder)
from probe_report import check_close, decode_case, save   # noqa: E402

LAYERS = 8
STEP = 256


def main():
    lengths = [int(n) for n in os.environ.get("KEYS", "4096 16384").split()]
    scale = 128 ** -0.5
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device()), "card": card()},
              "metric": f"us an attention, eager, {LAYERS} layers a step over their own caches "
                        "allocated ahead, 20 steps a sync, median of 7 alternating rounds",
              "cases": []}
    sides = {
        "metile": lambda q, k, v: metile.ops.scaled_dot_product_attention(
            q, k, v, scale=scale, backend="metile"),
        "metile_copied": lambda q, k, v: metile.ops.scaled_dot_product_attention(
            q, mx.contiguous(k), mx.contiguous(v), scale=scale, backend="metile"),
        "mlx": lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale),
    }
    for keys in lengths:
        alloc = (keys // STEP + 1) * STEP
        rk = mx.random.split(mx.random.key(keys), 2 * LAYERS + 2)
        caches = [mx.random.normal((1, 32, alloc, 128), key=rk[i]).astype(mx.float16)
                  for i in range(2 * LAYERS)]
        q = mx.random.normal((1, 32, 1, 128), key=rk[-2]).astype(mx.float16)
        new = mx.random.normal((1, 32, 1, 128), key=rk[-1]).astype(mx.float16)
        mx.eval(q, new, *caches)

        def step(attend, out, at):
            for layer in range(LAYERS):
                kc, vc = caches[2 * layer], caches[2 * layer + 1]
                kc[..., at:at + 1, :] = new       # this step's key and value
                vc[..., at:at + 1, :] = new
                caches[2 * layer], caches[2 * layer + 1] = kc, vc
                out = attend(out, kc[..., :at + 1, :], vc[..., :at + 1, :])
            return out

        want = step(sides["mlx"], q, keys - 1).astype(mx.float32)
        for name, attend in sides.items():
            got = step(attend, q, keys - 1).astype(mx.float32)
            check_close(got, want, keys, name)

        def timed(attend):
            mx.synchronize()
            start = time.perf_counter()
            out = q
            for _ in range(20):
                out = step(attend, out, keys - 1)
                mx.async_eval(out, *caches)
            mx.eval(out)
            mx.synchronize()
            return (time.perf_counter() - start) / (20 * LAYERS)

        decode_case(report, sides, lambda n: timed(sides[n]), lambda n: timed(sides[n]), keys,
                    {"keys": keys, "allocated": alloc})
    save(report)


if __name__ == "__main__":
    main()
