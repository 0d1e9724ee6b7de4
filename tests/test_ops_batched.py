"""metile.ops.matmul / linear and metile.nn.Linear on batched (3-D and higher) and 1-D
operands: MLX's matmul semantics (broadcast batch dimensions, 1-D promotion), the
flattened and batched kernel paths, gradients, routing keys and errors."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import metile.nn
import metile.ops as ops
from metile import lazy_graph, matmul_shapes
from metile.runtime import routing
from test_ops import TOL, np_act

def arrays(rng, shape, dtype="float32"):
    a = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, dtype))
    return a, np.array(a.astype(mx.float32)).astype(np.float64)


def check(y, expected, dtype):
    assert y.shape == expected.shape and y.dtype == getattr(mx, dtype)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), expected, rtol=rtol, atol=atol)


# (a shape, b shape, flattened into one GEMM?)
SHAPES = [
    ((3, 7, 33), (33, 20), True),           # the model's (B, T, K) @ (K, N)
    ((2, 3, 9, 17), (1, 1, 17, 5), True),   # b's batch all of extent 1
    ((65, 17), (3, 17, 9), False),          # a 2-D, b batched: a shared (stride 0)
    ((3, 7, 33), (3, 33, 20), False),       # both batched
    ((1, 9, 16), (4, 16, 63), False),       # a batch 1 broadcast
    ((4, 9, 16), (1, 16, 63), True),        # b batch 1 broadcast
    ((2, 1, 7, 33), (1, 3, 33, 20), False),  # partial broadcast on both sides
    ((33,), (33, 20), True),                # 1-D a
    ((5, 33), (33,), True),                 # 1-D b
    ((33,), (33,), True),                   # vector dot: a 0-d result
    ((9,), (2, 9, 5), False),               # 1-D a against a batched b
    ((2, 3, 4, 5), (5,), True),
]


@pytest.mark.parametrize("sa,sb,flat", SHAPES, ids=[f"{a}@{b}" for a, b, _ in SHAPES])
def test_matmul_matches_numpy_semantics(rng, sa, sb, flat):
    a, ar = arrays(rng, sa)
    b, br = arrays(rng, sb)
    p = matmul_shapes.plan(sa, sb)
    assert p.flattened is flat
    expected = np.matmul(ar, br)
    assert p.out_shape == expected.shape
    for backend in ("metile", "auto", "mlx"):
        check(ops.matmul(a, b, epilogue="relu", backend=backend), np.maximum(expected, 0),
              "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", [None, "leaky_relu", "gelu_tanh", "silu"])
def test_batched_kernel_with_epilogues_and_dtypes(rng, dtype, activation):
    a, ar = arrays(rng, (3, 65, 17), dtype)
    b, br = arrays(rng, (3, 17, 9), dtype)
    y = ops.matmul(a, b, epilogue=activation, negative_slope=0.2, backend="metile")
    check(y, np_act(ar @ br, activation, 0.2), dtype)
    info = json.loads(ops.explain_matmul(a, b, epilogue=activation, backend="metile"))
    assert info["path"] == "metile_kernel"
    assert info["batch"] == {"shape": [3], "how": "batched kernel, shared operands: none"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_broadcast_batches_in_16_bit(rng, dtype):
    a, ar = arrays(rng, (7, 33), dtype)
    b, br = arrays(rng, (2, 3, 33, 20), dtype)
    check(ops.matmul(a, b, epilogue="silu", backend="metile"), np_act(ar @ br, "silu"), dtype)
    a, ar = arrays(rng, (2, 1, 7, 33), dtype)
    b, br = arrays(rng, (3, 33, 20), dtype)
    check(ops.matmul(a, b, backend="metile"), ar @ br, dtype)


def test_shared_operand_is_not_copied_per_batch(rng):
    # a 2-D against a batched b: the kernel reads a once per batch index through a batch
    # stride of 0; the graph holds no broadcast of a.
    a, _ = arrays(rng, (7, 33))
    b, _ = arrays(rng, (4, 33, 20))
    a3, b3 = matmul_shapes.batched(a, b, matmul_shapes.plan(a.shape, b.shape))
    assert a3.shape == (1, 7, 33) and b3.shape == (4, 33, 20)
    g = lazy_graph.graph(ops.matmul(a, b, backend="metile"))
    # no Broadcast at all: none of a, and none for the output buffer (the kernel's batched
    # store is proven to write all of it - passes/buffer_usage.py - so the passed mx.zeros is
    # never read, never filled)
    assert g.count("Broadcast") == 0 and g.count("Full") == 0
    # a batch broadcasting only in part is expanded to the full batch (documented copy)
    a, _ = arrays(rng, (2, 1, 7, 33))
    b, _ = arrays(rng, (1, 3, 33, 20))
    a3, b3 = matmul_shapes.batched(a, b, matmul_shapes.plan(a.shape, b.shape))
    assert a3.shape == (6, 7, 33) and b3.shape == (6, 33, 20)
    g = lazy_graph.graph(ops.matmul(a, b, backend="metile"))
    assert g.count("Broadcast") == 2 and g.count("Full") == 0


def test_zero_sized_batches(rng):
    a, _ = arrays(rng, (0, 7, 33))
    b, _ = arrays(rng, (33, 20))
    assert ops.matmul(a, b, backend="metile").shape == (0, 7, 20)
    b, _ = arrays(rng, (0, 33, 20))
    assert ops.matmul(a[:, :, :], b, backend="metile").shape == (0, 7, 20)
    a, _ = arrays(rng, (7, 33))
    assert ops.matmul(a, b, backend="metile").shape == (0, 7, 20)
    a, b = mx.zeros((2, 4, 0)), mx.zeros((2, 0, 5))
    np.testing.assert_array_equal(np.array(ops.matmul(a, b, backend="metile")),
                                  np.zeros((2, 4, 5), np.float32))


def test_strided_operands(rng):
    # a transposed 3-D view and a sliced batch are read correctly (copied to row-major)
    a, ar = arrays(rng, (3, 33, 7))
    b, br = arrays(rng, (6, 33, 20))
    y = ops.matmul(a.swapaxes(1, 2), b[::2], backend="metile")
    check(y, ar.transpose(0, 2, 1) @ br[::2], "float32")
    w, wr = arrays(rng, (20, 33))
    y = ops.matmul(a.swapaxes(1, 2), w.T, backend="metile")   # flattened, w read in place
    check(y, ar.transpose(0, 2, 1) @ wr.T, "float32")


def _grads(fn, a, b, g):
    return mx.grad(lambda a, b: (fn(a, b) * g).sum(), argnums=(0, 1))(a, b)


@pytest.mark.parametrize("sa,sb", [((3, 7, 9), (9, 5)), ((7, 9), (3, 9, 5)), ((3, 7, 9), (3, 9, 5)),
                                   ((1, 7, 9), (3, 9, 5)), ((2, 1, 7, 9), (1, 3, 9, 5)),
                                   ((9,), (2, 9, 5)), ((3, 7, 9), (9,))])
@pytest.mark.parametrize("epilogue", [None, "gelu_tanh"])
def test_matmul_gradients_match_mlx(rng, sa, sb, epilogue):
    a, _ = arrays(rng, sa)
    b, _ = arrays(rng, sb)
    g, _ = arrays(rng, np.matmul(np.zeros(sa), np.zeros(sb)).shape)

    def ours(a, b):
        return ops.matmul(a, b, epilogue=epilogue, backend="metile")

    def theirs(a, b):
        z = a @ b
        return z if epilogue is None else ops.activate(z, epilogue)

    for got, want in zip(_grads(ours, a, b, g), _grads(theirs, a, b, g)):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=3e-4, atol=3e-5)


# -- linear / nn.Linear -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_on_any_rank(rng, dtype):
    w, wr = arrays(rng, (20, 33), dtype)
    bias, biasr = arrays(rng, (20,), dtype)
    for shape in [(33,), (7, 33), (2, 7, 33), (2, 3, 5, 33)]:
        x, xr = arrays(rng, shape, dtype)
        r, rr = arrays(rng, (*shape[:-1], 20), dtype)
        y = ops.linear(x, w, bias, "gelu_tanh", residual=r, backend="metile")
        check(y, np_act(xr @ wr.T + biasr, "gelu_tanh") + rr, dtype)


def test_linear_gradients_on_3d_inputs_match_mlx(rng):
    x, _ = arrays(rng, (2, 7, 33))
    w, _ = arrays(rng, (20, 33))
    bias, _ = arrays(rng, (20,))
    r, _ = arrays(rng, (2, 7, 20))
    g, _ = arrays(rng, (2, 7, 20))

    def loss(fn):
        return mx.grad(lambda *p: (fn(*p) * g).sum(), argnums=(0, 1, 2, 3))(x, w, bias, r)

    ours = loss(lambda x, w, b, r: ops.linear(x, w, b, "silu", residual=r, backend="metile"))
    theirs = loss(lambda x, w, b, r: nn.silu(x @ w.T + b) + r)
    for got, want in zip(ours, theirs):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("backend", ["metile", "auto"])
def test_nn_linear_on_3d_input_equals_mlx_linear(rng, backend):
    reference = nn.Linear(64, 48)
    ours = metile.nn.Linear.from_linear(reference, backend=backend)
    x, _ = arrays(rng, (2, 7, 64))
    expected = np.array(reference(x))
    np.testing.assert_allclose(np.array(ours(x)), expected, rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(mx.compile(ours)(x)), expected, rtol=3e-4, atol=3e-5)


def test_convert_model_with_3d_activations(rng):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Sequential(nn.Linear(32, 48), nn.SiLU())
            self.down = nn.Linear(48, 32)

        def __call__(self, x):
            return x + self.down(self.up(x))

    mx.random.seed(0)
    reference, model = Block(), Block()
    model.update(reference.parameters())
    report = metile.nn.convert(model, backend="metile")
    assert sorted(report.converted) == ["down", "up.layers.0"]
    x, _ = arrays(rng, (2, 7, 32))
    np.testing.assert_allclose(np.array(model(x)), np.array(reference(x)), rtol=3e-4, atol=3e-5)


# -- routing ------------------------------------------------------------------------------------

def test_batched_calls_have_their_own_routing_key(rng, tmp_path, monkeypatch):
    monkeypatch.setattr(routing, "routing_dir", lambda: tmp_path / "routing")
    routing.clear_memory()
    key = lambda *args, **kw: ops._signature("matmul", mx.float32, *args, **kw)[0]  # noqa: E731
    flat = key(16, 20, 33, "a@b", None, False)
    assert key(16, 20, 33, "a@b", None, False, batch=(4, "none")) != flat
    assert key(16, 20, 33, "a@b", None, False, batch=(4, "a")) != \
        key(16, 20, 33, "a@b", None, False, batch=(4, "none"))
    assert key(16, 20, 33, "a@b", None, False, batch=(3, "none")) == \
        key(16, 20, 33, "a@b", None, False, batch=(4, "none"))   # batch counts bucketed
    assert key(16, 20, 33, "a@b", None, False, batch=(5, "none")) != \
        key(16, 20, 33, "a@b", None, False, batch=(4, "none"))
    # a decision measured for the batched call is not used by a flattened call, and a
    # flattened (B, T, K) @ (K, N) shares the key of the 2-D GEMM of its rows
    clock = [0.0]
    real = ops._candidates

    def priced(*args):
        out = []
        for c in real(*args):
            def run(*xs, c=c):
                clock[0] += 1e-3 if c.name == "mlx" else 1e-4
                return c.run(*xs)
            out.append(routing.Candidate(c.name, run))
        return out

    monkeypatch.setattr(ops, "_candidates", priced)
    a, ar = arrays(rng, (4, 7, 33))
    b, br = arrays(rng, (4, 33, 20))
    decision = ops.tune_matmul(a, b, budget_s=0.01, clock=lambda: clock[0])
    assert decision["winner"].startswith("metile:")
    info = json.loads(ops.explain_matmul(a, b))
    assert info["path"] == "metile_kernel" and info["route"]["source"] == "cache"
    check(ops.matmul(a, b), ar @ br, "float32")
    flat = json.loads(ops.explain_matmul(a, b[0]))
    assert flat["path"] == "mlx_composite" and flat["route"]["source"] == "cost_model"
    assert flat["batch"]["how"] == "flattened into rows (one GEMM)"
    assert ops._signature("matmul", mx.float32, 28, 20, 33, "a@b", None, False) == \
        ops._signature("matmul", mx.float32, 4 * 7, 20, 33, "a@b", None, False)
    routing.clear_memory()


def test_batch_broadcast_matches_numpy():
    shapes = [(), (1,), (3,), (2, 1), (1, 3), (2, 3), (0,), (1, 0), (2, 0), (4, 1, 3), (3, 3)]
    for x in shapes:
        for y in shapes:
            try:
                want = tuple(np.broadcast_shapes(x, y))
            except ValueError:
                want = None
            assert matmul_shapes._broadcast(x, y) == want, (x, y)


# -- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,exc,pattern", [
    ((), (3, 5), ValueError,
     r"\[metile.ops\] matmul operands need at least one dimension, got \(\) @ \(3, 5\)"),
    ((4, 3), (), ValueError, r"need at least one dimension, got \(4, 3\) @ \(\)"),
    ((2, 4, 3), (2, 5, 6), ValueError,
     r"\[metile.ops\] inner dimensions differ: \(2, 4, 3\) @ \(2, 5, 6\) \(a has K=3, b has K=5\)"),
    ((4,), (5,), ValueError, r"inner dimensions differ: \(4,\) @ \(5,\)"),
    ((2, 4, 3), (3, 3, 6), ValueError,
     r"\[metile.ops\] batch dimensions \(2,\) and \(3,\) do not broadcast "
     r"\(\(2, 4, 3\) @ \(3, 3, 6\)\)"),
    ((2, 5, 4, 3), (3, 5, 3, 6), ValueError, r"batch dimensions \(2, 5\) and \(3, 5\)"),
])
def test_bad_shapes_fail_early(a, b, exc, pattern):
    with pytest.raises(exc, match=pattern):
        ops.matmul(mx.zeros(a), mx.zeros(b), backend="metile")
    with pytest.raises(exc, match=pattern):
        ops.explain_matmul(mx.zeros(a), mx.zeros(b))


def test_bad_dtypes_and_linear_ranks_fail_early():
    # mixed float dtypes promote as MLX's matmul (test_ops.py); other dtypes are refused
    assert ops.matmul(mx.zeros((2, 4, 3), mx.float16), mx.zeros((2, 3, 5))).dtype == mx.float32
    with pytest.raises(TypeError, match=r"\[metile.ops\] b has dtype mlx.core.int32"):
        ops.matmul(mx.zeros((2, 4, 3)), mx.zeros((2, 3, 5), mx.int32), backend="metile")
    # under "auto" an int operand is MLX's matmul's to promote
    assert ops.matmul(mx.zeros((2, 4, 3)), mx.zeros((2, 3, 5), mx.int32)).dtype == mx.float32
    with pytest.raises(ValueError, match=r"\[metile.ops\] x must have at least one dimension "
                                         r"\(\.\.\., in_features\), got shape \(\)"):
        ops.linear(mx.array(1.0), mx.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"x's last dimension is 4, but weight \(5, 3\)"):
        ops.linear(mx.zeros((2, 7, 4)), mx.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"residual shape \(7, 4\) does not broadcast to the "
                                         r"output shape \(2, 7, 5\)"):
        ops.linear(mx.zeros((2, 7, 3)), mx.zeros((5, 3)), residual=mx.zeros((7, 4)))
    with pytest.raises(ValueError, match=r"residual shape \(3, 7, 5\) does not broadcast"):
        ops.linear(mx.zeros((7, 3)), mx.zeros((5, 3)), residual=mx.zeros((3, 7, 5)))


@pytest.mark.parametrize("shape", [(5,), (7, 5), (2, 1, 5), (7, 1)])
@pytest.mark.parametrize("backend", ["metile", "auto"])
def test_linear_residual_broadcasts_as_numpy_adds(shape, backend):
    # x @ w.T + residual broadcasts the residual; so does the fused epilogue's (twice: the
    # second call takes any replay the first recorded), and its gradient sums it back
    rng = np.random.default_rng(3)
    x, w, r = (rng.standard_normal(s).astype(np.float32) for s in ((2, 7, 3), (5, 3), shape))
    want = x.astype(np.float64) @ w.T.astype(np.float64) + r
    for _ in range(2):
        got = ops.linear(mx.array(x), mx.array(w), residual=mx.array(r), backend=backend)
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
    grad = mx.grad(lambda r: ops.linear(mx.array(x), mx.array(w), residual=r,
                                        backend=backend).sum())(mx.array(r))
    # (each residual element is added to 2*7*5 / its count of the output's elements)
    np.testing.assert_array_equal(np.array(grad), np.full(shape, 70 / np.prod(shape)))


# -- the batched kernel's CUDA source -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_batched_kernel_cuda_source_compiles(dtype, transpose_b):
    from metile_kernels.gemm import batched_grid, batched_matmul_epilogue
    from nvrtc import TOOLKIT, compile_cuda, translation_unit
    if TOOLKIT is None:
        pytest.skip("needs the nvidia-cuda-nvrtc, -runtime and -cccl wheels")
    b_, m, n, k = 3, 200, 136, 72
    d = batched_matmul_epilogue[batched_grid(b_, m, n, 128, 128)].prepare(
        mx.zeros((1, m, k), dtype), mx.zeros((b_, n, k) if transpose_b else (b_, k, n), dtype),
        mx.zeros((b_, m, n), dtype), m, n, k, 0, k * n, **ops.CUDA_BLOCK, EPILOGUE="gelu_tanh",
        TRANSPOSE_B=transpose_b, backend="cuda")
    mm = d.variant.data["lowering"]["matmul"]
    # 16-bit row-major operands keep the asynchronous staging behind a batch offset (its
    # 16-byte alignment is checked at run time); a transposed B falls back to plain loads
    assert mm["async_copy"] is (dtype != mx.float32 and not transpose_b)
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log
