"""Triton's launch surface and device functions (issue 15, item 10).

* `num_warps=` at launch is `num_simdgroups=` (a warp and a SIMD-group are both 32
  lanes); `num_stages=` is `Schedule(num_stages=)`, merged with a SCHEDULE given;
  the same keywords in `metile.Config` for autotuning.  A kernel with parameters of
  those names receives them as arguments.
* A `@metile.kernel` called from a kernel is a device function (Triton's @jit
  functions calling each other): its body is inlined, constexprs bound from the call.
* `metile.cdiv` and `metile.next_power_of_2` on the host and in kernels.

Numbers on the MSL CPU runtime against NumPy; errors by their message.
"""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import CompilationError, LaunchError, Schedule
from metile.runtime.nvrtc import run_nvrtc
from metile_kernels.gemm import grid as gemm_grid, matmul
from nvrtc import TOOLKIT, translation_unit
from test_gemm import check, operands

RAGGED = (1, 7, 63, 65, 1000)


@metile.kernel
def scaled_copy(X, Y, n, alpha, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * alpha, mask=mask)


def launch_copy(n, **options):
    x = np.arange(n, dtype=np.float32)
    return x, scaled_copy[(metile.cdiv(n, 128),)](mx.array(x), mx.zeros((n,)), n, 2.0,
                                                  BLOCK=128, **options)


# -- num_warps / num_stages at launch -----------------------------------------------------------

@pytest.mark.parametrize("warps", [1, 2, 4])
def test_num_warps_is_num_simdgroups(warps):
    x = mx.ones((65,))
    d = scaled_copy[(1,)].prepare(x, mx.zeros((65,)), 65, 1.0, BLOCK=128, num_warps=warps)
    same = scaled_copy[(1,)].prepare(x, mx.zeros((65,)), 65, 1.0, BLOCK=128,
                                     num_simdgroups=warps)
    assert d.schedule_plan.threadgroup_size == same.schedule_plan.threadgroup_size == \
        (32 * warps, 1, 1)
    x, y = launch_copy(1000, num_warps=warps)
    np.testing.assert_array_equal(np.array(y), 2 * x)
    _, y = launch_copy(65, num_warps=warps, num_simdgroups=warps)  # agreeing: fine
    np.testing.assert_array_equal(np.array(y), 2 * np.arange(65))


@pytest.mark.parametrize("options, message", [
    (dict(num_warps=2, num_simdgroups=4), "num_warps=2 contradicts num_simdgroups=4"),
    (dict(num_warps=8, NUM_SG=4), "num_warps=8 contradicts num_simdgroups=4"),
    (dict(num_warps=0), "num_warps must be an int in 1..32, got 0"),
    (dict(num_warps=2.0), "num_warps must be an int in 1..32, got 2.0"),
    (dict(num_stages=2, SCHEDULE=Schedule(num_stages=3)),
     "num_stages=2 contradicts the SCHEDULE's num_stages=3"),
    (dict(num_stages=9), "num_stages=9: Schedule: num_stages must be from 1 through 8, got 9"),
    (dict(num_stages=2, SCHEDULE="fast"), "SCHEDULE must be a metile.Schedule, got str"),
])
def test_launch_option_errors(options, message):
    with pytest.raises(LaunchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launch_copy(8, **options)


def test_num_stages_on_a_kernel_without_k_loop_warns_and_runs():
    # Triton ignores num_stages where nothing is pipelined; a Triton launch runs here too,
    # and the warning says why the option is not honoured
    with pytest.warns(UserWarning, match="num_stages=2 is not honoured for kernel 'scaled_copy' "
                                         "and is ignored .*cannot honour num_stages=2: this "
                                         "elementwise kernel has no staged K loop"):
        x, y = launch_copy(9, num_stages=2)
    np.testing.assert_allclose(np.array(y), x * 2.0)
    # one stage is no pipelining, so it is met: no warning (a trial saw ~70 under autotune)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, y = launch_copy(9, num_stages=1)
    np.testing.assert_allclose(np.array(y), x * 2.0)
    # written into an explicit Schedule it is a requirement, refused by name
    with pytest.raises(CompilationError, match="cannot honour num_stages=2: this elementwise "
                                               "kernel has no staged K loop"):
        launch_copy(8, SCHEDULE=Schedule(num_stages=2))


@pytest.mark.parametrize("stages", [1, 2])
def test_num_stages_sets_the_gemm_stages(rng, stages):
    m, n, k = 75, 45, 37
    a, b, ref = operands(rng, m, n, k, "float16")
    tile = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
    d = matmul[gemm_grid(m, n, 32, 32)].prepare(a, b, mx.zeros((m, n)), m, n, k, **tile,
                                                num_stages=stages, num_warps=4)
    check(d(), ref)
    assert d.schedule_plan.num_stages == stages and d.schedule_plan.num_simdgroups == 4
    # merged with a SCHEDULE that states other fields (and agrees on num_stages)
    merged = matmul[gemm_grid(m, n, 32, 32)].prepare(
        a, b, mx.zeros((m, n)), m, n, k, **tile, num_stages=stages,
        SCHEDULE=Schedule(staging="threadgroup", num_stages=stages))
    check(merged(), ref)
    assert merged.schedule_plan.num_stages == stages
    assert merged.schedule_plan.staging == "threadgroup"


@metile.kernel
def named_like_options(Y, num_warps, num_stages: metile.constexpr):
    offs = metile.arange(0, 8)
    metile.store(Y + offs, offs * 0 + num_warps * 10 + num_stages)


def test_parameters_named_like_the_options_are_arguments():
    y = named_like_options[(1,)](mx.zeros((8,), mx.int32), num_warps=7, num_stages=9)
    np.testing.assert_array_equal(np.array(y), np.full(8, 79))
    y = named_like_options[(1,)](mx.zeros((8,), mx.int32), 3, 4)
    np.testing.assert_array_equal(np.array(y), np.full(8, 34))


# -- Config(num_warps=, num_stages=) ---------------------------------------------------------------

def copy_grid(meta):
    return (metile.cdiv(meta["n"], meta["BLOCK"]),)


def test_config_num_warps_autotunes(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(
        configs=[metile.Config(BLOCK=64, num_warps=2), metile.Config(BLOCK=256, num_warps=8),
                 # nothing to pipeline in this elementwise kernel: runs without it, warning
                 # (Triton ignores num_stages there)
                 metile.Config(BLOCK=64, num_warps=2, num_stages=2)],
        warmup=1, reps=1)(scaled_copy)
    x = np.arange(1000, dtype=np.float32)
    with pytest.warns(UserWarning, match="num_stages=2 is not honoured for kernel 'scaled_copy'"):
        out = tuned[copy_grid](mx.array(x), mx.zeros((1000,)), 1000, 0.5)
    np.testing.assert_array_equal(np.array(out), 0.5 * x)
    result = tuned.last_result
    assert set(result.timings) == {"Config(BLOCK=64,num_warps=2)",
                                   "Config(BLOCK=256,num_warps=8)",
                                   "Config(BLOCK=64,num_stages=2,num_warps=2)"}
    assert scaled_copy.schedule_plan.threadgroup_size[0] in (64, 256)


def test_config_num_stages_autotunes_a_gemm(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tile = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
    tuned = metile.autotune(configs=[metile.Config(**tile, num_stages=1, num_warps=4),
                                     metile.Config(**tile, num_stages=2, num_warps=4)],
                            warmup=1, reps=1)(matmul)
    m, n, k = 65, 63, 37
    a, b, ref = operands(rng, m, n, k, "float32")
    check(tuned[gemm_grid(m, n, 32, 32)](a, b, mx.zeros((m, n)), m, n, k), ref)
    assert len(tuned.last_result.timings) == 2 and not tuned.last_result.unusable


def test_launch_options_of_a_tuned_call_enter_the_tuning_key(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128)],
                            warmup=1, reps=1)(scaled_copy)
    x = np.arange(100, dtype=np.float32)
    tuned[copy_grid](mx.array(x), mx.zeros((100,)), 100, 1.0)
    plain = tuned.last_result.key
    out = tuned[copy_grid](mx.array(x), mx.zeros((100,)), 100, 1.0, num_warps=2)
    np.testing.assert_array_equal(np.array(out), x)
    assert tuned.last_result.key != plain and not tuned.last_result.from_cache
    assert scaled_copy.schedule_plan.threadgroup_size == (64, 1, 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_warps=64), "Config: num_warps must be an int from 1 through 32, got 64"),
    (dict(num_warps=4, num_simdgroups=8), "Config: num_warps=4 contradicts num_simdgroups=8"),
    (dict(num_warps=4, NUM_SG=2), "Config: num_warps=4 contradicts num_simdgroups=2"),
    (dict(num_stages=0), "Config: num_stages must be an int from 1 through 8, got 0"),
])
def test_config_option_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        metile.Config(BLOCK=64, **kwargs)


# -- a kernel called from a kernel -----------------------------------------------------------------

@metile.kernel
def axpy_values(x, y, alpha):
    return alpha * x + y


@metile.kernel
def store_block(X, Y, n, scale, BLOCK: metile.constexpr, SHIFT: metile.constexpr = 0):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * scale + SHIFT, mask=mask)


@metile.kernel
def calls_value_kernel(X, Y, Z, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(X + offs, mask=mask)
    y = metile.load(Y + offs, mask=mask)
    metile.store(Z + offs, axpy_values(x, y, 3.0), mask=mask)


@metile.kernel
def calls_storing_kernel(X, Y, Z, n, BLOCK: metile.constexpr):
    # positional constexpr, then keyword constexprs; the callee's default for SHIFT
    store_block(X, Y, n, 2.0, BLOCK)
    store_block(X, Z, n, -1.0, BLOCK=BLOCK, SHIFT=BLOCK // 2)


@pytest.mark.parametrize("n", RAGGED)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernel_returning_a_value(rng, n, dtype):
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    z = calls_value_kernel[(metile.cdiv(n, 64),)](mx.array(x), mx.array(y),
                                                  mx.zeros((n,), getattr(mx, dtype)), n, BLOCK=64)
    ref = (3.0 * x.astype(np.float32) + y.astype(np.float32)).astype(dtype)
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == "float16" else dict(rtol=3e-4, atol=3e-5)
    np.testing.assert_allclose(np.array(z).astype(np.float32), ref.astype(np.float32), **tol)


@pytest.mark.parametrize("n", RAGGED)
def test_kernel_that_stores(n):
    x = np.arange(n, dtype=np.float32)
    y, z = calls_storing_kernel[(metile.cdiv(n, 32),)](mx.array(x), mx.zeros((n,)),
                                                       mx.full((n,), 5.0), n, BLOCK=32)
    np.testing.assert_array_equal(np.array(y), 2 * x)
    np.testing.assert_array_equal(np.array(z), -x + 16)


@metile.kernel
def first_half(X, Y, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    if pid * BLOCK >= n // 2:
        return
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs) + 100.0, mask=offs < n // 2)


@metile.kernel
def calls_early_returning_kernel(X, Y, Z, n, BLOCK: metile.constexpr):
    first_half(X, Y, n, BLOCK)
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Z + offs, metile.load(X + offs, mask=offs < n), mask=offs < n)


@pytest.mark.parametrize("n", [1, 7, 40, 65])
def test_return_in_a_called_kernel_returns_to_the_caller(n):
    x = np.arange(n, dtype=np.float32)
    y, z = calls_early_returning_kernel[(metile.cdiv(n, 8),)](
        mx.array(x), mx.full((n,), -1.0), mx.zeros((n,)), n, BLOCK=8)
    half = n // 2
    np.testing.assert_array_equal(np.array(y), np.concatenate([x[:half] + 100, -np.ones(n - half)]))
    np.testing.assert_array_equal(np.array(z), x)


@metile.kernel
def calls_with_runtime_constexpr(X, Y, n):
    store_block(X, Y, n, 1.0, n)


@metile.kernel
def calls_with_launch_option(X, Y, n):
    store_block(X, Y, n, 1.0, BLOCK=8, num_warps=4)


@metile.kernel
def recursive_kernel(X, DEPTH: metile.constexpr):
    recursive_kernel(X, DEPTH)


@pytest.mark.parametrize("kernel, message", [
    (calls_with_runtime_constexpr,
     r"store_block\(\): constexpr parameter 'BLOCK' needs a compile-time value, got a runtime "
     r"int32 value"),
    (calls_with_launch_option,
     r"store_block\(\): got an unexpected keyword argument 'num_warps'"),
])
def test_kernel_call_errors_are_located(kernel, message):
    with pytest.raises(CompilationError, match=message) as info:
        kernel[(1,)](mx.zeros((8,)), mx.zeros((8,)), 8)
    assert "store_block(" in str(info.value)  # the caret line is the call


def test_recursive_kernel_call_is_refused():
    with pytest.raises(CompilationError, match=r"@metile.inline helpers and kernels called from "
                                               r"kernels nest more than 32 deep \(recursion\?\)"):
        recursive_kernel[(1,)](mx.zeros((8,)), DEPTH=1)


FACTOR = 2.0


@metile.kernel
def scale_by_factor(x):
    return x * FACTOR


@metile.kernel
def calls_factor_kernel(X, Y):
    offs = metile.arange(0, 8)
    metile.store(Y + offs, scale_by_factor(metile.load(X + offs)))


def test_a_changed_global_of_the_called_kernel_recompiles_the_caller(monkeypatch):
    x = np.arange(8, dtype=np.float32)
    y = calls_factor_kernel[(1,)](mx.array(x), mx.zeros((8,)))
    np.testing.assert_array_equal(np.array(y), 2 * x)
    monkeypatch.setitem(globals(), "FACTOR", 5.0)
    y = calls_factor_kernel[(1,)](mx.array(x), mx.zeros((8,)))
    np.testing.assert_array_equal(np.array(y), 5 * x)


# -- cdiv and next_power_of_2 ----------------------------------------------------------------------

@metile.kernel
def rounding(Y, n, BLOCK: metile.constexpr):
    WIDTH: metile.constexpr = metile.next_power_of_2(BLOCK)
    width = metile.sum(metile.arange(0, WIDTH) * 0 + 1)  # a tile of that many elements
    programs = metile.cdiv(n, BLOCK)  # a runtime int
    offs = metile.arange(0, 8)
    metile.store(Y + offs, offs * 0 + programs * 1000 + width + metile.cdiv(BLOCK, 3))


@pytest.mark.parametrize("n", RAGGED)
@pytest.mark.parametrize("block", [3, 8, 33])
def test_cdiv_and_next_power_of_2_in_a_kernel(n, block):
    y = rounding[(1,)](mx.zeros((8,), mx.int32), n, BLOCK=block)
    width = 1 << (block - 1).bit_length()
    expected = -(-n // block) * 1000 + width + -(-block // 3)
    np.testing.assert_array_equal(np.array(y), np.full(8, expected))


def test_cdiv_and_next_power_of_2_on_the_host():
    assert [metile.cdiv(a, b) for a, b in ((0, 4), (1, 4), (4, 4), (5, 4), (1000, 7))] == \
        [0, 1, 1, 2, 143]
    assert [metile.next_power_of_2(v) for v in (0, 1, 2, 3, 64, 65, 1000)] == \
        [1, 1, 2, 4, 64, 128, 1024]


# -- Triton porting surface (a hostile port, thirty-first session) ------------------------------

def test_config_takes_tritons_dict_form():
    # (Config({"BLOCK": 32}, num_warps=1) was refused as "num_simdgroups must be an int")
    c = metile.Config({"BLOCK": 32}, num_warps=1)
    assert c == metile.Config(BLOCK=32, num_warps=1) and c.meta == {"BLOCK": 32, "num_warps": 1}
    with pytest.raises(ValueError, match="Config: BLOCK given in the dict and as a keyword"):
        metile.Config({"BLOCK": 32}, BLOCK=64)


@metile.kernel
def maybe_bias(X, B, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)
    if B is not None:
        x = x + metile.load(B + offs, mask=offs < n)
    metile.store(Y + offs, x, mask=offs < n)


def test_none_for_an_optional_pointer_is_a_constexpr_none():
    # (None was refused: "expected an mx.array or a Python int/float/bool, got NoneType");
    # Triton specializes a None argument as a constexpr, so `B is not None` folds
    x = np.arange(100, dtype=np.float32)
    b = np.linspace(-1, 1, 100).astype(np.float32)
    for bias, want in ((None, x), (mx.array(b), x + b), (None, x)):
        out = maybe_bias[(2,)](mx.array(x), bias, mx.zeros((100,)), 100, BLOCK=64)
        np.testing.assert_array_equal(np.array(out), want)
    d = maybe_bias[(2,)].prepare(mx.array(x), None, mx.zeros((100,)), 100, BLOCK=64)
    assert d.spec.constexprs["B"] is None
    np.testing.assert_array_equal(np.array(d(mx.array(2 * x), None, mx.zeros((100,)), 100)),
                                  2 * x)
    with pytest.raises(CompilationError, match=r"unsupported operand: NoneType None and a "
                                               r"tile.*\(the constant is constexpr X=None\)"):
        scaled_copy[(1,)](None, mx.zeros((8,)), 8, 2.0, BLOCK=8)


@metile.heuristics(values={"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})
@metile.kernel
def even_or_masked(X, Y, n, BLOCK: metile.constexpr, EVEN: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    if EVEN:
        metile.store(Y + offs, metile.load(X + offs) * 2.0)
    else:
        metile.store(Y + offs, metile.load(X + offs, mask=offs < n) * 3.0, mask=offs < n)


def test_heuristics_compute_meta_parameters_from_the_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))   # (autotune measures afresh)
    # (metile.heuristics did not exist: ported @triton.heuristics(EVEN_K=...) kernels failed)
    x = np.arange(128, dtype=np.float32)
    for n, factor in ((128, 2.0), (100, 3.0)):
        out = even_or_masked[(2,)](mx.array(x), mx.zeros((128,)), n, BLOCK=64)
        np.testing.assert_array_equal(np.array(out)[:n], factor * x[:n])
        assert even_or_masked.base.last_dispatch.spec.constexprs["EVEN"] is (factor == 2.0)
    # under autotune the functions see each candidate's meta-parameters
    tuned = metile.autotune(configs=[metile.Config(BLOCK=32), metile.Config(BLOCK=64)],
                            key=["n"], warmup=1, reps=1)(even_or_masked)
    # (n = 96: EVEN for BLOCK=32 (x2), not for 64 (x3) - the candidates differ by design,
    # which autotune warns of)
    with pytest.warns(UserWarning, match="candidates compute different outputs"):
        out = tuned[lambda m: (metile.cdiv(m["n"], m["BLOCK"]),)](mx.array(x), mx.zeros((128,)),
                                                                  96)
    np.testing.assert_array_equal(np.array(out)[:96], 2.0 * x[:96])
    with pytest.raises(LaunchError, match="EVEN computed by metile.heuristics and also passed "
                                          "at the call"):
        even_or_masked[(2,)](mx.array(x), mx.zeros((128,)), 100, BLOCK=64, EVEN=True)
    with pytest.raises(ValueError, match="has no parameter 'EVEN_K'"):
        metile.heuristics(values={"EVEN_K": lambda a: True})(scaled_copy)


def test_a_heuristics_call_missing_an_argument_names_it():
    # the heuristic reads a["n"]: a call without n raised its bare KeyError: 'n'
    x = mx.zeros((128,))
    for call, missing in ((lambda: even_or_masked[(2,)](x, mx.zeros((128,)), BLOCK=64), "n"),
                          (lambda: even_or_masked[(2,)](x, mx.zeros((128,)), 100), "BLOCK"),
                          (lambda: even_or_masked.warmup(x, mx.zeros((128,)), grid=(2,),
                                                         BLOCK=64), "n")):
        with pytest.raises(TypeError, match=f"even_or_masked\\(\\) missing arguments: {missing}$"):
            call()
    with pytest.raises(TypeError, match="unexpected argument 'BLOK'"):
        even_or_masked[(2,)](x, mx.zeros((128,)), 100, BLOK=64)
    with pytest.raises(TypeError, match="takes 5 arguments, got 6"):
        even_or_masked[(2,)](x, mx.zeros((128,)), 100, 64, True, 1)


# -- Triton's constexpr objects and jit options (a hostile trial, session 38) ------------------

USE_TWO = metile.constexpr(False)
WIDTH = metile.constexpr(4)
GAIN = metile.constexpr(2.5)


@metile.kernel
def constexpr_objects(Y, FLAG: metile.constexpr, B: metile.constexpr = metile.constexpr(4)):
    o = metile.arange(0, WIDTH)
    if USE_TWO:
        metile.store(Y + o, (o + B).to(metile.float32))
    elif FLAG:
        metile.store(Y + o, (o + B).to(metile.float32) * GAIN)
    else:
        metile.store(Y + o, (o * metile.constexpr(3)).to(metile.float32))


@metile.inline
def _first_block(x_ptr, B: metile.constexpr = metile.constexpr(4)):
    return metile.load(x_ptr + metile.arange(0, B))


@metile.kernel
def helper_constexpr_default(X, Y):
    metile.store(Y + metile.arange(0, 4), _first_block(X) * 2)


def test_a_helpers_constexpr_object_default_reads_as_its_value():
    # (the review found the launch's defaults unwrapped and a called helper's not)
    got = helper_constexpr_default[(1,)](mx.arange(4).astype(mx.float32), mx.zeros((4,)))
    assert got.tolist() == [0, 2, 4, 6]


@pytest.mark.parametrize("flag", [False, True, metile.constexpr(False), metile.constexpr(True)])
def test_constexpr_objects_read_as_their_values(flag):
    # (`NAME = tl.constexpr(False)` at module level and `FLAG=tl.constexpr(False)` at the
    # call took the true branch: the object is truthy)
    got = constexpr_objects[(1,)](mx.zeros((4,)), FLAG=flag)
    on = flag.value if isinstance(flag, metile.constexpr) else flag
    expected = (np.arange(4) + 4) * 2.5 if on else np.arange(4) * 3.0
    np.testing.assert_array_equal(np.array(got), expected)


def test_do_not_specialize_is_taken_and_checked():
    def copy(X, Y, n, BLOCK: metile.constexpr):
        o = metile.arange(0, BLOCK)
        metile.store(Y + o, metile.load(X + o, mask=o < n), mask=o < n)

    k = metile.kernel(do_not_specialize=["n"])(copy)
    assert metile.kernel(do_not_specialize=[2])(copy).do_not_specialize == {"n"}
    got = k[(1,)](mx.arange(8).astype(mx.float32), mx.full((8,), -1.0), 5, BLOCK=8)
    assert got.tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    # under an explicit Schedule an int scalar is specialized for its proofs, unless named
    sched = metile.Schedule(num_simdgroups=1)
    k[(1,)](mx.arange(8).astype(mx.float32), mx.zeros((8,)), 5, BLOCK=8, SCHEDULE=sched)
    assert k.last_dispatch.spec.int_values == {}
    for bad, message in ((["m"], "names 'm', which is not a parameter"),
                         (["BLOCK"], "names constexpr 'BLOCK'")):
        with pytest.raises(TypeError, match=message):
            metile.kernel(do_not_specialize=bad)(copy)


def test_an_autotuned_kernel_has_tritons_best_config(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))

    @metile.autotune(configs=[metile.Config(BLOCK=4), metile.Config(BLOCK=8)], key=["n"],
                     warmup=1, reps=1)
    @metile.kernel
    def copy(X, Y, n, BLOCK: metile.constexpr):
        o = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        metile.store(Y + o, metile.load(X + o, mask=o < n), mask=o < n)

    assert copy.best_config is None
    copy[lambda m: (metile.cdiv(m["n"], m["BLOCK"]),)](mx.arange(10).astype(mx.float32),
                                                      mx.zeros((10,)), 10)
    assert copy.best_config == copy.last_result.config


@metile.kernel
def cast_to_out_type(X, Out, BLOCK: metile.constexpr):
    o = metile.arange(0, BLOCK)
    metile.store(Out + o, metile.load(X + o).to(Out.type.element_ty) * 3)


def test_tritons_type_element_ty_spelling_names_the_element_type():
    # (a tutorial port: the fused-attention tutorial casts with `Out.type.element_ty`;
    # "a runtime value has no attribute 'type'" before)
    x = mx.array(np.linspace(-2, 2, 8).astype(np.float32))
    got = cast_to_out_type[(1,)](x, mx.zeros((8,), dtype=mx.float16), BLOCK=8)
    assert got.dtype == mx.float16
    np.testing.assert_array_equal(np.array(got), (np.array(x).astype(np.float16) * 3))


def test_tritons_extra_libdevice_is_refused_with_the_portable_name():
    @metile.kernel
    def asin(X, Y, BLOCK: metile.constexpr):
        o = metile.arange(0, BLOCK)
        metile.store(Y + o, metile.extra.libdevice.asin(metile.load(X + o)))

    with pytest.raises(metile.CompilationError, match=r"metile.extra \(Triton's tl.extra\) is "
                                                      r"not supported: .*metile.math.asin"):
        asin[(1,)](mx.zeros((8,)), mx.zeros((8,)), BLOCK=8)


@metile.kernel
def persistent_matmul(A, B, C, T, BM: metile.constexpr, BK: metile.constexpr,
                      KT: metile.constexpr, RECURRENCE: metile.constexpr):
    for t in range(metile.program_id(0), T, metile.num_programs(0)):
        rm = t * BM + metile.arange(0, BM)
        rk = metile.arange(0, BK)
        acc = metile.zeros((BM, BM), dtype=metile.float32)
        for ki in range(KT):
            a = metile.load(A + rm[:, None] * (KT * BK) + ki * BK + rk[None, :])
            b = metile.load(B + (ki * BK + rk[:, None]) * BM + metile.arange(0, BM)[None, :])
            if RECURRENCE:
                acc = metile.dot(a, b, acc)
            else:
                acc += metile.dot(a, b)
        metile.store(C + rm[:, None] * BM + metile.arange(0, BM)[None, :], acc)


def test_a_persistent_matmul_runs_as_a_sum_and_its_recurrence_form_says_how():
    # (a tutorial port: Triton's persistent matmul nests the K loop in a loop over tiles,
    # which the fused GEMM does not take; the `+=` form runs on the general lowering)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (32, 16)))
    got = persistent_matmul[(3,)](mx.array(a), mx.array(b), mx.zeros((64, 16)), 4, BM=16,
                                  BK=16, KT=2, RECURRENCE=False)
    np.testing.assert_allclose(np.array(got), a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(metile.CompilationError, match=r"nested inside control flow.*written "
                                                      r"`acc \+= metile.dot\(a, b\)`"):
        persistent_matmul[(3,)](mx.array(a), mx.array(b), mx.zeros((64, 16)), 4, BM=16, BK=16,
                                KT=2, RECURRENCE=True)


@metile.kernel
def _scaled_rows(x, offs: metile.constexpr, SCALE: metile.constexpr):
    return x * (offs[:, None] + SCALE).to(metile.float32)


@metile.kernel
def tile_to_a_constexpr_parameter(X, Y, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs[:, None] * BLOCK + offs[None, :])
    metile.store(Y + offs[:, None] * BLOCK + offs[None, :], _scaled_rows(x, offs, 2))


def test_a_tile_passed_to_a_constexpr_helper_parameter_is_taken_as_triton_takes_it():
    # (a tutorial port: Triton's fused attention annotates `offs_m: tl.constexpr` on its inner
    # function and passes an arange; refused as "needs a compile-time value" before)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    got = tile_to_a_constexpr_parameter[(1,)](mx.array(x.ravel()), mx.zeros((16,)), BLOCK=4)
    np.testing.assert_array_equal(np.array(got).reshape(4, 4), x * (np.arange(4) + 2)[:, None])


# -- kernel.warmup and the CompiledKernel it returns (fortieth session) -------------------------

@metile.kernel
def reversed_block(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    scratch = metile.shared(BLOCK)
    metile.store(scratch + metile.arange(0, BLOCK), metile.load(X + offs, mask=offs < n,
                                                                other=0.0))
    metile.barrier()
    metile.store(Y + offs, metile.load(scratch + BLOCK - 1 - metile.arange(0, BLOCK)) * 2.0,
                 mask=offs < n)


def _reversed_blocks(x, block):
    padded = np.concatenate([x, np.zeros(-len(x) % block, x.dtype)])
    return padded.reshape(-1, block)[:, ::-1].ravel()[:len(x)] * 2


@pytest.mark.parametrize("n", [1, 7, 65, 1000])
def test_warmup_compiles_without_running_and_the_result_runs(n, monkeypatch):
    # (AttributeError: 'Kernel' object has no attribute 'warmup')
    from metile.runtime.dispatch import Dispatch

    def refuse(*args, **kwargs):
        raise AssertionError("warmup ran the kernel")

    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    grid = lambda meta: (metile.cdiv(meta["n"], meta["BLOCK"]),)
    with monkeypatch.context() as m:
        m.setattr(Dispatch, "_launch", refuse)
        m.setattr(Dispatch, "_direct_call", refuse)
        compiled = reversed_block.warmup(mx.array(x), mx.zeros((n,)), n, BLOCK=64, num_warps=2,
                                         grid=grid)
    assert isinstance(compiled, Dispatch)
    np.testing.assert_array_equal(np.array(compiled()), _reversed_blocks(x, 64))
    with pytest.raises(TypeError, match="grid"):
        reversed_block.warmup(mx.array(x), mx.zeros((n,)), n, BLOCK=64)
    # Triton's dtype placeholders for tensors: metile needs the arrays
    with pytest.raises(LaunchError, match=r"reversed_block.warmup\(\): argument 'X' is the dtype "
                                          r"mlx.core.float32; Triton's warmup takes a dtype"):
        reversed_block.warmup(mx.float32, mx.zeros((n,)), n, BLOCK=64, grid=(1,))


def test_the_warmups_result_launches_over_another_grid():
    # Triton's softmax tutorial: compiled = kernel.warmup(..., grid=(1,)), then
    # compiled[(programs, 1, 1)](every argument, constexprs in parameter order)
    n = 300
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    compiled = reversed_block.warmup(mx.array(x), mx.zeros((n,)), n, BLOCK=64, num_warps=2,
                                     grid=(1,))
    np.testing.assert_array_equal(np.array(compiled[(5, 1, 1)](mx.array(x), mx.zeros((n,)), n,
                                                                 64)),
                                  _reversed_blocks(x, 64))
    # the held constexpr when not passed, another block size when passed by keyword
    np.testing.assert_array_equal(np.array(compiled[(5,)](mx.array(x), mx.zeros((n,)), n)),
                                  _reversed_blocks(x, 64))
    np.testing.assert_array_equal(np.array(compiled[(10,)](mx.array(x), mx.zeros((n,)), n,
                                                           BLOCK=32)),
                                  _reversed_blocks(x, 32))


@pytest.mark.parametrize("backend", ["msl", "cuda"])
def test_warmup_answers_tritons_compiled_kernel(backend):
    compiled = reversed_block.warmup(mx.zeros((100,)), mx.zeros((100,)), 100, BLOCK=64,
                                     num_warps=2, grid=(2,), backend=backend)
    # asm: the generated source under its language, the checked Tile IR as Triton's ttir
    assert set(compiled.asm) == {backend, "tile_ir"}
    assert compiled.asm[backend] == compiled.source
    assert compiled.metadata.name.startswith("metile_reversed_block_")
    assert compiled.asm["tile_ir"].startswith("func @reversed_block(")
    assert "shared_alloc" in compiled.asm["tile_ir"]
    meta = compiled.metadata
    assert (meta.num_warps, meta.num_stages, meta.shared) == (2, 1, 64 * 4)
    if backend == "cuda":
        return     # n_regs / n_spills: test_warmup_reads_registers_from_ptxas
    # not known to metile: an AttributeError that says why (hasattr is False)
    for name in ("n_regs", "n_spills"):
        with pytest.raises(AttributeError, match=f"metile does not know {name} .*generates "
                                                 f"{backend.upper()} source.*reports no "
                                                 f"register use"):
            getattr(compiled, name)
        assert not hasattr(compiled, name)


@pytest.mark.skipif(TOOLKIT is None, reason="NVRTC not installed")
def test_warmup_reads_registers_from_ptxas():
    # Triton's softmax tutorial sizes its grid from n_regs: on CUDA they are ptxas's, for
    # the launch's own translation unit and arch (NVRTC, no GPU); checked against a
    # separate -v compile of the source the NVRTC tests build
    compiled = reversed_block.warmup(mx.zeros((100,)), mx.zeros((100,)), 100, BLOCK=64,
                                     num_warps=2, grid=(2,), backend="cuda")
    ok, log, _ = run_nvrtc(translation_unit(compiled), "sm_90",
                           extra=("--ptxas-options=-v",))
    assert ok, log
    used = int(re.search(r"Used (\d+) registers", log).group(1))
    spilled = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    assert isinstance(compiled.n_regs, int) and compiled.n_regs == used > 0
    assert compiled.n_spills == spilled // 4 == 0


def test_warmup_of_heuristics_and_autotuned_kernels(tmp_path, monkeypatch):
    # Triton's Autotuner.warmup: each candidate compiled, none measured (a list); a
    # candidate the tuning would skip is left out
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    with_block = metile.heuristics(values={"BLOCK": lambda args: 128})(scaled_copy)
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64, num_warps=2),
                                     metile.Config(BLOCK=256, num_warps=8),
                                     metile.Config(BLOCK=0)], key=["n"])(scaled_copy)
    x = np.arange(1000, dtype=np.float32)
    args = (mx.array(x), mx.zeros((1000,)), 1000, 0.5)
    one = with_block.warmup(*args, grid=copy_grid)
    np.testing.assert_array_equal(np.array(one()), 0.5 * x)
    several = tuned.warmup(*args, grid=copy_grid)
    assert tuned.last_result is None and tuned.best_config is None   # nothing measured
    assert [c.metadata.num_warps for c in several] == [2, 8]   # (BLOCK=0: arange(0, 0))
    for compiled in several:
        np.testing.assert_array_equal(np.array(compiled()), 0.5 * x)


def test_an_autotuned_warmups_launches_size_their_grid_for_the_arguments_they_are_called_with(
        tmp_path, monkeypatch):
    # each prepared candidate called with a larger n ran the grid its warmup's n gave
    # (cdiv(1000, 256) programs of BLOCK=256 left elements 1024.. of 3000 unwritten), where
    # a plain kernel's warmup, called so, sizes its grid callable for the new arguments
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64, num_warps=2),
                                     metile.Config(BLOCK=256, num_warps=8)],
                            key=["n"])(scaled_copy)
    seen = []

    def grid(meta):   # (the config's num_warps is the grid's to read, as at a tuned launch)
        seen.append(meta["num_warps"])
        return copy_grid(meta)

    several = tuned.warmup(mx.zeros((1000,)), mx.zeros((1000,)), 1000, 0.5, grid=grid)
    x = np.arange(3000, dtype=np.float32)
    for compiled in several:
        got = compiled(mx.array(x), mx.full((3000,), -1.0), 3000, 2.0)
        np.testing.assert_array_equal(np.array(got), 2.0 * x)
    assert set(seen) == {2, 8}
