"""Backends: printers of thread-form Tile IR.  See README.md for the contract."""

from .msl import emit_msl

__all__ = ["emit_msl"]
