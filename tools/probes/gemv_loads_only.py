"""What the int4 pair GEMV's reads cost without its arithmetic (issue 17's decode target).

Every form of quantized_matvec_pairs lands at 12.8-16.9 us on the H200 with DRAM 31-41%
busy, whatever its warp count, instruction count or row order (benchmarks/results/README.md,
s93-s102): "not identified further".  This probe removes the arithmetic and keeps the
reads: `matvec_loads` is the library kernel's grid, loop and `pair_fetch` (the same loads,
the same addresses) with the products replaced by an XOR of every word read (so no load is
dead), and `stream_read` reads the packed weight as one flat array, a program 16 KB in
4 KB steps as the GEMV's programs do, on 1 or 4 warps.  If the loads alone take the
GEMV's time, its reads (grid, pattern) bound it; if they take the HBM's time, its
arithmetic's latency does.

Beside them the pair GEMV with its K steps unrolled (quantized_ops.MATVEC_PAIRS_UNROLLED: a
later step's loads among an earlier step's arithmetic) at 8 rows / 4 words, 4 / 4 and 4 / 2.

Sides, each CHAIN calls a compiled call over 4 weights cycled (100 MB, twice the H100's L2),
20 calls a sync, median of alternating rounds; every GEMV side checked against MLX first:

    CHAIN=8 python3 tools/probes/gemv_loads_only.py [out.json]
    python3 tools/probes/gemv_loads_only.py --check      # CPU: the kernels run, GEMVs right
"""
import math
import os
import sys

sys.path[:0] = ["tools/probes", ".", "kernels"]
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import metile  # noqa: E402
from metile import quantized_ops  # noqa: E402
from metile_kernels.quantized_pairs import pair_fetch  # noqa: E402
from probe_report import add_case, chained_us, check_close, machine_info, save  # noqa: E402


@metile.kernel
def matvec_loads(x, w, scales, biases, out, rows, N, K, BITS: metile.constexpr = 4,
                 GROUP: metile.constexpr = 64, ROWS: metile.constexpr = 8,
                 LANES: metile.constexpr = 32, SPAN: metile.constexpr = 4,
                 WEIGHTS_ONLY: metile.constexpr = False):
    """quantized_matvec_pairs' grid, loop and reads (EVEN shapes), every word XORed instead of
    multiplied; WEIGHTS_ONLY reads the packed words alone (no x, scales or biases)."""
    r = metile.program_id(1)
    n = metile.program_id(0) * ROWS + metile.arange(0, ROWS)
    nn = metile.minimum(n, N - 1)
    lane = metile.arange(0, LANES)
    words, groups = K // (32 // BITS), K // GROUP     # (as the library kernel's)
    x_row = x + r * (K // 4) + (nn * 0)[:, None]
    acc = metile.zeros((ROWS, LANES), dtype=metile.uint32)
    facc = metile.zeros((ROWS, LANES), dtype=metile.float32)
    for w0 in range(0, words, LANES * SPAN):
        if WEIGHTS_ONLY:
            at = w + nn[:, None] * words + (w0 + lane * SPAN)[None, :]
            for i in metile.static_range(SPAN):
                acc = acc ^ metile.load(at + i)
        else:
            s, b, packed, xs = pair_fetch(w, x_row, scales, biases, nn, w0 + lane * SPAN, words,
                                          groups, GROUP // (32 // BITS), BITS, SPAN, True,
                                          False)
            for i in metile.static_range(SPAN):
                xa = xs[2 * i] ^ xs[2 * i + 1]
                acc = acc ^ packed[i] ^ ((xa ^ (xa >> 32)) & 0xFFFFFFFF).to(metile.uint32)
            facc += s + b
    total = metile.sum(acc.to(metile.float32) + facc, axis=1)
    metile.store(out + r * N + n, total.to(out.dtype), mask=n < N)


@metile.kernel
def matvec_loads_vec(wf, out, rows, N, K, ROWS: metile.constexpr = 8,
                     LANES: metile.constexpr = 32, SPAN: metile.constexpr = 4):
    """matvec_loads' grid and weight words (WEIGHTS_ONLY) through a float32 view as one
    (ROWS, LANES * SPAN) tile a step: vectorize_rows gives each lane a run of SPAN words, one
    16-byte load a row (the plain form's words are 4-byte loads: runs are for float data)."""
    words = K // 8
    STEP = LANES * SPAN
    n = metile.program_id(0) * ROWS + metile.arange(0, ROWS)
    nn = metile.minimum(n, N - 1)
    r = metile.program_id(1)
    cols = metile.arange(0, STEP)
    acc = metile.zeros((ROWS, STEP), dtype=metile.uint32)
    for w0 in range(0, words, STEP):
        v = metile.load(wf + nn[:, None] * words + (w0 + cols)[None, :])
        acc = acc ^ v.to(metile.uint32, bitcast=True)
    total = metile.sum(acc.to(metile.float32), axis=1)
    metile.store(out + r * N + n, total, mask=n < N)


@metile.kernel
def stream_read(src, out, total, STEPS: metile.constexpr = 4, BLOCK: metile.constexpr = 1024):
    """XOR of the words program p reads: STEPS blocks of BLOCK consecutive words from
    p * STEPS * BLOCK (one load tile a step, as a GEMV program's step)."""
    p = metile.program_id(0)
    acc = metile.zeros((BLOCK,), dtype=metile.uint32)
    for i in range(0, STEPS):
        offs = (p * STEPS + i) * BLOCK + metile.arange(0, BLOCK)
        acc = acc ^ metile.load(src + offs, mask=offs < total, other=0)
    metile.store(out + p, metile.sum(acc, axis=0))


def loads(x, wq, s, b, n, k, rows=8, span=4, weights_only=False):
    return matvec_loads[(math.ceil(n / rows), x.shape[0])](
        x.view(mx.uint64), wq, s, b, mx.zeros((x.shape[0], n), mx.float32), x.shape[0], n, k,
        BITS=4, GROUP=64, ROWS=rows, SPAN=span, WEIGHTS_ONLY=weights_only, num_warps=1)


def loads_vec(wq, n, k, rows=8):
    return matvec_loads_vec[(math.ceil(n / rows), 1)](
        wq.view(mx.float32), mx.zeros((1, n), mx.float32), 1, n, k, ROWS=rows, num_warps=1)


def flat(wq, warps):
    words = wq.size
    per = 4 * 1024
    programs = math.ceil(words / per)
    return stream_read[(programs,)](wq.reshape(-1), mx.zeros((programs,), mx.uint32), words,
                                    STEPS=4, BLOCK=1024, num_warps=warps)


def operands(rows, n, k, count, seed=0):
    out = []
    for i in range(count):
        w = (mx.random.normal((n, k), key=mx.random.key(seed + i)) / math.sqrt(k)).astype(
            mx.float16)
        out.append(mx.quantize(w, group_size=64, bits=4))
    x = mx.random.normal((rows, k), key=mx.random.key(seed + 99)).astype(mx.float16)
    mx.eval(x, out)
    return x, out


def sides(n, k):
    pairs = quantized_ops.MATVEC_PAIRS[0]
    return {
        "pairs": lambda x, q: quantized_ops._metile(x, *q, n, k, True, 64, 4, pairs),
        "pairs_halves": lambda x, q: quantized_ops._metile(
            x, *q, n, k, True, 64, 4, quantized_ops.MATVEC_PAIRS_HALVES),
        "pairs_unrolled": lambda x, q: quantized_ops._metile(
            x, *q, n, k, True, 64, 4, quantized_ops.MATVEC_PAIRS_UNROLLED),
        "pairs_unrolled_4_4": lambda x, q: quantized_ops._metile(
            x, *q, n, k, True, 64, 4, {**pairs, "ROWS": 4, "UNROLL": True}),
        "pairs_unrolled_4_2": lambda x, q: quantized_ops._metile(
            x, *q, n, k, True, 64, 4, {**quantized_ops.MATVEC_PAIRS[1], "UNROLL": True}),
        "loads": lambda x, q: loads(x, *q, n, k),
        "loads_4_2": lambda x, q: loads(x, *q, n, k, rows=4, span=2),
        "loads_weights": lambda x, q: loads(x, *q, n, k, weights_only=True),
        "loads_weights_vec": lambda x, q: loads_vec(q[0], n, k),
        "flat_1warp": lambda x, q: flat(q[0], 1),
        "flat_4warps": lambda x, q: flat(q[0], 4),
        "mlx_sum": lambda x, q: mx.sum(q[0], axis=-1),
        "mlx": lambda x, q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4),
    }


def check():
    n, k = 200, 1024
    x, qs = operands(1, n, k, 1)
    q = qs[0]
    want = np.array(mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4),
                    np.float32)
    for name, fn in sides(n, k).items():
        got = fn(x, q)
        mx.eval(got)
        if name.startswith("pairs"):
            err = np.abs(np.array(got, np.float32) - want).max() / np.abs(want).max()
            print(name, f"{err:.2e}", "WRONG" if err > 1e-2 else "ok")
        else:
            print(name, "ran", got.shape)
    # the flat reader against NumPy: each lane's XOR over the steps, summed over lanes
    words = np.array(q[0]).reshape(-1)
    for warps in (1, 4):
        got = np.array(flat(q[0], warps))
        padded = np.zeros(len(got) * 4096, np.uint32)
        padded[:words.size] = words
        want = np.bitwise_xor.reduce(padded.reshape(len(got), 4, 1024), axis=1).sum(
            axis=1, dtype=np.uint32)
        print("flat", warps, "ok" if np.array_equal(got, want) else "WRONG")


def main():
    if "--check" in sys.argv:
        check()
        return
    chain = int(os.environ.get("CHAIN", "8"))
    rounds = int(os.environ.get("ROUNDS", "7"))
    n, k = 11008, 4096
    x, qs = operands(1, n, k, 4)
    want = mx.quantized_matmul(x, *qs[0], transpose=True, group_size=64, bits=4)
    for name, op in sides(n, k).items():
        if name.startswith("pairs"):
            check_close(op(x, qs[0]), want, name)
    # each product its own arguments (weights cycled among them): a product repeated on the
    # same traced arrays is one node to mx.compile (metile's launches compare equal), which
    # timed half the metile products in s152
    us = chained_us({name: (lambda x, *q, op=op: op(x, q)) for name, op in sides(n, k).items()},
                    [(x, *qs[i % 4]) for i in range(chain)], rounds)
    weight_bytes = qs[0][0].nbytes
    all_bytes = weight_bytes + qs[0][1].nbytes + qs[0][2].nbytes
    report = {"machine": machine_info(device=str(mx.default_device())),
              "metric": f"us a call, {chain} a compiled call over 4 int4 weights cycled "
                        f"(1x{k}x{n}, group 64, float16), 20 calls a sync, median of {rounds} "
                        "alternating rounds",
              "cases": []}
    add_case(report, {"n": n, "k": k, "us": us,
                      "mlx_over": {s: round(us["mlx"] / t, 3) for s, t in us.items()},
                      "tb_per_s_all_bytes": {s: round(all_bytes / (t * 1e-6) / 1e12, 3)
                                             for s, t in us.items()},
                      "weight_bytes": weight_bytes, "all_bytes": all_bytes})
    save(report)


if __name__ == "__main__":
    main()
