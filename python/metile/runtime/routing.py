"""Measured routing: run an op as a metile kernel only where it was measured faster
than MLX's own composite on this machine.

An op (metile.ops.matmul, linear, ...) describes each call by a signature: what
can change which implementation is fastest (dtype, shape bucket, layout,
epilogue, device).  The signature, plus the candidate names, the device, the
toolchain, the numerics-relevant environment and the compiler and kernel
fingerprints, hashes to a key.  A decision per key lives in
`settings.cache_root()/routing/<key>.json` (the tuning cache's format and
locking, its own folder), so a machine measures a signature once and every
later process reuses it.

Where no decision is recorded the op's cost model decides (the ops choose MLX:
see ops.py), never a kernel nobody has timed.  Measuring happens only when asked
for: `metile.ops.tune_*`, inside `with metile.ops.tuning():`, or with
METILE_OPS_TUNE=1; and only where it can run (not while mx.compile or mx.vmap
traces: `can_evaluate`).  A measurement runs every candidate once on fresh
random operands of the call's shapes, rejects any whose result differs from the
reference candidate (MLX's composite, always first), then times the rest in
alternating order for about `budget_s` seconds in total.
"""

from __future__ import annotations

import numbers
import os
import statistics
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import mlx.core as mx
import numpy as np

from .. import _ext, settings
from . import forks, tuning

FORMAT = 1
REFERENCE = "mlx"
# A kernel must beat the reference by this fraction to be chosen: timing noise of a
# few percent must not flip a layer onto a kernel that is not really faster.
MARGIN = 0.03
# Seconds of timing per measured signature (compiling candidates that are not yet
# in the kernel cache comes on top).
DEFAULT_BUDGET_S = 0.25
SAMPLES = 5
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Candidate:
    """One way to compute the op: `run(*operands)` returns its mx.array result."""
    name: str
    run: Callable[..., mx.array]


@dataclass
class Decision:
    winner: str
    source: str             # "measured", "cache", "cost_model", "requested" or "unsupported"
    reason: str
    key: str | None = None
    timings: dict = field(default_factory=dict)     # candidate -> seconds per call
    unusable: dict = field(default_factory=dict)    # candidate -> why it cannot be chosen
    cache_file: str | None = None

    def to_dict(self) -> dict:
        return {"winner": self.winner, "source": self.source, "reason": self.reason,
                "timings_us": {k: round(v * 1e6, 3) for k, v in self.timings.items()},
                "unusable": dict(self.unusable), "key": self.key, "cache_file": self.cache_file}


def routing_dir() -> Path:
    return settings.cache_root() / "routing"


# -- decisions on disk, remembered per process ------------------------------------------------

_lock = threading.Lock()

forks.renew_lock_after_fork(globals())
# (where the cache root comes from, key) -> (entry or None, file).  Every `auto` call
# looks here, so the hit path reads two variables instead of building the path.
_memory: dict[tuple, tuple[dict | None, Path]] = {}


# Called after every decision recorded and when the decisions read are forgotten: what
# keeps results of earlier decisions (metile.op_replay's replays) forgets them.
RECORD_LISTENERS: list[Callable[[], None]] = []


def _notify() -> None:
    for listener in RECORD_LISTENERS:
        listener()


def clear_memory() -> None:
    """Forget what this process read from the decision cache (tests edit the files)."""
    with _lock:
        _memory.clear()
    _notify()


def _cache() -> tuning.TuningCache:
    return tuning.TuningCache(routing_dir())


def _slot(key: str) -> tuple:
    return os.environ.get("METILE_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME"), key


def lookup(key: str) -> tuple[dict | None, Path]:
    """The recorded decision for `key` (None if none or unreadable) and its file.
    A corrupt file is ignored with a warning naming it (TuningCache.load).  What a
    process read is remembered: a decision another process records later is seen
    by the next process."""
    slot = _slot(key)
    hit = _memory.get(slot)
    if hit is not None:
        return hit
    cache = _cache()
    entry = cache.load(key)
    if entry is not None and not _well_formed(entry):
        warnings.warn(f"metile: ignoring the malformed routing decision {cache.path(key)} "
                      f"(timings must map names to seconds, unusable names to reasons)")
        entry = None
    with _lock:
        _memory[slot] = (entry, cache.path(key))
    return entry, cache.path(key)


_env_memo: list = [None, None]


def environ_epoch() -> int | None:
    """A number that changes whenever os.environ does (_ext.environ_epoch), or None where
    os.environ keeps no dict of its own to watch."""
    return None if settings._ENVIRON_DATA is None else _ext.environ_epoch(settings._ENVIRON_DATA)


def environment() -> tuple:
    """tuning.relevant_environment() as a tuple, rescanned only when os.environ changes (a
    full scan costs tens of microseconds, too much for every call): whenever its dict's
    epoch does (_ext.environ_epoch); where there is none, when the number of variables or
    the value of one it found does (which misses a METILE_* variable set where another
    was removed)."""
    probe, value = _env_memo
    epoch = environ_epoch()
    if epoch is not None:
        if probe != ("epoch", epoch) or value is None:
            value = tuple(tuning.relevant_environment().items())
            _env_memo[:] = [("epoch", epoch), value]
        return value
    names = ("MLX_ENABLE_TF32",) + (tuple(k for k, _ in value) if value is not None else ())
    now = (len(os.environ), tuple(os.environ.get(n) for n in names))
    if probe != now or value is None:
        value = tuple(tuning.relevant_environment().items())
        names = ("MLX_ENABLE_TF32",) + tuple(k for k, _ in value)
        _env_memo[:] = [(len(os.environ), tuple(os.environ.get(n) for n in names)), value]
    return value


def record(key: str, entry: dict) -> Path | None:
    """Keeps `entry` for this process and writes it to the cache: its file, or None where
    the cache could not be written (then no report may name a file)."""
    cache = _cache()
    path = cache.path(key) if cache.store(key, entry) else None
    with _lock:
        _memory[_slot(key)] = (entry, path)
    _notify()
    return path


def decision_key(parts: dict) -> str:
    return tuning.tuning_key({**parts, "format": FORMAT, "kind": "routing"})


# the decision keys of recent signatures, by each op's memo tuple: building one encodes
# JSON (~30 us), at every call of a new signature - each step of an eager decode over a
# grown cache - where the memo (its dtypes, buckets, flags, device, environment) repeats
_signature_keys: dict[tuple, tuple[str, dict]] = {}


def signature_key(memo: tuple, parts: Callable[[], dict]) -> tuple[str, dict]:
    """(decision_key(parts()), parts()) of a signature, kept by `memo` (a tuple holding
    everything `parts` reads, the op's name first); bounded, cleared when full."""
    hit = _signature_keys.get(memo)
    if hit is None:
        if len(_signature_keys) >= 4096:
            _signature_keys.clear()
        made = parts()
        hit = _signature_keys[memo] = (decision_key(made), made)
    return hit


def _well_formed(entry: dict) -> bool:
    timings, unusable = entry.get("timings"), entry.get("unusable", {})
    return (isinstance(timings, dict) and isinstance(unusable, dict)
            and all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    for k, v in timings.items())
            and all(isinstance(k, str) for k in unusable))


def recorded(key: str, names: Callable[[], Iterable[str]], force: bool = False
             ) -> Decision | None:
    """The decision recorded for `key`; None where there is none, under `force`, or where
    it names a winner that is neither the reference nor one of `names()` (this version's
    candidates: a hand-edited file, or one an older version wrote), which warns once and
    is then measured again like a missing one instead of being ignored for good."""
    entry, path = (None, None) if force else lookup(key)
    if entry is None:
        return None
    decision = from_entry(entry, path)
    if decision.winner != REFERENCE and decision.winner not in set(names()):
        warnings.warn(f"metile: the routing decision {path} names {decision.winner!r}, which "
                      f"is not one of this version's candidates; it is measured again (MLX's "
                      f"composite runs until then)")
        return None
    return decision


def from_entry(entry: dict, path: Path | None) -> Decision:
    """The decision `entry` records; `path` None: measured in this process and kept in
    memory only (the cache could not be written)."""
    source = "cache" if path is not None else "measured (this process: the cache is unwritable)"
    return Decision(entry["winner"], source, entry.get("reason", "recorded measurement"),
                    entry["key"], dict(entry["timings"]), dict(entry.get("unusable", {})),
                    None if path is None else str(path))


# -- when measuring may run --------------------------------------------------------------------

class _Tuning(threading.local):
    scope = None   # (a class default: reading an unset thread-local raised and caught, ~1 us)


_tuning = _Tuning()


@contextmanager
def tuning_scope(budget_s: float | None = None, clock: Callable[[], float] | None = None):
    """Inside: an op call whose signature has no recorded decision measures it."""
    # (infinity failed deep in the measurement, "cannot convert float infinity to integer",
    # and a NumPy float was refused as no number)
    if budget_s is not None and (isinstance(budget_s, (bool, np.bool_))
                                 or not isinstance(budget_s, numbers.Real)
                                 or not 0 < budget_s < float("inf")):
        raise ValueError(f"[metile.ops.tuning] budget_s must be a positive, finite number of "
                         f"seconds, got {budget_s!r}")
    previous = _tuning.scope
    _tuning.scope = (budget_s, clock)
    _ext.tuning_scopes(1)   # (the count a replay table reads without calling Python)
    try:
        yield
    finally:
        _ext.tuning_scopes(-1)
        _tuning.scope = previous


def measuring_requested() -> bool:
    return in_tuning_scope() or settings.flag("METILE_OPS_TUNE")


def in_tuning_scope() -> bool:
    """Whether this thread is inside `tuning_scope` (a cheap test, unlike the setting)."""
    return _tuning.scope is not None


def budget() -> float:
    scope = _tuning.scope
    if scope is not None and scope[0] is not None:
        return float(scope[0])
    raw = os.environ.get("METILE_OPS_TUNE_BUDGET_S")
    if raw is None or raw.strip() == "":
        return DEFAULT_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise settings.SettingError(f"METILE_OPS_TUNE_BUDGET_S={raw!r} is not a positive, finite "
                                    f"number of seconds")
    return value


def scope_clock() -> Callable[[], float]:
    scope = _tuning.scope
    return scope[1] if scope is not None and scope[1] is not None else time.perf_counter


def can_evaluate(*arrays: mx.array) -> bool:
    """False while mx.compile or mx.vmap traces these arrays (they have no data).
    MLX exposes no tracing flag to Python; evaluating is the observable test, and an
    eager call being measured is about to synchronize anyway."""
    try:
        mx.eval(*arrays)
    except ValueError as e:
        if "function transformations" in str(e):
            return False
        raise
    return True


# -- measuring ---------------------------------------------------------------------------------

def _time(candidate: Candidate, operands, launches: int, clock) -> float:
    start = clock()
    outs = [candidate.run(*operands) for _ in range(launches)]
    mx.eval(*outs)
    mx.synchronize()
    return (clock() - start) / launches


def measure(key: str, parts: dict, candidates: Sequence[Candidate], operands: Sequence[mx.array],
            validate: Callable[[mx.array, mx.array], str | None], *, budget_s: float,
            clock: Callable[[], float] = time.perf_counter) -> Decision:
    """Validate, time and record.  candidates[0] is the reference (MLX's composite);
    `validate(out, reference_out)` returns None or what is wrong.  The winner is the
    fastest validated candidate if it beats the reference by MARGIN, else the reference."""
    if not candidates or candidates[0].name != REFERENCE:
        raise ValueError(f"routing candidates must start with the reference {REFERENCE!r}")
    mx.eval(*operands)
    reference = candidates[0].run(*operands)
    mx.eval(reference)
    usable, unusable = [candidates[0]], {}
    for c in candidates[1:]:
        try:
            out = c.run(*operands)          # also the warm-up: compiles the kernel
            mx.eval(out)
            problem = validate(out, reference)
        except Exception as e:  # noqa: BLE001  (any failure makes the candidate unusable, by name)
            unusable[c.name] = f"{type(e).__name__}: {e}"
            continue
        if problem:
            unusable[c.name] = f"validation against {REFERENCE} failed: {problem}"
        else:
            usable.append(c)

    single = {c.name: max(_time(c, operands, 1, clock), 1e-9) for c in usable}
    per_sample = budget_s / (len(usable) * SAMPLES)
    # (capped before int(): a budget near the float maximum overflowed to infinity here)
    launches = {n: max(1, int(min(1000.0, per_sample / t))) for n, t in single.items()}
    samples = SAMPLES if all(t <= per_sample for t in single.values()) else MIN_SAMPLES
    times: dict[str, list[float]] = {c.name: [] for c in usable}
    for i in range(samples):
        for c in (usable if i % 2 == 0 else usable[::-1]):   # alternate: drift hits all alike
            # an untimed lead-in of the candidate itself first: a sample right after another
            # candidate's ran slower (H100, s140: the dual GEMM after MLX's composite 17%,
            # MLX's after it 5%; with a lead-in of 5 launches neither)
            _time(c, operands, max(1, launches[c.name] // 10), clock)
            times[c.name].append(_time(c, operands, launches[c.name], clock))
    timings = {n: statistics.median(v) for n, v in times.items()}

    ref_time = timings[REFERENCE]
    contenders = {n: t for n, t in timings.items() if n != REFERENCE}
    best = min(contenders, key=contenders.get) if contenders else None
    if best is not None and contenders[best] < ref_time * (1 - MARGIN):
        winner = best
        reason = (f"measured: {best} {contenders[best] * 1e6:.1f} us vs {REFERENCE} "
                  f"{ref_time * 1e6:.1f} us per call")
    else:
        winner = REFERENCE
        reason = (f"measured: no metile candidate beat {REFERENCE} ({ref_time * 1e6:.1f} us per "
                  f"call) by {MARGIN:.0%}" if best is not None else
                  "measured: no metile candidate passed validation")
    entry = {"format": tuning.FORMAT, "key": key, "winner": winner, "reason": reason,
             "timings": timings, "unusable": unusable, "parts": parts,
             "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = record(key, entry)
    return Decision(winner, "measured", reason, key, timings, unusable,
                    None if path is None else str(path))
