"""General products (a `dot` outside the fast GEMM lowering) on the matrix unit
(passes/lower_dot_fragments.py): numbers against NumPy on the CPU runtime (Metal's
simdgroup_matrix, race-checked), which products take it and which keep the per-element
loop, the fallback where fragments would pass the threadgroup-memory limit, and the CUDA
spelling (mma.sync fragments, off under METILE_DOT_FRAGMENTS=0). On a GPU the tests run on
its backend, and count that backend's fragment products (CUDA's are m16n16k16, 16-bit)."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from nvrtc import TOOLKIT, compile_cuda, translation_unit

TOL = {mx.float32: 2e-5, mx.float16: 3e-3, mx.bfloat16: 2e-2}
# the call each backend's fragment product is spelt with (not its helper's definition)
PRODUCT = {"msl": "metal::simdgroup_multiply_accumulate(", "cuda": "metile_frag_mma(_dacc"}


def products(dispatch) -> int:
    """The fragment products in a launch's source, on whichever backend it runs."""
    return dispatch.source.count(PRODUCT[dispatch.spec.backend.language])


def on_fragments(dispatch, dtype, *dots) -> int:
    """How many of the products `dots` ((M, N, K) each) take fragments on the launch's
    backend: Metal's 8x8x8 simdgroup_matrix for every float dtype, CUDA's m16n16k16
    mma.sync for 16-bit operands only (strict float32 never runs on TF32)."""
    if dispatch.spec.backend.language == "msl":
        return sum(all(x % 8 == 0 for x in dot) for dot in dots)
    if dtype == mx.float32:
        return 0
    return sum(all(x % 16 == 0 for x in dot) for dot in dots)


@metile.kernel
def two_products(A, B, C, Out, m, n, k, d, BM: metile.constexpr, BN: metile.constexpr,
                 BK: metile.constexpr, BD: metile.constexpr):
    """Out = softmax_rows(A @ B) @ C for one (BM, BD) block: two products per program, a
    row reduction between them (attention's shape), ragged edges read as zero."""
    rm = metile.arange(0, BM)
    rn = metile.arange(0, BN)
    rk = metile.arange(0, BK)
    rd = metile.arange(0, BD)
    a = metile.load(A + rm[:, None] * k + rk[None, :], mask=(rm[:, None] < m) & (rk[None, :] < k),
                    other=0.0)
    b = metile.load(B + rk[:, None] * n + rn[None, :], mask=(rk[:, None] < k) & (rn[None, :] < n),
                    other=0.0)
    s = metile.dot(a, b)
    s = metile.where(rn[None, :] < n, s, -float("inf"))
    p = metile.exp(s - metile.max(s, axis=1)[:, None])
    p = p / metile.sum(p, axis=1)[:, None]
    c = metile.load(C + rn[:, None] * d + rd[None, :], mask=(rn[:, None] < n) & (rd[None, :] < d),
                    other=0.0)
    out = metile.dot(p.to(c.dtype), c, metile.full((BM, BD), 0.5, dtype=metile.float32))
    metile.store(Out + rm[:, None] * d + rd[None, :], out,
                 mask=(rm[:, None] < m) & (rd[None, :] < d))


def operands(rng, m, n, k, d, dtype):
    def make(shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32) * 0.5).astype(dtype)
    return make((m, k)), make((k, n)), make((n, d))


def reference(a, b, c):
    f = [np.array(x.astype(mx.float32), np.float64) for x in (a, b, c)]
    s = f[0] @ f[1]
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    # p is rounded to c's dtype before the second product, as the kernel does
    p = np.array(mx.array(p.astype(np.float32)).astype(c.dtype).astype(mx.float32), np.float64)
    return p @ f[2] + 0.5


def launch(a, b, c, blocks, backend=None):
    (m, k), n, d = a.shape, b.shape[1], c.shape[1]
    bm, bn, bk, bd = blocks
    kw = {"backend": backend} if backend else {}
    return two_products[(1,)].prepare(a, b, c, mx.zeros((m, d), mx.float32), m, n, k, d, BM=bm,
                                      BN=bn, BK=bk, BD=bd, **kw)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k,d,blocks", [(16, 32, 16, 16, (16, 32, 16, 16)),
                                            (13, 27, 11, 20, (16, 32, 16, 32)),
                                            (30, 8, 40, 9, (32, 8, 64, 16)),
                                            # 64-key rows on two warps' lanes (rows_reduce's
                                            # partials), as attention's score rows
                                            (11, 50, 16, 16, (16, 64, 16, 16))])
def test_two_products_against_numpy(rng, monkeypatch, dtype, m, n, k, d, blocks):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")   # every lane order, compared
    a, b, c = operands(rng, m, n, k, d, dtype)
    dispatch = launch(a, b, c, blocks)
    bm, bn, bk, bd = blocks
    assert products(dispatch) == on_fragments(dispatch, dtype, (bm, bn, bk), (bm, bd, bn))
    np.testing.assert_allclose(np.array(dispatch()), reference(a, b, c), rtol=TOL[dtype],
                               atol=TOL[dtype])


def test_products_not_made_of_fragments_keep_the_element_loop(rng):
    # K = 4 is not a whole 8-deep fragment: the first product runs per element, the
    # second (K = 16) on the matrix unit
    a, b, c = operands(rng, 8, 16, 4, 8, mx.float16)
    dispatch = launch(a, b, c, (8, 16, 4, 8))
    assert products(dispatch) == on_fragments(dispatch, mx.float16, (8, 16, 4), (8, 8, 16))
    np.testing.assert_allclose(np.array(dispatch()), reference(a, b, c), rtol=3e-3, atol=3e-3)


def test_past_the_threadgroup_limit_products_run_per_element(rng):
    # float32 blocks of whole fragments (64x32 scores over K = 32, 32 columns out) whose
    # operand copies and scratch would pass the CPU runtime's 32 KiB: lowered again
    # without fragments, as before they existed
    a, b, c = operands(rng, 64, 32, 32, 32, mx.float32)
    dispatch = launch(a, b, c, (64, 32, 32, 32))
    if dispatch.spec.backend.language == "msl":   # (CUDA's 48 KB holds them)
        assert products(dispatch) == 0
    np.testing.assert_allclose(np.array(dispatch()), reference(a, b, c), rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(TOOLKIT is None, reason="needs the NVRTC wheels")
def test_cuda_products_unless_turned_off(rng, monkeypatch):
    # the mma.sync spelling compiles and is the default; METILE_DOT_FRAGMENTS=0 turns it off
    a, b, c = operands(rng, 16, 32, 16, 16, mx.float16)
    monkeypatch.setenv("METILE_DOT_FRAGMENTS", "0")
    assert products(launch(a, b, c, (16, 32, 16, 16), "cuda")) == 0
    monkeypatch.delenv("METILE_DOT_FRAGMENTS")
    dispatch = launch(a, b, c, (16, 32, 16, 16), "cuda")
    assert products(dispatch) == 2
    ok, log = compile_cuda(translation_unit(dispatch), "sm_90")
    assert ok, log


@metile.kernel
def transposed_and_chained(A, Bt, C, Out, BM: metile.constexpr, BN: metile.constexpr,
                           BK: metile.constexpr):
    """out = (a @ btᵀ rounded) @ c + a @ btᵀ: a transposed operand (copied to threadgroup
    memory first), a product of a product, the first product as the second's acc."""
    rm, rn, rk = metile.arange(0, BM), metile.arange(0, BN), metile.arange(0, BK)
    a = metile.load(A + rm[:, None] * BK + rk[None, :])
    bt = metile.load(Bt + rn[:, None] * BK + rk[None, :])
    c = metile.load(C + rn[:, None] * BN + rn[None, :])
    ab = metile.dot(a, metile.trans(bt))
    metile.store(Out + rm[:, None] * BN + rn[None, :], metile.dot(ab.to(a.dtype), c, ab))


@pytest.mark.parametrize("bk", [24, 32])   # (CUDA's fragments take K = 32 only)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_transposed_operands_and_chained_products(rng, monkeypatch, dtype, bk):
    # the transposed operand's fragments are loaded transposed from its own copy
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    bt = mx.array(rng.standard_normal((32, bk)).astype(np.float32)).astype(dtype)
    c = mx.array(rng.standard_normal((32, 32)).astype(np.float32)).astype(dtype)
    a = mx.array(rng.standard_normal((16, bk)).astype(np.float32)).astype(dtype)
    d = transposed_and_chained[(1,)].prepare(a, bt, c, mx.zeros((16, 32)), BM=16, BN=32, BK=bk)
    assert products(d) == on_fragments(d, dtype, (16, 32, bk), (16, 32, 32))
    check_chained(d, a, bt, c, dtype)


def check_chained(d, a, bt, c, dtype):
    """transposed_and_chained's result against NumPy: round(a btᵀ) c + a btᵀ, the first
    product rounded to the operands' dtype as the kernel's second product reads it."""
    f = [np.array(x.astype(mx.float32), np.float64) for x in (a, bt, c)]
    ab = f[0] @ f[1].T
    rounded = np.array(mx.array(ab.astype(np.float32)).astype(dtype).astype(mx.float32), np.float64)
    want = rounded @ f[2] + ab
    np.testing.assert_allclose(np.array(d()), want, rtol=TOL[dtype] * 4,
                               atol=TOL[dtype] * 4 * np.abs(want).max())


# -- the accumulator layout (passes/mma_layout.py) ---------------------------------------------

def passes(dispatch) -> list:
    return dispatch.variant.data["passes"]


@pytest.mark.parametrize("warps", [1, 2])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k,d,blocks", [(13, 27, 11, 20, (16, 32, 16, 32)),
                                            (30, 16, 40, 9, (32, 16, 64, 16))])
def test_products_and_softmax_in_the_accumulator_layout(rng, monkeypatch, dtype, m, n, k, d,
                                                         blocks, warps):
    # one warp an 8-row slab (Metal; CUDA's are 16 rows): the scores, their row max/sum and
    # the second product's left operand stay in registers; every lane order compared
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    a, b, c = operands(rng, m, n, k, d, dtype)
    bm, bn, bk, bd = blocks
    dispatch = two_products[(1,)].prepare(a, b, c, mx.zeros((m, d), mx.float32), m, n, k, d,
                                          BM=bm, BN=bn, BK=bk, BD=bd, num_warps=warps)
    language = dispatch.spec.backend.language
    if language == "msl" or (dtype != mx.float32 and bm % (16 * warps) == 0):
        assert "mma_layout" in passes(dispatch)
        note = next(n for n in json.loads(dispatch.explain())["notes"] if "(mma_layout)" in n)
        assert f"each SIMD-group owns {bm // warps} rows" in note, note
    np.testing.assert_allclose(np.array(dispatch()), reference(a, b, c), rtol=TOL[dtype],
                               atol=TOL[dtype])
    monkeypatch.setenv("METILE_MMA_LAYOUT", "0")   # the lane layout: the same numbers
    plain = two_products[(1,)].prepare(a, b, c, mx.zeros((m, d), mx.float32), m, n, k, d,
                                       BM=bm, BN=bn, BK=bk, BD=bd, num_warps=warps)
    assert "mma_layout" not in passes(plain)
    np.testing.assert_allclose(np.array(plain()), reference(a, b, c), rtol=TOL[dtype],
                               atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_a_product_as_the_next_ones_accumulator_in_the_layout(rng, monkeypatch, dtype):
    # ab is both the second product's left operand (rounded, from registers) and its
    # accumulator; bt is read transposed
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    bt = mx.array(rng.standard_normal((32, 32)).astype(np.float32)).astype(dtype)
    c = mx.array(rng.standard_normal((32, 32)).astype(np.float32)).astype(dtype)
    a = mx.array(rng.standard_normal((16, 32)).astype(np.float32)).astype(dtype)
    d = transposed_and_chained[(1,)].prepare(a, bt, c, mx.zeros((16, 32)), BM=16, BN=32, BK=32,
                                             num_warps=1)
    if d.spec.backend.language == "msl":
        assert "mma_layout" in passes(d)
    check_chained(d, a, bt, c, dtype)


@metile.kernel
def product_read_transposed(A, B, Out, BM: metile.constexpr):
    """Out = (A @ B)ᵀ: the product read at other coordinates (a transpose) keeps the lane
    layout."""
    r = metile.arange(0, BM)
    a = metile.load(A + r[:, None] * BM + r[None, :])
    b = metile.load(B + r[:, None] * BM + r[None, :])
    metile.store(Out + r[:, None] * BM + r[None, :], metile.trans(metile.dot(a, b)))


def test_a_product_read_transposed_keeps_the_lane_layout(rng):
    a, b = (mx.array(rng.standard_normal((16, 16)).astype(np.float32)) for _ in range(2))
    d = product_read_transposed[(1,)].prepare(a, b, mx.zeros((16, 16)), BM=16, num_warps=1)
    assert "mma_layout" not in passes(d)
    f = [np.array(x, np.float64) for x in (a, b)]
    np.testing.assert_allclose(np.array(d()), (f[0] @ f[1]).T, rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(TOOLKIT is None, reason="needs the NVRTC wheels")
@pytest.mark.parametrize("wgmma", ["tma", "0"])
def test_cuda_attention_prefill_in_the_accumulator_layout_compiles(monkeypatch, wgmma):
    # P packed from registers, the rows' lanes combined by shuffles; on sm_90 the products
    # are warpgroup MMA (Q and the key block by descriptors, P from registers, the value
    # block N-major), for sm_90a; METILE_CUDA_WGMMA=0 keeps mma.sync
    import sys
    sys.path.insert(0, "kernels")
    from metile_kernels import attention as kernels
    monkeypatch.setenv("METILE_CUDA_WGMMA", wgmma)
    q = mx.zeros((1, 2, 256, 128), mx.float16)
    d = kernels.attention_forward[kernels.forward_grid(256, 2, 1, 128)].prepare(
        q, q, q, q, mx.zeros(q.shape, q.dtype), 256, 256, 1, 0.1, 0, 0, 0, 0, 0, 0, HEAD_DIM=128,
        BLOCK_D=128, BLOCK_M=128, BLOCK_N=64, MASK="causal", num_warps=8, backend="cuda",
        POSITIVE_SCALE=True)
    assert "mma_layout" in passes(d)
    source = translation_unit(d)
    assert "metile_pair(" in source and "metile_xor_max(" in source
    arch = d.variant.data["lowering"]["launch"]["arch"]
    note = next(n for n in json.loads(d.explain())["notes"] if "(mma_layout)" in n)
    assert ("wgmma m64nNk16, warpgroup MMA" in note) == (wgmma != "0"), note
    assert ("128-byte swizzle" in note) == (wgmma != "0") and "one iteration ahead" in note
    if wgmma == "0":
        assert "metile_frag_mma(" in source and "metile_wgmma_m64" not in source
        assert arch in (None, "sm_90")
        arch = "sm_90"
    else:
        assert arch == "sm_90a" and "metile_frag_mma(" not in source.split("{", 1)[-1].split("__global__", 1)[-1]
        assert source.count("metile_wgmma_m64n64k16_f16(") > 0          # S = Q K^T
        assert source.count("metile_wgmma_m64n128k16_f16_ra_tb(") > 0   # O += P V
        assert "metile_fence_proxy_async();" in source
    ok, log = compile_cuda(source, arch)
    assert ok, log


@pytest.mark.skipif(TOOLKIT is None, reason="needs the NVRTC wheels")
@pytest.mark.parametrize("bm,bn,warps", [(128, 128, 8)])
def test_cuda_attention_value_product_left_in_flight(bm, bn, warps):
    # lower_mma_layout.carried_products: without a two-blocks register bound (128x128 on
    # 8 warps, one block an SM) the P.V product accumulates in the carried registers and
    # is not waited for in its iteration (a wait before the next iteration's first
    # product holds them, a wait follows each loop); ptxas keeps the products
    # asynchronous (no C7512 serialization)
    import sys
    sys.path.insert(0, "kernels")
    from nvrtc import cubin
    from metile_kernels import attention as kernels
    q = mx.zeros((1, 2, 512, 128), mx.float16)
    d = kernels.attention_forward[kernels.forward_grid(512, 2, 1, bm)].prepare(
        q, q, q, q, mx.zeros(q.shape, q.dtype), 512, 512, 1, 0.1, 0, 0, 0, 0, 0, 0, HEAD_DIM=128,
        BLOCK_D=128, BLOCK_M=bm, BLOCK_N=bn, MASK="causal", num_warps=warps, backend="cuda",
        POSITIVE_SCALE=True)
    source = translation_unit(d)
    body = source.split("__global__", 1)[1]
    value_products = re.findall(r"metile_wgmma_m64n128k16_f16_ra_tb\((\w+),", body)
    assert len(value_products) == 2 * bn // 16      # its k-steps in each of the two loops
    assert all(acc.startswith("_m") for acc in value_products)    # the carried registers
    # after each loop's closing brace: the wait and the hold of its carried registers
    after_loops = re.findall(r"\n}\nmetile_wgmma_wait<0>\(\);\nmetile_wgmma_hold\((\w+)\);", body)
    assert sorted(after_loops) == sorted(set(value_products))
    # in each loop, the wait for them comes before the key product's fence, after the
    # iteration's barrier
    for loop in body.split("\nfor (")[1:3]:
        top = loop.split("metile_wgmma_fence();")[0]
        assert "__syncthreads();" in top and re.search(r"metile_wgmma_hold\(_m\d+\);", top)
    _, log = cubin(source, d.variant.data["lowering"]["launch"]["arch"],
                   extra=("--ptxas-options=-v",))
    assert "C7512" not in log and "serialized" not in log, log


@pytest.mark.skipif(TOOLKIT is None, reason="needs the NVRTC wheels")
@pytest.mark.parametrize("bn,carry", [(128, "0"), (64, "1")])
def test_cuda_attention_value_product_waited_where_issued(monkeypatch, bn, carry):
    # the P.V product accumulates into its own registers and is waited for where it is
    # issued under METILE_WGMMA_CARRY=0 (a launch resolved either way is its own cache
    # entry), and under the two-blocks register bound (128x64 on 8 warps) by default
    import sys
    sys.path.insert(0, "kernels")
    from metile_kernels import attention as kernels
    monkeypatch.setenv("METILE_WGMMA_CARRY", carry)
    q = mx.zeros((1, 2, 512, 128), mx.float16)
    d = kernels.attention_forward[kernels.forward_grid(512, 2, 1, 128)].prepare(
        q, q, q, q, mx.zeros(q.shape, q.dtype), 512, 512, 1, 0.1, 0, 0, 0, 0, 0, 0, HEAD_DIM=128,
        BLOCK_D=128, BLOCK_M=128, BLOCK_N=bn, MASK="causal", num_warps=8, backend="cuda",
        POSITIVE_SCALE=True)
    body = translation_unit(d).split("__global__", 1)[1]
    products = re.findall(r"metile_wgmma_m64n128k16_f16_ra_tb\((\w+),", body)
    assert products and all(acc.startswith("_wacc") for acc in products)
    assert not re.search(r"metile_wgmma_hold\(_m\d+\);", body)


@pytest.mark.skipif(TOOLKIT is None, reason="needs the NVRTC wheels")
def test_attention_block_copies_are_one_add_apart():
    # vectorize_rows.async_copy's proven path (copy_strided): a thread's chunks of a key
    # block (64 x 128 float16, 256 threads: 16 rows apart) are its first chunk plus
    # constants - 16 rows of 128 elements further in K, 16 rows of the 64-element swizzle
    # atom further in the tile - not each computed from its coordinates
    import sys
    sys.path.insert(0, "kernels")
    from metile_kernels import attention as kernels
    q = mx.zeros((1, 2, 512, 128), mx.float16)
    d = kernels.attention_forward[kernels.forward_grid(512, 2, 1, 128)].prepare(
        q, q, q, q, mx.zeros(q.shape, q.dtype), 512, 512, 1, 0.1, 0, 0, 0, 0, 0, 0, HEAD_DIM=128,
        BLOCK_D=128, BLOCK_M=128, BLOCK_N=64, MASK="causal", num_warps=8, backend="cuda",
        POSITIVE_SCALE=True)
    body = translation_unit(d).split("__global__", 1)[1]
    defs = dict(re.findall(r"const int32_t (_v\d+) = \((.*?)\);", body))
    copies = re.findall(r"metile_cp_async16_fill\(&(_sw\d+)\[(_v\d+)\], &K\[(_v\d+)\]", body)
    runs = [copies[i:i + 4] for i in range(len(copies) - 3)
            if all(defs.get(copies[i + s][2]) == f"{copies[i][2]} + {2048 * s}" and
                   defs.get(copies[i + s][1]) == f"{copies[i][1]} + {1024 * s}"
                   for s in (1, 2, 3))]
    assert len(runs) >= 2, copies     # the whole-block loop's and the masked loop's


@metile.kernel
def product_of_a_triangle(A, B, Out, n, BM: metile.constexpr):
    """tril(A) @ B for one (BM, BM) block: A's mask depends on the row and the column."""
    r = metile.arange(0, BM)
    a = metile.load(A + r[:, None] * n + r[None, :], mask=r[:, None] >= r[None, :], other=0.0)
    b = metile.load(B + r[:, None] * n + r[None, :], mask=r[None, :] < n, other=0.0)
    metile.store(Out + r[:, None] * n + r[None, :], metile.dot(a, b))


@pytest.mark.skipif(TOOLKIT is None, reason="needs the NVRTC wheels")
def test_bare_chunk_copies_only_where_proven():
    # vectorize_rows._whole_chunks_test: a tile copy whose masks are the row's alone or a
    # monotone one of the column gets a second, bare copy loop behind one test a thread
    # (two cp.async call sites for its array); a mask of both coordinates keeps only the
    # tested loop (one)
    def sites(source):
        calls = re.findall(r"metile_cp_async16(?:_fill)?\(&(\w+)\[", source.split("__global__")[-1])
        return {name: calls.count(name) for name in set(calls)}

    a = mx.zeros((64, 64), mx.float16)
    d = two_products[(1,)].prepare(a, a, a, mx.zeros((64, 64), mx.float32), 64, 64, 64, 64,
                                   BM=64, BN=64, BK=64, BD=64, num_warps=4, backend="cuda")
    assert sorted(sites(translation_unit(d)).values()) == [2, 2, 2]
    t = product_of_a_triangle[(1,)].prepare(a, a, mx.zeros((64, 64), mx.float32), 64, BM=64,
                                            num_warps=4, backend="cuda")
    assert "mma_layout" in passes(t)
    assert sorted(sites(translation_unit(t)).values()) == [1, 2]
