"""CompilationError: what the compiler rejects, pointing at the user's line."""

from __future__ import annotations

import linecache

from ..ir.core import Loc


class CompilationError(Exception):
    """A kernel the compiler rejects.  `str(err)` is `file:line:col: error: ...`
    followed by the offending source line and a caret under the column."""

    def __init__(self, message: str, loc: Loc | None = None):
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
    """A launch that cannot run: wrong arguments for the kernel's signature.
    Raised before anything is compiled or enqueued."""
