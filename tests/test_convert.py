"""metile.nn.convert: swapping mlx.nn.Linear layers of an existing model in place."""

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

import metile
import metile.nn as mnn


class Block(nn.Module):
    """A transformer-like block: attention projections without bias, a LayerNorm, an
    MLP as nn.Sequential(Linear, GELU(tanh), Linear), an Embedding and a quantized head."""

    def __init__(self, vocab=11, dims=32, hidden=48):
        super().__init__()
        self.embed = nn.Embedding(vocab, dims)
        self.norm = nn.LayerNorm(dims)
        self.q = nn.Linear(dims, dims, bias=False)
        self.k = nn.Linear(dims, dims, bias=False)
        self.v = nn.Linear(dims, dims, bias=False)
        self.o = nn.Linear(dims, dims, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dims, hidden), nn.GELU(approx="precise"),
                                 nn.Linear(hidden, dims))
        self.gate = nn.Sequential(nn.Linear(dims, dims), nn.LeakyReLU(0.2), nn.Linear(dims, dims),
                                  nn.LeakyReLU(3.0))
        self.head = nn.QuantizedLinear(dims, 32, group_size=32, bits=8)
        self.out = nn.Linear(32, vocab)

    def __call__(self, tokens):
        h = self.norm(self.embed(tokens))
        q, k, v = self.q(h), self.k(h), self.v(h)
        scores = (q @ k.swapaxes(-1, -2)) / q.shape[-1] ** 0.5
        h = h + self.o(mx.softmax(scores, axis=-1) @ v)
        h = h + self.mlp(h) + self.gate(h)
        return self.out(nn.silu(self.head(h)))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.SiLU(),
                         nn.Linear(32, 1))


def twins(make):
    mx.random.seed(0)
    reference, model = make(), make()
    model.update(reference.parameters())
    mx.eval(reference.parameters())
    return reference, model


def tokens(rng):
    return mx.array(rng.integers(0, 11, size=(2, 7)).astype(np.int32))


def test_report_names_what_was_converted_fused_and_skipped():
    _, model = twins(Block)
    report = mnn.convert(model)
    assert sorted(report.converted) == ["gate.layers.0", "gate.layers.2", "head", "k",
                                        "mlp.layers.0", "mlp.layers.2", "norm", "o", "out", "q",
                                        "v"]
    assert report.fused == {"mlp.layers.1": "mlp.layers.0", "gate.layers.1": "gate.layers.0"}
    assert report.skipped == {
        "embed": "not an mlx.nn.Linear (Embedding)",
        "gate.layers.3": "LeakyReLU(negative_slope=3.0) is fused only for slopes in [0, 1]; it "
                         "runs as its own module"}
    assert isinstance(model.head, mnn.QuantizedLinear)   # quantized_ops.py
    assert isinstance(model.mlp.layers[0], mnn.Linear)
    assert model.mlp.layers[0].activation == "gelu_tanh"
    assert model.gate.layers[0].activation == "leaky_relu"
    assert model.gate.layers[0].negative_slope == 0.2
    assert isinstance(model.mlp.layers[1], nn.Identity)
    assert isinstance(model.norm, mnn.LayerNorm)   # nn_norms.py
    assert "fused mlp.layers.1 into mlp.layers.0" in str(report)
    again = mnn.convert(model)
    assert again.converted == {} and again.skipped["q"] == "already a metile.nn.Linear"


@pytest.mark.parametrize("backend", ["auto", "metile"])
def test_logits_and_parameters_match_the_unconverted_model(rng, backend):
    reference, model = twins(Block)
    keys = [k for k, _ in tree_flatten(model.parameters())]
    weight = model.q.weight
    mnn.convert(model, backend=backend)
    assert [k for k, _ in tree_flatten(model.parameters())] == keys
    assert model.q.weight is weight   # the same array, not a copy
    t = tokens(rng)
    expected = np.array(reference(t)).astype(np.float64)
    np.testing.assert_allclose(np.array(model(t)), expected, rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(mx.compile(model)(t)), expected, rtol=3e-4, atol=3e-5)


def test_save_and_load_weights_roundtrip(rng, tmp_path):
    reference, model = twins(Block)
    mnn.convert(model)
    path = str(tmp_path / "w.safetensors")
    model.save_weights(path)
    fresh = Block()
    fresh.load_weights(path)               # the unconverted class loads converted weights
    t = tokens(rng)
    np.testing.assert_allclose(np.array(fresh(t)), np.array(reference(t)), rtol=3e-4, atol=3e-5)
    other = Block()
    mnn.convert(other)
    other.load_weights(path)               # and a converted model loads them too
    np.testing.assert_allclose(np.array(other(t)), np.array(reference(t)), rtol=3e-4, atol=3e-5)


def training_losses(model, optimizer, loss, steps):
    """The losses of `steps` optimizer steps on `model` (evaluated each step)."""
    step = nn.value_and_grad(model, loss)
    losses = []
    for _ in range(steps):
        value, grads = step(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)
        losses.append(value.item())
    return losses


@pytest.mark.parametrize("backend", ["auto", "metile"])
def test_training_gives_the_losses_of_the_unconverted_model(rng, backend):
    reference, model = twins(mlp)
    report = mnn.convert(model, backend=backend)
    assert report.fused == {"layers.1": "layers.0", "layers.3": "layers.2"}
    x = mx.array(rng.standard_normal((32, 16)).astype(np.float32))
    y = mx.array(np.sin(np.array(x).sum(axis=1, keepdims=True)))

    def run(m):
        return training_losses(m, optim.SGD(learning_rate=0.1),
                               lambda m: ((m(x) - y) ** 2).mean(), steps=5)

    ours, theirs = run(model), run(reference)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    assert ours[-1] < ours[0]


def test_class_predicate_and_frozen_parameters():
    _, model = twins(mlp)
    model.layers[2].freeze()
    report = mnn.convert(model, class_predicate=lambda path, m: path != "layers.4")
    assert report.skipped["layers.4"] == "class_predicate returned False"
    assert type(model.layers[4]) is nn.Linear
    assert model.layers[2].activation == "silu"
    trainable = [k for k, _ in tree_flatten(model.trainable_parameters())]
    assert "layers.2.weight" not in trainable and "layers.0.weight" in trainable


def test_functions_in_a_sequential_are_fused(rng):
    reference, model = twins(lambda: nn.Sequential(nn.Linear(8, 8), nn.relu, nn.Linear(8, 4),
                                                   nn.gelu_approx))
    report = mnn.convert(model)
    assert report.fused == {"layers.1": "layers.0", "layers.3": "layers.2"}
    x = mx.array(rng.standard_normal((5, 8)).astype(np.float32))
    np.testing.assert_allclose(np.array(model(x)), np.array(reference(x)), rtol=3e-4, atol=3e-5)


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"model must be an mlx.nn.Module, got list"):
        mnn.convert([nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="backend must be 'auto', 'metile' or 'mlx', got 'gpu'"):
        mnn.convert(mlp(), backend="gpu")
    with pytest.raises(ValueError, match="is itself a Linear"):
        mnn.convert(nn.Linear(2, 2))
    layer = metile.nn.Linear.from_linear(nn.Linear(3, 2, bias=False), "relu")
    assert "bias" not in layer and layer.activation == "relu"


# -- what a hostile test found (each left the converted model computing something else) ------

class ClippedReLU(nn.ReLU):
    def __call__(self, x):
        return mx.minimum(nn.relu(x), 0.5)


class ParallelSum(nn.Sequential):
    """A Sequential subclass whose layers do not run one after another."""

    def __call__(self, x):
        return sum(layer(x) for layer in self.layers)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = self.dec = nn.Linear(8, 8)
        self.mlp = nn.Sequential(self.enc, nn.ReLU())

    def __call__(self, x):
        return self.dec(self.mlp(x)) + self.enc(x)


def _twins(make, seed=3):
    mx.random.seed(seed)
    a = make()
    b = make()
    b.update(a.parameters())
    return a, b


@pytest.mark.parametrize("make,skipped", [
    (lambda: nn.Sequential(nn.Linear(8, 8), ClippedReLU()), "ClippedReLU subclasses mlx.nn.ReLU"),
    (lambda: ParallelSum(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), "not an mlx.nn.Linear"),
])
def test_only_what_runs_in_order_as_the_plain_activation_is_fused(rng, make, skipped):
    ref, model = _twins(make)
    report = mnn.convert(model)
    assert not report.fused and skipped in str(report)
    x = mx.array(rng.standard_normal((3, 8)).astype(np.float32))
    np.testing.assert_allclose(np.array(model(x)), np.array(ref(x)), rtol=1e-5, atol=1e-6)


def test_a_module_held_twice_stays_one_layer(rng):
    ref, model = _twins(Tied)
    report = mnn.convert(model)
    assert model.enc is model.dec is model.mlp.layers[0]
    assert isinstance(model.enc, mnn.Linear) and model.enc.activation is None
    assert not report.fused        # the Linear runs without the ReLU at the other paths
    x = mx.array(rng.standard_normal((4, 8)).astype(np.float32))

    def loss(m):
        return (m(x) ** 2).mean()

    for m in (ref, model):
        opt = optim.Adam(learning_rate=0.05)
        step = nn.value_and_grad(m, loss)
        for _ in range(3):
            value, grads = step(m)
            opt.update(m, grads)
        m.final = float(value)
    assert model.final == pytest.approx(ref.final, rel=1e-5)
    np.testing.assert_allclose(np.array(model.dec.weight), np.array(ref.dec.weight), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("backend", ["auto", "metile"])
def test_a_float32_input_into_a_float16_model_promotes_as_mlx(rng, backend):
    ref, model = _twins(lambda: nn.Sequential(nn.Linear(8, 4), nn.SiLU()))
    for m in (ref, model):
        m.set_dtype(mx.float16)
    mnn.convert(model, backend=backend)
    x = mx.array(rng.standard_normal((2, 8)).astype(np.float32))
    got, want = model(x), ref(x)
    assert got.dtype == want.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)


def test_layers_the_kernels_cannot_run_are_skipped():
    model = nn.Sequential(nn.Linear(4, 0), nn.LayerNorm(4), nn.RMSNorm(4))
    with mx.stream(mx.cpu):   # float64 arrays exist only on the CPU (MLX's GPUs refuse them)
        model.layers[1].set_dtype(mx.float64)
        model.layers[2].set_dtype(mx.float64)
    report = mnn.convert(model, backend="metile")
    assert "weight shape (0, 4) has no elements" in report.skipped["layers.0"]
    assert "float64" in report.skipped["layers.1"] and "float64" in report.skipped["layers.2"]


# -- a second hostile test (twenty-eighth session) -----------------------------------------------

def test_shapeless_compile_follows_the_input_shape(rng):
    # the MLX path reshaped x to its rows and the result back: under
    # mx.compile(shapeless=True) those reshapes kept the traced shape, so a converted model
    # returned the first call's shape (same element count) or failed to reshape (another)
    ref, model = _twins(lambda: nn.Sequential(nn.Linear(16, 8, bias=False)))
    mnn.convert(model)
    mx.eval(ref.parameters(), model.parameters())   # (shapeless: no lazy initialisers)
    w, w2 = (mx.array(rng.standard_normal((8, 16)).astype(np.float32)) for _ in range(2))
    fns = {"model": (mx.compile(model, shapeless=True), mx.compile(ref, shapeless=True)),
           "gated_mlp": (mx.compile(lambda x: metile.ops.gated_mlp(x, w, w2), shapeless=True),
                         mx.compile(lambda x: nn.silu(x @ w.T) * (x @ w2.T), shapeless=True)),
           "matmul": (mx.compile(lambda x: metile.ops.matmul(x, w.T), shapeless=True),
                      mx.compile(lambda x: x @ w.T, shapeless=True))}
    for name, (ours, theirs) in fns.items():
        for shape in [(2, 3, 16), (3, 2, 16), (1, 6, 16), (5, 7, 16)]:
            x = mx.array(rng.standard_normal(shape).astype(np.float32))
            got, want = ours(x), theirs(x)
            assert got.shape == want.shape == (*shape[:-1], 8), (name, shape, got.shape)
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_layers_that_are_not_linears_are_refused_by_name():
    with pytest.raises(TypeError, match="layer must be an mlx.nn.Linear, got QuantizedLinear; "
                                        "use metile.nn.QuantizedLinear.from_quantized"):
        mnn.Linear.from_linear(nn.QuantizedLinear(64, 32))
    for model, use in ((nn.QuantizedLinear(64, 32), "QuantizedLinear.from_quantized"),
                       (nn.RMSNorm(8), "RMSNorm.from_module"),
                       (nn.LayerNorm(8), "LayerNorm.from_module")):
        with pytest.raises(ValueError, match=f"is itself a {type(model).__name__} .*metile.nn.{use}"):
            mnn.convert(model)


@pytest.mark.parametrize("bits, mode", [(3, "affine"), (2, "affine"), (None, "mxfp4")])
def test_quantizing_a_metile_model_keeps_mlx_op_where_the_kernels_cannot(rng, bits, mode):
    # nn.quantize after convert(backend="metile") built layers that refused to run
    ref, model = _twins(lambda: nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 64)))
    mnn.convert(model, backend="metile")
    kw = dict(group_size=32 if mode == "mxfp4" else 64, bits=bits, mode=mode)
    nn.quantize(model, **kw)
    nn.quantize(ref, **kw)
    x = mx.array(rng.standard_normal((2, 128)).astype(np.float32))
    np.testing.assert_allclose(np.array(model(x)), np.array(ref(x)), rtol=1e-5, atol=1e-5)


def test_numpy_numbers_and_array_slopes_are_taken(rng):
    layer = mnn.Linear(np.int64(4), np.int32(3), activation="leaky_relu",
                       negative_slope=np.float32(0.25))
    assert (layer.weight.shape, layer.negative_slope) == ((3, 4), 0.25)
    with pytest.raises(TypeError, match="input_dims must be an int, got float"):
        mnn.Linear(4.0, 3)
    with pytest.raises(ValueError, match="output_dims must be a positive int, got -3"):
        mnn.Linear(4, -3)
    for slope in (mx.array(0.2),):   # (MLX's own LeakyReLU cannot run a NumPy slope)
        ref, model = _twins(lambda: nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(slope)))
        report = mnn.convert(model)
        assert len(report.fused) == 1, str(report)
        x = mx.array(rng.standard_normal((3, 8)).astype(np.float32))
        np.testing.assert_allclose(np.array(model(x)), np.array(ref(x)), rtol=1e-5, atol=1e-6)


# -- hostile tests (twenty-ninth session) ---------------------------------------------------

class TiedNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = self.b = nn.Linear(8, 8)
        self.n1 = self.n2 = nn.RMSNorm(8)

    def __call__(self, x):
        return self.n2(self.b(nn.relu(self.a(self.n1(x)))))


@pytest.mark.parametrize("refused,kept", [("a", True), ("b", False), ("n1", True)])
def test_a_tied_layer_stays_one_object_when_the_predicate_refuses_one_path(rng, refused, kept):
    # (a layer refused at its first path was judged again at its second and converted there:
    # two objects, and training drifted from the unconverted model's)
    ref, model = _twins(TiedNorm)
    report = mnn.convert(model, class_predicate=lambda path, m: path != refused)
    assert model.a is model.b and model.n1 is model.n2
    if refused in ("a", "b"):
        assert isinstance(model.a, mnn.Linear) is not kept
        if kept:
            assert report.skipped == {"a": "class_predicate returned False",
                                      "b": "the same layer is kept at another path"}
    else:
        assert not isinstance(model.n1, mnn.RMSNorm)
    x = mx.array(rng.standard_normal((4, 8)).astype(np.float32))
    y = mx.array(rng.standard_normal((4, 8)).astype(np.float32))
    losses = []
    for m in (ref, model):
        opt, step = optim.SGD(0.1), nn.value_and_grad(m, lambda m: nn.losses.mse_loss(m(x), y))
        for _ in range(3):
            value, grads = step(m)
            opt.update(m, grads)
            mx.eval(m.parameters())
        losses.append(float(value))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_a_bias_of_rows_is_skipped_and_a_vector_bias_of_any_shape_converted(rng):
    # (convert took a (3, N) bias MLX's addmm broadcasts, and the converted layer then raised)
    model = nn.Sequential(nn.Linear(8, 4))
    model.layers[0].bias = mx.array(rng.standard_normal((3, 4)).astype(np.float32))
    x = mx.array(rng.standard_normal((3, 8)).astype(np.float32))
    want = np.asarray(model(x))
    report = mnn.convert(model, backend="metile")
    assert report.skipped == {"layers.0": "bias shape (3, 4) is not one vector of the 4 output "
                                          "features"}
    np.testing.assert_allclose(np.asarray(model(x)), want, rtol=1e-6)
    for shape in ((1, 4), (), (1,), (1, 1)):
        # (a (1, N) bias set after convert raised "does not match 4 output features")
        model = nn.Sequential(nn.Linear(8, 4))
        mnn.convert(model, backend="metile")
        model.layers[0].bias = mx.array(rng.standard_normal(shape).astype(np.float32))
        ref = nn.Linear(8, 4)
        ref.update(model.layers[0].parameters())
        np.testing.assert_allclose(np.asarray(model(x)), np.asarray(ref(x)), rtol=1e-5,
                                   atol=1e-6)
        grads = [mx.grad(lambda p, m=m: (m.update(p) or m)(x).sum())(m.trainable_parameters())
                 for m in (model.layers[0], ref)]
        np.testing.assert_allclose(np.asarray(grads[0]["bias"]), np.asarray(grads[1]["bias"]),
                                   rtol=1e-5)
        assert grads[0]["bias"].shape == shape


def test_what_a_user_attached_to_a_linear_is_kept(tmp_path):
    # (convert kept only weight and bias: an attached array left parameters() and
    # load_weights refused the saved file)
    model = nn.Sequential(nn.Linear(8, 8))
    model.layers[0].scale = mx.ones((8,))
    model.layers[0].name_tag = "projection"
    model.save_weights(str(tmp_path / "w.safetensors"))
    mnn.convert(model)
    assert isinstance(model.layers[0], mnn.Linear) and model.layers[0].name_tag == "projection"
    assert sorted(k for k, _ in tree_flatten(model.parameters())) == \
        ["layers.0.bias", "layers.0.scale", "layers.0.weight"]
    model.load_weights(str(tmp_path / "w.safetensors"))


def test_convert_draws_nothing_from_the_global_random_key():
    # (each converted layer was built by its class's __init__, which drew an initialisation
    # and threw it away: after the same mx.random.seed, a converted model's dropout masks and
    # every later draw differed from the unconverted model's)
    def later_draw(convert):
        mx.random.seed(1)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(64, 4))
        quantized = nn.Sequential(nn.Linear(64, 64))
        nn.quantize(quantized)
        mx.random.seed(3)
        if convert:
            assert len(mnn.convert(model).converted) == 2
            assert len(mnn.convert(quantized).converted) == 1
        return np.array(mx.random.normal((4,)))
    np.testing.assert_array_equal(later_draw(True), later_draw(False))


def test_report_names_a_tied_layers_activation_only_where_one_follows():
    # (a tied Linear followed by another Linear, or by Dropout, was reported as skipping
    # that module as "its activation")
    tied = nn.Linear(8, 8)
    model = nn.Sequential(tied, nn.Linear(8, 8), nn.ReLU(), tied, nn.Dropout(0.1))
    report = mnn.convert(model)
    assert set(report.converted) == {"layers.0", "layers.1", "layers.3"}
    assert report.fused == {"layers.2": "layers.1"}
    assert report.skipped == {"layers.4": "not an mlx.nn.Linear (Dropout)"}
    tied = nn.Linear(8, 8)
    report = mnn.convert(nn.Sequential(tied, nn.ReLU(), tied))
    assert report.skipped == {"layers.1": "layers.0 is held at more than one place; its "
                                          "activation runs as its own module"}


def test_quantized_layer_takes_an_integer_x_under_every_backend():
    # (metile.nn.Linear runs MLX's composite for an x of another dtype; the quantized layer
    # under backend="metile" raised a TypeError for an int x, which MLX's layer takes)
    mx.random.seed(0)
    q = nn.QuantizedLinear(64, 32)
    x = mx.arange(128).reshape(2, 64).astype(mx.int32)
    for backend in ("metile", "auto", "mlx"):
        layer = mnn.QuantizedLinear.from_quantized(q, backend=backend)
        np.testing.assert_array_equal(np.array(layer(x)), np.array(q(x)))


@pytest.mark.parametrize("dtype", ["int32", "uint8", "float64"])
def test_norm_layers_take_what_mlx_layers_take_under_every_backend(dtype):
    # (an int or float64 x raised "x has dtype ..." under backend="metile", where the mlx.nn
    # layers promote it; the norm layers now hand it to MLX's layer, as metile.nn.Linear does)
    x = mx.arange(-8, 16).reshape(3, 8).astype(getattr(mx, dtype))
    for layer in (nn.RMSNorm(8), nn.LayerNorm(8)):
        layer.update({k: mx.arange(1, 9).astype(mx.float32) / 4 for k in layer.parameters()})
        with mx.stream(mx.cpu):      # (float64 runs on MLX's CPU stream only)
            want = layer(x)
        xs = np.array(x.astype(mx.float32) if dtype == "float64" else x).astype(np.float64)
        w = np.arange(1, 9) / 4
        if isinstance(layer, nn.RMSNorm):
            ref = xs / np.sqrt((xs ** 2).mean(-1, keepdims=True) + 1e-5) * w
        else:
            centred = xs - xs.mean(-1, keepdims=True)
            ref = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) * w + w
        for backend in ("metile", "auto", "mlx"):
            model = nn.Sequential(layer)
            mnn.convert(model, backend=backend)
            with mx.stream(mx.cpu):
                got = model(x)
            assert got.dtype == want.dtype
            np.testing.assert_allclose(np.array(got), ref, rtol=1e-5, atol=1e-5)
