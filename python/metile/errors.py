"""The errors every layer of metile raises, defined in one place.

CompilationError  the compiler rejects a kernel; points at the user's line
LaunchError       a launch cannot run with these arguments (raised at the call,
                  before anything is enqueued; a gradient a launch cannot give
                  raises it when evaluated)
ScheduleError     a Schedule requirement cannot be honoured for this kernel
                  and target (the compiler re-raises it as a CompilationError
                  at the kernel's definition)

This module imports nothing of metile's, so every layer, the IR included, can
raise these.  A location (`loc`) is anything with file, line and col.
"""

from __future__ import annotations

import linecache


class CompilationError(Exception):
    """A kernel the compiler rejects.  `str(err)` is `file:line:col: error: ...`
    followed by the offending source line and a caret under the column."""

    def __init__(self, message: str, loc=None):
        super().__init__(message)
        self.message = message
        self.loc = loc

    @property
    def lineno(self) -> int | None:
        return self.loc.line if self.loc else None

    def __str__(self) -> str:
        if self.loc is None:
            return f"error: {self.message}"
        loc = self.loc
        text = linecache.getline(loc.file, loc.line).rstrip("\n")
        head = f"{loc.file}:{loc.line}:{loc.col + 1}: error: {self.message}"
        if not text:
            return head
        return f"{head}\n    {text}\n    {' ' * loc.col}^"


class LaunchError(ValueError):
    """A launch that cannot run: arguments that do not fit the kernel's signature
    (ArgumentError), a grid that cannot be resolved (GridError), a bound or grid that
    reaches past an array, a kernel compiled for a backend the default device cannot run.
    Raised at the call, before anything is enqueued - signature errors before anything is
    compiled, the checks that need the compiled kernel's analysis after its compile; a
    gradient that a launch (or an op) cannot give is an array whose evaluation raises it."""


class ArgumentError(LaunchError, TypeError):
    """A launch's arguments do not fit the kernel's signature (an unexpected, repeated or
    missing argument, too many): the caller's mistake, never a candidate autotune may skip.
    A TypeError too, as Python raises for a call that does not fit a function's signature."""


class GridError(LaunchError):
    """A grid that cannot be resolved (not 1 to 3 non-negative ints, or its callable
    raised): the caller's mistake, never a candidate autotune may skip."""


class AxisError(ValueError, IndexError):
    """An axis out of range for an op's input: an IndexError as MLX's ops raise it (code
    written against `mx.softmax` catches that) and a ValueError, as NumPy's AxisError is."""


class ScheduleError(ValueError):
    """A schedule requirement the compiler cannot honour for this kernel and target.
    `requirement` names the control (e.g. "vector_width=4"), `reason` says why."""

    def __init__(self, requirement: str, reason: str):
        super().__init__(f"cannot honour {requirement}: {reason}")
        self.requirement = requirement
        self.reason = reason
