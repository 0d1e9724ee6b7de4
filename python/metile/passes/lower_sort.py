"""`sort` for `lower_tiles` (a mixin of `Lowering`): a bitonic network in threadgroup memory.

The result tile is in threadgroup memory (placement).  The operand is copied into it,
then each of the log2(n)*(log2(n)+1)/2 stages of the network is one lane loop over the
tile's numel/2 compare-exchange pairs (every line along the last axis at once) and a
barrier.  Stage (k, j) pairs position i with i + j inside blocks of 2j; a pair sorts
ascending when bit k of i is clear and descending otherwise, so each block of k becomes
sorted in alternating directions until the last stage (k = n) sorts the whole line.
Each pair belongs to one thread, so no two threads touch an element within a stage.

Order: `less` is `<` with NaN above every number (NumPy's order; Triton leaves NaN's
place unspecified), which keeps the comparison a total preorder: a comparator network
sorts under any such order.  Equal elements are interchangeable, so the values come out
as `np.sort` gives them; `descending` reverses every comparison.
"""

from __future__ import annotations

from math import prod

from ..ir.core import Builder, Op, Value
from ..ir.types import ScalarType, dtype_of
from .lane_layout import BOOL, I32, Ctx


class SortLowering:
    def lower_sort(self, op: Op, b: Builder) -> None:
        (x,) = op.operands
        st = self.storage_for(op.results[0])
        assert st.kind == "shared", "placement keeps sort results in threadgroup memory"
        shape, n = x.type.shape, x.type.shape[-1]
        self.barrier(b)
        self.lane_loop(b, shape, lambda ctx: self.write(st, ctx, self.elem(x, ctx)))
        self.barrier(b)
        descending = op.attrs.get("descending", False)
        k = 2
        while k <= n:
            j = k // 2
            while j >= 1:
                self.lane_loop(b, (x.type.numel // 2,), lambda ctx: self._compare_exchange(
                    ctx, st, n, k, j, descending))
                self.barrier(b)
                j //= 2
            k *= 2

    def _compare_exchange(self, ctx: Ctx, st, n: int, k: int, j: int, descending: bool):
        b = ctx.b
        c = lambda v: self.const(b, v)  # noqa: E731
        pair, line = ctx.lin, None  # pair index over every line: line, then pair in the line
        if prod(st.shape) > n:
            line = b.value("idiv", [pair, c(n // 2)], I32)
        q = b.value("mod", [pair, c(n // 2)], I32) if line is not None else pair
        # the pair's lower position inside its line: block q // j of width 2j, offset q % j
        if j == 1:
            pos = b.value("mul", [q, c(2)], I32)
        else:
            pos = self.add(b, b.value("mul", [b.value("idiv", [q, c(j)], I32), c(2 * j)], I32),
                           b.value("mod", [q, c(j)], I32))
        i = pos if line is None else self.add(b, b.value("mul", [line, c(n)], I32), pos)
        partner = b.value("add", [i, c(j)], I32)
        t = ScalarType(st.dtype)
        lo = b.value("mem_load", [i], t, root=st.name, space="threadgroup")
        hi = b.value("mem_load", [partner], t, root=st.name, space="threadgroup")
        # lo and hi out of order for an ascending pair: hi < lo (descending: lo < hi)
        up, down = self._less(b, hi, lo), self._less(b, lo, hi)
        if descending:
            up, down = down, up
        if k == n:
            swap = up
        else:
            bit = b.value("mod", [b.value("idiv", [pos, c(k)], I32), c(2)], I32)
            swap = b.value("where", [b.value("eq", [bit, c(0)], BOOL), up, down], BOOL)
        b.op("mem_store", [i, b.value("where", [swap, hi, lo], t)], [],
             {"root": st.name, "space": "threadgroup"})
        b.op("mem_store", [partner, b.value("where", [swap, lo, hi], t)], [],
             {"root": st.name, "space": "threadgroup"})

    @staticmethod
    def _less(b: Builder, x: Value, y: Value) -> Value:
        lt = b.value("lt", [x, y], BOOL)
        if not dtype_of(x.type).is_float:
            return lt
        # NaN is above every number: x < NaN when x is a number
        y_nan = b.value("ne", [y, y], BOOL)
        x_num = b.value("eq", [x, x], BOOL)
        return b.value("or", [lt, b.value("and", [y_nan, x_num], BOOL)], BOOL)

