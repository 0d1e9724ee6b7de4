"""One launch of the prefill path's dequantize (int4 group 64, 11008x4096 float16, the
default tile), for ncu: `ncu -k regex:dequantize --section ... python3 this.py`."""
import math
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
import mlx.core as mx   # noqa: E402

from metile import quantized_ops                 # noqa: E402
from metile_kernels import quantized as kernels  # noqa: E402

n, k = 11008, 4096
w = (mx.random.normal((n, k), key=mx.random.key(1)) / math.sqrt(k)).astype(mx.float16)
wq, s, b = mx.quantize(w, group_size=64, bits=4)
mx.eval(wq, s, b)
block = quantized_ops.DEQUANTIZE_BLOCK
for _ in range(2):
    out = kernels.dequantize[(math.ceil(k / block), n)](
        wq, s, b, mx.zeros((n, k), mx.float16), n, k, BITS=4, GROUP=64, BLOCK=block,
        num_warps=quantized_ops.DEQUANTIZE_WARPS)
    mx.eval(out)
    mx.synchronize()
print("dequantize", out.shape)
