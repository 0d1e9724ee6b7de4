"""Reductions and `dot` for `lower_tiles` (a mixin of `Lowering`).

* Full reduction to a scalar: each thread folds the elements it owns, then
  `simd_reduce` combines the 32 lanes of a SIMD-group, lane 0 of each group
  writes its partial to threadgroup memory, and after a barrier every thread
  folds the partials (so every thread holds the result; no broadcast step).
  A trailing barrier lets the next reduction reuse the scratch.
* Reduction along an axis of a rank >= 2 tile: the operand is in threadgroup
  memory (placement guarantees it) and each result element is a serial fold
  over the axis.
* `dot`: operands in threadgroup memory, each output element a serial fold
  over K in float32.  This is the reference lowering; SIMD-group matrix and
  tensor-core lowerings replace it where a schedule selects them.
Float reductions accumulate in float32 and round back to the operand dtype.
"""

from __future__ import annotations

from ..ir.core import Block, Builder, Op, Value
from ..ir.types import ScalarType, dtype_of
from ..language import dtypes as dt
from .lane_layout import BOOL, I32, Ctx


class ReductionLowering:
    @staticmethod
    def _acc_dtype(d: dt.DType) -> dt.DType:
        return dt.float32 if d.is_float else d

    def _identity(self, b: Builder, kind: str, d: dt.DType) -> Value:
        if kind == "sum":
            return self.const(b, 0.0 if d.is_float else 0, d)
        big = {"f": float("inf"), "i": 2**31 - 1, "u": 2**32 - 1}[d.kind]
        if kind == "max":
            big = {"f": float("-inf"), "i": -2**31, "u": 0}[d.kind]
        return self.const(b, big, d)

    def _combine(self, b: Builder, kind: str, a: Value, x: Value) -> Value:
        name = {"sum": "add", "max": "maximum", "min": "minimum"}[kind]
        return b.value(name, [a, x], a.type)

    def _cast(self, b: Builder, v: Value, d: dt.DType) -> Value:
        return v if v.type.dtype == d else b.value("cast", [v], ScalarType(d), to=d)

    def full_reduce(self, op: Op, b: Builder) -> Value:
        (x,) = op.operands
        kind, d = op.attrs["kind"], dtype_of(x.type)
        acc_d = self._acc_dtype(d)
        acc = self.decl("var", acc_d, prefix="_acc")
        b.op("var_set", [self._identity(b, kind, acc_d)], [], {"name": acc})

        def body(ctx: Ctx):
            e = self._cast(ctx.b, self.elem(x, ctx), acc_d)
            cur = ctx.b.value("var_get", [], ScalarType(acc_d), name=acc)
            ctx.b.op("var_set", [self._combine(ctx.b, kind, cur, e)], [], {"name": acc})

        self.lane_loop(b, x.type.shape, body)
        part = b.value("var_get", [], ScalarType(acc_d), name=acc)
        r = b.value("simd_reduce", [part], ScalarType(acc_d), kind=kind)
        groups = self.T // 32
        if groups > 1:
            scratch = self.decl("shared", acc_d, groups, "_red")
            then = Block()
            tb = Builder(then)
            tb.op("mem_store", [self.geom(b, "simd_group"), r], [], {"root": scratch,
                                                                     "space": "threadgroup"})
            first = b.value("eq", [self.geom(b, "simd_lane"), self.const(b, 0)], BOOL)
            b.op("if", [first], [], regions=[then, Block()])
            self.barrier(b)
            b.op("var_set", [self._identity(b, kind, acc_d)], [], {"name": acc})
            loop = Block()
            j = loop.add_arg(I32, "j")
            lb = Builder(loop)
            part = lb.value("mem_load", [j], ScalarType(acc_d), root=scratch, space="threadgroup")
            cur = lb.value("var_get", [], ScalarType(acc_d), name=acc)
            lb.op("var_set", [self._combine(lb, kind, cur, part)], [], {"name": acc})
            b.op("for", [self.const(b, 0), self.const(b, groups), self.const(b, 1)], [],
                 regions=[loop])
            r = b.value("var_get", [], ScalarType(acc_d), name=acc)
            self.barrier(b)  # the scratch may be reused by the next reduction
        return self._cast(b, r, d)

    def axis_reduce(self, op: Op, ctx: Ctx) -> Value:
        (x,) = op.operands
        kind, axis, d = op.attrs["kind"], op.attrs["axis"], dtype_of(x.type)
        acc_d = self._acc_dtype(d)
        acc = self.decl("var", acc_d, prefix="_acc")
        ctx.b.op("var_set", [self._identity(ctx.b, kind, acc_d)], [], {"name": acc})
        loop = Block()
        j = loop.add_arg(I32, "j")
        lb = Builder(loop)
        coords = list(ctx.coords())
        coords.insert(axis, j)
        e = self._cast(lb, self.elem(x, Ctx(self, lb, x.type.shape, coords=coords,
                                             identity=False)), acc_d)
        cur = lb.value("var_get", [], ScalarType(acc_d), name=acc)
        lb.op("var_set", [self._combine(lb, kind, cur, e)], [], {"name": acc})
        b = ctx.b
        b.op("for", [self.const(b, 0), self.const(b, x.type.shape[axis]), self.const(b, 1)], [],
             regions=[loop])
        return self._cast(b, b.value("var_get", [], ScalarType(acc_d), name=acc), d)

    def dot(self, op: Op, ctx: Ctx) -> Value:
        a, bm, acc_in = op.operands
        f32 = ScalarType(dt.float32)
        acc = self.decl("var", dt.float32, prefix="_acc")
        ctx.b.op("var_set", [self.elem(acc_in, ctx)], [], {"name": acc})
        m, n = ctx.coords()
        loop = Block()
        k = loop.add_arg(I32, "k")
        lb = Builder(loop)
        av = self.elem(a, Ctx(self, lb, a.type.shape, coords=[m, k], identity=False))
        bv = self.elem(bm, Ctx(self, lb, bm.type.shape, coords=[k, n], identity=False))
        prod_ = lb.value("mul", [self._cast(lb, av, dt.float32), self._cast(lb, bv, dt.float32)], f32)
        cur = lb.value("var_get", [], f32, name=acc)
        lb.op("var_set", [lb.value("add", [cur, prod_], f32)], [], {"name": acc})
        b = ctx.b
        b.op("for", [self.const(b, 0), self.const(b, a.type.shape[1]), self.const(b, 1)], [],
             regions=[loop])
        return b.value("var_get", [], f32, name=acc)

    def geom(self, b: Builder, name: str) -> Value:
        return b.value(name, [], I32)
