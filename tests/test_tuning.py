"""Autotuning and the persistent tuning cache, measured with a fake clock (no timed asserts)."""

import json
import os
import subprocess
import sys
import threading
import warnings

import mlx.core as mx
import numpy as np
import pytest

from metile.runtime.tuning import (TuningCache, TuningError, autotune, key_parts,
                                   operand_signature, relevant_environment, tuning_key)
from metile.schedule import Config, ScheduleError

CANDIDATES = [Config(num_simdgroups=2, BLOCK=64), Config(num_simdgroups=4, BLOCK=128),
              Config(num_simdgroups=8, BLOCK=256)]


class FakeKernel:
    """Launching a candidate advances a fake clock by that candidate's cost."""

    def __init__(self, costs, fail=None, wrong=(), stalls=None):
        self.now, self.costs, self.fail, self.wrong = 0.0, costs, fail or {}, set(wrong)
        self.stalls = stalls or {}  # launch number (1-based) -> extra seconds
        self.calls = []

    def clock(self):
        return self.now

    def __call__(self, config):
        self.calls.append(config.launch_kwargs()["BLOCK"])
        block = config.launch_kwargs()["BLOCK"]
        if block in self.fail:
            raise self.fail[block]
        self.now += self.costs[block] + self.stalls.get(len(self.calls), 0.0)
        return mx.array([1.0, 2.0]) + (1.0 if block in self.wrong else 0.0)


def parts(dtype=mx.float32, relaxed=False, **extra):
    x = mx.zeros((64, 32), dtype=dtype)
    return key_parts(operands={"x": x, "out": x, "n": 64, "alpha": 0.5},
                     overrides={"RELAXED_PRECISION": relaxed, **extra}, grid=(4, 1, 1),
                     source="src-fingerprint", compiler="compiler-fingerprint", target="cpu_msl")


@pytest.fixture
def cache(tmp_path):
    return TuningCache(tmp_path / "tuning")


def tune(kernel, cache, key=None, **kw):
    return autotune(CANDIDATES, kernel, parts() if key is None else key, cache=cache,
                    clock=kernel.clock, warmup=1, reps=5, launches=2, **kw)


def test_fastest_candidate_wins_and_is_cached(cache):
    kernel = FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3})
    result = tune(kernel, cache)
    assert result.config == CANDIDATES[1] and not result.from_cache
    assert result.timings == {c.key(): pytest.approx(t) for c, t in
                              zip(CANDIDATES, (3e-3, 1e-3, 2e-3))}
    entry = json.loads(cache.path(result.key).read_text())
    assert entry["winner"] == CANDIDATES[1].key() and entry["key"] == result.key
    # 1 validation launch + 1 warmup + 5 reps x 2 launches per candidate
    assert kernel.calls.count(128) == 12

    again = FakeKernel({64: 1e-6, 128: 1.0, 256: 1.0})  # would now pick BLOCK=64 if measured
    hit = tune(again, cache)
    assert hit.from_cache and hit.config == CANDIDATES[1] and again.calls == []


def test_median_ignores_one_slow_sample(cache):
    kernel = FakeKernel({64: 1e-3, 128: 2e-3, 256: 3e-3}, stalls={4: 1.0})
    result = tune(kernel, cache)
    assert kernel.calls[3] == 64  # the stall hit a timed launch of the best candidate
    assert result.config == CANDIDATES[0]
    assert result.timings[CANDIDATES[0].key()] == pytest.approx(1e-3)


@pytest.mark.parametrize("change", [
    dict(dtype=mx.float16), dict(dtype=mx.bfloat16), dict(relaxed=True),
    dict(SCHEDULE=__import__("metile").schedule.Schedule(vector_width=4)),
])
def test_winner_for_another_dtype_or_policy_is_not_reused(cache, change):
    tune(FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3}), cache)
    other = FakeKernel({64: 1e-3, 128: 3e-3, 256: 2e-3})
    result = tune(other, cache, key=parts(**change))
    assert not result.from_cache and result.config == CANDIDATES[0] and other.calls


def test_environment_and_candidates_are_part_of_the_key(cache, monkeypatch):
    monkeypatch.delenv("MLX_ENABLE_TF32", raising=False)
    for name in [n for n in os.environ if n.startswith("METILE_") and n != "METILE_CACHE_DIR"]:
        monkeypatch.delenv(name)  # e.g. a suite run with METILE_MSL_BOUNDS_CHECK=1
    base = tuning_key(parts())
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")
    assert tuning_key(parts()) != base
    monkeypatch.setenv("METILE_DEBUG", "schedule")  # inspection only: same key
    monkeypatch.setenv("METILE_CACHE_DIR", "/elsewhere")
    assert relevant_environment() == {"MLX_ENABLE_TF32": "0"}
    first = tune(FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3}), cache)
    fewer = autotune(CANDIDATES[:2], FakeKernel({64: 3e-3, 128: 1e-3}), parts(), cache=cache,
                     warmup=0, reps=1, launches=1)
    assert fewer.key != first.key and not fewer.from_cache


def test_operand_signature():
    a = mx.zeros((3, 4), dtype=mx.float16)
    assert operand_signature(a) == ["mx.array", "float16", [3, 4], [4, 1]]
    t = np.zeros((4, 6), dtype=np.float32)[:, ::2]
    assert operand_signature(t) == ["ndarray", "float32", [4, 3], [6, 2]]
    assert operand_signature(7) == ["int", "7"]
    assert operand_signature(True) == ["bool", "True"]
    assert operand_signature(0.5) == ["float"]
    assert operand_signature(0.5, by_value=True) == ["float", "0.5"]
    grid_a = key_parts(operands={"x": a}, grid=(1,))
    grid_b = key_parts(operands={"x": a}, grid=(2,))
    strided = key_parts(operands={"x": t})
    contiguous = key_parts(operands={"x": np.zeros((4, 3), dtype=np.float32)})
    assert tuning_key(grid_a) != tuning_key(grid_b)
    assert tuning_key(strided) != tuning_key(contiguous)
    assert tuning_key(key_parts(operands={"x": a}, source="v1")) != \
        tuning_key(key_parts(operands={"x": a}, source="v2"))


def test_unusable_candidates_are_skipped_with_reasons(cache):
    kernel = FakeKernel({64: 1e-3, 128: 2e-3, 256: 3e-3}, fail={
        64: ScheduleError("num_simdgroups=2", "no SIMD-group grid")})
    result = tune(kernel, cache)
    assert result.config == CANDIDATES[1]
    assert result.unusable == {CANDIDATES[0].key(): "ScheduleError: cannot honour "
                                                    "num_simdgroups=2: no SIMD-group grid"}
    entry = json.loads(cache.path(result.key).read_text())
    assert entry["unusable"] == result.unusable
    assert tune(FakeKernel({}), cache).unusable == result.unusable  # kept with the cached winner


def test_other_errors_propagate_and_all_unusable_raises(cache):
    with pytest.raises(RuntimeError, match="boom"):
        tune(FakeKernel({64: 1e-3}, fail={64: RuntimeError("boom")}), cache)
    err = ScheduleError("vector_width=4", "misaligned")
    with pytest.raises(TuningError, match="no usable candidate: Config\\(BLOCK=64,NUM_SG=2\\): "
                                          "ScheduleError: cannot honour vector_width=4"):
        tune(FakeKernel({}, fail={64: err, 128: err, 256: err}), cache)

    class CompilationError(Exception):
        pass
    result = tune(FakeKernel({128: 1e-3, 256: 2e-3}, fail={64: CompilationError("line 3")}), cache,
                  unusable=(ScheduleError, CompilationError))
    assert result.config == CANDIDATES[1]
    assert result.unusable[CANDIDATES[0].key()] == "CompilationError: line 3"


def test_validate_hook_rejects_wrong_candidates_before_timing(cache):
    seen = []

    def validate(outputs, reference):
        seen.append(1)
        np.testing.assert_allclose(np.array(outputs), np.array(reference), rtol=3e-4, atol=3e-5)

    kernel = FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3}, wrong={128})
    with pytest.warns(UserWarning, match=r"candidates compute different outputs - "
                                         r"Config\(BLOCK=128,NUM_SG=4\) differ"):
        result = tune(kernel, cache, validate=validate)
    assert result.config == CANDIDATES[2]
    assert result.unusable[CANDIDATES[1].key()].startswith("validation failed:")
    assert kernel.calls.count(128) == 1  # never timed
    assert len(seen) == 2  # every candidate after the reference
    with pytest.warns(UserWarning, match="candidates compute different outputs"):
        falsy = tune(FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3}),
                     TuningCache(cache.directory / "b"), validate=lambda out, ref: False)
    assert falsy.config == CANDIDATES[0]


def test_corrupt_entry_is_ignored_with_a_warning(cache):
    first = tune(FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3}), cache)
    for garbage in ("{not json", json.dumps({"key": "other", "winner": "x", "format": 1}),
                    json.dumps([1, 2]),
                    "[" * 100000):   # (past the parser's depth: a RecursionError escaped)
        cache.path(first.key).write_text(garbage)
        kernel = FakeKernel({64: 1e-3, 128: 3e-3, 256: 2e-3})
        with pytest.warns(UserWarning, match="ignoring corrupt tuning cache entry"):
            result = tune(kernel, cache)
        assert not result.from_cache and result.config == CANDIDATES[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert tune(FakeKernel({}), cache).from_cache  # rewritten entry is valid


def test_a_winner_that_is_not_a_candidate_is_measured_again_with_a_warning(cache):
    first = tune(FakeKernel({64: 3e-3, 128: 1e-3, 256: 2e-3}), cache)
    entry = json.loads(cache.path(first.key).read_text())
    cache.path(first.key).write_text(json.dumps({**entry, "winner": "BLOCK=4096"}))
    kernel = FakeKernel({64: 1e-3, 128: 3e-3, 256: 2e-3})
    with pytest.warns(UserWarning, match="winner 'BLOCK=4096' is not one of the candidates"):
        result = tune(kernel, cache)
    assert not result.from_cache and result.config == CANDIDATES[0] and kernel.calls


def test_concurrent_writers_leave_a_valid_entry(cache):
    entry = {"format": 1, "key": "k" * 40, "winner": CANDIDATES[0].key(), "timings": {}}
    errors = []

    def write(i):
        try:
            for _ in range(20):
                cache.store("k" * 40, {**entry, "timings": {"writer": i}})
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.load("k" * 40)["timings"]["writer"] in range(4)
    assert [p.name for p in cache.directory.iterdir() if p.name.startswith(".tmp-")] == []


SECOND_PROCESS = r"""
import sys
import mlx.core as mx
from metile.runtime.tuning import autotune, key_parts
from metile.schedule import Config

def run(config):
    raise SystemExit("measured again: " + config.key())

x = mx.zeros((64, 32), dtype=getattr(mx, sys.argv[1]))
parts = key_parts(operands={"x": x}, overrides={"RELAXED_PRECISION": False}, grid=(4, 1, 1),
                  source="s", compiler="c", target="cpu_msl")
cands = [Config(num_simdgroups=2, BLOCK=64), Config(num_simdgroups=4, BLOCK=128)]
result = autotune(cands, run, parts)
print(result.config.key(), result.from_cache)
"""


def test_second_process_reuses_the_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    x = mx.zeros((64, 32), dtype=mx.float32)
    p = key_parts(operands={"x": x}, overrides={"RELAXED_PRECISION": False}, grid=(4, 1, 1),
                  source="s", compiler="c", target="cpu_msl")
    cands = [Config(num_simdgroups=2, BLOCK=64), Config(num_simdgroups=4, BLOCK=128)]
    kernel = FakeKernel({64: 2e-3, 128: 1e-3})
    first = autotune(cands, kernel, p, clock=kernel.clock, warmup=0, reps=3, launches=1)
    assert first.config == cands[1]
    assert (tmp_path / "tuning" / f"{first.key}.json").exists()

    env = {**os.environ, "METILE_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", SECOND_PROCESS, "float32"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{cands[1].key()} True"
    # another dtype in the second process must measure (and here, refuses to)
    out = subprocess.run([sys.executable, "-c", SECOND_PROCESS, "float16"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "measured again: Config(BLOCK=64,NUM_SG=2)" in out.stderr


def test_autotune_argument_checks(cache):
    with pytest.raises(ValueError, match="at least one candidate"):
        autotune([], FakeKernel({}), parts(), cache=cache)
    with pytest.raises(ValueError, match="duplicates"):
        autotune([CANDIDATES[0], Config(BLOCK=64, NUM_SG=2)], FakeKernel({}), parts(), cache=cache)


def test_a_directory_at_an_entry_is_named_not_the_folder(cache):
    # (the warning said the tuning folder could not be written, which it could)
    entry = {"format": 1, "key": "k" * 40, "winner": CANDIDATES[0].key(), "timings": {}}
    cache.directory.mkdir(parents=True, exist_ok=True)
    cache.path("k" * 40).mkdir()
    with pytest.warns(RuntimeWarning, match=r"cannot write the tuning cache entry .*: a "
                                            r"directory is there"):
        assert cache.store("k" * 40, entry) is False



def test_a_directory_at_an_entrys_lock_is_named_not_the_folder(cache):
    # (the warning blamed the tuning folder, "Is a directory", and said to point
    # METILE_CACHE_DIR elsewhere)
    entry = {"format": 1, "key": "k" * 40, "winner": CANDIDATES[0].key(), "timings": {}}
    cache.directory.mkdir(parents=True, exist_ok=True)
    (cache.directory / ("k" * 40 + ".json.lock")).mkdir()
    with pytest.warns(RuntimeWarning, match=r"cannot write the tuning cache entry .*: a "
                                            r"directory is there \(.*\.json\.lock\)"):
        assert cache.store("k" * 40, entry) is False

def test_a_cache_folder_that_cannot_be_entered_only_warns(cache, monkeypatch):
    # (a mode-000 folder, or another user's 0700 cache: the failed write's handler asked
    # Path.is_dir, which raised PermissionError out of the tuning call)
    import pathlib
    entry = {"format": 1, "key": "k" * 40, "winner": CANDIDATES[0].key(), "timings": {}}

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(type(cache), "_store", lambda self, key, entry: denied())
    monkeypatch.setattr(pathlib.Path, "is_dir", lambda self: denied())
    with pytest.warns(RuntimeWarning, match=r"Permission denied"):
        assert cache.store("k" * 40, entry) is False
