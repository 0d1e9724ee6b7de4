"""General products on the matrix unit, for `lower_tiles` (a mixin of `Lowering`).

A `dot(a, b, acc)` outside the fast GEMM lowering (passes/gemm.py takes one dot
recurrence per kernel: attention's two products per key block, a product whose result
feeds a reduction) is otherwise lowered per output element: each thread runs a scalar
float32 multiply-add loop over K for the elements it owns, reading both operands from
threadgroup memory - two shared reads per multiply-add.  Here the program's SIMD-groups
share the product's (fm, fn) output fragments of the target's SIMD-group matrix unit
(`MatrixUnit`: 8x8x8 simdgroup_matrix on Metal, 16x16x16 mma.sync on CUDA): each takes
fragments f = simd_group, simd_group + groups, ... and accumulates them over K from
fragment loads of the operands in threadgroup memory, float32 accumulation.

What it proves or changes.  Only a product whose operands are 2-D tiles of one dtype the
unit takes and whose M, N, K are whole fragments is taken (`dot_unit`); anything else
keeps the per-element lowering.  The operands are read where placement put them in
threadgroup memory (row-major, as `Ctx.linear` indexes them) or copied there first
(`Lowering.shared_copy`, the copy axis reductions make: barrier, copy, barrier).  The fragments are stored row-major into the
result's threadgroup array when placement holds the result there (and `acc` is not a
carried value that may share it), else into a float32 scratch array read back into the
result's storage; `acc` is added element by element
by the thread owning the element.  A barrier precedes the fragment loads (the operands'
last writes) and the stores (earlier readers of the result's array) and one follows them
(other threads read the result): the same bracketing as any write of a shared tile.
Nothing changes where `dot_unit` declines.  The operand copies and the scratch hold more
in threadgroup memory than the per-element lowering: where the kernel then passes the
target's limit (SharedOverflow), lower_tiles lowers it again without fragment products,
so the estimates callers make for the per-element lowering (attention_ops.shared_bytes)
still hold.

Where it runs: where the resolved backend says (Backend.dot_fragments): on Metal (and
the CPU runtime, which checks races and bounds) always; on CUDA (mma.sync) unless
METILE_DOT_FRAGMENTS=0.  The attention tests pass with it on the H200, where it halved
causal attention prefill (1x32x4096x4096x128 float16: 10.7 ms against 22.0 per element, s22).
"""

from __future__ import annotations

from math import prod

from ..ir.core import Builder, Op, Value
from ..ir.types import ScalarType, TileType
from ..language import dtypes as dt
from .lane_layout import I32, Ctx

F32 = ScalarType(dt.float32)


def _untransposed(v: Value) -> Value:
    """The 2-D tile `v` is the transpose of (a `trans`), else `v`."""
    op = v.owner
    if isinstance(op, Op) and op.name == "permute" and tuple(op.attrs["dims"]) == (1, 0) \
            and len(op.operands[0].type.shape) == 2:
        return op.operands[0]
    return v


class DotFragmentLowering:
    # the backend's choice (Backend.dot_fragments), passed by lower_tiles.lower_tiles,
    # which lowers again without them where they pass the threadgroup memory limit
    dot_fragments_allowed = False
    dot_fragments_used = False

    def dot_unit(self, op: Op, b: Builder):
        """The SIMD-group matrix unit this general `dot` runs on, or None (per-element)."""
        if not self.dot_fragments_allowed or self.gemm is not None or \
                self.fn.meta.get("fragments"):
            return None
        a, bm, acc = op.operands
        if not all(isinstance(v.type, TileType) and len(v.type.shape) == 2
                   and isinstance(v.type.elem, ScalarType) for v in (a, bm, acc)):
            return None
        dtype = a.type.elem.dtype
        if bm.type.elem.dtype != dtype or acc.type.elem.dtype != dt.float32:
            return None
        (m, k), n = a.type.shape, bm.type.shape[1]
        for unit in self.matrix_units:
            fm, fn, fk = unit.shape
            if unit.warpgroup or unit.path is not None or unit.convert or \
                    not unit.takes(dtype.name, False) or m % fm or n % fn or k % fk:
                continue
            if self.shared_bytes + self._dot_extra_bytes(op, b) > self.shared_optin:
                return None
            return unit
        return None

    def _dot_extra_bytes(self, op: Op, b: Builder) -> int:
        """Threadgroup bytes the fragment product adds: operand copies and the scratch."""
        a, bm, _ = op.operands
        return self.shared_copy_bytes(a, b) + self.shared_copy_bytes(_untransposed(bm), b) + \
            prod(op.results[0].type.shape) * 4   # (at most) the scratch

    def _fragment(self, role: str, dtype: dt.DType, unit) -> str:
        name = self.fresh(f"_d{role}")
        self.decls.append(Op("decl", [], [], {"name": name, "storage": "fragment", "role": role,
                                              "dtype": dtype, "size": 1, "shape": unit.shape}, []))
        return name

    def lower_dot_fragments(self, op: Op, b: Builder, unit) -> None:
        a, bm, acc = op.operands
        result = op.results[0]
        (m, k), n = a.type.shape, bm.type.shape[1]
        fm, fn, fk = unit.shape
        self.dot_fragments_used = True
        # a right operand that is the transpose of a tile (keys^T in attention) is copied
        # as that tile and its fragments loaded transposed: no transposing copy, whose
        # reads of a 64x128 block walked one bank
        source = _untransposed(bm)
        st_a, st_b = self.shared_copy(a, b), self.shared_copy(source, b)
        out = self.storage_for(result)
        # fragments go straight into the result's threadgroup array unless `acc` may live
        # there too (a carried accumulator shares its loop's storage): it is read after
        acc_st = self.storage.get(acc.id)
        direct = out.kind == "shared" and isinstance(acc.owner, Op) and \
            (acc_st is None or acc_st.name != out.name)
        target = out.name if direct else self.decl("shared", dt.float32, m * n, "_dsc")
        frag_a = self._fragment("a", a.type.elem.dtype, unit)
        frag_b = self._fragment("b", bm.type.elem.dtype, unit)
        frag_c = self._fragment("acc", dt.float32, unit)
        self.barrier(b)
        groups = self.T // 32
        columns = n // fn

        def per_fragment(fb: Builder, f: Value) -> None:
            row0 = self._i(fb, "mul", self._i(fb, "idiv", f, columns), fm)
            col0 = self._i(fb, "mul", self._i(fb, "mod", f, columns), fn)
            fb.op("frag_fill", [], [], {"name": frag_c, "index": 0, "value": 0.0})

            def depth(kb: Builder, kk: Value) -> None:
                at_a = self._i(kb, "add", self._i(kb, "mul", row0, k), kk)
                kb.op("frag_load", [at_a], [], {"name": frag_a, "index": 0, "root": st_a.name,
                                                "ld": k, "convert": None})
                if source is bm:
                    at_b = self._i(kb, "add", self._i(kb, "mul", kk, n), col0)
                    kb.op("frag_load", [at_b], [], {"name": frag_b, "index": 0,
                                                    "root": st_b.name, "ld": n, "convert": None})
                else:   # element (kk, col0) of bm is element (col0, kk) of the (n, k) source
                    at_b = self._i(kb, "add", self._i(kb, "mul", col0, k), kk)
                    kb.op("frag_load", [at_b], [], {"name": frag_b, "index": 0,
                                                    "root": st_b.name, "ld": k, "convert": None,
                                                    "transpose": True})
                kb.op("frag_mma", [], [], {"d": (frag_c, 0), "a": (frag_a, 0),
                                           "b": (frag_b, 0), "c": (frag_c, 0)})
            self._for(fb, 0, k, fk, "kk", depth)
            at_c = self._i(fb, "add", self._i(fb, "mul", row0, n), col0)
            fb.op("frag_store", [self.const(fb, 0), at_c], [], {"name": frag_c, "root": target,
                                                                "ld": n})

        sg = b.value("simd_group", [], I32)
        self._for(b, sg, (m // fm) * columns, groups, "f", per_fragment)
        self.barrier(b)

        def finish(ctx: Ctx) -> None:
            product = ctx.b.value("mem_load", [ctx.linear((m, n))], F32, root=target,
                                  space="threadgroup")
            self.write(out, ctx, ctx.b.value("add", [self.elem(acc, ctx), product], F32))
        self.lane_loop(b, (m, n), finish)
        if out.kind == "shared":
            self.barrier(b)
