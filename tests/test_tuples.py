"""Tuples a kernel builds (frontend/tuples.py) carried through runtime loops and ifs,
element by element, on the CPU runtime against NumPy; and the errors for what cannot be
carried."""

import mlx.core as mx
import numpy as np
import pytest

import metile


@metile.kernel
def tuple_per_branch(out, flag):
    if flag > 0:
        c = (1, 2.5)
    else:
        c = (3, -4.0)
    i = metile.arange(0, 2)
    metile.store(out + i, metile.where(i == 0, c[0], c[1]).to(metile.float32))


@pytest.mark.parametrize("flag,want", [(1, [1.0, 2.5]), (0, [3.0, -4.0])])
def test_a_tuple_of_numbers_differs_between_the_branches_of_a_runtime_if(flag, want):
    out = tuple_per_branch[(1,)](mx.zeros((2,)), flag)
    np.testing.assert_array_equal(np.array(out), want)


@metile.inline
def two_blocks(a, i):
    return metile.load(a + i), metile.load(a + i + 16)


@metile.kernel
def carried_tuple(a, out, n):
    i = metile.arange(0, 16)
    cur = two_blocks(a, i)                       # the next step's loads, carried ahead
    acc = metile.zeros((16,), dtype=metile.float32)
    for s in range(0, n, 32):
        nxt = two_blocks(a, i + metile.minimum(s + 32, n - 32))
        acc += cur[0] * 2.0 + cur[1]
        cur = nxt
    metile.store(out + i, acc + cur[0] * 0.0)


def test_a_tuple_is_carried_through_a_runtime_loop():
    a = np.arange(128, dtype=np.float32)
    out = carried_tuple[(1,)](mx.array(a), mx.zeros((16,)), 128)
    blocks = a.reshape(4, 2, 16)
    np.testing.assert_array_equal(np.array(out), (blocks[:, 0] * 2 + blocks[:, 1]).sum(0))


@metile.kernel
def growing_tuple(a, out, n):
    t = (metile.load(a),)
    for s in range(0, n):
        t = t + (metile.load(a + s),)
    metile.store(out, t[0])


@metile.kernel
def tuple_of_a_dtype(a, out, n):
    t = (metile.load(a), metile.float32)
    for s in range(0, n):
        t = (t[0] + 1.0, metile.float32)
    metile.store(out, t[0])


@pytest.mark.parametrize("kernel,message", [
    (growing_tuple, "changes length from 1 to 2"),
    (tuple_of_a_dtype, "element 1 is"),
])
def test_what_a_loop_cannot_carry_is_named(kernel, message):
    with pytest.raises(metile.CompilationError, match=message):
        kernel[(1,)](mx.zeros((4,)), mx.zeros((1,)), 3)
