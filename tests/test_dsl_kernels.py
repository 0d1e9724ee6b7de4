"""@metile.kernel kernels a Triton user would write, run through the MSL CPU
runtime (or Metal) and checked against NumPy in float64.

Tolerances: float32 is strict (rtol=3e-4, atol=3e-5).  float16 / bfloat16
results are rounded to their dtype at the end (compute is float32 inside the
kernels), so they are checked to two units in the last place of the output
dtype: float16 rtol=atol=2e-3 (eps 9.8e-4), bfloat16 rtol=atol=1.6e-2
(eps 7.8e-3).  References are computed from the inputs as rounded to the
test dtype.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

import metile
from dsl_kernels import (block_rows, block_sum, block_view_copy, control_flow, layernorm, matmul,
                         scale_bias_act, softmax_rows, transpose, unary_math, vector_add,
                         view_copy)


SIZES = [1, 7, 9, 63, 65, 1000]
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
TOL = {"float32": (3e-4, 3e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}


def make(rng, shape, dtype):
    """An mx.array of `dtype` and its exact float64 value."""
    a = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(DTYPES[dtype])
    return a, np.array(a.astype(mx.float32)).astype(np.float64)


def check(got, ref, dtype):
    rtol, atol = TOL[dtype]
    assert got.dtype == DTYPES[dtype]
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_vector_add(rng, n, dtype):
    x, xr = make(rng, (n,), dtype)
    y, yr = make(rng, (n,), dtype)
    z = vector_add[(metile.cdiv(n, 256),)](x, y, mx.zeros((n,), DTYPES[dtype]), n, BLOCK=256)
    check(z, xr + yr, dtype)


@pytest.mark.parametrize("n", [65, 5000])
def test_vector_add_block_larger_than_threadgroup(rng, n):
    # BLOCK=2048 > 1024 threads: each thread owns two elements.
    x, xr = make(rng, (n,), "float32")
    y, yr = make(rng, (n,), "float32")
    z = vector_add[(metile.cdiv(n, 2048),)](x, y, mx.zeros((n,)), n, BLOCK=2048)
    check(z, xr + yr, "float32")


def _gelu(z):
    return 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


@pytest.mark.parametrize("dtype,act", [("float32", "gelu"), ("float16", "gelu"),
                                       ("bfloat16", "gelu"), ("float32", "tanh"),
                                       ("float32", "leaky")])
@pytest.mark.parametrize("n", SIZES)
def test_fused_scale_bias_activation(rng, n, dtype, act):
    x, xr = make(rng, (n,), dtype)
    b, br = make(rng, (n,), dtype)
    y = scale_bias_act[(metile.cdiv(n, 256),)](x, b, mx.zeros((n,), DTYPES[dtype]), 0.75, n,
                                               BLOCK=256, ACT=act)
    z = xr * 0.75 + br
    ref = {"gelu": _gelu, "tanh": np.tanh, "leaky": lambda v: np.where(v > 0, v, 0.1 * v)}[act](z)
    check(y, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", SIZES)
def test_softmax_rows(rng, cols, dtype):
    rows = 3
    x, xr = make(rng, (rows, cols), dtype)
    y = softmax_rows[(rows,)](x, mx.zeros((rows, cols), DTYPES[dtype]), cols, cols, BLOCK=1024)
    e = np.exp(xr - xr.max(axis=1, keepdims=True))
    check(y, e / e.sum(axis=1, keepdims=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", SIZES)
def test_layernorm(rng, cols, dtype):
    rows, eps = 4, 1e-5
    x, xr = make(rng, (rows, cols), dtype)
    w, wr = make(rng, (cols,), dtype)
    b, br = make(rng, (cols,), dtype)
    y = layernorm[(rows,)](x, w, b, mx.zeros((rows, cols), DTYPES[dtype]), cols, cols, eps,
                           BLOCK=1024)
    mu = xr.mean(axis=1, keepdims=True)
    var = ((xr - mu) ** 2).mean(axis=1, keepdims=True)
    check(y, (xr - mu) / np.sqrt(var + eps) * wr + br, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(1, 1), (7, 9), (63, 65), (65, 1000), (1000, 7)])
def test_transposed_copy(rng, m, n, dtype):
    x, xr = make(rng, (m, n), dtype)
    grid = (metile.cdiv(m, 16), metile.cdiv(n, 16))
    y = transpose[grid](x, mx.zeros((n, m), DTYPES[dtype]), m, n, BM=16, BN=16)
    check(y, xr.T, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 9, 63), (65, 63, 9), (9, 65, 100)])
def test_block_matmul(rng, m, n, k, dtype):
    a, ar = make(rng, (m, k), dtype)
    b, br = make(rng, (k, n), dtype)
    grid = (metile.cdiv(m, 16), metile.cdiv(n, 16))
    c = matmul[grid](a, b, mx.zeros((m, n), DTYPES[dtype]), m, n, k, BM=16, BN=16, BK=8)
    check(c, ar @ br, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", SIZES)
def test_thread_level_shared_barrier_reduction(rng, n, dtype):
    rows = 3
    x, xr = make(rng, (rows, n), dtype)
    out = block_sum[(rows,)](x, mx.zeros((rows,), DTYPES[dtype]), n)
    check(out, xr.sum(axis=1), dtype)


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_vector_add_integers(rng, dtype):
    d = getattr(mx, dtype)
    x = mx.array(rng.integers(0, 1000, 65)).astype(d)
    y = mx.array(rng.integers(0, 1000, 65)).astype(d)
    z = vector_add[(1,)](x, y, mx.zeros((65,), d), 65, BLOCK=256)
    assert z.dtype == d
    np.testing.assert_array_equal(np.array(z), np.array(x) + np.array(y))


@metile.kernel
def signed_overflow(A, Gt, Half, Neg, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    a = metile.load(A + offs, mask=m)
    metile.store(Gt + offs, ((a + 1) > a).to(metile.int32), mask=m)
    metile.store(Half + offs, (a * 2) // 2, mask=m)
    metile.store(Neg + offs, -a < 0, mask=m)


@pytest.mark.skipif(mx.default_device() == mx.gpu and mx.cuda.is_available(),
                    reason="CUDA: NVRTC has no -fwrapv; signed overflow there is C++'s "
                           "(undefined: H200 s68 folded (a + 1) > a to true), README")
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_signed_arithmetic_wraps(dtype):
    # Triton's integer arithmetic wraps; C++'s signed overflow is undefined, and clang had
    # folded `(a + 1) > a` to true for the largest value (the CPU runtime: -fwrapv)
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max // 2 + 1, -5], dtype)
    gt, half, neg = signed_overflow[(1,)](mx.array(a), mx.zeros(4, mx.int32),
                                          mx.zeros(4, getattr(mx, dtype.__name__)),
                                          mx.zeros(4, mx.int32), 4, BLOCK=4)
    with np.errstate(over="ignore"):
        twice = a * dtype(2)
        np.testing.assert_array_equal(np.array(gt), (a + dtype(1) > a).astype(np.int32))
        np.testing.assert_array_equal(np.array(half), np.trunc(twice / 2).astype(dtype))
        np.testing.assert_array_equal(np.array(neg), (-a < 0).astype(np.int32))


def test_thread_level_tensor_views(rng):
    a, ar = make(rng, (8, 8), "float32")
    out = view_copy[(1,)](a, mx.zeros((8, 8)))
    check(out, 2 * ar, "float32")


@pytest.mark.parametrize("m,n", [(1, 1), (7, 9), (65, 63)])
def test_block_views_mask_to_shape(rng, m, n):
    x, xr = make(rng, (m, n), "float32")
    y = block_view_copy[(metile.cdiv(m, 16), metile.cdiv(n, 16))](x, mx.zeros((n, m)), m, n,
                                                                 BM=16, BN=16)
    check(y, xr.T + 1, "float32")


@pytest.mark.parametrize("flag", [0, 1, 3])
def test_runtime_if_and_while_carry_tiles(rng, flag):
    x, xr = make(rng, (65,), "float32")
    y = control_flow[(1,)](x, mx.zeros((65,)), 65, flag, BLOCK=128)
    ref = xr * 2 if flag > 0 else xr - 1
    for _ in range(flag):
        ref = np.maximum(ref, 0) + 1
    check(y, ref, "float32")


def _unary_reference(x):
    a = np.abs(x)
    erf = np.vectorize(math.erf)
    return (np.exp2(x * 0.5) + np.log(a + 1) + np.sqrt(a) + 1 / (1 + np.exp(-x))
            + np.minimum(x, 0.25) + 1 / np.sqrt(a + 1) + np.exp(-a) + np.tanh(x) + erf(x)
            + np.where(x > 0.5, 2.0, -x))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unary_math(rng, dtype):
    # bfloat16: the 11 ops and sums each round to bfloat16; below magnitude 16 half an ulp is
    # 0.031, so the accumulated error is bounded by 11 * 0.031 ~ 0.34; we check 0.25 absolute.
    x, xr = make(rng, (1000,), dtype)
    y = unary_math[(4,)](x, mx.zeros((1000,), DTYPES[dtype]), 1000, BLOCK=256)
    if dtype == "float32":
        check(y, _unary_reference(xr), dtype)
    else:
        np.testing.assert_allclose(np.array(y.astype(mx.float32)), _unary_reference(xr),
                                   rtol=0, atol=0.25)


@pytest.mark.parametrize("m,n", [(1, 1), (7, 9), (16, 16), (9, 1)])
def test_axis_reductions_and_broadcast_back(rng, m, n):
    x, xr = make(rng, (m, n), "float32")
    rs, cm, sm = block_rows[(1,)](x, mx.zeros((m,)), mx.zeros((n,)), mx.zeros((m, n)), m, n,
                                  BM=16, BN=16)
    check(rs, xr.sum(axis=1), "float32")
    check(cm, xr.max(axis=0), "float32")
    e = np.exp(xr - xr.max(axis=1, keepdims=True))
    check(sm, e / e.sum(axis=1, keepdims=True), "float32")


# -- launch semantics ------------------------------------------------------------------------

@metile.kernel
def write_even(X, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(X + offs, offs.to(metile.float32), mask=(offs < n) & (offs % 2 == 0))


@metile.kernel
def scale_in_place(X, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(X + offs, metile.load(X + offs, mask=mask) * 2.0, mask=mask)


def test_unwritten_elements_keep_passed_values(rng):
    n = 65
    x = mx.array(rng.standard_normal(n).astype(np.float32))
    before = np.array(x)
    y = write_even[(1,)](x, n, BLOCK=128)
    ref = before.copy()
    ref[::2] = np.arange(0, n, 2)
    np.testing.assert_array_equal(np.array(y), ref)
    np.testing.assert_array_equal(np.array(x), before)  # the passed array is not modified


def test_partial_grid_keeps_passed_values(rng):
    n = 1000
    x, xr = make(rng, (n,), "float32")
    z0 = mx.array(np.full(n, 7.0, np.float32))
    z = vector_add[(2,)](x, x, z0, n, BLOCK=256)  # covers only the first 512 elements
    ref = np.full(n, 7.0)
    ref[:512] = 2 * xr[:512]
    check(z, ref, "float32")


def test_read_modify_write_output(rng):
    x, xr = make(rng, (63,), "float32")
    y = scale_in_place[(1,)](x, 63, BLOCK=64)
    check(y, 2 * xr, "float32")


def test_prepared_dispatch_relaunches(rng):
    n = 9
    x, xr = make(rng, (n,), "float32")
    dispatch = vector_add[(1,)].prepare(x, x, mx.zeros((n,)), n, BLOCK=256)
    first, second = dispatch(), dispatch()
    check(first, 2 * xr, "float32")
    check(second, 2 * xr, "float32")
    geometry = "blockIdx.x" if dispatch.variant.backend == "cuda" else "threadgroup_position_in_grid"
    assert geometry in dispatch.source
    # new arrays of the same signature: the same resolved launch with the arrays swapped
    y, yr = make(rng, (n,), "float32")
    check(dispatch(x, y, mx.zeros((n,)), n, BLOCK=256), xr + yr, "float32")
    assert vector_add.last_dispatch is dispatch
    # a different signature rebinds through the checks
    with pytest.raises(metile.LaunchError, match="prepared for a float32 buffer, got a float16"):
        dispatch(x.astype(mx.float16), y, mx.zeros((n,)), n, BLOCK=256)


def test_grid_callable_and_multiple_outputs(rng):
    n = 65
    x, xr = make(rng, (n,), "float32")
    grid = lambda meta: (metile.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
    z = vector_add[grid](x, x, mx.zeros((n,)), n, BLOCK=256)
    check(z, 2 * xr, "float32")


def test_zero_programs_return_passed_array():
    z0 = mx.ones((4,))
    z = vector_add[(0,)](z0, z0 * 2, z0 * 3, 4, BLOCK=256)
    np.testing.assert_array_equal(np.array(z), 3 * np.ones(4))


def test_lazy_until_eval(rng):
    x, xr = make(rng, (7,), "float32")
    z = vector_add[(1,)](x, x, mx.zeros((7,)), 7, BLOCK=256)
    assert isinstance(z, mx.array)
    mx.eval(z)
    check(z, 2 * xr, "float32")


# -- inside MLX graphs -------------------------------------------------------------------------

def test_inside_mx_compile(rng):
    rows, cols = 3, 65

    def f(x, y):
        s = vector_add[(metile.cdiv(rows * cols, 256),)](
            x.reshape(-1), y.reshape(-1), mx.zeros((rows * cols,)), rows * cols, BLOCK=256)
        s = s.reshape(rows, cols) * 2.0
        return softmax_rows[(rows,)](s, mx.zeros((rows, cols)), cols, cols, BLOCK=1024)

    x, xr = make(rng, (rows, cols), "float32")
    y, yr = make(rng, (rows, cols), "float32")
    compiled = mx.compile(f)
    for _ in range(2):  # the second call replays the compiled graph
        out = compiled(x, y)
        e = np.exp(2 * (xr + yr) - (2 * (xr + yr)).max(axis=1, keepdims=True))
        check(out, e / e.sum(axis=1, keepdims=True), "float32")


def test_inside_nn_module(rng):
    import mlx.nn as nn

    class LayerNorm(nn.Module):
        def __init__(self, dims, eps=1e-5):
            super().__init__()
            self.weight = mx.ones((dims,))
            self.bias = mx.zeros((dims,))
            self.eps = eps

        def __call__(self, x):
            rows, cols = x.shape
            return layernorm[(rows,)](x, self.weight, self.bias, mx.zeros_like(x), cols, cols,
                                      self.eps, BLOCK=1024)

    class Block(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.norm = LayerNorm(dims)
            self.linear = nn.Linear(dims, dims)

        def __call__(self, x):
            return self.linear(self.norm(x))

    model = Block(63)
    x, xr = make(rng, (5, 63), "float32")
    out = model(x)
    mu = xr.mean(axis=1, keepdims=True)
    normed = (xr - mu) / np.sqrt(((xr - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    w = np.array(model.linear.weight).astype(np.float64)
    bias = np.array(model.linear.bias).astype(np.float64)
    check(out, normed @ w.T + bias, "float32")
    out_c = mx.compile(model)(x)
    check(out_c, normed @ w.T + bias, "float32")


def test_repeated_launches_reuse_the_resolved_dispatch(rng):
    # The second call with the same signature takes the cached path: new arrays,
    # same checks.
    n = 65
    x, xr = make(rng, (n,), "float32")
    y, yr = make(rng, (n,), "float32")
    first = vector_add[(1,)](x, x, mx.zeros((n,)), n, BLOCK=256)
    assert len(vector_add._launches) >= 1
    again = vector_add[(1,)](x, y, mx.zeros((n,)), n, BLOCK=256)
    check(first, 2 * xr, "float32")
    check(again, xr + yr, "float32")
    z = mx.zeros((n,))
    with pytest.raises(metile.LaunchError, match="the same array as output"):
        vector_add[(1,)](x, z, z, n, BLOCK=256)
    # a different n is a different entry (coverage proofs depend on it)
    short = vector_add[(1,)](x, y, mx.full((n,), -1.0), 7, BLOCK=256)
    out = np.array(short)
    np.testing.assert_allclose(out[:7], (xr + yr)[:7], rtol=3e-4, atol=3e-5)
    np.testing.assert_array_equal(out[7:], -1.0)


# -- a hostile test (twenty-eighth session) ----------------------------------------------------

@metile.kernel
def erf_kernel(X, Y, n, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    metile.store(Y + i, metile.erf(metile.load(X + i, mask=i < n)), mask=i < n)


def test_erf_keeps_its_relative_accuracy_near_zero():
    # (1 - erfc cancelled every digit near 0: erf(1e-7) was 0, erf(1e-6) 5% off, and
    # tiny negatives and -0 came out +0; Triton's erf is libdevice's erff)
    import math
    xs = np.array([0.0, -0.0, 1e-38, 1e-20, 3e-8, 1e-7, -1e-7, 1e-6, 1e-4, 1e-2, 0.3, 0.49999,
                   0.5, -0.5, 0.75, 1.0, -2.0, 3.5, 10.0, -10.0], np.float32)
    got = np.array(erf_kernel[(1,)](mx.array(xs), mx.zeros(xs.shape), len(xs), BLOCK=32))
    want = np.array([math.erf(float(x)) for x in xs])
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(xs))


@metile.kernel(num_simdgroups=1)
def reversed_through_device(X, Y, Z):
    tid = metile.thread_id()
    metile.store(Y + tid, metile.load(X + tid))
    metile.barrier()
    metile.store(Z + tid, metile.load(Y + 31 - tid))


def test_a_barrier_orders_device_memory_too():
    # (barrier() emitted threadgroup_barrier(mem_threadgroup) alone: on an Apple GPU another
    # thread's device store need not be visible after it; CUDA's __syncthreads orders both)
    x = mx.arange(32).astype(mx.float32)
    d = reversed_through_device[(1,)].prepare(x, mx.zeros((32,)), mx.zeros((32,)),
                                              backend="msl")
    assert "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);" in d.source
    np.testing.assert_array_equal(np.array(d()[1]), np.arange(31, -1, -1))


@metile.kernel
def scaled_by_length(X, Y, BLOCK: metile.constexpr):
    x = metile.load(X + metile.arange(0, BLOCK)[:, None] * 3 + metile.arange(0, 3)[None, :])
    metile.store(Y + metile.arange(0, BLOCK)[:, None] * 3 + metile.arange(0, 3)[None, :],
                 x * len(x) + len(metile.trans(x)) * 0.5)


@metile.kernel
def length_of_a_scalar(X, Y):
    metile.store(Y, len(metile.load(X)))


def test_len_of_a_tile_is_its_first_dimension():
    # (a hostile trial: "len() of a runtime value; use metile.cast" - a tile's length is
    # static, as a NumPy array's)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = scaled_by_length[(1,)](mx.array(x), mx.zeros((4, 3)), BLOCK=4)
    np.testing.assert_array_equal(np.array(got), x * 4 + 1.5)
    with pytest.raises(metile.CompilationError, match=r"len\(\) of a scalar .*only a tile has a length"):
        length_of_a_scalar[(1,)](mx.ones((1,)), mx.zeros((1,)))
