"""Where an eager metile launch spends its host time on this machine: cProfile of many
cached launches (no synchronization inside the loop), sorted by own time, for
  kernel   `kernel[grid](...)` of a one-element kernel
  op       `metile.ops.matmul` of a 16x16x16 float16 product (backend="metile")
  op-big   the same op at 1024x1024x1024 (the warpgroup kernel, bulk tensor copies)
(on the GPU only) and each one's plain time per launch without the profiler.  Built-in entries (MLX's and
metile's C++ calls) show how much is Python and how much is the binding.

    python3 tools/probes/host_profile.py [out.txt]
"""
import cProfile
import io
import pstats
import sys
import time

import mlx.core as mx
import numpy as np

import metile


@metile.kernel
def plus_one(X, Y):
    metile.store(Y, metile.load(X) + 1.0)


def main():
    x = mx.array([1.0], dtype=mx.float32)
    out = mx.zeros((1,), dtype=mx.float32)
    small = mx.array(np.ones((16, 16), np.float16))
    big = mx.array(np.ones((1024, 1024), np.float16))
    mx.eval(x, out, small, big)
    ways = {"kernel": (lambda: plus_one[(1,)](x, out), 2000),
            "op": (lambda: metile.ops.matmul(small, small, backend="metile"), 500),
            "op-big": (lambda: metile.ops.matmul(big, big, backend="metile"), 200)}
    if not mx.cuda.is_available():  # the CPU runtime would spend minutes on each product
        del ways["op-big"]
    report = io.StringIO()
    for key, (fn, n) in ways.items():
        mx.eval(fn())
        mx.synchronize()
        t = time.perf_counter()
        outs = [fn() for _ in range(n)]
        built = (time.perf_counter() - t) / n * 1e6
        mx.eval(outs)
        mx.synchronize()
        del outs
        prof = cProfile.Profile()
        prof.enable()
        outs = [fn() for _ in range(n)]
        prof.disable()
        mx.eval(outs)
        mx.synchronize()
        print(f"== {key}: {built:.1f} us per launch built (no profiler)", file=report)
        pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(18)
    text = report.getvalue()
    print(text)
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(f"mlx {mx.__version__}, device {mx.default_device()}\n" + text)


if __name__ == "__main__":
    main()
