"""The int4/int8 GEMV in packed 16-bit pair arithmetic (`metile.pair_fma`): decode-shaped
`x @ W.T` on weights from `mx.quantize` (the packing quantized.py documents), two weights an
instruction.  `quantized_ops` runs it (MATVEC_PAIRS) where `PAIR_FORMS` holds the weights'
bits and x's dtype, transpose=True.

Why pairs: every float GEMV in quantized.py spends ~6.7-7.8 SASS instructions a weight
(unpack, convert, scale, multiply, add), and on the H200 that, not DRAM, was their bound
(benchmarks/results/README.md, s65).  Here a nibble pair ORed into the mantissa of 1024 is two
weights, one pair_fma centres them exactly and one multiplies them by x's pair and adds: ~2.8
instructions a weight at 8 rows and 4 words a lane.
"""

import metile

# (dtype, bits) the magic-number unpacking is exact for: M + q must stay below 2M
PAIR_FORMS = (("float16", 4), ("float16", 8), ("bfloat16", 4))


# the float M of each 16-bit dtype whose last mantissa bits an OR of q makes M + q exactly
MAGICS = {"float16": 1024.0, "bfloat16": 128.0}


def _twice(dtype_name: str, v: float) -> int:
    """The bits of `v` as a 16-bit float of `dtype_name`, in both halves of a word."""
    import numpy as np

    f = np.array(v, dtype=np.float32)
    if dtype_name == "float16":
        h = f.astype(np.float16)
        assert float(h) == v, v      # every constant here is exact
        h = int(h.view(np.uint16))
    else:
        assert float(f) == v and int(f.view(np.uint32)) & 0xFFFF == 0, v
        h = int(f.view(np.uint32)) >> 16
    return h | (h << 16)


def pair_constants(dtype_name: str, bits: int) -> dict:
    """The constants `quantized_matvec_pairs` takes for 16-bit floats of `dtype_name`, each
    16-bit one given twice, in both halves of a word:

    MAGIC  the bits of the float M whose last mantissa bits an OR of q makes M + q exactly
           (float16 1024: 10 mantissa bits; bfloat16 128: 7 bits, so 4-bit weights only);
    ONE, SHIFT  1 and -(M + C), so that one pair_fma makes q - C exactly: C = 2^(bits - 1)
           centres q (the products x (q - C) summed in 16 bits are about half the size of
           x q, and so is their rounding; the bias becomes b + C s);
    ONE_HI, SHIFT_HI  1/16 and -(M / 16 + C): the same for a nibble kept in place at bits
           4-7 (float16 4-bit: M + 16 q, IN_PLACE)."""
    if (dtype_name, bits) not in PAIR_FORMS:
        raise ValueError(f"quantized_matvec_pairs takes {sorted(PAIR_FORMS)}, got "
                         f"{(dtype_name, bits)}")
    magic = MAGICS[dtype_name]
    centre = float(1 << (bits - 1))

    def twice(v):
        return _twice(dtype_name, v)

    return {"MAGIC": twice(magic), "ONE": twice(1.0), "SHIFT": twice(-(magic + centre)),
            "ONE_HI": twice(1.0 / 16), "SHIFT_HI": twice(-(magic / 16 + centre)),
            "CENTRE": centre, "IN_PLACE": dtype_name == "float16" and bits == 4}


def unpack_constants(dtype_name: str) -> dict:
    """quantized_matmul's PAIRS constants for 4-bit weights and x of `dtype_name`: MAGIC and
    ONE as in `pair_constants`, UNMAGIC the pair -M (one pair_fma of M + q with ONE and
    UNMAGIC is q, exactly)."""
    c = pair_constants(dtype_name, 4)
    return {"MAGIC": c["MAGIC"], "ONE": c["ONE"],
            "UNMAGIC": _twice(dtype_name, -MAGICS[dtype_name])}


@metile.inline
def x_half(at, i, live, EVEN):
    """x's 16-bit value at `at + i` as the low bits of a uint64."""
    if EVEN:
        v = metile.load(at + i)
    else:
        v = metile.load(at + i, mask=live, other=0.0)
    return v.to(metile.uint16, bitcast=True).to(metile.uint64)


@metile.inline
def x_word(at, j, live, X_HALVES, EVEN):
    """x's 64-bit word j from `at` (its 16-bit values 4j .. 4j + 3, the first lowest): one
    64-bit load of the uint64 view, or (X_HALVES, `at` then counting 16-bit values) four
    loads of the values joined - which reads an x that starts anywhere (a view one element
    in), where the view's 64-bit loads would be misaligned (csrc/cuda_launch.cpp refuses
    such a pointer; on the H100 MLX's view handed the kernel an aligned x, s152)."""
    if X_HALVES:
        return x_half(at, 4 * j, live, EVEN) | (x_half(at, 4 * j + 1, live, EVEN) << 16) | \
            (x_half(at, 4 * j + 2, live, EVEN) << 32) | (x_half(at, 4 * j + 3, live, EVEN) << 48)
    if EVEN:
        return metile.load(at + j)
    return metile.load(at + j, mask=live, other=0)


@metile.inline
def float_rows(w, x_row, scales, biases, nn, lane, words, groups, WPG, BITS, LANES, ROWS,
               DTYPE, X_HALVES, W64=False):
    """sum_k x[k] (s q_k + b) of rows nn in float32, a packed word a lane a step: what
    quantized_matvec_pairs computes where one of its 16-bit sums overflowed (W64: `w` the
    weights' uint64 view, two packed words an element, the first lowest)."""
    XPW = 8 // BITS
    acc = metile.zeros((ROWS, LANES), dtype=metile.float32)
    for w0 in range(0, words, LANES):
        word = w0 + lane
        live = (word < words)[None, :]
        if W64:
            pair = metile.load(w + nn[:, None] * (words // 2) + (word // 2)[None, :],
                               mask=live, other=0)
            packed = ((pair >> (32 * (word % 2)).to(metile.uint64)[None, :]) &
                      0xFFFFFFFF).to(metile.uint32)
        else:
            packed = metile.load(w + nn[:, None] * words + word[None, :], mask=live, other=0)
        g = (word // WPG)[None, :]
        s = metile.load(scales + nn[:, None] * groups + g, mask=live, other=0.0).to(
            metile.float32)
        b = metile.load(biases + nn[:, None] * groups + g, mask=live, other=0.0).to(
            metile.float32)
        for e in metile.static_range(XPW):
            v = x_word(x_row, (word * XPW + e)[None, :], live, X_HALVES, False)
            for h in metile.static_range(4):
                xh = ((v >> (16 * h)) & 0xFFFF).to(metile.uint16).to(DTYPE, bitcast=True).to(
                    metile.float32)
                q = ((packed >> (BITS * (4 * e + h))) & ((1 << BITS) - 1)).to(metile.float32)
                acc += (s * q + b) * xh
    return metile.sum(acc, axis=1)


@metile.inline
def pair_halves(word, DTYPE):
    """The two 16-bit floats of uint32 words, as float32: (low, high)."""
    lo = (word & 0xFFFF).to(metile.uint16).to(DTYPE, bitcast=True).to(metile.float32)
    hi = (word >> 16).to(metile.uint16).to(DTYPE, bitcast=True).to(metile.float32)
    return lo, hi


@metile.inline
def pair_fetch(w, x_row, scales, biases, nn, first, words, groups, WPG, BITS, SPAN, EVEN,
               X_HALVES, W64=False):
    """What quantized_matvec_pairs reads for words first .. first + SPAN - 1 of rows nn (one
    group: SPAN divides WPG): the group's scale and bias (float32), the packed words and x's
    64-bit words for them (two a 4-bit word, one an 8-bit one), as tuples.  W64 (with EVEN,
    SPAN even): `w` is the weights' uint64 view, a lane's words read two a 64-bit load."""
    live = (first < words)[None, :]
    g = (first // WPG)[None, :]
    at = (w + nn[:, None] * (words // 2) + (first // 2)[None, :] if W64
          else w + nn[:, None] * words + first[None, :])
    XPW = 8 // BITS                  # x's 64-bit words a packed word: 2 (4-bit), 1 (8-bit)
    xat = x_row + (first * (4 * XPW if X_HALVES else XPW))[None, :]
    if EVEN:
        s = metile.load(scales + nn[:, None] * groups + g).to(metile.float32)
        b = metile.load(biases + nn[:, None] * groups + g).to(metile.float32)
    else:
        s = metile.load(scales + nn[:, None] * groups + g, mask=live, other=0.0).to(
            metile.float32)
        b = metile.load(biases + nn[:, None] * groups + g, mask=live, other=0.0).to(
            metile.float32)
    packed = ()
    xs = ()
    for i in metile.static_range(SPAN):
        if W64:
            if i % 2 == 0:
                pair = metile.load(at + i // 2)
                packed = packed + ((pair & 0xFFFFFFFF).to(metile.uint32),
                                   (pair >> 32).to(metile.uint32))
        elif EVEN:
            packed = packed + (metile.load(at + i),)
        else:
            packed = packed + (metile.load(at + i, mask=live, other=0),)
        for e in metile.static_range(XPW):
            xs = xs + (x_word(xat, i * XPW + e, live, X_HALVES, EVEN),)
    return s, b, packed, xs


@metile.inline
def pair_word(packed, xa, xb, part, x_part, BITS, DTYPE, MAGIC, ONE, SHIFT, ONE_HI, SHIFT_HI,
              IN_PLACE):
    """One packed word's products with x added to the pair sums `part` and x's own pairs to
    `x_part` (quantized_matvec_pairs)."""
    P = 16 // BITS                   # pairs a word
    LOW = 0x000F000F if BITS == 4 else 0x00FF00FF
    x0 = (xa & 0xFFFFFFFF).to(metile.uint32)
    x1 = (xa >> 32).to(metile.uint32)
    if BITS == 4:
        x2 = (xb & 0xFFFFFFFF).to(metile.uint32)
        x3 = (xb >> 32).to(metile.uint32)
        # pair j = (x_j, x_{j+4}): halves of the word's four x pairs regrouped
        pairs = ((x0 & 0xFFFF) | (x2 << 16), (x0 >> 16) | (x2 & 0xFFFF0000),
                 (x1 & 0xFFFF) | (x3 << 16), (x1 >> 16) | (x3 & 0xFFFF0000))
    else:
        pairs = ((x0 & 0xFFFF) | (x1 << 16), (x0 >> 16) | (x1 & 0xFFFF0000))
    for j in metile.static_range(P):
        if IN_PLACE:
            # pairs 1 and 3 keep their nibbles at bits 4-7 (M + 16 q)
            half_word = packed >> (8 * (j // 2))
            if j % 2 == 0:
                q = (half_word & 0x000F000F) | MAGIC
                centred = metile.pair_fma(q, ONE, SHIFT, dtype=DTYPE)
            else:
                q = (half_word & 0x00F000F0) | MAGIC
                centred = metile.pair_fma(q, ONE_HI, SHIFT_HI, dtype=DTYPE)
        else:
            q = ((packed >> (BITS * j)) & LOW) | MAGIC
            centred = metile.pair_fma(q, ONE, SHIFT, dtype=DTYPE)
        part = metile.pair_fma(pairs[j], centred, part, dtype=DTYPE)
        x_part = metile.pair_fma(pairs[j], ONE, x_part, dtype=DTYPE)
    return part, x_part


@metile.inline
def pair_step(w, x_row, scales, biases, nn, first, words, groups, m, WPG, BITS, ROWS, LANES,
              SPAN, DTYPE, ONE, SHIFT, CENTRE, ONE_HI, SHIFT_HI, IN_PLACE, EVEN, X_HALVES,
              W64=False):
    """One K step of quantized_matvec_pairs: sum_k x_k (s q_k + b) over words first ..
    first + SPAN - 1 of rows nn, a (ROWS, LANES) float32 tile."""
    s, b, packed, xs = pair_fetch(w, x_row, scales, biases, nn, first, words, groups, WPG, BITS,
                                  SPAN, EVEN, X_HALVES, W64)
    part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
    x_part = metile.zeros((ROWS, LANES), dtype=metile.uint32)
    for i in metile.static_range(SPAN):
        if BITS == 4:
            part, x_part = pair_word(packed[i], xs[2 * i], xs[2 * i + 1], part, x_part, BITS,
                                     DTYPE, m, ONE, SHIFT, ONE_HI, SHIFT_HI, IN_PLACE)
        else:
            part, x_part = pair_word(packed[i], xs[i], xs[i], part, x_part, BITS, DTYPE, m,
                                     ONE, SHIFT, ONE_HI, SHIFT_HI, IN_PLACE)
    lo, hi = pair_halves(part, DTYPE)
    x_lo, x_hi = pair_halves(x_part, DTYPE)
    return s * (lo + hi) + (b + CENTRE * s) * (x_lo + x_hi)


@metile.kernel
def quantized_matvec_pairs(x, w, scales, biases, out, rows, N, K, magic,
                           BITS: metile.constexpr = 4,
                           GROUP: metile.constexpr = 64, ROWS: metile.constexpr = 4,
                           LANES: metile.constexpr = 32, SPAN: metile.constexpr = 4,
                           DTYPE: metile.constexpr = metile.float16,
                           MAGIC: metile.constexpr = 0, ONE: metile.constexpr = 0,
                           SHIFT: metile.constexpr = 0, CENTRE: metile.constexpr = 0.0,
                           ONE_HI: metile.constexpr = 0, SHIFT_HI: metile.constexpr = 0,
                           IN_PLACE: metile.constexpr = False, EVEN: metile.constexpr = False,
                           X_HALVES: metile.constexpr = False, UNROLL: metile.constexpr = 0,
                           W64: metile.constexpr = False):
    """out[r, n] = sum_k x[r, k] * W[n, k] (TRANSPOSE=True) in packed 16-bit pair arithmetic:
    two weights an instruction where the other GEMVs spend ~6.7 instructions a weight
    (unpack, convert, scale, multiply, add: benchmarks/results/README.md, s65).

    `x` is the (rows, K / 4) uint64 view of the 16-bit activations (four a word, the first
    lowest), or with X_HALVES the (rows, K) activations themselves, each word joined from four
    16-bit loads (`x_word`: an x that starts at any element, where the view's 64-bit loads
    would be misaligned).  Pair j of a packed word holds elements j and j + P (P = 16 / BITS)
    in its 16-bit halves, so one AND and OR with MAGIC (`magic`) turn the pair into M + q, one
    pair_fma into q - C exactly, and one pair_fma multiplies it by x's matching pair (x's
    halves regrouped once a word, shared by the ROWS rows) and adds it to the pair sums.  Those
    are summed in 16 bits over SPAN consecutive words of one group (SPAN divides the group's
    words), then in float32 with the group's scale and bias:
        sum_k (s q_k + b) x_k = s * sum_k x_k (q_k - C) + (b + C s) * sum_k x_k.
    Program (i, r) computes outputs [i * ROWS, (i + 1) * ROWS) of row r on LANES lanes; a
    loop step covers LANES * SPAN consecutive packed words, lane l words l * SPAN and on, so
    a warp's loads of a row's words and of x are contiguous (lanes taking whole groups read
    x 128 bytes apart, a cache line a lane: 33-98 us on the H200, s85).  On the H200 (1x4096
    x11008 int4 group 64 float16, ncu kernel time, second s89 run): ROWS 8 SPAN 4 13.2 us,
    ROWS 4 SPAN 2 13.9, ROWS 4 SPAN 4 14.8, SPAN 8 19.7-36.7; the runs GEMV 18.8 and MLX's
    qmv ~30.  W64 (with EVEN and an even SPAN; `w` the weights' uint64 view): a lane's words
    two a 64-bit load - ncu ranked it slower (s93: 14.0 against 13.3); in the chain its probe
    form was 3-4% faster on one H100 (s156), this form 4-10% slower on another (s157).
    No faster (s93, same measure, 8/4 at 13.3 in that run): that with the next step's reads
    issued a step ahead (12.9), rows spread over 2-4 warps a program (13.7-14.7), 16 rows a
    warp (16.1), SPAN 8 with 64-bit loads (19.5-22.0) - removed.  A row past N reads row
    N - 1 (not stored), so no row branches.  EVEN: a row's words are a multiple of LANES * SPAN
    (no load is masked).  UNROLL: the first UNROLL K steps unrolled (at most the row's
    steps: with EVEN their loads are not masked), the rest in a loop - ptxas then issues a
    later step's loads among an earlier step's arithmetic, no faster on the H100 (17.8 us a
    product against 17.4, s152).  MAGIC, ONE, SHIFT, CENTRE, ONE_HI, SHIFT_HI, IN_PLACE:
    `pair_constants(DTYPE, BITS)` (IN_PLACE: float16 4-bit, pairs 1 and 3 unpacked without
    a shift).  A 16-bit sum can overflow where |x| reaches the hundreds: its row's total is
    then not finite, and the program computes its rows again in float32 (`float_rows`)."""
    PER = 32 // BITS
    WPG = GROUP // PER             # packed words a group (a multiple of SPAN)
    STEP = LANES * SPAN
    # at most 32 products a 16-bit sum (a sum that overflows falls back: float_rows)
    metile.static_assert(SPAN * PER // 2 <= 32 and WPG % SPAN == 0,
                         "SPAN words must lie in one group, at most 32 products a sum")
    metile.static_assert(not W64 or (EVEN and SPAN % 2 == 0),
                         "W64 reads a lane's words two a load: it needs EVEN and an even SPAN")
    words = K // PER
    groups = K // GROUP
    n = metile.program_id(0) * ROWS + metile.arange(0, ROWS)
    nn = metile.minimum(n, N - 1)
    r = metile.program_id(1)
    lane = metile.arange(0, LANES)
    # x through a pointer broadcast over the rows, not a (LANES,) tile broadcast (placed in
    # threadgroup memory): lane l holds column l of every (ROWS, LANES) tile, so the ROWS
    # loads of one address are one load to the GPU compiler
    if X_HALVES:   # x as its 16-bit values (`x_word`), else its uint64 view
        x_row = x + r * K + (nn * 0)[:, None]
    else:
        x_row = x + r * (K // 4) + (nn * 0)[:, None]
    # MAGIC as the launch passes it (`magic`, its value): a register the loop keeps, where
    # the constant was rematerialized (a MOV) before each OR that takes it (ptxas, sm_90)
    m = magic.to(metile.uint32)
    acc = metile.zeros((ROWS, LANES), dtype=metile.float32)
    # the first UNROLL steps in one block, the GPU compiler free to issue a later step's
    # loads among an earlier step's arithmetic; the rest (all of them where UNROLL is 0) in
    # a loop
    for w0 in metile.static_range(0, UNROLL * STEP, STEP):
        acc += pair_step(w, x_row, scales, biases, nn, w0 + lane * SPAN, words, groups, m, WPG,
                         BITS, ROWS, LANES, SPAN, DTYPE, ONE, SHIFT, CENTRE, ONE_HI, SHIFT_HI,
                         IN_PLACE, EVEN, X_HALVES, W64)
    for w0 in range(UNROLL * STEP, words, STEP):
        acc += pair_step(w, x_row, scales, biases, nn, w0 + lane * SPAN, words, groups, m, WPG,
                         BITS, ROWS, LANES, SPAN, DTYPE, ONE, SHIFT, CENTRE, ONE_HI, SHIFT_HI,
                         IN_PLACE, EVEN, X_HALVES, W64)
    total = metile.sum(acc, axis=1)
    # a 16-bit sum that overflowed (|x| in the hundreds and more) left its row's total
    # infinite or NaN: those programs compute their rows again in float32 (as does an x
    # holding inf or NaN, whose result is that again)
    if metile.sum(metile.where(total - total == 0, 0, 1)) > 0:
        total = float_rows(w, x_row, scales, biases, nn, lane, words, groups, WPG, BITS, LANES,
                           ROWS, DTYPE, X_HALVES, W64)
    one = metile.arange(0, 1)
    metile.store(out + (r + one)[:, None] * N + n[None, :], total[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (n[None, :] < N))
