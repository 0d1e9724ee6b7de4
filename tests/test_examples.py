"""The examples run as a newcomer runs them (README's first command runs demo.py)
and check their own results against NumPy."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("example", ["demo.py", "histogram.py", "attention_block.py",
                                     "decoder_block.py"])
def test_example_runs_and_checks_itself(example, tmp_path):
    env = {**os.environ, "METILE_CACHE_DIR": str(tmp_path)}  # a fresh tuning cache, too
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("OK")
