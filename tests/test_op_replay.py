"""Repeated eager op calls replay their launch (metile/op_replay.py): the numbers and
gradients of a replayed call are NumPy's and MLX's, a replay is what runs (the op's
routing is not asked again), and a changed setting or a new routing decision sends the
call back through the op's full path."""

import mlx.core as mx
import numpy as np
import pytest

import metile
import metile.ops as ops
from metile import op_replay
from metile.runtime import routing
from conftest import default_is_cpu, mlx_compile_failure, np_rope

TOL = {mx.float32: 2e-5, mx.float16: 3e-3, mx.bfloat16: 2e-2}


def arrays(rng, dtype, *shapes):
    return [mx.array(rng.standard_normal(s).astype(np.float32)).astype(dtype) for s in shapes]


def f64(x):
    return np.array(x.astype(mx.float32), np.float64)


@pytest.fixture
def routes(monkeypatch):
    """The metile calls that went through the op's routing (a replayed call does not)."""
    seen = []
    real = ops._route

    def counted(op, arrays, activation, slope, backend, **kwargs):
        if backend != "mlx":
            seen.append(op)
        return real(op, arrays, activation, slope, backend, **kwargs)
    monkeypatch.setattr(ops, "_route", counted)
    return seen


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_a_repeated_matmul_replays_on_new_arrays(rng, routes, dtype):
    a, b = arrays(rng, dtype, (13, 27), (27, 9))
    metile.ops.matmul(a, b, epilogue="relu", backend="metile")
    assert len(routes) == 1 and len(op_replay._REPLAYS) == 1
    for _ in range(2):   # new arrays of the same signature
        a, b = arrays(rng, dtype, (13, 27), (27, 9))
        out = metile.ops.matmul(a, b, epilogue="relu", backend="metile")
        want = np.maximum(f64(a) @ f64(b), 0)
        np.testing.assert_allclose(f64(out), want, rtol=TOL[dtype], atol=TOL[dtype] * 8)
    assert len(routes) == 1   # neither call routed again


def test_rows_of_a_batched_left_operand_and_the_result_shape(rng, routes):
    a, b = arrays(rng, mx.float32, (2, 5, 24), (24, 8))
    metile.ops.matmul(a, b, backend="metile")
    a, b = arrays(rng, mx.float32, (2, 5, 24), (24, 8))
    out = metile.ops.matmul(a, b, backend="metile")
    assert out.shape == (2, 5, 8) and len(routes) == 1
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=2e-5, atol=2e-5)


def test_replayed_gradients_match_mlx(rng, routes):
    a, b = arrays(rng, mx.float32, (12, 20), (20, 7))

    def ours(x, y):
        return (metile.ops.matmul(x, y, epilogue="gelu_tanh", backend="metile") ** 2).sum()

    def theirs(x, y):
        return (metile.ops.matmul(x, y, epilogue="gelu_tanh", backend="mlx") ** 2).sum()

    first = mx.grad(ours, argnums=(0, 1))(a, b)
    again = mx.grad(ours, argnums=(0, 1))(a, b)   # the replay's custom vjp
    assert len(routes) == 1
    for g in (first, again):
        for got, want in zip(g, mx.grad(theirs, argnums=(0, 1))(a, b)):
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wrap", ["grad", "grad of compile", "compile of grad"])
def test_an_eager_replay_then_gradients_through_a_captured_weight(rng, routes, wrap):
    # recorded and replayed eagerly (no tracer among its arrays: launched without a custom
    # vjp), then differentiated where only x is traced and reaches the op through another
    # op: the replay must take its vjp there
    a, w = arrays(rng, mx.float32, (10, 16), (16, 6))
    metile.ops.matmul(a, w, epilogue="silu", backend="metile")
    eager = metile.ops.matmul(a * 2, w, epilogue="silu", backend="metile")
    np.testing.assert_allclose(f64(eager), f64(metile.ops.matmul(a * 2, w, epilogue="silu",
                                                                    backend="mlx")),
                               rtol=2e-5, atol=2e-5)

    def loss(backend):
        return lambda x: (metile.ops.matmul(x * 2, w, epilogue="silu", backend=backend) ** 2).sum()

    if wrap == "grad":
        grad = mx.grad(loss("metile"))
    elif wrap == "grad of compile":
        grad = mx.grad(mx.compile(loss("metile")))
    else:
        grad = mx.compile(mx.grad(loss("metile")))
    want = mx.grad(loss("mlx"))(a)
    for _ in range(2):
        np.testing.assert_allclose(np.array(grad(a)), np.array(want), rtol=1e-4, atol=1e-4)
    assert len(routes) == 1


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=str)
def test_linear_with_bias_and_residual_replays_with_gradients(rng, routes, dtype):
    x, w, bias, res = arrays(rng, dtype, (3, 5, 24), (9, 24), (9,), (3, 5, 9))

    def loss(x, w, bias, res, backend):
        y = metile.ops.linear(x, w, bias, "silu", residual=res, backend=backend)
        return (y.astype(mx.float32) ** 2).sum()

    metile.ops.linear(x, w, bias, "silu", residual=res, backend="metile")
    x, w, bias, res = arrays(rng, dtype, (3, 5, 24), (9, 24), (9,), (3, 5, 9))
    out = metile.ops.linear(x, w, bias, "silu", residual=res, backend="metile")
    z = f64(x) @ f64(w).T + f64(bias)
    want = z / (1 + np.exp(-z)) + f64(res)
    np.testing.assert_allclose(f64(out), want, rtol=TOL[dtype], atol=TOL[dtype] * 8)
    got = mx.grad(loss, argnums=(0, 1, 2, 3))(x, w, bias, res, "metile")
    ref = mx.grad(loss, argnums=(0, 1, 2, 3))(x, w, bias, res, "mlx")
    assert routes == ["linear"]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(f64(g), f64(r), rtol=TOL[dtype] * 4,
                                   atol=TOL[dtype] * 4 * np.abs(f64(r)).max())


def test_a_changed_setting_takes_the_full_path(rng, routes, monkeypatch):
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    for _ in range(2):
        metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 1
    monkeypatch.setenv("METILE_MSL_TIMEOUT_S", "301")    # a value changed
    metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 2
    monkeypatch.setenv("METILE_REPLAY_TEST_PROBE", "1")   # a METILE_ variable added
    out = metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 3
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("variable", ["XDG_CACHE_HOME", "HOME"])
def test_another_cache_folder_takes_the_full_path(rng, routes, monkeypatch, tmp_path, variable):
    # routing reads its recorded decisions below settings.cache_root(): a replay made with
    # one folder replayed the route it had found there under another
    monkeypatch.delenv("METILE_CACHE_DIR", raising=False)
    monkeypatch.setenv(variable, str(tmp_path / "a"))
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    for _ in range(2):
        metile.ops.matmul(a, b)
    assert len(routes) == 1
    monkeypatch.setenv(variable, str(tmp_path / "b"))
    out = metile.ops.matmul(a, b)
    assert len(routes) == 2
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=2e-5, atol=2e-5)


def test_each_change_of_a_setting_is_noticed(rng, routes, monkeypatch):
    # a check that passed is skipped until os.environ changes (csrc/ext.cpp, EnvCheck): each
    # change - to a new value, back, or to another variable - is compared again
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    monkeypatch.setenv("METILE_MSL_TIMEOUT_S", "301")
    for _ in range(3):
        metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 1
    monkeypatch.setenv("METILE_MSL_TIMEOUT_S", "302")
    for _ in range(3):
        metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 2   # (recorded again under 302, then replayed)
    monkeypatch.setenv("METILE_MSL_TIMEOUT_S", "301")
    metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 3
    monkeypatch.setenv("UNRELATED_TEST_VARIABLE", "1")   # not a setting: one more variable
    out = metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 4
    out = metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 4
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=2e-5, atol=2e-5)


def test_a_routing_decision_forgets_the_replays(rng, routes, tmp_path, monkeypatch):
    monkeypatch.setattr(routing, "routing_dir", lambda: tmp_path / "routing")
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    for _ in range(2):
        metile.ops.matmul(a, b, backend="metile")
    assert op_replay._REPLAYS
    routing.record("some-decision", {"winner": "mlx", "key": "some-decision", "timings": {}})
    assert not op_replay._REPLAYS
    metile.ops.matmul(a, b, backend="metile")
    assert len(routes) == 2


def test_a_transposed_view_after_a_row_major_call_gives_its_product(rng, routes):
    a, b, w = arrays(rng, mx.float32, (8, 16), (16, 8), (8, 16))
    metile.ops.matmul(a, b, backend="metile")
    out = metile.ops.matmul(a, w.T, backend="metile")   # same signature, a view
    np.testing.assert_allclose(f64(out), f64(a) @ f64(w).T, rtol=2e-5, atol=2e-5)


def test_replays_inside_compile(rng, routes):
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    metile.ops.matmul(a, b, epilogue="silu", backend="metile")
    step = mx.compile(lambda x, y: metile.ops.matmul(x, y, epilogue="silu", backend="metile") * 2)
    for _ in range(2):
        a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
        z = f64(a) @ f64(b)
        np.testing.assert_allclose(f64(step(a, b)), 2 * z / (1 + np.exp(-z)), rtol=2e-5,
                                   atol=2e-5)
    assert len(routes) == 1


@pytest.fixture
def row_routes(monkeypatch):
    """The metile row-op calls (norms, softmax) that went through routing."""
    from metile import model_ops
    seen = []
    real = model_ops._route

    def counted(op, backend, *args, **kwargs):
        if backend != "mlx":
            seen.append(op)
        return real(op, backend, *args, **kwargs)
    monkeypatch.setattr(model_ops, "_route", counted)
    return seen


def rms(x, w, eps):
    out = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return out if w is None else out * w


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_norms_replay_with_gradients(rng, row_routes, dtype, weighted):
    def call(x, w):
        return metile.ops.rms_norm(x, w if weighted else None, 1e-5, backend="metile")

    x, w = arrays(rng, dtype, (3, 7, 40), (40,))
    call(x, w)
    x, w = arrays(rng, dtype, (3, 7, 40), (40,))
    out = call(x, w)
    assert row_routes == ["rms_norm"] and out.shape == (3, 7, 40)
    np.testing.assert_allclose(f64(out), rms(f64(x), f64(w) if weighted else None, 1e-5),
                               rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)
    loss = lambda x, w: (call(x, w).astype(mx.float32) ** 2).sum()   # noqa: E731
    ref = lambda x, w: (mx.fast.rms_norm(x, w if weighted else None, 1e-5)  # noqa: E731
                        .astype(mx.float32) ** 2).sum()
    for g, r in zip(mx.grad(loss, argnums=(0, 1))(x, w), mx.grad(ref, argnums=(0, 1))(x, w)):
        np.testing.assert_allclose(f64(g), f64(r), rtol=TOL[dtype] * 8,
                                   atol=TOL[dtype] * 8 * max(1.0, np.abs(f64(r)).max()))


def test_layer_norm_with_a_bias_only_replays(rng, row_routes):
    x, b = arrays(rng, mx.float32, (5, 33), (33,))
    metile.ops.layer_norm(x, None, b, 1e-5, backend="metile")
    x, b = arrays(rng, mx.float32, (5, 33), (33,))
    out = metile.ops.layer_norm(x, None, b, 1e-5, backend="metile")
    assert row_routes == ["layer_norm"]
    c = f64(x) - f64(x).mean(-1, keepdims=True)
    want = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) + f64(b)
    np.testing.assert_allclose(f64(out), want, rtol=1e-4, atol=1e-4)


def test_softmax_replays_over_the_last_axis_only(rng, row_routes):
    def numpy_softmax(x, axis):
        e = np.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    for axis, routed in ((-1, 1), (0, 2)):   # a first axis moves it last: full path each call
        row_routes.clear()
        for _ in range(2):
            (x,) = arrays(rng, mx.float32, (6, 20))
            out = metile.ops.softmax(x, axis=axis, backend="metile")
            np.testing.assert_allclose(f64(out), numpy_softmax(f64(x), axis), rtol=1e-5,
                                       atol=1e-6)
        assert len(row_routes) == routed


def test_calls_routed_to_mlx_skip_routing_when_repeated(rng, routes, row_routes, monkeypatch):
    # backend="auto" on the CPU: the cost model keeps MLX's ops; a repeated call runs the
    # composite directly until a setting changes
    x, w, bias = arrays(rng, mx.float32, (2, 6, 16), (8, 16), (8,))
    for _ in range(3):
        x, w, bias = arrays(rng, mx.float32, (2, 6, 16), (8, 16), (8,))
        out = metile.ops.linear(x, w, bias, "relu")
        np.testing.assert_allclose(f64(out), np.maximum(f64(x) @ f64(w).T + f64(bias), 0),
                                   rtol=1e-5, atol=1e-5)
        y = metile.ops.rms_norm(x, None, 1e-6)
        np.testing.assert_allclose(f64(y), rms(f64(x), None, 1e-6), rtol=1e-5, atol=1e-5)
    assert routes == ["linear"] and row_routes == ["rms_norm"]
    monkeypatch.setenv("METILE_REPLAY_TEST_PROBE", "1")
    metile.ops.linear(x, w, bias, "relu")
    assert routes == ["linear", "linear"]


def test_calls_that_ask_for_mlx_replay_its_op(rng, monkeypatch):
    # backend="mlx" asks for MLX's op: a repeated call runs it without the op's Python body
    # (the full path cost 5-15x MLX's own eager call on the CPU)
    from metile import model_ops, quantized_ops
    entered = []
    for module, name in ((ops, "_matmul_plan"), (ops, "_route"), (model_ops, "_route"),
                         (model_ops, "_softmax_axes"), (quantized_ops, "_check")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k:
                            entered.append(_name) or _real(*a, **k))
    w = mx.array(rng.standard_normal((24, 64)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    problem = mlx_compile_failure(mx.quantized_matmul(w[:2], wq, s, b))
    if problem:   # (MLX's own float32 product does not compile on the H200's image)
        pytest.skip(problem.splitlines()[0])
    for _ in range(3):
        x, a, bm, lw = arrays(rng, mx.float32, (5, 64), (5, 64), (64, 24), (24, 64))
        np.testing.assert_allclose(f64(metile.ops.matmul(a, bm, epilogue="relu", backend="mlx")),
                                   np.maximum(f64(a) @ f64(bm), 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(f64(metile.ops.linear(x, lw, backend="mlx")),
                                   f64(x) @ f64(lw).T, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(f64(metile.ops.rms_norm(x, None, 1e-6, backend="mlx")),
                                   rms(f64(x), None, 1e-6), rtol=1e-5, atol=1e-5)
        e = np.exp(f64(x) - f64(x).max(-1, keepdims=True))
        np.testing.assert_allclose(f64(metile.ops.softmax(x, backend="mlx")),
                                   e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            f64(metile.ops.quantized_matmul(x, wq, s, b, backend="mlx")),
            f64(x) @ f64(mx.dequantize(wq, s, b, group_size=64, bits=4)).T, rtol=1e-4, atol=1e-4)
    assert sorted(entered) == sorted(["_matmul_plan", "_route", "_route", "_softmax_axes",
                                      "_check"]), entered
    monkeypatch.setenv("METILE_REPLAY_TEST_PROBE", "1")   # a new setting: the full path
    metile.ops.softmax(x, backend="mlx")
    assert entered.count("_softmax_axes") == 2


@pytest.mark.parametrize("rows", [2, 40])   # the GEMV and the GEMM
def test_quantized_matmul_replays(rng, rows, monkeypatch):
    from metile import quantized_ops
    seen = []
    real = quantized_ops._route

    def counted(*args, **kwargs):
        seen.append(args[-1])
        return real(*args, **kwargs)
    monkeypatch.setattr(quantized_ops, "_route", counted)
    w = mx.array(rng.standard_normal((24, 128)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    for _ in range(3):
        (x,) = arrays(rng, mx.float32, (rows, 128))
        out = metile.ops.quantized_matmul(x, wq, s, b, backend="metile")
        want = f64(x) @ f64(mx.dequantize(wq, s, b, group_size=64, bits=4)).T
        np.testing.assert_allclose(f64(out), want, rtol=1e-4, atol=1e-4)
    assert seen == ["metile"]
    g = mx.grad(lambda x: metile.ops.quantized_matmul(x, wq, s, b, backend="metile").sum())(x)
    ref = mx.grad(lambda x: mx.quantized_matmul(x, wq, s, b).sum())(x)
    np.testing.assert_allclose(f64(g), f64(ref), rtol=1e-4, atol=1e-4)


def test_one_array_twice_then_two_arrays(rng, routes):
    # matmul(a, a) records both kernel operands from one object: each slot keeps its own
    # position, so matmul(x, y) of the same signature multiplies x by y
    (a,) = arrays(rng, mx.float32, (16, 16))
    np.testing.assert_allclose(f64(metile.ops.matmul(a, a, backend="metile")), f64(a) @ f64(a),
                               rtol=2e-5, atol=2e-5)
    x, y = arrays(rng, mx.float32, (16, 16), (16, 16))
    np.testing.assert_allclose(f64(metile.ops.matmul(x, y, backend="metile")), f64(x) @ f64(y),
                               rtol=2e-5, atol=2e-5)
    assert len(routes) == 1



def test_bad_options_are_refused_by_the_full_path_after_a_replay(rng):
    # unhashable or mistyped options never key a replay: the op's own checks name them
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    for _ in range(2):
        metile.ops.matmul(a, b, backend="metile")
        metile.ops.softmax(a, axis=-1, backend="metile")
    with pytest.raises(ValueError, match="epilogue must be one of"):
        metile.ops.matmul(a, b, epilogue=["relu"], backend="metile")
    with pytest.raises(TypeError, match="axis must be None, an int or a sequence of ints"):
        metile.ops.softmax(a, axis=(0, [1]), backend="metile")
    with pytest.raises(TypeError, match="negative_slope must be a number"):
        metile.ops.linear(a, b.T, negative_slope="0.1", backend="metile")


@pytest.mark.parametrize("backend", ["metile", "auto"])
def test_gated_mlp_replays(rng, routes, backend):
    def want(x, wg, wu):
        g = f64(x) @ f64(wg).T
        return g / (1 + np.exp(-g)) * (f64(x) @ f64(wu).T)

    for _ in range(3):
        x, wg, wu = arrays(rng, mx.float32, (2, 5, 32), (24, 32), (24, 32))
        out = metile.ops.gated_mlp(x, wg, wu, "silu", backend=backend)
        assert out.shape == (2, 5, 24)
        np.testing.assert_allclose(f64(out), want(x, wg, wu), rtol=1e-4, atol=1e-4)
    assert routes == ["gated_mlp"]

    def loss(x, wg, wu, b):
        return (metile.ops.gated_mlp(x, wg, wu, "silu", backend=b) ** 2).sum()
    got = mx.grad(loss, argnums=(0, 1, 2))(x, wg, wu, backend)
    ref = mx.grad(loss, argnums=(0, 1, 2))(x, wg, wu, "mlx")
    for g, r in zip(got, ref):
        np.testing.assert_allclose(f64(g), f64(r), rtol=1e-4, atol=1e-4)


def test_replay_keys_tell_option_types_and_absent_arrays_apart():
    x, y = mx.zeros((2, 3)), mx.zeros((3,), mx.float16)
    key = op_replay.key
    # 1, 1.0 and True are different options (a kernel specialized for one is not the other's)
    keys = {key("op", (v,), x) for v in (1, 1.0, True, "1", None, (1,))}
    assert len(keys) == 6 and None not in keys
    # the arrays' dtypes and shapes, an absent one, and the op's name are in the key
    assert key("op", (), x, y) != key("op", (), x, y.astype(mx.float32))
    assert key("op", (), x, None) != key("op", (), x) != key("op", (), None, x)
    assert key("op", (), x) != key("other", (), x)
    # an option or argument that cannot key a replay: no key (the op's full path runs)
    assert key("op", ([1],), x) is None and key("op", ((1.5,),), x) is None
    assert key("op", (2 ** 70,), x) is None and key("op", (), np.zeros(3)) is None


def test_a_changed_option_misses_and_a_provisional_replay_declines_while_tuning(rng, routes):
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    metile.ops.matmul(a, b, epilogue="leaky_relu", negative_slope=0.25, backend="metile")
    metile.ops.matmul(a, b, epilogue="leaky_relu", negative_slope=0.25, backend="metile")
    assert len(routes) == 1
    out = metile.ops.matmul(a, b, epilogue="leaky_relu", negative_slope=0.5, backend="metile")
    assert len(routes) == 2   # another slope: the full path, its own kernel
    want = f64(a) @ f64(b)
    np.testing.assert_allclose(f64(out), np.where(want > 0, want, 0.5 * want), rtol=2e-5,
                               atol=2e-5)
    k = op_replay.key("matmul", ("leaky_relu", 0.25, "metile", None), a, b)
    replay, provisional = op_replay._REPLAYS.get(k)
    assert not provisional
    # inside a tuning scope (a call there may measure): a provisional replay (one routed by
    # the cost model) declines, a decided one runs
    table = metile._ext.ReplayTable(2)
    table.put(k, replay, True)
    with routing.tuning_scope():
        assert table("matmul", ("leaky_relu", 0.25, "metile", None), a, b) is None
        table.put(k, replay, False)
        got = table("matmul", ("leaky_relu", 0.25, "metile", None), a, b)
    table.put(k, replay, True)   # (out of the scope a provisional replay runs)
    assert table("matmul", ("leaky_relu", 0.25, "metile", None), a, b) is not None
    np.testing.assert_allclose(f64(got), np.where(want > 0, want, 0.25 * want), rtol=2e-5,
                               atol=2e-5)
    # full at its capacity: emptied before the next entry
    table.put(op_replay.key("matmul", (None, 0.25, "metile", None), a, b), replay, False)
    assert len(table) == 2
    table.put(op_replay.key("matmul", ("relu", 0.25, "metile", None), a, b), replay, False)
    assert len(table) == 1 and table.get(k) is None


# -- the ops' eager entries (op_replay.entry: a C function per op) ---------------------------

def test_an_entry_binds_arguments_as_the_op_signature_does(rng, routes):
    # positional or by keyword, a default given or left out: one signature, one replay
    a, b = arrays(rng, mx.float32, (9, 12), (12, 5))
    want = np.maximum(f64(a) @ f64(b), 0)
    calls = [lambda: metile.ops.matmul(a, b, epilogue="relu", backend="metile"),
             lambda: metile.ops.matmul(b=b, a=a, backend="metile", epilogue="relu"),
             lambda: metile.ops.matmul(a, b=b, epilogue="relu", backend="metile",
                                       negative_slope=ops.LEAKY_SLOPE)]
    for call in calls * 2:
        np.testing.assert_allclose(f64(call()), want, rtol=2e-5, atol=2e-5)
    assert len(routes) == 1
    x = arrays(rng, mx.float32, (4, 12))[0]
    w = arrays(rng, mx.float32, (12,))[0]
    for call in [lambda: metile.ops.rms_norm(x, w, 1e-5, backend="metile"),
                 lambda: metile.ops.rms_norm(x, eps=1e-5, weight=w, backend="metile")] * 2:
        got = call()
        ref = f64(x) / np.sqrt((f64(x) ** 2).mean(-1, keepdims=True) + 1e-5) * f64(w)
        np.testing.assert_allclose(f64(got), ref, rtol=2e-5, atol=2e-5)
    assert len(op_replay._REPLAYS.replays("rms_norm")) == 1


def test_an_entry_sends_calls_it_cannot_bind_to_the_op_which_names_them(rng):
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    for _ in range(2):   # (recorded: the entry has a replay for (a, b))
        metile.ops.matmul(a, b, backend="metile")
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'b'"):
        metile.ops.matmul(a)
    with pytest.raises(TypeError, match="unexpected keyword argument 'epilog'"):
        metile.ops.matmul(a, b, epilog="relu")
    with pytest.raises(TypeError, match="multiple values for argument 'b'"):
        metile.ops.matmul(a, b, b=b)
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        metile.ops.matmul(a, b, "relu")
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'eps'"):
        metile.ops.rms_norm(a, None)
    with pytest.raises(ValueError, match="backend must be 'auto', 'metile' or 'mlx', got 'cuda'"):
        metile.ops.matmul(a, b, backend="cuda")


def test_an_entry_keeps_the_op_name_signature_and_docstring():
    import inspect
    from metile import model_ops, quantized_ops
    for name, params in [("matmul", ["a", "b", "epilogue", "negative_slope", "backend",
                                      "stream"]),
                         ("rms_norm", ["x", "weight", "eps", "backend", "stream"]),
                         ("softmax", ["x", "axis", "precise", "backend", "stream"]),
                         ("quantized_matmul", ["x", "w", "scales", "biases", "transpose",
                                               "group_size", "bits", "mode", "backend",
                                               "stream"])]:
        fn = getattr(metile.ops, name)
        sig = inspect.signature(fn)
        assert list(sig.parameters) == params
        assert sig.parameters["backend"].default == "auto"
        assert sig.parameters["backend"].kind is inspect.Parameter.KEYWORD_ONLY
        assert fn.__name__ == name and inspect.getdoc(fn)
        assert fn.__module__ in ("metile.ops", model_ops.__name__, quantized_ops.__name__)
    assert "MLX's signature" in metile.ops.quantized_matmul.__doc__


def test_quantized_matmul_with_mlx_none_defaults_replays(rng, monkeypatch):
    # group_size=None / bits=None (MLX's "the mode's default") key their own replay
    from metile import quantized_ops
    seen = []
    real = quantized_ops._route
    monkeypatch.setattr(quantized_ops, "_route",
                        lambda *args, **kwargs: seen.append(1) or real(*args, **kwargs))
    w = mx.array(rng.standard_normal((24, 128)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    want_w = f64(mx.dequantize(wq, s, b, group_size=64, bits=4))
    for _ in range(3):
        (x,) = arrays(rng, mx.float32, (2, 128))
        out = metile.ops.quantized_matmul(x, wq, s, b, group_size=None, bits=None,
                                          backend="metile")
        np.testing.assert_allclose(f64(out), f64(x) @ want_w.T, rtol=1e-4, atol=1e-4)
    assert len(seen) == 1


def test_an_entry_finds_its_replay_again_only_while_the_table_holds_it(rng, routes):
    # the entry's recent hits (option objects by identity) stand for the table's entry
    # only while the table is unchanged: forgetting the replays sends the call back to
    # the op, and an equal option built anew still finds the replay through its key
    a, b = arrays(rng, mx.float32, (6, 10), (10, 4))
    want = f64(a) @ f64(b)
    want = np.where(want > 0, want, 0.3 * want)
    for _ in range(3):
        out = metile.ops.matmul(a, b, epilogue="leaky_relu", negative_slope=0.3, backend="metile")
    assert len(routes) == 1
    slope = float("0.3")   # another float object of the same value
    np.testing.assert_allclose(f64(metile.ops.matmul(a, b, epilogue="leaky_relu",
                                                     negative_slope=slope, backend="metile")),
                               want, rtol=2e-5, atol=2e-5)
    assert len(routes) == 1
    op_replay.forget()
    np.testing.assert_allclose(f64(metile.ops.matmul(a, b, epilogue="leaky_relu",
                                                     negative_slope=0.3, backend="metile")),
                               want, rtol=2e-5, atol=2e-5)
    assert len(routes) == 2   # routed again, then recorded again
    (c,) = arrays(rng, mx.float32, (7, 10))   # another shape, the same options: its own key
    metile.ops.matmul(c, b, epilogue="leaky_relu", negative_slope=0.3, backend="metile")
    assert len(routes) == 3
    np.testing.assert_allclose(f64(out), want, rtol=2e-5, atol=2e-5)


def test_ops_pickle_by_reference_as_python_functions_do(rng):
    # (multiprocessing hands workers functools.partial(op, ...)): an op's entry pickles by
    # its module and name, and the unpickled op computes the same numbers
    import functools
    import pickle
    (x,) = arrays(rng, mx.float32, (3, 8))
    for name in ("matmul", "linear", "gated_mlp", "rms_norm", "layer_norm", "softmax",
                 "quantized_matmul"):
        assert pickle.loads(pickle.dumps(getattr(metile.ops, name))).__name__ == name
    from unittest import mock
    pickled = pickle.dumps(metile.ops.matmul)
    with mock.patch("metile.ops.matmul"):   # replaced since it was pickled: said so
        with pytest.raises(pickle.UnpicklingError, match="metile.ops.matmul is no longer "
                                                         "metile's op"):
            pickle.loads(pickled)
    norm = pickle.loads(pickle.dumps(functools.partial(metile.ops.rms_norm, eps=1e-5,
                                                       backend="metile")))
    want = f64(x) / np.sqrt((f64(x) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(f64(norm(x, None)), want, rtol=2e-5, atol=2e-5)


def test_a_setting_added_where_another_variable_went_sends_the_call_back(rng, monkeypatch):
    # (a hostile test: the count of all variables was the only sign of a new METILE_*
    # variable, so one removed and one added kept a replay - and routing's memo - as they
    # were: an invalid setting went unreported, METILE_OPS_TUNE=1 measured nothing)
    monkeypatch.setenv("METILE_TEST_UNRELATED", "1")
    monkeypatch.delenv("METILE_OPS_TUNE", raising=False)
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "1")
    (x,) = arrays(rng, mx.float32, (8, 16))
    for _ in range(2):
        metile.ops.rms_norm(x, None, 1e-5)
    monkeypatch.delenv("SOME_UNRELATED_VARIABLE")
    monkeypatch.setenv("METILE_OPS_TUNE", "yes please")
    with pytest.raises(metile.settings.SettingError,
                       match="METILE_OPS_TUNE='yes please' is not a boolean"):
        metile.ops.rms_norm(x, None, 1e-5)
    monkeypatch.setenv("METILE_OPS_TUNE", "0")
    # routing's environment (part of every decision key) after the same kind of swap
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "1")
    before = dict(routing.environment())
    monkeypatch.delenv("SOME_UNRELATED_VARIABLE")
    monkeypatch.setenv("METILE_TEST_SETTING", "2")
    assert dict(routing.environment()) == {**before, "METILE_TEST_SETTING": "2"}


def test_an_entry_made_without_its_arguments_refuses_by_name():
    e = metile._ext.OpEntry.__new__(metile._ext.OpEntry)
    with pytest.raises(TypeError, match="an OpEntry made without its arguments has no function"):
        e.function()
    with pytest.raises(AttributeError):
        e.matmul


@pytest.mark.parametrize("backend", ["metile", "auto", "mlx"])
def test_option_values_mlx_refuses_or_mistypes_are_named_or_taken(rng, backend):
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    with pytest.raises(TypeError, match=r"\[metile.ops.softmax\] precise must be a bool, got "
                                        r"int 1"):
        metile.ops.softmax(a, precise=1, backend=backend)
    # an int slope past int64 (MLX's scalar conversion raised std::bad_cast in the composite)
    out = metile.ops.matmul(a, b, epilogue="leaky_relu", negative_slope=10**30, backend=backend)
    z = f64(a) @ f64(b)
    np.testing.assert_allclose(f64(out), np.where(z > 0, z, 1e30 * z), rtol=1e-4)


@pytest.mark.parametrize("backend", ["metile", "auto", "mlx"])
def test_mlx_stream_and_force_fused_arguments_are_taken(rng, backend):
    # drop-ins take what MLX's ops take: `stream=` (a stream, a device or mx.cpu: the call
    # runs with it as the default, a replayed call too) and attention's `force_fused=`
    a, b = arrays(rng, mx.float32, (8, 16), (16, 8))
    (w,) = arrays(rng, mx.float32, (16,))
    (q,) = arrays(rng, mx.float32, (1, 2, 8, 16))
    wq, s, z = mx.quantize(arrays(rng, mx.float32, (8, 64))[0], group_size=64, bits=4)
    (x,) = arrays(rng, mx.float32, (3, 64))
    want_q = mx.quantized_matmul(x, wq, s, z, stream=mx.cpu)
    default_qmm_compiles = mlx_compile_failure(mx.quantized_matmul(x, wq, s, z)) is None
    from metile import _ext
    cpu_runtime = getattr(_ext, "has_msl_cpu", False)
    if backend == "metile" and not cpu_runtime and not default_is_cpu():
        # (the kernels on a CPU stream need the MSL CPU runtime: a CUDA build without
        # boost.context has none, and says so)
        streams = (None,)
    else:
        streams = (None, mx.cpu, mx.new_stream(mx.cpu), mx.Device(mx.cpu))
    for stream in streams:
        for _ in range(2):
            np.testing.assert_allclose(f64(metile.ops.matmul(a, b, backend=backend, stream=stream)),
                                       f64(a) @ f64(b), rtol=1e-5, atol=1e-5)
            quantized = [(metile.ops.quantized_matmul(x, wq, s, z, backend=backend, stream=stream),
                          want_q)] if stream is not None or default_qmm_compiles else []
            for got, want in quantized + [
                    (metile.ops.rms_norm(a, w, 1e-5, backend=backend, stream=stream),
                     mx.fast.rms_norm(a, w, 1e-5)),
                    (metile.ops.layer_norm(a, w, None, 1e-5, backend=backend, stream=stream),
                     mx.fast.layer_norm(a, w, None, 1e-5)),
                    (metile.ops.softmax(a, backend=backend, stream=stream), mx.softmax(a, axis=-1)),
                    (metile.ops.add_rms_norm(a, a, w, 1e-5, backend=backend, stream=stream)[1],
                     mx.fast.rms_norm(a + a, w, 1e-5)),
                    (metile.ops.rope(q, 16, traditional=False, base=1e4, scale=1.0, offset=3,
                                     backend=backend, stream=stream),
                     mx.fast.rope(q, 16, traditional=False, base=1e4, scale=1.0, offset=3)),
                    (metile.ops.scaled_dot_product_attention(
                        q, q, q, scale=0.25, force_fused=False, backend=backend, stream=stream),
                     mx.fast.scaled_dot_product_attention(q, q, q, scale=0.25))]:
                np.testing.assert_allclose(f64(got), f64(want), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match=r"\[metile.ops.matmul\] stream must be an mx.Stream or "
                                        r"a device, got str"):
        metile.ops.matmul(a, b, backend=backend, stream="cpu")
    with pytest.raises(TypeError, match="force_fused must be a bool, got int 1"):
        metile.ops.scaled_dot_product_attention(q, q, q, scale=0.25, force_fused=1,
                                                backend=backend)


@pytest.mark.parametrize("backend", ["auto", "mlx"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_an_mlx_replay_follows_a_shapeless_compile_to_new_shapes(rng, backend, with_residual):
    # a replay of linear's MLX route reshaped x to the recorded call's rows: after eager
    # calls, mx.compile(shapeless=True) returned the first shape for every later input
    (w,) = arrays(rng, mx.float32, (6, 8))

    def fn(x, r=None):
        return metile.ops.linear(x, w, residual=r, backend=backend)

    def want(x, r=None):
        out = f64(x) @ f64(w).T
        return out if r is None else out + f64(r)
    first = arrays(rng, mx.float32, (2, 3, 8), (2, 3, 6))
    for _ in range(2):
        fn(first[0], first[1] if with_residual else None)
    f = mx.compile(fn, shapeless=True)
    for shape in ((2, 3), (3, 2), (5, 4)):
        x, r = arrays(rng, mx.float32, (*shape, 8), (*shape, 6))
        r = r if with_residual else None
        out = f(x, r) if with_residual else f(x)
        assert out.shape == (*shape, 6)
        np.testing.assert_allclose(f64(out), want(x, r), rtol=1e-5, atol=1e-5)


def test_a_call_that_raises_leaves_no_replay(rng):
    # quantized_matmul's MLX routes recorded their replay before MLX's op ran (an mxfp4
    # call with affine scales raised, and its signature was kept)
    op_replay.forget()
    w = mx.array(rng.standard_normal((24, 64)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=32, bits=4)
    (x,) = arrays(rng, mx.float32, (2, 64))
    for backend in ("auto", "mlx"):
        for _ in range(2):
            with pytest.raises(ValueError):
                metile.ops.quantized_matmul(x, wq, s, b, group_size=32, mode="mxfp4",
                                            backend=backend)
    assert len(op_replay._REPLAYS) == 0


@pytest.mark.parametrize("backend", ["auto", "mlx", "metile"])
@pytest.mark.parametrize("residual_shape", [(3, 5, 32), (5, 32)])
def test_add_rms_norm_replays_with_gradients(rng, row_routes, backend, residual_shape):
    # (it took the full path on every call: 18-23 us on this CPU against MLX's add + norm
    # at 4.3)
    for _ in range(3):
        x, r, w = arrays(rng, mx.float32, (3, 5, 32), residual_shape, (32,))
        h, y = metile.ops.add_rms_norm(x, r, w, 1e-5, backend=backend)
        want_h = f64(x) + f64(r)
        np.testing.assert_allclose(f64(h), want_h, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f64(y), rms(want_h, f64(w), 1e-5), rtol=1e-5, atol=1e-5)
    assert row_routes == ([] if backend == "mlx" else ["add_rms_norm"])

    def loss(fn):
        def f(x, r, w):
            h, y = fn(x, r, w)
            return (h * h).sum() + (y * mx.arange(32)).sum()
        return f
    got = mx.grad(loss(lambda x, r, w: metile.ops.add_rms_norm(x, r, w, 1e-5, backend=backend)),
                  argnums=(0, 1, 2))(x, r, w)
    want = mx.grad(loss(lambda x, r, w: (x + r, mx.fast.rms_norm(x + r, w, 1e-5))),
                   argnums=(0, 1, 2))(x, r, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(f64(g), f64(e), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "mlx", "metile"])
@pytest.mark.parametrize("with_freqs", [False, True])
def test_rope_replays_at_each_call_offset(rng, row_routes, backend, with_freqs):
    # a decoding loop moves the int offset every token: a replay keyed without its value
    # (op_replay.entry's `values`), the kernel taking it as an array - where each offset
    # had taken the full path and a new launch (~250 us a token on this CPU)
    from metile import model_ops
    freqs = mx.array(rng.uniform(1.0, 50.0, 8).astype(np.float32)) if with_freqs else None
    base = None if with_freqs else 10000.0
    functions = []
    # (offsets where float32 angles still agree to 1e-4: far positions differ between any
    # two float32 implementations, the full path's too)
    for offset in [0, 1, 2, 37, 300]:
        (x,) = arrays(rng, mx.float32, (2, 3, 1, 20))
        out = metile.ops.rope(x, 16, traditional=False, base=base, scale=0.5, offset=offset,
                              freqs=freqs, backend=backend)
        want = mx.fast.rope(x, 16, traditional=False, base=base, scale=0.5, offset=offset,
                            freqs=freqs)
        np.testing.assert_allclose(f64(out), f64(want), rtol=1e-4, atol=1e-4)
        functions.append(model_ops._rope_fn.cache_info().currsize)
    assert row_routes == ([] if backend == "mlx" else ["rope"])
    if backend == "metile":
        # one custom function for every replayed offset
        assert len(set(functions[1:])) == 1, functions
    # numbers other than a plain int take the full path, which names what it refuses
    out = metile.ops.rope(x, 16, traditional=False, base=base, scale=0.5,
                          offset=np.int64(9), freqs=freqs, backend=backend)
    want = mx.fast.rope(x, 16, traditional=False, base=base, scale=0.5, offset=9, freqs=freqs)
    np.testing.assert_allclose(f64(out), f64(want), rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="offset must be an int"):
        metile.ops.rope(x, 16, traditional=False, base=base, scale=0.5, offset=2.0,
                        freqs=freqs, backend=backend)
    g = mx.grad(lambda x: (metile.ops.rope(x, 16, traditional=False, base=base, scale=0.5,
                                           offset=5, freqs=freqs, backend=backend)
                           * mx.arange(20)).sum())(x)
    # the rotation's transpose of the weights: the rotation by the negated angle, in NumPy
    # (not MLX's gradient: under its CUDA backend, MLX 0.32.4's rope vjp at offset 5 of a
    # one-position x gave other values, which the backend="mlx" case shows there)
    weights = np.broadcast_to(np.arange(20, dtype=np.float64), x.shape)
    e = np_rope(weights, 16, False, base, -0.5, 5,
                None if freqs is None else np.array(freqs, np.float64))
    if backend != "metile" and mx.default_device().type == mx.gpu and mx.cuda.is_available():
        return   # (auto takes MLX's op there, and with it MLX's gradient, above)
    np.testing.assert_allclose(f64(g), e, rtol=1e-4, atol=1e-4)


def test_a_reloaded_module_keeps_the_table_the_ops_answer_from(rng):
    # the op entries hold the table they were made with; a reload made a new one, which
    # forget() and routing's decisions cleared while the ops kept replaying the old
    import importlib
    (a,) = arrays(rng, mx.float32, (4, 4))
    table = op_replay._REPLAYS
    importlib.reload(op_replay)
    assert op_replay._REPLAYS is table
    metile.ops.matmul(a, a)
    assert len(table) == 1
    op_replay.forget()
    assert len(table) == 0
