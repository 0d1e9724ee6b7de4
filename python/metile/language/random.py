"""Counter-based random numbers with Triton's streams: `metile.rand(seed, offsets)`.

Philox-4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011)
keyed on the seed and counting on the offset, so a value depends only on
(seed, offset, n_rounds).  The integer words and the uniforms are exact uint32 and
float32 arithmetic, the same bits on every backend and the CPU runtime and the bits
Triton's `tl.randint4x` / `tl.rand` define for the same 32-bit offsets and a seed in
[-2**31, 2**32); normals also go through the backend's float32 log, sqrt, cos and sin.

Triton widens the seed to 64 bits and keys Philox on its two halves, and so does
metile: a seed is any integer scalar (int32, uint32, int64, uint64 or a Python int);
an int32 seed's high half is its sign (all ones when negative), a uint32 seed's is
zero.  Offsets are 32-bit: Triton runs Philox-4x64 on 64-bit offsets, which metile
does not build, so an int64 offset is a compile error.

The functions are @metile.inline helpers written with the language's own uint32
ops (`umulhi`, `*`, `^`, `+`): they need nothing from a backend beyond `umulhi`.
"""

from __future__ import annotations

import functools

from .core import (cast, constexpr, cos, log, maximum, sin, sqrt, static_assert, static_range,
                   umulhi, where, zeros)
from .dtypes import float32, int32, int64, uint32

N_ROUNDS_DEFAULT = 10
# Philox-4x32 round multipliers and Weyl key increments (the golden ratio and sqrt(3) - 1)
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
# the largest float32 whose product with (float)(2**31 - 1) is still below 1.0
_UNIFORM_SCALE = 4.6566127342e-10
_TWO_PI = 6.283185307179586


def _library(fn):
    """Mark `fn` as an inline helper of the kernel language (as @metile.inline does; that
    decorator lives in runtime/, which imports this package)."""
    @functools.wraps(fn)
    def stub(*args, **kwargs):
        raise RuntimeError(f"metile.{fn.__name__} can only be called inside a @metile.kernel "
                           f"function")

    stub.__metile_inline__ = True
    stub.__wrapped__ = fn
    return stub


@_library
def philox_impl(c0, c1, c2, c3, k0, k1, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """`n_rounds` Philox-4x32 rounds of the counter (c0, c1, c2, c3) under the key
    (k0, k1); every operand is read as uint32.  Returns four uint32 values."""
    c0, c1, c2, c3 = cast(c0, uint32), cast(c1, uint32), cast(c2, uint32), cast(c3, uint32)
    # as Values, so the key schedule wraps at 32 bits even for a compile-time seed
    k0, k1 = cast(k0, uint32), cast(k1, uint32)
    for _ in static_range(n_rounds):
        a0, a2 = c0, c2
        c0 = umulhi(_ROUND_B, a2) ^ c1 ^ k0
        c2 = umulhi(_ROUND_A, a0) ^ c3 ^ k1
        c1 = _ROUND_B * a2
        c3 = _ROUND_A * a0
        k0 = k0 + _KEY_A
        k1 = k1 + _KEY_B
    return c0, c1, c2, c3


@_library
def philox(seed, c0, c1, c2, c3, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Philox keyed on `seed` (any integer scalar: Triton's 64-bit seed)."""
    # The seed widened to 64 bits as Triton widens it (int32 sign-extends, uint32 zero-extends,
    # uint64 keeps its bits), then split into its low and high words.
    k0 = cast(seed, uint32)
    k1 = cast(cast(seed, int64) >> 32, uint32)
    return philox_impl(c0, c1, c2, c3, k0, k1, n_rounds)


@_library
def randint4x(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Four independent uint32 values per element of `offset` (int32 or uint32)."""
    # `offset + zeros` gives a Python-int offset a dtype to check (it emits nothing)
    static_assert((offset + zeros((1,), int32)).dtype.primitive_bitwidth == 32,
                  "random offsets must be 32-bit: Triton keys Philox-4x64 on 64-bit offsets, "
                  "which metile does not build; cast the offsets to int32 or uint32")
    c0 = cast(offset, uint32)
    zero = c0 * 0  # the counter's other words, shaped like the offsets
    return philox(seed, c0, zero, zero, zero, n_rounds)


@_library
def randint(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """One uint32 value per element of `offset`: the first of `randint4x`."""
    r0, _, _, _ = randint4x(seed, offset, n_rounds)
    return r0


@_library
def uint_to_uniform_float(x):
    """A uint32 (or int32) random value as a float32 in [0, 1)."""
    u = cast(x, uint32)
    # Triton reads the bits as int32 and folds negatives with -x - 1, which is ~x:
    # the result lies in [0, 2**31 - 1] either way
    u = where(u >= 0x80000000, ~u, u)
    return cast(u, float32) * _UNIFORM_SCALE


@_library
def rand(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """float32 uniform in [0, 1), one per element of `offset`."""
    return uint_to_uniform_float(randint(seed, offset, n_rounds))


@_library
def rand4x(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Four independent float32 uniforms in [0, 1) per element of `offset`."""
    i0, i1, i2, i3 = randint4x(seed, offset, n_rounds)
    return (uint_to_uniform_float(i0), uint_to_uniform_float(i1), uint_to_uniform_float(i2),
            uint_to_uniform_float(i3))


@_library
def pair_uniform_to_normal(u1, u2):
    """Box-Muller: two uniforms in [0, 1) to two independent standard normals."""
    u1 = maximum(1.0e-7, u1)  # log(0) would give an infinite radius
    th = _TWO_PI * u2
    r = sqrt(-2.0 * log(u1))
    return r * cos(th), r * sin(th)


@_library
def randn(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """float32 standard normal, one per element of `offset` (the cosine half of Box-Muller
    over the first two words of `randint4x`)."""
    i0, i1, _, _ = randint4x(seed, offset, n_rounds)
    u1 = maximum(1.0e-7, uint_to_uniform_float(i0))
    th = _TWO_PI * uint_to_uniform_float(i1)
    return sqrt(-2.0 * log(u1)) * cos(th)


@_library
def randn4x(seed, offset, n_rounds: constexpr = N_ROUNDS_DEFAULT):
    """Four independent float32 standard normals per element of `offset`."""
    u0, u1, u2, u3 = rand4x(seed, offset, n_rounds)
    n0, n1 = pair_uniform_to_normal(u0, u1)
    n2, n3 = pair_uniform_to_normal(u2, u3)
    return n0, n1, n2, n3


__all__ = ["philox", "philox_impl", "randint", "randint4x", "rand", "rand4x", "randn", "randn4x",
           "uint_to_uniform_float", "pair_uniform_to_normal"]
