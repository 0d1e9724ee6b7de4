"""How `metile.ops.matmul` maps MLX's (NumPy's) matmul semantics onto the GEMM kernels.

a (..., M, K) @ b (..., K, N): the batch dimensions broadcast as NumPy's do; a 1-D
`a` is a (1, K) row and a 1-D `b` a (K, 1) column, and the promoted axis is dropped
from the result.  A call runs one of two ways:

- flattened: `b` is one matrix for the whole batch (no batch dimensions, or all of
  extent 1), so a's batch and rows form one (batch * M, K) row block and the call is
  a single 2-D GEMM: the common (B, T, K) @ (K, N), and one large GEMM fills the
  machine better than B small ones.
- batched: `b` differs across the batch; `batched_matmul_epilogue` runs one GEMM per
  batch index (grid axis 2).  Each operand is either batched in full (a matrix per
  batch index) or shared by every batch index (batch extent 1: batch stride 0, no
  copy).  An operand whose batch dimensions broadcast only in part ((2, 1, M, K)
  against (1, 3, K, N)) is expanded with mx.broadcast_to, and the kernel call copies
  the expansion to row-major: a copy of the full batch of that operand.

Reshaping to rows or batches is free for a row-contiguous operand; a strided view
(a transpose, a slice) is copied to row-major once, by MLX's reshape or by the
custom-kernel call, as a 2-D operand's would be.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Plan:
    out_shape: tuple[int, ...]     # the result's shape, promoted axes dropped
    batch_shape: tuple[int, ...]   # the broadcast batch dimensions
    m: int
    n: int
    k: int
    a_batch: tuple[int, ...]       # a's own batch dimensions (after 1-D promotion)
    b_batch: tuple[int, ...]

    @property
    def batch(self) -> int:
        return math.prod(self.batch_shape)

    @property
    def flattened(self) -> bool:
        """b is the same matrix for every batch index: one 2-D GEMM over all rows."""
        return math.prod(self.b_batch) == 1


def plan(a_shape, b_shape) -> Plan:
    """The call's shapes; a clear ValueError for operands matmul cannot multiply."""
    return _plan(tuple(a_shape), tuple(b_shape))


@functools.lru_cache(maxsize=1024)
def _plan(a_shape: tuple, b_shape: tuple) -> Plan:
    # a pure function of the shapes, asked again by every eager call of a signature
    if not a_shape or not b_shape:
        raise ValueError(f"[metile.ops] matmul operands need at least one dimension, got "
                         f"{a_shape} @ {b_shape} (use * to multiply by a scalar)")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ValueError(f"[metile.ops] inner dimensions differ: {a_shape} @ {b_shape} "
                         f"(a has K={a2[-1]}, b has K={b2[-2]})")
    a_batch, b_batch = a2[:-2], b2[:-2]
    batch_shape = _broadcast(a_batch, b_batch)
    if batch_shape is None:
        raise ValueError(f"[metile.ops] batch dimensions {a_batch} and {b_batch} do not broadcast "
                         f"({a_shape} @ {b_shape})")
    m, k, n = a2[-2], a2[-1], b2[-1]
    out = batch_shape + ((m,) if len(a_shape) > 1 else ()) + ((n,) if len(b_shape) > 1 else ())
    return Plan(out, batch_shape, m, n, k, a_batch, b_batch)


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy's broadcast of two shapes, None where they do not broadcast (plain Python:
    every eager call pays for this)."""
    if not x or x == y:
        return y
    if not y:
        return x
    x, y = (1,) * (len(y) - len(x)) + x, (1,) * (len(x) - len(y)) + y
    out = []
    for i, j in zip(x, y):
        if i != j and i != 1 and j != 1:
            return None
        out.append(j if i == 1 else i)
    return tuple(out)


def flattened(a: mx.array, b: mx.array, p: Plan) -> tuple[mx.array, mx.array]:
    """(rows, K) and (K, N) operands of a flattened call.  A 2-D `b` is passed as it is,
    so a transposed view stays recognisable (ops._layout)."""
    a2 = a.reshape(math.prod(p.a_batch) * p.m, p.k)
    return a2, (b if b.ndim == 2 else b.reshape(p.k, p.n))


def batched(a: mx.array, b: mx.array, p: Plan) -> tuple[mx.array, mx.array]:
    """(batch or 1, M, K) and (batch or 1, K, N) operands of a batched call: extent 1
    for an operand shared by every batch index."""
    return (_batched(a.reshape(*p.a_batch, p.m, p.k), p.a_batch, p),
            _batched(b.reshape(*p.b_batch, p.k, p.n), p.b_batch, p))


def _batched(x: mx.array, own: tuple[int, ...], p: Plan) -> mx.array:
    rows, cols = x.shape[-2:]
    if math.prod(own) == 1:
        return x.reshape(1, rows, cols)
    padded = (1,) * (len(p.batch_shape) - len(own)) + own
    if padded != p.batch_shape:   # broadcasts in part: expanded (copied) to the full batch
        x = mx.broadcast_to(x, (*p.batch_shape, rows, cols))
    return x.reshape(p.batch, rows, cols)


def batch_count(a3: mx.array, b3: mx.array) -> int:
    """The batch of a batched call's operands (an extent 1 broadcasts, also against 0)."""
    return a3.shape[0] if b3.shape[0] == 1 else b3.shape[0]


def sharing(a3: mx.array, b3: mx.array) -> str:
    """Which operands of a batched call every batch index shares (routing key part)."""
    shared = ("a" if a3.shape[0] == 1 else "") + ("b" if b3.shape[0] == 1 else "")
    return shared or "none"
