"""Epilogues that read: a bias vector (per output column or per output row) and a
residual matrix at the store's coordinates, loaded inside the fused GEMM epilogue
under the store's bounds (passes/gemm_epilogue_reads.py).  Numbers against NumPy on
the CPU runtime with race and bounds checking; CUDA source shape (compiled, never
launched here); every non-fusable read rejected by message at the user's line.

Tolerances as in test_gemm.py (the output's dtype adds one rounding).
"""

import inspect
import json

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile_kernels.gemm import grid, linear_epilogue
from test_epilogue import k_recurrence
from test_gemm import check, operands

RAGGED = [(1, 1, 1), (7, 65, 33), (130, 70, 17)]


@pytest.fixture(autouse=True)
def race_check(monkeypatch):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")


def _vec(rng, n, dtype):
    x = mx.array(rng.standard_normal(n).astype(np.float32)).astype(getattr(mx, dtype))
    return x, np.array(x.astype(mx.float32)).astype(np.float64)


def _relu(x):
    return np.maximum(x, 0)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_bias_activation_residual(rng, dtype):
    # one specialization serves every shape: bias per column, GELU, residual add
    d = getattr(mx, dtype)
    for m, n, k in RAGGED:
        a, b, acc = operands(rng, m, n, k, dtype)
        bias, bias64 = _vec(rng, n, dtype)
        res, res64 = _vec(rng, (m, n), dtype)
        out = linear_epilogue[grid(m, n, 32, 32)](
            a, b, mx.zeros((m, n), d), bias, res, m, n, k, BLOCK_M=32, BLOCK_N=32,
            BIAS="columns", RESIDUAL=True, EPILOGUE="gelu_tanh")
        check(out, _gelu(acc + bias64) + res64, dtype)


@pytest.mark.parametrize("axis", ["columns", "rows"])
def test_bias_broadcast_along_each_axis(rng, axis):
    for m, n, k in RAGGED:
        a, b, acc = operands(rng, m, n, k, "float32")
        bias, bias64 = _vec(rng, n if axis == "columns" else m, "float32")
        d = linear_epilogue[grid(m, n, 32, 32)].prepare(
            a, b, mx.zeros((m, n)), bias, bias, m, n, k, BLOCK_M=32, BLOCK_N=32, BIAS=axis,
            EPILOGUE="relu")
        ref = acc + (bias64[None, :] if axis == "columns" else bias64[:, None])
        check(d(), _relu(ref))
    (read,) = d.variant.data["lowering"]["matmul"]["epilogue_reads"]
    kind = "per-column vector" if axis == "columns" else "per-row vector"
    assert read == {"buffer": "bias", "dtype": "float32", "tile_shape": [32], "kind": kind,
                    "broadcast": "over rows" if axis == "columns" else "over columns",
                    "masked": True}


def test_residual_only_and_report(rng):
    m, n, k = 65, 9, 63
    a, b, acc = operands(rng, m, n, k, "float16")
    res, res64 = _vec(rng, (m, n), "float16")
    d = linear_epilogue[grid(m, n, 32, 32)].prepare(
        a, b, mx.zeros((m, n), mx.float16), res, res, m, n, k, BLOCK_M=32, BLOCK_N=32,
        BIAS="none", RESIDUAL=True)
    check(d(), acc + res64, "float16")
    info = d.variant.data["lowering"]["matmul"]
    assert [r["buffer"] for r in info["epilogue_reads"]] == ["residual"]
    assert info["epilogue_reads"][0]["kind"] == "matrix"
    assert ("epilogue reads 'residual' (float16 matrix) per stored element: its load's "
            "address and mask evaluated at the element's (row, column), only where the store "
            "writes") in json.loads(d.explain())["notes"]


@metile.kernel
def plus_transposed(A, B, C, R, M, N, K, SHIFT: metile.constexpr, BM: metile.constexpr = 32,
                    BN: metile.constexpr = 32, BK: metile.constexpr = 16):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    # R read transposed (and shifted by SHIFT elements): its own address, not the store's
    r = metile.load(R + rn[None, :] * M + rm[:, None] + SHIFT, mask=mask, other=0.0)
    metile.store(C + rm[:, None] * N + rn[None, :], acc + r, mask=mask)


@pytest.mark.parametrize("shift", [0, 1])
def test_a_read_at_its_own_address_and_its_note(rng, shift):
    # (the note said the read was "at the store's coordinates" for a transposed or shifted
    # read too, whose elements are at other addresses)
    m, n, k = 40, 33, 20
    a, b, acc = operands(rng, m, n, k, "float32")
    flat, flat64 = _vec(rng, m * n + shift, "float32")
    d = plus_transposed[grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), flat, m, n, k,
                                                   SHIFT=shift)
    check(d(), acc + flat64[shift:].reshape(n, m).T)
    assert ("epilogue reads 'R' (float32 matrix) per stored element: its load's address and "
            "mask evaluated at the element's (row, column), only where the store writes") in \
        json.loads(d.explain())["notes"]


@metile.kernel
def alpha_beta_c(A, B, C0, C, M, N, K, alpha, beta, BM: metile.constexpr = 32,
                 BN: metile.constexpr = 32, BK: metile.constexpr = 16):
    """C = alpha * A @ B + beta * C0, pointer style; C0 read unmasked (the store's
    bounds guard it on edge tiles)."""
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    c0 = metile.load(C0 + rm[:, None] * N + rn[None, :])
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc * alpha + beta * c0, mask=mask)


def test_pointer_style_beta_c_unmasked_read_within_store_bounds(rng):
    # bounds checking (conftest) fails the launch if the unmasked read left the buffer
    m, n, k = 45, 70, 33
    a, b, acc = operands(rng, m, n, k, "float32")
    c0, c064 = _vec(rng, (m, n), "float32")
    out = alpha_beta_c[grid(m, n, 32, 32)](a, b, c0, mx.zeros((m, n)), m, n, k, 1.5, -0.75)
    check(out, 1.5 * acc - 0.75 * c064)


def test_cuda_source_reads_bias_and_residual_in_the_register_epilogue():
    z = mx.zeros
    m, n, k = 200, 136, 72
    d = linear_epilogue[grid(m, n)].prepare(
        z((m, k), mx.float16), z((k, n), mx.float16), z((m, n), mx.float16),
        z((n,), mx.float16), z((m, n), mx.float16), m, n, k, BLOCK_K=32, BIAS="columns",
        RESIDUAL=True, EPILOGUE="sigmoid_gated", backend="cuda")
    info = d.variant.data["lowering"]["matmul"]
    assert info["epilogue_from"] == "registers"
    assert [r["buffer"] for r in info["epilogue_reads"]] == ["bias", "residual"]
    src = d.source
    assert src.count("bias[") >= 1 and src.count("residual[") >= 1


# -- non-fusable reads ---------------------------------------------------------------------------

@metile.kernel
def reads_output(A, B, C, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                 BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    old = metile.load(C + rm[:, None] * N + rn[None, :], mask=mask)  # REJECT
    metile.store(C + rm[:, None] * N + rn[None, :], acc + old, mask=mask)


@metile.kernel
def reduces_a_read(A, B, C, R, M, N, K, BM: metile.constexpr = 16, BN: metile.constexpr = 16,
                   BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    r = metile.load(R + rm[:, None] * N + rn[None, :])
    total = metile.sum(r, axis=1)  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc + total[:, None], mask=mask)


@metile.kernel
def single_element_read(A, B, C, S, M, N, K, BM: metile.constexpr = 16,
                        BN: metile.constexpr = 16, BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    s = metile.load(S + metile.arange(0, 1))  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc * s[None, :], mask=mask)


@metile.kernel
def indirect_read(A, B, C, Idx, V, M, N, K, BM: metile.constexpr = 16,
                  BN: metile.constexpr = 16, BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    where = metile.load(Idx + rn)
    v = metile.load(V + where)  # REJECT
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc + v[None, :], mask=mask)


@metile.kernel
def read_used_twice(A, B, C, Bias, M, N, K, BM: metile.constexpr = 16,
                    BN: metile.constexpr = 16, BK: metile.constexpr = 8):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    bias = metile.load(Bias + rn, mask=rn < N)  # REJECT
    acc = k_recurrence(A, B, M, N, K, rm, rn, BM, BN, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N) & (bias[None, :] > -1.0e30)
    metile.store(C + rm[:, None] * N + rn[None, :], acc + bias[None, :], mask=mask)


REJECTED = [
    (reads_output, "the epilogue reads 'C', the buffer the GEMM stores to"),
    (reduces_a_read, "a reduction in the epilogue"),
    (single_element_read, "an epilogue read of 'S' with shape (1,) that is neither the output "
                          "tile's shape nor a vector along one of its axes"),
    (indirect_read, "an epilogue read whose address or mask is itself read from memory"),
    (read_used_twice, "a value read for the epilogue is also used outside it"),
]


def _marked_line(kernel) -> int:
    lines, start = inspect.getsourcelines(kernel.fn)
    return start + next(i for i, text in enumerate(lines) if "# REJECT" in text)


@pytest.mark.parametrize("kernel,message", REJECTED, ids=[k.__name__ for k, _ in REJECTED])
def test_non_fusable_reads_rejected(kernel, message):
    m = n = k = 16
    args = [mx.zeros((m, k)), mx.zeros((k, n)), mx.zeros((m, n))]
    extra = {reduces_a_read: [mx.zeros((m, n))], single_element_read: [mx.zeros((1,))],
             indirect_read: [mx.zeros((n,), mx.int32), mx.zeros((n,))],
             read_used_twice: [mx.zeros((n,))]}
    args += extra.get(kernel, []) + [m, n, k]
    with pytest.raises(metile.CompilationError) as err:
        kernel[(1, 1)].prepare(*args, backend="msl")
    assert "error: cannot lower the GEMM: " in str(err.value) and message in str(err.value)
    assert err.value.lineno == _marked_line(kernel)
    assert "metile/passes" not in str(err.value)
