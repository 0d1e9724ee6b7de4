"""`metile.tensor(...)` views: shaped, strided, access-checked windows on a
buffer.  A view is a compile-time object of the frontend; its loads and stores
become pointer arithmetic plus bounds-masked `load`/`store` ops, so later
stages see ordinary Tile IR."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Block, Op, Value
from ..ir.types import PointerType, ScalarType
from ..errors import CompilationError
from .semantics import Semantics, describe, is_const

ACCESS = ("read", "write", "readwrite")


@dataclass
class TensorView:
    base: Value  # scalar pointer
    shape: tuple
    strides: tuple
    block_shape: tuple | None
    access: str

    @property
    def dtype(self):
        return self.base.type.dtype

    def _address(self, sem: Semantics, position, verb: str):
        if not isinstance(position, tuple):
            position = (position,)
        if len(position) != len(self.shape):
            raise CompilationError(f"{verb}() position has {len(position)} coordinates; "
                                   f"the view has rank {len(self.shape)}")
        offset, mask = 0, True
        for i, (p, extent, stride) in enumerate(zip(position, self.shape, self.strides)):
            if self.block_shape is not None:
                coord = sem.binary("add", p, self._lane_coords(sem, i))
            else:
                coord = p
            offset = sem.binary("add", offset, sem.binary("mul", coord, stride))
            terms = [sem.binary("lt", coord, extent)]
            if not nonnegative(p):
                # a position that may be negative (a launch value, a runtime step) is
                # masked below as above; one the frontend proves >= 0 (program ids, loop
                # counters from 0) keeps the one bound the GEMM lowerings read as the shape
                terms.append(sem.binary("ge", coord, 0))
            for inside in terms:
                if is_const(inside) and not isinstance(inside, Value):
                    if not inside and self.block_shape is None:
                        raise CompilationError(f"{verb}() position {position} is outside the "
                                               f"view's shape {self.shape}")
                    continue
                mask = inside if mask is True else sem.binary("and", mask, inside)
        if is_const(offset):
            offset = sem.const(offset, _int32())
        ptr = sem.binary("add", self.base, offset)
        return ptr, (None if mask is True else mask)

    def _lane_coords(self, sem: Semantics, axis: int):
        """arange over the block along `axis`, shaped to broadcast over the block."""
        extent = self.block_shape[axis]
        v = sem.b.value("arange", [], _tile_i32((extent,)), start=0, end=extent)
        for _ in range(axis):
            v = sem.expand_dims(v, 0)
        for _ in range(len(self.block_shape) - axis - 1):
            v = sem.expand_dims(v, len(v.type.shape))
        return v

    def load(self, sem: Semantics, position):
        if self.access == "write":
            raise CompilationError("load from a write-only tensor view (access='write')")
        ptr, mask = self._address(sem, position, "load")
        return sem.load(ptr, mask=mask)

    def store(self, sem: Semantics, position, value) -> None:
        if self.access == "read":
            raise CompilationError("store to a read-only tensor view (access='read')")
        ptr, mask = self._address(sem, position, "store")
        sem.store(ptr, value, mask=mask)


def make_view(sem: Semantics, buffer, shape, strides, block_shape, access) -> TensorView:
    if not (isinstance(buffer, Value) and isinstance(buffer.type, PointerType)):
        raise CompilationError("tensor() needs a buffer parameter or a shared() allocation")
    if isinstance(shape, (int, Value)):
        shape = (shape,)
    if not isinstance(shape, tuple) or not shape:
        raise CompilationError("tensor() needs shape=(...)")
    _check_extents("shape", shape)
    if strides is not None and not isinstance(strides, (int, Value)):
        _check_extents("strides", strides)
    if strides is None:
        strides, running = [], 1
        for extent in reversed(shape):
            strides.insert(0, running)
            running = sem.binary("mul", running, extent)
        strides = tuple(strides)
    elif isinstance(strides, (int, Value)):
        strides = (strides,)
    if len(strides) != len(shape):
        raise CompilationError(f"tensor() strides {strides} do not match shape rank {len(shape)}")
    if block_shape is not None:
        if isinstance(block_shape, int):
            block_shape = (block_shape,)
        if not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_shape):
            raise CompilationError("tensor() block_shape must be positive constexpr ints")
        if len(block_shape) != len(shape):
            raise CompilationError("tensor() block_shape rank differs from shape rank")
    if access not in ACCESS:
        raise CompilationError(f"tensor() access must be one of {ACCESS}, got {access!r}")
    return TensorView(buffer, tuple(shape), tuple(strides), block_shape, access)


def _check_extents(what: str, values) -> None:
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, Value)) or \
                isinstance(v, Value) and not (isinstance(v.type, ScalarType) and v.type.dtype.is_int):
            raise CompilationError(f"tensor() {what}[{i}] must be an int (constexpr or a runtime "
                                   f"int scalar), got {describe(v)}")


def _int32():
    from ..language.dtypes import int32
    return int32


def _tile_i32(shape):
    from ..ir.types import ScalarType, TileType
    return TileType(shape, ScalarType(_int32()))


_NONNEGATIVE_OPS = ("add", "mul", "minimum", "idiv", "shr")   # of non-negative operands


def nonnegative(v, depth: int = 0) -> bool:
    """Whether a scalar int position is provably >= 0 (as int32 arithmetic that does not
    wrap): a non-negative constant, a program id or count, an unsigned value, a loop
    counter the frontend marked, or +, *, //, >>, min, max of such values, or max with one.
    False where nothing says so."""
    if isinstance(v, bool) or depth > 16:
        return False
    if isinstance(v, int):
        return v >= 0
    if not isinstance(v, Value) or not isinstance(v.type, ScalarType):
        return False
    if v.type.dtype.is_int and v.type.dtype.kind == "u":
        return True
    owner = v.owner
    if isinstance(owner, Block):
        return v.id in owner.nonnegative
    if not isinstance(owner, Op):
        return False
    if owner.name == "const":
        return owner.attrs["value"] >= 0
    if owner.name in ("program_id", "num_programs"):
        return True
    if owner.name == "maximum":
        return any(nonnegative(o, depth + 1) for o in owner.operands)
    if owner.name in _NONNEGATIVE_OPS:
        return all(nonnegative(o, depth + 1) for o in owner.operands)
    return False

