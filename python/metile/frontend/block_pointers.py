"""Triton's block pointers and tensor descriptors, as compile-time objects of the frontend.

`make_block_ptr(base, shape, strides, offsets, block_shape, order)` describes a
`block_shape` window at `offsets` in a strided `shape`-d tensor; `advance(p, deltas)`
moves the window; `load(p, boundary_check=, padding_option=)` and
`store(p, value, boundary_check=)` read and write it.  `make_tensor_descriptor(base,
shape, strides, block_shape)` gives `desc.load(offsets)` / `desc.store(offsets, value)`.

Like `metile.tensor(...)` views (frontend/views.py) these are not IR values: an access
becomes pointer arithmetic plus a masked `load`/`store`, element (i, j, ...) of the
block at `base + sum((offset_d + lane_d) * stride_d)`, so later stages (the GEMM
lowering included) see ordinary Tile IR.  Bounds follow Triton: a block pointer checks
`0 <= coordinate < shape` on the dimensions listed in `boundary_check` only (the others
are unchecked, as in Triton); a tensor descriptor checks every dimension (TMA's
zero-fill of out-of-bounds reads and dropped out-of-bounds writes).  No TMA here: the
CUDA backend stages these loads like any other.

A block pointer reassigned in a loop (`p = advance(p, (0, BK))`) carries its offsets:
`loop_parts` / `with_parts` are the protocol frontend/control.py uses to carry
composite values as several scalars.  In a GEMM-shaped loop passes/pointer_recurrence
then puts each carried offset in closed form (`offset0 + trip * delta`), so the loop
carries only the accumulator and gets the GEMM lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import CompilationError
from ..ir.core import Value
from ..ir.types import PointerType, ScalarType, TileType, shape_of
from ..language import dtypes as dt
from .builtins import builtin, need_constexpr
from .semantics import Semantics, describe, is_const

PADDING = ("", "zero", "nan")


@dataclass(frozen=True)
class BlockPointer:
    base: Value          # scalar device (or shared) pointer
    shape: tuple         # int or runtime int scalar per dimension
    strides: tuple
    offsets: tuple       # int or runtime int32 scalar per dimension
    block_shape: tuple   # constexpr ints
    order: tuple         # a layout hint (Triton's): accepted, checked, not needed here

    @property
    def dtype(self) -> dt.DType:
        return self.base.type.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"block pointer (block {self.block_shape} of a {self.rank}-d {self.dtype} tensor)"

    # -- carried through loops and ifs (frontend/control.py) ------------------------------
    def loop_parts(self) -> tuple:
        return self.offsets

    def loop_part_names(self, name: str) -> list[str]:
        return [f"{name}.offsets[{i}]" for i in range(self.rank)]

    def with_parts(self, parts) -> "BlockPointer":
        return replace(self, offsets=tuple(parts))

    def layout_differs(self, other) -> str | None:
        """Why `other` cannot share this pointer's loop slots (None when it can): a loop
        or an if may change a block pointer's offsets, nothing else."""
        if not isinstance(other, BlockPointer):
            return f"becomes {describe(other)}"
        for field in ("base", "shape", "strides", "block_shape"):
            mine, theirs = getattr(self, field), getattr(other, field)
            if not _same(mine, theirs):
                return (f"gets another {field.replace('_', ' ')}; only its offsets may change "
                        f"(metile.advance)")
        return None

    # -- metile.load / metile.store (frontend/builtins.py) -----------------------------------
    def load_block(self, gen, mask, other, boundary_check, padding_option):
        return _load_block(gen, self, mask, other, boundary_check, padding_option)

    def store_block(self, gen, value, mask, boundary_check):
        _store_block(gen, self, value, mask, boundary_check)

    # -- frontend attribute access -----------------------------------------------------------
    def attribute(self, name: str):
        raise CompilationError(f"block pointers have no attribute {name!r}; use "
                               f"metile.load / metile.store / metile.advance")


@dataclass(frozen=True)
class TensorDescriptor:
    base: Value
    shape: tuple
    strides: tuple
    block_shape: tuple
    padding_option: str  # what out-of-bounds elements read: "zero" or "nan"

    @property
    def dtype(self) -> dt.DType:
        return self.base.type.dtype

    def __repr__(self) -> str:
        return (f"tensor descriptor (block {self.block_shape} of a {len(self.shape)}-d "
                f"{self.dtype} tensor)")

    def load(self, gen, offsets):
        offsets = _offsets(gen.sem, offsets, len(self.shape), "tensor descriptor load()")
        ptr, mask = _address(gen.sem, self.base, self.shape, self.strides, offsets,
                             self.block_shape, range(len(self.shape)))
        return gen.sem.load(ptr, mask=mask, other=_padding(self.padding_option, mask))

    def store(self, gen, offsets, value):
        offsets = _offsets(gen.sem, offsets, len(self.shape), "tensor descriptor store()")
        value = _block_value(gen.sem, value, self.block_shape, "tensor descriptor store()")
        ptr, mask = _address(gen.sem, self.base, self.shape, self.strides, offsets,
                             self.block_shape, range(len(self.shape)))
        gen.sem.store(ptr, value, mask=mask)

    def attribute(self, name: str):
        if name == "load":
            return lambda gen, args, kwargs: _call(self.load, gen, args, kwargs, "load",
                                                   ("offsets",))
        if name == "store":
            return lambda gen, args, kwargs: _call(self.store, gen, args, kwargs, "store",
                                                   ("offsets", "value"))
        if name in ("shape", "strides", "block_shape", "dtype"):
            return getattr(self, name)
        raise CompilationError(f"tensor descriptors have no attribute {name!r} here (load, "
                               f"store, shape, strides, block_shape and dtype)")


def _call(method, gen, args, kwargs, name, params):
    """Bind a descriptor method's arguments by Triton's parameter names."""
    if len(args) > len(params) or set(kwargs) - set(params[len(args):]):
        raise CompilationError(f"tensor descriptor {name}() takes ({', '.join(params)}), got "
                               f"{len(args)} positional and {sorted(kwargs)} keyword arguments")
    bound = dict(zip(params, args), **kwargs)
    missing = [p for p in params if p not in bound]
    if missing:
        raise CompilationError(f"tensor descriptor {name}() is missing {', '.join(missing)}")
    return method(gen, *(bound[p] for p in params))


def _same(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Value) or isinstance(b, Value):
        return a is b
    return type(a) is type(b) and a == b


# -- checks ----------------------------------------------------------------------------------

def _base(base, what: str) -> Value:
    if not (isinstance(base, Value) and isinstance(base.type, PointerType)):
        raise CompilationError(f"{what} base must be a buffer parameter (a scalar pointer), got "
                               f"{describe(base)}")
    return base


def _ints(values, what: str, rank: int | None = None) -> tuple:
    if isinstance(values, (int, Value)) and not isinstance(values, bool):
        values = (values,)
    if not isinstance(values, tuple) or not values:
        raise CompilationError(f"{what} must be a tuple of ints, got {describe(values)}")
    if rank is not None and len(values) != rank:
        raise CompilationError(f"{what} has {len(values)} entries; the tensor has rank {rank}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, Value)) or isinstance(v, Value) and \
                not (isinstance(v.type, ScalarType) and v.type.dtype.is_int):
            raise CompilationError(f"{what}[{i}] must be an int (constexpr or a runtime int "
                                   f"scalar), got {describe(v)}")
    return values


def _block_shape(block_shape, what: str, rank: int) -> tuple:
    if isinstance(block_shape, int):
        block_shape = (block_shape,)
    if not isinstance(block_shape, tuple) or len(block_shape) != rank:
        raise CompilationError(f"{what} block_shape must be a tuple of {rank} constexpr ints "
                               f"(one per dimension), got {describe(block_shape)}")
    for i, b in enumerate(block_shape):
        need_constexpr(b, f"{what} block_shape[{i}]")
        if b <= 0:
            raise CompilationError(f"{what} block_shape[{i}] must be positive, got {b}")
    return block_shape


def _offsets(sem: Semantics, offsets, rank: int, what: str) -> tuple:
    if isinstance(offsets, list):
        offsets = tuple(offsets)
    offsets = _ints(offsets, f"{what} offsets")
    if len(offsets) != rank:
        raise CompilationError(f"{what} offsets has {len(offsets)} entries; the block has "
                               f"rank {rank}")
    return offsets


def _block_value(sem: Semantics, value, block_shape: tuple, what: str):
    """Triton stores a scalar to every element of the block, a tile of the block's shape
    element by element, and refuses any other shape."""
    if isinstance(value, Value) and isinstance(value.type, TileType):
        if shape_of(value.type) != tuple(block_shape):
            raise CompilationError(f"{what} value of shape {shape_of(value.type)} does not match "
                                   f"the block shape {tuple(block_shape)}")
        return value
    if is_const(value):
        return value  # sem.store broadcasts and converts it
    if isinstance(value, Value):
        return sem.broadcast_to(value, tuple(block_shape))
    raise CompilationError(f"{what} needs a value to store, got {describe(value)}")


# -- addresses -------------------------------------------------------------------------------

def _lanes(sem: Semantics, block_shape: tuple, axis: int) -> Value:
    """arange over the block along `axis`, shaped to broadcast over the block."""
    extent = block_shape[axis]
    v = sem.b.value("arange", [], TileType((extent,), ScalarType(dt.int32)), start=0, end=extent)
    for _ in range(axis):
        v = sem.expand_dims(v, 0)
    for _ in range(len(block_shape) - axis - 1):
        v = sem.expand_dims(v, len(v.type.shape))
    return v


def _address(sem: Semantics, base, shape, strides, offsets, block_shape, checked):
    """(pointer tile, mask or None) of the block at `offsets`; the mask holds
    0 <= coordinate < extent on the `checked` dimensions (the lower bound is dropped for a
    compile-time offset >= 0)."""
    offset, mask = 0, None
    for i, (start, extent, stride) in enumerate(zip(offsets, shape, strides)):
        coord = sem.binary("add", start, _lanes(sem, block_shape, i))
        offset = sem.binary("add", offset, sem.binary("mul", coord, stride))
        if i not in checked:
            continue
        conds = [] if is_const(start) and start >= 0 else [sem.binary("ge", coord, 0)]
        conds.append(sem.binary("lt", coord, extent))
        for c in conds:
            mask = c if mask is None else sem.binary("and", mask, c)
    return sem.binary("add", base, offset), mask


# -- builtins --------------------------------------------------------------------------------

@builtin("base, shape, strides, offsets, block_shape, order")
def make_block_ptr(gen, base, shape, strides, offsets, block_shape, order):
    what = "make_block_ptr()"
    base = _base(base, what)
    shape = _ints(shape, f"{what} shape")
    rank = len(shape)
    strides = _ints(strides, f"{what} strides", rank)
    offsets = _offsets(gen.sem, offsets, rank, what)
    block_shape = _block_shape(block_shape, what, rank)
    if isinstance(order, int):
        order = (order,)
    if not isinstance(order, tuple) or sorted(o if isinstance(o, int) else -1 for o in order) \
            != list(range(rank)):
        raise CompilationError(f"{what} order must be a permutation of 0..{rank - 1} (the "
                               f"dimensions from fastest- to slowest-varying), got "
                               f"{describe(order)}")
    return BlockPointer(base, shape, strides, offsets, block_shape, order)


@builtin("base, offsets")
def advance(gen, base, offsets):
    if not isinstance(base, BlockPointer):
        raise CompilationError(f"advance() needs a block pointer (from metile.make_block_ptr), "
                               f"got {describe(base)}")
    deltas = _offsets(gen.sem, offsets, base.rank, "advance()")
    # A zero step keeps the offset itself: a loop then yields it unchanged (invariant).
    moved = tuple(o if is_const(d) and d == 0 else gen.sem.binary("add", o, d)
                  for o, d in zip(base.offsets, deltas))
    return base.with_parts(moved)


@builtin("base, shape, strides, block_shape, padding_option='zero'")
def make_tensor_descriptor(gen, base, shape, strides, block_shape, padding_option):
    what = "make_tensor_descriptor()"
    base = _base(base, what)
    shape = _ints(shape, f"{what} shape")
    strides = _ints(strides, f"{what} strides", len(shape))
    block_shape = _block_shape(block_shape, what, len(shape))
    _check_padding(padding_option, ("zero", "nan"), base.type.dtype, what)
    return TensorDescriptor(base, shape, strides, block_shape, padding_option)


@builtin("desc, offsets")
def load_tensor_descriptor(gen, desc, offsets):
    return _descriptor(desc, "load_tensor_descriptor()").load(gen, offsets)


@builtin("desc, offsets, value")
def store_tensor_descriptor(gen, desc, offsets, value):
    return _descriptor(desc, "store_tensor_descriptor()").store(gen, offsets, value)


def _descriptor(desc, what: str) -> TensorDescriptor:
    if not isinstance(desc, TensorDescriptor):
        raise CompilationError(f"{what} needs a tensor descriptor (from "
                               f"metile.make_tensor_descriptor), got {describe(desc)}")
    return desc


# -- metile.load / metile.store of a block pointer --------------------------------------------

def _checked_dims(p: BlockPointer, boundary_check, what: str) -> set:
    if boundary_check is None:
        return set()
    if isinstance(boundary_check, int) and not isinstance(boundary_check, bool):
        boundary_check = (boundary_check,)
    if isinstance(boundary_check, list):
        boundary_check = tuple(boundary_check)
    if not isinstance(boundary_check, tuple):
        raise CompilationError(f"{what} boundary_check must be a tuple of dimensions, got "
                               f"{describe(boundary_check)}")
    for d in boundary_check:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < p.rank:
            raise CompilationError(f"{what} boundary_check dimension {d!r} is out of range for "
                                   f"a block pointer of rank {p.rank} (0..{p.rank - 1})")
    return set(boundary_check)


def _load_block(gen, p: BlockPointer, mask, other, boundary_check, padding_option):
    what = "load() of a block pointer"
    if mask is not None or other is not None:
        raise CompilationError(f"{what} takes no mask= or other=: bounds are boundary_check=, "
                               f"out-of-bounds values padding_option=")
    checked = _checked_dims(p, boundary_check, what)
    _check_padding(padding_option, PADDING, p.dtype, what)
    ptr, mask = _address(gen.sem, p.base, p.shape, p.strides, p.offsets, p.block_shape, checked)
    return gen.sem.load(ptr, mask=mask, other=_padding(padding_option, mask))


def _check_padding(option, allowed, dtype: dt.DType, what: str) -> None:
    if option not in allowed:
        raise CompilationError(f"{what}: padding_option must be one of {allowed}, got {option!r}")
    if option == "nan" and not dtype.is_float:
        raise CompilationError(f"{what}: padding_option='nan' needs a float tensor, got {dtype}")


def _padding(option: str, mask):
    """`other` of the masked load.  Triton leaves padding "" undefined; zero is what a
    masked load reads here."""
    return float("nan") if option == "nan" and mask is not None else None


def _store_block(gen, p: BlockPointer, value, mask, boundary_check):
    what = "store() to a block pointer"
    if mask is not None:
        raise CompilationError(f"{what} takes no mask=: bounds are boundary_check=")
    checked = _checked_dims(p, boundary_check, what)
    value = _block_value(gen.sem, value, p.block_shape, what)
    ptr, mask = _address(gen.sem, p.base, p.shape, p.strides, p.offsets, p.block_shape, checked)
    gen.sem.store(ptr, value, mask=mask)
