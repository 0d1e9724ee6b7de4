"""Rejected simdgroup_inline kernels: the shared-memory contract and matrix-view
rules (frontend/fragments.py, passes/shared_hazards.py).  Each error names the
broken rule and points at the offending line; nothing runs."""

import inspect

import mlx.core as mx
import pytest

import metile

INLINE = metile.Schedule(backend="simdgroup_inline")
M = mx.zeros((8, 8))


def _line_of(kernel, marker: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    for i, line in enumerate(lines):
        if marker in line:
            return first + i
    raise AssertionError(marker)


def rejected(kernel, marker: str, match: str, *args):
    args = args or (M, M, mx.zeros((8, 8)))
    with pytest.raises(metile.CompilationError, match=match) as info:
        kernel[(1,)].prepare(*args, STRICT_MATH=True, SCHEDULE=INLINE)
    msg = str(info.value)
    assert f"{__file__}:{_line_of(kernel, marker)}:" in msg, msg
    assert "metile/passes" not in msg
    return msg


@metile.kernel
def scalar_write_then_matrix_read(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(64, dtype="f32")
    values = metile.tensor(memory, shape=(8, 8))
    matrix = metile.tensor(memory, shape=(8, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        values.store((index // 8, index % 8), metile.load(A + index))
    fragment = matrix.load((0, 0))  # MARK
    output.store((0, 0), fragment)


def test_missing_barrier_before_matrix_read():
    msg = rejected(scalar_write_then_matrix_read, "# MARK", "missing barrier")
    assert "publish the scalar write before the matrix read" in msg
    # (the loop's write reaches the read through the loop's exit: it was reported
    # "missing barrier() across the loop backedge")
    assert "missing barrier(): publish" in msg and "backedge" not in msg


@metile.kernel
def backedge(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(64, dtype="f32")
    values = metile.tensor(memory, shape=(8, 8))
    matrix = metile.tensor(memory, shape=(8, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    for step in metile.tile_range(0, 4):
        for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
            values.store((index // 8, index % 8), metile.load(A + index))  # MARK
        metile.barrier()
        output.store((0, 0), matrix.load((0, 0)))


def test_missing_barrier_across_loop_backedge():
    msg = rejected(backedge, "# MARK", r"missing barrier\(\) across the loop backedge")
    assert "finish the matrix read" in msg


@metile.kernel
def lane_origin(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(256, dtype="f32")
    matrix = metile.tensor(memory, shape=(32, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    output.store((0, 0), matrix.load((metile.thread_id() % 4 * 8, 0)))  # MARK


def test_non_uniform_matrix_origin():
    rejected(lane_origin, "# MARK", "must be uniform within each SIMD-group")


@metile.kernel
def pointer_select(A, B, Out, *, BLOCK: metile.constexpr = 32):
    first = metile.shared(64, dtype="f32")
    second = metile.shared(64, dtype="f32")
    pointer = first
    if metile.load(A) > 0.0:
        pointer = second  # MARK
    metile.store(pointer + metile.thread_id(), 1.0)
    metile.barrier()
    matrix = metile.tensor(first, shape=(8, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    output.store((0, 0), matrix.load((0, 0)))


def test_conditional_shared_pointer_selection():
    with pytest.raises(metile.CompilationError,
                       match="conditional shared-pointer selection is unsupported") as info:
        pointer_select[(1,)].prepare(M, M, mx.zeros((8, 8)), STRICT_MATH=True, SCHEDULE=INLINE)
    msg = str(info.value)
    lines = {_line_of(pointer_select, "# MARK"), _line_of(pointer_select, "if metile.load")}
    assert any(f"{__file__}:{n}:" in msg for n in lines), msg


@metile.kernel
def outside_tile(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(128, dtype="f32")
    matrix = metile.tensor(memory, shape=(16, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    output.store((0, 0), matrix.load((12, 0)))  # MARK


def test_out_of_bounds_shared_tile():
    rejected(outside_tile, "# MARK", "out-of-bounds shared tile")


@metile.kernel
def oversized_view(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(64, dtype="f32")
    matrix = metile.tensor(memory, shape=(8, 8), strides=(12, 1), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    output.store((0, 0), matrix.load((0, 0)))  # MARK


def test_view_must_fit_allocation():
    rejected(oversized_view, "# MARK", "does not fit its 64-element shared allocation")


@metile.kernel
def scratch_alias(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(BLOCK * 2, dtype="f32")
    scratch = metile.tensor(memory, shape=(BLOCK // 4, 8))
    rows = metile.load(Control)
    source = metile.tensor(Source, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    metile.store(memory + metile.thread_id(), 0.0)  # MARK
    output.store((0, 0), source.load((0, 0), scratch=scratch), scratch=scratch)


def test_scratch_misuse():
    rejected(scratch_alias, "# MARK", "scratch misuse", mx.zeros((8, 8)), mx.array([8], mx.int32),
             mx.zeros((8, 8)))


@metile.kernel
def scratch_offset(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(BLOCK * 2 + 8, dtype="f32")
    scratch = metile.tensor(memory + 8, shape=(BLOCK // 4, 8))
    rows = metile.load(Control)
    source = metile.tensor(Source, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    fragment = source.load((0, 0), scratch=scratch)  # MARK
    metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                  access="write").store((0, 0), fragment)


def test_scratch_offset_alias():
    rejected(scratch_offset, "# MARK", "scratch misuse: scratch= must reference a top-level",
             mx.zeros((8, 8)), mx.array([8], mx.int32), mx.zeros((8, 8)))


@metile.kernel
def read_write_device(A, B, Out, *, BLOCK: metile.constexpr = 32):
    view = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8))
    view.store((0, 0), view.load((0, 0)) + 1.0)  # MARK


def test_read_and_write_of_one_device_allocation():
    rejected(read_write_device, "# MARK", "both read and written")


@metile.kernel
def mixed_dot(A, B, Out, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    right = metile.tensor(B, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    product = metile.dot(left.load((0, 0)), right.load((0, 0)), metile.zeros((8, 8)))  # MARK
    output.store((0, 0), product)


def test_mismatched_dot_dtypes():
    rejected(mixed_dot, "# MARK", "one dtype", M, M.astype(mx.float16), mx.zeros((8, 8)))


@metile.kernel
def runtime_strides(A, B, Out, pitch, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(pitch, 1), block_shape=(8, 8),
                         access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    output.store((0, 0), left.load((0, 0)))  # MARK


def test_non_constant_strides():
    rejected(runtime_strides, "# MARK", "constant strides", M, M, mx.zeros((8, 8)), 8)


@metile.kernel
def allocation_in_loop(A, B, Out, *, BLOCK: metile.constexpr = 32):
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    for step in metile.tile_range(0, 2):
        memory = metile.shared(64, dtype="f32")  # MARK
        matrix = metile.tensor(memory, shape=(8, 8), block_shape=(8, 8))
        output.store((0, 0), matrix.load((0, 0)))


def test_shared_allocation_inside_loop():
    rejected(allocation_in_loop, "# MARK", "shared allocations belong at the top of the kernel")


@metile.kernel
def tail_without_scratch(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    rows = metile.load(Control)
    source = metile.tensor(Source, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    fragment = source.load((0, 0))  # MARK
    metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                  access="write").store((0, 0), fragment)


def test_incomplete_device_tile_needs_scratch():
    rejected(tail_without_scratch, "# MARK", "pass scratch=", mx.zeros((8, 8)),
             mx.array([8], mx.int32), mx.zeros((8, 8)))


@metile.kernel
def matrix_store_then_scalar_read(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(64, dtype="f32")
    values = metile.tensor(memory, shape=(8, 8))
    matrix = metile.tensor(memory, shape=(8, 8), block_shape=(8, 8))
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    matrix.store((0, 0), left.load((0, 0)))
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        metile.store(Out + index, values.load((index // 8, index % 8)))  # MARK


def test_missing_barrier_before_scalar_read():
    msg = rejected(matrix_store_then_scalar_read, "# MARK", "missing barrier")
    assert "publish the matrix store before the scalar read" in msg


@metile.kernel
def disjoint_regions(A, B, Out, *, BLOCK: metile.constexpr = 32):
    memory = metile.shared(128, dtype="f32")
    top = metile.tensor(memory, shape=(16, 8), block_shape=(8, 8))
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    fragment = top.load((8, 0))
    top.store((0, 0), left.load((0, 0)))  # disjoint from the read above: no barrier needed
    output.store((0, 0), fragment)


def test_disjoint_regions_need_no_barrier():
    disjoint_regions[(1,)].prepare(M, M, mx.zeros((8, 8)), STRICT_MATH=True, SCHEDULE=INLINE)


@metile.kernel
def lane_branch(A, B, Out, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    if metile.thread_id() < 16:
        output.store((0, 0), left.load((0, 0)))  # MARK


def test_matrix_op_under_lane_divergent_branch():
    rejected(lane_branch, "# MARK", "uniform within each SIMD-group")


@metile.kernel
def lane_scalar(A, B, Out, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    scale = metile.cast(metile.thread_id(), "f32")
    output.store((0, 0), left.load((0, 0)) * scale)  # MARK


def test_fragment_scalar_operand_must_be_simd_uniform():
    rejected(lane_scalar, "# MARK", "scalar operands of fragment arithmetic must be uniform")


@metile.kernel
def short_scratch(Source, Control, Output, *, BLOCK: metile.constexpr = 64):
    scratch = metile.tensor(metile.shared(64, dtype="f32"), shape=(8, 8))
    rows = metile.load(Control)
    source = metile.tensor(Source, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    fragment = source.load((0, 0), scratch=scratch)  # MARK
    metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                  access="write").store((0, 0), fragment)


def test_scratch_shape_must_match_block():
    rejected(short_scratch, "# MARK", r"scratch misuse: the scratch tensor has 8 rows; with "
             r"BLOCK=64 threads it needs BLOCK // 4 = 16", mx.zeros((8, 8)),
             mx.array([8], mx.int32), mx.zeros((8, 8)))


@metile.kernel
def group_outside(A, B, Out, *, BLOCK: metile.constexpr = 64):
    memory = metile.shared(64, dtype="f32")
    matrix = metile.tensor(memory, shape=(8, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    output.store((0, 0), matrix.load((metile.thread_id() // 32 * 8, 0)))  # MARK


def test_per_simdgroup_tile_out_of_bounds():
    # the second of the two SIMD-groups' tiles (rows 8..15) is outside the 8-row view
    rejected(group_outside, "# MARK", r"out-of-bounds shared tile: the 8x8 tile's row origin is "
             r"not provably within \[0, 0\] for every one of the 2 SIMD-groups")


@metile.kernel
def group_neighbour(A, B, Out, *, BLOCK: metile.constexpr = 64):
    memory = metile.shared(192, dtype="f32")
    matrix = metile.tensor(memory, shape=(24, 8), block_shape=(8, 8))
    output = metile.tensor(Out, shape=(16, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    row = metile.thread_id() // 32 * 8
    fragment = matrix.load((row, 0))
    matrix.store((row + 8, 0), fragment)  # MARK
    output.store((row, 0), fragment)


def test_per_simdgroup_tiles_overlapping_another_group():
    # group g overwrites the tile group g + 1 reads: not provably disjoint
    msg = rejected(group_neighbour, "# MARK", "missing barrier", M, M, mx.zeros((16, 8)))
    assert "finish the matrix read before the storage is overwritten" in msg


@metile.kernel
def lane_while(A, B, Out, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    step = 0
    while step < metile.thread_id() % 4:  # WHILE
        output.store((0, 0), left.load((0, 0)))  # MARK
        step = step + 1


def test_matrix_op_under_lane_divergent_while():
    msg = rejected(lane_while, "# MARK", "matrix operations need control flow that is uniform "
                   "within each SIMD-group")
    assert f"the while loop at line {_line_of(lane_while, '# WHILE')} has a condition that " \
           f"depends on thread_id()" in msg


@metile.kernel
def carried_lane_while(A, B, Out, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    step = 0
    while step < 4:
        output.store((0, 0), left.load((0, 0)))  # MARK
        step = step + 1 + metile.thread_id() % 2  # lane-dependent through the carried value


def test_lane_divergence_carried_into_while_condition():
    rejected(carried_lane_while, "# MARK", "uniform within each SIMD-group")


@metile.kernel
def barrier_in_group_while(A, B, Out, *, BLOCK: metile.constexpr = 64):
    step = 0
    while step < metile.thread_id() // 32:
        metile.barrier()  # MARK
        step = step + 1


def test_barrier_needs_threadgroup_uniform_while():
    # SIMD-uniform is enough for matrix operations, not for a threadgroup barrier
    rejected(barrier_in_group_while, "# MARK", r"barrier\(\) under control flow that depends on "
             r"thread_id\(\).*every thread of the program must reach it")


# -- hostile tests (twenty-ninth session) ---------------------------------------------------

@metile.kernel
def _lane_chain(A, Out, n, *, L: metile.constexpr, BLOCK: metile.constexpr = 32):
    scratch = metile.tensor(metile.shared(BLOCK * 2, dtype="f32"), shape=(BLOCK // 4, 8))
    src = metile.tensor(A, shape=(32, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    out = metile.tensor(Out, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    v = (0,) * L
    for it in metile.tile_range(0, n):
        v = v[1:] + (metile.thread_id() % 4 * 8,)
    out.store((0, 0), src.load((v[0], 0), scratch=scratch), scratch=scratch)


@metile.kernel(num_simdgroups=2)
def _thread_chain(C, n, L: metile.constexpr):
    v = (0,) * L
    for it in metile.tile_range(0, n):
        v = v[1:] + (metile.thread_id(),)   # after L iterations v[0] == thread_id()
    metile.atomic_add(C, v[0])


@pytest.mark.parametrize("hops", [3, 12])
def test_thread_dependence_many_loop_carried_hops_away_is_found(hops):
    # (the fixed points stopped after 8 and 4 rounds: past them a lane-dependent matrix origin
    # compiled and mixed rows, and a per-thread atomic ran once per program)
    a = mx.arange(256, dtype=mx.float32).reshape(32, 8)
    with pytest.raises(metile.CompilationError, match="matrix origins, extents and bases must be "
                                                      "uniform within each SIMD-group"):
        _lane_chain[(1,)](a, mx.zeros((8, 8)), hops, L=hops, STRICT_MATH=True,
                          SCHEDULE=metile.Schedule(backend="simdgroup_inline"))
    got = _thread_chain[(1,)](mx.zeros((1,), mx.int32), hops, L=hops)
    assert got.tolist() == [sum(range(64))]


def test_a_constant_index_outside_a_shared_array_is_refused():
    # (it read the neighbouring shared array, which no bounds check fences)
    @metile.kernel(num_simdgroups=1)
    def outside(O):
        s = metile.shared(32)
        t = metile.shared(32)
        tid = metile.thread_id()
        metile.store(t + tid, 7.0)
        metile.store(s + tid, 1.0)
        metile.barrier()
        metile.store(O + tid, metile.load(s + 40))

    with pytest.raises(metile.CompilationError, match="load\\(\\) of element 40 of a shared array "
                                                      "of 32 elements: outside it"):
        outside[(1,)](mx.zeros((32,)))


@metile.kernel
def fragment_summed(A, O, BLOCK: metile.constexpr = 32):
    f = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),  # REJECT
                      access="read").load((0, 0))
    metile.store(O, metile.sum(f))


def test_a_fragment_reduced_as_a_tile_is_named():
    # (an AssertionError without a line: "lower_tiles: cannot compute frag_view_load per
    # element")
    rejected(fragment_summed, "# REJECT", r"a matrix fragment \(a view's 8x8 block_shape "
             r"load\) is opaque: it cannot be reduced, indexed or stored as a tile here",
             M, mx.zeros((1,)))


@metile.kernel
def plain_tile_in_a_fragment_dot(A, B, O, BLOCK: metile.constexpr = 32):
    f = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                      access="read").load((0, 0))
    r = metile.arange(0, 8)
    p = metile.load(B + r[:, None] * 8 + r[None, :])  # REJECT
    out = metile.tensor(O, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="write")
    out.store((0, 0), metile.dot(f, p, metile.zeros((8, 8))))


def test_a_plain_tile_in_a_fragment_dot_is_named():
    # (it said "load is not supported on matrix fragments", as if loads were refused)
    rejected(plain_tile_in_a_fragment_dot, "# REJECT",
             r"this 8x8 tile is used as a matrix fragment \(a dot operand or combined with "
             r"one\), which must come from a block_shape view's load")
