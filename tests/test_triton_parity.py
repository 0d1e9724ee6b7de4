"""Triton's language rules in metile kernels: implicit type promotion, store and
`other=` conversion, `where` with an integer condition, hints, compile-time
helpers and the `metile.math` namespace.  Numbers are checked against NumPy on
the CPU runtime; the CUDA spellings are compile-checked in test_cuda_nvrtc.py."""

import math
import warnings

import mlx.core as mx
import numpy as np
import pytest

import metile

SIZES = (1, 7, 65, 1000)
BLOCK = 128


def _grid(n):
    return (max(1, metile.cdiv(n, BLOCK)),)


def _values(n, dtype, seed=0):
    """Random values exactly representable in `dtype` (as mx array, float64 NumPy copy)."""
    rng = np.random.default_rng(seed)
    if dtype == mx.bool_:
        a = mx.array(rng.integers(0, 2, n).astype(bool))
    elif dtype in (mx.int32, mx.uint32):
        a = mx.array(rng.integers(0 if dtype == mx.uint32 else -50, 50, n)).astype(dtype)
    else:
        a = mx.array(rng.uniform(-4, 4, n).astype(np.float32)).astype(dtype)
    return a, np.array(a.astype(mx.float32) if dtype == mx.bfloat16 else a).astype(np.float64)


F32, F16, BF16, I32, U32, B = mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint32, mx.bool_
_MT = {F32: metile.float32, F16: metile.float16, BF16: metile.bfloat16, I32: metile.int32,
       U32: metile.uint32, B: metile.bool_}


@metile.kernel
def binary(X, Y, Z, n, OP: metile.constexpr, OUT: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    y = metile.load(Y + offs, mask=m)
    if OP == "add":
        z = x + y
    elif OP == "mul":
        z = x * y
    elif OP == "div":
        z = x / y
    elif OP == "max":
        z = metile.maximum(x, y)
    else:
        z = metile.where(x < y, x, y)
    assert z.dtype == OUT, "promoted dtype"
    metile.store(Z + offs, z, mask=m)


# (x dtype, y dtype, promoted) per Triton's rules: kind, then width, float16 with
# bfloat16 -> float32, same-width signed/unsigned -> unsigned
PAIRS = [(F16, F32, F32), (BF16, F32, F32), (I32, F32, F32), (I32, F16, F16), (I32, BF16, BF16),
         (F16, BF16, F32), (I32, U32, U32), (B, I32, I32), (B, F16, F16)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("xd,yd,out", PAIRS, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("op", ["add", "mul", "max", "where"])
def test_mixed_operands_promote(xd, yd, out, op, n):
    (x, xn), (y, yn) = _values(n, xd, 1), _values(n, yd, 2)
    z = binary[_grid(n)](x, y, mx.zeros((n,), out), n, OP=op, OUT=_MT[out], BLOCK=BLOCK)
    if out == U32:  # both operands become uint32 first
        xn, yn = np.mod(xn, 2**32), np.mod(yn, 2**32)
    ref = {"add": xn + yn, "mul": xn * yn, "max": np.maximum(xn, yn),
           "where": np.where(xn < yn, xn, yn)}[op]
    if out == U32:
        ref = np.mod(ref, 2**32)
    got = np.array(z.astype(F32) if out == BF16 else z).astype(np.float64)
    # the promoted dtype's rounding of an exact result; float16/bfloat16 round once
    tol = {F16: 1e-3, BF16: 8e-3}.get(out, 1e-6)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("xd", [I32, F16, F32])
def test_true_division_of_integers_is_float32(xd, n):
    (x, xn), (y, yn) = _values(n, xd, 3), _values(n, I32, 4)
    y = mx.where(y == 0, 7, y).astype(I32)
    yn = np.where(yn == 0, 7, yn)
    out = F16 if xd == F16 else F32
    z = binary[_grid(n)](x, y, mx.zeros((n,), out), n, OP="div", OUT=_MT[out], BLOCK=BLOCK)
    tol = 1e-3 if out == F16 else 1e-6
    np.testing.assert_allclose(np.array(z).astype(np.float64), xn / yn, rtol=tol, atol=tol)


@metile.kernel
def with_numbers(X, Z, n, OUT: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    z = x * 3 + 0.5 - True
    assert z.dtype == OUT, "a number of a lower or equal kind does not promote"
    metile.store(Z + offs, z, mask=m)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("xd,out", [(I32, F32), (F16, F16), (BF16, BF16), (F32, F32), (B, F32)],
                         ids=lambda d: str(d).split(".")[-1])
def test_numbers_promote_only_to_a_higher_kind(xd, out, n):
    x, xn = _values(n, xd, 5)
    z = with_numbers[_grid(n)](x, mx.zeros((n,), out), n, OUT=_MT[out], BLOCK=BLOCK)
    # x * 3 rounds in `out` first, then + 0.5, then - 1, each rounded in `out`
    ref = mx.array(xn.astype(np.float32)).astype(out) * 3 + 0.5 - 1 if out != F32 else xn * 3 - 0.5
    ref = np.array(ref.astype(F32) if isinstance(ref, mx.array) else ref)
    got = np.array(z.astype(F32))
    np.testing.assert_allclose(got, ref, rtol=0, atol=0 if out != F32 else 1e-6)


@metile.kernel
def converting_store(X, Z, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Z + offs, metile.load(X + offs, mask=m) * 1.5, mask=m)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("out", [F16, BF16, I32, B], ids=lambda d: str(d).split(".")[-1])
def test_store_converts_to_the_buffer_dtype(out, n):
    x, xn = _values(n, F32, 6)
    z = converting_store[_grid(n)](x, mx.zeros((n,), out), n, BLOCK=BLOCK)
    v = (xn * 1.5).astype(np.float32)
    if out == I32:
        ref = np.trunc(v)  # C's conversion: toward zero
    elif out == B:
        ref = (v != 0).astype(np.float64)
    else:
        ref = np.array(mx.array(v).astype(out).astype(F32))
    np.testing.assert_array_equal(np.array(z.astype(F32)).astype(np.float64), ref)


@metile.kernel
def number_stores(Z, V: metile.constexpr):
    metile.store(Z + metile.arange(0, 4), V)


@pytest.mark.parametrize("out,value,expect", [(I32, -2.75, -2), (I32, 7, 7), (F16, 3, 3.0),
                                              (B, 0.0, 0), (B, 2, 1), (U32, 2**31 + 5, 2**31 + 5),
                                              (F32, True, 1.0)])
def test_numbers_stored_convert(out, value, expect):
    z = number_stores[(1,)](mx.zeros((4,), out), V=value)
    np.testing.assert_array_equal(np.array(z).astype(np.float64), [expect] * 4)


@metile.kernel
def load_other(X, Z, n, OTHER: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.store(Z + offs, metile.load(X + offs, mask=offs < n, other=OTHER))


@pytest.mark.parametrize("xd,other,fill", [(I32, -1.75, -1), (F16, -math.inf, -math.inf),
                                           (F32, 2, 2.0), (B, 1, 1)],
                         ids=["int-from-float", "half-inf", "float-from-int", "bool-from-int"])
def test_load_other_converts(xd, other, fill):
    x, xn = _values(7, xd, 7)
    z = load_other[(1,)](x, mx.zeros((16,), xd), 7, OTHER=other, BLOCK=16)
    np.testing.assert_array_equal(np.array(z).astype(np.float64), np.r_[xn, [fill] * 9])


@metile.kernel
def int_condition(C, X, Z, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    c = metile.load(C + offs, mask=m)
    metile.store(Z + offs, metile.where(c, metile.load(X + offs, mask=m), -1), mask=m)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("xd", [F32, F16, I32], ids=lambda d: str(d).split(".")[-1])
def test_where_with_an_integer_condition(xd, n):
    c, cn = _values(n, I32, 8)
    x, xn = _values(n, xd, 9)
    z = int_condition[_grid(n)](c, x, mx.zeros((n,), xd), n, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(z).astype(np.float64), np.where(cn != 0, xn, -1))
