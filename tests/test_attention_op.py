"""metile.ops.scaled_dot_product_attention (attention_ops.py, metile_kernels/attention.py)
against mx.fast.scaled_dot_product_attention and a float64 NumPy reference, on the CPU
runtime.

Reference: softmax(scale q kᵀ + mask) v in float64 from the (rounded) inputs, with MLX's
conventions: causal keeps key j for query i when j <= i + Lk - Lq; a removed key (causal
or boolean) scores float32's lowest finite value, so a row with every key removed
averages all values.  Tolerances: float32 is the strict FP32 one (rtol 3e-4, atol
3e-5); for 16-bit inputs the kernels round the probabilities to the input dtype before
the P·V product (as flash-attention kernels do) and the output once, so the tolerance
is a few units of that dtype's rounding: float16 2e-3, bfloat16 1.6e-2 (relative to
values of order 1).  The CUDA emission of each kernel is compiled with NVRTC.
"""


import json

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import attention_ops
from metile.runtime import routing
from nvrtc import TOOLKIT, compile_cuda, translation_unit

sdpa = metile.ops.scaled_dot_product_attention
TOL = {mx.float32: (3e-4, 3e-5), mx.float16: (2e-3, 2e-3), mx.bfloat16: (1.6e-2, 1.6e-2)}


def reference(q, k, v, scale, mask=None):
    q, k, v = (np.array(x.astype(mx.float32), np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = scale * q @ k.swapaxes(-1, -2)
    lq, lk = s.shape[-2:]
    lowest = np.finfo(np.float32).min
    if isinstance(mask, str):
        s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq), s, lowest)
    elif mask is not None and mask.dtype == mx.bool_:
        s = np.where(np.array(mask), s, lowest)
    elif mask is not None:
        s = s + np.array(mask.astype(mx.float32), np.float64)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def operands(rng, b, hq, hkv, lq, lk, d, dtype=mx.float32):
    def make(shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    return make((b, hq, lq, d)), make((b, hkv, lk, d)), make((b, hkv, lk, d))


def check(q, k, v, mask=None, scale=None, path=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if path is not None:
        info = json.loads(attention_ops.explain_attention(q, k, v, scale=scale, mask=mask,
                                                          backend="metile"))
        assert info["config"]["path"] == path
    out = sdpa(q, k, v, scale=scale, mask=mask, backend="metile")
    assert out.shape == q.shape and out.dtype == q.dtype
    rtol, atol = TOL[q.dtype]
    got = np.array(out.astype(mx.float32), np.float64)
    np.testing.assert_allclose(got, reference(q, k, v, scale, mask), rtol=rtol, atol=atol)
    mlx = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    np.testing.assert_allclose(got, np.array(mlx.astype(mx.float32)), rtol=2 * rtol,
                               atol=2 * atol)
    return out


# -- forward ------------------------------------------------------------------------------------

@pytest.mark.parametrize("lq,lk", [(1, 1), (7, 33), (33, 7), (33, 100), (100, 100)])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_ragged_lengths(rng, lq, lk, mask):
    check(*operands(rng, 1, 2, 2, lq, lk, 16), mask=mask)


@pytest.mark.parametrize("scale", [4.0, -4.0, 0.0])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_scale_signs(rng, scale, mask):
    # a positive scale lets whole key blocks take row maxima before scaling
    # (POSITIVE_SCALE); a negative or zero one must not (the maxima would be the minima;
    # at |scale| 4 the exponentials pass float32's range unless the true maximum is
    # subtracted, so taking the wrong one fails)
    check(*operands(rng, 1, 2, 2, 70, 150, 32), mask=mask, scale=scale, path="prefill")


def test_positive_scale_is_a_promise_the_kernel_default_does_not_make(rng):
    # the library kernel called directly with a negative scale and the default
    # POSITIVE_SCALE=False is right; the op passes True only for scale > 0
    import sys
    sys.path.insert(0, "kernels")
    from metile_kernels import attention as kernels
    q, k, v = operands(rng, 1, 2, 2, 64, 128, 32)
    out = kernels.attention_forward[kernels.forward_grid(64, 2, 1, 32)](
        q, k, v, q, mx.zeros(q.shape, q.dtype), 64, 128, 1, -4.0 * kernels.LOG2E, 0, 0, 0, 0,
        0, 0, HEAD_DIM=32, BLOCK_D=32, BLOCK_M=32, BLOCK_N=32)
    np.testing.assert_allclose(np.array(out, np.float64), reference(q, k, v, -4.0),
                               rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("heads,hkv,group", [(3, 3, 2), (4, 2, 4), (3, 1, 1)])
def test_causal_program_order(rng, heads, hkv, group):
    # HEAD_GROUP hands programs out in runs of heads, longest query blocks first: every
    # (head, block) is still computed once - a short last run (3 heads in runs of 2) and
    # grouped-query heads included; two batch entries (the order is per entry)
    import sys
    sys.path.insert(0, "kernels")
    from metile_kernels import attention as kernels
    q, k, v = operands(rng, 2, heads, hkv, 70, 90, 16)
    out = kernels.attention_forward[kernels.forward_grid(70, heads, 2, 16)](
        q, k, v, q, mx.zeros(q.shape, q.dtype), 70, 90, heads // hkv,
        0.25 * kernels.LOG2E, 0, 0, 0, 0, 0, 0, HEAD_DIM=16, BLOCK_D=16, BLOCK_M=16, BLOCK_N=16,
        MASK="causal", HEAD_GROUP=group)
    np.testing.assert_allclose(np.array(out, np.float64), reference(q, k, v, 0.25, "causal"),
                               rtol=3e-4, atol=3e-5)


def test_head_group_fits_the_l2_share():
    # 32 heads of 4096 keys x 128 float16: 2 MiB of keys and values a head -> runs of 8;
    # 8192 keys -> 4; grouped-query heads share theirs (4 query heads a key head -> 32);
    # never more than the heads there are, never below one
    assert attention_ops.head_group(32, 4096, 128, 2) == 8
    assert attention_ops.head_group(32, 8192, 128, 2) == 4
    assert attention_ops.head_group(32, 4096, 128, 2, group=4) == 32
    assert attention_ops.head_group(6, 64, 64, 2) == 6
    assert attention_ops.head_group(32, 1 << 22, 256, 4) == 1


@pytest.mark.parametrize("d", [64, 80])
def test_head_dims(rng, d):
    check(*operands(rng, 1, 2, 1, 33, 40, d), mask="causal", path="prefill")


@pytest.mark.parametrize("hkv", [1, 2])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_grouped_query_heads(rng, hkv, mask):
    check(*operands(rng, 2, 4, hkv, 9, 20, 16), mask=mask, path="prefill")


@pytest.mark.parametrize("shape", [(7, 33), (2, 1, 7, 33), (4, 7, 1), (1, 4, 1, 33)])
def test_boolean_masks_broadcast(rng, shape):
    q, k, v = operands(rng, 2, 4, 2, 7, 33, 16)
    mask = mx.array(rng.random(shape) > 0.4)
    check(q, k, v, mask=mask)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_additive_masks(rng, dtype):
    q, k, v = operands(rng, 1, 2, 1, 33, 7, 16, dtype)
    mask = mx.array(rng.standard_normal((2, 33, 7)).astype(np.float32)).astype(dtype)
    check(q, k, v, mask=mask)


def test_removed_rows_follow_mlx(rng):
    """A query whose every key is removed averages the values (MLX's finite lowest
    score); an additive -inf everywhere is NaN, as in MLX; causal with Lq > Lk removes
    every key of the first Lq - Lk queries."""
    q, k, v = operands(rng, 1, 1, 1, 7, 9, 16)
    keep = rng.random((7, 9)) > 0.5
    keep[2] = False
    out = check(q, k, v, mask=mx.array(keep))
    np.testing.assert_allclose(np.array(out)[0, 0, 2], np.array(v)[0, 0].mean(0), rtol=3e-4,
                               atol=3e-5)
    additive = np.zeros((7, 9), np.float32)
    additive[4] = -np.inf
    additive[5, :5] = -np.inf       # the first key block of the row is all -inf
    out = np.array(sdpa(q, k, v, scale=0.25, mask=mx.array(additive), backend="metile"))
    mlx = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25,
                                                        mask=mx.array(additive)))
    assert np.isnan(out[0, 0, 4]).all() and np.isnan(mlx[0, 0, 4]).all()
    np.testing.assert_allclose(np.delete(out, 4, axis=2), np.delete(mlx, 4, axis=2), rtol=6e-4,
                               atol=6e-5)
    check(*operands(rng, 1, 2, 1, 12, 5, 16), mask="causal")


@pytest.mark.parametrize("lq,lk,path", [(40, 40, "prefill"), (6, 100, "decode"),
                                         (3, 77, "decode_rows"), (1, 300, "decode_rows")])
def test_additive_masks_of_the_lowest_float(rng, lq, lk, path):
    """mlx.nn's additive causal mask holds float32's lowest value; in base 2 it overflows.
    A row it masks everywhere averages the values (MLX's finite sum), not NaN; float32's
    largest value keeps its key alone."""
    q, k, v = operands(rng, 1, 2, 2, lq, lk, 32)
    lowest, largest = np.finfo(np.float32).min, np.finfo(np.float32).max
    additive = np.where(np.arange(lk) < lk // 3, lowest, 0.0).astype(np.float32)
    additive = np.broadcast_to(additive, (lq, lk)).copy()
    additive[0] = lowest
    if lq > 1:
        additive[1, 5] = largest
    out = check(q, k, v, mask=mx.array(additive), path=path)
    np.testing.assert_allclose(np.array(out)[0, :, 0], np.array(v)[0, :, :].mean(1), rtol=3e-4,
                               atol=3e-5)
    if lq > 1:
        np.testing.assert_allclose(np.array(out)[0, :, 1], np.array(v)[0, :, 5], rtol=3e-4,
                                   atol=3e-5)
    # mlx.nn's causal mask plus a padding mask of the same lowest value
    import mlx.nn as nn
    mask = (nn.MultiHeadAttention.create_additive_causal_mask(lk)[-lq:]
            + mx.where(mx.arange(lk) < 1, lowest, 0.0))
    check(q, k, v, mask=mask, path=path)


def test_an_integer_query_is_mlx_op_s_under_auto(rng):
    # MLX promotes an int32 query beside float keys; the kernels take floats only
    q, k, v = operands(rng, 1, 2, 2, 3, 5, 16)
    qi = (q * 4).astype(mx.int32)
    want = mx.fast.scaled_dot_product_attention(qi, k, v, scale=0.25)
    got = sdpa(qi, k, v, scale=0.25)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.array(got), np.array(want))
    with pytest.raises(ValueError, match=r"unsupported type int32"):   # MLX's own refusal
        sdpa(qi, qi, qi, scale=0.25)


@pytest.mark.parametrize("lq", [6, 1])
@pytest.mark.parametrize("mask", [True, False, -1.0])
def test_a_0d_mask_and_a_1_element_scale(rng, lq, mask):
    # (found by a hostile test: a 0-d mask reached the kernel as a scalar argument and failed
    # to compile; MLX broadcasts it, and takes scale as a one-element array)
    q, k, v = operands(rng, 2, 4, 2, lq, 9, 16)
    m = mx.array(mask)
    out = sdpa(q, k, v, scale=mx.array(0.25), mask=m, backend="metile")
    np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.25, m), rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("backend", ["metile", "auto", "mlx"])
def test_a_0d_numpy_scale_as_mlx_takes_it(rng, backend):
    # (found by a hostile test: MLX's op takes a 0-d NumPy array as scale - np.load's
    # saved scalar; metile refused it as "scale must be a number" under every backend)
    q, k, v = operands(rng, 1, 4, 2, 3, 9, 16)
    out = sdpa(q, k, v, scale=np.array(0.25), backend=backend)
    np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.25), rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision(rng, dtype):
    check(*operands(rng, 1, 4, 2, 33, 40, 64, dtype), mask="causal")
    check(*operands(rng, 1, 4, 2, 1, 100, 64, dtype), path="decode_rows")
    check(*operands(rng, 1, 4, 2, 3, 100, 64, dtype), mask="causal", path="decode_rows")
    check(*operands(rng, 1, 4, 2, 6, 100, 64, dtype), path="decode")


def test_mixed_dtypes_promote_as_mlx(rng):
    q, k, v = operands(rng, 1, 2, 1, 7, 9, 16)
    out = sdpa(q.astype(mx.float16), k, v, scale=0.25, backend="metile")
    assert out.dtype == mx.float32
    np.testing.assert_allclose(np.array(out), reference(q.astype(mx.float16), k, v, 0.25),
                               rtol=3e-4, atol=3e-5)


def test_strided_and_empty_inputs(rng):
    """A (B, L, H, D) projection viewed as (B, H, L, D) is read correctly (copied to
    row-major); zero queries give an empty result of q's shape, as MLX's op."""
    q, k, v = operands(rng, 1, 9, 12, 4, 2, 16)     # (B, L, H, D): 9 queries, 12 keys
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    check(q, k, v, mask="causal")
    empty = sdpa(q[:, :, :0], k, v, scale=0.25, backend="metile")
    assert empty.shape == (1, 4, 0, 16)


# -- decode (split keys + combine) --------------------------------------------------------------

@pytest.mark.parametrize("hq,hkv,lq,mask", [(2, 2, 1, None), (4, 1, 1, "causal"),
                                            (4, 2, 3, "causal"), (4, 1, 2, "bool"),
                                            (4, 2, 1, "bool"), (2, 1, 1, "additive")])
def test_decode_splits_the_keys(rng, hq, hkv, lq, mask):
    lk = 1000
    q, k, v = operands(rng, 2, hq, hkv, lq, lk, 64)
    if mask == "bool":
        mask = mx.array(rng.random((2, hq, lq, lk)) > 0.3)
    elif mask == "additive":
        mask = mx.array(rng.standard_normal((hq, 1, lk)).astype(np.float32))
    assert attention_ops.split_count(2, hkv, lk, 64) > 1
    # a few queries: attention_decode (no matrix products) by default, and the split
    # kernel as the other candidate
    check(q, k, v, mask=mask, path="decode_rows")
    # (and the largest key block of attention_decode where it differs from the first)
    candidates = attention_ops.configs(q, k, v, attention_ops._mask_kind(mask))
    paths = [c["path"] for c in candidates]
    assert paths[0] == "decode_rows" and paths[-1] == "decode" and len(paths) in (2, 3)
    assert len({c.get("BLOCK_N") for c in candidates[:-1]}) == len(paths) - 1
    for cfg in candidates:
        got = attention_ops._launch(q, k, v, mask, 0.125, cfg)
        np.testing.assert_allclose(np.array(got), reference(q, k, v, 0.125, mask), rtol=1e-4,
                                   atol=1e-5)
    split = candidates[-1]
    # the split tile holds the program's rows (query heads per key/value head x
    # queries), rounded up to a power of two, not 16 of which most are padding
    rows = hq // hkv * lq
    assert split["BLOCK_M"] == {1: 1, 2: 2, 4: 4, 6: 8, 8: 8}[rows]


@pytest.mark.parametrize("lq,lk,mask", [(2, 300, "causal"), (3, 77, "causal"), (4, 130, "bool"),
                                         (2, 200, "additive"), (4, 4, "causal"), (3, 50, None)])
def test_a_few_queries_each_their_own_row(rng, lq, lk, mask):
    # speculative or chunked decoding: each query of each head its own attention_decode
    # row (a causal query stopping at its last visible key), GQA, ragged keys
    q, k, v = operands(rng, 2, 4, 2, lq, lk, 64)
    if mask == "bool":
        mask = mx.array(rng.random((2, 1, lq, lk)) > 0.3)
    elif mask == "additive":
        mask = mx.array(rng.standard_normal((4, lq, lk)).astype(np.float32))
    check(q, k, v, mask=mask, path="decode_rows")
    for splits, ahead in ((1, 1), (3, 1), (1, 2), (3, 2)):
        # (AHEAD=2: two key blocks loaded ahead of the one reduced)
        got = attention_ops._launch(q, k, v, mask, 0.125, {"path": "decode_rows", "BLOCK_N": 8,
                                                           "SPLITS": splits, "AHEAD": ahead})
        np.testing.assert_allclose(np.array(got), reference(q, k, v, 0.125, mask), rtol=1e-4,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="AHEAD .* must be 1 or 2, got 3"):
        attention_ops._launch(q, k, v, mask, 0.125, {"path": "decode_rows", "BLOCK_N": 8,
                                                     "AHEAD": 3})


def test_queries_that_see_no_key_take_the_split_kernel(rng):
    # causal with more queries than keys: the first queries see no key and MLX averages
    # every value there; attention_decode would leave them empty, so the split kernel runs
    q, k, v = operands(rng, 1, 2, 2, 4, 2, 32)
    assert [c["path"] for c in attention_ops.configs(q, k, v, "causal")] == ["decode"] * 2
    check(q, k, v, mask="causal", path="decode")
    # more queries than attention_decode takes first: the split kernel leads
    q, k, v = operands(rng, 1, 2, 2, attention_ops.ROWS_QUERIES + 1, 100, 32)
    assert attention_ops.configs(q, k, v)[0]["path"] == "decode"


@pytest.mark.parametrize("d,dtype", [(80, mx.float16), (128, mx.bfloat16), (96, mx.float32)])
def test_one_query_combines_rows_on_lanes(rng, d, dtype):
    # attention_decode's scores: each key's row of the (keys, head dim) block is summed by
    # the lanes that hold it (shuffles), not by one thread from threadgroup memory
    from metile_kernels import attention as kernels
    q, k, v = operands(rng, 1, 4, 2, 1, 300, d, dtype)
    check(q, k, v, path="decode_rows")
    for backend in ("msl", "cuda"):
        # (a key block both backends' threadgroup memory holds: the machine's own first
        # candidate may be one only CUDA's 48 KB fits)
        dispatch = kernels.attention_decode[kernels.decode_grid(3, 4)].prepare(
            q, k, v, mx.zeros((1,), mx.float32), mx.zeros((3, 4, d), mx.float32),
            mx.zeros((3, 4, 2), mx.float32), 300, 1, 4, 2, 128, 0.1, 4, 12, 0, 0, 0, 0, 0, 0,
            HEAD_DIM=d,
            BLOCK_D=attention_ops._head_block(d), BLOCK_N=32, num_warps=8, backend=backend)
        assert "metile_lanes_sum<" in dispatch.source, backend
        # its outputs proven covered: no written-mask outputs (and no merge after)
        assert "_written" not in dispatch.source, backend


@pytest.mark.parametrize("splits,d", [(1, 64), (5, 80), (9, 128), (64, 96), (80, 64)])
@pytest.mark.parametrize("combine", ["splits", "loop"])
def test_combines_agree(rng, splits, d, combine):
    # the merge of the splits' partial outputs: every split of a row at once (up to
    # COMBINE_SPLITS, ragged column blocks) or attention_combine's loop; both against NumPy
    lk = 8 * splits
    q, k, v = operands(rng, 1, 3, 3, 1, lk, d)
    config = {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": splits, "combine": combine}
    if combine == "splits" and splits > attention_ops.COMBINE_SPLITS:
        with pytest.raises(ValueError, match="merges at most 64 splits"):
            attention_ops._launch(q, k, v, None, 0.2, config)
        config.pop("combine")        # the default beyond the one-shot combine's limit
    got = attention_ops._launch(q, k, v, None, 0.2, config)
    np.testing.assert_allclose(np.array(got), reference(q, k, v, 0.2, None), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("combine", ["splits", "loop"])
@pytest.mark.parametrize("warps", [1, 4])
def test_combine_on_fewer_warps(rng, combine, warps):
    # a configuration's combine_warps (the plan's own count is a thread an element: 1024
    # for a (32, 32) block of the one-shot combine); both combines against NumPy
    q, k, v = operands(rng, 1, 5, 5, 1, 8 * 37, 80)
    config = {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": 37, "combine": combine,
              "combine_warps": warps}
    got = attention_ops._launch(q, k, v, None, 0.2, config)
    np.testing.assert_allclose(np.array(got), reference(q, k, v, 0.2, None), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("warps", [0, 3, 64, 2.0, True])
def test_combine_warps_are_checked(rng, warps):
    q, k, v = operands(rng, 1, 3, 3, 1, 16, 64)
    config = {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": 2, "combine_warps": warps}
    with pytest.raises(ValueError, match="combine_warps must be a power of two from 1 to 32"):
        attention_ops._launch(q, k, v, None, 0.2, config)


def test_an_unknown_combine_is_refused_by_name(rng):
    q, k, v = operands(rng, 1, 3, 3, 1, 16, 64)
    config = {"path": "decode_rows", "BLOCK_N": 8, "SPLITS": 2, "combine": "tree"}
    with pytest.raises(ValueError, match="combine must be 'splits' or 'loop', got 'tree'"):
        attention_ops._launch(q, k, v, None, 0.2, config)


def test_rows_split_count(monkeypatch):
    # attention_decode's splits: ~2048 warps over the rows' programs, or splits of 256 keys
    # up to 4x the warps; at most the one-shot combine's 64, each split at least four key
    # blocks
    assert attention_ops.rows_split_count(32, 4096, 8, 2) == 32
    assert attention_ops.rows_split_count(32, 16384, 8, 2) == 64
    assert attention_ops.rows_split_count(8, 4096, 8, 2) == 64
    assert attention_ops.rows_split_count(256, 4096, 8, 2) == 16
    assert attention_ops.rows_split_count(256, 1024, 8, 2) == 4
    assert attention_ops.rows_split_count(4096, 16384, 8, 2) == 1
    assert attention_ops.rows_split_count(1, 100, 8, 2) == 4
    assert attention_ops.rows_split_count(4096, 4096, 64, 16) == 1
    assert attention_ops.rows_warps(8, 128) == 2 and attention_ops.rows_warps(64, 128) == 16
    monkeypatch.setattr(attention_ops, "_on_cuda", lambda: True)
    assert attention_ops.rows_tiles(128, 2)[0] == {"path": "decode_rows", "BLOCK_N": 8}


def test_split_count():
    assert attention_ops.split_count(1, 32, 4096, 64) == 9       # 288 programs: the GPU twice
    assert attention_ops.split_count(1, 1, 100, 64) == 1          # too short to split
    assert attention_ops.split_count(64, 32, 4096, 64) == 1


# -- gradients ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [None, "causal", "bool", "additive"])
def test_gradients_match_mlx(rng, mask):
    q, k, v = operands(rng, 1, 4, 2, 7, 12, 16)
    if mask == "bool":
        mask = mx.array(rng.random((7, 12)) > 0.3)
    elif mask == "additive":
        mask = mx.array(rng.standard_normal((7, 12)).astype(np.float32))
    cot = mx.array(rng.standard_normal(q.shape).astype(np.float32))
    arrays = [q, k, v] + ([mask] if isinstance(mask, mx.array) else [])

    def loss(fn):
        def f(q, k, v, *m):
            return (fn(q, k, v, scale=0.3, mask=m[0] if m else mask) * cot).sum()
        return f

    ours = mx.grad(loss(lambda *a, **kw: sdpa(*a, backend="metile", **kw)),
                   argnums=tuple(range(len(arrays))))(*arrays)
    theirs = mx.grad(loss(mx.fast.scaled_dot_product_attention),
                     argnums=tuple(range(len(arrays))))(*arrays)
    for name, a, b in zip("qkvm", ours, theirs):
        if name == "m" and mask.dtype == mx.bool_:
            continue
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=3e-4, atol=3e-5,
                                   err_msg=f"d{name}")


def test_inside_compile(rng):
    q, k, v = operands(rng, 1, 2, 1, 7, 9, 16)
    f = mx.compile(lambda q, k, v: sdpa(q, k, v, scale=0.25, mask="causal", backend="metile")
                   + 1.0)
    np.testing.assert_allclose(np.array(f(q, k, v)), reference(q, k, v, 0.25, "causal") + 1.0,
                               rtol=3e-4, atol=3e-5)


# -- routing ------------------------------------------------------------------------------------

def test_auto_without_a_decision_is_mlx(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    routing.clear_memory()
    q, k, v = operands(rng, 1, 2, 1, 7, 9, 16)
    info = json.loads(attention_ops.explain_attention(q, k, v, scale=0.25))
    assert info["path"] == "mlx" and info["route"]["source"] == "cost_model"
    decision = attention_ops.tune_attention(q, k, v, scale=0.25, budget_s=0.02)
    assert decision["source"] == "measured" and "mlx" in decision["timings_us"]
    assert not decision["unusable"], decision["unusable"]    # the kernels validated
    again = json.loads(attention_ops.explain_attention(q, k, v, scale=0.25))
    assert again["route"]["source"] == "cache" and again["route"]["winner"] == decision["winner"]
    out = sdpa(q, k, v, scale=0.25)
    np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.25), rtol=3e-4, atol=3e-5)
    routing.clear_memory()


# -- bad inputs ---------------------------------------------------------------------------------

def _bad(rng):
    return operands(rng, 1, 4, 2, 3, 5, 16)


@pytest.mark.parametrize("change,error,message", [
    (lambda q, k, v: (q, k[..., :8], v[..., :8], {}), ValueError, "head dimensions differ"),
    (lambda q, k, v: (q[:, :3], k, v, {}), ValueError,
     r"query heads \(3\) must be a multiple of key/value heads \(2\)"),
    (lambda q, k, v: (q, k, v[:, :, :4], {}), ValueError, "must agree in batch, heads and length"),
    (lambda q, k, v: (q[0], k, v, {}), ValueError, "q must have rank 4"),
    (lambda q, k, v: (q.astype(mx.int32), k, v, {"backend": "metile"}), TypeError,
     "q has dtype"),

    (lambda q, k, v: (q, k, v, {"mask": "upper"}), ValueError, "mask must be None, 'causal'"),
    (lambda q, k, v: (q, k, v, {"mask": mx.zeros((2, 5))}), ValueError, "does not broadcast"),
    (lambda q, k, v: (q, k, v, {"mask": mx.zeros((3, 5))}), ValueError,   # (MLX's type)
     "must promote to the output dtype"),
    (lambda q, k, v: (q, k, v, {"backend": "triton"}), ValueError, "backend must be"),
])
def test_bad_inputs(rng, change, error, message):
    q, k, v = _bad(rng)
    q, k, v, kw = change(q, k, v)
    if "mask" in kw and isinstance(kw["mask"], mx.array) and kw["mask"].dtype == mx.float32:
        q, k, v = (x.astype(mx.float16) for x in (q, k, v))
    with pytest.raises(error, match=message):
        sdpa(q, k, v, scale=0.25, **kw)


@pytest.mark.parametrize("dv,dk", [(8, 16), (16, 160), (160, 160)])
def test_what_the_kernels_do_not_take_runs_mlx_on_auto(rng, dv, dk):
    # MLX's op takes a value head dimension of its own and heads wider than these kernels'
    # threadgroup memory: "auto" (the default) runs it, "metile" names what it cannot do
    q, k, _ = operands(rng, 1, 2, 2, 5, 9, dk)
    v = mx.array(rng.standard_normal((1, 2, 9, dv)).astype(np.float32))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    for backend in ("auto", "mlx"):
        got = sdpa(q, k, v, scale=0.25, mask="causal", backend=backend)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
    if dv == dk:
        try:   # (the H200's shared memory takes 160-wide float32 heads; Metal's 32 KiB not)
            attention_ops.configs(q, k, v, "causal")
            pytest.skip("this device's kernels take 160-wide float32 heads")
        except ValueError:
            pass
    route = json.loads(attention_ops.explain_attention(q, k, v, scale=0.25, mask="causal"))
    assert route["path"] == "mlx" and route["route"]["source"] == "unsupported"
    with pytest.raises(ValueError, match="one head dimension" if dv != dk else
                       r"head dimension 160 with 4-byte elements is not supported by metile's "
                       r"kernels: .* threadgroup memory, .* use backend='auto' or 'mlx'"):
        sdpa(q, k, v, scale=0.25, mask="causal", backend="metile")


def test_int32_offsets_limit():
    q, k = mx.zeros((1, 1, 2**16, 16)), mx.zeros((1, 1, 2**15, 16))
    mask = mx.broadcast_to(mx.array(True), (1, 1, 2**16, 2**15))    # lazy: never allocated
    with pytest.raises(ValueError, match="int32 offsets"):
        sdpa(q, k, k, scale=0.25, mask=mask, backend="metile")


# -- CUDA emission ------------------------------------------------------------------------------

@pytest.mark.skipif(TOOLKIT is None, reason="needs the nvidia-cuda-nvrtc wheels")
@pytest.mark.parametrize("mask", ["causal", "additive"])
def test_cuda_emission_compiles_with_nvrtc(mask):
    from metile_kernels import attention as kernels

    q, k = mx.zeros((1, 4, 64, 128), mx.float16), mx.zeros((1, 2, 64, 128), mx.float16)
    m = mx.zeros((64, 64), mx.float16)
    shape = dict(HEAD_DIM=128, BLOCK_D=128, MASK=mask)
    strides = (0, 0, 64, 1)
    dispatches = [
        kernels.attention_forward[(2, 4, 1)].prepare(
            q, k, k, m, mx.zeros(q.shape, mx.float16), 64, 64, 2, 0.1, *strides, 0, 0,
            BLOCK_M=64, BLOCK_N=64, backend="cuda", **shape),
        kernels.attention_split[(4, 2, 1)].prepare(
            q[:, :, :1], k, k, m, mx.zeros((4, 4, 128)), mx.zeros((4, 4, 2)), 1, 64, 2, 16,
            0.1, *strides, 0, 0, BLOCK_M=16, BLOCK_N=16, backend="cuda", **shape),
        kernels.attention_combine[(1,)].prepare(
            mx.zeros((4, 4, 128)), mx.zeros((4, 4, 2)), mx.zeros((4, 128), mx.float16), 4, 4,
            HEAD_DIM=128, BLOCK_D=128, backend="cuda"),
        kernels.attention_decode[kernels.decode_grid(4, 8)].prepare(
            q[:, :, :2], k, k, m, mx.zeros((4, 8, 128)), mx.zeros((4, 8, 2)), 64, 2, 4, 2, 16,
            0.1, 8, 32, *strides, 0, 0, BLOCK_N=8, num_warps=2, backend="cuda", **shape),
        kernels.attention_combine_splits[kernels.combine_grid(8, 128, 32)].prepare(
            mx.zeros((4, 8, 128)), mx.zeros((4, 8, 2)), mx.zeros((8, 128), mx.float16), 8, 4,
            HEAD_DIM=128, BLOCK_D=32, BLOCK_S=4, backend="cuda"),
    ]
    for d in dispatches:
        ok, log = compile_cuda(translation_unit(d), "sm_90")
        assert ok, log


def test_one_query_of_a_wide_head(rng):
    # head dim 256 in float32: past what any split tile holds on the CPU runtime (32 KiB of
    # threadgroup memory), within attention_decode's smallest key block
    q, k, v = operands(rng, 1, 2, 1, 1, 40, 256, mx.float32)
    check(q, k, v, path="decode_rows")
    assert attention_ops.configs(q, k, v)[0]["path"] == "decode_rows"


def test_decode_a_nan_key_poisons_its_head_only(rng):
    # the per-slot softmax (attention_decode): a NaN score stays NaN through the slot merge,
    # as in MLX's op; the other head is untouched
    q, k, v = operands(rng, 1, 2, 2, 1, 300, 64)
    kn = np.array(k)
    kn[0, 0, 17, 3] = np.nan
    k = mx.array(kn)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125)
    for cfg in attention_ops.configs(q, k, v):
        if cfg["path"] != "decode_rows":
            continue
        got = np.array(attention_ops._launch(q, k, v, None, 0.125, cfg))
        assert np.isnan(got[0, 0]).all() and np.isnan(np.array(want)[0, 0]).all()
        np.testing.assert_allclose(got[0, 1], reference(q, k, v, 0.125, None)[0, 1],
                                   rtol=1e-4, atol=1e-5)


def test_sinks_run_mlx_and_the_kernels_refuse_them(rng):
    # (from a hostile test: MLX 0.32's `sinks` was an unexpected keyword here)
    q, k, v = (mx.array(rng.standard_normal((1, 2, 3, 8)).astype(np.float32)) for _ in range(3))
    sinks = mx.array([0.5, -1.0])
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal", sinks=sinks)
    for backend in ("auto", "mlx"):
        got = metile.ops.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal",
                                                      sinks=sinks, backend=backend)
        np.testing.assert_array_equal(np.array(got), np.array(want))
    with pytest.raises(ValueError, match="the metile attention kernels have no attention sinks"):
        metile.ops.scaled_dot_product_attention(q, k, v, scale=0.3, sinks=sinks,
                                                backend="metile")


def test_float64_runs_mlx_op_under_auto():
    # MLX's op computes float64 (on the CPU); under "auto" the drop-in hands it over, as the
    # norms do, and backend="metile" names the dtype its kernels take
    q = mx.array(np.random.default_rng(5).standard_normal((1, 2, 3, 16)), mx.float64)
    with mx.stream(mx.cpu):
        want = np.array(mx.fast.scaled_dot_product_attention(q, q, q, scale=0.25))
        for backend in ("auto", "mlx"):
            got = metile.ops.scaled_dot_product_attention(q, q, q, scale=0.25, backend=backend)
            assert got.dtype == mx.float64
            np.testing.assert_array_equal(np.array(got), want)
        with pytest.raises(TypeError, match=r"q has dtype mlx.core.float64; supported"):
            metile.ops.scaled_dot_product_attention(q, q, q, scale=0.25, backend="metile")


# -- a hostile test (twenty-ninth session) --------------------------------------------------

def test_explain_follows_the_calls_that_run_mlx_op_before_routing(rng):
    ops = metile.ops
    # (explain_attention said 'metile' for an empty key length under backend="metile", and
    # refused a bool scale and an int query, where the op runs MLX's op for all three)
    q = mx.array(rng.standard_normal((1, 2, 8, 32)).astype(np.float32))
    k = mx.array(rng.standard_normal((1, 2, 16, 32)).astype(np.float32))
    empty = k[:, :, :0]
    info = json.loads(ops.explain_attention(q, empty, empty, scale=0.2, backend="metile"))
    assert info["path"] == "mlx"
    for call in (dict(q=q, scale=True), dict(q=q.astype(mx.int32), scale=0.2)):
        info = json.loads(ops.explain_attention(call["q"], k, k, scale=call["scale"]))
        assert info["path"] == "mlx" and info["route"]["reason"].startswith("MLX's op: an argument")
    got = ops.scaled_dot_product_attention(q, empty, empty, scale=0.2, backend="metile")
    assert got.shape == (1, 2, 8, 32)


@pytest.mark.parametrize("backend", ["auto", "mlx", "metile"])
@pytest.mark.parametrize("mask, lq", [(None, 1), ("causal", 4), ("causal", 40)])
def test_a_repeated_call_replays_without_routing(rng, monkeypatch, backend, mask, lq):
    # (eager decode calls the op with one signature every token: the checks and routing
    # cost ~20x MLX's own call, so a repeated signature replays its path: op_replay.py)
    from metile import op_replay
    routed, native = [], []
    real = attention_ops._route
    monkeypatch.setattr(attention_ops, "_route",
                        lambda *a, **k: routed.append(1) or real(*a, **k))
    monkeypatch.setattr(op_replay._REPLAYS, "observer", lambda op, kernel: native.append(kernel))
    for _ in range(3):
        q, k, v = operands(rng, 1, 4, 2, lq, 40, 16)
        out = sdpa(q, k, v, scale=0.3, mask=mask, backend=backend)
        np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.3, mask),
                                   rtol=3e-4, atol=3e-5)
    assert routed == [1]
    # the metile kernels' launches (a decode call's split kernel and merge, a prefill's
    # forward) replay natively; MLX's op from Python
    assert native == [backend == "metile"] * 2
    sdpa(q, k, v, scale=0.25, mask=mask, backend=backend)       # another option: routed
    sdpa(q, k, v, scale=0.3, mask=mx.ones((lq, 40), mx.bool_),  # a mask array keys none
         backend=backend)
    sdpa(q, k, v, scale=0.3, mask=mx.ones((lq, 40), mx.bool_), backend=backend)
    assert len(routed) == 4
    grad = mx.grad(lambda q: sdpa(q, k, v, scale=0.3, mask=mask, backend=backend).sum())(q)
    want = mx.grad(lambda q: mx.fast.scaled_dot_product_attention(
        q, k, v, scale=0.3, mask=mask).sum())(q)
    np.testing.assert_allclose(np.array(grad), np.array(want), rtol=1e-4, atol=1e-5)


def test_a_replay_of_mixed_dtypes_casts_as_the_first_call(rng, monkeypatch):
    # q float32 with float16 k, v: the kernels take the promoted arrays (casts the op
    # makes), so the replay is the op's Python path without its checks and routing
    from metile import op_replay
    native = []
    monkeypatch.setattr(op_replay._REPLAYS, "observer", lambda op, kernel: native.append(kernel))
    for _ in range(3):
        q, k, v = operands(rng, 1, 4, 4, 1, 33, 16)
        k, v = k.astype(mx.float16), v.astype(mx.float16)
        out = sdpa(q, k, v, scale=0.25, backend="metile")
        assert out.dtype == mx.float32
        np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.25), rtol=3e-4, atol=3e-5)
    assert native == [False, False]


# -- decode over a KV cache allocated ahead ------------------------------------------------------

def _nodes(out, label):
    import io
    dot = io.StringIO()
    mx.export_to_dot(dot, out)
    return dot.getvalue().count(f'label ="{label}"')


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("window", [(0, 100), (37, 251), (0, 300)])
def test_decode_reads_a_cache_prefix_in_place(rng, dtype, window):
    # a cache allocated ahead hands attention its prefix, buffer[..., a:b, :] (mlx_lm's
    # caches): a slice that is not row-contiguous, which the launch copied - every key and
    # value of every layer at every step.  The decode kernel now reads the buffer
    b, hq, hkv, alloc, d = 2, 8, 4, 300, 64
    a, end = window
    cache_k, cache_v, q = (mx.array(rng.standard_normal(s).astype(np.float32)).astype(dtype)
                           for s in ((b, hkv, alloc, d), (b, hkv, alloc, d), (b, hq, 1, d)))
    mx.eval(cache_k, cache_v, q)     # (a lazy q would take its own contiguous())
    step = mx.array(rng.standard_normal((b, hkv, 1, d)).astype(np.float32)).astype(dtype)
    cache_k[..., a:a + 1, :] = step       # this step's key and value, as a cache writes them
    cache_v[..., a:a + 1, :] = 2 * step
    k, v = cache_k[..., a:end, :], cache_v[..., a:end, :]
    lazy = sdpa(q, k, v, scale=d ** -0.5, backend="metile")
    assert _nodes(lazy, "Contiguous") == 0 and _nodes(lazy, "SliceUpdate") == 2, \
        (_nodes(lazy, "Contiguous"), _nodes(lazy, "SliceUpdate"))
    info = json.loads(attention_ops.explain_attention(q, k, v, scale=d ** -0.5,
                                                      backend="metile"))
    if (a, end) == (0, alloc):     # (MLX's whole-axis slice is the buffer itself)
        assert info["kv"]["read"] == "as given"
    else:
        assert info["kv"] == {"read": "cache buffer in place", "kv_pad": alloc - (end - a),
                              "kv_start": a}
    out = check(q, k, v, path="decode_rows")
    np.testing.assert_array_equal(np.array(lazy), np.array(out))
    np.testing.assert_array_equal(np.array(out), np.array(
        sdpa(q, mx.array(np.array(k)), mx.array(np.array(v)), scale=d ** -0.5, backend="metile")))


@pytest.mark.parametrize("make", [
    lambda ck, cv: (ck[..., 5:90, :], cv[..., 6:91, :]),           # k and v at other keys
    lambda ck, cv: (ck[..., 0:170:2, :], cv[..., 0:170:2, :]),     # a strided slice
    lambda ck, cv: (ck[:, :2, :85, :], cv[:, :2, :85, :]),          # a slice of the heads too
    lambda ck, cv: (ck[..., :85, :], mx.array(np.array(cv[..., :85, :]))),   # v not a slice
    lambda ck, cv: (ck.swapaxes(2, 2)[..., :85, :32], cv[..., :85, :32]),   # a slice of d
])
def test_decode_over_other_views_copies_them_and_is_right(rng, make):
    cache_k, cache_v = (mx.array(rng.standard_normal((1, 4, 200, 64)).astype(np.float32))
                        for _ in range(2))
    mx.eval(cache_k, cache_v)
    k, v = make(cache_k, cache_v)
    q = mx.array(rng.standard_normal((1, 4, 1, k.shape[-1])).astype(np.float32))
    info = json.loads(attention_ops.explain_attention(q, k, v, scale=0.2, backend="metile"))
    assert info["kv"]["read"] == "as given"
    check(q, k, v, path="decode_rows")


def test_decode_over_a_cache_prefix_differentiates_and_compiles(rng):
    cache_k, cache_v = (mx.array(rng.standard_normal((1, 4, 128, 32)).astype(np.float32))
                        for _ in range(2))
    q = mx.array(rng.standard_normal((1, 4, 1, 32)).astype(np.float32))
    mx.eval(cache_k, cache_v, q)

    def loss(attend):
        def f(q, ck, cv):
            return (attend(q, ck[..., :77, :], cv[..., :77, :]) ** 2).sum()
        return f
    ours = loss(lambda q, k, v: sdpa(q, k, v, scale=0.2, backend="metile"))
    theirs = loss(lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2))
    for got, want in zip(mx.grad(ours, argnums=(0, 1, 2))(q, cache_k, cache_v),
                         mx.grad(theirs, argnums=(0, 1, 2))(q, cache_k, cache_v)):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(mx.compile(ours)(q, cache_k, cache_v)),
                               np.array(theirs(q, cache_k, cache_v)), rtol=1e-5)


def test_repeated_decode_over_a_cache_prefix_replays_natively(rng, monkeypatch):
    # (an eager decode loop calls the op with the cache's prefix every layer: the replay
    # reads the buffer of each call's slice, and only of the slice it recorded)
    from metile import op_replay
    native = []
    monkeypatch.setattr(op_replay._REPLAYS, "observer", lambda op, kernel: native.append(kernel))
    cache_k, cache_v = (mx.array(rng.standard_normal((1, 4, 256, 32)).astype(np.float32))
                        for _ in range(2))
    q = mx.array(rng.standard_normal((1, 4, 1, 32)).astype(np.float32))
    mx.eval(cache_k, cache_v, q)
    calls = [(0, 100)] * 3 + [(20, 120)] * 2 + [(0, 100)]
    for a, b in calls:
        k, v = cache_k[..., a:b, :], cache_v[..., a:b, :]
        out = sdpa(q, k, v, scale=0.3, backend="metile")
        assert _nodes(out, "Contiguous") == 0
        np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.3), rtol=3e-4, atol=3e-5)
    # replayed natively: the second and third calls, and the second of the other slice
    # (its first call took the op's path and recorded it; the last call, a slice the replay
    # no longer holds, took the op's path again)
    assert native == [True, True, True]
    # an array that is no slice takes the op's path (a copy of the buffer would be stale)
    k = mx.array(np.array(cache_k[..., :100, :]))
    out = sdpa(q, k, cache_v[..., :100, :], scale=0.3, backend="metile")
    np.testing.assert_allclose(np.array(out), reference(q, k, cache_v[..., :100, :], 0.3),
                               rtol=3e-4, atol=3e-5)


def test_a_replayed_cache_prefix_of_another_buffer_is_read_right(rng):
    # the replay recorded a slice of a 256-key buffer; the same slice of a 300-key buffer
    # (same shapes for the op) or of a buffer whose layout is not row-contiguous must not
    # reuse its offsets
    q = mx.array(rng.standard_normal((1, 4, 1, 32)).astype(np.float32))
    buffers = [mx.array(rng.standard_normal(s).astype(np.float32))
               for s in ((1, 4, 256, 32), (1, 4, 256, 32), (1, 4, 300, 32), (1, 4, 300, 32),
                         (4, 1, 256, 32), (4, 1, 256, 32))]
    mx.eval(q, *buffers)
    pairs = [(buffers[0], buffers[1])] * 2 + [(buffers[2], buffers[3])] + \
        [(buffers[4].swapaxes(0, 1), buffers[5].swapaxes(0, 1))]
    for ck, cv in pairs:
        k, v = ck[..., 3:103, :], cv[..., 3:103, :]
        out = sdpa(q, k, v, scale=0.3, backend="metile")
        np.testing.assert_allclose(np.array(out), reference(q, k, v, 0.3), rtol=3e-4, atol=3e-5)
    # a gradient through the replay (its custom vjp's forward reads the buffers too)
    for _ in range(2):
        grad = mx.grad(lambda ck: sdpa(q, ck[..., 3:103, :], buffers[1][..., 3:103, :],
                                       scale=0.3, backend="metile").sum())(buffers[0])
        want = mx.grad(lambda ck: mx.fast.scaled_dot_product_attention(
            q, ck[..., 3:103, :], buffers[1][..., 3:103, :], scale=0.3).sum())(buffers[0])
        np.testing.assert_allclose(np.array(grad), np.array(want), rtol=1e-4, atol=1e-5)


def test_decode_in_a_compiled_call_reads_its_arguments_cache_in_place(rng):
    # a compiled call's argument is laid out as each call passes it: the kernels read the
    # buffer through the launch's contiguous() (a share when row-contiguous, a copy else)
    base = mx.array(rng.standard_normal((1, 4, 128, 32)).astype(np.float32))
    strided = mx.array(rng.standard_normal((1, 128, 4, 32)).astype(np.float32)).swapaxes(1, 2)
    values = mx.array(rng.standard_normal((1, 4, 128, 32)).astype(np.float32))
    q = mx.array(rng.standard_normal((1, 4, 1, 32)).astype(np.float32))
    mx.eval(base, strided, values, q)
    seen = {"traced": [], "eager": []}

    def step(q, ck, cv, how="traced"):
        k, v = ck[..., 5:82, :], cv[..., 5:82, :]
        seen[how].append(json.loads(attention_ops.explain_attention(
            q, k, v, scale=0.2, backend="metile"))["kv"]["read"])
        return sdpa(q, k, v, scale=0.2, backend="metile")
    compiled = mx.compile(step)
    for ck in (base, strided, base):
        want = reference(q, ck[..., 5:82, :], values[..., 5:82, :], 0.2)
        np.testing.assert_allclose(np.array(compiled(q, ck, values)), want, rtol=3e-4, atol=3e-5)
        np.testing.assert_allclose(np.array(step(q, ck, values, "eager")), want, rtol=3e-4,
                                   atol=3e-5)
    # traced (the compiled call's arguments: layout unknown): in place; eager, the
    # evaluated strided buffer is known not row-contiguous: its slice is copied
    assert set(seen["traced"]) == {"cache buffer in place"}
    assert seen["eager"] == ["cache buffer in place", "as given", "cache buffer in place"]


@pytest.mark.parametrize("mask", [None, "causal", "bool", "additive"])
def test_a_cache_prefix_in_place_with_masks_gqa_and_batches(rng, mask):
    # three queries of six heads over two key heads, two batch entries, keys 17..150 of
    # 200: the masks index keys as the prefix's, not the buffer's
    cache_k, cache_v = (mx.array(rng.standard_normal((2, 2, 200, 48)).astype(np.float32))
                        for _ in range(2))
    q = mx.array(rng.standard_normal((2, 6, 3, 48)).astype(np.float32))
    mx.eval(cache_k, cache_v, q)
    if mask == "bool":
        mask = mx.array(rng.random((3, 133)) > 0.3)
    elif mask == "additive":
        mask = mx.array(rng.standard_normal((2, 6, 3, 133)).astype(np.float32))
    k, v = cache_k[..., 17:150, :], cache_v[..., 17:150, :]
    info = json.loads(attention_ops.explain_attention(q, k, v, scale=0.3, mask=mask,
                                                      backend="metile"))
    assert info["config"]["path"] == "decode_rows"
    assert info["kv"] == {"read": "cache buffer in place", "kv_pad": 67, "kv_start": 17}
    out = sdpa(q, k, v, scale=0.3, mask=mask, backend="metile")
    np.testing.assert_allclose(np.array(out), reference(q, cache_k[..., 17:150, :],
                                                        cache_v[..., 17:150, :], 0.3, mask),
                               rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("path,lq", [("prefill", 24), ("decode", 2)])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_prefill_and_split_kernels_read_a_cache_prefix_in_place(rng, path, lq, mask):
    # queries over keys 9..129 of a 160-key cache (a chunk of a prefill, or a speculative
    # step on the split-K kernel): the flash forward and the split kernel read the buffer
    cache_k, cache_v = (mx.array(rng.standard_normal((2, 2, 160, 32)).astype(np.float32))
                        for _ in range(2))
    q = mx.array(rng.standard_normal((2, 4, lq, 32)).astype(np.float32))
    mx.eval(cache_k, cache_v, q)
    k, v = cache_k[..., 9:129, :], cache_v[..., 9:129, :]
    config = next(c for c in attention_ops.configs(q, k, v, "causal" if mask else "none")
                  if c["path"] == path)
    lazy = attention_ops._run(q, k, v, 0.3, mask, config)
    # (the split path's own buffers take theirs: no more than with evaluated k and v)
    copies = (mx.array(np.array(cache_k[..., 9:129, :])),
              mx.array(np.array(cache_v[..., 9:129, :])))
    assert _nodes(lazy, "Contiguous") == _nodes(
        attention_ops._run(q, *copies, 0.3, mask, config), "Contiguous")
    info = json.loads(attention_ops.explain_attention(q, k, v, scale=0.3, mask=mask,
                                                      backend="metile"))
    assert info["kv"] == {"read": "cache buffer in place", "kv_pad": 40, "kv_start": 9}
    np.testing.assert_allclose(np.array(lazy), reference(q, cache_k[..., 9:129, :],
                                                         cache_v[..., 9:129, :], 0.3, mask),
                               rtol=3e-4, atol=3e-5)


def test_a_cache_past_32_bit_offsets_is_read_through_its_prefix(monkeypatch):
    # (the kernels address a buffer with 32-bit offsets: a buffer larger than a launch
    # takes goes as the prefix's copy, which may still fit)
    from metile import attention_ops as ops_module
    monkeypatch.setattr(ops_module, "MAX_BUFFER_ELEMENTS", 4 * 160 * 32 - 1)
    cache_k, cache_v = (mx.zeros((1, 4, 160, 32)) for _ in range(2))
    q = mx.zeros((1, 4, 1, 32))
    mx.eval(cache_k, cache_v, q)
    assert ops_module._cache_buffers(cache_k[..., :100, :], cache_v[..., :100, :])[2] is None
    monkeypatch.setattr(ops_module, "MAX_BUFFER_ELEMENTS", 4 * 160 * 32)
    assert ops_module._cache_buffers(cache_k[..., :100, :], cache_v[..., :100, :])[2] == (60, 0)
