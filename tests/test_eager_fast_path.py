"""A repeated eager `kernel[grid](...)` and `Dispatch(*args)` reuse the resolved launch
through its LaunchGuard (_ext, one C++ check of the call's signature and the launch
environment) and call the binding directly: whatever the guard lets through must be a
call the launch key would have matched, and everything else must re-resolve.  Results are
checked against NumPy on the CPU runtime, and each case counts the Dispatches made."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.errors import LaunchError
from metile.runtime import dispatch as dispatch_module

from conftest import default_is_cpu

pytestmark = pytest.mark.skipif(not default_is_cpu(), reason="checks results on the CPU runtime")


@metile.kernel
def add_c(X, Y, n, c, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) + c, mask=mask)


SCALE = 2.0


@metile.kernel
def scaled(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * SCALE, mask=mask)


@pytest.fixture
def made(monkeypatch):
    """The Dispatches made (each a resolution of a launch) while the test runs."""
    seen = []

    class Counted(dispatch_module.Dispatch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self)
    monkeypatch.setattr(dispatch_module, "Dispatch", Counted)
    add_c._launches.clear()
    scaled._launches.clear()
    return seen


def _x(n, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def _expect(x, y, n, c, covered):
    want = y.copy()
    m = min(n, covered)
    want[:m] = x[:m] + np.asarray(c, x.dtype)
    return want


def test_repeats_reuse_the_launch_and_stay_right(made):
    for seed in range(4):
        x, y = _x(40, seed=seed), _x(40, seed=seed + 10)
        got = add_c[(3,)](mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
        np.testing.assert_array_equal(np.array(got), _expect(x, y, 40, 1.5, 48))
    assert len(made) == 1 and add_c._launches.last is made[0]
    assert made[0]._direct is not None   # the CPU runtime's binding, called straight away


@pytest.mark.parametrize("change", ["shape", "dtype", "n", "c", "c type", "BLOCK", "grid",
                                    "grid item type", "no kwargs"])
def test_a_changed_signature_resolves_again(made, change):
    n, c, grid, dtype, size, kw = 40, 1.5, (3,), np.float32, 40, {"BLOCK": 16}
    x, y = _x(size), _x(size, seed=1)
    np.testing.assert_array_equal(
        np.array(add_c[grid](mx.array(x), mx.array(y), n, c, **kw)), _expect(x, y, n, c, 48))
    covered = 48
    if change == "shape":
        size = 56
    elif change == "dtype":
        dtype = np.float16
    elif change == "n":
        n = 33
    elif change == "c":
        c = -0.25
    elif change == "c type":
        c = 2          # an int scalar: another type, so another kernel signature
    elif change == "BLOCK":
        kw, covered = {"BLOCK": 8}, 24
    elif change == "grid":
        grid, covered = (2,), 32      # elements 32..39 keep Y's values (a written mask)
    elif change == "grid item type":
        grid = (np.int64(3),)
    elif change == "no kwargs":
        kw = {}
    x, y = _x(size, dtype), _x(size, dtype, seed=2)
    for _ in range(2):   # the second call takes the new launch's guard
        if change == "no kwargs":
            with pytest.raises(Exception):
                add_c[grid](mx.array(x), mx.array(y), n, c, **kw)
            continue
        got = np.array(add_c[grid](mx.array(x), mx.array(y), n, c, **kw))
        np.testing.assert_allclose(got, _expect(x, y, n, c, covered), rtol=1e-3)
    if change != "no kwargs":
        # a new launch was resolved (kept by its key, with the scalar c and its type):
        # for new shapes, scalar values or grid sizes by the first one's specialization
        # (Dispatch._resized: no second binding and specializing), else in full
        new = add_c.last_dispatch
        assert len(add_c._launches) == 2 and new is not made[0]
        assert new._key[1][3] == (type(c), c)
        same_family = change in ("shape", "n", "c", "grid")
        assert len(made) == (1 if same_family else 2)


def test_kwarg_values_are_compared_with_their_types(made):
    # True == 1, yet a launch resolved for BLOCK=True is not one for BLOCK=1: with the
    # key's types, another entry (here a kernel taking a flag as a constexpr)
    @metile.kernel
    def maybe_negate(X, Y, n, NEG: metile.constexpr, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        mask = offs < n
        v = metile.load(X + offs, mask=mask)
        if NEG:
            v = -v
        metile.store(Y + offs, v, mask=mask)

    x = _x(16)
    for neg in (1, True, 1, True):
        got = maybe_negate[(1,)](mx.array(x), mx.zeros((16,)), 16, NEG=neg, BLOCK=16)
        np.testing.assert_array_equal(np.array(got), -x)
    assert len(made) == 2


@pytest.mark.parametrize("variable, value", [("METILE_RACE_CHECK", "1"),
                                             ("METILE_DEBUG", "asserts"),
                                             ("METILE_LANE_ORDER", "reverse")])
def test_a_changed_launch_setting_resolves_again(made, monkeypatch, variable, value):
    monkeypatch.delenv(variable, raising=False)
    x, y = _x(40), _x(40, seed=1)
    for _ in range(2):
        add_c[(3,)](mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
    assert len(made) == 1
    monkeypatch.setenv(variable, value)
    for _ in range(2):
        got = add_c[(3,)](mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
        np.testing.assert_array_equal(np.array(got), _expect(x, y, 40, 1.5, 48))
    assert len(made) == 2
    monkeypatch.setenv(variable, value)   # set again to the same value: a new string, same launch
    add_c[(3,)](mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
    monkeypatch.delenv(variable)
    add_c[(3,)](mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
    assert len(made) == 2 and add_c._launches.last is made[0]   # back to the first, by key


def test_the_race_check_setting_reaches_the_binding(monkeypatch):
    # METILE_RACE_CHECK=1 runs every lane order and compares: a kernel whose result depends
    # on the order is reported at evaluation, also when the launch before was cached
    @metile.kernel
    def last_writer(Y, BLOCK: metile.constexpr):
        offs = metile.arange(0, BLOCK)
        metile.store(Y + offs * 0, offs.to(metile.float32))

    monkeypatch.delenv("METILE_RACE_CHECK", raising=False)
    for _ in range(2):
        mx.eval(last_writer[(1,)](mx.zeros((1,)), BLOCK=32))
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    with pytest.raises(Exception, match="(?i)race|order"):
        mx.eval(last_writer[(1,)](mx.zeros((1,)), BLOCK=32))


def test_a_changed_global_takes_effect(made):
    global SCALE
    x = _x(20)
    try:
        for scale in (2.0, 2.0, 3.0, 3.0):
            SCALE = scale
            got = scaled[(2,)](mx.array(x), mx.zeros((20,)), 20, BLOCK=16)
            np.testing.assert_array_equal(np.array(got), x * np.float32(scale))
    finally:
        SCALE = 2.0
    assert len(made) == 2


def test_an_aliased_output_is_refused_by_name(made):
    x, y = mx.array(_x(40)), mx.array(_x(40, seed=1))
    for _ in range(2):
        add_c[(3,)](x, y, 40, 1.5, BLOCK=16)
    with pytest.raises(LaunchError, match="argument 'X' is the same array as output 'Y'"):
        add_c[(3,)](y, y, 40, 1.5, BLOCK=16)
    d = add_c[(3,)].prepare(x, y, 40, 1.5, BLOCK=16)
    with pytest.raises(LaunchError, match="argument 'X' is the same array as output 'Y'"):
        d(y, y, 40, 1.5, BLOCK=16)


def test_a_prepared_dispatch_takes_new_arrays(made):
    x, y = _x(40), _x(40, seed=1)
    d = add_c[(3,)].prepare(mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
    for seed in range(3):
        x, y = _x(40, seed=seed + 3), _x(40, seed=seed + 6)
        got = d(mx.array(x), mx.array(y), 40, 1.5, BLOCK=16)
        np.testing.assert_array_equal(np.array(got), _expect(x, y, 40, 1.5, 48))
    assert len(made) == 1
    # another length: rebound (same dtypes, ranks and constexprs), and right
    x, y = _x(24), _x(24, seed=1)
    got = d(mx.array(x), mx.array(y), 24, 1.5, BLOCK=16)
    np.testing.assert_array_equal(np.array(got), _expect(x, y, 24, 1.5, 48))
    assert len(made) == 2


def test_alternating_signatures_stay_right(made):
    a, b = _x(40), _x(24, seed=1)
    for _ in range(3):
        got_a = add_c[(3,)](mx.array(a), mx.zeros((40,)), 40, 1.0, BLOCK=16)
        got_b = add_c[(2,)](mx.array(b), mx.zeros((24,)), 24, 2.0, BLOCK=16)
        np.testing.assert_array_equal(np.array(got_a), a + 1.0)
        np.testing.assert_array_equal(np.array(got_b), b + 2.0)
    # two launches kept, the second resolved from the first's specialization (a family)
    assert len(add_c._launches) == 2 and len(made) == 1


def test_a_keyword_array_is_not_taken_positionally(made):
    # arrays passed by keyword: the launch is not reused by key, nor guarded
    x = _x(16)
    for _ in range(2):
        got = add_c[(1,)](mx.array(x), Y=mx.zeros((16,)), n=16, c=1.0, BLOCK=16)
        np.testing.assert_array_equal(np.array(got), x + 1.0)
    assert len(made) == 2 and add_c._launches.last is None


def test_clearing_the_cache_forgets_the_last_launch(made):
    x = _x(16)
    add_c[(1,)](mx.array(x), mx.zeros((16,)), 16, 1.0, BLOCK=16)
    assert add_c._launches.last is made[0]
    add_c._launches.clear()
    assert add_c._launches.last is None
    got = add_c[(1,)](mx.array(x), mx.zeros((16,)), 16, 1.0, BLOCK=16)
    np.testing.assert_array_equal(np.array(got), x + 1.0)
    assert len(made) == 2


def test_new_shapes_take_the_family_launch_and_stay_right(made):
    # an eager loop over a growing buffer: each step a new shape and n, and grids whose
    # coverage of the output is proven or not (a written mask then keeps Y's values)
    for n in range(1, 70, 3):
        size = n + (n % 5)      # (some outputs longer than n: elements past n keep Y's)
        blocks = -(-n // 16) - (1 if n % 7 == 0 and n > 16 else 0)   # some grids short
        x, y = _x(size, seed=n), _x(size, seed=n + 100)
        got = add_c[(blocks,)](mx.array(x), mx.array(y), n, 0.5 * n, BLOCK=16)
        np.testing.assert_allclose(np.array(got), _expect(x, y, n, 0.5 * n, blocks * 16),
                                   rtol=1e-6)
    assert len(made) == 1   # every later launch resolved from the family's specialization
    kept = add_c._launches
    assert len(kept) > 20 and len(kept.families) == 1


def test_a_full_launch_cache_drops_its_oldest_launch_and_keeps_the_family(made, monkeypatch):
    # (clearing the whole cache every 256 new shapes cost ~0.7 ms and sent the next new
    # shape through a full resolution)
    from metile.runtime import dispatch
    monkeypatch.setattr(dispatch, "_LAUNCH_CACHE_SIZE", 4)
    kept, first = add_c._launches, None
    for n in range(20, 27):
        x, y = _x(n, seed=n), _x(n, seed=n + 1)
        got = add_c[(2,)](mx.array(x), mx.array(y), n, 1.5, BLOCK=16)
        np.testing.assert_allclose(np.array(got), _expect(x, y, n, 1.5, 32), rtol=1e-6)
        first = first or add_c.last_dispatch
    assert len(kept) == 4 and first not in kept.values() and add_c.last_dispatch in kept.values()
    assert len(made) == 1 and len(kept.families) == 1


def test_the_family_launch_refuses_an_aliased_output(made):
    x, y = mx.array(_x(40)), mx.array(_x(40, seed=1))
    add_c[(3,)](x, y, 40, 1.5, BLOCK=16)
    z = mx.array(_x(24))
    with pytest.raises(LaunchError, match="argument 'X' is the same array as output 'Y'"):
        add_c[(2,)](z, z, 24, 1.5, BLOCK=16)


def test_an_int_past_int32_is_another_family(made):
    # the scalar binds as int64 there: another specialization, not the int32 one's
    # (one block of 8 over 8 elements: n only bounds the mask, every store stays inside)
    x, y = _x(8), _x(8, seed=1)
    add_c[(1,)](mx.array(x), mx.array(y), 8, 1.0, BLOCK=8)
    got = add_c[(1,)](mx.array(x), mx.array(y), 2**31 + 8, 1.0, BLOCK=8)
    np.testing.assert_array_equal(np.array(got), x + np.float32(1.0))
    assert len(made) == 2 and made[1].specs["n"][1].name == "int64"


def test_a_changed_global_reaches_new_shapes(made):
    # Kernel.refresh forgets the launches and their families when a global changes
    global SCALE
    try:
        for size, scale in ((20, 2.0), (24, 2.0), (28, 3.0), (32, 3.0)):
            SCALE = scale
            x = _x(size)
            got = scaled[(2,)](mx.array(x), mx.zeros((size,)), size, BLOCK=16)
            np.testing.assert_array_equal(np.array(got), x * np.float32(scale))
    finally:
        SCALE = 2.0
    assert len(made) == 2
