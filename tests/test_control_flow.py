"""return, break and continue in kernels and @metile.inline helpers, with Python's
(and Triton's) meaning, checked against NumPy on the MSL CPU runtime.  Outputs
start as a sentinel, so an element a return skipped is seen untouched.

Tolerances: float32 strict (rtol=3e-4, atol=3e-5); searches and counts are exact."""

import inspect

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.frontend.desugar_control import desugar
from metile.frontend.source import function_source

RTOL, ATOL = 3e-4, 3e-5
SENTINEL = -7.0


def _rows(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# -- return in the kernel body --------------------------------------------------------------

@metile.kernel
def early_exit(X, Y, n, used, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    if pid >= used:
        return
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, x * 2.0 + 1.0, mask=offs < n)


@pytest.mark.parametrize("n", [1, 7, 65, 1000])
def test_return_when_the_grid_is_larger_than_needed(rng, n):
    x = _rows(rng, (n,))
    used = max(1, metile.cdiv(n, 32) - 1)  # the last program(s) must not store
    grid = metile.cdiv(n, 32) + 3
    y = np.array(early_exit[(grid,)](mx.array(x), mx.full((n,), SENTINEL), n, used, BLOCK=32))
    done = min(n, used * 32)
    np.testing.assert_allclose(y[:done], x[:done] * 2.0 + 1.0, rtol=RTOL, atol=ATOL)
    assert (y[done:] == SENTINEL).all()


@metile.kernel(num_simdgroups=2)
def thread_exit(X, Y, n, BLOCK: metile.constexpr = 64):
    i = metile.program_id(0) * BLOCK + metile.thread_id()
    if i >= n:
        return
    x = metile.load(X + i)
    if x < 0.0:
        metile.store(Y + i, -x)
        return
    metile.store(Y + i, x * 3.0)


@pytest.mark.parametrize("n", [1, 9, 63, 1000])
def test_early_return_in_thread_level_code(rng, n):
    x = _rows(rng, (n,))
    y = np.array(thread_exit[(metile.cdiv(n, 64),)](mx.array(x), mx.full((n,), SENTINEL), n))
    np.testing.assert_allclose(y, np.where(x < 0, -x, 3.0 * x), rtol=RTOL, atol=ATOL)


@metile.kernel(num_simdgroups=4)
def rows_sum(X, Out, n, rows, BLOCK: metile.constexpr = 128):
    """Thread level with shared memory and barriers after a program-uniform return."""
    row = metile.program_id(0)
    if row >= rows:
        return
    partial = metile.shared(BLOCK, dtype=metile.float32)
    tid = metile.thread_id()
    acc = 0.0
    for i in metile.tile_range(tid, n, BLOCK):
        acc += metile.load(X + row * n + i)
    metile.store(partial + tid, acc)
    metile.barrier()
    step = BLOCK // 2
    while step > 0:
        if tid < step:
            metile.store(partial + tid, metile.load(partial + tid) + metile.load(partial + tid + step))
        metile.barrier()
        step = step // 2
    if tid == 0:
        metile.store(Out + row, metile.load(partial))


def test_uniform_return_before_barriers(rng):
    x = _rows(rng, (5, 301))
    out = np.array(rows_sum[(8,)](mx.array(x), mx.full((8,), SENTINEL), 301, 5))
    np.testing.assert_allclose(out[:5], x.astype(np.float64).sum(1), rtol=RTOL, atol=ATOL)
    assert (out[5:] == SENTINEL).all()


@metile.kernel
def static_exit(X, Y, n, MODE: metile.constexpr, BLOCK: metile.constexpr = 64):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, x, mask=offs < n)
    if MODE == 0:
        return
    metile.store(Y + offs, x * 3.0, mask=offs < n)


@pytest.mark.parametrize("mode", [0, 1])
def test_return_under_a_compile_time_condition(rng, mode):
    x = _rows(rng, (100,))
    y = np.array(static_exit[(2,)](mx.array(x), mx.full((100,), SENTINEL), 100, MODE=mode))
    np.testing.assert_allclose(y, x * (3.0 if mode else 1.0), rtol=RTOL, atol=ATOL)
    if mode == 0:  # nothing is emitted after a return taken at compile time
        args = (mx.array(x), mx.zeros((100,)), 100)
        assert _body(static_exit[(2,)].prepare(*args, MODE=0, backend="msl").source) == \
            _body(store_once[(2,)].prepare(*args, backend="msl").source)


@metile.kernel
def store_once(X, Y, n, BLOCK: metile.constexpr = 64):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, x, mask=offs < n)


# -- return in inline helpers ----------------------------------------------------------------

@metile.inline
def piecewise(x):
    if x < -1.0:
        return -x
    if x < 1.0:
        return x * x
    return 2.0 * x - 1.0


@metile.inline
def clipped(x, lo):
    # a return inside one branch of an if that does not always return: flags, not a merge
    y = x
    if x < lo:
        y = lo
        if x < lo - 1.0:
            return lo - 1.0
    return y * 0.5


@metile.kernel(num_simdgroups=1)
def apply_helpers(X, A, B, n, BLOCK: metile.constexpr = 32):
    i = metile.program_id(0) * BLOCK + metile.thread_id()
    if i < n:
        x = metile.load(X + i)
        metile.store(A + i, piecewise(x))
        metile.store(B + i, clipped(x, 0.25))


@pytest.mark.parametrize("n", [1, 33, 1000])
def test_helper_returns_per_thread(rng, n):
    x = _rows(rng, (n,), 2.0)
    a, b = apply_helpers[(metile.cdiv(n, 32),)](mx.array(x), mx.full((n,), SENTINEL),
                                                mx.full((n,), SENTINEL), n)
    ref_a = np.where(x < -1, -x, np.where(x < 1, x * x, 2 * x - 1))
    ref_b = np.where(x < 0.25 - 1.0, 0.25 - 1.0, np.where(x < 0.25, 0.25, x) * 0.5)
    np.testing.assert_allclose(np.array(a), ref_a, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.array(b), ref_b, rtol=RTOL, atol=ATOL)


@metile.inline
def per_program(x, flag):
    if flag > 0:
        return x * 2.0
    return -x


@metile.kernel
def tile_helper(X, Y, Flags, n, BLOCK: metile.constexpr = 64):
    pid = metile.program_id(0)
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    metile.store(Y + offs, per_program(x, metile.load(Flags + pid)), mask=offs < n)


def test_helper_returns_tiles_under_a_program_condition(rng):
    x = _rows(rng, (300,))
    flags = np.array([1, 0, 0, 1, 1], np.int32)
    y = np.array(tile_helper[(5,)](mx.array(x), mx.full((300,), SENTINEL), mx.array(flags), 300))
    ref = np.where(np.repeat(flags, 64)[:300] > 0, 2 * x, -x)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


# -- break and continue --------------------------------------------------------------------

@metile.kernel(num_simdgroups=1)
def first_over(X, Out, n, t):
    """Per program (uniform): the first index of its row above t, or -1."""
    row = metile.program_id(0)
    i = 0
    found = -1
    while True:
        if i >= n:
            break
        if metile.load(X + row * n + i) > t:
            found = i
            break
        i += 1
    if metile.thread_id() == 0:
        metile.store(Out + row, found)


@metile.kernel(num_simdgroups=1)
def first_over_per_thread(X, Out, rows, n, t):
    """Per thread (divergent): each thread searches its own row."""
    row = metile.program_id(0) * 32 + metile.thread_id()
    if row >= rows:
        return
    found = -1
    i = 0
    while i < n:
        if metile.load(X + row * n + i) > t:
            found = i
            break
        i += 1
    metile.store(Out + row, found)


def _first_over(x, t):
    return np.array([int(np.argmax(r > t)) if (r > t).any() else -1 for r in x], np.int32)


@pytest.mark.parametrize("n", [1, 9, 65])
def test_break_in_while_searches(rng, n):
    x = _rows(rng, (37, n))
    t = 1.2
    out = first_over[(37,)](mx.array(x), mx.full((37,), 99, dtype=mx.int32), n, t)
    np.testing.assert_array_equal(np.array(out), _first_over(x, t))
    out = first_over_per_thread[(2,)](mx.array(x), mx.full((37,), 99, dtype=mx.int32), 37, n, t)
    np.testing.assert_array_equal(np.array(out), _first_over(x, t))


@metile.kernel(num_simdgroups=1)
def skip_sums(X, Out, n):
    """Per thread: sum the positives, and of the negatives only the first two."""
    row = metile.program_id(0) * 32 + metile.thread_id()
    acc = 0.0
    negatives = 0
    for i in range(n):
        v = metile.load(X + row * n + i)
        if v < 0.0:
            negatives += 1
            if negatives > 2:
                continue
        if v == 0.5:
            continue
        acc += v
    metile.store(Out + row, acc)


def test_continue_skips_iterations(rng):
    x = _rows(rng, (32, 20))
    x[3, 4] = 0.5
    out = np.array(skip_sums[(1,)](mx.array(x), mx.full((32,), SENTINEL), 20))
    ref = []
    for r in x.astype(np.float64):
        acc, neg = 0.0, 0
        for v in r:
            if v < 0:
                neg += 1
                if neg > 2:
                    continue
            if v == 0.5:
                continue
            acc += v
        ref.append(acc)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


@metile.kernel
def nested_break(X, Out, rows, n, t, BLOCK: metile.constexpr = 32):
    """Tile code: per program, over its rows, sum each row in chunks until a chunk's
    max exceeds t (break in the inner loop only); reductions hold barriers inside."""
    total = 0.0
    for r in range(rows):
        for start in range(0, n, BLOCK):
            offs = start + metile.arange(0, BLOCK)
            x = metile.load(X + (metile.program_id(0) * rows + r) * n + offs, mask=offs < n,
                            other=-1.0)
            if metile.max(x) > t:
                break
            total += metile.sum(metile.where(offs < n, x, 0.0))
    metile.store(Out + metile.program_id(0), total)


def test_nested_loops_break_in_the_inner_loop(rng):
    programs, rows, n, t = 3, 4, 100, 2.2
    x = _rows(rng, (programs, rows, n))
    out = np.array(nested_break[(programs,)](mx.array(x), mx.full((programs,), SENTINEL), rows,
                                             n, t))
    ref = np.zeros(programs)
    for p in range(programs):
        for r in range(rows):
            for s in range(0, n, 32):
                chunk = x[p, r, s:s + 32].astype(np.float64)
                if chunk.max() > t:
                    break
                ref[p] += chunk.sum()
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


@metile.kernel(num_simdgroups=1)
def return_in_loop(X, Out, Steps, n, t):
    """Per thread: store the first index over t and stop; -1 when none."""
    row = metile.program_id(0) * 32 + metile.thread_id()
    for i in range(n):
        metile.store(Steps + row, i + 1)
        if metile.load(X + row * n + i) > t:
            metile.store(Out + row, i)
            return
    metile.store(Out + row, -1)


@metile.kernel
def uniform_return_in_loop(X, Y, n, BLOCK: metile.constexpr = 16):
    """Tile code: program p copies chunks 0, 1, ... and returns at its stop index."""
    pid = metile.program_id(0)
    limit = metile.load(X + pid * n * BLOCK)  # the stop index, stored in the row's first slot
    for k in range(n):
        offs = (pid * n + k) * BLOCK + metile.arange(0, BLOCK)
        if k == metile.cast(limit, metile.int32):
            return
        metile.store(Y + offs, metile.load(X + offs) + 1.0)
    metile.store(Y + pid * n * BLOCK, SENTINEL * 2.0)


def test_return_inside_loops(rng):
    x = _rows(rng, (32, 12))
    out, steps = return_in_loop[(1,)](mx.array(x), mx.full((32,), 99, dtype=mx.int32),
                                      mx.zeros((32,), dtype=mx.int32), 12, 1.0)
    first = _first_over(x, 1.0)
    np.testing.assert_array_equal(np.array(out), first)
    np.testing.assert_array_equal(np.array(steps), np.where(first >= 0, first + 1, 12))

    n, block = 5, 16
    x = _rows(rng, (3, n, block))
    x[:, 0, 0] = [2, 0, 9]  # program 2 never hits its stop: it runs to the end
    y = np.array(uniform_return_in_loop[(3,)](mx.array(x), mx.full((3, n, block), SENTINEL), n))
    ref = np.full((3, n, block), SENTINEL)
    for p, stop in enumerate([2, 0, n]):
        ref[p, :stop] = x[p, :stop] + 1.0
    ref[2, 0, 0] = SENTINEL * 2.0  # only the program that finished its loop gets here
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@metile.inline
def store_positive(ptr, x):
    if x <= 0.0:
        return
    metile.store(ptr, x)


@metile.kernel(num_simdgroups=1)
def while_continue_break(X, Out, Count, n, t):
    """Per thread: a while loop with both continue and break, then a helper's bare return."""
    row = metile.program_id(0) * 32 + metile.thread_id()
    acc = 0.0
    count = 0
    i = 0
    while i < n:
        v = metile.load(X + row * n + i)
        i += 1
        if v < -t:
            continue
        if v > t:
            count += 100
            break
        acc += v
        count += 1
    store_positive(Out + row, acc)
    metile.store(Count + row, count)


@metile.kernel
def chunk_sums(X, Out, n, t, BLOCK: metile.constexpr = 32):
    """Tile code over tile_range: skip negative chunks, stop once the total passes t."""
    pid = metile.program_id(0)
    total = 0.0
    for s in metile.tile_range(0, n, BLOCK):
        offs = s + metile.arange(0, BLOCK)
        m = metile.sum(metile.load(X + pid * n + offs, mask=offs < n))
        if m < 0.0:
            continue
        total += m
        if total > t:
            break
    metile.store(Out + pid, total)


def test_continue_and_break_in_one_loop(rng):
    n, t = 17, 1.5
    x = _rows(rng, (32, n))
    out, count = while_continue_break[(1,)](mx.array(x), mx.full((32,), SENTINEL),
                                            mx.zeros((32,), dtype=mx.int32), n, t)
    ref_out, ref_count = [], []
    for r in x.astype(np.float64):
        acc, c = 0.0, 0
        for v in r:
            if v < -t:
                continue
            if v > t:
                c += 100
                break
            acc += v
            c += 1
        ref_out.append(acc if acc > 0 else SENTINEL)
        ref_count.append(c)
    np.testing.assert_allclose(np.array(out), ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(np.array(count), ref_count)

    x = _rows(rng, (3, 201))
    out = np.array(chunk_sums[(3,)](mx.array(x), mx.full((3,), SENTINEL), 201, 2.0))
    ref = []
    for r in x.astype(np.float64):
        total = 0.0
        for s in range(0, 201, 32):
            if r[s:s + 32].sum() < 0:
                continue
            total += r[s:s + 32].sum()
            if total > 2.0:
                break
        ref.append(total)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


# -- what is not rewritten stays the same ------------------------------------------------------

@metile.kernel
def plain(X, Y, n, BLOCK: metile.constexpr = 64):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs, mask=offs < n) + 1.0, mask=offs < n)


@metile.kernel
def plain_with_return(X, Y, n, BLOCK: metile.constexpr = 64):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs, mask=offs < n) + 1.0, mask=offs < n)
    return


@metile.kernel
def guarded_by_hand(X, Y, n, used, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    if pid >= used:
        pass
    else:
        offs = pid * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + offs, mask=offs < n)
        metile.store(Y + offs, x * 2.0 + 1.0, mask=offs < n)


def _body(source: str) -> str:
    return source  # the kernel body as metal_kernel takes it; the signature is built later


def test_no_flags_where_none_are_needed():
    src = function_source(plain.fn if hasattr(plain, "fn") else inspect.unwrap(plain))
    assert desugar(src, is_helper=False) is src.tree.body
    args = (mx.zeros((100,)), mx.zeros((100,)), 100)
    assert _body(plain[(2,)].prepare(*args, backend="msl").source) == \
        _body(plain_with_return[(2,)].prepare(*args, backend="msl").source)
    # `if pid >= used: return` is the if/else a user would write, with no flag variable
    assert _body(early_exit[(2,)].prepare(*args, 1, BLOCK=64, backend="msl").source) == \
        _body(guarded_by_hand[(2,)].prepare(*args, 1, BLOCK=64, backend="msl").source)


# -- located compile errors ----------------------------------------------------------------------

def _compile_error(launch) -> metile.CompilationError:
    with pytest.raises(metile.CompilationError) as info:
        launch()
    return info.value


def _points_at(err, fn, marker: str):
    lines, first = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else inspect.unwrap(fn))
    line = first + next(i for i, text in enumerate(lines) if marker in text)
    msg = str(err).splitlines()
    assert msg[0].startswith(f"{__file__}:{line}:"), str(err)
    assert marker in msg[1] and msg[2].strip() == "^", str(err)
    return line


def _line(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else inspect.unwrap(fn))
    return first + next(i for i, text in enumerate(lines) if marker in text)


@metile.kernel(num_simdgroups=1)
def divergent_return(X, n):
    tid = metile.thread_id()
    if tid >= n:
        return  # MARK-ret
    metile.store(X + tid, 1.0)
    metile.barrier()  # MARK-barrier
    metile.store(X + tid, 2.0)


@metile.kernel(num_simdgroups=1)
def divergent_break(X, n):
    tid = metile.thread_id()
    for i in range(n):
        if tid == i:
            break  # MARK-brk
        metile.barrier()  # MARK-barrier
    metile.store(X + tid, 1.0)


@metile.kernel(num_simdgroups=1)
def divergent_continue(X, n):
    tid = metile.thread_id()
    for i in range(n):
        if tid < i:
            continue  # MARK-cont
        metile.store(X + tid, 1.0)
        metile.barrier()  # MARK-barrier


@metile.kernel(num_simdgroups=1)
def divergent_return_in_loop(X, n):
    tid = metile.thread_id()
    for i in range(n):
        metile.barrier()  # MARK-barrier
        if tid == i:
            metile.store(X + tid, 1.0)
            return  # MARK-ret


@pytest.mark.parametrize("kernel,kind,marker", [
    (divergent_return, "return", "MARK-ret"), (divergent_break, "break", "MARK-brk"),
    (divergent_continue, "continue", "MARK-cont"), (divergent_return_in_loop, "return", "MARK-ret")])
def test_exit_that_makes_a_barrier_divergent(kernel, kind, marker):
    err = _compile_error(lambda: kernel[(1,)](mx.zeros((32,)), 4))
    _points_at(err, kernel, "MARK-barrier")
    assert (f"barrier() under control flow that depends on thread_id() (the {kind} at line "
            f"{_line(kernel, marker)} depends on it, so some threads skip the code after it): "
            f"every thread of the program must reach it") in str(err)


@metile.kernel
def divergent_return_before_tile(X, n, BLOCK: metile.constexpr = 32):
    if metile.thread_id() >= n:
        return  # MARK-ret
    offs = metile.arange(0, BLOCK)  # MARK-tile
    metile.store(X + offs, metile.load(X + offs) + 1.0)


def test_exit_before_tile_code_that_depends_on_the_thread():
    err = _compile_error(lambda: divergent_return_before_tile[(1,)](mx.zeros((32,)), 4))
    _points_at(err, divergent_return_before_tile, "MARK-tile")
    assert (f"tile operation under control flow that depends on thread_id() (the return at "
            f"line {_line(divergent_return_before_tile, 'MARK-ret')} depends on it") in str(err)


@metile.inline
def mixed_types(x):
    if x > 0.0:
        return x
    return metile.cast(x, metile.int32)


@metile.inline
def sometimes_none(x):
    if x > 0.0:
        return x * 2.0


@metile.inline
def returns_in_loop(x, n):
    for i in range(n):
        if x > i:
            return x  # MARK-loopret
    return x


@metile.kernel(num_simdgroups=1)
def uses_helper(X, n, WHICH: metile.constexpr):
    x = metile.load(X + metile.thread_id())
    if WHICH == 0:
        y = mixed_types(x)
    elif WHICH == 1:
        y = sometimes_none(x)
    else:
        y = returns_in_loop(x, n)
    metile.store(X + metile.thread_id(), y)


def test_helper_return_values_must_agree():
    x = mx.zeros((32,))
    err = _compile_error(lambda: uses_helper[(1,)](x, 4, WHICH=0))
    assert "error: the return value is float32 in one branch and int32 in the other; cast so " \
           "both agree" in str(err)
    assert str(err).startswith(f"{__file__}:{_line(mixed_types, 'if x > 0.0')}:")
    err = _compile_error(lambda: uses_helper[(1,)](x, 4, WHICH=1))
    assert "the helper returns a value (float32) on one path of this runtime if and nothing on " \
           "the other; return a value on every path" in str(err)
    assert str(err).startswith(f"{__file__}:{_line(sometimes_none, 'if x > 0.0')}:")
    err = _compile_error(lambda: uses_helper[(1,)](x, 4, WHICH=2))
    _points_at(err, returns_in_loop, "MARK-loopret")
    assert "return inside a loop of an @metile.inline helper that returns a value is not " \
           "supported" in str(err)


@metile.kernel
def returns_value(X):
    metile.store(X, 1.0)
    if metile.program_id(0) > 0:
        return 1  # MARK-retval


def test_kernel_cannot_return_a_value():
    err = _compile_error(lambda: returns_value[(1,)](mx.zeros((4,))))
    _points_at(err, returns_value, "MARK-retval")
    assert "a kernel cannot return a value; store results into an output buffer" in str(err)


@metile.kernel
def endless(X):
    i = 0
    while True:  # MARK-endless
        i += 1
    metile.store(X, 1.0)


def test_while_true_without_break():
    err = _compile_error(lambda: endless[(1,)](mx.zeros((4,))))
    _points_at(err, endless, "MARK-endless")
    assert "while condition must be a runtime scalar, got the compile-time bool True: with no " \
           "break or return in it the loop never ends" in str(err)


@metile.kernel
def fragment_product(A, B, Output, used, *, BLOCK: metile.constexpr = 32):
    left_memory = metile.shared(64, dtype="f32")
    right_memory = metile.shared(64, dtype="f32")
    result_memory = metile.shared(64, dtype="f32")
    if metile.program_id(0) >= used:
        return
    left = metile.tensor(A, shape=(8, 8), access="read")
    right = metile.tensor(B, shape=(8, 8), access="read")
    output = metile.tensor(Output, shape=(8, 8), access="write")
    left_values = metile.tensor(left_memory, shape=(8, 8))
    right_values = metile.tensor(right_memory, shape=(8, 8))
    result_values = metile.tensor(result_memory, shape=(8, 8))
    left_matrix = metile.tensor(left_memory, shape=(8, 8), block_shape=(8, 8))
    right_matrix = metile.tensor(right_memory, shape=(8, 8), block_shape=(8, 8))
    result_matrix = metile.tensor(result_memory, shape=(8, 8), block_shape=(8, 8))
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        position = (index // 8, index % 8)
        left_values.store(position, left.load(position))
        right_values.store(position, right.load(position))
    metile.barrier()
    first = metile.dot(left_matrix.load((0, 0)), right_matrix.load((0, 0)), metile.zeros((8, 8)))
    result_matrix.store((0, 0), first)
    metile.barrier()
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        position = (index // 8, index % 8)
        output.store(position, result_values.load(position))


@pytest.mark.parametrize("used", [0, 1])
def test_uniform_return_in_a_simdgroup_inline_kernel(rng, used):
    # Fragment kernels keep metile.shared at the top: allocated before the return.
    a, b = _rows(rng, (8, 8)), _rows(rng, (8, 8))
    out = np.array(fragment_product[(2,)](mx.array(a), mx.array(b), mx.full((8, 8), SENTINEL), used,
                                          STRICT_MATH=True,
                                          SCHEDULE=metile.Schedule(backend="simdgroup_inline")))
    ref = a.astype(np.float64) @ b if used else np.full((8, 8), SENTINEL)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


# -- range() with steps of either sign --------------------------------------------------------------

@metile.kernel
def range_sum(Z, lo, hi, step):
    s = 0
    c = 0
    for i in range(lo, hi, step):
        s += i
        c += 1
    metile.store(Z + 0, s)
    metile.store(Z + 1, c)


@metile.kernel
def range_sum_const(Z, LO: metile.constexpr, HI: metile.constexpr, ST: metile.constexpr):
    s = 0
    for i in range(LO, HI, ST):
        s += i * 3
    metile.store(Z, s)


@pytest.mark.parametrize("lo,hi,step", [(0, 7, 2), (5, 0, -1), (10, 1, -4), (0, 7, -1),
                                        (7, 0, 3), (-3, 4, 7), (4, -9, -5), (2, 2, -1)])
def test_a_runtime_step_of_either_sign_runs_pythons_iterations(lo, hi, step):
    # (found by a hostile test: a negative step known at launch ran no iterations going
    # down, or until the counter wrapped going up)
    got = np.array(range_sum[(1,)](mx.zeros((2,), mx.int32), lo, hi, step))
    r = range(lo, hi, step)
    assert got.tolist() == [sum(r), len(r)]


def _wrapped(x):
    return (x + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("lo,hi,step", [(-2**31 + 5, 2**31 - 1, 2**30), (0, 2**31 - 1, 10**9),
                                        (2**31 - 1, -2**31, -2**30 - 7),
                                        (2**31 - 3, 2**31 - 1, 1)])
def test_ranges_at_the_int32_limits(lo, hi, step):
    # (found by a hostile test: hi - lo past int32 ran no iteration; a counter stepping
    # past INT_MAX wrapped and looped forever)
    got = np.array(range_sum[(1,)](mx.zeros((2,), mx.int32), lo, hi, step))
    r = range(lo, hi, step)
    assert got.tolist() == [_wrapped(sum(r)), len(r)]


@metile.kernel
def range_sum_step(Z, hi, ST: metile.constexpr):
    s = 0
    c = 0
    for i in range(0, hi, ST):
        s += i
        c += 1
    metile.store(Z + 0, s)
    metile.store(Z + 1, c)


@pytest.mark.parametrize("hi,step", [(2**31 - 1, 10**9), (2**31 - 1, 2**30 + 1), (100, 7)])
def test_a_constant_step_up_to_int_max(hi, step):
    got = np.array(range_sum_step[(1,)](mx.zeros((2,), mx.int32), hi, ST=step))
    r = range(0, hi, step)
    assert got.tolist() == [_wrapped(sum(r)), len(r)]


def test_a_zero_step_at_launch_runs_no_iteration():
    # Python raises; a kernel cannot, and looping forever (as it did) hangs the caller
    got = np.array(range_sum[(1,)](mx.zeros((2,), mx.int32), 0, 5, 0))
    assert got.tolist() == [0, 0]


@pytest.mark.parametrize("lo,hi,step", [(5, 0, -1), (9, -2, -4), (0, 3, -1)])
def test_a_negative_constant_step(lo, hi, step):
    got = np.array(range_sum_const[(1,)](mx.zeros((1,), mx.int32), LO=lo, HI=hi, ST=step))
    assert got.tolist() == [3 * sum(range(lo, hi, step))]


def test_static_range_with_a_negative_step():
    @metile.kernel
    def unrolled_down(Z, LO: metile.constexpr, HI: metile.constexpr, ST: metile.constexpr):
        s = 0
        for i in metile.static_range(LO, HI, ST):
            s = s * 10 + i
        metile.store(Z, s)

    got = np.array(unrolled_down[(1,)](mx.zeros((1,), mx.int32), LO=5, HI=0, ST=-2))
    want = 0
    for i in range(5, 0, -2):
        want = want * 10 + i
    assert got.tolist() == [want]


def test_the_wide_counter_compiles_for_cuda():
    from nvrtc import TOOLKIT, compile_cuda, translation_unit
    if TOOLKIT is None:
        pytest.skip("no NVRTC")
    d = range_sum_step[(1,)].prepare(mx.zeros((2,), mx.int32), 2**31 - 1, ST=10**9,
                                     backend="cuda")
    source = translation_unit(d)
    assert "_w = " in source
    ok, log = compile_cuda(source, "sm_90")
    assert ok, log


@metile.kernel
def number_or_tile(X, O, n, BLOCK: metile.constexpr):
    c = metile.load(X + metile.arange(0, BLOCK))
    v = 0.5
    if n > 0:
        v = c * 2.0
    metile.store(O + metile.arange(0, BLOCK), v)


@pytest.mark.parametrize("n", [1, 0])
def test_a_number_on_one_branch_fills_the_tile_of_the_other(rng, n):
    # (found by a hostile test: it crashed the frontend with an AttributeError)
    x = _rows(rng, (8,))
    got = np.array(number_or_tile[(1,)](mx.array(x), mx.zeros((8,)), n, BLOCK=8))
    np.testing.assert_allclose(got, x * 2.0 if n else np.full(8, 0.5), rtol=RTOL, atol=ATOL)


def test_a_scalar_value_and_a_tile_on_two_branches_is_an_error():
    @metile.kernel
    def scalar_or_tile(X, O, n, BLOCK: metile.constexpr):
        v = metile.load(X)
        if n > 0:
            v = metile.load(X + metile.arange(0, BLOCK))
        metile.store(O + metile.arange(0, BLOCK), v)

    with pytest.raises(metile.CompilationError, match="is tile<8, float32> in one branch and "
                                                      "float32 in the other"):
        scalar_or_tile[(1,)](mx.ones((8,)), mx.zeros((8,)), 1, BLOCK=8)


# -- the loop variable after the loop (twenty-ninth session) ---------------------------------

def _python_loops(n, step):
    """What each loop kernel below computes, in Python."""
    t = 100
    for t in range(0, n):
        pass
    plain = t
    v = 100
    for v in range(0, n):
        v = v + 1000
    reassigned = v
    t = -1
    for t in range(0, n):
        if t == 3:
            break
    broke = t
    t, s = -1, 0
    for t in range(0, n):
        if t % 2 == 0:
            continue
        s += t
    continued = t * 1000 + s
    t = 77
    for t in range(n, 0, step):
        pass
    return [plain, reassigned, broke, continued, t]


@metile.kernel
def loop_variables(Y, n, step):
    t = 100
    for t in range(0, n):
        pass
    metile.store(Y + 0, t)
    v = 100
    for v in range(0, n):
        v = v + 1000
    metile.store(Y + 1, v)
    t = -1
    for t in range(0, n):
        if t == 3:
            break
    metile.store(Y + 2, t)
    t = -1
    s = 0
    for t in range(0, n):
        if t % 2 == 0:
            continue
        s += t
    metile.store(Y + 3, t * 1000 + s)
    t = 77
    for t in range(n, 0, step):
        pass
    metile.store(Y + 4, t)


@pytest.mark.parametrize("n", [0, 1, 6])
@pytest.mark.parametrize("step", [-2, 3])
def test_the_loop_variable_keeps_its_last_value_after_the_loop(n, step):
    # (it kept its value from before the loop: 100 for range(0, 6) where Python gives 5; the
    # body's reassignment made it "not defined here"; after a break it held the last value
    # of the range, not the one at the break)
    got = loop_variables[(1,)](mx.zeros((5,), dtype=mx.int32), n, step)
    assert got.tolist() == _python_loops(n, step)


def test_a_loop_variable_first_bound_by_the_loop_is_undefined_after_it():
    @metile.kernel
    def after(Y, n):
        for i in range(0, n):
            pass
        metile.store(Y + 0, i)

    with pytest.raises(metile.CompilationError, match="'i'.*first assigned by the loop, and a "
                                                      "loop that runs no iteration leaves it unset"):
        after[(1,)](mx.zeros((1,), dtype=mx.int32), 3)


@metile.kernel
def first_bound_by_constant_loops(Y, n, BLOCK: metile.constexpr):
    s = 0
    for i in range(5):
        s += i
    metile.store(Y + 0, s * 100 + i)
    for j in range(0, BLOCK, 3):
        if j * 2 > n:
            break
    metile.store(Y + 1, j)
    for k in range(BLOCK, 0, -4):
        w = k * 2
    metile.store(Y + 2, k)


@pytest.mark.parametrize("n", [0, 5, 100])
def test_a_loop_variable_first_bound_by_a_constant_range_that_runs_keeps_its_last_value(n):
    # (a hostile trial: refused as "a loop that runs no iteration leaves it unset", though
    # range(5) always runs)
    def python(n, block=8):
        for j in range(0, block, 3):
            if j * 2 > n:
                break
        return [10 * 100 + 4, j, 4]
    got = first_bound_by_constant_loops[(1,)](mx.zeros((3,), dtype=mx.int32), n, BLOCK=8)
    assert got.tolist() == python(n)


# -- `a if c else b` runs one side (twenty-ninth session) -------------------------------------

@metile.kernel
def guarded_sides(C, X, Y, n, d):
    metile.store(Y + 0, metile.atomic_add(C, 1) if n > 3 else -1)
    metile.store(Y + 1, n // d if d != 0 else -1)
    metile.store(Y + 2, metile.load(X + n) * 2 + 1 if n >= 0 and n < 4 else -1)
    pair = (n, 2) if n > 3 else (3, n)
    metile.store(Y + 3, pair[0] * 10 + pair[1])
    metile.store(Y + 4, (n % d if n > 2 else 7) if d != 0 else (1 if n < -5 else 2))


def _guarded_sides(n, d):
    trunc = lambda a, b: int(a / b)   # (runtime // and % truncate, as in Triton)
    return [0 if n > 3 else -1, trunc(n, d) if d != 0 else -1,
            2 * n + 1 if 0 <= n < 4 else -1, n * 10 + 2 if n > 3 else 30 + n,
            ((n - trunc(n, d) * d) if n > 2 else 7) if d != 0 else (1 if n < -5 else 2)]


@pytest.mark.parametrize("n,d", [(-7, 0), (1, 0), (2, 3), (5, -2), (6, 0)])
def test_a_conditional_expression_runs_only_the_chosen_side(n, d, monkeypatch):
    # (both sides ran: the atomic counted when n <= 3, n // 0 stopped the kernel with
    # "guard the divisor", the load read out of bounds, and the tuple form was refused)
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "1")
    counter, got = guarded_sides[(1,)](mx.zeros((1,), dtype=mx.int32), mx.arange(4, dtype=mx.int32),
                                       mx.zeros((5,), dtype=mx.int32), n, d)
    assert got.tolist() == _guarded_sides(n, d)
    assert counter.tolist() == [1 if n > 3 else 0]


def test_a_conditional_expression_on_a_tile_selects_elementwise():
    @metile.kernel
    def select(Y, n, BLOCK: metile.constexpr):
        offs = metile.arange(0, BLOCK)
        metile.store(Y + offs, offs * 2 if offs > n else offs + 100)

    assert select[(1,)](mx.zeros((4,), dtype=mx.int32), 1, BLOCK=4).tolist() == [100, 101, 4, 6]


@metile.kernel
def numbers_of_two_kinds(Y, n):
    metile.store(Y + 0, 2 ** 31 if n > 0 else -1)
    metile.store(Y + 1, 2 ** 31 if n > 0 else 1)
    metile.store(Y + 2, 2 ** 40 if n > 0 else 3)
    metile.store(Y + 3, 1 if n > 0 else 2.5)


@pytest.mark.parametrize("n", [1, 0])
def test_a_conditional_expression_of_two_numbers_merges_as_an_if_statement(n):
    # (the select typed 2**31 as uint32 and refused -1: "constant -1 does not fit in
    # uint32", where the same values from an if statement's branches are int64)
    got = numbers_of_two_kinds[(1,)](mx.zeros((4,), dtype=mx.int64), n).tolist()
    assert got == ([2 ** 31, 2 ** 31, 2 ** 40, 1] if n else [-1, 1, 3, 2])


# -- names first bound in a constant loop's body, read after it (fortieth session) -------------

def _python_first_bound(x, n, block):
    for i in range(0, 4):
        t = i * 2
        row = x[i * block:(i + 1) * block]
        p = i * block
    first = [t, None, None, None, None]
    y = row + x[p:p + block]
    for j in range(7, 8):
        u = j * 10
    first[1] = u
    for k in range(10, 0, -3):
        w = k + 100
        if k < n:
            break
    first[2] = w * 1000 + k
    s = 0
    for a in range(0, 3):
        for b in range(0, 2):
            v = a * 10 + b
        s += v
    first[3] = s * 100 + v
    for c in range(0, 5):
        q = c * 3
        if c % 2 == 1:
            continue
    first[4] = q
    return y, first


@metile.kernel
def first_bound_in_constant_loop_bodies(X, Y, T, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    for i in range(0, 4):
        t = i * 2
        row = metile.load(X + i * BLOCK + offs)
        p = X + i * BLOCK
    metile.store(T + 0, t)
    metile.store(Y + offs, row + metile.load(p + offs))
    for j in range(7, 8):
        u = j * 10
    metile.store(T + 1, u)
    for k in range(10, 0, -3):
        w = k + 100
        if k < n:
            break
    metile.store(T + 2, w * 1000 + k)
    s = 0
    for a in range(0, 3):
        for b in range(0, 2):
            v = a * 10 + b
        s += v
    metile.store(T + 3, s * 100 + v)
    for c in range(0, 5):
        q = c * 3
        if c % 2 == 1:
            continue
    metile.store(T + 4, q)


@pytest.mark.parametrize("n", [0, 8, 100])
@pytest.mark.parametrize("block", [1, 7, 64])
def test_a_name_first_bound_in_a_constant_loop_that_runs_keeps_its_last_value(rng, n, block):
    # (refused as "not defined here: it is first assigned inside a loop body", though the
    # range always runs and Python - and Triton - define the name after it)
    x = _rows(rng, (4 * block,))
    y, t = first_bound_in_constant_loop_bodies[(1,)](
        mx.array(x), mx.zeros((block,)), mx.zeros((5,), dtype=mx.int32), n, BLOCK=block)
    want_y, want_t = _python_first_bound(x, n, block)
    np.testing.assert_allclose(np.array(y), want_y, rtol=RTOL, atol=ATOL)
    assert t.tolist() == want_t


def test_a_body_name_not_read_after_the_loop_leaves_the_loop_whole():
    # a name the code after the loop binds again before reading (here, and in the next
    # iteration of an enclosing loop) is not carried out of it: the body is compiled once,
    # in the loop (the first iteration is compiled on its own only for a name read after)
    @metile.kernel
    def rebound(X, Y, rows, BLOCK: metile.constexpr):
        offs = metile.arange(0, BLOCK)
        for r in range(0, rows):
            acc = metile.zeros((BLOCK,), dtype=metile.float32)
            for i in range(0, 4):
                x = metile.load(X + (r * 4 + i) * BLOCK + offs)
                half = x * 0.5
                acc += half
            x = acc + 1.0
            metile.store(Y + r * BLOCK + offs, x)

    x = np.arange(64, dtype=np.float32)
    args = (mx.array(x), mx.zeros((16,)), 2)
    y = rebound[(1,)](*args, BLOCK=8)
    np.testing.assert_allclose(np.array(y), x.reshape(2, 4, 8).sum(1).ravel() * 0.5 + 1.0,
                               rtol=RTOL, atol=ATOL)
    msl = rebound[(1,)].prepare(*args, BLOCK=8, backend="msl").source
    assert msl.count("X[") == 1 and msl.count("* 0.5f") == 1


@metile.kernel
def runtime_range(Y, n, B: metile.constexpr):
    for i in range(0, n):
        t = i
    metile.store(Y + 0, t)


@metile.kernel
def constexpr_range(Y, n, B: metile.constexpr):
    for i in range(0, B):
        t = i
    metile.store(Y + 0, t)


@metile.kernel
def bound_after_a_break(Y, n, B: metile.constexpr):
    for i in range(0, 4):
        if i > n:
            break
        t = i
    metile.store(Y + 0, t)


@metile.kernel
def bound_in_a_runtime_if(Y, n, B: metile.constexpr):
    for i in range(0, 4):
        if i > n:
            t = i
    metile.store(Y + 0, t)


@metile.kernel
def bound_after_a_return(Y, n, B: metile.constexpr):
    for i in range(0, 4):
        if i > n:
            return
        t = i
    metile.store(Y + 0, t)


@pytest.mark.parametrize("kernel,why", [
    (runtime_range, "a loop that may run no iteration"),
    (constexpr_range, "a loop that may run no iteration"),
    (bound_after_a_break, "its first iteration may not assign it"),
    (bound_in_a_runtime_if, "its first iteration may not assign it"),
    # (a return before the assignment: the message named only break, continue and if)
    (bound_after_a_return, r"may not assign it \(a return, break"),
])
def test_a_name_a_loop_may_leave_unbound_is_refused_after_it(kernel, why):
    # (range(0, B) with B = 0 runs no iteration; a break or a runtime if before the
    # assignment may skip it in the first iteration, where Python raises NameError)
    with pytest.raises(metile.CompilationError, match="'t' is not defined here: it is first "
                                                      "assigned inside a loop body.*" + why):
        kernel[(1,)](mx.zeros((1,), dtype=mx.int32), -1, B=0)


@metile.inline
def _last_scaled_row(X, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    for i in range(0, 3):
        pair = (metile.load(X + i * BLOCK + offs), i)
    return pair[0] * pair[1]


@metile.kernel
def first_bound_composites(X, Y, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.store(Y + offs, _last_scaled_row(X, BLOCK))
    for i in range(0, 3):
        block = metile.make_block_ptr(X, (3 * BLOCK,), (1,), (i * BLOCK,), (BLOCK,), (0,))
    metile.store(Y + BLOCK + offs, metile.load(block))


def test_a_tuple_or_block_pointer_first_bound_in_a_constant_loop_keeps_its_last_value(rng):
    # (a helper's loop, and a composite carried part by part once the first iteration bound it)
    x = _rows(rng, (24,))
    y = np.array(first_bound_composites[(1,)](mx.array(x), mx.zeros((16,)), BLOCK=8))
    np.testing.assert_allclose(y, np.concatenate([x[16:] * 2, x[16:]]), rtol=RTOL, atol=ATOL)


@metile.kernel
def float_bounded_range(Y, N: metile.constexpr):
    for i in range(0, N):
        t = i
    metile.store(Y + 0, t)


@pytest.mark.parametrize("bound,message", [
    (4.0, "float constant 4.0 combined with an int32 value"),
    (True, "bool constant True combined with int32"),
])
def test_a_constant_range_bound_that_is_not_an_int_is_refused_at_the_loop(bound, message):
    # (a float bound raised Python's bare TypeError "'float' object cannot be interpreted as
    # an integer", without the line, once the first iteration was peeled; a bool bound of a
    # loop that runs once compiled, one that runs more was refused)
    with pytest.raises(metile.CompilationError, match=message + r".*constexpr N="):
        float_bounded_range[(1,)](mx.zeros((1,), dtype=mx.int32), N=bound)


# -- nests of loops each peeled: copies of the innermost body linear in the depth ----------------

@metile.kernel
def peeled_nest(X, Y, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    for a in range(0, 2):
        for b in range(0, 3):
            for c in range(0, 2):
                for d in range(0, 3):
                    x4 = metile.load(X + d * BLOCK + offs) * (c + 1)
                x3 = x4 + b
            x2 = x3 * 2.0
        x1 = x2 + a
    metile.store(Y + offs, x1)


def test_a_nest_of_peeled_loops_compiles_its_innermost_body_once_a_level(rng):
    # Each loop here binds a name read after it, so its first iteration is compiled ahead of
    # it.  The rest of an enclosing loop compiled each inner loop's first iteration again
    # (the names it peeled for were dropped there, and an inner loop's own variable, read in
    # its body, counted as read after the loop it is in): the innermost body 2**(depth-1)+1
    # times, 9 here, 2 s of compile time at depth 10.  Now once per level, plus the loop.
    x = _rows(rng, (3 * 8,))
    y = peeled_nest[(1,)](mx.array(x), mx.zeros((8,)), BLOCK=8)
    np.testing.assert_allclose(np.array(y), (x[16:] * 2 + 2) * 2.0 + 1, rtol=RTOL, atol=ATOL)
    ir = peeled_nest.warmup(mx.array(x), mx.zeros((8,)), BLOCK=8, grid=(1,)).asm["tile_ir"]
    assert ir.count("load(") == 4 + 1



@metile.kernel
def augmented_after_the_loop(Y, T, n, B: metile.constexpr):
    for i in range(0, 4):
        t = i * 3
        u = i
    u += n   # (read by the augmented assignment alone)
    t += n
    metile.store(Y + 0, t)


def test_an_augmented_assignment_after_a_constant_loop_reads_the_name_the_loop_bound():
    # (`u += n`, u read nowhere else, was taken for no read of u: u was left undefined after
    # the loop and refused as "its first iteration may not assign it", which it does)
    assert augmented_after_the_loop[(1,)](mx.zeros((1,), dtype=mx.int32),
                                          mx.zeros((1,), dtype=mx.int32), 5, B=1).tolist() == [14]
