"""Reductions along an axis of a tile (lower_reductions.rows_reduce): numbers against
NumPy through the CPU runtime, for rows the lanes combine by shuffles (runs of 4 on
Metal, one element a lane in the plain layout) and for rows they cannot (copied to
threadgroup memory and folded there); where the operand is held (registers, not
threadgroup memory); CUDA emission compiled by NVRTC.

Tolerances: float32 sums in another order, rtol 1e-5; max/min exact."""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.passes.placement import analyze
from nvrtc import TOOLKIT, compile_cuda, translation_unit


@metile.kernel
def row_stats(X, S, M, N, rows, cols, R: metile.constexpr, C: metile.constexpr):
    """S = 2 * row sums, M = row maxima, N = row minima of an (R, C) block of X's rows."""
    r = metile.program_id(0) * R + metile.arange(0, R)[:, None]
    c = metile.arange(0, C)[None, :]
    inside = (r < rows) & (c < cols)
    x = metile.load(X + r * cols + c, mask=inside, other=0.0).to(metile.float32)
    out = metile.program_id(0) * R + metile.arange(0, R)
    metile.store(S + out, metile.sum(x * 2.0, axis=1), mask=out < rows)
    metile.store(M + out, metile.max(metile.where(inside, x, -float("inf")), axis=1),
                 mask=out < rows)
    metile.store(N + out, metile.min(metile.where(inside, x, float("inf")), axis=1),
                 mask=out < rows)


@metile.kernel
def column_sums_of_a_loop(X, Y, rows, cols, R: metile.constexpr, C: metile.constexpr):
    """Y = X.sum(axis=0) for X (rows, C): an (R, C) accumulator over blocks of rows,
    summed along axis 0 once, after the loop."""
    r = metile.arange(0, R)[:, None]
    c = metile.arange(0, C)[None, :]
    acc = metile.zeros((R, C), dtype=metile.float32)
    for start in range(0, rows, R):
        acc += metile.load(X + (start + r) * cols + c, mask=(start + r < rows) & (c < cols),
                           other=0.0).to(metile.float32)
    out = metile.arange(0, C)
    metile.store(Y + out, metile.sum(acc, axis=0), mask=out < cols)


def _data(rng, shape, dtype):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


# (rows, cols, R, C, warps): rows on 32 / 16 / 8 lanes in runs of 4 (Metal), a plain
# layout with 8-element rows, 256-column rows on two SIMD-groups (64 lanes: each group's
# shuffled partial, then a fold of the two), and 512-column rows on 2 warps (128 lanes a
# row on 64 threads: folded in threadgroup memory)
SHAPES = [(37, 100, 16, 128, 4), (37, 30, 64, 32, 2), (9, 60, 64, 64, 4), (5, 8, 8, 8, 1),
          (9, 250, 4, 256, 4), (9, 500, 4, 512, 2)]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols,R,C,warps", SHAPES)
def test_row_reductions_against_numpy(rng, dtype, rows, cols, R, C, warps):
    x = _data(rng, (rows, cols), dtype)
    outs = [mx.zeros((rows,), mx.float32) for _ in range(3)]
    s, m, n = row_stats[(metile.cdiv(rows, R),)](x, *outs, rows, cols, R=R, C=C,
                                                 num_warps=warps)
    xs = np.array(x.astype(mx.float32)).astype(np.float64)
    np.testing.assert_allclose(np.array(s), 2 * xs.sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.array(m), xs.max(axis=1).astype(np.float32))
    np.testing.assert_array_equal(np.array(n), xs.min(axis=1).astype(np.float32))


@pytest.mark.parametrize("rows,cols,R,C,warps", SHAPES)
def test_rows_on_lanes_combine_by_shuffles(rows, cols, R, C, warps):
    x = mx.zeros((rows, cols), mx.float32)
    outs = [mx.zeros((rows,), mx.float32) for _ in range(3)]
    d = row_stats[(1,)].prepare(x, *outs, rows, cols, R=R, C=C, num_warps=warps,
                                backend="msl")
    # the row held in registers, not threadgroup memory, either way
    fn = d.spec.tile_ir()
    assert [analyze(fn).kind[o.results[0].id] for o in fn.body.ops if o.name == "load"] \
        == ["local"]
    # on lanes where a row (in runs of 4) fits one pass of the block's threads
    on_lanes = C <= 32 * 4 * warps
    assert ("metile_lanes_sum<" in d.source) == on_lanes
    assert ("metile_lanes_max<" in d.source) == on_lanes
    assert ("_rowparts" in d.source) == (on_lanes and C > 32 * 4)   # several SIMD-groups a row


def test_a_loop_accumulator_stays_in_registers(rng):
    # summed along axis 0 after the loop: copied to threadgroup memory there, once, not
    # held there through the loop
    rows, cols = 300, 100
    x = _data(rng, (rows, cols), mx.float16)
    y = column_sums_of_a_loop[(1,)](x, mx.zeros((cols,), mx.float32), rows, cols, R=16, C=128,
                                     num_warps=2)
    np.testing.assert_allclose(np.array(y), np.array(x.astype(mx.float32)).sum(axis=0),
                               rtol=1e-5, atol=1e-4)
    d = column_sums_of_a_loop[(1,)].prepare(x, mx.zeros((cols,), mx.float32), rows, cols,
                                            R=16, C=128, num_warps=2, backend="msl")
    fn = d.spec.tile_ir()
    loop = next(o for o in fn.body.ops if o.name == "for")
    assert analyze(fn).kind[loop.results[0].id] == "local"


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")
@pytest.mark.parametrize("dtype", [mx.float16, mx.float32], ids=str)
def test_cuda_row_reductions_compile(dtype):
    # runs of 8 (float16) or 4 (float32) on CUDA: 128 columns on 16 or 32 lanes
    x = mx.zeros((37, 100), dtype)
    outs = [mx.zeros((37,), mx.float32) for _ in range(3)]
    d = row_stats[(3,)].prepare(x, *outs, 37, 100, R=16, C=128, num_warps=4, backend="cuda")
    assert "metile_lanes_sum<" in d.source
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log


@metile.kernel
def run_rows(X, S, M, Y, rows, R: metile.constexpr, C: metile.constexpr):
    """S = row sums, M = row maxima of X (rows, C), and Y = X less its row's mean: rows as
    narrow as one run, so each row is one thread's (lower_reductions._rows_in_lanes for S
    and M; the mean is read back along the row, so it takes threadgroup memory)."""
    r = metile.program_id(0) * R + metile.arange(0, R)
    c = metile.arange(0, C)
    live = r[:, None] < rows
    x = metile.load(X + r[:, None] * C + c[None, :], mask=live, other=0.0).to(metile.float32)
    metile.store(S + r, metile.sum(x, axis=1), mask=r < rows)
    metile.store(M + r, metile.max(x, axis=1), mask=r < rows)
    mean = metile.sum(x, axis=1) / C
    metile.store(Y + r[:, None] * C + c[None, :], (x - mean[:, None]).to(Y.dtype), mask=live)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("rows,C,R,warps", [(100, 4, 64, 1), (70, 4, 128, 2), (37, 8, 64, 1)])
def test_rows_one_run_wide_fold_in_their_thread(rng, dtype, rows, C, R, warps):
    x = _data(rng, (rows, C), dtype)
    s, m, y = run_rows[(metile.cdiv(rows, R),)](
        x, mx.zeros((rows,), mx.float32), mx.zeros((rows,), mx.float32),
        mx.zeros((rows, C), dtype), rows, R=R, C=C, num_warps=warps)
    xs = np.array(x.astype(mx.float32)).astype(np.float64)
    np.testing.assert_allclose(np.array(s), xs.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(m), xs.max(axis=1).astype(np.float32))
    tol = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1e-2}[dtype]
    np.testing.assert_allclose(np.array(y.astype(mx.float32)),
                               xs - xs.mean(axis=1, keepdims=True), rtol=tol, atol=tol * 4)


def test_rows_one_run_wide_keep_their_results_in_registers():
    # Metal's runs of 4: a 4-wide row is one thread's run - summed there, the sum held in a
    # register (no lanes combine, nothing in threadgroup memory for it); the mean, read
    # back only along its row, is held in the same registers (placement.row_held)
    x = mx.zeros((100, 4), mx.float32)
    outs = (mx.zeros((100,), mx.float32), mx.zeros((100,), mx.float32), mx.zeros((100, 4)))
    d = run_rows[(2,)].prepare(x, *outs, 100, R=64, C=4, num_warps=1, backend="msl")
    assert "Lanes own runs of 4" in " ".join(d.execution_report.notes)
    # S and M: two registers a thread (its two rows); the mean: two more, no threadgroup array
    assert len(re.findall(r"\bfloat _rowred\d+\[2\];", d.source)) == 2
    assert len(re.findall(r"\bfloat _rowheld\d+\[2\];", d.source)) == 1
    assert not re.search(r"threadgroup (float|half|int)", d.source)
    assert "metile_lanes_sum<" not in d.source and "metile_lanes_max<" not in d.source


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC wheels not installed")
def test_cuda_rows_one_run_wide_fold_in_their_thread():
    # float16 runs of 8 on CUDA: an 8-wide row is one thread's; a kernel of row sums alone
    # then needs no threadgroup memory and no barrier
    x = mx.zeros((100, 8), mx.float16)
    d = row_sums_only[(2,)].prepare(x, mx.zeros((100,), mx.float32), 100, R=64, C=8,
                                    num_warps=1, backend="cuda")
    assert "_rowred" in d.source and "__shared__" not in d.source
    assert "__syncthreads" not in d.source
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log


@metile.kernel
def row_sums_only(X, S, rows, R: metile.constexpr, C: metile.constexpr):
    r = metile.program_id(0) * R + metile.arange(0, R)
    c = metile.arange(0, C)
    x = metile.load(X + r[:, None] * C + c[None, :], mask=r[:, None] < rows, other=0.0)
    metile.store(S + r, metile.sum(x.to(metile.float32), axis=1), mask=r < rows)


def test_row_sums_only_against_numpy(rng):
    x = _data(rng, (100, 8), mx.float16)
    s = row_sums_only[(2,)](x, mx.zeros((100,), mx.float32), 100, R=64, C=8, num_warps=1)
    np.testing.assert_allclose(np.array(s), np.array(x.astype(mx.float32)).sum(axis=1),
                               rtol=1e-5, atol=1e-5)


@metile.kernel
def rows_read_back(X, Y, Z, rows, cols, R: metile.constexpr, C: metile.constexpr):
    """Y = (x - mean) * max|x - mean| per row, in a loop over blocks of R rows (the
    statistics read back only along their rows: placement.row_held); Z = the row sums,
    stored as a (R,) tile too (a use elsewhere: threadgroup memory, as before)."""
    c = metile.arange(0, C)[None, :]
    for start in range(0, rows, R):
        r = start + metile.arange(0, R)[:, None]
        inside = (r < rows) & (c < cols)
        x = metile.load(X + r * cols + c, mask=inside, other=0.0).to(metile.float32)
        y = x - metile.sum(x, axis=1)[:, None] * (1.0 / cols)
        top = (metile.max(metile.where(inside, metile.abs(y), 0.0), axis=1) + 0.0)[:, None]
        metile.store(Y + r * cols + c, (y * top).to(Y.dtype), mask=inside)
        total = metile.sum(x, axis=1)
        at = start + metile.arange(0, R)
        metile.store(Z + at, total + metile.where(total > 0, 0.0, 0.0), mask=at < rows)


# (rows, cols, R, C, warps): a row on 16 lanes (CUDA's runs of 8 over 128 columns), on 32,
# on 4, one thread's run, and rows too wide for one SIMD-group's lanes (threadgroup memory)
HELD = [(37, 128, 8, 128, 2), (20, 256, 4, 256, 2), (50, 30, 16, 32, 1), (70, 4, 64, 4, 1),
        (9, 1000, 2, 1024, 4)]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
@pytest.mark.parametrize("rows,cols,R,C,warps", HELD)
def test_statistics_read_back_along_their_rows(rng, dtype, rows, cols, R, C, warps):
    x = _data(rng, (rows, cols), dtype)
    y, z = rows_read_back[(1,)](x, mx.zeros((rows, cols), dtype), mx.zeros((rows,), mx.float32),
                                rows, cols, R=R, C=C, num_warps=warps)
    xs = np.array(x.astype(mx.float32)).astype(np.float64)
    c = xs - xs.mean(axis=1, keepdims=True)
    want = c * np.abs(c).max(axis=1, keepdims=True)
    tol = {mx.float32: 1e-5, mx.float16: 4e-3}[dtype]
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), want, rtol=tol, atol=tol * 8)
    np.testing.assert_allclose(np.array(z), xs.sum(axis=1), rtol=1e-5, atol=1e-4)


def test_statistics_read_back_along_their_rows_stay_in_registers():
    # CUDA, 16-bit rows of 128 in runs of 8: a row on 16 lanes; the mean and the maximum
    # are combined by 16-lane shuffles and kept there (no threadgroup array, no barrier for
    # them); the sums stored as a (R,) tile go through threadgroup memory as before
    x = mx.zeros((37, 128), mx.float16)
    d = rows_read_back[(1,)].prepare(x, mx.zeros((37, 128), mx.float16),
                                     mx.zeros((37,), mx.float32), 37, 128, R=8, C=128,
                                     num_warps=2, backend="cuda")
    body = d.variant.data["body"]
    assert len(re.findall(r"\bfloat _rowheld\d+\[2\];", body)) == 2   # (two rows a thread)
    assert len(re.findall(r"__shared__ float _rows\d+\[8\];", body)) == 1
    assert "metile_lanes_sum<16>" in body and "metile_lanes_max<16>" in body
    if TOOLKIT is not None:
        ok, log = compile_cuda(translation_unit(d), "sm_90")
        assert ok, log


@metile.kernel
def nan_row_extremes(X, M, N, R: metile.constexpr, C: metile.constexpr):
    r = metile.arange(0, R)
    c = metile.arange(0, C)
    x = metile.load(X + r[:, None] * C + c[None, :])
    metile.store(M + r, metile.max(x, axis=1))
    metile.store(N + r, metile.min(x, axis=1))


@pytest.mark.parametrize("R,C", [(4, 32), (4, 8), (3, 5)])
def test_an_all_nan_row_gives_the_fold_start_on_every_path(R, C):
    # (from a hostile test: rows folded in their lanes' runs - (4, 32), (4, 8) - started
    # from their first element and gave NaN for a row of NaN, other layouts -inf / +inf;
    # the README promises the start, as fmax skips NaN)
    x = np.arange(R * C, dtype=np.float32).reshape(R, C)
    x[1] = np.nan
    x[2, ::2] = np.nan
    m, n = nan_row_extremes[(1,)](mx.array(x), mx.zeros((R,)), mx.zeros((R,)), R=R, C=C)
    want_m, want_n = np.nanmax(np.where(np.isnan(x), -np.inf, x), axis=1), \
        np.nanmin(np.where(np.isnan(x), np.inf, x), axis=1)
    np.testing.assert_array_equal(np.array(m), want_m)
    np.testing.assert_array_equal(np.array(n), want_n)


def test_the_sum_of_a_bool_tile_counts_its_true_elements():
    # (refused: "sum() is not defined on tile<8, bool>", where Triton counts in int32 and
    # metile's own cumsum takes bool tiles)
    @metile.kernel
    def count(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.arange(0, BLOCK)
        x = metile.load(X + offs, mask=offs < n, other=0.0)
        metile.store(Y + 0, metile.sum(x > 0.5, axis=0))

    x = np.array([0.1, 0.9, 0.7, 0.2, 0.8], np.float32)
    got = count[(1,)](mx.array(x), mx.zeros((1,), dtype=mx.int32), 5, BLOCK=8)
    assert got.tolist() == [int((x > 0.5).sum())]


@metile.kernel
def reshaped_after_row_stats(X, O, V: metile.constexpr):
    r = metile.arange(0, 4)
    c = metile.arange(0, 8)
    x = metile.load(X + r[:, None] * 8 + c[None, :])
    s = metile.sum(x, 1)
    if V == 0:
        y = metile.reshape(metile.broadcast_to(s[:, None], (4, 8)), (32,))
    elif V == 1:
        y = metile.reshape(s[:, None] * x, (32,))
    elif V == 2:
        y = metile.reshape(x - metile.max(x, 1)[:, None], (32,))
    else:
        y = metile.reshape(metile.cumsum(x, 1) + s[:, None], (32,))
    metile.store(O + metile.arange(0, 32), y)


@pytest.mark.parametrize("variant", [0, 1, 2, 3])
def test_a_row_statistic_read_through_a_reshape(variant):
    # a statistic broadcast back over its rows and then reshaped is read at the reshaped
    # tile's coordinates, outside the lanes holding its rows: it was held there anyway
    # (placement.row_held) and the compiler failed an assertion
    x = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    s = x.sum(1, keepdims=True)
    want = {0: np.broadcast_to(s, (4, 8)), 1: s * x, 2: x - x.max(1, keepdims=True),
            3: np.cumsum(x, 1) + s}[variant].ravel()
    out = reshaped_after_row_stats[(1,)](mx.array(x.ravel()), mx.zeros((32,)), V=variant)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-6)
