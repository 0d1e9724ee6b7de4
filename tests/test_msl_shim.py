"""Tests of metile's Metal shim (python/metile/runtime/msl_cpu/include) and of
rewrite_msl: builds tests/shim/test_shim.cpp (MLX-style kernels run on a
small fiber scheduler) with clang++-19 and runs it, checks that the
address-space mode rejects mixed address spaces, and that a trivial kernel
library compiles quickly."""

from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import shutil
import subprocess
import time

import pytest

from metile import MslCompileError

ROOT = pathlib.Path(__file__).resolve().parents[1]
MSL_CPU = ROOT / "python" / "metile" / "runtime" / "msl_cpu"
INCLUDE = MSL_CPU / "include"
SHIM_TESTS = ROOT / "tests" / "shim"
CLANG = shutil.which("clang++-19")

# The flags metile compiles kernel libraries with.
KERNEL_FLAGS = [
    "-std=c++20", "-O2", "-fno-strict-aliasing",
    "-Xclang", "-ffloat16-excess-precision=none",
    "-Xclang", "-fbfloat16-excess-precision=none",
    "-mf16c", "--rtlib=compiler-rt",
    "-Wno-unknown-attributes", "-Wno-c++11-narrowing",
    "-I", str(INCLUDE),
]

needs_clang = pytest.mark.skipif(CLANG is None, reason="clang++-19 is not installed (apt: clang-19 libclang-rt-19-dev)")


def _load_rewrite():
    spec = importlib.util.spec_from_file_location("metile_msl_rewrite", MSL_CPU / "rewrite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rewrite_msl = _load_rewrite().rewrite_msl


def _compile(args, cwd=None):
    return subprocess.run([CLANG, *args], capture_output=True, text=True, cwd=cwd)


@needs_clang
def test_shim_kernels_run(tmp_path):
    if not pathlib.Path("/usr/include/boost/context/detail/fcontext.hpp").exists():
        pytest.skip("boost.context is not installed (apt: libboost-context-dev)")
    exe = tmp_path / "test_shim"
    r = _compile([*KERNEL_FLAGS, str(SHIM_TESTS / "test_shim.cpp"), "-lboost_context", "-o", str(exe)])
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all shim tests passed" in run.stdout


@needs_clang
def test_address_space_mistakes_fail_the_strict_check():
    """tests/shim/address_spaces.metal compiles against the strict Metal model as
    is, and each -DBAD=n variant (a pointer in the wrong address space) fails."""
    from metile.runtime.msl_cpu import strict

    source = rewrite_msl((SHIM_TESTS / "address_spaces.metal").read_text())
    strict.check(source, "address_spaces")
    for bad in (1, 2, 3, 4):
        with pytest.raises(MslCompileError, match=r"(?s)strict Metal check.*error: cannot initialize|no matching function"):
            strict.check(f"#define BAD {bad}\n{source}", f"address_spaces_bad{bad}")


TRIVIAL_KERNEL = """
#include <metal_stdlib>
using namespace metal;

template <typename T>
[[kernel]] void custom_kernel_myexp(
  const device T* inp [[buffer(0)]],
  device T* out [[buffer(1)]],
  uint3 thread_position_in_grid [[thread_position_in_grid]]) {
  uint elem = thread_position_in_grid.x;
  out[elem] = metal::exp(inp[elem]);
}

extern "C" void metile_lane_main(metile_rt::Lane* lane) {
  metile_rt::current_lane = lane;
  custom_kernel_myexp<float>(
      static_cast<const float*>(lane->buffers[0]), static_cast<float*>(lane->buffers[1]),
      uint3(lane->thread_position_in_grid[0], lane->thread_position_in_grid[1],
            lane->thread_position_in_grid[2]));
}
"""


@needs_clang
def test_kernel_library_builds_fast(tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text(rewrite_msl(TRIVIAL_KERNEL))
    lib = tmp_path / "k.so"
    t0 = time.perf_counter()
    r = _compile([*KERNEL_FLAGS, "-shared", "-fPIC", str(src), "-o", str(lib)])
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # no warnings from the shim
    handle = ctypes.CDLL(str(lib))
    assert hasattr(handle, "metile_lane_main")
    # About 0.3 s on one core; the budget is generous for loaded CI machines.
    assert elapsed < 3.0, f"trivial kernel took {elapsed:.2f} s to compile"


def test_rewrite_msl():
    src = (
        "float4 x = vec<float, 4>(a.xy, 1, 2);\n"
        "vec<float,4> y; device float4* p; auto z = as_type<vec<uint,2>>(q);\n"
        "auto c = static_cast<float4>(i4) + (half2)(h) + (float4)s + static_cast<int>(f);\n"
        "auto w = metal::vec<IdxT, 2>(0); auto lit = 1.5bf + 2bf + 0xbf + x1bf;\n"
        'template [[host_name("k")]] [[kernel]] decltype(f<float>) f<float>;\n'
        "template <typename T> [[kernel]] void k();\n"
    )
    out = rewrite_msl(src)
    assert "::metile_rt::make_vec<float, 4>(a.xy, 1, 2)" in out
    assert "vec<float,4> y; device float4* p; auto z = as_type<vec<uint,2>>(q);" in out
    assert "::metile_rt::convert<float4>(i4)" in out
    assert "::metile_rt::convert<half2>(h)" in out
    # (a bare C-style vector cast converts element-wise too; it was left to clang, which
    # reinterprets a vector's bits)
    assert "::metile_rt::convert<float4>(s)" in out and "static_cast<int>(f)" in out
    assert "::metile_rt::make_vec<IdxT, 2>(0)" in out
    assert "((bfloat)1.5f) + ((bfloat)2) + 0xbf + x1bf" in out
    assert "template decltype(f<float>) f<float>;" in out
    assert "template <typename T> [[kernel]] void k();" in out
    assert rewrite_msl(out) == out
