"""Where decode attention's fixed cost goes.  s125 (H100, 8 attentions a compiled call,
each over its own cache): metile's and MLX's op both take ~5.3 ns a key plus ~18 us an
attention - at 4096 keys the fixed part is 45% of the call.  Is it the GPU (two kernels'
launch, ramp and tail) or the host's work per graph node?

* decode attention, 8 a compiled call, at 64 to 4096 keys: the fixed part directly;
* a tiny op that is one kernel either way (rms_norm of 1x4096 float16: MLX's primitive,
  metile's custom kernel), 16 a compiled call: the cost of one node when the GPU has
  nothing to do.

Each metile side twice: as the ops are now (one MetileOp node an op under mx.compile) and
traced with `_ext.fuse_ops(False)` ("_custom_function": the op's nodes inside
mx.custom_function's StopGradient and CustomTransforms, as before s127).

20 calls a sync, median of 7 alternating rounds.  Under ncu (NCU=1: 2 calls of each, no
timing) the kernels' own durations come out to set beside the times.

    python3 tools/probes/decode_fixed_cost.py [out.json]
"""
import json
import os
import platform
import sys

sys.path.insert(0, "tools/probes")
import mlx.core as mx   # noqa: E402

import metile   # noqa: E402
from decode_chain_configs import card, chained, decode_inputs, per_attention   # noqa: E402 (this folder)
from metile import _ext, attention_ops   # noqa: E402
from probe_report import alternating_us   # noqa: E402

CHAIN = 8
NODES = 16
DEFAULT = {"path": "decode_rows", "BLOCK_N": 8}


def traced_unfused(fn):
    """`fn` (a compiled function) traced, at its first call, with ops kept in
    mx.custom_function's nodes."""
    state = {"traced": False}

    def call(*args):
        if state["traced"]:
            return fn(*args)
        was = _ext.fuse_ops(False)
        try:
            return fn(*args)
        finally:
            _ext.fuse_ops(was)
            state["traced"] = True
    return call


def decode_sides(keys):
    """A query, CHAIN caches of `keys` keys (1x32xkeysx128 float16) and the compiled chains
    of decode attention over them: metile's op (one node), metile's traced with
    mx.custom_function's nodes, MLX's."""
    scale = 128 ** -0.5
    q, kv = decode_inputs(keys, CHAIN)

    def metile_op(a, b, c):
        return attention_ops._run(a, b, c, scale, None, DEFAULT)
    return q, kv, {"metile": chained(metile_op, CHAIN),
                   "metile_custom_function": traced_unfused(chained(metile_op, CHAIN)),
                   "mlx": chained(lambda a, b, c: mx.fast.scaled_dot_product_attention(
                       a, b, c, scale=scale), CHAIN)}


def timed(fns, x, args, per):
    if os.environ.get("NCU"):
        for fn in fns.values():
            per_attention(fn, x, args, 2, per)
        return {}
    for fn in fns.values():
        per_attention(fn, x, args, 2, per)
    return alternating_us(fns, lambda n: per_attention(fns[n], x, args, 20, per), 7)


def main():
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device()), "card": card()},
              "metric": "us an op: decode attention 8 a compiled call (each its own cache), "
                        "rms_norm 16 a call; 20 calls a sync, median of 7 alternating rounds",
              "attention": [], "nodes": {}}
    for keys in [int(n) for n in os.environ.get("KEYS", "64 256 1024 4096").split()]:
        q, kv, fns = decode_sides(keys)
        us = timed(fns, q, kv, CHAIN)
        case = {"keys": keys, "us_per_attention": us}
        print(json.dumps(case), flush=True)
        report["attention"].append(case)

    x = mx.random.normal((1, 4096)).astype(mx.float16)
    w = mx.ones((4096,), mx.float16)
    mx.eval(x, w)

    def nodes(op):
        def step(a, weight):
            for _ in range(NODES):
                a = op(a, weight)
            return a
        return mx.compile(step)
    fns = {"metile_rms_norm": nodes(lambda a, b: metile.ops.rms_norm(a, b, 1e-5,
                                                                      backend="metile")),
           "metile_rms_norm_custom_function": traced_unfused(nodes(
               lambda a, b: metile.ops.rms_norm(a, b, 1e-5, backend="metile"))),
           "mlx_rms_norm": nodes(lambda a, b: mx.fast.rms_norm(a, b, 1e-5))}
    us = timed(fns, x, [w], NODES)
    report["nodes"] = {"us_per_node": us, "nodes_a_call": NODES}
    print(json.dumps(report["nodes"]), flush=True)
    if len(sys.argv) > 1:
        json.dump(report, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
