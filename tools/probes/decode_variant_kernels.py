"""Variants of attention_decode for tools/probes/decode_prefetch.py --replace (s39):
attention_decode_r1 keeps each key slot's running maximum and sum as (BLOCK_N, 1) tiles, where
the library kernel keeps them as (BLOCK_N, BLOCK_D) tiles equal along each row: one
exponential a key instead of one an element, at the cost of the (BLOCK_N, 1) values' trips
through threadgroup memory (the lane layout places them apart from the rows)."""
import metile
from metile_kernels.attention import REMOVED, add_mask

@metile.kernel
def attention_decode_r1(Q, K, V, Mask, Partial, Stats, kv_len, q_len, q_heads, group, chunk,
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
    m_i = metile.full((BLOCK_N, 1), -float("inf"), dtype=metile.float32)
    l_i = metile.zeros((BLOCK_N, 1), dtype=metile.float32)
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
        key_in = key < hi
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
    l_out = metile.sum(l_i * weight)
    at = program + metile.arange(0, 1)
    cols = metile.program_id(1) * BLOCK_D + metile.arange(0, BLOCK_D)
    metile.store(Partial + at[:, None] * HEAD_DIM + cols[None, :], out[None, :],
                 mask=(at[:, None] < programs) & (cols[None, :] < HEAD_DIM))
    pair = metile.program_id(1) * 2 + metile.arange(0, 2)
    stats = metile.where(pair == 0, m_out, l_out)
    metile.store(Stats + at[:, None] * 2 + pair[None, :], stats[None, :],
                 mask=(at[:, None] < programs) & (pair[None, :] < 2))


