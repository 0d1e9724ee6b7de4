"""gemm_epilogue_reads: the memory reads a fused GEMM epilogue may make.

Besides the accumulator, constants and runtime scalars, an epilogue may read

* a matrix of the output tile's shape at the store's coordinates (a residual, or
  `C` in `alpha * A @ B + beta * C`), and
* a vector broadcast along one axis of the tile: one value per output column
  repeated down the rows (a bias, `Bias + columns`), or one value per output row
  repeated across the columns (`Scale + rows` expanded with `[:, None]`).

Such a load is not materialized where the kernel writes it: the lowering
evaluates it per output element inside the epilogue, at the element's (row,
column), masked by its own mask and by the store's mask, so edge tiles read
exactly what they store.  The contract checked here makes that evaluation equal
to the kernel's tile semantics:

* the load's address and mask are index arithmetic (no value read from memory,
  no loop variable), so they can be computed at any coordinate;
* the loaded tile reaches the epilogue only through broadcasts, `[None, :]` /
  `[:, None]` and pointwise ops, and is used nowhere else;
* each of its axes maps to one output axis, in order (no transposition, no
  axis repeated, not a single element spread over the whole tile);
* it reads a floating-point buffer that the kernel does not store to (reading
  the output in the epilogue would race with other threads' stores).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompilationError
from ..ir.core import Op, Value
from ..ir.ops import ELEMENTWISE
from ..ir.types import TileType, elem_type

PREFIX = "cannot lower the GEMM"
# Ops an epilogue read's address or mask may be built from (index arithmetic).
_INDEX = frozenset({"arange", "program_id", "num_programs", "const", "splat", "broadcast",
                    "expand_dims"}) | ELEMENTWISE
_KINDS = {(0, 1): "matrix", (1,): "per-column vector", (0,): "per-row vector"}


@dataclass
class EpilogueRead:
    load: Op
    buffer: str
    axes: tuple            # output axes the loaded tile varies along, in its axis order

    @property
    def kind(self) -> str:
        return _KINDS[self.axes]

    def describe(self) -> dict:
        ptr = elem_type(self.load.operands[0].type)
        return {"buffer": self.buffer, "dtype": ptr.dtype.name,
                # (what one program loads, not the buffer: a per-column bias of N values
                # reads a (BLOCK_N,) tile)
                "tile_shape": list(self.load.results[0].type.shape), "kind": self.kind,
                "broadcast": {"matrix": None, "per-column vector": "over rows",
                              "per-row vector": "over columns"}[self.kind],
                "masked": len(self.load.operands) > 1}


def _reject(message: str, op: Op | None) -> CompilationError:
    return CompilationError(f"{PREFIX}: {message}", op.loc if op is not None else None)


def leaf_cone(v: Value) -> dict[int, Value]:
    """Values reachable backwards from an epilogue leaf, not entering a load's operands
    (a load's address and mask are checked separately)."""
    seen, todo = {}, [v]
    while todo:
        w = todo.pop()
        if w.id in seen:
            continue
        seen[w.id] = w
        op = w.owner
        if isinstance(op, Op) and op.name != "load":
            todo.extend(op.operands)
    return seen


def _check_address(load: Op) -> None:
    seen, todo = set(), list(load.operands)
    while todo:
        w = todo.pop()
        if w.id in seen:
            continue
        seen.add(w.id)
        op = w.owner
        if op is None:
            continue
        if not isinstance(op, Op):
            raise _reject("an epilogue read whose address or mask uses a loop-carried or branch "
                          "value", load)
        if op.name == "load":
            raise _reject("an epilogue read whose address or mask is itself read from memory "
                          "(indirect reads are not fused)", load)
        if op.name not in _INDEX:
            raise _reject(f"an epilogue read whose address or mask uses '{op.name}'; only index "
                          f"arithmetic can be evaluated at the store's coordinates", load)
        todo.extend(op.operands)


def _maps(v: Value, m: tuple, out: dict, memo: set) -> None:
    """For each load under `v`, the output axis each of its axes lands on (None: an
    axis of extent 1 broadcast), given that `v`'s axes land on `m`."""
    if (v.id, m) in memo or not isinstance(v.type, TileType):
        return
    memo.add((v.id, m))
    op = v.owner
    if not isinstance(op, Op) or op.name in ("const", "splat"):
        return
    if op.name == "load":
        out.setdefault(id(op), (op, set()))[1].add(m)
        return
    if op.name == "broadcast":
        src = op.operands[0]
        if isinstance(src.type, TileType):
            off = len(op.result.type.shape) - len(src.type.shape)
            _maps(src, tuple(None if s == 1 and op.result.type.shape[j + off] != 1 else m[j + off]
                             for j, s in enumerate(src.type.shape)), out, memo)
        return
    if op.name == "expand_dims":
        a = op.attrs["axis"]
        _maps(op.operands[0], m[:a] + m[a + 1:], out, memo)
        return
    for o in op.operands:   # pointwise: tile operands share the result's shape
        if isinstance(o.type, TileType) and o.type.shape == v.type.shape:
            _maps(o, m, out, memo)


def check_epilogue_reads(fn, epilogue: list[Op], dependent: set, store: Op, uses: dict,
                         leaves: list[Value]) -> tuple[list[EpilogueRead], set[int]]:
    """The epilogue's reads (program order) and the ids of the tile values built from
    them, which the lowering evaluates per output element instead of materializing."""
    out_root = elem_type(store.operands[0].type).root
    fused: dict[int, Value] = {}
    maps: dict = {}
    memo: set = set()
    for leaf in leaves:
        cone = leaf_cone(leaf)
        loads = [w.owner for w in cone.values() if isinstance(w.owner, Op)
                 and w.owner.name == "load"]
        if not loads:
            continue
        for ld in loads:
            ptr = elem_type(ld.operands[0].type)
            if ptr.root == out_root:
                raise _reject(f"the epilogue reads {ptr.root!r}, the buffer the GEMM stores to "
                              f"(other threads' stores would race with the read); pass the "
                              f"values in a separate buffer", ld)
            if ptr.space != "device":
                raise _reject(f"an epilogue read of {ptr.space} memory ({ptr.root!r}); only "
                              f"device buffers are fused", ld)
            if not ptr.dtype.is_float:
                raise _reject(f"an epilogue read of {ptr.root!r} ({ptr.dtype}); fused reads are "
                              f"float32, float16 or bfloat16", ld)
            _check_address(ld)
        # Tile values between the loads and the epilogue.
        has_load = {}

        def reaches(w: Value) -> bool:
            if w.id not in has_load:
                op = w.owner
                has_load[w.id] = isinstance(op, Op) and (
                    op.name == "load" or any(reaches(o) for o in op.operands if o.id in cone))
            return has_load[w.id]

        for w in cone.values():
            if isinstance(w.type, TileType) and reaches(w):
                fused[w.id] = w
        if isinstance(leaf.type, TileType) and len(leaf.type.shape) == 2:
            _maps(leaf, (0, 1), maps, memo)
    epilogue_ids = {id(op) for op in epilogue}
    for w in fused.values():
        for user, _ in uses.get(w.id, []):
            if id(user) not in epilogue_ids and not any(r.id in fused for r in user.results):
                ld = next(o for o in [w.owner] if isinstance(o, Op))
                raise _reject("a value read for the epilogue is also used outside it (the read "
                              "is evaluated per output element inside the epilogue); load it "
                              "separately for the other use", ld)
    all_loads = {id(w.owner): w.owner for leaf in leaves for w in leaf_cone(leaf).values()
                 if isinstance(w.owner, Op) and w.owner.name == "load"}
    for key, ld in all_loads.items():
        if key not in maps:
            raise _reject(f"an epilogue read of {elem_type(ld.operands[0].type).root!r} with "
                          f"shape {_shape(ld)} that is neither the output tile's shape nor a "
                          f"vector along one of its axes (per row or per column)", ld)
    reads = []
    for ld, ms in maps.values():
        ptr = elem_type(ld.operands[0].type)
        shape = _shape(ld)
        if len(ms) > 1:
            raise _reject(f"the epilogue uses the read of {ptr.root!r} at two different "
                          f"positions of the output tile", ld)
        (m,) = ms
        axes = tuple(a for a in m if a is not None)
        if axes not in _KINDS:
            raise _reject(f"an epilogue read of {ptr.root!r} with shape {shape} that is neither "
                          f"the output tile's shape nor a vector along one of its axes "
                          f"(per row or per column)", ld)
        reads.append(EpilogueRead(ld, ptr.root, axes))
    order = {id(op): i for i, op in enumerate(_walk(fn))}
    reads.sort(key=lambda r: order.get(id(r.load), 0))
    return reads, set(fused)


def _shape(ld: Op) -> tuple:
    t = ld.results[0].type
    return tuple(t.shape) if isinstance(t, TileType) else ()


def _walk(fn):
    from ..ir.core import walk
    return walk(fn.body)
