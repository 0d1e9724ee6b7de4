"""Dual GEMM (passes/gemm.py, lower_matmul.py): a K loop carrying two dot recurrences
that share the left operand, act(A @ B1) * (A @ B2), lowered as one fused GEMM (A staged
once, both B tiles staged, two accumulator sets, one epilogue over both).

Numbers on the CPU runtime (race and bounds checks on, conftest.py) against float64
NumPy products of the same rounded inputs: the library kernel `gated_mlp` over ragged
shapes, dtypes and activations; Triton-style pointer kernels (the shared A as one load or
as two equal loads); two recurrences of different left operands (the general lowering);
`metile.ops.gated_mlp` against MLX's composite, gradients included, per backend.  The
CUDA emission (mma.sync from ordinary staging, and the cp.async ring for 16-bit
row-major operands) is compiled with NVRTC; the MSL passes the strict check."""

import json

import mlx.core as mx
import numpy as np
import pytest

import metile
import metile.ops as ops
from conftest import requires_msl_device
from metile.runtime import routing
from metile.settings import SettingError
from metile_kernels.gemm import gated_mlp, grid
from nvrtc import TOOLKIT, compile_cuda, translation_unit

SHAPES = [(75, 45, 37), (1, 1, 1), (130, 70, 200)]
# float32: strict FP32 products; 16-bit: operands exact, one rounding of the output
TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float16": dict(rtol=2e-3, atol=2e-3),
       "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}


def _act(g, activation):
    if activation == "silu":
        return g / (1.0 + np.exp(-g))
    if activation == "relu":
        return np.maximum(g, 0.0)
    return 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))


def _rounded(rng, shape, dtype, scale=1.0):
    a = mx.array((scale * rng.standard_normal(shape)).astype(np.float32)).astype(
        getattr(mx, dtype))
    return a, np.array(a.astype(mx.float32)).astype(np.float64)


def _check(out, ref, dtype):
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    scale = max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(got / scale, ref / scale, **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_library_kernel_ragged(rng, dtype):
    for m, n, k in SHAPES:
        x, X = _rounded(rng, (m, k), dtype, 1 / np.sqrt(k))
        wg, WG = _rounded(rng, (n, k), dtype)
        wu, WU = _rounded(rng, (n, k), dtype)
        for activation in ("silu", "gelu_tanh", "relu"):
            d = gated_mlp[grid(m, n)].prepare(x, wg, wu, mx.zeros((m, n), x.dtype), m, n, k,
                                              ACTIVATION=activation)
            mm = d.variant.data["lowering"]["matmul"]
            assert mm["products"] == 2 and "lower_matmul" in d.variant.data["passes"]
            _check(d(), _act(X @ WG.T, activation) * (X @ WU.T), dtype)


@metile.kernel
def dual_pointer(x_ptr, g_ptr, u_ptr, o_ptr, M, N, K, stride_xm, stride_wk, stride_om,
                 BLOCK_M: metile.constexpr, BLOCK_N: metile.constexpr,
                 BLOCK_K: metile.constexpr, TWO_LOADS: metile.constexpr = False):
    # Triton style: pointers advanced every K step, `acc += dot` and `acc = dot(.., acc)`.
    pid_m = metile.program_id(0)
    pid_n = metile.program_id(1)
    offs_m = pid_m * BLOCK_M + metile.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + metile.arange(0, BLOCK_N)
    offs_k = metile.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    g_ptrs = g_ptr + offs_k[:, None] * stride_wk + offs_n[None, :]
    u_ptrs = u_ptr + offs_k[:, None] * stride_wk + offs_n[None, :]
    acc_g = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    acc_u = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in range(0, metile.cdiv(K, BLOCK_K)):
        left = K - k * BLOCK_K
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < left)
        b_mask = (offs_k[:, None] < left) & (offs_n[None, :] < N)
        a = metile.load(x_ptrs, mask=a_mask, other=0.0)
        acc_g += metile.dot(a, metile.load(g_ptrs, mask=b_mask, other=0.0))
        if TWO_LOADS:   # the shared operand written twice: equal load expressions
            a = metile.load(x_ptrs, mask=a_mask, other=0.0)
        acc_u = metile.dot(a, metile.load(u_ptrs, mask=b_mask, other=0.0), acc_u)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk
    out = acc_g * metile.sigmoid(acc_g) * acc_u
    o_ptrs = o_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    metile.store(o_ptrs, out.to(o_ptr.dtype), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _pointer_call(rng, m, n, k, dtype, bm=32, bn=32, bk=16, **kw):
    x, X = _rounded(rng, (m, k), dtype, 1 / np.sqrt(k))
    wg, WG = _rounded(rng, (k, n), dtype)
    wu, WU = _rounded(rng, (k, n), dtype)
    d = dual_pointer[(metile.cdiv(m, bm), metile.cdiv(n, bn))].prepare(
        x, wg, wu, mx.zeros((m, n), x.dtype), m, n, k, k, n, n, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=bk, **kw)
    return d, _act(X @ WG, "silu") * (X @ WU)


@requires_msl_device   # the MSL lowering's fragments and allocations
@pytest.mark.parametrize("two_loads", [False, True])
def test_pointer_kernel_takes_the_dual_lowering(rng, two_loads):
    for m, n, k in [(75, 45, 37), (64, 64, 64)]:
        d, ref = _pointer_call(rng, m, n, k, "float32", TWO_LOADS=two_loads)
        data = d.variant.data
        assert "lower_matmul" in data["passes"] and "pointer_recurrence" in data["passes"]
        mm = data["lowering"]["matmul"]
        assert mm["products"] == 2 and mm["fragment"] == "simdgroup_matrix 8x8"
        # A is staged once: one A stage, two B stages
        names = [a["name"] for a in d.execution_report.to_dict()["allocations"]]
        assert sum(n.startswith("_sa") for n in names) == 1
        assert sum(n.startswith("_sb") for n in names) == 2
        _check(d(), ref, "float32")


def test_ffma_path(rng):
    # A 20-column tile is no whole number of 8x8 fragments: FFMA micro-tiles, two per thread.
    d, ref = _pointer_call(rng, 40, 30, 21, "float32", bm=32, bn=20, bk=8)
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["fragment"] == "ffma" and mm["products"] == 2
    _check(d(), ref, "float32")


@pytest.mark.parametrize("schedule", [dict(double_buffer=True), dict(vector_width=4)])
def test_specialized_schedule(rng, schedule):
    # Known sizes: the K loop split with guards proven, then both B stages double-buffered
    # or copied 4 wide (row-major weights).
    m, n, k = 70, 72, 40
    x, X = _rounded(rng, (m, k), "float16", 1 / np.sqrt(k))
    wg, WG = _rounded(rng, (k, n), "float16")
    wu, WU = _rounded(rng, (k, n), "float16")
    d = gated_mlp[grid(m, n, 32, 32)].prepare(
        x, wg, wu, mx.zeros((m, n), x.dtype), m, n, k, BLOCK_M=32, BLOCK_N=32, BLOCK_K=8,
        TRANSPOSE_B=False, SCHEDULE=metile.Schedule(**schedule))
    passes = d.variant.data["passes"]
    assert "split_k_loop" in passes and d.variant.data["lowering"]["matmul"]["products"] == 2
    assert ("double_buffer_staging" if "double_buffer" in schedule else "vectorize_staging") \
        in passes
    _check(d(), _act(X @ WG, "silu") * (X @ WU), "float16")


@metile.kernel
def two_left_operands(x_ptr, y_ptr, w_ptr, o_ptr, M, N, K, BLOCK_M: metile.constexpr,
                      BLOCK_N: metile.constexpr, BLOCK_K: metile.constexpr):
    offs_m = metile.program_id(0) * BLOCK_M + metile.arange(0, BLOCK_M)
    offs_n = metile.program_id(1) * BLOCK_N + metile.arange(0, BLOCK_N)
    offs_k = metile.arange(0, BLOCK_K)
    acc1 = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    acc2 = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in metile.tile_range(0, K, BLOCK_K):
        am = (offs_m[:, None] < M) & (k + offs_k[None, :] < K)
        bm = (k + offs_k[:, None] < K) & (offs_n[None, :] < N)
        w = metile.load(w_ptr + (k + offs_k[:, None]) * N + offs_n[None, :], mask=bm, other=0.0)
        a1 = metile.load(x_ptr + offs_m[:, None] * K + k + offs_k[None, :], mask=am, other=0.0)
        a2 = metile.load(y_ptr + offs_m[:, None] * K + k + offs_k[None, :], mask=am, other=0.0)
        acc1 = metile.dot(a1, w, acc1)
        acc2 = metile.dot(a2, w, acc2)
    metile.store(o_ptr + offs_m[:, None] * N + offs_n[None, :], metile.maximum(acc1, 0.0) * acc2,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def test_two_recurrences_of_different_left_operands_take_the_general_lowering(rng):
    m, n, k = 20, 12, 19
    x, X = _rounded(rng, (m, k), "float32")
    y, Y = _rounded(rng, (m, k), "float32")
    w, W = _rounded(rng, (k, n), "float32")
    d = two_left_operands[(2, 1)].prepare(x, y, w, mx.zeros((m, n)), m, n, k, BLOCK_M=16,
                                          BLOCK_N=16, BLOCK_K=8)
    assert "matmul" not in d.variant.data["lowering"]
    np.testing.assert_allclose(np.array(d()), np.maximum(X @ W, 0) * (Y @ W), rtol=2e-4,
                               atol=2e-4)


@requires_msl_device   # the 32 KiB of threadgroup memory of the Metal targets
def test_plan_counts_both_b_tiles():
    # 64x64x32 float16: one A tile (4 KiB) and two B tiles (8 KiB) per stage
    d = gated_mlp[grid(64, 64)].prepare(
        *(mx.zeros(s, mx.float16) for s in ((64, 32), (64, 32), (64, 32), (64, 64))),
        64, 64, 32, BLOCK_K=32)
    assert "(12288 bytes per stage)" in " ".join(d.execution_report.plan.reasons)
    # float32 64x64x48: one B tile would fit 32 KiB (24 KiB a stage), two do not (36 KiB)
    with pytest.raises(metile.CompilationError, match=r"staging='threadgroup': one 64x48 \+ 2 "
                                                      r"48x64 operand stage .* need 36864 bytes"):
        gated_mlp[grid(64, 64)].prepare(
            *(mx.zeros(s, mx.float32) for s in ((64, 48), (64, 48), (64, 48), (64, 64))),
            64, 64, 48, BLOCK_K=48, SCHEDULE=metile.Schedule(staging="threadgroup"))


def test_wgmma_takes_both_products_where_their_accumulators_fit(monkeypatch):
    # 128x128x64 on two warpgroups: both products on the warpgroup MMA (a 64x128
    # accumulator tile each per warpgroup, 128 floats per thread together); on one
    # warpgroup they would need 256 per thread: the warp MMA, and the plan says why.
    monkeypatch.setenv("METILE_CUDA_WGMMA", "1")
    d = _cuda_gated(128, 128, 64, 8, transpose_b=True)
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["fragment"].startswith("wgmma") and mm["products"] == 2
    assert "warpgroup_mma" in d.variant.data["passes"]
    reasons = d.execution_report.plan.reasons
    assert any("Dual GEMM" in r and "warpgroup MMAs" in r for r in reasons)
    narrow = _cuda_gated(128, 128, 64, 4, transpose_b=False)
    mm = narrow.variant.data["lowering"]["matmul"]
    assert mm["fragment"].startswith("mma.sync") and mm["products"] == 2
    reasons = narrow.execution_report.plan.reasons
    assert any("Dual GEMM" in r and "more than 128 floats per thread" in r for r in reasons)
    assert not any(r.startswith("Warpgroup MMA") for r in reasons)


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
@pytest.mark.parametrize("transpose_b", [True, False])
@pytest.mark.parametrize("shape", [(256, 256, 256), (200, 300, 100)])
def test_wgmma_dual_compiles_without_serialized_products(monkeypatch, transpose_b, shape):
    # both layouts of the weights, whole and ragged tiles; ptxas serializes every wgmma
    # when non-wgmma code touches accumulator registers (warnings C7514/C7515)
    monkeypatch.setenv("METILE_CUDA_WGMMA", "1")
    d = _cuda_gated(128, 128, 64, 8, transpose_b, mx.float16, *shape)
    assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
    allocations = d.execution_report.to_dict()["allocations"]
    # the A stages and one stage array per product's B
    assert sum(a["name"].startswith("_sw") for a in allocations) == 3
    ok, log = compile_cuda(translation_unit(d), "sm_90a")
    assert ok, log
    assert "C7514" not in log and "C7515" not in log and "spill" not in log.replace(
        "0 bytes spill", "")


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
@pytest.mark.parametrize("variant", ["tma", "1", "whole"])
def test_joined_dual_products_compile_as_one_product(monkeypatch, variant):
    # METILE_WGMMA_DUAL=joined: the two weights' tiles adjacent in one stage array and one
    # m64n256 product over both per 64 rows and K step, the TMA and cp.async copies placing
    # the up tile 128 rows after the gate's; ragged and whole tiles
    monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
    monkeypatch.setenv("METILE_WGMMA_DUAL", "joined")
    for shape in ((256, 256, 256), (200, 300, 100)):
        d = _cuda_gated(128, 128, 64, 8, True, mx.float16, *shape)
        assert "joined_dual_products" in d.variant.data["passes"]
        allocations = d.execution_report.to_dict()["allocations"]
        assert sum(a["name"].startswith("_sw") for a in allocations) == 2   # A, both Bs
        source = translation_unit(d)
        assert "m64n256k16" in source and "m64n128k16" not in source
        ok, log = compile_cuda(source, "sm_90a")
        assert ok, log
        assert "C7514" not in log and "C7515" not in log and "spill" not in log.replace(
            "0 bytes spill", "")
    # weights read as their transposes (N-major B), or a 64-deep K step missing: split
    narrow = _cuda_gated(128, 128, 64, 8, False, mx.float16)
    assert "joined_dual_products" not in narrow.variant.data["passes"]
    assert "joined_dual_products" not in _cuda_gated(
        128, 128, 32, 8, True, mx.float16).variant.data["passes"]
    monkeypatch.setenv("METILE_WGMMA_DUAL", "merged")
    with pytest.raises(SettingError, match="METILE_WGMMA_DUAL=.merged. is not "
                                                         "one of split, joined"):
        _cuda_gated(128, 128, 64, 8, True, mx.float16)


@pytest.mark.skipif(not (mx.default_device().type == mx.gpu and mx.cuda.is_available()),
                    reason="the warpgroup MMA runs on an NVIDIA sm_90 GPU")
@pytest.mark.parametrize("dual", ["split", "joined"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("transpose_b", [True, False])
def test_wgmma_dual_on_the_gpu(rng, dtype, transpose_b, dual, monkeypatch):
    monkeypatch.setenv("METILE_WGMMA_DUAL", dual)
    for m, n, k in [(200, 300, 100), (256, 384, 512), (1, 130, 64), (129, 128, 200)]:
        x, X = _rounded(rng, (m, k), dtype, 1 / np.sqrt(k))
        wg, WG = _rounded(rng, (n, k) if transpose_b else (k, n), dtype)
        wu, WU = _rounded(rng, (n, k) if transpose_b else (k, n), dtype)
        if not transpose_b:
            WG, WU = WG.T, WU.T
        for activation in ("silu", "relu"):
            d = gated_mlp[grid(m, n, 128, 128)].prepare(
                x, wg, wu, mx.zeros((m, n), x.dtype), m, n, k, BLOCK_M=128, BLOCK_N=128,
                BLOCK_K=64, num_simdgroups=8, ACTIVATION=activation, TRANSPOSE_B=transpose_b)
            assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
            _check(d(), _act(X @ WG.T, activation) * (X @ WU.T), dtype)


@requires_msl_device
def test_tensor_ops_target_plans_the_simdgroup_path(rng):
    # apple10's tensor_ops / nax paths take one product: the SIMD-group path, said so
    m, n, k = 40, 48, 24
    x, X = _rounded(rng, (m, k), "float16", 1 / np.sqrt(k))
    wg, WG = _rounded(rng, (n, k), "float16")
    wu, WU = _rounded(rng, (n, k), "float16")
    d = gated_mlp[grid(m, n)].prepare(x, wg, wu, mx.zeros((m, n), x.dtype), m, n, k,
                                      target="apple10")
    assert d.variant.data["lowering"]["matmul"]["fragment"] == "simdgroup_matrix 8x8"
    assert any("dual GEMM" in r for r in d.execution_report.plan.reasons)
    _check(d(), _act(X @ WG.T, "silu") * (X @ WU.T), "float16")
    with pytest.raises(metile.CompilationError, match="the tensor_ops lowering takes one product"):
        gated_mlp[grid(m, n)].prepare(x, wg, wu, mx.zeros((m, n), x.dtype), m, n, k,
                                      target="apple10",
                                      SCHEDULE=metile.Schedule(backend="tensor_ops"))


def _cuda_gated(bm, bn, bk, nsg, transpose_b, dtype=mx.float16, m=256, n=256, k=256):
    x = mx.zeros((m, k), dtype)
    w = mx.zeros((n, k) if transpose_b else (k, n), dtype)
    return gated_mlp[grid(m, n, bm, bn)].prepare(
        x, w, w, mx.zeros((m, n), dtype), m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_simdgroups=nsg, TRANSPOSE_B=transpose_b, backend="cuda")


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
@pytest.mark.parametrize("transpose_b", [True, False])
def test_cuda_emission_compiles(transpose_b):
    d = _cuda_gated(64, 64, 32, 4, transpose_b)
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["products"] == 2 and mm["fragment"].startswith("mma.sync")
    # Row-major 16-bit weights take the cp.async ring; transposed ones ordinary staging.
    assert mm["async_copy"] is (not transpose_b)
    if not transpose_b:
        assert len(mm["shared_layout"]) == 3
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
def test_cuda_tf32_scratch_epilogue_compiles():
    # Relaxed float32 runs mma.sync tf32, whose epilogue goes through a shared scratch:
    # one per product.
    x = mx.zeros((100, 48), mx.float32)
    d = gated_mlp[grid(100, 80)].prepare(x, mx.zeros((80, 48)), mx.zeros((80, 48)),
                                         mx.zeros((100, 80)), 100, 80, 48, BLOCK_K=16,
                                         RELAXED_PRECISION=True, backend="cuda")
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["products"] == 2 and "tf32" in mm["fragment"]
    assert mm["epilogue_from"] == "shared-memory scratch"
    allocations = d.execution_report.to_dict()["allocations"]
    assert sum(a["name"].startswith("_sc") for a in allocations) == 2
    ok, log = compile_cuda(translation_unit(d), "sm_80")
    assert ok, log


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
def test_cuda_pointer_kernel_async_and_float32(rng):
    x16 = mx.zeros((96, 40), mx.float16)
    w16 = mx.zeros((40, 72), mx.float16)
    for x, w in ((x16, w16), (x16.astype(mx.float32), w16.astype(mx.float32))):
        d = dual_pointer[(2, 2)].prepare(x, w, w, mx.zeros((96, 72), x.dtype), 96, 72, 40, 40,
                                         72, 72, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32,
                                         backend="cuda")
        mm = d.variant.data["lowering"]["matmul"]
        assert mm["products"] == 2
        # float16: mma.sync from the cp.async ring; strict float32: FFMA micro-tiles (two
        # sets, 16-byte operand reads) from the same ring
        assert mm["async_copy"]
        if x.dtype == mx.float32:
            assert mm["fragment"] == "ffma" and "ffma_vector_reads" in d.variant.data["passes"]
        ok, log = compile_cuda(translation_unit(d), "sm_80")
        assert ok, log


# -- metile.ops.gated_mlp ----------------------------------------------------------------------

@pytest.fixture
def routing_cache(tmp_path, monkeypatch):
    directory = tmp_path / "routing"
    monkeypatch.setattr(routing, "routing_dir", lambda: directory)
    monkeypatch.delenv("METILE_OPS_TUNE", raising=False)
    routing.clear_memory()
    yield directory
    routing.clear_memory()


def _weights(rng, n, k, dtype):
    return (_rounded(rng, (n, k), dtype, 1 / np.sqrt(k)) for _ in range(2))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu"])
def test_op_matches_mlx_and_numpy(rng, dtype, activation):
    for lead, n, k in [((2, 3), 45, 37), ((), 7, 16), ((1,), 1, 1)]:
        x, X = _rounded(rng, (*lead, k), dtype)
        (wg, WG), (wu, WU) = _weights(rng, n, k, dtype)
        got = ops.gated_mlp(x, wg, wu, activation, backend="metile")
        ref = ops.gated_mlp(x, wg, wu, activation, backend="mlx")
        assert got.shape == ref.shape == (*lead, n) and got.dtype == x.dtype
        _check(got, _act(X @ WG.T, activation) * (X @ WU.T), dtype)
        _check(got, np.array(ref.astype(mx.float32)).astype(np.float64), dtype)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu"])
def test_op_gradients_match_mlx(rng, activation):
    x, _ = _rounded(rng, (2, 5, 24), "float32")
    (wg, _), (wu, _) = _weights(rng, 19, 24, "float32")
    cot = mx.array(rng.standard_normal((2, 5, 19)).astype(np.float32))

    def loss(backend):
        return lambda *a: (ops.gated_mlp(*a, activation, backend=backend) * cot).sum()

    def composite(x, wg, wu):
        return (ops.activate(x @ wg.T, activation) * (x @ wu.T) * cot).sum()

    got = mx.grad(loss("metile"), argnums=(0, 1, 2))(x, wg, wu)
    want = mx.grad(composite, argnums=(0, 1, 2))(x, wg, wu)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=1e-4)
    # and through mx.compile
    compiled = mx.compile(lambda *a: ops.gated_mlp(*a, activation, backend="metile"))
    np.testing.assert_allclose(np.array(compiled(x, wg, wu)),
                               np.array(ops.gated_mlp(x, wg, wu, activation, backend="mlx")),
                               rtol=2e-4, atol=2e-4)


def test_auto_routes_by_measurement(rng, routing_cache):
    x, _ = _rounded(rng, (6, 33), "float32")
    (wg, _), (wu, _) = _weights(rng, 20, 33, "float32")
    info = json.loads(ops.explain_gated_mlp(x, wg, wu))
    assert info["path"] == "mlx_composite" and info["route"]["source"] == "cost_model"
    key, parts = ops._signature("gated_mlp", x.dtype, 6, 20, 33, "x@w.T", "silu", False)
    assert parts["op"] == "gated_mlp" and "gated_kernel" in parts
    if ops._on_cuda():   # strict float32 tiles on CUDA, the weights as stored or copied
        assert parts["candidates"] == ["mlx"] + [ops._config_name(c) for c in (
            {**ops.CUDA_F32_BLOCK, "TRANSPOSE_B": True},
            {**ops.CUDA_F32_SMALL_BLOCK, "TRANSPOSE_B": True},
            ops.CUDA_F32_BLOCK, ops.CUDA_F32_SMALL_BLOCK)]
    else:
        assert parts["candidates"] == ["mlx", "metile:BLOCK_M=64,BLOCK_N=64,BLOCK_K=16,"
                                              "TRANSPOSE_B=True"]
    assert key != ops._signature("linear", x.dtype, 6, 20, 33, "x@w.T", "silu", False)[0]
    decision = ops.tune_gated_mlp(x, wg, wu, budget_s=0.01)
    assert decision["source"] == "measured" and set(decision["timings_us"]) == set(
        parts["candidates"])
    explained = json.loads(ops.explain_gated_mlp(x, wg, wu, backend="metile"))
    assert explained["path"] == "metile_kernel"
    assert "lower_matmul" in explained["execution_report"]["passes"]
    np.testing.assert_allclose(np.array(ops.gated_mlp(x, wg, wu)),
                               np.array(ops.gated_mlp(x, wg, wu, backend="mlx")),
                               rtol=2e-4, atol=2e-4)


def test_op_bad_inputs():
    x, w = mx.zeros((3, 8)), mx.zeros((5, 8))
    with pytest.raises(ValueError, match="activation must be one of silu, gelu_tanh, relu"):
        ops.gated_mlp(x, w, w, "tanh")
    with pytest.raises(ValueError, match=r"w_gate \(5, 8\) and w_up \(6, 8\) differ"):
        ops.gated_mlp(x, w, mx.zeros((6, 8)))
    # (named on the weights as given: it read "(3, 7) @ (8, 5)", the product's transpose)
    with pytest.raises(ValueError, match=r"x's last dimension is 7, but w_gate and w_up \(5, 8\) "
                                         r"\(hidden, in_features\) take 8 input features"):
        ops.gated_mlp(mx.zeros((3, 7)), w, w)
    with pytest.raises(TypeError, match=r"x has dtype mlx.core.int32"):
        ops.gated_mlp(x.astype(mx.int32), w, w, backend="metile")
    with pytest.raises(ValueError, match=r"x must have at least one dimension"):
        ops.gated_mlp(mx.zeros(()), w, w, backend="metile")
    with pytest.raises(ValueError, match="w_up must be a 2-D mx.array"):
        ops.gated_mlp(x, w, mx.zeros((8,)))
    with pytest.raises(ValueError, match="backend must be 'auto', 'metile' or 'mlx'"):
        ops.gated_mlp(x, w, w, backend="cuda")


def test_gated_tiles_on_sm_90(monkeypatch):
    # backend="metile" takes the 128-wide warpgroup tile in place of the 256-wide one (two
    # 64x256 accumulator tiles per warpgroup would be 256 floats per thread); auto's
    # candidates leave warpgroup tiles out (a converted block's forward+backward was slower
    # with it, and its compiled float16 time bimodal, on the H200: ops.gated_configs) and
    # are never split-K
    monkeypatch.setattr(ops, "_on_cuda", lambda: True)
    monkeypatch.setattr(ops, "_warpgroup_gemm", lambda: True)

    def core(block):
        return {k: v for k, v in block.items() if k != "TRANSPOSE_B"}
    configs = ops.gated_configs(mx.float16)
    assert configs and all(core(c) in (ops.CUDA_BLOCK, ops.CUDA_SMALL_BLOCK) for c in configs)
    assert not any("SPLIT_K" in c for c in configs)
    assert len({ops._config_name(c) for c in configs}) == len(configs)
    x, w = mx.zeros((4096, 4096), mx.float16), mx.zeros((11008, 4096), mx.float16)
    forced = ops._route("gated_mlp", (x, w, w), "silu", None, "metile")
    assert core(forced.block) == ops.CUDA_WGMMA_SMALL_BLOCK and forced.block.get("TRANSPOSE_B")


# -- several outputs from one epilogue (the products kept for a backward pass) ------------

def _three_outputs(rng, m, n, k, dtype, **options):
    (x, xr), (wg, wgr), (wu, wur) = (_rounded(rng, s, dtype, c) for s, c in
                                     (((m, k), 1.0), ((n, k), 0.2), ((n, k), 0.2)))
    # the library kernel with gate_out and up_out: its result and both products
    zeros = [mx.zeros((m, n), x.dtype) for _ in range(3)]
    bm, bn = options.get("BLOCK_M", 32), options.get("BLOCK_N", 32)
    launch = gated_mlp[grid(m, n, bm, bn)]
    return launch, (x, wg, wu, zeros[0], m, n, k, *zeros[1:]), (xr @ wgr.T, xr @ wur.T)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(75, 45, 37), (64, 64, 64)])
def test_an_epilogue_stores_several_outputs(rng, dtype, shape):
    # each output its own pointwise function of the accumulators at the same coordinates
    # (the fused GEMM stored once: a kernel with three stores fell to the lanes' lowering)
    launch, args, (g, u) = _three_outputs(rng, *shape, dtype)
    d = launch.prepare(*args, BLOCK_M=32, BLOCK_N=32)
    assert d.variant.data["lowering"]["matmul"]["products"] == 2
    out, gate, up = launch(*args, BLOCK_M=32, BLOCK_N=32)
    for got, want in ((out, _act(g, "silu") * u), (gate, g), (up, u)):
        _check(got, want, dtype)


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
@pytest.mark.parametrize("shape", [(256, 256, 256), (200, 300, 100)])
def test_several_outputs_on_the_warpgroup_mma(monkeypatch, rng, shape):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "1")
    launch, args, _ = _three_outputs(rng, *shape, "float16", BLOCK_M=128, BLOCK_N=128)
    d = launch.prepare(*args, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_simdgroups=8,
                       backend="cuda")
    mm = d.variant.data["lowering"]["matmul"]
    assert mm["fragment"].startswith("wgmma") and mm["products"] == 2
    source = translation_unit(d)
    # every output written from the accumulators' registers, in pairs where aligned
    assert d.variant.data["passes"].count("paired_epilogue_stores") == 1   # a step, once
    assert all(f"{name}[" in source for name in ("output", "gate_out", "up_out"))
    ok, log = compile_cuda(source, "sm_90a")
    assert ok, log
    assert "C7514" not in log and "C7515" not in log and "spill" not in log.replace(
        "0 bytes spill", "")


@metile.kernel
def two_stores_one_buffer(x, w, out, n, BLOCK: metile.constexpr = 16):
    a = metile.tensor(x, shape=(n, n), strides=(n, 1), block_shape=(BLOCK, BLOCK),
                      access="read")
    b = metile.tensor(w, shape=(n, n), strides=(n, 1), block_shape=(BLOCK, BLOCK),
                      access="read")
    c = metile.tensor(out, shape=(n, n), strides=(n, 1), block_shape=(BLOCK, BLOCK),
                      access="write")
    acc = metile.zeros((BLOCK, BLOCK), dtype=metile.float32)
    for k in metile.tile_range(0, n, BLOCK):
        acc = metile.dot(a.load((0, k)), b.load((k, 0)), acc)
    c.store((0, 0), acc)
    c.store((0, 0), acc * 2.0)


def test_two_stores_into_one_output_are_refused():
    with pytest.raises(metile.CompilationError, match="stores write one output each"):
        two_stores_one_buffer[(1,)](mx.zeros((16, 16)), mx.zeros((16, 16)), mx.zeros((16, 16)),
                                    16)
