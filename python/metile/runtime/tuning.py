"""Autotuning and the persistent tuning cache.

`autotune` measures candidate configurations and remembers the winner on disk
under `$METILE_CACHE_DIR/tuning` (default `~/.cache/metile/tuning`), one JSON
file per key.  The key is a hash of everything that can change which candidate
is fastest or whether its results are acceptable: each operand's type, dtype,
shape and strides (scalars by type, integers also by value since they
specialize shape proofs), the caller's compile-policy overrides (precision,
schedule, ...), the candidate list, the grid, the source and compiler
fingerprints, the numerics-relevant environment and the target toolchain.  So
a winner measured for float16 is never reused for float32, nor one measured
with RELAXED_PRECISION=True or MLX_ENABLE_TF32=1 for a strict-precision call.

Writers take a file lock and replace the file atomically, so concurrent
processes never see a half-written entry; an unreadable entry is ignored with a
warning and measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import mlx.core as mx
import numpy as np
from filelock import FileLock

from ..errors import ScheduleError
from ..schedule.schedule import Config

FORMAT = 1
# METILE_* variables that cannot change generated code or its numerics.
_ENV_IGNORED = {"METILE_CACHE_DIR", "METILE_DEBUG", "METILE_DISABLE_DISK_CACHE",
                "METILE_MSL_TIMEOUT_S", "METILE_RACE_CHECK", "METILE_MSL_CHECK_ADDRESS_SPACES",
                "METILE_MSL_STRICT", "METILE_MSL_BOUNDS_CHECK", "METILE_MSL_STACK_KB",
                "METILE_LANE_ORDER", "METILE_OPS_TUNE", "METILE_OPS_TUNE_BUDGET_S"}


class TuningError(RuntimeError):
    """No candidate could run; the message lists every candidate's reason."""


def tuning_dir() -> Path:
    from .. import settings
    return settings.cache_root() / "tuning"


# -- key ------------------------------------------------------------------------------------

def _row_major_strides(shape) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def operand_signature(value, by_value: bool = False):
    """How one launch argument enters the key.

    mx.array: dtype, shape and strides.  MLX does not expose strides; metile
    hands kernels row-major data, so the row-major strides of the shape are what
    the kernel indexes with.  numpy arrays report their own (element) strides.
    Scalars enter by type; ints and bools also by value (they specialize shape
    proofs), floats by value only when `by_value` is set.
    """
    if isinstance(value, np.generic):
        # a NumPy scalar is its Python value to the launch (Kernel.bind): so here, or it
        # took the array branch below and key=["n"] ignored its value
        value = value.item()
    if isinstance(value, mx.array):
        if by_value and value.ndim == 0:
            return ["mx.array", str(value.dtype).removeprefix("mlx.core."), repr(value.item())]
        return ["mx.array", str(value.dtype).removeprefix("mlx.core."), list(value.shape),
                _row_major_strides(value.shape)]
    if hasattr(value, "dtype") and hasattr(value, "strides") and hasattr(value, "shape"):
        item = value.dtype.itemsize or 1
        return [type(value).__name__, str(value.dtype), list(value.shape),
                [s // item for s in value.strides]]
    if isinstance(value, (bool, int)) or by_value:
        return [type(value).__name__, repr(value)]
    if isinstance(value, (float, complex)):
        return [type(value).__name__]
    return [type(value).__qualname__, repr(value)]


def relevant_environment(environ=None) -> dict:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items())
            if (k.startswith("METILE_") and k not in _ENV_IGNORED) or k == "MLX_ENABLE_TF32"}


def toolchain() -> dict:
    from ..version import __version__

    return {"mlx": mx.__version__, "metile": __version__, "machine": platform.machine(),
            "system": platform.system()}


def _policy_value(value):
    key = getattr(value, "key", None)
    return key() if callable(key) else repr(value)


def key_parts(*, operands: dict, overrides: dict | None = None, grid=None, source: str = "",
              compiler: str = "", target: str = "", by_value: Sequence[str] = ()) -> dict:
    """The parts of a tuning key except the candidates (autotune adds those).

    operands: launch arguments by parameter name.  overrides: the caller's
    compile-policy keywords (RELAXED_PRECISION, STRICT_MATH, SCHEDULE, ...).
    grid: the evaluated grid.  source/compiler: fingerprints.  target: e.g. "sm_90".
    """
    return {
        "operands": {n: operand_signature(v, n in by_value) for n, v in operands.items()},
        "overrides": {k: _policy_value(v) for k, v in sorted((overrides or {}).items())},
        "grid": None if grid is None else [int(g) for g in grid],
        "source": source, "compiler": compiler, "target": target,
        "environment": relevant_environment(), "toolchain": toolchain(),
    }


def tuning_key(parts: dict) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


# -- cache ----------------------------------------------------------------------------------

# Entries this process measured but could not write (an unwritable cache), by (folder, key):
# without them an unwritable cache measured every candidate again at every call, not once
# a process as its warning says.
_unsaved: dict[tuple[str, str], dict] = {}
_UNSAVED_LIMIT = 4096


class TuningCache:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else tuning_dir()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict | None:
        path = self.path(key)
        try:
            text = path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # the latter: store() warns about it
            return None
        except (OSError, UnicodeDecodeError) as e:   # (bytes that are not UTF-8: damaged)
            warnings.warn(f"metile: ignoring unreadable tuning cache entry {path}: {e}")
            return None
        try:
            entry = json.loads(text)
            if not (isinstance(entry, dict) and entry.get("key") == key
                    and entry.get("format") == FORMAT and isinstance(entry.get("winner"), str)):
                raise ValueError("not a tuning entry for this key")
            timings, unusable = entry.get("timings", {}), entry.get("unusable", {})
            if not (isinstance(timings, dict) and isinstance(unusable, dict)
                    and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                            for t in timings.values())
                    and all(isinstance(r, str) for r in unusable.values())):
                # (handed on as TuneResult's dicts: a list there failed in the caller)
                raise ValueError("its timings or unusable reasons are not the mappings "
                                 "autotune writes")
            if entry["winner"] in unusable:
                # a winner its own measurement refused (validation, compile): only an edited
                # or damaged entry says so, and running it could give a wrong result
                raise ValueError(f"its winner {entry['winner']!r} is listed as unusable")
        except (ValueError, RecursionError) as e:   # (nesting past the parser's depth)
            warnings.warn(f"metile: ignoring corrupt tuning cache entry {path}: "
                          f"{e if isinstance(e, ValueError) else 'nested too deeply'}")
            return None
        return entry

    def forget(self, key: str) -> None:
        """Drop the entry for `key` (one whose winner cannot run a call)."""
        _unsaved.pop((str(self.directory), key), None)
        try:
            self.path(key).unlink()
        except OSError:
            pass

    def store(self, key: str, entry: dict) -> bool:
        """Whether `entry` was written (an unwritable cache warns and keeps nothing)."""
        try:
            self._store(key, entry)
            return True
        except OSError as e:
            # An unwritable cache only costs measuring again in the next process.
            from .cache import warn_unwritable

            path = self.path(key)
            # (the folder is fine: the entry's own path, or its lock's, is taken - the lock's
            # was reported as an unwritable cache directory)
            taken = next((p for p in (path, Path(f"{path}.lock")) if _is_dir(p)), None)
            if taken is not None:
                warnings.warn(f"metile: cannot write the tuning cache entry {path}: a directory "
                              f"is there ({taken}); this result is measured again in each process",
                              RuntimeWarning, stacklevel=2)
                return False
            warn_unwritable(self.directory, e, "autotuning results are not kept between runs, so "
                                               "each process measures them again")
            return False

    def _store(self, key: str, entry: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        with FileLock(str(path) + ".lock"):
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            try:
                from .cache import shareable
                shareable(fd)
                with os.fdopen(fd, "w") as f:
                    json.dump(entry, f, indent=1, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise


def _is_dir(path) -> bool:
    """Path.is_dir, False where the folder cannot be entered (is_dir raises then)."""
    try:
        return path.is_dir()
    except OSError:
        return False


# -- measuring ------------------------------------------------------------------------------

@dataclass
class TuneResult:
    config: Config
    key: str
    from_cache: bool
    timings: dict = field(default_factory=dict)     # config key -> median seconds per launch
    unusable: dict = field(default_factory=dict)    # config key -> reason


def _outputs(value) -> list:
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, mx.array)]
    return []


def measure(fn: Callable[[], object], warmup: int, reps: int, launches: int,
            clock: Callable[[], float]) -> float:
    """Median seconds per launch over `reps` samples.  Each sample enqueues `launches`
    launches and synchronizes once: a synchronization round trip costs far more than a
    small kernel, so timing one launch per sync would measure the round trip."""
    for _ in range(warmup):
        mx.eval(*_outputs(fn()))
    mx.synchronize()
    samples = []
    for _ in range(reps):
        start = clock()
        outs = []
        for _ in range(launches):
            outs += _outputs(fn())
        mx.eval(*outs)
        mx.synchronize()
        samples.append((clock() - start) / launches)
    return statistics.median(samples)


def autotune(candidates: Sequence[Config], run_candidate: Callable[[Config], object],
             key_parts: dict, *, warmup: int = 3, reps: int = 15, launches: int = 10,
             validate: Callable[[object, object], object] | None = None,
             unusable: tuple[type[BaseException], ...] = (ScheduleError,),
             fatal: tuple[type[BaseException], ...] = (),
             cache: TuningCache | None = None, clock: Callable[[], float] = time.perf_counter
             ) -> TuneResult:
    """The fastest of `candidates`, measured with `run_candidate(config)` (which launches
    the kernel and returns its mx.array outputs), or the cached winner for the same key.

    A candidate raising one of `unusable` (ScheduleError by default; the kernel layer
    adds CompilationError) is skipped with its reason; one raising one of `fatal` (a
    subclass of them that is the caller's mistake, e.g. a Config setting an argument the
    kernel does not take) stops the tuning with its error.  `validate(outputs, reference)`
    compares candidates' outputs: they are grouped by agreement, and when they disagree
    the largest group (ties: the earliest candidate's) is taken as right - the others
    are unusable, with a warning naming both sides (checked against the first candidate
    alone, a wrong first one made every right one "differ" and won).
    """
    if not candidates:
        raise ValueError("autotune needs at least one candidate Config")
    if len(set(candidates)) != len(candidates):
        raise ValueError("autotune candidates contain duplicates")
    cache = TuningCache() if cache is None else cache
    parts = {**key_parts, "candidates": [c.key() for c in candidates], "format": FORMAT}
    key = tuning_key(parts)
    by_key = {c.key(): c for c in candidates}
    slot = (str(cache.directory), key)
    entry = _unsaved.get(slot) or cache.load(key)
    if entry is not None and entry["winner"] in by_key:
        return TuneResult(by_key[entry["winner"]], key, True, entry.get("timings", {}),
                          entry.get("unusable", {}))
    if entry is not None:
        # (the key names the candidates, so only an edited or damaged entry gets here)
        warnings.warn(f"metile: ignoring tuning cache entry {cache.path(key)}: its winner "
                      f"{entry['winner']!r} is not one of the candidates; measuring again")

    timings, reasons, groups = {}, {}, []      # groups: [reference outputs, [names]]
    for config in candidates:
        name = config.key()
        try:
            outs = run_candidate(config)          # first launch: compiles
            mx.eval(*_outputs(outs))
            if validate is not None:
                for group in groups:
                    try:
                        agrees = validate(outs, group[0]) is not False
                    except AssertionError:
                        agrees = False
                    if agrees:
                        group[1].append(name)
                        break
                else:
                    groups.append([outs, [name]])
            timings[name] = None                  # usable: timed below unless outvoted
        except fatal:
            raise
        except unusable as e:
            reasons[name] = f"{type(e).__name__}: {e}"
        except AssertionError as e:
            reasons[name] = f"validation failed: {e}"
    if len(groups) > 1:
        right = max(groups, key=lambda g: len(g[1]))       # (max keeps the earliest on ties)
        wrong = [n for g in groups if g is not right for n in g[1]]
        for n in wrong:
            del timings[n]
            reasons[n] = (f"validation failed: outputs differ from the {len(right[1])} of "
                          f"{sum(len(g[1]) for g in groups)} candidates that agree")
        warnings.warn(f"metile autotune: candidates compute different outputs - {', '.join(wrong)} "
                      f"differ from {', '.join(right[1])}; the majority is kept, but a config "
                      f"that changes the result usually means the kernel depends on its tiling")
    for config in candidates:
        if config.key() in timings:
            try:
                timings[config.key()] = measure(lambda: run_candidate(config), warmup, reps,
                                                launches, clock)
            except unusable as e:
                del timings[config.key()]
                reasons[config.key()] = f"{type(e).__name__}: {e}"
    if not timings:
        raise TuningError("no usable candidate: " +
                          "; ".join(f"{k}: {v}" for k, v in reasons.items()))
    winner = min(timings, key=timings.get)
    entry = {"format": FORMAT, "key": key, "winner": winner, "timings": timings,
             "unusable": reasons, "parts": parts,
             "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not cache.store(key, entry):
        if len(_unsaved) >= _UNSAVED_LIMIT:
            _unsaved.clear()
        _unsaved[slot] = entry
    return TuneResult(by_key[winner], key, False, timings, reasons)
