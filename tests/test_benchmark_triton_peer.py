"""The Triton peer's pure-Python parts (argument handling, the merge into
schedule_fusion's JSON); the kernel itself runs only on the GPU machine."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.compiler import triton_peer as tp

ROOT = Path(__file__).resolve().parents[1]


def test_shapes_parse_and_bad_ones_say_why(capsys):
    assert tp.parse_shape("512x4096X11008") == (512, 4096, 11008)
    with pytest.raises(SystemExit):
        tp.parser().parse_args(["--shapes", "512x4096"])
    assert "shape '512x4096' is not MxNxK" in capsys.readouterr().err
    with pytest.raises(Exception, match="non-positive"):
        tp.parse_shape("0x4x4")


def args(**kw):
    base = {"merge": "m.json", "output": None, "sizes": None, "shapes": [], "dtype": None}
    return SimpleNamespace(**{**base, **kw})


def test_dtype_and_sizes_come_from_the_metile_report():
    metile = {"configuration": {"dtype": "bfloat16", "sizes": [1024, 4096]}}
    a = args(shapes=[(16, 4096, 4096)])
    assert tp.resolve_arguments(a, metile) == [(1024,) * 3, (4096,) * 3, (16, 4096, 4096)]
    assert a.dtype == "bfloat16"
    a = args(sizes=[8, 8], dtype="float16")
    assert tp.resolve_arguments(a, None) == [(8, 8, 8)]
    with pytest.raises(SystemExit, match="disagrees with m.json, measured in bfloat16"):
        tp.resolve_arguments(args(dtype="float16"), metile)


def test_missing_or_corrupt_merge_file_is_reported_not_raised(tmp_path):
    assert tp.load_merge(str(tmp_path / "none.json"))[1].endswith("does not exist")
    (tmp_path / "bad.json").write_text("{truncated")
    data, problem = tp.load_merge(str(tmp_path / "bad.json"))
    assert data is None and "not readable JSON" in problem
    (tmp_path / "list.json").write_text("[1]")
    assert "JSON list, not an object" in tp.load_merge(str(tmp_path / "list.json"))[1]
    a = args(merge=str(tmp_path / "bad.json"))
    assert tp.output_path(a, problem) == str(tmp_path / "bad.json") + ".triton.json"
    a.output = "new.json"
    assert tp.output_path(a, problem) == "new.json"
    assert tp.output_path(a, None) == a.merge


def test_merge_keeps_the_metile_report_and_the_table_pairs_rows():
    metile = {"cases": [{"shape": [64, 64, 64], "mlx_pair_us": {"fused": 12.5, "mlx_compile": 10.0}}],
              "device": "NVIDIA H200"}
    case = {"us": 8.0, "tflops": 0.07, "torch_us": 9.0, "error": {"relative_frobenius": 1e-4},
            "best_config": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8,
                            "num_warps": 4, "num_stages": 5}}
    section = {"cases": {"64x64x64": case, "16x64x64": {"error": {"relative_frobenius": 2e-4}}}}
    report = tp.merge_report(metile, section, {"triton": "3.6.0"})
    assert report["cases"] == metile["cases"] and report["device"] == "NVIDIA H200"
    assert report["triton"] is section and report["triton_versions"] == {"triton": "3.6.0"}
    assert "triton" not in metile
    lines = tp.table(section, metile).splitlines()
    assert lines[1].split() == ["64x64x64", "8.0", "0.1", "9.0", "12.5", "10.0", "1.00e-04",
                                "64x64x32", "w4", "s5"]
    assert lines[2].split() == ["16x64x64", "-", "-", "-", "-", "-", "2.00e-04", "-"]


def test_launch_count_input_sets_and_shared_memory_budget():
    assert tp.launches_for(1e-3, 25.0) == 25
    assert tp.launches_for(1.0, 25.0) == 3 and tp.launches_for(1e-9, 25.0) == 5000
    assert tp.input_sets_for(6 << 20, 50 << 20) == 3 and tp.input_sets_for(400 << 20, 50 << 20) == 1
    assert tp.fits_shared_memory(128, 256, 64, 3, 2)  # 144 KiB
    assert not tp.fits_shared_memory(128, 256, 64, 3, 4)  # 288 KiB


def test_module_imports_without_torch_or_triton():
    # --help must work where neither is installed (this CPU machine)
    run = subprocess.run([sys.executable, "-m", "benchmarks.compiler.triton_peer", "--help"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and "--merge" in run.stdout, run.stderr
