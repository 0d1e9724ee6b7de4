"""metile.ops.scaled_dot_product_attention against mx.fast.scaled_dot_product_attention.

    python -m benchmarks.attention [--dtype float16] [--output results.json]
    python -m benchmarks.attention --quick          # tiny shapes, for the CPU runtime

Cases (B x Hq x Lq x D over B x Hkv x Lk x D): causal prefill 1x32x4096x128 (and
--prefill-lengths), decode of one query over a 4096-key cache (and --decode-lengths).
Both sides are `mx.compile`d calls of the op (backend="metile" forced, backend="mlx"
is MLX's op); each measurement chains `--launches` dependent calls (the output, which
has q's shape, is the next call's q) and synchronises once, so the ~80 us eval round
trip is amortised; `--chain N` puts N attentions in each compiled call, each over its
own k and v (a decode step's layers), so the call's host time is shared by N ops.  metile and MLX alternate, the first of each round swapping; each
number is the median over `--rounds`.  Before timing, the metile output is checked
against MLX's (the op's routing validation tolerance).  Reports microseconds per call,
TFLOP/s for prefill (4 B Hq Lq Lk D, halved for causal) and TB/s for decode (q, k, v
and the output read or written once), and the MLX/metile time ratio (> 1: metile faster).
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

import metile
from benchmarks.common import machine, write_report, positive_int, output_path
from metile import attention_ops

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def steps(scale, mask, chain=1, keys=None):
    """The two sides as compiled calls of (q, k0, v0, k1, v1, ...): `chain` attentions one
    after another, each output the next query and each over its own cache (a decode step's
    layers in one graph, so the call's host time is shared by `chain` ops).  With `keys`,
    each k and v is a cache allocated ahead and the attention reads its first `keys`
    (`buffer[..., :keys, :]`, as mlx_lm hands a cache's prefix)."""
    def chained(op):
        def step(q, *kv):
            out = q
            for i in range(chain):
                k, v = kv[2 * i], kv[2 * i + 1]
                if keys is not None:
                    k, v = k[..., :keys, :], v[..., :keys, :]
                out = op(out, k, v)
            return out
        return step

    def ours(q, k, v):
        return metile.ops.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask,
                                                       backend="metile")

    def theirs(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    return {"metile": mx.compile(chained(ours)), "mlx": mx.compile(chained(theirs))}


def seconds_per_call(step, q, kv, launches, chain=1) -> float:
    """Seconds per attention of `launches` dependent calls of `step` synchronised once."""
    mx.synchronize()
    start = time.perf_counter()
    out = q
    for _ in range(launches):
        out = step(out, *kv)
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - start) / (launches * chain)


def measure(case, dtype, launches, rounds, chain=1, pad=0) -> dict:
    b, hq, hkv, lq, lk, d, mask = (case[n] for n in ("b", "hq", "hkv", "lq", "lk", "d", "mask"))
    keys = mx.random.split(mx.random.key(0), 1 + 2 * chain)
    q = mx.random.normal((b, hq, lq, d), key=keys[0]).astype(dtype)
    kv = [mx.random.normal((b, hkv, lk + pad, d), key=keys[1 + i]).astype(dtype)
          for i in range(2 * chain)]
    k, v = kv[:2]
    mx.eval(q, *kv)
    scale = d ** -0.5
    prefix = lk if pad else None
    single = steps(scale, mask, keys=prefix)
    problem = attention_ops._validate(single["metile"](q, k, v), single["mlx"](q, k, v))
    if problem:
        raise SystemExit(f"metile's output differs from MLX's for {case}: {problem}")
    fns = steps(scale, mask, chain, prefix) if chain > 1 else single
    k, v = (k[..., :lk, :], v[..., :lk, :]) if pad else (k, v)
    config, _ = attention_ops._route(q, k, v, scale, mask, "metile")
    for fn in fns.values():                     # warm-up: compile, first launch
        seconds_per_call(fn, q, kv, 1, chain)
    times = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            times[name].append(seconds_per_call(fns[name], q, kv, launches, chain))
    us = {name: float(np.median(t)) * 1e6 for name, t in times.items()}
    result = {**case, "dtype": str(dtype).removeprefix("mlx.core."), "config": config,
              "chain": chain, "cache_pad": pad, "us_per_call": us, "mlx_over_metile": us["mlx"] / us["metile"]}
    flops = 4 * b * hq * lq * lk * d * (0.5 if mask == "causal" and lq == lk else 1.0)
    moved = (2 * b * hq * lq * d + 2 * b * hkv * lk * d) * dtype.size
    if lq > 16:
        result["tflops"] = {n: flops / (t * 1e-6) / 1e12 for n, t in us.items()}
    else:
        result["tb_per_s"] = {n: moved / (t * 1e-6) / 1e12 for n, t in us.items()}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--prefill-lengths", type=positive_int, nargs="*", default=[4096])
    parser.add_argument("--decode-lengths", type=int, nargs="*", default=[4096])
    # (20 launches a sync read decode at 4096 keys anywhere from 0.88x to 1.24x of MLX between
    # runs on the H200, s40/s42; 100 a sync, 9 rounds: 0.94x and 1.02x)
    parser.add_argument("--launches", type=positive_int, default=100)
    parser.add_argument("--rounds", type=positive_int, default=9)
    # (one op a compiled call puts its host time beside a 20-40 us decode kernel; a model's
    # step runs its layers in one graph)
    parser.add_argument("--chain", type=positive_int, default=1,
                        help="attentions a compiled call, each over its own k and v (per-op "
                             "times are the call's divided by it)")
    parser.add_argument("--cache-pad", type=int, default=0,
                        help="keys each k and v buffer holds past the attended ones: the "
                             "attention reads buffer[..., :L, :], a cache allocated ahead")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 2 launches, 2 rounds (the CPU runtime); replaces the shape, launch "
                             "and round options")
    parser.add_argument("--output", type=output_path)
    args = parser.parse_args()
    if args.cache_pad < 0:
        parser.error(f"--cache-pad must be >= 0, got {args.cache_pad}")
    if args.quick:
        args.heads, args.head_dim = 2, 32
        args.prefill_lengths, args.decode_lengths = [64], [256]
        args.launches, args.rounds = 2, 2
    hkv = args.kv_heads or args.heads
    dtype = DTYPES[args.dtype]
    cases = [dict(name="prefill_causal", b=1, hq=args.heads, hkv=hkv, lq=n, lk=n,
                  d=args.head_dim, mask="causal") for n in args.prefill_lengths]
    cases += [dict(name="decode", b=1, hq=args.heads, hkv=hkv, lq=1, lk=n, d=args.head_dim,
                   mask=None) for n in args.decode_lengths]
    results = []
    for case in cases:
        r = measure(case, dtype, args.launches, args.rounds, args.chain, args.cache_pad)
        rate = (f"{r['tflops']['metile']:.1f} vs {r['tflops']['mlx']:.1f} TFLOP/s"
                if "tflops" in r else
                f"{r['tb_per_s']['metile']:.3f} vs {r['tb_per_s']['mlx']:.3f} TB/s")
        print(f"{case['name']:15s} {case['b']}x{case['hq']}x{case['lq']}x{case['lk']}x{case['d']} "
              f"{args.dtype}: metile {r['us_per_call']['metile']:.1f} us, mlx "
              f"{r['us_per_call']['mlx']:.1f} us ({rate}), mlx/metile "
              f"{r['mlx_over_metile']:.3f}  config {r['config']}")
        results.append(r)
    write_report(args.output, {"machine": machine(), "benchmark": "attention",
                               "launches": args.launches, "rounds": args.rounds,
                               "chain": args.chain, "cache_pad": args.cache_pad,
                               "cases": results})


if __name__ == "__main__":
    main()
