"""metile.metal_kernel: hand-written MSL kernels checked against NumPy.

On a Linux machine these run in the MSL CPU runtime; on a Mac the same tests
run on the Metal GPU through MLX.
"""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile_kernels.msl_reference import GEMM_SOURCE
from conftest import requires_msl_device

pytestmark = requires_msl_device

RTOL, ATOL = 3e-4, 3e-5  # strict FP32


def exp_kernel():
    # The elementwise example of MLX's custom-kernel documentation.
    source = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """
    return metile.metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=source)


@pytest.mark.parametrize(
    "dtype,tol",
    # half/bfloat outputs are rounded to 11/8 significant bits: 2^-10 and 2^-7 relative
    [(mx.float32, (RTOL, ATOL)), (mx.float16, (2e-3, 2e-3)), (mx.bfloat16, (8e-3, 8e-3))],
)
@pytest.mark.parametrize("n", [1, 7, 65, 1000])
def test_exp_example(dtype, tol, n, rng):
    x = rng.standard_normal(n).astype(np.float32)
    a = mx.array(x).astype(dtype)
    (out,) = exp_kernel()(
        inputs=[a], template=[("T", dtype)], grid=(n, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[a.shape], output_dtypes=[dtype],
    )
    expected = np.exp(np.array(a.astype(mx.float32)).astype(np.float64))
    np.testing.assert_allclose(np.array(out.astype(mx.float32)), expected, rtol=tol[0], atol=tol[1])


def test_strided_input_uses_shape_strides_ndim(rng):
    # ensure_row_contiguous=False: the kernel walks a transposed view itself.
    source = """
        uint elem = thread_position_in_grid.x;
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        out[elem] = inp[loc] * 2.0f;
    """
    kernel = metile.metal_kernel("strided", ["inp"], ["out"], source, ensure_row_contiguous=False)
    x = rng.standard_normal((9, 13)).astype(np.float32)
    a = mx.array(x).T  # non-contiguous
    (out,) = kernel(inputs=[a], grid=(a.size, 1, 1), threadgroup=(64, 1, 1),
                    output_shapes=[a.shape], output_dtypes=[mx.float32])
    np.testing.assert_allclose(np.array(out), x.T * 2, rtol=RTOL, atol=ATOL)


def test_template_arguments_int_bool_dtype(rng):
    source = """
        uint i = thread_position_in_grid.x;
        T v = static_cast<T>(x[i]) * T(SCALE);
        out[i] = NEGATE ? -v : v;
    """
    kernel = metile.metal_kernel("templated", ["x"], ["out"], source)
    x = rng.standard_normal(100).astype(np.float32)
    for scale, negate in ((3, True), (2, False)):
        (out,) = kernel(inputs=[mx.array(x)], template=[("T", mx.float32), ("SCALE", scale), ("NEGATE", negate)],
                        grid=(100, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(100,)], output_dtypes=[mx.float32])
        np.testing.assert_allclose(np.array(out), x * scale * (-1 if negate else 1), rtol=RTOL, atol=ATOL)


def test_scalar_and_small_inputs_follow_mlx_signature(rng):
    # A Python float becomes a 0-d float32 (`const constant float&`); a
    # 3-element array is passed in constant memory.
    source = """
        uint i = thread_position_in_grid.x;
        out[i] = x[i] * alpha + coeffs[i % 3];
    """
    kernel = metile.metal_kernel("affine", ["x", "alpha", "coeffs"], ["out"], source)
    x = rng.standard_normal(10).astype(np.float32)
    c = np.array([1.0, 2.0, 3.0], np.float32)
    (out,) = kernel(inputs=[mx.array(x), 0.5, mx.array(c)], grid=(10, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[(10,)], output_dtypes=[mx.float32])
    np.testing.assert_allclose(np.array(out), x * 0.5 + c[np.arange(10) % 3], rtol=RTOL, atol=ATOL)


REDUCE_SOURCE = """
    threadgroup float partial[256];
    uint tid = thread_position_in_threadgroup.x;
    uint gid = threadgroup_position_in_grid.x;
    uint i = thread_position_in_grid.x;
    partial[tid] = i < n ? x[i] : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint stride = 128; stride > 0; stride /= 2) {
        if (tid < stride) {
            partial[tid] += partial[tid + stride];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (tid == 0) {
        out[gid] = partial[0];
    }
"""


@pytest.mark.parametrize("n", [1, 255, 256, 1000])
def test_threadgroup_reduction_with_barriers(n, rng):
    kernel = metile.metal_kernel("block_sum", ["x", "n"], ["out"], REDUCE_SOURCE)
    x = rng.standard_normal(n).astype(np.float32)
    groups = (n + 255) // 256
    (out,) = kernel(inputs=[mx.array(x), n], grid=(groups * 256, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[(groups,)], output_dtypes=[mx.float32], race_check=True)
    padded = np.zeros(groups * 256)
    padded[:n] = x
    np.testing.assert_allclose(np.array(out), padded.reshape(groups, 256).sum(1), rtol=RTOL, atol=1e-4)


def test_race_check_reports_missing_barrier(rng):
    # Same reduction without the barrier between the steps: the result then
    # depends on the order in which threads run.
    racy = REDUCE_SOURCE.replace("        threadgroup_barrier(mem_flags::mem_threadgroup);\n    }", "    }")
    assert racy != REDUCE_SOURCE
    kernel = metile.metal_kernel("racy_sum", ["x", "n"], ["out"], racy)
    x = mx.array(rng.standard_normal(256).astype(np.float32))
    (out,) = kernel(inputs=[x, 256], grid=(256, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[(1,)], output_dtypes=[mx.float32], race_check=True)
    with pytest.raises(RuntimeError, match="race detected in kernel 'racy_sum'"):
        mx.eval(out)


def test_simd_sum_and_shuffle_xor(rng):
    source = """
        uint i = thread_position_in_grid.x;
        uint lane = thread_index_in_simdgroup;
        float v = x[i];
        float total = simd_sum(v);
        float butterfly = v;
        for (ushort offset = 16; offset > 0; offset /= 2) {
            butterfly += simd_shuffle_xor(butterfly, offset);
        }
        float neighbour = simd_shuffle_xor(v, ushort(1));
        sums[i] = total;
        butterflies[i] = butterfly;
        swapped[i] = neighbour;
        float largest = simd_max(v);
        if (lane == 0) { firsts[i / 32] = largest; }
    """
    kernel = metile.metal_kernel("simd_ops", ["x"], ["sums", "butterflies", "swapped", "firsts"], source)
    x = rng.standard_normal(128).astype(np.float32)
    outs = kernel(inputs=[mx.array(x)], grid=(128, 1, 1), threadgroup=(64, 1, 1),
                  output_shapes=[(128,), (128,), (128,), (4,)], output_dtypes=[mx.float32] * 4)
    groups = x.reshape(4, 32).astype(np.float64)
    np.testing.assert_allclose(np.array(outs[0]), np.repeat(groups.sum(1), 32), rtol=RTOL, atol=1e-4)
    np.testing.assert_allclose(np.array(outs[1]), np.repeat(groups.sum(1), 32), rtol=RTOL, atol=1e-4)
    np.testing.assert_array_equal(np.array(outs[2]), x.reshape(-1, 2)[:, ::-1].reshape(-1))
    np.testing.assert_array_equal(np.array(outs[3]), x.reshape(4, 32).max(1))


def test_atomic_histogram(rng):
    source = """
        uint i = thread_position_in_grid.x;
        if (i < n) {
            atomic_fetch_add_explicit(&hist[values[i]], 1, memory_order_relaxed);
        }
    """
    kernel = metile.metal_kernel("histogram", ["values", "n"], ["hist"], source, atomic_outputs=True)
    values = rng.integers(0, 16, size=5000).astype(np.int32)
    (hist,) = kernel(inputs=[mx.array(values), 5000], grid=(5000, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[(16,)], output_dtypes=[mx.int32], init_value=0)
    np.testing.assert_array_equal(np.array(hist), np.bincount(values, minlength=16))




def gemm_kernel():
    return metile.metal_kernel("gemm64", ["A", "B", "K", "N"], ["C"], GEMM_SOURCE)


def run_gemm(a, b, **kw):
    m, k = a.shape
    n = b.shape[1]
    (c,) = gemm_kernel()(inputs=[a, b, k, n], grid=(n // 64 * 32 * 4, m // 64, 1), threadgroup=(128, 1, 1),
                         output_shapes=[(m, n)], output_dtypes=[mx.float32], **kw)
    return c


def test_simdgroup_matrix_gemm(rng):
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    c = run_gemm(mx.array(a), mx.array(b), race_check=True)
    np.testing.assert_allclose(np.array(c), a.astype(np.float64) @ b, rtol=RTOL, atol=1e-4)


def test_gemm_inside_mx_compile(rng):
    a = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)

    @mx.compile
    def f(x, y):
        return run_gemm(x * 2.0, y) + 1.0

    out = f(mx.array(a), mx.array(b))
    np.testing.assert_allclose(np.array(out), (2 * a.astype(np.float64)) @ b + 1, rtol=RTOL, atol=1e-4)
    # The compiled graph is reused for a second call with new values.
    out2 = f(mx.array(b.T.copy()), mx.array(a.T.copy()))
    np.testing.assert_allclose(np.array(out2), (2 * b.T.astype(np.float64)) @ a.T + 1, rtol=RTOL, atol=1e-4)


def test_launch_is_lazy():
    # This kernel fails when it runs (divergent barrier), so any work done
    # before mx.eval would raise at the call.
    source = """
        if (thread_position_in_grid.x == 0) { return; }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[thread_position_in_grid.x] = 1.0f;
    """
    kernel = metile.metal_kernel("lazy_probe", ["x"], ["out"], source)
    (out,) = kernel(inputs=[mx.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                    output_shapes=[(4,)], output_dtypes=[mx.float32])
    with pytest.raises(RuntimeError, match="divergent threadgroup barrier"):
        mx.eval(out)


# --- Metal fidelity of the CPU runtime: buffer alignment, strided fences,
# order-dependent outputs, compile_options, NumPy integers (issue 11) -----------

ADDRESS_PHASES = """
    if (thread_position_in_grid.x == 0) {
        phases[0] = uint(ulong(fresh) % 16);
        phases[1] = uint(ulong(view16) % 16);
        phases[2] = uint(ulong(view4) % 16);
        phases[3] = uint(ulong(phases) % 16);
    }
"""


@pytest.mark.parametrize("bounds_check", [False, True])
def test_buffers_bound_at_metal_alignment(bounds_check):
    # Metal binds an array at its byte offset into a 16-byte-aligned buffer:
    # a fresh array and a view 16 bytes in are 16-byte aligned, a view 4 bytes
    # in is 4 mod 16, and outputs are aligned (MLX's CPU arrays are 8 mod 16).
    kernel = metile.metal_kernel("address_phases", ["fresh", "view16", "view4"], ["phases"], ADDRESS_PHASES,
                                 ensure_row_contiguous=False)
    base = mx.arange(64, dtype=mx.float32)
    (phases,) = kernel(inputs=[base + 1, base[4:], base[1:]], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                       output_shapes=[(4,)], output_dtypes=[mx.uint32], stream=mx.cpu, bounds_check=bounds_check)
    np.testing.assert_array_equal(np.array(phases), [0, 0, 4, 0])


VEC4_SCALE = """
    uint i = thread_position_in_grid.x;
    float4 v = *(const device float4*)(inp + 4 * i);
    *(device float4*)(out + 4 * i) = v * 2.0f;
"""


@pytest.mark.parametrize("bounds_check", [False, True])
@pytest.mark.parametrize("offset", [0, 4, 8])
def test_vector_pointer_casts_on_aligned_buffers(offset, bounds_check):
    # `*(device float4*)p` on a buffer start: a fault on MLX's 8-byte-aligned
    # CPU arrays before buffers were bound at Metal's alignment.
    kernel = metile.metal_kernel("vec4_scale", ["inp"], ["out"], VEC4_SCALE)
    base = np.arange(80, dtype=np.float32)
    x = mx.array(base)[offset:offset + 64]
    (out,) = kernel(inputs=[x], grid=(16, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(64,)],
                    output_dtypes=[mx.float32], stream=mx.cpu, bounds_check=bounds_check)
    np.testing.assert_array_equal(np.array(out), 2 * base[offset:offset + 64])


def test_vector_cast_on_view_misaligned_on_metal_still_faults():
    # A view one float into its buffer is 4 mod 16 on Metal too: a float4 cast
    # there is the kernel's error, and the runtime does not hide it.
    kernel = metile.metal_kernel("vec4_scale_view", ["inp"], ["out"], VEC4_SCALE, ensure_row_contiguous=False)
    x = mx.arange(68, dtype=mx.float32)[1:65]
    (out,) = kernel(inputs=[x], grid=(16, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(64,)],
                    output_dtypes=[mx.float32], stream=mx.cpu, bounds_check=False)
    with pytest.raises(RuntimeError, match=r"kernel 'vec4_scale_view': invalid memory access"):
        mx.eval(out)


STRIDED_READ = """
    uint i = thread_position_in_grid.x;
    out[i] = inp[elem_to_loc(int(i), inp_shape, inp_strides, inp_ndim)] + inp[EXTRA];
"""


@pytest.mark.parametrize("view", ["slice", "offset_slice", "transpose", "broadcast", "negative_stride"])
def test_bounds_check_fences_what_the_strides_reach(view):
    kernel = metile.metal_kernel("strided_read", ["inp"], ["out"], STRIDED_READ, ensure_row_contiguous=False)
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    b = mx.array(base)
    x, ref = {
        "slice": (b[:, :3], base[:, :3]),  # 24 elements spanning 59
        "offset_slice": (b[2:, 5:], base[2:, 5:]),
        "transpose": (b.T, base.T),
        "broadcast": (mx.broadcast_to(b[:1], (5, 8)), np.broadcast_to(base[:1], (5, 8))),  # 40 over 8
        "negative_stride": (b[::-1, 1::2], base[::-1, 1::2]),
    }[view]
    (out,) = kernel(inputs=[x], template=[("EXTRA", 0)], grid=(x.size, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[x.shape], output_dtypes=[mx.float32], stream=mx.cpu, bounds_check=True)
    np.testing.assert_array_equal(np.array(out), ref + ref.reshape(-1)[0])


def test_bounds_check_reports_a_read_past_a_strided_views_extent():
    kernel = metile.metal_kernel("strided_read_past", ["inp"], ["out"], STRIDED_READ, ensure_row_contiguous=False)
    x = mx.arange(64, dtype=mx.float32).reshape(8, 8)[:, :3]  # reaches 7 * 8 + 2 = element 58
    (out,) = kernel(inputs=[x], template=[("EXTRA", 60)], grid=(24, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[(8, 3)], output_dtypes=[mx.float32], stream=mx.cpu, bounds_check=True)
    with pytest.raises(RuntimeError, match=r"'inp' \(236 bytes\) accessed at byte offset 240, past its end"):
        mx.eval(out)


FLOAT_ATOMIC_SUM = """
    atomic_fetch_add_explicit(&total[0], w[thread_position_in_grid.x], memory_order_relaxed);
"""


def float_atomic_sum(**kw):
    # 1 + 1e8 - 1e8 in float: 0 added forward, 1 added in reverse order.
    kernel = metile.metal_kernel("float_atomic_sum", ["w"], ["total"], FLOAT_ATOMIC_SUM, atomic_outputs=True)
    w = mx.array([1.0, 1e8, -1e8], dtype=mx.float32)
    (out,) = kernel(inputs=[w], grid=(3, 1, 1), threadgroup=(3, 1, 1), output_shapes=[(1,)],
                    output_dtypes=[mx.float32], init_value=0, stream=mx.cpu, race_check=True, **kw)
    mx.eval(out)
    return np.array(out)


def test_race_check_reports_an_undeclared_order_dependent_output():
    with pytest.raises(RuntimeError, match=(
            r"race detected in kernel 'float_atomic_sum': output total differs at element 0 between forward "
            r"and reversed thread order \(0 vs 1\).*declare it with order_dependent_outputs=")):
        float_atomic_sum()


@pytest.mark.parametrize("declared", [["total"], {"total": None}, {"total": (0.0, 1.0)}])
def test_order_dependent_outputs_are_exempt_from_the_race_check(declared):
    assert float_atomic_sum(order_dependent_outputs=declared)[0] in (0.0, 1.0)


def test_order_dependent_tolerance_is_enforced():
    with pytest.raises(RuntimeError, match=r"output total differs at element 0"):
        float_atomic_sum(order_dependent_outputs={"total": (0.0, 0.5)})


@pytest.mark.parametrize("declared,error,message", [
    (["sum"], ValueError,
     "[metal_kernel] order_dependent_outputs names 'sum', which is not an output; the outputs are ['total']"),
    ("total", TypeError,
     "[metal_kernel] order_dependent_outputs must be a list of output names or a dict from output name to "
     "None, rtol or (rtol, atol), got 'total'"),
    ({"total": -1.0}, ValueError,
     "[metal_kernel] order_dependent_outputs['total'] must be None, a positive rtol or (rtol, atol) with "
     "non-negative values, not both zero; got -1.0"),
    ({"total": (0, 0)}, ValueError,
     "[metal_kernel] order_dependent_outputs['total'] must be None, a positive rtol or (rtol, atol) with "
     "non-negative values, not both zero; got (0, 0)"),
])
def test_order_dependent_outputs_bad_values(declared, error, message):
    with pytest.raises(error) as info:
        float_atomic_sum(order_dependent_outputs=declared)
    assert str(info.value) == message


@pytest.mark.parametrize("mode", ["safe", "relaxed", "fast"])
def test_compile_options_math_mode(mode, rng):
    kernel = metile.metal_kernel("math_mode_exp", ["inp"], ["out"],
                                 "out[thread_position_in_grid.x] = metal::exp(inp[thread_position_in_grid.x]);",
                                 compile_options={"math_mode": mode})
    x = rng.standard_normal(40).astype(np.float32)
    x[:2] = [-np.inf, np.inf]
    (out,) = kernel(inputs=[mx.array(x)], grid=(40, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(40,)],
                    output_dtypes=[mx.float32])
    # Every mode computes with IEEE semantics on the CPU runtime ("safe" on Metal).
    np.testing.assert_allclose(np.array(out), np.exp(x.astype(np.float64)), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("options,message", [
    ("fast", "[metal_kernel] Expected `compile_options` to be a dict."),
    ({"math_mode": "FAST"}, "[metal_kernel] Expected math_mode to be 'safe', 'relaxed', or 'fast'."),
    ({"math_mode": 2}, "[metal_kernel] Expected math_mode to be 'safe', 'relaxed', or 'fast'."),
    ({"fast_math": True}, "[metal_kernel] Unknown compile option `fast_math`."),
])
def test_compile_options_rejected_as_mlx_rejects_them(options, message):
    with pytest.raises(ValueError) as info:
        metile.metal_kernel("bad_options", ["inp"], ["out"], "out[0] = inp[0];", compile_options=options)
    assert str(info.value) == message


def test_grid_and_threadgroup_accept_numpy_integers(rng):
    kernel = metile.metal_kernel("np_grid", ["inp"], ["out"],
                                 "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] + 1.0f;")
    x = rng.standard_normal(10).astype(np.float32)
    (out,) = kernel(inputs=[mx.array(x)], grid=(np.int64(x.size), np.int32(1), 1),
                    threadgroup=(np.uint8(8), 1, np.int16(1)), output_shapes=[x.shape], output_dtypes=[mx.float32])
    np.testing.assert_allclose(np.array(out), x + 1, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match=r"grid must be a tuple of three ints, got \(10.0, 1, 1\)"):
        kernel(inputs=[mx.array(x)], grid=(10.0, 1, 1), threadgroup=(8, 1, 1), output_shapes=[x.shape],
               output_dtypes=[mx.float32])


# -- hostile tests (twenty-ninth session) ---------------------------------------------------

def test_a_python_int_past_int32_is_an_int64_scalar():
    # (it was made int32 and wrapped: 2**40 arrived as 0)
    k = metile.metal_kernel("wide_scalar", ["a", "b"], ["out"],
                            "uint i = thread_position_in_grid.x; out[i] = float(a) + float(b);")
    run = lambda a: k(inputs=[a, 1], output_shapes=[(2,)], output_dtypes=[mx.float32],
                      grid=(2, 1, 1), threadgroup=(2, 1, 1))[0]
    assert run(2**40).tolist() == [float(np.float32(2.0**40) + np.float32(1))] * 2
    assert run(3).tolist() == [4.0, 4.0]
    with pytest.raises(ValueError, match=r"input 'a' = 1180591620717411303424 does not fit in "
                                         r"int64"):
        run(2**70)


INTEGER_FUNCTIONS = """
uint t = thread_position_in_grid.x;
int a = x[t]; int b = y[t];
uint ua = uint(a); uint ub = uint(b);
device int* o = out + t * 15;
o[0] = addsat(a, b); o[1] = subsat(a, b); o[2] = hadd(a, b); o[3] = rhadd(a, b);
o[4] = int(addsat(ua, ub)); o[5] = int(subsat(ua, ub)); o[6] = mul24(a & 0x7fff, b & 0x7fff);
o[7] = mad24(a & 0xff, b & 0xff, 3); o[8] = madhi(a, b, 1); o[9] = madsat(a, b, 1);
o[10] = extract_bits(a, 4u, 8u); o[11] = int(extract_bits(ua, 4u, 8u));
o[12] = insert_bits(a, b, 8u, 4u);
float c; float s = sincos(0.5f * float(t), c); o[13] = int(round((s * s + c * c) * 1000.0f));
int2 v = addsat(int2(a, b), int2(b, a)); o[14] = v.x - v.y;
"""


def _integer_functions(a, b, t):
    sat = lambda v, lo, hi: max(lo, min(hi, v))
    s32 = lambda v: (v & 0xFFFFFFFF) - (2**32 if v & 0x80000000 else 0)
    i32, u32 = (-2**31, 2**31 - 1), (0, 2**32 - 1)
    ua, ub = a & 0xFFFFFFFF, b & 0xFFFFFFFF

    def field(v, signed):
        f = (v >> 4) & 0xFF
        return f - 256 if signed and f & 0x80 else f

    return [sat(a + b, *i32), sat(a - b, *i32), (a + b) >> 1, (a + b + 1) >> 1,
            s32(sat(ua + ub, *u32)), s32(sat(ua - ub, *u32)), (a & 0x7FFF) * (b & 0x7FFF),
            (a & 0xFF) * (b & 0xFF) + 3, s32(((a * b) >> 32) + 1), sat(sat(a * b, *i32) + 1, *i32),
            field(ua, True), field(ua, False), s32((ua & ~0xF00) | ((ub << 8) & 0xF00)), 1000, 0]


def test_metal_integer_functions_and_sincos():
    # (addsat, subsat, hadd, rhadd, mul24, mad24, madhi, madsat, extract_bits, insert_bits and
    # sincos passed the strict check and then failed to compile: "undeclared identifier")
    xs = np.array([2**31 - 1, -2**31, 100, -7, 0x12345678, -1], np.int32)
    ys = np.array([5, 3, -300, 9, 0x0ABCDEF0, -1], np.int32)
    k = metile.metal_kernel("integer_functions", ["x", "y"], ["out"], INTEGER_FUNCTIONS)
    k.check(inputs=[mx.array(xs), mx.array(ys)], output_dtypes=[mx.int32])
    (out,) = k(inputs=[mx.array(xs), mx.array(ys)], output_shapes=[(xs.size * 15,)],
               output_dtypes=[mx.int32], grid=(xs.size, 1, 1), threadgroup=(xs.size, 1, 1))
    got = np.array(out).reshape(xs.size, 15).tolist()
    assert got == [_integer_functions(a, b, t) for t, (a, b) in
                   enumerate(zip(xs.tolist(), ys.tolist()))]


MATRICES = """
float2x2 m = float2x2(float2(1, 2), float2(3, 4));
float3x3 a = float3x3(2.0f);
a[1][2] = 5.0f;
float4x4 b = float4x4(float4(1, 0, 0, 0), float4(0, 2, 0, 0), float4(0, 0, 3, 0), float4(1, 1, 1, 4));
float2x2 from_half = float2x2(half2x2(half2(1.0h, 2.0h), half2(0.5h, 1.0h)));
float2x3 c = float2x3(float3(1, 2, 3), float3(4, 5, 6));
float3x3 p = c * float3x2(float2(1, 0), float2(0, 1), float2(1, 1));
float3 v = float3(1, 2, 3) * a;
out[0] = (m * float2(1, 1)).y; out[1] = v.z; out[2] = determinant(m); out[3] = determinant(a);
out[4] = determinant(b); out[5] = from_half[1][0]; out[6] = transpose(c)[2][1];
out[7] = p[2][2]; out[8] = (m * m)[1][1]; out[9] = (2.0f * m + m - m)[0][1];
"""


def test_metal_matrix_types():
    # (float2x2 ... half4x4 were unknown types to the strict check and the runtime)
    k = metile.metal_kernel("matrices", ["x"], ["out"], MATRICES)
    k.check(inputs=[mx.zeros((1,))], output_dtypes=[mx.float32])
    (out,) = k(inputs=[mx.zeros((1,))], output_shapes=[(10,)], output_dtypes=[mx.float32],
               grid=(1, 1, 1), threadgroup=(1, 1, 1))
    m = np.array([[1.0, 3.0], [2.0, 4.0]])              # rows x columns (Metal's are columns)
    a = 2 * np.eye(3)
    a[2, 1] = 5.0
    b = np.array([[1, 0, 0, 1], [0, 2, 0, 1], [0, 0, 3, 1], [0, 0, 0, 4.0]])
    c = np.array([[1, 4], [2, 5], [3, 6.0]])
    p = c @ np.array([[1, 0, 1], [0, 1, 1.0]])
    want = [(m @ [1, 1])[1], (np.array([1, 2, 3]) @ a)[2], np.linalg.det(m), np.linalg.det(a),
            np.linalg.det(b), 0.5, c.T[1, 2], p[2, 2], (m @ m)[1, 1], 2 * m[1, 0]]
    np.testing.assert_allclose(np.array(out), want, rtol=1e-6)


def test_a_matrix_from_a_list_of_scalars_is_refused_as_metal_refuses_it():
    k = metile.metal_kernel("matrix_scalars", ["x"], ["out"],
                            "float2x2 m = float2x2(1, 2, 3, 4); out[0] = m[0][0];")
    with pytest.raises(metile.MslCompileError):
        k.check(inputs=[mx.zeros((1,))], output_dtypes=[mx.float32])
