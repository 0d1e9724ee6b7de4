"""metile.ops / metile.nn: GEMM-backed ops on mx.arrays inside MLX models."""

import json
import math

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest

import metile.nn
import metile.ops as ops

TOL = {"float32": (3e-4, 3e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}


def np_act(z, activation, slope=0.01):  # MLX's leaky_relu default
    if activation is None:
        return z
    if activation == "relu":
        return np.maximum(z, 0)
    if activation == "leaky_relu":
        return np.where(z > 0, z, slope * z)
    if activation == "silu":
        return z / (1 + np.exp(-z))
    return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


def arrays(rng, shape, dtype):
    a = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, dtype))
    return a, np.array(a.astype(mx.float32)).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", [None, "relu", "leaky_relu", "gelu_tanh", "silu"])
def test_linear_against_numpy(rng, dtype, activation):
    x, xr = arrays(rng, (3, 7, 33), dtype)   # batched leading dims, ragged sizes
    w, wr = arrays(rng, (20, 33), dtype)     # (out, in) as MLX stores it
    y = ops.linear(x, w, activation=activation, backend="metile")
    assert y.shape == (3, 7, 20) and y.dtype == x.dtype
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), np_act(xr @ wr.T, activation),
                               rtol=rtol, atol=atol)


def test_linear_with_bias_and_matmul_epilogue(rng):
    x, xr = arrays(rng, (9, 65), "float32")
    w, wr = arrays(rng, (17, 65), "float32")
    b, br = arrays(rng, (17,), "float32")
    y = ops.linear(x, w, b, "relu", backend="metile")
    np.testing.assert_allclose(np.array(y), np.maximum(xr @ wr.T + br, 0), rtol=3e-4, atol=3e-5)
    m = ops.matmul(x, w.T, epilogue="silu", backend="metile")
    np.testing.assert_allclose(np.array(m), np_act(xr @ wr.T, "silu"), rtol=3e-4, atol=3e-5)


def test_repeated_calls_reuse_one_launch_with_new_arrays(rng):
    # the launcher's cache (ops._run launches through kernel[grid]): the same signature
    # reuses its Dispatch, each call on its own arrays; another signature (bias,
    # residual, activation) is another entry
    from metile_kernels.gemm import linear_epilogue
    linear_epilogue._launches.clear()
    w, wr = arrays(rng, (17, 40), "float32")
    b, br = arrays(rng, (17,), "float32")
    outs = []
    for _ in range(3):
        x, xr = arrays(rng, (9, 40), "float32")
        outs.append((ops.linear(x, w, b, "gelu_tanh", backend="metile"), xr))
    r, rr = arrays(rng, (9, 17), "float32")
    with_residual = ops.linear(x, w, b, "gelu_tanh", residual=r, backend="metile")
    for y, xr in outs:
        np.testing.assert_allclose(np.array(y), np_act(xr @ wr.T + br, "gelu_tanh"),
                                   rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(with_residual),
                               np_act(xr @ wr.T + br, "gelu_tanh") + rr, rtol=3e-4, atol=3e-5)
    assert len(linear_epilogue._launches) == 2
    # an input aliasing the output is impossible here: each call allocates its output
    assert outs[0][0] is not outs[1][0]


def test_gradients_against_numpy(rng):
    x, xr = arrays(rng, (6, 10), "float32")
    w, wr = arrays(rng, (5, 10), "float32")
    g, gr = arrays(rng, (6, 5), "float32")

    def loss(x, w):
        return (ops.linear(x, w, activation="relu", backend="metile") * g).sum()

    dx, dw = mx.grad(loss, argnums=(0, 1))(x, w)
    upstream = gr * (xr @ wr.T > 0)
    np.testing.assert_allclose(np.array(dx), upstream @ wr, rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(dw), upstream.T @ xr, rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("activation,slope", [("leaky_relu", 0.1), ("leaky_relu", 0.0),
                                              ("relu", 0.0)])
def test_gradient_at_a_zero_pre_activation_is_mlxs(activation, slope):
    # MLX's leaky_relu is max(slope * z, z): its derivative at z = 0 is 1 (metile's was the
    # slope, and 0 for a slope of 0); relu's is 0 there.  Rows of x that are zero give z = 0
    # in a bias-free layer (padding rows).
    x = mx.array(np.r_[np.zeros((2, 4)), np.ones((1, 4))].astype(np.float32))
    w = mx.array(np.array([[1.0, -2.0, 0.5, 0.25], [-1.0, 0.5, 0.0, 1.0]], np.float32))
    act = {"relu": nn.relu, "leaky_relu": lambda z: nn.leaky_relu(z, slope)}[activation]
    want = mx.grad(lambda x: act(x @ w.T).sum())(x)
    for backend in ("metile", "mlx"):
        got = mx.grad(lambda x: ops.linear(x, w, None, activation, backend=backend,
                                           negative_slope=slope).sum())(x)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, err_msg=backend)
        got = mx.grad(lambda x: ops.linear(x, w, mx.zeros((2,)), activation, backend=backend,
                                           negative_slope=slope).sum())(x)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, err_msg=backend)



@pytest.mark.parametrize("residual", [False, True])
def test_leaky_gradient_where_the_float16_output_underflows_to_minus_zero(residual):
    # A small negative z (|z| < ~6e-6 at slope 0.01) gives slope * z = -0.0 in a float16
    # output; its derivative is still the slope, as MLX's max(slope * z, z) gives it (the
    # backward read the output's sign with >= 0 and took 1, 100x the slope).
    z = np.array([-1e-6, -3e-6, -5e-6, -1e-5, 0.0, 1e-6, 2.0, -2.0], np.float32)
    x = mx.array(np.ones((1, 1), np.float32)).astype(mx.float16)
    w = mx.array(z[:, None]).astype(mx.float16)
    r = mx.zeros((1, z.size), mx.float16) if residual else None
    want = mx.grad(lambda w: nn.leaky_relu(x @ w.T).astype(mx.float32).sum())(w)
    for backend in ("metile", "mlx"):
        got = mx.grad(lambda w: ops.linear(x, w, None, "leaky_relu", residual=r,
                                           backend=backend).astype(mx.float32).sum())(w)
        np.testing.assert_array_equal(np.array(got.astype(mx.float32)),
                                      np.array(want.astype(mx.float32)), err_msg=backend)
        got = mx.grad(lambda w: ops.matmul(x, w.T, epilogue="leaky_relu", backend=backend)
                      .astype(mx.float32).sum())(w)
        np.testing.assert_array_equal(np.array(got.astype(mx.float32)),
                                      np.array(want.astype(mx.float32)), err_msg=backend)

def test_inside_compile_and_module(rng):
    layer = metile.nn.Linear(33, 20, activation="gelu_tanh", backend="metile")
    x, xr = arrays(rng, (4, 33), "float32")
    wr, br = np.array(layer.weight).astype(np.float64), np.array(layer.bias).astype(np.float64)
    expected = np_act(xr @ wr.T + br, "gelu_tanh")
    np.testing.assert_allclose(np.array(layer(x)), expected, rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(mx.compile(layer)(x)), expected, rtol=3e-4, atol=3e-5)


@pytest.mark.slow
def test_mlp_trains_like_the_mlx_mlp(rng):
    # The same 3-layer MLP built from metile.nn.Linear (kernel path) and from
    # mlx.nn.Linear, same initial weights, 20 SGD steps: losses agree.
    def mlp(make):
        return nn.Sequential(make(16, 32), nn.ReLU(), make(32, 32), nn.ReLU(), make(32, 1))

    mx.random.seed(0)
    reference = mlp(lambda i, o: nn.Linear(i, o))
    ours = mlp(lambda i, o: metile.nn.Linear(i, o, backend="metile"))
    ours.update(reference.parameters())
    x = mx.array(rng.standard_normal((64, 16)).astype(np.float32))
    y = mx.array(np.sin(np.array(x).sum(axis=1, keepdims=True)))

    def run(model):
        optimizer = optim.SGD(learning_rate=0.2)
        step = nn.value_and_grad(model, lambda m: ((m(x) - y) ** 2).mean())
        losses = []
        for _ in range(20):
            loss, grads = step(model)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)
            losses.append(loss.item())
        return losses

    ours_losses, ref_losses = run(ours), run(reference)
    np.testing.assert_allclose(ours_losses, ref_losses, rtol=1e-4, atol=1e-6)
    assert ours_losses[-1] < 0.8 * ours_losses[0]  # it actually trains


def test_explain_says_which_path_and_why(rng):
    x, _ = arrays(rng, (4, 8), "float32")
    w, _ = arrays(rng, (3, 8), "float32")
    auto = json.loads(ops.explain_linear(x, w, activation="relu"))
    if mx.default_device().type == mx.cpu:
        assert auto["path"] == "mlx_composite" and "emulator" in auto["reason"]
    assert auto["route"]["source"] in ("cost_model", "cache")
    forced = json.loads(ops.explain_linear(x, w, activation="relu", backend="metile"))
    assert forced["path"] == "metile_kernel"
    assert forced["route"]["source"] == "requested"
    small_f32 = ops.CUDA_F32_SMALL_BLOCK if ops._on_cuda() else ops.BLOCK
    assert forced["config"] == {**small_f32, "TRANSPOSE_B": True}   # the weight as stored
    assert forced["execution_report"]["epilogue_regions"] == 1
    with_bias = json.loads(ops.explain_linear(x, w, mx.zeros((3,)), "relu", backend="metile"))
    # bias and activation are one fused epilogue that reads the bias vector
    assert with_bias["execution_report"]["epilogue_regions"] == 1
    assert [r["buffer"] for r in with_bias["epilogue_reads"]] == ["bias"]


def test_metile_namespace_after_plain_import():
    import metile

    layer = metile.nn.Linear(4, 3)
    assert isinstance(layer, nn.Linear) and metile.ops.linear is ops.linear


@pytest.mark.parametrize("backend", ["metile", "auto", "mlx"])
def test_mixed_dtypes_promote_as_mlx(rng, backend):
    # (found by a hostile test: float16 x with a float32 weight was refused, even under
    # backend="mlx", where MLX promotes)
    x, xr = arrays(rng, (2, 5, 24), "float16")
    w, wr = arrays(rng, (12, 24), "float32")
    b, br = arrays(rng, (12,), "bfloat16")
    r, rr = arrays(rng, (2, 5, 12), "float32")
    rtol, atol = TOL["float32"]
    y = ops.matmul(x, w.T, backend=backend)
    assert y.dtype == (x @ w.T).dtype == mx.float32
    np.testing.assert_allclose(np.array(y), xr @ wr.T, rtol=rtol, atol=atol)
    y = ops.linear(x, w, b, "relu", residual=r, backend=backend)
    assert y.dtype == mx.float32
    np.testing.assert_allclose(np.array(y), np_act(xr @ wr.T + br, "relu") + rr, rtol=rtol,
                               atol=atol)
    g, gr = arrays(rng, (12, 24), "float16")
    y = ops.gated_mlp(x, g, w, backend=backend)
    assert y.dtype == mx.float32
    np.testing.assert_allclose(np.array(y), np_act(xr @ gr.T, "silu") * (xr @ wr.T),
                               rtol=rtol, atol=atol)
    # the gradient reaches each operand in its own dtype, as through MLX's promotion
    gx, gw = mx.grad(lambda x, w: ops.linear(x, w, backend=backend).sum(), argnums=(0, 1))(x, w)
    assert (gx.dtype, gw.dtype) == (mx.float16, mx.float32)
    np.testing.assert_allclose(np.array(gw), np.broadcast_to(xr.reshape(-1, 24).sum(0),
                                                             (12, 24)), rtol=rtol, atol=1e-3)


def test_bad_arguments():
    x = mx.zeros((4, 8))
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.linear(x, mx.zeros((3, 8)), activation="tanh")
    with pytest.raises(ValueError, match=r"inner dimensions differ: \(4, 8\) @ \(7, 3\)"):
        ops.matmul(x, mx.zeros((7, 3)))
    with pytest.raises(TypeError, match="dtype mlx.core.int32; supported"):
        ops.matmul(x.astype(mx.int32), mx.zeros((8, 3), mx.int32), backend="metile")
    # under "auto" what MLX's matmul says of integers (MLX's composite takes the call)
    with pytest.raises(ValueError, match=r"\[matmul\] Only inexact types are supported"):
        ops.matmul(x.astype(mx.int32), mx.zeros((8, 3), mx.int32))
    with pytest.raises(ValueError, match="bias shape"):
        ops.linear(x, mx.zeros((3, 8)), mx.zeros((4,)))
    with pytest.raises(ValueError, match="backend must be"):
        ops.matmul(x, mx.zeros((8, 3)), backend="cuda")
    with pytest.raises(ValueError, match="backend must be"):
        ops.linear(x, mx.zeros((3, 8)), backend="gpu")


def test_leaky_relu_slope_matches_mlx_and_is_a_parameter(rng):
    x, xr = arrays(rng, (8, 16), "float32")
    w, wr = arrays(rng, (12, 16), "float32")
    z = xr @ wr.T
    for backend in ("metile", "mlx"):
        y = ops.linear(x, w, activation="leaky_relu", backend=backend)
        np.testing.assert_allclose(np.array(y), np.array(nn.leaky_relu(x @ w.T)),
                                   rtol=3e-4, atol=3e-5)
        y = ops.linear(x, w, activation="leaky_relu", backend=backend, negative_slope=0.2)
        np.testing.assert_allclose(np.array(y), np.where(z > 0, z, 0.2 * z), rtol=3e-4, atol=3e-5)
    layer = metile.nn.Linear(16, 12, activation="leaky_relu", negative_slope=0.3, backend="metile")
    layer.weight = w
    zb = z + np.array(layer.bias)
    np.testing.assert_allclose(np.array(layer(x)), np.where(zb > 0, zb, 0.3 * zb),
                               rtol=3e-4, atol=3e-5)
    with pytest.raises(TypeError, match="negative_slope must be a number, got str"):
        metile.nn.Linear(4, 4, activation="leaky_relu", negative_slope="0.1")


def test_relu_keeps_nan_as_mlx_does(rng):
    # MLX's relu is mx.maximum(x, 0): a NaN stays NaN (the epilogue's maximum, Triton's,
    # gave 0 there)
    x, _ = arrays(rng, (4, 16), "float32")
    w, _ = arrays(rng, (6, 16), "float32")
    x[1, 3] = float("nan")
    want = np.array(nn.relu(x @ w.T))
    x2, _ = arrays(rng, (4, 16), "float32")
    wg, _ = arrays(rng, (6, 16), "float32")
    wg[2, 5] = float("nan")
    gated_want = np.array(nn.relu(x2 @ wg.T) * (x2 @ w.T))
    for backend in ("metile", "mlx"):
        np.testing.assert_allclose(np.array(ops.linear(x, w, activation="relu", backend=backend)),
                                   want, rtol=3e-4, atol=3e-5)
        np.testing.assert_allclose(np.array(ops.matmul(x, w.T, epilogue="relu",
                                                       backend=backend)),
                                   want, rtol=3e-4, atol=3e-5)
        # a NaN in the gate's product only: relu must keep it for the up product to meet
        got = np.array(ops.gated_mlp(x2, wg, w, activation="relu", backend=backend))
        np.testing.assert_allclose(got, gated_want, rtol=3e-4, atol=3e-5)
    assert np.isnan(want[1]).all() and np.isnan(gated_want[:, 2]).all()


@pytest.mark.parametrize("activation", [None, "relu", "leaky_relu", "gelu_tanh", "silu"])
def test_quantize_keeps_the_activation(rng, activation):
    model = nn.Sequential(metile.nn.Linear(64, 32, activation=activation, backend="mlx"))
    x, _ = arrays(rng, (5, 64), "float32")
    nn.quantize(model, group_size=32, bits=8)
    layer = model.layers[0]
    assert isinstance(layer, nn.QuantizedLinear)
    # reference: MLX's own quantized product, then the activation in NumPy
    q = mx.quantized_matmul(x, layer.weight, layer.scales, layer.biases, transpose=True,
                            group_size=32, bits=8) + layer.bias
    np.testing.assert_allclose(np.array(model(x)), np_act(np.array(q).astype(np.float64), activation),
                               rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("backend", ["auto", "mlx", "metile"])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_quantize_keeps_the_backend(rng, backend, activation):
    # (a helper finding: after convert(backend="metile") nn.quantize gave backend "auto")
    model = nn.Sequential(metile.nn.Linear(64, 32, activation=activation, backend=backend))
    nn.quantize(model, group_size=32, bits=4)
    layer = model.layers[0]
    assert isinstance(layer, nn.QuantizedLinear)
    if activation is None and backend == "auto":
        assert type(layer) is nn.QuantizedLinear      # MLX's own layer, as before
    else:
        assert isinstance(layer, metile.nn.QuantizedLinear) and layer.backend == backend
    x, _ = arrays(rng, (3, 64), "float32")
    q = mx.quantized_matmul(x, layer.weight, layer.scales, layer.biases, transpose=True,
                            group_size=32, bits=4) + layer.bias
    np.testing.assert_allclose(np.array(model(x)), np_act(np.array(q).astype(np.float64),
                                                          activation), rtol=3e-4, atol=3e-5)


def test_quantize_input_with_activation_is_refused():
    layer = metile.nn.Linear(64, 32, activation="relu")
    with pytest.raises(ValueError, match="quantize_input=True is not supported for a layer with "
                                         "activation='relu'"):
        layer.to_quantized(mode="nvfp4", quantize_input=True)


def test_an_array_slope_is_refused_not_detached(rng):
    # (a 0-d mx.array slope became a float: silently no gradient where MLX's leaky_relu has
    # one); metile.nn.convert still fuses LeakyReLU(mx.array(...)), whose slope is a constant
    x, _ = arrays(rng, (5, 7), "float32")
    w, _ = arrays(rng, (7, 6), "float32")
    for backend in ("auto", "mlx", "metile"):
        with pytest.raises(TypeError, match="an mx.array slope would get no gradient here"):
            ops.matmul(x, w, epilogue="leaky_relu", negative_slope=mx.array(0.3), backend=backend)
