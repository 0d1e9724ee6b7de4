"""The int4 pair GEMV reading its packed words as 16-byte runs (issue 17's decode target):
CPU-side evidence for the next step, no GPU timing yet.

On the H100 (s154b, benchmarks/results/README.md) the GEMV's weight words alone read as
16-byte runs took 13.2 us a product against 16.2 as 4-byte loads (the H200: 11.7 / 11.8), and
the GEMV costs what its reads cost.  Here the words come in as one (ROWS, LANES * SPAN) float32
tile (vectorize_rows gives a lane its SPAN consecutive words: LDG.E.128) and are taken apart by
reshape to (ROWS, LANES, 2, 2) and `split`.  The numbers are the library kernel's (bit for
bit, CPU runtime), but the sm_90 SASS (NVRTC, `--sass`) moves the split through shared memory:
32 STS + 8 STS.128, 32 LDS + 16 LDS.64 and 4 barriers a step, 909 instructions a loop against
671.  `split` lowers per element (passes/lower_tiles.py); a split along an axis each thread
holds whole would be register-local - the compiler change this form waits on.

A second form (FORM "w64") reads the words two a load through a uint64 view and takes them
apart by shift and mask: 656 instructions a loop, 24 LDG.E.64, no shared memory (s93 timed
it by ncu's single launches: 14.0 against 13.3 us; `--time` times it in the chain).  In the
chain (s156, H100, four runs): 13.9-14.0 us a product against 14.4-14.6 for the library
form, MLX 27.8-27.9 - 3-4% faster, 1.99x of MLX against 1.92x.  In the library since as the
W64 form (quantized_ops.MATVEC_PAIRS_W64, a candidate `auto` measures; not the default until
the H200 confirms it).

    python3 tools/probes/gemv_vec_words.py [--sass]   # CPU: against the library kernel
    python3 tools/probes/gemv_vec_words.py --time [out.json]   # GPU: the chain
"""
import math
import re
import sys

sys.path[:0] = ["tools/probes", ".", "kernels", "tests"]
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import metile  # noqa: E402
from metile import quantized_ops  # noqa: E402
from metile_kernels.quantized_pairs import pair_constants, pair_halves, pair_word  # noqa: E402


@metile.kernel
def pairs_words(x, wv, scales, biases, out, rows, N, K, magic, BITS: metile.constexpr = 4,
                GROUP: metile.constexpr = 64, ROWS: metile.constexpr = 8,
                LANES: metile.constexpr = 32, SPAN: metile.constexpr = 4,
                DTYPE: metile.constexpr = metile.float16, MAGIC: metile.constexpr = 0,
                ONE: metile.constexpr = 0, SHIFT: metile.constexpr = 0,
                CENTRE: metile.constexpr = 0.0, ONE_HI: metile.constexpr = 0,
                SHIFT_HI: metile.constexpr = 0, IN_PLACE: metile.constexpr = False,
                FORM: metile.constexpr = "vec"):
    """quantized_matvec_pairs (EVEN, float16 4-bit, no float32 fallback) with each lane's SPAN
    packed words read through the view `wv`: FORM "vec" one run of its float32 view split
    apart, "w64" two words a load of its uint64 view, taken apart by shift and mask."""
    PER = 32 // BITS
    WPG = GROUP // PER
    STEP = LANES * SPAN
    words = K // PER
    groups = K // GROUP
    n = metile.program_id(0) * ROWS + metile.arange(0, ROWS)
    nn = metile.minimum(n, N - 1)
    r = metile.program_id(1)
    lane = metile.arange(0, LANES)
    x_row = x + r * (K // 4) + (nn * 0)[:, None]
    m = magic.to(metile.uint32)
    acc = metile.zeros((ROWS, LANES), dtype=metile.float32)
    for w0 in range(0, words, STEP):
        first = w0 + lane * SPAN
        g = (first // WPG)[None, :]
        s = metile.load(scales + nn[:, None] * groups + g).to(metile.float32)
        b = metile.load(biases + nn[:, None] * groups + g).to(metile.float32)
        if FORM == "vec":
            v = metile.load(wv + nn[:, None] * words + (w0 + metile.arange(0, STEP))[None, :])
            ev, od = metile.split(metile.reshape(v.to(metile.uint32, bitcast=True), ROWS,
                                                 LANES, 2, 2))
            p0, p2 = metile.split(ev)
            p1, p3 = metile.split(od)
            packed = (p0, p1, p2, p3)
        else:
            at = wv + nn[:, None] * (words // 2) + (first // 2)[None, :]
            packed = ()
            for h in metile.static_range(SPAN // 2):
                pair = metile.load(at + h)
                packed = packed + ((pair & 0xFFFFFFFF).to(metile.uint32),
                                   (pair >> 32).to(metile.uint32))
        xat = x_row + (first * 2)[None, :]
        part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
        x_part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
        for j in metile.static_range(SPAN):
            part, x_part = pair_word(packed[j], metile.load(xat + 2 * j),
                                     metile.load(xat + 2 * j + 1), part, x_part, BITS, DTYPE, m,
                                     ONE, SHIFT, ONE_HI, SHIFT_HI, IN_PLACE)
        lo, hi = pair_halves(part, DTYPE)
        x_lo, x_hi = pair_halves(x_part, DTYPE)
        acc += s * (lo + hi) + (b + CENTRE * s) * (x_lo + x_hi)
    total = metile.sum(acc, axis=1)
    one = metile.arange(0, 1)
    metile.store(out + (r + one)[:, None] * N + n[None, :], total[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (n[None, :] < N))


def launch(x, w, s, b, n, k, backend=None, form="vec"):
    consts = pair_constants("float16", 4)
    view = mx.float32 if form == "vec" else mx.uint64
    call = pairs_words[(math.ceil(n / 8), 1)]
    args = (x.view(mx.uint64), w.view(view), s, b, mx.zeros((1, n), x.dtype), 1, n, k,
            consts["MAGIC"])
    meta = dict(BITS=4, GROUP=64, ROWS=8, SPAN=4, DTYPE=metile.float16, FORM=form,
                num_warps=1, **consts)
    if backend:
        return call.prepare(*args, backend=backend, **meta)
    return call(*args, **meta)


def sass(form):
    import nvrtc as tools
    import pairs_sass
    s0 = mx.zeros((11008, 64), mx.float16)
    d = launch(mx.zeros((1, 4096), mx.float16), mx.zeros((11008, 512), mx.uint32), s0, s0,
               11008, 4096, backend="cuda", form=form)
    data, log = tools.cubin(tools.translation_unit(d), "sm_90", ("-Xptxas", "-v"))
    print(form, " ".join(re.findall(r"Used \d+ registers|\d+ bytes spill \w+", log)))
    whole, loop = pairs_sass.mix(tools.disassemble(data))
    print("  loop", sum(loop.values()), ", ".join(f"{o} {c}" for o, c in loop.most_common(30)))


def timed():
    """us a product in the chain (probe_report.chained_us): the library GEMV, the uint64
    words form, MLX (1x4096x11008 int4 group 64 float16, 4 weights cycled)."""
    import os

    from probe_report import add_case, chained_us, check_close, machine_info, save
    n, k, chain = int(os.environ.get("N", "11008")), 4096, 8
    x = mx.random.normal((1, k), key=mx.random.key(99)).astype(mx.float16)
    qs = [mx.quantize((mx.random.normal((n, k), key=mx.random.key(i)) / 64).astype(
        mx.float16), group_size=64, bits=4) for i in range(4)]
    mx.eval(x, qs)
    sides = {
        "pairs": lambda x, *q: quantized_ops._metile(x, *q, n, k, True, 64, 4,
                                                     quantized_ops.MATVEC_PAIRS[0]),
        "w64": lambda x, *q: launch(x, *q, n, k, form="w64"),
        "mlx": lambda x, *q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4),
    }
    want = sides["mlx"](x, *qs[0])
    for name, op in sides.items():
        check_close(op(x, *qs[0]), want, name)
    us = chained_us(sides, [(x, *qs[i % 4]) for i in range(chain)],
                    int(os.environ.get("ROUNDS", "9")))
    report = {"machine": machine_info(), "metric": "us a product, 8 a compiled call", "cases": []}
    add_case(report, {"n": n, "k": k, "us": us,
                      "mlx_over": {s_: round(us["mlx"] / t, 3) for s_, t in us.items()}})
    save(report, sys.argv[2] if len(sys.argv) > 2 else None)


if __name__ == "__main__":
    if "--time" in sys.argv:
        timed()
        sys.exit()
    n, k = 300, 4096
    x = mx.random.normal((1, k)).astype(mx.float16)
    q = mx.quantize((mx.random.normal((n, k)) / 64).astype(mx.float16), group_size=64, bits=4)
    base = np.array(quantized_ops._metile(x, *q, n, k, True, 64, 4,
                                          quantized_ops.MATVEC_PAIRS[0]).astype(mx.float32))
    for form in ("vec", "w64"):
        got = np.array(launch(x, *q, n, k, form=form).astype(mx.float32))
        print(form, "max diff vs library", np.abs(got - base).max())
        if "--sass" in sys.argv:
            sass(form)
