"""The int4 pair GEMV with its lanes interleaved along K (issue 17's decode target).

The library GEMV (quantized_matvec_pairs, 8 rows a warp) gives lane l the SPAN consecutive
packed words l * SPAN .. of each K step, so every load instruction of a warp spreads over
the step: a 4-byte word load touches 512 bytes (4 cache lines) of which it uses 128, and x's
64-bit loads, 64 bytes apart, touch 2 KB (16 lines) a load.  Counted in L1 wavefronts (one a
line a load) that is ~272 a step a warp: 128 for the words, 128 for x, 16 for the scales and
biases - x costs the L1 what the weights do.  On the H200 (s154) the weight words alone,
read the GEMV's way, took 11.8 us a product and the GEMV's reads with x, scales and biases
14.0: the small reads cost ~2.2 us.

Here lane l reads words w0 + i * LANES + l (i < SPAN): each word load is 128 contiguous bytes
(one line), x's two 64-bit words for it 16 bytes a lane (512 bytes, 4 lines, a load): ~128
wavefronts a step.  The price: a lane's SPAN words lie in SPAN groups, so each word's pair
sums meet their scale and bias in float32 (4 products a 16-bit sum, not 16), and each word
has its own scale and bias loads (64 2-byte loads a step against 16).  The numbers are the
library's within rounding (the 16-bit sums are shorter); `--check` on the CPU, `--sass` the
sm_90 loop (NVRTC), `--time [out.json]` the chain on a GPU.

Measured (H100 80GB HBM3, s158, 8 products a compiled call, us a product, two runs): the
library form 14.7 / 14.5, interleaved 15.2 / 15.0, at 4 rows 15.7 / 15.4, two words a load
(WL 2) 14.4 / 14.3, that at 4 rows 14.4 / 14.2; MLX 28.0 / 27.8.  The L1 wavefronts a step
fell from ~272 to ~128 (WL 2) or ~112 (WL 1) and the time by at most 2%: they are not what
bounds the GEMV.  sm_90 loops (`--sass`): 991 / 577 / 763 / 469 instructions (8 rows and 4
rows, WL 1 and 2) against the library's 671, 96-128 registers at 8 rows.

    python3 tools/probes/gemv_interleaved.py --check [--sass]
    python3 tools/probes/gemv_interleaved.py --time [out.json]
"""
import math
import os
import sys

sys.path[:0] = ["tools/probes", ".", "kernels", "tests"]
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import metile  # noqa: E402
from metile import quantized_ops  # noqa: E402
from metile_kernels.quantized_pairs import pair_constants, pair_halves, pair_word  # noqa: E402


@metile.inline
def program_rows(x, N, K, ROWS, LANES):
    """Program (i, r) of a pair GEMV probe: its rows n (ROWS of them), those clamped to N - 1
    (nn: no row branches), r, the lanes and x's row r (the uint64 view) as a pointer
    broadcast over the rows, as quantized_matvec_pairs sets them up."""
    n = metile.program_id(0) * ROWS + metile.arange(0, ROWS)
    nn = metile.minimum(n, N - 1)
    r = metile.program_id(1)
    return n, nn, r, metile.arange(0, LANES), x + r * (K // 4) + (nn * 0)[:, None]


@metile.inline
def store_rows(out, acc, n, r, rows, N):
    """The lanes' float32 sums `acc` (ROWS, LANES) of rows n, summed and stored in out's
    row r."""
    total = metile.sum(acc, axis=1)
    one = metile.arange(0, 1)
    metile.store(out + (r + one)[:, None] * N + n[None, :], total[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (n[None, :] < N))


@metile.kernel
def pairs_interleaved(x, w, scales, biases, out, rows, N, K, magic,
                      GROUP: metile.constexpr = 64, ROWS: metile.constexpr = 8,
                      LANES: metile.constexpr = 32, SPAN: metile.constexpr = 4,
                      WL: metile.constexpr = 1, DTYPE: metile.constexpr = metile.float16,
                      ONE: metile.constexpr = 0, SHIFT: metile.constexpr = 0,
                      CENTRE: metile.constexpr = 0.0, ONE_HI: metile.constexpr = 0,
                      SHIFT_HI: metile.constexpr = 0, IN_PLACE: metile.constexpr = False):
    """quantized_matvec_pairs (4-bit, a row's words a multiple of LANES * SPAN, no float32
    fallback) with the lanes interleaved along K: load i of a step gives lane l the WL
    words w0 + i * WL * LANES + WL * l (WL 2: `w` the weights' uint64 view, one 64-bit load),
    SPAN words a lane a step."""
    WPG = GROUP // 8
    STEP = LANES * SPAN
    words = K // 8
    groups = K // GROUP
    n, nn, r, lane, x_row = program_rows(x, N, K, ROWS, LANES)
    m = magic.to(metile.uint32)
    acc = metile.zeros((ROWS, LANES), dtype=metile.float32)
    for w0 in range(0, words, STEP):
        first = w0 + WL * lane
        # (the group of load i: its first group plus a constant, folded into the loads)
        s_at = scales + nn[:, None] * groups + (first // WPG)[None, :]
        b_at = biases + nn[:, None] * groups + (first // WPG)[None, :]
        w_at = w + nn[:, None] * (words // WL) + (first // WL)[None, :]
        x_at = x_row + (first * 2)[None, :]
        for i in metile.static_range(SPAN // WL):
            s = metile.load(s_at + i * (WL * LANES // WPG)).to(metile.float32)
            b = metile.load(b_at + i * (WL * LANES // WPG)).to(metile.float32)
            if WL == 1:
                packed = (metile.load(w_at + i * LANES),)
            else:
                pair = metile.load(w_at + i * LANES)
                packed = ((pair & 0xFFFFFFFF).to(metile.uint32), (pair >> 32).to(metile.uint32))
            part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
            x_part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
            for j in metile.static_range(WL):
                xa = metile.load(x_at + i * 2 * WL * LANES + 2 * j)
                xb = metile.load(x_at + i * 2 * WL * LANES + 2 * j + 1)
                part, x_part = pair_word(packed[j], xa, xb, part, x_part, 4, DTYPE, m, ONE,
                                         SHIFT, ONE_HI, SHIFT_HI, IN_PLACE)
            lo, hi = pair_halves(part, DTYPE)
            x_lo, x_hi = pair_halves(x_part, DTYPE)
            acc += s * (lo + hi) + (b + CENTRE * s) * (x_lo + x_hi)
    store_rows(out, acc, n, r, rows, N)


# name -> (rows a warp, words a load)
FORMS = {"interleaved": (8, 1), "interleaved_rows4": (4, 1), "interleaved_w2": (8, 2),
         "interleaved_w2_rows4": (4, 2)}


def launch(x, w, s, b, n, k, rows=8, wl=1, backend=None):
    dtype = "float16" if x.dtype == mx.float16 else "bfloat16"
    consts = pair_constants(dtype, 4)
    magic = consts.pop("MAGIC")
    call = pairs_interleaved[(math.ceil(n / rows), 1)]
    args = (x.view(mx.uint64), w.view(mx.uint64) if wl == 2 else w, s, b, mx.zeros((1, n), x.dtype), 1, n, k, magic)
    meta = dict(GROUP=64, ROWS=rows, SPAN=4, WL=wl, DTYPE=getattr(metile, dtype), num_warps=1,
                **consts)
    if backend:
        return call.prepare(*args, backend=backend, **meta)
    return call(*args, **meta)


def library(x, w, s, b, n, k):
    return quantized_ops._metile(x, w, s, b, n, k, True, 64, 4, quantized_ops.MATVEC_PAIRS[0])


def check():
    for dtype in (mx.float16, mx.bfloat16):
        for n, k in ((300, 4096), (17, 1024)):
            x = mx.random.normal((1, k), key=mx.random.key(1)).astype(dtype)
            q = mx.quantize((mx.random.normal((n, k), key=mx.random.key(2)) / 64).astype(dtype),
                            group_size=64, bits=4)
            wf = np.array(mx.dequantize(*q, group_size=64, bits=4).astype(mx.float32),
                          np.float64)
            ref = np.array(x.astype(mx.float32), np.float64) @ wf.T
            scale = np.abs(ref).max()
            base = np.array(library(x, *q, n, k).astype(mx.float32))
            for rows, wl in FORMS.values():
                got = np.array(launch(x, *q, n, k, rows, wl).astype(mx.float32))
                print(dtype, n, k, rows, wl, "interleaved", f"{np.abs(got - ref).max() / scale:.2e}",
                      "library", f"{np.abs(base - ref).max() / scale:.2e}")


def sass(rows, wl):
    import nvrtc as tools
    import pairs_sass
    s0 = mx.zeros((11008, 64), mx.float16)
    d = launch(mx.zeros((1, 4096), mx.float16), mx.zeros((11008, 512), mx.uint32), s0, s0,
               11008, 4096, rows, wl, backend="cuda")
    data, log = tools.cubin(tools.translation_unit(d), "sm_90", ("-Xptxas", "-v"))
    print(rows, "rows", wl, "words a load:", log.strip().splitlines()[-2])
    whole, loop = pairs_sass.mix(tools.disassemble(data))
    print("  loop", sum(loop.values()), ", ".join(f"{o} {c}" for o, c in loop.most_common(14)))


def timed():
    """us a product in the chain (probe_report.chained_us): the library GEMV, the interleaved
    form at 8 and 4 rows, MLX (1x4096x11008 int4 group 64 float16, 4 weights cycled)."""
    from probe_report import add_case, chained_us, check_close, machine_info, save
    n, k, chain = int(os.environ.get("N", "11008")), 4096, 8
    x = mx.random.normal((1, k), key=mx.random.key(99)).astype(mx.float16)
    qs = [mx.quantize((mx.random.normal((n, k), key=mx.random.key(i)) / 64).astype(
        mx.float16), group_size=64, bits=4) for i in range(4)]
    mx.eval(x, qs)
    sides = {
        "pairs": lambda x, *q: library(x, *q, n, k),
        **{name: (lambda x, *q, f=f: launch(x, *q, n, k, *f)) for name, f in FORMS.items()},
        "mlx": lambda x, *q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4),
    }
    want = sides["mlx"](x, *qs[0])
    for name, op in sides.items():
        check_close(op(x, *qs[0]), want, name)
    us = chained_us(sides, [(x, *qs[i % 4]) for i in range(chain)],
                    int(os.environ.get("ROUNDS", "9")))
    report = {"machine": machine_info(), "metric": "us a product, 8 a compiled call, 4 int4 "
              "weights cycled (1x4096x11008 group 64 float16)", "cases": []}
    add_case(report, {"n": n, "k": k, "us": us,
                      "mlx_over": {s_: round(us["mlx"] / t, 3) for s_, t in us.items()}})
    save(report, sys.argv[2] if len(sys.argv) > 2 else None)


if __name__ == "__main__":
    if "--time" in sys.argv:
        timed()
    else:
        check()
        if "--sass" in sys.argv:
            for rows, wl in FORMS.values():
                sass(rows, wl)
