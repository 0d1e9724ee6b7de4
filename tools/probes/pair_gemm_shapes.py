"""Which shapes the pair-dequantizing fused GEMM (quantized_ops.WGMMA_PAIRS) finishes at:
one product per process (a hung kernel cannot be interrupted), checked against MLX's
quantized_matmul.  s142/s143 (H100): test_pair_dequantized_warpgroup_prefill at 200x512x4096
never finished while 128/512/2048 x 11008 x 4096 ran in the benchmark.

    python3 tools/probes/pair_gemm_shapes.py M N K [TILE]
"""
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, ".")
from metile import quantized_ops  # noqa: E402

m, n, k = (int(v) for v in sys.argv[1:4])
tile = sys.argv[4] if len(sys.argv) > 4 else "WGMMA_PAIRS"
rng = np.random.default_rng(0)
w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(mx.float16)
wq, s, b = mx.quantize(w, group_size=64, bits=4)
x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.float16)
ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
mx.eval(ref)
start = time.perf_counter()
y = quantized_ops._metile(x, wq, s, b, n, k, True, 64, 4, getattr(quantized_ops, tile))
mx.eval(y)
err = float(mx.max(mx.abs(y.astype(mx.float32) - ref.astype(mx.float32))))
print(f"{tile} {m}x{n}x{k}: finished in {time.perf_counter() - start:.2f} s, "
      f"max |metile - mlx| {err:.3g}", flush=True)
