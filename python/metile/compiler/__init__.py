"""The compiler driver: which backend a kernel compiles for, the ordered
pipeline of steps from a Python function to MSL or CUDA source, and the typed
results the runtime launches.

  backend.py    Backend (language, target hardware, emitter, matrix units,
                launcher) and resolve_backend, the one place that looks at
                MLX's device or METILE_BACKEND
  pipeline.py   analyze (frontend -> verify -> uniformity -> buffer_usage ->
                plan_schedule) and generate (lowering -> verify -> emit), each
                recording the steps that ran; Analysis and CompiledKernel
  planning.py   kernel traits from Tile IR, the schedule plan for a target, and
                the execution report rebuilt from the thread-form IR

The runtime (binding, caches, launches, autotuning, autodiff) calls these; it
does not contain them.
"""

from .backend import LANGUAGES, Backend, resolve_backend
from .pipeline import Analysis, CompiledKernel, Request

__all__ = ["Backend", "resolve_backend", "LANGUAGES", "Analysis", "CompiledKernel", "Request"]
