"""Hopper warpgroup MMA (passes/gemm_wgmma.py, issue 13 item 6).

On this machine: the plan and report for the sm_90 target, the emitted source and
its launch record, NVRTC compiling it for sm_90a (wgmma needs the arch-specific
target; the instruction is refused for plain sm_90), HGMMA in its SASS when
nvdisasm is there.  On an H200 (MLX's CUDA backend): the numbers, against NumPy,
on ragged shapes, for both 16-bit dtypes, fused epilogues, bias reads and every
stage count.
"""

import re
import shutil

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.runtime import dispatch
from metile import Schedule
from metile_kernels.gemm import grid, linear_epilogue, matmul, matmul_epilogue
from test_gemm import check, operands

WG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)


@pytest.fixture(autouse=True)
def warpgroup_path(monkeypatch):
    # Variant 1 (the default's loop without its proven copy), named so a test's
    # expectations do not follow the environment; tests of other variants set theirs.
    monkeypatch.setenv("METILE_CUDA_WGMMA", "1")


def test_warp_specialized_variant(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "ws")
    d = prepare((1000, 1000, 1000))
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["fragment"] == "wgmma m64nNk16 (warpgroup, warp-specialized)"
    assert d.variant.data["lowering"]["launch"]["threads"] == 2 * 128 + 128   # + a producer warpgroup
    assert "warp_specialization" in d.execution_report.passes
    assert "__shfl_sync(0xffffffffu" in d.variant.data["body"]


def test_warp_specialized_variant_with_its_thread_count_named(monkeypatch):
    # num_simdgroups=12 (what ops pass): 2 multiplying warpgroups + the copying one; the
    # planner once looked for a 12-warp fragment grid and refused the tile
    monkeypatch.setenv("METILE_CUDA_WGMMA", "ws")
    d = prepare((1000, 1000, 1000), kernel=matmul_epilogue, num_simdgroups=12,
                EPILOGUE="affine_leaky")
    assert d.variant.data["lowering"]["matmul"]["fragment"] == \
        "wgmma m64nNk16 (warpgroup, warp-specialized)"
    assert d.variant.data["lowering"]["launch"]["threads"] == 384


def test_warp_specialized_variant_needs_three_stages(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "ws")
    with pytest.raises(metile.CompilationError, match="at least 3 stages"):
        prepare((300, 300, 300), SCHEDULE=Schedule(num_stages=2))


def test_unknown_variant_is_an_error(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "fast")
    with pytest.raises(ValueError, match="METILE_CUDA_WGMMA='fast' is not one of 0, 1, ws"):
        prepare((300, 300, 300))


def test_on_by_default_and_off_with_zero(monkeypatch):
    monkeypatch.delenv("METILE_CUDA_WGMMA")
    mm = prepare((1000, 1000, 1000)).variant.data["lowering"]["matmul"]
    assert mm["fragment"] == "wgmma m64nNk16 (warpgroup, bulk tensor copies)"
    monkeypatch.setenv("METILE_CUDA_WGMMA", "0")
    mm = prepare((1000, 1000, 1000)).variant.data["lowering"]["matmul"]
    assert mm["fragment"].startswith("mma.sync")
on_gpu = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                            reason="runs on MLX's CUDA backend (sm_90)")


def prepare(shape, dtype="float16", kernel=matmul, tile=WG, **kw):
    """A CUDA dispatch planned for the reference CUDA target (sm_90 on a machine
    without a CUDA GPU; the device's own on an H200)."""
    m, n, k = shape
    d = getattr(mx, dtype)
    a, b = mx.zeros((m, k), dtype=d), mx.zeros((k, n), dtype=d)
    extra = (1.25, -0.5) if kernel is matmul_epilogue else ()
    return kernel[grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])].prepare(
        a, b, mx.zeros((m, n), dtype=d), m, n, k, *extra, **tile, backend="cuda", **kw)


def test_plan_and_report_name_the_warpgroup_path():
    d = prepare((1000, 1000, 1000))
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["fragment"] == "wgmma m64nNk16 (warpgroup)"
    assert mm["warpgroups"] == 2 and mm["product"] == "m64n256k16"
    assert set(mm["shared_layout"].values()) == {"128-byte-swizzled 64-element atoms (wgmma SW128)"}
    launch = d.variant.data["lowering"]["launch"]
    assert launch["arch"] == "sm_90a" and launch["threads"] == 256
    # 4 stages of a 128x64 and a 64x256 float16 tile, past the 48 KiB of static shared memory
    assert mm["stages"] == 4 and launch["shared_memory"] == 4 * (128 * 64 + 64 * 256) * 2
    report = d.execution_report
    assert "warpgroup_mma" in report.passes and "register_epilogue" in report.passes
    assert any("Warpgroup MMA" in r for r in report.plan.reasons)
    # the warp-MMA fallback the planner also described is not reported as what runs
    assert not any(r.startswith("Warp-level MMA") or "warp fragments" in r
                   for r in report.plan.reasons)
    assert report.plan.cooperative_layout == "warpgroup MMA accumulators (wgmma's register layout)"
    src = d.variant.data["body"] + d.variant.data["header"]
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in src
    assert "mma.sync" not in src and "extern __shared__" in src


@pytest.mark.parametrize("target", ["sm_80", "sm_100"])
def test_other_targets_keep_warp_mma(target, monkeypatch):
    from metile.compiler import backend as backend_module
    from metile.schedule.targets import TARGETS
    plain = backend_module.target_for
    monkeypatch.setattr(backend_module, "target_for", lambda kind, arch=None: (
        TARGETS[target] if kind == "cuda" else plain(kind, arch)))
    mm = prepare((256, 256, 128)).variant.data["lowering"]["matmul"]
    assert mm["fragment"].startswith("mma.sync")


@pytest.mark.parametrize("tile", [dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32),
                                  dict(BLOCK_M=96, BLOCK_N=128, BLOCK_K=64)])
def test_tiles_not_made_of_atoms_keep_warp_mma(tile):
    mm = prepare((256, 640, 128), tile=tile).variant.data["lowering"]["matmul"]
    assert mm["fragment"].startswith("mma.sync")


def test_float32_keeps_ffma():
    mm = prepare((256, 256, 128), dtype="float32",
                 tile=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)).variant.data["lowering"]["matmul"]
    assert mm["fragment"] == "ffma"


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_requested_stage_counts(stages):
    d = prepare((300, 300, 300), SCHEDULE=Schedule(num_stages=stages))
    assert d.variant.data["lowering"]["matmul"]["stages"] == stages


def test_too_many_stages_is_a_clear_error():
    with pytest.raises(metile.CompilationError, match="num_stages=5.*shared memory"):
        prepare((300, 300, 300), SCHEDULE=Schedule(num_stages=5))


def test_schedule_asking_for_ordinary_loads_falls_back_to_warp_mma():
    d = prepare((300, 300, 300), SCHEDULE=Schedule(num_stages=1))
    assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("mma.sync")


def linear_prepare(shape, dtype="float16", tile=WG):
    # A [N, K] weight read as the (K, N) right operand: contiguous along K, not N
    m, n, k = shape
    d = getattr(mx, dtype)
    x, w = mx.zeros((m, k), dtype=d), mx.zeros((n, k), dtype=d)
    return linear_epilogue[grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])].prepare(
        x, w, mx.zeros((m, n), dtype=d), mx.zeros((n,), dtype=d), mx.zeros((m, n), dtype=d),
        m, n, k, **tile, TRANSPOSE_B=True, EPILOGUE="gelu_tanh", backend="cuda")


def test_transposed_right_operand_is_read_k_major():
    d = linear_prepare((256, 256, 128))
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["fragment"] == "wgmma m64nNk16 (warpgroup)"
    body = d.variant.data["body"]
    # both operands K-major: no imm-trans-b, B's descriptors stride 1024 bytes per 8 rows
    assert "m64n256k16_f16(" in body and "_tb(" not in body


# -- NVRTC (compiles for the device, never launches) ------------------------------------------

nvrtc = pytest.importorskip("nvrtc")
needs_nvrtc = pytest.mark.skipif(nvrtc.TOOLKIT is None, reason="needs the nvidia-cuda-* wheels")


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", [matmul, matmul_epilogue])
def test_compiles_for_sm90a_and_not_for_sm90(dtype, kernel):
    tu = nvrtc.translation_unit(prepare((1000, 1000, 1000), dtype=dtype, kernel=kernel))
    ok, log = nvrtc.compile_cuda(tu, "sm_90a")
    assert ok, log
    ok, log = nvrtc.compile_cuda(tu, "sm_90")
    assert not ok and "wgmma" in log


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_k_major_right_operand_compiles_for_sm90a(dtype):
    ok, log = nvrtc.compile_cuda(nvrtc.translation_unit(linear_prepare((1000, 1000, 1000), dtype)),
                                 "sm_90a")
    assert ok, log


@needs_nvrtc
@pytest.mark.parametrize("kernel", ["matmul", "linear"])
def test_192_wide_tile_is_one_warpgroup_product_a_step(kernel):
    # a 128x192x64 tile (one a user may name; ops tried it for whole waves over the SMs):
    # m64n192k16 products, both operand layouts
    tile = {**WG, "BLOCK_N": 192}
    d = (prepare((1000, 1000, 1000), tile=tile) if kernel == "matmul"
         else linear_prepare((1000, 1000, 1000), "float16", tile=tile))
    assert d.variant.data["lowering"]["matmul"]["product"] == "m64n192k16"
    ok, log = nvrtc.compile_cuda(nvrtc.translation_unit(d), "sm_90a")
    assert ok, log


@needs_nvrtc
@pytest.mark.skipif(shutil.which("nvdisasm") is None and nvrtc.nvdisasm() is None,
                    reason="needs nvdisasm")
def test_sass_has_warpgroup_mma_and_no_spills():
    tu = nvrtc.translation_unit(prepare((1000, 1000, 1000)))
    cubin, log = nvrtc.cubin(tu, "sm_90a", ["--ptxas-options=-v"])
    sass = nvrtc.disassemble(cubin)
    assert sass.count("HGMMA.64x256x16.F32") == 4          # one K step of 64, unrolled
    assert "LDL" not in sass and "STL" not in sass        # accumulators stay in registers
    assert "0 bytes spill stores" in log
    # the four products of a step issue back to back, one step's group stays in flight
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    assert "C7514" not in log and "C7515" not in log


@needs_nvrtc
@pytest.mark.skipif(shutil.which("nvdisasm") is None and nvrtc.nvdisasm() is None,
                    reason="needs nvdisasm")
@pytest.mark.parametrize("case", ["bfloat16 epilogue", "128x128", "3 stages", "linear", "whole"])
def test_every_pipelined_form_keeps_a_product_group_in_flight(case, monkeypatch):
    if case == "whole":
        monkeypatch.setenv("METILE_CUDA_WGMMA", "whole")
    d = {"bfloat16 epilogue": lambda: prepare((4096, 4096, 4096), "bfloat16", matmul_epilogue),
         "128x128": lambda: prepare((4096, 4096, 4096),
                                    tile=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)),
         "3 stages": lambda: prepare((4096, 4096, 4096), SCHEDULE=Schedule(num_stages=3)),
         "linear": lambda: linear_prepare((4096, 4096, 4096)),
         "whole": lambda: prepare((4096, 4096, 4096))}[case]()
    cubin, log = nvrtc.cubin(nvrtc.translation_unit(d), "sm_90a", ["--ptxas-options=-v"])
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in nvrtc.disassemble(cubin)
    assert "C751" not in log and "0 bytes spill stores" in log


@needs_nvrtc
@pytest.mark.skipif(shutil.which("nvdisasm") is None and nvrtc.nvdisasm() is None,
                    reason="needs nvdisasm")
def test_warp_specialized_sass_keeps_one_product_group_in_flight(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "ws")
    tu = nvrtc.translation_unit(prepare((1000, 1000, 1000)))
    cubin, log = nvrtc.cubin(tu, "sm_90a", ["--ptxas-options=-v"])
    sass = nvrtc.disassemble(cubin)
    # the four products of a K step back to back (ptxas may peel or unroll the step)
    assert sass.count("HGMMA.64x256x16.F32") % 4 == 0 and "HGMMA" in sass
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass      # wait_group 1 kept
    assert "C7514" not in log and "C7517" not in log and "C7518" not in log
    # compiled as it launches, under __launch_bounds__(384) (a register cap of 170): ptxas
    # 13.5 then takes 168 registers and spills 4 bytes of this opt-in variant (without the
    # bounds, which no launch uses, 154 and none); more would be a regression
    spilled = re.search(r"(\d+) bytes spill stores", log)
    assert spilled and int(spilled.group(1)) <= 4, log


@metile.kernel
def matmul_transposed_out(left, right, output, rows, columns, inner,
                          BLOCK_M: metile.constexpr = 128, BLOCK_N: metile.constexpr = 256,
                          BLOCK_K: metile.constexpr = 64):
    """output (columns, rows) = (left @ right).T: the tile stored with a column slope of
    `rows`, so adjacent accumulator columns are not adjacent in memory."""
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                      block_shape=(BLOCK_K, BLOCK_N), access="read")
    c = metile.tensor(output, shape=(rows, columns), strides=(1, rows),
                      block_shape=(BLOCK_M, BLOCK_N), access="write")
    acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in metile.tile_range(0, inner, BLOCK_K):
        acc = metile.dot(a.load((metile.program_id(0) * BLOCK_M, k)),
                         b.load((k, metile.program_id(1) * BLOCK_N)), acc)
    c.store((metile.program_id(0) * BLOCK_M, metile.program_id(1) * BLOCK_N),
            acc.to(output.dtype))


PAIR = {"float16": "__halves2half2(", "bfloat16": "__halves2bfloat162(", "float32": "make_float2("}


@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16", "float32"])
def test_epilogue_stores_adjacent_columns_as_pairs(out_dtype):
    # each thread's (c, c+1) accumulator pair is one 4- or 8-byte store when both are in
    # bounds and a run-time test found its first pair and the one a row below aligned
    m = n = k = 1000
    dtype = "float16" if out_dtype == "float32" else out_dtype
    d = getattr(mx, dtype)
    a, b = mx.zeros((m, k), dtype=d), mx.zeros((k, n), dtype=d)
    disp = matmul[grid(m, n, 128, 256)].prepare(a, b, mx.zeros((m, n), dtype=getattr(mx, out_dtype)),
                                               m, n, k, **WG, backend="cuda")
    assert "paired_epilogue_stores" in disp.variant.data["passes"]
    body = disp.variant.data["body"]
    # 64 pairs of each thread's 128 accumulators (unrolled in the compiled code)
    assert body.count(PAIR[out_dtype]) == 1
    size = 8 if out_dtype == "float32" else 4
    assert body.count(f"& {size - 1}ull) == 0)") == 2
    if nvrtc.TOOLKIT is not None:
        assert nvrtc.compile_cuda(nvrtc.translation_unit(disp), "sm_90a")[0]


def test_transposed_output_is_stored_element_by_element():
    m = n = k = 1000
    a, b = mx.zeros((m, k), dtype=mx.float16), mx.zeros((k, n), dtype=mx.float16)
    disp = matmul_transposed_out[grid(m, n, 128, 256)].prepare(
        a, b, mx.zeros((n, m), dtype=mx.float16), m, n, k, backend="cuda")
    assert disp.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
    assert "paired_epilogue_stores" not in disp.variant.data["passes"]
    assert "__halves2half2(" not in disp.variant.data["body"]


# -- numbers on the H200 ----------------------------------------------------------------------

def check_products(out, a, b, ref):
    """float32 results of 16-bit products, bounded componentwise by the scale of the sums
    (|A| @ |B|, the dot product's backward-error bound) rather than by the result, which
    cancellation can make arbitrarily small.  The warpgroup products sum in another order
    than mma.sync; seen on the H200: 27 of 1e6 results of 1000-long sums off by up to
    6.9e-5 where |A| @ |B| was ~640 (1.1e-7 of it), above `check`'s atol of 3e-5.  A
    missing or doubled K tile is off by a whole part of the sum, far above 1e-6 of it."""
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    scale = np.abs(np.array(a.astype(mx.float32)).astype(np.float64)) @ \
        np.abs(np.array(b.astype(mx.float32)).astype(np.float64))
    assert got.shape == ref.shape
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err - 1e-6 * scale), err.shape)
    assert (err <= 1e-6 * scale).all(), (worst, got[worst], ref[worst], scale[worst])


RAGGED = [(128, 256, 64), (1000, 1000, 1000), (129, 257, 65), (300, 700, 200), (64, 64, 4096),
          (1, 1, 1)]


def test_whole_group_copies_variant(monkeypatch):
    # METILE_CUDA_WGMMA=whole: a proof before the K loop (one __syncthreads_and) selects a
    # copy of the loop whose copies are one zero-filling cp.async per group, no tests
    monkeypatch.setenv("METILE_CUDA_WGMMA", "whole")
    d = prepare((1000, 1000, 1000))
    assert "whole_group_copies" in d.variant.data["passes"]
    assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
    body = d.variant.data["body"]
    assert body.count("__syncthreads_and(") == 1
    fast = body[body.index("__syncthreads_and("):]
    fast = fast[:fast.index("} else {")]            # the proven branch
    # 12 groups per thread (4 of A, 8 of B) at 3 sites: the 2 prologue tiles and the loop
    assert fast.count("metile_cp_async16_fill(") == 12 * 3
    assert "metile_aligned16(" not in fast and "metile_cp_async16(" not in fast
    monkeypatch.setenv("METILE_CUDA_WGMMA", "1")
    assert "whole_group_copies" not in prepare((1000, 1000, 1000)).variant.data["passes"]


@on_gpu
@pytest.mark.parametrize("variant", ["1", "ws", "whole"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ragged_shapes_on_the_gpu(rng, dtype, variant, monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
    for m, n, k in RAGGED:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = matmul[grid(m, n, 128, 256)].prepare(a, b, mx.zeros((m, n)), m, n, k, **WG)
        assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
        check_products(d(), a, b, ref)


@on_gpu
@pytest.mark.parametrize("variant", ["1", "ws", "whole"])
def test_empty_inner_dimension_gives_zeros_on_the_gpu(rng, variant, monkeypatch):
    # K = 0: no K step runs, so no product ever overwrites the accumulators (the first
    # product's scale-d = 0 stands in for zeroing them ahead of the loop)
    monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
    m, n = 300, 300
    a, b, _ = operands(rng, m, n, 64, "float16")
    out = matmul[grid(m, n, 128, 256)](a, b, mx.full((m, n), 7.0), m, n, 0, **WG)
    np.testing.assert_array_equal(np.array(out), np.zeros((m, n), np.float32))


@on_gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_stage_counts_on_the_gpu(rng, stages):
    m, n, k = 333, 555, 777
    a, b, ref = operands(rng, m, n, k, "bfloat16")
    out = matmul[grid(m, n, 128, 256)](a, b, mx.zeros((m, n)), m, n, k, **WG,
                                         SCHEDULE=Schedule(num_stages=stages))
    check_products(out, a, b, ref)


@on_gpu
@pytest.mark.parametrize("tile", [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64),
                                  dict(BLOCK_M=128, BLOCK_N=192, BLOCK_K=64),
                                  dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64),
                                  dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64),
                                  dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128)])
@pytest.mark.parametrize("variant", ["1", "tma"])
def test_other_warpgroup_tiles_on_the_gpu(rng, tile, variant, monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
    m, n, k = 517, 389, 300
    a, b, ref = operands(rng, m, n, k, "float16")
    out = matmul[grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])](a, b, mx.zeros((m, n)), m, n, k,
                                                             **tile)
    check_products(out, a, b, ref)


@on_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_paired_stores_of_narrow_outputs_on_ragged_shapes_on_the_gpu(rng, dtype, monkeypatch):
    # odd column counts: every row's stride is odd, so the run-time test stores element by
    # element; even ones pair, and the last pair of a ragged edge is stored alone
    monkeypatch.setenv("METILE_CUDA_WGMMA", "whole")
    for m, n, k in RAGGED + [(200, 258, 64), (130, 2, 70)]:
        a, b, ref = operands(rng, m, n, k, dtype)
        out = matmul[grid(m, n, 128, 256)](a, b, mx.zeros((m, n), dtype=getattr(mx, dtype)),
                                           m, n, k, **WG)
        check(out, ref, dtype)


@on_gpu
def test_transposed_output_on_the_gpu(rng):
    m, n, k = 300, 258, 130
    a, b, ref = operands(rng, m, n, k, "float16")
    out = matmul_transposed_out[grid(m, n, 128, 256)](a, b, mx.zeros((n, m)), m, n, k)
    check_products(out.T, a, b, ref)


@on_gpu
def test_fused_epilogue_and_narrow_output_on_the_gpu(rng):
    m, n, k = 1000, 1000, 1000
    a, b, ref = operands(rng, m, n, k, "float16")
    out = matmul_epilogue[grid(m, n, 128, 256)](a, b, mx.zeros((m, n), dtype=mx.float16), m, n,
                                                k, 1.25, -0.5, **WG, EPILOGUE="affine_leaky",
                                                NEGATIVE_SLOPE=0.1)
    z = 1.25 * ref - 0.5
    check(out, np.where(z > 0, z, 0.1 * z), "float16")


@on_gpu
@pytest.mark.parametrize("variant", ["1", "whole"])
def test_offset_view_operands_on_the_gpu(rng, variant, monkeypatch):
    # A view starting 1 element in: the 16-byte copies fall back to element copies.
    monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
    m, n, k = 200, 256, 128
    a, b, ref = operands(rng, m, n + 1, k, "float16")
    bv = b[:, 1:]
    ref = ref[:, 1:]
    out = matmul[grid(m, n, 128, 256)](a, bv, mx.zeros((m, n)), m, n, k, **WG)
    check_products(out, a, bv, ref)


@on_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant, epilogue, width", [("1", "none", 256), ("tma", "relu", 256),
                                                      ("tma", "relu", 192)])
def test_linear_weight_layout_on_the_gpu(rng, dtype, variant, epilogue, width, monkeypatch):
    # bias (+ relu) epilogue, weight read as stored (N, K), ragged sizes; under tma one
    # K-major box per stage (also 192 rows: a box that is not a power of two)
    monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
    m, n, k = 300, 520, 200
    d = getattr(mx, dtype)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(d)
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(d)
    bias = mx.array(rng.standard_normal((n,)).astype(np.float32)).astype(d)
    tile = {**WG, "BLOCK_N": width}
    out = linear_epilogue[grid(m, n, 128, width)](x, w, mx.zeros((m, n)), bias, x, m, n, k,
                                                  **tile, TRANSPOSE_B=True, BIAS="columns",
                                                  EPILOGUE=epilogue)
    X, W, B = (np.array(t.astype(mx.float32)).astype(np.float64) for t in (x, w, bias))
    ref = X @ W.T + B
    check(out, np.maximum(ref, 0) if epilogue == "relu" else ref)


def test_cached_launches_follow_the_setting(monkeypatch, rng):
    # a repeated kernel[grid] launch resolved before METILE_CUDA_WGMMA changed is not reused
    m, n, k = 40, 30, 20
    a, b, ref = operands(rng, m, n, k, "float32")
    launch = matmul[grid(m, n, 32, 32)]
    for variant in ("0", "ws", "0"):
        monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
        check(launch(a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16), ref)
    # the launch key holds the raw values of the settings it depends on (bytes where
    # os.environ's own dict is read: settings.raw_values), then the device type
    at = dispatch._LAUNCH_VARIABLES.index("METILE_CUDA_WGMMA")
    seen = {key[3][at] for key in matmul._launches}
    assert {"0", "ws"} <= {v.decode() if isinstance(v, bytes) else v for v in seen if v is not None}
