"""What the H200's HBM delivers to a streaming kernel that reads and writes every byte once
(rms_norm's traffic: read 16384x8192 float16, write the same): torch's device-to-device copy
and elementwise `mul` in CUDA-graph replays (20 a graph, median of 7 rounds), beside MLX's
`mx.fast.rms_norm` and metile's `ops.rms_norm` on the same bytes (compiled calls, 20 a
synchronisation; MLX-graph timing, launch gaps included).  The bound for issue 17's rms_norm
target: 1.05x of MLX needs 1.05 x MLX's bytes a second.

    python3 tools/probes/hbm_ceiling.py torch|mlx [out.json]   (each side its own process)
"""
import json
import statistics
import sys
import time

ROWS, COLS = 16384, 8192


def torch_side():
    import torch
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    out = {}
    for name, fn in (("copy", lambda: y.copy_(x)), ("mul", lambda: torch.mul(x, 1.0, out=y))):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                fn()
        samples = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / 20)
        us = statistics.median(samples)
        out[name] = {"us": us, "tb_per_s": 2 * x.numel() * 2 / us / 1e6}
    return out


def mlx_side():
    import mlx.core as mx
    import metile.ops as ops
    x = mx.random.normal((ROWS, COLS)).astype(mx.float16)
    w = mx.ones((COLS,), mx.float16)
    mx.eval(x, w)
    fns = {"mlx rms_norm": mx.compile(lambda a: mx.fast.rms_norm(a, w, 1e-5)),
           "metile rms_norm": mx.compile(lambda a: ops.rms_norm(a, w, 1e-5, backend="metile"))}
    samples = {k: [] for k in fns}
    for r in range(8):
        for name, fn in (fns.items() if r % 2 else reversed(list(fns.items()))):
            mx.synchronize()
            t = time.perf_counter()
            y = x
            for _ in range(20):
                y = fn(y)
            mx.eval(y)
            mx.synchronize()
            if r:
                samples[name].append((time.perf_counter() - t) / 20 * 1e6)
    out = {}
    for name, s in samples.items():
        us = statistics.median(s)
        out[name] = {"us": us, "tb_per_s": 2 * ROWS * COLS * 2 / us / 1e6}
    return out


def main():
    side = sys.argv[1]
    results = torch_side() if side == "torch" else mlx_side()
    report = {"shape": [ROWS, COLS], "dtype": "float16", "side": side, "results": results}
    for name, r in results.items():
        print(f"{side:6s} {name:16s} {r['us']:8.1f} us {r['tb_per_s']:.2f} TB/s")
    if len(sys.argv) > 2:
        json.dump(report, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()
