"""Launch-time mistakes a new user makes, each answered by an error that names
the culprit and the fix (or by the correct result, checked against NumPy)."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import default_is_cpu, requires_msl_device
from metile import CompilationError, LaunchError


@metile.kernel
def double(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=m) * 2.0, mask=m)


@metile.kernel(differentiable=True)
def square(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    x = metile.load(X + offs, mask=m)
    metile.store(Y + offs, x * x, mask=m)


@metile.kernel
def reads_only(X, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    metile.load(X + offs, mask=offs < n)


@metile.kernel
def count_true(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.arange(0, BLOCK)
    x = metile.load(X + offs, mask=offs < n)  # masked-off lanes read False
    metile.store(Y + offs, metile.where(x, 1, 0), mask=offs < BLOCK)


def test_grad_of_single_input_differentiable_kernel():
    x = mx.array(np.linspace(-2, 2, 9).astype(np.float32))
    g = mx.grad(lambda a: (square[(1,)](a, mx.zeros((9,)), 9, BLOCK=16) * mx.arange(9)).sum())(x)
    np.testing.assert_allclose(np.array(g), 2 * np.array(x) * np.arange(9), rtol=3e-4, atol=3e-5)


def test_grad_through_kernel_without_vjp_says_how_to_get_one():
    x = mx.ones((8,))
    with pytest.raises(LaunchError, match=r"kernel 'double' has no vjp.*"
                                          r"@metile\.kernel\(differentiable=True\).*custom_function"):
        mx.grad(lambda a: double[(1,)](a, mx.zeros((8,)), 8, BLOCK=8).sum())(x)
    # a kernel off the gradient's path is fine
    g = mx.grad(lambda a: (a * double[(1,)](mx.ones((8,)), mx.zeros((8,)), 8, BLOCK=8)).sum())(x)
    np.testing.assert_allclose(np.array(g), np.full(8, 2.0))


def test_grid_beyond_32_bit_thread_counts():
    with pytest.raises(LaunchError, match=r"grid 134217728 programs x 32 threads = 4294967296 "
                                          r"threads on axis 0 exceeds 2147483647"):
        double[(2**27,)](mx.ones((8,)), mx.zeros((8,)), 8, BLOCK=8)
    with pytest.raises(LaunchError, match="grid axis 1 has 2147483648 programs"):
        double[(1, 2**31)](mx.ones((8,)), mx.zeros((8,)), 8, BLOCK=8)


def test_grid_of_numpy_integers():
    x = mx.arange(100, dtype=mx.float32)
    for grid in ((np.int64(4),), np.int32(4), [np.uint8(4)]):
        y = double[grid](x, mx.zeros((100,)), 100, BLOCK=32)
        np.testing.assert_allclose(np.array(y), np.arange(100) * 2.0)
    with pytest.raises(LaunchError, match=r"grid must be 1 to 3 non-negative ints"):
        double[(2.0,)](x, mx.zeros((100,)), 100, BLOCK=32)


def test_float_constexpr_is_named():
    with pytest.raises(CompilationError, match=r"arange\(\) end must be a constexpr int.*got float 8\.0 "
                                               r"\(the constant is constexpr BLOCK=8\.0\)"):
        double[(1,)](mx.ones((8,)), mx.zeros((8,)), 8, BLOCK=8.0)


def test_kernel_without_stores():
    with pytest.raises(CompilationError, match="kernel 'reads_only' stores to no buffer, so it has "
                                               "no result"):
        reads_only[(1,)](mx.ones((8,)), 8, BLOCK=8)


def test_bool_buffers():
    x = mx.array([True, False, True, True, False])
    y = count_true[(1,)](x, mx.zeros((8,), dtype=mx.int32), 5, BLOCK=8)
    np.testing.assert_array_equal(np.array(y), [1, 0, 1, 1, 0, 0, 0, 0])
    # bool * 2.0 promotes to float32, as in Triton
    y = double[(1,)](x, mx.zeros((5,)), 5, BLOCK=8)
    np.testing.assert_array_equal(np.array(y), [2.0, 0.0, 2.0, 2.0, 0.0])


@requires_msl_device
def test_source_kernels_take_numpy_ints_and_refuse_huge_grids():
    k = metile.metal_kernel(name="copy4", input_names=["a"], output_names=["b"],
                            source="uint i = thread_position_in_grid.x; b[i] = a[i];")
    call = dict(inputs=[mx.arange(4, dtype=mx.float32)], output_shapes=[(4,)],
                output_dtypes=[mx.float32])
    b = k(grid=(np.int64(4), np.int32(1), 1), threadgroup=(np.uint16(4), 1, 1), **call)[0]
    np.testing.assert_array_equal(np.array(b), np.arange(4))
    with pytest.raises(ValueError, match=r"\[metal_kernel\] grid \(2147483648, 1, 1\) has a "
                                         r"dimension above 2147483647"):
        k(grid=(2**31, 1, 1), threadgroup=(4, 1, 1), **call)
    with pytest.raises(ValueError, match=r"grid must be a tuple of three ints, got \(True, 1, 1\)"):
        k(grid=(True, 1, 1), threadgroup=(4, 1, 1), **call)


@metile.kernel
def keyword_names(vertex, fragment, n, BLOCK: metile.constexpr):
    o = metile.arange(0, BLOCK)
    metile.store(fragment + o, metile.load(vertex + o, mask=o < n) + 1.0, mask=o < n)


def test_parameters_named_like_metal_keywords_are_renamed():
    y = keyword_names[(1,)](mx.arange(5, dtype=mx.float32), mx.zeros((5,)), 5, BLOCK=8)
    np.testing.assert_array_equal(np.array(y), np.arange(5) + 1.0)
    src = keyword_names[(1,)].prepare(mx.arange(5, dtype=mx.float32), mx.zeros((5,)), 5,
                                      BLOCK=8).source
    assert "arg_vertex" in src and "arg_fragment" in src



@metile.kernel
def macro_names(NAN, errno, uint3, M_PI_F, as_type, BLOCK: metile.constexpr):
    o = metile.arange(0, BLOCK)
    v = metile.load(NAN + o) * uint3 + M_PI_F
    metile.store(errno + o, v + v.to(metile.int32, bitcast=True).to(metile.float32) * as_type)


def test_parameters_named_like_macros_vector_types_and_builtins_are_renamed():
    # (a hostile trial: the C preprocessor expanded a parameter named NAN or errno, MSL
    # read uint3 as its vector type and as_type as the bitcast it calls - a clang error
    # dump at the first launch instead of a kernel)
    x = mx.arange(4, dtype=mx.float32)
    got = macro_names[(1,)](x, mx.zeros((4,)), 2.0, 0.5, 0.0, BLOCK=4)
    np.testing.assert_array_equal(np.array(got), np.arange(4) * 2.0 + 0.5)
    src = macro_names[(1,)].prepare(x, mx.zeros((4,)), 2.0, 0.5, 0.0, BLOCK=4).source
    assert all(f"arg_{n}" in src for n in ("NAN", "errno", "uint3", "M_PI_F", "as_type"))

def test_buffers_beyond_32_bit_offsets_are_refused():
    # lazy arrays: nothing is allocated, the launch is refused before anything runs
    big = mx.zeros((2**16, 2**15), dtype=mx.float16)  # MLX shapes are int32 per axis
    with pytest.raises(LaunchError, match=r"kernel 'double': argument 'X' has 2147483648 "
                                          r"elements, more than the 2146435072 that 32-bit "
                                          r"offsets address: compute its offsets in int64"):
        double[(1,)](big, mx.zeros((8,), mx.float16), 8, BLOCK=8)


@pytest.mark.skipif(not default_is_cpu(), reason="the CPU runtime's binding (_ext.launch_cpu) "
                    "serves the CPU stream; this default device is a GPU")
def test_relaunches_on_the_cpu_runtime_reuse_their_binding(monkeypatch):
    # the first launch of a signature goes through MetalKernel's checks (_ext.launch_cpu)
    # and binds (_ext.CpuLaunch, its arguments converted once); later ones call the binding
    # with the new arrays (the results stay right); a changed lane order (a setting the
    # binding read) is part of the launch key: a new Dispatch, bound again
    from metile import _ext
    from metile.runtime import metal_kernel as metal_kernel_module

    monkeypatch.delenv("METILE_LANE_ORDER", raising=False)
    prepared, orders, bound_orders, calls = [], [], [], []
    real_prepare = metal_kernel_module.MetalKernel.prepare_call
    monkeypatch.setattr(metal_kernel_module.MetalKernel, "prepare_call",
                        lambda self, *a: prepared.append(1) or real_prepare(self, *a))
    real_launch, real_bound = _ext.launch_cpu, _ext.CpuLaunch
    monkeypatch.setattr(_ext, "launch_cpu", lambda *a: orders.append(a[9]) or real_launch(*a))

    class Bound:
        def __init__(self, *a):
            bound_orders.append(a[8])
            self.bound = real_bound(*a)

        def __call__(self, arrays, stream=None):
            calls.append(len(arrays))
            return self.bound(arrays, stream)
    monkeypatch.setattr(_ext, "CpuLaunch", Bound)

    @metile.kernel
    def add_two(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        metile.store(Y + offs, metile.load(X + offs, mask=offs < n) + 2.0, mask=offs < n)

    for i in range(3):
        x = np.arange(10, dtype=np.float32) * (i + 1)
        got = add_two[(1,)](mx.array(x), mx.zeros((10,)), 10, BLOCK=16)
        np.testing.assert_array_equal(np.array(got), x + 2.0)
    # the first launch binds (one set of checks) and runs through the binding, as the
    # relaunches do: no full call
    assert len(prepared) == 1 and orders == [] and bound_orders == ["forward"]
    assert calls == [2, 2, 2]   # X and n's 0-d array (Y is only written)
    monkeypatch.setenv("METILE_LANE_ORDER", "reverse")
    got = add_two[(1,)](mx.ones((10,)), mx.zeros((10,)), 10, BLOCK=16)
    np.testing.assert_array_equal(np.array(got), np.full(10, 3.0, np.float32))
    assert bound_orders[-1] == "reverse"   # (a new launch for the new setting, bound)


def test_vmap_over_a_launch_is_refused_by_name():
    # a kernel has no batching rule: under mx.vmap its outputs stand in with the batched
    # shapes and evaluating them raises an error naming the kernel and what to do instead
    import metile

    @metile.kernel
    def doubled(x, out, n, BLOCK: metile.constexpr):
        i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        metile.store(out + i, metile.load(x + i, mask=i < n) * 2.0, mask=i < n)

    xs = mx.ones((3, 8))
    out = mx.vmap(lambda v: doubled[(1,)](v, mx.zeros((8,)), 8, BLOCK=8))(xs)
    assert out.shape == (3, 8)
    with pytest.raises((LaunchError, RuntimeError),
                       match=r"kernel 'doubled' cannot be batched by mx.vmap"):
        mx.eval(out)


@pytest.mark.skipif(mx.default_device() == mx.gpu and mx.metal.is_available(),
                    reason="on Metal kernels launch through MLX's own metal_kernel primitive")
def test_shapeless_compile_is_refused_by_name():
    # a kernel is built for the shapes it was traced with (grid, constants): MLX's
    # shapeless compile would rerun it on others, so the launch refuses by name
    x = mx.ones((8,))
    f = mx.compile(lambda a: double[(1,)](a, mx.zeros((8,)), 8, BLOCK=8), shapeless=True)
    with pytest.raises(ValueError, match=r"kernel 'double' is built for the shapes it was "
                                         r"traced with, so mx.compile\(shapeless=True\)"):
        mx.eval(f(x))
    w = mx.ones((8,))
    g = mx.compile(lambda a: metile.ops.rms_norm(a, w, 1e-5, backend="metile"), shapeless=True)
    with pytest.raises(ValueError, match=r"kernel 'rms_norm' is built for the shapes"):
        mx.eval(g(mx.ones((4, 8))))
    # every later shape too, for each row op: their rows were a reshape, which kept the
    # traced shape and failed first ("[reshape] Cannot reshape array of size 224")
    rows_ops = {"rms_norm": lambda a: metile.ops.rms_norm(a, mx.ones((16,)), 1e-5,
                                                           backend="metile"),
                "softmax": lambda a: metile.ops.softmax(a, backend="metile"),
                "rope": lambda a: metile.ops.rope(a, 8, traditional=False, base=1e4,
                                                  scale=1.0, offset=3, backend="metile"),
                "linear": lambda a: metile.ops.linear(a, mx.ones((4, 16)), backend="metile")}
    for name, op in rows_ops.items():
        c = mx.compile(op, shapeless=True)
        kernel = "matmul_epilogue" if name == "linear" else name
        for t in (4, 7):
            with pytest.raises(ValueError, match=rf"kernel '{kernel}' is built for the "
                                                 r"shapes it was traced with"):
                mx.eval(c(mx.ones((1, 2, t, 16))))
    # MLX's ops (backend="mlx", and auto's MLX route) stay shapeless
    h = mx.compile(lambda a: metile.ops.rms_norm(a, w, 1e-5, backend="mlx"), shapeless=True)
    for rows in (4, 6):
        np.testing.assert_allclose(np.array(h(mx.ones((rows, 8)))), np.ones((rows, 8)),
                                   rtol=1e-5)


# -- a second hostile test (twenty-eighth session) -------------------------------------------

@metile.kernel
def named_like_metal_attributes(threadgroup_position_in_grid, grid_size, n,
                                BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(grid_size + offs, metile.load(threadgroup_position_in_grid + offs, mask=m) * 3.0,
                 mask=m)


def test_parameters_named_like_metal_attributes_are_renamed():
    # (MLX declares an attribute the body names as a parameter: the generated signature
    # defined it twice, a raw Metal compile error)
    out = named_like_metal_attributes[(2,)](mx.arange(100, dtype=mx.float32), mx.zeros((100,)),
                                            100, BLOCK=64)
    np.testing.assert_array_equal(np.array(out), 3.0 * np.arange(100))


def test_num_simdgroups_true_and_array_grids_are_refused_by_name():
    x = mx.zeros((4,))
    with pytest.raises(metile.LaunchError, match="num_simdgroups must be an int in 1..32, got True"):
        named_like_metal_attributes[(1,)](x, x, 4, BLOCK=4, num_simdgroups=True)
    with pytest.raises(metile.LaunchError, match=r"grid must be 1 to 3 non-negative ints .* got "
                                                 r"array\(\[1, 2\]"):
        named_like_metal_attributes[lambda m: mx.array([1, 2])](x, x, 4, BLOCK=4)


@pytest.mark.parametrize("grid, shown", [
    ([], "[]"), ((1, 2, 3, 4), "(1, 2, 3, 4)"), ("abc", "'abc'"), ([1.5], "[1.5]"),
    (lambda m: [], "[] (returned by the grid callable)")])
def test_a_refused_grid_is_named_as_the_call_gave_it(grid, shown):
    # (the tuple made of a list was named: grid=[] read "got ()", [1.5] "got (1.5,)")
    x = mx.zeros((8,))
    message = (r"grid must be 1 to 3 non-negative ints \(programs per axis\), got "
               + re.escape(shown) + "$")
    with pytest.raises(LaunchError, match=message):
        double[grid](x, x, 8, BLOCK=8)
    with pytest.raises(LaunchError, match=message):
        double.warmup(x, x, 8, BLOCK=8, grid=grid)


def test_a_grid_of_no_programs_is_a_launch_that_runs_nothing():
    # (not a refused grid: an axis of 0 programs is an empty launch, as in Triton)
    out = double[[0]](mx.ones((8,)), mx.ones((8,)), 8, BLOCK=8)
    np.testing.assert_array_equal(np.array(out), np.ones(8))


def test_num_warps_against_the_schedule_names_both():
    # (README: contradictions are errors naming both; planning blamed the kernel's lanes)
    x = mx.zeros((4,))
    with pytest.raises(LaunchError, match=r"num_warps=2 contradicts the SCHEDULE's "
                                          r"num_simdgroups=4"):
        named_like_metal_attributes[(1,)](x, x, 4, BLOCK=4, num_warps=2,
                                          SCHEDULE=metile.Schedule(num_simdgroups=4))


# -- a hostile test (twenty-ninth session) --------------------------------------------------

@metile.kernel
def _fill_blocks(Z, BLOCK: metile.constexpr = 4):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Z + offs, 1.0)


def test_a_grid_changed_in_place_launches_its_current_value():
    # (the launch cache kept the grid object: a list changed in place, or an mx.array
    # incremented, ran the first grid's programs again)
    written = lambda launcher: int(np.array(launcher(mx.zeros((16,)))).sum())
    grid = [1]
    held = _fill_blocks[grid]
    for n in (1, 2, 3):
        grid[0] = n
        assert written(_fill_blocks[grid]) == 4 * n and written(held) == 4 * n
    g = mx.array(1)
    for n in (1, 2, 3):
        assert written(_fill_blocks[(g,)]) == 4 * n == written(_fill_blocks[g])
        g += 1
    assert written(_fill_blocks[np.array(2)]) == 8
    with pytest.raises(LaunchError, match="grid must be 1 to 3 non-negative ints"):
        written(_fill_blocks[{2}])   # (a set: "unhashable type" from the launch cache before)


@metile.kernel
def doubled_unmasked(X, Y, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs) * 2.0)


@metile.kernel
def tile_copy(X, Y, M, N, S, BM: metile.constexpr, BN: metile.constexpr):
    rows = metile.program_id(0) * BM + metile.arange(0, BM)
    cols = metile.program_id(1) * BN + metile.arange(0, BN)
    inside = (rows[:, None] < M) & (cols[None, :] < N)
    metile.store(Y + rows[:, None] * S + cols[None, :],
                 metile.load(X + rows[:, None] * S + cols[None, :], mask=inside), mask=inside)


def test_a_store_past_its_output_is_refused_before_it_runs():
    # a bound larger than the output (or no mask and a grid past its end) would write out
    # of bounds: on the CPU runtime that corrupted the process's heap (an abort at exit)
    x = mx.arange(8).astype(mx.float32)
    with pytest.raises(LaunchError, match=r"kernel 'double' would store to element 15 of 'Y', "
                                          r"which has 8 elements: .* at grid \(1, 1, 1\) and "
                                          r"n=32"):
        double[(1,)](x, mx.zeros((8,)), 32, BLOCK=16)
    with pytest.raises(LaunchError, match=r"'doubled_unmasked' would store to element 15 of "
                                          r"'Y', which has 8 elements"):
        doubled_unmasked[(1,)](x, mx.zeros((8,)), BLOCK=16)
    # a 3x5 tile store (row stride 5) into 14 elements: its last element is 14
    t = mx.arange(15).astype(mx.float32)
    with pytest.raises(LaunchError, match=r"'tile_copy' would store to element 14 of 'Y', "
                                          r"which has 14 elements"):
        tile_copy[(1, 1)](t, mx.zeros((14,)), 3, 5, 5, BM=4, BN=8)
    # in bounds: the same launches run and are right
    np.testing.assert_array_equal(np.array(double[(1,)](x, mx.zeros((8,)), 8, BLOCK=16)),
                                  np.arange(8) * 2.0)
    np.testing.assert_array_equal(np.array(doubled_unmasked[(1,)](x, mx.zeros((8,)), BLOCK=8)),
                                  np.arange(8) * 2.0)
    np.testing.assert_array_equal(np.array(tile_copy[(1, 1)](t, mx.zeros((15,)), 3, 5, 5,
                                                             BM=4, BN=8)), np.arange(15.0))
    # a new bound of the same launch family is checked too
    for n in (4, 8, 9):
        if n > 8:
            with pytest.raises(LaunchError, match="would store to element 8 of 'Y'"):
                double[(1,)](x, mx.zeros((8,)), n, BLOCK=16)
        else:
            got = np.array(double[(1,)](x, mx.zeros((8,)), n, BLOCK=16))
            np.testing.assert_array_equal(got[:n], np.arange(n) * 2.0)


@metile.kernel
def guarded_copy(X, Y, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    if pid * BLOCK < n:
        metile.store(Y + offs, metile.load(X + offs))


def test_a_load_past_its_input_is_refused_before_it_runs():
    # the same analysis bounds top-level loads: a bound past the input read another
    # buffer's bytes (or faulted) on a GPU and returned them as a result
    x = mx.arange(8).astype(mx.float32)
    with pytest.raises(LaunchError, match=r"kernel 'double' would load from element 15 of "
                                          r"'X', which has 8 elements: .* and n=16"):
        double[(1,)](x, mx.zeros((16,)), 16, BLOCK=16)
    with pytest.raises(LaunchError, match=r"'doubled_unmasked' would load from element 15 of "
                                          r"'X', which has 8 elements"):
        doubled_unmasked[(2,)](x, mx.zeros((16,)), BLOCK=8)
    t = mx.arange(14).astype(mx.float32)
    with pytest.raises(LaunchError, match=r"'tile_copy' would load from element 14 of 'X', "
                                          r"which has 14 elements"):
        tile_copy[(1, 1)](t, mx.zeros((15,)), 3, 5, 5, BM=4, BN=8)
    # new values of the same launch family are checked too, and in-bounds ones run
    for n in (8, 9):
        y = mx.zeros((16,))
        if n > 8:
            with pytest.raises(LaunchError, match="would load from element 8 of 'X'"):
                double[(1,)](x, y, n, BLOCK=16)
        else:
            np.testing.assert_array_equal(np.array(double[(1,)](x, y, n, BLOCK=16))[:8],
                                          np.arange(8) * 2.0)
    # a load under a branch is not bounded by the analysis (its guard may keep it inside):
    # the second program's block lies past X, and the guard skips it
    got = np.array(guarded_copy[(2,)](x, mx.full((16,), -1.0), 8, BLOCK=8))
    np.testing.assert_array_equal(got, np.r_[np.arange(8.0), np.full(8, -1.0)])


@metile.kernel
def store_moved(X, Y, base, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs + base, metile.load(X + offs))


@metile.kernel
def load_moved(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Y + offs, metile.load(X + (offs + 1), mask=m), mask=m)


def test_offsets_moved_by_a_constant_or_scalar_are_bounded_too():
    # (a hostile trial: `Y + offs + 1` or `X + offs + base` dropped the launch's check, so
    # an off-by-one wrote Y[8] of 8 elements, or read the bytes after X, silently)
    x = mx.arange(8).astype(mx.int32)
    y = lambda: mx.full((8,), -7, mx.int32)
    with pytest.raises(LaunchError, match=r"'store_moved' would store to element 8 of 'Y', "
                                          r"which has 8 elements: its store reaches \[1, 9\)"):
        store_moved[(2,)](x, y(), 1, BLOCK=4)
    with pytest.raises(LaunchError, match=r"'store_moved' would store to element -1 of 'Y' "
                                          r"\(which has 8 elements\), before its start"):
        store_moved[(2,)](x, y(), -1, BLOCK=4)
    with pytest.raises(LaunchError, match=r"'load_moved' would load from element 8 of 'X', "
                                          r"which has 8 elements: .* and n=8"):
        load_moved[(2,)](x, y(), 8, BLOCK=4)
    # in bounds they run, and a moved store proves no coverage (the rest is kept)
    np.testing.assert_array_equal(np.array(store_moved[(2,)](x, y(), 0, BLOCK=4)), np.arange(8))
    np.testing.assert_array_equal(np.array(store_moved[(1,)](x, y(), 4, BLOCK=4)),
                                  [-7] * 4 + [0, 1, 2, 3])
    np.testing.assert_array_equal(np.array(load_moved[(2,)](x, y(), 7, BLOCK=4)),
                                  [1, 2, 3, 4, 5, 6, 7, -7])


@metile.kernel
def copy_wide(X, Y, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0).to(metile.int64)
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    m = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=m), mask=m)


def test_int64_offsets_are_bounded_and_proven_as_int32_ones():
    # the README's int64 form (`program_id(0).to(int64) * BLOCK + arange`) indexes what the
    # int32 form does: its loads and stores are bounded at launch (a load past X returned
    # the bytes after it), and its store covers the output (no written mask)
    x = mx.arange(10).astype(mx.float32)
    got = copy_wide[(1,)](x, mx.full((10,), -1.0), 10, BLOCK=16)
    np.testing.assert_array_equal(np.array(got), np.arange(10.0))
    assert type(copy_wide.last_dispatch.spec.coverage["Y"]).__name__ == "RadixCoverage"
    with pytest.raises(LaunchError, match=r"'copy_wide' would load from element 15 of 'X', "
                                          r"which has 10 elements: .* and n=16"):
        copy_wide[(1,)](x, mx.zeros((16,)), 16, BLOCK=16)
    with pytest.raises(LaunchError, match=r"'copy_wide' would store to element 15 of 'Y', "
                                          r"which has 10 elements"):
        copy_wide[(1,)](mx.arange(16).astype(mx.float32), mx.zeros((10,)), 16, BLOCK=16)


def test_a_bound_of_2_to_the_31_or_more_is_checked_as_a_smaller_one():
    # a Python int of 2**31 or more reaches the kernel as an int64 scalar, so `offs < n`
    # compares offs.to(int64): the analysis looked for offs itself, bounded nothing, and
    # the launch wrote past Y and read past X (heap corruption, an abort at exit)
    x = mx.arange(8).astype(mx.float32)
    for n in (2**31, 2**40):
        with pytest.raises(LaunchError, match=rf"kernel 'double' would store to element 15 "
                                              rf"of 'Y', which has 8 elements: .* n={n}"):
            double[(1,)](x, mx.zeros((8,)), n, BLOCK=16)
    t = mx.arange(15).astype(mx.float32)
    with pytest.raises(LaunchError, match=r"'tile_copy' would store to element 19 of 'Y', "
                                          r"which has 15 elements"):
        tile_copy[(1, 1)](t, mx.zeros((15,)), 2**31, 5, 5, BM=4, BN=8)
    np.testing.assert_array_equal(np.array(double[(1,)](x, mx.zeros((8,)), 8, BLOCK=16)),
                                  np.arange(8) * 2.0)


@metile.kernel
def residual_on_columns(A, B, R, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
                        BK: metile.constexpr):
    rows = metile.program_id(0) * BM + metile.arange(0, BM)
    cols = metile.program_id(1) * BN + metile.arange(0, BN)
    ks = metile.arange(0, BK)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in range(0, K, BK):
        a = metile.load(A + rows[:, None] * K + (k + ks)[None, :],
                        mask=(rows[:, None] < M) & ((k + ks)[None, :] < K))
        b = metile.load(B + (k + ks)[:, None] * N + cols[None, :],
                        mask=((k + ks)[:, None] < K) & (cols[None, :] < N))
        acc += metile.dot(a, b)
    # rows left to the store's mask: the fused epilogue reads R only where C is stored
    r = metile.load(R + rows[:, None] * N + cols[None, :], mask=cols[None, :] < N)
    metile.store(C + rows[:, None] * N + cols[None, :], acc + r,
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


def test_an_epilogue_read_masked_on_one_axis_is_not_refused():
    # (a hostile trial: the load check bounded it by its own mask, past R's 30 elements,
    # while the epilogue evaluates it only at stored elements)
    rng = np.random.default_rng(0)
    a, b, r = (rng.standard_normal(s).astype(np.float32) for s in ((5, 7), (7, 6), (5, 6)))
    got = residual_on_columns[(1, 1)](mx.array(a), mx.array(b), mx.array(r), mx.zeros((5, 6)),
                                      5, 6, 7, BM=16, BN=16, BK=16)
    np.testing.assert_allclose(np.array(got), a @ b + r, rtol=1e-5, atol=1e-5)


@metile.kernel
def one_tile_product(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
                     BK: metile.constexpr):
    rows = metile.program_id(0) * BM + metile.arange(0, BM)
    cols = metile.program_id(1) * BN + metile.arange(0, BN)
    ks = metile.arange(0, BK)
    a = metile.load(A + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K))
    b = metile.load(B + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N))
    metile.store(C + rows[:, None] * N + cols[None, :], metile.dot(a, b),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


def test_a_product_operand_past_its_input_is_refused():
    # a product's operands are loaded as tiles under their own masks: still bounded
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 6)).astype(np.float32)
    with pytest.raises(LaunchError, match=r"'one_tile_product' would load from element 55 of 'A', "
                                          r"which has 35 elements"):
        one_tile_product[(1, 1)](mx.array(a), mx.array(b), mx.zeros((8, 6)), 8, 6, 7,
                                 BM=16, BN=16, BK=16)
    got = one_tile_product[(1, 1)](mx.array(a), mx.array(b), mx.zeros((5, 6)), 5, 6, 7,
                                   BM=16, BN=16, BK=16)
    np.testing.assert_allclose(np.array(got), a @ b, rtol=1e-5, atol=1e-5)


def test_launch_options_list_every_keyword_bind_reads():
    # a tuned call refuses keywords that are neither the kernel's parameters nor
    # LAUNCH_OPTIONS: an option bind() reads but the list lacks would be refused there
    import ast
    import inspect

    from metile.runtime import kernel as kernel_module
    popped = {node.args[0].value for node in ast.walk(ast.parse(inspect.getsource(kernel_module)))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "pop" and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "kwargs" and node.args
              and isinstance(node.args[0], ast.Constant)}
    assert popped and popped == set(kernel_module.LAUNCH_OPTIONS)


@metile.kernel
def _copy_n(X, Y, n, BLOCK: metile.constexpr):
    o = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + o, metile.load(X + o, mask=o < n), mask=o < n)


def test_explain_after_a_launch_that_failed_does_not_describe_the_one_before():
    x = mx.arange(8).astype(mx.float32)
    y = _copy_n[(1,)](x, mx.zeros((8,)), 8, BLOCK=8)
    np.testing.assert_array_equal(np.array(y), np.arange(8))
    assert json.loads(_copy_n.explain())
    with pytest.raises(TypeError, match="n"):
        _copy_n[(1,)](x, mx.zeros((8,)), BLOCK=8)          # n missing
    with pytest.raises(RuntimeError, match=r"_copy_n's last launch failed before it was "
                                           r"prepared \(\w+: "):
        _copy_n.explain()
    _copy_n[(1,)](x, mx.zeros((8,)), 8, BLOCK=8)          # a launch that runs: described again
    assert json.loads(_copy_n.explain())
