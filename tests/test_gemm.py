"""GEMM: the canonical dot recurrence lowered to matrix fragments (simdgroup_matrix on
MSL, WMMA / FFMA on CUDA), against NumPy on ragged shapes and every operand dtype.

Tolerances.  Products of float16 or bfloat16 values are exact in float32 and the
accumulation is float32 for every operand dtype, so with a float32 output every
dtype is held to strict FP32 (rtol=3e-4, atol=3e-5) against float64 products of
the same (rounded) inputs.  A float16 / bfloat16 output adds one rounding of the
result: rtol = 2 ulp at 1.0 (float16 2e-3, bfloat16 1.6e-2), atol scaled the same.
"""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from dsl_kernels import matmul as pointer_matmul
from dsl_kernels import single_dot
from metile_kernels.gemm import grid, matmul

SHAPES = [(1, 1, 1), (7, 9, 65), (63, 65, 17), (64, 64, 64), (100, 37, 129)]
STRICT = dict(rtol=3e-4, atol=3e-5)
OUTPUT_TOL = {"float32": STRICT, "float16": dict(rtol=2e-3, atol=2e-3),
              "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}


def operands(rng, m, n, k, dtype):
    d = getattr(mx, dtype)
    a = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(d)
    b = mx.array(rng.standard_normal((k, n)).astype(np.float32)).astype(d)
    exact = [np.array(x.astype(mx.float32)).astype(np.float64) for x in (a, b)]
    return a, b, exact[0] @ exact[1]


def check(out, ref, out_dtype="float32"):
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, **OUTPUT_TOL[out_dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matmul_ragged_shapes(rng, dtype):
    # One specialization per dtype: rows/columns/inner are runtime scalars.
    for m, n, k in SHAPES:
        a, b, ref = operands(rng, m, n, k, dtype)
        out = matmul[grid(m, n)](a, b, mx.zeros((m, n)), m, n, k)
        check(out, ref)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_narrow_output(rng, dtype):
    m, n, k = 63, 65, 17
    a, b, ref = operands(rng, m, n, k, dtype)
    out = matmul[grid(m, n)](a, b, mx.zeros((m, n), getattr(mx, dtype)), m, n, k)
    assert out.dtype == getattr(mx, dtype)
    check(out, ref, dtype)


def test_pointer_style_matmul_small_tile(rng):
    # Triton-style pointers + masks, 16x16x8 tile: a 2x2 grid of one-fragment SIMD-groups.
    for m, n, k in [(1, 1, 1), (33, 17, 20)]:
        a, b, ref = operands(rng, m, n, k, "float32")
        c = pointer_matmul[(metile.cdiv(m, 16), metile.cdiv(n, 16))](
            a, b, mx.zeros((m, n)), m, n, k, BM=16, BN=16, BK=8)
        check(c, ref)


@pytest.mark.parametrize("nsg", [1, 2])
def test_num_simdgroups(rng, nsg):
    m, n, k = 70, 33, 40
    a, b, ref = operands(rng, m, n, k, "float32")
    d = matmul[grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=32,
                                           BLOCK_N=32, BLOCK_K=8, num_simdgroups=nsg)
    assert d.call_kwargs["threadgroup"] == (32 * nsg, 1, 1)
    info = d.variant.data["lowering"]["matmul"]
    assert info["simdgroup_grid"][0] * info["simdgroup_grid"][1] == nsg
    check(d(), ref)


def test_ffma_path_when_the_tile_is_not_whole_fragments(rng):
    # BLOCK_K=4 is not a multiple of the 8-deep simdgroup_matrix: register micro-tiles.
    m, n, k = 37, 29, 23
    a, b, ref = operands(rng, m, n, k, "float32")
    d = matmul[grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=32,
                                           BLOCK_N=32, BLOCK_K=4)
    info = d.variant.data["lowering"]["matmul"]
    assert info["fragment"] == "ffma" and info["micro_tile"] == [4, 2]
    assert "simdgroup_matrix" not in d.source
    check(d(), ref)


def test_reference_dot_outside_a_recurrence(rng):
    a, b, ref = operands(rng, 8, 8, 8, "float32")
    check(single_dot[(1,)](a, b, mx.zeros((8, 8)), BM=8, BN=8, BK=8), ref)


# -- generated source ---------------------------------------------------------------------------

@metile.kernel
def user_matmul(left, right, output, rows, columns, inner,
                BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
                BLOCK_K: metile.constexpr = 16, RELAXED_PRECISION: metile.constexpr = False):
    # The specification's form, written by a user (same statements as the library kernel).
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                      block_shape=(BLOCK_K, BLOCK_N), access="read")
    c = metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                      block_shape=(BLOCK_M, BLOCK_N), access="write")
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    accumulator = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in metile.tile_range(0, inner, BLOCK_K):
        accumulator = metile.dot(a.load((row_origin, k)), b.load((k, column_origin)), accumulator)
    c.store((row_origin, column_origin), accumulator.to(output.dtype))


def prepare(kernel, dtype="float32", out="float32", m=64, n=64, k=64, **kw):
    a = mx.zeros((m, k), getattr(mx, dtype))
    b = mx.zeros((k, n), getattr(mx, dtype))
    return kernel[grid(m, n)].prepare(a, b, mx.zeros((m, n), getattr(mx, out)), m, n, k, **kw)


def fragment_ops(src: str) -> list[str]:
    return re.findall(r"(simdgroup_\w+|metile_frag_\w+)\(", src)


@pytest.mark.parametrize("backend", ["msl", "cuda"])
def test_user_kernel_in_the_spec_form_gets_the_same_lowering(backend):
    lib = prepare(matmul, "float16", backend=backend)
    user = prepare(user_matmul, "float16", backend=backend)
    assert lib.source == user.source
    assert lib.variant.data["lowering"] == user.variant.data["lowering"]


def test_pointer_and_view_forms_lower_alike():
    view = prepare(matmul, BLOCK_M=16, BLOCK_N=16, BLOCK_K=8, backend="msl")
    a, b = mx.zeros((64, 64)), mx.zeros((64, 64))
    pointer = pointer_matmul[(4, 4)].prepare(a, b, mx.zeros((64, 64)), 64, 64, 64, BM=16, BN=16,
                                             BK=8, backend="msl")
    assert fragment_ops(view.source) == fragment_ops(pointer.source)
    v, p = view.variant.data["lowering"]["matmul"], pointer.variant.data["lowering"]["matmul"]
    assert v == p


def test_msl_uses_simdgroup_matrix_and_a_register_epilogue():
    for dtype, t in [("float32", "float"), ("float16", "half"), ("bfloat16", "bfloat16_t")]:
        d = prepare(matmul, dtype, backend="msl")
        src = d.source
        assert f"metal::simdgroup_matrix<{t}, 8, 8> _fa" in src
        assert "metal::simdgroup_matrix<float, 8, 8> _facc" in src
        assert src.count("metal::simdgroup_multiply_accumulate(") == 16  # 4x4 per SIMD-group
        # The epilogue reads each lane's two accumulator elements where they are (the lane
        # layout of MLX's steel kernels and of the CPU runtime's simdgroup_matrix): no
        # threadgroup scratch, no SIMD-group barriers.
        assert src.count("thread_elements()") == 2 * 16
        assert "metal::simdgroup_barrier(" not in src
        info = d.variant.data["lowering"]["matmul"]
        assert info == {**info, "tile_shape": [64, 64, 16], "simdgroup_grid": [2, 2],
                        "threadgroup_size": [128, 1, 1], "staging": "threadgroup",
                        "fragment": "simdgroup_matrix 8x8", "operand_dtype": dtype,
                        "epilogue_regions": 0, "k_loop_masked": True,
                        "outer_bounds_proven": False}
    lowering = d.variant.data["lowering"]
    assert [a["name"] for a in lowering["allocations"]] == ["_sa1", "_sb2"]
    assert lowering["allocations"][0]["bytes"] == 64 * 16 * 2
    assert info["epilogue_from"] == "registers"
    assert [lp["induction_variable"] for lp in lowering["loops"]] == ["k", "kk", "f"]


@pytest.mark.parametrize("dtype,t", [("float16", "__half"), ("bfloat16", "__nv_bfloat16")])
def test_cuda_half_types_use_tensor_core_mma(dtype, t):
    d = prepare(matmul, dtype, backend="cuda")
    src = d.source
    kind = "f16" if dtype == "float16" else "bf16"
    # mma.sync through inline PTX: NVRTC under MLX cannot include <mma.h>
    assert "#include" not in src
    assert f'METILE_MMA_HALF("m16n8k16", "{kind}")' in src
    assert f"metile_frag_a<{t}> _fa" in src and "metile_frag_acc _facc" in src
    assert src.count("metile_frag_mma(") - 3 == 4  # 2x2 fragments per warp (+3 helper definitions)
    assert "metile_frag_a_tf32 _fa" not in src
    # operands staged by 16-byte cp.async into a ring of swizzled stages, fragments read
    # with ldmatrix (B transposed); the epilogue reads the accumulators in registers
    lowering = d.variant.data["lowering"]["matmul"]
    stages = lowering["stages"]
    assert stages >= 2 and lowering["async_copy"] and lowering["epilogue_from"] == "registers"
    assert f"__shared__ __align__(128) {t} _sa1[{stages * 64 * 16}];" in src
    assert "cp.async.cg.shared.global" in src and f"metile_cp_async_wait<{stages - 2}>();" in src
    assert "__syncwarp();" not in src and "_sc" not in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src and "metile_frag_load_sw<" in src
    assert lowering["fragment"] == "mma.sync m16n8k16 (16x16x16 fragments)"


def test_cuda_strict_float32_uses_ffma_and_tf32_only_when_relaxed():
    strict = prepare(matmul, backend="cuda")
    assert "mma.sync" not in strict.source and "tf32" not in strict.source
    assert strict.variant.data["lowering"]["matmul"]["fragment"] == "ffma"
    assert "float _acc3[32];" in strict.source  # an 8x4 register micro-tile per thread
    relaxed = prepare(matmul, RELAXED_PRECISION=True, backend="cuda")
    assert "metile_frag_a_tf32 _fa" in relaxed.source and "cvt.rna.tf32.f32" in relaxed.source
    assert relaxed.variant.data["lowering"]["matmul"]["fragment"] == "mma.sync m16n8k8 tf32 (16x16x8 fragments)"


def test_cuda_small_tile_falls_to_ffma():
    # A 16x16 tile over four warps leaves 8x8 per warp: not whole 16x16 WMMA fragments.
    d = prepare(matmul, "float16", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_simdgroups=4,
                backend="cuda")
    assert d.variant.data["lowering"]["matmul"]["fragment"] == "ffma" and "mma.sync" not in d.source


def test_gemm_output_coverage_is_proven_when_the_grid_covers_it():
    # The 2-D tile store writes every element exactly when grid * tile covers
    # (rows, columns) and the row stride equals columns: no preserve-mask output.
    m, n, k = 100, 37, 129
    args = (mx.zeros((m, k)), mx.zeros((k, n)), mx.zeros((m, n)), m, n, k)
    assert matmul[grid(m, n)].prepare(*args).tracked == []
    partial = matmul[(1, 1)].prepare(*args)
    assert partial.tracked == [0] and partial.variant.data["outputs"] == ["output", "output_written"]
    out = np.array(matmul[(1, 1)](mx.ones((m, k)), mx.ones((k, n)), mx.full((m, n), -1.0), m, n, k))
    np.testing.assert_array_equal(out[64:], -1.0)  # rows no program wrote keep the passed values
    np.testing.assert_array_equal(out[:64], float(k))
