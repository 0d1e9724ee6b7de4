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
from nvrtc import TOOLKIT, compile_cuda, translation_unit

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


@pytest.mark.parametrize("n", (7, 1000))
@pytest.mark.parametrize("xd,yd,out", PAIRS, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("op", ["add", "max", "where"])
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
    out = F32   # (float16 / int32 too: Triton divides 16-bit floats in float32)
    z = binary[_grid(n)](x, y, mx.zeros((n,), out), n, OP="div", OUT=_MT[out], BLOCK=BLOCK)
    np.testing.assert_allclose(np.array(z).astype(np.float64), xn / yn, rtol=1e-6, atol=1e-6)


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
    if out != F32 and mx.default_device() == mx.gpu and mx.cuda.is_available():
        # CUDA contracts x * 3 + 0.5 into one FMA (NVRTC's default --fmad=true, as
        # Triton's enable_fp_fusion): one rounding there, so an element may instead equal
        # that single-rounded value, less 1, rounded (README, "Types follow Triton's rules")
        exact = xn.astype(np.float64) * 3 + 0.5
        once = (mx.array(exact.astype(np.float16)) if out == F16 else   # one rounding
                mx.array(exact.astype(np.float32)).astype(out))         # (exact in float32)
        fused = np.array((once - 1).astype(F32))
        ref = np.where(got == fused, got, ref)
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
def half_bfloat_convert(X, Y, Z, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    metile.store(Y + offs, x.to(Y.dtype.element_ty))
    metile.store(Z + offs, x)  # the store's own conversion


@pytest.mark.parametrize("src,dst", [(F16, BF16), (BF16, F16)], ids=["f16-bf16", "bf16-f16"])
def test_half_bfloat_conversions(src, dst):
    # clang has no half <-> bfloat conversion: the CPU runtime refused to compile these
    x = mx.array(np.array([1.0009765625, 3.14159, 65504, 1e-7, -2.5, 7e4, 65520, -0.0],
                          np.float32)).astype(src)
    y, z = half_bfloat_convert[(1,)](x, mx.zeros(8, dst), mx.zeros(8, dst), BLOCK=8)
    ref = np.array(x.astype(dst).astype(F32))
    np.testing.assert_array_equal(np.array(y.astype(F32)), ref)
    np.testing.assert_array_equal(np.array(z.astype(F32)), ref)


@pytest.mark.skipif(TOOLKIT is None, reason="needs NVRTC")
def test_half_bfloat_conversions_compile_for_cuda():
    launch = half_bfloat_convert[(1,)].prepare(mx.zeros(8, F16), mx.zeros(8, BF16),
                                               mx.zeros(8, BF16), BLOCK=8, backend="cuda")
    ok, log = compile_cuda(translation_unit(launch), "sm_90")
    assert ok, log


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


# -- metile.math ------------------------------------------------------------------------

UNARY = {"log2": (np.log2, (0.1, 8)), "sin": (np.sin, (-6, 6)), "cos": (np.cos, (-6, 6)),
         "tan": (np.tan, (-1.2, 1.2)), "asin": (np.arcsin, (-1, 1)), "acos": (np.arccos, (-1, 1)),
         "atan": (np.arctan, (-8, 8)), "floor": (np.floor, (-9, 9)), "ceil": (np.ceil, (-9, 9)),
         "exp2": (np.exp2, (-8, 8)), "rsqrt": (lambda v: 1 / np.sqrt(v), (0.1, 8)),
         "erf": (None, (-3, 3)), "sqrt_rn": (np.sqrt, (0, 9)), "sigmoid": (None, (-8, 8))}


@metile.kernel
def math1(X, Z, n, FN: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Z + offs, FN(metile.load(X + offs, mask=m)), mask=m)


def _ref1(fn, v):
    if fn == "erf":
        return np.vectorize(math.erf)(v)
    if fn == "sigmoid":
        return 1 / (1 + np.exp(-v))
    return UNARY[fn][0](v)


def _uniform(n, lo, hi, dtype, seed):
    v = np.random.default_rng(seed).uniform(lo, hi, n).astype(np.float32)
    a = mx.array(v).astype(dtype)
    return a, np.array(a.astype(F32)).astype(np.float64)


@pytest.mark.parametrize("n", (1000,))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("fn", sorted(UNARY))
def test_math_unary(fn, dtype, n):
    x, xn = _uniform(n, *UNARY[fn][1], dtype, 11)
    f = getattr(metile, fn) if fn == "sigmoid" else getattr(metile.math, fn)
    z = math1[_grid(n)](x, mx.zeros((n,), dtype), n, FN=f, BLOCK=BLOCK)
    ref = _ref1(fn, xn)
    got = np.array(z.astype(F32)).astype(np.float64)
    if dtype == F32:
        np.testing.assert_allclose(got, ref, rtol=3e-6, atol=3e-6)
    else:  # computed in float32, rounded once to the storage type: at most one unit apart
        rounded = np.array(mx.array(ref.astype(np.float32)).astype(dtype).astype(F32))
        ulp = np.abs(rounded) * (2**-10 if dtype == F16 else 2**-7) + 1e-7
        assert np.all(np.abs(got - rounded) <= ulp), np.max(np.abs(got - rounded) / ulp)


@metile.kernel
def math2(X, Y, Z, n, FN: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    y = metile.load(Y + offs, mask=m)
    if FN == "fma":
        z = metile.math.fma(x, y, x)
    elif FN == "clamp":
        z = metile.clamp(x, -1.0, y)
    elif FN == "div_rn":
        z = metile.math.div_rn(x, y)
    else:
        z = FN(x, y)
    metile.store(Z + offs, z, mask=m)


@pytest.mark.parametrize("n", (7, 1000))
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("fn", ["pow", "atan2", "fma", "clamp", "div_rn"])
def test_math_binary(fn, dtype, n):
    x, xn = _uniform(n, 0.1 if fn == "pow" else -4, 4, dtype, 12)
    y, yn = _uniform(n, 0.5, 3, dtype, 13)
    f = getattr(metile.math, fn) if fn in ("pow", "atan2") else fn
    z = math2[_grid(n)](x, y, mx.zeros((n,), dtype), n, FN=f, BLOCK=BLOCK)
    ref = {"pow": np.power, "atan2": np.arctan2, "fma": lambda a, b: a * b + a,
           "clamp": lambda a, b: np.minimum(np.maximum(a, -1.0), b),
           "div_rn": np.divide}[fn](xn, yn)
    got = np.array(z.astype(F32)).astype(np.float64)
    tol = 3e-6 if dtype == F32 else 2e-3
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_math_of_an_integer_is_refused():
    @metile.kernel
    def k(X):
        metile.store(X, metile.math.sin(metile.load(X)))

    with pytest.raises(metile.CompilationError, match="'sin' needs a floating-point operand, "
                                                      "got int32"):
        k[(1,)](mx.zeros((1,), I32))


def test_math_namespace_names_the_same_markers():
    for name in metile.math.__all__:
        assert getattr(metile.math, name) is getattr(metile, name)


# -- hints, compile-time helpers, loop options -----------------------------------------------

@metile.kernel
def hinted(X, Z, n, BLOCK: metile.constexpr):
    metile.static_assert(BLOCK == metile.next_power_of_2(BLOCK), "BLOCK is a power of two")
    pid = metile.program_id(0)
    offs = metile.max_contiguous(metile.multiple_of(pid * BLOCK, BLOCK), BLOCK) \
        + metile.arange(0, BLOCK)
    offs = metile.max_constancy(offs, 1)
    metile.assume(n > 0)
    metile.assume(BLOCK > 0)
    m = offs < n
    acc = metile.load(X + offs, mask=m)
    for i in metile.static_range(1, 4):
        acc = acc + i * metile.load(X + offs, mask=m)
    for j in metile.range(0, 2, num_stages=1):
        acc = acc + j
    metile.debug_barrier()
    metile.store(Z + offs, acc, mask=m)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [F32, I32], ids=lambda d: str(d).split(".")[-1])
def test_hints_and_compile_time_helpers(dtype, n):
    x, xn = _values(n, dtype, 14)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # num_stages=1 asks for nothing: no warning
        z = hinted[_grid(n)](x, mx.zeros((n,), dtype), n, BLOCK=BLOCK)
    np.testing.assert_allclose(np.array(z).astype(np.float64), xn * 7 + 1, rtol=3e-4, atol=3e-5)


def test_next_power_of_2_on_the_host():
    assert [metile.next_power_of_2(v) for v in (0, 1, 2, 3, 64, 65, 1000)] == \
        [1, 1, 2, 4, 64, 128, 1024]
    with pytest.raises(TypeError, match="needs an int, got float"):
        metile.next_power_of_2(3.0)


@metile.kernel
def staged_loop(X, Z, n, STAGES: metile.constexpr, WS: metile.constexpr, FRESH: metile.constexpr):
    acc = 0.0
    for i in metile.range(0, n, num_stages=STAGES, warp_specialize=WS):  # MARK-stages
        acc += metile.load(X + i)
    metile.store(Z, acc)


def _fresh():
    """A constexpr never compiled before: the messages below come from compiling."""
    import uuid
    return uuid.uuid4().hex


def test_loop_options_warn_when_not_honoured():
    x = mx.arange(10).astype(F32)
    with pytest.warns(UserWarning, match=r"test_triton_parity.py:\d+: range\(num_stages=3\) is "
                                         r"accepted but not honoured: software pipelining"):
        z = staged_loop[(1,)](x, mx.zeros((1,)), 10, STAGES=3, WS=False, FRESH=_fresh())
    assert float(z[0]) == 45.0
    with pytest.warns(UserWarning, match=r"range\(warp_specialize=True\) is accepted but not "
                                         r"honoured: metile does not specialize warps"):
        staged_loop[(1,)](x, mx.zeros((1,)), 10, STAGES=None, WS=True, FRESH=_fresh())


@metile.kernel
def prints(X, n, FRESH: metile.constexpr):
    metile.static_print("n is", n, "block", 4)
    metile.store(X, metile.load(X))


def test_static_print_prints_at_compile_time(capsys):
    prints[(1,)](mx.zeros((1,)), 3, FRESH=_fresh())
    out = capsys.readouterr().out
    assert "static_print: n is int32 block 4" in out


def _refused(kernel, match, *args, **kw):
    with pytest.raises(metile.CompilationError, match=match) as info:
        kernel[(1,)](*args, **kw)
    return str(info.value)


@metile.kernel
def bad_static_assert(X, B: metile.constexpr):
    metile.static_assert(B % 2 == 0, "B must be even")  # MARK-sa
    metile.store(X, 1.0)


@metile.kernel
def runtime_static_range(X, n):
    for i in metile.static_range(0, n):  # MARK-srange
        metile.store(X, 1.0)


@metile.kernel
def bad_hint(X, BLOCK: metile.constexpr):
    offs = metile.multiple_of(metile.arange(0, BLOCK), 0)  # MARK-hint
    metile.store(X + offs, 1.0)


@metile.kernel
def bad_loop_option(X, n):
    for i in metile.range(0, n, num_warps=4):  # MARK-opt
        metile.store(X, 1.0)


@metile.kernel
def bitcast(X):
    metile.store(X, metile.load(X).to(metile.int16, bitcast=True))  # MARK-bitcast


@metile.kernel
def bit_views(F, I, U, H, HU, B, BI, OF, OH, OB):
    """Triton's same-width bitcasts each way: float32 -> int32 / uint32, float16 ->
    uint16, bfloat16 -> int16, and back from the integers."""
    r = metile.arange(0, 64)
    f, h, b = metile.load(F + r), metile.load(H + r), metile.load(B + r)
    metile.store(I + r, f.to(metile.int32, bitcast=True))
    u = f.to(metile.uint32, bitcast=True)
    metile.store(U + r, u)
    metile.store(HU + r, h.to(metile.uint16, bitcast=True))
    metile.store(BI + r, b.to(metile.int16, bitcast=True))
    # back: the uint32 bits with the sign flipped (a float bit trick), and the 16-bit ones
    metile.store(OF + r, (u ^ 0x80000000).to(metile.float32, bitcast=True))
    metile.store(OH + r, h.to(metile.uint16, bitcast=True).to(metile.float16, bitcast=True))
    metile.store(OB + r, b.to(metile.int16, bitcast=True).to(metile.bfloat16, bitcast=True))


def bit_view_arrays(rng):
    f = (rng.standard_normal(64) * 100).astype(np.float32)
    return (mx.array(f), mx.zeros(64, mx.int32), mx.zeros(64, mx.uint32),
            mx.array(f.astype(np.float16)), mx.zeros(64, mx.uint16),
            mx.array(f).astype(mx.bfloat16), mx.zeros(64, mx.int16),
            mx.zeros(64, mx.float32), mx.zeros(64, mx.float16), mx.zeros(64, mx.bfloat16))


def test_same_width_bitcasts_read_the_bits(rng):
    args = bit_view_arrays(rng)
    i, u, hu, bi, of, oh, ob = bit_views[(1,)](*args)
    f = np.array(args[0])
    np.testing.assert_array_equal(np.array(i), f.view(np.int32))
    np.testing.assert_array_equal(np.array(u), f.view(np.uint32))
    np.testing.assert_array_equal(np.array(hu), np.array(args[3]).view(np.uint16))
    bf_bits = np.array(args[5].view(mx.int16))
    np.testing.assert_array_equal(np.array(bi), bf_bits)
    np.testing.assert_array_equal(np.array(of), -f)
    np.testing.assert_array_equal(np.array(oh), np.array(args[3]))
    np.testing.assert_array_equal(np.array(ob.view(mx.int16)), bf_bits)


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")
def test_same_width_bitcasts_compile_for_cuda(rng):
    d = bit_views[(1,)].prepare(*bit_view_arrays(rng), backend="cuda")
    assert "metile_bitcast<float>(" in d.source
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log


def test_compile_time_helpers_refuse_by_name():
    x = mx.zeros((8,))
    msg = _refused(bad_static_assert, "static_assert failed: B must be even", x, B=3)
    assert "MARK-sa" in msg
    _refused(runtime_static_range, r"static_range\(\) bounds must be constexpr ints, got a "
                                   r"runtime int32 value", x, 3)
    _refused(bad_hint, r"multiple_of\(\) values must be positive constexpr ints, got int 0", x,
             BLOCK=8)
    _refused(bad_loop_option, r"range\(\) got an unexpected keyword argument 'num_warps'", x, 3)
    _refused(bitcast, r"bitcast=True from float32 to int16: a reinterpreting cast needs two "
                      r"non-bool types of one width \(float32 has 32 bits, int16 16\)", x)


@pytest.mark.parametrize("expr,name", [
    ("metile.histogram(metile.load(X + metile.arange(0, 8)), 4)", "histogram"),
    ("metile.gather(metile.load(X + metile.arange(0, 8)), metile.arange(0, 8), 0)", "gather"),
    ("metile.load(X).to(metile.float8e4b8)", "float8e4b8"),
    ("metile.dot_scaled(metile.load(X), 1, 'e2m1', metile.load(X), 1, 'e2m1')", "dot_scaled"),
    ("metile.math.softmax(metile.load(X + metile.arange(0, 8)))", "softmax"),
])
def test_unsupported_triton_names_are_named(expr, name, tmp_path):
    import importlib.util
    src = tmp_path / f"k_{name}.py"
    src.write_text("import metile\n\n\n@metile.kernel\ndef k(X):\n"
                   f"    metile.store(X, {expr})\n")
    spec = importlib.util.spec_from_file_location(f"k_{name}", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(metile.CompilationError) as info:
        mod.k[(1,)](mx.zeros((8,)))
    msg = str(info.value)
    prefix = "metile.math" if "math." in expr else "metile"
    assert f"{prefix}.{name} (Triton's tl.{name}) is not supported: " in msg, msg
    assert f"{src}:6:" in msg, msg


# -- shape helpers, ptr.dtype.element_ty ------------------------------------------------------

@metile.kernel
def outer(X, Y, Z, M: metile.constexpr, N: metile.constexpr):
    x = metile.load(X + metile.arange(0, M))
    y = metile.load(Y + metile.arange(0, N))
    rows = metile.broadcast_to(metile.expand_dims(x, 1), (M, N))
    cols = metile.expand_dims(y, 0)
    z = rows * cols
    zero = metile.zeros((M, N), dtype=Z.dtype.element_ty)
    assert Z.dtype.element_ty == z.dtype or Z.dtype.element_ty != z.dtype
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    metile.store(Z + offs, z + zero)


@pytest.mark.parametrize("m,n", [(1, 8), (4, 32), (16, 2)])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: str(d).split(".")[-1])
def test_expand_dims_broadcast_to_and_element_ty(m, n, dtype):
    (x, xn), (y, yn) = _values(m, dtype, 15), _values(n, dtype, 16)
    z = outer[(1,)](x, y, mx.zeros((m * n,), dtype), M=m, N=n)
    ref = np.array(mx.array(np.outer(xn, yn).astype(np.float32)).astype(dtype))
    np.testing.assert_array_equal(np.array(z).reshape(m, n), ref)


@metile.kernel
def bad_broadcast(X):
    metile.store(X + metile.arange(0, 4), metile.broadcast_to(metile.arange(0, 4), (2,)))


def test_broadcast_to_a_smaller_shape_is_refused():
    _refused(bad_broadcast, r"broadcast_to\(\): a tile of shape \(4,\) does not broadcast to "
                            r"\(2,\)", mx.zeros((4,), I32))


@metile.kernel
def divided(X, Y, Z, OUT: metile.constexpr):
    o = metile.arange(0, 4)
    q = metile.load(X + o) / metile.load(Y + o)
    assert q.dtype == OUT
    metile.store(Z + o, q)


@pytest.mark.parametrize("xd,yd", [(F16, F16), (BF16, BF16), (I32, F16), (F16, BF16)],
                         ids=lambda d: str(d).split(".")[-1])
def test_division_of_16_bit_floats_is_float32_as_in_triton(xd, yd):
    # Triton computes `/` of a float16 or bfloat16 operand in float32 (PTX has no 16-bit
    # division) with a float32 result; metile divided in 16 bits: int32 100000 / float16 4
    # was inf, 1 / 3 had three digits
    x = mx.array([100000, 1, 7, 3]).astype(xd) if xd == I32 else \
        mx.array([1.0, 2.0, 7.0, 3.0]).astype(xd)
    y = mx.array([4.0, 3.0, 9.0, 0.5]).astype(yd)
    z = divided[(1,)](x, y, mx.zeros((4,), F32), OUT=metile.float32)
    want = np.array(x.astype(F32), np.float64) / np.array(y.astype(F32), np.float64)
    np.testing.assert_allclose(np.array(z), want.astype(np.float32), rtol=1e-7)


@metile.kernel
def scaled_by(X, Z, V: metile.constexpr):
    o = metile.arange(0, 4)
    metile.store(Z + o, metile.load(X + o) * V)


@pytest.mark.parametrize("value", [1 + 2**-24, 1 + 3 * 2**-24, 0.5 + 2**-25, 16777217.0,
                                   3.4028235677973366e38, -3.4028235677973366e38])
def test_a_float_constant_rounds_once_as_the_same_runtime_number(value):
    # a constant halfway between two float32 values was written as its double's decimal
    # and rounded by the compiler the other way (1 + 2**-24 gave 1.0000001; the largest
    # double below float32's overflow threshold gave FLT_MAX, not inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.full(4, np.float32(value))
    constant = scaled_by[(1,)](mx.ones((4,)), mx.zeros((4,)), V=value)
    np.testing.assert_array_equal(np.array(constant), want)


@metile.kernel
def folded(Z):
    o = metile.arange(0, 16)
    nan = float("nan")
    v = metile.where(o == 0, metile.maximum(nan, 1.0),
        metile.where(o == 1, metile.minimum(nan, 1.0),
        metile.where(o == 2, metile.clamp(nan, 0.0, 10.0),
        metile.where(o == 3, metile.exp(1000.0),
        metile.where(o == 4, metile.log(0.0),
        metile.where(o == 5, metile.sqrt(-1.0),
        metile.where(o == 6, metile.sigmoid(-1000.0),
        metile.where(o == 7, metile.rsqrt(0.0),
        metile.where(o == 8, metile.math.pow(0.0, -1.0),
        metile.where(o == 9, metile.maximum(nan, 1.0, propagate_nan=metile.PropagateNan.ALL),
        metile.where(o == 10, o * metile.floor(2.5) / 4, 0.0)))))))))))
    metile.store(Z + o, v)


def test_compile_time_math_folds_as_the_run_time_functions():
    # constants folded with Python's max/min (a NaN first came out), floor/ceil as ints
    # (`i * floor(2.5)` was an int tile) and math's exceptions (exp(1000.) was a compile
    # error, Triton gives inf)
    z = np.array(folded[(1,)](mx.zeros((16,))))
    want = [1.0, 1.0, 0.0, np.inf, -np.inf, np.nan, 0.0, np.inf, np.inf, np.nan, 10 * 2.0 / 4]
    np.testing.assert_array_equal(z[:11], np.array(want, np.float32))


@metile.kernel
def mixed_signedness(X, Y, Z, OP: metile.constexpr):
    o = metile.arange(0, 4)
    x, y = metile.load(X + o), metile.load(Y + o)
    metile.store(Z + o, x // y if OP == "idiv" else x % y)


@pytest.mark.parametrize("op", ["idiv", "mod"])
def test_division_of_mixed_signedness_is_refused_as_in_triton(op):
    # int32 // uint32 divided as unsigned: -7 // 2 gave 2147483644 (Triton refuses it)
    x = mx.array([-7, 7, 9, -1], mx.int32)
    y = mx.array([2, 2, 4, 3], mx.uint32)
    with pytest.raises(metile.CompilationError, match="different signedness"):
        mixed_signedness[(1,)](x, y, mx.zeros((4,), mx.int32), OP=op)
    z = mixed_signedness[(1,)](x, y.astype(mx.int32), mx.zeros((4,), mx.int32), OP=op)
    want = np.fmod(np.array(x), np.array(y).astype(np.int32)) if op == "mod" else \
        np.trunc(np.array(x) / np.array(y).astype(np.int32)).astype(np.int32)
    np.testing.assert_array_equal(np.array(z), want)


# -- `not`, `and`, `or` (a hostile trial: `not n` on a runtime int was refused with a hint
# about tiles, and `and`/`or`/`not` on bool tiles, which Triton takes elementwise, too) ------

@metile.kernel
def truthiness(X, Out, n, f, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    r = 0
    if not n:
        r += 1
    if not f:
        r += 10
    pos, small = x > 0, x < 3
    both = (pos and small).to(metile.int32)
    either = (pos or small).to(metile.int32) * 100
    neither = (not pos).to(metile.int32) * 1000
    metile.store(Out + offs, both + either + neither + r * 10000)


@pytest.mark.parametrize("n, f", [(0, 0.0), (3, -0.0), (-2, 0.5), (0, float("nan"))])
def test_not_and_or_follow_python_on_scalars_and_bool_tiles(n, f):
    x = np.array([-1, 0, 1, 2, 3, 4, -5, 2], np.float32)
    out = np.array(truthiness[(1,)](mx.array(x), mx.zeros((8,), mx.int32), n, f, BLOCK=8))
    pos, small = x > 0, x < 3
    r = (not n) * 1 + (not f) * 10
    np.testing.assert_array_equal(out, (pos & small) + (pos | small) * 100 + (~pos) * 1000
                                  + r * 10000)


@metile.kernel
def and_of_ints(Out, n, m):
    v = n and m
    metile.store(Out, v)


def test_and_of_runtime_ints_asks_for_the_comparison():
    # Python's `n and m` is m or n, not a bool: no conversion keeps its meaning everywhere
    with pytest.raises(metile.CompilationError,
                       match=r"'and' needs bool scalars, got a runtime int32 value; compare it"):
        and_of_ints[(1,)](mx.zeros((1,), mx.int32), 1, 2)


# -- chained comparisons: Python's `a < b < c` is (a < b) and (b < c), b evaluated once
# (a hostile trial: `if 0 <= i < n:` was a compile error; Triton refuses it too) ---------------

@metile.kernel
def chained(A, B, C, Out, lo, hi, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    a = metile.load(A + offs)
    b = metile.load(B + offs)
    c = metile.load(C + offs)
    r = (a < b < c).to(metile.int32) + (a <= b != c > 0).to(metile.int32) * 10
    s = 0
    if lo <= 3 < hi:
        s = 100
    if 0 < 1 < lo:      # a constant True link drops out
        s += 1000
    if 2 < 1 < lo:      # a constant False link is the answer
        s += 10000
    metile.store(Out + offs, r + s + (lo < a < hi).to(metile.int32) * 100000)


@pytest.mark.parametrize("lo, hi", [(0, 4), (4, 9), (2, 3)])
def test_chained_comparisons_are_pythons(lo, hi):
    a = np.array([1, 2, 3, 0, 5, np.nan], np.float32)
    b = np.array([2, 1, 4, 0, 5, 1], np.float32)
    c = np.array([3, 3, 3, 1, -1, 2], np.float32)
    out = chained[(1,)](mx.array(a), mx.array(b), mx.array(c), mx.zeros((6,), mx.int32), lo, hi,
                        BLOCK=6)
    ref = ((a < b) & (b < c)) + ((a <= b) & (b != c) & (c > 0)) * 10 \
        + (100 if lo <= 3 < hi else 0) + (1000 if 1 < lo else 0) + ((lo < a) & (a < hi)) * 100000
    np.testing.assert_array_equal(np.array(out), ref)
