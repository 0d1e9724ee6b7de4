"""Every model op on operands that are offset views: float16 rows starting 2 bytes past a
16-byte boundary (`flat[1:].reshape(...)` of an evaluated array - a row-contiguous view MLX
hands over without a copy).  Kernels that load or store 16 bytes at a time must test the
address at run time and take their element path: on a GPU a vector access at such an address
faults and the process loses its CUDA context (MLX's own quantized_matmul does, s149), on the
CPU runtime it reads the same numbers.  Each op's result on the views is checked against its
result on aligned copies of the same values (the copies' numbers are checked against NumPy
in each op's own test file) and against NumPy float64 where the reference is one line."""

import mlx.core as mx
import numpy as np
import pytest

from metile import ops

TOL = 2e-2   # float16, of the largest value


def offset(a: mx.array) -> mx.array:
    """`a`'s values as a view starting one element past the start of an evaluated array."""
    flat = mx.concatenate([mx.zeros((1,), a.dtype), a.reshape(-1)])
    mx.eval(flat)
    return flat[1:].reshape(a.shape)


def values(rng, *shape) -> mx.array:
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(mx.float16)


def f64(a) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def same(on_views, on_copies, reference=None):
    for got, want in zip(on_views if isinstance(on_views, tuple) else (on_views,),
                         on_copies if isinstance(on_copies, tuple) else (on_copies,)):
        scale = max(np.abs(f64(want)).max(), 1.0)
        assert np.abs(f64(got) - f64(want)).max() / scale <= TOL
    if reference is not None:
        got = on_views[0] if isinstance(on_views, tuple) else on_views
        scale = max(np.abs(reference).max(), 1.0)
        assert np.abs(f64(got) - reference).max() / scale <= TOL


def test_norms_and_softmax_on_offset_views(rng):
    x, r, w, b = values(rng, 6, 200), values(rng, 6, 200), values(rng, 200), values(rng, 200)
    xv, rv, wv, bv = (offset(a) for a in (x, r, w, b))
    x64, w64, b64 = f64(x), f64(w), f64(b)
    rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w64
    same(ops.rms_norm(xv, wv, 1e-5, backend="metile"),
         ops.rms_norm(x, w, 1e-5, backend="metile"), rms)
    centred = x64 - x64.mean(-1, keepdims=True)
    ln = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    same(ops.layer_norm(xv, wv, bv, 1e-5, backend="metile"),
         ops.layer_norm(x, w, b, 1e-5, backend="metile"), ln)
    same(ops.add_rms_norm(xv, rv, wv, 1e-5, backend="metile"),
         ops.add_rms_norm(x, r, w, 1e-5, backend="metile"))
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    same(ops.softmax(xv, backend="metile"), ops.softmax(x, backend="metile"),
         e / e.sum(-1, keepdims=True))


def test_rope_and_attention_on_offset_views(rng):
    x = values(rng, 1, 4, 9, 64)
    same(ops.rope(offset(x), 64, traditional=False, base=10000.0, scale=1.0, offset=3,
                  backend="metile"),
         ops.rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=3, backend="metile"))
    for queries in (1, 9):   # the decode kernel, then the prefill kernel
        q, k, v = values(rng, 1, 4, queries, 64), values(rng, 1, 2, 33, 64), \
            values(rng, 1, 2, 33, 64)
        scale = 64 ** -0.5
        on_views = ops.scaled_dot_product_attention(offset(q), offset(k), offset(v),
                                                    scale=scale, backend="metile")
        on_copies = ops.scaled_dot_product_attention(q, k, v, scale=scale, backend="metile")
        q64, k64, v64 = (np.repeat(f64(a), 2, axis=1) if a is not q else f64(a)
                         for a in (q, k, v))
        s = q64 @ np.swapaxes(k64, -1, -2) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        same(on_views, on_copies, (p / p.sum(-1, keepdims=True)) @ v64)


def test_linear_and_gated_mlp_on_offset_views(rng):
    x, w, g, bias, res = values(rng, 37, 96), values(rng, 80, 96), values(rng, 80, 96), \
        values(rng, 80), values(rng, 37, 80)
    x64, w64, g64 = f64(x), f64(w), f64(g)
    ref = np.maximum(x64 @ w64.T + f64(bias), 0) + f64(res)
    same(ops.linear(offset(x), offset(w), offset(bias), "relu", residual=offset(res),
                    backend="metile"),
         ops.linear(x, w, bias, "relu", residual=res, backend="metile"), ref)
    gate = x64 @ g64.T
    same(ops.gated_mlp(offset(x), offset(g), offset(w), "silu", backend="metile"),
         ops.gated_mlp(x, g, w, "silu", backend="metile"),
         gate / (1 + np.exp(-gate)) * (x64 @ w64.T))


# The int4 pair GEMV reads x as 64-bit words (x.view(uint64)).  On the CPU, MLX's view of a
# float16 view one element in keeps the 2-byte offset (x86 loads allow it); on CUDA (H100,
# MLX 0.32.4, s152) the same call neither faulted nor met the launch's refusal of a
# misaligned input (csrc/cuda_launch.cpp, kept as the guard should such a pointer reach a
# launch): the kernel read an aligned x.  So the numbers are checked everywhere.


@pytest.mark.parametrize("rows", [1, 3, 40])   # the GEMV forms and the GEMM
def test_quantized_matmul_on_offset_views(rng, rows):
    from metile import quantized_ops
    wq, s, b = mx.quantize(values(rng, 64, 256), group_size=64, bits=4)
    x = values(rng, rows, 256)
    dense = f64(mx.dequantize(wq, s, b, group_size=64, bits=4))
    # (the packed words one uint32 past the boundary: 4 bytes)
    on_views = ops.quantized_matmul(offset(x), offset(wq), offset(s), offset(b), True, 64, 4,
                                    backend="metile")
    same(on_views, ops.quantized_matmul(x, wq, s, b, True, 64, 4, backend="metile"),
         f64(x) @ dense.T)


@pytest.mark.parametrize("config", ["MATVEC_PAIRS", "MATVEC_RUNS"])
def test_decode_kernels_on_offset_views(rng, config):
    # the GEMVs CUDA's decode takes: the pair GEMV (x as 64-bit words, see above), the runs
    # GEMV (16 bytes of weights at a time, tested aligned at run time)
    from metile import quantized_ops
    wq, s, b = mx.quantize(values(rng, 64, 256), group_size=64, bits=4)
    x = values(rng, 2, 256)
    dense = f64(mx.dequantize(wq, s, b, group_size=64, bits=4))
    chosen = getattr(quantized_ops, config)[0]
    on_views = quantized_ops._metile(offset(x), offset(wq), offset(s), offset(b), 64, 256, True,
                                     64, 4, chosen)
    same(on_views, quantized_ops._metile(x, wq, s, b, 64, 256, True, 64, 4, chosen),
         f64(x) @ dense.T)


@pytest.mark.parametrize("k", [256, 1024])   # a row's words masked at the end, and EVEN
def test_pair_gemv_reading_halves_on_offset_views(rng, k):
    # MATVEC_PAIRS_HALVES joins x's 64-bit words from 16-bit loads: bit for bit the uint64
    # view's numbers on an aligned x, and right on a view one element in; with |x| in the
    # hundreds a 16-bit sum overflows and the
    # float32 fallback (float_rows) reads x the same way
    from metile import quantized_ops
    wq, s, b = mx.quantize(values(rng, 64, k), group_size=64, bits=4)
    dense = f64(mx.dequantize(wq, s, b, group_size=64, bits=4))
    for scale in (1.0, 300.0):
        x = (values(rng, 3, k).astype(mx.float32) * scale).astype(mx.float16)
        words = quantized_ops._metile(x, wq, s, b, 64, k, True, 64, 4,
                                      quantized_ops.MATVEC_PAIRS[0])
        halves = quantized_ops._metile(offset(x), offset(wq), offset(s), offset(b), 64, k, True,
                                       64, 4, quantized_ops.MATVEC_PAIRS_HALVES)
        np.testing.assert_array_equal(np.array(halves), np.array(words))
        same(halves, words, f64(x) @ dense.T)
