"""Where an eager launch's host time goes, part by part, on this machine's default device:
a cached `kernel[grid](...)` of a one-element kernel against its pieces - the launcher
object (`kernel[grid]`) made once, the resolved launch's C++ binding called on its input
list (no Python checks), and MLX's own `x + 1`; a replayed `metile.ops.matmul` (16x16
float16) against its C++ replay called directly and MLX's `a @ a`.  Best of 5 loops of
4000 builds, no evaluation.

    python3 tools/probes/launch_parts.py [out.json]
"""
import json
import sys
import time

import mlx.core as mx
import numpy as np

import metile
from metile import op_replay

from eager_host_cost import per_call   # (this folder: best of five loops of many launches)


@metile.kernel
def plus_one(X, Y):
    metile.store(Y, metile.load(X) + 1.0)


def main():
    x, out = mx.array([1.0], dtype=mx.float32), mx.zeros((1,), dtype=mx.float32)
    a = mx.array(np.ones((16, 16), np.float16))
    mx.eval(x, out, a)
    mx.eval(plus_one[(1,)](x, out))
    mx.eval(plus_one[(1,)](x, out))
    launcher = plus_one[(1,)]
    d = plus_one._launches.last
    direct = d._direct
    # the binding's input list as the launch's guard assembles it: per kernel input, a
    # value the launch keeps, or the call's argument at that position
    args = (x, out)
    inputs = [v if fixed else args[v] for fixed, v in d._input_plan] if direct else None
    mx.eval(metile.ops.matmul(a, a, backend="metile"))
    mx.eval(metile.ops.matmul(a, a, backend="metile"))
    replay = next(iter(op_replay._REPLAYS.replays("matmul")), None)
    parts = {
        "mlx x + 1": per_call(lambda: x + 1.0),
        "mlx a @ a": per_call(lambda: a @ a),
        "kernel[grid](x, out)": per_call(lambda: plus_one[(1,)](x, out)),
        "launcher(x, out), launcher made once": per_call(lambda: launcher(x, out)),
        "ops.matmul(a, a)": per_call(lambda: metile.ops.matmul(a, a, backend="metile")),
    }
    # the floor of any C++ call on these arrays from Python (nanobind's argument checks)
    parts["nanobind floor: _ext.array_signature(x, out)"] = per_call(
        lambda: metile._ext.array_signature(x, out))
    if direct is not None:
        try:
            direct(inputs)
            parts["the launch's C++ binding on its inputs"] = per_call(lambda: direct(inputs))
        except (TypeError, ValueError) as e:   # a binding that takes other arguments: say so
            parts["the launch's C++ binding"] = f"not timed: {e}"
        if hasattr(direct, "time_parts"):   # CUDA: the binding's own parts, timed in C++
            for name, ns in direct.time_parts(inputs, 20000).items():
                parts[f"in C++: {name}"] = round(ns / 1000, 3)
    if replay is not None:
        parts["ops.matmul's C++ replay on (a, a)"] = per_call(lambda: replay(a, a))
    # the row ops, 16x64 float16, as tools/probes/launch_cost.py builds them
    rows = mx.array(np.ones((16, 64), np.float16))
    weight = mx.array(np.ones((64,), np.float16))
    mx.eval(rows, weight)
    for name, op, given, mlx_op in (
            ("rms_norm", lambda: metile.ops.rms_norm(rows, weight, 1e-5, backend="metile"),
             (rows, weight), lambda: mx.fast.rms_norm(rows, weight, 1e-5)),
            ("softmax", lambda: metile.ops.softmax(rows, backend="metile"), (rows,),
             lambda: mx.softmax(rows, axis=-1))):
        for _ in range(2):
            mx.eval(op())
        parts[f"mlx {name}"] = per_call(mlx_op)
        parts[f"ops.{name}"] = per_call(op)
        found = op_replay._REPLAYS.replays(name)
        if found:
            parts[f"ops.{name}'s replay ({type(found[0]).__name__})"] = per_call(
                lambda r=found[0], g=given: r(*g))
    for k, v in parts.items():
        print(f"{k:42s} {v}", flush=True)
    if len(sys.argv) > 1:
        json.dump({"mlx": mx.__version__, "device": str(mx.default_device()),
                   "metric": "host us per eager build, best of 5 loops of 4000, no evaluation",
                   "parts": parts}, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
