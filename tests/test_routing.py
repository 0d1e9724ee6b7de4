"""Measured routing of metile.ops (backend="auto"): decisions come from measurements
validated against MLX's composite, persist on disk, and never pick a slow or wrong
candidate.  Timing goes through an injected fake clock (no timed asserts)."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import metile
import metile.ops as ops
from metile.runtime import routing
from metile.settings import SettingError


@pytest.fixture(autouse=True)
def routing_cache(tmp_path, monkeypatch):
    """Each test records decisions in its own folder (compiled kernels stay shared)."""
    directory = tmp_path / "routing"
    monkeypatch.setattr(routing, "routing_dir", lambda: directory)
    monkeypatch.delenv("METILE_OPS_TUNE", raising=False)
    monkeypatch.delenv("METILE_OPS_TUNE_BUDGET_S", raising=False)
    routing.clear_memory()
    yield directory
    routing.clear_memory()


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def price(monkeypatch, clock, costs, wrong=(), fast=None):
    """Make each candidate advance `clock` by costs[name prefix] per call (costs["fast"]
    for the first metile candidate whose name `fast` accepts); candidates whose prefix is
    in `wrong` return a result off by one.  Returns the metile candidate names seen, in
    order (the set depends on the device: one portable tile on the CPU, several measured
    tiles on CUDA), and the fast one last when there is one."""
    real = ops._candidates
    seen = []
    chosen = []

    def priced(*args):
        out = []
        for c in real(*args):
            prefix = c.name.split(":")[0]
            if prefix != "mlx" and c.name not in seen:
                seen.append(c.name)
                if fast is not None and not chosen and fast(c.name):
                    chosen.append(c.name)
            key = "fast" if c.name in chosen else prefix

            def run(*operands, c=c, prefix=prefix, key=key):
                clock.now += costs[key]
                y = c.run(*operands)
                return y + 1 if prefix in wrong else y
            out.append(routing.Candidate(c.name, run))
        return out

    monkeypatch.setattr(ops, "_candidates", priced)
    return seen, chosen


def config_of(name):
    """The configuration a candidate name spells ("metile:BLOCK_M=64,...,TRANSPOSE_B=True")."""
    pairs = (item.split("=") for item in name.split(":", 1)[1].split(","))
    return {k: True if v == "True" else int(v) for k, v in pairs}


def operands(rng, m=5, k=33, n=20):
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32))
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    b = mx.array(rng.standard_normal((n,)).astype(np.float32))
    return x, w, b


def reference(x, w, b):
    z = np.array(x).astype(np.float64) @ np.array(w).astype(np.float64).T + np.array(b)
    return np.maximum(z, 0)


def test_first_call_uses_the_cost_model_and_measures_nothing(rng, routing_cache):
    x, w, b = operands(rng)
    y = ops.linear(x, w, b, "relu")
    np.testing.assert_allclose(np.array(y), reference(x, w, b), rtol=3e-4, atol=3e-5)
    info = json.loads(ops.explain_linear(x, w, b, "relu"))
    assert info["path"] == "mlx_composite"
    assert info["route"]["source"] == "cost_model" and info["route"]["timings_us"] == {}
    assert "cost model (no measurement recorded)" in info["reason"]
    assert not routing_cache.exists()


def test_slower_metile_candidate_is_not_chosen(rng, monkeypatch):
    clock = FakeClock()
    names, _ = price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, b = operands(rng)
    decision = ops.tune_linear(x, w, b, "relu", budget_s=0.01, clock=clock)
    assert decision["winner"] == "mlx" and decision["source"] == "measured"
    assert names and decision["timings_us"] == {"mlx": 1000.0, **{n: 5000.0 for n in names}}
    info = json.loads(ops.explain_linear(x, w, b, "relu"))
    assert info["path"] == "mlx_composite" and info["route"]["source"] == "cache"
    assert "no metile candidate beat mlx (1000.0 us per call) by 3%" in info["reason"]
    assert info["route"]["timings_us"] == decision["timings_us"]


def test_faster_metile_candidate_is_chosen_and_runs(rng, monkeypatch):
    clock = FakeClock()
    x, w, b = operands(rng)
    # linear reads the weight as stored: the transposed-B kernel, named as such (the
    # portable tile on the CPU; on CUDA the row-major kernels are candidates too)
    _, chosen = price(monkeypatch, clock, {"mlx": 1e-3, "metile": 6e-4, "fast": 4e-4},
                      fast=lambda name: name.endswith("TRANSPOSE_B=True"))
    decision = ops.tune_linear(x, w, b, "relu", budget_s=0.01, clock=clock)
    name, = chosen
    assert decision["winner"] == name
    assert decision["reason"] == f"measured: {name} 400.0 us vs mlx 1000.0 us per call"
    info = json.loads(ops.explain_linear(x, w, b, "relu"))
    assert info["path"] == "metile_kernel" and info["config"] == config_of(name)
    assert info["route"]["timings_us"][name] == 400.0
    np.testing.assert_allclose(np.array(ops.linear(x, w, b, "relu")), reference(x, w, b),
                               rtol=3e-4, atol=3e-5)


def test_margin_keeps_mlx_when_the_kernel_is_barely_faster(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 0.98e-3})
    x, w, _ = operands(rng)
    assert ops.tune_matmul(x, w.T, budget_s=0.01, clock=clock)["winner"] == "mlx"


def test_candidate_failing_validation_is_never_chosen(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 1e-5}, wrong={"metile"})
    x, w, b = operands(rng)
    decision = ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)
    assert decision["winner"] == "mlx"
    assert decision["unusable"]
    for name, why in decision["unusable"].items():
        assert name.startswith("metile:") and why.startswith("validation against mlx failed: max error")
    assert list(decision["timings_us"]) == ["mlx"]



def test_a_decision_naming_a_candidate_that_failed_validation_is_ignored(rng, monkeypatch):
    # (a decision file whose winner is a candidate it lists as failing validation - only an
    # edited or damaged file says so - was followed: the wrong kernel ran)
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 1e-5}, wrong={"metile"})
    x, w, b = operands(rng)
    decision = ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)
    path = Path(decision["cache_file"])
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "winner": next(iter(decision["unusable"]))}))
    routing.clear_memory()
    with pytest.warns(UserWarning, match="is listed as unusable"):
        info = json.loads(ops.explain_linear(x, w, b))
    assert info["path"] == "mlx_composite" and info["route"]["source"] == "cost_model"

def test_a_sleeping_candidate_loses_on_the_real_clock():
    a = mx.ones((8, 8))

    def sleepy(x):
        time.sleep(0.02)
        return x @ x

    calls = []

    def raising(x):
        calls.append(1)
        raise RuntimeError("cannot launch")

    decision = routing.measure(
        "k" * 40, {}, [routing.Candidate("mlx", lambda x: x @ x),
                       routing.Candidate("metile:sleepy", sleepy),
                       routing.Candidate("metile:broken", raising)],
        [a], lambda out, ref: None, budget_s=0.01)
    assert decision.winner == "mlx"
    assert decision.timings["metile:sleepy"] >= 0.02 > decision.timings["mlx"]
    assert decision.unusable == {"metile:broken": "RuntimeError: cannot launch"}
    assert calls == [1]   # a failing candidate is not timed


def test_reference_must_come_first():
    with pytest.raises(ValueError, match="must start with the reference 'mlx'"):
        routing.measure("k", {}, [routing.Candidate("metile:x", lambda: None)], [],
                        lambda o, r: None, budget_s=0.01)


def test_rows_share_a_power_of_two_bucket(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    _, w, _ = operands(rng)
    ops.tune_matmul(mx.ones((5, 33)), w.T, budget_s=0.01, clock=clock)
    for m, source in ((8, "cache"), (5, "cache"), (9, "cost_model"), (4, "cost_model")):
        info = json.loads(ops.explain_matmul(mx.ones((m, 33)), w.T))
        assert info["route"]["source"] == source, m
    assert [ops.m_bucket(m) for m in (0, 1, 2, 3, 5, 8, 9, 1000)] == [1, 1, 2, 4, 8, 8, 16, 1024]


def test_decisions_persist_across_processes(tmp_path):
    # Process 1 measures (fake clock, fake costs under the real candidate names);
    # process 2 reads the decision from the shared METILE_CACHE_DIR.
    first = textwrap.dedent("""
        import json, mlx.core as mx, metile.ops as ops
        from metile.runtime import routing
        now = [0.0]
        real = ops._candidates
        def priced(*args):
            out = []
            for c in real(*args):
                cost = 1e-3 if c.name == "mlx" else 3e-3
                def run(*xs, c=c, cost=cost):
                    now[0] += cost
                    return ops._linear_mlx(xs[0], xs[1], None, "silu", 0.01)
                out.append(routing.Candidate(c.name, run))
            return out
        ops._candidates = priced
        x, w = mx.ones((7, 16)), mx.ones((24, 16)) / 16
        print(json.dumps(ops.tune_linear(x, w, activation="silu", budget_s=0.01,
                                         clock=lambda: now[0])))
    """)
    second = textwrap.dedent("""
        import json, mlx.core as mx, metile.ops as ops
        x, w = mx.ones((6, 16)), mx.ones((24, 16)) / 16
        print(json.dumps(json.loads(ops.explain_linear(x, w, activation="silu"))["route"]))
    """)
    env = {**os.environ, "METILE_CACHE_DIR": str(tmp_path / "shared")}
    env.pop("METILE_OPS_TUNE", None)
    out = []
    for script in (first, second):
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    measured, cached = out
    assert measured["source"] == "measured" and cached["source"] == "cache"
    assert cached["winner"] == measured["winner"] == "mlx"
    assert cached["timings_us"] == measured["timings_us"] and len(cached["timings_us"]) >= 2
    assert cached["cache_file"] == measured["cache_file"]
    assert Path(cached["cache_file"]).parent == tmp_path / "shared" / "routing"


def test_corrupt_decision_file_is_ignored_with_a_warning_and_measured_again(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, b = operands(rng)
    path = Path(ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)["cache_file"])
    path.write_text('{"winner": "metile:BLOCK_M=64,BLOCK_N')
    routing.clear_memory()
    with pytest.warns(UserWarning, match=f"ignoring corrupt tuning cache entry {path}"):
        info = json.loads(ops.explain_linear(x, w, b))
    assert info["path"] == "mlx_composite" and info["route"]["source"] == "cost_model"
    routing.clear_memory()
    with pytest.warns(UserWarning, match="corrupt"):
        again = ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)
    assert again["source"] == "measured" and json.loads(path.read_text())["winner"] == "mlx"


@pytest.mark.parametrize("damage", [b"\xeb\xff not utf-8", "unusable", "timings"])
def test_a_damaged_decision_file_is_ignored_with_a_warning(rng, monkeypatch, damage):
    # (found by a hostile test: bytes that are not UTF-8, an `unusable` list or a timing that
    # is not a number made ops.linear / explain raise instead of measuring again)
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, b = operands(rng)
    path = Path(ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)["cache_file"])
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    else:
        entry = json.loads(path.read_text())
        entry[damage] = [1, 2] if damage == "unusable" else {"mlx": "x"}
        path.write_text(json.dumps(entry))
    routing.clear_memory()
    with pytest.warns(UserWarning, match="ignoring (unreadable|corrupt|the malformed)"):
        info = json.loads(ops.explain_linear(x, w, b))
    assert info["route"]["source"] == "cost_model"
    routing.clear_memory()
    with pytest.warns(UserWarning):
        out = ops.linear(x, w, b)
    np.testing.assert_allclose(np.array(out), np.array(x) @ np.array(w).T + np.array(b),
                               rtol=1e-4, atol=1e-4)


def test_tuning_scope_measures_eager_calls_but_not_traced_ones(rng, monkeypatch, routing_cache):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, b = operands(rng)
    with ops.tuning(budget_s=0.01, clock=clock):
        y = mx.compile(lambda x: ops.linear(x, w, b, "relu"))(x)   # traced: cost model
        assert not routing_cache.exists()
        np.testing.assert_allclose(np.array(y), reference(x, w, b), rtol=3e-4, atol=3e-5)
        ops.linear(x, w, b, "relu")                                    # eager: measured
    assert json.loads(ops.explain_linear(x, w, b, "relu"))["route"]["source"] == "cache"
    with pytest.raises(ValueError, match="budget_s must be a positive, finite number of "
                                         "seconds, got 0"):
        with ops.tuning(budget_s=0):
            pass


def test_budgets_of_every_positive_finite_size_measure(rng, monkeypatch):
    # (an infinite budget, or one near the float maximum, failed inside the measurement with
    # "cannot convert float infinity to integer"; a NumPy float was refused)
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, _ = operands(rng)
    for budget in (1e308, np.float32(0.01)):
        decision = ops.tune_matmul(x, w.T, budget_s=budget, force=True, clock=clock)
        assert decision["winner"] == "mlx" and decision["source"] == "measured"
    for budget in (float("inf"), float("nan"), np.True_):
        with pytest.raises(ValueError, match="budget_s must be a positive, finite number"):
            ops.tune_matmul(x, w.T, budget_s=budget, force=True, clock=clock)


def test_environment_switch_measures_the_first_eager_call(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    monkeypatch.setattr(routing, "scope_clock", lambda: clock)
    monkeypatch.setenv("METILE_OPS_TUNE", "1")
    monkeypatch.setenv("METILE_OPS_TUNE_BUDGET_S", "0.01")
    x, w, _ = operands(rng)
    ops.matmul(x, w.T, epilogue="gelu_tanh")
    assert json.loads(ops.explain_matmul(x, w.T, epilogue="gelu_tanh"))["route"]["source"] == "cache"
    monkeypatch.delenv("METILE_OPS_TUNE")     # the switch is not part of the decision's key
    routing.clear_memory()
    assert json.loads(ops.explain_matmul(x, w.T, epilogue="gelu_tanh"))["route"]["source"] == "cache"
    monkeypatch.setenv("METILE_OPS_TUNE", "1")
    for raw in ("soon", "inf", "nan", "-1"):   # (inf passed the check, then overflowed)
        monkeypatch.setenv("METILE_OPS_TUNE_BUDGET_S", raw)
        with pytest.raises(SettingError, match=f"METILE_OPS_TUNE_BUDGET_S='{raw}' is not a "
                                               f"positive, finite"):
            ops.matmul(x, w.T, epilogue="relu")


def test_recorded_kernel_route_inside_compile_and_grad(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 4e-4})
    x, w, b = operands(rng)
    assert ops.tune_linear(x, w, b, "relu", budget_s=0.01, clock=clock)["winner"] != "mlx"
    expected = reference(x, w, b)
    y = mx.compile(lambda x, w, b: ops.linear(x, w, b, "relu"))(x, w, b)
    np.testing.assert_allclose(np.array(y), expected, rtol=3e-4, atol=3e-5)

    def loss(x, w, b):
        return (ops.linear(x, w, b, "relu") ** 2).sum()

    for fn in (mx.grad(loss, argnums=(0, 1, 2)), mx.compile(mx.grad(loss, argnums=(0, 1, 2)))):
        dx, dw, db = fn(x, w, b)
        g = 2 * expected
        np.testing.assert_allclose(np.array(dx), g @ np.array(w), rtol=3e-4, atol=3e-4)
        np.testing.assert_allclose(np.array(dw), g.T @ np.array(x), rtol=3e-4, atol=3e-4)
        np.testing.assert_allclose(np.array(db), g.sum(0), rtol=3e-4, atol=3e-4)


def test_grad_without_a_decision_uses_the_cost_model(rng, routing_cache):
    x, w, b = operands(rng)
    dx = mx.grad(lambda x: ops.linear(x, w, b, "silu").sum())(x)
    z = np.array(x).astype(np.float64) @ np.array(w).T + np.array(b)
    s = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(np.array(dx), (s * (1 + z * (1 - s))) @ np.array(w),
                               rtol=3e-4, atol=3e-4)
    assert not routing_cache.exists()


def test_nn_linear_auto_follows_the_decision(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 4e-4})
    layer = metile.nn.Linear(33, 20, activation="relu")
    x, _, _ = operands(rng)
    assert json.loads(layer.explain(x))["path"] == "mlx_composite"
    ops.tune_linear(x, layer.weight, layer.bias, "relu", budget_s=0.01, clock=clock)
    assert json.loads(layer.explain(x))["path"] == "metile_kernel"
    np.testing.assert_allclose(np.array(layer(x)), reference(x, layer.weight, layer.bias),
                               rtol=3e-4, atol=3e-5)


def test_numerics_environment_selects_its_own_decision(rng, monkeypatch):
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    monkeypatch.delenv("MLX_ENABLE_TF32", raising=False)
    x, w, _ = operands(rng)
    ops.tune_matmul(x, w.T, budget_s=0.01, clock=clock)
    assert json.loads(ops.explain_matmul(x, w.T))["route"]["source"] == "cache"
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")     # strict FP32 may change which path wins
    assert json.loads(ops.explain_matmul(x, w.T))["route"]["source"] == "cost_model"
    monkeypatch.delenv("MLX_ENABLE_TF32")
    assert json.loads(ops.explain_matmul(x, w.T))["route"]["source"] == "cache"


# -- a second hostile test (twenty-eighth session) ---------------------------------------------

def test_a_decision_naming_an_unknown_candidate_warns_and_is_measured_again(rng, monkeypatch):
    # (a hand-edited or older file naming a tile this version lacks was ignored in silence,
    # explain said "no measurement recorded", and tuning() never replaced it)
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, b = operands(rng)
    path = Path(ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)["cache_file"])
    entry = json.loads(path.read_text())
    entry["winner"] = "metile:BLOCK_M=3"
    path.write_text(json.dumps(entry))
    routing.clear_memory()
    with pytest.warns(UserWarning, match=r"names 'metile:BLOCK_M=3', which is not one of this "
                                         r"version's candidates; it is measured again"):
        with routing.tuning_scope(0.01, clock):
            mx.eval(ops.linear(x, w, b))
    assert json.loads(path.read_text())["winner"] == "mlx"


def test_an_unwritable_cache_names_no_file(rng, monkeypatch, tmp_path):
    # (explain said source "cache" with a cache_file that did not exist)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setattr(routing, "routing_dir", lambda: blocker / "routing")
    routing.clear_memory()
    clock = FakeClock()
    price(monkeypatch, clock, {"mlx": 1e-3, "metile": 5e-3})
    x, w, b = operands(rng)
    with pytest.warns(RuntimeWarning, match="cannot write the cache directory"):
        tuned = ops.tune_linear(x, w, b, budget_s=0.01, clock=clock)
    assert tuned["cache_file"] is None
    route = json.loads(ops.explain_linear(x, w, b))["route"]
    assert route["cache_file"] is None and "unwritable" in route["source"]


@pytest.mark.parametrize("backend", ["auto", "mlx"])
def test_integer_and_float64_operands_run_mlx_composite(rng, backend):
    # (refused even under backend="mlx", where MLX's addmm / matmul take them)
    xi = mx.array(rng.integers(-3, 3, (4, 8)).astype(np.int32))
    w = mx.array(rng.standard_normal((5, 8)).astype(np.float32))
    b = mx.array(rng.standard_normal((5,)).astype(np.float32))
    got = ops.linear(xi, w, b, "relu", backend=backend)
    np.testing.assert_array_equal(np.array(got), np.array(mx.maximum(mx.addmm(b, xi, w.T), 0)))
    a64 = mx.array(rng.standard_normal((4, 8)), mx.float64)
    b64 = mx.array(rng.standard_normal((8, 5)), mx.float64)
    with mx.stream(mx.cpu):
        got = ops.matmul(a64, b64, backend=backend)
        assert got.dtype == mx.float64
        np.testing.assert_allclose(np.array(got), np.array(a64) @ np.array(b64), rtol=1e-12)
        got = ops.gated_mlp(a64, b64.T, b64.T, backend=backend)
        assert got.dtype == mx.float64
    with pytest.raises(TypeError, match="has dtype mlx.core.int32"):
        ops.linear(xi, w, b, backend="metile")


def test_linear_layer_explains_what_it_runs_for_another_dtype(rng):
    # (explain said the kernel runs where __call__ runs MLX's composite)
    import metile.nn as mnn
    layer = mnn.Linear(8, 4, activation="relu", backend="metile")
    x16 = mx.array(rng.standard_normal((2, 8)).astype(np.float16))
    info = json.loads(layer.explain(x16))
    assert info["path"] == "mlx_composite" and "float16" in info["reason"]
    assert json.loads(layer.explain(mx.ones((2, 8), mx.int32)))["path"] == "mlx_composite"
