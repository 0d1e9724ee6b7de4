"""Bad kernels and bad launches give clear errors, never a crash or a hang."""

import os

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import default_is_cpu

cpu_runtime_only = pytest.mark.skipif(not default_is_cpu(), reason="checks messages of metile's MSL CPU runtime")


def copy_kernel(source="out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];", name="copy"):
    return metile.metal_kernel(name, ["inp"], ["out"], source)


def assert_runtime_still_works():
    """After a kernel error the process and the runtime carry on."""
    (good,) = launch(copy_kernel(), n=8)
    np.testing.assert_array_equal(np.array(good), np.zeros(8, np.float32))


def launch(kernel, n=8, **kw):
    args = dict(inputs=[mx.zeros(n)], grid=(n, 1, 1), threadgroup=(n, 1, 1),
                output_shapes=[(n,)], output_dtypes=[mx.float32])
    args.update(kw)
    return kernel(**args)


@cpu_runtime_only
def test_compile_error_names_the_body_line():
    source = "uint i = thread_position_in_grid.x;\nfloat v = inp[i];\nout[i] = v + undefined_name;\n"
    with pytest.raises(metile.MslCompileError) as info:
        launch(copy_kernel(source, name="broken"))
    message = str(info.value)
    assert "kernel 'broken' failed to compile" in message
    assert "broken (source):3:" in message
    assert "undefined_name" in message


@cpu_runtime_only
def test_divergent_barrier_is_reported_not_hung():
    source = """
        uint i = thread_position_in_grid.x;
        if (i % 2 == 0) {
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        out[i] = inp[i];
    """
    (out,) = launch(copy_kernel(source, name="divergent"))
    with pytest.raises(RuntimeError, match=r"divergent threadgroup barrier .* 4 of 8 threads returned"):
        mx.eval(out)


@cpu_runtime_only
def test_barriers_at_different_sites_are_reported():
    source = """
        uint i = thread_position_in_grid.x;
        if (i < 4) {
            threadgroup_barrier(mem_flags::mem_threadgroup);
        } else {
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        out[i] = inp[i];
    """
    (out,) = launch(copy_kernel(source, name="two_sites"))
    with pytest.raises(RuntimeError, match="threads wait at different threadgroup_barrier calls"):
        mx.eval(out)


@cpu_runtime_only
def test_runtime_error_leaves_the_process_usable():
    source = "if (thread_position_in_grid.x) return; threadgroup_barrier(mem_flags::mem_none); out[0] = 1.0f;"
    (bad,) = launch(copy_kernel(source, name="fails"))
    with pytest.raises(RuntimeError):
        mx.eval(bad)
    assert_runtime_still_works()


@cpu_runtime_only
def test_threadgroup_memory_limit():
    source = """
        threadgroup float big[9000];
        big[thread_position_in_threadgroup.x] = 1.0f;
        out[thread_position_in_grid.x] = big[0];
    """
    (out,) = launch(copy_kernel(source, name="too_much_tg"))
    with pytest.raises(RuntimeError, match="threadgroup memory"):
        mx.eval(out)


def test_threadgroup_beyond_metal_limit():
    with pytest.raises(ValueError, match="at most 1024 threads per threadgroup"):
        launch(copy_kernel(), n=2048, grid=(2048, 1, 1), threadgroup=(2048, 1, 1))
    with pytest.raises(ValueError, match="at most 1024 threads per threadgroup"):
        launch(copy_kernel(), n=4096, grid=(64, 64, 1), threadgroup=(64, 32, 1))


def test_argument_count_and_shape_checks():
    kernel = copy_kernel()
    with pytest.raises(ValueError, match="expected `inputs` to have size 1 but got size 2"):
        launch(kernel, inputs=[mx.zeros(8), mx.zeros(8)])
    with pytest.raises(ValueError, match="expected `output_dtypes` to have size 1 but got size 0"):
        launch(kernel, output_dtypes=[])
    with pytest.raises(ValueError, match="grid must be a tuple of three ints"):
        launch(kernel, grid=(8, 1))
    with pytest.raises(ValueError, match="at least one output"):
        metile.metal_kernel("none", ["x"], [], "")
    with pytest.raises(ValueError, match="must be distinct"):
        metile.metal_kernel("dup", ["x"], ["x"], "")


@cpu_runtime_only
def test_address_space_check_mode():
    # Passing threadgroup memory where the helper takes a device pointer is an
    # error on Metal; the check mode reproduces it.
    header = "inline float first(const device float* p) { return p[0]; }"
    source = """
        threadgroup float staged[32];
        staged[thread_position_in_threadgroup.x] = inp[thread_position_in_grid.x];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[thread_position_in_grid.x] = first(staged);
    """
    bad = metile.metal_kernel("mixed_spaces", ["inp"], ["out"], source, header=header)
    with pytest.raises(metile.MslCompileError, match="mixed_spaces"):
        bad.check(inputs=[mx.zeros(32)], output_dtypes=[mx.float32])
    good = metile.metal_kernel("same_spaces", ["inp"], ["out"], source,
                               header=header.replace("device", "threadgroup"))
    good.check(inputs=[mx.zeros(32)], output_dtypes=[mx.float32])


@pytest.mark.skipif(mx.metal.is_available(), reason="Metal runs MSL on the GPU")
def test_gpu_without_metal_says_where_msl_runs():
    from metile.runtime.metal_kernel import route

    with pytest.raises(RuntimeError, match=r"kernel 'copy' is MSL, which runs on a Metal GPU or on the CPU stream.*stream=mx.cpu"):
        route(mx.Device(mx.gpu), "copy")
    assert route(mx.Device(mx.cpu)) == "cpu"


@pytest.mark.skipif(not mx.cuda.is_available() or default_is_cpu(), reason="needs MLX's CUDA backend as default device")
def test_cuda_default_device_call_needs_cpu_stream():
    with pytest.raises(RuntimeError, match="Pass stream=mx.cpu"):
        launch(copy_kernel())


@cpu_runtime_only
def test_invalid_memory_access_is_reported_not_a_crash():
    source = """
        device float* wild = (device float*)(16);
        wild[thread_position_in_grid.x] = inp[0];
        out[thread_position_in_grid.x] = 1.0f;
    """
    (out,) = launch(copy_kernel(source, name="wild_pointer"))
    with pytest.raises(RuntimeError, match=r"invalid memory access at address 0x10 in threadgroup \(0, 0, 0\)"):
        mx.eval(out)
    assert_runtime_still_works()


@cpu_runtime_only
def test_fiber_stack_overflow_is_reported():
    # 800 KB of locals per thread overflow the 128 KiB fiber stack; the kernel is
    # compiled with stack-clash probing, so the guard page catches it.
    source = """
        float big[200000];
        for (int i = 0; i < 200000; ++i) big[i] = inp[0] + i;
        out[thread_position_in_grid.x] = big[thread_position_in_grid.x * 1000];
    """
    (out,) = launch(copy_kernel(source, name="deep_stack"), n=4)
    with pytest.raises(RuntimeError, match="invalid memory access .* fiber stack overflow"):
        mx.eval(out)


@cpu_runtime_only
def test_endless_kernel_is_interrupted_by_the_timeout(monkeypatch):
    monkeypatch.setenv("METILE_MSL_TIMEOUT_S", "1")
    source = """
        float v = inp[0];
        while (v >= 0.0f) { v = v + 1.0f; if (v > 1e30f) v = 0.0f; }
        out[thread_position_in_grid.x] = v;
    """
    (out,) = launch(copy_kernel(source, name="endless"), n=64, grid=(64, 1, 1), threadgroup=(32, 1, 1))
    with pytest.raises(RuntimeError, match=r"kernel exceeded METILE_MSL_TIMEOUT_S=1 s in threadgroup"):
        mx.eval(out)
    assert_runtime_still_works()


@cpu_runtime_only
@pytest.mark.parametrize("source,where", [
    # one element past the end / before the start
    ("out[thread_position_in_grid.x] = inp[thread_position_in_grid.x + 1];",
     r"'inp' \(32 bytes\) accessed at byte offset 32, past its end"),
    ("out[thread_position_in_grid.x + 1] = inp[thread_position_in_grid.x];",
     r"'out' \(32 bytes\) accessed at byte offset 32, past its end"),
    ("out[thread_position_in_grid.x] = inp[int(thread_position_in_grid.x) - 1];",
     r"'inp' \(32 bytes\) accessed at byte offset -4, before its start"),
])
def test_bounds_check_names_the_buffer(source, where):
    # (not run unchecked: the stray write would corrupt this process's heap unnoticed)
    (out,) = launch(copy_kernel(source, name="off_by_one"), n=8, bounds_check=True)
    with pytest.raises(RuntimeError, match=r"out-of-bounds access in threadgroup \(0, 0, 0\): " + where):
        mx.eval(out)
    assert_runtime_still_works()


@cpu_runtime_only
def test_bounds_check_keeps_correct_results(rng, monkeypatch):
    # the same numbers with every buffer fenced (through the environment, as a DSL
    # launch would see it), odd sizes included
    monkeypatch.setenv("METILE_MSL_BOUNDS_CHECK", "1")
    from dsl_kernels import vector_add
    for n in (1, 7, 1000):
        x = rng.standard_normal(n).astype(np.float32)
        z = vector_add[(metile.cdiv(n, 256),)](mx.array(x), mx.array(x), mx.zeros((n,)), n,
                                               BLOCK=256)
        np.testing.assert_array_equal(np.array(z), 2 * x)


# -- a hostile test (twenty-eighth session) -------------------------------------------------

@cpu_runtime_only
@pytest.mark.parametrize("body", ["if (inp[0] == 0.0f) throw 1; out[0] = 1;",
                                  "try { out[0] = inp[0]; } catch (...) {}"])
def test_exceptions_are_compile_errors_as_in_metal(body):
    # (compiled with exceptions, an uncaught throw terminated the Python process)
    k = metile.metal_kernel("throws", ["inp"], ["out"], body)
    with pytest.raises(metile.MslCompileError, match="exceptions disabled"):
        mx.eval(launch(k))
    with pytest.raises(metile.MslCompileError):
        k.check(inputs=[mx.zeros((8,))], output_dtypes=[mx.float32])
    assert_runtime_still_works()


def test_an_int_template_argument_past_int32_is_refused_by_name():
    k = metile.metal_kernel("templated", ["inp"], ["out"], "out[0] = inp[0] * (float)N;")
    with pytest.raises(ValueError, match=r"template argument N=2147483648 does not fit in the "
                                         r"int \(32 bits\)"):
        launch(k, template=[("N", 2**31)])


# -- a hostile test (twenty-ninth session) --------------------------------------------------

@cpu_runtime_only
@pytest.mark.parametrize("bounds_check", [False, True])
@pytest.mark.parametrize("race_check", [False, True])
def test_an_access_to_a_buffer_with_no_elements_raises(bounds_check, race_check, monkeypatch):
    # (unchecked, the write went into the few bytes MLX allocates for an empty output and
    # corrupted the heap: "free(): invalid next size", the process aborted)
    monkeypatch.delenv("METILE_MSL_BOUNDS_CHECK", raising=False)
    (out,) = launch(copy_kernel(name="empty"), n=0, inputs=[mx.zeros((0,))], grid=(4, 1, 1),
                    threadgroup=(4, 1, 1), bounds_check=bounds_check, race_check=race_check)
    where = (r"'inp' \(0 bytes\) accessed at byte offset 0, past its end" if bounds_check
             else r"a buffer with no elements \('inp', 'out'\) accessed at byte offset 0")
    with pytest.raises(RuntimeError, match=r"kernel 'empty': out-of-bounds access in threadgroup "
                                           r"\(0, 0, 0\): " + where):
        mx.eval(out)
    assert_runtime_still_works()


@cpu_runtime_only
def test_a_kernel_that_does_not_touch_its_empty_buffers_runs(monkeypatch):
    monkeypatch.delenv("METILE_MSL_BOUNDS_CHECK", raising=False)
    k = metile.metal_kernel("guarded", ["inp", "n"], ["out", "flag"],
                            "uint i = thread_position_in_grid.x; if (i < n) out[i] = inp[i]; "
                            "if (i == 0) flag[0] = 7;")
    out, flag = k(inputs=[mx.zeros((0,)), 0], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                  output_shapes=[(0,), (1,)], output_dtypes=[mx.float32, mx.int32],
                  bounds_check=False)
    mx.eval(out, flag)
    assert out.shape == (0,) and flag.tolist() == [7]


@cpu_runtime_only
@pytest.mark.parametrize("body,signal", [("if (inp[0] == 0.0f) __builtin_trap(); out[0] = 1;", "illegal instruction"),
                                         ("__builtin_debugtrap(); out[0] = 1;", "trap")])
def test_a_trap_in_a_kernel_is_a_kernel_error(body, signal):
    # (SIGILL from __builtin_trap killed the Python process)
    (out,) = launch(copy_kernel(body, name="traps"))
    with pytest.raises(RuntimeError, match=rf"kernel 'traps': {signal} at .* in threadgroup \(0, 0, 0\): "
                                           r"the kernel reached a trap \(__builtin_trap"):
        mx.eval(out)
    assert_runtime_still_works()


@cpu_runtime_only
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"),
                    reason="the zero-divisor check's trap is decoded on x86 (csrc/README.md)")
@pytest.mark.parametrize("body", ["int z = 0; out[0] = float(int(inp[0]) / z);",
                                  "int d = int(inp[0]) - int(inp[0]); out[0] = float(7 % d);"])
def test_a_divisor_the_compiler_proves_zero_still_raises(body):
    # (C++'s undefined behaviour: clang deleted the store, and the output came back unwritten
    # with no error)
    (out,) = launch(copy_kernel(body, name="zero_divisor"))
    with pytest.raises(RuntimeError, match=r"kernel 'zero_divisor': integer division by zero"):
        mx.eval(out)
    assert_runtime_still_works()


@cpu_runtime_only
def test_a_load_through_a_null_pointer_raises():
    # (clang deleted the load as undefined behaviour: no error, an unwritten output)
    body = "device const float* p = nullptr; out[thread_position_in_grid.x] = p[thread_position_in_grid.x];"
    (out,) = launch(copy_kernel(body, name="null_load"), bounds_check=False)
    with pytest.raises(RuntimeError, match=r"kernel 'null_load': invalid memory access at address"):
        mx.eval(out)
    assert_runtime_still_works()
