"""Compiler stages without running kernels: Tile IR, lowering decisions visible
in the generated MSL, debug output and the compile cache."""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.ir.core import Block, Builder, Function, Op, Value
from metile.ir.printer import format_function
from metile.ir.types import ScalarType
from metile.ir.verifier import IRVerificationError, verify
from metile.language import float32
from dsl_kernels import block_sum, matmul, single_dot, softmax_rows, vector_add


# These tests read the generated MSL, whatever the default device: every prepare names it.

def prepared_source(launcher, *args, **kwargs) -> str:
    return launcher.prepare(*args, backend="msl", **kwargs).source


def test_tile_ir_printer_and_verifier():
    d = vector_add[(1,)].prepare(mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=64,
                                 backend="msl")
    fn = d.spec.tile_ir()
    verify(fn)
    text = format_function(fn)
    assert "func @vector_add(" in text and "BLOCK: constexpr = 64" in text
    for op in ("program_id()", "arange()", "ptr_add(", "load(", "store("):
        assert op in text, text


def test_verifier_rejects_use_before_definition():
    body = Block()
    b = Builder(body)
    dangling = Value(ScalarType(float32), None)
    b.value("neg", [dangling], ScalarType(float32))
    with pytest.raises(IRVerificationError, match="used before its definition"):
        verify(Function("broken", [], body))
    body = Block(ops=[Op("lane_loop", [], [], {}, [Block()])])
    with pytest.raises(IRVerificationError, match="not an op of the tile form"):
        verify(Function("broken", [], body))


def test_one_element_per_thread_up_to_1024():
    src = prepared_source(vector_add[(1,)], mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8,
                          BLOCK=100)
    d = vector_add[(1,)].prepare(mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=100,
                                 backend="msl")
    assert d.spec.threads == 128  # 100 rounded up to whole SIMD-groups
    assert d.call_kwargs["threadgroup"] == (128, 1, 1) and d.call_kwargs["grid"] == (128, 1, 1)
    assert "< 100" in src and "for (int _s" not in src


def test_larger_blocks_loop_over_slots():
    # scalar lanes (vector_width=1): each thread loops over its 4 slots
    d = vector_add[(3,)].prepare(mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=4096,
                                 backend="msl", SCHEDULE=metile.Schedule(vector_width=1))
    assert d.spec.threads == 1024
    assert re.search(r"for \(int (_s\d+) = 0; \1 < 4; \+\+\1\)", d.source), d.source
    assert d.call_kwargs["grid"] == (3 * 1024, 1, 1)
    # by default the 4 elements are one run of consecutive elements (passes/vectorize_rows.py)
    d = vector_add[(3,)].prepare(mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=4096,
                                 backend="msl")
    assert "vectorize_rows" in d.execution_report.passes
    assert "device packed_float4*" in d.source


@pytest.mark.parametrize("n", [3, 7, 8])
def test_runs_read_inputs_mlx_passes_as_constant_memory(n):
    # MLX passes an input of fewer than 8 elements in Metal's `constant` address space; a
    # run of 4 read through a `device` vector pointer then failed Metal's (the strict
    # check's) compile - each run is built from its elements
    x = np.arange(n, dtype=np.float32)
    out = vector_add[(1,)](mx.array(x), mx.array(2 * x), mx.zeros((n,)), n, BLOCK=128,
                           num_warps=1)
    np.testing.assert_array_equal(np.array(out), 3 * x)


def test_block_reduction_uses_simd_and_threadgroup_memory():
    src = prepared_source(softmax_rows[(2,)], mx.zeros((2, 8)), mx.zeros((2, 8)), 8, 8, BLOCK=256)
    assert "metal::simd_max" in src and "metal::simd_sum" in src
    assert "threadgroup float" in src and "threadgroup_barrier" in src


def test_reference_dot_operands_go_through_threadgroup_memory():
    # A dot outside a K-loop recurrence reads its operands from threadgroup memory: on the
    # matrix unit when its sizes are whole 8x8x8 fragments, else one FFMA loop an element
    src = prepared_source(single_dot[(1,)], mx.zeros((8, 8)), mx.zeros((8, 8)), mx.zeros((8, 8)),
                          BM=8, BN=8, BK=8)
    assert src.count("threadgroup float") == 3  # the A and B tiles, the product's scratch
    assert "metal::simdgroup_multiply_accumulate(" in src
    src = prepared_source(single_dot[(1,)], mx.zeros((8, 4)), mx.zeros((4, 8)), mx.zeros((8, 8)),
                          BM=8, BN=8, BK=4)
    assert src.count("threadgroup float") == 2  # the A and B tiles
    assert "simdgroup_matrix" not in src and "for (int _k" in src


def test_gemm_recurrence_lowers_to_fragments():
    d = matmul[(1, 1)].prepare(mx.zeros((8, 8)), mx.zeros((8, 8)), mx.zeros((8, 8)), 8, 8, 8,
                               BM=16, BN=16, BK=8, backend="msl")
    src = d.source
    assert src.count("threadgroup float") == 2  # A and B stages (epilogue from registers)
    assert "metal::simdgroup_multiply_accumulate(" in src
    # the K loop (its counter 64-bit: K is not known to lie a step below INT_MAX)
    assert re.search(r"for \(long _k\d+_w = 0; _k\d+_w < _v\d+; _k\d+_w \+= 8\)", src)
    assert d.variant.data["lowering"]["matmul"]["fragment"] == "simdgroup_matrix 8x8"


def test_loops_are_not_unrolled():
    src = prepared_source(block_sum[(1,)], mx.zeros((1, 8)), mx.zeros((1,)), 8)
    assert "while (true)" in src and src.count("threadgroup_barrier") <= 3


def test_full_coverage_proof_avoids_copy():
    d = vector_add[(4,)].prepare(mx.zeros((1000,)), mx.zeros((1000,)), mx.zeros((1000,)), 1000,
                                 BLOCK=256, backend="msl")
    assert d.variant.data["outputs"] == ["Z"] and not d.tracked
    # a grid too small to cover the output: unwritten elements must be preserved
    d = vector_add[(2,)].prepare(mx.zeros((1000,)), mx.zeros((1000,)), mx.zeros((1000,)), 1000,
                                 BLOCK=256, backend="msl")
    assert d.variant.data["outputs"] == ["Z", "Z_written"] and d.tracked == [0]
    assert "Z_in" in d.variant.data["inputs"]


@metile.kernel
def plus_one_scalar(X, Y):
    metile.store(Y, metile.load(X) + 1.0)


def test_a_scalar_store_covers_a_one_element_output():
    # every program writes element 0: that is the whole of a one-element output (no
    # written-mask output, no merge per launch), and only element 0 of a longer one
    x = mx.array([1.0])
    d = plus_one_scalar[(1,)].prepare(x, mx.zeros((1,)))
    assert d.variant.data["outputs"] == ["Y"] and not d.tracked
    np.testing.assert_array_equal(np.array(d()), [2.0])
    d = plus_one_scalar[(4,)].prepare(x, mx.array([5.0, 6.0, 7.0, 8.0]))
    assert d.variant.data["outputs"] == ["Y", "Y_written"] and d.tracked == [0]
    np.testing.assert_array_equal(np.array(d()), [2.0, 6.0, 7.0, 8.0])


@metile.kernel
def scale2d(X, Y, M, N, BM: metile.constexpr, BN: metile.constexpr):
    # Triton's spelling: offsets built per axis, then expanded, added pointer by pointer
    rows = metile.program_id(0) * BM + metile.arange(0, BM)
    cols = metile.program_id(1) * BN + metile.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = metile.load(X + rows[:, None] * N + cols[None, :], mask=mask)
    metile.store(Y + rows[:, None] * N + cols[None, :], x * 2.0, mask=mask)


def _doubling_covers(kernel, rows, full_grid, short_grid, rows_done, **meta):
    """A (rows, 45) doubling kernel: on `full_grid` its store is proven to cover the output
    (no written-mask output); on `short_grid`, which writes only the first `rows_done`
    rows, the written mask keeps the passed values in the rest."""
    x = mx.arange(rows * 45).reshape(rows, 45).astype(mx.float32)
    d = kernel[full_grid].prepare(x, mx.zeros((rows, 45)), rows, 45, **meta)
    assert d.variant.data["outputs"] == ["Y"] and not d.tracked
    np.testing.assert_array_equal(np.array(d()), np.array(x) * 2)
    d = kernel[short_grid].prepare(x, mx.full((rows, 45), -1.0), rows, 45, **meta)
    assert d.variant.data["outputs"] == ["Y", "Y_written"]
    want = np.full((rows, 45), -1.0, np.float32)
    want[:rows_done] = np.array(x)[:rows_done] * 2
    np.testing.assert_array_equal(np.array(d()), want)


def test_full_coverage_proof_of_triton_style_2d_stores():
    # one program row short of the output: the written-mask keeps the rest
    _doubling_covers(scale2d, 70, (5, 3), (4, 3), 64, BM=16, BN=16)


@metile.kernel
def row_times_two(X, Y, M, N, BN: metile.constexpr):
    # one output row per program along axis 1, spelled program_id(1) + arange(0, 1)
    row = metile.program_id(1) + metile.arange(0, 1)
    cols = metile.program_id(0) * BN + metile.arange(0, BN)
    mask = (row[:, None] < M) & (cols[None, :] < N)
    x = metile.load(X + row[:, None] * N + cols[None, :], mask=mask)
    metile.store(Y + row[:, None] * N + cols[None, :], x * 2.0, mask=mask)


@metile.kernel
def scale2d_named_masks(X, Y, M, N, BM: metile.constexpr, BN: metile.constexpr):
    # each axis' mask formed first, expanded after
    rows = metile.program_id(0) * BM + metile.arange(0, BM)
    cols = metile.program_id(1) * BN + metile.arange(0, BN)
    rows_in = rows < M
    cols_in = cols < N
    mask = rows_in[:, None] & cols_in[None, :]
    x = metile.load(X + rows[:, None] * N + cols[None, :], mask=mask)
    metile.store(Y + rows[:, None] * N + cols[None, :], x * 2.0, mask=mask)


def test_full_coverage_proof_of_masks_expanded_after():
    _doubling_covers(scale2d_named_masks, 70, (5, 3), (4, 3), 64, BM=16, BN=16)


def test_full_coverage_proof_of_one_row_blocks():
    # six programs for seven rows: the last row keeps the passed values
    _doubling_covers(row_times_two, 7, (3, 7), (3, 6), 6, BN=16)


@metile.kernel
def heads_times_two(X, Y, L, D: metile.constexpr, BL: metile.constexpr, BD: metile.constexpr):
    # (heads, L, D) blocks of BL rows, one head a program along axis 1, one batch entry a
    # program along axis 2: attention's output store
    head = metile.program_id(1) + metile.program_id(2) * metile.num_programs(1)
    rows = metile.program_id(0) * BL + metile.arange(0, BL)
    d = metile.arange(0, BD)
    mask = (rows[:, None] < L) & (d[None, :] < D)
    at = head * L * D + rows[:, None] * D + d[None, :]
    metile.store(Y + at, metile.load(X + at, mask=mask) * 2.0, mask=mask)


@metile.kernel
def heads_overlapping(X, Y, L, D: metile.constexpr, BL: metile.constexpr):
    # a head's coefficient one row: heads overlap, and the last rows of the output are
    # never written
    rows = metile.program_id(0) * BL + metile.arange(0, BL)
    d = metile.arange(0, D)
    mask = rows[:, None] < L
    at = metile.program_id(1) * D + rows[:, None] * D + d[None, :]
    metile.store(Y + at, metile.load(X + at, mask=mask) * 2.0, mask=mask)


@pytest.mark.parametrize("grid,proven", [((3, 2, 2), True), ((2, 2, 2), False),
                                         ((3, 1, 2), False), ((3, 2, 1), False)])
def test_full_coverage_proof_of_batched_head_stores(grid, proven):
    # buffer_usage.RadixCoverage: digits d (radix D, the columns past it masked), rows
    # (radix L, the grid reaching it), head and batch (radix the grid) chain exactly on a
    # full grid; a grid one block, one head or one batch entry short is not proven and
    # keeps the passed values where nothing was written
    x = mx.arange(2 * 2 * 10 * 6).reshape(2, 2, 10, 6).astype(mx.float32)
    d = heads_times_two[grid].prepare(x, mx.full(x.shape, -1.0), 10, D=6, BL=4, BD=8)
    assert (d.variant.data["outputs"] == ["Y"]) == proven
    assert d.tracked == ([] if proven else [0])
    want = np.full((4, 10, 6), -1.0, np.float32)      # (batch x head, rows, d)
    rows, heads = min(10, grid[0] * 4), grid[1] * grid[2]
    want[:heads, :rows] = np.array(x).reshape(4, 10, 6)[:heads, :rows] * 2
    np.testing.assert_array_equal(np.array(d()), want.reshape(x.shape))


def test_overlapping_digits_are_not_a_coverage_proof():
    x = mx.arange(3 * 10 * 4).reshape(3, 10, 4).astype(mx.float32)
    d = heads_overlapping[(3, 3)].prepare(x, mx.full(x.shape, -1.0), 10, D=4, BL=4)
    assert d.variant.data["outputs"] == ["Y", "Y_written"]
    flat = np.full(x.size, -1.0, np.float32)
    flat[:(10 + 2) * 4] = np.array(x).reshape(-1)[:(10 + 2) * 4] * 2
    np.testing.assert_array_equal(np.array(d()).reshape(-1), flat)


@metile.kernel
def swizzled_copy(X, Y, N, G: metile.constexpr, FORM: metile.constexpr):
    # one element a program, at the program's (i, j) after Triton's swizzle2d
    i, j = metile.swizzle2d(metile.program_id(0), metile.program_id(1),
                            metile.num_programs(0), metile.num_programs(1), G)
    if FORM == "reversed":
        j = metile.num_programs(1) - 1 - j
    elif FORM == "mixed":
        j = metile.program_id(1)       # i beside the raw id of the other axis
    at = i * N + j + metile.arange(0, 1)
    metile.store(Y + at, metile.load(X + at) * 2.0)


def _swizzle2d(i, j, size_i, size_j, size_g):
    ij = i * size_j + j
    off_i = ij // (size_g * size_j) * size_g
    size_g = min(size_i - off_i, size_g)
    ij %= size_g * size_j
    return off_i + ij % size_g, ij // size_g


@pytest.mark.parametrize("form,proven", [("plain", True), ("reversed", True), ("mixed", False)])
def test_coverage_through_swizzled_program_ids(form, proven):
    # swizzle2d of the program ids permutes the grid (and so does num_programs - 1 - j):
    # a store addressed by its results is proven to cover the output; one of them beside
    # the other axis' raw program id is not (here it leaves elements unwritten, which
    # keep the passed values)
    grid, n = (5, 4), 4
    x = mx.arange(20).astype(mx.float32)
    d = swizzled_copy[grid].prepare(x, mx.full((20,), -1.0), n, G=2, FORM=form)
    assert (d.variant.data["outputs"] == ["Y"]) == proven
    want = np.full(20, -1.0, np.float32)
    for p0 in range(grid[0]):
        for p1 in range(grid[1]):
            i, j = _swizzle2d(p0, p1, *grid, 2)
            j = grid[1] - 1 - j if form == "reversed" else p1 if form == "mixed" else j
            want[i * n + j] = 2.0 * (i * n + j)
    assert (want == -1.0).any() != proven
    np.testing.assert_array_equal(np.array(d()), want)


def test_swizzle2d_of_other_values_is_no_coverage_proof():
    @metile.kernel
    def halves(X, Y, N, G: metile.constexpr):
        i, j = metile.swizzle2d(metile.program_id(0) // 2, metile.program_id(1),
                                metile.num_programs(0), metile.num_programs(1), G)
        at = i * N + j + metile.arange(0, 1)
        metile.store(Y + at, metile.load(X + at) * 2.0)

    x = mx.arange(20).astype(mx.float32)
    d = halves[(5, 4)].prepare(x, mx.full((20,), -1.0), 4, G=2)
    assert d.variant.data["outputs"] == ["Y", "Y_written"]


@metile.kernel
def ones_2d(Y, M, N, K, BM: metile.constexpr, BN: metile.constexpr, FORM: metile.constexpr):
    # a (M, N) tile store of ones under a mask with one term more than its two bounds
    rows = metile.program_id(0) * BM + metile.arange(0, BM)
    cols = metile.program_id(1) * BN + metile.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if FORM == "second_row_bound":
        mask = (rows[:, None] < K) & mask
    elif FORM == "gate":
        gate = metile.program_id(2) + metile.arange(0, 1)
        mask = mask & (gate[:, None] < K)
    metile.store(Y + rows[:, None] * N + cols[None, :], 1.0 + rows[:, None] * 0.0, mask=mask)


@pytest.mark.parametrize("form,k,rows_written", [("second_row_bound", 2, 2), ("gate", 0, 0),
                                                 ("gate", 1, 6)])
def test_mask_terms_beyond_the_tile_bounds_are_no_coverage_proof(form, k, rows_written):
    # (found by a hostile test: the 2-D proof kept one of two bounds on the rows, and
    # ignored a term on another index, and said the output was covered - its unwritten
    # part came back uninitialised)
    d = ones_2d[(2, 2, 1)].prepare(mx.full((6, 5), -7.0), 6, 5, k, BM=4, BN=4, FORM=form)
    assert d.variant.data["outputs"] == ["Y", "Y_written"] and d.tracked == [0]
    want = np.full((6, 5), -7.0, np.float32)
    want[:rows_written] = 1.0
    np.testing.assert_array_equal(np.array(d()), want)


def test_a_tile_store_under_negative_bounds_covers_nothing():
    # M and N both negative: their product is positive, but the mask writes nothing
    for m, n in ((-2, -3), (0, 6), (6, -1)):
        y = ones_2d[(1, 1, 1)](mx.full((6,), -7.0), m, n, 0, BM=4, BN=4, FORM="plain")
        np.testing.assert_array_equal(np.array(y), np.full(6, -7.0, np.float32))


def test_a_mask_on_the_reversed_block_is_not_a_mask_on_the_block():
    # the store at rows = pid * B + arange, the mask on (num_programs - 1 - pid) * B +
    # arange: another index (the old proof took them as one and said 20 rows of 32 were
    # the output; rows 0-7 and 12-15 are never written).  Prepared only: launched, this
    # kernel writes past the output.
    @metile.kernel
    def reversed_mask(Y, n, B: metile.constexpr, D: metile.constexpr):
        rows = metile.program_id(0) * B + metile.arange(0, B)
        rev = (metile.num_programs(0) - 1 - metile.program_id(0)) * B + metile.arange(0, B)
        d = metile.arange(0, D)
        metile.store(Y + rows[:, None] * D + d[None, :], 1.0 + d[None, :] * 0.0,
                     mask=rev[:, None] < n)

    d = reversed_mask[(4,)].prepare(mx.full((40,), -7.0), 20, B=8, D=2)
    assert d.variant.data["outputs"] == ["Y", "Y_written"] and d.tracked == [0]


def test_debug_prints_msl_and_tile_ir(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("METILE_DEBUG", "msl,tile_ir")
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))

    @metile.kernel
    def fresh(X, BLOCK: metile.constexpr):
        metile.store(X + metile.arange(0, BLOCK), 1.0)

    fresh[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    out = capsys.readouterr().out
    assert "func @fresh(" in out and "[tile form]" in out
    assert "X[" in out and "1.0f" in out


def test_disk_cache_skips_the_frontend(monkeypatch, tmp_path):
    import metile.compiler.pipeline as pipeline

    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    calls = []
    real = pipeline.build_tile_ir
    monkeypatch.setattr(pipeline, "build_tile_ir", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    def make():
        @metile.kernel
        def cached(X, BLOCK: metile.constexpr):
            metile.store(X + metile.arange(0, BLOCK), 2.0)
        return cached

    src1 = make()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl").source
    assert calls == [1]
    # a new kernel object, same content
    src2 = make()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl").source
    assert calls == [1] and src1 == src2
    assert list((tmp_path / "dsl").glob("*.json"))
    make()[(1,)].prepare(mx.zeros((16,)), BLOCK=16, backend="msl")  # a new constexpr value compiles
    assert calls == [1, 1]


def test_cache_key_is_content_not_name(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))

    def first():
        @metile.kernel
        def same_name(X, BLOCK: metile.constexpr):
            metile.store(X + metile.arange(0, BLOCK), 1.0)
        return same_name

    def second():
        @metile.kernel
        def same_name(X, BLOCK: metile.constexpr):
            metile.store(X + metile.arange(0, BLOCK), 5.0)
        return second_body(same_name)

    def second_body(k):
        return k

    a = first()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    b = second()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    assert a.spec.key != b.spec.key
    assert "1.0f" in a.source and "5.0f" in b.source
    assert a.variant.data["name"] != b.variant.data["name"]


SCALE = 3.0


def test_cache_key_includes_globals(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))

    def make():
        @metile.kernel
        def scaled(X, BLOCK: metile.constexpr):
            metile.store(X + metile.arange(0, BLOCK), SCALE)
        return scaled

    a = make()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    monkeypatch.setitem(globals(), "SCALE", 4.0)
    b = make()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    assert a.spec.key != b.spec.key and "4.0f" in b.source


def test_corrupt_cache_entry_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))

    def make():
        @metile.kernel
        def corrupt(X, BLOCK: metile.constexpr):
            metile.store(X + metile.arange(0, BLOCK), 1.0)
        return corrupt

    d = make()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    for f in (tmp_path / "dsl").glob("*.json"):
        f.write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring the damaged kernel cache entry"):
        again = make()[(1,)].prepare(mx.zeros((8,)), BLOCK=8, backend="msl")
    assert again.source == d.source


def test_a_damaged_cache_entry_is_generated_again(tmp_path, monkeypatch):
    # (found by a hostile test: one flipped bit in a cached source - `* 3.0f` read as `* 2.0f`
    # - compiled and ran; the entry now carries its contents' sha256)
    import json
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))

    def make():
        @metile.kernel
        def tripled(X, Y, BLOCK: metile.constexpr):
            o = metile.arange(0, BLOCK)
            metile.store(Y + o, metile.load(X + o) * 3.0)
        return tripled

    x = mx.arange(8).astype(mx.float32)
    np.testing.assert_array_equal(np.array(make()[(1,)](x, mx.zeros((8,)), BLOCK=8)),
                                  3 * np.arange(8))
    (f,) = (tmp_path / "dsl").glob("*.json")
    text = f.read_text()
    assert "3.0f" in text
    f.write_text(text.replace("3.0f", "2.0f"))
    with pytest.warns(UserWarning, match="ignoring the damaged kernel cache entry"):
        y = make()[(1,)](x, mx.zeros((8,)), BLOCK=8)
    np.testing.assert_array_equal(np.array(y), 3 * np.arange(8))
    json.loads(f.read_text())   # written again, whole
    # truncated, binary junk, another JSON value: the same warning, the kernel made again
    for junk in (text[:100].encode(), b"\xff\xfe\x00junk", b"null", b'{"key": 1}'):
        f.write_bytes(junk)
        with pytest.warns(UserWarning, match=r"ignoring the damaged kernel cache entry .* "
                                             r"\(it is not a cache entry"):
            y = make()[(1,)](x, mx.zeros((8,)), BLOCK=8)
        np.testing.assert_array_equal(np.array(y), 3 * np.arange(8))
        json.loads(f.read_text())


def test_specialization_by_dtype():
    f32 = vector_add[(1,)].prepare(mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=64,
                                   backend="msl")
    f16 = vector_add[(1,)].prepare(*(mx.zeros((8,), mx.float16) for _ in range(3)), 8, BLOCK=64,
                                   backend="msl")
    assert f32.spec is not f16.spec
    assert "half" in f16.source and "half" not in f32.source


def test_explain_steps_takes_a_bool():
    import json
    d = vector_add[(1,)].prepare(mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=64,
                                 backend="msl")
    assert "steps" in json.loads(d.explain(steps=True))
    with pytest.raises(TypeError, match=r"explain\(steps=\) takes True or False, got 'yes'"):
        d.explain(steps="yes")
    # the launcher's explain takes it too (it passed steps= to the kernel as an argument:
    # "unexpected argument 'steps'"), and the same report
    launched = json.loads(vector_add[(1,)].explain(
        mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=64, backend="msl", steps=True))
    assert launched["steps"] == json.loads(d.explain(steps=True))["steps"]
    assert "steps" not in json.loads(vector_add[(1,)].explain(
        mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8, BLOCK=64, backend="msl"))


def test_a_kernel_parameter_named_steps_stays_the_kernels():
    import json

    @metile.kernel
    def scaled(x, out, steps, BLOCK: metile.constexpr):
        i = metile.arange(0, BLOCK)
        metile.store(out + i, metile.load(x + i) * steps)

    x = mx.arange(4, dtype=mx.float32)
    report = json.loads(scaled[(1,)].explain(x, mx.zeros((4,)), steps=3.0, BLOCK=4))
    assert "steps" not in report
    out = scaled[(1,)](x, mx.zeros((4,)), steps=3.0, BLOCK=4)
    np.testing.assert_array_equal(np.array(out), np.arange(4) * 3.0)
