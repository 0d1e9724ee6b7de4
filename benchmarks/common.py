"""What every benchmark report records about where it ran, and how it is written."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import mlx.core as mx
import numpy as np


def device_name() -> str:
    """The default device as MLX names it (e.g. "NVIDIA H200", the CPU model)."""
    return mx.device_info().get("device_name", str(mx.default_device()))


def machine() -> dict:
    import metile
    record = {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "device": device_name(),
        "mlx_version": mx.__version__,
        "metile_version": metile.__version__,
    }
    if mx.default_device() == mx.cpu:
        # what the CPU runtime compiles kernels with (its numbers depend on it)
        from metile.runtime.msl_cpu import compiler
        try:
            record["msl_cpu_compiler"] = compiler.find_compiler()[1]
        except RuntimeError as e:
            record["msl_cpu_compiler"] = f"none: {e}"
    return record


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (a count of rounds, launches, tokens, a size)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0 (a sample's target time)."""
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def output_path(text: str) -> str:
    """argparse type: a file the report can be written to, checked before the run (an
    unwritable path failed only after it)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"the directory {parent} is not writable")
    return text


def _strict(value):
    """`value` with NaN and infinities as null: strict JSON other tools can read (a failed
    sample's NaN made the file invalid JSON)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_report(path: str | None, report: dict) -> None:
    if path:
        text = json.dumps(_strict(report), indent=2, allow_nan=False)
        with open(path, "w") as f:
            f.write(text)


def sample(fn, x, launches: int) -> float:
    """Seconds per call of `fn(x)`: `launches` calls enqueued, one synchronization."""
    mx.synchronize()
    start = time.perf_counter()
    mx.eval([fn(x) for _ in range(launches)])
    mx.synchronize()
    return (time.perf_counter() - start) / launches


def rotate_sized(fns: dict, x, rounds: int, sample_s: float = 0.03) -> dict:
    """`rotate` with `launches` chosen so a sample of the first function lasts ~sample_s
    (3 to 60 launches)."""
    first = next(iter(fns.values()))
    first_s = rotate({"probe": first}, x, 3, 1)["probe"]
    launches = max(3, min(60, int(sample_s / max(first_s, 1e-6))))
    return rotate(fns, x, launches, rounds)


def rotation(names: list, r: int) -> list:
    """The order of round `r`: the names rotated by r // 2, reversed in odd rounds - with two
    names every other round starts with each (a rotation by r reversed every other round
    gave two names the same order in every round)."""
    shift = (r // 2) % len(names)
    order = names[shift:] + names[:shift]
    return order if r % 2 == 0 else order[::-1]


def rotate(fns: dict, x, launches: int, rounds: int) -> dict:
    """Median latency per name over `rounds` rounds in rotation()'s orders."""
    names, times = list(fns), {n: [] for n in fns}
    # one untimed sample each: the first to hold `launches` outputs at once allocates
    # them (a compiled graph's first calls ran 3-5x slower on the H200 until then)
    for n in names:
        sample(fns[n], x, launches)
    for r in range(rounds):
        for n in rotation(names, r):
            # an untimed lead-in of the variant itself: a sample right after another
            # variant's ran slower (H100, s140, tools/probes/order_penalty.py)
            sample(fns[n], x, max(1, launches // 10))
            times[n].append(sample(fns[n], x, launches))
    return {n: float(np.median(t)) for n, t in times.items()}
