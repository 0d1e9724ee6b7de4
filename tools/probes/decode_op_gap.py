"""Where the decode benchmark's time goes: `benchmarks.attention` measured the op at
62.6 us (4096 keys) where `decode_ahead.py` measured its kernels at 21.7 (H100, s118).
The two differ in how they call: the benchmark compiles the op with k and v as the
compiled function's arguments, the probe compiles `attention_ops._run` with k and v
captured.  Each combination, and MLX's op both ways, chained (each output the next
query), 100 calls a sync, alternating, median of 9 rounds; then the compiled graphs'
primitives of the two forms.

    python3 tools/probes/decode_op_gap.py [out.json]
    DECODE_SET=splits python3 tools/probes/decode_op_gap.py [out.json]   (split_variants)
"""
import io
import os
import platform
import re
import sys
import time

sys.path.insert(0, "tools/probes")
import mlx.core as mx   # noqa: E402
import numpy as np      # noqa: E402

import metile                                 # noqa: E402
from decode_attention_ncu import operands     # noqa: E402
from metile import attention_ops              # noqa: E402
from probe_report import add_case, alternating_us, check_close, kv_bandwidth, save  # noqa: E402

SCALE = 128 ** -0.5
KEYS = tuple(int(x) for x in __import__("os").environ.get("KEYS", "4096 16384").split())
CONFIG = {"path": "decode_rows", "BLOCK_N": 8}


def split_variants(k, v):
    """DECODE_SET=splits: the kernels at 16, 32 (the default at 32 heads) and 64 splits,
    MLX's op, and a read of k and v once (`sum` over the keys) - all with k and v captured,
    a form in which MLX's ops ran 1.2-1.75x slower on the H200 than with k and v as
    arguments (s121/s122): compare the split counts with each other, and metile with MLX
    in `benchmarks.attention`."""
    out = {}
    for splits in (16, 32, 64):
        cfg = {**CONFIG, "SPLITS": splits}
        out[f"splits{splits}"] = (mx.compile(
            lambda q, c=cfg: attention_ops._run(q, k, v, SCALE, None, c)), False)
    out["mlx"] = (mx.compile(lambda q: mx.fast.scaled_dot_product_attention(
        q, k, v, scale=SCALE)), False)
    # (q's shape out, so it chains: the sums' first 128 features of each head)
    out["read_kv"] = (mx.compile(lambda q: q + (k.sum(axis=2, keepdims=True)
                                                + v.sum(axis=2, keepdims=True)) * 0), False)
    return out


def variants(k, v):
    op = lambda q, k, v: metile.ops.scaled_dot_product_attention(q, k, v, scale=SCALE,
                                                                  backend="metile")
    run = lambda q, k, v: attention_ops._run(q, k, v, SCALE, None, CONFIG)
    ref = lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE)
    out = {}
    for name, f in (("op", op), ("run", run), ("mlx", ref)):
        out[f"{name}_args"] = (mx.compile(f), True)
        out[f"{name}_captured"] = (mx.compile(lambda q, f=f: f(q, k, v)), False)
    out["op_eager"] = (op, True)
    return out


def per_call(fn, takes_kv, q, k, v, launches):
    mx.synchronize()
    start = time.perf_counter()
    out = q
    for _ in range(launches):
        out = fn(out, k, v) if takes_kv else fn(out)
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - start) / launches


def labels(fn, takes_kv, q, k, v):
    out = fn(q, k, v) if takes_kv else fn(q)
    buf = io.StringIO()
    mx.export_to_dot(buf, out)
    return re.findall(r'label ="([^"]+)", shape=rectangle', buf.getvalue())


def main():
    report = {"machine": {"platform": platform.platform(), "mlx_version": mx.__version__,
                          "device": str(mx.default_device())},
              "metric": "us per call, 100 chained calls a sync, median of 9 alternating rounds",
              "cases": []}
    try:
        import subprocess
        report["machine"]["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True).stdout.strip()
    except Exception:
        pass
    for keys in KEYS:
        q, k, v = operands(keys)
        splits = os.environ.get("DECODE_SET") == "splits"
        fns = split_variants(k, v) if splits else variants(k, v)
        want = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE)
                        .astype(mx.float32))
        for name, (fn, takes) in fns.items():
            if name == "read_kv":
                per_call(fn, takes, q, k, v, 2)
                continue
            check_close((fn(q, k, v) if takes else fn(q)).astype(mx.float32), want, keys, name)
            per_call(fn, takes, q, k, v, 2)
        us = alternating_us(fns, lambda n: per_call(*fns[n], q, k, v, 100), 9)
        case = {"keys": keys, "us_per_call": us, "tb_per_s": kv_bandwidth(us, keys)}
        if not splits:
            case["graphs"] = {n: labels(*fns[n], q, k, v)[-12:]
                              for n in ("op_args", "run_args", "run_captured")}
        add_case(report, case)
    save(report)


if __name__ == "__main__":
    main()
