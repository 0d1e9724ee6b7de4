"""fp8 storage types: `metile.float8e4nv` (e4m3 "fn") and `metile.float8e5` (e5m2) held in
uint8/int8 buffers.  Bytes become fp8 with `.to(fp8, bitcast=True)`, convert exactly to
float32/float16/bfloat16, floats convert back rounding to nearest even and saturating as
PTX's `cvt.rn.satfinite` (±448 / ±57344, NaN gives 0x7f), and `.to(metile.uint8,
bitcast=True)` gives the bytes to store.  Checked on the CPU runtime against a NumPy
decoder and encoder written here from the formats' definitions; the CUDA emission (the
same bit arithmetic) compiled with NVRTC."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError

from nvrtc import TOOLKIT, compile_cuda, translation_unit

# name: (mantissa bits, exponent bias, e4m3-style "fn" specials, largest finite code)
FORMATS = {"float8e4nv": (3, 7, True, 0x7E), "float8e5": (2, 15, False, 0x7B)}
CODES = np.arange(256, dtype=np.uint8)


def decode(codes, fmt):
    """Each byte's value from the format's definition (float64; exact)."""
    m_bits, bias, fn, _ = FORMATS[fmt]
    out = []
    for b in np.asarray(codes, np.uint8).tolist():
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b & 0x7F) >> m_bits, b & ((1 << m_bits) - 1)
        if fn and (b & 0x7F) == 0x7F:  # NaN keeps the byte's sign, as a float's would
            out.append(np.copysign(np.nan, sign))
        elif not fn and e == 0x7F >> m_bits:
            out.append(sign * np.inf if m == 0 else np.copysign(np.nan, sign))
        elif e == 0:
            out.append(sign * m * 2.0 ** (1 - bias - m_bits))
        else:
            out.append(sign * (1 + m / 2 ** m_bits) * 2.0 ** (e - bias))
    return np.array(out)


def encode(x, fmt):
    """float32 -> fp8 bytes: the nearest finite value, ties to the even code, past the
    largest finite value saturating to it (infinities too), NaN 0x7f."""
    max_code = FORMATS[fmt][3]
    grid = decode(np.arange(max_code + 1), fmt)  # the non-negative finite values, ascending
    x = np.asarray(x, np.float32).astype(np.float64)
    ax = np.minimum(np.abs(x), grid[-1])
    hi = np.clip(np.searchsorted(grid, ax), 1, max_code)
    lo = hi - 1
    d_lo, d_hi = ax - grid[lo], grid[hi] - ax
    code = np.where((d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0)), lo, hi)
    code = code | np.where(np.signbit(x), 0x80, 0)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def test_the_reference_decoder_knows_the_formats():
    e4 = decode(CODES, "float8e4nv")
    assert np.nanmax(e4) == 448 and np.isnan(e4).sum() == 2 and not np.isinf(e4).any()
    assert e4[1] == 2.0 ** -9 and e4[0x38] == 1.0
    # e5m2 is the top byte of float16
    e5 = decode(CODES, "float8e5")
    half = (CODES.astype(np.uint16) << 8).view(np.float16).astype(np.float64)
    np.testing.assert_array_equal(e5, half)


@metile.kernel
def decode_all(B8, S8, F32, F16, BF16, FROM_INT8, FMT: metile.constexpr):
    offs = metile.arange(0, 256)
    x = metile.load(B8 + offs).to(FMT, bitcast=True)
    metile.static_assert(x.dtype == FMT)
    metile.store(F32 + offs, x.to(metile.float32))
    metile.store(F16 + offs, x.to(metile.float16))
    metile.store(BF16 + offs, x.to(metile.bfloat16))
    s = metile.cast(metile.load(S8 + offs), FMT, bitcast=True)  # int8 bytes too
    metile.store(FROM_INT8 + offs, s.to(metile.float32))


def _same(got, expect, what):
    """Equal values, NaN where NaN, and the sign of zero."""
    got = np.asarray(got, np.float64)
    np.testing.assert_array_equal(got, expect, err_msg=what)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expect), err_msg=what)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_byte_decodes_exactly(fmt):
    outs = decode_all[(1,)](mx.array(CODES), mx.array(CODES.view(np.int8)),
                            mx.zeros(256, mx.float32), mx.zeros(256, mx.float16),
                            mx.zeros(256, mx.bfloat16), mx.zeros(256, mx.float32),
                            FMT=getattr(metile, fmt))
    expect = decode(CODES, fmt)
    for what, got in zip(("float32", "float16", "bfloat16", "int8 bytes"), outs):
        _same(np.array(got.astype(mx.float32)), expect, what)


@metile.kernel
def encode_f32(X, E4, E5, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    metile.store(E4 + offs, x.to(metile.float8e4nv).to(metile.uint8, bitcast=True), mask=m)
    metile.store(E5 + offs, metile.cast(x, metile.float8e5, fp_downcast_rounding="rtne")
                 .to(metile.uint8, bitcast=True), mask=m)


def _edge_cases() -> np.ndarray:
    """Every fp8 value of both formats, the midpoints between neighbours (exact ties) and
    the float32 values either side of them, the saturation boundaries, float32's extremes."""
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, 464.0, 480.0, 449.0, 463.99, 464.01, 500.0,
              57344.0, 61440.0, 61441.0, 65504.0, 1e30, 3.4028235e38, 1e-45, -1e-45,
              1.1754942e-38, 2.0 ** -10, 2.0 ** -17, 2.0 ** -10 * 1.0000001, 2.0 ** -17 * 3]
    for fmt, (_, _, _, max_code) in FORMATS.items():
        grid = decode(np.arange(max_code + 1), fmt)
        mid = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
        values += [*grid, *mid, *np.nextafter(mid, np.float32(np.inf)),
                   *np.nextafter(mid, np.float32(0))]
    v = np.array(values, np.float32)
    return np.concatenate([v, -v])


def test_float32_rounds_to_nearest_even_and_saturates(rng):
    mag = np.exp2(rng.uniform(-26, 20, 20000)).astype(np.float32)
    x = np.concatenate([_edge_cases(), mag * rng.choice([-1, 1], mag.size)]).astype(np.float32)
    n = x.size
    e4, e5 = encode_f32[(metile.cdiv(n, 1024),)](mx.array(x), mx.zeros(n, mx.uint8),
                                                 mx.zeros(n, mx.uint8), n, BLOCK=1024)
    for fmt, got in (("float8e4nv", e4), ("float8e5", e5)):
        expect = encode(x, fmt)
        bad = np.flatnonzero(np.array(got) != expect)
        assert bad.size == 0, (fmt, x[bad[:5]], np.array(got)[bad[:5]], expect[bad[:5]])
    # the rules, spelled out on a few values
    probe = np.array([464, 465, -1e9, np.inf, np.nan, 2.0 ** -10, 1.5 * 2 ** -10, -0.0],
                     np.float32)
    got = encode_f32[(1,)](mx.array(probe), mx.zeros(8, mx.uint8), mx.zeros(8, mx.uint8), 8,
                           BLOCK=32)
    # 464 ties between 448 (0x7e, even) and the NaN code: saturation keeps 448
    assert np.array(got[0]).tolist() == [0x7E, 0x7E, 0xFE, 0x7E, 0x7F, 0x00, 0x01, 0x80]
    assert np.array(got[1]).tolist()[2:5] == [0xFB, 0x7B, 0x7F]  # never an infinity


@metile.kernel
def from_half(X, E4, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.store(E4 + offs, metile.load(X + offs).to(metile.float8e4nv)
                 .to(metile.uint8, bitcast=True))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_sources_round_once(rng, dtype):
    x = mx.array(rng.normal(0, 100, 512).astype(np.float32)).astype(dtype)
    (got,) = [from_half[(1,)](x, mx.zeros(512, mx.uint8), BLOCK=512)]
    expect = encode(np.array(x.astype(mx.float32)), "float8e4nv")
    np.testing.assert_array_equal(np.array(got), expect)


@metile.kernel
def rescale(X, Y, scale, n, BLOCK: metile.constexpr):
    """e4m3 bytes in, scaled, e5m2 bytes out: the quantized-storage pattern."""
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    b = metile.load(X + offs, mask=m)
    v = b.to(metile.float8e4nv, bitcast=True).to(metile.float32) * scale
    q = v.to(metile.float8e5)
    metile.store(Y + offs, metile.where(m, q, q).to(metile.uint8, bitcast=True), mask=m)


def test_kernel_loads_scales_and_stores_fp8_bytes(rng):
    n = 3000
    x = rng.integers(0, 256, n, dtype=np.uint8)
    got = rescale[(metile.cdiv(n, 256),)](mx.array(x), mx.zeros(n, mx.uint8), 37.5, n,
                                          BLOCK=256)
    with np.errstate(invalid="ignore"):
        v = (decode(x, "float8e4nv").astype(np.float32) * np.float32(37.5)).astype(np.float32)
    np.testing.assert_array_equal(np.array(got), encode(v, "float8e5"))


@metile.kernel
def fp8_add(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e4nv, bitcast=True)
    metile.store(Y + metile.arange(0, 8), (x + x).to(metile.float32))


@metile.kernel
def fp8_scale(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e5, bitcast=True)
    metile.store(Y + metile.arange(0, 8), (x * 2.0).to(metile.float32))


@metile.kernel
def fp8_exp(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e4nv, bitcast=True)
    metile.store(Y + metile.arange(0, 8), metile.exp(x).to(metile.float32))


@metile.kernel
def fp8_sum(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e4nv, bitcast=True)
    metile.store(Y, metile.sum(x).to(metile.float32))


@metile.kernel
def fp8_sort(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e4nv, bitcast=True)
    metile.store(Y + metile.arange(0, 8), metile.sort(x).to(metile.float32))


@metile.kernel
def fp8_zeros(Y):
    metile.store(Y + metile.arange(0, 8), metile.zeros((8,), metile.float8e4nv)
                 .to(metile.float32))


@metile.kernel
def fp8_store_converts(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e4nv, bitcast=True)
    metile.store(Y + metile.arange(0, 8), x)


@metile.kernel
def wide_bitcast(X, Y):
    x = metile.load(X + metile.arange(0, 8))
    metile.store(Y + metile.arange(0, 8), x.to(metile.float8e4nv, bitcast=True)
                 .to(metile.float32))


@metile.kernel
def amd_fp8(X, Y):
    x = metile.load(X + metile.arange(0, 8)).to(metile.float8e4b8, bitcast=True)
    metile.store(Y + metile.arange(0, 8), x.to(metile.float32))


def test_fp8_is_storage_and_the_other_formats_are_refused():
    u8, f32 = mx.zeros(8, mx.uint8), mx.zeros(8, mx.float32)
    storage = r"fp8 is a storage type; convert to float16/float32 first"
    for kernel, what in ((fp8_add, r"'\+' on float8e4nv values"),
                         (fp8_scale, r"'\*' on float8e5 values"),
                         (fp8_exp, r"'exp' on float8e4nv values"),
                         (fp8_sum, r"sum\(\) on float8e4nv values"),
                         (fp8_sort, r"sort\(\) on float8e4nv values")):
        with pytest.raises(CompilationError, match=what + ": " + storage):
            kernel[(1,)](u8, f32)
    with pytest.raises(CompilationError, match=r"a float8e4nv constant \(0\): fp8 is a storage "
                                               r"type; make the value in float32"):
        fp8_zeros[(1,)](f32)
    with pytest.raises(CompilationError, match=r"store\(\) of float8e4nv values into a uint8 "
                                               r"buffer would convert the numbers; store the "
                                               r"bytes with \.to\(metile\.uint8, bitcast=True\)"):
        fp8_store_converts[(1,)](u8, mx.zeros(8, mx.uint8))
    with pytest.raises(CompilationError, match=r"bitcast=True from float32 to float8e4nv: "
                                               r"a reinterpreting cast needs two non-bool types "
                                               r"of one width \(float32 has 32 bits, "
                                               r"float8e4nv 8\)"):
        wide_bitcast[(1,)](f32, f32)
    with pytest.raises(CompilationError, match=r"float8e4b8.*AMD's and the legacy fp8 formats "
                                               r"are not built"):
        amd_fp8[(1,)](u8, f32)
    for name in ("float8e4b15", "float8e4b8", "float8e5b16"):
        assert not hasattr(metile, name)


@metile.kernel(differentiable=True)
def quantize_dequantize(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    metile.store(Y + offs, x.to(metile.float8e4nv).to(metile.float32), mask=m)


def test_differentiable_kernels_refuse_fp8_by_name():
    with pytest.raises(CompilationError, match=r"differentiable=True needs a pointwise kernel: "
                                               r"MLX has no fp8 arrays"):
        quantize_dequantize[(1,)](mx.ones(8), mx.zeros(8), 8, BLOCK=8)


@metile.kernel
def printed(X, Y):
    x = metile.load(X + metile.arange(0, 4)).to(metile.float8e4nv, bitcast=True)
    metile.device_print("v", x)
    metile.device_print("b", x, hex=True)
    metile.store(Y + metile.arange(0, 4), x.to(metile.float32))


def test_device_print_shows_the_value_or_with_hex_the_byte(capfd):
    mx.eval(printed[(1,)](mx.array(np.array([0x38, 0xB8, 0x01, 0x7F], np.uint8)),
                          mx.zeros(4, mx.float32)))
    lines = [ln.split(": ", 1)[1] for ln in capfd.readouterr().out.splitlines()
             if ln.startswith("pid (")]
    # each element's two lines follow each other
    assert lines == ["1.0", "0x38", "-1.0", "0xb8", "0.001953125", "0x01", "nan", "0x7f"]


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")
def test_cuda_emission_compiles_with_nvrtc():
    source = translation_unit(rescale[(1,)].prepare(mx.zeros(64, mx.uint8), mx.zeros(64, mx.uint8),
                                                    2.0, 64, BLOCK=64, backend="cuda"))
    assert "metile_float8e4nv_to_float" in source and "metile_float_to_float8e5" in source
    assert "__nv_fp8" not in source
    ok, log = compile_cuda(source, "sm_90")
    assert ok, log
