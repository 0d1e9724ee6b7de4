"""Triton's atomics (atomic_max/min/xchg/cas/and/or/xor, old values returned) on the CPU
runtime against NumPy.  A buffer updated with anything but unused-result atomic_add starts
from the passed contents, so results are Triton's in-place updates."""

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

import metile

NP_AT = {"max": np.maximum.at, "min": np.minimum.at, "and": np.bitwise_and.at,
         "or": np.bitwise_or.at, "xor": np.bitwise_xor.at, "add": np.add.at}


def _scatter(kind):
    fn = getattr(metile, f"atomic_{kind}")

    @metile.kernel
    def scatter(X, Index, V, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        m = offs < n
        fn(X + metile.load(Index + offs, mask=m), metile.load(V + offs, mask=m), mask=m)

    return scatter


SCATTER = {k: _scatter(k) for k in NP_AT}


@pytest.mark.parametrize("kind,dtype", [("max", np.int32), ("min", np.int32),
                                        ("max", np.float32), ("min", np.float32),
                                        ("max", np.uint32), ("and", np.int32), ("or", np.uint32),
                                        ("xor", np.int32)])
@pytest.mark.parametrize("n", [1, 333])
def test_scatter_matches_numpy_from_passed_contents(kind, dtype, n):
    rng = np.random.default_rng(n)
    bins = 13
    if dtype == np.float32:
        v, x = rng.normal(size=n).astype(dtype), rng.normal(size=bins).astype(dtype)
    else:
        lo = 0 if dtype == np.uint32 else -1000
        v, x = rng.integers(lo, 1 << 20, n).astype(dtype), rng.integers(lo, 1 << 20, bins).astype(dtype)
    idx = rng.integers(0, bins - 2, n).astype(np.int32)  # the last bins stay untouched
    out = SCATTER[kind][(metile.cdiv(n, 128),)](mx.array(x), mx.array(idx), mx.array(v), n,
                                                BLOCK=128)
    ref = x.copy()
    NP_AT[kind](ref, idx, v)
    np.testing.assert_array_equal(np.array(out), ref)


@metile.kernel
def ticket_counter(Counter, Tickets, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    zero = metile.zeros((BLOCK,), metile.int32)
    old = metile.atomic_add(Counter + zero, 1, mask=m)
    metile.store(Tickets + offs, old, mask=m)


@pytest.mark.parametrize("n", [1, 300])
def test_ticket_counter_hands_out_unique_old_values(n):
    counter, tickets = ticket_counter[(metile.cdiv(n, 64),)](
        mx.array([5], mx.int32), mx.zeros((n,), mx.int32), n, BLOCK=64)
    assert int(np.array(counter)[0]) == 5 + n
    np.testing.assert_array_equal(np.sort(np.array(tickets)), np.arange(5, 5 + n))


@metile.kernel
def exchange(X, V, Old, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Old + offs, metile.atomic_xchg(X + offs, metile.load(V + offs, mask=m), mask=m),
                 mask=m)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32])
def test_xchg_returns_the_passed_contents(dtype):
    n = 70
    x, v = np.arange(100, 100 + n + 5).astype(dtype), np.arange(n).astype(dtype)
    out, old = exchange[(2,)](mx.array(x), mx.array(v), mx.zeros((n,), mx.array(x).dtype), n,
                              BLOCK=64)
    np.testing.assert_array_equal(np.array(old), x[:n])
    np.testing.assert_array_equal(np.array(out), np.concatenate([v, x[n:]]))


@metile.kernel
def cas_once(X, Cmp, V, Old, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    old = metile.atomic_cas(X + offs, metile.load(Cmp + offs, mask=m), metile.load(V + offs, mask=m))
    metile.store(Old + offs, old, mask=m)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_cas_swaps_only_where_equal(dtype):
    n = 64
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, n).astype(dtype)
    cmp, v = rng.integers(0, 3, n).astype(dtype), rng.integers(10, 20, n).astype(dtype)
    out, old = cas_once[(1,)](mx.array(x), mx.array(cmp), mx.array(v), mx.zeros((n,), mx.array(x).dtype),
                              n, BLOCK=64)
    np.testing.assert_array_equal(np.array(old), x)
    np.testing.assert_array_equal(np.array(out), np.where(x == cmp, v, x))


@metile.kernel
def uniform_max(X, Old, v):
    old = metile.atomic_max(X, v)  # same on every thread: once per program
    metile.store(Old + metile.program_id(0), old)


def test_uniform_scalar_atomic_once_per_program_with_its_old_value():
    out, old = uniform_max[(4,)](mx.array([3], mx.int32), mx.zeros((4,), mx.int32), 7)
    assert int(np.array(out)[0]) == 7
    assert sorted(np.array(old).tolist()) == [3, 7, 7, 7]


@metile.kernel
def add_then_max(X, V, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    metile.atomic_add(X + offs % 4, metile.load(V + offs, mask=m), mask=m)
    metile.barrier()
    metile.atomic_max(X + offs % 4, 100, mask=m & (offs < 2))


def test_mixed_kinds_on_one_buffer_start_from_the_passed_contents():
    n = 40
    v = np.arange(n, dtype=np.int32)
    x = np.array([1, 2, 3, 4, 5], np.int32)
    out = add_then_max[(1,)](mx.array(x), mx.array(v), n, BLOCK=64)
    ref = x.copy()
    np.add.at(ref, np.arange(n) % 4, v)
    ref[:2] = np.maximum(ref[:2], 100)
    np.testing.assert_array_equal(np.array(out), ref)


LOCK = textwrap.dedent("""
    import mlx.core as mx, numpy as np, metile

    @metile.kernel
    def thread_locked_sum(Lock, Total, X, n, BLOCK: metile.constexpr):
        # one thread per program takes the spin lock and does the read-modify-write with
        # atomics
        pid = metile.program_id(0)
        offs = pid * BLOCK + metile.arange(0, BLOCK)
        s = metile.sum(metile.load(X + offs, mask=offs < n))
        if metile.thread_id() == 0:
            while metile.atomic_cas(Lock, 0, 1) == 1:
                pass
            t = metile.atomic_xchg(Total, 0.0)
            metile.atomic_xchg(Total, t + s)
            metile.atomic_xchg(Lock, 0)

    @metile.kernel
    def locked_sum(Lock, Total, X, n, BLOCK: metile.constexpr):
        # Triton's lock with its default semantics (acq_rel): a plain load and store of
        # Total inside it, ordered by the cas (acquire) and the xchg (release)
        pid = metile.program_id(0)
        offs = pid * BLOCK + metile.arange(0, BLOCK)
        s = metile.sum(metile.load(X + offs, mask=offs < n))
        while metile.atomic_cas(Lock, 0, 1) == 1:
            pass
        metile.store(Total, metile.load(Total) + s)
        metile.atomic_xchg(Lock, 0)

    n = 64 * 200
    x = np.random.default_rng(0).normal(size=n).astype(np.float32)
    for kernel in (thread_locked_sum, locked_sum, locked_sum):
        lock, total = kernel[(metile.cdiv(n, 64),)](
            mx.zeros((1,), mx.int32), mx.full((1,), 0.5), mx.array(x), n, BLOCK=64)
        assert int(np.array(lock)[0]) == 0
        np.testing.assert_allclose(np.array(total)[0], 0.5 + x.sum(dtype=np.float64),
                                   rtol=1e-4)
    print("ok")
""")


def test_cas_spin_locks_protect_a_read_modify_write(tmp_path):
    script = tmp_path / "lock.py"  # a file: the kernel's source must be readable
    script.write_text(LOCK)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@metile.kernel
def ordered(X, Y, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.store(Y + offs, offs.to(metile.float32))
    metile.atomic_add(X, 1)
    metile.atomic_add(X + 1, 1, sem="relaxed")
    metile.atomic_xchg(X + 2, 1, sem="release")
    metile.atomic_max(X + 3, 1, sem="acquire", scope="cta")


@pytest.mark.parametrize("backend,fence,block_fence,device_barrier", [
    ("msl", "METILE_FENCE();", "METILE_FENCE();",
     "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);"),
    ("cuda", "__threadfence();", "__threadfence_block();", None),
])
def test_memory_semantics_put_fences_around_the_atomic(backend, fence, block_fence,
                                                       device_barrier):
    # Triton's sem=: acq_rel (its default) fences before and after, release before, acquire
    # after, relaxed none; scope="cta" a block's fence.  The atomic itself stays relaxed.
    d = ordered[(2,)].prepare(mx.zeros((4,), mx.int32), mx.zeros((32,)), BLOCK=32,
                              backend=backend)
    body = d.variant.data["body"]
    calls = [line.strip() for line in body.splitlines()
             if "atomic" in line and "init" not in line and "=" in line and "[" in line]
    assert len(calls) == 4, body
    lines = [line.strip() for line in body.splitlines()]
    around = [(lines[lines.index(c) - 2], lines[lines.index(c) + 1]) for c in calls]
    assert around[0] == (fence, fence)                  # default: acq_rel
    assert fence not in around[1] and block_fence not in around[1]   # relaxed
    assert around[2][0] == fence and around[2][1] != fence           # release
    assert around[3][0] != block_fence and around[3][1] == block_fence   # acquire, cta
    if device_barrier:
        # a release done once per program publishes every thread's device writes first
        first = lines.index(calls[0])
        assert device_barrier in lines[:first]
    np.testing.assert_array_equal(np.array(ordered[(2,)](mx.zeros((4,), mx.int32),
                                                         mx.zeros((32,)), BLOCK=32)[0]),
                                  [2, 2, 1, 1])


@metile.kernel
def bad_sem(X):
    metile.atomic_max(X, 1, sem="seq_cst")  # MARK


@metile.kernel
def float_and(X):
    metile.atomic_and(X, 1.0)  # MARK


@pytest.mark.parametrize("kernel,args,message", [
    (bad_sem, lambda: (mx.zeros((1,), mx.int32),),
     "atomic_max() sem='seq_cst': expected one of 'relaxed', 'acquire', 'release', 'acq_rel'"),
    (float_and, lambda: (mx.zeros((1,)),),
     "atomic_and() on a float32 buffer is not supported; it takes int32, uint32 buffers"),
])
def test_atomic_errors(kernel, args, message):
    with pytest.raises(metile.CompilationError) as info:
        kernel[(1,)](*args())
    assert message in str(info.value)


# -- a plain load of a buffer atomics update (fortieth session) ------------------------------

LAYER_NORM_BACKWARD = textwrap.dedent("""
    import os, sys
    import mlx.core as mx, numpy as np, metile

    # Triton's layer-norm backward tutorial (06-fused-layer-norm.py), as written there:
    # each row's partial dw/db is added into its group's row under a spin lock taken with
    # atomic_cas, the group's first writer found by a plain load of the counter that shares
    # the lock's buffer (and set with atomic_xchg); then the groups are summed.
    @metile.kernel
    def layer_norm_bwd_dx_fused(DX, DY, DW, DB, X, W, Mean, Rstd, Lock, stride, N,
                                GROUP_SIZE_M: metile.constexpr, BLOCK_SIZE_N: metile.constexpr):
        row = metile.program_id(0)
        cols = metile.arange(0, BLOCK_SIZE_N)
        mask = cols < N
        X += row * stride
        DY += row * stride
        DX += row * stride
        lock_id = row % GROUP_SIZE_M
        Lock += lock_id
        Count = Lock + GROUP_SIZE_M
        DW = DW + lock_id * N + cols
        DB = DB + lock_id * N + cols
        x = metile.load(X + cols, mask=mask, other=0).to(metile.float32)
        dy = metile.load(DY + cols, mask=mask, other=0).to(metile.float32)
        w = metile.load(W + cols, mask=mask).to(metile.float32)
        mean = metile.load(Mean + row)
        rstd = metile.load(Rstd + row)
        xhat = (x - mean) * rstd
        wdy = w * dy
        xhat = metile.where(mask, xhat, 0.)
        wdy = metile.where(mask, wdy, 0.)
        c1 = metile.sum(xhat * wdy, axis=0) / N
        c2 = metile.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        metile.store(DX + cols, dx, mask=mask)
        partial_dw = (dy * xhat).to(w.dtype)
        partial_db = (dy).to(w.dtype)
        while metile.atomic_cas(Lock, 0, 1) == 1:
            pass
        count = metile.load(Count)
        if count == 0:
            metile.atomic_xchg(Count, 1)
        else:
            partial_dw += metile.load(DW, mask=mask)
            partial_db += metile.load(DB, mask=mask)
        metile.store(DW, partial_dw, mask=mask)
        metile.store(DB, partial_db, mask=mask)
        metile.barrier()
        metile.atomic_xchg(Lock, 0)

    @metile.kernel
    def layer_norm_bwd_dwdb(DW, DB, FINAL_DW, FINAL_DB, M, N, BLOCK_SIZE_M: metile.constexpr,
                            BLOCK_SIZE_N: metile.constexpr):
        pid = metile.program_id(0)
        cols = pid * BLOCK_SIZE_N + metile.arange(0, BLOCK_SIZE_N)
        dw = metile.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=metile.float32)
        db = metile.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=metile.float32)
        for i in range(0, M, BLOCK_SIZE_M):
            rows = i + metile.arange(0, BLOCK_SIZE_M)
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            offs = rows[:, None] * N + cols[None, :]
            dw += metile.load(DW + offs, mask=mask, other=0.)
            db += metile.load(DB + offs, mask=mask, other=0.)
        metile.store(FINAL_DW + cols, metile.sum(dw, axis=0), mask=cols < N)
        metile.store(FINAL_DB + cols, metile.sum(db, axis=0), mask=cols < N)

    RTOL, ATOL = 3e-4, 3e-5
    for M, N, G in ((1, 1, 1), (9, 7, 4), (65, 63, 8), (200, 1000, 16)):
        rng = np.random.default_rng(M)
        x = rng.normal(size=(M, N)).astype(np.float32)
        dy = rng.normal(size=(M, N)).astype(np.float32)
        w = rng.normal(size=N).astype(np.float32)
        mean = x.mean(1, dtype=np.float64).astype(np.float32)
        rstd = (1 / np.sqrt(x.var(1, dtype=np.float64) + 1e-5)).astype(np.float32)
        block = 1 << (N - 1).bit_length()
        dx, dw, db, locks = layer_norm_bwd_dx_fused[(M,)](
            mx.zeros((M, N)), mx.array(dy), mx.zeros((G, N)), mx.zeros((G, N)), mx.array(x),
            mx.array(w), mx.array(mean), mx.array(rstd), mx.zeros((2 * G,), mx.int32), N, N,
            GROUP_SIZE_M=G, BLOCK_SIZE_N=block)
        final_dw, final_db = layer_norm_bwd_dwdb[(metile.cdiv(N, 32),)](
            dw, db, mx.zeros((N,)), mx.zeros((N,)), G, N, BLOCK_SIZE_M=8, BLOCK_SIZE_N=32)
        mx.eval(dx, dw, db, locks, final_dw, final_db)   # (raises what the race check finds)

        x64, dy64, w64 = x.astype(np.float64), dy.astype(np.float64), w.astype(np.float64)
        xhat = (x64 - mean[:, None]) * rstd[:, None]
        wdy = w64 * dy64
        c1 = (xhat * wdy).sum(1, keepdims=True) / N
        c2 = wdy.sum(1, keepdims=True) / N
        want_dx = (wdy - (xhat * c1 + c2)) * rstd[:, None]
        group = np.arange(M) % G
        want_dw = np.stack([(dy64 * xhat)[group == g].sum(0) for g in range(G)])
        want_db = np.stack([dy64[group == g].sum(0) for g in range(G)])
        np.testing.assert_allclose(np.array(dx), want_dx, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.array(dw), want_dw, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.array(db), want_db, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.array(final_dw), want_dw.sum(0), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.array(final_db), want_db.sum(0), rtol=RTOL, atol=ATOL)
        # every lock released; a group's counter set by its first row only
        assert np.array(locks).tolist() == [0] * G + [int(g < M) for g in range(G)]
    print("ok")
""")


@pytest.mark.parametrize("race_check", ["0", "1"])
def test_layer_norm_backward_locks_and_reads_its_counter_with_a_plain_load(tmp_path, race_check):
    # (refused: "buffer 'Lock' is updated with atomics and also loaded in this kernel").
    # With the race check each launch also runs in the other thread orders: dw and db,
    # summed in the order the programs take the lock, come from the counter's read and
    # are not compared.
    import os
    script = tmp_path / "layer_norm_backward.py"  # a file: the kernel's source must be readable
    script.write_text(LAYER_NORM_BACKWARD)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "METILE_RACE_CHECK": race_check})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@metile.kernel
def read_then_add(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    # each element's current contents, added to itself: the passed value doubled
    metile.atomic_add(X + offs, metile.load(X + offs, mask=m, other=-1.0), mask=m)
    metile.barrier()
    # after the barrier the program's atomics are seen; masked-off lanes give `other`
    metile.store(Y + offs, metile.load(X + offs, mask=m, other=-1.0))
    metile.atomic_max(X + n, metile.load(X + n) + 1.0)


@pytest.mark.parametrize("n", [1, 7, 63])
def test_a_plain_load_of_an_atomic_buffer_reads_its_current_contents(rng, n):
    x = rng.normal(size=n + 1).astype(np.float32)
    out_x, y = read_then_add[(1,)](mx.array(x), mx.zeros((64,)), n, BLOCK=64)
    want = x.copy()
    want[:n] *= 2
    want_y = np.full(64, -1.0, np.float32)
    want_y[:n] = want[:n]
    want[n] = x[n] + 1
    np.testing.assert_allclose(np.array(out_x), want, rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(y), want_y, rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("backend,read", [("msl", "metal::atomic_load_explicit"),
                                          ("cuda", "const volatile T*")])
def test_an_atomic_buffers_plain_load_is_a_relaxed_atomic_read(backend, read):
    d = read_then_add[(1,)].prepare(mx.zeros((8,)), mx.zeros((64,)), 7, BLOCK=64,
                                    backend=backend)
    body, source = d.variant.data["body"], d.source
    assert read in source and body.count("metile_atomic_read(&X[") == 3
    # copied in from the passed contents first, as before an atomic
    lines = [line.strip() for line in body.splitlines()]
    reads = [i for i, line in enumerate(lines) if "metile_atomic_read(" in line]
    assert all(lines[i - 1].startswith("metile_atomic_init(") for i in reads)
    if backend == "cuda":
        from nvrtc import TOOLKIT, compile_cuda, translation_unit
        if TOOLKIT is None:
            pytest.skip("no NVRTC")
        ok, log = compile_cuda(translation_unit(d), "sm_90")
        assert ok, log


@metile.kernel(num_simdgroups=1)
def peek_after_add(C, Y):
    tid = metile.thread_id()
    at = C + tid * 0   # (per thread: the add and the read are each thread's own)
    metile.atomic_add(at, 1)
    metile.store(Y + tid, metile.load(at))


def test_the_race_check_takes_what_an_atomic_buffers_load_reads_as_order_dependent(monkeypatch):
    # each thread reads the count after its own add: which count depends on the order the
    # threads ran in, so the race check (every thread order) does not compare Y (it raised
    # "race detected ... output Y"); the count itself is still compared
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    count, seen = peek_after_add[(1,)](mx.array([5], dtype=mx.int32), mx.zeros((32,), mx.int32))
    mx.eval(count, seen)   # (the check's error raised here: np.array() would not show it)
    assert np.array(count).tolist() == [37]
    assert set(np.array(seen).tolist()) <= set(range(6, 38))


TICKET = textwrap.dedent("""
    import mlx.core as mx, numpy as np, metile

    @metile.kernel
    def in_turn(Turn, Order, n):
        # program p waits for its turn (a plain read of the atomic buffer), records the
        # order it ran in, then hands the turn on: earlier programs' atomics move the value
        # past each waiting program's own
        pid = metile.program_id(0)
        while metile.load(Turn) != pid:
            pass
        at = metile.atomic_add(Turn + 1, 1)
        metile.store(Order + pid, at)
        metile.atomic_add(Turn, 1)

    n = 24
    turn, order = in_turn[(n,)](mx.zeros((2,), mx.int32), mx.zeros((n,), mx.int32), n)
    mx.eval(turn, order)
    assert np.array(turn).tolist() == [n, n], np.array(turn)
    assert np.array(order).tolist() == list(range(n)), np.array(order)
    print("ok")
""")


def test_a_ticket_spin_finishes_under_the_bounds_check(tmp_path):
    # METILE_MSL_BOUNDS_CHECK runs a launch twice; both runs start from the outputs' initial
    # contents (the second started from the first's, where every turn had passed, and spun)
    script = tmp_path / "ticket.py"   # a file: the kernel's source must be readable
    script.write_text(TICKET)
    env = dict(os.environ, METILE_MSL_BOUNDS_CHECK="1", METILE_MSL_TIMEOUT_S="30")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
