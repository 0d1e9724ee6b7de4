"""METILE_* settings: accepted spellings, and errors naming the variable."""

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import requires_msl_device
from metile import settings


def test_flags(monkeypatch):
    for raw, want in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False),
                      ("no", False)):
        monkeypatch.setenv("METILE_RACE_CHECK", raw)
        assert settings.flag("METILE_RACE_CHECK") is want
    monkeypatch.delenv("METILE_RACE_CHECK")
    assert settings.flag("METILE_RACE_CHECK") is False
    monkeypatch.setenv("METILE_RACE_CHECK", "yes please")
    with pytest.raises(metile.SettingError,
                       match=r"METILE_RACE_CHECK='yes please' is not a boolean; use 1 \(on\) or 0"):
        settings.flag("METILE_RACE_CHECK")


@requires_msl_device
def test_invalid_settings_fail_a_launch_by_name(monkeypatch):
    k = metile.metal_kernel(name="copy", input_names=["a"], output_names=["b"],
                            source="uint i = thread_position_in_grid.x; b[i] = a[i];")

    def run():
        return k(inputs=[mx.arange(4, dtype=mx.float32)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                 output_shapes=[(4,)], output_dtypes=[mx.float32])[0]

    np.testing.assert_array_equal(np.array(run()), np.arange(4))
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "always")
    with pytest.raises(metile.SettingError, match="METILE_MSL_BOUNDS_CHECK='always' is not a boolean"):
        run()
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "1")
    monkeypatch.setenv("METILE_LANE_ORDER", "backwards")
    with pytest.raises(metile.SettingError, match="METILE_LANE_ORDER='backwards' is not one of "
                                                  "forward, reverse, shuffle"):
        run()


def test_unknown_debug_word_warns(monkeypatch):
    monkeypatch.setenv("METILE_DEBUG", "schedule,tileir")
    with pytest.warns(UserWarning, match="METILE_DEBUG: unknown word.s. tileir; known: uniformity"):
        assert "schedule" in settings.debug_flags()


def test_nn_and_ops_after_plain_import():
    r = subprocess.run([sys.executable, "-c", "import metile; print(metile.nn.Linear(3, 2).weight.shape,"
                        " metile.ops.linear.__name__)"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(2, 3) linear"
