"""What the decode probes share: timing their sides in alternating order and writing the
report (one JSON line a case, the whole report to argv[1])."""
import json
import sys

import numpy as np


def alternating_us(names, measure, rounds: int) -> dict:
    """Median microseconds of `measure(name)` (seconds) per name over `rounds` rounds, the
    order reversed every other round."""
    times = {n: [] for n in names}
    order = list(names)
    for r in range(rounds):
        for n in (order if r % 2 == 0 else order[::-1]):
            times[n].append(measure(n))
    return {n: round(float(np.median(t)) * 1e6, 1) for n, t in times.items()}


def check_close(got, want, *label) -> None:
    """A side's output against the reference's, relative to the reference's largest value
    (a decode output over many keys is small): within 1e-2."""
    got, want = (np.array(x, np.float32) for x in (got, want))
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-2, (*label, err)


def mlx_over(us: dict, names) -> dict:
    """MLX's time over each side's: above 1, the side is the faster."""
    return {n: round(us["mlx"] / us[n], 3) for n in names}


def kv_bandwidth(us: dict, keys: int, heads: int = 32, d: int = 128, itemsize: int = 2) -> dict:
    """TB/s each side's time gives reading k and v (heads x keys x d each) once."""
    moved = 2 * heads * keys * d * itemsize
    return {n: round(moved / (t * 1e-6) / 1e12, 3) for n, t in us.items()}


def decode_case(report: dict, names, measure, warm, keys: int, fields: dict,
                ratios=None) -> None:
    """Time decode attention's sides: `warm(name)` each once, then `measure(name)`
    (seconds an attention) over 7 alternating rounds; add the case - `fields`, the us an
    attention, MLX's time over each side's in `ratios` (every side unless given), the TB/s
    reading k and v of `keys` keys."""
    for name in names:
        warm(name)
    us = alternating_us(names, measure, 7)
    add_case(report, {**fields, "us_per_attention": us,
                      "mlx_over": mlx_over(us, names if ratios is None else ratios),
                      "tb_per_s": kv_bandwidth(us, keys)})


def add_case(report: dict, case: dict) -> None:
    print(json.dumps(case), flush=True)
    report["cases"].append(case)


def save(report: dict, path: str | None = None) -> None:
    """The report to `path`, else to argv[1] where a probe takes its output there."""
    path = path if path is not None else (sys.argv[1] if len(sys.argv) > 1 else None)
    if path:
        json.dump(report, open(path, "w"), indent=1)


def chained_us(ops: dict, groups: list, rounds: int, calls: int = 20) -> dict:
    """Median microseconds a call of each op in `ops` (name -> op(*group)): len(groups) calls
    a compiled call, call i on groups[i] - no two on the same arrays, since mx.compile merges
    a call repeated on the same traced arrays (s152) - `calls` compiled calls a
    synchronisation, `rounds` alternating rounds after two warm calls each."""
    import time

    import mlx.core as mx

    sizes = [len(g) for g in groups]
    flat = [a for g in groups for a in g]

    def compiled(op):
        def step(*args):
            outs, at = [], 0
            for size in sizes:
                outs.append(op(*args[at:at + size]))
                at += size
            return outs
        return mx.compile(step)
    fns = {name: compiled(op) for name, op in ops.items()}

    def measure(name, launches=calls):
        mx.synchronize()
        start = time.perf_counter()
        outs = [fns[name](*flat) for _ in range(launches)]
        mx.eval(outs)
        mx.synchronize()
        return (time.perf_counter() - start) / (launches * len(groups))
    for name in fns:
        measure(name, 2)
    return alternating_us(list(fns), measure, rounds)


def card() -> str:
    """The GPU's name from nvidia-smi (a label), else the processor's."""
    import platform
    import subprocess
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def machine_info(**extra) -> dict:
    """The platform, MLX's version where MLX is loaded (a torch-only probe process does not
    load it for a label) and the card's name, with `extra`."""
    import platform
    info = {"platform": platform.platform(), **extra, "card": card()}
    if "mlx.core" in sys.modules:
        info["mlx_version"] = sys.modules["mlx.core"].__version__
    return info


def cuda_graph_us(fns, rounds: int, calls: int) -> tuple:
    """(wall clock, CUDA events) median microseconds a call of `fns` (torch side): every fn
    recorded in one CUDA graph after a warm call each, `calls` graph replays a
    synchronisation, `rounds` rounds."""
    import statistics
    import time

    import torch
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    g.replay()
    torch.cuda.synchronize()
    wall, events = [], []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        a.record()
        for _ in range(calls):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - start) * 1e6 / (calls * len(fns)))
        events.append(a.elapsed_time(b) * 1e3 / (calls * len(fns)))
    return round(statistics.median(wall), 2), round(statistics.median(events), 2)
