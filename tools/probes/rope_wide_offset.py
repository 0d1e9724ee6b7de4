"""MLX's own rope with a one-element int64 offset array on the default device: two
identical calls compared with each other and with the CPU stream, per batch entry
(tests/test_model_ops_norms.py::test_rope_wide_offset_arrays_take_mlx_op_under_auto failed
on the H200 in s82 at batch entry 1, where both sides are mx.fast.rope with the same
arguments)."""

import mlx.core as mx
import numpy as np

x = mx.array(np.random.default_rng(3).standard_normal((2, 1, 5, 8)).astype(np.float32))
for dtype, value in ((mx.int64, 2**31 + 7), (mx.int64, 9), (mx.int32, 9), (mx.uint32, 9)):
    offset = mx.array(np.array([value]), dtype=dtype)
    runs = [np.array(mx.fast.rope(x, 8, traditional=False, base=1e4, scale=1.0, offset=offset))
            for _ in range(3)]
    cpu = np.array(mx.fast.rope(x, 8, traditional=False, base=1e4, scale=1.0, offset=offset,
                                stream=mx.cpu))
    for b in range(2):
        print(f"{dtype} {value} batch {b}: runs differ by "
              f"{max(np.abs(r[b] - runs[0][b]).max() for r in runs):.3g}, "
              f"from the CPU by {max(np.abs(r[b] - cpu[b]).max() for r in runs):.3g}")
