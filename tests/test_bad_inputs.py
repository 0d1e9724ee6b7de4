"""What a hostile new user tries: a table of bad inputs to every public entry point
(kernel launches, the kernel language, Schedule/Config/autotune, metal_kernel,
cuda_kernel, ops, nn, METILE_* variables).  Each case ends in a clear error (its
type and a message naming the culprit and what is accepted) or a result checked
against NumPy; none may crash, hang or be silently wrong.  Cases that could take
the process down run in a subprocess with a timeout."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import uuid

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import LaunchError, CompilationError, ScheduleError
from conftest import default_is_cpu

# The table records what a user gets on the CPU device (metal_kernel through the MSL CPU
# runtime, its settings and its 32 KiB threadgroup memory); on a GPU several answers
# differ by design (shared-memory limits, where MSL runs).
pytestmark = pytest.mark.skipif(not default_is_cpu(), reason="outcomes recorded for the CPU device")

# (id, fn, expect, isolate, xfail reason) rows; fn() returns what the user would get
# (arrays are evaluated), expect is error(...) or correct(...).
CASES: list = []


def error(exc, pattern):
    return ("error", exc, pattern)


def correct(check):
    return ("correct", check)


def warns(category, pattern, check):
    """A correct result that comes with a warning (e.g. a setting metile only partly honours)."""
    return ("warns", category, pattern, check)


def case(id_, fn, expect, *, isolate=False, xfail=None):
    CASES.append((id_, fn, expect, isolate, xfail))


def equal(expected):
    def check(out):
        np.testing.assert_array_equal(np.array(out), np.asarray(expected))
    return check


def close(expected, rtol=3e-4, atol=3e-5):
    def check(out):
        np.testing.assert_allclose(np.array(out), np.asarray(expected), rtol=rtol, atol=atol)
    return check


def run_case(fn):
    out = fn()
    leaves = [a for a in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(a, mx.array)]
    if leaves:
        mx.eval(*leaves)
    return out


# -- kernels shared by the cases ----------------------------------------------------------

@metile.kernel
def copy(X, Y, n, BLOCK: metile.constexpr = 64):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask), mask=mask)


@metile.kernel
def copy2(X, Y, Z, BLOCK: metile.constexpr = 8):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    metile.store(Y + offs, x)
    metile.store(Z + offs, x)


@metile.kernel
def double(X, Y, BLOCK: metile.constexpr = 8):
    offs = metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs) * 2.0)


def zeros8(dtype=mx.float32):
    return mx.zeros((8,), dtype)


X8 = mx.arange(8).astype(mx.float32)


def launch_copy(*args, grid=(1,), **kw):
    return copy[grid](*args, **kw)


# -- launch arguments ---------------------------------------------------------------------

case("launch-missing-argument", lambda: launch_copy(X8, zeros8()),
     error(LaunchError, r"copy\(\) missing arguments: n"))
case("launch-too-many-arguments", lambda: launch_copy(X8, zeros8(), 8, 64, 1),
     error(LaunchError, r"copy\(\) takes 4 arguments, got 5"))
case("launch-misspelled-keyword", lambda: launch_copy(X8, zeros8(), 8, BLOK=64),
     error(LaunchError, r"unexpected argument 'BLOK'"))
case("launch-argument-twice", lambda: launch_copy(X8, zeros8(), 8, X=X8),
     error(LaunchError, r"multiple values for 'X'"))
for _dt in ("float64", "complex64"):
    case(f"buffer-dtype-{_dt}", lambda d=getattr(mx, _dt): launch_copy(mx.zeros((8,), d), zeros8(), 8),
         error(LaunchError, rf"argument 'X': dtype mlx.core.{_dt} is not supported \(metile kernels "
                            r"take float32, float16, bfloat16, int32, uint32, int64, uint64, int8, uint8, "
                            r"int16, uint16, bool\)"))
case("buffer-dtype-int8", lambda: launch_copy(mx.arange(8).astype(mx.int8) - 3, zeros8(), 8),
     correct(equal(np.arange(8, dtype=np.float32) - 3)))
case("buffer-dtype-int64", lambda: launch_copy(mx.arange(8).astype(mx.int64) - 3, zeros8(), 8),
     correct(equal(np.arange(8, dtype=np.float32) - 3)))
case("buffer-numpy-array", lambda: launch_copy(np.zeros(8, np.float32), zeros8(), 8),
     error(LaunchError, r"argument 'X': expected an mx.array or a Python int/float/bool, got ndarray"))
case("buffer-list", lambda: launch_copy([0.0] * 8, zeros8(), 8),
     error(LaunchError, r"argument 'X': expected an mx.array or a Python int/float/bool, got list"))
case("buffer-none", lambda: launch_copy(None, zeros8(), 8),   # (None is a constexpr, as Triton's)
     error(CompilationError, r"unsupported operand: NoneType None and a tile.*\(the constant is "
                             r"constexpr X=None\)"))
case("scalar-string", lambda: launch_copy(X8, zeros8(), "8"),
     error(LaunchError, r"argument 'n': expected an mx.array or a Python int/float/bool, got str"))
# Past int32 a Python int is an int64 scalar (uint64 from 2**63), as in Triton (all 8 copied:
# 2**32 + 3 cut to int32 would copy 3); past 64 bits it is refused.
case("scalar-int-beyond-int32", lambda: launch_copy(X8, zeros8(), 2**32 + 3, BLOCK=8),
     correct(equal(np.arange(8, dtype=np.float32))))
case("scalar-int-beyond-64-bits", lambda: launch_copy(X8, zeros8(), 2**64),
     error(LaunchError, r"argument 'n': 18446744073709551616 does not fit in 64 bits"))
case("scalar-int-below-int64", lambda: launch_copy(X8, zeros8(), -2**63 - 1),
     error(LaunchError, r"argument 'n': -9223372036854775809 does not fit in 64 bits"))
# A scalar of another kind promotes like a Triton scalar argument: `offs < n` compares in
# float32 (NaN: nothing copied) or in int32 (True is 1).
case("scalar-nan-for-int", lambda: launch_copy(X8, zeros8(), float("nan")),
     correct(equal(np.zeros(8, np.float32))))
case("scalar-float-for-int", lambda: launch_copy(X8, zeros8(), 7.5),
     correct(equal([0, 1, 2, 3, 4, 5, 6, 7])))
case("scalar-bool-for-int", lambda: launch_copy(X8 + 1, zeros8(), True),
     correct(equal([1, 0, 0, 0, 0, 0, 0, 0])))
case("scalar-numpy-int", lambda: launch_copy(X8, zeros8(), np.int32(6)),
     correct(equal([0, 1, 2, 3, 4, 5, 0, 0])))
case("scalar-numpy-complex", lambda: launch_copy(X8, zeros8(), np.complex64(6)),
     error(LaunchError, r"argument 'n': expected an mx.array or a Python int/float/bool, got complex"))
case("scalar-0d-array", lambda: launch_copy(X8, zeros8(), mx.array(5)),
     correct(equal([0, 1, 2, 3, 4, 0, 0, 0])))
case("output-passed-a-scalar", lambda: launch_copy(X8, 3.0, 8),
     error(CompilationError, r"parameter 'Y' was passed a scalar - a number, or a 0-d mx.array, which a launch takes as a scalar value; pass an mx.array of one or more dimensions if it is a buffer"))
case("output-0d-array", lambda: launch_copy(X8, mx.array(0.0), 8),
     error(CompilationError, r"parameter 'Y' was passed a scalar - a number, or a 0-d mx.array, which a launch takes as a scalar value; pass an mx.array of one or more dimensions if it is a buffer"))
case("input-aliases-output", lambda: (lambda y: launch_copy(y, y, 8))(zeros8()),
     error(LaunchError, r"argument 'X' is the same array as output 'Y'; an input must not alias"))
case("two-outputs-same-array", lambda: (lambda y: copy2[(1,)](X8, y, y))(zeros8()),
     error(LaunchError, r"outputs 'Y' and 'Z' are the same array"))
case("input-is-view-of-output", lambda: (lambda y: launch_copy(y[2:], y, 6))(X8),
     correct(equal([2, 3, 4, 5, 6, 7, 6, 7])))
case("bool-buffers", lambda: launch_copy(mx.array([True, False] * 4), zeros8(mx.bool_), 8),
     correct(equal([True, False] * 4)))
case("store-float16-into-float32",  # converted to the buffer's dtype, as in Triton
     lambda: launch_copy(X8.astype(mx.float16), zeros8(), 8),
     correct(equal(np.arange(8, dtype=np.float32))))
case("non-contiguous-input",
     lambda: launch_copy(mx.arange(16).astype(mx.float32).reshape(4, 4).T, mx.zeros((4, 4)), 16),
     correct(equal(np.arange(16, dtype=np.float32).reshape(4, 4).T)))
case("zero-size-buffers", lambda: launch_copy(mx.zeros((0,)), mx.zeros((0,)), 0, grid=(0,)),
     correct(equal(np.zeros((0,), np.float32))))
case("grid-of-zero-programs", lambda: launch_copy(X8, mx.ones((8,)), 8, grid=(0,)),
     correct(equal(np.ones(8, np.float32))))
case("grid-covering-part", lambda: launch_copy(X8, mx.full((8,), -1.0), 8, BLOCK=4),
     correct(equal([0, 1, 2, 3, -1, -1, -1, -1])))

# -- constexprs ---------------------------------------------------------------------------

case("constexpr-float-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=8.0),
     error(CompilationError, r"BLOCK=8.0"))
case("constexpr-zero-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=0),
     error(CompilationError, r"arange\(0, 0\) is empty: end must be greater than start\n.*"
                             r"metile.arange\(0, BLOCK\)"))
case("constexpr-negative-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=-64),
     error(CompilationError, r"arange\(0, -64\) is empty: end must be greater than start"))
case("constexpr-non-power-of-two", lambda: launch_copy(X8, zeros8(), 8, BLOCK=3, grid=(3,)),
     correct(equal(np.arange(8, dtype=np.float32))))
# (past Triton's 2**20 elements a tile is a compile error: 2**24 ran here and 2**27 overflowed
# the CPU runtime's stack at run time; 2**20 itself runs)
case("constexpr-huge-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=2**24),
     error(CompilationError, r"a tile of shape \(16777216,\) has 16777216 elements, more than "
                             r"the 1048576 \(2\*\*20\)"))
case("constexpr-block-at-the-bound", lambda: launch_copy(X8, zeros8(), 8, BLOCK=2**20),
     correct(equal(np.arange(8, dtype=np.float32))))
case("constexpr-block-past-int32", lambda: double[(1,)](X8, zeros8(), BLOCK=2**31 + 64),
     error(CompilationError, r"arange\(0, 2147483712\): its values are int32, so start and end "
                             r"must lie in \[-2\*\*31, 2\*\*31\]"))
case("constexpr-string-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK="64"),
     error(CompilationError, r"unsupported operand: a runtime int32 value and str '64' "
                             r"\(the constant is constexpr BLOCK='64'\)"))
case("constexpr-bool-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=True),
     error(CompilationError, r"arange\(\) end must be a constexpr int \(known at compile time\), "
                             r"got bool True \(the constant is constexpr BLOCK=True\)"))
case("constexpr-nan-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=float("nan")),
     error(CompilationError, r"arange\(\) end must be a constexpr int \(known at compile time\), "
                             r"got float nan \(the constant is constexpr BLOCK=nan\)"))
case("constexpr-none-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=None),
     error(CompilationError, r"unsupported operand: a runtime int32 value and NoneType None "
                             r"\(the constant is constexpr BLOCK=None\)"))
case("constexpr-list-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=[64]),
     error(LaunchError, r"constexpr 'BLOCK' must be hashable, got list"))
case("constexpr-array-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=mx.array(64)),
     error(LaunchError, r"constexpr 'BLOCK' must be a Python value, got an mx.array"))
case("constexpr-numpy-int-block", lambda: launch_copy(X8, zeros8(), 8, BLOCK=np.int64(8)),
     correct(equal(np.arange(8, dtype=np.float32))))

# -- grids --------------------------------------------------------------------------------

_GRID = r"grid must be 1 to 3 non-negative ints \(programs per axis\), got "
case("grid-four-axes", lambda: launch_copy(X8, zeros8(), 8, grid=(1, 1, 1, 1)), error(LaunchError, _GRID))
case("grid-empty", lambda: launch_copy(X8, zeros8(), 8, grid=()), error(LaunchError, _GRID))
case("grid-negative", lambda: launch_copy(X8, zeros8(), 8, grid=(-1,)), error(LaunchError, _GRID))
case("grid-float", lambda: launch_copy(X8, zeros8(), 8, grid=(1.0,)), error(LaunchError, _GRID))
case("grid-nan", lambda: launch_copy(X8, zeros8(), 8, grid=(float("nan"),)), error(LaunchError, _GRID))
case("grid-bool", lambda: launch_copy(X8, zeros8(), 8, grid=(True,)), error(LaunchError, _GRID))
case("grid-none", lambda: launch_copy(X8, zeros8(), 8, grid=None), error(LaunchError, _GRID))
case("grid-string", lambda: launch_copy(X8, zeros8(), 8, grid="1"), error(LaunchError, _GRID))
case("grid-numpy-ints", lambda: launch_copy(X8, zeros8(), 8, grid=(np.int64(1), np.int32(1))),
     correct(equal(np.arange(8, dtype=np.float32))))
case("grid-beyond-int32-threads", lambda: launch_copy(X8, zeros8(), 8, grid=(2**27,)),
     error(LaunchError, r"grid 134217728 programs x 64 threads = 8589934592 threads on axis 0 "
                        r"exceeds 2147483647"))
case("grid-axis1-beyond-int32", lambda: launch_copy(X8, zeros8(), 8, grid=(1, 2**31)),
     error(LaunchError, r"grid axis 1 has 2147483648 programs, more than 2147483647"))
case("grid-callable-returns-float", lambda: launch_copy(X8, zeros8(), 8, grid=lambda m: (m["n"] / 64,)),
     error(LaunchError, _GRID))
case("grid-callable-misspelled-key", lambda: launch_copy(X8, zeros8(), 8, grid=lambda m: (m["N"],)),
     error(LaunchError, r"the grid callable raised KeyError: 'N'; it receives a dict of the launch's "
                        r"arguments by name: 'X', 'Y', 'n', 'BLOCK'"))

# -- launch options -----------------------------------------------------------------------

for _v in (0, 33, 2.5, "4"):
    case(f"num-simdgroups-{_v}", lambda v=_v: launch_copy(X8, zeros8(), 8, num_simdgroups=v),
         error(LaunchError, rf"num_simdgroups must be an int in 1..32, got {re.escape(repr(_v))}"))
case("schedule-as-string", lambda: launch_copy(X8, zeros8(), 8, SCHEDULE="simdgroup"),
     error(LaunchError, r"SCHEDULE must be a metile.Schedule, got str"))
case("strict-math-string", lambda: launch_copy(X8, zeros8(), 8, STRICT_MATH="yes"),
     error(LaunchError, r"STRICT_MATH must be True or False, got 'yes'"))
case("kernel-called-directly", lambda: copy(X8, zeros8(), 8),
     error(TypeError, r"launch a metile kernel with copy\[grid\]\(\.\.\.\)"))
case("builtin-called-outside-kernel", lambda: metile.load(X8),
     error(RuntimeError, r"metile.load can only be called inside a @metile.kernel function"))


def _prepared():
    return copy[(1,)].prepare(X8, zeros8(), 8)


case("prepared-other-dtype", lambda: _prepared()(zeros8(mx.float16), zeros8(), 8),
     error(LaunchError, r"argument 'X': prepared for a float32 buffer, got a float16 buffer"))
case("prepared-other-rank", lambda: _prepared()(mx.zeros((2, 4)), zeros8(), 8),
     error(LaunchError, r"argument 'X': prepared for rank 1, got rank 2"))
case("prepared-other-constexpr", lambda: _prepared()(X8, zeros8(), 8, BLOCK=32),
     error(LaunchError, r"constexpr arguments differ from the prepared launch; prepare again"))
case("prepared-other-warps", lambda: _prepared()(X8, zeros8(), 8, num_warps=4),
     error(LaunchError, r"num_warps/num_simdgroups differ from the prepared launch \(the "
                        r"kernel's default, got 4 warps\); prepare again"))
case("prepared-scalar-for-buffer", lambda: _prepared()(1.0, zeros8(), 8),
     error(LaunchError, r"argument 'X': prepared for a float32 buffer, got a float32 scalar"))

# -- kernel definitions -------------------------------------------------------------------


def _define(fn, **kw):
    return lambda: metile.kernel(fn, **kw) if kw else metile.kernel(fn)


def _star_args(X, *rest):
    metile.store(X, 1.0)


def _star_kwargs(X, **rest):
    metile.store(X, 1.0)


def _plain(X):
    metile.store(X + metile.arange(0, 8), 1.0)


case("kernel-of-an-int", lambda: metile.kernel(3),
     error(TypeError, r"metile.kernel decorates a Python function written with def, got int 3"))
case("kernel-of-a-lambda", lambda: metile.kernel(lambda X: None)[(1,)](X8),
     error(CompilationError, r"a lambda cannot be a kernel or helper: write it with def"))
case("kernel-of-a-builtin", lambda: metile.kernel(print),
     error(TypeError, r"metile.kernel decorates a Python function written with def, got "
                      r"builtin_function_or_method"))
case("kernel-star-args", lambda: metile.kernel(_star_args)[(1,)](zeros8()),
     error(CompilationError, r"kernels cannot take \*args or \*\*kwargs"))
case("kernel-star-kwargs", lambda: metile.kernel(_star_kwargs)[(1,)](zeros8()),
     error(CompilationError, r"kernels cannot take \*args or \*\*kwargs"))
case("kernel-num-simdgroups-zero", lambda: metile.kernel(num_simdgroups=0)(_plain)[(1,)](zeros8()),
     error(LaunchError, r"num_simdgroups must be an int in 1..32, got 0"))


@metile.inline
def _helper(x):
    return x * 2.0


case("inline-called-outside-kernel", lambda: _helper(1.0),
     error(RuntimeError, r"_helper is a @metile.inline helper; call it inside a kernel"))


# -- the kernel language, misused -----------------------------------------------------------
# Each kernel below breaks one rule; the message names the rule and the line.

@metile.kernel
def k_load_scalar(X, n):
    metile.store(X, metile.load(n))


@metile.kernel
def k_store_to_scalar(X, n):
    metile.store(n, metile.load(X))


@metile.kernel
def k_tile_shapes(X):
    a = metile.arange(0, 8)
    b = metile.arange(0, 16)
    metile.store(X + a, (a + b).to(metile.float32))


@metile.kernel
def k_reduce_axis(X, AXIS: metile.constexpr):
    x = metile.load(X + metile.arange(0, 8))
    metile.store(X, metile.sum(x, axis=AXIS))


@metile.kernel
def k_reduce_runtime_axis(X, axis):
    x = metile.load(X + metile.arange(0, 8))
    metile.store(X, metile.sum(x, axis=axis))


@metile.kernel
def k_program_id(X, AXIS: metile.constexpr):
    metile.store(X + metile.program_id(AXIS), 1.0)


@metile.kernel
def k_program_id_runtime(X, axis):
    metile.store(X + metile.program_id(axis), 1.0)


@metile.kernel
def k_dot(A, B, C, SA: metile.constexpr, SB: metile.constexpr):
    a = metile.load(A + metile.arange(0, SA[0])[:, None] * SA[1] + metile.arange(0, SA[1])[None, :])
    b = metile.load(B + metile.arange(0, SB[0])[:, None] * SB[1] + metile.arange(0, SB[1])[None, :])
    c = metile.dot(a, b)
    metile.store(C + metile.arange(0, SA[0])[:, None] * SB[1] + metile.arange(0, SB[1])[None, :], c)


@metile.kernel
def k_dot_1d(A, C):
    a = metile.load(A + metile.arange(0, 8))
    metile.store(C + metile.arange(0, 8), metile.dot(a, a))


@metile.kernel
def k_dot_acc(A, C):
    r = metile.arange(0, 8)
    a = metile.load(A + r[:, None] * 8 + r[None, :])
    acc = metile.zeros((16, 16), dtype=metile.float32)
    metile.store(C + r[:, None] * 8 + r[None, :], metile.dot(a, a, acc))


@metile.kernel
def k_arange(X, START: metile.constexpr, END: metile.constexpr):
    offs = metile.arange(START, END)
    metile.store(X + offs, 1.0)


@metile.kernel
def k_zeros_dtype(X, DT: metile.constexpr):
    metile.store(X + metile.arange(0, 8), metile.zeros((8,), dtype=DT))


@metile.kernel
def k_cast(X, DT: metile.constexpr):
    metile.store(X, metile.cast(metile.load(X), DT))


@metile.kernel
def k_float_mask(X):
    offs = metile.arange(0, 8)
    x = metile.load(X + offs)
    metile.store(X + offs, x, mask=x)


@metile.kernel
def k_mask_shape(X):
    offs = metile.arange(0, 8)
    metile.store(X + offs, 1.0, mask=metile.arange(0, 16) < 4)


@metile.kernel
def k_other_string(X):
    offs = metile.arange(0, 8)
    metile.store(X + offs, metile.load(X + offs, mask=offs < 4, other="zero"))


@metile.kernel
def k_float_offset(X):
    metile.store(X + 0.5, 1.0)


@metile.kernel
def k_pointer_times_two(X):
    metile.store(X * 2, 1.0)


@metile.kernel
def k_where_two_buffers(X, Y):
    o = metile.arange(0, 8)
    metile.store(X + o, metile.load(metile.where(o < 2, X + o, Y + o)))


@metile.kernel
def k_array_for_scalar(X, n):
    o = metile.arange(0, 8)
    metile.store(X + o, 1.0, mask=o < n)


@metile.kernel
def k_pointer_plus_pointer(X, Y):
    metile.store(X + Y, 1.0)


@metile.kernel
def k_shared(X, SIZE: metile.constexpr):
    s = metile.shared(SIZE)
    s_tid = metile.thread_id()
    metile.store(s + s_tid, 1.0)
    metile.barrier()
    metile.store(X + s_tid, metile.load(s + s_tid))


@metile.kernel
def k_barrier_args(X):
    metile.barrier(1)
    metile.store(X, 1.0)


@metile.kernel
def k_atomic(X, BLOCK: metile.constexpr):
    metile.atomic_add(X + metile.arange(0, BLOCK), 1.0)


@metile.kernel
def k_atomic_and_store(X):
    offs = metile.arange(0, 8)
    metile.atomic_add(X + offs, 1.0)
    metile.store(X + offs, 2.0)


@metile.kernel
def k_view_access(X):
    v = metile.tensor(X, shape=(8,), access="w")
    v.store((0,), 1.0)


@metile.kernel
def k_view_rank(X):
    v = metile.tensor(X, shape=(8,))
    v.store((0, 0), 1.0)


@metile.kernel
def k_view_shape(X):
    v = metile.tensor(X, shape=(8, "a"))
    v.store((0, 0), 1.0)


@metile.kernel
def k_divergent_barrier(X):
    if metile.thread_id() < 4:
        metile.barrier()
    metile.store(X, 1.0)


@metile.kernel
def k_call_kernel(X, n):
    copy(X, X, n, n)  # a kernel called from a kernel is inlined; BLOCK must be constant


@metile.kernel
def k_undefined(X):
    metile.store(X, undefined_name)  # noqa: F821


@metile.kernel
def k_math_module(X):
    metile.store(X, math.sqrt(metile.load(X)))


@metile.kernel
def k_chained(X, n):
    if 0 < n < 4:
        metile.store(X, 1.0)


@metile.kernel
def k_item_assign(X):
    X[0] = 1.0


@metile.kernel
def k_tile_if(X):
    x = metile.load(X + metile.arange(0, 8))
    if x > 0:
        metile.store(X, 1.0)


@metile.kernel
def k_tile_not(X):
    x = metile.load(X + metile.arange(0, 8))
    metile.store(X + metile.arange(0, 8), 1.0, mask=not x)  # a bool tile's `not` is elementwise


@metile.kernel
def k_runtime_pow(X, n):
    metile.store(X, metile.load(X) ** n)


@metile.kernel
def k_const_div_zero(X):
    metile.store(X, 1 // 0)


@metile.kernel
def k_with(X):
    with open("x"):
        metile.store(X, 1.0)


@metile.kernel
def k_lambda(X):
    f = lambda v: v  # noqa: E731
    metile.store(X, f(1.0))


@metile.kernel
def k_print(X):
    print(X)
    metile.store(X, 1.0)


@metile.kernel
def k_fstring(X):
    s = f"{X}"
    metile.store(X, 1.0)


@metile.kernel
def k_dict(X):
    d = {"a": 1.0}
    metile.store(X, d["a"])


@metile.kernel
def k_nested_def(X):
    def g():
        return 1.0
    metile.store(X, g())


@metile.kernel
def k_import(X):
    import math as m  # noqa: F401
    metile.store(X, 1.0)


@metile.kernel
def k_global(X):
    global CASES
    metile.store(X, 1.0)


@metile.kernel
def k_del(X):
    y = 1.0
    del y
    metile.store(X, 1.0)


@metile.kernel
def k_walrus(X):
    metile.store(X, (y := 1.0))


@metile.kernel
def k_return_value(X):
    metile.store(X, 1.0)
    return X


@metile.kernel
def k_runtime_range_step(X, n):
    for i in range(0, 8, n):
        metile.store(X + i, 1.0)


@metile.kernel
def k_zero_step(X):
    for i in range(0, 8, 0):
        metile.store(X + i, 1.0)


@metile.kernel
def k_no_store(X):
    x = metile.load(X)


@metile.inline
def _recurse(x):
    return _recurse(x)


@metile.kernel
def k_recursion(X):
    metile.store(X, _recurse(1.0))


@metile.kernel
def k_early_return(X, Y, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    if pid * BLOCK >= n:
        return
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs))


@metile.kernel
def k_break(X, Y, n):
    acc = 0.0
    for i in range(n):
        if i == 3:
            break
        acc += metile.load(X + i)
    metile.store(Y, acc)


@metile.kernel
def k_int_div(X, Y, d):
    metile.store(Y, metile.load(X) // d)


@metile.kernel
def k_endless(X, n):
    i = 0
    acc = 0.0
    while i < n:
        acc = acc + 1.0
    metile.store(X, acc)


@metile.kernel(differentiable=True)
def k_diff_reduce(X, Y):
    x = metile.load(X + metile.arange(0, 8))
    metile.store(Y, metile.sum(x))


@metile.kernel(differentiable=True)
def k_diff_one_input(X, Y, BLOCK: metile.constexpr = 8):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs)
    metile.store(Y + offs, x * x)


@metile.kernel
def k_increment(X):
    metile.store(X, metile.load(X) + 1.0)


I8 = mx.arange(8, dtype=mx.int32)
A64 = mx.ones((8, 8))
lang = [
    ("load-from-scalar", lambda: k_load_scalar[(1,)](zeros8(), 3),
     r"load\(\) needs a pointer, got a runtime int32 value \(parameter \'n\' was passed a scalar"),
    ("store-to-scalar", lambda: k_store_to_scalar[(1,)](zeros8(), 3),
     r"store\(\) needs a pointer, got a runtime int32 value \(parameter \'n\' was passed a scalar"),
    ("mismatched-tile-shapes", lambda: k_tile_shapes[(1,)](mx.zeros((16,))),
     r"shapes \(8,\) and \(16,\) do not broadcast"),
    ("reduce-axis-out-of-range", lambda: k_reduce_axis[(1,)](zeros8(), AXIS=1),
     r"axis 1 out of range for a rank-1 tile"),
    ("reduce-negative-axis", lambda: k_reduce_axis[(1,)](zeros8(), AXIS=-2),
     r"axis -2 out of range for a rank-1 tile"),
    ("reduce-string-axis", lambda: k_reduce_axis[(1,)](zeros8(), AXIS="0"),
     r"reduction axis must be a constexpr int"),
    ("reduce-runtime-axis", lambda: k_reduce_runtime_axis[(1,)](zeros8(), 0),
     r"reduction axis must be a constexpr int"),
    ("program-id-axis-3", lambda: k_program_id[(1,)](zeros8(), AXIS=3),
     r"program_id\(\) axis must be 0, 1 or 2, got 3"),
    ("program-id-axis-negative", lambda: k_program_id[(1,)](zeros8(), AXIS=-1),
     r"program_id\(\) axis must be 0, 1 or 2, got -1"),
    ("program-id-runtime-axis", lambda: k_program_id_runtime[(1,)](zeros8(), 0),
     r"program_id\(\) axis must be a constexpr int \(known at compile time\), got a runtime int32 "
     r"value"),
    ("dot-inner-mismatch", lambda: k_dot[(1,)](A64, A64, mx.zeros((64,)), SA=(8, 16), SB=(8, 8)),
     r"dot\(\) inner dimensions differ: \(8, 16\) @ \(8, 8\)"),
    ("dot-int-operands", lambda: k_dot[(1,)](mx.ones((64,), mx.int32), mx.ones((64,), mx.int32),
                                             mx.zeros((64,), mx.int32), SA=(8, 8), SB=(8, 8)),
     r"dot\(\) needs two floating tiles of one dtype, got int32 and int32"),
    ("dot-1d-operands", lambda: k_dot_1d[(1,)](zeros8(), zeros8()),
     r"dot\(\) operand a must be a 2-D tile"),
    ("dot-acc-shape", lambda: k_dot_acc[(1,)](A64, mx.zeros((64,))),
     r"dot\(\) accumulator must be a tile<8x8, float32>, got a tile<16x16, float32> tile"),
    ("arange-reversed", lambda: k_arange[(1,)](mx.zeros((16,)), START=8, END=0),
     r"arange\(8, 0\) is empty: end must be greater than start"),
    ("arange-float-end", lambda: k_arange[(1,)](mx.zeros((16,)), START=0, END=8.0),
     r"arange\(\) end must be a constexpr int \(known at compile time\), got float 8.0"),
    ("zeros-bad-dtype", lambda: k_zeros_dtype[(1,)](zeros8(), DT="float64"),
     r"zeros\(\): unsupported dtype \'float64\'; kernels take float32, float16, bfloat16, int32, "
     r"uint32, int64, uint64, int8, uint8, int16, uint16, bool"),
    ("cast-to-non-dtype", lambda: k_cast[(1,)](zeros8(), DT=3),
     r"cast\(\): unsupported dtype 3; kernels take float32"),
    ("float-mask", lambda: k_float_mask[(1,)](zeros8()),
     r"mask must be a bool value, got a tile<8, float32> tile"),
    ("mask-shape-mismatch", lambda: k_mask_shape[(1,)](zeros8()),
     r"shapes \(8,\) and \(16,\) do not broadcast"),
    ("load-other-string", lambda: k_other_string[(1,)](zeros8()),
     r"expected a number or a runtime value, got str \'zero\'\n.*other=\"zero\""),
    ("pointer-float-offset", lambda: k_float_offset[(1,)](zeros8()),
     r"pointer offset must be an integer, got 0.5"),
    ("pointer-times-two", lambda: k_pointer_times_two[(1,)](zeros8()),
     r"\'\*\' is not defined on pointers: a pointer only takes \+ or - an int32 or int64 offset"),
    ("where-between-buffers", lambda: k_where_two_buffers[(1,)](zeros8(), zeros8()),
     r"where\(\) between pointers into different buffers \(X, Y\) is not supported: load from "
     r"each and choose between the values"),
    ("array-for-a-scalar", lambda: k_array_for_scalar[(1,)](zeros8(), mx.array([8])),
     r"\'<\' is not defined on pointers: .* \(parameter \'n\' was passed an mx.array, so it is a "
     r"buffer here; pass a Python number for a scalar, or read it with metile.load\(n\)\)"),
    ("pointer-plus-pointer", lambda: k_pointer_plus_pointer[(1,)](zeros8(), zeros8()),
     r"only pointer \+ integer offset is supported"),
    ("shared-size-zero", lambda: k_shared[(1,)](zeros8(), SIZE=0),
     r"shared\(\) size must be positive, got 0"),
    ("shared-size-negative", lambda: k_shared[(1,)](zeros8(), SIZE=-4),
     r"shared\(\) size must be positive, got -4"),
    ("barrier-with-argument", lambda: k_barrier_args[(1,)](zeros8()),
     r"metile.barrier\(\): too many positional arguments"),
    ("atomic-add-float16", lambda: k_atomic[(1,)](zeros8(mx.float16), BLOCK=8),
     r"atomic_add\(\) on a float16 buffer is not supported; it takes float32, int32, uint32 "
     r"buffers"),
    ("atomic-add-and-store", lambda: k_atomic_and_store[(1,)](zeros8()),
     r"buffer \'X\' is updated with atomics and also stored to in this kernel; write it with "
     r"metile.atomic_xchg"),
    ("view-bad-access", lambda: k_view_access[(1,)](zeros8()),
     r"tensor\(\) access must be one of \(\'read\', \'write\', \'readwrite\'\), got \'w\'"),
    ("view-index-rank", lambda: k_view_rank[(1,)](zeros8()),
     r"store\(\) position has 2 coordinates; the view has rank 1"),
    ("view-string-shape", lambda: k_view_shape[(1,)](zeros8()),
     r"tensor\(\) shape\[1\] must be an int \(constexpr or a runtime int scalar\), got str \'a\'"),
    ("divergent-barrier", lambda: k_divergent_barrier[(1,)](zeros8()),
     r"barrier\(\) under control flow that depends on thread_id\(\)"),
    ("kernel-call-runtime-constexpr", lambda: k_call_kernel[(1,)](zeros8(), 8),
     r"copy\(\): constexpr parameter 'BLOCK' needs a compile-time value, got a runtime int32 "
     r"value"),
    ("undefined-name", lambda: k_undefined[(1,)](zeros8()),
     r"name 'undefined_name' is not defined"),
    ("python-math-module", lambda: k_math_module[(1,)](zeros8()),
     r"call to sqrt, which is neither a metile builtin nor a @metile.inline helper"),
    ("item-assignment", lambda: k_item_assign[(1,)](zeros8()), r"item assignment is not supported"),
    ("if-on-a-tile", lambda: k_tile_if[(1,)](zeros8()), r"if condition must be a scalar"),
    ("not-on-a-tile", lambda: k_tile_not[(1,)](zeros8()),
     r"\'not\' needs a bool scalar or tile, got a tile<8, float32> tile; write x == 0 "
     r"\(or ~ for the bitwise complement\)"),
    ("runtime-power", lambda: k_runtime_pow[(1,)](zeros8(), 2),
     r"\*\* is only supported on compile-time constants"),
    ("constant-division-by-zero", lambda: k_const_div_zero[(1,)](zeros8()),
     r"cannot evaluate 1 // 0 at compile time: integer division or modulo by zero"),
    ("with-statement", lambda: k_with[(1,)](zeros8()),
     r"unsupported Python in a kernel: with statement"),
    ("lambda", lambda: k_lambda[(1,)](zeros8()), r"unsupported Python in a kernel: lambda"),
    ("f-string", lambda: k_fstring[(1,)](zeros8()), r"unsupported Python in a kernel: f-string"),
    ("dict-literal", lambda: k_dict[(1,)](zeros8()),
     r"unsupported Python in a kernel: dict literal"),
    ("nested-def", lambda: k_nested_def[(1,)](zeros8()),
     r"unsupported Python in a kernel: nested function definition"),
    ("import-in-kernel", lambda: k_import[(1,)](zeros8()),
     r"unsupported Python in a kernel: import"),
    ("global-statement", lambda: k_global[(1,)](zeros8()),
     r"unsupported Python in a kernel: global statement"),
    ("del-statement", lambda: k_del[(1,)](zeros8()),
     r"unsupported Python in a kernel: del statement"),
    ("walrus", lambda: k_walrus[(1,)](zeros8()),
     r"unsupported Python in a kernel: assignment expression"),
    ("return-a-value", lambda: k_return_value[(1,)](zeros8()),
     r"a kernel cannot return a value; store results into an output buffer"),
    ("range-zero-step", lambda: k_zero_step[(1,)](zeros8()),
     r"range\(\) step must not be zero"),
    ("kernel-without-stores", lambda: k_no_store[(1,)](zeros8()),
     r"kernel 'k_no_store' stores to no buffer"),
    ("inline-recursion", lambda: k_recursion[(1,)](zeros8()),
     r"@metile.inline helpers and kernels called from kernels nest more than 32 deep "
     r"\(recursion\?\)"),
    ("differentiable-reduction", lambda: k_diff_reduce[(1,)](zeros8(), mx.zeros((1,))),
     r"differentiable=True needs a pointwise kernel: loads and stores must address program_id\(0\) "
     r"\* BLOCK \+ arange\(0, BLOCK\)"),
]
for _id, _fn, _pattern in lang:
    case(_id, _fn, error(CompilationError, _pattern))

# Python's meaning, (0 < n) and (n < 4) (a compile error before)
case("chained-comparison", lambda: k_chained[(1,)](zeros8(), 2),
     correct(equal([1, 0, 0, 0, 0, 0, 0, 0])))

case("print-call", lambda: k_print[(1,)](zeros8()),
     error(CompilationError, r"Python's built-in 'print' is not available inside a kernel"))
case("arange-non-power-of-two", lambda: k_arange[(1,)](mx.full((16,), -1.0), START=0, END=7),
     correct(equal([1] * 7 + [-1] * 9)))
case("range-runtime-step", lambda: k_runtime_range_step[(1,)](zeros8(), 3), correct(equal([1, 0, 0] * 2 + [1, 0])))
case("shared-beyond-32KiB", lambda: k_shared[(1,)](zeros8(), SIZE=100_000),
     error(ScheduleError, r"cannot honour the threadgroup memory limit: allocations \(shared\(\) arrays "
                          r"and operand staging\) use 400000 bytes of threadgroup memory; the "
                          r"target "
                          r"has 32768"))

case("early-return", lambda: k_early_return[(4,)](X8, mx.full((8,), -1.0), 8, BLOCK=4),
     correct(equal(np.arange(8, dtype=np.float32))))
case("break-in-loop", lambda: k_break[(1,)](X8, zeros8(), 8), correct(equal([3, 0, 0, 0, 0, 0, 0, 0])))
# Triton's meaning: a program is one logical thread, so this adds 1 once.
case("scalar-read-modify-write", lambda: k_increment[(1,)](zeros8()), correct(equal([1, 0, 0, 0, 0, 0, 0, 0])))
case("differentiable-one-input",
     lambda: mx.grad(lambda x: k_diff_one_input[(1,)](x, zeros8()).sum())(X8),
     correct(equal(2 * np.arange(8, dtype=np.float32))))
case("grad-through-plain-kernel", lambda: mx.grad(lambda x: double[(1,)](x, zeros8()).sum())(X8),
     error(LaunchError, r"kernel 'double' has no vjp, so mx.grad/mx.vjp cannot differentiate "
                        r"through it: declare a pointwise kernel "
                        r"@metile.kernel\(differentiable=True\)"))
_DIV_FAULT = (r"kernel 'metile_k_int_div_\w+': integer division by zero \(or INT_MIN / -1\) in "
              r"threadgroup \(0, 0, 0\): Metal leaves the result unspecified")
case("integer-division-by-zero", lambda: k_int_div[(1,)](mx.array([7], mx.int32), mx.zeros((1,), mx.int32), 0),
     error(RuntimeError, _DIV_FAULT), isolate=True)
case("int-min-divided-by-minus-one",
     lambda: k_int_div[(1,)](mx.array([-2**31], mx.int32), mx.zeros((1,), mx.int32), -1),
     error(RuntimeError, _DIV_FAULT), isolate=True)
case("endless-loop-without-stores", lambda: k_endless[(1,)](zeros8(), 4),
     error(RuntimeError, r"METILE_MSL_TIMEOUT_S"), isolate=True)

# -- Schedule, Config, autotune ------------------------------------------------------------

S = metile.Schedule
schedule_fields = [
    ("schedule-unknown-backend", lambda: S(backend="gpu"), ValueError,
     r"Schedule: unknown backend 'gpu'; expected one of auto, simdgroup"),
    ("schedule-backend-int", lambda: S(backend=3), TypeError,
     r"Schedule: backend must be a string"),
    ("schedule-unknown-staging", lambda: S(staging="shared"), ValueError,
     r"Schedule: unknown staging 'shared'; expected one of auto, device, threadgroup"),
    ("schedule-zero-simdgroups", lambda: S(num_simdgroups=0), ValueError,
     r"Schedule: num_simdgroups must be from 1 through 32, got 0"),
    ("schedule-float-simdgroups", lambda: S(num_simdgroups=2.0), TypeError,
     r"Schedule: num_simdgroups must be an int from 1 through 32 or None, got float 2.0"),
    ("schedule-bool-simdgroups", lambda: S(num_simdgroups=True), TypeError,
     r"Schedule: num_simdgroups must be an int from 1 through 32 or None, got bool True"),
    ("schedule-vector-width-2", lambda: S(vector_width=2), ValueError,
     r"Schedule: vector_width must be None, 1 or 4, got 2"),
    ("schedule-vector-width-string", lambda: S(vector_width="4"), TypeError,
     r"Schedule: vector_width must be None, 1 or 4, got str '4'"),
    ("schedule-double-buffer-string", lambda: S(double_buffer="yes"), TypeError,
     r"Schedule: double_buffer must be None, True or False, got str 'yes'"),
    ("schedule-double-buffer-int", lambda: S(double_buffer=1), TypeError,
     r"Schedule: double_buffer must be None, True or False, got int 1"),
    ("schedule-unknown-field", lambda: S(backnd="simdgroup"), TypeError, r"backnd"),
    ("config-zero-simdgroups", lambda: metile.Config(num_simdgroups=0), ValueError,
     r"Config: num_simdgroups must be from 1 through 32, got 0"),
    ("config-unhashable-meta", lambda: metile.Config(BLOCK=[64]), TypeError,
     r"Config: meta-parameter BLOCK=\[64\] must be hashable"),
    ("config-contradiction", lambda: metile.Config(NUM_SG=2, num_simdgroups=4), ValueError,
     r"Config: NUM_SG=2 contradicts num_simdgroups=4"),
    ("config-mutation", lambda: setattr(metile.Config(BLOCK=64), "BLOCK", 32), AttributeError,
     r"Config is immutable"),
]
for _id, _fn, _exc, _pattern in schedule_fields:
    case(_id, _fn, error(_exc, _pattern))


def _scheduled(schedule, **kw):
    return lambda: launch_copy(X8, zeros8(), 8, SCHEDULE=schedule, **kw)


_NO_DOT = "this elementwise kernel contains no dot for a matrix backend"
case("schedule-tensor-ops", _scheduled(S(backend="tensor_ops")),
     error(CompilationError, rf"cannot honour backend='tensor_ops': {_NO_DOT}"))
case("schedule-nax", _scheduled(S(backend="nax")), error(CompilationError, rf"cannot honour backend='nax': {_NO_DOT}"))
case("schedule-simdgroup-without-dot", _scheduled(S(backend="simdgroup")),
     error(CompilationError, rf"cannot honour backend='simdgroup': {_NO_DOT}"))
case("schedule-width4-double-buffer", _scheduled(S(vector_width=4, double_buffer=True)),
     error(CompilationError, r"cannot honour double_buffer=True: this elementwise kernel has no staged "
                             r"K-loop to double buffer"))
case("schedule-contradicts-launch", _scheduled(S(num_simdgroups=4), num_simdgroups=8),
     error(LaunchError, r"num_simdgroups=8 contradicts the SCHEDULE's num_simdgroups=4"))
case("autotune-non-kernel", lambda: metile.autotune(configs=[metile.Config(BLOCK=8)])(lambda: None),
     error(TypeError, r"metile.autotune decorates a @metile.kernel"))
case("autotune-no-configs", lambda: metile.autotune(configs=[])(copy),
     error(TypeError, r"metile.autotune needs a non-empty list of metile.Config"))
case("autotune-dict-configs", lambda: metile.autotune(configs=[{"BLOCK": 8}])(copy),
     error(TypeError, r"metile.autotune needs a non-empty list of metile.Config"))
case("autotune-unknown-key", lambda: metile.autotune(configs=[metile.Config(BLOCK=8)], key=["N"])(copy),
     error(ValueError, r"metile.autotune key names unknown parameters \['N'\]"))
case("autotune-key-string", lambda: metile.autotune(configs=[metile.Config(BLOCK=8)], key="n")(copy),
     error(TypeError, r"metile.autotune key must be a list of parameter names, e.g. key=\['n'\], got 'n'"))
case("autotune-every-config-bad",
     lambda: metile.autotune(configs=[metile.Config(BLOCK=0), metile.Config(BLOCK=-8)])(copy)[(1,)](
         X8, zeros8(), 8),
     error(RuntimeError, r"no usable candidate"))

# -- metal_kernel ---------------------------------------------------------------------------

SRC = "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] * 2.0f;"


def mk(input_names=("inp",), output_names=("out",), source=SRC, name="twice", **kw):
    return metile.metal_kernel(name, list(input_names) if not isinstance(input_names, str)
                               else input_names, list(output_names), source, **kw)


def mk_call(kernel=None, **kw):
    args = dict(inputs=[X8], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                output_dtypes=[mx.float32], stream=mx.cpu)
    args.update(kw)
    out = (kernel or mk())(**args)
    return out[0] if len(out) == 1 else out


TWICE = 2 * np.arange(8, dtype=np.float32)
metal_ctor = [
    ("mk-no-outputs", lambda: mk(output_names=()), ValueError,
     r"\[metal_kernel\] must specify at least one output"),
    ("mk-duplicate-inputs", lambda: mk(input_names=("a", "a")), ValueError,
     r"\[metal_kernel\] input and output names must be distinct"),
    ("mk-output-named-like-input", lambda: mk(output_names=("inp",)), ValueError,
     r"\[metal_kernel\] input and output names must be distinct"),
    ("mk-name-not-identifier", lambda: mk(input_names=("a-b",)), ValueError,
     r"\[metal_kernel\] input/output names must be identifiers, got \['a-b'\]"),
    ("mk-name-int", lambda: mk(input_names=(1,)), ValueError,
     r"\[metal_kernel\] input/output names must be identifiers, got \[1\]"),
    ("mk-input-names-a-string", lambda: mk(input_names="inp"), TypeError,
     r"\[metal_kernel\] input_names must be a list of strings, got 'inp'"),
    ("mk-metal-keyword-name", lambda: mk(input_names=("kernel",)), ValueError,
     r"\[metal_kernel\] input_names\[0\] is 'kernel', which is a reserved word of Metal Shading "
     r"Language and cannot name a kernel argument"),
    ("mk-cxx-keyword-name", lambda: mk(output_names=("float",)), ValueError,
     r"\[metal_kernel\] output_names\[0\] is 'float', which is a reserved word"),
    ("mk-kernel-name-with-space", lambda: mk(name="my kernel"), ValueError,
     r"\[metal_kernel\] name must be letters, digits and underscores .*got 'my kernel'"),
    ("mk-source-not-a-string", lambda: mk(source=None), TypeError,
     r"\[metal_kernel\] source must be a string, got NoneType"),
]
for _id, _fn, _exc, _pattern in metal_ctor:
    case(_id, _fn, error(_exc, _pattern))
case("mk-source-syntax-error", lambda: mk_call(mk(source="out[0] = ;", name="syntax_error")),
     error(metile.MslCompileError, r"kernel 'syntax_error' failed to compile"))
case("mk-header-syntax-error", lambda: mk_call(mk(header="int f( {", name="bad_header")),
     error(metile.MslCompileError, r"kernel 'bad_header' failed to compile"))
case("mk-input-count", lambda: mk_call(inputs=[X8, X8]),
     error(ValueError, r"expected `inputs` to have size 1 but got size 2"))
case("mk-input-string", lambda: mk_call(inputs=["abc"]),
     error(TypeError, r"\[metal_kernel\] input 'inp' must be an mx.array or a Python scalar, got str"))
case("mk-input-none", lambda: mk_call(inputs=[None]),
     error(TypeError, r"\[metal_kernel\] input 'inp' must be an mx.array or a Python scalar, got NoneType"))
case("mk-input-numpy", lambda: mk_call(inputs=[np.arange(8, dtype=np.float32)]), correct(equal(TWICE)))
case("mk-input-float64", lambda: mk_call(inputs=[X8.astype(mx.float64)]),
     error((TypeError, ValueError), r"\[metal_kernel\] .*'inp'.*float64"))
case("mk-output-shapes-count", lambda: mk_call(output_shapes=[]),
     error(ValueError, r"expected `output_shapes` to have size 1 but got size 0"))
case("mk-output-shape-negative", lambda: mk_call(output_shapes=[(-8,)]),
     error(ValueError, r"output shape \[-8\] has a negative dimension"))
case("mk-output-shape-float", lambda: mk_call(output_shapes=[(8.5,)]),
     error(TypeError, r"\[metal_kernel\] output_shapes entry for 'out' must be a tuple of ints, got \(8.5,\)"))
case("mk-output-shape-int", lambda: mk_call(output_shapes=[8]),
     error(TypeError, r"\[metal_kernel\] output_shapes entry for 'out' must be a tuple of ints, got 8"))
case("mk-output-dtype-numpy", lambda: mk_call(output_dtypes=[np.float32]),
     error(TypeError, r"\[metal_kernel\] output_dtypes entry for 'out' must be an mx.Dtype"))
case("mk-output-dtype-string", lambda: mk_call(output_dtypes=["float32"]),
     error(TypeError, r"\[metal_kernel\] output_dtypes entry for 'out' must be an mx.Dtype"))
case("mk-output-dtype-float64", lambda: mk_call(output_dtypes=[mx.float64]),
     error((TypeError, ValueError), r"\[metal_kernel\] .*'out'.*float64"))
case("mk-grid-floats", lambda: mk_call(grid=(8.0, 1, 1)),
     error(ValueError, r"\[metal_kernel\] grid must be a tuple of three ints, got \(8.0, 1, 1\)"))
case("mk-grid-negative", lambda: mk_call(grid=(-8, 1, 1)),
     error(ValueError, r"\[metal_kernel\] grid dimensions must be non-negative, got \(-8, 1, 1\)"))
case("mk-grid-four-dims", lambda: mk_call(grid=(8, 1, 1, 1)),
     error(ValueError, r"\[metal_kernel\] grid must be a tuple of three ints"))
case("mk-grid-two-dims", lambda: mk_call(grid=(8, 1)),
     error(ValueError, r"\[metal_kernel\] grid must be a tuple of three ints"))
case("mk-grid-numpy-ints", lambda: mk_call(grid=(np.int64(8), 1, 1)), correct(equal(TWICE)))
case("mk-grid-huge", lambda: mk_call(grid=(2**40, 1, 1)),
     error(ValueError, r"\[metal_kernel\] grid \(1099511627776, 1, 1\) has a dimension above 2147483647"))
case("mk-threadgroup-2048", lambda: mk_call(threadgroup=(2048, 1, 1), grid=(2048, 1, 1)),
     error(ValueError, r"at most 1024 threads per threadgroup"))
case("mk-threadgroup-zero", lambda: mk_call(threadgroup=(0, 1, 1)),
     error(ValueError, r"\[metal_kernel\] threadgroup dimensions must be positive, got \(0, 1, 1\)"))
case("mk-grid-zero", lambda: mk_call(grid=(0, 1, 1), init_value=3.0), correct(equal(np.full(8, 3.0))))
TEMPLATED = "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] * N;"
_TEMPL_VALUE = r"\[metal_kernel\] template argument {} must be an int, bool or mx.Dtype"
case("mk-template-float", lambda: mk_call(mk(source=TEMPLATED, name="templ"), template=[("N", 2.5)]),
     error(TypeError, _TEMPL_VALUE.format("2.5")))
case("mk-template-string", lambda: mk_call(mk(source=TEMPLATED, name="templ"), template=[("N", "2")]),
     error(TypeError, _TEMPL_VALUE.format("'2'")))
case("mk-template-list", lambda: mk_call(mk(source=TEMPLATED, name="templ"), template=[("N", [2])]),
     error(TypeError, _TEMPL_VALUE.format(r"\[2\]")))
case("mk-template-not-pairs", lambda: mk_call(mk(source=TEMPLATED, name="templ"), template=[5]),
     error(TypeError, r"\[metal_kernel\] template .*\(name, value\) pairs.*5"))
case("mk-template-name-int", lambda: mk_call(mk(source=TEMPLATED, name="templ"), template=[(3, 2)]),
     error((TypeError, ValueError), r"\[metal_kernel\] template .*name.*3"))
case("mk-template-missing", lambda: mk_call(mk(source=TEMPLATED, name="templ")),
     error(metile.MslCompileError, r"kernel 'templ' failed to compile.*:\n.*templ \(source\):1:\d+: error: "
                                   r"use of undeclared identifier 'N'"))
case("mk-template-int", lambda: mk_call(mk(source=TEMPLATED, name="templ"), template=[("N", 2)]),
     correct(equal(TWICE)))
case("mk-init-value-string", lambda: mk_call(init_value="abc"),
     error((TypeError, ValueError), r"\[metal_kernel\] init_value.*'abc'"))
case("mk-stream-string", lambda: mk_call(stream="cpu"),
     error(TypeError, r"\[metal_kernel\] stream must be an mx.Stream, mx.Device or None, got 'cpu'"))
case("mk-lane-order-unknown", lambda: mk_call(lane_order="sideways"),
     error(ValueError, r"\[metal_kernel\] lane order must be 'forward', 'reverse' or 'shuffle', got 'sideways'"))
case("mk-atomic-float16-output",
     lambda: mk_call(mk(source="atomic_fetch_add_explicit(&out[0], 1.0h, memory_order_relaxed);",
                        name="atomic_half", atomic_outputs=True), output_dtypes=[mx.float16], init_value=0),
     error(metile.MslCompileError, r"kernel 'atomic_half' failed to compile"))
case("cuda-kernel-on-cpu",
     lambda: metile.cuda_kernel("twice", ["inp"], ["out"], "out[0] = inp[0];")(
         inputs=[X8], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
         output_dtypes=[mx.float32], stream=mx.cpu),
     error(RuntimeError, r"\[cuda_kernel\] kernel 'twice' is CUDA C\+\+, which needs MLX's CUDA backend; "
                         r"the requested device is Device\(cpu, 0\)"))

# -- ops and nn -----------------------------------------------------------------------------

A = mx.array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
W = mx.array(np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32))
ops_cases = [
    ("matmul-numpy", lambda: metile.ops.matmul(np.ones((4, 3)), W.T), TypeError,
     r"\[metile.ops\] a must be an mx.array, got ndarray"),
    # backend="metile": the kernels' own refusal; "auto" hands such dtypes to MLX's matmul
    ("matmul-int32", lambda: metile.ops.matmul(A.astype(mx.int32), W.T.astype(mx.int32),
                                               backend="metile"), TypeError,
     r"\[metile.ops\] a has dtype mlx.core.int32; supported: float32, float16, bfloat16"),
    ("matmul-int32-auto", lambda: metile.ops.matmul(A.astype(mx.int32), W.T.astype(mx.int32)),
     ValueError, r"\[matmul\] Only inexact types are supported"),
    ("matmul-float64", lambda: metile.ops.matmul(A.astype(mx.float64), W.T, backend="metile"),
     TypeError, r"\[metile.ops\] a has dtype mlx.core.float64; supported"),
    ("matmul-0d-a", lambda: metile.ops.matmul(mx.array(1.0), W.T), ValueError,
     r"\[metile.ops\] matmul operands need at least one dimension, got \(\) @ \(3, 5\)"),
    ("matmul-inner-mismatch", lambda: metile.ops.matmul(A, W), ValueError,
     r"\[metile.ops\] inner dimensions differ: \(4, 3\) @ \(5, 3\)"),
    ("matmul-unknown-epilogue", lambda: metile.ops.matmul(A, W.T, epilogue="tanh"), ValueError,
     r"\[metile.ops\] epilogue must be one of None, 'gelu_tanh', 'leaky_relu', 'relu', "
     r"'silu', got 'tanh'"),
    ("matmul-unknown-backend", lambda: metile.ops.matmul(A, W.T, backend="gpu"), ValueError,
     r"\[metile.ops\] backend must be 'auto', 'metile' or 'mlx', got 'gpu'"),
    ("matmul-slope-overflow", lambda: metile.ops.matmul(A, W.T, epilogue="leaky_relu",
                                                        negative_slope=10**400), ValueError,
     r"\[metile.ops\] negative_slope 1000.* does not fit in a float"),
    ("matmul-slope-string", lambda: metile.ops.matmul(A, W.T, epilogue="leaky_relu", negative_slope="x"),
     TypeError, r"\[metile.ops\] negative_slope must be a number, got str 'x'"),
    ("linear-numpy-x", lambda: metile.ops.linear(np.ones((4, 3), np.float32), W), TypeError,
     r"\[metile.ops\] x must be an mx.array, got ndarray"),   # (it said "a")
    ("linear-0d-x", lambda: metile.ops.linear(mx.array(1.0), W), ValueError,
     r"\[metile.ops\] x must have at least one dimension \(\.\.\., in_features\), got shape "
     r"\(\)"),   # (it named a and b, and the weight transposed)
    ("linear-1d-weight", lambda: metile.ops.linear(A, mx.ones((3,))), ValueError,
     r"\[metile.ops\] weight must be a 2-D mx.array \(out_features, in_features\)"),
    ("linear-numpy-weight", lambda: metile.ops.linear(A, np.ones((5, 3), np.float32)), ValueError,
     r"\[metile.ops\] weight must be a 2-D mx.array"),
    ("linear-bias-shape", lambda: metile.ops.linear(A, W, mx.ones((4,))), ValueError,
     r"\[metile.ops\] bias shape \(4,\) does not broadcast to the 5 output features"),
    ("linear-bias-rows-under-metile",
     lambda: metile.ops.linear(A, W, mx.ones((A.shape[0], 5)), backend="metile"), ValueError,
     r"\[metile.ops\] bias shape \(\d+, 5\): metile's kernels add one bias vector of 5 "
     r"output features to every row; pass a per-row bias as residual="),
    ("linear-bias-numpy", lambda: metile.ops.linear(A, W, np.ones((5,), np.float32)), TypeError,
     r"\[metile.ops\] bias must be an mx.array or None, got ndarray"),
    ("linear-unknown-activation-with-bias", lambda: metile.ops.linear(A, W, mx.ones((5,)), "tanh"),
     ValueError, r"\[metile.ops\] activation must be one of .*got 'tanh'"),
    ("linear-wrong-in-features", lambda: metile.ops.linear(mx.ones((4, 4)), W), ValueError,
     r"\[metile.ops\] x's last dimension is 4, but weight \(5, 3\) \(out_features, "
     r"in_features\) takes 3 input features"),
    ("nn-linear-unknown-activation", lambda: metile.nn.Linear(3, 5, activation="tanh"), ValueError,
     r"\[metile.nn.Linear\] activation must be one of .*got 'tanh'"),
    ("nn-linear-slope-string", lambda: metile.nn.Linear(3, 5, activation="leaky_relu", negative_slope="a"),
     TypeError, r"\[metile.nn.Linear\] negative_slope must be a number, got str"),
    ("nn-linear-slope-overflow", lambda: metile.nn.Linear(3, 5, activation="leaky_relu",
                                                          negative_slope=10**400), ValueError,
     r"\[metile.nn.Linear\] negative_slope 1000.* does not fit in a float"),
    ("nn-linear-unknown-backend", lambda: metile.nn.Linear(3, 5, backend="cuda"), ValueError,
     r"\[metile.nn.Linear\] backend must be 'auto', 'metile' or 'mlx', got 'cuda'"),
    ("nn-linear-negative-dims", lambda: metile.nn.Linear(-3, 5), ValueError,
     r"\[metile.nn.Linear\] input_dims must be a positive int, got -3"),
    ("nn-linear-zero-dims", lambda: metile.nn.Linear(3, 0), ValueError,
     r"\[metile.nn.Linear\] output_dims must be a positive int, got 0"),
    ("nn-linear-float-dims", lambda: metile.nn.Linear(3, 2.5), TypeError,
     r"\[metile.nn.Linear\] output_dims must be an int, got float 2.5"),
    ("nn-linear-wrong-input", lambda: metile.nn.Linear(3, 5)(mx.ones((2, 4))), ValueError,
     r"\[metile.ops\] x's last dimension is 4, but weight \(5, 3\)"),
]
for _id, _fn, _exc, _pattern in ops_cases:
    case(_id, _fn, error(_exc, _pattern))

_ref = np.array(A) @ np.array(W).T
case("matmul-zero-rows", lambda: metile.ops.matmul(mx.zeros((0, 3)), W.T, backend="metile"),
     correct(equal(np.zeros((0, 5), np.float32))))
case("matmul-zero-k", lambda: metile.ops.matmul(mx.zeros((4, 0)), mx.zeros((0, 5)), backend="metile"),
     correct(equal(np.zeros((4, 5), np.float32))))
case("linear-1d-input", lambda: metile.ops.linear(A[0], W), correct(close(_ref[0])))
case("matmul-1d-b", lambda: metile.ops.matmul(A, W[0], backend="metile"),
     correct(close(_ref[:, 0])))

# -- environment variables --------------------------------------------------------------------


def with_env(fn, **env):
    def run():
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return run_case(fn)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return run


def fresh_kernel_call():
    """A metal_kernel whose source is new to every cache, so it must be compiled."""
    src = f"// {uuid.uuid4().hex}\n" + SRC
    return mk_call(mk(source=src, name="fresh"))


case("env-backend-unknown", with_env(lambda: launch_copy(X8, zeros8(), 8, BLOCK=16), METILE_BACKEND="opencl"),
     error(LaunchError, r"METILE_BACKEND must be one of msl, cuda, got 'opencl'"))
case("env-backend-cuda-on-cpu", with_env(lambda: launch_copy(X8, zeros8(), 8, BLOCK=16), METILE_BACKEND="cuda"),
     error(LaunchError, r"kernel 'copy' was compiled to CUDA \(backend='cuda', METILE_BACKEND=cuda, "
                        r"or a target= / METILE_TARGET of that language such as 'sm_90'\), "
                        r"which runs only on MLX's CUDA backend; the default device is Device\(cpu, 0\). "
                        r"Leave the backend and target to the device"))
case("target-cuda-on-cpu", lambda: launch_copy(X8, zeros8(), 8, BLOCK=16, target="sm_90"),
     error(LaunchError, r"kernel 'copy' was compiled to CUDA \(.*or a target= / METILE_TARGET of "
                        r"that language such as 'sm_90'\)"))
case("env-debug-unknown", with_env(lambda: metile.kernel(_plain)[(1,)](zeros8()), METILE_DEBUG="everything"),
     warns(UserWarning, r"METILE_DEBUG: unknown word\(s\) everything; known: uniformity, .*plan_schedule, "
                        r"lower_tiles, .*tile_ir, thread_ir, msl, cuda, schedule",
           equal(np.ones(8, np.float32))))
_SETTING = r"{}='{}' is not {}"
for _var, _value, _accepted in (
        ("METILE_LANE_ORDER", "sideways", "one of forward, reverse, shuffle"),
        ("METILE_RACE_CHECK", "maybe", "a boolean; use 1 \\(on\\) or 0 \\(off\\)"),
        ("METILE_MSL_BOUNDS_CHECK", "maybe", "a boolean; use 1 \\(on\\) or 0 \\(off\\)")):
    case(f"env-{_var}-{_value}", with_env(lambda: mk_call(), **{_var: _value}),
         error(ValueError, _SETTING.format(_var, _value, _accepted)))
_THREADS = r"expected a whole number of CPU runtime worker threads from 1 to 4096 \(unset: one per core\)"
_TIMEOUT = r"expected a number of seconds >= 0 \(0 or unset: no limit\)"
_STACK = r"expected a whole number of KiB per fiber stack from 16 to 65536 \(unset: 128\)"
for _var, _value, _accepted in (
        ("METILE_MSL_THREADS", "abc", _THREADS), ("METILE_MSL_THREADS", "0", _THREADS),
        ("METILE_MSL_TIMEOUT_S", "abc", _TIMEOUT), ("METILE_MSL_TIMEOUT_S", "-1", _TIMEOUT),
        ("METILE_MSL_STACK_KB", "abc", _STACK), ("METILE_MSL_STACK_KB", "1", _STACK)):
    case(f"env-{_var}-{_value}", with_env(lambda: mk_call(), **{_var: _value}),
         error(ValueError, rf"\[metal_kernel\] invalid {_var}='{_value}': {_accepted}"))
case("env-cxx-missing", with_env(fresh_kernel_call, METILE_CXX="/nonexistent/clang++"),
     error(RuntimeError, r"\[metal_kernel\] METILE_CXX='/nonexistent/clang\+\+' is not a clang\+\+ 17 "
                         r"or later on PATH.*set METILE_CXX to a suitable clang\+\+"),
     isolate=True)  # the compiler is found once per process
case("env-cache-dir-is-a-file", with_env(fresh_kernel_call, METILE_CACHE_DIR=__file__ + "/cache"),
     warns(Warning, r"metile: cannot write the cache directory .*test_bad_inputs.py/cache.*"
                        r"Point METILE_CACHE_DIR at a writable directory", equal(TWICE)))
case("env-dot-fragments-maybe",
     with_env(lambda: metile.kernel(_plain)[(1,)](zeros8()), METILE_DOT_FRAGMENTS="maybe"),
     error(ValueError, r"METILE_DOT_FRAGMENTS='maybe' is not a boolean; use 1 \(on\) or 0 \(off\)"))
case("env-disable-disk-cache-maybe",
     with_env(lambda: metile.kernel(_plain)[(1,)](zeros8()), METILE_DISABLE_DISK_CACHE="maybe"),
     error(ValueError, r"METILE_DISABLE_DISK_CACHE='maybe' is not a boolean; use 1 \(on\) or 0 \(off\)"))


# -- running the table ------------------------------------------------------------------------

def _params():
    out = []
    for id_, fn, expect, isolate, xfail in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
        out.append(pytest.param(id_, fn, expect, isolate, id=id_, marks=marks))
    return out


def check_outcome(fn, expect):
    if expect[0] == "error":
        _, exc, pattern = expect
        with pytest.raises(exc) as info:
            run_case(fn)
        assert re.search(pattern, str(info.value)), f"{type(info.value).__name__}: {info.value}"
    elif expect[0] == "warns":
        _, category, pattern, check = expect
        with pytest.warns(category, match=pattern):
            out = run_case(fn)
        check(out)
    else:
        expect[1](run_case(fn))


def run_isolated(id_):
    """Child-process entry: run one case; the exit status says whether it held."""
    for cid, fn, expect, _, _ in CASES:
        if cid == id_:
            check_outcome(fn, expect)
            return
    raise KeyError(id_)


ISOLATED_TIMEOUT_S = 60


@pytest.mark.parametrize("id_,fn,expect,isolate", _params())
def test_bad_input(id_, fn, expect, isolate):
    if not isolate:
        check_outcome(fn, expect)
        return
    env = dict(os.environ, METILE_MSL_TIMEOUT_S="2")
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import test_bad_inputs as t; t.run_isolated({id_!r})"
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True,
                              text=True, timeout=ISOLATED_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"case {id_} hung for {ISOLATED_TIMEOUT_S} s")
    assert proc.returncode == 0, f"case {id_} exited with {proc.returncode}:\n{proc.stderr[-3000:]}"


def test_table_is_large_enough():
    assert len(CASES) >= 110
