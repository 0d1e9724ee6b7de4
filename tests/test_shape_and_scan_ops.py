"""Triton's shape ops (`trans`/`.T`/`permute`, `reshape`/`view`), index reductions
(`argmax`/`argmin`, `max(..., return_indices=True)`, `keep_dims`) and scans
(`cumsum`/`cumprod`) against NumPy on the CPU runtime, over dtypes and ragged
sizes.  The CUDA spellings are compile-checked in test_cuda_nvrtc.py."""

import mlx.core as mx
import numpy as np
import pytest

import metile

F32, F16, BF16, I32, U32, B = mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint32, mx.bool_
_IDS = lambda d: str(d).split(".")[-1]  # noqa: E731


def _values(shape, dtype, seed=0, low=-4, high=4):
    """(mx array, float64 NumPy copy) of values exact in `dtype`; integers in [low, high)."""
    rng = np.random.default_rng(seed)
    if dtype == B:
        a = mx.array(rng.integers(0, 2, shape).astype(bool))
    elif dtype in (I32, U32):
        a = mx.array(rng.integers(0 if dtype == U32 else low, high, shape)).astype(dtype)
    else:
        a = mx.array(rng.uniform(low, high, shape).astype(np.float32)).astype(dtype)
    return a, np.array(a.astype(F32) if dtype == BF16 else a).astype(np.float64)


def _np(a):
    return np.array(a.astype(F32) if a.dtype == BF16 else a).astype(np.float64)


# -- trans / .T / permute ----------------------------------------------------------------------

@metile.kernel
def transpose_tiles(X, Y, M, N, HOW: metile.constexpr, BM: metile.constexpr,
                    BN: metile.constexpr):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    x = metile.load(X + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N))
    if HOW == "T":
        y = x.T
    elif HOW == "trans":
        y = metile.trans(x)
    elif HOW == "permute":
        y = metile.permute(x, (1, 0))
    else:
        y = x.trans(1, 0)
    # y[j, i] = x[i, j], stored with the transposed tile's own index arithmetic
    metile.store(Y + rn[:, None] * M + rm[None, :], y * 2,
                 mask=(rn[:, None] < N) & (rm[None, :] < M))


@pytest.mark.parametrize("m,n", [(1, 1), (7, 9), (65, 33), (16, 100)])
@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32], ids=_IDS)
def test_transpose(dtype, m, n):
    x, xn = _values((m, n), dtype, 1)
    bm, bn = 16, 32
    y = transpose_tiles[(metile.cdiv(m, bm), metile.cdiv(n, bn))](
        x, mx.zeros((n, m), dtype), m, n, HOW="T", BM=bm, BN=bn)
    np.testing.assert_array_equal(_np(y), 2 * xn.T)


@pytest.mark.parametrize("how", ["trans", "permute", "method"])
def test_transpose_spellings(how):
    x, xn = _values((20, 40), F32, 2)
    y = transpose_tiles[(2, 2)](x, mx.zeros((40, 20)), 20, 40, HOW=how, BM=16, BN=32)
    np.testing.assert_array_equal(np.array(y), 2 * xn.T)


@metile.kernel
def permute3(X, Y, A: metile.constexpr, B: metile.constexpr, C: metile.constexpr,
             D0: metile.constexpr, D1: metile.constexpr, D2: metile.constexpr):
    i = metile.arange(0, A)[:, None, None]
    j = metile.arange(0, B)[None, :, None]
    k = metile.arange(0, C)[None, None, :]
    x = metile.load(X + (i * B + j) * C + k)
    y = metile.permute(x, D0, D1, D2)
    s = y.shape
    p = metile.arange(0, s[0])[:, None, None]
    q = metile.arange(0, s[1])[None, :, None]
    r = metile.arange(0, s[2])[None, None, :]
    metile.store(Y + (p * s[1] + q) * s[2] + r, y)


@pytest.mark.parametrize("dims", [(0, 2, 1), (2, 0, 1), (1, 2, 0), (2, 1, 0)])
def test_permute_three_axes(dims):
    x, xn = _values((3, 4, 5), F32, 3)
    ref = np.transpose(xn.reshape(3, 4, 5), dims)
    y = permute3[(1,)](x, mx.zeros(ref.shape), A=3, B=4, C=5, D0=dims[0], D1=dims[1],
                       D2=dims[2])
    np.testing.assert_array_equal(np.array(y), ref)


@metile.kernel
def scores(Q, K, S, M: metile.constexpr, N: metile.constexpr, D: metile.constexpr):
    q = metile.load(Q + metile.arange(0, M)[:, None] * D + metile.arange(0, D)[None, :])
    k = metile.load(K + metile.arange(0, N)[:, None] * D + metile.arange(0, D)[None, :])
    s = metile.dot(q, metile.trans(k))
    metile.store(S + metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :], s)


@pytest.mark.parametrize("dtype", [F32, F16], ids=_IDS)
def test_dot_with_a_transposed_operand(dtype):
    (q, qn), (k, kn) = _values((16, 8), dtype, 4), _values((24, 8), dtype, 5)
    s = scores[(1,)](q, k, mx.zeros((16, 24)), M=16, N=24, D=8)
    np.testing.assert_allclose(np.array(s), qn @ kn.T, rtol=3e-4, atol=3e-5)


@metile.kernel
def matmul_bt(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
              BK: metile.constexpr):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        a = metile.load(A + rm[:, None] * K + rk[None, :],
                        mask=(rm[:, None] < M) & (rk[None, :] < K))
        bt = metile.load(B + rn[:, None] * K + rk[None, :],
                         mask=(rn[:, None] < N) & (rk[None, :] < K))
        acc = metile.dot(a, bt.T, acc)  # B stored (N, K), as nn.Linear's weight
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.mark.parametrize("m,n,k", [(40, 36, 20), (1, 7, 9)])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=_IDS)
def test_gemm_loop_with_a_transposed_operand(dtype, m, n, k):
    (a, an), (b, bn) = _values((m, k), dtype, 14), _values((n, k), dtype, 15)
    c = matmul_bt[(metile.cdiv(m, 32), metile.cdiv(n, 32))](a, b, mx.zeros((m, n)), m, n, k,
                                                            BM=32, BN=32, BK=16)
    np.testing.assert_allclose(np.array(c), an @ bn.T, rtol=3e-4, atol=3e-5)


# -- reshape / view ----------------------------------------------------------------------------

@metile.kernel
def row_sums_of_a_flat_block(X, Y, Z, n, M: metile.constexpr, N: metile.constexpr,
                             HOW: metile.constexpr):
    offs = metile.arange(0, M * N)
    x = metile.load(X + offs, mask=offs < n)
    if HOW == "reshape":
        t = metile.reshape(x, (M, N))
    elif HOW == "view":
        t = metile.view(x, M, N)
    else:
        t = x.reshape(M, -1)
    metile.store(Y + metile.arange(0, M), metile.sum(t, axis=1))
    # back to 1-D: an elementwise value through two reshapes keeps its elements
    back = (t * 3).reshape(M * N)
    metile.store(Z + offs, back, mask=offs < n)


@pytest.mark.parametrize("n", [1, 7, 63, 128])
@pytest.mark.parametrize("how", ["reshape", "view", "method"])
def test_reshape_keeps_row_major_order(how, n):
    x, xn = _values((n,), F32, 6)
    y, z = row_sums_of_a_flat_block[(1,)](x, mx.zeros((8,)), mx.zeros((n,)), n, M=8, N=16,
                                           HOW=how)
    padded = np.zeros(128)
    padded[:n] = xn
    np.testing.assert_allclose(np.array(y), padded.reshape(8, 16).sum(1), rtol=3e-4, atol=3e-5)
    np.testing.assert_array_equal(np.array(z), (3 * xn).astype(np.float32))


@metile.kernel
def regroup(X, Y, A: metile.constexpr, B: metile.constexpr, C: metile.constexpr,
            D: metile.constexpr):
    x = metile.load(X + metile.arange(0, A)[:, None] * B + metile.arange(0, B)[None, :])
    y = metile.trans(metile.reshape(x, (C, D)))  # a reshape read at other coordinates
    metile.store(Y + metile.arange(0, D)[:, None] * C + metile.arange(0, C)[None, :], y)


@pytest.mark.parametrize("dtype", [F32, F16, I32], ids=_IDS)
@pytest.mark.parametrize("a,b,c,d", [(4, 6, 8, 3), (2, 32, 16, 4), (1, 5, 5, 1)])
def test_reshape_then_transpose(dtype, a, b, c, d):
    x, xn = _values((a, b), dtype, 7)
    y = regroup[(1,)](x, mx.zeros((d, c), dtype), A=a, B=b, C=c, D=d)
    np.testing.assert_array_equal(_np(y), xn.reshape(c, d).T)


# -- argmax / argmin ---------------------------------------------------------------------------

@metile.kernel
def row_argmax(X, I, J, V, n, FILL: metile.constexpr, KIND: metile.constexpr,
               LEFT: metile.constexpr, BLOCK: metile.constexpr):
    row = metile.program_id(0)
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + row * n + offs, mask=offs < n, other=FILL)
    if KIND == "max":
        i = metile.argmax(x, 0, tie_break_left=LEFT)
        v, j = metile.max(x, 0, return_indices=True, return_indices_tie_break_left=LEFT)
    else:
        i = metile.argmin(x, axis=0, tie_break_left=LEFT)
        v, j = metile.min(x, 0, return_indices=True, return_indices_tie_break_left=LEFT)
    metile.store(I + row, i)
    metile.store(J + row, j)
    metile.store(V + row, v)


def _arg(xn, kind, left, axis=-1):
    """NumPy's first index; with left=False the last one."""
    f = np.argmax if kind == "max" else np.argmin
    if left:
        return f(xn, axis=axis)
    flipped = np.flip(xn, axis=axis)
    return xn.shape[axis] - 1 - f(flipped, axis=axis)


_FILL = {"max": {F32: float("-inf"), F16: float("-inf"), BF16: float("-inf"), I32: -2**31, U32: 0},
         "min": {F32: float("inf"), F16: float("inf"), BF16: float("inf"), I32: 2**31 - 1,
                 U32: 2**32 - 1}}


_ROW_CASES = [(d, n, block) for d in (F32, F16, BF16, I32, U32) for n, block in
              ((7, 32), (1000, 1024))] + [(F32, 1, 32), (I32, 65, 128)]


@pytest.mark.parametrize("dtype,n,block", _ROW_CASES, ids=str)
@pytest.mark.parametrize("kind", ["max", "min"])
def test_argmax_argmin_of_rows(kind, dtype, n, block):
    # few distinct values, so ties are common: the smallest index wins (Triton's rule)
    x, xn = _values((3, n), dtype, 8, low=-3, high=3)
    if dtype in (F32, F16, BF16):
        x, xn = mx.round(x), np.round(xn)
    if dtype == U32:  # above the padding's 0, which would tie with a 0 for left=False
        x, xn = x + 1, xn + 1
    for left in (True, False):
        i, j, v = row_argmax[(3,)](x, mx.zeros((3,), I32), mx.zeros((3,), I32),
                                   mx.zeros((3,), dtype), n, FILL=_FILL[kind][dtype], KIND=kind,
                                   LEFT=left, BLOCK=block)
        ref = _arg(xn, kind, left)
        np.testing.assert_array_equal(np.array(i), ref)
        np.testing.assert_array_equal(np.array(j), ref)
        np.testing.assert_array_equal(_np(v), xn.max(1) if kind == "max" else xn.min(1))


@metile.kernel
def arg_axes(X, R, C, F, K, M: metile.constexpr, N: metile.constexpr, LEFT: metile.constexpr):
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    x = metile.load(X + offs)
    metile.store(R + metile.arange(0, M), metile.argmax(x, 1, tie_break_left=LEFT))
    metile.store(C + metile.arange(0, N), x.argmin(0, tie_break_left=LEFT))
    metile.store(F, metile.argmax(x, None, tie_break_left=LEFT))
    kept = metile.argmin(x, 1, keep_dims=True)  # (M, 1)
    metile.store(K + metile.arange(0, M)[:, None], kept)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("m,n", [(4, 8), (3, 50), (33, 2)])
@pytest.mark.parametrize("dtype", [F32, I32], ids=_IDS)
def test_argmax_argmin_along_axes(dtype, m, n, left):
    x, xn = _values((m, n), dtype, 9, low=-2, high=2)
    if dtype == F32:
        x, xn = mx.round(x), np.round(xn)
    r, c, f, k = arg_axes[(1,)](x, mx.zeros((m,), I32), mx.zeros((n,), I32), mx.zeros((1,), I32),
                                mx.zeros((m,), I32), M=m, N=n, LEFT=left)
    np.testing.assert_array_equal(np.array(r), _arg(xn, "max", left, 1))
    np.testing.assert_array_equal(np.array(c), _arg(xn, "min", left, 0))
    np.testing.assert_array_equal(np.array(f), [_arg(xn.reshape(-1), "max", left, 0)])
    np.testing.assert_array_equal(np.array(k), _arg(xn, "min", True, 1))


@metile.kernel
def kept_sums(X, S, T, M: metile.constexpr, N: metile.constexpr):
    x = metile.load(X + metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :])
    s = metile.sum(x, axis=1, keep_dims=True)  # (M, 1): broadcasts back over the rows
    metile.store(S + metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :], x - s)
    t = metile.max(x, keep_dims=True)  # (1, 1)
    metile.store(T + metile.arange(0, 1)[:, None] + metile.arange(0, 1)[None, :], t)


def test_reductions_keep_dims():
    x, xn = _values((6, 10), F32, 10)
    s, t = kept_sums[(1,)](x, mx.zeros((6, 10)), mx.zeros((1, 1)), M=6, N=10)
    np.testing.assert_allclose(np.array(s), xn - xn.sum(1, keepdims=True), rtol=3e-4, atol=3e-5)
    np.testing.assert_array_equal(np.array(t), xn.max(keepdims=True))


# -- cumsum / cumprod --------------------------------------------------------------------------

@metile.kernel
def scan_rows(X, Y, n, KIND: metile.constexpr, REVERSE: metile.constexpr,
              BLOCK: metile.constexpr):
    row = metile.program_id(0)
    offs = metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + row * n + offs, mask=m, other=1 if KIND == "prod" else 0)
    if KIND == "sum":
        y = metile.cumsum(x, 0, reverse=REVERSE)
    else:
        y = x.cumprod(axis=0, reverse=REVERSE)
    metile.store(Y + row * n + offs, y, mask=m)


def _scan_ref(xn, kind, reverse, axis=-1):
    f = np.cumsum if kind == "sum" else np.cumprod
    if reverse:
        return np.flip(f(np.flip(xn, axis), axis=axis), axis)
    return f(xn, axis=axis)


@pytest.mark.parametrize("n,block", [(1, 32), (7, 32), (65, 128), (1000, 1024)])
@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32], ids=_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(dtype, n, block, reverse):
    x, xn = _values((2, n), dtype, 11)
    y = scan_rows[(2,)](x, mx.zeros((2, n), dtype), n, KIND="sum", REVERSE=reverse, BLOCK=block)
    ref = _scan_ref(xn, "sum", reverse)
    # floats accumulate in float32 and round once to the output dtype
    rtol, atol = {F32: (3e-4, 3e-4), F16: (1e-3, 4e-3), BF16: (8e-3, 3e-2)}.get(dtype, (0, 0))
    if dtype in (F16, BF16):  # the rounding of the exact running sum, ulp-scale
        ref32 = np.array(mx.array(ref.astype(np.float32)).astype(dtype).astype(F32))
        np.testing.assert_allclose(_np(y), ref32, rtol=rtol, atol=atol)
    else:
        np.testing.assert_allclose(_np(y), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("n", [1, 9, 100])
@pytest.mark.parametrize("dtype", [F32, I32], ids=_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_cumprod(dtype, n, reverse):
    rng = np.random.default_rng(12)
    if dtype == I32:  # products stay inside int32: mostly ones, a few -1 and 2
        xn = rng.choice([1, 1, 1, -1, 2], size=(2, n)).astype(np.float64)
        xn[:, 20:] = np.where(xn[:, 20:] == 2, 1, xn[:, 20:])
    else:
        xn = rng.uniform(0.9, 1.1, (2, n))
    x = mx.array(xn.astype(np.float32)).astype(dtype)
    xn = np.array(x).astype(np.float64)
    y = scan_rows[(2,)](x, mx.zeros((2, n), dtype), n, KIND="prod", REVERSE=reverse, BLOCK=128)
    np.testing.assert_allclose(np.array(y), _scan_ref(xn, "prod", reverse), rtol=3e-4,
                               atol=3e-5)


@metile.kernel
def scan_axes(X, A0, A1, C, M: metile.constexpr, N: metile.constexpr):
    offs = metile.arange(0, M)[:, None] * N + metile.arange(0, N)[None, :]
    x = metile.load(X + offs)
    metile.store(A0 + offs, metile.cumsum(x, axis=0))
    metile.store(A1 + offs, metile.cumsum(x, axis=-1, reverse=True))
    metile.store(C + offs, metile.cumsum(x > 0, 1))  # bool scans as int32


@pytest.mark.parametrize("m,n", [(1, 5), (4, 8), (9, 33)])
def test_cumsum_along_axes(m, n):
    x, xn = _values((m, n), I32, 13, low=-5, high=5)
    a0, a1, c = scan_axes[(1,)](x, mx.zeros((m, n), I32), mx.zeros((m, n), I32),
                                mx.zeros((m, n), I32), M=m, N=n)
    np.testing.assert_array_equal(np.array(a0), np.cumsum(xn, 0))
    np.testing.assert_array_equal(np.array(a1), _scan_ref(xn, "sum", True, 1))
    np.testing.assert_array_equal(np.array(c), np.cumsum(xn > 0, 1))


@metile.kernel
def carried(X, Y, Z, n):
    acc = metile.zeros((4, 8), dtype=metile.float32)
    run = metile.zeros((32,), dtype=metile.float32)
    for i in range(0, n):
        x = metile.load(X + i * 32 + metile.arange(0, 32))
        acc += x.reshape(4, 8)
        run = metile.cumsum(run + x, 0)
    metile.store(Y + metile.arange(0, 8)[:, None] * 4 + metile.arange(0, 4)[None, :], acc.T)
    metile.store(Z + metile.arange(0, 32), run)


@pytest.mark.parametrize("n", [1, 3])
def test_shape_ops_and_scans_on_loop_carried_tiles(n):
    x, xn = _values((n, 32), F32, 16)
    y, z = carried[(1,)](x, mx.zeros((8, 4)), mx.zeros((32,)), n)
    np.testing.assert_allclose(np.array(y), xn.sum(0).reshape(4, 8).T, rtol=3e-4, atol=3e-5)
    run = np.zeros(32)
    for row in xn:
        run = np.cumsum(run + row)
    np.testing.assert_allclose(np.array(z), run, rtol=3e-4, atol=3e-5)


# -- refusals ----------------------------------------------------------------------------------

@metile.kernel
def bad_shape_op(X, WHAT: metile.constexpr):
    x = metile.load(X + metile.arange(0, 4)[:, None] * 8 + metile.arange(0, 8)[None, :])
    if WHAT == "dims":
        y = metile.permute(x, (0, 0))
    elif WHAT == "reshape":
        y = metile.reshape(x, (3, 8))
    elif WHAT == "trans1d":
        y = metile.trans(metile.load(X + metile.arange(0, 8)))
    elif WHAT == "T3d":
        y = x[:, :, None].T
    elif WHAT == "scan_axis":
        y = metile.cumsum(x, 2)
    elif WHAT == "argmax_bool":
        y = metile.argmax(x > 0, 0)
    else:
        y = metile.sum(x, 0, return_indices=True)
    metile.store(X + metile.arange(0, 4)[:, None] * 8 + metile.arange(0, 8)[None, :], y)


@pytest.mark.parametrize("what,match", [
    ("dims", r"permute\(\) dims \(0, 0\) are not a permutation of the 2 axes of a "
             r"tile<4x8, float32>"),
    ("reshape", r"reshape\(\): a tile of shape \(4, 8\) \(32 elements\) cannot take the shape "
                r"\(3, 8\)"),
    ("trans1d", r"trans\(\) without dims needs a 2-D tile, got a tile<8, float32> tile"),
    ("T3d", r"\.T needs a 2-D tile, got a tile<4x8x1, float32> tile"),
    ("scan_axis", r"cumsum\(\) axis 2 is out of range for a rank-2 tile"),
    ("argmax_bool", r"argmax\(\) is not defined on tile<4x8, bool>"),
    ("indices", r"sum\(\) has no return_indices"),
])
def test_shape_and_scan_errors(what, match):
    with pytest.raises(metile.CompilationError, match=match) as info:
        bad_shape_op[(1,)](mx.zeros((32,)), WHAT=what)
    assert "test_shape_and_scan_ops.py:" in str(info.value)


# -- `...` in a tile index (a hostile trial: `x[..., None]` was refused as "element access",
# as was `x[:2]`, which is no element access either) -------------------------------------

@metile.kernel
def ellipsis_index(X, Out, M: metile.constexpr, N: metile.constexpr):
    rm = metile.arange(0, M)
    rn = metile.arange(0, N)
    x = metile.load(X + rm[:, None] * N + rn[None, :])
    a = x[..., None]        # (M, N, 1)
    b = x[None, ...]        # (1, M, N)
    c = x[:, None, ...]     # (M, 1, N)
    d = x[...]
    metile.static_assert(a.shape == (M, N, 1) and b.shape == (1, M, N) and c.shape == (M, 1, N))
    s = metile.sum(a * 1.0, axis=2) + metile.sum(b * 10.0, axis=0) \
        + metile.sum(c * 100.0, axis=1) + d * 1000.0
    metile.store(Out + rm[:, None] * N + rn[None, :], s)


def test_ellipsis_in_a_tile_index_is_numpys():
    x = np.arange(15, dtype=np.float32).reshape(3, 5) - 7
    out = ellipsis_index[(1,)](mx.array(x), mx.zeros((15,)), M=3, N=5)
    np.testing.assert_array_equal(np.array(out).reshape(3, 5), x * 1111)


@metile.kernel
def partial_slice(X, Out, N: metile.constexpr):
    x = metile.load(X + metile.arange(0, N))
    metile.store(Out + metile.arange(0, 2), x[:2])


def test_a_partial_slice_of_a_tile_is_named():
    with pytest.raises(metile.CompilationError, match=r"tiles can only be indexed with None, ':' "
                                                      r"and '...' .*slicing part of an axis is "
                                                      r"not supported"):
        partial_slice[(1,)](mx.zeros((4,)), mx.zeros((4,)), N=4)
