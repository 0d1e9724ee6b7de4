"""metile: a tile-kernel language for MLX.

Kernels written in Python (`@metile.kernel`) or as MSL (`metile.metal_kernel`)
run as lazy nodes of the MLX graph: on Metal GPUs, on NVIDIA GPUs through
MLX's CUDA backend, and on the CPU through metile's MSL CPU runtime.
"""

import mlx.core  # noqa: F401  (the extension shares MLX's nanobind types; load MLX first)

from .runtime.cuda_kernel import CudaKernel, cuda_kernel
from .runtime.metal_kernel import MetalKernel, metal_kernel
from .runtime.msl_cpu.compiler import MslCompileError
from .schedule import Config, ExecutionReport, Schedule, ScheduleError, SchedulePlan

from .version import __version__  # noqa: E402

__all__ = ["metal_kernel", "MetalKernel", "cuda_kernel", "CudaKernel", "MslCompileError", "Schedule",
           "Config", "ScheduleError", "SchedulePlan", "ExecutionReport", "autotune", "heuristics", "SettingError"]

from .dsl import *  # noqa: E402,F401,F403  (the kernel language: kernel, load, store, dot, ...)
from .dsl import __all__ as _dsl_all  # noqa: E402
from .runtime.autotuner import autotune  # noqa: E402
from .runtime.heuristics import heuristics  # noqa: E402
from . import nn, ops  # noqa: E402  (metile.nn.Linear, metile.ops.linear after `import metile`)
from .settings import SettingError  # noqa: E402

__all__ += list(_dsl_all)
