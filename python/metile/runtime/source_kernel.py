"""What `metile.metal_kernel` and `metile.cuda_kernel` share: a kernel given as
a source body plus MLX's call contract, and the checks that run before any
graph node is built."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence

import mlx.core as mx

# Metal's and CUDA's limit alike.
MAX_THREADS_PER_THREADGROUP = 1024


def as_array(value, name: str, op: str) -> mx.array:
    if isinstance(value, mx.array):
        return value
    # MLX's rule for scalar inputs: 0-d arrays of bool, int32 (int64 past it) or float32.
    if isinstance(value, bool):
        return mx.array(value, dtype=mx.bool_)
    if isinstance(value, int):
        # int32 where it fits, else int64, as MLX's own conversion (2**40 had wrapped to 0)
        if -2**31 <= value < 2**31:
            return mx.array(value, dtype=mx.int32)
        if -2**63 <= value < 2**63:
            return mx.array(value, dtype=mx.int64)
        raise ValueError(f"[{op}] input '{name}' = {value} does not fit in int64")
    if isinstance(value, float):
        return mx.array(value, dtype=mx.float32)
    try:
        return mx.array(value)
    except Exception:
        raise TypeError(
            f"[{op}] input '{name}' must be an mx.array or a Python scalar, got {type(value).__name__}"
        ) from None


def resolve_stream(stream, op: str) -> mx.Stream:
    if stream is None:
        return mx.default_stream(mx.default_device())
    if isinstance(stream, mx.Stream):
        return stream
    if isinstance(stream, mx.DeviceType):
        stream = mx.Device(stream)
    if isinstance(stream, mx.Device):
        return mx.default_stream(stream)
    raise TypeError(f"[{op}] stream must be an mx.Stream, mx.Device or None, got {stream!r}")


_INT32_MAX = 2**31 - 1


def _exact_key(grid, threadgroup, output_shapes, output_dtypes):
    """A launch geometry as a lookup key when it is made of plain ints only (10.0 == 10 and
    True == 1 must not find a checked entry), else None."""
    try:
        parts = (tuple(grid), tuple(threadgroup), *map(tuple, output_shapes))
    except TypeError:
        return None
    if not all(type(v) is int for p in parts for v in p):
        return None
    return (parts, tuple(output_dtypes))


class SourceKernel:
    """A kernel body in a GPU language with MLX's generated signature."""

    op = "kernel"  # error prefix, MLX style

    def __init__(self, name, input_names, output_names, source, header, ensure_row_contiguous):
        # The name becomes part of the generated function's name, so Metal and NVRTC
        # reject anything but an identifier's characters.
        if not isinstance(name, str) or not re.fullmatch(r"\w+", name):
            raise ValueError(self.error(f"name must be letters, digits and underscores (it names "
                                        f"the generated function), got {name!r}"))
        for what, value in (("input_names", input_names), ("output_names", output_names)):
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise TypeError(self.error(f"{what} must be a list of strings, got {value!r}"))
        for what, value in (("source", source), ("header", header)):
            if not isinstance(value, str):
                raise TypeError(self.error(f"{what} must be a string, got {type(value).__name__}"))
        if not output_names:
            raise ValueError(self.error("must specify at least one output"))
        names = list(input_names) + list(output_names)
        bad = [n for n in names if not str(n).isidentifier()]
        if bad:
            raise ValueError(self.error(f"input/output names must be identifiers, got {bad}"))
        if len(set(names)) != len(names):
            raise ValueError(self.error(f"input and output names must be distinct, got {names}"))
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.ensure_row_contiguous = ensure_row_contiguous
        self._checked: dict = {}   # launch geometries prepare_call has checked

    def error(self, message: str) -> str:
        return f"[{self.op}] {message}"

    def _dims(self, value, what: str) -> tuple[int, int, int]:
        # NumPy integers (anything with __index__ except bool) count as ints, as in MLX.
        if isinstance(value, Sequence) and not isinstance(value, str):
            value = tuple(operator.index(v) if hasattr(v, "__index__") and not isinstance(v, bool)
                          else v for v in value)
        if not isinstance(value, Sequence) or len(value) != 3 or \
                not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(self.error(f"{what} must be a tuple of three ints, got {value!r}"))
        if any(v < 0 for v in value):
            raise ValueError(self.error(f"{what} dimensions must be non-negative, got {tuple(value)}"))
        if any(v > _INT32_MAX for v in value):
            raise ValueError(self.error(f"{what} {tuple(value)} has a dimension above {_INT32_MAX}: "
                                        f"MLX takes {what} sizes as 32-bit ints"))
        return tuple(value)

    def checked_extras(self, template, init_value) -> tuple[list, float | None]:
        """`template` as a list of (name, value) pairs and `init_value` as a float,
        or an error naming what is wrong (values are checked by the backend)."""
        if template is None:
            template = []
        if isinstance(template, (str, bytes)) or not isinstance(template, Sequence):
            raise TypeError(self.error(f"template must be a list of (name, value) pairs, e.g. "
                                       f"[('T', mx.float32), ('N', 4)], got {template!r}"))
        for i, entry in enumerate(template):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(self.error(f"template must be a list of (name, value) pairs, e.g. "
                                           f"[('T', mx.float32), ('N', 4)]; entry {i} is {entry!r}"))
            if not isinstance(entry[0], str) or not entry[0].isidentifier():
                raise TypeError(self.error(f"template entry {i} has name {entry[0]!r}; a template "
                                           f"parameter name must be an identifier string"))
            value = entry[1]
            if isinstance(value, int) and not isinstance(value, bool) and \
                    not -2**31 <= value < 2**31:
                # (the generated entry's template call failed with a message about
                # metile's code, not the argument)
                raise ValueError(self.error(f"template argument {entry[0]}={value} does not fit "
                                            f"in the int (32 bits) an integer template "
                                            f"parameter is"))
        if init_value is not None and (isinstance(init_value, bool) or
                                       not isinstance(init_value, (int, float))):
            raise TypeError(self.error(f"init_value must be a number (every output element starts "
                                       f"at it) or None, got {type(init_value).__name__} "
                                       f"{init_value!r}"))
        return [tuple(e) for e in template], None if init_value is None else float(init_value)

    def prepare_call(self, inputs, output_shapes, output_dtypes, grid, threadgroup):
        """Checked (inputs as arrays, grid, threadgroup, output shapes).  A repeated
        launch geometry (plain tuples of ints, as metile's own launches pass) was checked
        the first time: it is looked up, not checked again (eager launches pay for every
        microsecond here)."""
        if len(inputs) == len(self.input_names) and \
                all(type(x) is mx.array for x in inputs):
            key = _exact_key(grid, threadgroup, output_shapes, output_dtypes)
            hit = None if key is None else self._checked.get(key)
            if hit is not None:
                return list(inputs), hit[0], hit[1], hit[2]
            inputs, grid_c, tg_c, shapes = self._prepare_call(inputs, output_shapes,
                                                              output_dtypes, grid, threadgroup)
            if key is not None and len(self._checked) < 64:
                self._checked[key] = (grid_c, tg_c, shapes)
            return inputs, grid_c, tg_c, shapes
        return self._prepare_call(inputs, output_shapes, output_dtypes, grid, threadgroup)

    def _prepare_call(self, inputs, output_shapes, output_dtypes, grid, threadgroup):
        if len(inputs) != len(self.input_names):
            raise ValueError(
                self.error(f"expected `inputs` to have size {len(self.input_names)} but got size {len(inputs)}")
            )
        inputs = [as_array(x, n, self.op) for x, n in zip(inputs, self.input_names)]
        for what, seq in (("output_shapes", output_shapes), ("output_dtypes", output_dtypes)):
            if len(seq) != len(self.output_names):
                raise ValueError(
                    self.error(f"expected `{what}` to have size {len(self.output_names)} but got size {len(seq)}")
                )
        grid = self._dims(grid, "grid")
        threadgroup = self._dims(threadgroup, "threadgroup")
        if 0 in threadgroup:
            raise ValueError(self.error(f"threadgroup dimensions must be positive, got {threadgroup}"))
        threads = 1
        for g, t in zip(grid, threadgroup):
            threads *= min(g, t) if g else t
        if threads > MAX_THREADS_PER_THREADGROUP:
            raise ValueError(
                self.error(
                    f"threadgroup {threadgroup} has {threads} threads; the GPU allows at most "
                    f"{MAX_THREADS_PER_THREADGROUP} threads per threadgroup"
                )
            )
        for name, d in zip(self.output_names, output_dtypes):
            if not isinstance(d, mx.Dtype):
                raise TypeError(self.error(f"output_dtypes entry for {name!r} must be an mx.Dtype "
                                           f"(e.g. mx.float32), got {type(d).__name__} {d!r}"))
        for name, s in zip(self.output_names, output_shapes):
            if isinstance(s, str) or not isinstance(s, Sequence) or not all(
                    hasattr(d, "__index__") and not isinstance(d, bool) for d in s):
                raise TypeError(self.error(f"output_shapes entry for {name!r} must be a tuple of "
                                           f"ints, got {s!r}"))
        shapes = [[operator.index(d) for d in s] for s in output_shapes]
        for s in shapes:
            if any(d < 0 for d in s):
                raise ValueError(self.error(f"output shape {s} has a negative dimension"))
        return inputs, grid, threadgroup, shapes
