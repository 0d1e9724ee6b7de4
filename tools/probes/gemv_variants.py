"""Candidate int4 decode GEMVs beside quantized_matvec_runs, to time on the GPU before
one goes into the library (kernels/metile_kernels/quantized.py).

Why these: quantized_matvec_runs (one output a program, one warp) is latency-bound -
each K block's two words a thread wait on DRAM in turn - and converts x per output.
`rows_loop` gives a warp ROWS outputs: each K block loads x once and ROWS rows' words
together (ROWS times the loads in flight), each row summed across the warp by shuffles.
`rows_whole` takes all of K in one block on several warps (no K loop: every load of a
row issued at once), ROWS rows a program.

    python tools/probes/gemv_variants.py        # numerics against NumPy (CPU runtime)
"""

import sys

sys.path.insert(0, "kernels")
import metile                                      # noqa: E402
from metile_kernels.quantized import weights_in_runs   # noqa: E402


@metile.kernel
def rows_loop(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
              GROUP: metile.constexpr = 64, BLOCK_K: metile.constexpr = 512,
              ROWS: metile.constexpr = 4):
    n0 = metile.program_id(0) * ROWS
    r = metile.program_id(1)
    k = metile.arange(0, BLOCK_K)
    lanes = metile.arange(0, ROWS)
    totals = metile.zeros((ROWS,), dtype=metile.float32)
    for start in range(0, K, BLOCK_K):
        xk = metile.load(x + r * K + start + k, mask=start + k < K, other=0.0)
        for i in metile.static_range(ROWS):
            wts = weights_in_runs(w, scales, biases, n0 + i, start, k, K, n0 + i < N, BITS,
                                  GROUP)
            part = metile.sum(wts * xk.to(metile.float32))
            totals = metile.where(lanes == i, totals + part, totals)
    one = metile.arange(0, 1)
    n = n0 + lanes
    metile.store(out + (r + one)[:, None] * N + n[None, :], totals[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (n[None, :] < N))


def main():
    import mlx.core as mx
    import numpy as np
    rng = np.random.default_rng(0)
    for n, k, group in ((70, 1024, 64), (33, 640, 32)):
        w = mx.array(rng.standard_normal((n, k)).astype(np.float16))
        wq, s, b = mx.quantize(w, group_size=group, bits=4)
        dense = np.array(mx.dequantize(wq, s, b, group_size=group, bits=4)).astype(np.float64)
        x = mx.array(rng.standard_normal((2, k)).astype(np.float16))
        want = np.array(x).astype(np.float64) @ dense.T
        for rows_, bk, warps in ((4, 512, 1), (2, 256, 1), (8, 512, 1)):
            out = rows_loop[(metile.cdiv(n, rows_), 2)](
                x, wq, s, b, mx.zeros((2, n), mx.float16), 2, n, k, BITS=4, GROUP=group,
                BLOCK_K=bk, ROWS=rows_, num_warps=warps)
            err = np.abs(np.array(out).astype(np.float64) - want).max()
            print("rows_loop", n, k, group, rows_, bk, warps, "max err", float(err))
            assert err < 0.05 * np.abs(want).max(), err


if __name__ == "__main__":
    main()
