"""Types of Tile IR values.

A value is a scalar (one number per thread; uniform across the program unless
derived from thread_id), a pointer into a named root buffer, or a tile: a
shaped block of scalars or pointers distributed over the program's threads.
Pointers carry the name of the buffer they point into (`root`): metile keeps
pointer arithmetic as integer offsets from a statically known root, which is
what makes per-buffer facts (read/written, bounds, aliasing) decidable.  The
offset is int32 unless an int64 offset was added (`index`): then it is 64-bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..language.dtypes import DType, int32


@dataclass(frozen=True)
class ScalarType:
    dtype: DType

    def __str__(self) -> str:
        return self.dtype.name


@dataclass(frozen=True)
class PointerType:
    dtype: DType
    space: str  # "device" | "threadgroup"
    root: str   # kernel parameter or shared allocation it points into
    index: DType = int32  # the offset's integer type: int32, or int64 once an int64 was added

    def __str__(self) -> str:
        wide = "" if self.index == int32 else f", {self.index.name} offset"
        return f"ptr<{self.dtype.name}, {self.space}, @{self.root}{wide}>"


@dataclass(frozen=True)
class TileType:
    shape: tuple[int, ...]
    elem: ScalarType | PointerType

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def __str__(self) -> str:
        return f"tile<{'x'.join(map(str, self.shape))}, {self.elem}>"


Type = ScalarType | PointerType | TileType


def elem_type(t: Type) -> ScalarType | PointerType:
    return t.elem if isinstance(t, TileType) else t


def shape_of(t: Type) -> tuple[int, ...]:
    return t.shape if isinstance(t, TileType) else ()


def with_shape(elem: ScalarType | PointerType, shape: tuple[int, ...]) -> Type:
    return TileType(tuple(shape), elem) if shape else elem


def dtype_of(t: Type) -> DType | None:
    e = elem_type(t)
    return e.dtype if isinstance(e, ScalarType) else None


def is_pointer(t: Type) -> bool:
    return isinstance(elem_type(t), PointerType)


def is_tile(t: Type) -> bool:
    return isinstance(t, TileType)
