"""Triton's block pointers (`make_block_ptr`, `advance`, `load`/`store` with
`boundary_check=` / `padding_option=`) and tensor descriptors (`make_tensor_descriptor`,
`desc.load` / `desc.store`), frontend/block_pointers.py.  Checked on the CPU runtime
against NumPy; the block-pointer matmul (offsets advanced in the K loop) and the
descriptor matmul get the GEMM lowering; the CUDA emission compiles with NVRTC.
"""

import json

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.errors import CompilationError
from nvrtc import TOOLKIT, compile_cuda, translation_unit
from test_gemm import OUTPUT_TOL, operands


def line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


# -- copies: ragged edges, boundary_check, padding, strides -------------------------------------

@metile.kernel
def block_copy(X, Y, M, N, stride_xm, stride_xn, BM: metile.constexpr, BN: metile.constexpr,
               CHECK: metile.constexpr, PAD: metile.constexpr):
    # Reads an (M, N) view of X; writes the whole padded Y (row-major, whole blocks).
    pm, pn = metile.program_id(0), metile.program_id(1)
    x = metile.make_block_ptr(X, shape=(M, N), strides=(stride_xm, stride_xn),
                              offsets=(pm * BM, pn * BN), block_shape=(BM, BN), order=(1, 0))
    y = metile.make_block_ptr(Y, (metile.num_programs(0) * BM, metile.num_programs(1) * BN),
                              (metile.num_programs(1) * BN, 1), (pm * BM, pn * BN), (BM, BN),
                              (1, 0))
    metile.store(y, metile.load(x, boundary_check=CHECK, padding_option=PAD))


def copy(x, m, n, strides, check, pad="", bm=16, bn=8):
    grid = (metile.cdiv(m, bm), metile.cdiv(n, bn))
    y = mx.zeros((grid[0] * bm, grid[1] * bn), x.dtype)
    return np.array(block_copy[grid](x, y, m, n, *strides, BM=bm, BN=bn, CHECK=check, PAD=pad))


@pytest.mark.parametrize("m,n", [(37, 21), (16, 8), (1, 1), (50, 3)])
def test_copy_ragged_shapes_pads_with_zeros(rng, m, n):
    x = rng.standard_normal((m, n)).astype(np.float32)
    got = copy(mx.array(x), m, n, (n, 1), (0, 1))
    want = np.zeros_like(got)
    want[:m, :n] = x
    np.testing.assert_array_equal(got, want)


def test_padding_option_nan(rng):
    x = rng.standard_normal((20, 13)).astype(np.float32)
    got = copy(mx.array(x), 20, 13, (13, 1), (0, 1), pad="nan")
    np.testing.assert_array_equal(got[:20, :13], x)
    assert np.isnan(got[20:]).all() and np.isnan(got[:, 13:]).all()


def test_boundary_check_covers_only_the_listed_dimensions(rng):
    # A (20, 10) view of a (20, 16) buffer: with boundary_check=(0,) columns 10..15 are not
    # checked and read the buffer (Triton's semantics), rows past 20 still pad with zero.
    buf = rng.standard_normal((20, 16)).astype(np.float32)
    got = copy(mx.array(buf), 20, 10, (16, 1), (0,), bm=8, bn=16)
    np.testing.assert_array_equal(got[:20], buf)
    np.testing.assert_array_equal(got[20:], 0)
    both = copy(mx.array(buf), 20, 10, (16, 1), (0, 1), bm=8, bn=16)
    np.testing.assert_array_equal(both[:20, :10], buf[:, :10])
    np.testing.assert_array_equal(both[:, 10:], 0)


@metile.kernel
def transposed_read(XT, Y, M, N, BM: metile.constexpr, BN: metile.constexpr):
    # XT holds X^T (N, M) row-major: X is read through strides (1, M), column-major order.
    pm, pn = metile.program_id(0), metile.program_id(1)
    x = metile.make_block_ptr(XT, (M, N), (1, M), (pm * BM, pn * BN), (BM, BN), order=(0, 1))
    y = metile.make_block_ptr(Y, (M, N), (N, 1), (pm * BM, pn * BN), (BM, BN), order=(1, 0))
    metile.store(y, metile.load(x, boundary_check=(0, 1)) * 2.0, boundary_check=(0, 1))


@pytest.mark.parametrize("m,n", [(19, 33), (16, 16)])
def test_transposed_read_through_strides_and_order(rng, m, n):
    x = rng.standard_normal((m, n)).astype(np.float32)
    y = transposed_read[(metile.cdiv(m, 8), metile.cdiv(n, 16))](
        mx.array(x.T.copy()), mx.zeros((m, n)), m, n, BM=8, BN=16)
    np.testing.assert_array_equal(np.array(y), 2 * x)


# -- advance in loops and ifs -------------------------------------------------------------------

@metile.kernel
def row_sums(X, Y, M, N, BM: metile.constexpr, BN: metile.constexpr):
    # Y[i] = sum of X[i, :] over column blocks, the block pointer advanced in a while loop;
    # every other block of a program with odd id is skipped by an advance in a runtime if.
    pm = metile.program_id(0)
    p = metile.make_block_ptr(X, (M, N), (N, 1), (pm * BM, 0), (BM, BN), (1, 0))
    acc = metile.zeros((BM,), dtype=metile.float32)
    col = 0
    while col < N:
        acc += metile.sum(metile.load(p, boundary_check=(0, 1)), axis=1)
        if pm % 2 == 1:
            p = metile.advance(p, (0, BN))
            col += BN
        p = metile.advance(p, (0, BN))
        col += BN
    out = metile.make_block_ptr(Y, (M,), (1,), (pm * BM,), (BM,), (0,))
    metile.store(out, acc, boundary_check=(0,))


def test_advance_in_while_loops_and_runtime_ifs(rng):
    m, n, bm, bn = 30, 45, 8, 4
    x = rng.standard_normal((m, n)).astype(np.float32)
    y = np.array(row_sums[(metile.cdiv(m, bm),)](mx.array(x), mx.zeros((m,)), m, n, BM=bm, BN=bn))
    cols = np.arange(n)
    want = np.empty(m)
    for i in range(m):
        odd = (i // bm) % 2 == 1
        keep = (cols // bn) % 2 == 0 if odd else np.ones(n, bool)
        want[i] = x[i, keep].astype(np.float64).sum()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@metile.inline
def window(X, N, start):
    # Returned from both branches of a runtime if: the offsets merge, the layout is shared.
    if start > 0:
        return metile.make_block_ptr(X, (N,), (1,), (start,), (4,), (0,))
    return metile.make_block_ptr(X, (N,), (1,), (0,), (4,), (0,))


@metile.kernel
def advanced_then_read(X, Y, N, T, START):
    p = window(X, N, START)
    for i in range(T):
        p = metile.advance(p, (4,))
    q = metile.make_block_ptr(Y, (N,), (1,), (0,), (4,), (0,))
    metile.store(q, metile.load(p, boundary_check=(0,)), boundary_check=(0,))


@pytest.mark.parametrize("steps,start", [(2, 0), (0, 3), (1, 9), (3, 1)])
def test_block_pointer_used_after_its_loop(steps, start):
    x = np.arange(1, 15, dtype=np.float32)
    y = np.array(advanced_then_read[(1,)](mx.array(x), mx.zeros((14,)), 14, steps, start))
    first = start + 4 * steps
    want = np.zeros(14, np.float32)
    want[:4] = [x[i] if i < 14 else 0 for i in range(first, first + 4)]
    np.testing.assert_array_equal(y, want)


# -- the block-pointer matmul --------------------------------------------------------------------

@metile.kernel
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: metile.constexpr, BLOCK_N: metile.constexpr,
                  BLOCK_K: metile.constexpr):
    # Triton's block-pointer matmul, `tl.` renamed.
    pid_m = metile.program_id(0)
    pid_n = metile.program_id(1)
    a_block_ptr = metile.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                        offsets=(pid_m * BLOCK_M, 0),
                                        block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_block_ptr = metile.make_block_ptr(base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
                                        offsets=(0, pid_n * BLOCK_N),
                                        block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
    accumulator = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in range(0, K, BLOCK_K):
        a = metile.load(a_block_ptr, boundary_check=(0, 1))
        b = metile.load(b_block_ptr, boundary_check=(0, 1))
        accumulator += metile.dot(a, b)
        a_block_ptr = metile.advance(a_block_ptr, (0, BLOCK_K))
        b_block_ptr = metile.advance(b_block_ptr, (BLOCK_K, 0))
    c = accumulator.to(c_ptr.dtype)
    c_block_ptr = metile.make_block_ptr(base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
                                        offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N),
                                        block_shape=(BLOCK_M, BLOCK_N), order=(1, 0))
    metile.store(c_block_ptr, c, boundary_check=(0, 1))


def prepare_matmul(a, b, m, n, k, strides_a, strides_b, out_dtype, **kw):
    c = mx.zeros((m, n), out_dtype)
    return matmul_kernel[(metile.cdiv(m, 32), metile.cdiv(n, 32))].prepare(
        a, b, c, m, n, k, *strides_a, *strides_b, n, 1, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, **kw)


# The GEMM lowering's matrix instruction per backend: SIMD-group matrices on MSL; on CUDA
# strict float32 has no tensor-core unit (FFMA register tiles), float16 takes mma.sync.
GEMM_FRAGMENT = {
    "msl": {"float32": "simdgroup_matrix 8x8", "float16": "simdgroup_matrix 8x8",
            "bfloat16": "simdgroup_matrix 8x8"},
    "cuda": {"float32": "ffma", "float16": "mma.sync m16n8k16 (16x16x16 fragments)",
             "bfloat16": "mma.sync m16n8k16 (16x16x16 fragments)"},
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_block_pointer_matmul_gets_the_gemm_lowering(rng, dtype):
    for m, n, k in [(75, 45, 37), (1, 1, 1), (64, 64, 64), (33, 70, 100)]:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = prepare_matmul(a, b, m, n, k, (k, 1), (n, 1), getattr(mx, dtype))
        got = np.array(d().astype(mx.float32)).astype(np.float64)
        np.testing.assert_allclose(got, ref, **OUTPUT_TOL[dtype])
    info = d.variant.data["lowering"]["matmul"]
    assert info["fragment"] == GEMM_FRAGMENT[d.variant.backend][dtype]
    assert info["operand_dtype"] == dtype
    assert info["k_loop_masked"] and info["epilogue_ops"] == ([] if dtype == "float32"
                                                               else ["cast"])
    detail = {s["step"]: s.get("detail")
              for s in json.loads(d.explain(steps=True))["steps"]}["pointer_recurrence"]
    assert detail == (
        f"loop at line {line_of('for k in range(0, K, BLOCK_K):')}: a_block_ptr.offsets[1], "
        f"b_block_ptr.offsets[0] advanced in closed form (start + trip * increment); "
        f"a_block_ptr.offsets[0], b_block_ptr.offsets[1] unchanged (the initial value); "
        f"accumulator += dot(a, b) accumulated as dot(a, b, acc)")


def test_block_pointer_matmul_under_a_schedule_proves_complete_k_steps(rng):
    # Transposed B through its strides; the bound checks (lower ones included) of the
    # complete K steps are proven and dropped, the tail step keeps them.
    m, n, k = 45, 70, 41
    a, b, ref = operands(rng, m, n, k, "float32")
    bt = mx.array(np.array(b).T.copy())
    d = prepare_matmul(a, bt, m, n, k, (k, 1), (1, k), mx.float32,
                       SCHEDULE=metile.Schedule(double_buffer=True))
    np.testing.assert_allclose(np.array(d()), ref, **OUTPUT_TOL["float32"])
    info = d.variant.data["lowering"]["matmul"]
    assert info["k_split"] == {"complete_iterations": 2, "remainder": True}
    assert info["double_buffered"]


@pytest.mark.skipif(TOOLKIT is None, reason="needs the nvidia-cuda-nvrtc wheels")
def test_cuda_emission_compiles_with_nvrtc():
    z = mx.zeros((64, 64), mx.float16)
    d = prepare_matmul(z, z, 75, 45, 37, (37, 1), (45, 1), mx.float16, backend="cuda")
    assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("mma.sync m16n8k16")
    for arch in ("sm_80", "sm_90"):
        ok, log = compile_cuda(translation_unit(d), arch)
        assert ok, log


# -- tensor descriptors --------------------------------------------------------------------------

@metile.kernel
def descriptor_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: metile.constexpr,
                      BLOCK_N: metile.constexpr, BLOCK_K: metile.constexpr):
    # Triton 3.x's device-side descriptors (row-major operands, as TMA needs).
    a_desc = metile.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    b_desc = metile.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    c_desc = metile.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    offs_am = metile.program_id(0) * BLOCK_M
    offs_bn = metile.program_id(1) * BLOCK_N
    accumulator = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in range(metile.cdiv(K, BLOCK_K)):
        offs_k = k * BLOCK_K
        a = a_desc.load([offs_am, offs_k])
        b = metile.load_tensor_descriptor(b_desc, [offs_k, offs_bn])
        accumulator = metile.dot(a, b, accumulator)
    c_desc.store([offs_am, offs_bn], accumulator.to(c_desc.dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tensor_descriptor_matmul(rng, dtype):
    for m, n, k in [(75, 45, 37), (32, 32, 16)]:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = descriptor_matmul[(metile.cdiv(m, 32), metile.cdiv(n, 32))].prepare(
            a, b, mx.zeros((m, n), getattr(mx, dtype)), m, n, k, BLOCK_M=32, BLOCK_N=32,
            BLOCK_K=16)
        got = np.array(d().astype(mx.float32)).astype(np.float64)
        np.testing.assert_allclose(got, ref, **OUTPUT_TOL[dtype])
    assert d.variant.data["lowering"]["matmul"]["operand_dtype"] == dtype
    assert "pointer_recurrence" not in d.execution_report.passes  # nothing carried


@metile.kernel
def descriptor_shift(X, Y, M, N, SHIFT: metile.constexpr, B: metile.constexpr):
    # Reads the block one row above (row -1 for the first program: out of bounds, zero).
    # The tensor starts at row 2 of X, so an unchecked row -1 would read X's row 1.
    x = metile.make_tensor_descriptor(X + 2 * N, (M, N), (N, 1), (B, B))
    y = metile.make_tensor_descriptor(Y, (M, N), (N, 1), (B, B))
    r, c = metile.program_id(0) * B, metile.program_id(1) * B
    y.store((r, c), x.load((r - SHIFT, c)))


def test_tensor_descriptor_bounds_both_sides(rng):
    m, n = 21, 10
    buf = rng.standard_normal((m + 2, n)).astype(np.float32)
    x = buf[2:]
    y = np.array(descriptor_shift[(metile.cdiv(m, 8), metile.cdiv(n, 8))](
        mx.array(buf), mx.full((m, n), 7.0), m, n, SHIFT=1, B=8))
    want = np.zeros_like(x)
    want[1:] = x[:-1]
    np.testing.assert_array_equal(y, want)


# -- misuse ------------------------------------------------------------------------------------

@metile.kernel
def misuse(X, Y, N, CASE: metile.constexpr):
    p = metile.make_block_ptr(X, (N, N), (N, 1), (0, 0), (4, 4), (1, 0))
    if CASE == "offsets rank":
        metile.make_block_ptr(X, (N, N), (N, 1), (0,), (4, 4), (1, 0))
    elif CASE == "advance rank":
        p = metile.advance(p, (4,))
    elif CASE == "advance plain":
        metile.advance(X + 4, (4, 0))
    elif CASE == "boundary dim":
        metile.load(p, boundary_check=(0, 2))
    elif CASE == "mask":
        metile.load(p, mask=N > 0)
    elif CASE == "plain boundary":
        metile.load(X + metile.arange(0, 4), boundary_check=(0,))
    elif CASE == "nan int":
        metile.load(metile.make_block_ptr(Y, (N,), (1,), (0,), (4,), (0,)), padding_option="nan")
    elif CASE == "store shape":
        metile.store(p, metile.zeros((4, 8)))
    elif CASE == "order":
        metile.make_block_ptr(X, (N, N), (N, 1), (0, 0), (4, 4), (1, 1))
    elif CASE == "block shape":
        metile.make_block_ptr(X, (N, N), (N, 1), (0, 0), (4, N), (1, 0))
    elif CASE == "descriptor rank":
        metile.make_tensor_descriptor(X, (N, N), (N, 1), (4, 4)).load((0, 0, 0))
    elif CASE == "loop base":
        for i in range(N):
            p = metile.make_block_ptr(X + i, (N, N), (N, 1), (0, 0), (4, 4), (1, 0))
    elif CASE == "if shape":
        if N > 3:
            p = metile.make_block_ptr(X, (N, 8), (N, 1), (0, 0), (4, 4), (1, 0))
    metile.store(X, 0.0)


@pytest.mark.parametrize("case,message", [
    ("offsets rank", "make_block_ptr() offsets has 1 entries; the block has rank 2"),
    ("advance rank", "advance() offsets has 1 entries; the block has rank 2"),
    ("advance plain", "advance() needs a block pointer (from metile.make_block_ptr), got a "
                      "runtime ptr<float32, device, @X> value"),
    ("boundary dim", "load() of a block pointer boundary_check dimension 2 is out of range for "
                     "a block pointer of rank 2 (0..1)"),
    ("mask", "load() of a block pointer takes no mask= or other="),
    ("plain boundary", "load(): boundary_check= is only for block pointers"),
    ("nan int", "padding_option='nan' needs a float tensor, got int32"),
    ("store shape", "store() to a block pointer value of shape (4, 8) does not match the block "
                    "shape (4, 4)"),
    ("order", "make_block_ptr() order must be a permutation of 0..1"),
    ("block shape", "make_block_ptr() block_shape[1] must be a constexpr int"),
    ("descriptor rank", "tensor descriptor load() offsets has 3 entries; the block has rank 2"),
    ("loop base", "loop-carried variable 'p' (a block pointer (block (4, 4) of a 2-d float32 "
                  "tensor)) gets another base; only its offsets may change (metile.advance) "
                  "inside the loop"),
    ("if shape", "variable 'p' (a block pointer (block (4, 4) of a 2-d float32 tensor)) gets "
                 "another shape; only its offsets may change (metile.advance) in one branch of "
                 "a runtime if"),
])
def test_misuse_is_a_clear_error(case, message):
    with pytest.raises(CompilationError) as err:
        misuse[(1,)](mx.zeros((16,)), mx.zeros((16,), mx.int32), 4, CASE=case)
    assert message in str(err.value)


# -- metile.tensor views: both bounds ------------------------------------------------------------

@metile.kernel
def view_put(V, O, r0, c0, B: metile.constexpr):
    dst = metile.tensor(O, shape=(4, 4), strides=(4, 1), block_shape=(B, B), access="write")
    src = metile.tensor(V, shape=(B, B), strides=(B, 1), block_shape=(B, B), access="read")
    dst.store((r0, c0), src.load((0, 0)))


@metile.kernel
def view_get(X, O, r0, c0, B: metile.constexpr):
    src = metile.tensor(X, shape=(4, 4), strides=(4, 1), block_shape=(B, B), access="read")
    dst = metile.tensor(O, shape=(B, B), strides=(B, 1), block_shape=(B, B), access="write")
    dst.store((0, 0), src.load((r0, c0)))


def _window(x, r0, c0, b):
    """x's (b, b) window at (r0, c0), zero outside x (NumPy)."""
    out = np.zeros((b, b), x.dtype)
    for i in range(b):
        for j in range(b):
            if 0 <= r0 + i < x.shape[0] and 0 <= c0 + j < x.shape[1]:
                out[i, j] = x[r0 + i, c0 + j]
    return out


@pytest.mark.parametrize("r0,c0", [(1, -1), (-1, 0), (-2, -3), (3, 3), (-1, 3), (0, 0)])
def test_view_positions_below_zero_are_masked(r0, c0):
    # (found by a hostile test: only coord < extent was checked, so a negative origin
    # stored into the row before and read memory before the buffer)
    x = np.arange(16, dtype=np.float32).reshape(4, 4) + 1
    got = np.array(view_get[(1,)](mx.array(x), mx.zeros((2, 2)), r0, c0, B=2))
    np.testing.assert_array_equal(got, _window(x, r0, c0, 2))
    v = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    got = np.array(view_put[(1,)](mx.array(v), mx.zeros((4, 4)), r0, c0, B=2))
    want = np.zeros((4, 4), np.float32)
    for i in range(2):
        for j in range(2):
            if 0 <= r0 + i < 4 and 0 <= c0 + j < 4:
                want[r0 + i, c0 + j] = v[i, j]
    np.testing.assert_array_equal(got, want)


def test_a_constant_negative_view_position_is_an_error():
    @metile.kernel(num_simdgroups=1)
    def scalar_view(X, O, I: metile.constexpr):
        v = metile.tensor(X, shape=(4,), access="read")
        if metile.thread_id() == 0:
            metile.store(O + 0, v.load((I,)))

    with pytest.raises(CompilationError, match=r"position \(-1,\) is outside the view's shape"):
        scalar_view[(1,)](mx.zeros((8,)), mx.zeros((1,)), I=-1)


def test_only_positions_not_proven_non_negative_get_a_lower_bound():
    # program ids and loop counters from 0 need no lower-bound term (the GEMM lowerings
    # read the masks of such views as the tensor's shape); a launch value does
    import re
    from metile_kernels.gemm import grid, matmul
    lower = re.compile(r">= \(?0\)?[);]")
    src = view_get[(1,)].prepare(mx.zeros((4, 4)), mx.zeros((2, 2)), 0, 0, B=2,
                                 backend="msl").source
    assert lower.search(src)
    m = 40
    src = matmul[grid(m, m, 16, 16)].prepare(mx.zeros((m, m)), mx.zeros((m, m)), mx.zeros((m, m)),
                                             m, m, m, BLOCK_M=16, BLOCK_N=16, BLOCK_K=8,
                                             backend="msl").source
    assert not lower.search(src)
