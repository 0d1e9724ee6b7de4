"""Triton's smaller `tl` names (issue 15): load/store hints, dot's precision keywords,
maximum/minimum/clamp propagate_nan, sum(dtype=), the shape helpers (flip, ravel, squeeze,
unsqueeze, cat, broadcast, zeros_like, swizzle2d), the reductions xor_sum, reduce_or and
reduce(combine_fn), and TRITON_MAX_TENSOR_NUMEL, against NumPy on the CPU runtime; the CUDA
emission of each is compiled with NVRTC."""

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import metile

sys.path.insert(0, str(Path(__file__).parent))
import nvrtc  # noqa: E402

PN = metile.PropagateNan


# -- load/store hints ---------------------------------------------------------------------

@metile.kernel
def hinted_copy(X, Y, n, BLOCK: metile.constexpr, LC: metile.constexpr, LE: metile.constexpr,
                SC: metile.constexpr, SE: metile.constexpr):
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + i, mask=i < n, other=-1.0, cache_modifier=LC, eviction_policy=LE,
                    volatile=True)
    metile.store(Y + i, x * 2, mask=i < n, cache_modifier=SC, eviction_policy=SE)


@pytest.mark.parametrize("lc,le,sc,se", [(".ca", "evict_last", ".wb", ""),
                                         (".cg", "evict_first", ".cs", "evict_last"),
                                         (".cv", "", ".wt", "evict_first"),
                                         ("", "", ".cg", "")])
def test_load_store_hints_change_nothing(lc, le, sc, se):
    x = mx.array(np.arange(10, dtype=np.float32))
    y = hinted_copy[(3,)](x, mx.zeros((10,)), 10, BLOCK=4, LC=lc, LE=le, SC=sc, SE=se)
    np.testing.assert_array_equal(np.array(y), 2 * np.arange(10))


@pytest.mark.parametrize("kw,match", [
    (dict(LC=".wb"), r"load\(\): cache_modifier='\.wb' is not one of Triton's load cache "
                     r"modifiers '\.ca', '\.cg', '\.cv'"),
    (dict(SC=".ca"), r"store\(\): cache_modifier='\.ca' is not one of Triton's store cache "
                     r"modifiers '\.wb', '\.cg', '\.cs', '\.wt'"),
    (dict(LE="evict_normal"), r"load\(\): eviction_policy='evict_normal' is not one of "
                              r"'evict_last', 'evict_first'"),
])
def test_unknown_hints_are_refused(kw, match):
    args = dict(LC="", LE="", SC="", SE="") | kw
    with pytest.raises(metile.CompilationError, match=match):
        hinted_copy[(1,)](mx.zeros((4,)), mx.zeros((4,)), 4, BLOCK=4, **args)


def test_block_pointer_load_takes_the_hints():
    @metile.kernel
    def bp(X, Y):
        p = metile.make_block_ptr(X, (3, 5), (5, 1), (0, 0), (4, 8), (1, 0))
        x = metile.load(p, boundary_check=(0, 1), cache_modifier=".cg", eviction_policy="evict_last")
        q = metile.make_block_ptr(Y, (3, 5), (5, 1), (0, 0), (4, 8), (1, 0))
        metile.store(q, x + 1, boundary_check=(0, 1), cache_modifier=".cs")

    x = mx.array(np.arange(15, dtype=np.float32))
    np.testing.assert_array_equal(np.array(bp[(1,)](x, mx.zeros((15,)))), np.arange(15) + 1)


# -- dot keywords ------------------------------------------------------------------------------

@metile.kernel
def dot_kw(A, B, C, HOW: metile.constexpr, M: metile.constexpr, N: metile.constexpr,
           K: metile.constexpr):
    a = metile.load(A + _idx_inline(M, K))
    b = metile.load(B + _idx_inline(K, N))
    if HOW == "ieee":
        c = metile.dot(a, b, input_precision="ieee", out_dtype=metile.float32)
    elif HOW == "tf32":
        c = metile.dot(a, b, None, "tf32", max_num_imprecise_acc=0)
    elif HOW == "tf32x3":
        c = metile.dot(a, b, input_precision="tf32x3")
    elif HOW == "allow":
        c = metile.dot(a, b, allow_tf32=False)
    elif HOW == "both":
        c = metile.dot(a, b, input_precision="ieee", allow_tf32=True)
    elif HOW == "bad":
        c = metile.dot(a, b, input_precision="fp64")
    elif HOW == "f16":
        c = metile.dot(a, b, out_dtype=metile.float16)
    else:
        c = metile.dot(a, b, max_num_imprecise_acc=-1)
    metile.store(C + _idx_inline(M, N), c)


@metile.inline
def _idx_inline(m: metile.constexpr, n: metile.constexpr):
    return metile.arange(0, m)[:, None] * n + metile.arange(0, n)[None, :]


@pytest.mark.parametrize("how", ["ieee", "tf32", "tf32x3", "allow"])
def test_dot_precision_keywords(how):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 8), np.float32)
    c = dot_kw[(1,)](mx.array(a), mx.array(b), mx.zeros((8, 8)), HOW=how, M=8, N=8, K=16)
    np.testing.assert_allclose(np.array(c), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("how,match", [
    ("both", r"dot\(\): only one of input_precision= and allow_tf32= can be given"),
    ("bad", r"dot\(\): input_precision='fp64' is not one of 'tf32', 'tf32x3', 'ieee'"),
    ("f16", r"dot\(\): out_dtype=float16 is not built: metile accumulates in float32"),
    ("neg", r"dot\(\): max_num_imprecise_acc= must be a constexpr int >= 0, got int -1"),
])
def test_dot_keywords_refused(how, match):
    with pytest.raises(metile.CompilationError, match=match):
        dot_kw[(1,)](mx.zeros((128,)), mx.zeros((128,)), mx.zeros((64,)), HOW=how, M=8, N=8,
                     K=16)


def test_ieee_contradicts_relaxed_precision():
    @metile.kernel
    def relaxed(A, C, RELAXED_PRECISION: metile.constexpr):
        a = metile.load(A + _idx_inline(16, 16))
        metile.store(C + _idx_inline(16, 16), metile.dot(a, a, input_precision="ieee"))

    with pytest.raises(metile.CompilationError, match=r"input_precision='ieee' \(or "
                       r"allow_tf32=False\) contradicts the kernel's RELAXED_PRECISION=True"):
        relaxed[(1,)](mx.zeros((256,)), mx.zeros((256,)), RELAXED_PRECISION=True)


# -- propagate_nan, sum(dtype=) --------------------------------------------------------------

@metile.kernel
def nan_ops(X, Y, Z, HOW: metile.constexpr, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    x, y = metile.load(X + i), metile.load(Y + i)
    if HOW == "max_none":
        z = metile.maximum(x, y, propagate_nan=metile.PropagateNan.NONE)
    elif HOW == "max_all":
        z = metile.maximum(x, y, propagate_nan=metile.PropagateNan.ALL)
    elif HOW == "min_none":
        z = metile.minimum(x, y, PN.NONE)
    elif HOW == "min_all":
        z = metile.minimum(x, y, PN.ALL)
    elif HOW == "max_default":
        z = metile.maximum(x, y)
    elif HOW == "max_scalar_all":
        z = metile.maximum(x, 0.5, propagate_nan=PN.ALL)
    elif HOW == "clamp_all":
        z = metile.clamp(x, -1.0, 1.0, propagate_nan=PN.ALL)
    elif HOW == "clamp_none":
        z = metile.clamp(x, -1.0, 1.0)
    else:
        z = metile.maximum(x, y, propagate_nan=True)
    metile.store(Z + i, z)


_X = np.array([1.0, np.nan, 3.0, np.nan, -2.0, 0.0, 5.0, -7.0], np.float32)
_Y = np.array([np.nan, 2.0, 1.0, np.nan, -3.0, 4.0, np.inf, -np.inf], np.float32)
_NAN_REF = {"max_none": np.fmax(_X, _Y), "max_all": np.maximum(_X, _Y),
            "min_none": np.fmin(_X, _Y), "min_all": np.minimum(_X, _Y),
            "max_default": np.fmax(_X, _Y), "max_scalar_all": np.maximum(_X, 0.5),
            "clamp_all": np.clip(_X, -1, 1), "clamp_none": np.fmin(np.fmax(_X, -1), 1)}


@pytest.mark.parametrize("how", list(_NAN_REF))
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_propagate_nan(how, dtype):
    z = nan_ops[(1,)](mx.array(_X).astype(dtype), mx.array(_Y).astype(dtype),
                      mx.zeros((8,), dtype), HOW=how, BLOCK=8)
    np.testing.assert_array_equal(np.array(z.astype(mx.float32)), _NAN_REF[how])


def test_propagate_nan_refuses_other_values():
    with pytest.raises(metile.CompilationError, match=r"maximum\(\) propagate_nan must be "
                       r"metile.PropagateNan.NONE or .ALL, got bool True"):
        nan_ops[(1,)](mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), HOW="bad", BLOCK=8)


def test_integer_maximum_ignores_propagate_nan():
    @metile.kernel
    def imax(X, Z):
        i = metile.arange(0, 8)
        metile.store(Z + i, metile.maximum(metile.load(X + i), 3, propagate_nan=PN.ALL))

    x = np.arange(-4, 4, dtype=np.int32)
    z = imax[(1,)](mx.array(x), mx.zeros((8,), mx.int32))
    np.testing.assert_array_equal(np.array(z), np.maximum(x, 3))


@metile.kernel
def sums(X, Y, Z, M: metile.constexpr, N: metile.constexpr):
    x = metile.load(X + _idx_inline(M, N))
    metile.store(Y + metile.arange(0, N)[None, :], metile.sum(x, 0, True, metile.float32))
    metile.store(Z, metile.sum(x, dtype=metile.int32))


def test_sum_dtype_casts_first_and_keep_dims_is_third():
    x = np.random.default_rng(2).uniform(-3, 3, (4, 8)).astype(np.float16)
    y, z = sums[(1,)](mx.array(x), mx.zeros((8,)), mx.zeros((1,), mx.int32), M=4, N=8)
    assert y.dtype == mx.float32 and z.dtype == mx.int32
    np.testing.assert_allclose(np.array(y), x.astype(np.float32).sum(0), rtol=1e-6, atol=1e-6)
    assert int(np.array(z)[0]) == x.astype(np.int32).sum()  # truncated, then summed


# -- shape helpers -----------------------------------------------------------------------------

@metile.kernel
def shapes(X, Y, WHAT: metile.constexpr, M: metile.constexpr, N: metile.constexpr):
    x = metile.load(X + _idx_inline(M, N))
    if WHAT == "flip":
        y = metile.flip(x)
    elif WHAT == "flip0":
        y = metile.flip(x, 0)
    elif WHAT == "flip-1":
        y = metile.flip(x, -1)
    elif WHAT == "flip1d":
        y = metile.reshape(metile.flip(metile.ravel(x)), (M, N))
    elif WHAT == "squeeze":
        y = metile.squeeze(metile.unsqueeze(x, 1), 1) * 3
    elif WHAT == "unsqueeze":
        y = metile.sum(metile.unsqueeze(x, 0), 0)
    elif WHAT == "broadcast":
        col, row = metile.broadcast(metile.sum(x, 1)[:, None], metile.arange(0, N)[None, :])
        y = col + row
    elif WHAT == "zeros_like":
        z = metile.zeros_like(x)
        y = z + metile.zeros_like(metile.sum(x)) + 1
    else:
        y = x
    metile.store(Y + _idx_inline(M, N), y)


_SHAPES = {"flip": lambda x: x[:, ::-1], "flip0": lambda x: x[::-1], "flip-1": lambda x: x[:, ::-1],
           "flip1d": lambda x: x.ravel()[::-1].reshape(x.shape), "squeeze": lambda x: 3 * x,
           "unsqueeze": lambda x: x,
           "broadcast": lambda x: x.sum(1)[:, None] + np.arange(x.shape[1])[None, :],
           "zeros_like": lambda x: np.ones_like(x)}


@pytest.mark.parametrize("what", list(_SHAPES))
@pytest.mark.parametrize("m,n", [(4, 8), (3, 5)])
def test_shape_helpers(what, m, n):
    x = np.arange(m * n, dtype=np.int32).reshape(m, n) * 7 % 11
    y = shapes[(1,)](mx.array(x), mx.zeros((m, n), mx.int32), WHAT=what, M=m, N=n)
    np.testing.assert_array_equal(np.array(y), _SHAPES[what](x))


@metile.kernel
def cats(A, B, Y, M: metile.constexpr, K: metile.constexpr, N: metile.constexpr):
    a = metile.load(A + _idx_inline(M, N))
    b = metile.load(B + _idx_inline(K, N))
    c = metile.cat(a, b, can_reorder=True)
    metile.store(Y + _idx_inline(M + K, N), c)


@pytest.mark.parametrize("m,k,n", [(4, 4, 1), (3, 5, 1), (2, 6, 4), (8, 1, 3)])
def test_cat_along_axis0(m, k, n):
    a = np.arange(m * n, dtype=np.float32).reshape(m, n)
    b = -np.arange(k * n, dtype=np.int32).reshape(k, n) - 1
    if n == 1:
        a, b = a.ravel(), b.ravel()
    y = cats[(1,)](mx.array(a.ravel()), mx.array(b.ravel()), mx.zeros(((m + k) * n,)), M=m, K=k,
                   N=n)
    assert y.dtype == mx.float32  # float32 with int32 promotes, as Triton's operands
    np.testing.assert_array_equal(np.array(y), np.concatenate([a, b]).ravel())


@metile.kernel
def cat1d(A, Y, N: metile.constexpr, REORDER: metile.constexpr):
    a = metile.load(A + metile.arange(0, N))
    metile.store(Y + metile.arange(0, 2 * N), metile.cat(a, a * 10, REORDER))


def test_cat_keeps_order_either_way():
    a = np.arange(1, 9, dtype=np.int32)
    for reorder in (False, True):
        y = cat1d[(1,)](mx.array(a), mx.zeros((16,), mx.int32), N=8, REORDER=reorder)
        np.testing.assert_array_equal(np.array(y), np.concatenate([a, 10 * a]))


def _swizzle_ref(i, j, size_i, size_j, size_g):
    """Triton's tl.swizzle2d in NumPy (non-negative operands)."""
    ij = i * size_j + j
    size_gj = size_g * size_j
    group_id = ij // size_gj
    off_i = group_id * size_g
    size_g = np.minimum(size_i - off_i, size_g)
    ij = ij % size_gj
    return off_i + ij % size_g, ij // size_g


@metile.kernel
def swizzle(I, J, si, sj, G: metile.constexpr, M: metile.constexpr, N: metile.constexpr):
    i = metile.arange(0, M)[:, None] + metile.zeros((M, N), metile.int32)
    j = metile.arange(0, N)[None, :] + metile.zeros((M, N), metile.int32)
    ni, nj = metile.swizzle2d(i, j, si, sj, G)
    metile.store(I + _idx_inline(M, N), ni)
    metile.store(J + _idx_inline(M, N), nj)
    # all-constant operands fold at compile time
    ci, cj = metile.swizzle2d(3, 2, 5, 4, 2)
    metile.static_assert(ci == 2 and cj == 3)  # Triton: ij 14, group 1, rows 2..3


@pytest.mark.parametrize("m,n,g", [(5, 4, 2), (8, 8, 3), (7, 3, 7), (4, 6, 1)])
def test_swizzle2d(m, n, g):
    ii, jj = swizzle[(1,)](mx.zeros((m, n), mx.int32), mx.zeros((m, n), mx.int32), m, n, G=g,
                           M=m, N=n)
    ri, rj = _swizzle_ref(*np.meshgrid(np.arange(m), np.arange(n), indexing="ij"), m, n, g)
    np.testing.assert_array_equal(np.array(ii), ri)
    np.testing.assert_array_equal(np.array(jj), rj)
    # a bijection of the m x n grid
    assert len({(a, b) for a, b in zip(np.array(ii).ravel(), np.array(jj).ravel())}) == m * n


@metile.kernel
def bad_shape(X, WHAT: metile.constexpr):
    x = metile.load(X + _idx_inline(4, 8))
    if WHAT == "flip_dim":
        y = metile.flip(x, 2)
    elif WHAT == "squeeze":
        y = metile.squeeze(x, 0)
    elif WHAT == "cat":
        y = metile.cat(x, metile.load(X + _idx_inline(4, 4)))
    elif WHAT == "swizzle":
        y, _ = metile.swizzle2d(x, 0, 4, 8, 2)
    else:
        y = metile.zeros_like(X)
    metile.store(X + _idx_inline(4, 8), y)


@pytest.mark.parametrize("what,match", [
    ("flip_dim", r"flip\(\) dim 2 is out of range for a rank-2 tile"),
    ("squeeze", r"squeeze\(\) dim 0 has extent 4 in a tile of shape \(4, 8\); only an axis of "
                r"extent 1 can be removed"),
    ("cat", r"cat\(\) concatenates along axis 0 tiles whose other extents agree, got shapes "
            r"\(4, 8\) and \(4, 4\)"),
    ("swizzle", r"swizzle2d\(\) i must be an integer, got a tile<4x8, float32> tile"),
    ("zeros_like", r"zeros_like\(\) needs a tile or a runtime scalar"),
])
def test_shape_helper_errors(what, match):
    with pytest.raises(metile.CompilationError, match=match) as info:
        bad_shape[(1,)](mx.zeros((32,)), WHAT=what)
    assert "test_triton_small_names.py:" in str(info.value)


# -- xor_sum, reduce_or, reduce ------------------------------------------------------------

@metile.kernel
def bitwise(X, R0, R1, RA, WHAT: metile.constexpr, M: metile.constexpr, N: metile.constexpr):
    x = metile.load(X + _idx_inline(M, N))
    if WHAT == "xor":
        metile.store(R0 + metile.arange(0, N)[None, :], metile.xor_sum(x, 0, keep_dims=True))
        metile.store(R1 + metile.arange(0, M), metile.xor_sum(x, 1))
        metile.store(RA, metile.xor_sum(x))
    else:
        metile.store(R0 + metile.arange(0, N)[None, :], metile.reduce_or(x, 0, keep_dims=True))
        metile.store(R1 + metile.arange(0, M), metile.reduce_or(x, 1))
        metile.store(RA, metile.reduce_or(x, None))


@pytest.mark.parametrize("what", ["xor", "or"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.bool_],
                         ids=["i32", "u32", "i64", "bool"])
@pytest.mark.parametrize("m,n", [(4, 8), (33, 5), (64, 40)])
def test_bitwise_reductions(what, dtype, m, n):
    rng = np.random.default_rng(m * n)
    if dtype is np.bool_:
        x = rng.random((m, n)) < (0.1 if what == "or" else 0.5)
    else:
        x = rng.integers(0, 2**31 - 1, (m, n)).astype(dtype)
        if dtype is np.int64:
            x = x * (2**31) - x  # values past 32 bits
    md = mx.array(x)
    r0, r1, ra = bitwise[(1,)](md, mx.zeros((n,), md.dtype), mx.zeros((m,), md.dtype),
                               mx.zeros((1,), md.dtype), WHAT=what, M=m, N=n)
    f = np.bitwise_xor if what == "xor" else np.bitwise_or
    np.testing.assert_array_equal(np.array(r0), f.reduce(x, 0))
    np.testing.assert_array_equal(np.array(r1), f.reduce(x, 1))
    np.testing.assert_array_equal(np.array(ra)[0], f.reduce(x.ravel()))


def test_bitwise_reduction_refuses_floats():
    with pytest.raises(metile.CompilationError, match=r"xor_sum\(\) needs integer or bool "
                                                      r"elements, got float32"):
        bitwise[(1,)](mx.zeros((32,)), mx.zeros((8,)), mx.zeros((4,)), mx.zeros((1,)),
                      WHAT="xor", M=4, N=8)


@metile.inline
def _affine(m0, c0, m1, c1):
    """Composition of x -> m0 x + c0 then x -> m1 x + c1: associative, not commutative."""
    return m1 * m0, m1 * c0 + c1


@metile.inline
def _mul(a, b):
    return a * b


@metile.inline
def _argmax(v0, i0, v1, i1):
    take = (v1 > v0) | ((v1 == v0) & (i1 < i0))
    return metile.where(take, v1, v0), metile.where(take, i1, i0)


@metile.kernel
def reductions(X, C, P, Q, S, M: metile.constexpr, N: metile.constexpr, AXIS: metile.constexpr,
               KEEP: metile.constexpr):
    x = metile.load(X + _idx_inline(M, N))
    c = metile.load(C + _idx_inline(M, N))
    m, a = metile.reduce((x, c), AXIS, _affine, keep_dims=KEEP)
    n_out = M if AXIS == 1 else N
    offs = metile.arange(0, n_out)
    if KEEP:
        offs = metile.arange(0, n_out)[:, None] if AXIS == 1 else metile.arange(0, n_out)[None, :]
    metile.store(P + offs, m)
    metile.store(Q + offs, a)
    cols = metile.arange(0, N)[None, :] + metile.zeros((M, N), metile.int32)
    _, where_max = metile.reduce((x, cols), 1, _argmax)
    metile.store(S + metile.arange(0, M), where_max.to(metile.float32))
    metile.store(S + M, metile.reduce(x, None, _mul))


def _affine_ref(ms, cs):
    m, c = ms[0], cs[0]
    for m1, c1 in zip(ms[1:], cs[1:]):
        m, c = m1 * m, m1 * c + c1
    return m, c


@pytest.mark.parametrize("axis,keep", [(0, False), (1, False), (1, True), (0, True)])
@pytest.mark.parametrize("m,n", [(4, 8), (9, 33)])
def test_reduce_with_combine_fn(axis, keep, m, n):
    rng = np.random.default_rng(3)
    x = rng.uniform(0.8, 1.2, (m, n)).astype(np.float32)
    c = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    k = m if axis == 1 else n
    p, q, s = reductions[(1,)](mx.array(x), mx.array(c), mx.zeros((k,)), mx.zeros((k,)),
                               mx.zeros((m + 1,)), M=m, N=n, AXIS=axis, KEEP=keep)
    lines = [(x[i], c[i]) for i in range(m)] if axis == 1 else [(x[:, j], c[:, j])
                                                                 for j in range(n)]
    ref = np.array([_affine_ref(a, b) for a, b in lines], np.float32)
    np.testing.assert_allclose(np.array(p), ref[:, 0], rtol=1e-5)
    np.testing.assert_allclose(np.array(q), ref[:, 1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(s)[:m], np.argmax(x, 1))
    prod = np.float32(1)
    for v in x.ravel():  # the serial row-major order of the fold
        prod = np.float32(prod * v)
    np.testing.assert_allclose(np.array(s)[m], prod, rtol=1e-6)


@metile.kernel
def bad_reduce(X, WHAT: metile.constexpr):
    x = metile.load(X + _idx_inline(4, 8))
    if WHAT == "fn":
        y = metile.reduce(x, 0, metile.maximum)
    elif WHAT == "count":
        y = metile.reduce(x, 0, _affine)
    else:
        y = metile.reduce(x, 2, _mul)
    metile.store(X + metile.arange(0, 8), y)


@pytest.mark.parametrize("what,match", [
    ("fn", r"reduce\(\) combine_fn must be an @metile.inline function"),
    ("count", r"reduce\(\): combine_fn _affine must take 2 arguments for 1 input tile\(s\): "
              r"the running value.s 1, then the next element.s 1"),
    ("axis", r"reduce\(\) axis 2 is out of range for a rank-2 tile"),
])
def test_reduce_errors(what, match):
    with pytest.raises(metile.CompilationError, match=match):
        bad_reduce[(1,)](mx.zeros((32,)), WHAT=what)


def test_max_tensor_numel_is_tritons():
    assert metile.TRITON_MAX_TENSOR_NUMEL == 2**20

    @metile.kernel
    def k(X, B: metile.constexpr):
        metile.static_assert(B <= metile.TRITON_MAX_TENSOR_NUMEL)
        metile.store(X + metile.arange(0, B), 1.0)

    np.testing.assert_array_equal(np.array(k[(1,)](mx.zeros((8,)), B=8)), np.ones(8))


# -- CUDA ------------------------------------------------------------------------------------

@pytest.mark.skipif(nvrtc.TOOLKIT is None, reason="no NVRTC")
def test_cuda_emission_compiles_with_nvrtc():
    @metile.kernel
    def everything(X, I, L, Y, Z, n, M: metile.constexpr, N: metile.constexpr):
        x = metile.load(X + _idx_inline(M, N), cache_modifier=".cg", eviction_policy="evict_first")
        i = metile.load(I + _idx_inline(M, N))
        w = metile.load(L + _idx_inline(M, N))
        y = metile.maximum(metile.flip(x, 0), x, propagate_nan=PN.ALL)
        h = metile.maximum(x.to(metile.float16), x.to(metile.bfloat16).to(metile.float16))
        y = metile.minimum(y, 2.0) + h.to(metile.float32) + metile.sum(metile.dot(x, metile.trans(x), input_precision="ieee"), 1)[:, None]
        r, c = metile.swizzle2d(metile.arange(0, M)[:, None] + i * 0, i, n, N, 2)
        metile.store(Y + _idx_inline(M, N), y + (r + c).to(metile.float32), cache_modifier=".cs")
        p = metile.reduce((x, i), 1, _argmax)[1]
        z = metile.cat(metile.xor_sum(i, 1) + p, metile.reduce_or(i, 1))
        metile.store(Z + metile.arange(0, 2 * M), z + metile.xor_sum(w).to(metile.int32))

    d = everything[(1,)].prepare(mx.zeros((128,)), mx.zeros((128,), mx.int32),
                                 mx.zeros((128,), mx.int64), mx.zeros((128,)),
                                 mx.zeros((32,), mx.int32), 8, M=16, N=8, backend="cuda")
    body = d.variant.compiled.body
    assert "metile_warp_xor(" in body  # the int64 xor_sum to a scalar: a warp butterfly
    ok, log = nvrtc.compile_cuda(nvrtc.translation_unit(d), "sm_80")
    assert ok, log
