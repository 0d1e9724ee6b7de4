"""`cuda_kernel(arch=...)`: metile's own NVRTC compile to a cached cubin, launched
through MLX's precompiled_cuda_kernel.  The compile tests run without a GPU
where the nvidia-cuda-nvrtc wheels (or a CUDA toolkit) are present; the
launch tests at the end need MLX's CUDA backend (the H200)."""

import os
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import _ext
from metile.errors import CompilationError
from metile.runtime import nvrtc
from metile.settings import SettingError


def _available() -> str | None:
    try:
        nvrtc.find_toolkit()
    except (nvrtc.NvrtcUnavailable, SettingError) as e:
        return str(e)
    return None


needs_nvrtc = pytest.mark.skipif(_available() is not None, reason=f"no NVRTC: {_available()} "
                                 "(pip install nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-cccl)")

AXPY = """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n[0]) out[i] = __float2half(a[0] * __half2float(x[i])) + y[i];
"""
WGMMA_FENCE = """
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    out[threadIdx.x] = 1.0f;
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, and no cubins remembered from earlier tests."""
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nvrtc, "_memory", {})
    return tmp_path / "cache" / "cuda"


@pytest.fixture
def nvrtc_calls(monkeypatch):
    calls = []
    real = nvrtc.run_nvrtc

    def counting(source, arch, toolkit=None):
        calls.append(arch)
        return real(source, arch, toolkit)

    monkeypatch.setattr(nvrtc, "run_nvrtc", counting)
    return calls


def _axpy(arch="sm_90a", **kw):
    return metile.cuda_kernel("axpy_half", ["a", "x", "y", "n"], ["out"], AXPY, arch=arch, **kw)


AXPY_DTYPES = ([mx.float32, mx.float16, mx.float16, mx.int32], [mx.float16])


def test_translation_unit_has_the_precompiled_contract():
    name, source = _axpy().translation_unit(*AXPY_DTYPES, (128, 2, 1))
    assert re.fullmatch(r"axpy_half_sm_90a_[0-9a-f]{16}", name)
    assert (f'extern "C" __global__ void __launch_bounds__(256) {name}(const float* __restrict__ a, '
            f"const __half* __restrict__ x, const __half* __restrict__ y, const int32_t* __restrict__ n, "
            f"__half* __restrict__ out) {{") in source
    assert "#include <cuda_fp16.h>" in source and "#include <cuda/std/limits>" in source
    # the symbol depends on what its code depends on: arch, dtypes, block size, shared memory
    others = {_axpy("sm_80").translation_unit(*AXPY_DTYPES, (128, 2, 1))[0],
              _axpy().translation_unit([mx.float32, mx.bfloat16, mx.bfloat16, mx.int32], [mx.bfloat16],
                                       (128, 2, 1))[0],
              _axpy().translation_unit(*AXPY_DTYPES, (128, 1, 1))[0],
              _axpy(shared_memory=64 * 1024).translation_unit(*AXPY_DTYPES, (128, 2, 1))[0]}
    assert name not in others and len(others) == 4


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_compiles_to_a_cubin_holding_the_kernel_symbol(cache, arch):
    kernel = _axpy(arch)
    name, cubin = kernel.compiled(*AXPY_DTYPES, (256, 1, 1))
    assert cubin[:4] == b"\x7fELF"
    # extern "C": MLX looks the kernel up by exactly this name
    assert name.encode() + b"\0" in cubin
    assert (cache / f"{next(cache.glob('*.cubin')).name}").stat().st_size == len(cubin)


@needs_nvrtc
def test_arch_reaches_nvrtc_wgmma_needs_sm_90a(cache):
    kernel = metile.cuda_kernel("fence", [], ["out"], WGMMA_FENCE, arch="sm_90a")
    _, cubin = kernel.compiled([], [mx.float32], (128, 1, 1))
    assert cubin[:4] == b"\x7fELF"
    plain = metile.cuda_kernel("fence", [], ["out"], WGMMA_FENCE, arch="sm_90")
    with pytest.raises(CompilationError, match=r"for sm_90:[\s\S]*wgmma\.fence[\s\S]*not supported") as e:
        plain.compiled([], [mx.float32], (128, 1, 1))
    assert e.value.arch == "sm_90"


@needs_nvrtc
def test_syntax_error_names_the_arch_and_carries_nvrtcs_log(cache):
    kernel = metile.cuda_kernel("broken", ["x"], ["out"], "out[0] = x[0] + undefined_name;", arch="sm_90a")
    with pytest.raises(CompilationError) as e:
        kernel.compiled([mx.float32], [mx.float32], (32, 1, 1))
    message = str(e.value)
    assert "kernel 'broken' for sm_90a" in message
    assert 'identifier "undefined_name" is undefined' in message
    assert e.value.arch == "sm_90a" and "undefined_name" in e.value.log
    assert not list(cache.glob("*.cubin"))


@needs_nvrtc
def test_long_logs_are_cut_to_the_first_lines(cache):
    body = "\n".join(f"out[0] = undefined_{i};" for i in range(80))
    with pytest.raises(CompilationError) as e:
        nvrtc.compile(f'extern "C" __global__ void k(float* out) {{\n{body}\n}}', "sm_80")
    message = str(e.value)
    assert "undefined_0" in message and "undefined_79" not in message
    assert re.search(r"\.\.\. \(\d+ more lines\)", message)
    assert "undefined_79" in e.value.log


@needs_nvrtc
def test_disk_cache_is_hit_by_a_later_process(cache, nvrtc_calls, monkeypatch):
    source = _axpy().translation_unit(*AXPY_DTYPES, (64, 1, 1))[1]
    first = nvrtc.compile(source, "sm_90a")
    assert nvrtc.compile(source, "sm_90a") == first and nvrtc_calls == ["sm_90a"]  # memory
    monkeypatch.setattr(nvrtc, "_memory", {})  # as a new process would start
    assert nvrtc.compile(source, "sm_90a") == first and nvrtc_calls == ["sm_90a"]  # disk
    nvrtc.compile(source, "sm_80")
    assert nvrtc_calls == ["sm_90a", "sm_80"]  # the arch is part of the key


@needs_nvrtc
def test_truncated_cache_file_is_rebuilt(cache, nvrtc_calls, monkeypatch):
    source = _axpy().translation_unit(*AXPY_DTYPES, (64, 1, 1))[1]
    first = nvrtc.compile(source, "sm_90a")
    (path,) = cache.glob("*.cubin")
    path.write_bytes(first[: len(first) // 2])
    monkeypatch.setattr(nvrtc, "_memory", {})
    assert nvrtc.compile(source, "sm_90a") == first
    assert nvrtc_calls == ["sm_90a", "sm_90a"]
    assert path.read_bytes() == first
    # a file of the right size but other bytes is not trusted either
    path.write_bytes(bytes(len(first)))
    monkeypatch.setattr(nvrtc, "_memory", {})
    assert nvrtc.compile(source, "sm_90a") == first and len(nvrtc_calls) == 3


@needs_nvrtc
def test_unwritable_cache_dir_warns_and_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("METILE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(nvrtc, "_memory", {})
    with pytest.warns(RuntimeWarning, match="cannot write the cache directory .*compiled CUDA kernels"):
        cubin = nvrtc.compile('extern "C" __global__ void k(float* out) { out[0] = 1.0f; }', "sm_80")
    assert cubin[:4] == b"\x7fELF"


def test_metile_nvrtc_pointing_at_a_missing_file(tmp_path, monkeypatch):
    missing = tmp_path / "libnvrtc.so.13"
    monkeypatch.setenv("METILE_NVRTC", str(missing))
    with pytest.raises(SettingError, match=rf"METILE_NVRTC='{re.escape(str(missing))}' is not a file; "
                                           r"set it to the path of libnvrtc\.so"):
        nvrtc.compile('extern "C" __global__ void k(float* out) {}', "sm_90a")


@needs_nvrtc
def test_metile_nvrtc_selects_the_library(monkeypatch):
    library = nvrtc.find_toolkit().library
    monkeypatch.setenv("METILE_NVRTC", library)
    toolkit = nvrtc.find_toolkit()
    assert toolkit.library == library and toolkit.origin == "METILE_NVRTC"
    assert any((Path(d) / "cuda_fp16.h").exists() for d in toolkit.includes)


@needs_nvrtc
def test_a_loaded_libnvrtc_is_found_in_the_process_maps(monkeypatch):
    # MLX's CUDA build links libnvrtc; here the wheel's copy stands in for it.
    library = nvrtc._nvidia_wheel_roots() and nvrtc.find_toolkit().library
    if not library:
        pytest.skip("no nvidia-cuda-nvrtc wheel")
    import ctypes
    ctypes.CDLL(library)
    assert nvrtc._mapped_nvrtc() == os.path.realpath(library)
    monkeypatch.delenv("METILE_NVRTC", raising=False)
    nvrtc._find.cache_clear()  # the search runs once per process; run it again now
    try:
        assert nvrtc.find_toolkit().origin == "loaded in this process"
    finally:
        nvrtc._find.cache_clear()


def test_bad_arch_template_and_shape_reads_are_refused_early():
    with pytest.raises(ValueError, match=r"arch must name a real GPU architecture .* got 'compute_90a'"):
        metile.cuda_kernel("k", ["x"], ["out"], "out[0] = x[0];", arch="compute_90a")
    with pytest.raises(ValueError, match=r"passes only pointers, so pass sizes as scalar inputs"):
        metile.cuda_kernel("k", ["x"], ["out"], "out[0] = x[x_shape[0] - 1];", arch="sm_90a")
    kernel = metile.cuda_kernel("k", ["x"], ["out"], "out[0] = x[0];", arch="sm_90a")
    with pytest.raises(ValueError, match=r"arch='sm_90a'.*takes no template arguments"):
        kernel(inputs=[mx.zeros(4)], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1),
               threadgroup=(1, 1, 1), template=[("T", mx.float32)])
    with pytest.raises(ValueError, match="shared_memory must be a non-negative int"):
        metile.cuda_kernel("k", ["x"], ["out"], "out[0] = x[0];", shared_memory=-1, arch="sm_90a")


@pytest.mark.skipif(mx.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_launch_without_a_cuda_device_raises_like_the_mlx_path():
    messages = []
    for arch in (None, "sm_90a"):
        kernel = metile.cuda_kernel("k", ["x"], ["out"], "out[0] = x[0];", arch=arch)
        with pytest.raises(RuntimeError, match=r"is CUDA C\+\+, which needs MLX's CUDA backend") as e:
            kernel(inputs=[mx.zeros(4)], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1),
                   threadgroup=(1, 1, 1))
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    # the binding, reached without the Python check, raises too (no crash)
    with pytest.raises(RuntimeError, match="No CUDA back-end"):
        mx.eval(_ext.launch_precompiled_cuda("k_0", b"\x7fELF\0\0", [mx.zeros(4)], [[1]], [mx.float32],
                                             (1, 1, 1), (1, 1, 1), 0, None, True, mx.default_stream(mx.cpu)))


@needs_nvrtc
@pytest.mark.parametrize("arch", [None, "sm_90a"])
def test_large_shared_memory_and_launch_arguments_reach_the_binding(cache, monkeypatch, arch,
                                                                   stand_in_gpu):
    # No GPU here: stand in for the device check and record what each binding gets.
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")   # this tests MLX's precompiled binding
    seen = {}
    monkeypatch.setattr(_ext, "launch_cuda", lambda *args: seen.setdefault("cuda", args))
    monkeypatch.setattr(_ext, "launch_precompiled_cuda", lambda *args: seen.setdefault("precompiled", args))
    body = "extern __shared__ float tile[]; tile[threadIdx.x] = x[threadIdx.x]; out[threadIdx.x] = tile[threadIdx.x];"
    kernel = metile.cuda_kernel("big_smem", ["x"], ["out"], body, shared_memory=100 * 1024, arch=arch)
    kernel(inputs=[mx.zeros(256)], output_shapes=[(256,)], output_dtypes=[mx.float32], grid=(256, 1, 1),
           threadgroup=(256, 1, 1), init_value=0.5)
    if arch is None:
        args = seen["cuda"]
        assert args[6] == 100 * 1024 and args[13] == 0.5  # shared_memory, init_value
    else:
        name, cubin, inputs, shapes, dtypes, grid, threadgroup, smem, init, contiguous, stream, \
            scalars = seen["precompiled"]
        assert name.startswith("big_smem_sm_90a_") and cubin[:4] == b"\x7fELF"
        assert (shapes, dtypes, grid, threadgroup, smem, init, contiguous) == \
            ([[256]], [mx.float32], (256, 1, 1), (256, 1, 1), 100 * 1024, 0.5, True)
        assert stream is stand_in_gpu and len(inputs) == 1 and scalars == []


on_cuda = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                             reason="needs MLX's CUDA backend")


@on_cuda
def test_precompiled_axpy_matches_numpy(rng):
    x = rng.standard_normal(1000).astype(np.float16)
    y = rng.standard_normal(1000).astype(np.float16)
    (out,) = _axpy()(inputs=[2.5, mx.array(x), mx.array(y), 1000], output_shapes=[(1000,)],
                     output_dtypes=[mx.float16], grid=(1024, 1, 1), threadgroup=(256, 1, 1))
    np.testing.assert_allclose(np.array(out).astype(np.float32), 2.5 * x.astype(np.float32) + y,
                               rtol=2e-3, atol=2e-3)


@on_cuda
def test_precompiled_wgmma_fence_runs_inside_compile():
    kernel = metile.cuda_kernel("fence", ["x"], ["out"], WGMMA_FENCE.replace("1.0f", "x[threadIdx.x] * 2.0f"),
                                arch="sm_90a")

    @mx.compile
    def f(v):
        return kernel(inputs=[v + 1.0], output_shapes=[(128,)], output_dtypes=[mx.float32],
                      grid=(128, 1, 1), threadgroup=(128, 1, 1))[0]

    np.testing.assert_array_equal(np.array(f(mx.arange(128, dtype=mx.float32))), (np.arange(128) + 1.0) * 2)


@on_cuda
@pytest.mark.parametrize("arch", [None, "sm_90a"])
def test_dynamic_shared_memory_above_48kb(arch):
    # 150 KB of dynamic shared memory: the launch fails unless MLX raised the
    # kernel's limit, which it does only when the byte count reaches it.
    n = 150 * 1024 // 4
    body = f"""
        extern __shared__ float tile[];
        for (int i = threadIdx.x; i < {n}; i += blockDim.x) tile[i] = x[i];
        __syncthreads();
        for (int i = threadIdx.x; i < {n}; i += blockDim.x) out[i] = tile[{n} - 1 - i];
    """
    kernel = metile.cuda_kernel("reverse_smem", ["x"], ["out"], body, shared_memory=n * 4, arch=arch)
    x = mx.arange(n, dtype=mx.float32)
    (out,) = kernel(inputs=[x], output_shapes=[(n,)], output_dtypes=[mx.float32], grid=(256, 1, 1),
                    threadgroup=(256, 1, 1))
    np.testing.assert_array_equal(np.array(out), np.arange(n, dtype=np.float32)[::-1])
