"""Launch another GPU's cubin through metile's own launch primitive and expect a Python
RuntimeError (run under cuda-gdb for a backtrace if the process dies instead)."""
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from metile import _ext  # noqa: E402
from metile.runtime import nvrtc  # noqa: E402

foreign = nvrtc.compile('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }', "sm_100a", "k")
fn = _ext.CudaFunction("k", foreign, 0)
try:
    _ext.launch_cuda_function(fn, [], [[4]], [mx.float32], (1, 1, 1), (1, 1, 1), [], True,
                              mx.default_stream(mx.gpu))
except RuntimeError as e:
    print("refused:", e)
