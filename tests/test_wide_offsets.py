"""Buffers past 2**31 elements (passes/wide_offsets.py, runtime/arguments.py): launched when
every offset into them is computed in 64 bits, refused by name otherwise.  The refusals use
lazy arrays (nothing is allocated); one kernel runs over 2**31 + 3 * 2**20 bytes (on the
H200, or with METILE_TEST_BIG=1 on the CPU runtime) and is compared with NumPy at the ends
and across the 2**31 boundary."""

import os

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import LaunchError
from metile_kernels.gemm import grid, matmul

N_BIG = 2**31 + 3 * 2**20          # past MAX_BUFFER_ELEMENTS and past 2**31
SHAPE = (2, N_BIG // 2)            # MLX shapes are int32 per axis


@metile.kernel
def add_one_wide(X, Y, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0).to(metile.int64)
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) + 1, mask=mask)


@metile.kernel
def add_one_narrow(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) + 1, mask=mask)


@metile.kernel
def add_one_cast_late(X, Y, n, BLOCK: metile.constexpr):
    offs = (metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)).to(metile.int64)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) + 1, mask=mask)


@metile.kernel
def matmul_wide(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
                BK: metile.constexpr, WIDE_K: metile.constexpr = True):
    rm = metile.program_id(0).to(metile.int64) * BM + metile.arange(0, BM)
    rn = metile.program_id(1).to(metile.int64) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        if WIDE_K:
            rk = k.to(metile.int64) + metile.arange(0, BK)
        else:
            # rk * N below is computed in int32, then widened by the int64 rn: refused for
            # big buffers
            rk = k + metile.arange(0, BK)
        a = metile.load(A + rm[:, None] * K + rk[None, :],
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = metile.load(B + rk[:, None] * N + rn[None, :],
                        mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = metile.dot(a, b, acc)
    metile.store(C + rm[:, None] * N + rn[None, :], acc,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


BIG_GEMM = (2**16, 2**15 + 64, 16)   # 2**31 + 2**22 outputs


def _gemm(a, b, c, m, n, k, prepare=False, wide_k=True):
    launch = matmul_wide[(metile.cdiv(m, 64), metile.cdiv(n, 64))]
    return (launch.prepare if prepare else launch)(a, b, c, m, n, k, BM=64, BN=64, BK=16,
                                                   WIDE_K=wide_k)


def _launch(kernel, x, y, n, block=1024):
    return kernel[(metile.cdiv(n, block),)](x, y, n, BLOCK=block)


def test_small_buffers_record_which_offsets_are_wide():
    x = mx.arange(10, dtype=mx.uint8)
    wide = add_one_wide[(1,)].prepare(x, mx.zeros(10, mx.uint8), 10, BLOCK=16)
    narrow = add_one_narrow[(1,)].prepare(x, mx.zeros(10, mx.uint8), 10, BLOCK=16)
    late = add_one_cast_late[(1,)].prepare(x, mx.zeros(10, mx.uint8), 10, BLOCK=16)
    rec = {k: d.variant.data["lowering"]["wide_offsets"]
           for k, d in (("wide", wide), ("narrow", narrow), ("late", late))}
    assert rec["wide"] == {"buffers": ["X", "Y"], "narrowing_casts": []}
    assert rec["narrow"]["buffers"] == []
    assert rec["late"]["buffers"] == ["X", "Y"] and len(rec["late"]["narrowing_casts"]) == 1
    for d in (wide, narrow, late):   # and they all compute the same thing
        np.testing.assert_array_equal(np.array(d()), np.arange(10) + 1)


def test_int32_offsets_into_a_big_buffer_are_refused():
    x, y = mx.zeros(SHAPE, mx.uint8), mx.zeros(SHAPE, mx.uint8)
    with pytest.raises(LaunchError, match=r"kernel 'add_one_narrow': argument 'X' has "
                                          rf"{N_BIG} elements, more than the 2146435072 that "
                                          r"32-bit offsets address: compute its offsets in "
                                          r"int64, e.g. `pid = metile.program_id\(0\)"):
        _launch(add_one_narrow, x, y, N_BIG)


def test_a_computed_value_widened_late_is_refused():
    x, y = mx.zeros(SHAPE, mx.uint8), mx.zeros(SHAPE, mx.uint8)
    with pytest.raises(LaunchError, match=r"widens a computed 32-bit value to 64 bits \(at "
                                          r".*test_wide_offsets.py:\d+\)"):
        _launch(add_one_cast_late, x, y, N_BIG)


def test_gemm_with_a_big_output_is_refused():
    # the library GEMM computes its offsets in int32
    m, n, k = 2**16, 2**15 + 64, 16
    a, b = mx.zeros((m, k), mx.float16), mx.zeros((k, n), mx.float16)
    with pytest.raises(LaunchError, match=r"argument 'output' has \d+ elements.*library kernels index in 32 bits"):
        matmul[grid(m, n, 64, 64)](a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=64, BLOCK_N=64,
                                   BLOCK_K=16)


def test_gemm_with_int64_offsets_takes_big_outputs(rng):
    m, n, k = BIG_GEMM
    a, b = mx.zeros((m, k), mx.float16), mx.zeros((k, n), mx.float16)
    d = _gemm(a, b, mx.zeros((m, n)), m, n, k, prepare=True)   # not run here
    assert d.variant.data["lowering"]["wide_offsets"] == {"buffers": ["A", "B", "C"],
                                                         "narrowing_casts": []}
    assert "matmul" in d.variant.data["lowering"]   # the GEMM lowering, not a scalar loop
    with pytest.raises(LaunchError, match=r"matmul_wide.*widens a computed 32-bit value"):
        _gemm(a, b, mx.zeros((m, n)), m, n, k, prepare=True, wide_k=False)
    # both forms on small sizes, against NumPy
    for wide_k in (True, False):
        sa = rng.standard_normal((70, 40)).astype(np.float32)
        sb = rng.standard_normal((40, 90)).astype(np.float32)
        out = _gemm(mx.array(sa), mx.array(sb), mx.zeros((70, 90)), 70, 90, 40, wide_k=wide_k)
        np.testing.assert_allclose(np.array(out), sa.astype(np.float64) @ sb, rtol=3e-4,
                                   atol=3e-5)


@pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                    reason="2**31 outputs of a K=16 GEMM: minutes on the CPU runtime")
def test_gemm_past_2_31_outputs_on_the_gpu(rng):
    m, n, k = BIG_GEMM
    a = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.float16)
    b = mx.array(rng.standard_normal((k, n)).astype(np.float32)).astype(mx.float16)
    c = _gemm(a, b, mx.zeros((m, n)), m, n, k)
    mx.eval(c)
    A, B = (np.array(t.astype(mx.float32)).astype(np.float64) for t in (a, b))
    for r0 in (0, 2**31 // n - 1, m - 64):   # rows 2**31 // n - 1, ... cross element 2**31
        np.testing.assert_allclose(np.array(c[r0:r0 + 64]), A[r0:r0 + 64] @ B, rtol=2e-3,
                                   atol=2e-3, err_msg=f"rows from {r0}")


@pytest.mark.skipif(not (os.environ.get("METILE_TEST_BIG") == "1" or
                         (mx.cuda.is_available() and mx.default_device().type == mx.gpu)),
                    reason="6+ GiB and over a minute on the CPU runtime (~17 GB resident): runs "
                           "on the H200, or with METILE_TEST_BIG=1")
def test_int64_offsets_run_past_2_31_elements():
    # 2 GiB in and out (uint8); compared at the ends and across the 2**31 boundary
    n, cols = N_BIG, SHAPE[1]
    x = mx.tile(mx.arange(256, dtype=mx.uint8)[None], (2, cols // 256))   # x[i] = i % 256
    y = _launch(add_one_wide, x, mx.zeros(SHAPE, mx.uint8), n, block=4096)
    mx.eval(y)
    for start in (0, cols - 5, 2**31 - 2**20 - 5, 2**31 - 7, n - 4096):
        r, c = divmod(start, cols)
        got = np.array(y[r, c:c + 4096])
        want = ((np.arange(start, start + got.size) + 1) % 256).astype(np.uint8)
        np.testing.assert_array_equal(got, want, err_msg=f"elements from {start}")
