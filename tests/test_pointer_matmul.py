"""Triton's canonical matmul (operand pointers advanced every K iteration, `acc = dot(a, b,
acc)` or `acc += dot(a, b)`, with or without masks on K) gets the GEMM lowering and the
fused epilogue: `passes/pointer_recurrence.py` puts the loop in the form `passes/gemm.py`
matches.  Checked on the CPU runtime against float64 NumPy products of the same (rounded)
inputs; tolerances as in test_gemm.py (strict FP32 for a float32 output, one rounding
more for float16: rtol=atol=2e-3).  The CUDA emission is compiled with NVRTC.
"""

import json

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.errors import CompilationError
from nvrtc import TOOLKIT, compile_cuda, translation_unit
from test_block_pointers import GEMM_FRAGMENT
from test_gemm import OUTPUT_TOL, operands


@metile.kernel
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: metile.constexpr, BLOCK_N: metile.constexpr,
                  BLOCK_K: metile.constexpr, GROUP_M: metile.constexpr,
                  ACTIVATION: metile.constexpr):
    # Triton's tutorial matmul, `tl.` renamed: grouped program order, wrapped (% M) rows.
    pid = metile.program_id(0)
    num_pid_m = metile.cdiv(M, BLOCK_M)
    num_pid_n = metile.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_M + metile.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + metile.arange(0, BLOCK_N)) % N
    offs_k = metile.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in range(0, metile.cdiv(K, BLOCK_K)):
        a = metile.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = metile.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        accumulator = metile.dot(a, b, accumulator)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if ACTIVATION == "leaky_relu":
        accumulator = metile.where(accumulator >= 0, accumulator, 0.01 * accumulator)
    c = accumulator.to(metile.float16)
    offs_cm = pid_m * BLOCK_M + metile.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + metile.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    metile.store(c_ptrs, c, mask=c_mask)


@metile.kernel
def matmul_accumulate(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      BLOCK_M: metile.constexpr, BLOCK_N: metile.constexpr,
                      BLOCK_K: metile.constexpr, EVEN_K: metile.constexpr):
    # `acc += dot(a, b)`, a loop stepping by BLOCK_K, and offsets advanced besides the
    # pointers; EVEN_K (K a multiple of BLOCK_K) drops the K masks, as Triton kernels do.
    rm = metile.program_id(0) * BLOCK_M + metile.arange(0, BLOCK_M)
    rn = metile.program_id(1) * BLOCK_N + metile.arange(0, BLOCK_N)
    rk = metile.arange(0, BLOCK_K)
    a_ptrs = A + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn
    acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = metile.load(a_ptrs)
            b = metile.load(b_ptrs)
        else:
            a = metile.load(a_ptrs, mask=rk[None, :] < K, other=0.0)
            b = metile.load(b_ptrs, mask=rk[:, None] < K, other=0.0)
        acc += metile.dot(a, b)
        a_ptrs = a_ptrs + BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        rk += BLOCK_K
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype), mask=mask)


@metile.kernel
def from_one(A, B, C, M, N, K, BLOCK: metile.constexpr = 16):
    # A loop starting at 1 (trip index k - 1) and `acc = dot(a, b) + acc`.
    rm = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    rn = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)
    rk = metile.arange(0, BLOCK)
    a_ptrs = A + rm[:, None] * K + rk[None, :]
    b_ptrs = B + rk[:, None] * N + rn[None, :]
    acc = metile.zeros((BLOCK, BLOCK), dtype=metile.float32)
    for k in range(1, metile.cdiv(K, BLOCK) + 1):
        left = K - (k - 1) * BLOCK
        a = metile.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        b = metile.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc = metile.dot(a, b) + acc
        a_ptrs += BLOCK
        b_ptrs += BLOCK * N
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def line_of(text: str) -> int:
    """The line of this file that contains `text` (where the report points)."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def leaky(x):
    return np.where(x >= 0, x, 0.01 * x)


def check(out, ref, out_dtype):
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, **OUTPUT_TOL[out_dtype])


TILE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)


def launch(m, n, k, a, b, strides_a, strides_b, **kw):
    """The Triton launch: a 1-D grid of output tiles, strides passed as runtime ints."""
    programs = metile.cdiv(m, 32) * metile.cdiv(n, 32)
    c = mx.zeros((m, n), mx.float16)
    return matmul_kernel[(programs,)].prepare(a, b, c, m, n, k, *strides_a, *strides_b, n, 1,
                                              **TILE, GROUP_M=2, **kw)


SHAPES = [(75, 45, 37), (1, 1, 1), (64, 64, 64), (130, 70, 200)]


@pytest.mark.parametrize("dtype,activation", [("float32", ""), ("float16", "leaky_relu"),
                                              ("bfloat16", "")])
def test_triton_matmul_ragged_shapes(rng, dtype, activation):
    # One specialization per case: sizes and strides are runtime scalars.
    for m, n, k in SHAPES:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = launch(m, n, k, a, b, (k, 1), (n, 1), ACTIVATION=activation)
        check(d(), leaky(ref) if activation else ref, "float16")
    info = d.variant.data["lowering"]["matmul"]
    assert info["fragment"] == GEMM_FRAGMENT[d.variant.backend][dtype]
    assert info["operand_dtype"] == dtype
    assert info["k_loop_masked"] and info["epilogue_regions"] == 1
    assert info["epilogue_ops"] == (["ge", "mul", "where", "cast"] if activation else ["cast"])
    report = json.loads(d.explain(steps=True))
    assert report["passes"][:6] == ["frontend", "verify", "uniformity", "pointer_recurrence",
                                    "verify", "buffer_usage"]
    assert {"lower_matmul", "fuse_epilogue"} <= set(report["passes"])
    detail = {s["step"]: s.get("detail") for s in report["steps"]}["pointer_recurrence"]
    line = line_of("for k in range(0, metile.cdiv(K, BLOCK_K)):")
    assert detail == (f"loop at line {line}: a_ptrs, b_ptrs advanced in closed form "
                      f"(start + trip * increment)")
    assert report["epilogue_regions"] == 1


def test_operands_given_through_strides(rng):
    # A stored as (K, M) and B as (N, K): each read through its transposed strides; the
    # float16 specialization of the test above (strides are runtime values).
    for m, n, k in [(75, 45, 37), (33, 130, 64)]:
        a, b, ref = operands(rng, m, n, k, "float16")
        at, bt = mx.array(np.array(a).T.copy()), mx.array(np.array(b).T.copy())
        d = launch(m, n, k, at, bt, (1, m), (1, k), ACTIVATION="leaky_relu")
        check(d(), leaky(ref), "float16")
        assert "pointer_recurrence" in d.execution_report.passes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_accumulate_form_without_k_masks(rng, dtype):
    # K a multiple of BLOCK_K: no K conjunct on the loads; float32 output held to strict FP32.
    for m, n, k in [(70, 33, 48), (1, 1, 16), (64, 96, 128)]:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = matmul_accumulate[(metile.cdiv(m, 32), metile.cdiv(n, 32))].prepare(
            a, b, mx.zeros((m, n)), m, n, k, k, 1, n, 1, **TILE, EVEN_K=True)
        check(d(), ref, "float32")
    info = d.variant.data["lowering"]["matmul"]
    assert info["fragment"] == GEMM_FRAGMENT[d.variant.backend][dtype]
    assert not info["k_loop_masked"]
    assert json.loads(d.explain(steps=True))["steps"][3] == {
        "step": "pointer_recurrence",
        "detail": f"loop at line {line_of('for k in range(0, K, BLOCK_K):')}: a_ptrs, b_ptrs, "
                  f"rk advanced in closed form (start + trip * increment); acc += dot(a, b) "
                  f"accumulated as dot(a, b, acc)"}


def test_accumulate_form_with_k_masks_under_a_schedule(rng):
    # An explicit schedule specializes the sizes: the K conjuncts (on the advanced offsets)
    # are proven for complete steps and dropped, the tail step keeps them, double-buffered.
    m, n, k = 45, 70, 41
    a, b, ref = operands(rng, m, n, k, "float32")
    bt = mx.array(np.array(b).T.copy())
    d = matmul_accumulate[(metile.cdiv(m, 32), metile.cdiv(n, 32))].prepare(
        a, bt, mx.zeros((m, n)), m, n, k, k, 1, 1, k, **TILE, EVEN_K=False,
        SCHEDULE=metile.Schedule(double_buffer=True))
    check(d(), ref, "float32")
    passes = d.execution_report.passes
    assert ["prove_gemm_bounds", "lower_matmul", "split_k_loop", "double_buffer_staging"] == \
        [p for p in passes if p in ("prove_gemm_bounds", "lower_matmul", "split_k_loop",
                                    "double_buffer_staging")]
    info = d.variant.data["lowering"]["matmul"]
    assert info["k_split"] == {"complete_iterations": 2, "remainder": True}


def test_loop_from_one_and_dot_plus_accumulator(rng):
    for m, n, k in [(75, 45, 37), (16, 16, 16)]:
        a, b, ref = operands(rng, m, n, k, "float32")
        d = from_one[(metile.cdiv(m, 16), metile.cdiv(n, 16))].prepare(a, b, mx.zeros((m, n)),
                                                                      m, n, k)
        check(d(), ref, "float32")
    assert "lower_matmul" in d.execution_report.passes


@pytest.mark.skipif(TOOLKIT is None, reason="needs the nvidia-cuda-nvrtc wheels")
def test_cuda_emission_compiles_with_nvrtc():
    m, n, k = 75, 45, 37
    z = mx.zeros((64, 64), mx.float16)
    d = launch(m, n, k, z, z, (k, 1), (n, 1), ACTIVATION="leaky_relu", backend="cuda")
    info = d.variant.data["lowering"]["matmul"]
    assert info["fragment"].startswith("mma.sync m16n8k16") and info["epilogue_regions"] == 1
    for arch in ("sm_80", "sm_90"):
        ok, log = compile_cuda(translation_unit(d), arch)
        assert ok, log


# -- what stays carried is named ----------------------------------------------------------------

@metile.kernel
def running_scale(A, B, C, M, N, K, BLOCK: metile.constexpr = 16):
    rm = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    rk = metile.arange(0, BLOCK)
    a_ptrs = A + rm[:, None] * K + rk[None, :]
    b_ptrs = B + rk[:, None] * N + rm[None, :]
    acc = metile.zeros((BLOCK, BLOCK), dtype=metile.float32)
    scale = 1.0
    for k in range(0, K, BLOCK):
        acc = metile.dot(metile.load(a_ptrs), metile.load(b_ptrs), acc)
        a_ptrs += BLOCK
        b_ptrs += BLOCK * N
        scale += 0.5  # invariant, but a float sum is not reassociated
    metile.store(C + rm[:, None] * N + rm[None, :], acc * scale)


@metile.kernel
def growing_stride(A, B, C, M, N, K, BLOCK: metile.constexpr = 16):
    rm = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    rk = metile.arange(0, BLOCK)
    a_ptrs = A + rm[:, None] * K + rk[None, :]
    b_ptrs = B + rk[:, None] * N + rm[None, :]
    acc = metile.zeros((BLOCK, BLOCK), dtype=metile.float32)
    for k in range(0, K, BLOCK):
        acc = metile.dot(metile.load(a_ptrs), metile.load(b_ptrs), acc)
        a_ptrs += k
        b_ptrs += BLOCK * N
    metile.store(C + rm[:, None] * N + rm[None, :], acc)


@pytest.mark.parametrize("kernel,carried", [
    (running_scale, "'scale' (float32)"),
    (growing_stride, "'a_ptrs' (tile<16x16, ptr<float32, device, @A>>)")])
def test_values_the_loop_still_carries_are_named(kernel, carried):
    z = mx.zeros((16, 16))
    with pytest.raises(CompilationError) as err:
        kernel[(1,)](z, z, mx.zeros((16, 16)), 16, 16, 16)
    assert (f"cannot lower the GEMM: the K loop carries other values besides the accumulator: "
            f"{carried}; only pointers") in str(err.value)
    assert "for k in range(0, K, BLOCK):" in str(err.value)  # the user's line


@metile.kernel
def two_products(Q, Kt, V, Out, N, D: metile.constexpr = 16, BLOCK: metile.constexpr = 16):
    # Two products per step (as attention has): not a GEMM, so the loop keeps its pointers
    # and `acc += dot(s, v)` and runs through the reference dot lowering, as before.
    rd = metile.arange(0, D)
    rb = metile.arange(0, BLOCK)
    q = metile.load(Q + rd[:, None] * D + rd[None, :])
    k_ptrs = Kt + rd[:, None] * N + rb[None, :]
    v_ptrs = V + rb[:, None] * D + rd[None, :]
    acc = metile.zeros((D, D), dtype=metile.float32)
    for j in range(0, N, BLOCK):
        s = metile.dot(q, metile.load(k_ptrs))
        acc += metile.dot(s, metile.load(v_ptrs))
        k_ptrs += BLOCK
        v_ptrs += BLOCK * D
    metile.store(Out + rd[:, None] * D + rd[None, :], acc)


def test_kernels_with_two_products_keep_their_loops(rng):
    q, kt, v = (rng.standard_normal(s).astype(np.float32) for s in ((16, 16), (16, 32), (32, 16)))
    d = two_products[(1,)].prepare(mx.array(q), mx.array(kt), mx.array(v), mx.zeros((16, 16)), 32)
    np.testing.assert_allclose(np.array(d()), q.astype(np.float64) @ kt @ v, rtol=3e-4, atol=3e-5)
    assert "pointer_recurrence" not in d.execution_report.passes
    assert "matmul" not in d.variant.data["lowering"]
