"""Warpgroup tiles against whole waves over the SMs: ops.linear's kernel with the weight
read as stored, at 128x256x64, 128x192x64 and 128x128x64, beside MLX's `x @ w.T`, each an
`mx.compile`d call timed like benchmarks/quantized.py (many launches per sync,
alternating, median of rounds); then int4 dequantize+gemm (ops' default tile) beside
MLX's quantized_matmul.  Checked against MLX before timing.

    python tools/probes/wave_tiles.py out.json [--rounds 5]
"""

import argparse
import json
import math
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

from metile import ops, quantized_ops                # noqa: E402

sys.path.insert(0, "tools/probes")
from quantized_parts import timed                    # noqa: E402  (its timing, its rounds)

SHAPES = ((512, 4096, 11008), (4096, 4096, 4096), (2048, 4096, 11008), (512, 4096, 12288))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    out = {"device": str(mx.default_device()), "mlx": mx.__version__, "cases": {}}
    for m, k, n in SHAPES:
        x = mx.random.normal((m, k), key=mx.random.key(1)).astype(mx.float16)
        w = (mx.random.normal((n, k), key=mx.random.key(2)) / math.sqrt(k)).astype(mx.float16)
        mx.eval(x, w)
        fns = {"mlx": mx.compile(lambda x, w=w: x @ w.T)}
        for bn in (256, 192, 128):
            block = {**ops.CUDA_WGMMA_BLOCK, "BLOCK_N": bn, "TRANSPOSE_B": True}
            fns[f"metile 128x{bn}"] = mx.compile(
                lambda x, w=w, block=block: ops._launch_linear(x, w, None, None, None, 0.01,
                                                               block))
        want = np.array(fns["mlx"](x).astype(mx.float32))
        for name, fn in fns.items():
            err = float(np.abs(np.array(fn(x).astype(mx.float32)) - want).max())
            if err > 0.02 * float(np.abs(want).max()):
                print(m, k, n, name, "error", err, flush=True)
        case = timed(fns, x, args.rounds)
        case["default"] = ops._config_name(ops._block(m, n, mx.float16, True, k=k))
        out["cases"][f"{m}x{k}x{n}"] = case
        print(f"{m}x{k}x{n}", json.dumps(case), flush=True)
    # int4 prefill, warm weight, ops' default tile for the dense product
    m, k, n = 512, 4096, 11008
    w = (mx.random.normal((n, k), key=mx.random.key(3)) / math.sqrt(k)).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((m, k), key=mx.random.key(4)).astype(mx.float16)
    mx.eval(wq, s, b, x)
    fns = {"mlx quantized_matmul": mx.compile(lambda x: mx.quantized_matmul(x, wq, s, b)),
           "dequantize+gemm": mx.compile(lambda x: quantized_ops._metile(
               x, wq, s, b, n, k, True, 64, 4, quantized_ops.DEQUANTIZE_GEMM))}
    case = timed(fns, x, args.rounds)
    out["cases"]["int4 prefill 512x4096x11008 warm"] = case
    print("int4 prefill", json.dumps(case), flush=True)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
