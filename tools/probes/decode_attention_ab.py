"""Decode attention A/B in one run: attention_decode as it was before s40 (one online
softmax for the key block: two block reductions an iteration, eight barriers) against the
current one (a softmax per key slot, no barrier in the loop), and MLX's op - one query of 32
heads over 4096 and 16384 keys, float16, head dim 128, the default 8-key block.  Compiled
calls (100 a sync, alternating, median of rounds), then each kernel once more for ncu.

    python3 tools/probes/decode_attention_ab.py
    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/decode_attention_ab.py --once
"""

import argparse
import json
import sys
import types

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")
sys.path.insert(0, "tools/probes")
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

import metile           # noqa: E402

from decode_attention import alternating            # noqa: E402 (this folder)
from decode_attention_ncu import operands            # noqa: E402
from metile import attention_ops                     # noqa: E402
from metile_kernels import attention as current      # noqa: E402
from metile_kernels.attention import LOG2E, REMOVED  # noqa: E402,F401


# (kv_pad and kv_start are taken and not read: the op's launch passes them since s35, and
# this probe's k and v are whole arrays, both 0)
@metile.kernel
def attention_decode_before_s40(Q, K, V, Mask, Partial, Stats, kv_len, q_len, q_heads, group, chunk,
                     scale_log2, rows_total, programs, mask_stride_b, mask_stride_h,
                     mask_stride_q, mask_stride_k, kv_pad, kv_start,
                     HEAD_DIM: metile.constexpr, BLOCK_D: metile.constexpr,
                     BLOCK_N: metile.constexpr = 64, MASK: metile.constexpr = "none"):
    """attention_split for one query (of a few: q_len, each its own row) of one query
    head, without matrix products: a (BLOCK_N, BLOCK_D) block of keys times the query
    (held as a block of equal rows) summed along each key's row gives the scores - the
    lanes holding a row combine it by shuffles (lower_reductions.rows_reduce) - and the
    values, weighted by their probabilities, accumulate in a (BLOCK_N, BLOCK_D) block
    summed over the keys once, after the loop.  Each key and value is read as 16-byte
    runs, once per query.  (The split kernel's general products keep every operand in
    threadgroup memory and fold each output on one thread: 159 us against MLX's 37 for
    32 heads of 4096 keys on the H200.)  A causal query stops at its last visible key
    (the split holding none leaves an empty chunk: m = -inf, l = 0); a query that sees
    no key at all (q_len > kv_len) is not this kernel's (MLX averages every value there).
    Program p (grid decode_grid: one axis, so the stores below are the one-row form the
    launch proves covers its outputs, with no written-mask outputs and merge) takes
    split p // rows_total of row p % rows_total = (batch * q_heads + head) * q_len +
    query (programs: the grid's size), and writes Partial[p] and Stats[p] as
    attention_split writes its rows."""
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
    kv_offset = (batch * kv_heads + kv_head) * kv_len * HEAD_DIM
    lo = split * chunk
    hi = metile.minimum(lo + chunk, kv_len)
    if MASK == "causal":
        hi = metile.minimum(hi, query + kv_len - q_len + 1)
    m_i = -float("inf")
    l_i = 0.0
    acc = metile.zeros((BLOCK_N, BLOCK_D), dtype=metile.float32)
    # each block's keys and values are loaded one iteration ahead (held in registers
    # across it), so their reads are in flight while the block before is reduced: the
    # reductions' barriers would otherwise put two DRAM round trips in every iteration
    inside = (lo + keys < hi) & d_in
    k = metile.load(K + kv_offset + (lo + keys) * HEAD_DIM + d, mask=inside, other=0.0)
    v = metile.load(V + kv_offset + (lo + keys) * HEAD_DIM + d, mask=inside, other=0.0)
    for start in range(lo, hi, BLOCK_N):
        ahead = (start + BLOCK_N + keys < hi) & d_in
        k_next = metile.load(K + kv_offset + (start + BLOCK_N + keys) * HEAD_DIM + d,
                             mask=ahead, other=0.0)
        v_next = metile.load(V + kv_offset + (start + BLOCK_N + keys) * HEAD_DIM + d,
                             mask=ahead, other=0.0)
        s = metile.sum(q.to(metile.float32) * k.to(metile.float32), axis=1) * scale_log2
        key = start + metile.arange(0, BLOCK_N)
        key_in = key < hi
        if MASK == "bool" or MASK == "additive":
            entry = metile.load(Mask + batch * mask_stride_b + head * mask_stride_h
                                + query * mask_stride_q + key * mask_stride_k, mask=key_in,
                                other=0)
            if MASK == "bool":
                s = metile.where(entry != 0, s, REMOVED)
            else:
                s = s + entry.to(metile.float32) * LOG2E
        s = metile.where(key_in, s, -float("inf"))
        m_new = metile.maximum(m_i, metile.max(s))
        finite = m_new > -float("inf")
        alpha = metile.where(finite, metile.exp2(m_i - m_new), 1.0)
        p = metile.where(finite, metile.exp2(s - m_new), 0.0)
        l_i = l_i * alpha + metile.sum(p)
        acc = acc * alpha + p[:, None] * v.to(metile.float32)
        m_i = m_new
        k = k_next
        v = v_next
    out = metile.sum(acc, axis=0)
    at = program + metile.arange(0, 1)
    cols = metile.program_id(1) * BLOCK_D + metile.arange(0, BLOCK_D)
    metile.store(Partial + at[:, None] * HEAD_DIM + cols[None, :], out[None, :],
                 mask=(at[:, None] < programs) & (cols[None, :] < HEAD_DIM))
    pair = metile.program_id(1) * 2 + metile.arange(0, 2)
    stats = metile.where(pair == 0, m_i, l_i)
    metile.store(Stats + at[:, None] * 2 + pair[None, :], stats[None, :],
                 mask=(at[:, None] < programs) & (pair[None, :] < 2))



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--once", action="store_true", help="each kernel once (for ncu)")
    args = parser.parse_args()
    before = types.SimpleNamespace(**{n: getattr(current, n) for n in dir(current)
                                      if not n.startswith("__")})
    before.attention_decode = attention_decode_before_s40
    for keys in (4096, 16384):
        q, k, v = operands(keys)
        scale = 128 ** -0.5
        cfg = {"path": "decode_rows", "BLOCK_N": 8}

        def rows(kernels):
            return lambda q: attention_ops._launch_rows(kernels, q, k, (k, v, 0, 0), q, "none",
                                                        [0, 0, 0, 0],
                                                        scale * LOG2E, cfg)
        fns = {"mlx": mx.compile(lambda q: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)),
               "before s40": mx.compile(rows(before)), "now": mx.compile(rows(current))}
        want = np.array(fns["mlx"](q).astype(mx.float32))
        for name, fn in fns.items():
            err = float(np.abs(np.array(fn(q).astype(mx.float32)) - want).max())
            print(f"decode_attention_ab keys {keys} {name}: max error {err:.2e}", flush=True)
        if not args.once:
            print("decode_attention_ab", keys,
                  json.dumps(alternating(fns, q, args.rounds, 100)), flush=True)


if __name__ == "__main__":
    main()
