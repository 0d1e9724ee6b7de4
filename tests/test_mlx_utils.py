"""The helpers every metal_kernel body can call (include/metile_msl/mlx_utils.h),
run through metile.metal_kernel on the CPU runtime and checked against NumPy:
elem_to_loc in both forms over strided, broadcast and reversed views of 1 to 5
dimensions, Limits for each dtype, ceildiv, log1p, and the spelling macros.

The strided-view launches pass bounds_check=False: the bounds-check mode's
fenced copies are the subject of tests of their own; these tests are about
the offsets elem_to_loc computes."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import requires_msl_device

# MLX's metal_kernel helpers, run by the kernels that call them: on Metal or the CPU runtime.
pytestmark = requires_msl_device

LINEAR_UINT = metile.metal_kernel(
    "utils_linear_uint", ["inp"], ["out", "loc"],
    """
        uint elem = thread_position_in_grid.x;
        uint offset = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        out[elem] = inp[offset];
        loc[elem] = offset;
    """,
    ensure_row_contiguous=False,
)

LINEAR_INT = metile.metal_kernel(
    "utils_linear_int", ["inp"], ["out", "loc"],
    """
        int elem = int(thread_position_in_grid.x);
        auto offset = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        static_assert(metal::is_same_v<decltype(offset), int>, "the offset has the index's type");
        out[elem] = inp[offset];
        loc[elem] = offset;
    """,
    ensure_row_contiguous=False,
)

GRID3 = metile.metal_kernel(
    "utils_grid3", ["inp"], ["out"],
    """
        uint3 p = thread_position_in_grid;
        uint3 n = threads_per_grid;
        int64_t offset = elem_to_loc(p, inp_shape, inp_strides, inp_ndim);
        out[(p.z * n.y + p.y) * n.x + p.x] = inp[offset];
    """,
    ensure_row_contiguous=False,
)


def _views():
    """(name, NumPy base, function making the same view of an array) with
    views of 1..5 dims: contiguous, transposed, stepped, broadcast."""
    base1 = np.arange(40, dtype=np.float32)
    base3 = np.arange(2 * 5 * 7, dtype=np.float32).reshape(2, 5, 7)
    base4 = np.arange(3 * 4 * 5 * 2, dtype=np.float32).reshape(3, 4, 5, 2)
    base5 = np.arange(2 * 3 * 2 * 3 * 4, dtype=np.float32).reshape(2, 3, 2, 3, 4)
    return [
        ("1d", base1, lambda a: a),
        ("1d_step3", base1, lambda a: a[1::3]),
        ("2d_transposed", base3[0], lambda a: a.T),
        ("2d_column", base3[1], lambda a: a[:, 2:5]),
        ("3d_permuted", base3, lambda a: a.transpose(2, 0, 1)),
        ("3d_broadcast", base3[:, :1, :], lambda a: _broadcast(a, (2, 4, 7))),
        ("4d_swapped", base4, lambda a: a.swapaxes(1, 3)),
        ("4d_stepped", base4, lambda a: a[::2, 1:, ::2, :]),
        ("5d_permuted", base5, lambda a: a.transpose(4, 2, 0, 3, 1)),
    ]


def _broadcast(a, shape):
    return np.broadcast_to(a, shape) if isinstance(a, np.ndarray) else mx.broadcast_to(a, shape)


def _expected_offsets(view: np.ndarray) -> np.ndarray:
    """Element offsets of each row-major element of `view` from its first
    element's address, in elements (what elem_to_loc returns)."""
    item = view.itemsize
    idx = np.indices(view.shape).reshape(view.ndim, -1)
    return (np.array(view.strides)[:, None] // item * idx).sum(axis=0)


@pytest.mark.parametrize("name,base,make", _views(), ids=[v[0] for v in _views()])
def test_elem_to_loc_linear_index(name, base, make):
    view_np = make(base)
    view = make(mx.array(base))
    assert view.shape == view_np.shape
    out, loc = LINEAR_UINT(
        inputs=[view], grid=(view.size, 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[view.shape, (view.size,)], output_dtypes=[mx.float32, mx.uint32], stream=mx.cpu,
        bounds_check=False,
    )
    np.testing.assert_array_equal(np.array(out), view_np)
    np.testing.assert_array_equal(np.array(loc), _expected_offsets(view_np))


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_elem_to_loc_negative_strides_with_int_index(ndim):
    shape = (11, 5, 6)[:ndim]
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    rev = tuple(slice(None, None, -1) if d % 2 == 0 else slice(None, None, 2) for d in range(ndim))
    view_np = base[rev]
    view = mx.array(base)[rev]
    out, loc = LINEAR_INT(
        inputs=[view], grid=(view.size, 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[view.shape, (view.size,)], output_dtypes=[mx.float32, mx.int32], stream=mx.cpu,
        bounds_check=False,
    )
    np.testing.assert_array_equal(np.array(out), view_np)
    expected = _expected_offsets(view_np)
    assert expected.min() < 0  # the reversed dimension really walks backwards
    np.testing.assert_array_equal(np.array(loc), expected)


@pytest.mark.parametrize("name,base,make", _views(), ids=[v[0] for v in _views()])
def test_elem_to_loc_grid_position(name, base, make):
    view_np = make(base)
    view = make(mx.array(base))
    shape = view_np.shape
    nx = shape[-1]
    ny = shape[-2] if len(shape) > 1 else 1
    nz = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    (out,) = GRID3(
        inputs=[view], grid=(nx, ny, nz), threadgroup=(4, 2, 2),
        output_shapes=[view.shape], output_dtypes=[mx.float32], stream=mx.cpu,
        bounds_check=False,
    )
    np.testing.assert_array_equal(np.array(out), view_np)


def test_limits_match_numpy():
    source = """
        out_f32[0] = Limits<float>::max;        out_f32[1] = Limits<float>::min;
        out_f32[2] = Limits<float>::finite_max; out_f32[3] = Limits<float>::finite_min;
        out_f16[0] = Limits<half>::max;         out_f16[1] = Limits<half>::min;
        out_f16[2] = Limits<half>::finite_max;  out_f16[3] = Limits<half>::finite_min;
        out_bf16[0] = Limits<bfloat16_t>::max;        out_bf16[1] = Limits<bfloat16_t>::min;
        out_bf16[2] = Limits<bfloat16_t>::finite_max; out_bf16[3] = Limits<bfloat16_t>::finite_min;
        out_i32[0] = Limits<int>::max;          out_i32[1] = Limits<int>::min;
        out_i32[2] = Limits<int>::finite_max;   out_i32[3] = Limits<int>::finite_min;
        out_u32[0] = Limits<uint>::max;         out_u32[1] = Limits<uint>::min;
        out_i8[0] = Limits<char>::max;          out_i8[1] = Limits<char>::min;
        out_b[0] = Limits<bool>::max;           out_b[1] = Limits<bool>::min;
    """
    names = ["out_f32", "out_f16", "out_bf16", "out_i32", "out_u32", "out_i8", "out_b"]
    dtypes = [mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint32, mx.int8, mx.bool_]
    kernel = metile.metal_kernel("utils_limits", ["unused"], names, source)
    outs = kernel(inputs=[mx.zeros((8,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                  output_shapes=[(4,)] * 5 + [(2,), (2,)], output_dtypes=dtypes, stream=mx.cpu)
    got = [np.array(o.astype(mx.float32) if o.dtype == mx.bfloat16 else o) for o in outs]
    for dt, g in zip((np.float32, np.float16), got[:2]):
        big = np.finfo(dt).max
        np.testing.assert_array_equal(g, np.array([np.inf, -np.inf, big, -big], dtype=dt))
    bf_max = float(mx.finfo(mx.bfloat16).max)
    np.testing.assert_array_equal(got[2], np.array([np.inf, -np.inf, bf_max, -bf_max], dtype=np.float32))
    i32 = np.iinfo(np.int32)
    np.testing.assert_array_equal(got[3], [i32.max, i32.min, i32.max, i32.min])
    np.testing.assert_array_equal(got[4][:2], [np.iinfo(np.uint32).max, 0])
    # MSL's char is signed (as int8_t).
    np.testing.assert_array_equal(got[5], [127, -128])
    np.testing.assert_array_equal(got[6], [True, False])


def test_ceildiv_and_spelling_macros():
    header = """
        MTL_CONST int kChunk = 7;
    """
    source = """
        uint i = thread_position_in_grid.x;
        int n = int(x[i]);
        out[i] = ceildiv(n, kChunk);
        int acc = 0;
        MLX_MTL_PRAGMA_UNROLL
        for (int k = 0; k < 4; ++k) acc += n;
        out4[i] = acc;
    """
    kernel = metile.metal_kernel("utils_ceildiv", ["x"], ["out", "out4"], source, header=header)
    x = np.arange(0, 50, dtype=np.int32)
    out, out4 = kernel(inputs=[mx.array(x)], grid=(x.size, 1, 1), threadgroup=(32, 1, 1),
                       output_shapes=[x.shape, x.shape], output_dtypes=[mx.int32, mx.int32], stream=mx.cpu)
    np.testing.assert_array_equal(np.array(out), -(-x // 7))
    np.testing.assert_array_equal(np.array(out4), 4 * x)


def test_log1p_float_and_bfloat():
    source = """
        uint i = thread_position_in_grid.x;
        out[i] = log1p(x[i]);
        out_bf[i] = log1p(bfloat16_t(x[i]));
    """
    kernel = metile.metal_kernel("utils_log1p", ["x"], ["out", "out_bf"], source)
    x = np.array([0.0, -0.0, 1e-30, 1e-10, -1e-7, 3e-4, 0.5, -0.5, 1.0, 7.0, 1e6, 3e38, np.inf, -1.0, -0.999],
                 dtype=np.float32)
    out, out_bf = kernel(inputs=[mx.array(x)], grid=(x.size, 1, 1), threadgroup=(32, 1, 1),
                         output_shapes=[x.shape, x.shape], output_dtypes=[mx.float32, mx.bfloat16],
                         stream=mx.cpu)
    with np.errstate(divide="ignore"):
        expected = np.log1p(x.astype(np.float64))
    # A few float32 ulps: the correction leaves a rounding or two.
    np.testing.assert_allclose(np.array(out), expected, rtol=5e-7, atol=0)
    x_bf = np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
    with np.errstate(divide="ignore"):
        ref_bf = np.log1p(x_bf)
    expected_bf = np.array(mx.array(ref_bf.astype(np.float32)).astype(mx.bfloat16).astype(mx.float32))
    np.testing.assert_array_equal(np.array(out_bf.astype(mx.float32)), expected_bf)
