"""metile's own launch primitive for the cubins it compiles (csrc/cuda_launch.cpp,
METILE_CUDA_LAUNCH): the choice of path on any machine, and on a CUDA GPU the results of
both paths against each other and NumPy, inputs that are not row-contiguous, mx.compile,
the library GEMM, and a broken image refused with a message."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import _ext
from metile.runtime import cuda_kernel as cuda_kernel_module
from metile.runtime import nvrtc
from metile.settings import SettingError, cuda_launch


def _no_nvrtc() -> bool:
    try:
        nvrtc.find_toolkit()
    except Exception:
        return True
    return False


OWN = getattr(_ext, "has_cuda_launch", False)
on_cuda = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                             reason="needs MLX's CUDA backend")
needs_own = pytest.mark.skipif(not OWN, reason="metile's C++ layer was built without MLX's CUDA "
                                               "backend (no CUDA launch primitive)")

SCALE = """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + 1.0f;
"""


def _scale(name="scale_own"):
    return metile.cuda_kernel(name, ["x", "a", "n"], ["out"], SCALE, arch="sm_90a",
                              value_inputs=("a", "n"))


def _run(kernel, x, a=2.0):
    n = x.size
    (out,) = kernel(inputs=[x, a, n], output_shapes=[(n,)], output_dtypes=[mx.float32],
                    grid=(256 * ((n + 255) // 256), 1, 1), threadgroup=(256, 1, 1), scalars=[a, n])
    return out


def test_the_setting_is_checked(monkeypatch):
    assert cuda_launch() == "metile"
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")
    assert cuda_launch() == "mlx"
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "own")
    with pytest.raises(SettingError, match="METILE_CUDA_LAUNCH='own'.*metile.*mlx"):
        cuda_launch()


@pytest.mark.skipif(_no_nvrtc(), reason="no NVRTC to compile the cubin")
def test_without_the_primitive_mlx_launches_the_cubin(monkeypatch, stand_in_gpu):
    # a build without MLX's CUDA backend (CI) keeps MLX's precompiled_cuda_kernel path,
    # whatever the setting says
    monkeypatch.setattr(cuda_kernel_module, "_OWN_LAUNCH", False)
    seen = []
    monkeypatch.setattr(_ext, "launch_precompiled_cuda", lambda *args: seen.append(args) or [mx.zeros(4)])
    _run(_scale("scale_fallback"), mx.zeros(4))
    (name, cubin, arrays, shapes, dtypes, grid, block, smem, init, contiguous, _, scalars), = seen
    assert cubin[:4] == b"\x7fELF" and scalars == [2.0, 4] and len(arrays) == 1 and contiguous


@on_cuda
@needs_own
def test_both_paths_match_numpy(monkeypatch, rng):
    x = rng.standard_normal(1000).astype(np.float32)
    kernel = _scale()
    own = np.array(_run(kernel, mx.array(x)))
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")
    theirs = np.array(_run(kernel, mx.array(x)))
    np.testing.assert_array_equal(own, theirs)
    np.testing.assert_allclose(own, 2.0 * x + 1.0, rtol=1e-6)


@on_cuda
@needs_own
def test_inputs_that_are_not_row_contiguous_are_copied(rng):
    base = rng.standard_normal((40, 30)).astype(np.float32)
    kernel = _scale("scale_views")
    for view, want in ((mx.array(base).T, base.T), (mx.array(base)[:, ::3], base[:, ::3]),
                       (mx.broadcast_to(mx.array(base[:1]), (40, 30)), np.broadcast_to(base[:1], (40, 30)))):
        got = _run(kernel, view.reshape(-1) if view.ndim == 1 else view)
        np.testing.assert_allclose(np.array(got).reshape(want.shape), 2.0 * want + 1.0, rtol=1e-6)


@on_cuda
@needs_own
def test_inside_compile_with_lazy_inputs(rng):
    x = rng.standard_normal(777).astype(np.float32)
    kernel = _scale("scale_compiled")
    f = mx.compile(lambda v: _run(kernel, (v * 3.0).T, 0.5) + 1.0)
    for _ in range(3):
        np.testing.assert_allclose(np.array(f(mx.array(x))), 0.5 * 3.0 * x + 2.0, rtol=1e-5)


@on_cuda
@needs_own
def test_library_gemm_is_the_same_on_both_paths(monkeypatch, rng):
    a = mx.array(rng.standard_normal((300, 200)).astype(np.float16))
    b = mx.array(rng.standard_normal((200, 170)).astype(np.float16))
    own = np.array(metile.ops.matmul(a, b, backend="metile"))
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")
    theirs = np.array(metile.ops.matmul(a, b, backend="metile"))
    np.testing.assert_array_equal(own, theirs)
    want = np.array(a.astype(mx.float32)).astype(np.float64) @ np.array(b.astype(mx.float32))
    np.testing.assert_allclose(own.astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(_no_nvrtc(), reason="no NVRTC to compile a cubin")
def test_cubin_headers_are_checked_before_the_driver_reads_them():
    # the driver's loader crashed the process on a truncated cubin (H200): the C++ layer
    # checks the ELF header's tables lie inside the image first, on every build
    image = nvrtc.compile('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }', "sm_90a", "k")
    _ext.check_cubin("k", image)
    for bad, why in ((image[:200], "outside the image"), (b"PTX" + image[3:], "no ELF header"),
                     (image[:4] + b"\x01" + image[5:], "not a 64-bit ELF file"), (b"", "no ELF header")):
        with pytest.raises(ValueError, match=f"kernel 'k' is not a loadable 64-bit cubin: .*{why}"):
            _ext.check_cubin("k", bad)


@on_cuda
@needs_own
def test_a_broken_or_foreign_image_is_refused_with_the_kernels_name():
    image = nvrtc.compile('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }', "sm_90a", "k")
    with pytest.raises(ValueError, match="kernel 'k' is not a loadable 64-bit cubin"):
        _ext.CudaFunction("k", image[:300], 0)
    foreign = nvrtc.compile('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }', "sm_100a", "k")
    fn = _ext.CudaFunction("k", foreign, 0)
    # refused when the launch is built (the module is loaded then), not inside mx.eval
    with pytest.raises(RuntimeError, match="cuModuleLoadData for kernel 'k' failed"):
        _ext.launch_cuda_function(fn, [], [[4]], [mx.float32], (1, 1, 1), (1, 1, 1),
                                  [], True, mx.default_stream(mx.gpu))
    with pytest.raises(ValueError, match="grid and threadgroup sizes must be positive"):
        _ext.launch_cuda_function(fn, [], [[4]], [mx.float32], (0, 1, 1), (4, 1, 1),
                                  [], True, mx.default_stream(mx.gpu))


@pytest.mark.skipif(_no_nvrtc(), reason="no NVRTC to compile the cubin")
def test_relaunches_go_straight_to_the_binding(monkeypatch, stand_in_gpu):
    # the first launch of a Dispatch goes through CudaKernel's checks and binds; later
    # launches of the same signature call the binding with the new arrays only; a changed
    # METILE_CUDA_LAUNCH is part of the launch key, so it gets a new Dispatch
    from metile_kernels.gemm import grid, matmul_epilogue

    monkeypatch.setattr(cuda_kernel_module, "_OWN_LAUNCH", True)
    seen, prepared = [], []

    class Function:
        def __init__(self, name, image, shared_memory):
            self.name = name

    def own(fn, inputs, shapes, dtypes, grid_, block, scalars, contiguous, stream, no_vjp=""):
        seen.append(("own", fn, inputs, scalars))
        return [mx.zeros(tuple(s), d) for s, d in zip(shapes, dtypes)]

    class Bound:   # _ext.CudaLaunch: launch_cuda_function with its fixed arguments bound
        def __init__(self, fn, kept, shapes, dtypes, grid_, block, scalars, contiguous, no_vjp):
            self.call = lambda arrays, stream: own(fn, [arrays[i] for i in kept], shapes, dtypes,
                                                   grid_, block, scalars, contiguous, stream, no_vjp)

        def __call__(self, arrays, stream=None):
            return self.call(arrays, stream)

    def theirs(name, cubin, inputs, shapes, dtypes, *rest):
        seen.append(("mlx", name, inputs, rest[-2]))   # (scalars, the Dispatch's no_vjp)
        return [mx.zeros(tuple(s), d) for s, d in zip(shapes, dtypes)]

    real_prepare = cuda_kernel_module.CudaKernel.prepare_call
    monkeypatch.setattr(cuda_kernel_module.CudaKernel, "prepare_call",
                        lambda self, *a: prepared.append(1) or real_prepare(self, *a))
    monkeypatch.setattr(_ext, "CudaFunction", Function, raising=False)
    monkeypatch.setattr(_ext, "launch_cuda_function", own, raising=False)
    monkeypatch.setattr(_ext, "CudaLaunch", Bound, raising=False)
    monkeypatch.setattr(_ext, "launch_precompiled_cuda", theirs)
    from metile.compiler import backend as backend_module
    monkeypatch.setattr(backend_module, "_device_target",   # as on an H200
                        lambda: ("cuda", backend_module.target_for("cuda", "sm_90"), "Device(gpu, 0)"))
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    from metile.runtime import tensor_maps   # no driver here to encode the maps
    monkeypatch.setattr(tensor_maps, "templates",
                        lambda maps, encoded=True: mx.zeros((128 * len(maps),), mx.uint8))
    m, n, k = 130, 70, 90

    def launch(a, b):
        return matmul_epilogue[grid(m, n, 128, 128)](
            a, b, mx.zeros((m, n), mx.float16), m, n, k, 2.0, 0.5, EPILOGUE="affine",
            NEGATIVE_SLOPE=0.0, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_simdgroups=8)

    arrays = [(mx.full((m, k), float(i), mx.float16), mx.full((k, n), 1.0, mx.float16))
              for i in range(4)]
    for a, b in arrays[:3]:
        assert launch(a, b).shape == (m, n)
    assert len(prepared) == 1            # the first launch's bind (its checks, once)
    assert [s[0] for s in seen] == ["own"] * 3 and seen[0][1] is seen[2][1]
    # the arrays of the third launch (straight from the arguments: the same objects)
    assert seen[2][2][0] is arrays[2][0] and np.array(seen[2][2][0])[0, 0] == 2.0
    assert seen[2][3][:5] == [m, n, k, 2.0, 0.5]
    monkeypatch.setenv("METILE_CUDA_LAUNCH", "mlx")
    launch(*arrays[3])
    assert seen[-1][0] == "mlx" and np.array(seen[-1][2][0])[0, 0] == 3.0


def test_raw_values_follow_the_environment(monkeypatch):
    from metile.settings import raw_values
    monkeypatch.delenv("METILE_TEST_RAW", raising=False)
    assert raw_values(("METILE_TEST_RAW",)) == (None,)
    monkeypatch.setenv("METILE_TEST_RAW", "a")
    first = raw_values(("METILE_TEST_RAW",))
    monkeypatch.setenv("METILE_TEST_RAW", "b")
    assert raw_values(("METILE_TEST_RAW",)) != first and first[0] in ("a", b"a")


def test_a_launch_is_not_reused_on_another_default_device(monkeypatch):
    # the backend a launch was resolved for follows the default device (MSL for the CPU
    # runtime, CUDA on an NVIDIA GPU): the launch key holds the device's type
    from metile.runtime.dispatch import launch_environment

    here = launch_environment()
    other = mx.cpu if here[-1] == mx.gpu else mx.gpu   # whichever device this is not

    class Other:
        type = other
    monkeypatch.setattr(mx, "default_device", lambda: Other)
    assert launch_environment() != here and launch_environment()[-1] == other
