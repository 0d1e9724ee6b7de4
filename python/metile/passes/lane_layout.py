"""The lane layout of tiles, as seen while emitting element code.

A program has T threads.  Element i of a row-major-linearised tile belongs to
thread i % T, slot i // T (in a kernel laid out in runs of V, a tile of a multiple
of T*V elements gives thread (i // V) % T runs of V consecutive elements:
passes/vectorize_rows.py).  `Ctx` is a position in that layout where element
code is being emitted: inside a `lane_loop` (identity: the element this thread
owns in this slot) or at coordinates derived from one (broadcasting, reduction
axes, dot operands), where only threadgroup-memory tiles can be read.
"""

from __future__ import annotations

from ..ir.core import Builder, Value
from ..ir.types import PointerType, ScalarType, elem_type
from ..language import dtypes as dt

I32 = ScalarType(dt.int32)
BOOL = ScalarType(dt.bool_)


class Storage:
    """Where a tile is held: `local` registers in the lane layout (or, with `layout`, the
    accumulator layout of lower_mma_layout.py), `shared` threadgroup
    memory, or `rows`: a last-axis reduction's (rows,) result in the registers of the
    threads holding each row of its (rows, columns) operand `parent` (laid out in runs of
    `width`): register slot s of a thread is the row its run slot s holds
    (lower_reductions._rows_held), read only by element code of a `parent`-shaped tile."""

    def __init__(self, kind: str, name: str, shape: tuple, dtype: dt.DType,
                 parent: tuple | None = None, width: int = 1):
        self.kind, self.name, self.shape, self.dtype = kind, name, shape, dtype
        self.parent, self.width = parent, width
        # "tiles" | "rows": a register array in the matrix unit's accumulator layout
        # (passes/lower_mma_layout.py) instead of the lane layout
        self.layout: str | None = None
        # threadgroup tiles: elements between rows where padded (mma_layout.padded)
        self.pitch: int | None = None
        # threadgroup tiles: a run-time element offset into the array (a double buffer's
        # half, lower_mma_layout.prefetch)
        self.base = None
        # a GEMM's staged operand: elements a stage of the array holds (None: the tile's)
        # and where this operand's tile starts in one (a joined dual GEMM's B tiles share
        # stages: gemm_wgmma._joined_dual, gemm_async.stage_base)
        self.stage_size: int | None = None
        self.stage_offset = 0
        # threadgroup tiles: the array 16-byte aligned and every row 16 bytes apart (what
        # ldmatrix needs, proven when the tile is laid out: lower_mma_layout)
        self.rows_aligned = False
        # threadgroup tiles of 16-bit elements in wgmma's 128-byte swizzle atoms (64 columns
        # of every row, 16-byte chunks permuted by the row's low three bits): element (r, c)
        # of an R-row tile at (c / 64) 64 R + 64 r + ((c % 64) / 8 ^ r % 8) 8 + c % 8
        self.swizzled = False


def scalar_of(t) -> ScalarType:
    """The per-element type a thread holds: pointers become their offsets (int32, or int64
    after an int64 offset was added)."""
    e = elem_type(t)
    return ScalarType(e.index) if isinstance(e, PointerType) else e


class Ctx:
    """Where element code is being emitted: a lane loop (or a derived coordinate view)."""

    def __init__(self, low, b: Builder, shape, lin=None, slot=None, coords=None, identity=True):
        self.low, self.b, self.shape = low, b, tuple(shape)
        self.lin, self.slot, self.identity = lin, slot, identity
        self._coords = coords
        self.memo: dict[int, Value] = {}
        # In a lane loop laid out in runs (vectorize_rows.py): the run's shared state and
        # which of its consecutive elements this context is.
        self.run, self.run_index = None, 0
        # the lane-loop context this one was derived from (itself in a lane loop): whose
        # register slot a `rows` tile is read at
        self.origin = self if identity else None

    def coords(self) -> list[Value]:
        run = self.run
        if self._coords is None and run is not None and self.run_index and self.identity \
                and self.shape == run.ctxs[0].shape and self.shape[-1] % len(run.ctxs) == 0:
            # element e of a run (vectorize_rows.py) sits e columns after the run's first
            base = run.ctxs[0].coords()
            self._coords = base[:-1] + [self.low.add(self.b, base[-1],
                                                     self.low.const(self.b, self.run_index))]
        if self._coords is None:
            out, rest = [], self.lin
            for axis in range(len(self.shape) - 1, -1, -1):
                extent = self.shape[axis]
                if axis == 0 or all(e == 1 for e in self.shape[:axis]):
                    # the lane loop's element is inside the tile: no wrap past here
                    out.append(rest)
                    out.extend(self.low.const(self.b, 0) for _ in range(axis))
                    break
                elif extent & (extent - 1) == 0:
                    # lin is an element index (never negative): a power-of-two extent is a
                    # mask and a shift, not the signed division's correction for negatives
                    out.append(self.b.value("and", [rest, self.low.const(self.b, extent - 1)], I32))
                    rest = self.b.value("shr", [rest, self.low.const(self.b, extent.bit_length() - 1)],
                                        I32)
                else:
                    c = self.low.const(self.b, extent)
                    out.append(self.b.value("mod", [rest, c], I32))
                    rest = self.b.value("idiv", [rest, c], I32)
            self._coords = out[::-1]
        return self._coords

    def derived(self, shape, coords) -> "Ctx":
        out = Ctx(self.low, self.b, shape, coords=coords, identity=False)
        out.origin = self.origin
        return out

    def reshaped(self, shape) -> "Ctx":
        """The same element seen as one of a tile of `shape` with the same row-major order:
        in a lane loop it is still this thread's slot, so register tiles stay readable."""
        if self.identity:
            out = Ctx(self.low, self.b, shape, lin=self.lin, slot=self.slot)
            out.memo = self.memo  # a value read at the same linear element is the same
            out.run, out.run_index = self.run, self.run_index
            out.origin = self.origin
            return out
        out = Ctx(self.low, self.b, shape, lin=self.linear(self.shape), identity=False)
        out.origin = self.origin
        return out

    def linear(self, shape) -> Value:
        if self.identity and tuple(shape) == self.shape:
            return self.lin
        coords = self.coords()
        out = None
        for c, extent in zip(coords, shape):
            out = c if out is None else self.b.value(
                "add", [self.b.value("mul", [out, self.low.const(self.b, extent)], I32), c], I32)
        return out
