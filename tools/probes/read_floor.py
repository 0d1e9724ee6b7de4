"""How fast the bytes of issue 17's two decode targets can be read at all, against the time
each target asks for (MLX's time over the target ratio).

int4 decode (1x4096x11008, group 64) reads 25.4 MB of packed words, scales and biases a
product; decode attention (1x32x1x4096x128 float16) reads 67 MB of k and v an attention.  A
kernel cannot be faster than reading its bytes once, so where the fastest read of them -
in the same chained form the benchmarks time - takes longer than the target's time, the
target is out of reach on that card, whatever the kernel computes.

Two sides, each its own process (as hbm_ceiling.py):

    python3 tools/probes/read_floor.py mlx   [out.json]  # MLX's op, metile's op, mx.sum of
                                                          # the same bytes: 8 a compiled call
    python3 tools/probes/read_floor.py torch [out.json]  # a Triton streaming read (its best
                                                          # block, steps and warps) and
                                                          # torch.sum, 8 a CUDA graph
    python3 tools/probes/read_floor.py --check            # CPU: the MLX side's sides agree

Every buffer of a chain is its own (4 weights cycled for int4: 101 MB; 8 caches for
attention: 536 MB; both past the H100's and H200's 50 MB L2), 20 chains a synchronisation,
median of alternating rounds, us a product / attention by the wall clock (the torch side
also by CUDA events: graph replays have no host gaps, so its floor is if anything low).
"""
import json
import math
import os
import sys

sys.path[:0] = ["tools/probes", "."]

CHAIN = 8
N, K, GROUP = 11008, 4096, 64
HEADS, KEYS, D = 32, 4096, 128
# bytes a product / attention: words + float16 scales and biases; k and v
INT4_BYTES = N * K // 2 + 2 * (N * (K // GROUP) * 2)
ATTN_BYTES = 2 * HEADS * KEYS * D * 2
TARGETS = {"int4_decode": 2.5, "decode_attention": 1.4}
ROUNDS = int(os.environ.get("ROUNDS", "7"))
CALLS = int(os.environ.get("CALLS", "20"))


def mlx_side(small: bool = False) -> dict:
    import mlx.core as mx
    import numpy as np

    import metile
    from probe_report import chained_us, check_close

    n, k, keys = (256, 512, 256) if small else (N, K, KEYS)
    heads = 4 if small else HEADS
    count = 2 if small else 4

    ws = []
    for i in range(count):
        w = (mx.random.normal((n, k), key=mx.random.key(i)) / math.sqrt(k)).astype(mx.float16)
        ws.append(mx.quantize(w, group_size=GROUP, bits=4))
    x = mx.random.normal((1, k), key=mx.random.key(99)).astype(mx.float16)
    caches = [(mx.random.normal((1, heads, keys, D), key=mx.random.key(200 + i)).astype(
                   mx.float16),
               mx.random.normal((1, heads, keys, D), key=mx.random.key(300 + i)).astype(
                   mx.float16)) for i in range(CHAIN)]
    q = mx.random.normal((1, heads, 1, D), key=mx.random.key(98)).astype(mx.float16)
    mx.eval(ws, x, caches, q)
    scale = 1 / math.sqrt(D)

    int4_sides = {
        "mlx": lambda w: mx.quantized_matmul(x, *w, transpose=True, group_size=GROUP, bits=4),
        # backend="metile": auto is MLX's op until a tuning run measures the kernels (s154
        # timed auto, so its "metile" column was MLX's op)
        "metile": lambda w: metile.ops.quantized_matmul(x, *w, transpose=True,
                                                        group_size=GROUP, bits=4,
                                                        backend="metile"),
        # every byte the product reads, summed by MLX's reduction
        # (as float32: uint32 + float16 is float16 in MLX)
        "mlx_sum": lambda w: sum(mx.sum(a, axis=-1).astype(mx.float32) for a in w),
        # one launch reading next to nothing: what a product in the chain costs beyond its
        # kernel's own time
        "mlx_tiny": lambda w: mx.sum(w[1][:1], axis=-1),
    }
    attn_sides = {
        "mlx": lambda c: mx.fast.scaled_dot_product_attention(q, *c, scale=scale),
        "metile": lambda c: metile.ops.scaled_dot_product_attention(q, *c, scale=scale,
                                                                     backend="metile"),
        "mlx_sum": lambda c: mx.sum(c[0], axis=(2, 3)) + mx.sum(c[1], axis=(2, 3)),
        "mlx_tiny": lambda c: mx.sum(c[0][:, :1, :1], axis=-1),
    }
    int4_args = [a for i in range(CHAIN) for a in ws[i % count]]
    attn_args = [a for c in caches for a in c]

    want = np.array(int4_sides["mlx"](ws[0]), np.float32)
    check_close(int4_sides["metile"](ws[0]), want, "int4 metile")
    check_close(attn_sides["metile"](caches[0]), attn_sides["mlx"](caches[0]),
                "attention metile")
    if small:
        # mx.sum's reads are the bytes the product reads: its value against NumPy's
        got = np.array(int4_sides["mlx_sum"](ws[0]), np.float64)
        words = np.array(ws[0][0]).astype(np.uint64).sum(axis=-1) % 2**32   # uint32 wraps
        ref = words + sum(np.array(a, np.float64).sum(axis=-1) for a in ws[0][1:])
        assert np.allclose(got, ref, rtol=1e-3), "mlx_sum"
        print("check: int4 and attention sides agree with MLX; mlx_sum with NumPy")
        return {}

    cases = {}
    for case, sides, args, per, moved in (("int4_decode", int4_sides, int4_args, 3, INT4_BYTES),
                                          ("decode_attention", attn_sides, attn_args, 2,
                                           ATTN_BYTES)):
        us = chained_us({name: (lambda *a, op=op: op(a)) for name, op in sides.items()},
                        [tuple(args[per * i:per * i + per]) for i in range(CHAIN)], ROUNDS,
                        CALLS)
        cases[case] = {"us": us, "bytes": moved,
                       "tb_per_s": {s: round(moved / (t * 1e-6) / 1e12, 3) for s, t in us.items()},
                       "mlx_over_metile": round(us["mlx"] / us["metile"], 3),
                       "target_ratio": TARGETS[case],
                       "target_us": round(us["mlx"] / TARGETS[case], 2)}
        print(case, json.dumps(cases[case]), flush=True)
    return {"side": "mlx", "mlx_version": mx.__version__, "cases": cases}


def torch_side() -> dict:
    import torch
    import triton
    import triton.language as tl

    from probe_report import cuda_graph_us

    @triton.jit
    def read_words(src, out, total, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        # STEPS blocks of BLOCK consecutive int32 words from pid * STEPS * BLOCK, XORed
        # (no load dead), one int32 a program written
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in tl.static_range(STEPS):
            offs = (pid * STEPS + i) * BLOCK + tl.arange(0, BLOCK)
            acc = acc ^ tl.load(src + offs, mask=offs < total, other=0)
        tl.store(out + pid, tl.sum(acc, axis=0))

    def read(buf, out, block, steps, warps):
        grid = (triton.cdiv(buf.numel(), block * steps),)
        read_words[grid](buf, out, buf.numel(), BLOCK=block, STEPS=steps, num_warps=warps)

    def timed(fns) -> tuple:
        """us a read by the wall clock and by CUDA events: CHAIN reads a graph, CALLS graph
        replays a synchronisation."""
        return cuda_graph_us(fns, ROUNDS, CALLS)

    cases = {}
    configs = [(b, s, w) for b in (1024, 2048, 4096) for s in (1, 4, 8) for w in (4, 8)]
    for case, moved, count in (("int4_decode", INT4_BYTES, 4), ("decode_attention", ATTN_BYTES,
                                                                 CHAIN)):
        bufs = [torch.randint(-2**31, 2**31 - 1, (moved // 4,), dtype=torch.int32,
                              device="cuda") for _ in range(count)]
        # one int32 a program: at most a program a 1024 words
        outs = [torch.empty(moved // 4 // 1024 + 1, dtype=torch.int32, device="cuda")
                for _ in range(CHAIN)]
        chain = [bufs[i % count] for i in range(CHAIN)]
        triton_us = {}
        for block, steps, warps in configs:
            fns = [lambda b=b, o=o: read(b, o, block, steps, warps)
                   for b, o in zip(chain, outs)]
            triton_us[f"{block}x{steps}/{warps}w"] = timed(fns)
        halves = [b.view(torch.float16) for b in chain]
        sums = [lambda h=h: torch.sum(h, dtype=torch.float32) for h in halves]
        torch_sum = timed(sums)
        best = min(triton_us, key=lambda c: triton_us[c][0])
        cases[case] = {"bytes": moved, "triton_read_us": triton_us, "triton_best": best,
                       "triton_best_us": triton_us[best], "torch_sum_us": torch_sum,
                       "floor_us": min(triton_us[best][0], torch_sum[0]),
                       "floor_tb_per_s": round(moved / (min(triton_us[best][0],
                                                            torch_sum[0]) * 1e-6) / 1e12, 3)}
        print(case, json.dumps({k: v for k, v in cases[case].items()
                                if k != "triton_read_us"}), flush=True)
        del bufs, outs, chain, halves
        torch.cuda.empty_cache()
    return {"side": "torch", "torch_version": torch.__version__,
            "triton_version": triton.__version__, "cases": cases}


def main():
    if "--check" in sys.argv:
        mlx_side(small=True)
        return
    side = sys.argv[1]
    from probe_report import machine_info
    report = {"machine": machine_info(), "chain": CHAIN, "calls_a_sync": CALLS, "rounds": ROUNDS,
              "metric": "us a product / attention, median of alternating rounds",
              **(mlx_side() if side == "mlx" else torch_side())}
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
