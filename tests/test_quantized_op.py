"""metile.ops.quantized_matmul (quantized_ops.py, metile_kernels/quantized.py) on weights
from mx.quantize, through the CPU runtime: against a float64 NumPy product with the
dequantized weight (mx.dequantize, checked here against our own unpacking of the
packed words) and against mx.quantized_matmul.

Tolerances, as a fraction of the largest reference value: float32 1e-5 (float32
accumulation over K <= 384); float16 2e-3 and bfloat16 1.6e-2: the output rounding
(2^-11 / 2^-8 relative) plus, in the GEMM, the dequantized weight rounded to x's
dtype before the matrix product (about the same again over random-signed terms).
MLX's CPU kernels accumulate 16-bit inputs in lower precision, so the check against
MLX allows MLX's own distance from the float64 product plus ours.  The CUDA emission
of every kernel is compiled with NVRTC.
"""

import re

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import metile
from metile import nn as mnn
from metile import ops, quantized_ops
from metile.runtime import routing
from nvrtc import TOOLKIT, compile_cuda, translation_unit
from conftest import mlx_compile_failure

TOL = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}
DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def f64(a):
    return np.array(a.astype(mx.float32), dtype=np.float64)


def quantized(rng, shape, dtype, group_size, bits):
    w = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    return mx.quantize(w, group_size=group_size, bits=bits)


def unpacked(wq, scales, biases, group_size, bits):
    """The dequantized matrix from the packed words as documented in quantized.py:
    element j of a row is bits [(j % per) * bits, ...) of word j // per, low first."""
    words = np.array(wq).astype(np.uint64)
    per = 32 // bits
    q = np.stack([(words >> (bits * e)) & ((1 << bits) - 1) for e in range(per)], axis=-1)
    q = q.reshape(words.shape[0], -1).astype(np.float64)
    s = np.repeat(f64(scales), group_size, axis=1)
    b = np.repeat(f64(biases), group_size, axis=1)
    return s * q + b


def check(y, x, wq, scales, biases, transpose, group_size, bits, dtype):
    w = f64(mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits))
    x64 = f64(x)
    ref = x64 @ (w.T if transpose else w)
    assert y.shape == tuple(ref.shape)
    scale = max(np.abs(ref).max(), 1.0)
    err = np.abs(f64(y) - ref).max() / scale
    assert err <= TOL[dtype], f"error {err:.2e} of the largest value vs float64 > {TOL[dtype]}"
    if dtype == mx.float32 and not transpose and mx.cuda.is_available():
        # MLX 0.32.4's own CUDA quantized_matmul(transpose=False) on float32 stalled GPU runs
        # (s125, s145; tools/probes/untransposed_hang.py: its first call did not return in
        # 15 s with the GPU idle): the float64 check above stands alone there
        return
    try:
        mlx = f64(mx.quantized_matmul(x, wq, scales, biases, transpose=transpose,
                                      group_size=group_size, bits=bits))
    except RuntimeError as e:
        # MLX 0.32.4's own CUDA kernel fails to launch float32 with group_size 128
        # (H200, 2026-12-01: "cuGraphAddKernelNode ... invalid argument"); the float64
        # check above stands alone there
        if "cuGraphAddKernelNode" not in str(e):
            raise
        return
    mlx_err = np.abs(mlx - ref).max() / scale
    assert np.abs(f64(y) - mlx).max() / scale <= mlx_err + TOL[dtype]


def test_packing_round_trips_through_mx_dequantize(rng):
    for bits in (4, 8):
        wq, s, b = quantized(rng, (5, 128), mx.float32, 32, bits)
        np.testing.assert_allclose(unpacked(wq, s, b, 32, bits),
                                   f64(mx.dequantize(wq, s, b, group_size=32, bits=bits)),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_transposed_decode_and_prefill(rng, bits, group_size, dtype):
    n, k = 45, 3 * group_size          # N ragged against every tile, K three groups
    wq, s, b = quantized(rng, (n, k), dtype, group_size, bits)
    for rows in (1, 3, 17, 64):         # GEMV up to 8 rows, GEMM above
        x = mx.array(rng.standard_normal((rows, k)).astype(np.float32)).astype(dtype)
        y = ops.quantized_matmul(x, wq, s, b, True, group_size, bits, backend="metile")
        assert y.dtype == dtype
        check(y, x, wq, s, b, True, group_size, bits, dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
@pytest.mark.parametrize("bits,group_size", [(4, 32), (8, 128), (4, 64)])
def test_untransposed(rng, bits, group_size, dtype):
    k, n = 37, 2 * group_size           # x @ W with W (K, N) quantized along N; K ragged
    wq, s, b = quantized(rng, (k, n), dtype, group_size, bits)
    for rows in (1, 3, 17):
        x = mx.array(rng.standard_normal((rows, k)).astype(np.float32)).astype(dtype)
        y = ops.quantized_matmul(x, wq, s, b, False, group_size, bits, backend="metile")
        check(y, x, wq, s, b, False, group_size, bits, dtype)


def test_leading_dims_and_mixed_dtypes(rng):
    wq, s, b = quantized(rng, (40, 128), mx.float32, 64, 4)
    for shape in [(128,), (2, 3, 128), (2, 5, 2, 128)]:
        x = mx.array(rng.standard_normal(shape).astype(np.float32))
        y = ops.quantized_matmul(x, wq, s, b, backend="metile")
        assert y.shape == (*shape[:-1], 40)
        ref = f64(x).reshape(-1, 128) @ unpacked(wq, s, b, 64, 4).T
        np.testing.assert_allclose(f64(y).reshape(-1, 40), ref, rtol=1e-5, atol=1e-5)
    # float16 x with float32 scales gives float32, as in MLX
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32)).astype(mx.float16)
    y = ops.quantized_matmul(x, wq, s, b, backend="metile")
    assert y.dtype == mx.quantized_matmul(x, wq, s, b).dtype == mx.float32
    check(y, x, wq, s, b, True, 64, 4, mx.float32)
    empty = ops.quantized_matmul(mx.zeros((0, 128)), wq, s, b, backend="metile")
    assert empty.shape == (0, 40)


@pytest.mark.parametrize("rows", [2, 17])
def test_gradients_match_mlx(rng, rows):
    wq, s, b = quantized(rng, (24, 64), mx.float32, 32, 4)
    x = mx.array(rng.standard_normal((rows, 64)).astype(np.float32))
    cot = mx.array(rng.standard_normal((rows, 24)).astype(np.float32))

    def loss(fn):
        return lambda x, s, b: (fn(x, wq, s, b, True, 32, 4) * cot).sum()

    mine = mx.grad(loss(lambda *a: ops.quantized_matmul(*a, backend="metile")),
                   argnums=(0, 1, 2))(x, s, b)
    theirs = mx.grad(loss(mx.quantized_matmul), argnums=(0, 1, 2))(x, s, b)
    for name, a, e in zip(("x", "scales", "biases"), mine, theirs):
        np.testing.assert_allclose(np.array(a), np.array(e), rtol=3e-4, atol=3e-4, err_msg=name)
    # d/dx in float64: cot @ W
    np.testing.assert_allclose(np.array(mine[0]), f64(cot) @ unpacked(wq, s, b, 32, 4),
                               rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("rows", [2, 17])   # the GEMV and the GEMM (and their replays)
def test_the_packed_weight_gradient_is_refused_where_it_is_used(rng, rows):
    # MLX's op refuses d/dw; the kernel path gave zeros, which Adam or weight decay turned
    # into float32 words (an unfrozen quantized layer corrupted by one step)
    from metile.errors import LaunchError
    wq, s, b = quantized(rng, (24, 64), mx.float32, 32, 4)
    x = mx.array(rng.standard_normal((rows, 64)).astype(np.float32))
    for _ in range(2):
        gx, gw, gs = mx.grad(lambda x, w, s: ops.quantized_matmul(x, w, s, b, True, 32, 4,
                                                                  backend="metile").sum(),
                             argnums=(0, 1, 2))(x, wq, s)
        want = mx.grad(lambda x: mx.quantized_matmul(x, wq, s, b, True, 32, 4).sum())(x)
        np.testing.assert_allclose(np.array(gx), np.array(want), rtol=3e-4, atol=3e-4)
        mx.eval(gs)
        with pytest.raises(LaunchError, match="no gradient with respect to the quantized weight"):
            mx.eval(wq - 0.1 * gw)
    with pytest.raises(RuntimeError, match="no gradient wrt the quantized weights"):
        mx.eval(mx.grad(lambda w: mx.quantized_matmul(x, w, s, b, True, 32, 4).sum())(wq))


def test_inside_compile(rng):
    wq, s, b = quantized(rng, (40, 128), mx.float16, 64, 4)
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32)).astype(mx.float16)
    f = mx.compile(lambda x: ops.quantized_matmul(x, wq, s, b, backend="metile") * 2)
    check(f(x) / 2, x, wq, s, b, True, 64, 4, mx.float16)


# -- routing ------------------------------------------------------------------------------------

def test_auto_without_a_decision_is_mlx_then_measured(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    routing.clear_memory()
    wq, s, b = quantized(rng, (40, 128), mx.float32, 64, 4)
    x = mx.array(rng.standard_normal((2, 128)).astype(np.float32))
    info = json.loads(quantized_ops.explain_quantized_matmul(x, wq, s, b))
    assert info["path"] == "mlx" and info["route"]["source"] == "cost_model"
    assert mx.array_equal(ops.quantized_matmul(x, wq, s, b), mx.quantized_matmul(x, wq, s, b))
    decision = quantized_ops.tune_quantized_matmul(x, wq, s, b, budget_s=0.02)
    assert decision["source"] == "measured" and "mlx" in decision["timings_us"]
    assert not decision["unusable"], decision["unusable"]     # every kernel validated
    again = json.loads(quantized_ops.explain_quantized_matmul(x, wq, s, b))
    assert again["route"]["source"] == "cache" and again["route"]["winner"] == decision["winner"]
    check(ops.quantized_matmul(x, wq, s, b), x, wq, s, b, True, 64, 4, mx.float32)
    forced = json.loads(quantized_ops.explain_quantized_matmul(x, wq, s, b, backend="metile"))
    assert forced["config"]["kernel"] == "matvec"
    routing.clear_memory()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("bits,group_size,k", [(4, 64, 1280), (8, 32, 1280), (4, 128, 1280),
                                               (4, 64, 1024), (8, 128, 1024)])
def test_every_decode_candidate(rng, bits, group_size, k, dtype):
    # K = 1280: over one 1024-block and into a second, partial one; K = 1024: every block
    # of every candidate whole (the kernels' EVEN_K form, no load masked); N ragged; 3 rows
    n = 13
    wq, s, b = quantized(rng, (n, k), dtype, group_size, bits)
    x = mx.array(rng.standard_normal((3, k)).astype(np.float32)).astype(dtype)
    kinds = []
    for config in (quantized_ops.configs(3, dtype, True, bits) + quantized_ops.MATVEC_ROWS
                   + quantized_ops.MATVEC_WARPS):
        kinds.append(config["kernel"])
        y = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, bits, config)
        check(y, x, wq, s, b, True, group_size, bits, dtype)
    assert {"matvec_runs", "matvec_rows", "matvec_warps"} <= set(kinds)
    # the packed-pair GEMV is a candidate exactly where its unpacking is exact
    pairs = (str(dtype).removeprefix("mlx.core."), bits) in (("float16", 4), ("float16", 8),
                                                              ("bfloat16", 4))
    assert ("matvec_pairs" in kinds) == pairs


@pytest.mark.parametrize("dtype,bits", [(mx.float16, 4), (mx.float16, 8), (mx.bfloat16, 4)],
                         ids=str)
@pytest.mark.parametrize("rows,n,k,group_size,lanes", [
    (1, 37, 2048, 64, 32),     # 32 groups: every loop step whole (no load masked)
    (2, 13, 1344, 64, 32),     # 21 groups: a partial step
    (3, 5, 4096, 128, 64),     # two warps a program, whole
    (1, 9, 960, 32, 64),       # 30 groups on 64 lanes: most masked
])
def test_pair_gemv_ragged(rng, dtype, bits, rows, n, k, group_size, lanes):
    wq, s, b = quantized(rng, (n, k), dtype, group_size, bits)
    x = mx.array(rng.standard_normal((rows, k)).astype(np.float32)).astype(dtype)
    # rows a lane (a program's last rows past N read row N - 1), words a lane (a group holds
    # at least 4: 4-bit group 32)
    for r, span in ((1, 1), (2, 2), (4, 4), (8, 4)):
        config = {"kernel": "matvec_pairs", "ROWS": r, "SPAN": span, "LANES": lanes,
                  "num_warps": lanes // 32}
        y = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, bits, config)
        check(y, x, wq, s, b, True, group_size, bits, dtype)


@pytest.mark.parametrize("dtype,bits", [(mx.float16, 4), (mx.float16, 8), (mx.bfloat16, 4)],
                         ids=str)
@pytest.mark.parametrize("size", ["outliers", "tiny"])
def test_pair_gemv_any_magnitude_of_x(rng, dtype, bits, size):
    # float16 sums of x (q - C) overflow once |x| reaches the hundreds: such a program's rows
    # are computed again in float32 (without that, inf and NaN); tiny x stay exact enough
    n, k = 12, 1024
    wq, s, b = quantized(rng, (n, k), dtype, 64, bits)
    xv = rng.standard_normal((2, k)).astype(np.float32)
    if size == "outliers":
        # runs of 16 values of 5000 of one sign: 16-bit sums of 5000 (q - C) pass float16's
        # range (the outputs stay within it)
        xv *= 100.0
        for start in (128, 640):
            xv[:, start:start + 16] = np.sign(xv[:, start:start + 1]) * 5000.0
    else:
        xv *= 1e-4
    x = mx.array(xv).astype(dtype)
    for config in quantized_ops.MATVEC_PAIRS:
        y = quantized_ops._metile(x, wq, s, b, n, k, True, 64, bits, config)
        assert np.isfinite(f64(y)).all()
        w = f64(mx.dequantize(wq, s, b, group_size=64, bits=bits))
        ref = f64(x) @ w.T
        err = np.abs(f64(y) - ref).max() / np.abs(ref).max()
        assert err <= TOL[dtype], err


def _matches_the_default_pairs(rng, wq, s, b, n, k, dtype, bits, config):
    """`config`'s pair GEMV against MATVEC_PAIRS[0] to the bit and against float64, with
    and without outliers (16 values of 5000 of one sign: a 16-bit sum past float16's range,
    which the float32 fallback recomputes); the last x."""
    dense = f64(mx.dequantize(wq, s, b, group_size=64, bits=bits))
    for outliers in (False, True):
        xv = rng.standard_normal((2, k)).astype(np.float32)
        if outliers:
            xv[:, 128:144] = np.sign(xv[:, 128:129]) * 5000.0
        x = mx.array(xv).astype(dtype)
        base, got = (quantized_ops._metile(x, wq, s, b, n, k, True, 64, bits, c)
                     for c in (quantized_ops.MATVEC_PAIRS[0], config))
        np.testing.assert_array_equal(f64(got), f64(base))
        ref = f64(x) @ dense.T
        fits = np.abs(ref) < 60000          # (past float16's range the output is inf)
        assert fits.mean() > 0.9
        err = np.abs(f64(got) - ref)[fits].max() / np.abs(ref[fits]).max()
        assert err <= TOL[dtype], err
    return x


@pytest.mark.parametrize("dtype,bits,k", [
    (mx.float16, 4, 1024),      # one step (128 words), unrolled
    (mx.float16, 4, 4096),      # four steps, all unrolled
    (mx.float16, 4, 9216),      # nine: eight unrolled (MAX_UNROLLED_STEPS), the last in the loop
    (mx.float16, 4, 1088),      # a partial step: not EVEN, nothing unrolled
    (mx.bfloat16, 4, 4096),
    (mx.float16, 8, 4096),      # 1024 words: eight steps
], ids=str)
def test_pair_gemv_unrolled_is_the_loop_bit_for_bit(rng, dtype, bits, k):
    # MATVEC_PAIRS_UNROLLED adds the same step sums in the same order as the loop: the same
    # numbers to the bit, through the float32 fallback too
    n = 24
    wq, s, b = quantized(rng, (n, k), dtype, 64, bits)
    x = _matches_the_default_pairs(rng, wq, s, b, n, k, dtype, bits,
                                   quantized_ops.MATVEC_PAIRS_UNROLLED)
    # what the launch unrolls: whole steps only, at most MAX_UNROLLED_STEPS
    words = k * bits // 32
    want = min(words // 128, quantized_ops.MAX_UNROLLED_STEPS) if words % 128 == 0 else 0
    d = quantized_ops._launch(x, wq, s, b, n, k, True, 64, bits,
                              quantized_ops.MATVEC_PAIRS_UNROLLED, dispatch_only=True)
    assert d.spec.constexprs["UNROLL"] == want


@pytest.mark.parametrize("dtype,bits,k", [
    (mx.float16, 4, 4096),      # four whole steps: the words two a 64-bit load
    (mx.float16, 4, 1088),      # a partial step: not EVEN, the 32-bit loads
    (mx.bfloat16, 4, 1024),
    (mx.float16, 8, 2048),
], ids=str)
def test_pair_gemv_words_two_a_load_are_the_default_bit_for_bit(rng, dtype, bits, k):
    # MATVEC_PAIRS_W64 reads the same words through the uint64 view (the first the low
    # half): the same sums to the bit, through the float32 fallback too
    n = 20
    wq, s, b = quantized(rng, (n, k), dtype, 64, bits)
    x = _matches_the_default_pairs(rng, wq, s, b, n, k, dtype, bits,
                                   quantized_ops.MATVEC_PAIRS_W64)
    d = quantized_ops._launch(x, wq, s, b, n, k, True, 64, bits,
                              quantized_ops.MATVEC_PAIRS_W64, dispatch_only=True)
    assert d.spec.constexprs["W64"] == (k * bits // 32 % 128 == 0)


def test_pair_gemv_refuses_what_its_unpacking_cannot_hold(rng):
    config = quantized_ops.MATVEC_PAIRS[0]
    for dtype, bits, transpose in ((mx.bfloat16, 8, True), (mx.float32, 4, True),
                                   (mx.float16, 4, False)):
        wq, s, b = quantized(rng, (64, 128) if transpose else (128, 64), dtype, 64, bits)
        x = mx.zeros((1, 128), dtype)
        with pytest.raises(ValueError, match="matvec_pairs kernel takes float16"):
            quantized_ops._metile(x, wq, s, b, 64, 128, transpose, 64, bits, config)
        assert "matvec_pairs" not in {c["kernel"] for c in
                                      quantized_ops.configs(1, dtype, transpose, bits)}


@pytest.mark.parametrize("bits", [4, 8])
def test_runs_read_each_packed_word_once_per_run(bits):
    # the packed word's index k // (32 // bits) keeps its value along a run: one read of
    # the word, the scale and the bias per run, x as vectors (vectorize_rows); 8-bit
    # weights (4 elements a word) narrow float16's runs of 8 to 4 on CUDA
    from metile_kernels import quantized as kernels
    n, k = 64, 4096
    wq, s, b = mx.quantize(mx.zeros((n, k), mx.float16), group_size=64, bits=bits)
    x = mx.zeros((1, k), mx.float16)
    for backend, width in (("msl", 4), ("cuda", 8 if bits == 4 else 4)):
        d = kernels.quantized_matvec_runs[(n, 1)].prepare(
            x, wq, s, b, mx.zeros((1, n), mx.float16), 1, n, k, BITS=bits, GROUP=64,
            BLOCK_K=1024, num_warps=2, backend=backend)
        notes = " ".join(d.execution_report.notes)
        assert f"Lanes own runs of {width} consecutive elements" in notes, notes
        assert "vectorize_rows" in d.execution_report.passes
        # per run: one word, one scale and one bias load, at the run's first element
        assert len(re.findall(r"\bw\[", d.source)) == 1, backend
        assert len(re.findall(r"\bscales\[", d.source)) == 1, backend
        if backend == "cuda" and TOOLKIT is not None:
            ok, log = compile_cuda(translation_unit(d), "sm_90")
            assert ok, log
    # i // 4 keeps its value along Metal's runs of 4; i // 2 and i // 3 split them (runs
    # of 2 would be narrower than any vector the emitters write): one element per lane,
    # the reason named; NumPy either way
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((256,)).astype(np.float32))
    xs = np.array(x)
    for divisor, width in ((4, 4), (2, None), (3, None)):
        d = pairs[(1,)].prepare(x, mx.zeros((256,), mx.float32), BLOCK=256, D=divisor,
                                num_warps=1, backend="msl")
        notes = " ".join(d.execution_report.notes)
        if width is None:
            assert "vectorize_rows" not in d.execution_report.passes
            assert "not provably affine" in notes, notes
        else:
            assert f"Lanes own runs of {width} consecutive elements" in notes, notes
        if mx.default_device().type == mx.cpu or mx.metal.is_available():   # (MSL runs there)
            np.testing.assert_array_equal(np.array(d()), xs + xs[np.arange(256) // divisor])


@metile.kernel
def pairs(X, Y, BLOCK: metile.constexpr, D: metile.constexpr):
    i = metile.arange(0, BLOCK)
    metile.store(Y + i, metile.load(X + i) + metile.load(X + i // D))


def test_dequantize_kernel_ragged(rng):
    from metile_kernels import quantized as kernels
    for bits, group_size, (rows, columns), per in ((4, 64, (5, 1088), 1), (8, 32, (3, 96), 1),
                                                   (4, 128, (2, 2176), 1),
                                                   (4, 64, (7, 1088), 4), (8, 32, (3, 96), 2)):
        wq, s, b = quantized(rng, (rows, columns), mx.float16, group_size, bits)
        out = kernels.dequantize[(metile.cdiv(columns, 1024), metile.cdiv(rows, per))](
            wq, s, b, mx.zeros((rows, columns), mx.float16), rows, columns, BITS=bits,
            GROUP=group_size, BLOCK=1024, ROWS=per, num_warps=4)
        # s * q + b in float32, rounded once to float16: within half an ulp of float64
        # (mx.dequantize rounds its float16 product and sum separately: up to an ulp off)
        np.testing.assert_allclose(f64(out), unpacked(wq, s, b, group_size, bits),
                                   rtol=2.0 ** -11, atol=2.0 ** -25)


def test_metile_defaults_are_the_measured_kernels_on_cuda(monkeypatch):
    # backend="metile" on CUDA with 16-bit x runs what measured fastest on the H200 (the
    # GEMV in packed pairs, or in runs; dequantize then the dense GEMM); float32 and other
    # devices keep theirs
    monkeypatch.setattr(quantized_ops, "_on_cuda", lambda: True)
    # the GEMV in packed pairs where its unpacking is exact, else the GEMV in runs
    assert quantized_ops.default_config(1, mx.float16, True) == quantized_ops.MATVEC_PAIRS[0]
    assert quantized_ops.default_config(4, mx.float16, True, 8) == quantized_ops.MATVEC_PAIRS[0]
    assert quantized_ops.default_config(1, mx.bfloat16, True, 8) == quantized_ops.MATVEC_RUNS[0]
    assert quantized_ops.default_config(512, mx.bfloat16, True) == quantized_ops.DEQUANTIZE_GEMM
    assert quantized_ops.default_config(1, mx.float16, False) == quantized_ops.MATVEC_N
    assert quantized_ops.default_config(1, mx.float32, True) == quantized_ops.MATVEC
    assert quantized_ops.default_config(512, mx.float32, True) == quantized_ops.GEMM
    # on warpgroup MMA auto also measures the pair-dequantizing fused GEMMs where they take
    # the call (4-bit, 16-bit x, K and N whole tiles); backend="metile" keeps dequantize +
    # GEMM (the pair kernel was measured at one N)
    monkeypatch.setattr(ops, "_warpgroup_gemm", lambda: True)
    shape = (11008, 4096, 64)
    assert quantized_ops.default_config(128, mx.float16, True) == quantized_ops.DEQUANTIZE_GEMM
    candidates = quantized_ops.configs(512, mx.float16, True, 4, *shape)
    assert candidates[-2:] == [quantized_ops.WGMMA_PAIRS, quantized_ops.WGMMA_PAIRS_TALL]
    assert quantized_ops.configs(16, mx.bfloat16, True, 4, *shape)[-1] == \
        quantized_ops.WGMMA_PAIRS_TALL
    # the 256-wide tile only where N allows it; none at 8 bits, K not whole tiles, float32
    assert quantized_ops.WGMMA_PAIRS not in quantized_ops.configs(512, mx.float16, True, 4,
                                                                  384, 4096, 64)
    assert quantized_ops.WGMMA_PAIRS_TALL in quantized_ops.configs(512, mx.float16, True, 4,
                                                                   384, 4096, 64)
    for dtype, bits, at in ((mx.float16, 8, shape), (mx.float16, 4, (11008, 4000, 32)),
                            (mx.float32, 4, shape)):
        assert not any(c.get("PAIRS") for c in quantized_ops.configs(512, dtype, True, bits,
                                                                     *at)), (dtype, bits, at)
    monkeypatch.setattr(ops, "_warpgroup_gemm", lambda: False)
    assert quantized_ops.configs(512, mx.float16, True, 4, *shape)[-1] == \
        quantized_ops.DEQUANTIZE_MLX_GEMM
    monkeypatch.setattr(quantized_ops, "_on_cuda", lambda: False)
    assert quantized_ops.default_config(1, mx.float16, True) == quantized_ops.MATVEC
    assert quantized_ops.default_config(512, mx.float16, True) == quantized_ops.GEMM


def test_prefill_candidates_include_dequantize_then_gemm(rng):
    # every prefill candidate, against float64 and MLX
    wq, s, b = quantized(rng, (40, 128), mx.float16, 64, 8)
    x = mx.array(rng.standard_normal((20, 128)).astype(np.float32)).astype(mx.float16)
    configs = quantized_ops.configs(32, mx.float16, True)
    assert [c["kernel"] for c in configs] == ["gemm", "dequantize+gemm", "dequantize+gemm"]
    assert configs[2] == quantized_ops.DEQUANTIZE_MLX_GEMM
    for config in configs:
        y = quantized_ops._metile(x, wq, s, b, 40, 128, True, 64, 8, config)
        check(y, x, wq, s, b, True, 64, 8, mx.float16)


@pytest.mark.skipif(not ops._warpgroup_gemm(), reason="warpgroup MMA (an sm_90 GPU)")
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k,bits,group_size", [(200, 300, 4096, 4, 64),
                                                   (130, 257, 320, 8, 32),
                                                   (7, 64, 1152, 4, 128)])
def test_fused_warpgroup_prefill_ragged(rng, dtype, m, n, k, bits, group_size):
    # rows and columns not multiples of the 128x256 tile, K not of its 64 (320 = 5 x 64
    # is, 1152 is 18 x 64 over groups of 128), each element masked where it is outside
    wq, s, b = quantized(rng, (n, k), dtype, group_size, bits)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    y = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, bits,
                              quantized_ops.WGMMA_GEMM)
    check(y, x, wq, s, b, True, group_size, bits, dtype)


@pytest.mark.skipif(not ops._warpgroup_gemm(), reason="warpgroup MMA (an sm_90 GPU)")
@pytest.mark.parametrize("tile", ["WGMMA_GEMM", "WGMMA_PAIRS_TALL"])
def test_fused_warpgroup_prefill_of_a_misaligned_x(rng, tile):
    # x an offset view 2 bytes past a 16-byte boundary: the K loop whose copies test each
    # group (not the whole-group loop), its weight words read a step ahead as well
    m, n, k, group_size = 130, 256, 320, 32
    wq, s, b = quantized(rng, (n, k), mx.float16, group_size, 4)
    flat = mx.array(rng.standard_normal(m * k + 1).astype(np.float32)).astype(mx.float16)
    x = flat[1:].reshape(m, k)
    y = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, 4,
                              getattr(quantized_ops, tile))
    # MLX's peer reads an aligned copy: MLX 0.32.4's own CUDA quantized_matmul faults
    # ("misaligned address", the context lost) on this view (H100, s149, after metile's y
    # had passed its float64 check)
    check(y, mx.array(np.array(x)), wq, s, b, True, group_size, 4, mx.float16)


PAIRS_TILE = {"kernel": "gemm", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "PAIRS": True}


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("m,group_size", [(40, 64), (3, 32), (17, 128)])
def test_pair_dequantized_gemm_is_the_float_form_bit_for_bit(rng, dtype, m, group_size):
    # the weight tile in packed pair arithmetic (one pair_fma takes the magic off, one
    # makes s q + b with one rounding) against the float32 form of the same tile: equal to
    # the bit, rows ragged (x's rows stay masked), weights of a wide range
    n, k = 64, 256
    w = mx.array((rng.standard_normal((n, k)) * 7).astype(np.float32)).astype(dtype)
    wq, s, b = mx.quantize(w, group_size=group_size, bits=4)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    y = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, 4, PAIRS_TILE)
    check(y, x, wq, s, b, True, group_size, 4, dtype)
    plain = {key: v for key, v in PAIRS_TILE.items() if key != "PAIRS"}
    same = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, 4, plain)
    assert np.array_equal(np.array(y.astype(mx.float32)), np.array(same.astype(mx.float32)))
    # x the identity: the product is the dequantized tile itself, every nibble position
    eye = mx.eye(k, dtype=dtype)
    tile = quantized_ops._metile(eye, wq, s, b, n, k, True, group_size, 4, PAIRS_TILE)
    q = unpacked(wq, mx.ones_like(s), mx.zeros_like(b), group_size, 4)
    sf, bf = (np.repeat(f64(a), group_size, axis=1) for a in (s, b))
    want = mx.array((sf * q + bf).astype(np.float32)).astype(dtype)   # one rounding
    assert np.array_equal(np.array(tile.astype(mx.float32)).T, np.array(want.astype(mx.float32)))


@pytest.mark.parametrize("change,message", [
    (dict(bits=8), "4-bit weights"), (dict(n=48), "N of BLOCK_N"),
    (dict(k=288, group=32), "K a multiple"),
    (dict(dtype=mx.float32), "float16 or bfloat16 x"),
])
def test_pair_dequantized_gemm_refuses_what_it_does_not_take(rng, change, message):
    bits, n, k, group, dtype = (change.get(a, d) for a, d in (
        ("bits", 4), ("n", 64), ("k", 256), ("group", 64), ("dtype", mx.float16)))
    wq, s, b = quantized(rng, (n, k), dtype, group, bits)
    x = mx.zeros((4, k), dtype)
    with pytest.raises(ValueError, match=message):
        quantized_ops._metile(x, wq, s, b, n, k, True, group, bits, PAIRS_TILE)


@pytest.mark.skipif(not ops._warpgroup_gemm(), reason="warpgroup MMA (an sm_90 GPU)")
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("tile,m,n,k,group_size", [
    ("WGMMA_PAIRS", 200, 512, 4096, 64), ("WGMMA_PAIRS", 7, 256, 1152, 128),
    ("WGMMA_PAIRS_TALL", 130, 384, 320, 32)])
def test_pair_dequantized_warpgroup_prefill(rng, dtype, tile, m, n, k, group_size):
    # (each case compiles its own ~17000-line kernel: ~15 s a case on the H100's host)
    wq, s, b = quantized(rng, (n, k), dtype, group_size, 4)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    y = quantized_ops._metile(x, wq, s, b, n, k, True, group_size, 4,
                              getattr(quantized_ops, tile))
    check(y, x, wq, s, b, True, group_size, 4, dtype)


# -- bad inputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("change,error,message", [
    (lambda x, w, s, b: ((x, w, s, b), {"group_size": 64}), ValueError,
     "96 elements, not a multiple of group_size=64"),
    (lambda x, w, s, b: ((x, w, s, b), {"bits": 3}), ValueError,
     "bits=3: metile's kernels take bits 4 and 8"),
    (lambda x, w, s, b: ((x, w, s, b), {"mode": "mxfp4"}), ValueError,
     "implement 'affine' quantization only"),
    (lambda x, w, s, b: ((x[:, :64], w, s, b), {}), ValueError,
     "x's last dimension is 64, but the quantized matrix has K=96"),
    (lambda x, w, s, b: ((x, w, s, None), {}), ValueError, "biases must be provided"),
    (lambda x, w, s, b: ((x.astype(mx.int32), w, s, b), {}), TypeError, "x has dtype"),
    (lambda x, w, s, b: ((x, w[None], s[None], b[None]), {}), ValueError, "2-D uint32"),
    (lambda x, w, s, b: ((x, w.astype(mx.int32), s, b), {}), ValueError, "2-D uint32"),
    (lambda x, w, s, b: ((x, w, s[:, :2], b[:, :2]), {}), ValueError,
     r"needs scales and biases of shape \(8, 3\)"),
    (lambda x, w, s, b: ((x, w, s, b), {"backend": "gpu"}), ValueError, "backend must be"),
])
def test_bad_inputs_are_refused_by_name(rng, change, error, message):
    wq, s, b = quantized(rng, (8, 96), mx.float32, 32, 4)
    x = mx.zeros((2, 96))
    args, kw = change(x, wq, s, b)
    kw = {"group_size": 32, "bits": 4, "backend": "metile", **kw}
    with pytest.raises(error, match=message):
        ops.quantized_matmul(*args, **kw)


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4", "affine"])
def test_group_size_and_bits_default_to_the_modes_own(rng, mode):
    # (None was affine's 64 and 4 for every mode, so an mxfp4 weight failed MLX's shape check
    # under auto and mlx: "incompatible based on bits and group_size ... group_size=64")
    w = mx.array(rng.standard_normal((64, 128)).astype(np.float32))
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32))
    wq, scales, *biases = mx.quantize(w, mode=mode)
    b = biases[0] if biases else None
    want = np.array(mx.quantized_matmul(x, wq, scales, b, mode=mode))
    for backend in ("auto", "mlx") + (("metile",) if mode == "affine" else ()):
        got = ops.quantized_matmul(x, wq, scales, b, mode=mode, backend=backend)
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5, err_msg=backend)
        got = ops.quantized_matmul(x, wq, scales, b, group_size=None, bits=None, mode=mode,
                                   backend=backend)
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5, err_msg=backend)
    assert json.loads(ops.explain_quantized_matmul(x, wq, scales, b, mode=mode))["path"] in (
        "mlx", "metile")


def test_numpy_integers_for_group_size_and_bits(rng):
    # (found by a hostile test: np.int64(64), as a config gives it, was refused; MLX takes it)
    wq, s, b = quantized(rng, (8, 96), mx.float32, 32, 4)
    x = mx.array(rng.standard_normal((2, 96)).astype(np.float32))
    want = np.array(mx.quantized_matmul(x, wq, s, b, group_size=32, bits=4))
    for backend in ("auto", "metile", "mlx"):
        got = ops.quantized_matmul(x, wq, s, b, group_size=np.int64(32), bits=np.int32(4),
                                   backend=backend)
        np.testing.assert_allclose(np.array(got), want, rtol=3e-4, atol=3e-5)


def test_scales_and_biases_of_two_dtypes_run_mlx_op_under_auto(rng):
    wq, s, b = quantized(rng, (8, 96), mx.float16, 32, 4)
    x = mx.array(rng.standard_normal((2, 96)).astype(np.float32))
    b32 = b.astype(mx.float32)
    want = np.array(mx.quantized_matmul(x, wq, s, b32, group_size=32, bits=4))
    for backend in ("auto", "mlx"):
        got = ops.quantized_matmul(x, wq, s, b32, group_size=32, bits=4, backend=backend)
        np.testing.assert_array_equal(np.array(got), want)
    with pytest.raises(TypeError, match="scales and biases must share a float dtype"):
        ops.quantized_matmul(x, wq, s, b32, group_size=32, bits=4, backend="metile")


@pytest.mark.parametrize("bits", [0, 7, -4])
@pytest.mark.parametrize("backend", ["auto", "mlx"])
def test_bits_mlx_does_not_take_are_refused_before_mlx_runs(rng, bits, backend):
    # (found by a hostile test: bits=0 reached MLX's op, which divides by it - SIGFPE)
    wq, s, b = quantized(rng, (8, 96), mx.float32, 32, 4)
    with pytest.raises(ValueError, match=rf"bits={bits}: affine quantization takes bits "
                                         r"\(1, 2, 3, 4, 5, 6, 8\)"):
        ops.quantized_matmul(mx.zeros((2, 96)), wq, s, b, group_size=32, bits=bits,
                             backend=backend)


@pytest.mark.parametrize("backend", ["auto", "mlx", "metile"])
def test_bits_zero_in_other_modes_is_refused_before_mlx_runs(backend):
    # (found by a hostile test: mode="mxfp4" skipped the affine bits check, and bits=0
    # reached MLX's op, which divides by it - SIGFPE, the process died; MLX 0.32.4)
    w, s = mx.quantize(mx.ones((8, 64)), mode="mxfp4")
    with pytest.raises(ValueError, match=r"bits=0: mode='mxfp4' quantizes to at least 1 bit"):
        ops.quantized_matmul(mx.zeros((2, 64)), w, s, None, group_size=32, bits=0,
                             mode="mxfp4", backend=backend)


@pytest.mark.parametrize("case", ["K=0", "0 rows, bits 2", "0 rows, mixed scale dtypes"])
def test_empty_products_are_zeros_on_every_path(rng, case):
    # (found by a hostile test: MLX 0.32.4's op divides by zero evaluating an empty product,
    # SIGFPE, and "auto" handed it K=0 and every MLX-only setting with no rows)
    if case == "K=0":
        x, w, s, b = mx.zeros((3, 0)), mx.zeros((40, 0), mx.uint32), mx.zeros((40, 0)), \
            mx.zeros((40, 0))
        kw, backends = {}, ("auto", "metile", "mlx")
    else:
        w, s, b = mx.quantize(mx.array(rng.standard_normal((40, 128)).astype(np.float32)),
                              group_size=64, bits=2 if "bits 2" in case else 4)
        if "mixed" in case:
            s = s.astype(mx.float16)
        x = mx.zeros((0, 128))
        kw = {"bits": 2} if "bits 2" in case else {}
        backends = ("auto", "mlx")
    for backend in backends:
        got = ops.quantized_matmul(x, w, s, b, backend=backend, **kw)
        mx.eval(got)
        assert got.shape == (x.shape[0], 40) and got.dtype == mx.float32
        assert not np.array(got).any()


def test_what_mlx_takes_and_the_kernels_do_not_runs_mlx_op(rng):
    # (found by a hostile test: batched weights and integer x, which MLX's op takes, were
    # refused even under backend="mlx")
    w, s, b = mx.quantize(mx.array(rng.standard_normal((40, 128)).astype(np.float32)),
                          group_size=64, bits=4)
    batched = (mx.array(rng.standard_normal((2, 3, 128)).astype(np.float32)),
               mx.stack([w, w]), mx.stack([s, s]), mx.stack([b, b]))
    integers = (mx.array(rng.integers(-3, 3, (3, 128)).astype(np.int32)), w, s, b)
    for args in (batched, integers):
        want = mx.quantized_matmul(*args)
        for backend in ("auto", "mlx"):
            assert mx.array_equal(ops.quantized_matmul(*args, backend=backend), want)
        with pytest.raises((TypeError, ValueError), match="x has dtype|2-D uint32"):
            ops.quantized_matmul(*args, backend="metile")


def test_gemv_keeps_mlx_op_non_finite_pattern_and_range(rng):
    # (found by a hostile test: the GEMV's factored s sum(q x) + b sum(x) made one inf in x
    # NaN in every output and overflowed for |x| near 1e37, where the product is finite)
    w = mx.array((rng.standard_normal((64, 128)) / 11.3).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    W = np.array(mx.dequantize(wq, s, b, group_size=64, bits=4)).astype(np.float64)
    xs = rng.standard_normal((1, 128)).astype(np.float32)
    xs[0, 5] = np.inf
    x = mx.array(xs)
    got = np.array(ops.quantized_matmul(x, wq, s, b, backend="metile"))
    want = np.array(mx.quantized_matmul(x, wq, s, b))
    assert (W[:, 5] == 0).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    big = mx.array((rng.standard_normal((1, 128)) * 1e37).astype(np.float32))
    got = np.array(ops.quantized_matmul(big, wq, s, b, backend="metile")).astype(np.float64)
    ref = np.array(big).astype(np.float64) @ W.T
    assert np.isfinite(ref).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_settings_without_a_kernel_run_mlx_under_auto(rng):
    w = mx.array(rng.standard_normal((8, 96)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=32, bits=3)
    x = mx.array(rng.standard_normal((2, 96)).astype(np.float32))
    expected = mx.quantized_matmul(x, wq, s, b, group_size=32, bits=3)
    assert mx.array_equal(ops.quantized_matmul(x, wq, s, b, group_size=32, bits=3), expected)


# -- nn.convert ---------------------------------------------------------------------------------

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.down = nn.Linear(96, 64, bias=False)
        self.head = nn.Linear(64, 16)

    def __call__(self, x):
        return self.head(nn.silu(self.down(nn.relu(self.up(x)))))


@pytest.mark.parametrize("backend", ["auto", "metile"])
def test_convert_swaps_quantized_linear(rng, backend):
    mx.random.seed(1)
    model = Model()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p != "head")
    nn.quantize(model, group_size=64, bits=8, class_predicate=lambda p, m: p == "head")
    x = mx.array(rng.standard_normal((3, 5, 64)).astype(np.float32))
    expected = model(x)
    failure = mlx_compile_failure(expected)
    if failure is not None:
        pytest.skip(f"MLX's own quantized_matmul does not compile on this machine: {failure}")
    report = mnn.convert(model, backend=backend)
    assert sorted(report.converted) == ["down", "head", "up"]
    assert isinstance(model.up, mnn.QuantizedLinear) and model.up.backend == backend
    assert (model.head.bits, model.head.group_size) == (8, 64)
    y = model(x)
    if backend == "auto":   # no decision recorded: MLX's op, the same numbers
        assert mx.array_equal(y, expected)
    else:
        np.testing.assert_allclose(np.array(y), np.array(expected), rtol=3e-4, atol=3e-5)
    assert mnn.convert(model).skipped["up"] == "already a metile.nn.QuantizedLinear"


# -- CUDA ---------------------------------------------------------------------------------------

def test_bulk_x_config_takes_x_by_bulk_copies(monkeypatch):
    # a config's BULK_X: that config's fused GEMM takes x by bulk tensor copies beside the
    # threads' weight stores (the form METILE_MIXED_BULK=1 gives every fused GEMM), others
    # keep every thread's cp.async copies; where the backend is not CUDA, it changes nothing
    monkeypatch.setenv("METILE_BACKEND", "cuda")
    m, n, k = 256, 256, 128
    x = mx.zeros((m, k), mx.float16)
    wq, s, b = mx.quantize(mx.zeros((n, k), mx.float16), group_size=64, bits=4)

    def passes(config):
        d = quantized_ops._launch(x, wq, s, b, n, k, True, 64, 4, config, dispatch_only=True)
        assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
        return d.execution_report.passes

    tall = quantized_ops.WGMMA_PAIRS_TALL
    assert tall["BULK_X"] and "BULK_X" not in quantized_ops.WGMMA_PAIRS
    assert {"bulk_tensor_copies", "mixed_bulk_staging"} <= set(passes(tall))
    plain = passes({key: v for key, v in tall.items() if key != "BULK_X"})
    assert "bulk_tensor_copies" not in plain and "whole_group_copies" in plain
    assert "mixed_bulk_staging" not in passes(quantized_ops.WGMMA_PAIRS)
    monkeypatch.setenv("METILE_BACKEND", "msl")
    assert quantized_ops._bulk_x_backend().language == "msl"
    assert not quantized_ops._bulk_x_backend().mixed_bulk


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
def test_cuda_emission_compiles_with_nvrtc(monkeypatch):
    from metile_kernels import quantized as kernels
    x = mx.zeros((512, 4096), mx.float16)
    for transpose in (True, False):
        wq, s, b = mx.quantize(mx.zeros((256, 4096) if transpose else (4096, 256), mx.float16),
                               group_size=64, bits=4)
        for kind, config in (("matvec", quantized_ops.MATVEC if transpose else
                              quantized_ops.MATVEC_N), ("gemm", quantized_ops.CUDA_GEMM)):
            rows = 1 if kind == "matvec" else 512
            meta = {k: v for k, v in config.items() if k != "kernel"}
            if kind == "gemm":
                d = kernels.quantized_matmul[kernels.matmul_grid(rows, 256, 128, 128)].prepare(
                    x[:rows], wq, s, b, mx.zeros((rows, 256), mx.float16), rows, 256, 4096,
                    BITS=4, GROUP=64, TRANSPOSE=transpose, backend="cuda", **meta)
                info = d.variant.data["lowering"]["matmul"]
                assert info["fragment"].startswith("mma.sync"), info["fragment"]
            else:
                kern = kernels.quantized_matvec if transpose else kernels.quantized_matvec_n
                d = kern[kernels.matvec_grid(rows, 256, meta["BLOCK_N"])].prepare(
                    x[:rows], wq, s, b, mx.zeros((rows, 256), mx.float16), rows, 256, 4096,
                    BITS=4, GROUP=64, backend="cuda", **meta)
            ok, log = compile_cuda(translation_unit(d), "sm_90")
            assert ok, log
    # the fused GEMM on warpgroup MMA: its weight tile dequantized by the threads into the
    # K-major stage, 16 bytes a store; wgmma needs the arch-specific target
    wq, s, b = mx.quantize(mx.zeros((300, 4096), mx.float16), group_size=64, bits=4)
    meta = {k: v for k, v in quantized_ops.WGMMA_GEMM.items() if k != "kernel"}
    d = kernels.quantized_matmul[kernels.matmul_grid(200, 300, 128, 256)].prepare(
        x[:200], wq, s, b, mx.zeros((200, 300), mx.float16), 200, 300, 4096, BITS=4, GROUP=64,
        TRANSPOSE=True, backend="cuda", **meta)
    assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
    assert re.search(r"reinterpret_cast<uint4\*>\(&_sw\d+\[", d.source)
    ok, log = compile_cuda(translation_unit(d), "sm_90a")
    assert ok, log
    # ...and in packed pairs (K and N whole tiles): no spills, no serialized products
    meta = {k: v for k, v in quantized_ops.WGMMA_PAIRS.items() if k != "kernel"}
    wq, s, b = mx.quantize(mx.zeros((512, 4096), mx.float16), group_size=64, bits=4)
    from metile_kernels.quantized_pairs import unpack_constants
    pair_args = {key.lower() if key == "MAGIC" else key: v
                 for key, v in unpack_constants("float16").items()}   # (magic: an argument)
    d = kernels.quantized_matmul[kernels.matmul_grid(200, 512, 128, 256)].prepare(
        x[:200], wq, s, b, mx.zeros((200, 512), mx.float16), 200, 512, 4096, BITS=4, GROUP=64,
        TRANSPOSE=True, GROUP_SHIFT=6, backend="cuda", **meta, **pair_args)
    assert d.variant.data["lowering"]["matmul"]["fragment"].startswith("wgmma")
    # one packed word a staged group of 8 weights (its index k >> 3 is the group's): read
    # from memory by the group's store, or a K step ahead into a register the store reads
    assert "staging_loads_ahead" in d.execution_report.passes
    def words_ahead(src):
        """(packed-word loads, their writes to a register array, that array's reads)"""
        loaded = set(re.findall(r"const uint32_t (_v\d+) = w\[", src))
        sets = [a for a, v in re.findall(r"(_ahead\d+)\[\d+\] = (_v\d+);", src)
                if v in loaded]
        assert len(set(sets)) == 1   # (one array of words; scales and biases have theirs)
        return loaded, sets, re.findall(r"= %s\[\d+\];" % sets[0], src)

    loaded, sets, reads = words_ahead(d.source)
    stores = d.source.count("reinterpret_cast<uint4*>(&_sw")
    assert reads and len(loaded) - len(sets) + len(reads) == stores
    # each loop (whole-group copies, its checked twin) loads the words of its first step
    # before it and of the next in every step, and reads them once a step: a loop without
    # the first would read registers nothing wrote (the checked twin had lost it)
    assert len(sets) == 2 * len(reads)
    ok, log = compile_cuda(translation_unit(d), "sm_90a")
    assert ok, log
    assert "C7514" not in log and "C7515" not in log and "spill" not in log.replace(
        "0 bytes spill", "")
    # ...and loaded in the step that stores them (METILE_STAGING_AHEAD=0): a read a store
    monkeypatch.setenv("METILE_STAGING_AHEAD", "0")
    d = kernels.quantized_matmul[kernels.matmul_grid(200, 512, 128, 256)].prepare(
        x[:200], wq, s, b, mx.zeros((200, 512), mx.float16), 200, 512, 4096, BITS=4, GROUP=64,
        TRANSPOSE=True, GROUP_SHIFT=6, backend="cuda", **meta, **pair_args)
    assert "staging_loads_ahead" not in d.execution_report.passes and "_ahead" not in d.source
    assert len(re.findall(r"\bw\[", d.source)) == d.source.count("reinterpret_cast<uint4*>(&_sw")
    monkeypatch.delenv("METILE_STAGING_AHEAD")
    # ...and x by bulk tensor copies beside the threads' stores (METILE_MIXED_BULK=1): one
    # tensor map (x's), the words still read ahead, no spills, no serialized products
    monkeypatch.setenv("METILE_MIXED_BULK", "1")
    d = kernels.quantized_matmul[kernels.matmul_grid(200, 512, 128, 256)].prepare(
        x[:200], wq, s, b, mx.zeros((200, 512), mx.float16), 200, 512, 4096, BITS=4, GROUP=64,
        TRANSPOSE=True, GROUP_SHIFT=6, backend="cuda", **meta, **pair_args)
    passes = d.execution_report.passes
    assert {"bulk_tensor_copies", "mixed_bulk_staging", "staging_loads_ahead"} <= set(passes)
    _, sets, reads = words_ahead(d.source)   # (the bulk loop and both fallbacks)
    assert reads and len(sets) == 2 * len(reads)
    assert [m["box"] for m in d.variant.data["lowering"]["launch"]["tensor_maps"]] == [[64, 128]]
    ok, log = compile_cuda(translation_unit(d), "sm_90a")
    assert ok, log
    assert "C7514" not in log and "C7515" not in log and "spill" not in log.replace(
        "0 bytes spill", "")
    # the run-laid kernels at every packing they run (8-bit narrows float16's runs to 4)
    for bits, group in ((4, 32), (8, 128)):
        wq, s, b = mx.quantize(mx.zeros((256, 4096), mx.float16), group_size=group, bits=bits)
        launches = [kernels.dequantize[(1, 256 // per)].prepare(
            wq, s, b, mx.zeros((256, 4096), mx.float16), 256, 4096, BITS=bits, GROUP=group,
            BLOCK=4096, ROWS=per, num_warps=8, backend="cuda") for per in (1, 4)]
        for config in (quantized_ops.MATVEC_RUNS + quantized_ops.MATVEC_ROWS
                       + quantized_ops.MATVEC_WARPS):
            meta = {k: v for k, v in config.items() if k != "kernel"}
            kern = getattr(kernels, "quantized_" + config["kernel"])
            launches.append(kern[kernels.matvec_grid(1, 256, meta.get("ROWS", 1))].prepare(
                x[:1], wq, s, b, mx.zeros((1, 256), mx.float16), 1, 256, 4096, BITS=bits,
                GROUP=group, backend="cuda", **meta))
        for d in launches:
            assert "vectorize_rows" in d.execution_report.passes
            ok, log = compile_cuda(translation_unit(d), "sm_90")
            assert ok, log


@pytest.mark.parametrize("transpose", [True, False])
def test_a_mismatched_x_is_named_for_its_layout(rng, transpose):
    # (from a hostile test: with transpose=False the message asked for K a multiple of
    # group_size, which that layout does not need - its K is the packed matrix's rows)
    wq, s, b = quantized(rng, (8, 96), mx.float32, 32, 4)
    k = 96 if transpose else 8
    with pytest.raises(ValueError) as e:
        ops.quantized_matmul(mx.zeros((2, k + 1)), wq, s, b, transpose=transpose,
                             group_size=32, bits=4, backend="metile")
    assert f"x's last dimension is {k + 1}, but the quantized matrix has K={k}" in str(e.value)
    assert ("multiple of group_size" in str(e.value)) == transpose
    # (the hint was added under transpose=True even where x's K is a whole number of groups,
    # so only the mismatch was wrong)
    with pytest.raises(ValueError) as e:
        ops.quantized_matmul(mx.zeros((2, 64)), wq, s, b, transpose=True, group_size=32, bits=4,
                             backend="metile")
    assert "x's last dimension is 64, but the quantized matrix has K=96" in str(e.value)
    assert "multiple of group_size" not in str(e.value)


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
@pytest.mark.parametrize("dtype,bits", [(mx.float16, 4), (mx.float16, 8), (mx.bfloat16, 4)],
                         ids=str)
def test_pair_gemv_cuda_emission_compiles(dtype, bits):
    # the packed pairs become __hfma2 calls, no threadgroup memory in the loop (x is read
    # through a pointer broadcast over the rows, not a tile broadcast)
    from metile_kernels import quantized as kernels
    from metile_kernels import quantized_pairs as pairs
    wq, s, b = mx.quantize(mx.zeros((256, 4096), dtype), group_size=64, bits=bits)
    x = mx.zeros((1, 4096), dtype)
    name = str(dtype).removeprefix("mlx.core.")
    consts = pairs.pair_constants(name, bits)
    taken = ("MAGIC", "ONE", "SHIFT", "CENTRE", "ONE_HI", "SHIFT_HI", "IN_PLACE")
    d = pairs.quantized_matvec_pairs[kernels.matvec_grid(1, 256, 4)].prepare(
        x.view(mx.uint64), wq, s, b, mx.zeros((1, 256), dtype), 1, 256, 4096, consts["MAGIC"],
        BITS=bits, GROUP=64, ROWS=4, SPAN=2, DTYPE=getattr(metile, name), EVEN=True,
        num_warps=1, backend="cuda", **{k: consts[k] for k in taken})
    assert "__hfma2" in d.source
    # the K loop, up to the rows' sums after it
    loop = d.source[d.source.index("for ("):d.source.index("metile_lanes_sum")]
    assert "__syncthreads" not in loop
    ok, log = compile_cuda(translation_unit(d), "sm_90")
    assert ok, log


def test_explain_says_an_empty_product_is_zeros(rng):
    # (it reported the GEMV kernel, which the op never launches for no rows)
    wq, s, b = quantized(rng, (32, 64), mx.float32, 64, 4)
    info = json.loads(ops.explain_quantized_matmul(mx.zeros((0, 64)), wq, s, b,
                                                   backend="metile"))
    assert info["path"] == "zeros"
    assert ops.quantized_matmul(mx.zeros((0, 64)), wq, s, b, backend="metile").shape == (0, 32)
