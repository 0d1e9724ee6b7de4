"""A NumPy Philox-4x32 with Triton's key, counter and float conversions: the reference
metile's random numbers are checked against (tests/test_random.py).

uint32 words are held in uint64 arrays so that products are exact; every sum and
product is reduced mod 2**32 by hand.
"""

import numpy as np

MASK = np.uint64(0xFFFFFFFF)
ROUND_A, ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
KEY_A, KEY_B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)


def _words(x, shape):
    """int or array -> uint64 array of 32-bit words (negative ints as two's complement)."""
    a = np.asarray(x, dtype=np.int64) % (1 << 32)
    return np.broadcast_to(a.astype(np.uint64), shape).copy()


def philox_impl(c0, c1, c2, c3, k0, k1, n_rounds=10):
    shape = np.broadcast_shapes(*(np.shape(v) for v in (c0, c1, c2, c3, k0, k1)))
    c0, c1, c2, c3, k0, k1 = (_words(v, shape) for v in (c0, c1, c2, c3, k0, k1))
    for _ in range(n_rounds):
        pa, pb = ROUND_A * c0, ROUND_B * c2  # < 2**64: exact
        c0, c1, c2, c3 = (((pb >> np.uint64(32)) ^ c1 ^ k0), pb & MASK,
                          ((pa >> np.uint64(32)) ^ c3 ^ k1), pa & MASK)
        k0, k1 = (k0 + KEY_A) & MASK, (k1 + KEY_B) & MASK
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def key(seed: int) -> tuple[int, int]:
    """Triton widens the seed to 64 bits (sign-extending a signed one): the two key words."""
    s = seed % (1 << 64)
    return s & 0xFFFFFFFF, s >> 32


def randint4x(seed: int, offsets, n_rounds=10):
    k0, k1 = key(seed)
    offsets = np.asarray(offsets)
    return philox_impl(offsets, 0, 0, 0, k0, k1, n_rounds)


def uint_to_uniform_float(x):
    """Triton's conversion, in float32 as the GPU computes it."""
    i = np.asarray(x, dtype=np.uint32).view(np.int32).astype(np.int64)
    i = np.where(i < 0, -i - 1, i)
    return i.astype(np.float32) * np.float32(4.6566127342e-10)


def rand(seed, offsets, n_rounds=10):
    return uint_to_uniform_float(randint4x(seed, offsets, n_rounds)[0])


def pair_uniform_to_normal(u1, u2):
    """Box-Muller with the float32 products a kernel forms, the transcendental parts in
    float64 (the kernel's float32 log/sqrt/cos/sin differ from these by a few ulp)."""
    u1 = np.maximum(np.float32(1e-7), u1)
    th = (np.float32(6.283185307179586) * u2).astype(np.float64)
    r = np.sqrt(-2.0 * np.log(u1.astype(np.float64)))
    return r * np.cos(th), r * np.sin(th)


def randn(seed, offsets, n_rounds=10):
    i0, i1, _, _ = randint4x(seed, offsets, n_rounds)
    return pair_uniform_to_normal(uint_to_uniform_float(i0), uint_to_uniform_float(i1))[0]


def randn4x(seed, offsets, n_rounds=10):
    u = [uint_to_uniform_float(i) for i in randint4x(seed, offsets, n_rounds)]
    return (*pair_uniform_to_normal(u[0], u[1]), *pair_uniform_to_normal(u[2], u[3]))
