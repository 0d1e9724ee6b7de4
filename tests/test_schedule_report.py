"""ExecutionReport: the recorded JSON format, materialization checks, METILE_DEBUG=schedule."""

import json

import pytest

from metile.schedule import (REPORT_SCHEMA, TARGETS, AllocationReport, ExecutionReport,
                             KernelTraits, LoopReport, Schedule, ScheduleError, check_schema,
                             debug_dump, plan_schedule, validate_report)

# Field names of the recorded M5 report (seeds/m5-schedule-fusion-results.json), in order.
SEED_REPORT_FIELDS = ["plan", "passes", "loops", "allocations", "double_buffered",
                      "vectorized_loads", "epilogue_regions", "notes"]
SEED_PLAN_FIELDS = ["backend", "threadgroup_size", "simdgroup_grid", "tile_shape", "staging",
                    "vector_width", "double_buffer", "reasons", "cooperative_layout",
                    "outer_bounds_proven"]
SEED_LOOP_FIELDS = ["induction_variable", "kind", "lanes", "elements_per_lane", "iteration_step"]
# Fields added since (optional in REPORT_SCHEMA: recorded reports without them stay valid).
ADDED_REPORT_FIELDS = ["num_stages"]
ADDED_PLAN_FIELDS = ["num_stages", "program_order", "group_size"]


def gemm_report(**schedule):
    traits = KernelTraits("matmul", (64, 64, 16), operand_dtypes=("float32",) * 2,
                          accumulator_dtype="float32", extents_divisible=(True, True, None),
                          vector_aligned=True)
    plan = plan_schedule(traits, TARGETS["cpu_msl"], Schedule(**schedule))
    stage = AllocationReport("a_stage", "threadgroup", "float32", 64 * 16, 4096)
    stage_b = AllocationReport("b_stage", "threadgroup", "float32", 16 * 64, 4096)
    return ExecutionReport.build(
        plan, passes=["optimize_tile_schedules", "split_k_loop", "fold_constants"],
        loops=[LoopReport("k", "interior", 128, 4, 16), LoopReport("k", "remainder", 128, 1, 16)],
        allocations=[stage, stage_b], vectorized_loads=2, epilogue_regions=1)


def test_gemm_explain_field_by_field():
    report = gemm_report(vector_width=4)
    data = json.loads(report.explain())
    assert list(data) == SEED_REPORT_FIELDS + ADDED_REPORT_FIELDS
    assert list(data["plan"]) == SEED_PLAN_FIELDS + ADDED_PLAN_FIELDS
    assert [list(lp) for lp in data["loops"]] == [SEED_LOOP_FIELDS] * 2
    plan = data["plan"]
    assert (plan["backend"], plan["threadgroup_size"], plan["simdgroup_grid"],
            plan["tile_shape"], plan["staging"], plan["vector_width"], plan["double_buffer"],
            plan["outer_bounds_proven"]) == \
        ("simdgroup", [128, 1, 1], [2, 2], [64, 64, 16], "threadgroup", 4, None, True)
    assert data["passes"] == ["optimize_tile_schedules", "split_k_loop", "fold_constants"]
    assert data["loops"][0] == {"induction_variable": "k", "kind": "interior", "lanes": 128,
                                "elements_per_lane": 4, "iteration_step": 16}
    assert data["allocations"] == [
        {"name": "a_stage", "space": "threadgroup", "dtype": "float32", "elements": 1024,
         "bytes": 4096},
        {"name": "b_stage", "space": "threadgroup", "dtype": "float32", "elements": 1024,
         "bytes": 4096}]
    assert (data["double_buffered"], data["vectorized_loads"], data["epilogue_regions"]) == \
        (False, 2, 1)
    assert "No software double buffer was materialized." in data["notes"]
    assert "Lane ownership of matrix fragments is opaque and not reported." in data["notes"]
    assert report.threadgroup_bytes == 8192
    check_schema(data)
    validate_report(report, TARGETS["cpu_msl"].threadgroup_memory_bytes)


def test_elementwise_explain_field_by_field():
    plan = plan_schedule(KernelTraits("elementwise", (256,), lanes=256), TARGETS["cpu_msl"])
    report = ExecutionReport.build(plan, passes=["split_elementwise_loops", "fold_constants"])
    data = json.loads(report.explain())
    assert list(data) == SEED_REPORT_FIELDS + ADDED_REPORT_FIELDS
    assert list(data["plan"]) == SEED_PLAN_FIELDS + ADDED_PLAN_FIELDS
    assert data["plan"]["simdgroup_grid"] is None
    assert data["plan"]["cooperative_layout"] == "scalar lanes"
    assert (data["loops"], data["allocations"], data["double_buffered"],
            data["vectorized_loads"], data["epilogue_regions"]) == ([], [], False, 0, 0)
    assert not any("opaque" in n for n in data["notes"])
    check_schema(data)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("epilogue_regions"), "$: missing ['epilogue_regions']"),
    (lambda d: d.update(extra=1), "unexpected ['extra']"),
    (lambda d: d["plan"].update(backend="auto"), "$.plan.backend: 'auto' is not one of"),
    (lambda d: d["plan"].update(vector_width=2), "$.plan.vector_width: 2 is not one of"),
    (lambda d: d["plan"].update(threadgroup_size=[128, 1]), "$.plan.threadgroup_size: 2 items"),
    (lambda d: d["loops"][0].update(lanes="128"), "$.loops[0].lanes: expected integer"),
    (lambda d: d.update(double_buffered=1), "$.double_buffered: expected boolean"),
    (lambda d: d.update(vectorized_loads=True), "$.vectorized_loads: expected integer"),
    (lambda d: d["allocations"][0].pop("bytes"), "$.allocations[0]: missing ['bytes']"),
])
def test_schema_check_rejects_malformed_reports(mutate, message):
    data = gemm_report().to_dict()
    mutate(data)
    with pytest.raises(ValueError) as err:
        check_schema(data)
    assert message in str(err.value)


def test_schema_agrees_with_jsonschema_when_installed():
    jsonschema = pytest.importorskip("jsonschema")
    data = gemm_report().to_dict()
    jsonschema.validate(data, REPORT_SCHEMA)
    data["plan"]["staging"] = "auto"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, REPORT_SCHEMA)


def _with(report, **changes):
    from dataclasses import replace
    return replace(report, **changes)


def test_validate_report_catches_unmaterialized_requirements():
    required = gemm_report(double_buffer=True)
    with pytest.raises(ScheduleError, match="double_buffer=True: lowering did not materialize"):
        validate_report(required)
    validate_report(_with(required, double_buffered=True))
    prohibited = gemm_report(double_buffer=False)
    with pytest.raises(ScheduleError, match="double_buffer=False: lowering materialized"):
        validate_report(_with(prohibited, double_buffered=True))
    with pytest.raises(ScheduleError, match="vector_width=4: lowering emitted no 4-wide loads"):
        validate_report(_with(gemm_report(vector_width=4), vectorized_loads=0))
    with pytest.raises(ScheduleError, match="vector_width=1: lowering emitted 2 vector loads"):
        validate_report(gemm_report(vector_width=1))
    with pytest.raises(ScheduleError, match="staging='device': lowering allocated 8192 bytes"):
        validate_report(gemm_report(staging="device"))
    with pytest.raises(ScheduleError, match="use 8192 bytes of threadgroup memory; the target "
                                            "has 4096"):
        validate_report(gemm_report(), 4096)


def test_debug_dump(tmp_path, monkeypatch, capsys):
    report = gemm_report()
    monkeypatch.delenv("METILE_DEBUG", raising=False)
    assert debug_dump("gemm", report.plan, report, tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("METILE_DEBUG", "msl,schedule")
    path = debug_dump("my kernel/gemm", report.plan, report, tmp_path / "schedule")
    assert path.parent == tmp_path / "schedule" and path.name.startswith("my_kernel_gemm-")
    saved = json.loads(path.read_text())
    assert saved == {"kernel": "my kernel/gemm", "plan": report.plan.to_dict(),
                     "execution_report": report.to_dict()}
    out = capsys.readouterr().out
    assert out.startswith("// metile schedule my kernel/gemm\n")
    assert json.loads(out.split("\n", 1)[1]) == saved
    # default directory is debug_output/schedule under the working directory
    monkeypatch.chdir(tmp_path)
    path = debug_dump("plan_only", report.plan)
    assert path.resolve().parent == (tmp_path / "debug_output" / "schedule").resolve()
    assert json.loads(path.read_text())["execution_report"] is None


def test_debug_schedule_prints_for_a_kernel_from_the_disk_cache(tmp_path, monkeypatch, capsys):
    # (a warm compile cache skipped the dump: METILE_DEBUG=schedule printed and saved nothing)
    import subprocess
    import sys
    script = (
        "import mlx.core as mx, metile\n"
        "@metile.kernel\n"
        "def twice(X, Y, n, BLOCK: metile.constexpr):\n"
        "    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)\n"
        "    metile.store(Y + offs, metile.load(X + offs, mask=offs < n) * 2, mask=offs < n)\n"
        "mx.eval(twice[(4,)](mx.ones((1000,)), mx.zeros((1000,)), 1000, BLOCK=256))\n")
    env = {**__import__("os").environ, "METILE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("METILE_DISABLE_DISK_CACHE", None)
    (tmp_path / "twice.py").write_text(script)   # (a kernel's source must be a file)
    for run in ("cold", "warm"):
        work = tmp_path / run
        work.mkdir()
        out = subprocess.run([sys.executable, str(tmp_path / "twice.py")], cwd=work,
                             capture_output=True,
                             text=True, env={**env, "METILE_DEBUG": "schedule"}, check=True).stdout
        assert out.startswith("// metile schedule twice\n"), (run, out)
        assert len(list((work / "debug_output" / "schedule").glob("twice-*.json"))) == 1, run
