"""fp8 <-> float conversions as integer bit manipulation, one source for every backend.

An fp8 value is held as its byte (MSL `uchar`, CUDA `uint8_t`).  The conversions are
written out rather than taken from CUDA's `__nv_fp8` intrinsics so that Metal, the CPU
runtime and CUDA compute the same bits:

  * fp8 -> float32 is exact (every fp8 value is a float32; half and bfloat16 hold them
    too, so the emitters narrow the float32 afterwards without a second rounding).
  * float32 -> fp8 rounds to nearest, ties to even, with the results of PTX's
    `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` (what Triton emits on sm_89+): finite values past
    the largest one and infinities saturate to it, keeping the sign (±448 for e4m3,
    ±57344 for e5m2, which therefore never produces an infinity), NaN gives 0x7f.
  * Other sources convert to float32 first: exact for half, bfloat16 and integers up to
    2^24; larger integers saturate either way.
"""

from __future__ import annotations

_SOURCE = """\
// fp8 with M mantissa bits and exponent bias B, held as a byte.  e4m3 ("fn"): only
// S.1111.111 is NaN, no infinities; e5m2: exponent 31 is infinity (mantissa 0) or NaN.
FN float metile_fp8_to_float(U32 b, int M, int B, bool fn) {
  U32 sign = (b & 0x80u) << 24;
  U32 e = (b & 0x7fu) >> M;
  U32 m = b & ((1u << M) - 1u);
  if (fn ? (b & 0x7fu) == 0x7fu : e == (0x7fu >> M)) {
    return AS_FLOAT(sign | (!fn && m == 0u ? 0x7f800000u : 0x7fc00000u));
  }
  if (e == 0u) {  // subnormal: m units of 2^(1 - B - M), exact in float32
    float v = float(m) * AS_FLOAT(U32(127 + 1 - B - M) << 23);
    return AS_FLOAT(AS_UINT(v) | sign);
  }
  return AS_FLOAT(sign | ((e + U32(127 - B)) << 23) | (m << (23 - M)));
}

// float32 -> fp8, round to nearest even; |x| past MAXCODE's value (and infinity) saturates
// to MAXCODE, NaN gives 0x7f: cvt.rn.satfinite's results.
FN U8 metile_float_to_fp8(float x, int M, int B, U32 maxcode) {
  U32 u = AS_UINT(x);
  U32 sign = (u >> 24) & 0x80u;
  U32 a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return U8(0x7fu);
  int e = int(a >> 23);
  int E = e - 127 + B;  // the fp8 biased exponent, < 1 for its subnormals
  U32 m = (a & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
  // m >> s is the significand in units of the result's last place; for a normal result
  // it includes the leading 1, which (E - 1) << M then lifts into the exponent field
  int s = E >= 1 ? 23 - M : 24 - M - E;
  U32 base = E >= 1 ? U32(E - 1) << M : 0u;
  if (s > 31) return U8(sign);  // below half the smallest subnormal: a signed zero
  U32 q = m >> s;
  U32 rem = m & ((1u << s) - 1u);
  U32 half = 1u << (s - 1);
  U32 code = base + q + ((rem > half || (rem == half && (q & 1u) != 0u)) ? 1u : 0u);
  return U8(sign | (code > maxcode ? maxcode : code));
}

FN float metile_float8e4nv_to_float(U8 b) { return metile_fp8_to_float(U32(b), 3, 7, true); }
FN float metile_float8e5_to_float(U8 b) { return metile_fp8_to_float(U32(b), 2, 15, false); }
FN U8 metile_float_to_float8e4nv(float x) { return metile_float_to_fp8(x, 3, 7, 0x7eu); }
FN U8 metile_float_to_float8e5(float x) { return metile_float_to_fp8(x, 2, 15, 0x7bu); }
"""


def helpers(qualifier: str, u8: str, u32: str, as_uint: str, as_float: str) -> str:
    """The conversion source for one backend's spellings (tokens, since C has braces)."""
    out = _SOURCE
    for token, text in (("FN", qualifier), ("U8", u8), ("U32", u32), ("AS_UINT", as_uint),
                        ("AS_FLOAT", as_float)):
        out = out.replace(token, text)
    return out


def to_float(dtype_name: str, x: str) -> str:
    return f"metile_{dtype_name}_to_float({x})"


def from_float(dtype_name: str, x: str) -> str:
    return f"metile_float_to_{dtype_name}({x})"
