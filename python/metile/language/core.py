"""The functions a kernel may call.

These are markers, not implementations: the frontend recognises each by its
`__metile_builtin__` name and builds Tile IR for the call.  Calling one from
ordinary Python (outside a kernel) raises, so a kernel accidentally run as
Python fails loudly instead of computing something else.
"""

from __future__ import annotations


class constexpr:
    """Annotation for a compile-time parameter (`BLOCK: metile.constexpr`).

    Each distinct value specializes the kernel.  Keyword-only parameters with
    a default are constexpr too.
    """

    def __init__(self, value=None):
        self.value = value

    def __repr__(self) -> str:
        return f"constexpr({self.value!r})"


def _builtin(name: str, doc: str):
    def stub(*args, **kwargs):
        raise RuntimeError(f"metile.{name} can only be called inside a @metile.kernel function")

    stub.__name__ = name
    stub.__qualname__ = name
    stub.__doc__ = doc
    stub.__metile_builtin__ = name
    return stub


_DOCS = {
    # block level
    "program_id": "program_id(axis) -> int32: index of this program (threadgroup) along a grid axis.",
    "num_programs": "num_programs(axis) -> int32: number of programs along a grid axis.",
    "arange": "arange(start, end) -> int32 tile [start, end); both bounds constexpr.",
    "load": "load(pointer, mask=None, other=None): scalar or tile load; masked-off lanes read `other` (0).",
    "store": "store(pointer, value, mask=None): scalar or tile store; masked-off lanes write nothing.",
    "atomic_add": "atomic_add(pointer, value, mask=None): adds value to device memory atomically "
                  "(relaxed order; float32, int32 or uint32 buffers); returns nothing. The buffer "
                  "ends as the passed array plus every added value.",
    "where": "where(condition, a, b): elementwise selection.",
    "maximum": "maximum(a, b): elementwise maximum.",
    "minimum": "minimum(a, b): elementwise minimum.",
    "exp": "exp(x)", "exp2": "exp2(x)", "log": "log(x)", "sqrt": "sqrt(x)", "rsqrt": "rsqrt(x)",
    "abs": "abs(x)", "tanh": "tanh(x)", "sigmoid": "sigmoid(x) = 1 / (1 + exp(-x))", "erf": "erf(x)",
    "cast": "cast(x, dtype): explicit conversion; the only way to change a value's dtype.",
    "sum": "sum(x, axis=None): reduction; None reduces every axis to a scalar.",
    "max": "max(x, axis=None): reduction.",
    "min": "min(x, axis=None): reduction.",
    "zeros": "zeros(shape, dtype=float32): constant tile.",
    "full": "full(shape, value, dtype=float32): constant tile.",
    "cdiv": "cdiv(a, b) = (a + b - 1) // b.",
    "dot": "dot(a, b, acc=None): tile matrix product a[M,K] @ b[K,N] (+ acc), accumulated in float32.",
    # thread level
    "thread_id": "thread_id() -> int32: this thread's index within its program.",
    "num_threads": "num_threads() -> int32: threads per program (the lane geometry's size).",
    "tile_range": "tile_range(start, end, step=1): loop range, written `for i in metile.tile_range(...)`.",
    "shared": "shared(size, dtype=float32): threadgroup (shared) memory; returns a pointer.",
    "barrier": "barrier(): threadgroup barrier; must be reached by every thread of the program.",
    "tensor": "tensor(buffer, shape=, strides=None, block_shape=None, access='readwrite'): indexed view.",
    "loop_state": "loop_state(value): marks a loop-carried value (identity; any reassigned variable is carried).",
}

globals().update({name: _builtin(name, doc) for name, doc in _DOCS.items()})


def cdiv(a, b):
    """cdiv(a, b) = (a + b - 1) // b; usable on the host (grid sizes) and in kernels."""
    return -(-a // b)


cdiv.__metile_builtin__ = "cdiv"

BUILTINS = tuple(_DOCS)

__all__ = ["constexpr", *BUILTINS]
