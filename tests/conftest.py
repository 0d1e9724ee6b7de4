import os
import tempfile

import mlx.core as mx
import numpy as np
import pytest

# Compiled kernels are cached on disk; a run shares one cache directory so each
# kernel compiles once (CI sets METILE_CACHE_DIR to keep it between steps).
os.environ.setdefault("METILE_CACHE_DIR", os.path.join(tempfile.gettempdir(), "metile-test-cache"))
# A kernel that never finishes fails its test instead of hanging the run.
os.environ.setdefault("METILE_MSL_TIMEOUT_S", "300")
# Every CPU-runtime launch runs on fenced copies of its buffers: an index before the
# start or past the end of any buffer fails the test, naming the buffer.
os.environ.setdefault("METILE_MSL_BOUNDS_CHECK", "1")
# Every kernel's MSL is also compiled against the strict Metal model
# (runtime/msl_cpu/strict.py): code Metal's compiler would reject fails its
# test here, not later on a Mac.  Checked once per translation unit and cached.
os.environ.setdefault("METILE_MSL_STRICT", "1")


def default_is_cpu() -> bool:
    return mx.default_device().type == mx.cpu


def mlx_compile_failure(*arrays) -> str | None:
    """MLX's message where evaluating `arrays` (MLX's own ops, before metile is involved)
    fails because MLX's JIT cannot compile its kernel here, else None; other errors raise.
    (The H200 image's CUDA 13 headers lack crt/mma.h, which MLX's float32 qmm includes.)"""
    try:
        mx.eval(*arrays)
    except RuntimeError as e:
        if "Failed to compile kernel" not in str(e):
            raise
        return str(e)
    return None


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _no_replays():
    """Each test's first op call of a signature takes the op's full path: a replay
    (metile/op_replay.py) recorded by an earlier test would skip what a test patches."""
    from metile import op_replay
    op_replay.forget()


requires_msl_device = pytest.mark.skipif(
    not (default_is_cpu() or mx.metal.is_available()),
    reason="MSL kernels run on a Metal GPU or the CPU stream; this default device is neither",
)


def _has_clang() -> bool:
    # Looked up by name, not through the runtime's find_compiler, which remembers its
    # answer for the process (tests change METILE_CXX).
    import shutil
    from metile.runtime.msl_cpu.compiler import _CANDIDATES
    return any(shutil.which(c) for c in _CANDIDATES)


requires_clang = pytest.mark.skipif(not _has_clang(), reason="needs clang++ >= 17 (the MSL CPU "
                                                               "runtime's compiler)")


class StandInGpuStream:
    """What a CUDA launch sees as its stream in the stand-in GPU tests (no GPU here)."""

    class device:
        type = mx.gpu


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """A CUDA launch's device checks pass without a GPU: MLX reports CUDA, and every stream
    a CUDA launch resolves (given or default) is StandInGpuStream.  Tests record what the
    binding is handed (patch _ext's launch functions) instead of running it."""
    from metile.runtime import cuda_kernel as cuda_kernel_module

    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_kernel_module, "resolve_stream", lambda stream, op: StandInGpuStream)
    monkeypatch.setattr(mx, "default_stream", lambda device: StandInGpuStream)
    return StandInGpuStream


def np_rope(x, dims, traditional, base, scale, offset, freqs=None):
    """mx.fast.rope in float64 NumPy: x (B, *, T, D), offset an int or B offsets."""
    b, t = x.shape[0], x.shape[-2]
    off = np.broadcast_to(np.asarray(offset, np.float64).reshape(-1), (b,))
    inv = 1.0 / np.asarray(freqs, np.float64) if freqs is not None else \
        base ** (-np.arange(0, dims, 2) / dims)
    pos = off.reshape((b,) + (1,) * (x.ndim - 2)) + np.arange(t).reshape((1,) * (x.ndim - 2) + (t,))
    angle = (pos * scale)[..., None] * inv
    c, s = np.cos(angle), np.sin(angle)
    out = x.copy()
    if traditional:
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2], out[..., 1:dims:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        h = dims // 2
        x1, x2 = x[..., :h], x[..., h:dims]
        out[..., :h], out[..., h:dims] = x1 * c - x2 * s, x1 * s + x2 * c
    return out
