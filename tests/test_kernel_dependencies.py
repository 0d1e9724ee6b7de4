"""A kernel's caches follow the values its code reads: a changed global, closure
value or helper takes effect on the next launch (in memory as on disk), as a
notebook user expects.  Results are checked against NumPy."""

import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np

import metile

SCALE = 2.0
OFFSETS = (1.0, 10.0)


@metile.kernel
def scaled(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * SCALE + OFFSETS[1], mask=mask)


@metile.inline
def twice(v):
    return v * 2.0


@metile.kernel
def through_helper(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, twice(metile.load(X + offs, mask=mask)), mask=mask)


def _run(k, x):
    n = x.size
    return np.array(k[(metile.cdiv(n, 64),)](x, mx.zeros((n,)), n, BLOCK=64))


def test_changed_global_is_used_by_the_next_launch(monkeypatch):
    x = mx.arange(100, dtype=mx.float32)
    xn = np.arange(100, dtype=np.float64)
    np.testing.assert_allclose(_run(scaled, x), xn * 2.0 + 10.0)
    # the same call signature twice: the second reuses the resolved launch
    np.testing.assert_allclose(_run(scaled, x), xn * 2.0 + 10.0)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    np.testing.assert_allclose(_run(scaled, x), xn * 3.0 + 10.0)
    monkeypatch.setitem(globals(), "OFFSETS", (1.0, -5.0))
    np.testing.assert_allclose(_run(scaled, x), xn * 3.0 - 5.0)
    monkeypatch.undo()
    np.testing.assert_allclose(_run(scaled, x), xn * 2.0 + 10.0)


def test_redefined_helper_is_used_by_the_next_launch(monkeypatch):
    x = mx.arange(70, dtype=mx.float32)
    xn = np.arange(70, dtype=np.float64)
    np.testing.assert_allclose(_run(through_helper, x), xn * 2.0)

    @metile.inline
    def thrice(v):
        return v * 3.0

    monkeypatch.setitem(globals(), "twice", thrice)
    np.testing.assert_allclose(_run(through_helper, x), xn * 3.0)


def test_changed_closure_value_is_used_by_the_next_launch():
    factor = 4.0

    @metile.kernel
    def closure_scale(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        mask = offs < n
        metile.store(Y + offs, metile.load(X + offs, mask=mask) * factor, mask=mask)

    x = mx.arange(65, dtype=mx.float32)
    xn = np.arange(65, dtype=np.float64)
    np.testing.assert_allclose(_run(closure_scale, x), xn * 4.0)
    factor = 0.5  # noqa: F841 (read through the kernel's closure cell)
    np.testing.assert_allclose(_run(closure_scale, x), xn * 0.5)


def test_prepared_dispatch_keeps_its_code(monkeypatch):
    x = mx.arange(10, dtype=mx.float32)
    d = scaled[(1,)].prepare(x, mx.zeros((10,)), 10, BLOCK=64)
    monkeypatch.setitem(globals(), "SCALE", -1.0)
    np.testing.assert_allclose(np.array(d()), np.arange(10) * 2.0 + 10.0)
    np.testing.assert_allclose(_run(scaled, x), np.arange(10) * -1.0 + 10.0)


def test_disk_cache_keyed_on_globals(tmp_path):
    # Two processes sharing one disk cache, the global differing between them.
    script = textwrap.dedent("""
        import sys, mlx.core as mx, numpy as np, metile
        K = float(sys.argv[1])

        @metile.kernel
        def k(X, Y, n, BLOCK: metile.constexpr):
            offs = metile.arange(0, BLOCK)
            m = offs < n
            metile.store(Y + offs, metile.load(X + offs, mask=m) + K, mask=m)

        print(np.array(k[(1,)](mx.arange(4, dtype=mx.float32), mx.zeros((4,)), 4, BLOCK=32)).tolist())
    """)
    path = tmp_path / "k.py"
    path.write_text(script)
    env = {"METILE_CACHE_DIR": str(tmp_path / "cache")}
    import os
    outs = []
    for value in ("1", "100", "1"):
        r = subprocess.run([sys.executable, str(path), value], capture_output=True, text=True,
                           timeout=300, env={**os.environ, **env})
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.strip())
    assert outs == ["[1.0, 2.0, 3.0, 4.0]", "[100.0, 101.0, 102.0, 103.0]", "[1.0, 2.0, 3.0, 4.0]"]


def test_disk_cache_keyed_on_the_defaults_of_helpers_and_called_kernels(tmp_path):
    # (a hostile trial, forty-sixth session: a default evaluated from a global when the
    # helper was defined - `s=FACTOR` - is not in the source's text, so a process with
    # another FACTOR loaded the kernel built with the first one's, silently)
    script = textwrap.dedent("""
        import sys, mlx.core as mx, numpy as np, metile
        FACTOR = float(sys.argv[1])

        @metile.inline
        def scaled(x, s=FACTOR):
            return x * s

        @metile.kernel
        def shifted(X, Z, S: metile.constexpr = FACTOR, BLOCK: metile.constexpr = 4):
            offs = metile.arange(0, BLOCK)
            metile.store(Z + offs, metile.load(X + offs) + S)

        @metile.kernel
        def k(X, Y, Z, BLOCK: metile.constexpr):
            offs = metile.arange(0, BLOCK)
            metile.store(Y + offs, scaled(metile.load(X + offs)))
            shifted(X, Z)

        y, z = k[(1,)](mx.arange(4, dtype=mx.float32), mx.zeros((4,)), mx.zeros((4,)), BLOCK=4)
        print(np.array(y).tolist(), np.array(z).tolist())
    """)
    path = tmp_path / "k.py"
    path.write_text(script)
    import os
    env = {**os.environ, "METILE_CACHE_DIR": str(tmp_path / "cache")}
    outs = []
    for value in ("2", "3", "2"):
        r = subprocess.run([sys.executable, str(path), value], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.strip())
    want = {f: f"{(np.arange(4.0) * f).tolist()} {(np.arange(4.0) + f).tolist()}"
            for f in (2, 3)}
    assert outs == [want[2], want[3], want[2]]


# -- a hostile test's findings (twenty-eighth session) ---------------------------------------

PARAMS = {"scale": 2.0}


class Settings:
    SCALE = 2.0


@metile.kernel
def through_dict_and_class(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=m) * PARAMS["scale"] + Settings.SCALE,
                 mask=m)


def test_in_place_edits_and_class_attributes_are_used_by_the_next_launch(monkeypatch):
    # an edited dict (the same object) and a class attribute went unnoticed: the first
    # launch's code ran on
    x = mx.arange(10, dtype=mx.float32)
    xn = np.arange(10, dtype=np.float64)
    np.testing.assert_allclose(_run(through_dict_and_class, x), xn * 2.0 + 2.0)
    monkeypatch.setitem(PARAMS, "scale", 3.0)
    np.testing.assert_allclose(_run(through_dict_and_class, x), xn * 3.0 + 2.0)
    monkeypatch.setattr(Settings, "SCALE", -1.0)
    np.testing.assert_allclose(_run(through_dict_and_class, x), xn * 3.0 - 1.0)


CONSTS = textwrap.dedent("""
    import metile
    SCALE = {scale}
    @metile.inline
    def helper(v):
        return v + {offset}
""")


def _outputs_over_edits(tmp_path, consts_file, script) -> list:
    """The script's printed result, each in a fresh process sharing one cache, as SCALE,
    helper's offset and the script's argument change: [2, 5, 10, 13] when the disk key
    follows all three."""
    import os
    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "METILE_CACHE_DIR": str(tmp_path / "cache")}
    outs = []
    for scale, offset, s in ((2.0, 0.0, 0.0), (5.0, 0.0, 0.0), (5.0, 1.0, 0.0), (5.0, 1.0, 3.0)):
        consts_file.write_text(CONSTS.format(scale=scale, offset=offset))
        r = subprocess.run([sys.executable, str(path), str(tmp_path), str(s)],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(float(r.stdout.strip()))
    return outs


def test_disk_cache_keyed_on_module_and_class_attributes(tmp_path):
    # consts.SCALE, consts.helper and Cfg.S were keyed by the module's or class's name only:
    # a second process read the first one's kernel
    assert _outputs_over_edits(tmp_path, tmp_path / "consts.py", """
        import sys, mlx.core as mx, numpy as np, metile
        sys.path.insert(0, sys.argv[1])
        import consts
        class Cfg:
            S = float(sys.argv[2])

        @metile.kernel
        def k(X, Y, BLOCK: metile.constexpr):
            o = metile.arange(0, BLOCK)
            metile.store(Y + o, consts.helper(metile.load(X + o)) * consts.SCALE + Cfg.S)

        print(np.array(k[(1,)](mx.ones((4,)), mx.zeros((4,)), BLOCK=4)).tolist()[0])
    """) == [2.0, 5.0, 10.0, 13.0]


n = 5   # a global named like the kernel's parameter: not something the kernel reads


def test_a_parameter_named_like_a_global_is_not_a_dependency(monkeypatch):
    # (such a global recompiled the kernel and wrote a disk entry for each of its values)
    from metile.runtime import dependencies, cache
    from metile.frontend.source import function_source
    names = {a for a, _ in dependencies.names(function_source(scaled.fn).tree)}
    assert "n" not in names and "SCALE" in names and "X" not in names and "offs" not in names
    before = cache.source_fingerprint(scaled.fn)
    monkeypatch.setitem(globals(), "n", 6)
    assert cache.source_fingerprint(scaled.fn) == before


DEFAULT_BLOCK = 8


@metile.kernel
def annotated(X, Y, BLOCK: metile.constexpr = DEFAULT_BLOCK):
    offs = metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs) * SCALE)


def test_decorators_defaults_and_annotations_are_no_dependencies():
    # (they were evaluated at definition; `metile.kernel` in the decorator was a reference
    # every launch compared, a sixth of a cached launch's host time)
    from metile.runtime import dependencies
    from metile.runtime.dependencies import Snapshot
    from metile.frontend.source import function_source
    names = {a for a, _ in dependencies.names(function_source(annotated.fn).tree)}
    assert names == {"metile", "SCALE"}
    assert [value for _, value, _ in Snapshot(annotated.fn)._refs] == [SCALE]


@metile.kernel
def reciprocal(X, Y, s, n, BLOCK: metile.constexpr, C: metile.constexpr = 1.0):
    offs = metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Y + offs, 1.0 / (metile.load(X + offs, mask=m) * s) / C, mask=m)


def test_negative_zero_is_not_zero_to_the_launch_caches():
    # -0.0 == 0.0: the launch after a 0.0 reused its scalar (and its constexpr's code)
    x = mx.ones((4,))
    for kw in ({"s": 1.0, "C": 0.0}, {"s": 1.0, "C": -0.0}, {"s": 0.0}, {"s": -0.0}):
        s = kw.pop("s")
        got = np.array(reciprocal[(1,)](x, mx.zeros((4,)), s, 4, BLOCK=4, **kw))
        with np.errstate(divide="ignore"):
            want = np.float32(1.0) / (np.float32(1.0) * np.float32(s)) / np.float32(kw.get("C", 1.0))
        np.testing.assert_array_equal(got, np.full(4, want, np.float32))


# -- attribute chains at any depth and on objects (thirtieth session) ------------------------

class Outer:
    class Nested:
        VAL = 1.0


class Holder:
    pass


CFG = Holder()
CFG.inner = Holder()
CFG.inner.VAL = 10.0


@metile.kernel
def through_chains(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * Outer.Nested.VAL + CFG.inner.VAL,
                 mask=mask)


def test_chains_of_attributes_are_used_by_the_next_launch(monkeypatch):
    # Outer.Nested.VAL and an object's attribute (CFG.inner.VAL) were not followed: the
    # first launch's values ran on
    x = mx.arange(10, dtype=mx.float32)
    xn = np.arange(10, dtype=np.float64)
    np.testing.assert_allclose(_run(through_chains, x), xn + 10.0)
    monkeypatch.setattr(Outer.Nested, "VAL", 7.0)
    np.testing.assert_allclose(_run(through_chains, x), xn * 7.0 + 10.0)
    monkeypatch.setattr(CFG.inner, "VAL", -2.0)
    np.testing.assert_allclose(_run(through_chains, x), xn * 7.0 - 2.0)
    other = Holder()
    other.VAL = 4.0
    monkeypatch.setattr(CFG, "inner", other)     # an object of the chain rebound
    np.testing.assert_allclose(_run(through_chains, x), xn * 7.0 + 4.0)


def test_disk_cache_keyed_on_chains_into_packages_and_objects(tmp_path):
    # pkg.consts.SCALE, pkg.consts.helper and cfg.V hashed only `pkg` (a module's name) or
    # the object's repr: a second process read the first one's kernel
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import consts\n")
    assert _outputs_over_edits(tmp_path, tmp_path / "pkg" / "consts.py", """
        import sys, types, mlx.core as mx, numpy as np, metile
        sys.path.insert(0, sys.argv[1])
        import pkg
        cfg = types.SimpleNamespace(V=float(sys.argv[2]))

        @metile.kernel
        def k(X, Y, BLOCK: metile.constexpr):
            o = metile.arange(0, BLOCK)
            metile.store(Y + o, pkg.consts.helper(metile.load(X + o)) * pkg.consts.SCALE + cfg.V)

        print(np.array(k[(1,)](mx.ones((4,)), mx.zeros((4,)), BLOCK=4)).tolist()[0])
    """) == [2.0, 5.0, 10.0, 13.0]


def test_the_source_is_read_when_the_kernel_is_defined(tmp_path):
    # a file edited after its import (no reload) gave the kernel's first compile the text
    # now at its lines: another kernel's body once lines were inserted above it
    (tmp_path / "mod.py").write_text(textwrap.dedent("""
        import metile

        @metile.kernel
        def kern(X, Y, BLOCK: metile.constexpr):
            o = metile.arange(0, BLOCK)
            metile.store(Y + o, metile.load(X + o) * 2.0)

        @metile.kernel
        def other(X, Y, BLOCK: metile.constexpr):
            o = metile.arange(0, BLOCK)
            metile.store(Y + o, metile.load(X + o) - 100.0)
    """))
    script = textwrap.dedent("""
        import sys, mlx.core as mx, numpy as np
        sys.path.insert(0, sys.argv[1])
        import mod
        path = sys.argv[1] + "/mod.py"
        text = open(path).read()
        open(path, "w").write("# a\\n# b\\n# c\\n# d\\n# e\\n" + text.replace("* 2.0", "* 5.0"))
        print(np.array(mod.kern[(1,)](mx.ones((4,)), mx.zeros((4,)), BLOCK=4)).tolist()[0])
    """)
    (tmp_path / "run.py").write_text(script)
    import os
    env = {**os.environ, "METILE_DISABLE_DISK_CACHE": "1"}
    r = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip()) == 2.0


EPS = np.float32(0.5)
STEPS = np.int64(3)
TABLE = np.zeros(5000, np.float32)


@metile.kernel
def through_numpy(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * STEPS + EPS + TABLE[2500],
                 mask=mask)


def test_numpy_scalars_and_arrays_are_constants_that_key_the_caches(monkeypatch):
    # a NumPy scalar was refused as an operand ("unsupported operand: ... np.float32(0.5)");
    # an element of a large NumPy array changed in place went unseen (its repr elides it)
    x = mx.arange(10, dtype=mx.float32)
    xn = np.arange(10, dtype=np.float64)
    np.testing.assert_allclose(_run(through_numpy, x), xn * 3 + 0.5)
    try:
        TABLE[2500] = 7.0
        np.testing.assert_allclose(_run(through_numpy, x), xn * 3 + 7.5)
        monkeypatch.setitem(globals(), "STEPS", np.int64(-1))
        np.testing.assert_allclose(_run(through_numpy, x), -xn + 7.5)
    finally:
        TABLE[2500] = 0.0


SHAPE_OF_NUMPY_INTS = (np.int64(2), np.int32(4))


@metile.kernel
def numpy_shapes(Y, V: metile.constexpr, SHAPE: metile.constexpr):
    z = metile.zeros(SHAPE, dtype=metile.float32) + V
    rows, cols = SHAPE_OF_NUMPY_INTS
    metile.store(Y + metile.arange(0, rows)[:, None] * cols + metile.arange(0, cols)[None, :], z)


def test_numpy_ints_in_a_tuple_are_ints_too():
    # (zeros() refused a shape of NumPy ints, a global's or a constexpr argument's, as "not
    # a tuple of positive constexpr ints"; a NumPy int alone was already an int)
    got = numpy_shapes[(1,)](mx.zeros((8,)), np.float32(1.5), (np.int64(2), np.uint8(4)))
    assert got.tolist() == [1.5] * 8
