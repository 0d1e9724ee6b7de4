"""@metile.autotune over real kernels: the winner computes the right numbers,
is remembered per tuning key, and unusable candidates are skipped with a reason."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import requires_msl_device


@metile.kernel
def scaled_copy(X, Y, n, alpha, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    value = metile.load(X + offs, mask=mask).to(metile.float32) * alpha
    metile.store(Y + offs, value.to(Y.dtype), mask=mask)


def grid(meta):
    return (metile.cdiv(meta["n"], meta["BLOCK"]),)


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    return metile.autotune(
        configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=256, num_simdgroups=8)],
        warmup=1, reps=2)(scaled_copy)


def test_winner_is_correct_and_cached(tuned):
    x = mx.arange(1000).astype(mx.float32)
    out = tuned[grid](x, mx.zeros((1000,)), 1000, 2.0)
    np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(1000))
    first = tuned.last_result
    assert not first.from_cache
    assert set(first.timings) == {"Config(BLOCK=64)", "Config(BLOCK=256,NUM_SG=8)"}
    tuned[grid](x, mx.zeros((1000,)), 1000, 3.0)  # same key: floats enter by type
    assert tuned.last_result.from_cache and tuned.last_result.config == first.config


def test_a_config_setting_an_argument_the_kernel_lacks_is_an_error(tmp_path, monkeypatch):
    # the caller's typo, as Triton raises it (it was skipped as unusable: a silently
    # smaller search, the reason only in last_result)
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128, WIDTH=4)],
                            warmup=1, reps=2)(scaled_copy)
    with pytest.raises(metile.LaunchError, match=r"scaled_copy\(\) got an unexpected argument "
                                                 r"'WIDTH' \(from autotune Config\(BLOCK=128, "
                                                 r"WIDTH=4\)\)"):
        tuned[grid](mx.ones((100,)), mx.zeros((100,)), 100, 1.0)


def test_a_first_call_inside_mx_compile_says_to_tune_eagerly(tuned):
    # (a hostile trial: MLX's "[eval] Attempting to eval an array during function
    # transformations", naming neither autotune nor the cure)
    x = mx.arange(100).astype(mx.float32)
    f = mx.compile(lambda x: tuned[grid](x, mx.zeros((100,)), 100, 2.0))
    with pytest.raises(metile.LaunchError, match=r"autotuned kernel 'scaled_copy' has no tuned "
                                                 r"winner for this call .* cannot measure its "
                                                 r"candidates while mx.compile or mx.vmap"):
        f(x)
    tuned[grid](x, mx.zeros((100,)), 100, 3.0)   # eager: measured, the winner kept
    np.testing.assert_array_equal(np.array(mx.compile(
        lambda x: tuned[grid](x, mx.zeros((100,)), 100, 2.0))(x)), 2.0 * np.arange(100))


def test_other_dtype_is_tuned_again(tuned):
    tuned[grid](mx.ones((100,)), mx.zeros((100,)), 100, 1.0)
    key32 = tuned.last_result.key
    tuned[grid](mx.ones((100,), mx.float16), mx.zeros((100,), mx.float16), 100, 1.0)
    assert not tuned.last_result.from_cache and tuned.last_result.key != key32


def test_autotune_needs_configs_and_a_kernel():
    with pytest.raises(TypeError, match="non-empty list of metile.Config"):
        metile.autotune(configs=[])(scaled_copy)
    with pytest.raises(TypeError, match="decorates a @metile.kernel"):
        metile.autotune(configs=[metile.Config(BLOCK=64)])(lambda: None)


def test_legacy_num_sg_sets_the_simdgroup_count():
    x = mx.ones((100,))
    d = scaled_copy[(1,)].prepare(x, mx.zeros((100,)), 100, 1.0, BLOCK=128, NUM_SG=8)
    assert d.schedule_plan.threadgroup_size == (256, 1, 1)
    with pytest.raises(metile.LaunchError, match="NUM_SG=8 contradicts num_simdgroups=4"):
        scaled_copy[(1,)].prepare(x, mx.zeros((100,)), 100, 1.0, BLOCK=128, NUM_SG=8, num_simdgroups=4)


def test_key_arguments_select_their_own_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128)], key=["alpha"],
                            warmup=1, reps=1)(scaled_copy)
    x = mx.ones((100,))
    tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    assert tuned.last_result.from_cache
    out = tuned[grid](x, mx.zeros((100,)), 100, 3.0)  # alpha is a key: measured again
    assert not tuned.last_result.from_cache
    np.testing.assert_array_equal(np.array(out), np.full(100, 3.0))
    with pytest.raises(ValueError, match="key names unknown parameters"):
        metile.autotune(configs=[metile.Config(BLOCK=64)], key=["size"])(scaled_copy)


# -- what a hostile test found -------------------------------------------------------------------

@metile.kernel
def doubled_first_block_only(X, Y, n, BLOCK: metile.constexpr):
    # one program of BLOCK elements: right only where BLOCK covers n
    offs = metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs, mask=offs < n) * 2.0, mask=offs < n)


def _first_block_only_tuned(tmp_path, monkeypatch, reps):
    """doubled_first_block_only autotuned over three blocks, the first too small for 200."""
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    return metile.autotune(configs=[metile.Config(BLOCK=128), metile.Config(BLOCK=256),
                                    metile.Config(BLOCK=512)], warmup=1, reps=reps)(
        doubled_first_block_only)


def test_a_wrong_first_candidate_does_not_win(tmp_path, monkeypatch):
    # (validated against the first candidate alone, a first config that computes something
    # else made every right one "differ" and won with its wrong output)
    tuned = _first_block_only_tuned(tmp_path, monkeypatch, 2)
    x = mx.arange(200).astype(mx.float32)
    with pytest.warns(UserWarning, match=r"candidates compute different outputs - "
                                         r"Config\(BLOCK=128\) differ"):
        out = tuned[(1,)](x, mx.zeros((200,)), 200)
    np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(200))
    assert "outputs differ from the 2 of 3" in tuned.last_result.unusable["Config(BLOCK=128)"]


def test_a_cached_winner_its_own_measurement_refused_is_measured_again(tmp_path, monkeypatch):
    # (an entry naming as winner a candidate it lists as unusable - an outvoted, wrong one -
    # was taken, and the launch returned its wrong numbers)
    import json
    tuned = _first_block_only_tuned(tmp_path, monkeypatch, 1)
    x = mx.arange(200).astype(mx.float32)
    with pytest.warns(UserWarning, match="candidates compute different outputs"):
        tuned[(1,)](x, mx.zeros((200,)), 200)
    path = next(tmp_path.rglob(f"{tuned.last_result.key}.json"))
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "winner": "Config(BLOCK=128)"}))
    with pytest.warns(UserWarning) as caught:     # (measured again: the vote warns again)
        out = tuned[(1,)](x, mx.zeros((200,)), 200)
    assert any("winner 'Config(BLOCK=128)' is listed as unusable" in str(w.message)
               for w in caught)
    np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(200))
    assert not tuned.last_result.from_cache


def test_a_key_that_is_no_list_of_names_is_named():
    for key in (None, "n", 3, ["n", 3]):
        with pytest.raises(TypeError, match="key must be a list of parameter names"):
            metile.autotune(configs=[metile.Config(BLOCK=64)], key=key)(scaled_copy)
    assert metile.autotune(configs=[metile.Config(BLOCK=64)], key=("n",))(scaled_copy).key == ("n",)


@metile.kernel
def offset_when_narrow(X, Y, n, BLOCK: metile.constexpr):
    # right for every BLOCK but 64, which adds one
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) + (1 if BLOCK == 64 else 0),
                 mask=mask)


def test_integer_outputs_off_by_one_are_outvoted(tmp_path, monkeypatch):
    # (compared through float32 with rtol=1e-3, counts near 1e6 off by one "agreed", and the
    # wrong candidate could win on its time)
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128),
                                     metile.Config(BLOCK=256)], warmup=1, reps=1)(
        offset_when_narrow)
    values = np.arange(1_000_000, 1_000_300, dtype=np.int32)

    def launch():
        return tuned[lambda meta: (metile.cdiv(300, meta["BLOCK"]),)](
            mx.array(values), mx.zeros((300,), mx.int32), 300)

    with pytest.warns(UserWarning, match=r"Config\(BLOCK=64\) differ"):
        out = launch()
    np.testing.assert_array_equal(np.array(out), values)
    assert "validation failed" in tuned.last_result.unusable["Config(BLOCK=64)"]

def test_a_tuned_meta_parameter_at_the_call_is_an_error(tuned):
    with pytest.raises(metile.LaunchError, match=r"conflicting meta-parameters BLOCK: the "
                                                r"autotune configs set them"):
        tuned[(2,)](mx.ones((1000,)), mx.zeros((1000,)), 1000, 2.0, BLOCK=512)


@pytest.mark.parametrize("given", [{"num_simdgroups": 4}, {"num_warps": 4}, {"NUM_SG": 4}])
def test_a_tuned_simdgroup_count_at_the_call_is_an_error(given):
    # (each config's num_simdgroups replaced the call's: num_simdgroups=4 ran on one
    # SIMD-group, silently, where a direct launch refuses the contradiction)
    from metile_kernels.gemm import matmul
    tuned = metile.autotune(configs=[
        metile.Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, num_simdgroups=1),
        metile.Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=8, num_simdgroups=1)])(matmul)
    a = mx.ones((40, 40))
    with pytest.raises(metile.LaunchError, match=r"conflicting meta-parameters "
                                                r"(num_simdgroups|num_warps|NUM_SG): the "
                                                r"autotune configs set them"):
        tuned[(2, 2)](a, a, mx.zeros((40, 40)), 40, 40, 40, **given)


# -- a second hostile test (twenty-eighth session) ---------------------------------------------

@metile.kernel
def add_rows(X, Y, n, BLOCK: metile.constexpr, ROWS: metile.constexpr = 2):
    offs = metile.program_id(0) * BLOCK * ROWS + metile.arange(0, BLOCK * ROWS)
    metile.store(Y + offs, metile.load(X + offs, mask=offs < n) + 1.0, mask=offs < n)


def test_grid_callables_see_defaults_and_int_grids_are_taken(tmp_path, monkeypatch):
    # (a tuned launch's grid callable got no defaults - KeyError: 'ROWS' for every config -
    # and an int grid, which plain launches take, raised "'int' object is not iterable")
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=32), metile.Config(BLOCK=64)],
                            warmup=1, reps=1)(add_rows)
    x = mx.arange(300).astype(mx.float32)
    out = tuned[lambda m: (metile.cdiv(m["n"], m["BLOCK"] * m["ROWS"]),)](x, mx.zeros((300,)), 300)
    np.testing.assert_array_equal(np.array(out), np.arange(300) + 1.0)
    for g in (5, np.int64(5), mx.array(5)):
        out = tuned[g](x, mx.zeros((300,)), 300)
        np.testing.assert_array_equal(np.array(out), np.arange(300) + 1.0)


def test_numpy_integer_keys_select_their_own_winner(tmp_path, monkeypatch):
    # (a NumPy integer took the array branch of the key: its value was ignored)
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128)],
                            key=["n"], warmup=1, reps=1)(scaled_copy)
    x = mx.ones((400,))
    tuned[grid](x, mx.zeros((400,)), np.int64(40), 1.0)
    assert not tuned.last_result.from_cache
    tuned[grid](x, mx.zeros((400,)), np.int64(400), 1.0)
    assert not tuned.last_result.from_cache
    tuned[grid](x, mx.zeros((400,)), 40, 1.0)   # the same key as np.int64(40)
    assert tuned.last_result.from_cache


def test_warmup_and_reps_are_checked_where_written():
    for kw, message in (({"reps": 0}, "reps must be an int >= 1, got 0"),
                        ({"warmup": -1}, "warmup must be an int >= 0, got -1"),
                        ({"reps": 1.5}, "reps must be an int >= 1, got 1.5")):
        with pytest.raises(ValueError, match=message):
            metile.autotune(configs=[metile.Config(BLOCK=64)], **kw)


@requires_msl_device   # (apple10's MSL runs on Metal or the CPU only)
def test_a_target_is_tuned_on_its_own(tmp_path, monkeypatch):
    # (the key ignored target=: a winner measured for the CPU was replayed for apple10,
    # whose plans differ - with a tile apple10 could not take, a CompilationError in every
    # process)
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    from metile_kernels.gemm import matmul_epilogue
    tuned = metile.autotune(configs=[metile.Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=4),
                                     metile.Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=8)],
                            warmup=1, reps=1)(matmul_epilogue)
    m, n, k = 40, 24, 20
    x, w = mx.random.normal((m, k)), mx.random.normal((k, n))
    g = lambda meta: (metile.cdiv(meta["rows"], meta["BLOCK_M"]),
                      metile.cdiv(meta["columns"], meta["BLOCK_N"]))
    tuned[g](x, w, mx.zeros((m, n)), m, n, k, 1.5, -0.25)
    cpu = tuned.last_result
    out = tuned[g](x, w, mx.zeros((m, n)), m, n, k, 1.5, -0.25, target="apple10")
    apple10 = tuned.last_result
    assert not apple10.from_cache and apple10.key != cpu.key
    z = 1.5 * (np.array(x, np.float64) @ np.array(w, np.float64)) - 0.25
    np.testing.assert_allclose(np.array(out), np.where(z > 0, z, 0.1 * z), rtol=2e-3, atol=2e-3)


# -- Triton's options: prune_configs_by, reset_to_zero, restore_value ---------------------------

CANDIDATES = [metile.Config(BLOCK=32), metile.Config(BLOCK=64),
              metile.Config(BLOCK=128, num_warps=4), metile.Config(BLOCK=256, num_simdgroups=8)]


def test_early_config_prune_narrows_the_candidates_once_a_key(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    calls = []

    def early(configs, named_args, **kwargs):
        calls.append((len(configs), named_args["n"], sorted(kwargs)))
        return [c for c in configs if c.meta["BLOCK"] <= named_args["n"] // 4]

    tuned = metile.autotune(configs=CANDIDATES, warmup=1, reps=2,
                            prune_configs_by={"early_config_prune": early})(scaled_copy)
    x = mx.arange(300).astype(mx.float32)
    out = tuned[grid](x, mx.zeros((300,)), 300, 2.0)
    np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(300))
    assert set(tuned.last_result.timings) == {"Config(BLOCK=32)", "Config(BLOCK=64)"}
    tuned[grid](x, mx.zeros((300,)), 300, 3.0)        # same key: not pruned again
    assert calls == [(4, 300, [])]
    out = tuned[grid](mx.ones((1000,)), mx.zeros((1000,)), 1000, 1.0)    # a new key
    assert len(calls) == 2 and len(tuned.last_result.timings) == 3
    np.testing.assert_array_equal(np.array(out), np.ones(1000))


def test_a_perf_model_keeps_the_top_k_it_ranks_fastest(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    seen = []

    def model(**kw):
        seen.append(kw)
        return np.float32(abs(kw["BLOCK"] - 100))     # 128 and 64 rank first (a NumPy number)

    for top_k, want in ((2, {"Config(BLOCK=128,num_warps=4)", "Config(BLOCK=64)"}),
                        (0.25, {"Config(BLOCK=128,num_warps=4)"})):
        tuned = metile.autotune(configs=CANDIDATES, warmup=1, reps=2,
                                prune_configs_by={"perf_model": model, "top_k": top_k})(scaled_copy)
        out = tuned[grid](mx.arange(500).astype(mx.float32), mx.zeros((500,)), 500, 2.0)
        np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(500))
        assert set(tuned.last_result.timings) == want
    # Triton's perf_model call: the arguments by name and each candidate's keywords
    assert seen[0]["n"] == 500 and seen[0]["alpha"] == 2.0 and "X" in seen[0]
    assert {s.get("num_warps") for s in seen} == {None, 4, 8}


@pytest.mark.parametrize("prune,error,message", [
    ({"top_k": 0}, TypeError, r"top_k'\] must be an int >= 1 \(a count\) or a float in \(0, 1\]"),
    ({"top_k": 1.5}, TypeError, r"top_k'\] must be an int >= 1"),
    ({"perf_model": 3}, TypeError, r"prune_configs_by\['perf_model'\] must be callable"),
    ({"prune_num_stages_by": len}, ValueError, r"unknown fields \['prune_num_stages_by'\]"),
    ([len], TypeError, r"prune_configs_by must be a dict"),
])
def test_bad_prune_options_are_named_at_the_decorator(prune, error, message):
    with pytest.raises(error, match=message):
        metile.autotune(configs=CANDIDATES, prune_configs_by=prune)


def test_a_perf_model_that_returns_no_number_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=CANDIDATES, prune_configs_by={
        "perf_model": lambda **kw: None, "top_k": 2})(scaled_copy)
    with pytest.raises(TypeError, match=r"scaled_copy: prune_configs_by's perf_model must "
                                        r"return a number \(an estimated time\), got None"):
        tuned[grid](mx.ones((100,)), mx.zeros((100,)), 100, 1.0)


def test_a_prune_that_keeps_nothing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=CANDIDATES,
                            prune_configs_by={"early_config_prune": lambda c, a, **k: []})(scaled_copy)
    with pytest.raises(metile.LaunchError, match="early_config_prune left no config"):
        tuned[grid](mx.ones((100,)), mx.zeros((100,)), 100, 1.0)


def test_a_prune_that_returns_none_is_named(tmp_path, monkeypatch):
    # (a forgotten `return` in the prune function: "'NoneType' object is not iterable")
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=CANDIDATES,
                            prune_configs_by={"early_config_prune": lambda c, a, **k: None})(
        scaled_copy)
    with pytest.raises(metile.LaunchError, match="early_config_prune returned None; it must "
                                                 "return the configs to keep"):
        tuned[grid](mx.ones((100,)), mx.zeros((100,)), 100, 1.0)


def test_a_triton_prune_reads_the_configs_as_triton_gives_them(tmp_path, monkeypatch):
    # Triton's pruning functions read conf.kwargs[...] (a dict), conf.num_warps and
    # conf.num_stages, and perf models conf.all_kwargs()
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    c = metile.Config({"BLOCK": 64}, num_warps=8, num_stages=2)
    assert c.kwargs == {"BLOCK": 64} and c.num_warps == 8 and c.num_stages == 2
    assert c.all_kwargs() == {"BLOCK": 64, "num_warps": 8, "num_stages": 2}
    assert metile.Config(BLOCK=32).num_warps is None
    assert metile.Config(BLOCK=32, num_simdgroups=2).num_warps == 2
    seen = []

    def keep(configs, named, **kw):
        seen.extend((c.kwargs["BLOCK"], c.num_warps) for c in configs)
        return [c for c in configs if c.kwargs["BLOCK"] <= 128 and c.num_warps != 8]

    tuned = metile.autotune(configs=CANDIDATES, warmup=1, reps=2,
                            prune_configs_by={"early_config_prune": keep})(scaled_copy)
    out = tuned[grid](mx.arange(300).astype(mx.float32), mx.zeros((300,)), 300, 3.0)
    np.testing.assert_array_equal(np.array(out), 3.0 * np.arange(300))
    assert len(seen) == len(CANDIDATES)
    assert set(tuned.last_result.timings) == {"Config(BLOCK=32)", "Config(BLOCK=64)",
                                              "Config(BLOCK=128,num_warps=4)"}


@metile.kernel
def block_sums_into(X, Total, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.atomic_add(Total, metile.sum(metile.load(X + offs, mask=offs < n, other=0.0)))


def test_reset_to_zero_holds_for_an_accumulating_kernel(tmp_path, monkeypatch):
    # Triton zeroes Total before each candidate: four candidates adding into one buffer
    # would give four sums.  A metile launch never writes the caller's array, so each
    # candidate and the launch after start from the zeros passed.
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=CANDIDATES, reset_to_zero=["Total"], restore_value="X",
                            warmup=2, reps=3)(block_sums_into)
    x = mx.array(np.random.default_rng(1).standard_normal(1000).astype(np.float32))
    total = mx.zeros((1,))
    for _ in range(2):
        out = tuned[grid](x, total, 1000)
        np.testing.assert_allclose(np.array(out), [np.array(x).sum()], rtol=1e-4, atol=1e-4)
    assert len(tuned.last_result.timings) == 4
    np.testing.assert_array_equal(np.array(total), [0.0])


@pytest.mark.parametrize("option,value,message", [
    ("reset_to_zero", ["Totl"], r"reset_to_zero names unknown parameters \['Totl'\]"),
    ("restore_value", [3], r"restore_value must be a parameter name or a list of them"),
])
def test_reset_and_restore_names_are_checked(option, value, message):
    with pytest.raises((ValueError, TypeError), match=message):
        metile.autotune(configs=CANDIDATES, **{option: value})(block_sums_into)


@pytest.mark.parametrize("option", ["do_bench", "pre_hook", "post_hook", "rep", "use_cuda_graph",
                                    "cache_results"])
def test_triton_options_metile_does_not_take_say_why(option):
    with pytest.raises(TypeError, match=rf"metile.autotune does not take {option}=: "):
        metile.autotune(configs=CANDIDATES, **{option: None})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'prune'"):
        metile.autotune(configs=CANDIDATES, prune={})


def test_a_cached_winner_that_cannot_run_the_call_is_measured_again(tmp_path, monkeypatch):
    # (a hostile trial: the entry's winner - here edited in, as a winner kept from another
    # machine's run can be - failed to compile on every launch until the file was deleted)
    import json
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    wide = metile.Config(BLOCK=128, SCHEDULE=metile.Schedule(vector_width=4))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), wide], warmup=1, reps=1)(scaled_copy)
    x = mx.arange(100).astype(mx.float32)
    tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    first = tuned.last_result
    assert first.config == metile.Config(BLOCK=64) and wide.key() in first.unusable
    path = next(tmp_path.rglob(f"{first.key}.json"))
    entry = json.loads(path.read_text())
    # (as another machine, where it compiled, would have recorded it: not unusable there)
    path.write_text(json.dumps({**entry, "winner": wide.key(), "unusable": {}}))
    with pytest.warns(UserWarning, match=r"winner Config\(BLOCK=128.*cannot run this call "
                                         r"\(CompilationError: .*vector_width=4"):
        out = tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(100))
    assert not tuned.last_result.from_cache and tuned.last_result.config == metile.Config(BLOCK=64)
    assert json.loads(path.read_text())["winner"] == metile.Config(BLOCK=64).key()



@pytest.mark.parametrize("use", ["explain", "prepare"])
def test_explain_and_prepare_measure_again_past_a_winner_that_cannot_run(tmp_path, monkeypatch,
                                                                         use):
    # (the launch measured again past such a winner; explain() and prepare() raised its
    # CompilationError)
    import json
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    wide = metile.Config(BLOCK=128, SCHEDULE=metile.Schedule(vector_width=4))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), wide], warmup=1, reps=1)(scaled_copy)
    x = mx.arange(100).astype(mx.float32)
    tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    path = next(tmp_path.rglob(f"{tuned.last_result.key}.json"))
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "winner": wide.key(), "unusable": {}}))
    with pytest.warns(UserWarning, match=r"winner Config\(BLOCK=128.*cannot run this call"):
        if use == "explain":
            report = json.loads(tuned[grid].explain(x, mx.zeros((100,)), 100, 2.0))
            assert report["autotune"]["winner"] == "Config(BLOCK=64)"
            assert report["autotune"]["from_cache"] is False
            assert report["plan"]["tile_shape"] == [64]
        else:
            out = tuned[grid].prepare(x, mx.zeros((100,)), 100, 2.0)()
            np.testing.assert_array_equal(np.array(out), 2.0 * np.arange(100))
    assert json.loads(path.read_text())["winner"] == "Config(BLOCK=64)"

def test_a_cached_entry_with_mistyped_fields_is_ignored(tmp_path, monkeypatch):
    import json
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128)],
                            warmup=1, reps=1)(scaled_copy)
    x = mx.arange(100).astype(mx.float32)
    tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    path = next(tmp_path.rglob(f"{tuned.last_result.key}.json"))
    entry = json.loads(path.read_text())
    for bad in ({"timings": [1, 2]}, {"unusable": "oops"}, {"timings": {"a": "fast"}}):
        path.write_text(json.dumps({**entry, **bad}))
        with pytest.warns(UserWarning, match="ignoring corrupt tuning cache entry"):
            tuned[grid](x, mx.zeros((100,)), 100, 2.0)
        result = tuned.last_result
        assert not result.from_cache and isinstance(result.timings, dict)


def test_an_autotuned_launch_explains_and_prepares_its_winner(tuned):
    # (a hostile trial: kernel[grid].explain existed, an autotuned one had neither)
    import json
    x = mx.arange(1000).astype(mx.float32)
    report = json.loads(tuned[grid].explain(x, mx.zeros((1000,)), 1000, 2.0))
    tune = report["autotune"]
    assert tune["winner"] in {"Config(BLOCK=64)", "Config(BLOCK=256,NUM_SG=8)"}
    assert not tune["from_cache"] and set(tune["timings"]) == {"Config(BLOCK=64)",
                                                                "Config(BLOCK=256,NUM_SG=8)"}
    assert "plan" in report
    again = json.loads(tuned[grid].explain(x, mx.zeros((1000,)), 1000, 2.0))["autotune"]
    assert again["from_cache"] and again["winner"] == tune["winner"]
    d = tuned[grid].prepare(x, mx.zeros((1000,)), 1000, 2.0)
    np.testing.assert_array_equal(np.array(d()[0] if isinstance(d(), list) else d()),
                                  2.0 * np.arange(1000))


def test_a_call_missing_an_argument_is_a_type_error_before_any_candidate(tuned):
    # (the grid callable's KeyError for the missing n failed every candidate: "no usable
    # candidate", where calling a Python function names the missing argument)
    called = []

    def counted(meta):
        called.append(meta)
        return grid(meta)

    x = mx.ones((100,))
    for launch, message in (
            (lambda: tuned[counted](x, mx.zeros((100,)), alpha=1.0), r"missing arguments: n"),
            (lambda: tuned[(2,)](x, mx.zeros((100,)), 100), r"missing arguments: alpha"),
            (lambda: tuned[counted].prepare(x, mx.zeros((100,)), alpha=1.0),
             r"missing arguments: n"),
            (lambda: tuned.warmup(x, mx.zeros((100,)), alpha=1.0, grid=counted),
             r"missing arguments: n"),
            (lambda: tuned[counted](x, mx.zeros((100,)), 100, 1.0, bogus=3),
             r"got an unexpected argument 'bogus'"),
            (lambda: tuned[counted](x, mx.zeros((100,)), 100, 1.0, 64, 4),
             r"takes 5 arguments, got 6")):
        with pytest.raises(TypeError, match=rf"^scaled_copy\(\) {message}$"):
            launch()
    assert called == [] and tuned.last_result is None
    # (a plain launch's is the same error)
    with pytest.raises(TypeError, match=r"^scaled_copy\(\) missing arguments: n$"):
        scaled_copy[(2,)](x, mx.zeros((100,)), alpha=1.0, BLOCK=64)


def test_a_grid_callables_own_key_error_is_named_not_every_candidate_skipped(tuned):
    # (a typo in the grid callable - meta["N"] for meta["n"] - read "no usable candidate")
    x = mx.ones((100,))
    typo = lambda meta: (metile.cdiv(meta["N"], meta["BLOCK"]),)  # noqa: E731
    message = (r"^the grid callable raised KeyError: 'N'; it receives a dict of the launch's "
               r"arguments by name: 'X', 'Y', 'n', 'alpha', 'BLOCK' \(from autotune "
               r"Config\(BLOCK=64\)\)$")
    with pytest.raises(metile.LaunchError, match=message):
        tuned[typo](x, mx.zeros((100,)), 100, 1.0)
    with pytest.raises(metile.LaunchError, match=message):
        tuned.warmup(x, mx.zeros((100,)), 100, 1.0, grid=typo)
    with pytest.raises(metile.LaunchError, match=r"^grid must be 1 to 3 non-negative ints "
                                                 r"\(programs per axis\), got \[\]$"):
        tuned[[]](x, mx.zeros((100,)), 100, 1.0)


def test_an_unwritable_cache_measures_once_a_process_not_every_call(tmp_path, monkeypatch):
    # (the winner was kept nowhere, so every launch measured every candidate again)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("METILE_CACHE_DIR", str(blocker / "cache"))
    tuned = metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128)],
                            warmup=1, reps=1)(scaled_copy)
    x = mx.arange(100).astype(mx.float32)
    with pytest.warns(RuntimeWarning, match="cannot write"):
        tuned[grid](x, mx.zeros((100,)), 100, 2.0)
    first = tuned.last_result
    assert not first.from_cache
    out = tuned[grid](x, mx.zeros((100,)), 100, 3.0)
    np.testing.assert_array_equal(np.array(out), 3.0 * np.arange(100))
    assert tuned.last_result.from_cache and tuned.last_result.config == first.config


def test_a_config_listed_twice_is_refused_at_the_decorator():
    with pytest.raises(ValueError, match=r"configs list Config\(BLOCK=64\) twice"):
        metile.autotune(configs=[metile.Config(BLOCK=64), metile.Config(BLOCK=128),
                                 metile.Config(BLOCK=64)], key=["n"])(doubled_first_block_only)

