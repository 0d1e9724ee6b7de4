"""metile.atomic_add: device buffers updated atomically; the result is the passed
array plus every added value.  Integer results are exact (and independent of thread
order); float sums are checked against NumPy with a float32 tolerance."""

import inspect

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError


@metile.kernel
def histogram(Values, Counts, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    bins = metile.load(Values + offs, mask=mask)
    metile.atomic_add(Counts + bins, 1, mask=mask)


@metile.kernel
def scatter_add(X, Index, Out, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.atomic_add(Out + metile.load(Index + offs, mask=mask), metile.load(X + offs, mask=mask),
                      mask=mask)


@metile.kernel
def block_total(X, Total, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.atomic_add(Total, metile.sum(metile.load(X + offs, mask=offs < n)))


@metile.kernel
def column_sums(X, Sums, rows, BLOCK_R: metile.constexpr, COLS: metile.constexpr):
    """A 2-D tile: each program adds its rows into per-column sums (uint32)."""
    r = metile.program_id(0) * BLOCK_R + metile.arange(0, BLOCK_R)
    c = metile.arange(0, COLS)
    mask = (r < rows)[:, None]
    x = metile.load(X + r[:, None] * COLS + c[None, :], mask=mask)
    metile.atomic_add(Sums + metile.zeros((BLOCK_R, COLS), metile.int32) + c[None, :], x,
                      mask=mask)


@pytest.mark.parametrize("n,block,nsg", [(1000, 256, None), (37, 16, 2), (1, 64, None)])
def test_histogram_counts_exactly(rng, n, block, nsg):
    # 16 elements over 64 threads: no element may be added twice
    values = rng.integers(0, 10, n).astype(np.int32)
    start = np.arange(10, dtype=np.int32)
    extra = {} if nsg is None else {"num_simdgroups": nsg}
    counts = histogram[(metile.cdiv(n, block),)](mx.array(values), mx.array(start), n, BLOCK=block,
                                                 **extra)
    np.testing.assert_array_equal(np.array(counts), start + np.bincount(values, minlength=10))


def test_scatter_add_matches_numpy(rng):
    n = 5000
    x = rng.standard_normal(n).astype(np.float32)
    index = rng.integers(0, 7, n).astype(np.int32)
    start = rng.standard_normal(7).astype(np.float32)
    out = scatter_add[(metile.cdiv(n, 512),)](mx.array(x), mx.array(index), mx.array(start), n,
                                              BLOCK=512)
    ref = start.astype(np.float64)
    np.add.at(ref, index, x.astype(np.float64))
    np.testing.assert_allclose(np.array(out), ref, rtol=1e-5, atol=1e-4)


def test_scalar_atomic_happens_once_per_program(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    total = block_total[(4,)](mx.array(x), mx.array([2.0]), 1000, BLOCK=256)
    # once per program: every one of the 256 threads holds the block's sum
    np.testing.assert_allclose(np.array(total), [2.0 + x.astype(np.float64).sum()], rtol=1e-5,
                               atol=1e-4)


def test_two_dimensional_tile_and_unsigned(rng):
    rows, cols = 50, 8
    x = rng.integers(0, 1000, (rows, cols)).astype(np.uint32)
    sums = column_sums[(metile.cdiv(rows, 16),)](mx.array(x), mx.zeros((cols,), mx.uint32), rows,
                                                 BLOCK_R=16, COLS=cols)
    np.testing.assert_array_equal(np.array(sums), x.sum(axis=0))


def test_atomics_compose_with_compile_and_any_lane_order(rng, monkeypatch):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")  # integer adds: every order agrees
    values = rng.integers(0, 5, 300).astype(np.int32)

    @mx.compile
    def step(v, c):
        return histogram[(2,)](v, c, 300, BLOCK=256) * 2

    out = step(mx.array(values), mx.zeros((5,), mx.int32))
    np.testing.assert_array_equal(np.array(out), 2 * np.bincount(values, minlength=5))


@pytest.mark.parametrize("backend,spelling", [
    ("msl", "metal::atomic_fetch_add_explicit((device metal::atomic_int*)&Counts["),
    ("cuda", "atomicAdd(reinterpret_cast<int*>(&Counts["),
])
def test_backend_spelling(backend, spelling):
    d = histogram[(1,)].prepare(mx.zeros((8,), mx.int32), mx.zeros((4,), mx.int32), 8, BLOCK=8,
                                backend=backend)
    assert spelling in d.source and "Counts_written" not in d.source
    assert d.call_kwargs["init_value"] == 0


@metile.kernel
def add_then_read(X, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.atomic_add(X + offs, 1.0, mask=offs < n)
    metile.store(X + offs, metile.load(X + offs) * 2.0)  # MARK


@metile.kernel
def half_atomic(X, BLOCK: metile.constexpr):
    metile.atomic_add(X + metile.arange(0, BLOCK), metile.zeros((BLOCK,), metile.float16))  # MARK


@metile.kernel
def shared_atomic(X, BLOCK: metile.constexpr):
    scratch = metile.shared(BLOCK)
    metile.atomic_add(scratch + metile.arange(0, BLOCK), 1.0)  # MARK
    metile.store(X + metile.arange(0, BLOCK), metile.load(scratch + metile.arange(0, BLOCK)))


@metile.kernel
def old_value(X, Y, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    old = metile.atomic_add(X + offs, 1.0)  # MARK
    metile.store(Y + offs, old)


@metile.kernel(differentiable=True)
def differentiable_atomic(X, Y, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.atomic_add(Y + offs, metile.load(X + offs))  # MARK


def _line(kernel) -> str:
    lines, first = inspect.getsourcelines(kernel.fn)
    return f"test_atomics.py:{first + next(i for i, t in enumerate(lines) if '# MARK' in t)}:"


@pytest.mark.parametrize("kernel,args,message", [
    (add_then_read, lambda: (mx.zeros((8,)), 8), "buffer 'X' is updated with atomics and also "
                                                 "stored to in this kernel; write it with "
                                                 "metile.atomic_xchg"),
    (half_atomic, lambda: (mx.zeros((8,), mx.float16),), "atomic_add() on a float16 buffer is not "
                                                         "supported; it takes float32, int32, uint32"),
    (shared_atomic, lambda: (mx.zeros((8,)),), "atomic_add() on threadgroup memory is not supported"),
    (differentiable_atomic, lambda: (mx.zeros((8,)), mx.zeros((8,))),
     "atomic_add is not supported in differentiable=True kernels"),
])
def test_rejections_name_the_line(kernel, args, message):
    with pytest.raises(CompilationError) as info:
        kernel[(1,)](*args(), BLOCK=8)
    assert message in str(info.value) and _line(kernel) in str(info.value)


@metile.kernel
def thread_level_counts(Values, Counts, Flags, n):
    """Thread-level code: each thread's own scalar atomic_add, and a uniform update made
    only by the threads that take a thread-dependent branch."""
    for i in metile.tile_range(metile.thread_id(), n, metile.num_threads()):
        metile.atomic_add(Counts + metile.load(Values + i), 1)
    if metile.thread_id() < 3:
        metile.atomic_add(Flags, 1)


def test_thread_level_atomics_are_per_thread(rng):
    n = 200
    values = rng.integers(0, 6, n).astype(np.int32)
    counts, flags = thread_level_counts[(1,)](mx.array(values), mx.zeros((6,), mx.int32),
                                              mx.zeros((1,), mx.int32), n, num_simdgroups=2)
    np.testing.assert_array_equal(np.array(counts), np.bincount(values, minlength=6))
    np.testing.assert_array_equal(np.array(flags), [3])


def test_atomic_add_old_value_counts_the_passed_contents():
    # the old value is used, so the buffer starts from the passed array (not from zero)
    x, y = old_value[(1,)](mx.arange(8).astype(mx.float32), mx.zeros((8,)), BLOCK=8)
    np.testing.assert_array_equal(np.array(y), np.arange(8))
    np.testing.assert_array_equal(np.array(x), np.arange(8) + 1)


# -- a hostile test (twenty-ninth session) --------------------------------------------------

@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_a_program_wide_store_is_seen_by_the_threads_that_read_it_back(order, monkeypatch):
    # (a store every thread makes alike runs once, by thread 0, and no barrier followed it:
    # with other lane orders the others read the buffer before it was written)
    monkeypatch.setenv("METILE_LANE_ORDER", order)

    @metile.kernel(num_simdgroups=2)
    def read_back(X, O):
        tid = metile.thread_id()
        metile.store(O, metile.load(X) + 1.0)
        metile.store(O + 1 + tid, metile.load(O))

    got = read_back[(1,)](mx.array([5.0]), mx.zeros((65,)))
    assert got.tolist() == [6.0] * 65


# -- the race check and atomics (a hostile trial, thirty-first session) -------------------------

@metile.kernel(num_simdgroups=1)
def float_pair_sums(X, S):
    tid = metile.thread_id()
    metile.atomic_add(S + tid % 2, metile.load(X + tid))


@metile.kernel(num_simdgroups=1)
def handed_out(X, M, Old):
    tid = metile.thread_id()
    o = metile.atomic_max(M + tid % 4, metile.load(X + tid))
    metile.store(Old + tid, o)


@metile.kernel(num_simdgroups=1)
def colliding(X, Y):
    tid = metile.thread_id()
    metile.store(Y + (tid % 4), metile.load(X + tid))


def test_the_race_check_knows_which_outputs_atomics_make_order_dependent(monkeypatch):
    # (float atomics and stored old values raised "race detected ... declare it with
    # order_dependent_outputs=", which a @metile.kernel launch cannot take; the compiler
    # knows these outputs, and a real race is still found)
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    x = np.random.default_rng(0).standard_normal(32).astype(np.float32)
    s = float_pair_sums[(1,)](mx.array(x), mx.zeros((2,)))
    np.testing.assert_allclose(np.array(s), x.reshape(16, 2).sum(0), rtol=1e-5, atol=1e-6)
    m, old = handed_out[(1,)](mx.array(x), mx.full((4,), -10.0), mx.zeros((32,)))
    np.testing.assert_array_equal(np.array(m), x.reshape(8, 4).max(0))
    assert set(np.array(old).tolist()) <= set(x.tolist()) | {-10.0}
    with pytest.raises(RuntimeError, match="race detected in kernel .*colliding"):
        mx.eval(colliding[(1,)](mx.array(x), mx.zeros((4,))))
