"""Which backends run device_print and device_assert, decided from the Backend record.

The CPU runtime (MSL run on the CPU) and CUDA run both.  A Metal GPU runs neither:
Metal Shading Language compute kernels have no printf and no way to stop a launch.
A device_print compiled for a Metal GPU is a compile error (its output would vanish);
a debug build's device_assert warns, once per specialization and process, that it is not
checked there (the emitted MSL keeps the check under a macro only the CPU runtime
defines, codegen/debug_ops.py).
"""

from __future__ import annotations

import warnings

from ..errors import CompilationError
from ..ir.core import Function, walk
from ..ir.ops import DEBUG
from .backend import Backend


def runs_on_metal_gpu(backend: Backend) -> bool:
    return backend.language == "msl" and backend.device.split(":")[0] == "metal"


def check_debug_support(fn: Function, backend: Backend) -> str | None:
    """A CompilationError for a device_print on a Metal GPU; else what the analysis records
    about the kernel's device_asserts (None without any)."""
    ops = [op for op in walk(fn.body) if op.name in DEBUG]
    printing = next((op for op in ops if op.name == "device_print"), None)
    if printing is not None and runs_on_metal_gpu(backend):
        raise CompilationError(
            "metile.device_print is not supported on a Metal GPU (MSL compute kernels cannot "
            "print): run the kernel on the CPU (mx.set_default_device(mx.cpu)), where metile's "
            "MSL CPU runtime prints, or on CUDA", printing.loc)
    lines = sorted({op.loc.line for op in ops if op.name == "device_assert" and op.loc})
    asserts = sum(op.name == "device_assert" for op in ops)
    if not asserts:
        return None
    return f"{asserts} device_assert check(s)" + (
        f" (line {', '.join(map(str, lines))})" if lines else "")


def warn_unchecked_asserts(name: str, details: dict, backend: Backend) -> None:
    """A debug build's device_asserts (the analysis' `device_assert` detail) compiled for
    a Metal GPU, where nothing checks them."""
    what = details.get("device_assert")
    if what and runs_on_metal_gpu(backend):
        warnings.warn(f"kernel {name!r}: {what} not checked on a Metal GPU (MSL compute "
                      f"kernels cannot stop a launch); the CPU runtime and CUDA check them",
                      stacklevel=2)
