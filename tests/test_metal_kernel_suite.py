"""A suite of `metile.metal_kernel` kernels written in the styles MLX-ecosystem
kernels use (pointer-cast vector loads and stores, MSL constants, packed
vectors, vec<T, N>, as_type, #define in bodies and headers, 3-D threadgroups,
CAS spin loops, threadgroup atomics, SIMD-group prefix sums, broadcasts and
shuffles, strided views through elem_to_loc, init_value, several outputs,
compile_options, template arguments, half and bfloat), each checked against
NumPy.

Every kernel runs three ways on the CPU runtime: plainly, with the bounds check
(buffers fenced by inaccessible pages) and with the race check (forward,
reversed and shuffled thread orders must agree).  Outputs whose values depend
on thread order by design (float atomics, hash-table slots) are declared with
`order_dependent_outputs=`.  The kernels were written for this suite; none is
copied from another project.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import requires_msl_device

pytestmark = requires_msl_device

RTOL, ATOL = 3e-4, 3e-5  # strict FP32
MODES = {
    "plain": dict(bounds_check=False, race_check=False),
    "bounds_check": dict(bounds_check=True, race_check=False),
    "race_check": dict(bounds_check=False, race_check=True),
}
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def run(kernel, check, **kwargs):
    outs = kernel(stream=mx.cpu, **check, **kwargs)
    mx.eval(outs)
    # NumPy has no bfloat16: such outputs come back as their float32 values.
    return [np.array(o.astype(mx.float32) if o.dtype == mx.bfloat16 else o) for o in outs]


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


VEC4_AXPY = metile.metal_kernel(
    "suite_vec4_axpy", ["x", "y", "alpha", "n"], ["out"],
    """
    uint i = thread_position_in_grid.x;
    uint quads = n / 4;
    if (i < quads) {
        float4 xv = *(const device float4*)(x + 4 * i);
        float4 yv = *(const device float4*)(y + 4 * i);
        *(device float4*)(out + 4 * i) = alpha * xv + yv;
    } else if (i == quads) {
        for (uint j = 4 * quads; j < n; ++j) out[j] = alpha * x[j] + y[j];
    }
    """,
)


@case
def vec4_axpy(rng, check):
    n = 1003
    x, y = f32(rng, n), f32(rng, n)
    (out,) = run(VEC4_AXPY, check, inputs=[mx.array(x), mx.array(y), 1.5, n], grid=(n // 4 + 1, 1, 1),
                 threadgroup=(64, 1, 1), output_shapes=[(n,)], output_dtypes=[mx.float32])
    np.testing.assert_allclose(out, 1.5 * x.astype(np.float64) + y, rtol=RTOL, atol=ATOL)


UINT4_BITS = metile.metal_kernel(
    "suite_uint4_bits", ["words"], ["mixed", "unit", "counts"],
    """
    uint i = thread_position_in_grid.x;
    uint4 a = *(const device uint4*)(words + 4 * i);
    *(device uint4*)(mixed + 4 * i) = a ^ (a >> 3u);
    // Mantissa bits under the exponent of 1.0: a float in [1, 2).
    float4 f = as_type<float4>((a & 0x007fffffu) | 0x3f800000u);
    *(device float4*)(unit + 4 * i) = f - 1.0f;
    counts[i] = popcount(a.x) + popcount(a.y) + popcount(a.z) + popcount(a.w);
    """,
)


@case
def uint4_bits(rng, check):
    words = rng.integers(0, 2**32, size=256, dtype=np.uint32)
    mixed, unit, counts = run(UINT4_BITS, check, inputs=[mx.array(words)], grid=(64, 1, 1), threadgroup=(32, 1, 1),
                              output_shapes=[(256,), (256,), (64,)],
                              output_dtypes=[mx.uint32, mx.float32, mx.uint32])
    np.testing.assert_array_equal(mixed, words ^ (words >> 3))
    expected_unit = ((words & 0x007FFFFF) | 0x3F800000).view(np.float32) - np.float32(1)
    np.testing.assert_array_equal(unit, expected_unit)
    bits = np.unpackbits(words.view(np.uint8)).reshape(64, -1).sum(1)
    np.testing.assert_array_equal(counts, bits)


MSL_CONSTANTS = metile.metal_kernel(
    "suite_msl_constants", ["x"], ["cleaned", "radians", "table", "ints"],
    """
    uint i = thread_position_in_grid.x;
    float v = x[i];
    cleaned[i] = isnan(v) ? 0.0f : clamp(v, -FLT_MAX, FLT_MAX);
    radians[i] = isinf(v) ? 0.0f : v * (M_PI_F / 180.0f);
    if (i == 0) {
        const float values[] = {
            INFINITY, -INFINITY, MAXFLOAT, HUGE_VALF, FLT_MAX, FLT_MIN, FLT_EPSILON,
            M_E_F, M_LOG2E_F, M_LOG10E_F, M_LN2_F, M_LN10_F, M_PI_F, M_PI_2_F, M_PI_4_F,
            M_1_PI_F, M_2_PI_F, M_2_SQRTPI_F, M_SQRT2_F, M_SQRT1_2_F,
            float(HALF_MAX), float(HALF_MIN), float(HALF_EPSILON), float(M_PI_H), float(M_SQRT2_H),
            float(HUGE_VALH), float(MAXHALF), isnan(NAN) ? 1.0f : 0.0f};
        for (uint k = 0; k < sizeof(values) / sizeof(values[0]); ++k) table[k] = values[k];
        const int limits[] = {INT_MAX, INT_MIN, SHRT_MAX, SHRT_MIN, USHRT_MAX, UCHAR_MAX, SCHAR_MIN, CHAR_BIT,
                              FLT_MANT_DIG, FLT_MAX_EXP, HALF_MANT_DIG, HALF_MAX_EXP, int(UINT_MAX >> 1),
                              int(LONG_MAX >> 33)};
        for (uint k = 0; k < sizeof(limits) / sizeof(limits[0]); ++k) ints[k] = limits[k];
    }
    """,
)


@case
def msl_constants(rng, check):
    x = np.array([0.0, 1.0, -2.5, 90.0, np.nan, np.inf, -np.inf, 3.4e38, -1e-30, 180.0], np.float32)
    cleaned, radians, table, ints = run(
        MSL_CONSTANTS, check, inputs=[mx.array(x)], grid=(10, 1, 1), threadgroup=(16, 1, 1),
        output_shapes=[(10,), (10,), (28,), (14,)], output_dtypes=[mx.float32, mx.float32, mx.float32, mx.int32])
    f, h = np.finfo(np.float32), np.finfo(np.float16)
    np.testing.assert_array_equal(cleaned, np.nan_to_num(x, nan=0.0, posinf=f.max, neginf=-f.max))
    finite = np.where(np.isinf(x), 0.0, x)
    np.testing.assert_allclose(radians, finite * np.float32(np.pi / 180), rtol=1e-6, atol=1e-30)
    consts = [math.e, math.log2(math.e), math.log10(math.e), math.log(2), math.log(10), math.pi, math.pi / 2,
              math.pi / 4, 1 / math.pi, 2 / math.pi, 2 / math.sqrt(math.pi), math.sqrt(2), math.sqrt(0.5)]
    expected = [np.inf, -np.inf, f.max, np.inf, f.max, f.tiny, f.eps] + consts + [
        h.max, h.tiny, h.eps, np.float16(math.pi), np.float16(math.sqrt(2)), np.inf, h.max, 1.0]
    np.testing.assert_array_equal(table, np.array(expected, np.float32))
    np.testing.assert_array_equal(ints, [2**31 - 1, -(2**31), 2**15 - 1, -(2**15), 2**16 - 1, 255, -128, 8,
                                         24, 128, 11, 16, 2**31 - 1, 2**30 - 1])


PACKED_RGB = metile.metal_kernel(
    "suite_packed_rgb", ["rgb"], ["gray", "inverted"],
    """
    uint i = thread_position_in_grid.x;
    const device packed_float3* pixels = (const device packed_float3*)rgb;
    float3 c = float3(pixels[i]);
    gray[i] = dot(c, float3(0.2126f, 0.7152f, 0.0722f));
    device packed_float3* o = (device packed_float3*)inverted;
    o[i] = 1.0f - pixels[i];  // arithmetic on a packed vector, stored back packed
    """,
)


@case
def packed_rgb(rng, check):
    rgb = rng.random((77, 3)).astype(np.float32)
    gray, inverted = run(PACKED_RGB, check, inputs=[mx.array(rgb)], grid=(77, 1, 1), threadgroup=(32, 1, 1),
                         output_shapes=[(77,), (77, 3)], output_dtypes=[mx.float32, mx.float32])
    np.testing.assert_allclose(gray, rgb.astype(np.float64) @ [0.2126, 0.7152, 0.0722], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(inverted, np.float32(1) - rgb)


PACKED_USHORT2 = metile.metal_kernel(
    "suite_packed_ushort2", ["pairs"], ["sums", "diffs", "swapped"],
    """
    uint i = thread_position_in_grid.x;
    const device packed_ushort2* p = (const device packed_ushort2*)pairs;
    ushort2 u = ushort2(p[i]);
    uint2 w = uint2(u);
    sums[i] = w.x + w.y;
    diffs[i] = int(w.x) - int(w.y);
    ((device packed_ushort2*)swapped)[i] = packed_ushort2(u.yx);
    """,
)


@case
def packed_ushort2(rng, check):
    pairs = rng.integers(0, 2**16, size=(45, 2), dtype=np.uint16)
    sums, diffs, swapped = run(PACKED_USHORT2, check, inputs=[mx.array(pairs)], grid=(45, 1, 1),
                               threadgroup=(16, 1, 1), output_shapes=[(45,), (45,), (45, 2)],
                               output_dtypes=[mx.uint32, mx.int32, mx.uint16])
    wide = pairs.astype(np.int64)
    np.testing.assert_array_equal(sums, wide.sum(1))
    np.testing.assert_array_equal(diffs, wide[:, 0] - wide[:, 1])
    np.testing.assert_array_equal(swapped, pairs[:, ::-1])


VEC_TEMPLATE = metile.metal_kernel(
    "suite_vec_template", ["x"], ["norms", "doubled"],
    """
    uint i = thread_position_in_grid.x;
    vec<T, N> v;
    for (int k = 0; k < N; ++k) v[k] = x[i * N + k];
    vec<float, N> f = vec<float, N>(v);
    norms[i] = dot(f, f);
    ((device vec<T, N>*)doubled)[i] = v * T(2);
    """,
)


@case
def vec_template(rng, check):
    x = f32(rng, 33, 4).astype(np.float16)
    norms, doubled = run(VEC_TEMPLATE, check, inputs=[mx.array(x)], template=[("T", mx.float16), ("N", 4)],
                         grid=(33, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(33,), (33, 4)],
                         output_dtypes=[mx.float32, mx.float16])
    np.testing.assert_allclose(norms, (x.astype(np.float64) ** 2).sum(1), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(doubled, x * np.float16(2))


AS_TYPE_BITS = metile.metal_kernel(
    "suite_as_type_bits", ["x"], ["bbits", "hbits", "pair", "back"],
    """
    uint i = thread_position_in_grid.x;
    bfloat b = bfloat(x[i]);
    half h = half(x[i]);
    bbits[i] = as_type<ushort>(b);
    hbits[i] = as_type<ushort>(h);
    pair[i] = as_type<uint>(bfloat2(b, -b));
    back[i] = float(b) + float(h);
    """,
)


@case
def as_type_bits(rng, check):
    x = np.concatenate([f32(rng, 60) * 100, [0.0, -0.0, 65504.0, 1e-8]]).astype(np.float32)
    n = x.size
    bbits, hbits, pair, back = run(AS_TYPE_BITS, check, inputs=[mx.array(x)], grid=(n, 1, 1), threadgroup=(32, 1, 1),
                                   output_shapes=[(n,)] * 4,
                                   output_dtypes=[mx.uint16, mx.uint16, mx.uint32, mx.float32])
    b = np.array(mx.array(x).astype(mx.bfloat16).view(mx.uint16))
    np.testing.assert_array_equal(bbits, b)
    np.testing.assert_array_equal(hbits, x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(pair, b.astype(np.uint32) | ((b ^ 0x8000).astype(np.uint32) << 16))
    b_float = (b.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(back, b_float + x.astype(np.float16).astype(np.float32))


DEFINE_IN_BODY = metile.metal_kernel(
    "suite_define_in_body", ["x"], ["out"],
    """
    #define SQR(v) ((v) * (v))
    #define WIDTH 8
    uint col = thread_position_in_grid.x;
    uint row = thread_position_in_grid.y;
    if (col < WIDTH) {
        out[row * WIDTH + col] = SQR(x[row * WIDTH + col]) - float(SQR(col));
    }
    #undef SQR
    #undef WIDTH
    """,
)


@case
def define_in_body(rng, check):
    x = f32(rng, 5, 8)
    (out,) = run(DEFINE_IN_BODY, check, inputs=[mx.array(x)], grid=(16, 5, 1), threadgroup=(16, 2, 1),
                 output_shapes=[(5, 8)], output_dtypes=[mx.float32])
    np.testing.assert_allclose(out, x.astype(np.float64) ** 2 - np.arange(8) ** 2, rtol=RTOL, atol=ATOL)


HEADER_HELPERS = metile.metal_kernel(
    "suite_header_helpers", ["x"], ["gelu", "softplus_out"],
    header="""
    #define GELU_K0 0.7978845608f
    #define GELU_K1 0.044715f
    template <typename T>
    inline T gelu_tanh(T v) {
        T inner = T(GELU_K0) * (v + T(GELU_K1) * v * v * v);
        return T(0.5f) * v * (T(1) + metal::precise::tanh(inner));
    }
    inline float softplus(float v) { return v > 20.0f ? v : metal::log(1.0f + metal::exp(v)); }
    """,
    source="""
    uint i = thread_position_in_grid.x;
    gelu[i] = gelu_tanh(x[i]);
    softplus_out[i] = softplus(x[i]);
    """,
)


@case
def header_helpers(rng, check):
    x = np.concatenate([f32(rng, 60) * 4, [25.0, -25.0]]).astype(np.float32)
    n = x.size
    gelu, sp = run(HEADER_HELPERS, check, inputs=[mx.array(x)], grid=(n, 1, 1), threadgroup=(32, 1, 1),
                   output_shapes=[(n,), (n,)], output_dtypes=[mx.float32, mx.float32])
    v = x.astype(np.float64)
    ref = 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v**3)))
    np.testing.assert_allclose(gelu, ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sp, np.where(v > 20, v, np.log1p(np.exp(v))), rtol=RTOL, atol=ATOL)


THREADGROUP_3D = metile.metal_kernel(
    "suite_threadgroup_3d", ["dummy"], ["ids", "launched"],
    """
    uint3 p = thread_position_in_grid;
    uint3 g = threadgroup_position_in_grid;
    uint3 l = thread_position_in_threadgroup;
    uint idx = (p.z * threads_per_grid.y + p.y) * threads_per_grid.x + p.x;
    ids[idx] = g.x | (g.y << 4) | (g.z << 8) | (l.x << 12) | (l.y << 16) | (l.z << 20);
    if (all(p == uint3(0))) {
        launched[0] = threads_per_grid.x;
        launched[1] = threads_per_grid.y;
        launched[2] = threads_per_grid.z;
    }
    """,
)


@case
def threadgroup_3d(rng, check):
    grid, tg = (5, 6, 3), (4, 4, 2)  # partial groups along every axis
    ids, size = run(THREADGROUP_3D, check, inputs=[mx.zeros((1,))], grid=grid, threadgroup=tg,
                    output_shapes=[(3, 6, 5), (3,)], output_dtypes=[mx.uint32, mx.uint32])
    z, y, x = np.meshgrid(np.arange(3), np.arange(6), np.arange(5), indexing="ij")
    expected = ((x // 4) | ((y // 4) << 4) | ((z // 2) << 8) | ((x % 4) << 12) | ((y % 4) << 16)
                | ((z % 2) << 20))
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(size, grid)


CAS_FLOAT_MAX = metile.metal_kernel(
    "suite_cas_float_max", ["x"], ["out"],
    """
    uint i = thread_position_in_grid.x;
    float v = x[i];
    device atomic_uint* slot = &out[i % BUCKETS];
    uint expected = atomic_load_explicit(slot, memory_order_relaxed);
    while (as_type<float>(expected) < v) {
        if (atomic_compare_exchange_weak_explicit(slot, &expected, as_type<uint>(v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            break;
        }
    }
    """,
    atomic_outputs=True,
)


@case
def cas_float_max(rng, check):
    x = f32(rng, 500)
    (out,) = run(CAS_FLOAT_MAX, check, inputs=[mx.array(x)], template=[("BUCKETS", 4)], grid=(500, 1, 1),
                 threadgroup=(64, 1, 1), output_shapes=[(4,)], output_dtypes=[mx.uint32],
                 init_value=float(np.float32(-np.inf).view(np.uint32)))
    expected = np.array([x[k::4].max() for k in range(4)], np.float32)
    np.testing.assert_array_equal(out.view(np.float32), expected)


FLOAT_ATOMIC_HISTOGRAM = metile.metal_kernel(
    "suite_float_atomic_histogram", ["bins", "w"], ["hist"],
    """
    uint i = thread_position_in_grid.x;
    atomic_fetch_add_explicit(&hist[bins[i]], w[i], memory_order_relaxed);
    """,
    atomic_outputs=True,
)


@case
def float_atomic_histogram(rng, check):
    bins = rng.integers(0, 10, size=700).astype(np.uint32)
    w = rng.random(700).astype(np.float32)
    # Float addition in thread order: each order rounds differently.
    (hist,) = run(FLOAT_ATOMIC_HISTOGRAM, check, inputs=[mx.array(bins), mx.array(w)], grid=(700, 1, 1),
                  threadgroup=(128, 1, 1), output_shapes=[(10,)], output_dtypes=[mx.float32], init_value=0,
                  order_dependent_outputs={"hist": (1e-5, 1e-5)})
    np.testing.assert_allclose(hist, np.bincount(bins, weights=w, minlength=10), rtol=1e-5, atol=1e-5)


THREADGROUP_ATOMICS = metile.metal_kernel(
    "suite_threadgroup_atomics", ["values"], ["hist"],
    """
    threadgroup atomic_uint local_bins[16];
    uint tid = thread_index_in_threadgroup;
    if (tid < 16) atomic_store_explicit(&local_bins[tid], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(&local_bins[values[thread_position_in_grid.x] & 15u], 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid < 16) {
        uint count = atomic_load_explicit(&local_bins[tid], memory_order_relaxed);
        atomic_fetch_add_explicit(&hist[tid], count, memory_order_relaxed);
    }
    """,
    atomic_outputs=True,
)


@case
def threadgroup_atomics(rng, check):
    values = rng.integers(0, 1000, size=1000).astype(np.uint32)
    (hist,) = run(THREADGROUP_ATOMICS, check, inputs=[mx.array(values)], grid=(1000, 1, 1),
                  threadgroup=(64, 1, 1), output_shapes=[(16,)], output_dtypes=[mx.uint32], init_value=0)
    np.testing.assert_array_equal(hist, np.bincount(values & 15, minlength=16))


SIMD_PREFIX_SCAN = metile.metal_kernel(
    "suite_simd_prefix_scan", ["x", "n"], ["inclusive", "exclusive"],
    """
    threadgroup float simd_totals[4];
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    uint sg = simdgroup_index_in_threadgroup;
    float v = i < n ? x[i] : 0.0f;
    float incl = simd_prefix_inclusive_sum(v);
    float excl = simd_prefix_exclusive_sum(v);
    if (lane == 31) simd_totals[sg] = incl;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float base = 0.0f;
    for (uint s = 0; s < sg; ++s) base += simd_totals[s];
    if (i < n) {
        inclusive[i] = base + incl;
        exclusive[i] = base + excl;
    }
    """,
)


@case
def simd_prefix_scan(rng, check):
    n = 300
    x = f32(rng, n)
    incl, excl = run(SIMD_PREFIX_SCAN, check, inputs=[mx.array(x), n], grid=(384, 1, 1), threadgroup=(128, 1, 1),
                     output_shapes=[(n,), (n,)], output_dtypes=[mx.float32, mx.float32])
    padded = np.zeros(384)
    padded[:n] = x
    blocks = padded.reshape(3, 128)
    ref_incl = np.cumsum(blocks, axis=1).reshape(-1)[:n]
    np.testing.assert_allclose(incl, ref_incl, rtol=RTOL, atol=1e-4)
    np.testing.assert_allclose(excl, ref_incl - x, rtol=RTOL, atol=1e-4)


SIMD_SOFTMAX = metile.metal_kernel(
    "suite_simd_softmax", ["x"], ["out", "row_max"],
    """
    uint row = thread_position_in_grid.y;
    uint lane = thread_index_in_simdgroup;
    const device float* r = x + row * C;
    float m = -INFINITY;
    for (uint c = lane; c < C; c += 32) m = max(m, r[c]);
    m = simd_max(m);
    float s = 0.0f;
    for (uint c = lane; c < C; c += 32) s += metal::fast::exp(r[c] - m);
    s = simd_sum(s);
    float inv = 1.0f / simd_broadcast(s, 0);
    for (uint c = lane; c < C; c += 32) out[row * C + c] = metal::exp(r[c] - m) * inv;
    if (lane == 0) row_max[row] = simd_broadcast_first(m);
    """,
)


@case
def simd_softmax(rng, check):
    x = f32(rng, 6, 96) * 3
    out, row_max = run(SIMD_SOFTMAX, check, inputs=[mx.array(x)], template=[("C", 96)], grid=(32, 6, 1),
                       threadgroup=(32, 2, 1), output_shapes=[(6, 96), (6,)], output_dtypes=[mx.float32] * 2)
    v = x.astype(np.float64)
    e = np.exp(v - v.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(row_max, x.max(1))


SIMD_SHUFFLES = metile.metal_kernel(
    "suite_simd_shuffles", ["x"], ["lane0_sum", "rotated", "reversed", "shifted", "xored", "quad_sums", "votes"],
    """
    uint i = thread_position_in_grid.x;
    ushort lane = ushort(thread_index_in_simdgroup);
    float v = x[i];
    float t = v;
    for (ushort d = 16; d > 0; d >>= 1) t += simd_shuffle_down(t, d);
    if (lane == 0) lane0_sum[i / 32] = t;
    rotated[i] = simd_shuffle_rotate_down(v, ushort(3));
    reversed[i] = simd_shuffle(v, ushort(31 - lane));
    float up = simd_shuffle_up(v, ushort(1));
    shifted[i] = lane == 0 ? v : up;
    xored[i] = simd_shuffle_xor(v, ushort(5));
    quad_sums[i] = quad_sum(v);
    bool positive = v > 0.0f;
    votes[i] = (simd_any(positive) ? 1 : 0) | (simd_all(positive) ? 2 : 0);
    """,
)


@case
def simd_shuffles(rng, check):
    x = f32(rng, 128)
    x[32:64] = np.abs(x[32:64]) + 0.5  # one SIMD-group entirely positive
    outs = run(SIMD_SHUFFLES, check, inputs=[mx.array(x)], grid=(128, 1, 1), threadgroup=(64, 1, 1),
               output_shapes=[(4,)] + [(128,)] * 6, output_dtypes=[mx.float32] * 6 + [mx.int32])
    lane0, rotated, reversed_, shifted, xored, quads, votes = outs
    g = x.reshape(4, 32)
    lanes = np.arange(32)
    np.testing.assert_allclose(lane0, g.astype(np.float64).sum(1), rtol=RTOL, atol=1e-4)
    np.testing.assert_array_equal(rotated, g[:, (lanes + 3) % 32].reshape(-1))
    np.testing.assert_array_equal(reversed_, g[:, ::-1].reshape(-1))
    np.testing.assert_array_equal(shifted, np.concatenate([g[:, :1], g[:, :-1]], axis=1).reshape(-1))
    np.testing.assert_array_equal(xored, g[:, lanes ^ 5].reshape(-1))
    np.testing.assert_allclose(quads, np.repeat(x.reshape(-1, 4).astype(np.float64).sum(1), 4), rtol=RTOL, atol=ATOL)
    expected_votes = np.repeat([int((r > 0).any()) | 2 * int((r > 0).all()) for r in g], 32)
    np.testing.assert_array_equal(votes, expected_votes)


STRIDED_PRODUCT = metile.metal_kernel(
    "suite_strided_product", ["a", "b"], ["out"],
    """
    uint i = thread_position_in_grid.x;
    auto la = elem_to_loc(i, a_shape, a_strides, a_ndim);
    auto lb = elem_to_loc(i, b_shape, b_strides, b_ndim);
    out[i] = a[la] * b[lb];
    """,
    ensure_row_contiguous=False,
)


@case
def strided_product(rng, check):
    a_base, b_base = f32(rng, 12, 9), f32(rng, 11, 24)
    a = mx.array(a_base).T  # transposed: strides (1, 9)
    b = mx.array(b_base)[1:10, ::2]  # sliced with an offset and a step
    (out,) = run(STRIDED_PRODUCT, check, inputs=[a, b], grid=(108, 1, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(9, 12)], output_dtypes=[mx.float32])
    np.testing.assert_allclose(out, a_base.T.astype(np.float64) * b_base[1:10, ::2], rtol=RTOL, atol=ATOL)


BROADCAST_3D = metile.metal_kernel(
    "suite_broadcast_3d", ["src"], ["out"],
    """
    uint3 pos = thread_position_in_grid;
    if (pos.x >= W || pos.y >= H) return;
    int64_t loc = elem_to_loc(pos, src_shape, src_strides, src_ndim);
    out[(pos.z * H + pos.y) * W + pos.x] = src[loc] + float(pos.z);
    """,
    ensure_row_contiguous=False,
)


@case
def broadcast_3d(rng, check):
    row = f32(rng, 1, 7, 1)
    src = mx.broadcast_to(mx.array(row), (3, 7, 10))  # strides (0, 1, 0)
    (out,) = run(BROADCAST_3D, check, inputs=[src], template=[("H", 7), ("W", 10)], grid=(16, 8, 3),
                 threadgroup=(8, 4, 2), output_shapes=[(3, 7, 10)], output_dtypes=[mx.float32])
    np.testing.assert_array_equal(out, np.broadcast_to(row, (3, 7, 10)) + np.arange(3, dtype=np.float32)[:, None, None])


REVERSED_VIEW = metile.metal_kernel(
    "suite_reversed_view", ["x"], ["out"],
    """
    int i = int(thread_position_in_grid.x);
    out[i] = 2.0f * x[elem_to_loc(i, x_shape, x_strides, x_ndim)];
    """,
    ensure_row_contiguous=False,
)


@case
def reversed_view(rng, check):
    base = f32(rng, 8, 6)
    x = mx.array(base)[::-1, 1::2]  # negative row stride: the kernel reads before its data pointer
    (out,) = run(REVERSED_VIEW, check, inputs=[x], grid=(24, 1, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(8, 3)], output_dtypes=[mx.float32])
    np.testing.assert_array_equal(out, 2 * base[::-1, 1::2])


INIT_VALUE_SCATTER = metile.metal_kernel(
    "suite_init_value_scatter", ["idx", "val"], ["out"],
    """
    uint i = thread_position_in_grid.x;
    out[idx[i]] = val[i];
    """,
)


@case
def init_value_scatter(rng, check):
    idx = rng.permutation(100)[:40].astype(np.int32)
    val = f32(rng, 40)
    (out,) = run(INIT_VALUE_SCATTER, check, inputs=[mx.array(idx), mx.array(val)], grid=(40, 1, 1),
                 threadgroup=(16, 1, 1), output_shapes=[(100,)], output_dtypes=[mx.float32], init_value=-1.5)
    expected = np.full(100, -1.5, np.float32)
    expected[idx] = val
    np.testing.assert_array_equal(out, expected)


ROW_STATS = metile.metal_kernel(
    "suite_row_stats", ["x", "cols"], ["mean", "var", "argmax", "smallest"],
    """
    uint r = thread_position_in_grid.x;
    if (r >= x_shape[0]) return;
    const device float* row = x + r * cols;
    float total = 0.0f;
    int best = 0;
    float lo = INFINITY;
    for (int c = 0; c < cols; ++c) {
        total += row[c];
        if (row[c] > row[best]) best = c;
        lo = min(lo, row[c]);
    }
    float mu = total / float(cols);
    float sq = 0.0f;
    for (int c = 0; c < cols; ++c) sq += (row[c] - mu) * (row[c] - mu);
    mean[r] = mu;
    var[r] = sq / float(cols);
    argmax[r] = best;
    smallest[r] = half(lo);
    """,
)


@case
def row_stats(rng, check):
    x = f32(rng, 21, 13)
    mean, var, argmax, smallest = run(
        ROW_STATS, check, inputs=[mx.array(x), 13], grid=(32, 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[(21,)] * 4, output_dtypes=[mx.float32, mx.float32, mx.int32, mx.float16])
    v = x.astype(np.float64)
    np.testing.assert_allclose(mean, v.mean(1), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(var, v.var(1), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(argmax, x.argmax(1))
    np.testing.assert_array_equal(smallest, x.min(1).astype(np.float16))


FAST_MATH = metile.metal_kernel(
    "suite_fast_math", ["x"], ["sig", "inv_norm"],
    """
    uint i = thread_position_in_grid.x;
    float v = x[i];
    sig[i] = 1.0f / (1.0f + metal::fast::exp(-v));
    inv_norm[i] = metal::fast::rsqrt(v * v + 1.0f);
    """,
    compile_options={"math_mode": "fast"},
)


@case
def fast_math(rng, check):
    x = f32(rng, 70) * 5
    sig, inv = run(FAST_MATH, check, inputs=[mx.array(x)], grid=(70, 1, 1), threadgroup=(32, 1, 1),
                   output_shapes=[(70,), (70,)], output_dtypes=[mx.float32] * 2)
    v = x.astype(np.float64)
    # The CPU runtime computes fast math with IEEE precision (documented).
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-v)), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(inv, 1 / np.sqrt(v * v + 1), rtol=RTOL, atol=ATOL)


DEQUANTIZE = metile.metal_kernel(
    "suite_dequantize", ["w", "scales", "biases"], ["out"],
    """
    uint i = thread_position_in_grid.x;
    uint word = w[(i * BITS) / 32];
    uint q = (word >> ((i * BITS) % 32)) & ((1u << BITS) - 1u);
    uint g = i / GROUP;
    float value = float(q) * float(scales[g]);
    if (HAS_BIAS) value += float(biases[g]);
    out[i] = T(value);
    """,
)


@case
def dequantize(rng, check):
    n, bits, group = 256, 4, 32
    q = rng.integers(0, 16, size=n).astype(np.uint32)
    w = (q.reshape(-1, 8) << (np.arange(8, dtype=np.uint32) * 4)).sum(1, dtype=np.uint32)
    scales = mx.array(rng.random(n // group).astype(np.float32)).astype(mx.bfloat16)
    biases = mx.array(rng.standard_normal(n // group).astype(np.float32)).astype(mx.bfloat16)
    s, b = (np.array(a.astype(mx.float32)).astype(np.float64) for a in (scales, biases))
    for has_bias in (True, False):
        (out,) = run(DEQUANTIZE, check, inputs=[mx.array(w), scales, biases],
                     template=[("T", mx.bfloat16), ("BITS", bits), ("GROUP", group), ("HAS_BIAS", has_bias)],
                     grid=(n, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(n,)], output_dtypes=[mx.bfloat16])
        ref = q * np.repeat(s, group) + (np.repeat(b, group) if has_bias else 0)
        np.testing.assert_allclose(out, ref, rtol=2**-8, atol=2**-8 * np.abs(ref).max())


HALF_GEMV = metile.metal_kernel(
    "suite_half_gemv", ["W", "x"], ["y"],
    """
    uint row = threadgroup_position_in_grid.x * simdgroups_per_threadgroup + simdgroup_index_in_threadgroup;
    uint lane = thread_index_in_simdgroup;
    if (row >= M) return;
    const device half4* wr = (const device half4*)(W + row * K);
    const device half4* xv = (const device half4*)x;
    float acc = 0.0f;
    for (uint k = lane; k < K / 4; k += 32) acc += dot(float4(wr[k]), float4(xv[k]));
    acc = simd_sum(acc);
    if (lane == 0) y[row] = half(acc);
    """,
)


@case
def half_gemv(rng, check):
    m, k = 37, 256
    w = (f32(rng, m, k) / 16).astype(np.float16)
    x = f32(rng, k).astype(np.float16)
    (y,) = run(HALF_GEMV, check, inputs=[mx.array(w), mx.array(x)], template=[("M", m), ("K", k)],
               grid=(19 * 64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(m,)], output_dtypes=[mx.float16])
    ref = w.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2e-3, atol=2e-3)


BFLOAT_ROPE = metile.metal_kernel(
    "suite_bfloat_rope", ["x", "base"], ["out"],
    """
    uint pair = thread_position_in_grid.x;
    uint pos = thread_position_in_grid.y;
    float theta = float(pos) * metal::exp2(-float(2 * pair) / float(D) * metal::log2(base));
    float c = metal::precise::cos(theta);
    float s = metal::precise::sin(theta);
    const device bfloat16_t* row = x + pos * D;
    float2 v = float2(row[2 * pair], row[2 * pair + 1]);
    *(device bfloat2*)(out + pos * D + 2 * pair) = bfloat2(v.x * c - v.y * s, v.x * s + v.y * c);
    """,
)


@case
def bfloat_rope(rng, check):
    seq, d = 9, 16
    x = mx.array(f32(rng, seq, d)).astype(mx.bfloat16)
    (out,) = run(BFLOAT_ROPE, check, inputs=[x, 10000.0], template=[("D", d)], grid=(d // 2, seq, 1),
                 threadgroup=(8, 4, 1), output_shapes=[(seq, d)], output_dtypes=[mx.bfloat16])
    v = np.array(x.astype(mx.float32)).astype(np.float64)
    theta = np.arange(seq)[:, None] * 10000.0 ** (-2 * np.arange(d // 2) / d)
    c, s = np.cos(theta), np.sin(theta)
    ref = np.empty_like(v)
    ref[:, 0::2] = v[:, 0::2] * c - v[:, 1::2] * s
    ref[:, 1::2] = v[:, 0::2] * s + v[:, 1::2] * c
    np.testing.assert_allclose(out, ref, rtol=2**-8, atol=2**-8 * 4)


HASH_SET = metile.metal_kernel(
    "suite_hash_set", ["keys"], ["table", "slots"],
    """
    uint i = thread_position_in_grid.x;
    uint key = keys[i];
    const uint CAP = 1u << LOG2_CAP;
    uint h = key % 61u;  // a deliberately crowded home range: keys collide and probe
    while (true) {
        uint expected = 0u;
        bool stored = atomic_compare_exchange_weak_explicit(&table[h], &expected, key,
                                                            memory_order_relaxed, memory_order_relaxed);
        if (stored || expected == key) break;
        if (expected != 0u) h = (h + 1) & (CAP - 1);  // taken by another key: probe on
    }
    atomic_store_explicit(&slots[i], h, memory_order_relaxed);
    """,
    atomic_outputs=True,
)


@case
def hash_set(rng, check):
    keys = rng.integers(1, 150, size=200).astype(np.uint32)
    # Which slot a colliding key lands in depends on which thread inserts first.
    table, slots = run(HASH_SET, check, inputs=[mx.array(keys)], template=[("LOG2_CAP", 8)], grid=(200, 1, 1),
                       threadgroup=(64, 1, 1), output_shapes=[(256,), (200,)],
                       output_dtypes=[mx.uint32, mx.uint32], init_value=0,
                       order_dependent_outputs=["table", "slots"])
    stored = table[table != 0]
    assert sorted(stored) == sorted(set(keys.tolist()))
    np.testing.assert_array_equal(table[slots], keys)


TILED_TRANSPOSE = metile.metal_kernel(
    "suite_tiled_transpose", ["inp"], ["out"],
    """
    threadgroup float tile[16][17];  // +1 column: no bank conflicts on the transposed read
    uint2 l = thread_position_in_threadgroup.xy;
    uint2 origin = threadgroup_position_in_grid.xy * 16;
    uint rows = inp_shape[0], cols = inp_shape[1];
    uint c = origin.x + l.x, r = origin.y + l.y;
    if (r < rows && c < cols) tile[l.y][l.x] = inp[r * cols + c];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint oc = origin.y + l.x, orow = origin.x + l.y;
    if (orow < cols && oc < rows) out[orow * rows + oc] = tile[l.x][l.y];
    """,
)


@case
def tiled_transpose(rng, check):
    x = f32(rng, 19, 33)
    (out,) = run(TILED_TRANSPOSE, check, inputs=[mx.array(x)], grid=(48, 32, 1), threadgroup=(16, 16, 1),
                 output_shapes=[(33, 19)], output_dtypes=[mx.float32])
    np.testing.assert_array_equal(out, x.T)


LONG_VECTORS = metile.metal_kernel(
    "suite_long_vectors", ["x"], ["out", "largest"],
    """
    uint i = thread_position_in_grid.x;
    long2 v = *(const device long2*)(x + 2 * i);
    *(device long2*)(out + 2 * i) = v * 3 - long2(LONG_MAX >> 40, 1);
    largest[i] = max(v.x, v.y);
    """,
)


@case
def long_vectors(rng, check):
    x = rng.integers(-(2**40), 2**40, size=42).astype(np.int64)
    out, largest = run(LONG_VECTORS, check, inputs=[mx.array(x)], grid=(21, 1, 1), threadgroup=(32, 1, 1),
                       output_shapes=[(42,), (21,)], output_dtypes=[mx.int64, mx.int64])
    np.testing.assert_array_equal(out, x * 3 - np.tile([(2**63 - 1) >> 40, 1], 21))
    np.testing.assert_array_equal(largest, x.reshape(-1, 2).max(1))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kernel_case", CASES, ids=[c.__name__ for c in CASES])
def test_suite_kernel(kernel_case, mode):
    kernel_case(np.random.default_rng(0), MODES[mode])


def test_suite_has_at_least_25_kernels():
    assert len(CASES) >= 25
