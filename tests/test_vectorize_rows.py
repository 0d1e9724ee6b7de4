"""Lanes in runs of vectors (passes/vectorize_rows.py): numbers against NumPy through the
CPU runtime (vector and scalar paths in one launch: ragged rows, bases at odd element
offsets, float32/float16/bfloat16), what is emitted (MSL packed vectors, CUDA 16-byte
loads and stores compiled by NVRTC for sm_90), the report, and the kernels the pass must
leave in the plain layout (a strided access, a scan, vector_width=1).

Tolerances: float32 rtol 3e-6 / atol 1e-6 (one float32 reduction in another order);
float16 2e-3 and bfloat16 1.6e-2 (two units in the last place of the rounded output)."""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import Schedule
from metile.passes.vectorize_rows import row_runs
from nvrtc import TOOLKIT, compile_cuda, translation_unit

TOL = {mx.float32: (3e-6, 1e-6), mx.float16: (2e-3, 2e-3), mx.bfloat16: (1.6e-2, 1.6e-2)}


@metile.kernel
def centre_scale(X, W, Y, rows, columns, BLOCK: metile.constexpr, ROWS: metile.constexpr = 1):
    """Y = (X - mean(X)) * W per row: a row in registers, a reduction, a broadcast read.
    (The 2-D index spelling of metile_kernels/norms.py: the store provably covers Y.)"""
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    x = metile.load(X + row * columns + col, mask=inside, other=0.0).to(metile.float32)
    w = metile.load(W + col, mask=col < columns, other=0.0).to(metile.float32)
    y = (x - metile.sum(x) / columns) * w
    metile.store(Y + row * columns + col, y.to(Y.dtype), mask=inside)


@metile.kernel
def column_sum(X, Y, rows, columns, BLOCK: metile.constexpr):
    """Y[c] = sum over rows of X[:, c] for a block of rows read down a column: the access
    moves by `columns` along the tile's last axis (rows are the last axis here)."""
    c = metile.program_id(0)
    r = metile.arange(0, BLOCK)
    x = metile.load(X + r * columns + c, mask=r < rows, other=0.0)
    metile.store(Y + c, metile.sum(x))


@metile.kernel
def transpose(X, Y, R: metile.constexpr, C: metile.constexpr):
    """Y = X.T for an (R, C) matrix: the load moves by 1 along the tile's last axis, the
    store by R."""
    r = metile.arange(0, R)[:, None]
    c = metile.arange(0, C)[None, :]
    metile.store(Y + c * R + r, metile.load(X + r * C + c))


@metile.kernel
def running_sum(X, Y, n, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    x = metile.load(X + i, mask=i < n, other=0.0)
    metile.store(Y + i, metile.cumsum(x, 0), mask=i < n)


def data(rng, shape, dtype):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def f64(a):
    return np.array(a.astype(mx.float32)).astype(np.float64)


def reference(x, w):
    x, w = f64(x), f64(w)
    return (x - x.mean(axis=-1, keepdims=True)) * w


def launch(x, w, warps, backend=None, schedule=None):
    rows, columns = x.shape
    block = metile.next_power_of_2(columns)
    kw = {"backend": backend} if backend else {}
    if schedule is not None:
        kw["SCHEDULE"] = schedule
    return centre_scale[(rows, 1)].prepare(x, w, mx.zeros((rows, columns), x.dtype), rows, columns,
                                         BLOCK=block, num_warps=warps, **kw)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("columns", [512, 506, 509])
def test_runs_match_numpy(rng, dtype, columns):
    # 512: every run whole; 506: the row tail masks part of the last runs and odd rows
    # start off a vector boundary (scalar path); 509: every row but the first starts
    # misaligned.  Each launch mixes the vector and the scalar path.  (Two warps: runs of
    # 4 or 8 fill the 512-element row on Metal and CUDA alike.)
    x, w = data(rng, (9, columns), dtype), data(rng, (columns,), dtype)
    d = launch(x, w, 2)
    assert "vectorize_rows" in d.execution_report.passes
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(f64(d()), reference(x, w), rtol=rtol, atol=atol)


def test_runs_from_a_slice_at_an_odd_offset(rng):
    # MLX hands the kernel a row-contiguous slice whose base is 3 elements into its buffer.
    big = data(rng, (9 * 512 + 3,), mx.float32)
    x = big[3:].reshape(9, 512)
    w = data(rng, (512,), mx.float32)
    out = launch(x, w, 2)()
    np.testing.assert_allclose(f64(out), reference(x, w), rtol=3e-6, atol=1e-6)


def test_runs_in_the_report_and_the_msl(rng):
    x, w = data(rng, (4, 256), mx.float16), data(rng, (256,), mx.float16)
    d = launch(x, w, 2, backend="msl")
    # x and w read as packed 4-vectors (one load each per run), y written as one; each
    # lane loop twice: bare vectors where all of a thread's runs pass one test, and each
    # run tested on its own
    assert d.execution_report.vectorized_loads == 2
    assert len(re.findall(r"device packed_half4\*>\(&|= metile_vload_half4\(", d.source)) == 6
    lanes = [lp for lp in d.execution_report.loops if lp.induction_variable == "lane"]
    assert lanes and all(lp.elements_per_lane == 4 and lp.iteration_step == 4 * 64
                         for lp in lanes)
    # the load's, the reduction's and the store's loops: the guarded copies are not counted
    assert len(lanes) == 3


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")
@pytest.mark.parametrize("dtype,vector", [(mx.float16, "uint4"), (mx.bfloat16, "uint4"),
                                          (mx.float32, "float4")])
def test_cuda_runs_are_16_byte_accesses(rng, dtype, vector):
    x, w = data(rng, (4, 1024), dtype), data(rng, (1024,), dtype)
    d = launch(x, w, 4, backend="cuda")
    source = translation_unit(d)
    # an aligned 16-byte load of x and of w per chunk and one store, behind an address test
    assert len(re.findall(rf"reinterpret_cast<const {vector}\*>", source)) >= 2
    assert re.search(rf"reinterpret_cast<{vector}\*>\(&Y\[", source)
    assert "metile_aligned16" in source or "& 15ull" in source
    # a run tested on its own holds 16-bit elements as the loaded words (taking them apart
    # inside the branch would wait for the load there); float32 elements as they are
    if dtype == mx.float32:
        assert "float _x" in source and "_xw" not in source
    else:
        assert "uint32_t _xw" in source and not re.search(r"(__half|__nv_bfloat16) _x", source)
    ok, log = compile_cuda(source, "sm_90")
    assert ok, log


def test_the_report_says_what_runs_did(rng):
    x, w = data(rng, (4, 4096), mx.float16), data(rng, (4096,), mx.float16)
    notes = launch(x, w, 16, backend="cuda").execution_report.notes
    assert ("Lanes own runs of 8 consecutive elements (vectorize_rows): one vector access per "
            "run where its masks hold and its address is aligned, scalar otherwise. "
            "2 lane loop(s) test all of a thread's runs at once first: where every run "
            "passes, its accesses are bare vectors. __launch_bounds__ asks for 4 resident blocks per SM (the registers its held "
            "tiles leave room for).") in notes
    x = data(rng, (16, 32), mx.float32)
    d = transpose[(1,)].prepare(x, mx.zeros((32, 16), mx.float32), R=16, C=32, num_warps=2)
    assert any(n.startswith("Lanes keep one element per access (vectorize_rows): a tile access "
                            "of the kernel has stride 16") for n in d.execution_report.notes)


def test_strided_access_keeps_the_plain_layout(rng):
    x = data(rng, (256, 5), mx.float32)
    d = column_sum[(5,)].prepare(x, mx.zeros((5,), mx.float32), 256, 5, BLOCK=256, num_warps=2)
    np.testing.assert_allclose(np.array(d()), f64(x).sum(axis=0), rtol=3e-6, atol=1e-5)
    assert "vectorize_rows" not in d.execution_report.passes
    assert row_runs(d.spec.tile_ir(), 64, "msl", {}) == (
        "no tile load or store has unit stride along its last axis")
    # a unit-stride load does not make a strided store of the same tile vectorizable
    x = data(rng, (16, 32), mx.float32)
    d = transpose[(1,)].prepare(x, mx.zeros((32, 16), mx.float32), R=16, C=32, num_warps=2)
    np.testing.assert_array_equal(np.array(d()), np.array(x).T)
    assert "vectorize_rows" not in d.execution_report.passes
    assert row_runs(d.spec.tile_ir(), 64, "msl", {}) == (
        "a tile access of the kernel has stride 16 along its last axis: runs would turn it "
        "from coalesced to strided")


def test_scan_keeps_the_plain_layout(rng):
    x = data(rng, (512,), mx.float32)
    d = running_sum[(1,)].prepare(x, mx.zeros((512,), mx.float32), 500, BLOCK=512, num_warps=2)
    np.testing.assert_allclose(np.array(d())[:500], np.cumsum(f64(x)[:500]), rtol=1e-5,
                               atol=1e-4)
    assert "vectorize_rows" not in d.execution_report.passes
    assert row_runs(d.spec.tile_ir(), 64, "msl", {}) == "the kernel contains a scan"


def test_vector_width_one_keeps_scalar_lanes(rng):
    x, w = data(rng, (4, 512), mx.float32), data(rng, (512,), mx.float32)
    d = launch(x, w, 2, schedule=Schedule(vector_width=1))
    np.testing.assert_allclose(f64(d()), reference(x, w), rtol=3e-6, atol=1e-6)
    assert d.execution_report.vectorized_loads == 0 and "float4" not in d.source
    assert "vectorize_rows" not in d.execution_report.passes


@pytest.mark.parametrize("warps,blocks", [(1, 32), (4, 16), (16, 4)])
def test_cuda_runs_ask_for_occupancy_within_the_sm_limit(rng, warps, blocks):
    # A row of 16-bit elements held two to a word fits 32 registers a thread: the bounds
    # ask for 2048 threads per SM, never more than the 32 blocks an SM holds.
    columns = 256 * warps
    x, w = data(rng, (4, columns), mx.float16), data(rng, (columns,), mx.float16)
    d = launch(x, w, warps, backend="cuda")
    assert d.variant.data["lowering"]["launch"]["min_blocks"] == blocks
    source = translation_unit(d)
    assert f"__launch_bounds__({32 * warps}, {blocks})" in source
    metile.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];", min_blocks=blocks)  # accepted
    if TOOLKIT is not None:
        ok, log = compile_cuda(source, "sm_90")
        assert ok, log


def test_cuda_kernel_refuses_impossible_occupancy():
    with pytest.raises(ValueError, match="min_blocks must be an int from 0 to 32"):
        metile.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];", min_blocks=64)


@metile.kernel
def sums_per_chunk(X, Y, chunks, BLOCK: metile.constexpr):
    """Y[c] = sum of chunk c of X (a reduction inside a loop), then Y[chunks] = the sum of
    squares of chunk 0 (a reduction once per program)."""
    i = metile.arange(0, BLOCK)
    for c in range(chunks):
        metile.store(Y + c, metile.sum(metile.load(X + c * BLOCK + i)))
    x = metile.load(X + i)
    metile.store(Y + chunks, metile.sum(x * x))


def test_reduction_barriers(rng, monkeypatch):
    # A reduction run once per program is one barrier (its scratch is its own); one in a
    # loop keeps the second, before the next iteration overwrites the scratch.  Every lane
    # order of the CPU runtime agrees (METILE_RACE_CHECK compares them).
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    x = data(rng, (3 * 256,), mx.float32)
    d = sums_per_chunk[(1,)].prepare(x, mx.zeros((4,), mx.float32), 3, BLOCK=256, num_warps=4)
    want = f64(x).reshape(3, 256).sum(axis=1).tolist() + [float((f64(x)[:256] ** 2).sum())]
    np.testing.assert_allclose(np.array(d()), want, rtol=1e-5, atol=1e-4)
    # two barriers per reduction in the loop, one after it (the MSL of any device)
    msl = sums_per_chunk[(1,)].prepare(x, mx.zeros((4,), mx.float32), 3, BLOCK=256,
                                       num_warps=4, backend="msl").source
    assert msl.count("threadgroup_barrier") == 3
    x = data(rng, (4, 512), mx.float16)
    from metile_kernels import norms
    rms = norms.rms_norm[norms.grid(4)].prepare(x, x[0], mx.zeros_like(x), 4, 512, 1e-5,
                                                BLOCK=512, num_warps=2, backend="cuda")
    assert rms.source.count("__syncthreads()") == 1


@metile.kernel
def mixed_add(A, B, C, n, BLOCK: metile.constexpr):
    """C (float16) = A (float16) + B (float32): runs of 8 on CUDA read B as two float4s."""
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    inside = i < n
    a = metile.load(A + i, mask=inside, other=0.0).to(metile.float32)
    metile.store(C + i, (a + metile.load(B + i, mask=inside, other=0.0)).to(C.dtype), mask=inside)


def test_mixed_widths(rng):
    # float16 and float32 accesses in one kernel: the run is 16 bytes of the narrowest
    # (8 elements on CUDA, two float4 chunks of the float32 operand; 4 on Metal)
    n = 1000
    a, b = data(rng, (n,), mx.float16), data(rng, (n,), mx.float32)
    d = mixed_add[(2,)].prepare(a, b, mx.zeros((n,), mx.float16), n, BLOCK=512, num_warps=2)
    want = (f64(a) + f64(b)).astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(f64(d()), want, rtol=1e-3, atol=1e-3)
    assert "vectorize_rows" in d.execution_report.passes
    cuda = mixed_add[(2,)].prepare(a, b, mx.zeros((n,), mx.float16), n, BLOCK=512, num_warps=2,
                                   backend="cuda")
    source = translation_unit(cuda)
    # two float4 chunks, in the loop under the whole-runs test and in the per-run one
    assert len(re.findall(r"reinterpret_cast<const float4\*>\(&B\[", source)) == 4
    assert re.search(r"reinterpret_cast<const uint4\*>\(&A\[", source)
    assert re.search(r"reinterpret_cast<uint4\*>\(&C\[", source)
    if TOOLKIT is not None:
        ok, log = compile_cuda(source, "sm_90")
        assert ok, log


@metile.kernel
def gather_rows(X, Index, Y, BLOCK: metile.constexpr):
    """Y[i] = X[Index[i]]: a unit-stride int32 read beside the float ones."""
    i = metile.arange(0, BLOCK)
    metile.store(Y + i, metile.load(X + metile.load(Index + i)))


def test_integer_access_keeps_the_plain_layout(rng):
    x = data(rng, (512,), mx.float32)
    index = mx.array(rng.permutation(512).astype(np.int32))
    d = gather_rows[(1,)].prepare(x, index, mx.zeros((512,), mx.float32), BLOCK=512, num_warps=2)
    np.testing.assert_array_equal(np.array(d()), np.array(x)[np.array(index)])
    assert "vectorize_rows" not in d.execution_report.passes
    assert row_runs(d.spec.tile_ir(), 64, "msl", {}).startswith(
        "a unit-stride int32 access would be read element by element")


def test_a_read_only_load_used_once_is_read_where_it_is_used(rng):
    # rms_norm's weight: read after the reduction inside the store's runs, not held in
    # registers across it (placement._fuse_single_loads); the row itself stays held
    from metile.passes.placement import analyze
    from metile_kernels import norms
    x = data(rng, (4, 512), mx.float16)
    # the placement is the same for both emitters; the launch runs on the device's own
    d = norms.rms_norm[norms.grid(4)].prepare(x, x[0], mx.zeros_like(x), 4, 512, 1e-5,
                                              BLOCK=512, num_warps=2)
    fn = d.spec.tile_ir()
    place = analyze(fn)
    kinds = [place.kind[o.results[0].id] for o in fn.body.ops if o.name == "load"]
    assert kinds == ["local", "recompute"]       # X held, W read where it is used
    got = d()
    xs, ws = f64(x), f64(x[0])
    want = xs / np.sqrt((xs * xs).mean(axis=-1, keepdims=True) + 1e-5) * ws
    np.testing.assert_allclose(f64(got), want, rtol=2e-3, atol=2e-3)


@metile.kernel
def read_after_write(X, Y, BLOCK: metile.constexpr):
    """Y = X + 1, then Y read back: the second load reads what the kernel wrote, so it
    stays where the program put it."""
    i = metile.arange(0, BLOCK)
    metile.store(Y + i, metile.load(X + i) + 1.0)
    metile.store(Y + i, metile.load(Y + i) * 2.0)


def test_a_load_of_a_written_buffer_stays_in_program_order(rng):
    from metile.passes.placement import analyze
    x = data(rng, (256,), mx.float32)
    d = read_after_write[(1,)].prepare(x, mx.zeros((256,), mx.float32), BLOCK=256, num_warps=2)
    np.testing.assert_allclose(np.array(d()), (f64(x) + 1.0) * 2.0, rtol=1e-6, atol=1e-6)
    fn = d.spec.tile_ir()
    loads = [o for o in fn.body.ops if o.name == "load"]
    kinds = [analyze(fn).kind[o.results[0].id] for o in loads]
    assert kinds[1] != "recompute"


@metile.kernel
def where_positive(X, Z, Y, n, BLOCK: metile.constexpr):
    """Y = Z where X > 0, else 0: the load of Z has a mask that reads loaded data."""
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + i, mask=i < n, other=0.0)
    z = metile.load(Z + i, mask=(i < n) & (x > 0.0), other=0.0)
    metile.store(Y + i, z + x * 0.0, mask=i < n)


@pytest.mark.parametrize("n", [1024, 1000, 517])
def test_whole_runs_test_against_numpy(rng, n):
    # 2 programs of 512: with n=1000 the second program's last runs fail the whole-runs
    # test and take the per-run path; 517 leaves a program with one run partly inside
    x = data(rng, (n,), mx.float32)
    d = mixed_add[(2,)].prepare(x.astype(mx.float16), x, mx.zeros((n,), mx.float16), n,
                                BLOCK=512, num_warps=2)
    want = (2 * f64(x.astype(mx.float16))).astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(f64(d()), want, rtol=1e-3, atol=1e-3)
    assert any("1 lane loop(s) test all of a thread's runs at once" in note
               for note in d.execution_report.notes)


def test_a_mask_on_loaded_data_keeps_per_run_tests(rng):
    # Z's mask reads x: it cannot be tested for the whole row before the loop, so the
    # loop reading Z keeps its per-run tests (one copy); the loop holding x gets both
    n = 1000
    x, z = data(rng, (n,), mx.float32), data(rng, (n,), mx.float32)
    d = where_positive[(2,)].prepare(x, z, mx.zeros((n,), mx.float32), n, BLOCK=512,
                                     num_warps=2)
    np.testing.assert_array_equal(f64(d()), np.where(f64(x) > 0, f64(z), 0.0))
    assert any("1 lane loop(s) test all of a thread's runs at once" in note
               for note in d.execution_report.notes)
    msl = where_positive[(2,)].prepare(x, z, mx.zeros((n,), mx.float32), n, BLOCK=512,
                                       num_warps=2, backend="msl").source
    assert len(re.findall(r"metile_vload_float4\(&X\[", msl)) == 2
    assert len(re.findall(r"metile_vload_float4\(&Z\[", msl)) == 1


@metile.kernel
def swap_halves(X, Y, n, HALF: metile.constexpr, BLOCK: metile.constexpr,
                SPELLING: metile.constexpr = "lt"):
    """Y[i] = X[i + HALF] for the first HALF elements of each block, X[i - HALF] for the
    rest: a piecewise unit-stride address (rope's partner read) that runs keep as vectors
    when HALF is a multiple of the run.  SPELLING: the same condition written three ways."""
    col = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    local = metile.arange(0, BLOCK)
    if SPELLING == "lt":
        first = local < HALF
    elif SPELLING == "le":
        first = local <= HALF - 1
    else:
        first = HALF > local
    partner = metile.where(first, col + HALF, col - HALF)
    metile.store(Y + col, metile.load(X + partner, mask=partner < n, other=0.0), mask=col < n)


@pytest.mark.parametrize("half,runs,spelling", [(64, True, "lt"), (64, True, "le"),
                                                (64, True, "gt"), (6, False, "lt"),
                                                (6, False, "le")])
def test_piecewise_addresses_in_runs(rng, half, runs, spelling):
    # where(local < HALF, col + HALF, col - HALF) is unit-stride on every run when HALF is
    # a multiple of the run width: one vector load per run; HALF=6 straddles runs of 4
    # (and 8): the kernel keeps one element per access.  NumPy either way.
    block = 128
    n = 3 * block - 5                 # ragged: the last program's tail is masked
    x = data(rng, (n,), mx.float32)
    d = swap_halves[(metile.cdiv(n, block),)].prepare(x, mx.zeros((n,), mx.float32), n,
                                                      HALF=half, BLOCK=block, num_warps=1,
                                                      SPELLING=spelling)
    xs = np.array(x)
    idx = np.arange(n)
    local = idx % block
    partner = np.where(local < half, idx + half, idx - half)
    want = np.where(partner < n, xs[np.minimum(partner, n - 1)], 0.0)   # partner >= 0 here
    np.testing.assert_array_equal(np.array(d()), want)
    assert ("vectorize_rows" in d.execution_report.passes) == runs
    # the MSL source whatever device runs the test (on a GPU `d` holds CUDA)
    msl = swap_halves[(3,)].prepare(x, mx.zeros((n,), mx.float32), n, HALF=half, BLOCK=block,
                                    num_warps=1, SPELLING=spelling, backend="msl").source
    assert bool(re.search(r"metile_vload_float4\(&X\[", msl)) == runs
    if runs and TOOLKIT is not None:
        cuda = swap_halves[(3,)].prepare(x, mx.zeros((n,), mx.float32), n, HALF=half,
                                         BLOCK=block, num_warps=1, backend="cuda")
        source = translation_unit(cuda)
        assert re.search(r"reinterpret_cast<const float4\*>\(&X\[", source)
        ok, log = compile_cuda(source, "sm_90")
        assert ok, log
    if not runs:
        assert any("an address chooses between pieces (where) at a point inside a run" in note
                   for note in d.execution_report.notes)


@metile.kernel
def scale_rows(X, S, Y, rows, columns, BLOCK: metile.constexpr, ROWS: metile.constexpr):
    """Y = X * S[row]: S's address does not move along a row."""
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    s = metile.load(S + row + col * 0, mask=row < rows, other=0.0)
    metile.store(Y + row * columns + col, metile.load(X + row * columns + col, mask=inside,
                                                       other=0.0) * s, mask=inside)


def test_a_load_still_along_runs_is_read_once_per_run(rng):
    rows, columns = 7, 250
    x, s = data(rng, (rows, columns), mx.float32), data(rng, (rows,), mx.float32)
    d = scale_rows[(metile.cdiv(rows, 2),)].prepare(x, s, mx.zeros((rows, columns), mx.float32),
                                                    rows, columns, BLOCK=256, ROWS=2,
                                                    num_warps=1)
    np.testing.assert_allclose(np.array(d()), np.array(x) * np.array(s)[:, None], rtol=1e-6)
    assert "vectorize_rows" in d.execution_report.passes
    # one read of S per run of 4 (this two-row tile keeps per-run tests: one loop), not 4
    assert len(re.findall(r"\bS\[", d.source)) == 1


@metile.kernel
def gather_quotient(X, Y, n, OFF: metile.constexpr, D: metile.constexpr,
                    BLOCK: metile.constexpr):
    """Y[i] = X[(i + OFF) // D] + X[i] where i + OFF >= 0: a load at a quotient, constant
    along a run only when D is a multiple of the run and i + OFF is aligned to it and never
    negative (C's division truncates toward zero)."""
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    j = i + OFF
    ok = (j >= 0) & (i < n)
    q = metile.load(X + j // D, mask=ok, other=0.0)
    metile.store(Y + i, q + metile.load(X + i, mask=i < n, other=0.0), mask=i < n)


@pytest.mark.parametrize("off,d,width", [(0, 8, 4), (0, 16, 4), (4, 8, 4), (2, 8, None),
                                         (1, 8, None), (-8, 8, None), (0, 6, None),
                                         (0, 3, None)])
def test_loads_at_a_quotient_against_numpy(rng, off, d, width):
    # OFF=-8: j < 0 in the first run; C truncates -8..-1 // 8 to -1 and 0: not constant
    # on the run, so the kernel keeps one element per lane (and the mask hides j < 0).
    # OFF=2 and D=6 fit runs of 2 only, narrower than any emitter's vectors; the mask
    # (i < n) moves along the run: the quotient load reads where any element's holds.
    n, block = 1000, 512
    x = data(rng, (n,), mx.float32)
    d_ = gather_quotient[(metile.cdiv(n, block),)].prepare(
        x, mx.zeros((n,), mx.float32), n, OFF=off, D=d, BLOCK=block, num_warps=2,
        backend="msl")
    xs = np.array(x)
    i = np.arange(n)
    j = i + off
    quotient = np.where(j >= 0, j // d, 0)            # j >= 0: floor == truncation
    want = np.where(j >= 0, xs[np.minimum(quotient, n - 1)], 0.0) + xs
    # the numbers on this machine's own backend (the CPU runtime here, CUDA on a GPU)
    got = gather_quotient[(metile.cdiv(n, block),)](x, mx.zeros((n,), mx.float32), n, OFF=off,
                                                     D=d, BLOCK=block, num_warps=2)
    np.testing.assert_array_equal(np.array(got), want.astype(np.float32))
    notes = " ".join(d_.execution_report.notes)
    if width is None:
        assert "vectorize_rows" not in d_.execution_report.passes, notes
    else:
        assert f"Lanes own runs of {width} consecutive elements" in notes, notes
    if width is not None and TOOLKIT is not None:   # the masked quotient load on CUDA
        cuda = gather_quotient[(2,)].prepare(x, mx.zeros((n,), mx.float32), n, OFF=off, D=d,
                                             BLOCK=block, num_warps=2, backend="cuda")
        ok, log = compile_cuda(translation_unit(cuda), "sm_90")
        assert ok, log


@metile.kernel
def scale_groups(X, S, Y, n, GROUP: metile.constexpr, BLOCK: metile.constexpr):
    """Y[i] = X[i] * S[i // GROUP] in X's dtype: a group scale read once per run under the
    row's ragged mask (i < n moves along the run)."""
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    s = metile.load(S + i // GROUP, mask=i < n, other=0.0)
    metile.store(Y + i, metile.load(X + i, mask=i < n, other=0.0) * s, mask=i < n)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32], ids=str)
def test_group_scales_in_runs_against_numpy(rng, dtype):
    n, block, group = 1000, 1024, 16      # ragged: the tail run is partly masked
    x = data(rng, (n,), dtype)
    s = data(rng, (metile.cdiv(n, group),), dtype)
    for backend in ("msl",) + (("cuda",) if TOOLKIT is not None else ()):
        d = scale_groups[(1,)].prepare(x, s, mx.zeros((n,), dtype), n, GROUP=group,
                                       BLOCK=block, num_warps=4, backend=backend)
        notes = " ".join(d.execution_report.notes)
        assert "Lanes own runs of" in notes, notes
        assert len(re.findall(r"\bS\[", d.source)) <= 2, backend   # once per run (+ fallback)
        if backend == "cuda":
            ok, log = compile_cuda(translation_unit(d), "sm_90")
            assert ok, log
    want = (f64(x) * np.repeat(f64(s), group)[:n]).astype(np.float32)
    got = scale_groups[(1,)](x, s, mx.zeros((n,), dtype), n, GROUP=group, BLOCK=block,
                             num_warps=4)
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), want,
                               rtol={mx.float32: 1e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3}[dtype])


@metile.kernel
def unit_axes(X, Y, Z, B, rows, columns, BLOCK: metile.constexpr,
              BROADCAST: metile.constexpr = True):
    """A row held in registers and read through unit axes: Y = 2x as a (1, BLOCK) row,
    Z = x + 1 as a (BLOCK, 1) column, and with BROADCAST, B = x[None, :] broadcast down
    2 rows (a read at other coordinates)."""
    r = metile.program_id(0)
    c = metile.arange(0, BLOCK)
    one = metile.arange(0, 1)
    x = metile.load(X + r * columns + c, mask=c < columns, other=0.0).to(metile.float32)
    x2 = x * 2.0
    metile.store(Y + (r + one)[:, None] * columns + c[None, :], x2[None, :].to(Y.dtype),
                 mask=((r + one)[:, None] < rows) & (c[None, :] < columns))
    metile.store(Z + r * columns + c[:, None] + one[None, :] * 0, (x + 1.0)[:, None].to(Z.dtype),
                 mask=(c[:, None] < columns) & (one[None, :] < 1))
    if BROADCAST:
        two = metile.arange(0, 2)
        metile.store(B + (r * 2 + two)[:, None] * columns + c[None, :],
                     (x[None, :] + two[:, None].to(metile.float32)).to(B.dtype),
                     mask=(two[:, None] < 2) & (c[None, :] < columns))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_a_unit_axis_reads_registers_in_place(rng, dtype):
    # x[None, :] / x[:, None] keep the row-major order, so a loaded row read through them
    # stays in registers (the dequantize kernel's one-row store held its words, scales
    # and biases in threadgroup memory behind three barriers); a broadcast still reads it
    # at other coordinates, from threadgroup memory
    from metile.passes.placement import analyze
    rows, columns = 3, 250
    x = data(rng, (rows, columns), dtype)
    outs = [mx.zeros((rows, columns), dtype), mx.zeros((rows, columns), dtype),
            mx.zeros((2 * rows, columns), dtype)]
    d = unit_axes[(rows,)].prepare(x, *outs, rows, columns, BLOCK=256, num_warps=2,
                                   backend="msl")
    y, z, b = unit_axes[(rows,)](x, *outs, rows, columns, BLOCK=256, num_warps=2)
    xs = f64(x)
    tol = dict(zip(("rtol", "atol"), TOL[dtype]))
    np.testing.assert_allclose(f64(y), 2 * xs, **tol)
    np.testing.assert_allclose(f64(z), xs + 1, **tol)
    np.testing.assert_allclose(f64(b), np.repeat(xs, 2, axis=0) + np.tile([[0.0], [1.0]], (rows, 1)),
                               **tol)
    fn = d.spec.tile_ir()
    kinds = [analyze(fn).kind[o.results[0].id] for o in fn.body.ops if o.name == "load"]
    assert kinds == ["shared"]       # one load, broadcast below: threadgroup memory
    # without the broadcast, the same row stays in registers
    d1 = unit_axes[(rows,)].prepare(x, *outs, rows, columns, BLOCK=256, num_warps=2,
                                    BROADCAST=False, backend="msl")
    fn = d1.spec.tile_ir()
    assert [analyze(fn).kind[o.results[0].id] for o in fn.body.ops if o.name == "load"] \
        == ["local"]
    assert "threadgroup_barrier" not in d1.source and "threadgroup float" not in d1.source
    assert "threadgroup_barrier" in d.source
    y, z = unit_axes[(rows,)](x, *outs, rows, columns, BLOCK=256, num_warps=2, BROADCAST=False)
    np.testing.assert_allclose(f64(y), 2 * xs, **tol)
    np.testing.assert_allclose(f64(z), xs + 1, **tol)


@metile.kernel
def whole_block_reductions(X, O, BLOCK: metile.constexpr):
    x = metile.load(X + metile.arange(0, BLOCK))
    metile.store(O, metile.sum(x, axis=0))
    metile.store(O + 1, metile.max(x, axis=0))
    metile.store(O + 2, metile.argmax(x, axis=0))


@pytest.mark.parametrize("block", [1024, 4096, 8192])
def test_a_block_reduced_to_one_scalar_store(rng, block):
    # (found by a hostile test: a scalar store beside a block the lanes read in runs
    # crashed the lowering with an AttributeError from BLOCK 4096 up)
    x = rng.standard_normal(block).astype(np.float32)
    got = np.array(whole_block_reductions[(1,)](mx.array(x), mx.zeros((3,)), BLOCK=block))
    np.testing.assert_allclose(got[:2], [x.sum(dtype=np.float64), x.max()], rtol=1e-5, atol=1e-4)
    assert got[2] == x.argmax()
