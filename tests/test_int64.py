"""int64 / uint64 in the language, with Triton's semantics: int64 buffers and scalars,
`.to(metile.int64)`, casts both ways (wrapping as in C), promotion (int32 op int64 is int64),
int64 pointer offsets, reductions; checked on the CPU runtime against NumPy, and the CUDA
emission compiled with NVRTC."""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError

from nvrtc import TOOLKIT, compile_cuda, translation_unit

I64 = np.int64


def i64(v):
    return mx.array(np.array(v, dtype=I64))


# how the backend that ran spells 64- and 32-bit signed integers
_C_TYPES = {"msl": {"long": "int64", "int": "int32"},
            "cuda": {"int64_t": "int64", "int32_t": "int32"}}


def _long(dispatch) -> str:
    return next(c for c, t in _C_TYPES[dispatch.variant.backend].items() if t == "int64")


def _scalar_type(dispatch, name: str) -> str:
    """The dtype a scalar argument is read as (MSL reads `name`, CUDA `name[0]`)."""
    body = dispatch.variant.data["body"]
    found = re.search(rf"const (\w+) _v\d+ = {name}(?:\[0\])?;", body)
    assert found, body
    return _C_TYPES[dispatch.variant.backend][found.group(1)]


@metile.kernel
def vector_add(X, Y, Out, n, BLOCK: metile.constexpr):
    """Triton's tutorial shape with a 64-bit program offset."""
    pid = metile.program_id(0)
    offs = pid.to(metile.int64) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Out + offs, metile.load(X + offs, mask=mask) + metile.load(Y + offs, mask=mask),
                 mask=mask)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint64])
def test_tutorial_vector_add_with_int64_offsets(rng, dtype):
    n = 1000
    if dtype == np.float32:
        x, y = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    elif dtype == np.int64:  # beyond 2**31 and negative
        x = rng.integers(-2**62, 2**62, n, dtype=I64)
        y = rng.integers(-2**40, 2**40, n, dtype=I64)
    else:
        x = rng.integers(2**63, 2**64 - 2**40, n, dtype=np.uint64)
        y = rng.integers(0, 2**40, n, dtype=np.uint64)
    out = vector_add[(metile.cdiv(n, 256),)](mx.array(x), mx.array(y), mx.zeros(n, mx.array(x).dtype),
                                             n, BLOCK=256)
    np.testing.assert_array_equal(np.array(out), x + y)
    d = vector_add.last_dispatch
    body = d.variant.data["body"]
    assert f"static_cast<{_long(d)}>(" in body and "X[" in body


@metile.kernel
def mixed(A, B, Sum, Prod, Less, scale, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    a = metile.load(A + offs, mask=m)   # int32
    b = metile.load(B + offs, mask=m)   # int64
    metile.static_assert((a + b).dtype == metile.int64)
    metile.static_assert((a * scale).dtype == metile.int64 or scale.dtype == metile.int32)
    metile.store(Sum + offs, a + b + scale, mask=m)
    metile.store(Prod + offs, a * b, mask=m)
    metile.store(Less + offs, (a < b).to(metile.int32), mask=m)


@pytest.mark.parametrize("scale", [3, 2**40 + 3, -2**45])
def test_int32_with_int64_promotes_to_int64(rng, scale):
    n = 100
    a = rng.integers(-2**31, 2**31, n).astype(np.int32)
    b = rng.integers(-2**31, 2**31, n, dtype=I64) * 3
    s, p, lt = mixed[(1,)](mx.array(a), mx.array(b), mx.zeros(n, mx.int64), mx.zeros(n, mx.int64),
                           mx.zeros(n, mx.int32), scale, n, BLOCK=128)
    wide = a.astype(I64)
    np.testing.assert_array_equal(np.array(s), wide + b + scale)
    np.testing.assert_array_equal(np.array(p), wide * b)  # wraps in 64 bits, as NumPy
    np.testing.assert_array_equal(np.array(lt), (wide < b).astype(np.int32))


@metile.kernel
def casts(X, F, I, U, Back, Div, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    metile.store(F + offs, x.to(metile.float32), mask=m)
    metile.store(I + offs, x.to(metile.int32), mask=m)
    metile.store(U + offs, metile.cast(x, metile.uint32), mask=m)
    # int32 -> int64 sign-extends; float32 -> int64 truncates toward zero
    metile.store(Back + offs, x.to(metile.int32).to(metile.int64)
                 + (x.to(metile.float32) * 0.5).to(metile.int64), mask=m)
    metile.store(Div + offs, (x // 7) * 1000 + x % 7, mask=m)


def test_casts_wrap_and_convert_like_c(rng):
    n = 200
    x = np.concatenate([rng.integers(-2**62, 2**62, n - 6, dtype=I64),
                        np.array([2**31, -2**31 - 1, 2**32 + 5, -1, 2**63 - 1, -2**63], I64)])
    f, i, u, back, div = casts[(1,)](mx.array(x), mx.zeros(n, mx.float32), mx.zeros(n, mx.int32),
                                     mx.zeros(n, mx.uint32), mx.zeros(n, mx.int64),
                                     mx.zeros(n, mx.int64), n, BLOCK=256)
    np.testing.assert_array_equal(np.array(f), x.astype(np.float32))
    np.testing.assert_array_equal(np.array(i), x.astype(np.int32))      # low 32 bits
    np.testing.assert_array_equal(np.array(u), x.astype(np.uint32))
    half = x.astype(np.float32).astype(np.float64) * 0.5
    ok = np.abs(half) < 2**62  # float -> int64 of a value past the range is undefined in C
    want = x.astype(np.int32).astype(I64) + np.trunc(half).astype(I64)
    np.testing.assert_array_equal(np.array(back)[ok], want[ok])
    assert np.array(div).tolist() == [_wrap64(_c_div(v, 7) * 1000 + v - _c_div(v, 7) * 7)
                                      for v in x.tolist()]


def _c_div(a: int, b: int) -> int:
    """C's integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _wrap64(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


@metile.kernel
def to_half(X, H, B, Back, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    h = x.to(metile.float16)
    metile.store(H + offs, h)
    metile.store(B + offs, x.to(metile.bfloat16))
    metile.store(Back + offs, h.to(metile.int64))


def test_int64_to_half_and_bfloat16_and_back(rng):
    # |x| < 2**20: float32 holds x exactly, so rounding it to bfloat16 once is the reference
    x = rng.integers(-2**20, 2**20, 64, dtype=I64)
    x[:3] = (-2048, 2049, 65519)
    h, b, back = to_half[(1,)](mx.array(x), mx.zeros(64, mx.float16), mx.zeros(64, mx.bfloat16),
                               mx.zeros(64, mx.int64), BLOCK=64)
    with np.errstate(over="ignore"):  # past 65504 float16 is inf, on both sides
        want = x.astype(np.float16)
    np.testing.assert_array_equal(np.array(h), want)
    np.testing.assert_array_equal(np.array(b.astype(mx.float32)),
                                  np.array(mx.array(x.astype(np.float32)).astype(mx.bfloat16)
                                           .astype(mx.float32)))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.array(back)[finite], want[finite].astype(I64))


@metile.kernel
def scaled_offsets(X, Out, base, step, n, BLOCK: metile.constexpr):
    """An int64 scalar argument past 2**31 in arithmetic: (base + i * step) - base."""
    offs = metile.arange(0, BLOCK)
    m = offs < n
    far = base + offs * step          # int64 values past 2**31
    metile.store(Out + offs, far - base + metile.load(X + offs, mask=m), mask=m)


def test_int64_scalar_argument_beyond_int32():
    n = 50
    x = np.arange(n, dtype=I64)
    base, step = 2**40 + 17, 3
    out = scaled_offsets[(1,)](mx.array(x), mx.zeros(n, mx.int64), base, step, n, BLOCK=64)
    np.testing.assert_array_equal(np.array(out), x + x * step)
    # Triton's rule: a Python int past int32 is an int64 argument; within int32 it is int32
    d = scaled_offsets.last_dispatch
    assert (_scalar_type(d, "base"), _scalar_type(d, "step")) == ("int64", "int32")
    out = scaled_offsets[(1,)](mx.array(x), mx.zeros(n, mx.int64), 5, step, n, BLOCK=64)
    np.testing.assert_array_equal(np.array(out), x + x * step)
    assert _scalar_type(scaled_offsets.last_dispatch, "base") == "int32"


@metile.kernel
def reduce_all(X, S, Hi, Lo, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    metile.store(S, metile.sum(x, axis=0))
    metile.store(Hi, metile.max(metile.where(m, x, -2**63), axis=0))
    metile.store(Lo, metile.min(metile.where(m, x, 2**63 - 1), axis=0))


@metile.kernel
def reduce_rows(X, S, Hi, Lo, COLS: metile.constexpr, ROWS: metile.constexpr):
    r = metile.arange(0, ROWS)
    c = metile.arange(0, COLS)
    x = metile.load(X + r[:, None] * COLS + c[None, :])
    metile.store(S + r, metile.sum(x, axis=1))
    metile.store(Hi + r, metile.max(x, axis=1))
    metile.store(Lo + r, metile.min(x, axis=1))


@pytest.mark.parametrize("n,block", [(1, 32), (300, 512), (1000, 1024)])
def test_int64_reductions(rng, n, block):
    x = rng.integers(-2**52, 2**52, n, dtype=I64)
    z = [mx.zeros(1, mx.int64) for _ in range(3)]
    s, hi, lo = reduce_all[(1,)](mx.array(x), *z, n, BLOCK=block)
    assert (int(np.array(s)[0]), int(np.array(hi)[0]), int(np.array(lo)[0])) == \
        (int(x.sum()), int(x.max()), int(x.min()))


def test_int64_reductions_along_an_axis(rng):
    x = rng.integers(-2**60, 2**60, (8, 64), dtype=I64)
    s, hi, lo = reduce_rows[(1,)](mx.array(x), *(mx.zeros(8, mx.int64) for _ in range(3)),
                                  COLS=64, ROWS=8)
    np.testing.assert_array_equal(np.array(s), x.sum(axis=1))  # wraps in 64 bits, as NumPy
    np.testing.assert_array_equal(np.array(hi), x.max(axis=1))
    np.testing.assert_array_equal(np.array(lo), x.min(axis=1))


@metile.kernel
def scan_sort(X, C, AM, S, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    metile.store(C + offs, metile.cumsum(x, 0))
    metile.store(AM, metile.argmax(x, 0))
    metile.store(S + offs, metile.sort(x))


def test_int64_cumsum_argmax_sort(rng):
    x = rng.integers(-2**62, 2**62, 64, dtype=I64)
    c, am, s = scan_sort[(1,)](mx.array(x), mx.zeros(64, mx.int64), mx.zeros(1, mx.int32),
                               mx.zeros(64, mx.int64), BLOCK=64)
    np.testing.assert_array_equal(np.array(c), np.cumsum(x))  # wraps in 64 bits, as NumPy
    assert int(np.array(am)[0]) == int(np.argmax(x))
    np.testing.assert_array_equal(np.array(s), np.sort(x))


@metile.kernel
def scale_2d(A, Out, M, N, stride_am, stride_an, stride_om, BM: metile.constexpr,
             BN: metile.constexpr):
    pm = metile.program_id(0)
    pn = metile.program_id(1)
    rm = pm * BM + metile.arange(0, BM)
    rn = pn * BN + metile.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    a = metile.load(A + rm[:, None] * stride_am + rn[None, :] * stride_an, mask=mask)
    metile.store(Out + rm[:, None] * stride_om + rn[None, :], a * 2.0, mask=mask)


def test_2d_kernel_with_int64_strides(rng):
    M, N, ld = 37, 45, 64
    a = rng.standard_normal((M, ld)).astype(np.float32)
    out = scale_2d[(metile.cdiv(M, 16), metile.cdiv(N, 16))](
        mx.array(a), mx.zeros((M, N), mx.float32), M, N, i64(ld), i64(1), N, BM=16, BN=16)
    np.testing.assert_array_equal(np.array(out), a[:, :N] * 2)


@metile.kernel
def matmul(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
           BM: metile.constexpr, BN: metile.constexpr, BK: metile.constexpr):
    """Triton's matmul tutorial loop (pointers advanced by int64 strides)."""
    pid_m = metile.program_id(0)
    pid_n = metile.program_id(1)
    offs_m = (pid_m * BM + metile.arange(0, BM)) % M
    offs_n = (pid_n * BN + metile.arange(0, BN)) % N
    offs_k = metile.arange(0, BK)
    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = metile.zeros((BM, BN), metile.float32)
    for k in range(0, metile.cdiv(K, BK)):
        a = metile.load(a_ptrs, mask=offs_k[None, :] < K - k * BK, other=0.0)
        b = metile.load(b_ptrs, mask=offs_k[:, None] < K - k * BK, other=0.0)
        acc += metile.dot(a, b)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    offs_cm = pid_m * BM + metile.arange(0, BM)
    offs_cn = pid_n * BN + metile.arange(0, BN)
    metile.store(C + stride_cm * offs_cm[:, None] + offs_cn[None, :], acc,
                 mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


@pytest.mark.parametrize("wide", ["all", "am"])
def test_matmul_with_int64_strides(rng, wide):
    M, N, K = 64, 48, 72
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    strides = [K, 1, N, 1, N]
    strides = [i64(s) for s in strides] if wide == "all" else [i64(K)] + strides[1:]
    c = matmul[(M // 32, N // 16)](mx.array(a), mx.array(b), mx.zeros((M, N), mx.float32), M, N, K,
                                   *strides, BM=32, BN=16, BK=16)
    np.testing.assert_allclose(np.array(c), a.astype(np.float64) @ b, rtol=3e-4, atol=3e-5 * K)


@metile.kernel
def atomic_int64(X, Out):
    metile.atomic_add(Out, metile.load(X))  # MARK-atomic


@metile.kernel
def random_int64_offsets(O, seed, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK).to(metile.int64)
    metile.store(O + offs, metile.randint(seed, offs))


@metile.kernel
def umulhi_int64(X, O):
    metile.store(O, metile.umulhi(metile.load(X), metile.load(X)))


@metile.kernel
def too_wide_constant(O):
    metile.store(O, metile.load(O) + 2**64)


@metile.kernel
def uint64_offset(X, Out):
    metile.store(Out, metile.load(X + metile.load(X).to(metile.uint64)))


def test_unsupported_int64_uses_are_clear_errors():
    x = mx.array(np.array([5], I64))
    with pytest.raises(CompilationError, match=r"atomic_add\(\) on a int64 buffer is not "
                                               r"supported; it takes float32, int32, uint32"):
        atomic_int64[(1,)](x, mx.zeros(1, mx.int64))
    with pytest.raises(CompilationError, match=r"random offsets must be 32-bit: Triton keys "
                                               r"Philox-4x64 on 64-bit offsets"):
        random_int64_offsets[(1,)](mx.zeros(8, mx.uint32), 7, BLOCK=8)
    with pytest.raises(CompilationError, match=r"umulhi\(\) of int64 operands \(the high 64 bits "
                                               r"of a 128-bit product\) is not built"):
        umulhi_int64[(1,)](x, mx.zeros(1, mx.int64))
    with pytest.raises(CompilationError, match=r"integer constant 18446744073709551616 does not "
                                               r"fit in 64 bits"):
        too_wide_constant[(1,)](x)
    with pytest.raises(CompilationError, match=r"pointer offsets must be int32 or int64, got "
                                               r"uint64; cast them"):
        uint64_offset[(1,)](x, mx.zeros(1, mx.int64))
    with pytest.raises(metile.LaunchError, match=r"argument 'n': 36893488147419103232 does not "
                                                 r"fit in 64 bits"):
        vector_add[(1,)](x, x, mx.zeros(1, mx.int64), 2**65, BLOCK=32)


needs_nvrtc = pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")


@needs_nvrtc
@pytest.mark.parametrize("launch", [
    lambda: vector_add[(4,)].prepare(i64(np.arange(100)), i64(np.arange(100)),
                               mx.zeros(100, mx.int64), 100, BLOCK=32, backend="cuda"),
    lambda: reduce_all[(1,)].prepare(i64(np.arange(100)), *(mx.zeros(1, mx.int64) for _ in range(3)),
                               100, BLOCK=256, backend="cuda"),
    lambda: casts[(1,)].prepare(i64(np.arange(8)), mx.zeros(8, mx.float32), mx.zeros(8, mx.int32),
                          mx.zeros(8, mx.uint32), mx.zeros(8, mx.int64), mx.zeros(8, mx.int64), 8,
                          BLOCK=32, backend="cuda"),
    lambda: to_half[(1,)].prepare(i64(np.arange(32)), mx.zeros(32, mx.float16),
                                  mx.zeros(32, mx.bfloat16), mx.zeros(32, mx.int64), BLOCK=32,
                                  backend="cuda"),
], ids=["vector_add", "reductions", "casts", "half"])
def test_cuda_emission_compiles_with_nvrtc(launch):
    source = translation_unit(launch())
    assert "int64_t" in source
    ok, log = compile_cuda(source, "sm_90")
    assert ok, log


@metile.kernel
def chosen_constant(O, n):
    # the two numbers type as an `if` statement's two assignments do: 0 or 2**31 is uint32
    # ("constant 2147483648 does not fit in int32" before), -1 or 2**40 int64
    metile.store(O, 0 if n > 0 else 2**31)
    metile.store(O + 1, metile.where(n > 0, -1, 2**40))
    metile.store(O + 2, metile.where(n > 0, 1.5, 2))


@pytest.mark.parametrize("n", [-1, 1])
def test_a_choice_between_two_numbers_takes_their_common_type(n):
    got = np.array(chosen_constant[(1,)](mx.zeros((3,), mx.int64), n))
    want = [0, -1, 1] if n > 0 else [2**31, 2**40, 2]
    np.testing.assert_array_equal(got, want)
