"""Buffer roles and store coverage.

`buffer_roles` — which buffer parameters a kernel loads from and stores to.
The launch API turns stored-to parameters into outputs.

`store_coverage` — for each output, a rule under which the kernel provably
writes every element, so the launch can skip preserving the passed array's
contents.  The recognised form is the canonical 1-D block store

    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(Out + offs, value[, mask=offs < n])

as the only store to `Out`, at the top level of the kernel (not under an if
or a loop) and with `Out` never loaded; and, under the same conditions, an unmasked
`store(Out, value)`, which covers a one-element `Out`.  It covers [0, grid[0] * BLOCK)
intersected with [0, n); the launch checks `grid[0] * BLOCK >= Out.size` and
`n >= Out.size` against the actual arguments.  The 2-D form (a GEMM's output
tile, pointer or tensor-view spelling alike)

    rows = program_id(a) * BM + arange(0, BM)      (along tile dim 0)
    cols = program_id(b) * BN + arange(0, BN)      (along tile dim 1)
    store(Out + rows[:, None] * S + cols[None, :], value, mask=(rows < M) & (cols < N))

writes exactly [0, M * N) when S == N; the launch checks S == N, both grid
axes cover M and N, and M * N >= Out.size.  A block of one row may be spelled
`program_id(a) + arange(0, 1)` (a GEMV's one output row per program).  Any other store pattern is
conservatively "not proven" (the launch then preserves unwritten elements).

The same rules bound the elements an access reaches (`last_index`), which the launch
checks against the array (runtime/dispatch.py `_refuse_overruns`).  A mixed-radix offset
plus a term of no index (`Out + offs + 1`, `X + offs + base`) keeps its rule with that
term as a shift: the range it reaches moves (`first_index` may fall below 0), and it proves
coverage only where the shift is 0 at launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Function, Op, Value, walk
from ..errors import CompilationError
from ..ir.types import PointerType, dtype_of, elem_type


@dataclass(frozen=True)
class Coverage:
    block: int              # elements per program along grid axis 0
    bound: str | None       # scalar parameter n in `mask = offs < n`, or None (no mask)
    bound_const: int | None = None

    def to_json(self) -> list:
        return ["1d", self.block, self.bound, self.bound_const]

    def covers(self, grid: tuple, size: int, args: dict) -> bool:
        grid0 = grid[0]
        if grid0 * self.block < size:
            return False
        if self.bound is not None:
            n = args.get(self.bound)
            return isinstance(n, int) and n >= size
        if self.bound_const is not None:
            return self.bound_const >= size
        return True

    def last_index(self, grid: tuple, args: dict) -> int | None:
        """The highest element the access (a store, or a load: load_extents) reaches at
        this launch (None: none, or a bound whose value the launch does not know)."""
        end = grid[0] * self.block
        if self.bound is not None:
            n = args.get(self.bound)
            if not isinstance(n, int) or isinstance(n, bool):
                return None
            end = min(end, n)
        elif self.bound_const is not None:
            end = min(end, self.bound_const)
        return end - 1 if end > 0 else None


@dataclass(frozen=True)
class FirstElementCoverage:
    """`store(Out, value)` unmasked: every program writes element 0, which is the whole
    output when it has one element (a kernel's scalar result)."""

    def to_json(self) -> list:
        return ["first"]

    def covers(self, grid: tuple, size: int, args: dict) -> bool:
        return size <= 1 and all(g >= 1 for g in grid)

    def last_index(self, grid: tuple, args: dict) -> int | None:
        return 0 if all(g >= 1 for g in grid) else None


Scalar = "int | str"  # a constant, or the name of a runtime scalar parameter


def _value(s, args: dict):
    return s if isinstance(s, int) else args.get(s)


@dataclass(frozen=True)
class TileCoverage:
    """The 2-D tile store of the module docstring."""

    axes: tuple[int, int]       # program_id axis of the row and column index
    blocks: tuple[int, int]     # BM, BN
    bounds: tuple              # M, N (Scalar)
    row_stride: object         # S (Scalar)

    def to_json(self) -> list:
        return ["2d", list(self.axes), list(self.blocks), list(self.bounds), self.row_stride]

    def covers(self, grid: tuple, size: int, args: dict) -> bool:
        m, n, s = (_value(b, args) for b in (*self.bounds, self.row_stride))
        if not all(isinstance(x, int) for x in (m, n, s)) or s != n:
            return False
        if m <= 0 or n <= 0:   # the mask writes nothing (two negatives multiply to > 0)
            return size == 0
        (ra, ca), (bm, bn) = self.axes, self.blocks
        return grid[ra] * bm >= m and grid[ca] * bn >= n and m * n >= size

    def last_index(self, grid: tuple, args: dict) -> int | None:
        m, n, s = (_value(b, args) for b in (*self.bounds, self.row_stride))
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (m, n, s)):
            return None
        (ra, ca), (bm, bn) = self.axes, self.blocks
        rows, cols = min(m, grid[ra] * bm), min(n, grid[ca] * bn)
        if rows <= 0 or cols <= 0 or s < 0:
            return None
        return (rows - 1) * s + cols - 1


def _symbol(name: str, grid: tuple, args: dict) -> int | None:
    """A coefficient's symbol at launch: `num_programs(axis)` ("grid:axis") or a runtime int
    scalar by name (None where the launch's value is not an int)."""
    if name.startswith("grid:"):
        axis = int(name[5:])
        return grid[axis] if axis < len(grid) else 1
    v = args.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class RadixCoverage:
    """A store whose offset is a sum of independent digits, each an index times a
    coefficient: a program id (radix: the grid along its axis), an `arange(0, B)` (radix
    B, or its bound where the mask says `arange < bound`) or a block index `program_id(a)
    * B + arange(0, B)` masked by `index < bound` (radix the bound; the grid must reach
    it).  Coefficients are products of constants, runtime int scalars and
    `num_programs(axis)`.  At launch the digits, sorted by coefficient and leaving out
    those of radix 1, must form a mixed-radix number - the first coefficient 1, each next
    one the previous times its radix - reaching at least the output's size: then every
    element in between is written exactly once per program set, e.g. attention's
    `Out + (batch * heads + head) * L * D + rows[:, None] * D + d[None, :]` with
    `rows < L`."""

    digits: tuple   # (kind, coef, data): kind "pid" (axis,), "arange" (block, bound),
                    # "block" (axis, block, bound); coef (int, (symbols...))
    # a term of no index added to every element's offset (`Out + offs + 1`, `X + offs +
    # base`): it moves the accessed range, so the overrun check (first_index, last_index)
    # sees it; coverage is proven only where its value is 0
    shift: tuple = (0, ())

    def to_json(self) -> list:
        return ["radix", [[k, [c[0], list(c[1])], list(d)] for k, c, d in self.digits],
                [self.shift[0], list(self.shift[1])]]

    def _shift(self, grid: tuple, args: dict) -> int | None:
        const, syms = self.shift
        for sym in syms:
            v = _symbol(sym, grid, args)
            if v is None:
                return None
            const *= v
        return const

    def _digits(self, grid: tuple, args: dict) -> list | None:
        """Per digit (coefficient, extent, bound) at these launch values - the extent the
        index spans, the bound its mask keeps it under (the extent where unmasked); None
        where a value is not a known int."""
        def programs(axis: int) -> int:
            return grid[axis] if axis < len(grid) else 1

        def value(s):
            return s if isinstance(s, int) else _symbol(s, grid, args)

        out = []
        for kind, (const, syms), data in self.digits:
            coef = const
            for sym in syms:
                v = value(sym)
                if v is None:
                    return None
                coef *= v
            if kind == "pid":
                extent = bound = programs(data[0])
            else:
                extent = data[0] if kind == "arange" else programs(data[0]) * data[1]
                bound = extent if data[-1] is None else value(data[-1])
                if bound is None:
                    return None
            out.append((coef, extent, bound))
        return out

    def covers(self, grid: tuple, size: int, args: dict) -> bool:
        digits = self._digits(grid, args)
        if digits is None or self._shift(grid, args) != 0:
            return False
        chain = []
        for coef, extent, bound in digits:
            if bound > extent:
                return False
            radix = bound
            if radix <= 0:
                return size == 0
            if radix > 1:
                chain.append((coef, radix))
        chain.sort()
        reach = 1
        for coef, radix in chain:
            if coef != reach:
                return False
            reach *= radix
        return reach >= size

    def _span(self, grid: tuple, args: dict) -> tuple | None:
        """(first, last) element the access reaches at this launch, or None (nothing
        accessed, a value not known, or a negative coefficient)."""
        digits, shift = self._digits(grid, args), self._shift(grid, args)
        if digits is None or shift is None:
            return None
        last = 0
        for coef, extent, bound in digits:
            count = min(extent, bound)
            if count <= 0:
                return None      # nothing written
            if coef < 0:
                return None      # (not a form the analysis proves anything of)
            last += coef * (count - 1)
        return shift, shift + last

    def last_index(self, grid: tuple, args: dict) -> int | None:
        span = self._span(grid, args)
        return None if span is None else span[1]

    def first_index(self, grid: tuple, args: dict) -> int | None:
        span = self._span(grid, args)
        return None if span is None else span[0]


def coverage_from_json(data: list):
    if data[0] == "first":
        return FirstElementCoverage()
    if data[0] == "radix":
        shift = (data[2][0], tuple(data[2][1])) if len(data) > 2 else (0, ())
        return RadixCoverage(tuple((k, (c[0], tuple(c[1])), tuple(d)) for k, c, d in data[1]),
                             shift)
    if data[0] == "2d":
        return TileCoverage(tuple(data[1]), tuple(data[2]), tuple(data[3]), data[4])
    return Coverage(*data[1:])


def _root(v: Value) -> PointerType | None:
    e = elem_type(v.type)
    return e if isinstance(e, PointerType) else None


def buffer_roles(fn: Function) -> tuple[set[str], set[str]]:
    """(loaded roots, stored roots) among device buffer parameters."""
    loaded, stored = set(), set()
    for op in walk(fn.body):
        if op.name in ("load", "store", "frag_view_load", "frag_view_store"):
            p = _root(op.operands[0])
            if p is not None and p.space == "device":
                (loaded if op.name.endswith("load") else stored).add(p.root)
    return loaded, stored


def defining_op(v: Value) -> Op | None:
    return v.owner if isinstance(v.owner, Op) else None


def strip_broadcasts(v: Value) -> Value:
    """Look through splat/broadcast (they do not change which elements are addressed)."""
    while (op := defining_op(v)) is not None and op.name in ("splat", "broadcast"):
        v = op.operands[0]
    return v


def block_offsets(v: Value) -> int | None:
    """BLOCK if v == program_id(0) * BLOCK + arange(0, BLOCK) (either operand order)."""
    op = defining_op(v)
    if op is None or op.name != "add":
        return None
    for a, b in (op.operands, op.operands[::-1]):
        ar, base = defining_op(strip_broadcasts(a)), defining_op(strip_broadcasts(b))
        if ar is None or ar.name != "arange" or ar.attrs["start"] != 0 or base is None:
            continue
        block = ar.attrs["end"]
        if base.name != "mul":
            continue
        x, y = base.operands
        for pid, c in ((x, y), (y, x)):
            p, k = defining_op(pid), defining_op(c)
            if p is not None and p.name == "program_id" and p.attrs["axis"] == 0 \
                    and k is not None and k.name == "const" and k.attrs["value"] == block:
                return block
    return None


def _layout(v: Value) -> tuple[int, int] | None:
    """(tile dim, block) of `arange(0, B)`, possibly moved by expand_dims/broadcast."""
    op = defining_op(v)
    if op is None:
        return None
    if op.name == "arange":
        return (0, op.attrs["end"]) if op.attrs["start"] == 0 else None
    if op.name == "broadcast":
        return _layout(op.operands[0])
    if op.name == "expand_dims":
        inner = _layout(op.operands[0])
        if inner is None:
            return None
        return (inner[0] + (1 if op.attrs["axis"] <= inner[0] else 0), inner[1])
    return None


def _index(v: Value) -> tuple[int, int, int] | None:
    """(tile dim, block, program axis) if v == program_id(axis) * B + arange(0, B) along a dim,
    possibly moved by expand_dims/broadcast afterwards (Triton's `rows[:, None]` of
    `rows = pid * B + arange(0, B)`) as well as before."""
    op = defining_op(v)
    while op is not None and op.name == "broadcast":
        op = defining_op(op.operands[0])
    if op is not None and op.name == "expand_dims":
        inner = _index(op.operands[0])
        if inner is None:
            return None
        return (inner[0] + (1 if op.attrs["axis"] <= inner[0] else 0), inner[1], inner[2])
    if op is None or op.name != "add":
        return None
    for a, b in (op.operands, op.operands[::-1]):
        lay, base = _layout(a), defining_op(strip_broadcasts(b))
        if lay is not None and lay[1] == 1 and base is not None and base.name == "program_id":
            # program_id(axis) + arange(0, 1): a block of one, spelled without "* 1"
            return (lay[0], 1, base.attrs["axis"])
        if lay is None or base is None or base.name != "mul":
            continue
        for pid, c in (base.operands, base.operands[::-1]):
            p, k = defining_op(pid), defining_op(c)
            if p is not None and p.name == "program_id" and k is not None and k.name == "const" \
                    and k.attrs["value"] == lay[1]:
                return (lay[0], lay[1], p.attrs["axis"])
    return None


def _widening(op: Op | None) -> bool:
    """A cast that keeps every integer's value (int32 -> int64, uint32 -> int64, ...):
    `program_id(0).to(int64) * BLOCK + arange(0, BLOCK)` indexes what its int32 form does."""
    if op is None or op.name != "cast" or op.attrs.get("bitcast"):
        return False
    src, dst = dtype_of(op.operands[0].type), op.attrs.get("to")
    if src is None or dst is None or not (src.is_int and dst.is_int):
        return False
    return dst.bits >= src.bits if src.kind == dst.kind else \
        (src.kind == "u" and dst.kind == "i" and dst.bits > src.bits)


def _uncast(v: Value) -> Value:
    """v with broadcasts and value-keeping integer casts looked through."""
    while (op := defining_op(v)) is not None and \
            (op.name in ("splat", "broadcast") or _widening(op)):
        v = op.operands[0]
    return v


def _scalar(v: Value, params: dict):
    v = _uncast(v)
    if id(v) in params:
        return params[id(v)]
    op = defining_op(v)
    if op is not None and op.name == "const" and isinstance(op.attrs["value"], int):
        return op.attrs["value"]
    return None


def _terms(v: Value, params: dict) -> list | None:
    """v as a sum of (index, coefficient) terms (+ zero constants), or None."""
    idx = _index(v)
    if idx is not None:
        return [(idx, 1)]
    op = defining_op(v)
    if op is None:
        return None
    if op.name == "broadcast":
        return _terms(op.operands[0], params)
    if op.name == "add":
        parts = [_terms(x, params) for x in op.operands]
        return None if None in parts else parts[0] + parts[1]
    if op.name == "splat" and _scalar(v, params) == 0:
        return []
    if op.name == "mul":
        for x, c in (op.operands, op.operands[::-1]):
            inner, coef = _terms(x, params), _scalar(c, params)
            if inner is not None and len(inner) == 1 and inner[0][1] == 1 and coef is not None:
                return [(inner[0][0], coef)]
    return None


def _bounds(mask: Value, params: dict) -> dict | None:
    """{index: bound} for mask == (index < bound) & ... (broadcasts looked through)."""
    op = defining_op(mask)
    if op is None:
        return None
    if op.name == "broadcast":
        return _bounds(op.operands[0], params)
    if op.name == "expand_dims":
        # a row or column mask formed first and expanded after (`cols_in[None, :]` of
        # `cols_in = cols < N`): its index moves with the new axis, as in _index
        inner = _bounds(op.operands[0], params)
        if inner is None:
            return None
        axis = op.attrs["axis"]
        return {(dim + (1 if axis <= dim else 0), block, pid): bound
                for (dim, block, pid), bound in inner.items()}
    if op.name == "and":
        parts = [_bounds(x, params) for x in op.operands]
        # two bounds on one index: which is smaller is known only at launch, and a dict
        # would keep one of them (the store writes below the smaller) - no proof
        if None in parts or set(parts[0]) & set(parts[1]):
            return None
        return {**parts[0], **parts[1]}
    if op.name == "lt":
        idx, bound = _index(op.operands[0]), _scalar(op.operands[1], params)
        return None if idx is None or bound is None else {idx: bound}
    return None


def _tile_coverage(offsets: list[Value], mask: Value | None, params: dict) -> TileCoverage | None:
    """The 2-D tile a store covers when its offsets (one per pointer add, e.g. Triton's
    `Y + rows[:, None] * N + cols[None, :]`) sum to row * stride + column."""
    terms = []
    for offs in offsets:
        part = _terms(offs, params)
        if part is None:
            return None
        terms += part
    if mask is None or len(terms) != 2:
        return None
    by_dim = {idx[0]: (idx, coef) for idx, coef in terms}
    bounds = _bounds(mask, params)
    if set(by_dim) != {0, 1} or bounds is None:
        return None
    (row, stride), (col, unit) = by_dim[0], by_dim[1]
    # exactly the row and the column bound: a conjunct on any other index (a gate, a
    # program id of a third axis) turns stores off that the proof would count
    if unit != 1 or row[2] == col[2] or set(bounds) != {row, col}:
        return None
    return TileCoverage((row[2], col[2]), (row[1], col[1]), (bounds[row], bounds[col]), stride)


def _times(a: tuple, b: tuple) -> tuple:
    return (a[0] * b[0], tuple(sorted(a[1] + b[1])))


def _expanded(index: dict, axis: int) -> dict:
    """A _linear form after expand_dims(axis): its aranges' tile dims move past the new one."""
    return {(a if a[0] != "arange" else ("arange", a[1] + (1 if axis <= a[1] else 0), a[2])): c
            for a, c in index.items()}


def _linear(v: Value, params: dict) -> dict | None:
    """v (a scalar or tile of int32 index arithmetic) as {atom: coefficient}: atoms
    ("pid", axis, order, reversed) (a program id, or with `order` one of swizzle2d's
    results that permute the grid - frontend/shape_ops.py - and `reversed` for either as
    `num_programs(axis) - 1 - it`: each takes every value in [0, grid[axis]) as the program
    id does, but a reversed index is another index - a mask on one bounds the other's
    complement, not itself),
    ("arange", dim, block) (its tile dim after expand_dims), ("one",); coefficients (int,
    (symbols...)) with runtime int scalars by name and num_programs as "grid:axis".  None
    where v is anything else (a product of two indices, a division, a load...)."""
    if _widening(defining_op(v)):
        return _linear(defining_op(v).operands[0], params)
    if id(v) in params:
        return {("one",): (1, (params[id(v)],))}
    op = defining_op(v)
    if op is None:
        return None
    name = op.name
    if op.attrs.get("program_order"):
        a, b, k, serial = op.attrs["program_order"]
        return {("pid", b if k else a, (a, b, serial), False): (1, ())}
    if name == "sub":
        # num_programs(axis) - 1 - x for x a program index of that axis: the same range
        top, x = op.operands
        top_op, inner = defining_op(top), _linear(x, params)
        if top_op is not None and top_op.name == "sub" and inner is not None and \
                len(inner) == 1 and (atom := next(iter(inner)))[0] == "pid" and \
                inner[atom] == (1, ()) and \
                _linear(top_op.operands[0], params) == {("one",): (1, (f"grid:{atom[1]}",))} \
                and _linear(top_op.operands[1], params) == {("one",): (1, ())}:
            return {(*atom[:3], not atom[3]): (1, ())}
        return None
    if name in ("broadcast", "splat"):
        return _linear(op.operands[0], params)
    if name == "expand_dims":
        inner = _linear(op.operands[0], params)
        return None if inner is None else _expanded(inner, op.attrs["axis"])
    if name == "const":
        value = op.attrs["value"]
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        return {} if value == 0 else {("one",): (value, ())}
    if name == "program_id":
        return {("pid", op.attrs["axis"], None, False): (1, ())}
    if name == "num_programs":
        return {("one",): (1, (f"grid:{op.attrs['axis']}",))}
    if name == "arange":
        return {("arange", 0, op.attrs["end"]): (1, ())} if op.attrs["start"] == 0 else None
    if name == "add":
        a, b = (_linear(x, params) for x in op.operands)
        if a is None or b is None or set(a) & set(b):
            return None
        return {**a, **b}
    if name == "mul":
        a, b = (_linear(x, params) for x in op.operands)
        if a is None or b is None:
            return None
        for x, y in ((a, b), (b, a)):
            if set(y) == {("one",)}:
                return {atom: _times(c, y[("one",)]) for atom, c in x.items()}
            if not y:
                return {}
    return None


def _linear_bounds(mask: Value, params: dict) -> list | None:
    """[(index as _linear, bound)] for mask == (index < bound) & ..., or None."""
    op = defining_op(mask)
    if op is None:
        return None
    if op.name == "broadcast":
        return _linear_bounds(op.operands[0], params)
    if op.name == "expand_dims":
        inner = _linear_bounds(op.operands[0], params)
        return None if inner is None else [(_expanded(index, op.attrs["axis"]), bound)
                                           for index, bound in inner]
    if op.name == "and":
        parts = [_linear_bounds(x, params) for x in op.operands]
        return None if None in parts else parts[0] + parts[1]
    if op.name == "lt":
        index, bound = _linear(op.operands[0], params), _scalar(op.operands[1], params)
        return None if index is None or bound is None else [(index, bound)]
    return None


def _radix_coverage(offsets: list[Value], mask: Value | None, params: dict):
    """RadixCoverage of a store at the sum of `offsets` under `mask`, or None."""
    total: dict = {}
    for offs in offsets:
        part = _linear(offs, params)
        if part is None or set(part) & set(total):
            return None
        total.update(part)
    # (a term of no index: the range moves by it; a mask on the moved index - `offs + 1 <
    # n` - bounds no digit below, so no rule)
    shift = total.pop(("one",), (0, ()))
    bounds = [] if mask is None else _linear_bounds(mask, params)
    if bounds is None:
        return None
    digits, used = [], []
    for index, bound in bounds:
        ars = [a for a in index if a[0] == "arange"]
        pids = [a for a in index if a[0] == "pid"]
        if len(ars) != 1 or len(index) != 1 + len(pids) or len(pids) > 1 or \
                index[ars[0]] != (1, ()) or ars[0] not in total:
            return None
        ar = ars[0]
        coef = total.pop(ar)
        if not pids:
            digits.append(("arange", coef, (ar[2], bound)))
            continue
        pid = pids[0]
        if index[pid] != (ar[2], ()) or total.get(pid) != _times(coef, (ar[2], ())):
            return None
        del total[pid]
        digits.append(("block", coef, (pid[1], ar[2], bound)))
        used.append(pid)
    for atom, coef in total.items():
        digits.append(("pid", coef, (atom[1],)) if atom[0] == "pid" else
                      ("arange", coef, (atom[2], None)))
        if atom[0] == "pid":
            used.append(atom)
    # each grid axis once; a swizzled pair's axes only through that pair's results (the
    # pair permutes the grid; one of its results beside the other axis' program id does not)
    axes = {atom[1]: atom[2] for atom in used}
    if len(axes) != len(used) or any(
            order is not None and any(axes.get(x, order) != order for x in order[:2])
            for order in axes.values()):
        return None
    return RadixCoverage(tuple(digits), shift)


def order_dependent(fn: Function, outputs: list[str]) -> dict:
    """The outputs whose contents may depend on the order a program's threads run in
    (output -> None: the CPU runtime's race check skips them): float atomics' buffers
    (each order rounds the sum another way) and every output storing a value derived from
    an atomic's old value (each order hands the old values out differently) or from a plain
    load of a buffer atomics update (what it reads depends on which atomics came first)."""
    ops = list(walk(fn.body))
    atomic = atomic_buffers(fn)
    derived = {r.id for op in ops if op.name == "store" and op.attrs.get("atomic")
               or op.name == "load" and getattr(_root(op.operands[0]), "root", None) in atomic
               for r in op.results}
    for _ in range(2):   # (values carried through loops and branches, approximately)
        for op in ops:
            if any(o.id in derived for o in op.operands):
                derived.update(r.id for r in op.results)
                for region in op.regions:
                    derived.update(a.id for a in region.args)
    out = {}
    for op in ops:
        if op.name != "store" or len(op.operands) < 2:
            continue
        ptr = elem_type(op.operands[0].type)
        root = getattr(ptr, "root", None)
        if root in outputs and ((op.attrs.get("atomic") and ptr.dtype.is_float)
                                or op.operands[1].id in derived):
            out[root] = None
    return out


def atomic_roots(fn: Function) -> dict[str, Op]:
    """Device buffers whose atomics add from zero, each with its first atomic.

    A buffer updated only with atomic_add whose old values go unused starts at zero
    and its result is the passed array plus the added values (runtime/dispatch.py).
    Any other atomic buffer (max, min, xchg, cas, and, or, xor, mixed kinds, or an
    old value used) is left out: it is an ordinary tracked output whose elements the
    lowering initialises from the passed contents at their first atomic (lower_tiles
    `atomic_init`), so every old value and the result are Triton's.  An atomic buffer
    may also be read with a plain load (Triton's layer-norm backward reads its lock
    buffer's counter so): a relaxed read of the element's current contents, copied in
    first like an atomic's (lower_tiles `emit_load`), so such a buffer starts from its
    passed contents too.  A plain store to it is refused (CompilationError at the store):
    it would race with the atomics and bypass the copy-in.  Atomics in dot and
    simdgroup_inline kernels are refused here."""
    atomic: dict[str, list[Op]] = {}
    used: set[int] = set()
    for op in walk(fn.body):
        used.update(v.id for v in op.operands)
        if op.name == "store" and op.attrs.get("atomic") and (p := _root(op.operands[0])):
            atomic.setdefault(p.root, []).append(op)
    read: set[str] = set()
    for op in walk(fn.body):
        if op.name not in ("load", "store", "frag_view_load", "frag_view_store") or \
                op.attrs.get("atomic") or not (p := _root(op.operands[0])) or \
                p.root not in atomic:
            continue
        if op.name == "load":
            read.add(p.root)
        elif op.name == "store":
            raise CompilationError(f"buffer {p.root!r} is updated with atomics and also stored "
                                   "to in this kernel; write it with metile.atomic_xchg (its "
                                   "old value unused) where it takes atomics", op.loc)
        else:
            kind = "loaded" if op.name.endswith("load") else "stored to"
            raise CompilationError(f"buffer {p.root!r} is updated with atomics and also {kind} "
                                   "as matrix fragments in this kernel; a buffer takes either "
                                   "atomics or fragment accesses", op.loc)
    if atomic:
        first = next(iter(atomic.values()))[0]
        why = ("kernels with dot" if any(op.name == "dot" for op in walk(fn.body)) else
               "simdgroup_inline kernels" if fn.meta.get("fragments") else None)
        if why:
            raise CompilationError(f"atomic_{first.attrs['atomic']} is not supported in {why}",
                                   first.loc)
    return {root: ops[0] for root, ops in atomic.items() if root not in read and
            all(op.attrs["atomic"] == "add" and op.results[0].id not in used for op in ops)}


def atomic_buffers(fn: Function) -> set[str]:
    """Device buffers the kernel updates with atomics (a plain load of one is a relaxed
    atomic read: lower_tiles `emit_load`, uniformity)."""
    return {p.root for op in walk(fn.body)
            if op.name == "store" and op.attrs.get("atomic") and (p := _root(op.operands[0]))}


def atomic_init_roots(fn: Function) -> set[str]:
    """Atomic buffers initialised from the passed contents (see atomic_roots)."""
    return atomic_buffers(fn) - set(atomic_roots(fn))


def _access_rule(ptr_value: Value, mask: Value | None, params: dict):
    """The rule (Coverage, TileCoverage, RadixCoverage or FirstElementCoverage) giving the
    elements an access at `ptr_value` under `mask` addresses, or None where its pattern is
    not one of the module docstring's."""
    if id(ptr_value) in params and mask is None:
        return FirstElementCoverage()
    ptr = defining_op(ptr_value)
    if ptr is None or ptr.name != "ptr_add":
        return None
    base, offs = ptr.operands
    offsets = [offs]
    base = strip_broadcasts(base)
    while (inner := defining_op(base)) is not None and inner.name == "ptr_add":
        offsets.append(inner.operands[1])
        base = strip_broadcasts(inner.operands[0])
    if id(base) not in params:
        return None
    block = block_offsets(offs) if len(offsets) == 1 else None
    if block is None:
        return _tile_coverage(offsets, mask, params) or _radix_coverage(offsets, mask, params)
    if mask is None:
        return Coverage(block, None)
    m = defining_op(mask)
    # (an int64 bound - a Python int of 2**31 or more - compares offs.to(int64): the
    # same elements)
    if m is None or m.name != "lt" or _uncast(m.operands[0]) is not offs:
        return None
    bound = _scalar(m.operands[1], params)   # a scalar parameter's name, or an int constant
    if bound is None:
        return None
    return Coverage(block, bound) if isinstance(bound, str) else Coverage(block, None, bound)


def _params(fn: Function) -> dict:
    return {id(p.value): p.name for p in fn.params if p.value is not None}


def store_coverage(fn: Function, loaded: set[str]) -> dict:
    stores: dict[str, list[Op]] = {}
    for op in walk(fn.body):
        if op.name == "store" and not op.attrs.get("atomic") and \
                (p := _root(op.operands[0])) and p.space == "device":
            stores.setdefault(p.root, []).append(op)
    top = {id(op) for op in fn.body.ops}
    params = _params(fn)
    out: dict = {}   # root -> Coverage | TileCoverage | FirstElementCoverage
    for root, ops in stores.items():
        if root in loaded or len(ops) != 1 or id(ops[0]) not in top:
            continue
        store = ops[0]
        rule = _access_rule(store.operands[0], store.operands[2] if len(store.operands) == 3
                            else None, params)
        if rule is not None:
            out[root] = rule
    return out


def load_extents(fn: Function) -> dict:
    """{buffer: [rule, ...]}: for each load at the kernel's top level (which every program
    runs, so a load past its buffer there is a read out of bounds whatever the data) whose
    pattern is one of the module docstring's, the rule whose `last_index` bounds the
    elements it reads.  The launch refuses a bound or grid that reaches past the input
    (runtime/dispatch.py), as it does for stores.  Loads under a branch or in a loop, or of
    another pattern, are not recorded (a guard may keep them in bounds); nor, in a kernel
    with a matrix product, is a load that is not a product's operand: a fused GEMM epilogue
    reads it under the store's mask as well as its own (passes/gemm_epilogue_reads.py), so
    `C0 + rows * N + cols`, unmasked or masked on one axis, reads only what the store
    writes."""
    params = _params(fn)
    ops = list(walk(fn.body))
    operands = None
    if any(op.name == "dot" for op in ops):
        # values a product multiplies, through the unary ops that pass a tile on
        operands = {v.id for op in ops if op.name == "dot" for v in op.operands[:2]}
        for op in reversed(ops):
            if op.name in ("cast", "trans", "broadcast", "expand_dims", "reshape") and \
                    op.results and op.results[0].id in operands:
                operands.add(op.operands[0].id)
    out: dict = {}
    for op in fn.body.ops:
        if op.name != "load" or not (p := _root(op.operands[0])) or p.space != "device" \
                or (operands is not None and op.results[0].id not in operands):
            continue
        rule = _access_rule(op.operands[0], op.operands[1] if len(op.operands) == 3 else None,
                            params)
        if rule is not None and rule not in out.setdefault(p.root, []):
            out[p.root].append(rule)
    return {k: v for k, v in out.items() if v}
