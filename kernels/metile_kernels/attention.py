"""Attention kernels written in metile's tile form (Triton-style pointers and masks).

    out[b, h, i] = softmax_j(scale q[b, h, i] . k[b, h // G, j] + mask[b, h, i, j]) v[b, h // G]

with q (B, Hq, Lq, D) and k, v (B, Hkv, Lk, D), all row-major, G = Hq / Hkv
query heads per key/value head (grouped-query attention; G = 1 is multi-head).

Three kernels and two ways to combine split keys:

* `attention_forward` (prefill): one program per (query block, query head, batch),
  a loop over key/value blocks with two `dot`s (Q·Kᵀ, then P·V, float32
  accumulation) and the online softmax (running row maximum and sum; the
  accumulator is rescaled when the maximum grows).  Causal programs stop at the
  last key block their queries can see.
* `attention_split` (decode: one or a few queries over a long cache): the keys
  are cut into `splits` chunks over grid axis 0; each program handles every query
  of every query head that shares one key/value head (G x Lq rows), so each key
  and value byte is read once per chunk, not once per query head.  It writes its
  chunk's running maximum, sum and unnormalised output in float32.
* `attention_decode` (one or a few queries): the split kernel's work per query head
  and query without matrix products - scores summed along each key's row by the lanes
  holding it, values accumulated in a block summed once (its docstring says why).
* `attention_combine_splits` (up to 64 splits, all read at once) or
  `attention_combine` (a loop over them) merges the chunks:
  out = Σ_s acc_s 2^(m_s - M) / Σ_s l_s 2^(m_s - M).

Scores are kept in base 2 (scale and additive mask are multiplied by log2 e) so
the softmax uses exp2.  Masking follows MLX's `mx.fast.scaled_dot_product_attention`:

* MASK="causal": query i sees key j when j <= i + (Lk - Lq) (the last query is
  aligned with the last key);
* MASK="bool": a False entry removes the key; MASK="additive": the entry is added
  to the scaled score.  The mask buffer is read through four element strides
  (batch, head, query, key), 0 along an axis the mask broadcasts over.

MLX replaces a removed (causal or boolean) score by the dtype's lowest finite
value, not -inf: a row whose every key is removed averages all values.  The
kernels do the same with REMOVED (finite); keys past Lk (the ragged last block)
are -inf and never count.  A row whose scores are all -inf (an additive mask of
-inf everywhere) is 0/0 = NaN, as in MLX.

Which lowering these get (see passes/gemm.py): the fast GEMM lowering (staged
fragments, tensor cores on CUDA, simdgroup_matrix on Metal) takes one `dot`
recurrence per kernel.  These kernels have two products per loop iteration and
loop-carried row statistics, so both dots take the general tile lowering: the
operands are staged in threadgroup memory and, where the backend allows it
(passes/lower_dot_fragments.py: Metal always, CUDA under METILE_DOT_FRAGMENTS=1 until
it has run on a GPU), the program's SIMD-groups share the product's matrix-unit
fragments; otherwise each thread runs a scalar float32 multiply-add loop over K for
its output elements.  The row maximum and sum are per-row reductions.  The P·V
product is written `acc * alpha + dot(p, v)`, not
`dot(p, v, acc)`: the latter is a dot recurrence next to a second dot, which
passes/gemm.py refuses ("a second matrix product") instead of lowering generally.
Either way the scores and probabilities go through threadgroup memory between the
products; keeping them in accumulator registers (row reductions across a fragment's
lanes) is what would make it competitive with a fused flash-attention kernel.
Tile sizes: metile.attention_ops.tiles.
"""

import metile

LOG2E = 1.4426950408889634
# MLX's removed-score value is float32's lowest finite number; any value far below
# every real score gives the same weights (exactly 0 next to a real score, equal
# weights in a row with none).
REMOVED = -3.0e38
MASKS = ("none", "causal", "bool", "additive")


@metile.inline
def add_mask(s, entry):
    """s + entry in base 2.  A finite entry whose base-2 value passes float32's range
    (mlx.nn's additive masks use float32's lowest value, 2^128 * 1.44 overflows) is
    clamped to REMOVED instead of becoming an infinity: MLX adds it in the natural base,
    where it stays finite, so a row masked that way everywhere averages its values
    instead of being 0/0."""
    e = entry.to(metile.float32)
    b = e * LOG2E
    b = metile.where((b == -float("inf")) & (e > -float("inf")), REMOVED, b)
    b = metile.where((b == float("inf")) & (e < float("inf")), -REMOVED, b)
    return s + b


def forward_grid(q_len: int, q_heads: int, batch: int, BLOCK_M: int) -> tuple[int, int, int]:
    return (metile.cdiv(q_len, BLOCK_M), q_heads, batch)


@metile.inline
def scores_block(q, k_ptrs, key, row_in, rows_head, rows_query, mask_base, kv_len,
                 causal_shift, scale_log2, mask_stride_h, mask_stride_q, mask_stride_k, d,
                 HEAD_DIM, MASK):
    """(rows, BLOCK_N) base-2 scores of the rows against keys `key`, masked: -inf past
    kv_len, REMOVED where a causal or boolean mask removes the key.  `k_ptrs` address
    the (BLOCK_N, BLOCK_D) key block as stored (a key's features contiguous, so a
    warp's loads are coalesced; the product takes its transpose)."""
    key_in = key < kv_len
    k = metile.load(k_ptrs, mask=key_in[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    s = metile.dot(q, metile.trans(k)) * scale_log2
    if MASK == "causal":
        s = metile.where(key[None, :] <= rows_query[:, None] + causal_shift, s, REMOVED)
    elif MASK == "bool" or MASK == "additive":
        m_ptrs = (mask_base + rows_head[:, None] * mask_stride_h
                  + rows_query[:, None] * mask_stride_q + key[None, :] * mask_stride_k)
        entry = metile.load(m_ptrs, mask=row_in[:, None] & key_in[None, :], other=0)
        if MASK == "bool":
            s = metile.where(entry != 0, s, REMOVED)
        else:
            s = add_mask(s, entry)
    return metile.where(key_in[None, :], s, -float("inf"))


@metile.inline
def softmax_step(s, m_i, l_i, acc, v, scale_log2, RAW):
    """One online-softmax step: the new running maximum, sum and rescaled accumulator.
    A row whose maximum is still -inf (every score so far -inf) adds nothing: it subtracts
    0 instead, so its exponentials are exp2(-inf) = 0 and its rescale exp2(-inf) = 0 of a
    sum and accumulator that are 0 - one test a row, none an element.  RAW: `s` is not
    scaled yet (scale_log2 > 0 promised): the row maximum is scaled once a row and each
    exponential's argument is one fused multiply-add (s * scale - m); otherwise `s` is
    the base-2 scores and scale_log2 is not read."""
    m_blk = metile.max(s, axis=1)
    if RAW:
        m_blk = m_blk * scale_log2
    m_new = metile.maximum(m_i, m_blk)
    m_use = metile.where(m_new > -float("inf"), m_new, 0.0)
    alpha = metile.exp2(m_i - m_use)
    if RAW:
        p = metile.exp2(s * scale_log2 - m_use[:, None])
    else:
        p = metile.exp2(s - m_use[:, None])
    l_new = l_i * alpha + metile.sum(p, axis=1)
    acc_new = acc * alpha[:, None] + metile.dot(p.to(v.dtype), v)
    return m_new, l_new, acc_new


@metile.inline
def whole_block(q, k_ptrs, v_ptrs, d_in, scale_log2, m_i, l_i, acc, POSITIVE_SCALE):
    """softmax_step over a key block every row of the query block sees whole: no score
    masks, no key past kv_len.  POSITIVE_SCALE (scale_log2 > 0 promised): the scores go
    to softmax_step unscaled (its RAW form)."""
    k = metile.load(k_ptrs, mask=d_in[None, :], other=0.0)
    v = metile.load(v_ptrs, mask=d_in[None, :], other=0.0)
    s = metile.dot(q, metile.trans(k))
    if not POSITIVE_SCALE:
        s = s * scale_log2
    return softmax_step(s, m_i, l_i, acc, v, scale_log2, POSITIVE_SCALE)


@metile.kernel
def attention_forward(Q, K, V, Mask, Out, q_len, kv_len, group, scale_log2,
                      mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_k, kv_pad, kv_start,
                      HEAD_DIM: metile.constexpr, BLOCK_D: metile.constexpr,
                      BLOCK_M: metile.constexpr = 32, BLOCK_N: metile.constexpr = 32,
                      MASK: metile.constexpr = "none",
                      POSITIVE_SCALE: metile.constexpr = False,
                      HEAD_GROUP: metile.constexpr = 0):
    """Out = softmax(scale Q Kᵀ + mask) V for one block of BLOCK_M queries of one query
    head (program_id(1)) of one batch entry (program_id(2)).  BLOCK_D: HEAD_DIM rounded
    up to a power of two (the columns past HEAD_DIM are masked).  scale_log2 = scale *
    log2(e); POSITIVE_SCALE=True promises scale_log2 > 0 (whole key blocks then take row
    maxima before scaling: a negative scale would pick the minima).  Grid:
    forward_grid(q_len, q_heads, batch, BLOCK_M).

    HEAD_GROUP (causal only; 0 keeps the grid's own order): programs are handed out in
    runs of HEAD_GROUP heads, and within a run the query blocks with the most keys come
    first - the GPU starts programs roughly in launch order, so the longest ones no longer
    start last and leave SMs idle at the end, while the heads running at once still share
    their keys and values in L2 (the group's size is the caller's L2 budget).

    K and V may be a cache's buffer with the keys at kv_start .. kv_start + kv_len of
    kv_len + kv_pad a head (attention_decode's form)."""
    head = metile.program_id(1)
    batch = metile.program_id(2)
    q_heads = metile.num_programs(1)
    block_m = metile.program_id(0)
    if MASK == "causal" and HEAD_GROUP > 0:
        # the launch order within a batch entry (head * blocks + block) in runs of
        # HEAD_GROUP heads (Triton's swizzle2d; the last run may be short), each run's
        # blocks last to first - a permutation of the grid, so the output store is still
        # proven to cover the output (passes/buffer_usage.py)
        blocks = metile.num_programs(0)
        head, slot = metile.swizzle2d(head, block_m, q_heads, blocks, HEAD_GROUP)
        block_m = blocks - 1 - slot
    kv_head = batch * (q_heads // group) + head // group
    start_m = block_m * BLOCK_M
    rows = start_m + metile.arange(0, BLOCK_M)
    d = metile.arange(0, BLOCK_D)
    row_in = rows < q_len
    d_in = d < HEAD_DIM
    q_base = Q + (batch * q_heads + head) * q_len * HEAD_DIM
    q = metile.load(q_base + rows[:, None] * HEAD_DIM + d[None, :],
                    mask=row_in[:, None] & d_in[None, :], other=0.0)
    k_base = K + (kv_head * (kv_len + kv_pad) + kv_start) * HEAD_DIM
    v_base = V + (kv_head * (kv_len + kv_pad) + kv_start) * HEAD_DIM
    mask_base = Mask + batch * mask_stride_b
    heads = metile.zeros((BLOCK_M,), dtype=metile.int32) + head
    causal_shift = kv_len - q_len
    hi = kv_len
    if MASK == "causal":
        # Keys past the block's last query are removed for every row; a block holding a
        # row that sees no key (q_len > kv_len) visits them all, as MLX averages them.
        if start_m + causal_shift >= 0:
            hi = metile.minimum(kv_len, start_m + BLOCK_M + causal_shift)
    m_i = metile.full((BLOCK_M,), -float("inf"), dtype=metile.float32)
    l_i = metile.zeros((BLOCK_M,), dtype=metile.float32)
    acc = metile.zeros((BLOCK_M, BLOCK_D), dtype=metile.float32)
    # Key blocks [0, whole) every row sees whole (the block's first row sees the fewest
    # causal keys) run without masks; the rest - the diagonal, the ragged end, every block
    # of a bool or additive mask - with them.
    whole = 0
    if MASK == "none":
        whole = kv_len // BLOCK_N * BLOCK_N
    elif MASK == "causal":
        whole = metile.maximum(metile.minimum(start_m + causal_shift + 1, kv_len), 0) \
            // BLOCK_N * BLOCK_N
    for start_n in metile.tile_range(0, whole, BLOCK_N):
        key = start_n + metile.arange(0, BLOCK_N)
        m_i, l_i, acc = whole_block(q, k_base + key[:, None] * HEAD_DIM + d[None, :],
                                    v_base + key[:, None] * HEAD_DIM + d[None, :], d_in,
                                    scale_log2, m_i, l_i, acc, POSITIVE_SCALE)
    for start_n in metile.tile_range(whole, hi, BLOCK_N):
        key = start_n + metile.arange(0, BLOCK_N)
        s = scores_block(q, k_base + key[:, None] * HEAD_DIM + d[None, :], key, row_in, heads,
                         rows, mask_base, kv_len, causal_shift, scale_log2, mask_stride_h,
                         mask_stride_q, mask_stride_k, d, HEAD_DIM, MASK)
        v = metile.load(v_base + key[:, None] * HEAD_DIM + d[None, :],
                        mask=(key[:, None] < kv_len) & d_in[None, :], other=0.0)
        m_i, l_i, acc = softmax_step(s, m_i, l_i, acc, v, scale_log2, False)
    out = acc / l_i[:, None]
    metile.store(Out + (batch * q_heads + head) * q_len * HEAD_DIM + rows[:, None] * HEAD_DIM
                 + d[None, :], out.to(Out.dtype), mask=row_in[:, None] & d_in[None, :])


def split_grid(splits: int, kv_heads: int, batch: int) -> tuple[int, int, int]:
    return (splits, kv_heads, batch)


def split_chunk(kv_len: int, splits: int, BLOCK_N: int) -> int:
    """Keys per split: whole key blocks, so no block straddles two splits."""
    return metile.cdiv(metile.cdiv(kv_len, splits), BLOCK_N) * BLOCK_N


@metile.kernel
def attention_split(Q, K, V, Mask, Partial, Stats, q_len, kv_len, group, chunk, scale_log2,
                    mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_k, kv_pad, kv_start,
                    HEAD_DIM: metile.constexpr, BLOCK_D: metile.constexpr,
                    BLOCK_M: metile.constexpr = 16, BLOCK_N: metile.constexpr = 64,
                    MASK: metile.constexpr = "none"):
    """One split of the keys (program_id(0): keys [s * chunk, (s + 1) * chunk)) for the
    group x q_len rows (query head, query) that share key/value head program_id(1) of
    batch entry program_id(2); rows <= BLOCK_M.  Writes Partial[s, b, h, i, :] (the
    unnormalised float32 output) and Stats[s, b, h, i, 0:2] (running maximum, sum).
    Grid: split_grid(splits, kv_heads, batch).  K and V as attention_forward takes them."""
    split = metile.program_id(0)
    kv_head = metile.program_id(1)
    batch = metile.program_id(2)
    kv_heads = metile.num_programs(1)
    q_heads = kv_heads * group
    r = metile.arange(0, BLOCK_M)
    row_in = r < group * q_len
    heads = kv_head * group + r // q_len
    queries = r % q_len
    d = metile.arange(0, BLOCK_D)
    d_in = d < HEAD_DIM
    # row r of this program is query `queries[r]` of query head `heads[r]`
    row_offset = ((batch * q_heads + heads) * q_len + queries) * HEAD_DIM
    q = metile.load(Q + row_offset[:, None] + d[None, :], mask=row_in[:, None] & d_in[None, :],
                    other=0.0)
    kv_offset = ((batch * kv_heads + kv_head) * (kv_len + kv_pad) + kv_start) * HEAD_DIM
    mask_base = Mask + batch * mask_stride_b
    lo = split * chunk
    hi = metile.minimum(lo + chunk, kv_len)
    m_i = metile.full((BLOCK_M,), -float("inf"), dtype=metile.float32)
    l_i = metile.zeros((BLOCK_M,), dtype=metile.float32)
    acc = metile.zeros((BLOCK_M, BLOCK_D), dtype=metile.float32)
    for start_n in metile.tile_range(lo, hi, BLOCK_N):
        key = start_n + metile.arange(0, BLOCK_N)
        s = scores_block(q, K + kv_offset + key[:, None] * HEAD_DIM + d[None, :], key, row_in,
                         heads, queries, mask_base, hi, kv_len - q_len, scale_log2, mask_stride_h,
                         mask_stride_q, mask_stride_k, d, HEAD_DIM, MASK)
        v = metile.load(V + kv_offset + key[:, None] * HEAD_DIM + d[None, :],
                        mask=(key[:, None] < hi) & d_in[None, :], other=0.0)
        m_i, l_i, acc = softmax_step(s, m_i, l_i, acc, v, scale_log2, False)
    rows_total = metile.num_programs(2) * q_heads * q_len
    out_row = (batch * q_heads + heads) * q_len + queries
    metile.store(Partial + (split * rows_total + out_row)[:, None] * HEAD_DIM + d[None, :], acc,
                 mask=row_in[:, None] & d_in[None, :])
    stats = Stats + (split * rows_total + out_row) * 2
    metile.store(stats, m_i, mask=row_in)
    metile.store(stats + 1, l_i, mask=row_in)


def decode_grid(splits: int, rows_total: int) -> tuple[int, int]:
    return (splits * rows_total, 1)


@metile.kernel
def attention_decode(Q, K, V, Mask, Partial, Stats, kv_len, q_len, q_heads, group, chunk,
                     scale_log2, rows_total, programs, mask_stride_b, mask_stride_h,
                     mask_stride_q, mask_stride_k, kv_pad, kv_start,
                     HEAD_DIM: metile.constexpr, BLOCK_D: metile.constexpr,
                     BLOCK_N: metile.constexpr = 64, MASK: metile.constexpr = "none",
                     AHEAD: metile.constexpr = 1):
    """attention_split for one query (of a few: q_len, each its own row) of one query
    head, without matrix products: a (BLOCK_N, BLOCK_D) block of keys times the query
    (held as a block of equal rows) summed along each key's row gives the scores - the
    lanes holding a row combine it by shuffles and keep it (lower_reductions._rows_held:
    the scores are only read broadcast back over the block) - and the values, weighted by
    their probabilities, accumulate in a (BLOCK_N, BLOCK_D) block.  Each row of the block
    is a slot of its own online softmax (keys slot, slot + BLOCK_N, ...: its running
    maximum and sum held as (BLOCK_N, BLOCK_D) tiles equal along the row), so no value
    crosses rows inside the loop: no barrier there (with one maximum and sum for the
    block, two block reductions a key block put eight barriers into each iteration of 8
    keys on the H200, s39).  The slots merge once after the loop.  Each key and value is
    read as 16-byte runs, once per query.  (The split kernel's general products keep every
    operand in threadgroup memory and fold each output on one thread: 159 us against
    MLX's 37 for 32 heads of 4096 keys on the H200.)  A causal query stops at its last
    visible key (the split holding none leaves an empty chunk: m = -inf, l = 0); a query
    that sees no key at all (q_len > kv_len) is not this kernel's (MLX averages every value
    there).  Program p (grid decode_grid: one axis, so the stores below are the one-row
    form the launch proves covers its outputs, with no written-mask outputs and merge)
    takes split p // rows_total of row p % rows_total = (batch * q_heads + head) * q_len +
    query (programs: the grid's size), and writes Partial[p] and Stats[p] as
    attention_split writes its rows.  AHEAD (1 or 2): how many key blocks are loaded ahead
    of the one being reduced (2: twice the bytes in flight, 16 more registers a thread at
    8 keys on 2 warps).  K and V may be a cache's buffer with the keys at kv_start ..
    kv_start + kv_len of kv_len + kv_pad a head (a KV cache allocated ahead, read in place
    of a copy of its prefix)."""
    metile.static_assert(AHEAD == 1 or AHEAD == 2, "AHEAD must be 1 or 2")
    program = metile.program_id(0)
    split = program // rows_total
    row = program % rows_total
    query = row % q_len
    head = (row // q_len) % q_heads
    batch = row // (q_len * q_heads)
    kv_heads = q_heads // group
    kv_head = head // group
    keys = metile.arange(0, BLOCK_N)[:, None]
    d = metile.arange(0, BLOCK_D)[None, :]
    d_in = d < HEAD_DIM
    # the query at every key's row (a broadcast pointer): read once, held as the block
    q = metile.load(Q + row * HEAD_DIM + d + keys * 0, mask=d_in & (keys >= 0), other=0.0)
    kv_offset = ((batch * kv_heads + kv_head) * (kv_len + kv_pad) + kv_start) * HEAD_DIM
    lo = split * chunk
    hi = metile.minimum(lo + chunk, kv_len)
    if MASK == "causal":
        hi = metile.minimum(hi, query + kv_len - q_len + 1)
    m_i = metile.full((BLOCK_N, BLOCK_D), -float("inf"), dtype=metile.float32)
    l_i = metile.zeros((BLOCK_N, BLOCK_D), dtype=metile.float32)
    acc = metile.zeros((BLOCK_N, BLOCK_D), dtype=metile.float32)
    # each block's keys and values are loaded one iteration ahead (held in registers
    # across it), so their reads are in flight while the block before is reduced
    inside = (lo + keys < hi) & d_in
    k = metile.load(K + kv_offset + (lo + keys) * HEAD_DIM + d, mask=inside, other=0.0)
    v = metile.load(V + kv_offset + (lo + keys) * HEAD_DIM + d, mask=inside, other=0.0)
    if AHEAD == 2:
        second = (lo + BLOCK_N + keys < hi) & d_in
        k_second = metile.load(K + kv_offset + (lo + BLOCK_N + keys) * HEAD_DIM + d,
                               mask=second, other=0.0)
        v_second = metile.load(V + kv_offset + (lo + BLOCK_N + keys) * HEAD_DIM + d,
                               mask=second, other=0.0)
    for start in range(lo, hi, BLOCK_N):
        ahead = (start + AHEAD * BLOCK_N + keys < hi) & d_in
        k_next = metile.load(K + kv_offset + (start + AHEAD * BLOCK_N + keys) * HEAD_DIM + d,
                             mask=ahead, other=0.0)
        v_next = metile.load(V + kv_offset + (start + AHEAD * BLOCK_N + keys) * HEAD_DIM + d,
                             mask=ahead, other=0.0)
        key = start + keys
        key_in = (key < hi) & (d >= 0)
        # each key's score at every element of its row
        s = metile.where(key_in, metile.sum(q.to(metile.float32) * k.to(metile.float32),
                                            axis=1)[:, None] * scale_log2, -float("inf"))
        if MASK == "bool" or MASK == "additive":
            entry = metile.load(Mask + batch * mask_stride_b + head * mask_stride_h
                                + query * mask_stride_q + key * mask_stride_k,
                                mask=key < hi, other=0)
            if MASK == "bool":
                s = metile.where(entry != 0, s, REMOVED)
            else:
                s = add_mask(s, entry)
            s = metile.where(key_in, s, -float("inf"))
        # one exponential a slot and key: of the new key against the slot's maximum, or of
        # the old maximum against the new key where the key raises it (the other factor
        # is 1); a key that is -inf adds nothing, also to a slot that has seen none (whose
        # difference is NaN), and a NaN score stays NaN
        up = s > m_i
        t = metile.exp2(-metile.abs(s - m_i))
        p = metile.where(up, 1.0, metile.where(s == -float("inf"), 0.0, t))
        alpha = metile.where(up, t, 1.0)
        l_i = l_i * alpha + p
        acc = acc * alpha + p * v.to(metile.float32)
        m_i = metile.where(up, s, m_i)
        if AHEAD == 2:
            k = k_second
            v = v_second
            k_second = k_next
            v_second = v_next
        else:
            k = k_next
            v = v_next
    # the slots merged: their maximum, each slot's sum and values scaled to it (the sums
    # read in one column: a slot's is equal along its row; whole-block reductions, where
    # an axis reduction would copy the block to threadgroup memory)
    m_out = metile.max(m_i)
    weight = metile.where(m_out > -float("inf"), metile.exp2(m_i - m_out), 0.0)
    out = metile.sum(acc * weight, axis=0)
    l_out = metile.sum(metile.where(d == 0, l_i * weight, 0.0))
    at = program + metile.arange(0, 1)
    cols = metile.program_id(1) * BLOCK_D + metile.arange(0, BLOCK_D)
    metile.store(Partial + at[:, None] * HEAD_DIM + cols[None, :], out[None, :],
                 mask=(at[:, None] < programs) & (cols[None, :] < HEAD_DIM))
    pair = metile.program_id(1) * 2 + metile.arange(0, 2)
    stats = metile.where(pair == 0, m_out, l_out)
    metile.store(Stats + at[:, None] * 2 + pair[None, :], stats[None, :],
                 mask=(at[:, None] < programs) & (pair[None, :] < 2))


@metile.kernel
def attention_combine(Partial, Stats, Out, rows_total, splits,
                      HEAD_DIM: metile.constexpr, BLOCK_D: metile.constexpr,
                      BLOCK_R: metile.constexpr = 8):
    """Out[row] = Σ_s Partial[s, row] 2^(m_s - M) / Σ_s l_s 2^(m_s - M), M = max_s m_s,
    for BLOCK_R rows per program.  Grid: (cdiv(rows_total, BLOCK_R),)."""
    rows = metile.program_id(0) * BLOCK_R + metile.arange(0, BLOCK_R)
    d = metile.arange(0, BLOCK_D)
    row_in = rows < rows_total
    inside = row_in[:, None] & (d[None, :] < HEAD_DIM)
    m = metile.full((BLOCK_R,), -float("inf"), dtype=metile.float32)
    for s in range(0, splits):
        m = metile.maximum(m, metile.load(Stats + (s * rows_total + rows) * 2, mask=row_in,
                                          other=-float("inf")))
    finite = m > -float("inf")
    total = metile.zeros((BLOCK_R,), dtype=metile.float32)
    acc = metile.zeros((BLOCK_R, BLOCK_D), dtype=metile.float32)
    for s in range(0, splits):
        stats = Stats + (s * rows_total + rows) * 2
        weight = metile.where(finite, metile.exp2(metile.load(stats, mask=row_in, other=0.0) - m),
                              0.0)
        total = total + weight * metile.load(stats + 1, mask=row_in, other=0.0)
        part = metile.load(Partial + (s * rows_total + rows)[:, None] * HEAD_DIM + d[None, :],
                           mask=inside, other=0.0)
        acc = acc + part * weight[:, None]
    out = acc / total[:, None]
    metile.store(Out + rows[:, None] * HEAD_DIM + d[None, :], out.to(Out.dtype), mask=inside)


def combine_grid(rows_total: int, head_dim: int, BLOCK_D: int) -> tuple[int, int]:
    return (rows_total, metile.cdiv(head_dim, BLOCK_D))


@metile.kernel
def attention_combine_splits(Partial, Stats, Out, rows_total, splits,
                             HEAD_DIM: metile.constexpr, BLOCK_D: metile.constexpr,
                             BLOCK_S: metile.constexpr = 32):
    """attention_combine for one row and BLOCK_D of its columns a program, every split
    (splits <= BLOCK_S) read at once: the statistics as a (BLOCK_S,) block, the partial
    outputs as a (BLOCK_S, BLOCK_D) block summed over the splits.  attention_combine's
    loop over the splits puts one dependent read in each of its `splits` iterations on
    a handful of programs; here every read of a row is in flight together.
    Grid: combine_grid (rows_total, cdiv(HEAD_DIM, BLOCK_D))."""
    row = metile.program_id(0)
    s = metile.arange(0, BLOCK_S)
    s_in = s < splits
    stats = Stats + (s * rows_total + row) * 2
    m_s = metile.load(stats, mask=s_in, other=-float("inf"))
    l_s = metile.load(stats + 1, mask=s_in, other=0.0)
    m = metile.max(m_s)
    weight = metile.where(m > -float("inf"), metile.exp2(m_s - m), 0.0)
    weight = metile.where(s_in, weight, 0.0)
    total = metile.sum(weight * l_s)
    d = metile.program_id(1) * BLOCK_D + metile.arange(0, BLOCK_D)
    d_in = d < HEAD_DIM
    part = metile.load(Partial + (s * rows_total + row)[:, None] * HEAD_DIM + d[None, :],
                       mask=s_in[:, None] & d_in[None, :], other=0.0)
    out = metile.sum(part * weight[:, None], axis=0) / total
    # the (row, columns) store in the 2-D form the launch proves covers Out: no
    # written-mask output, no merge with the array passed for Out
    at = row + metile.arange(0, 1)
    metile.store(Out + at[:, None] * HEAD_DIM + d[None, :], out[None, :].to(Out.dtype),
                 mask=(at[:, None] < rows_total) & (d[None, :] < HEAD_DIM))
