"""The GPU timeline of back-to-back compiled calls: metile's softmax / rms_norm against
MLX's op, as the model_ops benchmark enqueues them (N calls, one eval, one sync): the gap
between consecutive kernels is what the benchmark's per-call latency adds to the
kernel's own time.  The timeline comes from CUPTI through torch.profiler (CUPTI records
every kernel of the process, MLX's included), or from nsys:

    python3 tools/probes/launch_gaps.py --torch [rows: 256 columns]
    nsys profile -t cuda -o gaps python3 tools/probes/launch_gaps.py
"""
import sys

import mlx.core as mx

sys.path.insert(0, "kernels")
from metile import model_ops  # noqa: E402

EPS = 1e-5


def main():
    args = [a for a in sys.argv[1:] if a != "--torch"]
    rows, columns = (16384, 8192) if not args else (int(args[0]), 256)
    x = mx.random.normal((rows, columns)).astype(mx.float16)
    w = mx.random.normal((columns,)).astype(mx.float16)
    mx.eval(x, w)
    fns = {
        "mlx_softmax": mx.compile(lambda x, w: mx.softmax(x, axis=-1)),
        "metile_softmax": mx.compile(lambda x, w: model_ops._softmax_fn((("num_warps", 4),))(x)),
        "mlx_rms_norm": mx.compile(lambda x, w: mx.fast.rms_norm(x, w, EPS)),
        "metile_rms_norm": mx.compile(
            lambda x, w: model_ops._rms_fn(EPS, True, (("num_warps", 16),))(x, w)),
    }
    for fn in fns.values():          # warm-up
        mx.eval([fn(x, w) for _ in range(30)])
        mx.synchronize()
    if "--torch" in sys.argv:
        import torch
        from torch.profiler import ProfilerActivity, profile
        torch.zeros(1, device="cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(fns, x, w)
        # the trace file holds every CUPTI kernel record (MLX's are not tied to a torch op)
        import json
        import tempfile
        path = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
        summarize([(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("cat") == "kernel"])
    else:
        run(fns, x, w)


def run(fns, x, w):
    for name, fn in fns.items():
        mx.eval([fn(x, w) for _ in range(30)])
        mx.synchronize()
        print(name, "done", flush=True)


def summarize(kernels):
    """Per kernel name: the median duration and the median gap since the previous
    kernel ended (microseconds)."""
    kernels.sort()
    stats, prev_end = {}, None
    for start, end, name in kernels:
        durs, gaps = stats.setdefault(name[:50], ([], []))
        durs.append(end - start)
        if prev_end is not None:
            gaps.append(start - prev_end)
        prev_end = end
    for name, (durs, gaps) in stats.items():
        if len(durs) >= 10:
            durs, gaps = sorted(durs), sorted(gaps)
            print(f"{name:50s} n={len(durs):3d} kernel median {durs[len(durs) // 2]:7.1f} us, "
                  f"gap before it median {gaps[len(gaps) // 2]:6.1f} us, p90 "
                  f"{gaps[9 * len(gaps) // 10]:6.1f}")


if __name__ == "__main__":
    main()
