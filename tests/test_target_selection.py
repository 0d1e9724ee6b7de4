"""Planning and running for a chosen target on any machine: METILE_TARGET and the
target= launch option; apple10 (M5-class) plans against the recorded M5 report."""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import requires_msl_device
from metile.compiler import resolve_backend
from metile.errors import CompilationError, LaunchError
from metile.schedule import TARGETS, check_schema
from metile.settings import SettingError
from metile_kernels.gemm import grid, matmul, matmul_epilogue

pytestmark = requires_msl_device

ALPHA, BETA, SLOPE = 1.25, -0.5, 0.1
TILE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16)
RECORDED = json.loads((Path(__file__).parent / "data" / "m5_schedule_fusion_recorded.json")
                      .read_text())
SEED = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "m5-schedule-fusion-results.json"


@metile.kernel
def affine_leaky(X, Y, alpha, beta, n, BLOCK: metile.constexpr):
    # the recorded report's separate pointwise epilogue (benchmarks/compiler/schedule_fusion.py)
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    scaled = metile.load(X + offs, mask=mask) * alpha + beta
    metile.store(Y + offs, metile.where(scaled > 0, scaled, scaled * SLOPE), mask=mask)


@pytest.fixture(autouse=True)
def _no_target_from_outside(monkeypatch):
    monkeypatch.delenv("METILE_TARGET", raising=False)
    monkeypatch.delenv("METILE_BACKEND", raising=False)


def operands(rng, m, n, k, dtype=np.float32):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    return a, b


def prepare_product(a, b, **options):
    m, k = a.shape
    n = b.shape[1]
    return matmul[grid(m, n, 64, 64)].prepare(mx.array(a), mx.array(b), mx.zeros((m, n)),
                                              m, n, k, **TILE, **options)


def prepare_fused(a, b, **options):
    m, k = a.shape
    n = b.shape[1]
    return matmul_epilogue[grid(m, n, 64, 64)].prepare(
        mx.array(a), mx.array(b), mx.zeros((m, n)), m, n, k, ALPHA, BETA,
        EPILOGUE="affine_leaky", NEGATIVE_SLOPE=SLOPE, **TILE, **options)


def fused_reference(a, b):
    z = ALPHA * (a.astype(np.float64) @ b.astype(np.float64)) + BETA
    return np.where(z > 0, z, SLOPE * z)


# -- selecting the target -------------------------------------------------------------------

@pytest.mark.parametrize("how", ["env", "option"])
def test_the_target_selects_the_plan(rng, monkeypatch, how):
    a, b = operands(rng, 64, 64, 64)

    def plan_for(target):
        if how == "env":
            monkeypatch.setenv("METILE_TARGET", target)
            return prepare_product(a, b, SCHEDULE=metile.Schedule())
        return prepare_product(a, b, SCHEDULE=metile.Schedule(), target=target)

    m3 = plan_for("apple9")
    assert m3.spec.target.name == "apple9"
    assert (m3.schedule_plan.backend, m3.schedule_plan.staging) == ("simdgroup", "threadgroup")
    m5 = plan_for("apple10")
    assert m5.spec.target.name == "apple10"
    assert (m5.schedule_plan.backend, m5.schedule_plan.staging) == ("tensor_ops", "device")
    assert m5.schedule_plan.cooperative_layout == \
        "native SDK cooperative_tensor (opaque lane ownership)"


def test_an_apple9_plan_runs_here(rng, monkeypatch):
    monkeypatch.setenv("METILE_TARGET", "apple9")
    a, b = operands(rng, 70, 50, 40)
    d = prepare_fused(a, b)
    assert d.spec.backend.native and d.spec.target.name == "apple9"
    np.testing.assert_allclose(np.array(d()), fused_reference(a, b), rtol=3e-4, atol=3e-5)


def test_an_apple10_simdgroup_plan_runs_here(rng):
    # The M5 plan with the path metile lowers today, executed by the CPU runtime.
    a, b = operands(rng, 70, 50, 40)
    d = prepare_fused(a, b, target="apple10", SCHEDULE=metile.Schedule(backend="simdgroup"))
    assert d.spec.target.name == "apple10" and d.schedule_plan.backend == "simdgroup"
    np.testing.assert_allclose(np.array(d()), fused_reference(a, b), rtol=3e-4, atol=3e-5)


def test_the_option_overrides_the_environment(rng, monkeypatch):
    monkeypatch.setenv("METILE_TARGET", "apple10")
    a, b = operands(rng, 64, 64, 64)
    d = prepare_product(a, b, target="apple9", SCHEDULE=metile.Schedule())
    assert d.spec.target.name == "apple9" and d.schedule_plan.backend == "simdgroup"


def test_unknown_target_names_list_the_known_ones(rng, monkeypatch):
    known = ", ".join(TARGETS)
    a, b = operands(rng, 64, 64, 64)
    with pytest.raises(LaunchError) as info:
        prepare_product(a, b, target="apple11")
    assert str(info.value) == f"unknown target 'apple11'; known: {known}"
    with pytest.raises(LaunchError, match="target must be a target name such as 'apple10', got int"):
        prepare_product(a, b, target=10)
    monkeypatch.setenv("METILE_TARGET", "m5")
    with pytest.raises(SettingError) as info:
        prepare_product(a, b)
    assert str(info.value) == f"METILE_TARGET='m5' is not a known target; known: {known}"


def test_a_target_of_the_other_language_is_an_error(rng, monkeypatch):
    with pytest.raises(LaunchError) as info:
        resolve_backend("cuda", target="apple10")
    assert str(info.value) == (
        "target='apple10' is a MSL target, but backend='cuda' emits CUDA; name a CUDA target "
        "(sm_80, sm_90, sm_100) or leave the language to the target")
    a, b = operands(rng, 64, 64, 64)
    with pytest.raises(LaunchError, match="target='sm_90' is a CUDA target, but backend='msl' "
                                          "emits MSL; name a MSL target \\(apple7, apple8, "
                                          "apple9, apple10, cpu_msl\\)"):
        prepare_product(a, b, backend="msl", target="sm_90")
    monkeypatch.setenv("METILE_BACKEND", "msl")
    monkeypatch.setenv("METILE_TARGET", "sm_90")
    with pytest.raises(LaunchError, match="METILE_TARGET='sm_90' is a CUDA target, but "
                                          "METILE_BACKEND=msl emits MSL"):
        prepare_product(a, b)


def test_a_target_alone_picks_its_language():
    cuda = resolve_backend(target="sm_90")
    assert (cuda.language, cuda.target.name) == ("cuda", "sm_90")
    m5 = resolve_backend(target="apple10")
    assert (m5.language, m5.target.name, m5.native) == ("msl", "apple10", True)


def test_plans_for_two_targets_do_not_share_caches(rng, monkeypatch):
    a, b = operands(rng, 64, 64, 64)
    matmul._specs.clear()
    m5 = prepare_product(a, b, target="apple10", SCHEDULE=metile.Schedule())
    m3 = prepare_product(a, b, target="apple9", SCHEDULE=metile.Schedule())
    assert m5.spec is not m3.spec and m5.spec.key != m3.spec.key   # memory and disk keys
    assert len(matmul._specs) == 2
    assert (m5.schedule_plan.backend, m3.schedule_plan.backend) == ("tensor_ops", "simdgroup")
    # planning apple10 again finds its own specialization, not apple9's
    assert prepare_product(a, b, target="apple10", SCHEDULE=metile.Schedule()).spec is m5.spec

    # Resolved launches (kernel[grid](...) reuses them by signature) follow METILE_TARGET.
    out = mx.zeros((64, 64))
    args = (mx.array(a), mx.array(b), out, 64, 64, 64)
    matmul._launches.clear()
    for target in ("apple9", "apple7", "apple9"):
        monkeypatch.setenv("METILE_TARGET", target)
        result = matmul[grid(64, 64)](*args, **TILE)
        np.testing.assert_allclose(np.array(result), a @ b, rtol=3e-4, atol=3e-5)
    assert sorted(d.spec.target.name for d in matmul._launches.values()) == ["apple7", "apple9"]


# -- the apple10 plans run here: tensor ops lowered, executed by the CPU runtime's shim -------

@pytest.mark.parametrize("schedule", [metile.Schedule(), metile.Schedule(backend="tensor_ops")])
def test_an_apple10_tensor_ops_plan_runs_here(rng, schedule):
    a, b = operands(rng, 70, 50, 40)
    d = prepare_fused(a, b, target="apple10", SCHEDULE=schedule)
    assert d.unlowered is None and d.schedule_plan.backend == "tensor_ops"
    assert "mpp::tensor_ops::matmul2d<" in d.source
    np.testing.assert_allclose(np.array(d()), fused_reference(a, b), rtol=3e-4, atol=3e-5)
    out = matmul_epilogue[grid(70, 50)](
        mx.array(a), mx.array(b), mx.zeros((70, 50)), 70, 50, 40, ALPHA, BETA,
        EPILOGUE="affine_leaky", NEGATIVE_SLOPE=SLOPE, **TILE, SCHEDULE=schedule,
        target="apple10")
    np.testing.assert_allclose(np.array(out), fused_reference(a, b), rtol=3e-4, atol=3e-5)


def test_explicit_nax_runs_here(rng):
    a, b = operands(rng, 64, 64, 64, np.float16)
    d = prepare_product(a, b, target="apple10", SCHEDULE=metile.Schedule(backend="nax"))
    plan = d.schedule_plan
    assert (plan.backend, plan.threadgroup_size, plan.simdgroup_grid, plan.staging) == \
        ("nax", (128, 1, 1), (2, 2), "device")
    assert plan.cooperative_layout == "NAX 16x16 cooperative fragments (opaque lane ownership)"
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(np.array(d()), want, rtol=3e-4, atol=3e-5)


def test_a_backend_planned_ahead_of_its_lowering_is_refused(rng, monkeypatch):
    # The plan-only machinery (Lowering.planned_backends) for a path still being built:
    # nax as if it were not lowered yet.
    from metile.compiler import planning
    from metile.schedule import Lowering
    monkeypatch.setattr(planning, "LOWERING", Lowering(
        matrix_backends=("simdgroup", "simdgroup_inline", "tensor_ops"),
        planned_backends=("nax",)))
    matmul._specs.clear()
    matmul._launches.clear()
    a, b = operands(rng, 64, 64, 64, np.float16)
    try:
        d = prepare_product(a, b, target="apple10", SCHEDULE=metile.Schedule(backend="nax"))
        assert d.schedule_plan.backend == "nax"
        with pytest.raises(CompilationError) as info:
            d()
        assert ("the apple10 plan selects backend 'nax', which metile's lowering does not "
                "implement yet") in str(info.value)
        assert "SCHEDULE=metile.Schedule(backend='simdgroup') runs this GEMM" in str(info.value)
        data = json.loads(d.explain())
        assert data["passes"] == ["frontend", "verify", "uniformity", "buffer_usage",
                                  "plan_schedule"]
        assert data["notes"][-1].startswith("Plan only: no kernel was generated (the nax "
                                            "lowering is not implemented yet)")
    finally:
        matmul._specs.clear()
        matmul._launches.clear()


@pytest.mark.parametrize("schedule, message", [
    (dict(backend="tensor_ops", vector_width=4),
     "cannot honour backend='tensor_ops' with vector_width=4: tensor_ops accesses are opaque and "
     "cannot satisfy an explicit vector width"),
    (dict(backend="nax", vector_width=1),
     "cannot honour backend='nax' with vector_width=1: nax accesses are opaque and cannot "
     "satisfy an explicit vector width"),
    (dict(backend="tensor_ops", double_buffer=True),
     "cannot honour backend='tensor_ops' with double_buffer=True: tensor_ops loads device memory "
     "directly into cooperative tensors; no software double buffer can materialize"),
    (dict(backend="tensor_ops", staging="threadgroup"),
     "cannot honour backend='tensor_ops' with staging='threadgroup': tensor_ops supports only "
     "device staging"),
    (dict(backend="nax", num_stages=2),
     "cannot honour backend='nax' with num_stages=2: nax loads device memory directly into "
     "cooperative tensors; there are no operand stages"),
    (dict(backend="nax"),
     "cannot honour backend='nax': nax computes float32 products at reduced precision on "
     "apple10; it needs RELAXED_PRECISION=True"),
])
def test_controls_the_opaque_paths_cannot_honour_are_refused(rng, schedule, message):
    a, b = operands(rng, 64, 64, 64, np.float16 if schedule.get("num_stages") else np.float32)
    with pytest.raises(CompilationError) as info:
        prepare_product(a, b, target="apple10", SCHEDULE=metile.Schedule(**schedule))
    assert message in str(info.value)


def test_auto_with_an_explicit_width_takes_the_controllable_path_on_apple10(rng):
    a, b = operands(rng, 64, 64, 64)
    d = prepare_product(a, b, target="apple10", SCHEDULE=metile.Schedule(vector_width=4))
    assert d.schedule_plan.backend == "simdgroup" and d.schedule_plan.vector_width == 4
    assert d.schedule_plan.reasons[0].startswith("tensor_ops not selected: tensor_ops accesses "
                                                 "are opaque")
    np.testing.assert_allclose(np.array(d()), a @ b, rtol=3e-4, atol=3e-5)


def test_explain_of_an_apple10_plan(rng):
    a, b = operands(rng, 64, 64, 64)
    text = matmul[grid(64, 64)].explain(mx.array(a), mx.array(b), mx.zeros((64, 64)), 64, 64, 64,
                                        **TILE, SCHEDULE=metile.Schedule(), target="apple10")
    data = json.loads(text)
    check_schema(data)
    assert data["plan"]["backend"] == "tensor_ops"
    assert data["passes"] == ["frontend", "verify", "uniformity", "buffer_usage", "plan_schedule",
                              "placement", "lower_tiles", "prove_gemm_bounds", "lower_matmul",
                              "tensor_ops_matmul", "verify", "emit_msl"]
    assert not any(n.startswith("Plan only") for n in data["notes"])
    steps = json.loads(matmul.last_dispatch.explain(steps=True))["steps"]
    assert [s["step"] for s in steps] == data["passes"]
    assert [s["detail"] for s in steps if s["step"] == "plan_schedule"] == \
        ["tensor_ops, 128 threads, matmul2d (tensor_ops: one product per SIMD-group sub-tile) "
         "on a 2x2 grid"]


# -- the recorded M5 report, field by field -------------------------------------------------

# Each claim of the recorded plan reasons and report notes, in the recorded order, as a
# test of the sentence of ours that makes it (the project words its own sentences).
GEMM_REASON_CLAIMS = [
    # tensor ops take the dtype, the tile shape and the SIMD-group grid chosen
    lambda r: r.startswith("Metal 4 tensor operations") and "float32 operands" in r
    and "64x64x16 tile" in r and "2x2 SIMD-group grid" in r,
    # operands go from device memory into register cooperative tensors
    lambda r: "device memory" in r and "register cooperative tensors" in r,
    # lane ownership of the cooperative tensors is opaque
    lambda r: "does not expose which lane owns which element" in r,
]
ELEMENTWISE_REASON_CLAIMS = [
    lambda r: r.startswith("Lanes follow the geometry traced") and "arange/BLOCK" in r,
]
NOTE_CLAIMS = [
    # widths describe the emitted operations, not machine instructions
    lambda n: n.startswith("Widths are those of the emitted source operations"),
    # masked tails may stay scalar while aligned interiors are vectors
    lambda n: n.startswith("Masked tail accesses can stay scalar"),
    # no software double buffer materialized
    lambda n: n == "No software double buffer was materialized.",
]


def recorded_reports(n: int) -> dict:
    """The recorded calls at n^3 (float32 operands, 64x64x16 tiles, strict precision) with
    target='apple10'.  The GEMMs pass SCHEDULE=metile.Schedule() (every policy automatic;
    integer sizes specialize, which is how the recorded plans prove their outer bounds);
    the pointwise epilogue is launched without one (its bounds are recorded unproven)."""
    rng = np.random.default_rng(n)
    a, b = operands(rng, n, n, n)
    schedule = metile.Schedule()
    fused = prepare_fused(a, b, target="apple10", SCHEDULE=schedule)
    product = prepare_product(a, b, target="apple10", SCHEDULE=schedule)
    x = mx.array(rng.standard_normal(n * n).astype(np.float32))
    pointwise = affine_leaky[(metile.cdiv(n * n, 256),)].prepare(
        x, mx.zeros(n * n), ALPHA, BETA, n * n, BLOCK=256, target="apple10")
    # the pointwise kernel lowers today: its apple10 code runs here
    z = np.array(x).astype(np.float64) * ALPHA + BETA
    np.testing.assert_allclose(np.array(pointwise()), np.where(z > 0, z, SLOPE * z),
                               rtol=1e-6, atol=1e-6)
    return {"fused": fused, "product": product, "separate_epilogue": pointwise}


@pytest.mark.parametrize("case", RECORDED["cases"], ids=lambda c: f"{c['shape'][0]}^3")
def test_apple10_reports_match_the_recorded_m5_report(case):
    dispatches = recorded_reports(case["shape"][0])
    assert sorted(dispatches) == sorted(case["execution_reports"])
    for name, recorded in case["execution_reports"].items():
        d = dispatches[name]
        report = json.loads(d.explain())
        check_schema(report)
        plan = report["plan"]
        for field, value in recorded["plan"].items():
            assert plan[field] == value, (name, field)
        gemm = plan["backend"] != "elementwise"
        claims = GEMM_REASON_CLAIMS if gemm else ELEMENTWISE_REASON_CLAIMS
        assert len(claims) == recorded["reasons"]
        for i, claim in enumerate(claims):
            assert any(claim(r) for r in plan["reasons"]), (name, "reason", i)
        assert len(NOTE_CLAIMS) == recorded["notes"]
        for i, claim in enumerate(NOTE_CLAIMS):
            assert any(claim(n) for n in report["notes"]), (name, "note", i)
        if gemm:
            assert "Lane ownership of matrix fragments is opaque and not reported." \
                in report["notes"]
        # Nothing staged, buffered or vectorized, as recorded.
        for field in ("allocations", "double_buffered", "vectorized_loads"):
            assert report[field] == recorded[field], (name, field)
        # What the lowering emitted: its K loop and fused epilogue regions as recorded.
        assert d.unlowered is None, name
        assert report["loops"] == recorded["loops"], name
        assert report["epilogue_regions"] == recorded["epilogue_regions"], name


@pytest.mark.skipif(not SEED.exists(), reason="the seed report lives outside the repository")
def test_the_recorded_fields_are_the_seed_reports():
    seed = json.loads(SEED.read_text())
    assert seed["device"] == RECORDED["device"]
    assert [c["shape"] for c in seed["cases"]] == [c["shape"] for c in RECORDED["cases"]]
    for full, kept in zip(seed["cases"], RECORDED["cases"]):
        for name, report in full["execution_reports"].items():
            mine = kept["execution_reports"][name]
            assert {k: report["plan"][k] for k in mine["plan"]} == mine["plan"]
            for field in ("loops", "allocations", "double_buffered", "vectorized_loads",
                          "epilogue_regions"):
                assert report[field] == mine[field]
            assert (len(report["plan"]["reasons"]), len(report["notes"])) == \
                (mine["reasons"], mine["notes"])
