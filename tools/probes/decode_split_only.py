"""How much of decode attention's time the combine costs: CHAIN attentions a compiled call,
each over its own cache and all from the same query (no output feeds the next), and
the same with each query the attention before's output ("_dep": the split kernel's partial
outputs viewed as the next query, no kernel between), the split kernel alone against the
split kernel with its combine and MLX's op, 20 calls a sync, alternating, median of 7.

The split kernel alone is what one kernel fewer (the last split of a row merging the
others) could at best reach: if it does not beat MLX by the target, that design cannot.

    CHAIN=8 KEYS="1024 4096 16384" python3 tools/probes/decode_split_only.py [out.json]
"""
import os
import sys
import time

import mlx.core as mx

from metile import attention_ops

sys.path[:0] = ["tools/probes", "."]
from decode_chain_configs import card, decode_inputs   # noqa: E402
from probe_report import add_case, alternating_us, kv_bandwidth, mlx_over, save   # noqa: E402

CONFIG = {"path": "decode_rows", "BLOCK_N": 8, "combine_warps": 4}


def split_only(q, k, v, scale, before=None):
    """attention_decode's partial outputs and statistics, no combine.  `before` (the previous
    split's partial outputs) goes where the mask would be, which MASK "none" never reads:
    the dependence on the attention before that a decode step's layers have, with no kernel
    between (q stands there otherwise, as the op passes it)."""
    from metile_kernels import attention as kernels
    combine = attention_ops._combine
    attention_ops._combine = lambda kernels, partial, stats, *rest: (partial, stats)
    try:
        return attention_ops._launch_rows(kernels, q, k, (k, v, 0, 0),
                                          q if before is None else before, "none",
                                          [0, 0, 0, 0], scale * attention_ops.LOG2E, CONFIG)
    finally:
        attention_ops._combine = combine


def independent(op, chain):
    def step(q, *kv):
        outs = []
        for i in range(chain):
            out = op(q, kv[2 * i], kv[2 * i + 1])
            outs.extend(out if isinstance(out, tuple) else (out,))
        return outs
    return mx.compile(step)


def dependent(op, chain, split=False):
    """CHAIN attentions each after the one before, the call's result what the next call
    starts from (as benchmarks.attention's chain): (q, carried, *kv) -> carried."""
    def step(q, carried, *kv):
        for i in range(chain):
            k, v = kv[2 * i], kv[2 * i + 1]
            carried = split_only(q, k, v, op, carried)[0] if split else op(carried, k, v)
        return carried
    return mx.compile(step)


def per_attention_dep(fn, q, start, kv, launches, chain):
    mx.synchronize()
    begin = time.perf_counter()
    out = start
    for _ in range(launches):
        out = fn(q, out, *kv)
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - begin) / (launches * chain)


def per_attention(fn, q, kv, launches, chain):
    mx.synchronize()
    start = time.perf_counter()
    outs = [fn(q, *kv) for _ in range(launches)]
    mx.eval(outs)
    mx.synchronize()
    return (time.perf_counter() - start) / (launches * chain)


def main():
    chain = int(os.environ.get("CHAIN", "8"))
    lengths = [int(n) for n in os.environ.get("KEYS", "1024 4096 16384").split()]
    scale = 128 ** -0.5
    report = {"machine": {"platform": __import__("platform").platform(),
                          "mlx_version": mx.__version__, "device": str(mx.default_device()),
                          "card": card()},
              "metric": f"us per attention, {chain} a compiled call each over its own cache "
                        "from one query, 20 calls a sync, median of 7 alternating rounds; "
                        "'split' is the split kernel alone (no combine: not an attention)",
              "config": CONFIG, "cases": []}
    for keys in lengths:
        q, kv = decode_inputs(keys, chain)
        ops = {"split": lambda a, b, c: split_only(a, b, c, scale),
               "full": lambda a, b, c: attention_ops._run(a, b, c, scale, None, CONFIG),
               "mlx": lambda a, b, c: mx.fast.scaled_dot_product_attention(a, b, c,
                                                                            scale=scale)}
        fns = {n: independent(op, chain) for n, op in ops.items()}
        # (a decode step's layers: each attention after the one before)
        deps = {"split_dep": dependent(scale, chain, split=True),
                "full_dep": dependent(ops["full"], chain),
                "mlx_dep": dependent(ops["mlx"], chain)}
        first = split_only(q, kv[0], kv[1], scale)[0]
        mx.eval(first)
        starts = {"split_dep": first, "full_dep": q, "mlx_dep": q}

        def measure(n, launches):
            if n in deps:
                return per_attention_dep(deps[n], q, starts[n], kv, launches, chain)
            return per_attention(fns[n], q, kv, launches, chain)
        names = list(fns) + list(deps)
        for n in names:
            measure(n, 2)
        us = alternating_us(names, lambda n: measure(n, 20), 7)
        add_case(report, {"keys": keys, "chain": chain, "us_per_attention": us,
                          "mlx_over": {**mlx_over(us, ["split", "full"]),
                                       "split_dep": round(us["mlx_dep"] / us["split_dep"], 3),
                                       "full_dep": round(us["mlx_dep"] / us["full_dep"], 3)},
                          "tb_per_s": kv_bandwidth(us, keys)})
    save(report)


if __name__ == "__main__":
    main()
