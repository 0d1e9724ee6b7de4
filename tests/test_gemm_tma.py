"""Bulk tensor copies (TMA) for the warpgroup GEMM (METILE_CUDA_WGMMA=tma; passes/gemm_wgmma.py
bulk_tensor_form, runtime/tensor_maps.py, issue 13).

On this machine: which kernels the proof accepts and refuses, the emitted loop and launch
record (template input, scratch output), NVRTC's SASS for sm_90a (UTMALDG, one product
group in flight, no spills), the launch's arguments with a stand-in binding, and the
driver's absence as a clear error.  On an H200: the numbers against NumPy on ragged
shapes, offset views (which take the cp.async loops), K = 0, both dtypes and the
pointer-form GEMM (a Linear's weight read K-major: test_gemm_wgmma, by variant).
"""

import shutil

import mlx.core as mx
import numpy as np
import pytest

import metile
import nvrtc
from dsl_kernels import matmul as pointer_matmul
from metile.errors import LaunchError
from metile.runtime import tensor_maps
from metile_kernels.gemm import grid, matmul, matmul_epilogue
from test_gemm import operands
from test_gemm_wgmma import RAGGED, check_products, linear_prepare

WG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)
on_gpu = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                            reason="needs MLX's CUDA backend on a GPU")
needs_sass = pytest.mark.skipif(nvrtc.TOOLKIT is None or (
    shutil.which("nvdisasm") is None and nvrtc.nvdisasm() is None),
    reason="needs the nvidia-cuda-* wheels and nvdisasm")


@pytest.fixture(autouse=True)
def tma_variant(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "tma")


def prepare(m, n, k, dtype="float16", kernel=matmul, tile=WG, args=(), **kw):
    z = mx.zeros
    return kernel[grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])].prepare(
        z((m, k), dtype=getattr(mx, dtype)), z((k, n), dtype=getattr(mx, dtype)), z((m, n)),
        m, n, k, *args, **tile, **kw, backend="cuda")


def tma_branch(body: str) -> str:
    """The loop selected by the bulk-tensor proof (the first __syncthreads_and)."""
    start = body.index("__syncthreads_and(")
    return body[start:body.index("} else {", start)]


def test_library_gemm_takes_bulk_tensor_copies():
    d = prepare(1000, 1000, 1000)
    data = d.variant.data
    assert "bulk_tensor_copies" in data["passes"] and "whole_group_copies" in data["passes"]
    launch = data["lowering"]["launch"]
    # A: boxes of 64 K x 128 rows; B (row-major): 4 boxes of 64 N x 64 K per stage
    assert launch["tensor_maps"] == [{"dtype": "float16", "box": [64, 128]},
                                     {"dtype": "float16", "box": [64, 64]}]
    assert data["inputs"][-1] == "metile_tmap_template"
    assert data["outputs"] == ["output", "metile_tmap_slots"]
    fast = tma_branch(data["body"])
    # 5 boxes at each of 3 sites (the 2 prologue tiles and the loop), no cp.async
    assert fast.count("metile_tma_load2d(") == 15
    assert "cp_async" not in fast and "metile_mbar_wait(" in fast
    assert fast.count("metile_tma_encode(") == 2 and fast.count("metile_tma_publish(") == 2


def test_linear_weight_is_one_k_major_box_per_stage():
    d = linear_prepare((300, 512, 256), "bfloat16")
    launch = d.variant.data["lowering"]["launch"]
    assert launch["tensor_maps"] == [{"dtype": "bfloat16", "box": [64, 128]},
                                     {"dtype": "bfloat16", "box": [64, 256]}]


def test_pointer_form_gemm_takes_bulk_tensor_copies():
    m = n = k = 512
    z = mx.zeros
    d = pointer_matmul[(m // 128, n // 256)].prepare(
        z((m, k), dtype=mx.float16), z((k, n), dtype=mx.float16), z((m, n)), m, n, k,
        BM=128, BN=256, BK=64, num_simdgroups=8, backend="cuda")
    assert "bulk_tensor_copies" in d.variant.data["passes"]


@metile.kernel
def matmul_other_masks(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
                       BK: metile.constexpr, FORM: metile.constexpr):
    """A's mask with a conjunct that is not a bound ("extra": rm >= 1), or with its rows
    unmasked ("rows unmasked": no extent along them): no tensor map reads like either."""
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        if FORM == "extra":
            a_mask = (rm[:, None] < M) & (rk[None, :] < K) & (rm[:, None] >= 1)
        else:
            a_mask = rk[None, :] < K
        a = metile.load(A + rm[:, None] * K + rk[None, :], mask=a_mask)
        b = metile.load(B + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = metile.dot(a, b, acc)
    metile.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.mark.parametrize("form", ["extra", "rows unmasked"])
def test_masks_that_are_not_bounds_keep_the_cp_async_loops(form):
    m = n = k = 512
    z = mx.zeros
    d = matmul_other_masks[(m // 128, n // 256)].prepare(
        z((m, k), dtype=mx.float16), z((k, n), dtype=mx.float16), z((m, n)), m, n, k,
        BM=128, BN=256, BK=64, FORM=form, num_simdgroups=8, backend="cuda")
    data = d.variant.data
    assert data["lowering"]["matmul"]["fragment"].startswith("wgmma")
    assert "bulk_tensor_copies" not in data["passes"]
    assert "tensor_maps" not in data["lowering"]["launch"]
    assert "metile_tmap_template" not in data["inputs"]


def test_other_variants_take_no_tensor_maps(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "whole")
    data = prepare(1000, 1000, 1000).variant.data
    assert "bulk_tensor_copies" not in data["passes"] and "metile_tma" not in data["body"]


@needs_sass
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("refill", ["empty", "barrier"])
def test_sass_has_bulk_tensor_copies_and_keeps_a_product_group_in_flight(dtype, refill,
                                                                           monkeypatch):
    monkeypatch.setenv("METILE_WGMMA_REFILL", refill)
    d = prepare(1000, 1000, 1000, dtype, matmul_epilogue, args=(1.5, 0.25), EPILOGUE="relu")
    cubin, log = nvrtc.cubin(nvrtc.translation_unit(d), "sm_90a", ["--ptxas-options=-v"])
    sass = nvrtc.disassemble(cubin)
    assert "UTMALDG.2D" in sass and "UTMACCTL" in sass      # the copies; the map's fence
    # every loop (bulk tensor, whole groups, checked copies) keeps wait_group 1 (with empty
    # barriers the SASS holds two more of them: ptxas lays the bulk-tensor loop's wait out
    # more than once)
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == (3 if refill == "barrier" else 5)
    assert "C751" not in log and "0 bytes spill stores" in log


@needs_sass
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_refills_by_empty_barriers(dtype, monkeypatch):
    # the default (METILE_WGMMA_REFILL=empty): no block barrier in the loop; every warp
    # releases the stage it finished and thread 0 waits for that before refilling it
    monkeypatch.delenv("METILE_WGMMA_REFILL", raising=False)
    d = prepare(1000, 1000, 1000, dtype)
    assert "empty_barrier_refills" in d.execution_report.passes
    loop = tma_branch(d.variant.data["body"])
    loop = loop[loop.index("for (int _"):]   # the K loop
    assert "__syncthreads()" not in loop
    assert "metile_mbar_arrive(" in loop and loop.count("metile_mbar_wait(") == 2
    assert "metile_mbar_init_count(" in d.variant.data["body"]
    cubin, log = nvrtc.cubin(nvrtc.translation_unit(d), "sm_90a", ["--ptxas-options=-v"])
    assert "0 bytes spill stores" in log
    assert nvrtc.disassemble(cubin).count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 1
    # "barrier": a block barrier a K step orders the refills instead
    monkeypatch.setenv("METILE_WGMMA_REFILL", "barrier")
    d = prepare(1000, 1000, 1000, dtype)
    loop = tma_branch(d.variant.data["body"])
    loop = loop[loop.index("for (int _"):]
    assert "empty_barrier_refills" not in d.execution_report.passes
    assert "__syncthreads()" in loop and "metile_mbar_arrive(" not in loop
    monkeypatch.setenv("METILE_WGMMA_REFILL", "fence")
    with pytest.raises(ValueError, match="METILE_WGMMA_REFILL='fence' is not one of barrier, empty"):
        prepare(1000, 1000, 1000, dtype)


def test_prepared_off_the_gpu_the_template_is_zeros():
    d = prepare(300, 300, 300)
    template = d.call_kwargs["inputs"][-1]
    assert template.dtype == mx.uint8 and template.shape == (256,)
    # the scratch: 2 maps of 128 bytes for each of the 3 x 2 blocks
    assert d.call_kwargs["output_shapes"][-1] == (3 * 2 * 256,)
    assert d.call_kwargs["output_dtypes"][-1] == mx.uint8
    assert d.results == 1


def test_without_the_driver_the_error_names_it(monkeypatch):
    import ctypes

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    tensor_maps._driver.cache_clear()
    tensor_maps._templates.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", missing)
    try:
        with pytest.raises(LaunchError, match="cuTensorMapEncodeTiled.*METILE_CUDA_WGMMA=whole"):
            tensor_maps.templates([{"dtype": "float16", "box": [64, 128]}])
    finally:
        tensor_maps._driver.cache_clear()


@pytest.mark.skipif(nvrtc.TOOLKIT is None, reason="needs the nvidia-cuda-* wheels")
@pytest.mark.parametrize("scalars", ["value", "array"])
def test_launch_hands_the_template_and_scratch_to_the_binding(monkeypatch, scalars, stand_in_gpu):
    from metile import _ext
    monkeypatch.setenv("METILE_CUDA_SCALARS", scalars)
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")   # this tests MLX's precompiled binding
    seen = []
    monkeypatch.setattr(_ext, "launch_precompiled_cuda", lambda *args: seen.append(args) or
                        [mx.zeros((130, 70)), mx.zeros((512,), dtype=mx.uint8)])
    d = prepare(130, 70, 90)
    outs = d.variant.callable()(**d.call_kwargs)
    name, cubin, inputs, shapes, dtypes, *_, values = seen[-1]
    if scalars == "value":   # rows, columns, inner as kernel parameters
        assert [x.shape for x in inputs] == [(130, 90), (90, 70), (256,)] and values == [130, 70, 90]
    else:
        assert [x.shape for x in inputs] == [(130, 90), (90, 70), (), (), (), (256,)] and values == []
    assert shapes == [[130, 70], [2 * 1 * 256]] and cubin[:4] == b"\x7fELF"
    assert len(outs) == 2   # Dispatch._launch keeps the first `results` of them


# -- numbers on the H200 ----------------------------------------------------------------------

@on_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ragged_shapes_on_the_gpu(rng, dtype):
    for m, n, k in RAGGED + [(4096, 256, 4096), (257, 1000, 4160)]:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = matmul[grid(m, n, 128, 256)].prepare(a, b, mx.zeros((m, n)), m, n, k, **WG)
        assert "bulk_tensor_copies" in d.variant.data["passes"]
        check_products(d(), a, b, ref)


@on_gpu
def test_relaunch_reuses_the_template_on_the_gpu(rng):
    for m, n, k in [(300, 500, 700), (300, 500, 700), (128, 256, 64)]:
        a, b, ref = operands(rng, m, n, k, "float16")
        out = matmul[grid(m, n, 128, 256)](a, b, mx.zeros((m, n)), m, n, k, **WG)
        check_products(out, a, b, ref)


@on_gpu
def test_empty_inner_dimension_gives_zeros_on_the_gpu(rng):
    m, n = 300, 300
    a, b, _ = operands(rng, m, n, 64, "float16")
    out = matmul[grid(m, n, 128, 256)](a, b, mx.full((m, n), 7.0), m, n, 0, **WG)
    np.testing.assert_array_equal(np.array(out), np.zeros((m, n), np.float32))


@on_gpu
@pytest.mark.parametrize("offset", ["a", "b", "odd stride"])
def test_views_the_proof_refuses_run_the_copies_on_the_gpu(rng, offset):
    m, n, k = 200, 256, 130
    a, b, ref = operands(rng, m, n + 1, k + 1, "float16")
    av, bv = a[:, :k], b[:k, :n]
    if offset == "a":
        av = a[:, 1:]
    elif offset == "b":
        bv = b[1:, 1:]
    ref = np.array(av.astype(mx.float32)).astype(np.float64) @ \
        np.array(bv.astype(mx.float32)).astype(np.float64)
    out = matmul[grid(m, n, 128, 256)](av, bv, mx.zeros((m, n)), m, n, k, **WG)
    check_products(out, av, bv, ref)


@on_gpu
def test_pointer_form_on_the_gpu(rng):
    m, n, k = 300, 700, 333
    a, b, ref = operands(rng, m, n, k, "float16")
    out = pointer_matmul[(-(-m // 128), -(-n // 256))](a, b, mx.zeros((m, n)), m, n, k,
                                                       BM=128, BN=256, BK=64, num_simdgroups=8)
    check_products(out, a, b, ref)
