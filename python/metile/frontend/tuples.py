"""Tuples a kernel builds, carried through runtime loops and ifs element by element.

`(a, b)` displays, `return a, b` from an inline helper, `t + (c,)`, `t += (c,)`, `t * 2` and
slices `t[1:]` give a KernelTuple.
It follows the `loop_parts` protocol of frontend/control.py (as block pointers do), so a
tuple of runtime values and numbers may be reassigned inside a `range` loop or differ
between the branches of a runtime `if` (Triton carries tuples too): each element is a
carried slot, and a nested tuple (or block pointer) is carried through its own parts.
Only its elements may change there, not its length or nesting; elements that are not
values, numbers or tuples of them (None, dtypes, tensor descriptors) are kept as they are
and may not change.  Plain Python tuples (a shape, a constexpr argument) are carried the
same way (frontend/control.py wraps them).
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
    # A nested tuple (or block pointer) element is carried through its own parts, so the
    # slots are the leaves in order and the structure is rebuilt around them.  An element
    # that is neither a value, a number nor a composite (None, a dtype, a tensor
    # descriptor) is no slot: it stays as it is and must not change.
    def loop_parts(self) -> tuple:
        parts = []
        for x in self:
            inner = _composite(x)
            if inner is not None:
                parts += inner.loop_parts()
            elif _slot(x):
                parts.append(x)
        return tuple(parts)

    def loop_part_names(self, name: str) -> list[str]:
        names = []
        for i, x in enumerate(self):
            inner = _composite(x)
            if inner is not None:
                names += inner.loop_part_names(f"{name}[{i}]")
            elif _slot(x):
                names.append(f"{name}[{i}]")
        return names

    def with_parts(self, parts) -> "KernelTuple":
        parts = list(parts)
        out = []
        for x in self:
            inner = _composite(x)
            if inner is not None:
                n = len(inner.loop_parts())
                out.append(inner.with_parts(parts[:n]))
                del parts[:n]
            elif _slot(x):
                out.append(parts.pop(0))
            else:
                out.append(x)
        return KernelTuple(out)

    def layout_differs(self, other) -> str | None:
        if not isinstance(other, tuple):
            return f"becomes {describe(other)}"
        if len(other) != len(self):
            return f"changes length from {len(self)} to {len(other)}"
        for i, (x, y) in enumerate(zip(self, other)):
            inner = _composite(x)
            if inner is not None:
                why = inner.layout_differs(y)
                if why:
                    return f"has element {i} that {why}"
            elif _composite(y) is not None:
                return f"has element {i} that becomes {describe(y)}"
            elif not _slot(x) and not _same(x, y):
                return (f"has element {i} that changes from {describe(x)} to {describe(y)} "
                        f"(only runtime values, numbers and tuples of them are carried)")
            elif _slot(x) and not _slot(y):
                return f"has element {i} that becomes {describe(y)}"
        return None


def _composite(x):
    """A tuple element carried through its own parts (a tuple as a KernelTuple, a block
    pointer as it is), or None."""
    if isinstance(x, tuple):
        return KernelTuple(x)
    return x if hasattr(x, "loop_parts") else None


def _slot(x) -> bool:
    """Whether a tuple element is carried as a slot (a runtime value or a number)."""
    return isinstance(x, Value) or is_const(x)


def _same(x, y) -> bool:
    return x is y or (type(x) is type(y) and x == y)
