"""Expression vjp: gradients for pointwise kernels.

`@metile.kernel(differentiable=True)` makes launches of a pointwise kernel
differentiable with `mx.grad`/`mx.vjp`: the forward pass is the compiled
kernel; the backward pass differentiates the kernel's own expression, replayed
from its Tile IR as MLX ops.  Only kernels this module can read as a pure
elementwise map qualify (it proves that, or the launch is a CompilationError
naming why):

  * every load and store addresses `program_id(0) * BLOCK + arange(0, BLOCK)`
    (the canonical 1-D block), with no mask or a mask `offs < bound` of a scalar
    bound (a load's bound and `other=` are replayed), and no stored value reads the
    position (arange, program_id) itself;
  * no control flow, reductions, matrix products, shared memory or barriers;
  * runtime scalars are constants of the derivative (no gradient flows to them).

Matrix products and mutable multi-stage pipelines are not differentiated: the
replay would not be the kernel's expression.

`simdgroup_inline` kernels qualify when their outputs are a pointwise function
of 8x8 device-tile loads (`check_fragment_pointwise`): every matrix view access
has the same origin, extents and strides, so an output element at address a
depends only on the inputs' elements at a.  Loops, runtime extents and masked
tails are allowed (they choose which elements are written, which the launch
records); a `dot`, shared memory other than scratch, barriers, scalar device
stores and values carried across iterations are not.  The vjp replays the
stored expression over the whole flattened arrays and keeps the cotangent of
the elements the kernel wrote.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import CompilationError
from ..ir.core import Function, walk
from ..ir.types import elem_type
from ..passes.buffer_usage import block_offsets, defining_op, strip_broadcasts
from .op_function import OpFunction

def _ignoring_nan(pick):
    """metile's maximum/minimum (Triton's): a NaN operand gives the other one, where MLX's
    propagates it (and the replay's gradient then missed the chosen operand)."""
    def f(a, b):
        a, b = (x if isinstance(x, mx.array) else mx.array(x) for x in (a, b))
        return mx.where(mx.isnan(a), b, mx.where(mx.isnan(b), a, pick(a, b)))
    return f


def _truncating(op):
    """Runtime integer // and % truncate toward zero in a kernel (C's, Triton's); MLX's
    floor_divide and remainder are Python's."""
    def f(a, b):
        q, r = mx.floor_divide(a, b), mx.remainder(a, b)
        q = q + ((r != 0) & ((mx.array(a) < 0) != (mx.array(b) < 0))).astype(q.dtype)
        return q if op == "idiv" else a - q * b
    return f


def _bitwise_or_logical(bitwise, logical):
    """`&` / `|` of the kernel: bitwise on integers, logical on bools (as in Triton)."""
    def f(a, b):
        ints = [x for x in (a, b) if isinstance(x, mx.array) and x.dtype != mx.bool_]
        return bitwise(a, b) if ints else logical(a, b)
    return f


_MX = {
    "add": mx.add, "sub": mx.subtract, "mul": mx.multiply, "div": mx.divide,
    "idiv": _truncating("idiv"), "mod": _truncating("mod"),
    "maximum": _ignoring_nan(mx.maximum), "minimum": _ignoring_nan(mx.minimum),
    "and": _bitwise_or_logical(mx.bitwise_and, mx.logical_and),
    "or": _bitwise_or_logical(mx.bitwise_or, mx.logical_or),
    "lt": mx.less, "le": mx.less_equal, "gt": mx.greater, "ge": mx.greater_equal,
    "eq": mx.equal, "ne": mx.not_equal,
    "neg": mx.negative, "not": mx.logical_not, "exp": mx.exp, "log": mx.log, "sqrt": mx.sqrt,
    "rsqrt": mx.rsqrt, "abs": mx.abs, "tanh": mx.tanh, "sigmoid": mx.sigmoid, "erf": mx.erf,
    "exp2": lambda x: mx.power(2.0, x), "where": mx.where,
    "log2": mx.log2, "sin": mx.sin, "cos": mx.cos, "tan": mx.tan, "asin": mx.arcsin,
    "acos": mx.arccos, "atan": mx.arctan, "floor": mx.floor, "ceil": mx.ceil,
    "pow": mx.power, "atan2": mx.arctan2,
}
_INDEX_OPS = {"program_id", "arange", "splat", "broadcast", "ptr_add"}
# What replay() handles besides the _MX table.
_REPLAYED = _INDEX_OPS | {"const", "load", "store", "cast"}
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16,
           "int32": mx.int32, "uint32": mx.uint32, "int64": mx.int64,
           "uint64": mx.uint64, "int8": mx.int8, "uint8": mx.uint8, "int16": mx.int16,
           "uint16": mx.uint16, "bool": mx.bool_}


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
        if op.name not in _MX and op.name not in _REPLAYED:
            # the vjp replays the kernel as MLX ops: an op it cannot replay is refused
            # here rather than failing (or silently missing) in the backward pass
            raise _reject(f"the backward pass cannot replay '{op.name}' as an MLX op", op)
        if op.name == "cast" and any(elem_type(v.type).dtype.name not in _DTYPES
                                     for v in (*op.operands, *op.results)):
            raise _reject("MLX has no fp8 arrays to replay a conversion to or from fp8 in", op)
        if op.name in ("load", "store"):
            ptr = defining_op(op.operands[0])
            if ptr is None or ptr.name != "ptr_add" or id(strip_broadcasts(ptr.operands[0])) not in params \
                    or block_offsets(ptr.operands[1]) is None:
                raise _reject("loads and stores must address program_id(0) * BLOCK + "
                              "arange(0, BLOCK) of a buffer parameter", op)
            mask_index = 1 if op.name == "load" else 2
            if len(op.operands) > mask_index:
                mask = defining_op(op.operands[mask_index])
                if mask is None or mask.name != "lt" or mask.operands[0] is not ptr.operands[1]:
                    raise _reject("masks must be `offs < n`", op)
                if _scalar_bound(mask.operands[1], params) is None:
                    raise _reject("a mask's bound must be a scalar argument or a constant "
                                  "(`offs < n`)", op)
    _check_position_free(fn)


def _scalar_bound(value, params: set):
    """The op or parameter a mask bound `offs < bound` reads, if a scalar one."""
    root = strip_broadcasts(value)
    op = defining_op(root)
    if op is None:
        return root if id(root) in params else None
    return op if op.name == "const" else None


def _check_position_free(fn: Function) -> None:
    """The stored values must not read the element's position (program_id, arange): the
    vjp replays them as maps over whole arrays, where no position exists."""
    ops = list(walk(fn.body))
    positional = set()
    for op in ops:
        if op.name in ("program_id", "arange"):
            positional.update(id(r) for r in op.results)
        elif op.name not in ("ptr_add", "load", "store") and \
                any(id(v) in positional for v in op.operands):
            positional.update(id(r) for r in op.results)
    for op in ops:
        if op.name == "store" and id(op.operands[1]) in positional:
            raise _reject("the stored value depends on the element's position (program_id or "
                          "arange), which the backward pass's replay over whole arrays does "
                          "not have", op)
        if op.name == "load" and len(op.operands) > 2 and id(op.operands[2]) in positional:
            raise _reject("a load's `other=` depends on the element's position", op)


def check_fragment_pointwise(fn: Function) -> None:
    """Raise a CompilationError unless the simdgroup_inline kernel `fn` is a pointwise
    map of device tiles (module docstring)."""
    params = {id(p.value) for p in fn.params if p.value is not None}
    ops = list(walk(fn.body))
    scratch = {op.attrs["scratch"] for op in ops if op.attrs.get("scratch")}
    geometry, stored, pointwise = None, set(), set(params)
    for op in ops:
        if op.name == "dot":
            raise CompilationError("differentiable=True does not differentiate matrix products "
                                   "(metile.dot): expression vjp covers pointwise fragment "
                                   "epilogues only", op.loc)
        if op.name == "shared_alloc" and op.attrs["root"] not in scratch or op.name == "barrier":
            raise _reject(f"'{op.name}' (shared-memory exchange) is not an elementwise "
                          f"operation", op)
        if op.name == "store" or (op.name == "load"
                                  and not elem_type(op.results[0].type).dtype.is_int):
            raise _reject("scalar device loads and stores are not part of a fragment "
                          "expression (only integer extents may be loaded)", op)
        if op.name in ("frag_view_load", "frag_view_store"):
            if op.attrs["space"] != "device" or id(op.operands[0]) not in params:
                raise _reject("matrix views must address a buffer parameter directly", op)
            key = (tuple(_const(v) if _const(v) is not None else id(v)
                         for v in op.operands[1:5]), tuple(op.attrs["strides"]))
            if geometry is not None and key != geometry:
                raise _reject("every matrix view access needs the same origin, extents and "
                              "strides, so each output element depends on the inputs' elements "
                              "at its own address", op)
            geometry = key
            if op.name == "frag_view_store":
                root = id(op.operands[0])
                if root in stored:
                    raise _reject("each output is stored by one expression", op)
                stored.add(root)
                if id(op.operands[5]) not in pointwise:
                    raise _reject("the stored fragment must be a pointwise function of matrix "
                                  "loads, constants and scalar parameters (no loop-carried or "
                                  "position-dependent values)", op)
            else:
                pointwise.add(id(op.results[0]))
        elif op.name == "const" or (op.name in _MX or op.name in ("splat", "cast")) and \
                op.operands and all(id(v) in pointwise for v in op.operands):
            pointwise.update(id(r) for r in op.results)


def _const(v):
    op = defining_op(v)
    return op.attrs["value"] if op is not None and op.name == "const" else None


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
        elif name == "load" and fn.meta.get("fragments"):
            continue  # an integer extent (check_fragment_pointwise), not part of the values
        elif name == "load":
            root = defining_op(op.operands[0]).operands[0]
            value = loaded[_root_name(fn, root)]
            if len(op.operands) > 1:   # `offs < bound` (check_pointwise), else `other`
                bound = _bound_value(defining_op(op.operands[1]).operands[1], env)
                other = env.get(id(op.operands[2]), 0) if len(op.operands) > 2 else 0
                keep = mx.arange(value.size) < bound
                value = mx.where(keep, value, mx.array(other, value.dtype))
            env[id(op.results[0])] = value
        elif name == "store":
            root = defining_op(op.operands[0]).operands[0]
            out[_root_name(fn, root)] = env[id(op.operands[1])]
        elif name == "frag_view_load":
            env[id(op.results[0])] = loaded[_root_name(fn, op.operands[0])]
        elif name == "frag_view_store":
            out[_root_name(fn, op.operands[0])] = env[id(op.operands[5])]
        elif name == "cast":
            value = env[id(op.operands[0])]
            target = _DTYPES[elem_type(op.results[0].type).dtype.name]
            env[id(op.results[0])] = value.astype(target) if isinstance(value, mx.array) else value
        elif name in _MX:
            if not all(id(v) in env for v in op.operands):
                continue  # an index computation (mask, offsets): not part of the values
            env[id(op.results[0])] = _MX[name](*(env[id(v)] for v in op.operands))
    return out


def _bound_value(value, env: dict):
    """A mask bound's value in the replay: a scalar argument's, or a constant's."""
    root = strip_broadcasts(value)
    if id(root) in env:
        return env[id(root)]
    op = defining_op(root)
    return op.attrs["value"]


def stored_twice(fn: Function) -> list[str]:
    """The buffer parameters a pointwise kernel stores to more than once."""
    seen, twice = set(), []
    for op in walk(fn.body):
        if op.name == "store":
            name = _root_name(fn, defining_op(op.operands[0]).operands[0])
            if name in seen and name not in twice:
                twice.append(name)
            seen.add(name)
    return twice


def loaded_buffers(fn: Function) -> set[str]:
    """The buffer parameters a pointwise kernel (check_pointwise) loads from."""
    return {_root_name(fn, defining_op(op.operands[0]).operands[0])
            for op in walk(fn.body) if op.name == "load"}


def _root_name(fn: Function, value) -> str:
    target = id(strip_broadcasts(value))
    return next(p.name for p in fn.params if p.value is not None and id(p.value) == target)


def _fit(a, m: int):
    """`a` flattened to `m` elements: its first m, or zero-padded to m (an input shorter
    than the outputs, read under a mask: its gradient is the pad's, cut back)."""
    flat = a.reshape(-1)
    return flat[:m] if flat.size >= m else mx.pad(flat, (0, m - flat.size))


def _vjp_by_output(expression, primals: list, cots: list) -> list:
    """The gradients of a pointwise `expression` (its outputs' element j depends on its
    inputs' element j, the first n of each flattened) for `cots`, one output at a time, each
    output's contribution zero where its cotangent is: an output the loss does not use
    gets zero cotangents from MLX, and 0 times a singular derivative (sqrt at 0, log of a
    negative) made every gradient NaN, where MLX's own autodiff never visits that output."""
    grads = [None] * len(primals)
    for i, cot in enumerate(cots):
        _, g = mx.vjp(lambda *a, i=i: [expression(*a)[i]], primals, [cot])
        unused = cot == 0
        for j, gj in enumerate(g):
            flat = gj.reshape(-1)
            m = unused[:flat.size] if flat.size <= unused.size else \
                mx.pad(unused, (0, flat.size - unused.size), constant_values=False)
            gj = mx.where(m, mx.zeros((), flat.dtype), flat).reshape(gj.shape)
            grads[j] = gj if grads[j] is None else grads[j] + gj
    return grads


def differentiable_launch(fn: Function, launch, loaded_names: list[str], output_names: list[str],
                          scalars: dict, n: int):
    """`launch(*loaded_arrays) -> [outputs]` made differentiable: the vjp replays `fn`'s
    expression on the first `n` elements (what the kernel reads and writes).  A runtime
    scalar passed as a 0-d float mx.array is a primal too (its gradient is the sum over the
    elements; it was a constant, so mx.grad gave it zero, silently)."""
    traced = [k for k, v in scalars.items()
              if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating)]
    nl = len(loaded_names)

    # (one MLX node under a transform, as metile.ops are: op_function.py)
    forward = OpFunction(lambda *arrays: launch(*arrays[:nl]), name=fn.name)

    @forward.vjp
    def backward(primals, cotangents, outputs):
        # MLX passes a lone primal as a bare array, not a one-element sequence.
        primals = [primals] if isinstance(primals, mx.array) else list(primals)
        cotangents = [cotangents] if isinstance(cotangents, mx.array) else cotangents
        outputs = [outputs] if isinstance(outputs, mx.array) else outputs
        # each scalar as n copies, so its contributions are elementwise like the buffers'
        # (masked per output below) and summed after
        expanded = [mx.broadcast_to(p, (n,)) for p in primals[nl:]]

        def expression(*arrays):
            # The expression takes the whole arrays and reads their first n elements, so
            # the gradients have the arrays' shapes, zero past n (where the kernel reads
            # nothing); an array shorter than n is padded (it was broadcast against the
            # outputs, or failed to broadcast).
            flat = {k: _fit(a, n) for k, a in zip(loaded_names, arrays[:nl])}
            values = replay(fn, flat, {**scalars, **dict(zip(traced, arrays[nl:]))})
            # (an output the kernel fills with a constant: that value at every element)
            return [mx.broadcast_to(values[k] if isinstance(values[k], mx.array)
                                    else mx.array(values[k], o.dtype), (n,))
                    for k, o in zip(output_names, outputs)]

        cots = [c.reshape(-1)[:n] for c in cotangents]
        grads = _vjp_by_output(expression, primals[:nl] + expanded, cots)
        return [g.reshape(p.shape) for g, p in zip(grads[:nl], primals)] + \
            [g.sum().astype(p.dtype) for g, p in zip(grads[nl:], primals[nl:])]

    return lambda *arrays: forward(*arrays, *(scalars[k] for k in traced))


def fragment_differentiable_launch(fn: Function, launch, loaded_names: list[str],
                                   output_names: list[str], scalars: dict):
    """`launch(*loaded_arrays, *passed_outputs) -> (outputs, written)` made differentiable
    for a simdgroup_inline kernel that passed check_fragment_pointwise; `written` holds one
    float32 mask per output (1 where the kernel stored).  The vjp replays the stored
    expression over the flattened arrays and keeps the written elements' cotangents; the
    passed output arrays are primals too, whose elements the kernel leaves unwritten reach
    the result unchanged (their gradient was lost: the merge read them from outside)."""
    k, nl = len(output_names), len(loaded_names)

    @mx.custom_function
    def forward(*arrays):
        outs, written = launch(*arrays)
        return [*outs, *written]

    @forward.vjp
    def backward(primals, cotangents, outputs):
        primals = [primals] if isinstance(primals, mx.array) else list(primals)
        loaded, passed = primals[:nl], primals[nl:]
        n = max(o.size for o in outputs[:k])
        floats = [i for i, p in enumerate(loaded) if mx.issubdtype(p.dtype, mx.floating)]

        def expression(*arrays):
            flat = {name: _fit(a, n) for name, a in zip(loaded_names, loaded)}
            flat.update({loaded_names[i]: _fit(a, n) for i, a in zip(floats, arrays)})
            values = replay(fn, flat, scalars)
            return [mx.broadcast_to(mx.array(values[name]) if not isinstance(values[name],
                                                                              mx.array)
                                    else values[name], (n,))[:o.size].astype(mx.float32)
                    for name, o in zip(output_names, outputs)]

        cots = [c.reshape(-1).astype(mx.float32) * m.reshape(-1)
                for c, m in zip(cotangents[:k], outputs[k:])]
        grads = _vjp_by_output(expression, [loaded[i] for i in floats], cots)
        out = [mx.zeros_like(p) for p in primals]
        for i, g in zip(floats, grads):
            out[i] = _fit(g, loaded[i].size).reshape(loaded[i].shape).astype(loaded[i].dtype)
        for i, (p, c, m) in enumerate(zip(passed, cotangents[:k], outputs[k:])):
            if mx.issubdtype(p.dtype, mx.floating):
                out[nl + i] = (c.astype(mx.float32) * (1 - m)).reshape(p.shape).astype(p.dtype)
        return out

    return lambda *arrays: forward(*arrays)[:k]
