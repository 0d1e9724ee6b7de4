"""An op's forward with its derivatives as one MLX node (`OpFunction`, csrc/op_node.h), and
the rules an op's MLX composite gives it under mx.vmap and mx.jvp.  Used by every metile
op (metile.ops, through op_replay) and by kernel-level autodiff (runtime/autodiff.py)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import mlx.core as mx

from .. import _ext, settings

_ext.fuse_ops(settings.op_nodes())


def vmap_rule(composite):
    """An mx.custom_function vmap rule that computes an op's MLX `composite` (a function of
    the custom function's arrays) under mx.vmap: a metile kernel has no batching rule of
    its own, MLX's ops do.  Outputs batched along axis 0."""
    def rule(inputs, axes):
        if isinstance(inputs, mx.array):   # (a custom function of one array)
            inputs, axes = (inputs,), (axes,)
        out = mx.vmap(composite, in_axes=tuple(axes))(*inputs)
        if isinstance(out, (tuple, list)):
            return list(out), [0] * len(out)
        return out, 0
    return rule


def jvp_rule(composite):
    """An mx.custom_function jvp rule that pushes the tangents through an op's MLX
    `composite` (as vmap_rule does for batching): forward-mode derivatives of the op
    without a tangent kernel.  Primals without a tangent (None: not differentiated, such as
    a quantized weight's words) stay constants of the composite."""
    def rule(primals, tangents):
        if isinstance(primals, mx.array):   # (a custom function of one array)
            primals, tangents = (primals,), (tangents,)
        primals = list(primals)
        moving = [i for i, t in enumerate(tangents) if t is not None]

        def along(*xs):
            args = list(primals)
            for i, x in zip(moving, xs):
                args[i] = x
            out = composite(*args)
            return list(out) if isinstance(out, (tuple, list)) else [out]
        _, out = mx.jvp(along, [primals[i] for i in moving], [tangents[i] for i in moving])
        return out[0] if len(out) == 1 else out
    return rule


def composite_rules(f, composite):
    """Give the OpFunction `f` (an op's kernel launch) the vmap and jvp rules of its MLX
    `composite` (a function of f's arrays computing the same values)."""
    f.composite(composite)


_op_forward = threading.local()


@contextmanager
def op_forward():
    """Launches made inside an op's forward (OpFunction.__call__), whose node or
    custom function carries the op's own vjp, jvp and vmap: they go without the per-launch
    no-vjp guard (a custom vjp: Dispatch._launch), which nothing can reach there - and which
    kept the op from being one MetileOp node where MLX's CustomKernel launches it (CUDA, an
    output that starts from a value), so mx.jvp and mx.vmap met that kernel."""
    depth = getattr(_op_forward, "depth", 0)
    _op_forward.depth = depth + 1
    try:
        yield
    finally:
        _op_forward.depth = depth


def in_op_forward() -> bool:
    return getattr(_op_forward, "depth", 0) > 0


class OpFunction:
    """An op's forward with its derivatives, used as mx.custom_function is (`f.vjp(rule)`,
    composite_rules) but without its nodes: called on arrays no transform traces, the
    forward's own nodes (no derivative can be asked of them); on traced arrays (mx.compile,
    grad, vjp, jvp, vmap), the forward's nodes as one node carrying the op's vjp and its
    MLX composite's jvp and vmap (_ext.op_node; mx.custom_function's nodes around them where
    the forward holds a node that one cannot run).  Under mx.compile an op is then one
    node where mx.custom_function made it three (each costs host time at every call).
    The vjp takes what an mx.custom_function's does: the primals as a tuple, the cotangent
    and output (tuples where the forward returns several).  Without a composite, mx.jvp's
    tangents and mx.vmap's outputs raise when evaluated, naming the op, as a bare launch's
    do."""

    def __init__(self, forward, name=None):
        self._forward = forward
        self._vjp = None
        self._composite = None
        self._rules = None
        # (named in the refusals of mx.jvp and mx.vmap without a composite: "kernel 'name'")
        self.__name__ = name or getattr(forward, "__name__", "op")
        self.__doc__ = forward.__doc__

    def vjp(self, fn):
        self._vjp = fn
        self._rules = None
        return fn

    def composite(self, composite):
        self._composite = composite
        self._rules = None

    def _made_rules(self):
        if self._vjp is None:
            raise TypeError(f"[metile] op function {self.__name__!r} has no vjp")
        composite = self._composite
        self._rules = _ext.op_rules(
            node_backward(self._vjp),
            None if composite is None else forward_tangents(composite),
            None if composite is None else vmap_rule(composite), self.__name__)
        return self._rules

    def __call__(self, *arrays, shapes=None):
        """The forward of `arrays`; with `shapes` (one shape, or None, an output), each
        output reshaped to its shape - inside the node, where there is one, as the reshapes
        of arrays the op made its rows are (an op on (batch, T, D) is then one node)."""
        with op_forward():
            out = self._forward(*arrays)
        single = isinstance(out, mx.array)
        if not _ext.any_tracer(*arrays):
            if shapes is None:
                return out
            outs = [o if s is None else o.reshape(s)
                    for o, s in zip([out] if single else out, shapes)]
            return outs[0] if single else type(out)(outs)
        rules = self._rules or self._made_rules()
        made = _ext.op_node(list(arrays), [out] if single else list(out), rules,
                            [] if shapes is None else [None if s is None else list(s)
                                                       for s in shapes])
        return made[0] if single else type(out)(made)


def op_function(forward):
    """Decorator: `forward` as an OpFunction (an op's kernel launch with its rules)."""
    return OpFunction(forward)


def node_backward(vjp):
    """_ext.op_node's and a replay's vjp (lists of arrays) calling an op's vjp in
    mx.custom_function's convention; a None gradient (an array not differentiated) is
    zeros."""
    def backward(primals, cotangents, outputs):
        one = len(outputs) == 1
        grads = vjp(tuple(primals), cotangents[0] if one else tuple(cotangents),
                    outputs[0] if one else tuple(outputs))
        grads = [grads] if isinstance(grads, mx.array) else list(grads)
        return [mx.zeros_like(p) if g is None else g for p, g in zip(primals, grads)]
    return backward


def forward_tangents(composite):
    """The replay's jvp: (primals, tangents aligned with them, None where absent) -> a list
    of output tangents, through jvp_rule."""
    rule = jvp_rule(composite)

    def forward(primals, tangents):
        out = rule(list(primals), list(tangents))
        return [out] if isinstance(out, mx.array) else list(out)
    return forward
