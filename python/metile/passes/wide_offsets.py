"""wide_offsets: which buffers a kernel addresses with 64-bit offsets (an analysis; it
changes nothing).

Buffers of more than `runtime.arguments.MAX_BUFFER_ELEMENTS` elements are launched only
when every element offset into them is a 64-bit value, as Triton users write for large
tensors (`pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)`): an int32 offset would wrap
and address the wrong element silently.  Two facts make the proof:

* `wide_indexed` (thread form, after lowering): every device access of the buffer
  (mem_load, mem_store, mem_atomic, vec_load, vec_store, cp_async, aligned16) takes an
  int64 or uint64 index.  Lowerings that compute offsets themselves (GEMM staging, the 4-wide
  elementwise interior) do so in int32, so their buffers fail this check.
* `narrowing_casts` (tile form): no int32 value that is itself computed (`pid * BLOCK +
  arange`, say) is widened to 64 bits, by a cast or by a pointer addition that makes the
  address 64-bit: such a value may have wrapped already.  Program ids, constants, aranges,
  loop induction variables and scalar arguments widen exactly.
"""

from __future__ import annotations

from ..ir.core import Function, Op, walk
from ..ir.types import elem_type
from ..language import dtypes as dt

_WIDE = (dt.int64, dt.uint64)
_ACCESS_INDEX = {"mem_load": ("root", 0), "mem_store": ("root", 0), "mem_atomic": ("root", 0),
                 "vec_load": ("root", 0), "vec_store": ("root", 0), "aligned16": ("root", 0),
                 "cp_async": ("src", 1)}
# 32-bit values that are exact when widened: nothing computed them from other values.
_EXACT_LEAVES = {"program_id", "num_programs", "const", "arange", "thread_id", "num_threads"}


def wide_indexed(thread_fn: Function, buffers: dict) -> list[str]:
    """Parameters whose every device access in `thread_fn` takes a 64-bit index
    (`buffers` maps (parameter, role) to the root names the thread form uses)."""
    narrow = set()
    for op in walk(thread_fn.body):
        where = _ACCESS_INDEX.get(op.name)
        if where is None or op.attrs.get("space", "device") != "device":
            continue
        attr, i = where
        if elem_type(op.operands[i].type).dtype not in _WIDE:
            narrow.add(op.attrs[attr])
    roots: dict[str, set] = {}
    for (name, role), root in buffers.items():
        if role != "scalar":
            roots.setdefault(name, set()).add(root)
    return sorted(n for n, rs in roots.items() if not rs & narrow)


def narrowing_casts(fn: Function, scalar_params: set) -> list[Op]:
    """Ops of the tile form that widen a computed 32-bit (or narrower) integer to 64 bits:
    casts, and pointer additions that make an address 64-bit while an int32 offset
    accumulated on it (or added with it) was computed (`B + rk * N + rn64`: rk * N)."""
    exact = set(scalar_params)
    for op in walk(fn.body):
        if op.name == "for" and op.regions and op.regions[0].args:
            exact.add(op.regions[0].args[0].id)   # an induction variable is an int32 bound
    out = []
    for op in walk(fn.body):
        if op.name == "cast":
            d = elem_type(op.operands[0].type).dtype
            if elem_type(op.results[0].type).dtype in _WIDE and d not in _WIDE and \
                    d.kind in "iu" and not _exact(op.operands[0], exact):
                out.append(op)
        elif op.name == "ptr_add" and elem_type(op.results[0].type).index in _WIDE:
            p, off = op.operands
            d = elem_type(off.type).dtype
            if (d not in _WIDE and not _exact(off, exact)) or \
                    (elem_type(p.type).index not in _WIDE and not _pointer_exact(p, exact)):
                out.append(op)
    return out


def _exact(v, exact: set) -> bool:
    if v.id in exact:
        return True
    op = v.owner
    if not isinstance(op, Op):
        return False
    if op.name in ("splat", "broadcast", "expand_dims"):
        return all(_exact(o, exact) for o in op.operands)
    return op.name in _EXACT_LEAVES


def _pointer_exact(p, exact: set) -> bool:
    """Whether the int32 offset accumulated on pointer `p` is exact (parameter + leaves)."""
    op = p.owner
    if not isinstance(op, Op):
        return True   # the parameter itself (a loop-carried pointer is an Op's result below)
    if op.name in ("splat", "broadcast", "expand_dims"):
        return _pointer_exact(op.operands[0], exact)
    if op.name == "ptr_add":
        return _exact(op.operands[1], exact) and _pointer_exact(op.operands[0], exact)
    return False
