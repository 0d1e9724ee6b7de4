"""Whether the int4 pair GEMV gains from persistent programs (issue 17's decode target): every
one-wave form of quantized_matvec_pairs reads its weights at 31-41% of DRAM (s100).  Here
`programs` one-warp programs each walk row blocks p, p + programs, ... with the next (block,
step)'s reads issued before this step's arithmetic (a carried tuple), so a warp keeps loads in
flight across blocks and the launch has no ramp of 1376 programs.  Its stores sit in the block
loop, which the launch cannot prove cover the output (a fill and a merge follow the kernel):
this probe measures the kernel alone, under ncu, beside the library's 8/4 form.

    python3 tools/probes/gemv_stream.py --check            # CPU: numbers against NumPy
    ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        -k regex:matvec_pairs python3 tools/probes/gemv_stream.py
"""
import argparse
import math
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "kernels")
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import metile  # noqa: E402
from metile import quantized_ops  # noqa: E402
from metile_kernels.quantized_pairs import (float_rows, pair_constants, pair_fetch,  # noqa: E402
                                            pair_halves, pair_word)


@metile.kernel
def quantized_matvec_pairs_stream(x, w, scales, biases, out, rows, N, K, magic, programs,
                                  BITS: metile.constexpr = 4, GROUP: metile.constexpr = 64,
                                  ROWS: metile.constexpr = 8, LANES: metile.constexpr = 32,
                                  SPAN: metile.constexpr = 4,
                                  DTYPE: metile.constexpr = metile.float16,
                                  ONE: metile.constexpr = 0, SHIFT: metile.constexpr = 0,
                                  CENTRE: metile.constexpr = 0.0, ONE_HI: metile.constexpr = 0,
                                  SHIFT_HI: metile.constexpr = 0,
                                  IN_PLACE: metile.constexpr = False):
    """quantized_matvec_pairs (EVEN shapes) on `programs` persistent programs: program p
    takes row blocks p, p + programs, ...; the reads of the next step - of this block or of
    the next one - are issued before this step's arithmetic."""
    PER = 32 // BITS
    WPG = GROUP // PER
    STEP = LANES * SPAN
    words = K // PER
    groups = K // GROUP
    steps = words // STEP
    blocks = (N + ROWS - 1) // ROWS
    p = metile.program_id(0)
    r = metile.program_id(1)
    lane = metile.arange(0, LANES)
    rows_i = metile.arange(0, ROWS)
    x_row = x + r * (K // 4) + (rows_i * 0)[:, None]
    m = magic.to(metile.uint32)
    mine = (blocks - p + programs - 1) // programs
    last = mine * steps - 1
    ahead = pair_fetch(w, x_row, scales, biases, metile.minimum(p * ROWS + rows_i, N - 1),
                       lane * SPAN, words, groups, WPG, BITS, SPAN, True, False)
    for i in range(0, mine):
        acc = metile.zeros((ROWS, LANES), dtype=metile.float32)
        for st in range(0, steps):
            s, b, packed, xs = ahead
            t1 = metile.minimum(i * steps + st + 1, last)
            nn1 = metile.minimum((p + (t1 // steps) * programs) * ROWS + rows_i, N - 1)
            ahead = pair_fetch(w, x_row, scales, biases, nn1, (t1 % steps) * STEP + lane * SPAN,
                               words, groups, WPG, BITS, SPAN, True, False)
            part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
            x_part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
            for j in metile.static_range(SPAN):
                if BITS == 4:
                    part, x_part = pair_word(packed[j], xs[2 * j], xs[2 * j + 1], part, x_part,
                                             BITS, DTYPE, m, ONE, SHIFT, ONE_HI, SHIFT_HI,
                                             IN_PLACE)
                else:
                    part, x_part = pair_word(packed[j], xs[j], xs[j], part, x_part, BITS, DTYPE,
                                             m, ONE, SHIFT, ONE_HI, SHIFT_HI, IN_PLACE)
            lo, hi = pair_halves(part, DTYPE)
            x_lo, x_hi = pair_halves(x_part, DTYPE)
            acc += s * (lo + hi) + (b + CENTRE * s) * (x_lo + x_hi)
        n = (p + i * programs) * ROWS + rows_i
        total = metile.sum(acc, axis=1)
        if metile.sum(metile.where(total - total == 0, 0, 1)) > 0:
            total = float_rows(w, x_row, scales, biases, metile.minimum(n, N - 1), lane, words,
                               groups, WPG, BITS, LANES, ROWS, DTYPE, False)
        one = metile.arange(0, 1)
        metile.store(out + (r + one)[:, None] * N + n[None, :], total[None, :].to(out.dtype),
                     mask=((r + one)[:, None] < rows) & (n[None, :] < N))


def stream(x, wq, s, b, n, k, programs, bits=4, rows=8, span=4):
    name = str(x.dtype).removeprefix("mlx.core.")
    c = pair_constants(name, bits)
    kw = {key: c[key] for key in ("ONE", "SHIFT", "CENTRE", "ONE_HI", "SHIFT_HI", "IN_PLACE")}
    blocks = math.ceil(n / rows)
    p = min(programs, blocks)
    return quantized_matvec_pairs_stream[(p, x.shape[0])](
        x.view(mx.uint64), wq, s, b, mx.zeros((x.shape[0], n), x.dtype), x.shape[0], n, k,
        c["MAGIC"], p, BITS=bits, GROUP=64, ROWS=rows, SPAN=span, DTYPE=getattr(metile, name),
        num_warps=1, **kw)


def operands(rows, n, k, seed=0):
    w = (mx.random.normal((n, k), key=mx.random.key(seed)) / math.sqrt(k)).astype(mx.float16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((rows, k), key=mx.random.key(seed + 1)).astype(mx.float16)
    mx.eval(wq, s, b, x)
    ref = np.array(x.astype(mx.float32), np.float64) @ np.array(
        mx.dequantize(wq, s, b, group_size=64, bits=4).astype(mx.float32), np.float64).T
    return x, wq, s, b, ref


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if args.check:
        for rows, n, k, programs in ((1, 37, 1024, 3), (2, 70, 2048, 4), (1, 64, 1024, 100)):
            x, wq, s, b, ref = operands(rows, n, k)
            y = np.array(stream(x, wq, s, b, n, k, programs).astype(mx.float32), np.float64)
            err = np.abs(y - ref).max() / np.abs(ref).max()
            print(rows, n, k, programs, f"{err:.2e}", "WRONG" if err > 1e-2 else "ok")
        return
    n, k = 11008, 4096
    x, wq, s, b, ref = operands(1, n, k)
    sides = [("library 8/4", lambda: quantized_ops._metile(x, wq, s, b, n, k, True, 64, 4,
                                                           quantized_ops.MATVEC_PAIRS[0]))]
    sides += [(f"stream {pr} programs", lambda pr=pr: stream(x, wq, s, b, n, k, pr))
              for pr in (132, 264, 528, 1056)]
    for name, fn in sides:
        y = np.array(fn().astype(mx.float32), np.float64)
        err = np.abs(y - ref).max() / np.abs(ref).max()
        print("side", name, "WRONG" if err > 1e-2 else "", flush=True)
        for _ in range(args.repeat):
            mx.eval(fn())
            mx.synchronize()


if __name__ == "__main__":
    main()
