"""metile.pair_fma: packed 16-bit float pairs in uint32 words (ir/ops.py PAIR), through
the CPU runtime against NumPy, the CUDA emission compiled with NVRTC, and its errors."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from nvrtc import TOOLKIT, compile_cuda, translation_unit


@metile.kernel
def pair_fma_kernel(a, b, c, out, n, BLOCK: metile.constexpr, DT: metile.constexpr,
                    C_CONST: metile.constexpr = -1):
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = i < n
    x = metile.load(a + i, mask=m, other=0)
    y = metile.load(b + i, mask=m, other=0)
    if C_CONST >= 0:      # a word constant as the addend
        z = C_CONST
    else:
        z = metile.load(c + i, mask=m, other=0)
    metile.store(out + i, metile.pair_fma(x, y, z, dtype=DT), mask=m)


def words(v):
    return mx.array(np.ascontiguousarray(v).view(np.uint32))


def bf16_bits(v64):
    """float64 -> bfloat16 bit patterns, rounded to nearest even (as uint16)."""
    f = np.asarray(v64, np.float32).view(np.uint32).astype(np.uint64)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits16):
    return (bits16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("n", [1, 37, 256, 16384])
def test_float16_pairs_match_numpy(rng, n):
    a, b, c = (rng.standard_normal(2 * n).astype(np.float16) for _ in range(3))
    out = pair_fma_kernel[(metile.cdiv(n, 64),)](words(a), words(b), words(c),
                                                 mx.zeros((n,), mx.uint32), n, BLOCK=64,
                                                 DT=metile.float16)
    got = np.array(out).view(np.float16)
    # the product of two halves is exact in float64: one rounding, as a fused multiply-add
    want = (a.astype(np.float64) * b + c).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_float16_rounds_once():
    # 3 * 683 + 2^-24 = 2049 + 2^-24: rounded once, 2050; through float32 first, 2049 (a
    # tie) and then 2048 - the CPU runtime's half fma once did that
    words_of = lambda v: words(np.array(v, np.float16))  # noqa: E731
    out = pair_fma_kernel[(1,)](words_of([3, 1]), words_of([683, 1]), words_of([2.0 ** -24, 0]),
                                mx.zeros((1,), mx.uint32), 1, BLOCK=16, DT=metile.float16)
    assert np.array(out).view(np.float16)[0] == np.float16(2050.0)


def test_bfloat16_pairs_match_numpy(rng):
    n = 45
    a, b, c = (bf16_bits(rng.standard_normal(2 * n)) for _ in range(3))
    out = pair_fma_kernel[(1,)](words(a), words(b), words(c), mx.zeros((n,), mx.uint32), n,
                                BLOCK=64, DT=metile.bfloat16)
    got = from_bf16(np.array(out).view(np.uint16))
    want = from_bf16(a) * from_bf16(b) + from_bf16(c)
    # Metal's bfloat path computes in float32 and rounds (documented): within one bfloat16 ulp
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-30)


def test_a_word_constant_is_both_halves(rng):
    n = 16
    a, b = (rng.standard_normal(2 * n).astype(np.float16) for _ in range(2))
    minus_two = int(np.array([-2.0, 0.5], np.float16).view(np.uint32)[0])  # low -2, high 0.5
    out = pair_fma_kernel[(1,)](words(a), words(b), words(a), mx.zeros((n,), mx.uint32), n,
                                BLOCK=16, DT=metile.float16, C_CONST=minus_two)
    got = np.array(out).view(np.float16).astype(np.float64).reshape(n, 2)
    prod = (a.astype(np.float64) * b).reshape(n, 2)
    want = (prod + np.array([-2.0, 0.5])).astype(np.float16)
    np.testing.assert_array_equal(got.astype(np.float16), want)


@metile.kernel
def bad_pair_fma(a, out, CASE: metile.constexpr):
    i = metile.arange(0, 16)
    x = metile.load(a + i)
    if CASE == 0:
        y = metile.pair_fma(x, x, x, dtype=metile.float32)
    elif CASE == 1:
        y = metile.pair_fma(x, x, x)
    elif CASE == 2:
        y = metile.pair_fma(x.to(metile.float32, bitcast=True), x, x, dtype=metile.float16)
    elif CASE == 3:
        y = metile.pair_fma(x, 1.5, x, dtype=metile.float16)
    else:
        y = metile.pair_fma(x, x, -1, dtype=metile.float16)
    metile.store(out + i, y)


@pytest.mark.parametrize("case,message", [
    (0, "dtype= must be float16 or bfloat16"),
    (1, "needs dtype="),
    (2, "operand a must be uint32 \\(or int32\\) words"),
    (3, "operand b must be a uint32 value"),
    (4, "operand c must be a uint32 value"),
])
def test_bad_operands_are_refused_by_name(case, message):
    with pytest.raises(metile.CompilationError, match=message):
        bad_pair_fma[(1,)](mx.zeros((16,), mx.uint32), mx.zeros((16,), mx.uint32), CASE=case)


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_cuda_emission_is_one_packed_fma(dt):
    d = pair_fma_kernel[(1,)].prepare(mx.zeros((64,), mx.uint32), mx.zeros((64,), mx.uint32),
                                      mx.zeros((64,), mx.uint32), mx.zeros((64,), mx.uint32), 64,
                                      BLOCK=64, DT=getattr(metile, dt), backend="cuda")
    assert "__hfma2" in d.source
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log


@metile.kernel
def words_per_branch(a, out, n):
    i = metile.arange(0, 4)
    w = metile.load(a + i)
    t = (w, 0x3C003C00)                       # (x, 1.0 twice) carried through the loop
    for s in range(n):
        t = (metile.pair_fma(t[0], t[1], t[1], dtype=metile.float16), t[1])
    if n > 1:                                 # a word constant per branch: 1.0 or -1.0
        u = (t[0], 0x3C003C00)
    else:
        u = (t[0], 0xBC00BC00)
    metile.store(out + i, metile.pair_fma(u[0], u[1], 0, dtype=metile.float16))


@pytest.mark.parametrize("n", [0, 2])
def test_word_constants_carried_and_merged(n):
    # numbers merged from two branches become int32 (or uint32 past it) values: pair_fma
    # takes either as the same 32 bits (a hostile-trial finding: int32 was refused)
    x = np.array([0.5, 1, 2, -3, 4, 5, 6, 7], np.float16)
    out = words_per_branch[(1,)](mx.array(x.view(np.uint32)), mx.zeros((4,), mx.uint32), n)
    want = (x.astype(np.float64) + n) * (1 if n > 1 else -1)
    np.testing.assert_array_equal(np.array(out).view(np.float16), want.astype(np.float16))
