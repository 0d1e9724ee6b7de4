"""The int4 pair GEMV's K split over the warps of a program, timed as the benchmark times it
(issue 17's decode target).

s154 (H200, benchmarks/results/README.md, forty-fifth session) timed the library GEMV
(quantized_matvec_pairs: one-warp programs of 8 rows, 1376 warps) at 14.1 us a product in a
compiled chain and its reads alone at 14.0: its arithmetic is hidden, the reads as
structured bound it.  The same reads at 4 rows / 2 words a lane (twice the warps) took 11.9
and a flat read by 4-warp programs 9.3: more warps an SM stream faster, but 4 rows a warp
double x's regrouping work a weight.  The library kernel with LANES = 64 or 128 on 2 or 4
warps keeps 8 rows a warp and gives each warp its own LANES-wide part of every K step (sm_90
SASS, tools/probes/pairs_sass.py LANES=64 num_warps=2: the same 671-instruction loop, x's
loads 8 a step shared by the rows, 96 registers), the partial sums met once after the loop.
s91 ranked a K split by ncu's single launches (14.2-17.5 us against 13.2-14.0) and dropped
it; s154 found ncu's single launches rank the GEMV's forms differently from the chain, so
here each form is timed in the chain, 8 products a compiled call over 4 weights cycled, each
product its own arguments.  (A split by rows of the tile - rows i // ROWS of a (SPLIT * ROWS,
LANES) tile - was tried on the CPU first: its per-row x offsets defeat the sharing of x's
loads, 64 a step and 1107 instructions a loop.)

Measured (H100, s155 / s155b, us a product): default 21.6 / 18.3, LANES 64 on 2 warps 21.5 /
19.1, LANES 128 on 4 warps 22.9 / 20.8, MLX 31.0 / 30.0 - no faster, not a candidate.
s156 (another H100, whose chain ran faster throughout): default 14.6, 4 rows / 2 words 14.9,
rows over 2 / 4 warps 14.7 / 14.8, LANES 64 / 128 15.4 / 16.8, unrolled 15.0 (on 4 warps
15.0), MLX 28.0 - none faster than the default.

    python3 tools/probes/gemv_warps_chain.py [out.json]   # GPU
    python3 tools/probes/gemv_warps_chain.py --check      # CPU: each form against the default
"""
import math
import os
import sys

sys.path[:0] = ["tools/probes", ".", "kernels"]
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from metile import quantized_ops  # noqa: E402

PAIRS = quantized_ops.MATVEC_PAIRS[0]
FORMS = {
    "pairs": PAIRS,
    "pairs_4_2": quantized_ops.MATVEC_PAIRS[1],
    "lanes64_2w": {**PAIRS, "LANES": 64, "num_warps": 2},
    "lanes128_4w": {**PAIRS, "LANES": 128, "num_warps": 4},
    "rows4_lanes64_2w": {**PAIRS, "ROWS": 4, "LANES": 64, "num_warps": 2},
    "rows4_lanes128_4w": {**PAIRS, "ROWS": 4, "LANES": 128, "num_warps": 4},
    "rows16_lanes64_2w": {**PAIRS, "ROWS": 16, "LANES": 64, "num_warps": 2},
    # rows spread over the warps (the (ROWS, 32) tile's row r on warp r % num_warps, 8 rows
    # a warp): a program reads 2-4x the contiguous weight bytes, as the 4-warp flat read that
    # streamed faster (9.3 us against 11.0 by 1-warp programs, H200 s154); s93 ranked this by
    # ncu only (13.7-14.7 against 13.3)
    "rows16_2w": {**PAIRS, "ROWS": 16, "num_warps": 2},
    "rows32_4w": {**PAIRS, "ROWS": 32, "num_warps": 4},
    # the K steps unrolled (a later step's loads among an earlier step's arithmetic): timed
    # in the chain on the H100 only (17.8 against 17.4, s152), where runs differ by 3 us
    "unrolled": quantized_ops.MATVEC_PAIRS_UNROLLED,
    "rows32_4w_unrolled": {**quantized_ops.MATVEC_PAIRS_UNROLLED, "ROWS": 32, "num_warps": 4},
    # the library's words two a 64-bit load (s45 timed it first as gemv_vec_words FORM "w64")
    "w64": quantized_ops.MATVEC_PAIRS_W64,
    # 4 rows a warp at 4 words a lane: twice the warps of the default (the 4/2 reads alone
    # streamed at 11.9 against 14.0 us, H200 s154) at the default's per-step overheads a
    # word; ranked by ncu only (13.7 against 13.3, s93)
    "rows4": {**PAIRS, "ROWS": 4},
    "rows4_w64": {**quantized_ops.MATVEC_PAIRS_W64, "ROWS": 4},
}
# FORMS="pairs,w64" times those alone
if os.environ.get("FORMS"):
    FORMS = {k: FORMS[k] for k in os.environ["FORMS"].split(",")}


def operands(n, k, count, dtype=mx.float16, seed=0):
    out = []
    for i in range(count):
        w = (mx.random.normal((n, k), key=mx.random.key(seed + i)) / math.sqrt(k)).astype(dtype)
        out.append(mx.quantize(w, group_size=64, bits=4))
    x = mx.random.normal((1, k), key=mx.random.key(seed + 99)).astype(dtype)
    mx.eval(x, out)
    return x, out


def product(form, n, k):
    return lambda x, q: quantized_ops._metile(x, *q, n, k, True, 64, 4, form)


def check():
    """Each form against the default form and MLX's op (CPU runtime)."""
    for dtype in (mx.float16, mx.bfloat16):
        for n, k in ((300, 4096), (17, 2048)):
            x, qs = operands(n, k, 1, dtype)
            want = np.array(mx.quantized_matmul(x, *qs[0], transpose=True, group_size=64,
                                                bits=4).astype(mx.float32))
            base = np.array(product(PAIRS, n, k)(x, qs[0]).astype(mx.float32))
            for name, form in FORMS.items():
                got = np.array(product(form, n, k)(x, qs[0]).astype(mx.float32))
                err = np.abs(got - want).max() / np.abs(want).max()
                base_err = np.abs(base - want).max() / np.abs(want).max()
                print(dtype, n, k, name, f"{err:.2e} (default {base_err:.2e})",
                      "WRONG" if err > 2 * base_err + 1e-3 else "ok")


def main():
    if "--check" in sys.argv:
        check()
        return
    from probe_report import add_case, chained_us, check_close, machine_info, save
    chain = int(os.environ.get("CHAIN", "8"))
    rounds = int(os.environ.get("ROUNDS", "7"))
    n, k = 11008, 4096
    x, qs = operands(n, k, 4)
    want = mx.quantized_matmul(x, *qs[0], transpose=True, group_size=64, bits=4)
    sides = {name: product(form, n, k) for name, form in FORMS.items()}
    sides["mlx"] = lambda x, q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4)
    for name, op in sides.items():
        check_close(op(x, qs[0]), want, name)
    us = chained_us({name: (lambda x, *q, op=op: op(x, q)) for name, op in sides.items()},
                    [(x, *qs[i % 4]) for i in range(chain)], rounds)
    report = {"machine": machine_info(),
              "metric": f"us a product, {chain} a compiled call over 4 int4 weights cycled "
                        f"(1x{k}x{n}, group 64, float16), 20 calls a sync, median of "
                        f"{rounds} alternating rounds",
              "forms": FORMS, "cases": []}
    add_case(report, {"n": n, "k": k, "us": us,
                      "mlx_over": {s: round(us["mlx"] / t, 3) for s, t in us.items()}})
    save(report)


if __name__ == "__main__":
    main()
