"""The MSL CPU runtime's source builder, compiler discovery and kernel cache."""

import os
import warnings

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.runtime.msl_cpu import compiler, source
from metile.runtime.msl_cpu.compiler import MslCompileError
from conftest import default_is_cpu

cpu_runtime_only = pytest.mark.skipif(not default_is_cpu(), reason="exercises metile's MSL CPU runtime")


def test_missing_compiler_names_the_fix(monkeypatch):
    monkeypatch.setenv("METILE_CXX", "/nonexistent/clang++")
    compiler.find_compiler.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"METILE_CXX='/nonexistent/clang\+\+' is not a clang\+\+ 17 "
                                               r"or later on PATH.*apt-get install clang-19 libclang-rt-19-dev"):
            compiler.find_compiler()
    finally:
        monkeypatch.delenv("METILE_CXX")
        compiler.find_compiler.cache_clear()


def test_threadgroup_declarations_become_group_storage():
    body = """
        threadgroup float tile[32][33];
        threadgroup atomic_int counter;
        threadgroup float* p = &tile[0][0];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    """
    out = source.rewrite_threadgroup_declarations(body)
    assert ("threadgroup ::metile_rt::ident<float[32][33]>& tile = "
            "::metile_rt::tg_storage<float[32][33], 16>(0);") in out
    assert ("threadgroup ::metile_rt::ident<atomic_int>& counter = "
            "::metile_rt::tg_storage<atomic_int, 16>(1);") in out
    # pointers into threadgroup memory and barriers are left alone
    assert "threadgroup float* p = &tile[0][0];" in out
    assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in out


def test_threadgroup_declarations_of_every_form():
    # (several names in one declaration, alignas/aligned, and vector arrays: the first two
    # silently became per-thread locals, the last did not compile - `float4 (&tile)[32]`
    # expanded the float4(...) macro)
    out = source.rewrite_threadgroup_declarations(
        "threadgroup float a[32], b[8][4];\n"
        "threadgroup alignas(32) float c[64];\n"
        "threadgroup half4 d[16] __attribute__((aligned(64)));\n"
        "threadgroup float4 tile[32];\n")
    assert ("threadgroup ::metile_rt::ident<float[32]>& a = "
            "::metile_rt::tg_storage<float[32], 16>(0); "
            "threadgroup ::metile_rt::ident<float[8][4]>& b = "
            "::metile_rt::tg_storage<float[8][4], 16>(1);") in out
    assert "::metile_rt::tg_storage<float[64], 32>(2);" in out
    assert "::metile_rt::tg_storage<half4[16], 64>(3);" in out
    assert "threadgroup ::metile_rt::ident<float4[32]>& tile" in out
    for body, where in (("threadgroup float z = 1.0f;", "source"), ("", "header")):
        with pytest.raises(MslCompileError, match=rf"\({where}, line 1\): `threadgroup float "
                                                  rf"(z = 1.0f|sh\[32\]);` - a threadgroup "
                                                  rf"variable is shared by the group only"):
            source.build(name="k", inputs=[], output_names=["y"], output_dtypes=[mx.float32],
                         source=body or "y[0] = 1;",
                         header="" if body else "threadgroup float sh[32];\n",
                         template=[], atomic_outputs=False, rewrite=lambda text: text)


def test_signature_matches_mlx_rules():
    tu = source.build(
        name="sig",
        inputs=[
            source.InputSpec("big", mx.float16, 2, 64),
            source.InputSpec("small", mx.int32, 1, 3),
            source.InputSpec("scalar", mx.float32, 0, 1),
        ],
        output_names=["out"],
        output_dtypes=[mx.bfloat16],
        source="out[0] = big[big_strides[0]] + small[0] + scalar + big_ndim + thread_index_in_simdgroup;",
        header="",
        template=[("N", 4), ("FLAG", True), ("T", mx.float32)],
        atomic_outputs=False,
        rewrite=lambda s: s,
    )
    assert "template <int N, bool FLAG, typename T>" in tu
    assert "const device float16_t* big [[buffer(0)]]" in tu
    assert "const constant int64_t* big_strides [[buffer(1)]]" in tu
    assert "const constant int& big_ndim [[buffer(2)]]" in tu
    assert "big_shape" not in tu
    assert "const constant int32_t* small [[buffer(3)]]" in tu
    assert "const constant float& scalar [[buffer(4)]]" in tu
    assert "device bfloat16_t* out [[buffer(5)]]" in tu
    assert "uint thread_index_in_simdgroup [[thread_index_in_simdgroup]]" in tu
    assert "custom_kernel_sig<4, true, float>(" in tu


@cpu_runtime_only
def test_kernels_compile_once_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    kernel = metile.metal_kernel("cached", ["x"], ["out"], "out[thread_position_in_grid.x] = x[thread_position_in_grid.x] + 1;")

    def run(dtype):
        (out,) = kernel(inputs=[mx.zeros(4, dtype=dtype)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                        output_shapes=[(4,)], output_dtypes=[dtype])
        np.testing.assert_array_equal(np.array(out.astype(mx.float32)), np.ones(4))

    run(mx.float32)
    libraries = sorted((tmp_path / "msl_cpu").glob("*.so"))
    assert len(libraries) == 1
    stamp = libraries[0].stat().st_mtime_ns
    run(mx.float32)
    assert sorted((tmp_path / "msl_cpu").glob("*.so")) == libraries
    assert libraries[0].stat().st_mtime_ns == stamp
    run(mx.float16)  # another dtype is another specialization
    assert len(list((tmp_path / "msl_cpu").glob("*.so"))) == 2


@cpu_runtime_only
def test_a_directory_where_the_library_goes_is_a_warning(tmp_path, monkeypatch):
    # (os.replace onto it raised IsADirectoryError out of every launch of the kernel)
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    text = 'extern "C" int metile_probe_directory() { return 7; }'
    library = compiler.compile_library(text, "probe")
    library.unlink()
    library.mkdir()
    with pytest.warns(RuntimeWarning, match=r"cannot keep the compiled kernel at .*\.so \(.*Is a "
                                            r"directory"):
        private = compiler.compile_library(text, "probe")
    assert private != library and private.is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiler.compile_library(text, "probe") == private   # kept: no second compile


@cpu_runtime_only
def test_a_compile_lock_that_cannot_be_taken_is_a_warning(tmp_path, monkeypatch):
    # (a directory at the lock's path - or another user's leftover lock in a shared cache -
    # raised filelock's IsADirectoryError/PermissionError out of every launch)
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    text = 'extern "C" int metile_probe_lock() { return 8; }'
    library = compiler.cache_dir() / (compiler._key(text, compiler._FLAGS + [
        f"-I{compiler.INCLUDE_DIR}"]) + ".so")
    (library.parent / (library.name + ".lock")).mkdir(parents=True)
    with pytest.warns(RuntimeWarning, match=r"cannot take the compile lock .*\.so\.lock \(.*Is a "
                                            r"directory"):
        private = compiler.compile_library(text, "probe")
    assert private != library and private.is_file() and not library.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiler.compile_library(text, "probe") == private   # kept: no second compile


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_while_a_launch_is_being_built_does_not_hang_the_child():
    # (a thread compiling held the library lock at the fork; the child's first new launch
    # waited on its copy forever)
    from metile.runtime import metal_kernel, routing
    with metal_kernel._lock, routing._lock:
        pid = os.fork()
        if pid == 0:
            ok = metal_kernel._lock.acquire(timeout=5) and routing._lock.acquire(timeout=5)
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
