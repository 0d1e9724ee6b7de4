"""Matrix-fragment accesses of `simdgroup_inline` kernels (frontend half).

Under `Schedule(backend="simdgroup_inline")` a tensor view with
`block_shape=(8, 8)` loads and stores whole 8x8 matrix fragments instead of
lane-distributed tiles.  Each access becomes one tile-form op that keeps the
view's geometry (base pointer, origin, logical extents, constant strides and
the optional scratch tensor), so `passes.shared_hazards` can check the
shared-memory contract and `passes.lower_fragments` can pick a matrix
load/store or a bounded scalar copy through scratch:

  frag_view_load(base, row, col, rows, cols){strides, scratch, ...} -> tile (8, 8)
  frag_view_store(base, row, col, rows, cols, value){strides, scratch, ...}

The rules checked here are local to one access (rank, constant strides,
scratch shape); whole-kernel rules live in `passes.shared_hazards`.
"""

from __future__ import annotations

from ..ir.core import Op, Value
from ..ir.types import ScalarType, TileType
from ..language import dtypes as dt
from ..errors import CompilationError
from .semantics import is_const
from .views import TensorView

FRAGMENT = (8, 8)


def applies(gen, view: TensorView) -> bool:
    return bool(getattr(gen.ctx, "fragments", False)) and view.block_shape is not None \
        and tuple(view.block_shape) == FRAGMENT


def _strides(view: TensorView) -> tuple[int, int]:
    if len(view.shape) != 2:
        raise CompilationError(f"matrix views need rank 2, got shape {view.shape}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in view.strides):
        raise CompilationError("matrix views need constant strides (constexpr ints); "
                               f"got strides {tuple(_show(s) for s in view.strides)}")
    s0, s1 = view.strides
    if s0 <= 0 or s1 <= 0 or (s0 != 1 and s1 != 1):
        raise CompilationError(f"matrix views need positive row-major (ld, 1) or column-major "
                               f"(1, ld) strides, got {view.strides}")
    return s0, s1


def _show(s):
    return s if not isinstance(s, Value) else "<runtime>"


def _root_alloc(v: Value):
    """The shared_alloc op a pointer derives from, and whether it is that pointer itself."""
    direct = True
    while isinstance(v.owner, Op) and v.owner.name == "ptr_add":
        v, direct = v.owner.operands[0], False
    owner = v.owner if isinstance(v.owner, Op) else None
    return (owner if owner is not None and owner.name == "shared_alloc" else None), direct


def _scratch(gen, view: TensorView, scratch) -> dict:
    if scratch is None:
        return {}
    if not isinstance(scratch, TensorView):
        raise CompilationError("scratch= must be a metile.tensor over a metile.shared allocation")
    alloc, direct = _root_alloc(scratch.base)
    if alloc is None or not direct:
        raise CompilationError("scratch misuse: scratch= must reference a top-level shared "
                               "allocation directly (no offset alias, no device buffer)")
    if view.base.type.space != "device":
        raise CompilationError("scratch misuse: scratch= is only for device matrix views")
    if scratch.block_shape is not None or scratch.access != "readwrite" \
            or len(scratch.shape) != 2 or scratch.shape[1] != 8 \
            or not isinstance(scratch.shape[0], int) or tuple(scratch.strides) != (8, 1):
        raise CompilationError("scratch misuse: the scratch tensor must have shape "
                               "(BLOCK // 4, 8), strides (8, 1), read/write access and no "
                               "block_shape")
    if scratch.dtype != view.dtype:
        raise CompilationError(f"scratch misuse: scratch dtype {scratch.dtype} differs from the "
                               f"device tensor's {view.dtype}")
    return {"scratch": alloc.attrs["root"], "scratch_rows": scratch.shape[0],
            "scratch_size": alloc.attrs["size"]}


def _operands(gen, view: TensorView, position, verb: str):
    sem = gen.sem
    if not isinstance(position, tuple) or len(position) != 2:
        raise CompilationError(f"{verb}() of a matrix view needs a (row, column) origin")
    vals = []
    for x in (*position, *view.shape):
        if isinstance(x, Value):
            if not isinstance(x.type, ScalarType) or not x.type.dtype.is_int:
                raise CompilationError(f"matrix view origins and extents must be integer scalars, "
                                       f"got {x.type}")
            vals.append(x)
        elif is_const(x) and isinstance(x, int):
            vals.append(sem.const(x, dt.int32))
        else:
            raise CompilationError(f"matrix view origins and extents must be integers, got {x!r}")
    return vals


def _attrs(gen, view: TensorView, position, scratch) -> dict:
    strides = _strides(view)
    space = view.base.type.space
    attrs = {"strides": strides, "space": space,
             "origin": tuple(p if isinstance(p, int) else None for p in position),
             "extent": tuple(e if isinstance(e, int) else None for e in view.shape)}
    if space == "threadgroup":
        alloc, _ = _root_alloc(view.base)
        if alloc is None:
            raise CompilationError("matrix views of threadgroup memory must derive from a "
                                   "metile.shared allocation")
        if scratch is not None:
            raise CompilationError("scratch misuse: scratch= is only for device matrix views")
    attrs.update(_scratch(gen, view, scratch))
    return attrs


def load(gen, view: TensorView, position, scratch=None) -> Value:
    if view.access == "write":
        raise CompilationError("load from a write-only tensor view (access='write')")
    attrs = _attrs(gen, view, position, scratch)
    ops = _operands(gen, view, position, "load")
    t = TileType(FRAGMENT, ScalarType(view.dtype))
    return gen.b.value("frag_view_load", [view.base, *ops], t, **attrs)


def store(gen, view: TensorView, position, value, scratch=None) -> None:
    if view.access == "read":
        raise CompilationError("store to a read-only tensor view (access='read')")
    if not (isinstance(value, Value) and isinstance(value.type, TileType)
            and tuple(value.type.shape) == FRAGMENT):
        raise CompilationError("store() to a matrix view needs an 8x8 fragment value")
    if not value.type.elem.dtype.is_float:
        raise CompilationError("matrix fragments hold floating values")
    attrs = _attrs(gen, view, position, scratch)
    ops = _operands(gen, view, position, "store")
    gen.b.op("frag_view_store", [view.base, *ops, value], [], attrs)

