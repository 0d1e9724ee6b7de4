"""int4 GEMV with K split over the warps of a program and the scale and bias applied once a
packed word (1x4096x11008, group 64, float16; ncu kernel durations).

Each program owns ROWS (<= 4) outputs; its (BLOCK_K / 8, 8) tile puts one packed word's
eight k on a lane (one 16-byte run of x), so sum_e q_e x_e and sum_e x_e are a lane's own
sums, x's sums are shared by the ROWS rows, and each row's products accumulate in a (words,)
tile across the K loop, summed over the program once after it (no reduction inside the
loop).  The kernels before it (quantized_matvec_runs / _rows) reduced every K block and ran
one warp a program: ncu s33 had the 4x512 rows form at 24% achieved occupancy (a single wave
of 2752 one-warp programs), issue slots 46% busy, DRAM 23%.

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/gemv_split_words.py
    python3 tools/probes/decode_kernels_ncu.py --summarize ncu.csv

Measured on the H200 (s65, `benchmarks/results/ncu/h200-ncu-gemv-split-s65-2026-12-03.csv`,
caches flushed, every output within 1e-2 of float64): MLX's qmv 30.2 us, runs 1024/1 19.7,
this kernel 20.4-27.5 (best 2048/2 and 4096/4 with 4 rows, 4096/4 with 2 rows: 20.4) - no
faster.  Every form since s28 (one output a warp, rows a warp, K split, words a lane) lands
at 19.5-25 us: about 6.7 SASS instructions a weight (shift, mask, I2FP, FFMA, x's
conversion, address and reduction arithmetic; NVRTC sm_90), which at the ~50% issue rate
these kernels reach is that time.  Past it needs fewer instructions a weight - two nibbles
a LOP3 as a half2 (0x6400 | q, less 1024) multiplied in half2 (HFMA2), ~2.5 a weight -
which the language cannot express yet (no packed 16-bit pairs).  Not a candidate.
"""

import math
import sys

import numpy as np

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")

import metile  # noqa: E402

@metile.inline
def word_products(w, scales, biases, n, at, xk, xs, e, words_total, groups, BITS, GROUP):
    """Per packed word of row n: s * sum_e q_e x_e + b * sum_e x_e (a (W,) tile)."""
    PER = 32 // BITS
    packed = metile.load(w + n * words_total + at[:, None] + e[None, :] * 0)
    s = metile.load(scales + n * groups + at // (GROUP // PER)).to(metile.float32)
    b = metile.load(biases + n * groups + at // (GROUP // PER)).to(metile.float32)
    q = ((packed >> (e * BITS)[None, :]) & ((1 << BITS) - 1)).to(metile.float32)
    return s * metile.sum(q * xk, axis=1) + b * xs


@metile.kernel
def quantized_matvec_words(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                           GROUP: metile.constexpr = 64, BLOCK_K: metile.constexpr = 2048,
                           ROWS: metile.constexpr = 4):
    PER = 32 // BITS
    WORDS = BLOCK_K // PER
    n0 = metile.program_id(0) * ROWS
    r = metile.program_id(1)
    word = metile.arange(0, WORDS)
    e = metile.arange(0, PER)
    words_total = K // PER
    groups = K // GROUP
    n_a = n0
    n_b = metile.minimum(n0 + 1, N - 1)
    n_c = metile.minimum(n0 + 2, N - 1)
    n_d = metile.minimum(n0 + 3, N - 1)
    acc_a = metile.zeros((WORDS,), dtype=metile.float32)
    acc_b = metile.zeros((WORDS,), dtype=metile.float32)
    acc_c = metile.zeros((WORDS,), dtype=metile.float32)
    acc_d = metile.zeros((WORDS,), dtype=metile.float32)
    for start in range(0, K, BLOCK_K):
        kk = start + word[:, None] * PER + e[None, :]
        xk = metile.load(x + r * K + kk).to(metile.float32)
        xs = metile.sum(xk, axis=1)
        at = start // PER + word
        acc_a += word_products(w, scales, biases, n_a, at, xk, xs, e, words_total, groups, BITS, GROUP)
        if ROWS > 1:
            acc_b += word_products(w, scales, biases, n_b, at, xk, xs, e, words_total, groups, BITS, GROUP)
        if ROWS > 2:
            acc_c += word_products(w, scales, biases, n_c, at, xk, xs, e, words_total, groups, BITS, GROUP)
        if ROWS > 3:
            acc_d += word_products(w, scales, biases, n_d, at, xk, xs, e, words_total, groups, BITS, GROUP)
    lanes = metile.arange(0, ROWS)
    totals = metile.where(lanes == 0, metile.sum(acc_a), 0.0)
    if ROWS > 1:
        totals = metile.where(lanes == 1, metile.sum(acc_b), totals)
    if ROWS > 2:
        totals = metile.where(lanes == 2, metile.sum(acc_c), totals)
    if ROWS > 3:
        totals = metile.where(lanes == 3, metile.sum(acc_d), totals)
    one = metile.arange(0, 1)
    nn = n0 + lanes
    metile.store(out + (r + one)[:, None] * N + nn[None, :], totals[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (nn[None, :] < N))


# (BLOCK_K, num_warps, ROWS)
CONFIGS = [(1024, 1, 4), (1024, 2, 4), (2048, 2, 4), (2048, 4, 4), (4096, 4, 4), (4096, 8, 4),
           (1024, 1, 2), (2048, 2, 2), (2048, 4, 2), (4096, 4, 2), (4096, 8, 2), (2048, 4, 1),
           (4096, 8, 1)]


def main(repeat=3):
    import mlx.core as mx
    from metile import quantized_ops
    n, kk = 11008, 4096
    w = (mx.random.normal((n, kk), key=mx.random.key(1)) / math.sqrt(kk)).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((1, kk), key=mx.random.key(3)).astype(mx.float16)
    mx.eval(wq, s, b, x)
    reference = np.array(x.astype(mx.float32), np.float64) @ np.array(
        mx.dequantize(wq, s, b, group_size=64, bits=4).astype(mx.float32), np.float64).T
    sides = [("mlx quantized_matmul", lambda: mx.quantized_matmul(x, wq, s, b)),
             ("runs 1024/1", lambda: quantized_ops._metile(
                 x, wq, s, b, n, kk, True, 64, 4,
                 {"kernel": "matvec_runs", "BLOCK_K": 1024, "num_warps": 1}))]
    for bk, warps, rows in CONFIGS:
        sides.append((f"split {bk}/{warps} rows {rows}", lambda bk=bk, warps=warps, rows=rows:
                      quantized_matvec_words[(math.ceil(n / rows), 1)](
                          x, wq, s, b, mx.zeros((1, n), mx.float16), 1, n, kk,
                          BLOCK_K=bk, ROWS=rows, num_warps=warps)))
    for name, fn in sides:
        try:
            out = fn()
            mx.eval(out)
        except Exception as e:
            print("side", name, type(e).__name__, str(e)[:200], flush=True)
            continue
        mx.synchronize()
        error = (np.abs(np.array(out.astype(mx.float32), np.float64) - reference).max()
                 / np.abs(reference).max())
        print("side", name, f"WRONG: max error {error:.2e}" if error > 1e-2 else "ok", flush=True)
        for _ in range(repeat):
            mx.eval(fn())
            mx.synchronize()


if __name__ == "__main__":
    main()
