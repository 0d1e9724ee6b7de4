"""One causal attention_forward launch (1x32xLx128 float16) for ncu.

    ncu --kernel-name regex:attention_forward --section WarpStateStats \
        python3 tools/probes/attention_prefill_once.py [BM BN WARPS [L]]"""
import sys

import mlx.core as mx

sys.path.insert(0, "kernels")
from metile_kernels import attention as kernels  # noqa: E402
from metile.attention_ops import head_group  # noqa: E402

bm, bn, warps = (int(x) for x in (sys.argv[1:4] if len(sys.argv) > 3 else (64, 64, 4)))
n = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
q, k, v = (mx.random.normal((1, 32, n, 128)).astype(mx.float16) for _ in range(3))
for _ in range(2):   # (profile the second: a first call is far slower under ncu, s57)
    out = kernels.attention_forward[kernels.forward_grid(n, 32, 1, bm)](
        q, k, v, q, mx.zeros(q.shape, q.dtype), n, n, 1, 128 ** -0.5 * 1.4426950408889634,
        0, 0, 0, 0, 0, 0, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=bm, BLOCK_N=bn, MASK="causal",
        num_warps=warps, POSITIVE_SCALE=True, HEAD_GROUP=head_group(32, n, 128, 2))
    mx.eval(out)
