"""wide_offsets: which buffers a kernel addresses with 64-bit offsets (an analysis; it
changes nothing).

Buffers of more than `runtime.arguments.MAX_BUFFER_ELEMENTS` elements are launched only
when every element offset into them is a 64-bit value, as Triton users write for large
tensors (`pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)`): an int32 offset would wrap
and address the wrong element silently.  Two facts make the proof:

* `wide_indexed` (thread form, after lowering): every device access of the buffer
  (mem_load, mem_store, mem_atomic, vec_load, cp_async, aligned16) takes an int64 or
  uint64 index.  Lowerings that compute offsets themselves (GEMM staging, the 4-wide
  elementwise interior) do so in int32, so their buffers fail this check.
* `narrowing_casts` (tile form): no int32 value that is itself computed (`pid * BLOCK +
  arange`, say) is widened to 64 bits: such a value has wrapped before the cast.  Casts
  of program ids, constants, aranges and scalar arguments are exact.
"""

from __future__ import annotations

from ..ir.core import Function, Op, walk
from ..ir.types import elem_type
from ..language import dtypes as dt

_WIDE = (dt.int64, dt.uint64)
_ACCESS_INDEX = {"mem_load": ("root", 0), "mem_store": ("root", 0), "mem_atomic": ("root", 0),
                 "vec_load": ("root", 0), "aligned16": ("root", 0), "cp_async": ("src", 1)}
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
    """Casts of computed 32-bit (or narrower) integers to 64 bits in the tile form."""
    out = []
    for op in walk(fn.body):
        if op.name != "cast" or elem_type(op.results[0].type).dtype not in _WIDE:
            continue
        src = op.operands[0]
        d = elem_type(src.type).dtype
        if d in _WIDE or d.kind not in "iu":
            continue
        if not _exact(src, scalar_params):
            out.append(op)
    return out


def _exact(v, scalar_params: set) -> bool:
    if v.id in scalar_params:
        return True
    op = v.owner
    if not isinstance(op, Op):
        return False
    if op.name in ("splat", "broadcast", "expand_dims"):
        return all(_exact(o, scalar_params) for o in op.operands)
    return op.name in _EXACT_LEAVES
