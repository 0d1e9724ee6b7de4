"""The CUDA GEMM fast path (passes/gemm_async.py): 16-byte cp.async staging in a ring
of XOR-swizzled stages, ldmatrix fragments and the epilogue from registers.

Numbers: ragged shapes against NumPy for the large tiles the library uses on CUDA
(on the H200 these run the cp.async path; on CPU the same kernels run as MSL, which
keeps the ordinary staging).  K = 37 makes every row start misaligned for 16-byte
copies (the element-wise fallback), K = 72 aligned with a K tail, M and N cut
through the tiles.  Source: what the CUDA emitter prints and the report says."""

import mlx.core as mx
import numpy as np
import pytest

from metile_kernels.gemm import grid, matmul, matmul_epilogue
from test_gemm import operands

CONFIGS = [(128, 128, 32, 4), (128, 128, 32, 8), (128, 256, 32, 8), (64, 64, 16, 4), (64, 64, 32, 4)]
SHAPES = [(1, 1, 1), (130, 70, 37), (129, 257, 72)]
TOL = {"float16": dict(rtol=2e-3, atol=2e-3), "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bm,bn,bk,nsg", CONFIGS)
def test_large_tiles_ragged_fused_leaky(rng, dtype, bm, bn, bk, nsg):
    for m, n, k in SHAPES:
        a, b, acc = operands(rng, m, n, k, dtype)
        out = matmul_epilogue[grid(m, n, bm, bn)](
            a, b, mx.zeros((m, n), getattr(mx, dtype)), m, n, k, 1.25, -0.5, BLOCK_M=bm,
            BLOCK_N=bn, BLOCK_K=bk, num_simdgroups=nsg, EPILOGUE="affine_leaky",
            NEGATIVE_SLOPE=0.1)
        z = 1.25 * acc - 0.5
        ref = np.where(z > 0, z, 0.1 * z)
        got = np.array(out.astype(mx.float32)).astype(np.float64)
        np.testing.assert_allclose(got, ref, **TOL[dtype], err_msg=f"{m}x{n}x{k}")


def test_float32_output_from_registers(rng):
    m, n, k = 130, 70, 72
    a, b, ref = operands(rng, m, n, k, "float16")
    out = matmul[grid(m, n, 128, 128)](a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=128,
                                       BLOCK_N=128, BLOCK_K=32, num_simdgroups=4)
    np.testing.assert_allclose(np.array(out), ref, rtol=3e-4, atol=3e-5)


def _cuda(bm=128, bn=128, bk=32, nsg=4, dtype=mx.float16, m=256, n=256, k=256):
    a, b = mx.zeros((m, k), dtype), mx.zeros((k, n), dtype)
    return matmul_epilogue[grid(m, n, bm, bn)].prepare(
        a, b, mx.zeros((m, n), dtype), m, n, k, 1.0, 0.0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_simdgroups=nsg, EPILOGUE="relu", backend="cuda")


def test_cuda_source_and_report():
    d = _cuda()
    src, data = d.source, d.variant.data
    mm = data["lowering"]["matmul"]
    # 16 KiB per stage: three stages fill the 48 KiB of static shared memory
    assert mm["stages"] == 3 and mm["async_copy"] and mm["epilogue_from"] == "registers"
    assert set(mm["shared_layout"].values()) == {"xor-swizzled 16-byte chunks"}
    assert "async_pipeline_staging" in data["passes"] and "register_epilogue" in data["passes"]
    assert "__shared__ __align__(128) __half _sa1[12288];" in src
    assert "metile_cp_async_wait<1>();" in src and "metile_cp_async_wait<0>();" in src
    # A rows are 4 chunks (two rows per 128-byte line), B rows 16 chunks
    assert "metile_frag_load_sw<32, 2, 4>(" in src and "metile_frag_load_sw<128, 1, 8>(" in src
    # per operand and group in the two prologue stages and the loop (4 groups per thread):
    # one zero-filling copy under the test of all the thread's addresses, and the
    # per-group copy (with its own test) it falls back to (+ each helper's definition)
    assert src.count("metile_cp_async16_fill(") == 3 * 2 * 4 + 1
    assert src.count("metile_aligned16(") == 2 * 3 * 2 * 4 + 1


def test_cuda_wide_tile_takes_two_stages():
    mm = _cuda(128, 256, 32, 8).variant.data["lowering"]["matmul"]
    assert mm["stages"] == 2 and mm["simdgroup_grid"] == [2, 4]


def test_cuda_swizzle_is_a_permutation_of_chunks():
    # the copy and ldmatrix agree on one function; it must map each row's chunks 1:1 and
    # give the 8 rows one ldmatrix reads 8 different 16-byte bank groups
    from metile.passes.gemm_async import swizzle_params
    for ld in (16, 32, 64, 128, 256):
        u, cm = swizzle_params(ld, 8)
        chunks = ld // 8
        for r in range(64):
            moved = [c ^ ((r // u) % cm) for c in range(chunks)]
            assert sorted(moved) == list(range(chunks))
        for c in range(chunks):
            for r0 in range(0, 64, 8):
                groups = {((r * ld + 8 * (c ^ ((r // u) % cm))) // 8) % 8 for r in range(r0, r0 + 8)}
                assert len(groups) == 8, (ld, c, r0)
    assert swizzle_params(24, 8) is None and swizzle_params(8, 8) is None


FFMA_CONFIGS = [(128, 128, 16, 8), (128, 128, 32, 8), (64, 64, 16, 4), (128, 64, 16, 4)]


@pytest.mark.parametrize("bm,bn,bk,nsg", FFMA_CONFIGS)
def test_strict_float32_tiles_ragged(rng, bm, bn, bk, nsg):
    # on CUDA: scalar FMA micro-tiles fed by the cp.async ring with 16-byte operand reads
    # (misaligned rows at K = 37 take the element copies); on CPU the MSL kernels
    for m, n, k in SHAPES + [(260, 131, 100)]:
        a, b, acc = operands(rng, m, n, k, "float32")
        out = matmul_epilogue[grid(m, n, bm, bn)](
            a, b, mx.zeros((m, n)), m, n, k, 1.25, -0.5, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
            num_simdgroups=nsg, EPILOGUE="affine_leaky", NEGATIVE_SLOPE=0.1)
        z = 1.25 * acc - 0.5
        np.testing.assert_allclose(np.array(out), np.where(z > 0, z, 0.1 * z), rtol=2e-5,
                                   atol=2e-5, err_msg=f"{m}x{n}x{k}")


def test_cuda_strict_float32_source_and_report():
    d = _cuda(128, 128, 16, 8, dtype=mx.float32)
    src, data = d.source, d.variant.data
    mm = data["lowering"]["matmul"]
    # 16 KiB per stage: three stages in static shared memory; rows stay linear
    assert mm["fragment"] == "ffma" and mm["micro_tile"] == [8, 8]
    assert mm["stages"] == 3 and mm["async_copy"] and set(mm["shared_layout"].values()) == {"row-major"}
    assert {"async_pipeline_staging", "ffma_vector_reads", "whole_group_copies"} <= set(data["passes"])
    # per 4 K steps: 8 reads of A (one per micro-tile row) and 4 x 2 of B, in each of the
    # two loops (whole-group copies, and the one with per-tile copy tests); no run-time
    # address test on the kernel's own aligned stages
    assert src.count("*reinterpret_cast<const float4*>(&_sa") == 2 * 8
    assert src.count("*reinterpret_cast<const float4*>(&_sb") == 2 * 8
    assert "metile_load_vec<float4>(&_s" not in src
