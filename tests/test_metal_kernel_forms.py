"""MSL forms a Metal kernel author writes that the CPU runtime ran wrongly or refused (a
hostile trial, thirty-first session): C-style vector casts, threadgroup declarations of
several names, alignment and vector element types.  Numbers against NumPy; each failed
before its fix (a bit reinterpretation, per-thread locals, a compile error).
"""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.runtime.msl_cpu.compiler import MslCompileError


def run(source, x, out_shape, dtype=mx.float32, threads=32, header=""):
    k = metile.metal_kernel(name="forms", input_names=["x"], output_names=["y"], source=source,
                            header=header)
    return np.array(k(inputs=[x], grid=(threads, 1, 1), threadgroup=(threads, 1, 1),
                      output_shapes=[out_shape], output_dtypes=[dtype])[0])


@pytest.mark.parametrize("cast,want", [
    ("float4 f = (float4)iv;", 10.0),                         # int -> float, element-wise
    ("float4 f = (float4)(iv);", 10.0),
    ("float4 f = (float4)-iv.wzyx;", -10.0),                  # a unary operand with a swizzle
    ("float4 f = (float4)(int4)(float4(iv) + 0.75f);", 10.0),  # a cast of a cast truncates
    ("float4 f = (float4)(half4)float4(iv);", 10.0),          # elements of another width
])
def test_c_style_vector_casts_convert_each_element(cast, want):
    # ((float4)int4(1, 2, 3, 4) summed to 1.4e-44: clang's cast reinterprets the bits)
    out = run(f"""
        int4 iv = int4(x[0], x[1], x[2], x[3]);
        {cast}
        y[0] = f.x + f.y + f.z + f.w;""", mx.array([1, 2, 3, 4], mx.int32), (1,), threads=1)
    assert out[0] == want


def test_threadgroup_declarations_of_several_names_alignment_and_vectors():
    # (`threadgroup float a[32], b[32];` and the aligned forms were per-thread locals;
    # `threadgroup float4 t[32];` did not compile)
    x = mx.arange(32).astype(mx.float32)
    out = run("""
        threadgroup float a[32], b[32];
        threadgroup alignas(32) float c[32];
        threadgroup float4 t[32] __attribute__((aligned(64)));
        uint i = thread_position_in_threadgroup.x;
        a[i] = x[i];
        b[i] = 2.0f * x[i];
        c[i] = 3.0f * x[i];
        t[i] = float4(x[i], 0.0f, 0.0f, 1.0f);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        y[i] = a[31 - i] + b[31 - i] + c[31 - i] + t[31 - i].x + t[31 - i].w
               + float(((ulong)&c[0] % 32) + ((ulong)&t[0] % 64));""", x, (32,))
    np.testing.assert_array_equal(out, 7.0 * np.arange(31, -1, -1) + 1.0)


@pytest.mark.parametrize("source,header", [
    ("threadgroup float z = 1.0f; y[0] = z;", ""),
    ("y[0] = helper(x[0]);",
     "float helper(float v) { threadgroup float sh[32]; sh[0] = v; return sh[0]; }"),
])
def test_threadgroup_variables_metal_refuses_are_errors(source, header):
    # (an initialised one, or one in a helper function, silently became a per-thread local)
    with pytest.raises(MslCompileError, match="a threadgroup variable is shared by the group "
                                              "only when it is declared in the kernel body"):
        run(source, mx.ones((1,)), (1,), threads=1, header=header)


def test_mlx_fixed_rank_elem_to_loc():
    # (elem_to_loc_1/2/3 of MLX's utils were undeclared)
    a = mx.arange(24).astype(mx.float32).reshape(2, 3, 4)
    view = a.transpose(2, 0, 1)          # (4, 2, 3), strides (1, 12, 4)
    k = metile.metal_kernel(name="fixed_rank", input_names=["v"], output_names=["y"],
                            ensure_row_contiguous=False, source="""
        uint3 e = thread_position_in_grid;
        uint i = (e.z * 2 + e.y) * 3 + e.x;
        y[i] = v[elem_to_loc_3(e, v_strides)] + 100.0f * v[elem_to_loc_1(e.x, v_strides[2])]
               + 1000.0f * v[elem_to_loc_2(uint2(e.x, e.y), v_strides + 1)];""")
    out = k(inputs=[view], grid=(3, 2, 4), threadgroup=(1, 1, 1), output_shapes=[(24,)],
            output_dtypes=[mx.float32])[0]
    v = np.array(view)
    z, y, x = np.meshgrid(range(4), range(2), range(3), indexing="ij")
    flat = np.arange(24, dtype=np.float32)
    strides = np.array([1, 12, 4])
    want = v[z, y, x] + 100 * flat[x * strides[2]] + 1000 * flat[y * strides[1] + x * strides[2]]
    np.testing.assert_array_equal(np.array(out), want.reshape(-1))


@pytest.mark.parametrize("header", ["metal_simdgroup", "metal_atomic", "metal_math",
                                    "metal_integer", "metal_compute", "metal_simdgroup_matrix"])
def test_metal_library_headers_under_the_strict_check(header, monkeypatch):
    # (the strict check took the runtime shim's header, C++20: "no template named
    # 'is_same_v'", "constexpr if is a C++17 extension")
    monkeypatch.setenv("METILE_MSL_STRICT", "1")
    out = run("uint i = thread_position_in_grid.x; y[i] = simd_sum(x[i]);", mx.ones((32,)),
              (32,), header=f"#include <{header}>\n")
    np.testing.assert_array_equal(out, np.full(32, 32.0))


def test_a_float64_template_argument_is_refused():
    # (it compiled as `double`, even under the strict check; Metal has none)
    k = metile.metal_kernel(name="tdouble", input_names=["x"], output_names=["y"],
                            source="y[0] = T(x[0]);")
    with pytest.raises(TypeError, match="template argument float64: Metal has no double"):
        k(inputs=[mx.ones((1,))], template=[("T", mx.float64)], grid=(1, 1, 1),
          threadgroup=(1, 1, 1), output_shapes=[(1,)], output_dtypes=[mx.float32])
