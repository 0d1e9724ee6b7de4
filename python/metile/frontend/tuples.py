"""Tuples a kernel builds, carried through runtime loops and ifs element by element.

`(a, b)` displays, `return a, b` from an inline helper, `t + (c,)`, `t += (c,)`, `t * 2` and
slices `t[1:]` give a KernelTuple.
It follows the `loop_parts` protocol of frontend/control.py (as block pointers do), so a
tuple of runtime values and numbers may be reassigned inside a `range` loop or differ
between the branches of a runtime `if` (Triton carries tuples too): each element is a
carried slot.  Only its elements may change there, not its length; elements that are
not values or numbers (nested tuples, views, dtypes) cannot be carried and say so.
"""

from __future__ import annotations

from ..errors import CompilationError
from ..ir.core import Value
from .semantics import describe, is_const


class KernelTuple(tuple):
    def __add__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return KernelTuple(tuple(self) + tuple(other))

    def __radd__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return KernelTuple(tuple(other) + tuple(self))

    def __mul__(self, n):
        if not isinstance(n, int) or isinstance(n, bool):
            return NotImplemented
        return KernelTuple(tuple(self) * n)

    __rmul__ = __mul__

    def __getitem__(self, i):
        item = tuple.__getitem__(self, i)
        return KernelTuple(item) if isinstance(i, slice) else item

    # -- carried through loops and ifs (frontend/control.py) ------------------------------
    def loop_parts(self) -> tuple:
        for i, x in enumerate(self):
            if not (isinstance(x, Value) or is_const(x)):
                raise CompilationError(
                    f"a tuple whose element {i} is {describe(x)} cannot change "
                    f"inside a runtime loop or if: only runtime values and numbers are carried")
        return tuple(self)

    def loop_part_names(self, name: str) -> list[str]:
        return [f"{name}[{i}]" for i in range(len(self))]

    def with_parts(self, parts) -> "KernelTuple":
        return KernelTuple(parts)

    def layout_differs(self, other) -> str | None:
        if not isinstance(other, tuple):
            return f"becomes {describe(other)}"
        if len(other) != len(self):
            return f"changes length from {len(self)} to {len(other)}"
        return None
