"""int8 / uint8 / int16 / uint16 in the language, with Triton's semantics: buffers of these
dtypes, `.to()` both ways, arithmetic in the type (wrapping, as NumPy's same-type arithmetic),
Triton's promotion (int8 op int32 is int32, int8 op uint8 is uint8, int16 op uint8 is int16),
sums in 32 bits, max/min as int32; checked on the CPU runtime against NumPy, and the CUDA
emission compiled with NVRTC."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError

from nvrtc import TOOLKIT, compile_cuda, translation_unit

SMALL = [np.int8, np.uint8, np.int16, np.uint16]
MX = {np.int8: mx.int8, np.uint8: mx.uint8, np.int16: mx.int16, np.uint16: mx.uint16,
      np.int32: mx.int32, np.uint32: mx.uint32, np.float32: mx.float32}


def full_range(rng, dtype, n):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    x[:4] = [info.min, info.max, 0, 1]  # the wrap-around edges
    return x


@metile.kernel
def arith(A, B, Add, Sub, Mul, Div, Mod, And, Xor, Neg, Not, Lt, Max, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    a = metile.load(A + offs, mask=m)
    b = metile.load(B + offs, mask=m)
    metile.static_assert((a + b).dtype == a.dtype)
    metile.store(Add + offs, a + b, mask=m)
    metile.store(Sub + offs, a - b, mask=m)
    metile.store(Mul + offs, a * b, mask=m)
    nz = metile.where(b == 0, 1, b)
    metile.store(Div + offs, a // nz, mask=m)
    metile.store(Mod + offs, a % nz, mask=m)
    metile.store(And + offs, a & b, mask=m)
    metile.store(Xor + offs, a ^ b, mask=m)
    metile.store(Neg + offs, -a, mask=m)
    metile.store(Not + offs, ~a, mask=m)
    # each operand of the compare is a wrapped result: narrowing happens per operation
    metile.store(Lt + offs, ((a + b) < (a - b)).to(metile.int32), mask=m)
    metile.store(Max + offs, metile.maximum(a * b, a + b), mask=m)


def _c_div(a, b):
    """C's truncating division and remainder, in the operands' type (as Triton's)."""
    wide_a, wide_b = a.astype(np.int64), b.astype(np.int64)
    q = np.trunc(wide_a / wide_b).astype(np.int64)
    return q.astype(a.dtype), (wide_a - q * wide_b).astype(a.dtype)


@pytest.mark.parametrize("dtype", SMALL)
def test_arithmetic_wraps_in_the_type(rng, dtype):
    n = 200
    a, b = full_range(rng, dtype, n), full_range(rng, dtype, n)[::-1].copy()
    outs = [mx.zeros(n, MX[dtype]) for _ in range(9)] + [mx.zeros(n, mx.int32)] + \
           [mx.zeros(n, MX[dtype])]
    add, sub, mul, div, mod, and_, xor, neg, not_, lt, mx_ = arith[(1,)](
        mx.array(a), mx.array(b), *outs, n, BLOCK=256)
    with np.errstate(over="ignore"):
        nz = np.where(b == 0, 1, b).astype(dtype)
        q, r = _c_div(a, nz)
        expect = {"add": a + b, "sub": a - b, "mul": a * b, "div": q, "mod": r, "and": a & b,
                  "xor": a ^ b, "neg": -a, "not": ~a,
                  "lt": ((a + b) < (a - b)).astype(np.int32), "max": np.maximum(a * b, a + b)}
    for name, got in zip(expect, (add, sub, mul, div, mod, and_, xor, neg, not_, lt, mx_)):
        np.testing.assert_array_equal(np.array(got), expect[name], err_msg=name)


@metile.kernel
def abs_clamp(X, A, C, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    metile.store(A + offs, metile.abs(x))
    metile.store(C + offs, metile.clamp(x, 3, 100))


@pytest.mark.parametrize("dtype", SMALL)
def test_abs_and_clamp(rng, dtype):
    x = full_range(rng, dtype, 64)
    a, c = abs_clamp[(1,)](mx.array(x), mx.zeros(64, MX[dtype]), mx.zeros(64, MX[dtype]), BLOCK=64)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.array(a), np.abs(x))  # abs(-128) wraps to -128
    np.testing.assert_array_equal(np.array(c), np.clip(x, 3, 100))


@metile.kernel
def edges(I8, U8, Out8, OutU8, Cmp):
    x = metile.load(I8 + metile.arange(0, 4))      # 127, -128, -1, 5
    u = metile.load(U8 + metile.arange(0, 4))      # 200, 100, 255, 1
    metile.store(Out8 + metile.arange(0, 4), x + 1)              # 127 + 1 wraps to -128
    metile.store(Out8 + 4 + metile.arange(0, 4), x // -1)        # -128 // -1 wraps to -128
    metile.store(Out8 + 8 + metile.arange(0, 4), x << 1)         # 127 << 1 is -2
    metile.store(Out8 + 12 + metile.arange(0, 4), x >> 1)        # arithmetic: -128 >> 1 = -64
    metile.store(OutU8 + metile.arange(0, 4), u + 100)           # 200 + 100 wraps to 44
    metile.store(OutU8 + 4 + metile.arange(0, 4), u << 1)        # 200 << 1 is 144
    metile.store(OutU8 + 8 + metile.arange(0, 4), (u + u) >> 1)  # the sum wrapped first
    metile.store(Cmp + metile.arange(0, 4), (u + 100 > u).to(metile.int32))


def test_wrap_around_edges():
    x = np.array([127, -128, -1, 5], np.int8)
    u = np.array([200, 100, 255, 1], np.uint8)
    o8, ou8, cmp = edges[(1,)](mx.array(x), mx.array(u), mx.zeros(16, mx.int8),
                              mx.zeros(12, mx.uint8), mx.zeros(4, mx.int32))
    o8, ou8 = np.array(o8), np.array(ou8)
    np.testing.assert_array_equal(o8[:4], [-128, -127, 0, 6])
    np.testing.assert_array_equal(o8[4:8], [-127, -128, 1, -5])
    np.testing.assert_array_equal(o8[8:12], [-2, 0, -2, 10])
    np.testing.assert_array_equal(o8[12:], [63, -64, -1, 2])
    np.testing.assert_array_equal(ou8[:4], [44, 200, 99, 101])
    np.testing.assert_array_equal(ou8[4:8], [144, 200, 254, 2])
    np.testing.assert_array_equal(ou8[8:], [72, 100, 127, 1])
    np.testing.assert_array_equal(np.array(cmp), [0, 1, 0, 1])


@metile.kernel
def promote(A8, B32, U8, S16, Wide, Mixed, Mixed16, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    a = metile.load(A8 + offs)
    b = metile.load(B32 + offs)
    u = metile.load(U8 + offs)
    s = metile.load(S16 + offs)
    metile.static_assert((a + b).dtype == metile.int32)
    metile.static_assert((a + u).dtype == metile.uint8)
    metile.static_assert((s + u).dtype == metile.int16)
    metile.static_assert((a * 2).dtype == metile.int8)
    metile.static_assert((a * 0.5).dtype == metile.float32)
    metile.store(Wide + offs, a * b + 1000)
    metile.store(Mixed + offs, a + u)
    metile.store(Mixed16 + offs, s * u)


def test_triton_promotion(rng):
    n = 64
    a, u = full_range(rng, np.int8, n), full_range(rng, np.uint8, n)
    b = rng.integers(-2**20, 2**20, n).astype(np.int32)
    s = full_range(rng, np.int16, n)
    wide, mixed, mixed16 = promote[(1,)](mx.array(a), mx.array(b), mx.array(u), mx.array(s),
                                         mx.zeros(n, mx.int32), mx.zeros(n, mx.uint8),
                                         mx.zeros(n, mx.int16), BLOCK=n)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.array(wide), a.astype(np.int32) * b + 1000)
        np.testing.assert_array_equal(np.array(mixed), a.astype(np.uint8) + u)
        np.testing.assert_array_equal(np.array(mixed16), s * u.astype(np.int16))


@metile.kernel
def casts(X, F, I8, U16, Back, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)   # int32
    metile.store(I8 + offs, x.to(metile.int8), mask=m)
    metile.store(U16 + offs, metile.cast(x, metile.uint16), mask=m)
    f = metile.load(F + offs, mask=m)
    metile.store(Back + offs, f.to(metile.int8).to(metile.float32) + x.to(metile.int16), mask=m)


def test_casts_both_ways(rng):
    n = 100
    x = rng.integers(-2**31, 2**31, n).astype(np.int32)
    f = rng.uniform(-127, 127, n).astype(np.float32)
    i8, u16, back = casts[(1,)](mx.array(x), mx.array(f), mx.zeros(n, mx.int8),
                                mx.zeros(n, mx.uint16), mx.zeros(n, mx.float32), n, BLOCK=128)
    np.testing.assert_array_equal(np.array(i8), x.astype(np.int8))
    np.testing.assert_array_equal(np.array(u16), x.astype(np.uint16))
    np.testing.assert_array_equal(np.array(back), np.trunc(f) + x.astype(np.int16))


@metile.kernel
def to_half(X, H, Back, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    h = x.to(metile.float16)
    metile.store(H + offs, h)
    metile.store(Back + offs, (h * 0.5).to(X.dtype.element_ty))


@pytest.mark.parametrize("dtype", SMALL)
def test_to_half_and_back(rng, dtype):
    x = full_range(rng, dtype, 32)
    if dtype == np.uint16:
        x //= 2  # float16 holds at most 65504
    h, back = to_half[(1,)](mx.array(x), mx.zeros(32, mx.float16), mx.zeros(32, MX[dtype]), BLOCK=32)
    np.testing.assert_array_equal(np.array(h), x.astype(np.float16))
    np.testing.assert_array_equal(np.array(back),
                                  np.trunc(x.astype(np.float16) * np.float16(0.5)).astype(dtype))


@metile.kernel
def reduce_all(X, S, Hi, Lo, XS, C, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n, other=0)
    s = metile.sum(x)
    metile.static_assert(s.dtype == metile.int32 or s.dtype == metile.uint32)
    metile.static_assert(metile.max(x).dtype == metile.int32)
    metile.store(S, s)
    metile.store(Hi, metile.max(x))  # padding 0 is no extreme: x holds min, max and 0
    metile.store(Lo, metile.min(x))
    metile.store(XS, metile.xor_sum(x, 0))
    metile.store(C + offs, metile.cumsum(x, 0), mask=offs < n)


@pytest.mark.parametrize("dtype", SMALL)
@pytest.mark.parametrize("n,block", [(32, 32), (300, 512)])
def test_reductions_sum_in_32_bits(rng, dtype, n, block):
    x = full_range(rng, dtype, n)
    acc = np.int32 if np.issubdtype(dtype, np.signedinteger) else np.uint32
    s, hi, lo, xs, c = reduce_all[(1,)](
        mx.array(x), mx.zeros(1, MX[acc]), mx.zeros(1, mx.int32), mx.zeros(1, mx.int32),
        mx.zeros(1, MX[dtype]), mx.zeros(n, MX[acc]), n, BLOCK=block)
    # the sum of 512 values near 2**15 leaves int16: it must not wrap
    assert int(np.array(s)[0]) == int(x.astype(np.int64).sum())
    assert (int(np.array(hi)[0]), int(np.array(lo)[0])) == (int(x.max()), int(x.min()))
    assert int(np.array(xs)[0]) == int(np.bitwise_xor.reduce(x))
    np.testing.assert_array_equal(np.array(c), np.cumsum(x.astype(acc)))


@metile.kernel
def argmax_sort(X, AM, MX, S, Z, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    metile.store(AM, metile.argmax(x, 0))
    m, i = metile.max(x, 0, return_indices=True)
    metile.static_assert(m.dtype == x.dtype)  # with indices Triton keeps the type
    metile.store(MX, m)
    metile.store(S + offs, metile.sort(x))
    metile.store(Z + offs, metile.zeros((BLOCK,), x.dtype) + metile.full((BLOCK,), 3, x.dtype) * x)


@pytest.mark.parametrize("dtype", SMALL)
def test_argmax_sort_and_fills(rng, dtype):
    x = full_range(rng, dtype, 64)
    am, m, srt, z = argmax_sort[(1,)](mx.array(x), mx.zeros(1, mx.int32), mx.zeros(1, MX[dtype]),
                                      mx.zeros(64, MX[dtype]), mx.zeros(64, MX[dtype]), BLOCK=64)
    assert int(np.array(am)[0]) == int(np.argmax(x)) and int(np.array(m)[0]) == int(x.max())
    np.testing.assert_array_equal(np.array(srt), np.sort(x))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.array(z), x * dtype(3))


@metile.kernel
def scalar_arg(X, Out, s, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.static_assert((metile.load(X + offs) + s).dtype == metile.int8)
    metile.store(Out + offs, metile.load(X + offs) + s)


def test_small_int_scalar_argument():
    x = np.array([100, -100, 27, 0], np.int8)
    out = scalar_arg[(1,)](mx.array(x), mx.zeros(4, mx.int8), mx.array(np.int8(28)), BLOCK=4)
    np.testing.assert_array_equal(np.array(out), [-128, -72, 55, 28])


@metile.kernel
def atomic_small(X, Out):
    metile.atomic_add(Out, metile.load(X))


@metile.kernel
def umulhi_small(X, O):
    metile.store(O, metile.umulhi(metile.load(X), metile.load(X)))


@metile.kernel
def out_of_range(X, O):
    metile.store(O, metile.load(X) + 300)


@metile.kernel
def negative_unsigned(X, O):
    metile.store(O, metile.load(X) - (-1))


@metile.kernel
def small_offset(X, O):
    metile.store(O, metile.load(X + metile.load(X)))


def test_unsupported_small_int_uses_are_clear_errors():
    x8 = mx.array(np.array([5], np.int8))
    with pytest.raises(CompilationError, match=r"atomic_add\(\) on a int8 buffer is not "
                                               r"supported; it takes float32, int32, uint32"):
        atomic_small[(1,)](x8, mx.zeros(1, mx.int8))
    with pytest.raises(CompilationError, match=r"umulhi\(\) needs int32/uint32 operands, got "
                                               r"uint16; cast them"):
        umulhi_small[(1,)](mx.array(np.array([5], np.uint16)), mx.zeros(1, mx.uint16))
    with pytest.raises(CompilationError, match=r"constant 300 does not fit in int8"):
        out_of_range[(1,)](x8, mx.zeros(1, mx.int8))
    with pytest.raises(CompilationError, match=r"constant -1 does not fit in uint8"):
        negative_unsigned[(1,)](mx.array(np.array([5], np.uint8)), mx.zeros(1, mx.uint8))
    with pytest.raises(CompilationError, match=r"pointer offsets must be int32 or int64, got "
                                               r"int8; cast them"):
        small_offset[(1,)](x8, mx.zeros(1, mx.int8))


@metile.kernel
def printed(X, U, O):
    offs = metile.arange(0, 4)
    metile.store(O + offs, metile.load(X + offs))
    metile.device_print("x", metile.load(X + offs), metile.load(U + offs))
    metile.device_print("bits", metile.load(X + offs), metile.load(U + offs), hex=True)


needs_nvrtc = pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")


@needs_nvrtc
@pytest.mark.parametrize("launch", [
    lambda: arith[(1,)].prepare(*(mx.zeros(8, mx.int8) for _ in range(11)), mx.zeros(8, mx.int32),
                                mx.zeros(8, mx.int8), 8, BLOCK=32, backend="cuda"),
    lambda: reduce_all[(1,)].prepare(mx.zeros(300, mx.uint8), mx.zeros(1, mx.uint32),
                                     mx.zeros(1, mx.int32), mx.zeros(1, mx.int32),
                                     mx.zeros(1, mx.uint8), mx.zeros(300, mx.uint32), 300,
                                     BLOCK=512, backend="cuda"),
    lambda: to_half[(1,)].prepare(mx.zeros(32, mx.int16), mx.zeros(32, mx.float16),
                                  mx.zeros(32, mx.int16), BLOCK=32, backend="cuda"),
    lambda: printed[(1,)].prepare(mx.zeros(4, mx.int8), mx.zeros(4, mx.uint16),
                                  mx.zeros(4, mx.int8), backend="cuda"),
], ids=["arith", "reductions", "half", "print"])
def test_cuda_emission_compiles_with_nvrtc(launch):
    source = translation_unit(launch())
    assert "int8_t" in source or "int16_t" in source
    ok, log = compile_cuda(source, "sm_90")
    assert ok, log
