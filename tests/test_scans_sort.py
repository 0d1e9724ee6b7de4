"""Triton's associative_scan (an @metile.inline combine over a tile or a tuple of tiles),
sort (bitonic, power-of-two blocks), join/split/interleave and reductions over any axis
with keep_dims, against NumPy on the CPU runtime; one case of each also compiled for CUDA
with NVRTC."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from nvrtc import TOOLKIT, compile_cuda, translation_unit

F32, F16, BF16, I32, U32 = mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint32
_IDS = lambda d: str(d).split(".")[-1]  # noqa: E731


def _np(a):
    return np.array(a.astype(F32) if a.dtype == BF16 else a).astype(np.float64)


def _ints(shape, dtype, seed, low=-4, high=4):
    """(mx array, float64 copy) of small integers, exact in every dtype."""
    xn = np.random.default_rng(seed).integers(low, high, shape).astype(np.float64)
    return mx.array(xn.astype(np.float32)).astype(dtype), xn


def _flip_scan(f, xn, axis, reverse):
    """Triton's reverse scan: the scan of the flipped line, flipped back."""
    if not reverse:
        return f(xn, axis)
    return np.flip(f(np.flip(xn, axis), axis), axis)


# -- associative_scan: one tile --------------------------------------------------------------

@metile.inline
def _add(a, b):
    return a + b


@metile.inline
def _max(a, b):
    return metile.maximum(a, b)


@metile.inline
def _mul(a, b):
    return a * b


@metile.inline
def _max_by_if(a, b):
    if a > b:  # a runtime branch inside the combine
        return a
    return b


_NP = {"add": np.cumsum, "max": np.maximum.accumulate, "mul": np.cumprod,
       "max_by_if": np.maximum.accumulate}


@metile.kernel
def scan_row(X, Y, n, OP: metile.constexpr, REVERSE: metile.constexpr, FILL: metile.constexpr,
             BLOCK: metile.constexpr):
    row = metile.program_id(0)
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + row * n + offs, mask=m, other=FILL)  # FILL: the combine's identity
    if OP == "add":
        y = metile.associative_scan(x, 0, _add, reverse=REVERSE)
    elif OP == "max":
        y = metile.associative_scan(x, axis=0, combine_fn=_max, reverse=REVERSE)
    elif OP == "mul":
        y = metile.associative_scan(x, -1, _mul, REVERSE)
    else:
        y = x.associative_scan(0, _max_by_if, reverse=REVERSE)  # Triton's tensor method
    metile.store(Y + row * n + offs, y, mask=m)


_FILL = {"add": {F32: 0.0, F16: 0.0, I32: 0}, "mul": {F32: 1.0, F16: 1.0, I32: 1},
         "max": {F32: float("-inf"), F16: float("-inf"), I32: -2**31},
         "max_by_if": {F32: float("-inf"), F16: float("-inf"), I32: -2**31}}


@pytest.mark.parametrize("dtype", [F32, F16, I32], ids=_IDS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("op", ["add", "max"])
def test_scan_of_a_ragged_row(op, reverse, dtype):
    for n in (1, 7, 65, 1000):  # one block of 1024, masked (one compile)
        # small integers: every partial sum is exact in float16 too, so results are exact
        x, xn = _ints((2, n), dtype, n)
        y = scan_row[(2,)](x, mx.zeros((2, n), dtype), n, OP=op, REVERSE=reverse,
                           FILL=_FILL[op][dtype], BLOCK=1024)
        np.testing.assert_array_equal(_np(y), _flip_scan(_NP[op], xn, 1, reverse))


def test_scan_of_a_block_of_one():
    x, xn = _ints((3, 1), F32, 0)
    y = scan_row[(3,)](x, mx.zeros((3, 1)), 1, OP="add", REVERSE=True, FILL=0.0, BLOCK=1)
    np.testing.assert_array_equal(np.array(y), xn)


@pytest.mark.parametrize("dtype", [F32, F16, I32], ids=_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_product_scan(dtype, reverse):
    # products of 1, -1, 2 and 0.5 are exact (the exponent stays small over 100 steps)
    rng = np.random.default_rng(2)
    choices = [1, 1, 1, -1, 2] if dtype == I32 else [1, 1, -1, 2, 0.5]
    xn = rng.choice(choices, size=(2, 100)).astype(np.float64)
    x = mx.array(xn.astype(np.float32)).astype(dtype)
    y = scan_row[(2,)](x, mx.zeros((2, 100), dtype), 100, OP="mul", REVERSE=reverse,
                       FILL=_FILL["mul"][dtype], BLOCK=128)
    np.testing.assert_array_equal(_np(y), _flip_scan(np.cumprod, xn, 1, reverse))


def test_combine_with_a_runtime_branch():
    x, xn = _ints((2, 50), F32, 3, -100, 100)
    y = scan_row[(2,)](x, mx.zeros((2, 50)), 50, OP="max_by_if", REVERSE=False,
                       FILL=float("-inf"), BLOCK=64)
    np.testing.assert_array_equal(np.array(y), np.maximum.accumulate(xn, 1))


@metile.kernel
def scan_block(X, Y, M: metile.constexpr, N: metile.constexpr, OP: metile.constexpr,
               AXIS: metile.constexpr, REVERSE: metile.constexpr):
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    x = metile.load(X + offs)
    if OP == "add":
        y = metile.associative_scan(x, AXIS, _add, reverse=REVERSE)
    else:
        y = metile.associative_scan(x, AXIS, _max, reverse=REVERSE)
    metile.store(Y + offs, y)


@pytest.mark.parametrize("m,n", [(1, 5), (9, 33)])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("op,dtype", [("add", I32), ("max", F16)], ids=str)
def test_scan_along_each_axis_of_a_2d_tile(op, dtype, reverse, axis, m, n):
    x, xn = _ints((m, n), dtype, 4, -9, 9)
    y = scan_block[(1,)](x, mx.zeros((m, n), dtype), M=m, N=n, OP=op, AXIS=axis,
                         REVERSE=reverse)
    np.testing.assert_array_equal(_np(y), _flip_scan(_NP[op], xn, axis, reverse))


# -- associative_scan: tuples ----------------------------------------------------------------

@metile.inline
def _argmax_combine(v1, i1, v2, i2):
    take = v2 > v1  # ties keep the earlier index, as np.argmax does
    return metile.where(take, v2, v1), metile.where(take, i2, i1)


@metile.inline
def _affine_combine(a1, b1, a2, b2):
    # composing h -> a1*h + b1 then h -> a2*h + b2: associative, not commutative
    return a1 * a2, a2 * b1 + b2


@metile.kernel
def running_argmax(X, V, I, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m, other=float("-inf"))
    v, i = metile.associative_scan((x, offs), 0, _argmax_combine)
    metile.store(V + offs, v, mask=m)
    metile.store(I + offs, i, mask=m)


@pytest.mark.parametrize("dtype", [F32, F16], ids=_IDS)
def test_running_argmax_of_value_index_pairs(dtype):
    for n in (1, 37, 1000):
        x, xn = _ints((n,), dtype, n, -3, 3)  # few values: ties are common
        v, i = running_argmax[(1,)](x, mx.zeros((n,), dtype), mx.zeros((n,), I32), n,
                                    BLOCK=1024)
        np.testing.assert_array_equal(_np(v), np.maximum.accumulate(xn))
        np.testing.assert_array_equal(np.array(i), [np.argmax(xn[:k + 1]) for k in range(n)])


@metile.kernel
def linear_recurrence(A, B, H, M: metile.constexpr, N: metile.constexpr,
                      AXIS: metile.constexpr, REVERSE: metile.constexpr):
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    _, h = metile.associative_scan((metile.load(A + offs), metile.load(B + offs)), AXIS,
                                   _affine_combine, reverse=REVERSE)
    metile.store(H + offs, h)


def _recurrence(a, b, axis, reverse):
    """h_t = a_t * h_(t-1) + b_t from h = 0, along `axis` (reverse: from the end)."""
    a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
    if reverse:
        a, b = a[..., ::-1], b[..., ::-1]
    h, out = np.zeros(a.shape[:-1]), np.zeros(a.shape)
    for t in range(a.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out[..., t] = h
    if reverse:
        out = out[..., ::-1]
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_recurrence_as_a_tuple_scan(axis, reverse):
    rng = np.random.default_rng(6)
    an, bn = rng.uniform(0.5, 1.0, (8, 40)), rng.uniform(-1, 1, (8, 40))
    a, b = mx.array(an.astype(np.float32)), mx.array(bn.astype(np.float32))
    an, bn = np.array(a).astype(np.float64), np.array(b).astype(np.float64)
    h = linear_recurrence[(1,)](a, b, mx.zeros((8, 40)), M=8, N=40, AXIS=axis, REVERSE=reverse)
    np.testing.assert_allclose(np.array(h), _recurrence(an, bn, axis, reverse), rtol=3e-4,
                               atol=3e-5)


# -- sort --------------------------------------------------------------------------------------

@metile.kernel
def sort_row(X, Y, n, FILL: metile.constexpr, DESC: metile.constexpr, BLOCK: metile.constexpr):
    row = metile.program_id(0)
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + row * n + offs, mask=m, other=FILL)  # padding sorts to the end
    metile.store(Y + row * n + offs, metile.sort(x, descending=DESC), mask=m)


_SORT_DTYPES = [F32, F16, BF16, I32, U32]


def _sort_values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype in (I32, U32):
        xn = rng.integers(0 if dtype == U32 else -50, 50, shape).astype(np.float64)
    else:
        xn = rng.uniform(-10, 10, shape)
    x = mx.array(xn.astype(np.float32)).astype(dtype)
    return x, _np(x)


def _pad(dtype, descending):
    if dtype in (I32, U32):
        lo, hi = (0, 2**32 - 1) if dtype == U32 else (-2**31, 2**31 - 1)
        return lo if descending else hi
    return float("-inf") if descending else float("inf")


def _check_sort(n, block, dtype, descending):
    x, xn = _sort_values((2, n), dtype, n)
    y = sort_row[(2,)](x, mx.zeros((2, n), dtype), n, FILL=_pad(dtype, descending),
                       DESC=descending, BLOCK=block)
    ref = np.sort(xn, axis=1)
    np.testing.assert_array_equal(_np(y), ref[:, ::-1] if descending else ref)


@pytest.mark.parametrize("dtype", _SORT_DTYPES, ids=_IDS)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_a_ragged_row(descending, dtype):
    for n in (1, 7, 64, 1000):  # one block of 1024: the padding sorts past the row's end
        _check_sort(n, 1024, dtype, descending)


@pytest.mark.parametrize("n,block", [(1, 1), (2, 2), (7, 8)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_small_blocks(descending, n, block):
    _check_sort(n, block, F32, descending)


@metile.kernel
def sort_rows_of_a_tile(X, Y, M: metile.constexpr, N: metile.constexpr, DIM: metile.constexpr,
                        DESC: metile.constexpr):
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    x = metile.load(X + offs)
    y = x.sort(descending=DESC) if DIM == "method" else metile.sort(x, dim=DIM, descending=DESC)
    metile.store(Y + offs, y)


@pytest.mark.parametrize("m,n,dim", [(3, 16, None), (5, 2, 1), (2, 256, -1), (4, 8, "method")])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_along_the_last_axis_of_a_2d_tile(descending, dim, m, n):
    x, xn = _sort_values((m, n), I32, 8)  # many ties
    y = sort_rows_of_a_tile[(1,)](x, mx.zeros((m, n), I32), M=m, N=n, DIM=dim, DESC=descending)
    ref = np.sort(xn, axis=1)
    np.testing.assert_array_equal(np.array(y), ref[:, ::-1] if descending else ref)


def test_sort_puts_nan_last_as_numpy_does():
    xn = np.random.default_rng(9).uniform(-1, 1, (2, 32)).astype(np.float32)
    xn[0, [3, 17, 30]] = np.nan
    xn[1, :] = np.nan
    xn[1, 5] = 0.5
    for desc in (False, True):
        y = sort_rows_of_a_tile[(1,)](mx.array(xn), mx.zeros((2, 32)), M=2, N=32, DIM=None,
                                      DESC=desc)
        ref = np.sort(xn, axis=1)
        np.testing.assert_array_equal(np.array(y), ref[:, ::-1] if desc else ref)


@metile.kernel
def carried_scan_and_sort(X, Y, S, n, N: metile.constexpr):
    offs = metile.arange(0, N)
    acc = metile.zeros((N,), dtype=metile.float32)
    srt = metile.zeros((N,), dtype=metile.float32)
    for i in range(0, n):
        x = metile.load(X + i * N + offs)
        acc = metile.associative_scan(acc + x, 0, _add)
        srt = metile.sort(srt + x * 2, descending=True)
    metile.store(Y + offs, acc)
    metile.store(S + offs, srt)


@pytest.mark.parametrize("warps", [None, 1])
def test_scan_and_sort_of_loop_carried_tiles(warps):
    # one SIMD-group: each thread owns 8 of the 256 elements (several lane-loop slots)
    x, xn = _ints((3, 256), F32, 13, -5, 5)
    kw = {} if warps is None else {"num_warps": warps}
    y, s = carried_scan_and_sort[(1,)](x, mx.zeros((256,)), mx.zeros((256,)), 3, N=256, **kw)
    acc, srt = np.zeros(256), np.zeros(256)
    for row in xn:
        acc, srt = np.cumsum(acc + row), -np.sort(-(srt + 2 * row))
    np.testing.assert_array_equal(np.array(y), acc)
    np.testing.assert_array_equal(np.array(s), srt)


# -- join / split / interleave -----------------------------------------------------------------

@metile.kernel
def join_split(A, B, J, S0, S1, I, M: metile.constexpr, N: metile.constexpr):
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    a, b = metile.load(A + offs), metile.load(B + offs)
    j = metile.join(a, b)  # (M, N, 2)
    metile.store(J + offs[:, :, None] * 2 + metile.arange(0, 2)[None, None, :], j)
    # the pairs of a row-major (M, 2N) block: split its (M, N, 2) view
    p = metile.arange(0, M)[:, None] * (2 * N) + metile.arange(0, 2 * N)[None, :]
    s0, s1 = metile.split(metile.reshape(metile.load(A + p), (M, N, 2)))
    metile.store(S0 + offs, s0)
    metile.store(S1 + offs, s1 * 3)
    metile.store(I + p, metile.interleave(a, b))


@pytest.mark.parametrize("m,n", [(1, 1), (3, 33)])
@pytest.mark.parametrize("dtype", [F32, F16, I32], ids=_IDS)
def test_join_split_interleave(dtype, m, n):
    (a, an), (b, bn) = _ints((2 * m, n), dtype, 10), _ints((m, n), dtype, 11)
    j, s0, s1, i = join_split[(1,)](a, b, mx.zeros((m, n, 2), dtype), mx.zeros((m, n), dtype),
                                    mx.zeros((m, n), dtype), mx.zeros((m, 2 * n), dtype),
                                    M=m, N=n)
    a_block = an.reshape(-1)[:m * n].reshape(m, n)
    np.testing.assert_array_equal(_np(j), np.stack([a_block, bn], axis=-1))
    pairs = an.reshape(-1)[:2 * m * n].reshape(m, n, 2)
    np.testing.assert_array_equal(_np(s0), pairs[..., 0])
    np.testing.assert_array_equal(_np(s1), 3 * pairs[..., 1])
    np.testing.assert_array_equal(_np(i), np.stack([a_block, bn], -1).reshape(m, 2 * n))


@metile.kernel
def join_mixed(X, Y, Z, s, N: metile.constexpr):
    offs = metile.arange(0, N)
    x = metile.load(X + offs)
    j = metile.join(x, s)  # the scalar broadcasts: (N, 2)
    metile.store(Y + offs[:, None] * 2 + metile.arange(0, 2)[None, :], j)
    k = metile.join(s, s * 2)  # two scalars: a (2,) tile
    metile.store(Z + metile.arange(0, 2), k)
    back, _ = j.split()  # Triton's tensor method
    metile.store(X + offs, back + 1)


def test_join_broadcasts_and_joins_scalars():
    x = mx.arange(8).astype(F32)
    x2, y, z = join_mixed[(1,)](x, mx.zeros((8, 2)), mx.zeros((2,)), 2.5, N=8)
    np.testing.assert_array_equal(np.array(y), np.stack([np.arange(8), np.full(8, 2.5)], -1))
    np.testing.assert_array_equal(np.array(z), [2.5, 5.0])
    np.testing.assert_array_equal(np.array(x2), np.arange(8) + 1)


# -- reductions over any axis with keep_dims -----------------------------------------------------

@metile.kernel
def reduce_3d(X, S, MX, MN, A: metile.constexpr, B: metile.constexpr, C: metile.constexpr,
              AXIS: metile.constexpr):
    i = metile.arange(0, A)[:, None, None]
    j = metile.arange(0, B)[None, :, None]
    k = metile.arange(0, C)[None, None, :]
    offs = (i * B + j) * C + k
    x = metile.load(X + offs)
    # kept axes have extent 1: subtracting broadcasts the result back over them
    metile.store(S + offs, x - metile.sum(x, axis=AXIS, keep_dims=True))
    metile.store(MX + offs, x - metile.max(x, AXIS, keep_dims=True))
    metile.store(MN + offs, x - x.min(axis=AXIS, keep_dims=True))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, None])
def test_reductions_of_a_3d_tile_keep_dims(axis):
    x, xn = _ints((3, 4, 5), I32, 12, -20, 20)
    outs = reduce_3d[(1,)](x, *(mx.zeros((3, 4, 5), I32) for _ in range(3)), A=3, B=4, C=5,
                           AXIS=axis)
    for out, kind in zip(outs, ("sum", "max", "min")):
        ref = getattr(np, kind)(xn, axis=axis, keepdims=True)
        np.testing.assert_array_equal(np.array(out), xn - ref, err_msg=kind)


# -- refusals ----------------------------------------------------------------------------------

def _plain(a, b):
    return a + b


@metile.inline
def _three(a, b):
    return a, b, a


@metile.inline
def _to_float(a, b):
    return a + b * 0.5


@metile.inline
def _reads(a, b):
    return a + metile.sum(metile.arange(0, 4))


@metile.kernel
def bad(X, WHAT: metile.constexpr):
    x = metile.load(X + metile.arange(0, 4)[:, None] * 8 + metile.arange(0, 8)[None, :])
    i = metile.arange(0, 4)
    if WHAT == "plain":
        y = metile.associative_scan(x, 0, _plain)
    elif WHAT == "count":
        y = metile.associative_scan(x, 0, _three)
    elif WHAT == "dtype":
        y = metile.associative_scan(metile.cast(x, metile.int32), 1, _to_float)
    elif WHAT == "tile_op":
        y = metile.associative_scan(x, 0, _reads)
    elif WHAT == "shapes":
        y = metile.associative_scan((x, i), 0, _argmax_combine)
    elif WHAT == "axis":
        y = metile.associative_scan(x, 2, _add)
    elif WHAT == "sort_size":
        y = metile.sort(metile.load(X + metile.arange(0, 12)))
    elif WHAT == "sort_dim":
        y = metile.sort(x, 0)
    elif WHAT == "sort_bool":
        y = metile.sort(x > 0)
    else:
        y = metile.split(x)
    metile.store(X + metile.arange(0, 4)[:, None] * 8 + metile.arange(0, 8)[None, :], y)


@pytest.mark.parametrize("what,match", [
    ("plain", r"associative_scan\(\) combine_fn must be an @metile.inline function, got "
              r"function"),
    ("count", r"combine_fn _three returns 3 value\(s\) for 1 input tile\(s\)"),
    ("dtype", r"combine_fn _to_float result 0 is a runtime float32 value; it must be a int32 "
              r"scalar like input 0"),
    ("tile_op", r"combine_fn _reads may only compute on its scalar arguments; it uses arange"),
    ("shapes", r"associative_scan\(\) inputs must have one shape, got \(4, 8\), \(4,\)"),
    ("axis", r"associative_scan\(\) axis 2 is out of range for a rank-2 tile"),
    ("sort_size", r"sort\(\) sorts a power-of-two number of elements, at most 4096, along its "
                  r"axis \(a bitonic network\); got 12"),
    ("sort_dim", r"sort\(\) sorts along the last axis only \(dim=1 or -1\), got dim=0"),
    ("sort_bool", r"sort\(\) of a bool tile: cast it to int32 first"),
    ("split", r"split\(\) needs a last axis of extent 2, got a tile of shape \(4, 8\)"),
])
def test_bad_calls_are_refused_at_their_line(what, match):
    with pytest.raises(metile.CompilationError, match=match) as info:
        bad[(1,)](mx.zeros((64,)), WHAT=what)
    assert "test_scans_sort.py" in str(info.value)


# -- CUDA: the emitted source compiles ---------------------------------------------------------

_CUDA = {
    "tuple_scan": lambda: linear_recurrence[(1,)].prepare(
        mx.zeros((8, 40)), mx.zeros((8, 40)), mx.zeros((8, 40)), M=8, N=40, AXIS=1,
        REVERSE=True, backend="cuda"),
    "sort_f16": lambda: sort_row[(2,)].prepare(
        mx.zeros((2, 100), F16), mx.zeros((2, 100), F16), 100, FILL=float("inf"), DESC=False,
        BLOCK=128, backend="cuda"),
    "join_split": lambda: join_split[(1,)].prepare(
        mx.zeros((6, 8)), mx.zeros((3, 8)), mx.zeros((3, 8, 2)), mx.zeros((3, 8)),
        mx.zeros((3, 8)), mx.zeros((3, 16)), M=3, N=8, backend="cuda"),
    "keep_dims_3d": lambda: reduce_3d[(1,)].prepare(
        *(mx.zeros((3, 4, 5), I32) for _ in range(4)), A=3, B=4, C=5, AXIS=1, backend="cuda"),
}


@pytest.mark.skipif(TOOLKIT is None, reason="needs the nvidia-cuda-nvrtc wheels")
@pytest.mark.parametrize("case", sorted(_CUDA))
def test_generated_cuda_compiles(case):
    ok, log = compile_cuda(translation_unit(_CUDA[case]()), "sm_90")
    assert ok, f"{case}:\n{log}"
