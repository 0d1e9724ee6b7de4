"""Rejected kernels and bad launches: the message names the problem, points at
the user's line (file:line:col plus a caret) and shows no compiler frames.
These run no kernel (the frontend rejects them first)."""

import inspect
import traceback

import mlx.core as mx
import numpy as np
import pytest

import metile


def _line_of(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else fn)
    for i, line in enumerate(lines):
        if marker in line:
            return first + i
    raise AssertionError(marker)


def compile_error(launch) -> metile.CompilationError:
    with pytest.raises(metile.CompilationError) as info:
        launch()
    err = info.value
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    assert "metile/frontend" not in text and "metile/passes" not in text, text
    assert "code_generator" not in text
    return err


def assert_points_at(err, kernel, marker: str, col: int | None = None):
    line = _line_of(kernel, marker)
    msg = str(err)
    assert f"{__file__}:{line}:" in msg, msg
    assert marker in msg.splitlines()[1], msg  # the source line is shown
    assert msg.splitlines()[2].strip() == "^"
    if col is not None:
        assert f":{line}:{col}:" in msg, msg


X = mx.zeros((8,))


@metile.kernel
def uses_try(X):
    try:  # MARK-try
        metile.store(X, 1.0)
    finally:
        pass


def test_try_statement_rejected():
    err = compile_error(lambda: uses_try[(1,)](X))
    assert "unsupported Python in a kernel: try statement" in str(err)
    assert_points_at(err, uses_try, "MARK-try", col=5)


@metile.kernel
def uses_list_comprehension(X, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    parts = [offs * i for i in range(3)]  # MARK-comp
    metile.store(X + parts[0], 1.0)


def test_list_comprehension_rejected():
    err = compile_error(lambda: uses_list_comprehension[(1,)](X, BLOCK=8))
    assert "list comprehension" in str(err)
    assert_points_at(err, uses_list_comprehension, "MARK-comp", col=13)


@metile.kernel
def runtime_block(X, n):
    offs = metile.arange(0, n)  # MARK-constexpr
    metile.store(X + offs, 1.0)


def test_runtime_value_where_constexpr_required():
    err = compile_error(lambda: runtime_block[(1,)](X, 8))
    assert "arange() end must be a constexpr int" in str(err)
    assert "runtime int32" in str(err)
    assert_points_at(err, runtime_block, "MARK-constexpr", col=12)


@metile.kernel
def offsets_from_float(X, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.store(X + offs * 0.5, 1.0)  # MARK-floatoffs


def test_promoted_float_offset_is_refused_as_offset():
    # int * 0.5 promotes to float32 (Triton's rule); a pointer takes only integer offsets
    err = compile_error(lambda: offsets_from_float[(1,)](X, BLOCK=8))
    assert "pointer offsets must be int32 or int64, got float32; cast them" in str(err)
    assert_points_at(err, offsets_from_float, "MARK-floatoffs")


@metile.kernel
def writes_read_only_view(X, Y):
    view = metile.tensor(X, shape=(8,), access="read")
    view.store((0,), 1.0)  # MARK-readonly


def test_store_to_read_only_view():
    err = compile_error(lambda: writes_read_only_view[(1,)](X, X + 1))
    assert "store to a read-only tensor view (access='read')" in str(err)
    assert_points_at(err, writes_read_only_view, "MARK-readonly", col=5)


@metile.inline
def bad_helper(x):
    return x + metile.load(x)  # MARK-helper


@metile.kernel
def calls_bad_helper(X):
    metile.store(X, bad_helper(X))


def test_error_inside_inline_helper_points_at_helper():
    err = compile_error(lambda: calls_bad_helper[(1,)](X))
    assert "pointer offsets must be int32 or int64, got float32" in str(err)
    assert_points_at(err, bad_helper, "MARK-helper")


@metile.kernel
def carried_type_change(X, n):
    acc = 0
    for i in range(n):  # MARK-carried
        acc = acc + metile.load(X + i)
    metile.store(X, acc)


def test_loop_carried_type_change():
    # int32 + float32 promotes to float32, so the carried int32 `acc` changes type
    err = compile_error(lambda: carried_type_change[(1,)](X, 4))
    assert "loop-carried variable 'acc' changes type from int32 to float32" in str(err)


@metile.kernel
def constant_int_operand(A, OP: metile.constexpr, C: metile.constexpr, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    a = metile.load(A + offs)
    if OP == "//":
        r = a // C  # MARK-//
    elif OP == "%":
        r = a % C  # MARK-%
    elif OP == "<<":
        r = a << C  # MARK-<<
    else:
        r = a >> C  # MARK->>
    metile.store(A + offs, r)


@pytest.mark.parametrize("op,c,dtype,message", [
    ("//", 0, mx.int32, "integer '//' by the constant 0"),
    ("%", 0, mx.uint32, "integer '%' by the constant 0"),
    ("<<", 32, mx.int32, "'<<' by 32 on int32: a shift amount must be in [0, 32)"),
    (">>", -1, mx.int64, "'>>' by -1 on int64: a shift amount must be in [0, 64)"),
    ("<<", 8, mx.uint8, "'<<' by 8 on uint8: a shift amount must be in [0, 8)"),
])
def test_constant_divisor_zero_and_shift_out_of_range(op, c, dtype, message):
    # clang folded these undefined operations to garbage (-1 from `a // 0`, where a zero
    # divisor known only at launch is reported by the CPU runtime)
    err = compile_error(lambda: constant_int_operand[(1,)](mx.zeros((4,), dtype), OP=op, C=c,
                                                          BLOCK=4))
    assert message in str(err)
    assert_points_at(err, constant_int_operand, f"MARK-{op}", col=13)


@metile.kernel
def tile_condition(X, BLOCK: metile.constexpr):
    x = metile.load(X + metile.arange(0, BLOCK))
    if x > 0:  # MARK-tilecond
        metile.store(X, 1.0)


def test_if_on_a_tile():
    err = compile_error(lambda: tile_condition[(1,)](X, BLOCK=8))
    assert "if condition must be a scalar" in str(err)
    assert_points_at(err, tile_condition, "MARK-tilecond")


@metile.kernel
def code_after_break(X, n):
    for i in range(n):
        break
        metile.store(X + i, 1.0)  # MARK-dead


def test_code_after_break_rejected():
    # break itself is supported (tests/test_control_flow.py); dead code after it is a mistake.
    err = compile_error(lambda: code_after_break[(1,)](X, 4))
    assert "code after break never runs" in str(err)
    assert_points_at(err, code_after_break, "MARK-dead", col=9)


@metile.kernel
def for_else(X, n):
    for i in range(n):  # MARK-forelse
        if i > 2:
            break
    else:
        metile.store(X, 1.0)


def test_for_else_rejected():
    err = compile_error(lambda: for_else[(1,)](X, 4))
    assert "for/else is not supported" in str(err)
    assert_points_at(err, for_else, "MARK-forelse", col=5)


@metile.kernel
def calls_python(X):
    metile.store(X, float(len([1])))  # MARK-pycall


def test_calling_plain_python_function():
    def helper():
        return 1

    @metile.kernel
    def k(X):
        metile.store(X, helper())  # MARK-plain

    err = compile_error(lambda: k[(1,)](X))
    assert "neither a metile builtin nor a @metile.inline helper" in str(err)
    assert_points_at(err, k, "MARK-plain")


# -- bad launches ------------------------------------------------------------------------

@metile.kernel
def copy(X, Y, n, BLOCK: metile.constexpr = 64):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs, mask=offs < n), mask=offs < n)


def test_wrong_argument_count():
    with pytest.raises(metile.LaunchError, match="missing arguments: n"):
        copy[(1,)](X, mx.zeros((8,)))
    with pytest.raises(metile.LaunchError, match="takes 4 arguments, got 5"):
        copy[(1,)](X, X, 8, 64, 1)
    with pytest.raises(metile.LaunchError, match="unexpected argument 'BLOK'"):
        copy[(1,)](X, mx.zeros((8,)), 8, BLOK=64)


def test_unsupported_dtype():
    with pytest.raises(metile.LaunchError, match="dtype mlx.core.complex64 is not supported"):
        copy[(1,)](mx.zeros((8,), mx.complex64), mx.zeros((8,)), 8)


def test_input_aliasing_output():
    y = mx.zeros((8,))
    with pytest.raises(metile.LaunchError, match="same array as output 'Y'"):
        copy[(1,)](y, y, 8)


def test_output_slot_must_be_array():
    err = compile_error(lambda: copy[(1,)](X, 3.0, 8))
    assert "parameter 'Y' was passed a scalar - a number, or a 0-d mx.array, which a launch takes as a scalar value; pass an mx.array of one or more dimensions if it is a buffer" in str(err)


def test_bad_grid():
    with pytest.raises(metile.LaunchError, match="grid must be 1 to 3 non-negative ints"):
        copy[(1, 2, 3, 4)](X, mx.zeros((8,)), 8)
    with pytest.raises(metile.LaunchError, match="grid must be"):
        copy[(-1,)](X, mx.zeros((8,)), 8)


def test_prepared_dispatch_rejects_other_signature():
    d = copy[(1,)].prepare(X, mx.zeros((8,)), 8)
    with pytest.raises(metile.LaunchError, match="argument 'X'"):
        d(mx.zeros((8,), mx.float16), mx.zeros((8,)), 8)
    with pytest.raises(metile.LaunchError, match="rank"):
        d(mx.zeros((2, 4)), mx.zeros((8,)), 8)


def test_kernel_called_directly():
    with pytest.raises(TypeError, match=r"copy\[grid\]"):
        copy(X, X, 8)


@metile.kernel
def divergent_barrier(X):
    tid = metile.thread_id()
    if tid < 4:
        metile.barrier()  # MARK-divergent


def test_barrier_under_thread_dependent_if():
    err = compile_error(lambda: divergent_barrier[(1,)](X))
    assert "barrier() under control flow that depends on thread_id()" in str(err)
    assert_points_at(err, divergent_barrier, "MARK-divergent")


@metile.kernel
def divergent_tile(X, BLOCK: metile.constexpr):
    for i in metile.tile_range(metile.thread_id(), 64, 32):
        metile.store(X + metile.arange(0, BLOCK), 1.0)  # MARK-divtile


def test_tile_op_under_thread_dependent_loop():
    err = compile_error(lambda: divergent_tile[(1,)](X, BLOCK=8))
    assert "tile operation under control flow that depends on thread_id()" in str(err)
    assert_points_at(err, divergent_tile, "MARK-divtile")


@metile.kernel
def full_of_a_float_as_int(O, BLOCK: metile.constexpr):
    metile.store(O + metile.arange(0, BLOCK), metile.full((BLOCK,), 2.7, dtype=metile.int32))  # MARK-full


def test_full_of_a_float_with_an_int_dtype_names_both():
    err = compile_error(lambda: full_of_a_float_as_int[(1,)](mx.zeros((8,), mx.int32), BLOCK=8))
    assert "full() value 2.7 is a float and dtype int32 is not" in str(err)
    assert_points_at(err, full_of_a_float_as_int, "MARK-full")


@metile.kernel
def too_much_shared(x, out, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    v = metile.load(x + i)
    t = v[:, None] + v[None, :]
    metile.store(out + i, metile.sum(t, axis=1))  # MARK-shared


def test_shared_overflow_points_at_its_source_line():
    # a 512x512 float tile read across lanes (the row sums) is held in threadgroup memory:
    # past the limit, the error names the line whose tile pushed it over
    err = compile_error(lambda: too_much_shared[(1,)](mx.zeros((512,)), mx.zeros((512,)),
                                                      BLOCK=512))
    assert "tiles held in threadgroup memory need" in str(err)
    assert_points_at(err, too_much_shared, "MARK-shared")


@metile.kernel
def pointer_per_branch(a, b, out, flag):
    if flag > 0:  # MARK-pointers
        p = a
    else:
        p = b
    metile.store(out, metile.load(p))


def test_pointers_into_two_buffers_across_an_if_are_named():
    # (a helper finding: the message asked for a cast, which no pointer can take)
    err = compile_error(lambda: pointer_per_branch[(1,)](X, X + 1, X + 2, 1))
    assert "points into 'a' in one branch of a runtime if and into 'b' in the other" in str(err)
    assert "cast" not in str(err)
    assert_points_at(err, pointer_per_branch, "MARK-pointers")


@metile.kernel
def outer_sum(x, out, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    t = i[:, None] * BLOCK + i[None, :]  # MARK-huge
    metile.store(out + t, metile.load(x + t) + 1)


def test_a_tile_past_tritons_element_bound_is_a_compile_error():
    # (a hostile trial: a 2**27-element tile compiled and overflowed the CPU runtime's stack
    # at run time) - 2048 x 2048 is past Triton's 2**20; 1024 x 1024 is at it and runs
    n = 2048 * 2048
    err = compile_error(lambda: outer_sum[(1,)](mx.zeros((n,)), mx.zeros((n,)), BLOCK=2048))
    assert "a tile of shape (2048, 2048) has 4194304 elements" in str(err)
    assert "1048576" in str(err)
    assert_points_at(err, outer_sum, "MARK-huge")
    x = np.arange(1024 * 1024, dtype=np.float32) % 97
    out = outer_sum[(1,)](mx.array(x), mx.zeros((1024 * 1024,)), BLOCK=1024)
    np.testing.assert_array_equal(np.array(out), x + 1)


@metile.kernel
def min_with_wide_other(x, out, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    v = metile.load(x + i, mask=i < 3, other=0xFFFFFFFF)  # MARK-other
    metile.store(out, metile.min(v, axis=0))


def test_a_literal_is_not_blamed_on_a_constexpr_whose_digits_begin_it():
    # (a hostile trial: "constant 4294967295 does not fit in int32 (the constant is
    # constexpr BLOCK=4)" - the hint matched "constant 4" inside the literal's digits)
    xi = mx.zeros((4,), mx.int32)
    err = compile_error(lambda: min_with_wide_other[(1,)](xi, xi, BLOCK=4))
    assert "constant 4294967295 does not fit in int32" in str(err)
    assert "constexpr BLOCK" not in str(err)
    assert_points_at(err, min_with_wide_other, "MARK-other")
