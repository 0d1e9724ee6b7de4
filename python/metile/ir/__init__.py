"""Tile IR: one set of data structures for the tile form (frontend output) and
the thread form (after `passes.lower_tiles`).  See `ops.py` for the op set."""

from .core import Block, Builder, Function, Loc, Op, Param, Value, walk
from .printer import format_function
from .types import PointerType, ScalarType, TileType
from .verifier import IRVerificationError, verify

__all__ = ["Block", "Builder", "Function", "Loc", "Op", "Param", "Value", "walk",
           "format_function", "PointerType", "ScalarType", "TileType", "IRVerificationError",
           "verify"]
