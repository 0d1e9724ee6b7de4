"""The frontend's errors are metile's (`metile.errors`); this older import path
stays valid."""

from ..errors import CompilationError, LaunchError

__all__ = ["CompilationError", "LaunchError"]
