"""metile's Philox random numbers (python/metile/language/random.py) against a NumPy
Philox with Triton's key, counter and float conversions (tests/philox_reference.py):
integer streams bit for bit, uniforms exactly, normals to float32 transcendental
accuracy.  Numbers come from the CPU runtime; the CUDA spelling is compiled with NVRTC."""

import mlx.core as mx
import numpy as np
import pytest

import metile
import philox_reference as ref
from conftest import requires_clang, requires_msl_device

BLOCK = 128
SEEDS = (0, 1, 12345, -7, 2**31 - 1, -2**31)
U32, F32, I32 = mx.uint32, mx.float32, mx.int32


def _grid(n):
    return (max(1, metile.cdiv(n, BLOCK)),)


@metile.kernel
def ints4(O0, O1, O2, O3, n, seed, R: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    r0, r1, r2, r3 = metile.randint4x(seed, offs, R)
    metile.store(O0 + offs, r0, mask=m)
    metile.store(O1 + offs, r1, mask=m)
    metile.store(O2 + offs, r2, mask=m)
    metile.store(O3 + offs, r3, mask=m)


@metile.kernel
def singles(OFF, I, U, G, n, seed, R: metile.constexpr, BLOCK: metile.constexpr):
    """randint / rand / randn of offsets read from a buffer (any int32, negatives too)."""
    idx = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = idx < n
    offs = metile.load(OFF + idx, mask=m)
    metile.store(I + idx, metile.randint(seed, offs, R), mask=m)
    metile.store(U + idx, metile.rand(seed, offs, R), mask=m)
    metile.store(G + idx, metile.randn(seed, offs, R), mask=m)


@metile.kernel
def floats4(U0, U1, U2, U3, G0, G1, G2, G3, n, seed, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    u0, u1, u2, u3 = metile.rand4x(seed, offs)
    g0, g1, g2, g3 = metile.randn4x(seed, offs)
    metile.store(U0 + offs, u0, mask=m)
    metile.store(U1 + offs, u1, mask=m)
    metile.store(U2 + offs, u2, mask=m)
    metile.store(U3 + offs, u3, mask=m)
    metile.store(G0 + offs, g0, mask=m)
    metile.store(G1 + offs, g1, mask=m)
    metile.store(G2 + offs, g2, mask=m)
    metile.store(G3 + offs, g3, mask=m)


@metile.kernel
def dropout(x_ptr, out_ptr, n, p, seed, BLOCK: metile.constexpr):
    """Triton's tutorial dropout, renamed tl -> metile."""
    pid = metile.program_id(0)
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(x_ptr + offs, mask=mask)
    r = metile.rand(seed, offs)
    metile.store(out_ptr + offs, metile.where(r > p, x / (1 - p), 0.0), mask=mask)


@metile.kernel
def philox_words(C, K, O0, O1, O2, O3, R: metile.constexpr):
    """philox_impl on one counter and key read from buffers (known-answer vectors)."""
    c0, c1, c2, c3 = metile.load(C), metile.load(C + 1), metile.load(C + 2), metile.load(C + 3)
    k0, k1 = metile.load(K), metile.load(K + 1)
    r0, r1, r2, r3 = metile.philox_impl(c0, c1, c2, c3, k0, k1, R)
    metile.store(O0, r0)
    metile.store(O1, r1)
    metile.store(O2, r2)
    metile.store(O3, r3)


@metile.kernel
def constant_seed(O, n, SEED: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(O + offs, metile.randint(SEED, offs), mask=offs < n)


@metile.kernel
def scalar_offset(O, seed, OFFSET: metile.constexpr):
    metile.store(O, metile.randint(seed, OFFSET))
    metile.store(O + 1, metile.randint(seed, metile.program_id(0) + OFFSET))


@metile.kernel
def high_words(X, Y, Z, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    z = metile.umulhi(metile.load(X + offs, mask=m), metile.load(Y + offs, mask=m))
    metile.store(Z + offs, z, mask=m)


def _zeros(n, dtype=U32, k=1):
    return [mx.zeros((n,), dtype) for _ in range(k)]


# -- the reference itself -------------------------------------------------------------------------

def test_reference_matches_published_philox_vectors():
    # Random123's known-answer vectors for Philox-4x32-10 (counter words, key words -> output)
    for args, want in KAT:
        assert [int(w) for w in ref.philox_impl(*args)] == want


KAT = [((0, 0, 0, 0, 0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
       ((0xFFFFFFFF,) * 6, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0),
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])]


@pytest.mark.parametrize("case", range(len(KAT)))
def test_philox_impl_known_answers(case):
    args, want = KAT[case]
    c = mx.array(np.array(args[:4], dtype=np.uint32))
    k = mx.array(np.array(args[4:], dtype=np.uint32))
    out = philox_words[(1,)](c, k, *_zeros(1, k=4), R=10)
    assert [int(np.array(o)[0]) for o in out] == want


# -- integer streams, bit for bit -----------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", (1, 7, 65, 1000))
def test_randint4x_stream(seed, n):
    out = ints4[_grid(n)](*_zeros(n, k=4), n, seed, R=10, BLOCK=BLOCK)
    want = ref.randint4x(seed, np.arange(n))
    for j, (o, w) in enumerate(zip(out, want)):
        np.testing.assert_array_equal(np.array(o), w, err_msg=f"word {j}")


@pytest.mark.parametrize("rounds", (7, 10, 1))
def test_n_rounds(rounds):
    n = 300
    out = ints4[_grid(n)](*_zeros(n, k=4), n, 2024, R=rounds, BLOCK=BLOCK)
    for o, w in zip(out, ref.randint4x(2024, np.arange(n), rounds)):
        np.testing.assert_array_equal(np.array(o), w)
    if rounds != 10:  # a different stream from the default
        assert not np.array_equal(np.array(out[0]), ref.randint4x(2024, np.arange(n))[0])


OFFSETS = np.concatenate([np.arange(-40, 200), [2**31 - 1, -2**31, 123456789, -987654321]])


@pytest.mark.parametrize("seed", (3, -99))
@pytest.mark.parametrize("rounds", (10, 7))
def test_randint_rand_randn_of_any_offsets(seed, rounds):
    offs = OFFSETS.astype(np.int32)
    n = offs.size
    i, u, g = singles[_grid(n)](mx.array(offs), *_zeros(n), *_zeros(n, F32, 2), n, seed,
                                R=rounds, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(i), ref.randint4x(seed, offs, rounds)[0])
    u = np.array(u)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    # same float32 operations in the same order: equal (the brief allows 1 ulp; none is used)
    want_u = ref.rand(seed, offs, rounds)
    assert np.max(np.abs(u.view(np.int32) - want_u.view(np.int32))) <= 1
    np.testing.assert_allclose(np.array(g), ref.randn(seed, offs, rounds), rtol=1e-5, atol=1e-6)


def test_uint32_seed_above_int32_is_triton_int64_seed():
    # Triton widens a seed in [2**31, 2**32) (a Python int, so int64) with a zero high word;
    # metile takes it as a 0-d uint32 array and keys Philox the same way
    seed = 2**31 + 12345
    n = 100
    out = ints4[_grid(n)](*_zeros(n, k=4), n, mx.array(seed, dtype=U32), R=10, BLOCK=BLOCK)
    want = ref.randint4x(seed, np.arange(n))
    for o, w in zip(out, want):
        np.testing.assert_array_equal(np.array(o), w)
    # not the stream of the same bits read as a negative int32 seed (high word all ones)
    assert not np.array_equal(want[0], ref.randint4x(seed - 2**32, np.arange(n))[0])


def test_int32_seed_array_sign_extends():
    n = 50
    out = ints4[_grid(n)](*_zeros(n, k=4), n, mx.array(-5, dtype=I32), R=10, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(out[0]), ref.randint4x(-5, np.arange(n))[0])


@pytest.mark.parametrize("seed", (0, 7, -3, 2**32 - 1))
def test_constexpr_seed(seed):
    n = 130
    out = constant_seed[_grid(n)](*_zeros(n), n, SEED=seed, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(out), ref.randint4x(seed, np.arange(n))[0])


def test_scalar_offsets():
    # a Python-int offset and a runtime scalar offset give scalars of the same stream
    got = np.array(scalar_offset[(1,)](*_zeros(2), 77, OFFSET=5))
    np.testing.assert_array_equal(got, ref.randint4x(77, np.array([5, 5]))[0])


@pytest.mark.parametrize("seed", (2**32, 2**40 + 12345, -2**40 - 7, 2**63 + 99))
def test_64_bit_seed_keys_both_words(seed):
    # Triton's 64-bit seed: a Python int past int32 is passed as int64 (uint64 from 2**63)
    n = 40
    want = ref.randint4x(seed, np.arange(n))
    out = ints4[_grid(n)](*_zeros(n, k=4), n, seed, R=10, BLOCK=BLOCK)
    for got, w in zip(out, want):
        np.testing.assert_array_equal(np.array(got), w)
    out = constant_seed[_grid(n)](*_zeros(n), n, SEED=seed, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(out), want[0])


@metile.kernel
def runtime_rounds(O, n, seed, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.store(O + offs, metile.rand(seed, offs, n), mask=offs < n)


def test_n_rounds_must_be_a_constant():
    with pytest.raises(metile.CompilationError) as info:
        runtime_rounds[(1,)](mx.zeros((8,)), 8, 1, BLOCK=8)
    msg = str(info.value)
    assert "rand(): constexpr parameter 'n_rounds' needs a compile-time value, got a runtime " \
           "int32 value" in msg, msg
    line = runtime_rounds.fn.__code__.co_firstlineno + 3  # the call, not the library's line
    assert f"test_random.py:{line}:" in msg, msg


def test_streams_differ_by_seed_and_offset():
    n = 1000
    a = np.array(ints4[_grid(n)](*_zeros(n, k=4), n, 1, R=10, BLOCK=BLOCK)[0])
    b = np.array(ints4[_grid(n)](*_zeros(n, k=4), n, 2, R=10, BLOCK=BLOCK)[0])
    assert len(np.unique(a)) == n and np.mean(a == b) < 0.01


# -- floats ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", (0, 42, -1))
@pytest.mark.parametrize("n", (9, 1000))
def test_rand4x_and_randn4x(seed, n):
    out = floats4[_grid(n)](*_zeros(n, F32, 8), n, seed, BLOCK=BLOCK)
    words = ref.randint4x(seed, np.arange(n))
    for j in range(4):
        u = np.array(out[j])
        assert u.min() >= 0.0 and u.max() < 1.0
        np.testing.assert_array_equal(u, ref.uint_to_uniform_float(words[j]))
    for j, want in enumerate(ref.randn4x(seed, np.arange(n))):
        np.testing.assert_allclose(np.array(out[4 + j]), want, rtol=1e-5, atol=1e-6)


def test_distribution_moments():
    # 64k draws: uniform mean 1/2, variance 1/12; normal mean 0, variance 1 (5 sigma bounds)
    n = 1 << 16
    out = floats4[_grid(n)](*_zeros(n, F32, 8), n, 7, BLOCK=BLOCK)
    u = np.concatenate([np.array(o) for o in out[:4]]).astype(np.float64)
    g = np.concatenate([np.array(o) for o in out[4:]]).astype(np.float64)
    m = u.size
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / m)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / m)
    assert abs(g.mean()) < 5 / np.sqrt(m) and abs(g.var() - 1) < 5 * np.sqrt(2 / m)


def test_uniform_extremes():
    # the largest and smallest words map inside [0, 1), as Triton's conversion promises
    words = np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=np.uint32)
    u = ref.uint_to_uniform_float(words)
    assert u.max() < 1.0 and u[0] == 0.0 and u[-1] == 0.0


@pytest.mark.parametrize("n", (1, 7, 63, 65, 1000))
def test_dropout_matches_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    p, seed = 0.3, 2718
    out = np.array(dropout[_grid(n)](mx.array(x), mx.zeros((n,), F32), n, p, seed, BLOCK=BLOCK))
    keep = ref.rand(seed, np.arange(n)) > np.float32(p)
    want = np.where(keep, x / np.float32(1 - p), np.float32(0))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=0)
    assert np.array_equal(out != 0, keep & (x != 0))


# -- umulhi ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", (U32, I32))
def test_umulhi(dtype):
    rng = np.random.default_rng(5)
    a = rng.integers(0, 2**32, 1000, dtype=np.uint64)
    b = rng.integers(0, 2**32, 1000, dtype=np.uint64)
    a[:3], b[:3] = [0, 2**32 - 1, 2**31], [5, 2**32 - 1, 2]
    npd = np.uint32 if dtype == U32 else np.int32
    x, y = (mx.array(v.astype(np.uint32).view(npd)) for v in (a, b))
    z = high_words[_grid(1000)](x, y, mx.zeros((1000,), dtype), 1000, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(z).view(np.uint32), ((a * b) >> 32).astype(np.uint32))


def test_umulhi_needs_integers():
    with pytest.raises(metile.CompilationError, match=r"'umulhi' needs integer operands, got "
                                                      r"float32"):
        high_words[(1,)](mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=BLOCK)


def test_random_functions_refuse_python_calls():
    with pytest.raises(RuntimeError, match=r"metile.rand can only be called inside a "
                                           r"@metile.kernel"):
        metile.rand(0, 1)


@requires_clang
@requires_msl_device
def test_generated_msl_passes_the_strict_metal_check(monkeypatch):
    # metal::mulhi on uint, the uint/float conversions and the comparisons as Metal takes them
    monkeypatch.setenv("METILE_MSL_STRICT", "1")
    offs = np.arange(-3, 60).astype(np.int32)
    n = offs.size
    i, u, g = singles[_grid(n)](mx.array(offs), *_zeros(n), *_zeros(n, F32, 2), n,
                                mx.array(2**31 + 1, dtype=U32), R=10, BLOCK=BLOCK)
    np.testing.assert_array_equal(np.array(i), ref.randint4x(2**31 + 1, offs)[0])
    z = high_words[(1,)](*(mx.array(np.arange(9, dtype=np.int32) * -77777) for _ in range(2)),
                         mx.zeros((9,), I32), 9, BLOCK=BLOCK)
    a = ((np.arange(9, dtype=np.int64) * -77777) % 2**32).astype(np.uint64)
    np.testing.assert_array_equal(np.array(z).view(np.uint32), (a * a) >> np.uint64(32))


# -- CUDA -----------------------------------------------------------------------------------------

def test_cuda_source_compiles_for_sm90():
    from nvrtc import TOOLKIT, compile_cuda, translation_unit
    if TOOLKIT is None:
        pytest.skip("needs the nvidia-cuda-nvrtc, nvidia-cuda-runtime and nvidia-cuda-cccl wheels")
    n = 1000
    cases = {
        "randint4x": ints4[_grid(n)].prepare(*_zeros(n, k=4), n, 3, R=10, BLOCK=BLOCK,
                                             backend="cuda"),
        "rand_randn": singles[_grid(n)].prepare(mx.zeros((n,), I32), *_zeros(n),
                                                *_zeros(n, F32, 2), n, 3, R=7, BLOCK=BLOCK,
                                                backend="cuda"),
        "dropout": dropout[_grid(n)].prepare(*_zeros(n, F32, 2), n, 0.5, 3, BLOCK=BLOCK,
                                             backend="cuda"),
        "umulhi_int32": high_words[_grid(n)].prepare(*_zeros(n, I32, 3), n, BLOCK=BLOCK,
                                                     backend="cuda"),
    }
    for name, dispatch in cases.items():
        source = translation_unit(dispatch)
        assert "__umulhi(" in source, name
        ok, log = compile_cuda(source, "sm_90")
        assert ok, f"{name}:\n{log}"
