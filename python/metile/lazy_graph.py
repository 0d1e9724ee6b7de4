"""What an unevaluated mx.array was computed by, read from MLX's graph export.

MLX 0.32 exposes no strides or producing primitive of an array to Python; the one
view of the lazy graph it offers is `mx.export_to_dot`, which names each
primitive and the arrays between them.  `ops.matmul` uses it to see that its right
operand is a transposed view (`w.T`) and read `w` in place; the tests use it to
count the copies a call puts into the graph.  An evaluated array has no graph
left (MLX detaches it), so it reads as a leaf whatever its layout.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import mlx.core as mx

_PRIMITIVE = re.compile(r'^\{ (\d+) \[label ="([^"]*)"')
_EDGE = re.compile(r'^("[^"]+"|\d+) -> ("[^"]+"|\d+)$')
_SINK = re.compile(r'^\{ rank=sink; ("[^"]+"); \}$')


@dataclass(frozen=True)
class Graph:
    labels: dict[str, str]            # primitive node -> primitive name
    producer: dict[str, str]          # array node -> primitive node that computes it
    inputs: dict[str, list[str]]      # primitive node -> its input array nodes
    outputs: list[str]                # the exported arrays' nodes

    def primitive_of(self, array_node: str) -> str | None:
        """The name of the primitive that computes `array_node`; None for a leaf."""
        p = self.producer.get(array_node)
        return None if p is None else self.labels[p]

    def count(self, name: str) -> int:
        return sum(1 for label in self.labels.values() if label == name)

    def feeding(self, name: str, source: str) -> int:
        """How many `name` primitives take an array computed by a `source` primitive."""
        return sum(1 for p, label in self.labels.items() if label == name
                   and any(self.primitive_of(a) == source for a in self.inputs.get(p, [])))


def graph(*arrays: mx.array) -> Graph:
    buf = io.StringIO()
    mx.export_to_dot(buf, *arrays)
    labels, producer, inputs, outputs = {}, {}, {}, []
    for line in buf.getvalue().splitlines():
        line = line.strip()
        if m := _PRIMITIVE.match(line):
            labels[m.group(1)] = m.group(2)
        elif m := _SINK.match(line):
            outputs.append(m.group(1))
        elif m := _EDGE.match(line):
            src, dst = m.groups()
            if dst.startswith('"'):
                producer[dst] = src
            else:
                inputs.setdefault(dst, []).append(src)
    return Graph(labels, producer, inputs, outputs)


def is_transposed_view(b: mx.array) -> bool:
    """True if the 2-D `b` is, unevaluated, a Transpose of another array: then `b.T`
    is that array's own layout (no copy when it is row-major), where `b` itself would
    be copied to row-major by a custom-kernel call.  Read from the array's own primitive
    through metile's C++ layer (the graph export walked all of b's lazy graph: about a
    third of an eager ops.matmul's host time)."""
    from . import _ext

    return b.ndim == 2 and _ext.primitive_name(b) == "Transpose"
