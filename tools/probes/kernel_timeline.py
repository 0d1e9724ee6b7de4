"""The GPU's timeline of decode attention in a compiled call: is the time an op takes beyond
its kernels (s126: metile 8.6 us an attention at 4096 keys, MLX none; the int4 decode GEMV
17.3 us launched directly where ncu gives 13.2, s94) the GPU idling between kernels, or
kernels running longer than ncu's serialized, cold-cache durations?

The device image has no nsys; torch's profiler (Kineto, CUPTI activity records) records
every kernel the process launches, MLX's included.  For each side (metile's decode, MLX's
SDPA; int4 decode products; rms_norm 16 a call as the one-kernel op): 20 compiled calls of 8 attentions in one
graph, synchronised once, under the profiler, then from the trace the kernels' time an
op, the idle time between kernels an op (gaps), the median gap and the largest.

    python3 tools/probes/kernel_timeline.py [out.json]
"""
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, "tools/probes")
import mlx.core as mx   # noqa: E402

import metile   # noqa: E402
from decode_chain_configs import card   # noqa: E402 (this folder)
from decode_fixed_cost import decode_sides   # noqa: E402
from probe_report import save   # noqa: E402

CHAIN = 8
CALLS = 20


def kernels(trace_path):
    """(start us, duration us, name) of the trace's GPU kernels, in start order."""
    events = json.load(open(trace_path)).get("traceEvents", [])
    found = [(float(e["ts"]), float(e.get("dur", 0)), e.get("name", ""))
             for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    return sorted(found)


def summarize(found, ops):
    """Per op: the span from the first kernel's start to the last one's end, the kernels' time
    and the idle gaps; the gap sizes' median and largest; each kernel name's median time."""
    if not found:
        return {"kernels": 0}
    span = found[-1][0] + found[-1][1] - found[0][0]
    busy = sum(d for _, d, _ in found)
    gaps = sorted(max(0.0, found[i + 1][0] - (found[i][0] + found[i][1]))
                  for i in range(len(found) - 1))
    by_name = {}
    for _, d, name in found:
        by_name.setdefault(name[:70], []).append(d)
    return {"kernels": len(found), "us_span_per_op": round(span / ops, 2),
            "us_kernels_per_op": round(busy / ops, 2),
            "us_gaps_per_op": round(sum(gaps) / ops, 2),
            "gap_median_us": round(gaps[len(gaps) // 2], 2) if gaps else 0.0,
            "gap_max_us": round(gaps[-1], 2) if gaps else 0.0,
            "gaps_over_5us": sum(g > 5 for g in gaps),
            "kernel_median_us": {n: round(sorted(v)[len(v) // 2], 2)
                                 for n, v in sorted(by_name.items())}}


def profiled(fn, args, ops, torch):
    """Runs `fn` CALLS times chained under the profiler (after two unprofiled runs); the
    trace's summary and the wall time an op."""
    for _ in range(2):
        out = args[0]
        for _ in range(CALLS):
            out = fn(out, *args[1:])
        mx.eval(out)
    mx.synchronize()
    path = tempfile.mktemp(suffix=".json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        out = args[0]
        for _ in range(CALLS):
            out = fn(out, *args[1:])
        built = time.perf_counter()
        mx.eval(out)
        mx.synchronize()
        done = time.perf_counter()
    prof.export_chrome_trace(path)
    summary = summarize(kernels(path), ops * CALLS)
    summary["us_wall_per_op"] = round((done - start) * 1e6 / (ops * CALLS), 2)
    summary["us_building_per_op"] = round((built - start) * 1e6 / (ops * CALLS), 2)
    os.unlink(path)
    return summary


def main():
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "torch_version": torch.__version__, "card": card()},
              "metric": f"GPU timeline (torch profiler / CUPTI) of {CALLS} compiled calls "
                        f"synchronised once: decode attention {CHAIN} a call, rms_norm 16",
              "cases": []}
    for keys in [int(n) for n in os.environ.get("KEYS", "1024 4096").split()]:
        q, kv, sides = decode_sides(keys)
        for side, fn in sides.items():
            case = {"op": "decode_attention", "keys": keys, "side": side,
                    **profiled(fn, [q, *kv], CHAIN, torch)}
            print(json.dumps(case), flush=True)
            report["cases"].append(case)

    # int4 decode GEMV (1x4096 @ 11008x4096, group 64): 8 products of one x a call, each its
    # own weight (200 MB, more than L2); a call's output the first product's first 4096
    # columns, so calls chain
    rk = mx.random.split(mx.random.key(7), CHAIN + 1)
    xq = mx.random.normal((1, 4096), key=rk[0]).astype(mx.float16)
    quantized = []
    for i in range(CHAIN):
        wq = (mx.random.normal((11008, 4096), key=rk[1 + i]) * 0.02).astype(mx.float16)
        quantized.extend(mx.quantize(wq, group_size=64, bits=4))
    mx.eval(xq, *quantized)
    for side, op in {"metile": lambda a, w, s, b: metile.ops.quantized_matmul(
                         a, w, s, b, group_size=64, bits=4, backend="metile"),
                     "mlx": lambda a, w, s, b: mx.quantized_matmul(
                         a, w, s, b, group_size=64, bits=4)}.items():
        def products(a, *ws, op=op):
            outs = [op(a, *ws[3 * i:3 * i + 3]) for i in range(CHAIN)]
            return sum(o[:, :4096] for o in outs)
        case = {"op": "int4_decode_1x4096x11008", "side": side,
                **profiled(mx.compile(products), [xq, *quantized], CHAIN, torch)}
        print(json.dumps(case), flush=True)
        report["cases"].append(case)

    x = mx.random.normal((1, 4096)).astype(mx.float16)
    w = mx.ones((4096,), mx.float16)
    mx.eval(x, w)
    for side, op in {"metile": lambda a, b: metile.ops.rms_norm(a, b, 1e-5, backend="metile"),
                     "mlx": lambda a, b: mx.fast.rms_norm(a, b, 1e-5)}.items():
        def step(a, weight, op=op):
            for _ in range(16):
                a = op(a, weight)
            return a
        case = {"op": "rms_norm_1x4096", "side": side,
                **profiled(mx.compile(step), [x, w], 16, torch)}
        print(json.dumps(case), flush=True)
        report["cases"].append(case)
    save(report)


if __name__ == "__main__":
    main()
