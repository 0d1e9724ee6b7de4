"""The benchmark scripts still run and report what they measured (tiny sizes; the
numbers that matter come from the devices, see benchmarks/results/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_schedule_fusion_smoke(tmp_path):
    out = tmp_path / "fusion.json"
    env = {**os.environ, "MLX_ENABLE_TF32": "0"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.compiler.schedule_fusion", "--sizes", "32",
                          "--rounds", "1", "--target-ms", "1", "--double-buffer", "on",
                          "--output", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["configuration"]["schedule"].endswith("double_buffer=True)")
    (case,) = report["cases"]
    # every variant passed the benchmark's own NumPy gate (rtol=3e-4, atol=3e-5)
    assert case["shape"] == [32, 32, 32] and "tolerance_failures" not in case
    assert set(case["max_absolute_error"]) == {"metile_fused", "metile_two_launches", "mlx_compile"}
    for pair in ("fusion_pair_us", "mlx_pair_us", "schedule_pair_us"):
        assert all(v > 0 for k, v in case[pair].items() if k != "samples")
    for pair, names in (("fusion_pair_us", ("fused", "two_launches")), ("mlx_pair_us", ("fused", "mlx_compile"))):
        samples = case[pair]["samples"]   # one round: each median is its one sample
        assert sorted(samples) == sorted(names) and all(len(samples[n]) == 1 for n in names)
        assert all(samples[n][0] == case[pair][n] for n in names)
    assert case["execution_reports"]["fused"]["double_buffered"] is True


def test_schedule_fusion_refuses_tf32():
    env = {k: v for k, v in os.environ.items() if k != "MLX_ENABLE_TF32"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.compiler.schedule_fusion", "--sizes", "32"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "set MLX_ENABLE_TF32=0 before starting Python" in run.stderr


@pytest.mark.parametrize("args,message", [
    (["--rounds", "0"], "argument --rounds: must be a positive int, got 0"),
    (["--shapes", "8x8", "--output", "/nonexistent-dir/out.json"],
     "argument --output: the directory /nonexistent-dir does not exist"),
    (["--target-ms", "-1"], "argument --target-ms: must be a positive number, got -1"),
])
def test_bad_benchmark_arguments_are_refused_before_the_run(args, message):
    # (--rounds 0 wrote NaN ratios and exited 0; an unwritable --output failed after the run)
    run = subprocess.run([sys.executable, "-m", "benchmarks.model_ops", *args], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_reports_are_strict_json(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import write_report
    write_report(str(tmp_path / "r.json"), {"ratio": float("nan"), "times": [1.0, float("inf")]})
    assert json.loads((tmp_path / "r.json").read_text(),
                      parse_constant=lambda c: pytest.fail(c)) == {"ratio": None,
                                                                   "times": [1.0, None]}


@pytest.mark.parametrize("command,message", [
    (["-m", "benchmarks.regression.paired_regression", "--baseline-root", "/nonexistent"],
     "--baseline-root /nonexistent is not a metile source tree (no python/metile)"),
    (["examples/decoder_block.py", "--tokens", "0"],
     "argument --tokens: must be a positive integer, got 0"),
])
def test_tools_refuse_bad_arguments_with_a_message(command, message):
    # (each ended in a traceback: a copy into the missing tree, a reshape of no tokens)
    run = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0 and message in run.stderr and "Traceback" not in run.stderr, \
        run.stderr


def test_triton_peer_without_torch_says_what_it_needs():
    pytest.importorskip("mlx")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here")
    except ImportError:
        pass
    run = subprocess.run([sys.executable, "-m", "benchmarks.compiler.triton_peer", "--shapes",
                          "8x8x8"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0 and "triton_peer needs torch and Triton" in run.stderr \
        and "Traceback" not in run.stderr, run.stderr


def test_attention_benchmark_chains_ops_over_their_own_caches(tmp_path):
    # --chain N: N attentions a compiled call, each over its own k and v, per-op times
    # (a lone decode op a call measured host time beside its 20-40 us kernel)
    out = tmp_path / "attention.json"
    # --cache-pad P: each k and v a cache allocated P keys ahead, its prefix attended
    run = subprocess.run([sys.executable, "-m", "benchmarks.attention", "--quick", "--chain", "2",
                          "--cache-pad", "24", "--output", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["chain"] == 2 and report["cache_pad"] == 24
    assert [c["name"] for c in report["cases"]] == ["prefill_causal", "decode"]
    for case in report["cases"]:
        assert case["chain"] == 2 and all(t > 0 for t in case["us_per_call"].values())
    bad = subprocess.run([sys.executable, "-m", "benchmarks.attention", "--quick",
                          "--cache-pad", "-1"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--cache-pad must be >= 0, got -1" in bad.stderr


@pytest.mark.parametrize("count", [2, 3, 5])
def test_rotation_puts_every_name_in_every_place(count):
    # (two names once kept one order in every round: rotated by the round, reversed every
    # other, the second always ran second - model_layers' metile variant measured 0.6x)
    from benchmarks.common import rotation
    names = [f"n{i}" for i in range(count)]
    rounds = [rotation(names, r) for r in range(2 * count)]
    for order in rounds:
        assert sorted(order) == names
    for place in range(count):
        assert {order[place] for order in rounds} == set(names)
    firsts = [order[0] for order in rounds]
    assert all(firsts.count(n) == 2 for n in names)


def test_model_layers_reports_what_auto_gives(tmp_path):
    # beside the forced kernel, the routed ops a user gets: measured once, then compiled
    out = tmp_path / "layers.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks.model_layers", "--quick",
                          "--dtypes", "float32", "--tokens", "16", "--layers", "mlp",
                          "--rounds", "1", "--output", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    (case,) = report["cases"]
    assert set(case["variants"]) == {"mlx", "metile", "auto"}
    assert case["variants"]["auto"]["within_tolerance"] and case["auto_tuning_s"] >= 0
    auto = [s for s in report["summary"]["mlp"] if s["variant"] == "auto"]
    assert report["targets"]["mlp_forward_auto"]["speedups"] == [s["speedup"] for s in auto]
