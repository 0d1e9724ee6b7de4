"""A kept launch does not keep its call's arrays alive.

A kernel keeps each launch signature's resolved Dispatch (its launch cache and
`last_dispatch`) to relaunch later calls cheaply; it used to hold the arrays of the call it
was resolved for, so a model's first activations of every signature stayed allocated for
as long as the kernel (metile.ops included).  Measured with MLX's allocator: live bytes
after the call's arrays are dropped."""

import gc

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import ops
from metile.errors import LaunchError


@metile.kernel
def plus_one(x, out, n, BLOCK: metile.constexpr):
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(out + i, metile.load(x + i, mask=i < n) + 1.0, mask=i < n)


@metile.kernel(differentiable=True)
def squared(x, out, n, BLOCK: metile.constexpr):
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    v = metile.load(x + i, mask=i < n)
    metile.store(out + i, v * v, mask=i < n)


def _live() -> int:
    gc.collect()
    return mx.get_active_memory()


def _left_after(call) -> int:
    """Bytes still allocated after `call()` ran, was evaluated and its arrays dropped."""
    base = _live()
    call()
    return _live() - base


N = 1 << 20   # 4 MiB of float32


def _kernel_call():
    x = mx.ones((N,))
    y = plus_one[(N // 1024,)](x, mx.zeros((N,)), N, BLOCK=1024)
    mx.eval(y)
    assert float(y[7].item()) == 2.0


def test_a_launch_and_its_relaunch_keep_no_arrays():
    assert _left_after(_kernel_call) < (1 << 16)      # resolved and kept
    assert _left_after(_kernel_call) < (1 << 16)      # relaunched through the guard
    assert plus_one.last_dispatch is not None         # ...yet kept for the next call


def test_a_kept_launch_called_bare_says_it_let_go():
    _kernel_call()
    with pytest.raises(LaunchError, match="let go of its arrays"):
        plus_one.last_dispatch()
    # called with arrays it runs
    x = mx.arange(8, dtype=mx.float32)
    out = plus_one.last_dispatch(x, mx.zeros((8,)), 8, BLOCK=1024)
    np.testing.assert_array_equal(np.array(out), np.arange(8) + 1)


def test_a_prepared_launch_keeps_its_arrays_to_run_again():
    x = mx.arange(8, dtype=mx.float32)
    d = plus_one[(1,)].prepare(x, mx.zeros((8,)), 8, BLOCK=1024)
    np.testing.assert_array_equal(np.array(d()), np.arange(8) + 1)
    np.testing.assert_array_equal(np.array(d()), np.arange(8) + 1)


def test_differentiable_launch_keeps_its_gradient_after_letting_go():
    def loss(x):
        return squared[(1,)](x, mx.zeros((64,)), 64, BLOCK=64).sum()

    x = mx.linspace(-2, 2, 64)
    g = mx.grad(loss)(x)
    np.testing.assert_allclose(np.array(g), 2 * np.array(x), rtol=1e-6)

    def call():
        y = mx.random.normal((64,))
        mx.eval(mx.grad(loss)(y))
    assert _left_after(call) < (1 << 16)


@pytest.mark.parametrize("op", ["matmul", "linear", "softmax", "rms_norm"])
def test_ops_keep_no_arrays_of_their_calls(op):
    def call():
        a = mx.random.normal((256, 512))
        w = mx.random.normal((512, 512))
        if op == "matmul":
            y = ops.matmul(a, w, backend="metile")
        elif op == "linear":
            y = ops.linear(a, w, mx.zeros((512,)), "gelu_tanh", backend="metile")
        elif op == "softmax":
            y = ops.softmax(a, backend="metile")
        else:
            y = ops.rms_norm(a, mx.ones((512,)), 1e-5, backend="metile")
        mx.eval(y)
    # the first call records the launch (and an op replay), the second replays it
    assert _left_after(call) < (1 << 16)
    assert _left_after(call) < (1 << 16)


def test_a_repeated_launch_runs_from_its_guard():
    # the kept launch's guard holds its bound launch: a call of the signature is one C++
    # call (new arrays, correct numbers); any other call is the slower path's
    x = mx.arange(64, dtype=mx.float32)
    plus_one[(1,)](x, mx.zeros((64,)), 64, BLOCK=64)
    plus_one[(1,)](x, mx.zeros((64,)), 64, BLOCK=64)
    guard = plus_one._launches.last._guard
    y = mx.arange(64, dtype=mx.float32) * 3
    out = guard.launch((1,), (y, mx.zeros((64,)), 64), {"BLOCK": 64})
    np.testing.assert_array_equal(np.array(out), np.arange(64) * 3 + 1)
    assert guard.launch((1,), (y, mx.zeros((32,)), 64), {"BLOCK": 64}) is None   # shape
    assert guard.launch((1,), (y, mx.zeros((64,)), 63), {"BLOCK": 64}) is None   # scalar
    assert guard.launch((1,), (y, y, 64), {"BLOCK": 64}) is None                 # aliased
    with pytest.raises(LaunchError, match="alias|same array|both"):
        plus_one[(1,)](y, y, 64, BLOCK=64)
    out = plus_one[(1,)](y, mx.zeros((64,)), 63, BLOCK=64)   # the slower path, masked
    np.testing.assert_array_equal(np.array(out)[:63], np.arange(63) * 3 + 1)
