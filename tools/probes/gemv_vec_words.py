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

The words two a 64-bit load (s45's second form here) are in the library as
quantized_ops.MATVEC_PAIRS_W64; gemv_warps_chain.py times them (FORMS=w64).

    python3 tools/probes/gemv_vec_words.py [--sass]   # CPU: against the library kernel
"""
import math
import re
import sys

sys.path[:0] = ["tools/probes", ".", "kernels", "tests"]
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import metile  # noqa: E402
from metile import quantized_ops  # noqa: E402
from gemv_interleaved import program_rows, store_rows  # noqa: E402
from metile_kernels.quantized_pairs import pair_constants, pair_halves, pair_word  # noqa: E402


@metile.kernel
def pairs_words(x, wv, scales, biases, out, rows, N, K, magic, BITS: metile.constexpr = 4,
                GROUP: metile.constexpr = 64, ROWS: metile.constexpr = 8,
                LANES: metile.constexpr = 32, SPAN: metile.constexpr = 4,
                DTYPE: metile.constexpr = metile.float16, MAGIC: metile.constexpr = 0,
                ONE: metile.constexpr = 0, SHIFT: metile.constexpr = 0,
                CENTRE: metile.constexpr = 0.0, ONE_HI: metile.constexpr = 0,
                SHIFT_HI: metile.constexpr = 0, IN_PLACE: metile.constexpr = False):
    """quantized_matvec_pairs (EVEN, float16 4-bit, no float32 fallback) with each lane's SPAN
    packed words read as one run of their float32 view `wv`, split apart."""
    PER = 32 // BITS
    WPG = GROUP // PER
    STEP = LANES * SPAN
    words = K // PER
    groups = K // GROUP
    n, nn, r, lane, x_row = program_rows(x, N, K, ROWS, LANES)
    m = magic.to(metile.uint32)
    acc = metile.zeros((ROWS, LANES), dtype=metile.float32)
    for w0 in range(0, words, STEP):
        first = w0 + lane * SPAN
        g = (first // WPG)[None, :]
        s = metile.load(scales + nn[:, None] * groups + g).to(metile.float32)
        b = metile.load(biases + nn[:, None] * groups + g).to(metile.float32)
        v = metile.load(wv + nn[:, None] * words + (w0 + metile.arange(0, STEP))[None, :])
        ev, od = metile.split(metile.reshape(v.to(metile.uint32, bitcast=True), ROWS, LANES, 2,
                                             2))
        p0, p2 = metile.split(ev)
        p1, p3 = metile.split(od)
        packed = (p0, p1, p2, p3)
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
    store_rows(out, acc, n, r, rows, N)


def launch(x, w, s, b, n, k, backend=None):
    consts = pair_constants("float16", 4)
    call = pairs_words[(math.ceil(n / 8), 1)]
    args = (x.view(mx.uint64), w.view(mx.float32), s, b, mx.zeros((1, n), x.dtype), 1, n, k,
            consts["MAGIC"])
    meta = dict(BITS=4, GROUP=64, ROWS=8, SPAN=4, DTYPE=metile.float16,
                num_warps=1, **consts)
    if backend:
        return call.prepare(*args, backend=backend, **meta)
    return call(*args, **meta)


def sass():
    import nvrtc as tools
    import pairs_sass
    s0 = mx.zeros((11008, 64), mx.float16)
    d = launch(mx.zeros((1, 4096), mx.float16), mx.zeros((11008, 512), mx.uint32), s0, s0,
               11008, 4096, backend="cuda")
    data, log = tools.cubin(tools.translation_unit(d), "sm_90", ("-Xptxas", "-v"))
    print("vec", " ".join(re.findall(r"Used \d+ registers|\d+ bytes spill \w+", log)))
    whole, loop = pairs_sass.mix(tools.disassemble(data))
    print("  loop", sum(loop.values()), ", ".join(f"{o} {c}" for o, c in loop.most_common(30)))


if __name__ == "__main__":
    n, k = 300, 4096
    x = mx.random.normal((1, k)).astype(mx.float16)
    q = mx.quantize((mx.random.normal((n, k)) / 64).astype(mx.float16), group_size=64, bits=4)
    base = np.array(quantized_ops._metile(x, *q, n, k, True, 64, 4,
                                          quantized_ops.MATVEC_PAIRS[0]).astype(mx.float32))
    got = np.array(launch(x, *q, n, k).astype(mx.float32))
    print("vec max diff vs library", np.abs(got - base).max())
    if "--sass" in sys.argv:
        sass()
