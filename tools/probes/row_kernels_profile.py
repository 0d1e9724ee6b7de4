"""One launch each of the row kernels at 16384x8192 float16 (the configurations the H200
benchmark chose), for ncu: `ncu -k regex:metile --section ... python3 this.py`.

    python3 tools/probes/row_kernels_profile.py [rms_norm softmax layer_norm]
"""
import sys

import mlx.core as mx

sys.path.insert(0, "kernels")
from metile_kernels import norms, softmax  # noqa: E402

CONFIG = {"rms_norm": 16, "softmax": 4, "layer_norm": 8}


def inputs(rows=16384, columns=8192):
    """The benchmark's issue shape: a float16 (rows, columns) matrix and a weight row."""
    x = mx.random.normal((rows, columns)).astype(mx.float16)
    w = mx.random.normal((columns,)).astype(mx.float16)
    mx.eval(x, w)
    return x, w


def main():
    x, w = inputs()
    rows, columns = x.shape
    for op in sys.argv[1:] or list(CONFIG):
        warps = CONFIG[op]
        out = mx.zeros((rows, columns), mx.float16)
        if op == "rms_norm":
            y = norms.rms_norm[norms.grid(rows)](x, w, out, rows, columns, 1e-5, BLOCK=columns,
                                                 num_warps=warps)
        elif op == "layer_norm":
            y = norms.layer_norm[norms.grid(rows)](x, w, w, out, rows, columns, 1e-5,
                                                   BLOCK=columns, num_warps=warps)
        else:
            y = softmax.softmax[softmax.grid(rows)](x, out, rows, columns, BLOCK=columns,
                                                    num_warps=warps)
        mx.eval(y)
        mx.synchronize()
        print(op, warps, "warps done", flush=True)


if __name__ == "__main__":
    main()
