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
    # the GEMM lowering stages operands with 32-bit offsets of its own
    m, n, k = 2**16, 2**15 + 64, 16
    a, b = mx.zeros((m, k), mx.float16), mx.zeros((k, n), mx.float16)
    with pytest.raises(LaunchError, match=r"argument 'output' has \d+ elements.*GEMM-lowered"):
        matmul[grid(m, n, 64, 64)](a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=64, BLOCK_N=64,
                                   BLOCK_K=16)


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
