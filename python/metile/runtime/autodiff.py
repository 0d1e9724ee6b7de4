"""Expression vjp: gradients for pointwise kernels.

`@metile.kernel(differentiable=True)` makes launches of a pointwise kernel
differentiable with `mx.grad`/`mx.vjp`: the forward pass is the compiled
kernel; the backward pass differentiates the kernel's own expression, replayed
from its Tile IR as MLX ops.  Only kernels this module can read as a pure
elementwise map qualify (it proves that, or the launch is a CompilationError
naming why):

  * every load and store addresses `program_id(0) * BLOCK + arange(0, BLOCK)`
    (the canonical 1-D block), with no mask or the mask `offs < n`;
  * no control flow, reductions, matrix products, shared memory or barriers;
  * runtime scalars are constants of the derivative (no gradient flows to them).

Matrix products and mutable multi-stage pipelines are not differentiated: the
replay would not be the kernel's expression.
"""

from __future__ import annotations

import math

import mlx.core as mx

from ..frontend import CompilationError
from ..ir.core import Function, walk
from ..passes.buffer_usage import _block_offsets, _def, _strip

_MX = {
    "add": mx.add, "sub": mx.subtract, "mul": mx.multiply, "div": mx.divide,
    "idiv": mx.floor_divide, "mod": mx.remainder, "maximum": mx.maximum, "minimum": mx.minimum,
    "and": mx.logical_and, "or": mx.logical_or,
    "lt": mx.less, "le": mx.less_equal, "gt": mx.greater, "ge": mx.greater_equal,
    "eq": mx.equal, "ne": mx.not_equal,
    "neg": mx.negative, "not": mx.logical_not, "exp": mx.exp, "log": mx.log, "sqrt": mx.sqrt,
    "rsqrt": mx.rsqrt, "abs": mx.abs, "tanh": mx.tanh, "sigmoid": mx.sigmoid, "erf": mx.erf,
    "exp2": lambda x: mx.power(2.0, x), "where": mx.where,
}
_INDEX_OPS = {"program_id", "arange", "splat", "broadcast", "ptr_add"}
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16,
           "int32": mx.int32, "uint32": mx.uint32, "bool": mx.bool_}


def _reject(why: str, op=None) -> CompilationError:
    return CompilationError(f"differentiable=True needs a pointwise kernel: {why}",
                            getattr(op, "loc", None))


def check_pointwise(fn: Function) -> None:
    """Raise a CompilationError unless `fn` is a pointwise map (module docstring)."""
    params = {id(p.value) for p in fn.params if p.value is not None}
    for op in walk(fn.body):
        if op.name in ("for", "if", "while", "reduce", "dot", "shared_alloc", "barrier",
                       "thread_id", "num_programs", "num_threads"):
            raise _reject(f"'{op.name}' is not an elementwise operation", op)
        if op.name in ("load", "store"):
            ptr = _def(op.operands[0])
            if ptr is None or ptr.name != "ptr_add" or id(_strip(ptr.operands[0])) not in params \
                    or _block_offsets(ptr.operands[1]) is None:
                raise _reject("loads and stores must address program_id(0) * BLOCK + "
                              "arange(0, BLOCK) of a buffer parameter", op)
            mask_index = 1 if op.name == "load" else 2
            if len(op.operands) > mask_index:
                mask = _def(op.operands[mask_index])
                if mask is None or mask.name != "lt" or mask.operands[0] is not ptr.operands[1]:
                    raise _reject("masks must be `offs < n`", op)


def replay(fn: Function, loaded: dict[str, mx.array], scalars: dict) -> dict[str, mx.array]:
    """The kernel's stored values as MLX ops over whole (flattened) input arrays."""
    env: dict[int, object] = {}
    for p in fn.params:
        if p.value is not None and p.name in scalars:
            env[id(p.value)] = scalars[p.name]
    out = {}
    for op in walk(fn.body):
        name = op.name
        if name in _INDEX_OPS and name != "splat":
            continue
        if name == "const":
            env[id(op.results[0])] = op.attrs["value"]
        elif name == "splat":
            if id(op.operands[0]) in env:
                env[id(op.results[0])] = env[id(op.operands[0])]
        elif name == "load":
            root = _def(op.operands[0]).operands[0]
            env[id(op.results[0])] = loaded[_root_name(fn, root)]
        elif name == "store":
            root = _def(op.operands[0]).operands[0]
            out[_root_name(fn, root)] = env[id(op.operands[1])]
        elif name == "cast":
            value = env[id(op.operands[0])]
            target = _DTYPES[op.results[0].type.dtype.name]
            env[id(op.results[0])] = value.astype(target) if isinstance(value, mx.array) else value
        elif name in _MX:
            if not all(id(v) in env for v in op.operands):
                continue  # an index computation (mask, offsets): not part of the values
            env[id(op.results[0])] = _MX[name](*(env[id(v)] for v in op.operands))
    return out


def _root_name(fn: Function, value) -> str:
    target = id(_strip(value))
    return next(p.name for p in fn.params if p.value is not None and id(p.value) == target)


def differentiable_launch(fn: Function, launch, loaded_names: list[str], output_names: list[str],
                          scalars: dict, n: int):
    """`launch(*loaded_arrays) -> [outputs]` made differentiable: the vjp replays `fn`'s
    expression on the first `n` elements (what the kernel reads and writes)."""

    @mx.custom_function
    def forward(*arrays):
        return launch(*arrays)

    @forward.vjp
    def backward(primals, cotangents, outputs):
        def expression(*arrays):
            flat = {k: a.reshape(-1)[:n] for k, a in zip(loaded_names, arrays)}
            values = replay(fn, flat, scalars)
            return [values[k] for k in output_names]

        cots = [c.reshape(-1)[:n] for c in cotangents]
        _, grads = mx.vjp(expression, list(primals), cots)
        # Elements past n are never read by the kernel: their gradient is zero.
        return [mx.pad(g.reshape(-1), (0, math.prod(p.shape) - n)).reshape(p.shape)
                for g, p in zip(grads, primals)]

    return forward
