"""Matrix products with weights quantized by `mx.quantize` (affine mode).

`mx.quantize(w, group_size, bits)` stores a (rows, columns) float matrix as

    packed  (rows, columns * bits / 32) uint32: element j of a row sits in word
            j // (32 / bits) at bit offset (j % (32 / bits)) * bits, lowest bits first
    scales, biases  (rows, columns / group_size): one pair per group of
            `group_size` consecutive elements of a row

and the element is `scale * q + bias` for its group (q the unsigned integer).  The
kernels here multiply by that matrix without materialising it:

    TRANSPOSE=True  (mlx.nn.QuantizedLinear's layout): y = x @ W.T, W (N, K) quantized
                    along K
    TRANSPOSE=False: y = x @ W, W (K, N) quantized along N

* `quantized_matvec` (decode, few rows, TRANSPOSE=True): each program owns
  BLOCK_N output features of one row of x and walks K a block of packed words at a
  time; every word is loaded once, split into its 32 / BITS integers in registers
  and multiplied by the matching x elements.  Per word the scale and bias are
  applied once, not per element:
      sum_e (s q_e + b) x_e = s * sum_e q_e x_e + b * sum_e x_e.
  Rows of x are a grid axis (program_id(1)), so a few rows read the weight a few
  times (from cache after the first).
* `quantized_matvec_runs` (decode, TRANSPOSE=True): one output per program, written
  along K so the compiler lays it out in runs: x read as 16-byte vectors, each packed
  word, scale and bias once per run (passes/vectorize_rows.py, `runs_constant`).  The
  faster GEMV on the H200 (29.6 us against 49-59 for `quantized_matvec` at 1x4096x11008
  int4); `quantized_matvec_rows`, its several-outputs-a-program form, took 28.6 us
  against its 32.0 in one run, and level with it (25.8 / 25.7) once both had their shifts
  folded.
* `quantized_matvec_n` (decode, TRANSPOSE=False): the same with the quantized axis
  along the outputs; neighbouring lanes take neighbouring outputs, so the lanes of
  one packed word load the same address.
* `quantized_matmul` (prefill, any rows): the tiled GEMM whose right operand tile is
  dequantized while it is staged (`dequantized`), so the compiler's GEMM lowering
  (passes/gemm.py) multiplies it on matrix units (simdgroup_matrix on Metal,
  mma.sync on CUDA, warpgroup MMA on sm_90 for 64-deep K tiles: the threads write the
  dequantized tile into the stage) in the operand dtype with float32 accumulation.
  On the H200 the warpgroup form took 487 us at 512x4096x11008 int4, dequantize then
  the dense GEMM 122 (quantized_ops.WGMMA_GEMM says why).
* `dequantize` writes the float matrix row by row in runs (16-byte stores), for the
  dequantize-then-GEMM path a caller may measure against the fused one (on the H200 the
  faster prefill path: 67 us of dequantize, then ops' GEMM).

(quantized_pairs.py holds the GEMV in packed 16-bit pair arithmetic, the decode default on
CUDA where its unpacking is exact.)

Accumulation is float32; outputs are converted once, at the store.  K (TRANSPOSE)
or N (not TRANSPOSE) must be a multiple of GROUP, as mx.quantize requires; the
other extent may be anything (masked).
"""

import metile

BITS_SUPPORTED = (4, 8)
GROUPS_SUPPORTED = (32, 64, 128)


def matvec_grid(rows: int, columns: int, BLOCK_N: int) -> tuple[int, int]:
    return (metile.cdiv(columns, BLOCK_N), rows)


def matmul_grid(rows: int, columns: int, BLOCK_M: int, BLOCK_N: int) -> tuple[int, int]:
    return (metile.cdiv(rows, BLOCK_M), metile.cdiv(columns, BLOCK_N))


@metile.inline
def dequantized(w, scales, biases, k, n, K, N, BITS, GROUP, TRANSPOSE):
    """The (len(k), len(n)) float32 tile W[k, n] of the dequantized (K, N) operand at
    index tiles `k` and `n` (zero outside the matrix): W is stored transposed,
    quantized along K, when TRANSPOSE, else as (K, N) quantized along N."""
    PER = 32 // BITS
    inside = (k[:, None] < K) & (n[None, :] < N)
    if TRANSPOSE:
        word = n[None, :] * (K // PER) + (k // PER)[:, None]
        shift = ((k & (PER - 1)) * BITS)[:, None]     # k >= 0: its low bits (weights_in_runs)
        group = n[None, :] * (K // GROUP) + (k // GROUP)[:, None]
    else:
        word = k[:, None] * (N // PER) + (n // PER)[None, :]
        shift = ((n & (PER - 1)) * BITS)[None, :]
        group = k[:, None] * (N // GROUP) + (n // GROUP)[None, :]
    packed = metile.load(w + word, mask=inside, other=0)
    # q as a float without an integer conversion (a quarter-rate instruction on NVIDIA
    # GPUs, once per weight element of every staged tile): the bits of 2^23 + q, less 2^23
    q = ((packed >> shift) & ((1 << BITS) - 1) | 0x4B000000).to(metile.float32,
                                                                bitcast=True) - 8388608.0
    s = metile.load(scales + group, mask=inside, other=0.0).to(metile.float32)
    b = metile.load(biases + group, mask=inside, other=0.0).to(metile.float32)
    return s * q + b


@metile.inline
def dequantized_pairs(w, scales, biases, k, n, K, GROUP_SHIFT, DTYPE, MAGIC, ONE, UNMAGIC):
    """`dequantized`'s (len(k), len(n)) tile, 4-bit weights stored transposed, in DTYPE
    (float16 or bfloat16), for index tiles inside the matrix (no masks), computed in packed
    16-bit pair arithmetic: a word's nibbles i and i + 4 ORed into the mantissas of a pair
    of MAGICs are the pair (M + q_i, M + q_{i+4}); one pair_fma takes M off (exactly), one
    more makes s q + b with one rounding (as float32 arithmetic rounded to DTYPE gives it).
    Every element of a staged group of 8 along K evaluates its word's four pairs alike, so
    the CUDA compiler keeps each pair once: ~3 instructions a weight instead of ~20 for the
    float32 form with its per-element masks (SASS of the 512x4096x11008 warpgroup loop)."""
    # (k >= 0: shifts, not the signed division's rounding fix-ups: 394 -> 382 SASS
    # instructions a K step of the 256x128 tile; GROUP_SHIFT = log2(GROUP))
    word = n[None, :] * (K // 8) + (k >> 3)[:, None]
    e = (k & 7)[:, None]
    group = n[None, :] * (K >> GROUP_SHIFT) + (k >> GROUP_SHIFT)[:, None]
    packed = metile.load(w + word)
    s = metile.load(scales + group).to(metile.uint16, bitcast=True).to(metile.uint32)
    b = metile.load(biases + group).to(metile.uint16, bitcast=True).to(metile.uint32)
    pair = ((packed >> ((e & 3) * 4)) & 0x000F000F) | MAGIC
    q = metile.pair_fma(pair, ONE, UNMAGIC, dtype=DTYPE)
    v = metile.pair_fma(q, s | (s << 16), b | (b << 16), dtype=DTYPE)
    return ((v >> ((e >> 2) * 16)) & 0xFFFF).to(metile.uint16).to(DTYPE, bitcast=True)


@metile.inline
def row_sums(acc, ROWS, COLUMNS):
    """acc.sum(axis=1) of a (ROWS, COLUMNS) tile as ROWS whole-tile reductions: those
    combine lanes with SIMD shuffles, and the tile stays in registers, where an axis
    reduction of rows wider than a SIMD-group's lanes (quantized_matvec's 128 words a
    row, one a lane) copies the tile to threadgroup memory and sums each row on one
    thread (lower_reductions.rows_reduce combines a row on lanes only up to 32 of them)."""
    row_of = metile.arange(0, ROWS)[:, None] + metile.zeros((ROWS, COLUMNS), dtype=metile.int32)
    out = metile.zeros((ROWS,), dtype=metile.float32)
    for i in metile.static_range(ROWS):
        total = metile.sum(metile.where(row_of == i, acc, 0.0))
        out = metile.where(metile.arange(0, ROWS) == i, total, out)
    return out


@metile.inline
def weights_in_runs(w, scales, biases, row, start, k, columns, live, BITS, GROUP, EVEN=False):
    """The float32 weights `scale * q + bias` at columns `start + k` of `row` of a matrix
    packed along its rows (`columns` elements a row): `row` a scalar or a (ROWS, 1) tile,
    `live` (of the same form) whether it is a row of the matrix; True where the grid gives
    every program a row (a mask term of its own costs instructions in the loop); `EVEN`:
    every block whole and every row live, so no load is masked (`live` is not read).  `start`
    is a multiple of the block and `k` its arange, so the word index `start // PER + k //
    PER` and the group index keep their value along a run and the compiler reads each
    word, scale and bias once per run (passes/vectorize_rows.py, `runs_constant`)."""
    PER = 32 // BITS
    words = columns // PER
    groups = columns // GROUP
    word_at = start // PER + k // PER
    group_at = start // GROUP + k // GROUP
    if EVEN:
        # every block is whole and every row live (the caller's EVEN_K): no mask, so no
        # predicate a load, and the loads of a block issue back to back
        packed = metile.load(w + row * words + word_at)
        s = metile.load(scales + row * groups + group_at).to(metile.float32)
        b = metile.load(biases + row * groups + group_at).to(metile.float32)
        q = ((packed >> ((k & (PER - 1)) * BITS)) & ((1 << BITS) - 1)).to(metile.float32)
        return s * q + b
    in_words = live & (word_at < words)
    in_groups = live & (group_at < groups)
    packed = metile.load(w + row * words + word_at, mask=in_words, other=0)
    # k's low bits, not k % PER: equal for k >= 0, and a run's k is a multiple of PER
    # plus a constant, so the GPU compiler folds each element's shift to that constant
    # (C's signed remainder it cannot fold: it computed the shift per element).  (q
    # placed as the top mantissa bits of 1.0 instead of converted was tried for the GEMV:
    # the scale and bias terms it needs, each element unpacking its run's packed pair,
    # cost more than the conversion saved - 669 SASS instructions against 653)
    # (q as the bits of 2^23 + q less 2^23, as dequantized() does, was timed on the H200:
    # the GEMVs' kernel time went 22.5 -> 23.3 us and 46.6 -> 49.9 - I2FP is not their
    # bound; nor was the per-word factored form, x converted once for several rows and the
    # scale and bias applied once a word - 32.9-52.7 us, its row sums leaving the lanes
    # through threadgroup memory: s30, benchmarks/results/ncu/h200-ncu-gemv-s30-*.csv)
    q = ((packed >> ((k & (PER - 1)) * BITS)) & ((1 << BITS) - 1)).to(metile.float32)
    s = metile.load(scales + row * groups + group_at, mask=in_groups,
                    other=0.0).to(metile.float32)
    b = metile.load(biases + row * groups + group_at, mask=in_groups,
                    other=0.0).to(metile.float32)
    return s * q + b


@metile.kernel
def quantized_matvec(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                     GROUP: metile.constexpr = 64, BLOCK_N: metile.constexpr = 4,
                     BLOCK_W: metile.constexpr = 128):
    """out[r, n] = sum_k x[r, k] * W[n, k], W (N, K) packed along K (TRANSPOSE=True).
    Program (i, r) computes outputs [i * BLOCK_N, (i + 1) * BLOCK_N) of row r.
    Every tile has the (BLOCK_N, BLOCK_W) shape of the packed words it reads (x, the
    scales and the biases are loaded through pointers broadcast to it), so each
    lane keeps its words, x values and partial sums in registers; the lanes meet
    once, in the final sum over the words."""
    PER = 32 // BITS
    MASK = (1 << BITS) - 1
    WORDS_PER_GROUP = GROUP // PER
    words = K // PER
    groups = K // GROUP
    row = metile.program_id(1)
    n = metile.program_id(0) * BLOCK_N + metile.arange(0, BLOCK_N)
    lane_words = metile.arange(0, BLOCK_W)
    zero_n = n * 0
    x_row = x + row * K
    acc = metile.zeros((BLOCK_N, BLOCK_W), dtype=metile.float32)
    for start in range(0, words, BLOCK_W):
        word = start + lane_words
        inside = (n[:, None] < N) & (word[None, :] < words)
        packed = metile.load(w + n[:, None] * words + word[None, :], mask=inside, other=0)
        group = n[:, None] * groups + (word // WORDS_PER_GROUP)[None, :]
        s = metile.load(scales + group, mask=inside, other=0.0).to(metile.float32)
        b = metile.load(biases + group, mask=inside, other=0.0).to(metile.float32)
        # x at each lane's own coordinates (a broadcast pointer, not a broadcast tile):
        # its element is shared by BLOCK_N lanes and read from cache after the first.
        x_at = x_row + zero_n[:, None] + (word * PER)[None, :]
        # each weight dequantized (s q + b) before its product, as MLX's op computes: the
        # factored s sum(q x) + b sum(x) turned an inf in x into NaN in every output (inf
        # times a zero q, inf - inf) and overflowed float32 for |x| near 1e37, at the
        # same instruction count (two FMAs an element)
        for e in metile.static_range(PER):
            xe = metile.load(x_at + e, mask=inside, other=0.0).to(metile.float32)
            q = ((packed >> (e * BITS)) & MASK).to(metile.float32)
            acc += (s * q + b) * xe
    y = row_sums(acc, BLOCK_N, BLOCK_W)
    # the 2-D store form (rows x columns) lets the launch skip preserving `out`
    r = row + metile.arange(0, 1)
    metile.store(out + r[:, None] * N + n[None, :], y[None, :].to(out.dtype),
                 mask=(r[:, None] < rows) & (n[None, :] < N))


@metile.kernel
def quantized_matvec_runs(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                          GROUP: metile.constexpr = 64, BLOCK_K: metile.constexpr = 2048,
                          EVEN_K: metile.constexpr = False):
    """out[r, n] = sum_k x[r, k] * W[n, k], W (N, K) packed along K (TRANSPOSE=True), one
    output per program (n, r), K in blocks of BLOCK_K (a multiple of GROUP).
    Written along K so the compiler lays a block out in runs (passes/vectorize_rows.py):
    a thread's run of 8 (4 for 8-bit weights) consecutive k reads x as one 16-byte vector,
    and the packed word, scale and bias at `k // PER` and `k // GROUP` - one value along
    the run - once per run.  Indices use the block's own `k` (a multiple of the run at
    every run start) plus the block offset divided out, so the compiler can prove that.
    EVEN_K: K is a multiple of BLOCK_K (the caller checks), so no load needs a mask."""
    n = metile.program_id(0)
    r = metile.program_id(1)
    k = metile.arange(0, BLOCK_K)
    acc = metile.zeros((BLOCK_K,), dtype=metile.float32)
    for start in range(0, K, BLOCK_K):
        weights = weights_in_runs(w, scales, biases, n, start, k, K, True, BITS, GROUP, EVEN_K)
        if EVEN_K:
            xk = metile.load(x + r * K + start + k)
        else:
            xk = metile.load(x + r * K + start + k, mask=start + k < K, other=0.0)
        acc += weights * xk.to(metile.float32)
    one = metile.arange(0, 1)
    total = metile.sum(acc) + metile.zeros((1,), dtype=metile.float32)
    metile.store(out + (r + one)[:, None] * N + (n + one)[None, :], total[:, None].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & ((n + one)[None, :] < N))


@metile.kernel
def quantized_matvec_rows(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                          GROUP: metile.constexpr = 64, BLOCK_K: metile.constexpr = 512,
                          ROWS: metile.constexpr = 8, EVEN_K: metile.constexpr = False):
    """quantized_matvec_runs with ROWS outputs a program: each K block reads x once and
    the ROWS rows' words, scales and biases together (ROWS times the loads in flight of
    one output a program, whose K loop waited on DRAM once a block), each row's products
    summed across the program's lanes by shuffles (on one warp: no barrier).  On the H200
    (int4 group 64, 1x4096x11008 float16) 8 rows of 512 on one warp took 28.6 us against
    32.0 for quantized_matvec_runs and 35.2 for MLX in one run, 25.8 against 25.7 (MLX
    38.1) in the next, with both kernels' shifts folded; ROWS rows on ROWS warps as one
    2-D tile (x read per row, row sums through threadgroup memory) took 39-43; the same
    tile with every read one K block ahead (held in registers across the block, the
    products summed once after the loop) 37-52 in s18 and 31.2 kernel time (ncu) against
    28.7 for 4 rows here and 23.0 for quantized_matvec_runs: removed.  Those timings
    predate the clamped row below: with a mask term per row the generated code branched on
    each row's liveness, so a row's loads waited for the previous row's sum.  Clamped
    (s30, ncu kernel time, weights from DRAM): 4x512 24.0 us (28.4-28.7 before), 8x512
    46.6, 16x256 58.8, quantized_matvec_runs 22.5, MLX 30.0; compiled calls in the decode
    benchmark 4x512 29.6 us, 16x256 29.6, quantized_matvec_runs 33.6, MLX 34.2."""
    n0 = metile.program_id(0) * ROWS
    r = metile.program_id(1)
    k = metile.arange(0, BLOCK_K)
    lanes = metile.arange(0, ROWS)
    totals = metile.zeros((ROWS,), dtype=metile.float32)
    for start in range(0, K, BLOCK_K):
        if EVEN_K:   # K a multiple of BLOCK_K, as in quantized_matvec_runs
            xk = metile.load(x + r * K + start + k)
        else:
            xk = metile.load(x + r * K + start + k, mask=start + k < K, other=0.0)
        for i in metile.static_range(ROWS):
            # a row past N reads row N - 1 (its sum is not stored): no mask term that
            # differs between rows, so the compiler keeps the rows' loads in one block
            weights = weights_in_runs(w, scales, biases, metile.minimum(n0 + i, N - 1), start,
                                      k, K, True, BITS, GROUP, EVEN_K)
            part = metile.sum(weights * xk.to(metile.float32))
            totals = metile.where(lanes == i, totals + part, totals)
    one = metile.arange(0, 1)
    n = n0 + lanes
    metile.store(out + (r + one)[:, None] * N + n[None, :], totals[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (n[None, :] < N))


@metile.kernel
def quantized_matvec_warps(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                           GROUP: metile.constexpr = 64, BLOCK_K: metile.constexpr = 256,
                           ROWS: metile.constexpr = 4):
    """quantized_matvec_runs with ROWS outputs a program, one a warp (num_warps=ROWS and
    BLOCK_K = 8 per lane x 32 lanes, so the (ROWS, BLOCK_K) tile lays a row on each warp
    and its sum is the warp's shuffles).  A one-warp program is limited to 32 resident
    programs an SM on the H200, so at most 32 warps keep loads in flight there; ROWS warps
    a program lift that.  x is read through a pointer broadcast along the rows (each warp
    its own 16-byte runs, from cache after the first), not a (BLOCK_K,) tile broadcast,
    which would be exchanged through threadgroup memory.  On the H200 (int4 group 64,
    1x4096x11008 float16, ncu) 29.1-33.5 us against 22.5 for quantized_matvec_runs,
    whose profile says why the occupancy was not its limit: SM throughput 65%, DRAM 24%."""
    n = metile.program_id(0) * ROWS + metile.arange(0, ROWS)
    r = metile.program_id(1)
    k = metile.arange(0, BLOCK_K)
    live = n[:, None] < N
    acc = metile.zeros((ROWS, BLOCK_K), dtype=metile.float32)
    for start in range(0, K, BLOCK_K):
        weights = weights_in_runs(w, scales, biases, n[:, None], start, k[None, :], K, live,
                                  BITS, GROUP)
        at = start + k[None, :] + 0 * n[:, None]
        xk = metile.load(x + r * K + at, mask=at < K, other=0.0)
        acc += weights * xk.to(metile.float32)
    total = metile.sum(acc, axis=1)
    one = metile.arange(0, 1)
    metile.store(out + (r + one)[:, None] * N + n[None, :], total[None, :].to(out.dtype),
                 mask=((r + one)[:, None] < rows) & (n[None, :] < N))


@metile.kernel
def quantized_matvec_n(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                       GROUP: metile.constexpr = 64, BLOCK_N: metile.constexpr = 256,
                       BLOCK_K: metile.constexpr = 8):
    """out[r, n] = sum_k x[r, k] * W[k, n], W (K, N) packed along N (TRANSPOSE=False).
    Program (i, r) computes outputs [i * BLOCK_N, (i + 1) * BLOCK_N) of row r, one per
    lane, so no lanes combine: each K step unrolls BLOCK_K rows of W, 32 / BITS
    neighbouring lanes loading the same packed word."""
    row = metile.program_id(1)
    n = metile.program_id(0) * BLOCK_N + metile.arange(0, BLOCK_N)
    one = metile.arange(0, 1)
    zero_n = n * 0
    acc = metile.zeros((1, BLOCK_N), dtype=metile.float32)
    for start in range(0, K, BLOCK_K):
        for j in metile.static_range(BLOCK_K):
            k = start + j + one
            weight = dequantized(w, scales, biases, k, n, K, N, BITS, GROUP, False)
            xk = metile.load(x + row * K + k[:, None] + zero_n[None, :],
                             mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)
            acc += xk.to(metile.float32) * weight
    r = row + one
    metile.store(out + r[:, None] * N + n[None, :], acc.to(out.dtype),
                 mask=(r[:, None] < rows) & (n[None, :] < N))


@metile.kernel
def quantized_matmul(x, w, scales, biases, out, M, N, K, magic=0, BITS: metile.constexpr = 4,
                     GROUP: metile.constexpr = 64, TRANSPOSE: metile.constexpr = True,
                     BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
                     BLOCK_K: metile.constexpr = 32,
                     RELAXED_PRECISION: metile.constexpr = False, PAIRS: metile.constexpr = False,
                     ONE: metile.constexpr = 0,
                     UNMAGIC: metile.constexpr = 0, GROUP_SHIFT: metile.constexpr = 0):
    """out = x @ W (x (M, K) row-major) with W dequantized while its K tile is staged:
    the `dot` recurrence below is lowered to matrix fragments with the operand tile
    computed per element from the packed words, scales and biases.  The operands meet
    in x's dtype (the dequantized tile is rounded to it, as MLX's kernels do).  With PAIRS,
    `magic` is unpack_constants' MAGIC, passed at launch: a register the K loop keeps, where
    as a constant ptxas rematerialized the pair mask (a MOV) before each OR with it (SASS of
    the 256x128 tile: 409 -> 402 instructions a K step, 329 -> 313 with x by bulk copies)."""
    rm = metile.program_id(0) * BLOCK_M + metile.arange(0, BLOCK_M)
    rn = metile.program_id(1) * BLOCK_N + metile.arange(0, BLOCK_N)
    rk = metile.arange(0, BLOCK_K)
    acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        a = metile.load(x + rm[:, None] * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                        other=0.0)
        if PAIRS:
            b = dequantized_pairs(w, scales, biases, k, rn, K, GROUP_SHIFT, x.dtype,
                                  magic.to(metile.uint32), ONE, UNMAGIC)
        else:
            b = dequantized(w, scales, biases, k, rn, K, N, BITS, GROUP, TRANSPOSE)
        acc = metile.dot(a, b.to(x.dtype), acc)
    metile.store(out + rm[:, None] * N + rn[None, :], acc.to(out.dtype),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


@metile.kernel
def dequantize(w, scales, biases, out, rows, columns, BITS: metile.constexpr = 4,
               GROUP: metile.constexpr = 64, BLOCK: metile.constexpr = 1024,
               ROWS: metile.constexpr = 1):
    """out (rows, columns) = the float matrix `mx.dequantize` gives, row-major.
    Program (i, j) writes columns [i * BLOCK, (i + 1) * BLOCK) of rows [j * ROWS,
    (j + 1) * ROWS) (BLOCK a multiple of GROUP): runs of consecutive columns are stored
    as vectors, their packed word, scale and bias read once per run (as in
    quantized_matvec_runs).  ROWS > 1 gives each thread ROWS times the runs, their loads
    issued together.  On the H200 (4096x11008 int4 -> float16, ncu kernel time with caches
    flushed, s35): one row, 4096 columns on 8 warps 29.4 us (~3.9 TB/s of HBM; mx.dequantize
    85.3); the same written as a (ROWS, BLOCK) tile without masks (ROWS 1, 2 and 4) took
    310-319 us: the one-row form with a scalar row is the one to use."""
    start = metile.program_id(0) * BLOCK
    c = metile.arange(0, BLOCK)
    if ROWS == 1:
        r = metile.program_id(1)
        weights = weights_in_runs(w, scales, biases, r, start, c, columns, True, BITS, GROUP)
        one = metile.arange(0, 1)
        metile.store(out + (r + one)[:, None] * columns + (start + c)[None, :],
                     weights[None, :].to(out.dtype),
                     mask=((r + one)[:, None] < rows) & ((start + c)[None, :] < columns))
    else:
        r = metile.program_id(1) * ROWS + metile.arange(0, ROWS)
        live = r[:, None] < rows
        weights = weights_in_runs(w, scales, biases, r[:, None], start, c[None, :], columns,
                                  live, BITS, GROUP)
        metile.store(out + r[:, None] * columns + (start + c)[None, :], weights.to(out.dtype),
                     mask=live & ((start + c)[None, :] < columns))
