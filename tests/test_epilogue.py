"""Fused GEMM epilogues: the stored value's pointwise dependencies on the accumulator
run in float32 before the single output conversion; everything else is rejected with
a message naming the reason and the user's line.

Tolerances as in test_gemm.py: float32 output strict (rtol=3e-4, atol=3e-5), a
float16 / bfloat16 output adds one rounding (rtol=atol=2e-3 / 1.6e-2).
"""

import inspect
import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile_kernels.gemm import grid, matmul_epilogue
from test_gemm import check, operands

ALPHA, BETA = 1.25, -0.5


def gelu_tanh_ref(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference(kind, acc):
    if kind == "affine":
        return acc * ALPHA + BETA
    if kind == "affine_leaky":
        s = acc * ALPHA + BETA
        return np.where(s > 0, s, s * 0.1)
    if kind == "relu":
        return np.maximum(acc, 0)
    if kind == "gelu_tanh":
        return gelu_tanh_ref(acc)
    if kind == "sigmoid_gated":
        return acc * sigmoid_ref(acc)
    return acc


@pytest.mark.parametrize("kind", ["affine", "affine_leaky", "relu", "gelu_tanh", "sigmoid_gated"])
def test_library_epilogues(rng, kind):
    for m, n, k in [(7, 9, 65), (100, 37, 129)]:
        a, b, acc = operands(rng, m, n, k, "float32")
        d = matmul_epilogue[grid(m, n)].prepare(a, b, mx.zeros((m, n)), m, n, k, ALPHA, BETA,
                                                EPILOGUE=kind)
        assert d.variant.data["lowering"]["matmul"]["epilogue_regions"] == 1
        check(d(), reference(kind, acc))


@pytest.mark.parametrize("in_dtype,out_dtype", [("float32", "float16"), ("float16", "bfloat16"),
                                                ("bfloat16", "float16")])
def test_epilogue_cast_to_narrow_output(rng, in_dtype, out_dtype):
    m, n, k = 63, 65, 17
    a, b, acc = operands(rng, m, n, k, in_dtype)
    out = matmul_epilogue[grid(m, n)](a, b, mx.zeros((m, n), getattr(mx, out_dtype)), m, n, k,
                                      ALPHA, BETA, EPILOGUE="affine_leaky")
    assert out.dtype == getattr(mx, out_dtype)
    check(out, reference("affine_leaky", acc), out_dtype)


@metile.inline
def k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK):
    """The canonical dot-over-K recurrence every kernel below shares."""
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        a = metile.load(A + rm[:, None] * K + rk[None, :],
                        mask=(rm[:, None] < M) & (rk[None, :] < K))
        b = metile.load(B + rk[:, None] * N + rn[None, :],
                        mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = metile.dot(a, b, acc)
    return acc


@metile.kernel
def triton_style_epilogue(A, B, C, M, N, K, alpha, beta, BM: metile.constexpr = 32,
                          BN: metile.constexpr = 32, BK: metile.constexpr = 16):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    scaled = acc * alpha + beta                      # shared by the three uses below
    activated = metile.where(scaled > 0, scaled, scaled * 0.1)
    gated = metile.minimum(activated, 4.0) - metile.abs(scaled) * 0.0625
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], gated.to(C.dtype), mask=mask)


def test_user_epilogue_with_shared_subexpressions_and_runtime_scalars(rng):
    m, n, k = 45, 70, 33
    a, b, acc = operands(rng, m, n, k, "float32")
    d = triton_style_epilogue[(metile.cdiv(m, 32), metile.cdiv(n, 32))].prepare(
        a, b, mx.zeros((m, n)), m, n, k, ALPHA, BETA)
    info = d.variant.data["lowering"]["matmul"]
    assert info["captured_scalars"] == ["alpha", "beta"] and info["epilogue_regions"] == 1
    src = d.source
    # (MSL binds the scalar by value, CUDA reads it through MLX's pointer)
    assert re.search(r"const float _epi_alpha = alpha(\[0\])?;", src)
    assert re.search(r"const float _epi_beta = beta(\[0\])?;", src)
    # `scaled` is computed once per accumulator element a lane evaluates (the register
    # epilogue is unrolled over the lane's elements: thread_elements() on MSL, .x[e] on CUDA)
    body = d.variant.data["body"]
    sites = len(re.findall(r"thread_elements\(\)\[\d\]|\]\.x\[\d+\]", body))
    if info["fragment"] == "ffma":   # strict float32 on CUDA: per-thread register micro-tiles
        assert body.count("* _epi_alpha)") >= 1
    else:
        assert sites and body.count("* _epi_alpha)") == sites
    s = acc * ALPHA + BETA
    ref = np.minimum(np.where(s > 0, s, 0.1 * s), 4.0) - np.abs(s) * 0.0625
    check(d(), ref)
    for alpha, beta in [(-2.0, 0.25), (0.5, 3.0)]:  # runtime scalars: same kernel, new values
        s = acc * alpha + beta
        ref = np.minimum(np.where(s > 0, s, 0.1 * s), 4.0) - np.abs(s) * 0.0625
        check(d(a, b, mx.zeros((m, n)), m, n, k, alpha, beta), ref)


def test_cuda_epilogue_captures_scalars_from_their_pointers(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "array")   # (by value they are parameters)
    a = mx.zeros((64, 64), mx.float16)
    d = matmul_epilogue[(1, 1)].prepare(a, a, mx.zeros((64, 64), mx.float16), 64, 64, 64, 1.0,
                                        0.0, EPILOGUE="gelu_tanh", backend="cuda")
    src = d.source
    assert "const float _epi_alpha" not in src  # gelu reads no coefficient
    d = matmul_epilogue[(1, 1)].prepare(a, a, mx.zeros((64, 64), mx.float16), 64, 64, 64, 1.0,
                                        0.0, EPILOGUE="affine_leaky", backend="cuda")
    assert "const float _epi_alpha = alpha[0];" in d.source
    assert "static_cast<__half>(" in d.source  # the single final conversion


# -- a bias read (fused since epilogues may read; tests/test_epilogue_reads.py) -------------

@metile.kernel
def bias_epilogue(A, B, C, Bias, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                  BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    bias = metile.load(Bias + rn, mask=rn < N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc + bias[None, :], mask=mask)


def test_pointer_style_bias_is_fused(rng):
    m, n, k = 33, 41, 19
    a, b, acc = operands(rng, m, n, k, "float32")
    bias = rng.standard_normal(n).astype(np.float32)
    d = bias_epilogue[(metile.cdiv(m, 16), metile.cdiv(n, 16))].prepare(
        a, b, mx.zeros((m, n)), mx.array(bias), m, n, k)
    assert [r["buffer"] for r in d.variant.data["lowering"]["matmul"]["epilogue_reads"]] == ["Bias"]
    check(d(), acc + bias[None, :])


# -- rejected epilogues ---------------------------------------------------------------------


@metile.kernel
def reduction_epilogue(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                       BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    row_max = metile.max(acc, axis=1)  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc - row_max[:, None], mask=mask)


@metile.kernel
def control_flow_epilogue(A, B, C, M, N, K, flag, BM: metile.constexpr = 16,
                          BN: metile.constexpr = 16, BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    if flag > 0:  # REJECT
        acc = acc * 2.0
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=mask)


@metile.kernel
def two_stores(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
               BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=mask)
    metile.store(C + rm[:, None] * N + rn[None, :], acc * 2.0, mask=mask)  # REJECT


@metile.kernel
def two_products(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                 BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    square = metile.load(B + metile.arange(0, BN)[:, None] * N + rn[None, :])
    again = metile.dot(acc, square)  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], again, mask=mask)


@metile.kernel
def dimension_leaf(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                   BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mean = acc / metile.cast(K, metile.float32)  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], mean, mask=mask)


@metile.kernel
def early_narrowing(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                    BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    half = acc.to(metile.float16)  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], half * 2.0, mask=mask)


@metile.kernel
def int_output(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
               BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc * 10.0, mask=mask)  # REJECT


REJECTED = [
    (reduction_epilogue, "a reduction of the accumulator is not a pointwise epilogue"),
    (control_flow_epilogue, "control flow in the epilogue"),
    # (stores into outputs of their own are one epilogue: test_dual_gemm.py)
    (two_stores, "a fused GEMM's stores write one output each; two of them store through "
                 "one buffer"),
    (dimension_leaf, "dimension parameter 'K' used in the epilogue"),
    (early_narrowing, "the epilogue computes in float32 until the final conversion"),
    # (an int output was refused as "this cast produces int32 before the end", with no cast
    # written: the store's own conversion is the last op)
    (int_output, "a fused GEMM stores a float output (float32, float16 or bfloat16); "
                 "converting its result to int32 (a cast, or the store's conversion to its "
                 "buffer) is not fused"),
]


def test_second_product_takes_the_general_lowering(rng):
    # A product of the accumulator (or attention's two products with `acc = dot(p, v, acc)`)
    # is not one fused GEMM: the general tile lowering computes every product.
    m, n, k = 16, 16, 24
    a = mx.array(rng.standard_normal((m, k)).astype(np.float32))
    b = mx.array(rng.standard_normal((k, n)).astype(np.float32))
    d = two_products[(1, 1)].prepare(a, b, mx.zeros((m, n)), m, n, k)
    assert "matmul" not in d.variant.data["lowering"]
    A, B = np.array(a).astype(np.float64), np.array(b).astype(np.float64)
    np.testing.assert_allclose(np.array(d()), (A @ B) @ B[:n, :], rtol=3e-4, atol=3e-4)


def _marked_line(kernel) -> int:
    lines, start = inspect.getsourcelines(kernel.fn)
    return start + next(i for i, text in enumerate(lines) if "# REJECT" in text)


@pytest.mark.parametrize("kernel,message", REJECTED, ids=[k.__name__ for k, _ in REJECTED])
def test_rejected_epilogues(kernel, message):
    m = n = k = 16
    args = [mx.zeros((m, k)), mx.zeros((k, n)),
            mx.zeros((m, n), {early_narrowing: mx.float16, int_output: mx.int32}.get(
                kernel, mx.float32))]
    args += [m, n, k] + ([1] if kernel is control_flow_epilogue else [])
    with pytest.raises(metile.CompilationError) as err:
        kernel[(1, 1)].prepare(*args, backend="msl")
    assert "error: cannot lower the GEMM: " in str(err.value) and message in str(err.value)
    assert err.value.lineno == _marked_line(kernel)
    assert "metile/passes" not in str(err.value)  # the user's line, not compiler frames


@metile.kernel
def attention_like(Q, K, V, O, n, BLOCK: metile.constexpr, D: metile.constexpr):
    r = metile.arange(0, BLOCK)
    d = metile.arange(0, D)
    q = metile.load(Q + r[:, None] * D + d[None, :])
    acc = metile.zeros((BLOCK, D), dtype=metile.float32)
    for s in metile.tile_range(0, n, BLOCK):
        p = metile.dot(q, metile.load(K + (s + r)[None, :] * D + d[:, None]))
        acc = metile.dot(p, metile.load(V + (s + r)[:, None] * D + d[None, :]), acc)
    metile.store(O + r[:, None] * D + d[None, :], acc)


def test_recurrence_next_to_a_second_product(rng):
    # Triton's attention form: `acc = dot(p, v, acc)` with p itself a product in the loop.
    q, k, v = (mx.array(rng.standard_normal(s).astype(np.float32))
               for s in ((32, 16), (64, 16), (64, 16)))
    out = attention_like[(1,)](q, k, v, mx.zeros((32, 16)), 64, BLOCK=32, D=16)
    Q, K, V = (np.array(t).astype(np.float64) for t in (q, k, v))
    ref = sum((Q @ K[s:s + 32].T) @ V[s:s + 32] for s in (0, 32))
    np.testing.assert_allclose(np.array(out), ref, rtol=3e-4, atol=3e-4)


@metile.kernel
def product_and_activation(A, B, C, R, M, N, K, BM: metile.constexpr = 16,
                           BN: metile.constexpr = 16, BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=mask)
    metile.store(R + rm[:, None] * N + rn[None, :], metile.maximum(acc, 0.0) * 2.0, mask=mask)


def test_pointer_stores_into_two_outputs_are_one_epilogue(rng):
    # the product and its activation, each into its own output, from one fused GEMM
    m, n, k = 37, 29, 21
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    grid = (metile.cdiv(m, 16), metile.cdiv(n, 16))
    args = (mx.array(a), mx.array(b), mx.zeros((m, n)), mx.zeros((m, n)), m, n, k)
    assert "matmul" in product_and_activation[grid].prepare(*args).variant.data["lowering"]
    c, r = product_and_activation[grid](*args)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(np.array(c), want, rtol=3e-4, atol=3e-4)
    np.testing.assert_allclose(np.array(r), np.maximum(want, 0) * 2, rtol=3e-4, atol=3e-4)
