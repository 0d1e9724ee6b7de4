"""Which side of tests/test_quantized_op.py::test_untransposed stops a GPU run.

The test hung twice on the H100 (s125 in the 4-32 float32 case, s150's s145 call in 4-64
float32), past pytest-timeout (a thread stuck in a C call: the signal never ran).  This
repeats the test's launches one side at a time - metile's op (backend="metile") and MLX's
quantized_matmul - evaluating each alone, with faulthandler armed to print every thread's
Python stack when one launch takes longer than --stall seconds (the process stays, for the
caller's look at the GPU and the native stacks: tools/device_next.sh s150).  The last
"start" line before the stacks names the side, case and row count.

    python3 tools/probes/untransposed_hang.py [--repeats 30] [--stall 60]
"""
import argparse
import faulthandler
import sys

import mlx.core as mx
import numpy as np

from metile import ops

CASES = [(4, 32), (8, 128), (4, 64)]   # (bits, group), as the test's
K = 37                                  # the test's ragged K


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--stall", type=float, default=60.0)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    weights = {}
    for name in args.dtypes:
        for bits, group in CASES:
            w = mx.array(rng.standard_normal((K, 2 * group)).astype(np.float32)).astype(
                getattr(mx, name))
            weights[name, bits, group] = mx.quantize(w, group_size=group, bits=bits)
    # every case of metile's side before MLX's: a stall in MLX's op leaves metile's answered
    for side in ("metile", "mlx"):
        for name in args.dtypes:
            dtype = getattr(mx, name)
            for bits, group in CASES:
                wq, s, b = weights[name, bits, group]
                for rep in range(args.repeats):
                    for rows in (1, 3, 17):
                        x = mx.array(rng.standard_normal((rows, K)).astype(np.float32)).astype(dtype)
                        mx.eval(x, wq, s, b)
                        print(f"start {side} {name} bits={bits} group={group} rows={rows} "
                              f"repeat {rep}", flush=True)
                        faulthandler.dump_traceback_later(args.stall)
                        if side == "metile":
                            y = ops.quantized_matmul(x, wq, s, b, False, group, bits,
                                                     backend="metile")
                        else:
                            y = mx.quantized_matmul(x, wq, s, b, transpose=False,
                                                    group_size=group, bits=bits)
                        try:
                            mx.eval(y)
                        except RuntimeError as e:   # MLX's float32 group-128 launch failure
                            print(f"  {side} {name} {bits}/{group} rows={rows}: {e}"[:200],
                                  flush=True)
                            faulthandler.cancel_dump_traceback_later()
                            break
                        faulthandler.cancel_dump_traceback_later()
                print(f"done {side} {name} bits={bits} group={group} x{args.repeats}", flush=True)
    print("no stall", flush=True)


if __name__ == "__main__":
    sys.exit(main())
