"""plan_schedule: plans for representative kernels on every target, and every rejection."""

import dataclasses

import pytest

from metile.schedule import TARGETS, KernelTraits, Schedule, ScheduleError, plan_schedule


def gemm(tile=(64, 64, 16), dtype="float32", divisible=(True, True, True), aligned=True, **kw):
    return KernelTraits("matmul", tile, operand_dtypes=(dtype, dtype), accumulator_dtype="float32",
                        extents_divisible=divisible, vector_aligned=aligned, **kw)


ELEMENTWISE = KernelTraits("elementwise", (256,), lanes=256)


def plan(traits, target, **schedule):
    return plan_schedule(traits, TARGETS[target], Schedule(**schedule))


# -- plans ----------------------------------------------------------------------------------

def test_m5_gemm_defaults_to_tensor_ops():
    p = plan(gemm(), "apple10")
    assert p.to_dict() == {
        "backend": "tensor_ops", "threadgroup_size": [128, 1, 1], "simdgroup_grid": [2, 2],
        "tile_shape": [64, 64, 16], "staging": "device", "vector_width": None,
        "double_buffer": None, "reasons": list(p.reasons),
        "cooperative_layout": "native SDK cooperative_tensor (opaque lane ownership)",
        "outer_bounds_proven": True, "num_stages": None, "program_order": "linear",
        "group_size": None}
    assert p.reasons[0] == ("Metal 4 tensor operations (matmul2d on cooperative tensors) accept "
                            "float32 operands, the 64x64x16 tile and the 2x2 SIMD-group grid.")
    assert any("lane owns" in r for r in p.reasons)


@pytest.mark.parametrize("target", ["apple7", "apple8", "apple9", "cpu_msl"])
def test_pre_m5_gemm_uses_simdgroup_matrix_with_threadgroup_staging(target):
    p = plan(gemm(), target)
    assert (p.backend, p.threadgroup_size, p.simdgroup_grid, p.tile_shape, p.staging) == \
        ("simdgroup", (128, 1, 1), (2, 2), (64, 64, 16), "threadgroup")
    assert (p.vector_width, p.double_buffer, p.outer_bounds_proven) == (None, None, True)
    assert p.cooperative_layout == "simdgroup_matrix 8x8 fragments (opaque lane ownership)"
    assert p.reasons[:2] == (
        "SIMD-group matrix (simdgroup_matrix) multiply-accumulates into float32 accumulators on a "
        "2x2 SIMD-group grid (32x32 per SIMD-group).",
        "Operand tiles are staged through threadgroup memory (8192 bytes per stage) and loaded "
        "into SIMD-group fragments.")


@pytest.mark.parametrize("target", ["sm_80", "sm_90", "sm_100"])
def test_cuda_gemm_precision_paths(target):
    half = plan(gemm(dtype="float16"), target)
    assert (half.backend, half.simdgroup_grid, half.staging) == ("simdgroup", (2, 2), "threadgroup")
    # CUDA plans speak CUDA: warps and shared memory (field names stay the recorded ones)
    assert half.reasons[1] == ("Operand tiles are staged through shared memory (4096 bytes "
                               "per stage) and loaded into warp fragments.")
    strict = plan(gemm(), target)
    assert ("Strict float32 operands use scalar FMA instead of the matrix unit (relaxed precision "
            "would use the matrix unit).") in strict.reasons
    # strict FP32 is not claimed to run on warp MMA: no MMA reason, no warp grid, FMA layout
    assert not any("MMA" in r for r in strict.reasons) and strict.simdgroup_grid is None
    assert strict.cooperative_layout == "scalar FMA register micro-tiles (per-thread)"
    assert any(r.endswith("loaded into per-thread registers.") for r in strict.reasons)
    relaxed = plan(gemm(relaxed_precision=True), target)
    assert "Relaxed precision: float32 operands run on the matrix unit at reduced precision." \
        in relaxed.reasons


def test_auto_with_explicit_width_or_double_buffer_takes_the_controllable_path():
    for schedule in (dict(vector_width=4), dict(vector_width=1), dict(double_buffer=True)):
        p = plan(gemm(), "apple10", **schedule)
        assert p.backend == "simdgroup" and p.staging == "threadgroup"
        assert p.reasons[0].startswith("tensor_ops not selected: tensor_ops accesses are opaque") \
            or p.reasons[0].startswith("tensor_ops not selected: tensor_ops loads device memory")
    p = plan(gemm(), "apple10", vector_width=4)
    assert p.vector_width == 4 and p.double_buffer is None
    assert "Aligned interior staging loads are 4-wide; masked tails stay scalar." in p.reasons
    p = plan(gemm(), "apple10", double_buffer=True)
    assert p.double_buffer is True
    assert any(r.startswith("Software double buffering is required: two stages alternate over K")
               for r in p.reasons)
    p = plan(gemm(), "apple10", double_buffer=False)
    # (the explicit requirement is recorded as asked: it was None, "automatic", on tensor_ops)
    assert p.backend == "tensor_ops" and p.double_buffer is False
    assert plan(gemm(), "apple10").double_buffer is None


def test_auto_falls_back_when_the_tile_does_not_suit_tensor_ops():
    p = plan(gemm(tile=(32, 32, 8)), "apple10")
    assert p.backend == "simdgroup"
    assert p.reasons[0] == ("tensor_ops not selected: the 32x32x8 tile is not made of whole "
                            "16x16x16 tensor_ops fragments.")


def test_auto_threadgroup_staging_selects_simdgroup_on_m5():
    assert plan(gemm(), "apple10", staging="threadgroup").backend == "simdgroup"
    assert plan(gemm(), "apple10", staging="device").backend == "tensor_ops"


def test_explicit_nax_with_relaxed_float32_and_half():
    assert plan(gemm(dtype="float16"), "apple10", backend="nax").backend == "nax"
    p = plan(gemm(relaxed_precision=True), "apple10", backend="nax")
    assert p.cooperative_layout == "NAX 16x16 cooperative fragments (opaque lane ownership)"


def test_explicit_geometry_and_grid_factorization():
    p = plan(gemm(), "apple9", num_simdgroups=8)
    assert p.threadgroup_size == (256, 1, 1) and p.simdgroup_grid == (4, 2)
    assert plan(gemm(tile=(64, 32, 16)), "apple9", num_simdgroups=2).simdgroup_grid == (2, 1)
    assert plan(gemm(), "apple9", num_simdgroups=1).simdgroup_grid == (1, 1)
    assert plan(gemm(lanes=256), "apple9").simdgroup_grid == (4, 2)  # geometry fixed by kernel
    assert plan(gemm(tile=(8, 8, 8)), "apple9").simdgroup_grid == (1, 1)


def test_outer_bounds_follow_the_row_and_column_proofs_only():
    assert plan(gemm(divisible=(True, True, False)), "apple9").outer_bounds_proven is True
    ragged = plan(gemm(divisible=(True, None, True)), "apple9")
    assert ragged.outer_bounds_proven is False
    assert ("Row/column tiles are not proven complete; edge loads and stores keep their bounds "
            "checks.") in ragged.reasons


def test_double_buffering_prohibited_when_two_stages_do_not_fit():
    p = plan(gemm(tile=(128, 128, 32)), "apple9")
    assert (p.staging, p.double_buffer) == ("threadgroup", False)
    assert ("Two 32768-byte stages exceed apple9's threadgroup memory; double "
            "buffering is prohibited.") in p.reasons
    assert p.num_stages == 1
    big = plan(gemm(tile=(128, 128, 64)), "apple9")
    assert big.staging == "device"
    assert "A 65536-byte operand stage does not fit apple9's threadgroup memory" in big.reasons[1]


def test_elementwise_plan():
    p = plan(ELEMENTWISE, "cpu_msl")
    assert p.to_dict() == {
        "backend": "elementwise", "threadgroup_size": [256, 1, 1], "simdgroup_grid": None,
        "tile_shape": [256], "staging": "device", "vector_width": None, "double_buffer": None,
        "reasons": ["Lanes follow the geometry traced from the kernel (arange/BLOCK or "
                    "num_simdgroups)."],
        "cooperative_layout": "scalar lanes", "outer_bounds_proven": False,
        "num_stages": None, "program_order": "linear", "group_size": None}
    for target in TARGETS:
        assert plan(ELEMENTWISE, target, num_simdgroups=8).threadgroup_size == (256, 1, 1)
    wide = KernelTraits("elementwise", (1024,), lanes=256, extents_divisible=(True,),
                        vector_aligned=True)
    p = plan(wide, "sm_90", vector_width=4, double_buffer=False, staging="device")
    assert (p.vector_width, p.double_buffer, p.outer_bounds_proven) == (4, False, True)
    assert p.reasons[-1] == ("Each lane owns 4 elements, loaded as aligned 4-wide vectors; masked "
                             "tails stay scalar.")


def test_reduction_and_fragment_plans():
    red = KernelTraits("reduction", (1024,), lanes=1024, uses_shared=True, shared_bytes=128)
    p = plan(red, "apple9")
    assert (p.backend, p.staging, p.threadgroup_size) == ("elementwise", "threadgroup",
                                                          (1024, 1, 1))
    assert p.reasons[1] == "Block reductions combine per-SIMD-group partials in threadgroup memory."
    frag = KernelTraits("fragments", lanes=32, operand_dtypes=("float32",) * 2,
                        accumulator_dtype="float32", uses_shared=True, shared_bytes=768)
    for target in ("cpu_msl", "apple7", "apple10", "sm_90"):
        p = plan(frag, target, backend="simdgroup_inline")
        assert (p.backend, p.threadgroup_size, p.simdgroup_grid, p.tile_shape, p.staging) == \
            ("simdgroup_inline", (32, 1, 1), None, (8, 8), "threadgroup")
    assert plan(frag, "cpu_msl").backend == "simdgroup_inline"


def test_plan_is_immutable():
    p = plan(gemm(), "apple9")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.backend = "nax"
    assert p == plan(gemm(), "apple9")
    assert type(p).from_dict(p.to_dict()) == p


# -- rejections -----------------------------------------------------------------------------

FRAG = KernelTraits("fragments", lanes=64, operand_dtypes=("float16",) * 2)

REJECTIONS = [
    ("tensor_ops on M3", gemm(), "apple9", dict(backend="tensor_ops"),
     "cannot honour backend='tensor_ops': target apple9 (Apple GPU family 9: M3, M4, A17/A18) has "
     "no tensor_ops backend; it supports elementwise, simdgroup, simdgroup_inline"),
    ("nax on CPU runtime", gemm(), "cpu_msl", dict(backend="nax"),
     "cannot honour backend='nax': target cpu_msl (metile's MSL CPU runtime) has no nax backend"),
    ("tensor_ops on CUDA", gemm(), "sm_90", dict(backend="tensor_ops"),
     "target sm_90 (NVIDIA sm_90: H100/H200) has no tensor_ops backend"),
    ("nax strict float32", gemm(), "apple10", dict(backend="nax"),
     "cannot honour backend='nax': nax computes float32 products at reduced precision on "
     "apple10; it needs RELAXED_PRECISION=True"),
    ("int32 operands", gemm(dtype="int32"), "apple9", dict(backend="simdgroup"),
     "cannot honour backend='simdgroup': simdgroup on apple9 has no int32 matrix operands "
     "(supports float32, float16, bfloat16)"),
    ("float16 accumulator", KernelTraits("matmul", (64, 64, 16), operand_dtypes=("float16",) * 2,
                                         accumulator_dtype="float16"), "apple9", {},
     "accumulator dtype float16: matrix backends accumulate in float32"),
    ("tensor_ops explicit width", gemm(), "apple10", dict(backend="tensor_ops", vector_width=1),
     "cannot honour backend='tensor_ops' with vector_width=1: tensor_ops accesses are opaque and "
     "cannot satisfy an explicit vector width"),
    ("nax explicit width", gemm(dtype="float16"), "apple10", dict(backend="nax", vector_width=4),
     "cannot honour backend='nax' with vector_width=4: nax accesses are opaque"),
    ("tensor_ops double buffer", gemm(), "apple10", dict(backend="tensor_ops", double_buffer=True),
     "cannot honour backend='tensor_ops' with double_buffer=True: tensor_ops loads device memory "
     "directly into cooperative tensors; no software double buffer can materialize"),
    ("tensor_ops threadgroup staging", gemm(), "apple10",
     dict(backend="tensor_ops", staging="threadgroup"),
     "cannot honour backend='tensor_ops' with staging='threadgroup': tensor_ops supports only "
     "device staging"),
    ("3 SIMD-groups on 64x64", gemm(), "apple9", dict(num_simdgroups=3),
     "cannot honour num_simdgroups=3: no SIMD-group grid WM x WN = 3 divides the 64x64 tile into "
     "whole 8x8 fragments"),
    ("8 SIMD-groups on 16x16", gemm(tile=(16, 16, 16)), "cpu_msl", dict(num_simdgroups=8),
     "cannot honour num_simdgroups=8: no SIMD-group grid WM x WN = 8 divides the 16x16 tile"),
    ("8 SIMD-groups on 32x32 tensor_ops", gemm(tile=(32, 32, 16)), "apple10",
     dict(backend="tensor_ops", num_simdgroups=8),
     "no SIMD-group grid WM x WN = 8 divides the 32x32 tile into whole 16x16 fragments"),
    ("partial fragment tile", gemm(tile=(64, 64, 4)), "apple9", dict(backend="simdgroup"),
     "cannot honour backend='simdgroup': the 64x64x4 tile is not made of whole 8x8x8 simdgroup "
     "fragments"),
    ("num_simdgroups vs fixed GEMM lanes", gemm(lanes=256), "apple9", dict(num_simdgroups=4),
     "cannot honour num_simdgroups=4: the kernel fixes 256 lanes (8 SIMD-groups)"),
    ("width 4 with double buffer", gemm(), "apple9", dict(vector_width=4, double_buffer=True),
     "cannot honour vector_width=4 with double_buffer=True: 4-wide staging loads and software "
     "double buffering cannot currently be combined"),
    ("width 4 on ragged shapes", gemm(divisible=(False, False, False), aligned=None), "apple9",
     dict(vector_width=4),
     "cannot honour vector_width=4: alignment of the interior accesses is not provable"),
    ("width 4 misaligned", gemm(aligned=False), "cpu_msl",
     dict(backend="simdgroup", vector_width=4),
     "cannot honour vector_width=4: an interior access cannot be an aligned 4-wide load "
     "(misaligned, or not contiguous along its tile's inner axis, as a transposed operand is); "
     "use vector_width=None"),
    ("device staging with double buffer", gemm(), "apple9",
     dict(staging="device", double_buffer=True),
     "cannot honour staging='device' with double_buffer=True: double_buffer=True acts on "
     "threadgroup staging copies; device staging has none"),
    ("double buffer over capacity", gemm(tile=(128, 128, 32)), "apple9", dict(double_buffer=True),
     "cannot honour double_buffer=True: two operand stages and the kernel's allocations need "
     "65536 bytes of threadgroup memory; apple9 has 32768"),
    ("threadgroup staging over capacity", gemm(tile=(128, 128, 64)), "sm_90",
     dict(staging="threadgroup"),
     "cannot honour staging='threadgroup': one 128x64 + 64x128 operand stage and the kernel's "
     "allocations need 65536 bytes of shared memory; sm_90 has 49152"),
    ("kernel allocations push staging over", gemm(shared_bytes=30000), "apple9",
     dict(staging="threadgroup"), "need 38192 bytes of threadgroup memory; apple9 has 32768"),
    ("elementwise backend on a GEMM", gemm(), "apple9", dict(backend="elementwise"),
     "cannot honour backend='elementwise': this kernel is a whole-tile GEMM"),
    ("matrix backend on elementwise", ELEMENTWISE, "apple10", dict(backend="tensor_ops"),
     "cannot honour backend='tensor_ops': this elementwise kernel contains no dot for a matrix "
     "backend"),
    ("elementwise lanes mismatch", ELEMENTWISE, "cpu_msl", dict(num_simdgroups=4),
     "cannot honour num_simdgroups=4: 4 SIMD-groups are 128 lanes, but the kernel's traced lane "
     "geometry is 256 lanes"),
    ("elementwise staging mismatch", ELEMENTWISE, "cpu_msl", dict(staging="threadgroup"),
     "cannot honour staging='threadgroup': staging must match the kernel's memory operations; "
     "this elementwise kernel allocates no threadgroup memory of its own"),
    # (a kernel with dots was told it "contains no dot"; a reduction's block-reduction
    # scratch was denied: "uses no threadgroup memory")
    ("matrix backend on lanes with dots", KernelTraits("elementwise", (64,), lanes=32, dots=True),
     "cpu_msl", dict(backend="simdgroup"),
     "cannot honour backend='simdgroup': this elementwise kernel has dots, but no whole-tile "
     "GEMM a matrix backend lowers (8x8 fragment products take backend 'simdgroup_inline')"),
    ("reduction staging", KernelTraits("reduction", (64,), lanes=32), "cpu_msl",
     dict(staging="threadgroup"),
     "this reduction kernel allocates no threadgroup memory of its own (shared()) - its block "
     "reductions' partials use threadgroup scratch whatever the staging"),
    ("elementwise double buffer", ELEMENTWISE, "cpu_msl", dict(double_buffer=True),
     "cannot honour double_buffer=True: this elementwise kernel has no staged K-loop"),
    ("elementwise width 4, one element per lane",
     KernelTraits("elementwise", (256,), lanes=256, vector_aligned=True), "cpu_msl",
     dict(vector_width=4),
     "cannot honour vector_width=4: the 256-element tile over 256 lanes gives 1 elements per "
     "lane; width 4 needs each lane to own whole groups of 4 elements"),
    ("elementwise width 4 unaligned", KernelTraits("elementwise", (1024,), lanes=256), "cpu_msl",
     dict(vector_width=4), "alignment of the interior accesses is not provable"),
    ("lanes over the device limit", KernelTraits("elementwise", (2048,), lanes=2048), "sm_90", {},
     "the traced geometry has 2048 lanes; sm_90 allows at most 1024 threads per threadgroup"),
    ("fragments on the GEMM backend", FRAG, "apple9", dict(backend="simdgroup"),
     "only backend 'simdgroup_inline' lowers"),
    ("fragments forced width", FRAG, "apple9", dict(vector_width=4),
     "cannot honour vector_width=4: simdgroup_inline kernels place their own loads"),
    ("fragments double buffer", FRAG, "apple9", dict(double_buffer=True),
     "automatic double buffering is unsupported"),
    ("fragments lanes", KernelTraits("fragments", lanes=48), "apple9", {},
     "the traced lane geometry (48 lanes) must be a multiple of 32"),
    ("fragments bfloat16", KernelTraits("fragments", lanes=32, operand_dtypes=("bfloat16",) * 2),
     "apple9", {}, "simdgroup_inline on apple9 has no bfloat16 matrix operands"),
    ("simdgroup_inline on a GEMM", gemm(), "apple9", dict(backend="simdgroup_inline"),
     "backend 'simdgroup_inline' does not lower it"),
]


@pytest.mark.parametrize("traits, target, schedule, message",
                         [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_rejections(traits, target, schedule, message):
    with pytest.raises(ScheduleError) as err:
        plan(traits, target, **schedule)
    assert message in str(err.value)
    assert str(err.value).startswith("cannot honour ")
    assert isinstance(err.value, ValueError)


def test_the_same_requests_are_honoured_where_possible():
    """Each rejection above is specific: the nearest legal request plans."""
    assert plan(gemm(), "apple10", backend="tensor_ops").backend == "tensor_ops"
    assert plan(gemm(relaxed_precision=True), "apple10", backend="nax").backend == "nax"
    assert plan(gemm(), "apple9", num_simdgroups=4).simdgroup_grid == (2, 2)
    assert plan(gemm(), "apple9", vector_width=4, double_buffer=False).vector_width == 4
    assert plan(gemm(tile=(128, 128, 32)), "apple9", staging="threadgroup").staging == "threadgroup"
    assert plan(gemm(), "apple9", staging="device").staging == "device"
    assert plan(gemm(tile=(32, 64, 16)), "apple10", num_simdgroups=8).simdgroup_grid == (2, 4)
    # automatic staging moves to device memory when the kernel's own allocations leave no room
    assert plan(gemm(shared_bytes=30000), "apple9").staging == "device"


def test_traits_validation():
    with pytest.raises(ValueError, match="kind must be one of elementwise, reduction, matmul"):
        KernelTraits("conv")
    with pytest.raises(ValueError, match=r"needs tile_shape \(BLOCK_M, BLOCK_N, BLOCK_K\)"):
        KernelTraits("matmul", (64, 64), operand_dtypes=("float32",) * 2)
    with pytest.raises(ValueError, match="elementwise kernel needs its traced lanes"):
        KernelTraits("elementwise", (256,))
    t = KernelTraits("matmul", (64, 64, 16), operand_dtypes=("f16", "mlx.core.float16"))
    assert t.operand_dtypes == ("float16", "float16") and t.has_dot


def test_auto_falls_back_to_scalar_fma_when_no_fragment_fits():
    plan = plan_schedule(gemm(tile=(64, 64, 4)), TARGETS["apple9"], Schedule())
    assert plan.backend == "elementwise" and plan.simdgroup_grid is None
    assert plan.cooperative_layout == "scalar FMA register micro-tiles"
    assert plan.staging == "threadgroup" and plan.threadgroup_size == (128, 1, 1)
    assert any("not made of whole 8x8x8 simdgroup fragments" in r for r in plan.reasons)


@pytest.mark.parametrize("relaxed", [False, True])
def test_apple10_falls_back_to_scalar_fma_when_no_fragment_fits(relaxed):
    # (strict float32: nax's dtype refusal kept the fallback from being taken, and the launch
    # failed with "cannot honour backend='auto'", a requirement nobody gave)
    plan = plan_schedule(gemm(tile=(32, 32, 4), relaxed_precision=relaxed), TARGETS["apple10"],
                         Schedule())
    assert plan.backend == "elementwise"
    assert plan.cooperative_layout == "scalar FMA register micro-tiles"
    why = ("not made of whole 16x16x16 nax fragments" if relaxed
           else "nax computes float32 products at reduced precision")
    assert any(why in r for r in plan.reasons)


def test_a_dtype_no_path_takes_is_still_refused():
    with pytest.raises(ScheduleError, match="has no int8 matrix operands"):
        plan_schedule(gemm(tile=(32, 32, 4), dtype="int8"), TARGETS["apple10"], Schedule())


def test_planning_against_what_metile_lowers():
    # Without a Lowering the planner describes the hardware (the M5 contract table);
    # with one it never plans a path the code generators neither lower nor plan ahead
    # of their lowering (LOWERING lowers tensor_ops and nax; a Lowering without them
    # plans the SIMD-group path).
    from metile.schedule import LOWERING, Lowering
    assert plan(gemm(), "apple10").backend == "tensor_ops"
    assert plan_schedule(gemm(), TARGETS["apple10"], Schedule(), LOWERING).backend == "tensor_ops"
    lowered_only = Lowering(matrix_backends=("simdgroup", "simdgroup_inline"))
    lowered = plan_schedule(gemm(), TARGETS["apple10"], Schedule(), lowered_only)
    assert (lowered.backend, lowered.staging) == ("simdgroup", "threadgroup")
    with pytest.raises(ScheduleError, match="backend='nax': metile does not lower nax yet"):
        plan_schedule(gemm(dtype="float16"), TARGETS["apple10"], Schedule(backend="nax"),
                      lowered_only)
    big = gemm(tile=(128, 128, 64))
    assert plan(big, "apple9").staging == "device"   # hardware: fragments from device memory
    with pytest.raises(ScheduleError, match="need 65536 bytes of threadgroup memory"):
        plan_schedule(big, TARGETS["apple9"], Schedule(), LOWERING)
