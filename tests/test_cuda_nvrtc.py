"""Every CUDA path metile emits compiles with NVRTC for sm_80 and sm_90, on a
machine without a GPU (tests/nvrtc.py; the numbers come from the H200 runs in
tests/device-runs/).  Skipped where the nvidia-cuda-nvrtc wheel is missing."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from dsl_kernels import block_sum, layernorm, softmax_rows, transpose, vector_add, view_copy
from metile_kernels.gemm import grid, linear_epilogue, matmul, matmul_epilogue
from nvrtc import TOOLKIT, compile_cuda, translation_unit
from test_atomics import block_total, column_sums, histogram, thread_level_counts
from test_atomics_triton import SCATTER, cas_once, exchange, ticket_counter, uniform_max
from test_fragments import (INLINE, attention_tiles, half_products, masked_tiles, per_group_tiles,
                            relu_epilogue, transpose_tiles, two_products)
from test_schedule_lowering import axpy
from test_shape_and_scan_ops import (arg_axes, matmul_bt, regroup, row_argmax, scan_axes, scan_rows, scores,
                                     transpose_tiles as transpose_block)
from test_triton_parity import binary, converting_store, hinted, int_condition, math1, math2

pytestmark = pytest.mark.skipif(TOOLKIT is None, reason="needs the nvidia-cuda-nvrtc, "
                                                        "nvidia-cuda-runtime and nvidia-cuda-cccl "
                                                        "wheels (pip install '.[test]')")

F32, F16, BF16, I32 = mx.float32, mx.float16, mx.bfloat16, mx.int32


def _z(*shape, dtype=F32):
    return mx.zeros(shape, dtype)


def _gemm(dtype, m=72, n=40, k=44, kernel=matmul, tile=(32, 32, 16), **kw):
    # TRANSPOSE_B: the right operand as an nn.Linear weight is stored, (n, k)
    a, b = _z(m, k, dtype=dtype), _z(*((n, k) if kw.get("TRANSPOSE_B") else (k, n)), dtype=dtype)
    bm, bn, bk = tile
    extra = dict(EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.1) if kernel is matmul_epilogue else {}
    args = (a, b, _z(m, n), m, n, k) + ((1.5, -0.25) if kernel is matmul_epilogue else ())
    return kernel[grid(m, n, bm, bn)].prepare(*args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                              **extra, **kw)


def _linear(dtype, m, n, k, tile, **kw):
    bm, bn, bk = tile
    return linear_epilogue[grid(m, n, bm, bn)].prepare(
        _z(m, k, dtype=dtype), _z(*((n, k) if kw.get("TRANSPOSE_B") else (k, n)), dtype=dtype),
        _z(m, n, dtype=dtype),
        _z(max(m, n), dtype=dtype), _z(m, n, dtype=dtype), m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **kw)


CASES = {  # each builds a dispatch for `backend` (the test asks for "cuda")
    "vector_add": lambda backend=None: vector_add[(4,)].prepare(
        _z(1000), _z(1000), _z(1000), 1000, BLOCK=256, backend=backend),
    "softmax_half": lambda backend=None: softmax_rows[(4,)].prepare(
        _z(4, 100, dtype=F16), _z(4, 100, dtype=F16), 100, 100, BLOCK=128, backend=backend),
    "layernorm_bf16": lambda backend=None: layernorm[(4,)].prepare(
        _z(4, 100, dtype=BF16), _z(100, dtype=BF16), _z(100, dtype=BF16), _z(4, 100, dtype=BF16),
        100, 100, 1e-5, BLOCK=128, backend=backend),
    "transpose": lambda backend=None: transpose[(2, 2)].prepare(
        _z(40, 50), _z(50, 40), 40, 50, BM=32, BN=32, backend=backend),
    "block_sum": lambda backend=None: block_sum[(4,)].prepare(_z(4, 300), _z(4), 300,
                                                              backend=backend),
    "view_copy": lambda backend=None: view_copy[(1,)].prepare(_z(8, 8), _z(8, 8), backend=backend),
    "axpy_width_four": lambda backend=None: axpy[(3,)].prepare(
        _z(1500), _z(1500), _z(1500), 1.5, 1500, BLOCK=512,
        SCHEDULE=metile.Schedule(vector_width=4), backend=backend),
    "axpy_width_four_half": lambda backend=None: axpy[(2,)].prepare(
        _z(1000, dtype=F16), _z(1000, dtype=F16), _z(1000, dtype=F16), 1.5, 1000, BLOCK=512,
        SCHEDULE=metile.Schedule(vector_width=4), backend=backend),
    "gemm_f32_ffma": lambda backend=None: _gemm(F32, backend=backend),
    # strict float32 through the cp.async ring with 16-byte operand reads (ffma_vector_reads)
    "gemm_f32_ffma_vector_128": lambda backend=None: _gemm(
        F32, kernel=matmul_epilogue, tile=(128, 128, 16), num_simdgroups=8, backend=backend),
    "gemm_f32_ffma_vector_64": lambda backend=None: _gemm(
        F32, m=130, n=70, k=37, tile=(64, 64, 32), num_simdgroups=4, backend=backend),
    "gemm_f32_tf32": lambda backend=None: _gemm(F32, RELAXED_PRECISION=True, backend=backend),
    "gemm_f16_mma": lambda backend=None: _gemm(F16, backend=backend),
    "gemm_bf16_mma": lambda backend=None: _gemm(BF16, backend=backend),
    "gemm_f16_epilogue_128": lambda backend=None: _gemm(
        F16, 256, 256, 256, matmul_epilogue, (128, 128, 32), num_simdgroups=8, backend=backend),
    "gemm_f16_width_four": lambda backend=None: _gemm(
        F16, SCHEDULE=metile.Schedule(vector_width=4), backend=backend),
    "gemm_bf16_width_four": lambda backend=None: _gemm(
        BF16, SCHEDULE=metile.Schedule(vector_width=4), backend=backend),
    "gemm_f32_width_four": lambda backend=None: _gemm(
        F32, SCHEDULE=metile.Schedule(vector_width=4), backend=backend),
    "gemm_f16_double_buffer": lambda backend=None: _gemm(
        F16, 75, 45, 37, SCHEDULE=metile.Schedule(double_buffer=True), backend=backend),
    "gemm_f32_double_buffer": lambda backend=None: _gemm(
        F32, 96, 96, 64, SCHEDULE=metile.Schedule(double_buffer=True), backend=backend),
    # Schedule(num_stages=...) and grouped program order (tests/test_gemm_stages_and_order.py)
    "gemm_f16_stages_1": lambda backend=None: _gemm(
        F16, 75, 45, 37, SCHEDULE=metile.Schedule(num_stages=1), backend=backend),
    "gemm_f16_stages_2": lambda backend=None: _gemm(
        F16, 75, 45, 37, SCHEDULE=metile.Schedule(num_stages=2), backend=backend),
    "gemm_f16_stages_3": lambda backend=None: _gemm(
        F16, 200, 136, 72, matmul_epilogue, (64, 64, 32), SCHEDULE=metile.Schedule(num_stages=3),
        backend=backend),
    "gemm_bf16_stages_4": lambda backend=None: _gemm(
        BF16, 75, 45, 37, SCHEDULE=metile.Schedule(num_stages=4), backend=backend),
    "gemm_f16_grouped": lambda backend=None: _gemm(
        F16, 200, 136, 72, matmul_epilogue, (64, 64, 32),
        SCHEDULE=metile.Schedule(program_order="grouped", group_size=3), backend=backend),
    "gemm_f32_grouped_two_stages": lambda backend=None: _gemm(
        F32, 150, 90, 37, SCHEDULE=metile.Schedule(num_stages=2, group_size=2), backend=backend),
    "gemm_ffma_fallback_double_buffer": lambda backend=None: _gemm(
        F32, 70, 50, 37, tile=(32, 32, 4), SCHEDULE=metile.Schedule(double_buffer=True),
        backend=backend),
    # epilogues that read (tests/test_epilogue_reads.py): bias per column / row, residual
    "gemm_f16_bias_gelu_residual": lambda backend=None: _linear(
        F16, 200, 136, 72, (128, 128, 32), num_simdgroups=8, BIAS="columns", RESIDUAL=True,
        EPILOGUE="gelu_tanh", backend=backend),
    "gemm_bf16_row_bias": lambda backend=None: _linear(
        BF16, 75, 45, 37, (32, 32, 16), BIAS="rows", EPILOGUE="relu", backend=backend),
    "gemm_f32_ffma_bias_residual": lambda backend=None: _linear(
        F32, 70, 50, 37, (32, 32, 16), BIAS="columns", RESIDUAL=True, backend=backend),
    # the weight read as stored (TRANSPOSE_B, tests/test_gemm_transposed_b.py): ordinary
    # staged loads, since the tile is contiguous along K, not the copied N axis
    "gemm_f16_transposed_b_128": lambda backend=None: _gemm(
        F16, 256, 256, 256, matmul_epilogue, (128, 128, 32), num_simdgroups=8, TRANSPOSE_B=True,
        backend=backend),
    "gemm_f16_transposed_b_bias_gelu_residual": lambda backend=None: _linear(
        F16, 200, 136, 72, (128, 128, 32), num_simdgroups=8, BIAS="columns", RESIDUAL=True,
        EPILOGUE="gelu_tanh", TRANSPOSE_B=True, backend=backend),
    "gemm_bf16_transposed_b_small_tile_silu": lambda backend=None: _linear(
        BF16, 75, 45, 37, (64, 64, 32), num_simdgroups=4, BIAS="columns",
        EPILOGUE="sigmoid_gated", TRANSPOSE_B=True, backend=backend),
    "gemm_f16_transposed_b_stages_2": lambda backend=None: _gemm(
        F16, 75, 45, 37, matmul_epilogue, (64, 64, 32), TRANSPOSE_B=True,
        SCHEDULE=metile.Schedule(num_stages=2), backend=backend),
    "gemm_f32_ffma_transposed_b": lambda backend=None: _linear(
        F32, 70, 50, 37, (32, 32, 16), BIAS="columns", RESIDUAL=True, TRANSPOSE_B=True,
        backend=backend),
    "gemm_f32_tf32_transposed_b": lambda backend=None: _gemm(
        F32, 70, 50, 37, matmul_epilogue, (64, 64, 32), RELAXED_PRECISION=True, TRANSPOSE_B=True,
        backend=backend),
    "fragments_two_products": lambda backend=None: two_products[(1,)].prepare(
        _z(8, 8), _z(8, 8), _z(8, 8), STRICT_MATH=True, SCHEDULE=INLINE, backend=backend),
    "fragments_masked_tiles": lambda backend=None: masked_tiles[(1,)].prepare(
        _z(24, 8), mx.array([9], I32), _z(24, 8), STRICT_MATH=True, SCHEDULE=INLINE,
        backend=backend),
    "fragments_attention": lambda backend=None: attention_tiles[(1,)].prepare(
        _z(16, 16), _z(16, 16), _z(16, 16), _z(16, 16), N=16, STRICT_MATH=True, SCHEDULE=INLINE,
        backend=backend),
    "fragments_half": lambda backend=None: half_products[(1,)].prepare(
        _z(8, 8, dtype=F16), _z(8, 8, dtype=F16), _z(8, 8), _z(64, dtype=F16), STRICT_MATH=True,
        SCHEDULE=INLINE, backend=backend),
    "fragments_per_group": lambda backend=None: per_group_tiles[(1,)].prepare(
        _z(32, 8), _z(32, 8), BLOCK=128, STRICT_MATH=True, SCHEDULE=INLINE, backend=backend),
    "fragments_column_major": lambda backend=None: transpose_tiles[(1,)].prepare(
        _z(13, 8), mx.array([13], I32), _z(8, 16), STRICT_MATH=True, SCHEDULE=INLINE,
        backend=backend),
    "fragments_epilogue": lambda backend=None: relu_epilogue[(1,)].prepare(
        _z(16, 8), mx.array([9], I32), _z(16, 8), STRICT_MATH=True, SCHEDULE=INLINE,
        backend=backend),
    "atomic_histogram": lambda backend=None: histogram[(4,)].prepare(
        _z(1000, dtype=I32), _z(10, dtype=I32), 1000, BLOCK=256, backend=backend),
    "atomic_scalar": lambda backend=None: block_total[(4,)].prepare(
        _z(1000), _z(1), 1000, BLOCK=256, backend=backend),
    "atomic_unsigned_2d": lambda backend=None: column_sums[(4,)].prepare(
        _z(50, 8, dtype=mx.uint32), _z(8, dtype=mx.uint32), 50, BLOCK_R=16, COLS=8,
        backend=backend),
    "atomic_thread_level": lambda backend=None: thread_level_counts[(1,)].prepare(
        _z(200, dtype=I32), _z(6, dtype=I32), _z(1, dtype=I32), 200, num_simdgroups=2,
        backend=backend),
    # Triton's atomics (tests/test_atomics_triton.py): every kind, old values, init from input
    **{f"atomic_{k}_{d}": (lambda k=k, d=d: lambda backend=None: SCATTER[k][(2,)].prepare(
        _z(13, dtype=d), _z(200, dtype=I32), _z(200, dtype=d), 200, BLOCK=128,
        backend=backend))()
       for k, d in (("max", mx.float32), ("min", mx.float32), ("max", I32), ("min", mx.uint32),
                    ("and", I32), ("or", mx.uint32), ("xor", I32))},
    "atomic_xchg_float": lambda backend=None: exchange[(2,)].prepare(
        _z(80), _z(70), _z(70), 70, BLOCK=64, backend=backend),
    "atomic_cas_float": lambda backend=None: cas_once[(1,)].prepare(
        _z(64), _z(64), _z(64), _z(64), 64, BLOCK=64, backend=backend),
    "atomic_cas_int": lambda backend=None: cas_once[(1,)].prepare(
        _z(64, dtype=I32), _z(64, dtype=I32), _z(64, dtype=I32), _z(64, dtype=I32), 64,
        BLOCK=64, backend=backend),
    "atomic_ticket": lambda backend=None: ticket_counter[(2,)].prepare(
        _z(1, dtype=I32), _z(100, dtype=I32), 100, BLOCK=64, backend=backend),
    "atomic_uniform_old": lambda backend=None: uniform_max[(4,)].prepare(
        _z(1, dtype=I32), _z(4, dtype=I32), 7, backend=backend),
    # Triton's promotion, store conversion, integer where and math (tests/test_triton_parity.py)
    "triton_promote_half_bf16": lambda backend=None: binary[(8,)].prepare(
        _z(1000, dtype=F16), _z(1000, dtype=BF16), _z(1000), 1000, OP="add", OUT=metile.float32,
        BLOCK=128, backend=backend),
    "triton_promote_int_unsigned": lambda backend=None: binary[(8,)].prepare(
        _z(1000, dtype=I32), _z(1000, dtype=mx.uint32), _z(1000, dtype=mx.uint32), 1000,
        OP="max", OUT=metile.uint32, BLOCK=128, backend=backend),
    "triton_store_bf16_and_bool": lambda backend=None: converting_store[(8,)].prepare(
        _z(1000), _z(1000, dtype=mx.bool_), 1000, BLOCK=128, backend=backend),
    "triton_where_int_condition": lambda backend=None: int_condition[(8,)].prepare(
        _z(1000, dtype=I32), _z(1000, dtype=F16), _z(1000, dtype=F16), 1000, BLOCK=128,
        backend=backend),
    "triton_hints_static_range": lambda backend=None: hinted[(8,)].prepare(
        _z(1000), _z(1000), 1000, BLOCK=128, backend=backend),
    **{f"triton_math_{name}_{dt}": (lambda name, dtype: lambda backend=None: math1[(8,)].prepare(
        _z(1000, dtype=dtype), _z(1000, dtype=dtype), 1000, FN=getattr(metile.math, name),
        BLOCK=128, backend=backend))(name, dtype)
       for name in ("log2", "sin", "cos", "tan", "asin", "acos", "atan", "floor", "ceil")
       for dt, dtype in (("f32", F32), ("bf16", BF16))},
    **{f"triton_math_{name}_{dt}": (lambda name, dtype: lambda backend=None: math2[(8,)].prepare(
        _z(1000, dtype=dtype), _z(1000, dtype=dtype), _z(1000, dtype=dtype), 1000,
        FN=getattr(metile.math, name), BLOCK=128, backend=backend))(name, dtype)
       for name in ("pow", "atan2") for dt, dtype in (("f32", F32), ("f16", F16))},
    # shape ops, index reductions and scans (tests/test_shape_and_scan_ops.py)
    "shape_transpose_bf16": lambda backend=None: transpose_block[(5, 2)].prepare(
        _z(65, 33, dtype=BF16), _z(33, 65, dtype=BF16), 65, 33, HOW="T", BM=16, BN=32,
        backend=backend),
    "shape_reshape_then_trans": lambda backend=None: regroup[(1,)].prepare(
        _z(2, 32, dtype=F16), _z(4, 16, dtype=F16), A=2, B=32, C=16, D=4, backend=backend),
    "shape_dot_transposed": lambda backend=None: scores[(1,)].prepare(
        _z(16, 8, dtype=F16), _z(24, 8, dtype=F16), _z(16, 24), M=16, N=24, D=8,
        backend=backend),
    "shape_gemm_f16_transposed_operand": lambda backend=None: matmul_bt[(2, 2)].prepare(
        _z(40, 20, dtype=F16), _z(36, 20, dtype=F16), _z(40, 36), 40, 36, 20, BM=32, BN=32,
        BK=16, backend=backend),
    "shape_gemm_f32_transposed_operand": lambda backend=None: matmul_bt[(2, 2)].prepare(
        _z(40, 20), _z(36, 20), _z(40, 36), 40, 36, 20, BM=32, BN=32, BK=16, backend=backend),
    "argmax_rows_f16_1024": lambda backend=None: row_argmax[(3,)].prepare(
        _z(3, 1000, dtype=F16), _z(3, dtype=I32), _z(3, dtype=I32), _z(3, dtype=F16), 1000,
        FILL=float("-inf"), KIND="max", LEFT=True, BLOCK=1024, backend=backend),
    "argmin_axes_i32": lambda backend=None: arg_axes[(1,)].prepare(
        _z(9, 33, dtype=I32), _z(9, dtype=I32), _z(33, dtype=I32), _z(1, dtype=I32),
        _z(9, dtype=I32), M=9, N=33, LEFT=False, backend=backend),
    "cumsum_rows_bf16": lambda backend=None: scan_rows[(2,)].prepare(
        _z(2, 65, dtype=BF16), _z(2, 65, dtype=BF16), 65, KIND="sum", REVERSE=True, BLOCK=128,
        backend=backend),
    "cumprod_rows_f32": lambda backend=None: scan_rows[(2,)].prepare(
        _z(2, 65), _z(2, 65), 65, KIND="prod", REVERSE=False, BLOCK=128, backend=backend),
    "cumsum_axes_i32": lambda backend=None: scan_axes[(1,)].prepare(
        _z(9, 33, dtype=I32), _z(9, 33, dtype=I32), _z(9, 33, dtype=I32), _z(9, 33, dtype=I32),
        M=9, N=33, backend=backend),
}


# Everything for the H200's sm_90; the tensor-core paths (mma.sync, ldmatrix) for sm_80 too.
ARCHS = [(case, "sm_90") for case in sorted(CASES)] + \
    [(case, "sm_80") for case in sorted(CASES) if case.startswith(("gemm_f16", "gemm_bf16", "gemm_f32_tf32"))]


@pytest.mark.slow
@pytest.mark.parametrize("case,arch", ARCHS)
def test_generated_cuda_compiles(case, arch):
    dispatch = CASES[case](backend="cuda")
    source = translation_unit(dispatch)
    ok, log = compile_cuda(source, arch)
    assert ok, f"{case} for {arch}:\n{log}"


def test_a_compile_error_is_reported():
    # the check itself can fail: a body NVRTC rejects comes back with its log
    ok, log = compile_cuda('extern "C" __global__ void k(float* y) { y[0] = undefined_name; }',
                           "sm_90")
    assert not ok and "undefined_name" in log


def test_ffma_fallback_numbers_on_this_device(rng):
    # (the CPU twin of one case above, so the case is known to lower to something correct)
    a = mx.array(rng.standard_normal((70, 37)).astype(np.float32))
    b = mx.array(rng.standard_normal((37, 50)).astype(np.float32))
    out = matmul[grid(70, 50, 32, 32)](a, b, _z(70, 50), 70, 50, 37, BLOCK_M=32, BLOCK_N=32,
                                       BLOCK_K=4, SCHEDULE=metile.Schedule(double_buffer=True))
    np.testing.assert_allclose(np.array(out), np.array(a) @ np.array(b), rtol=3e-4, atol=3e-5)


@metile.kernel
def half_to_bool(X, Z, B):
    o = metile.arange(0, 8)
    x = metile.load(X + o)
    metile.store(Z + o, x.to(metile.bool_))
    metile.store(B + o, x)          # a store into a bool buffer converts as `!= 0` too


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_to_bool_compiles_and_is_nonzero(dtype):
    # (CUDA's `__half != 0` is ambiguous between its overloads: NVRTC refused every
    # float16/bfloat16 -> bool conversion)
    from nvrtc import mlx_translation_unit
    values = np.array([0.0, -0.0, 1.5, -2.0, np.nan, np.inf, 1e-3, 0.0], np.float32)
    x = mx.array(values).astype(dtype)
    args = (x, mx.zeros((8,), mx.bool_), mx.zeros((8,), mx.bool_))
    d = half_to_bool[(1,)].prepare(*args, backend="cuda")
    for source in (translation_unit(d), mlx_translation_unit(d)[1]):
        ok, log = compile_cuda(source, "sm_90")
        assert ok, log
    want = values != 0
    for got in half_to_bool[(1,)](*args):
        np.testing.assert_array_equal(np.array(got), want)
