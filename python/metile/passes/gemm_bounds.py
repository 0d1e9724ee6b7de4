"""prove_gemm_bounds: which GEMM staging loads are provably in bounds, and which
are provably 4-aligned.

An explicit Schedule specializes the launch's integer scalars, so the extents
(M, N, K and the leading dimensions) are known numbers.  This pass evaluates
each staging load's mask one conjunct at a time (`a & b & ...`, looking
through broadcasts) with integer interval arithmetic under *facts* about the
variables a staging copy depends on:

* the K induction variable: a **complete** K iteration has
  `k in [lo, k_full - BK]` (so `k + BK <= K`); the **remainder** iteration is
  `k = k_full`;
* the program ids: an output tile is **interior** along axis a when
  `program_id(a) <= p_max[a]`, the largest id for which every conjunct that
  depends on that axis alone is proven.  The lowering tests this once per
  threadgroup (a uniform branch), so tiles past it keep their guards.

A conjunct is dropped only under facts that prove it for every element of
the tile; everything else is kept.  Proving the K conjuncts therefore never
removes a row/column check: an edge tile in a complete K iteration keeps its
row/column guards.

Alignment: a load's address is put in affine form over the tile coordinates,
k and the program ids (known scalars folded in).  It is 4-aligned when the
contiguous axis has coefficient 1 and its extent is a multiple of 4, and
every other term is a multiple of 4 for every value its variable can take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.core import Block, Function, Op, Value
from ..ir.types import TileType
from .gemm import GemmPattern

BIG = 2**31 - 1
_CMP = {"lt": lambda a, b: (a[1] < b[0], a[0] >= b[1]),
        "le": lambda a, b: (a[1] <= b[0], a[0] > b[1]),
        "gt": lambda a, b: (a[0] > b[1], a[1] <= b[0]),
        "ge": lambda a, b: (a[0] >= b[1], a[1] < b[0])}


@dataclass(frozen=True)
class Facts:
    """Ranges of the variables a staging copy depends on (inclusive bounds)."""

    k: tuple[int, int]
    pid: tuple[tuple[int, int], ...] = ((0, BIG), (0, BIG), (0, BIG))


@dataclass
class GemmBounds:
    """The proofs for one specialized GEMM (see the module docstring)."""

    lo: int                                  # K loop start
    k_extent: int                            # K loop end (known)
    step: int                                # K loop step (= BLOCK_K)
    p_max: dict[int, int]                    # axis -> last interior program id (-1: none)
    loads: list[Op]                          # the staging loads (operand order a, b)
    conjuncts: dict[int, list[Value]]        # id(load) -> mask conjuncts
    aligned: dict[int, bool] = field(default_factory=dict)   # id(load) -> 4-aligned
    fn: Function | None = None
    scalars: dict = field(default_factory=dict)
    iv: Value | None = None

    @property
    def k_full(self) -> int:
        """End of the complete iterations: lo + BK * floor((K - lo) / BK)."""
        return self.lo + max(0, (self.k_extent - self.lo) // self.step) * self.step

    @property
    def n_full(self) -> int:
        return (self.k_full - self.lo) // self.step

    @property
    def has_remainder(self) -> bool:
        return self.k_full < self.k_extent

    @property
    def interior_facts(self) -> Facts:
        return Facts((self.lo, self.k_full - self.step), self.tile_pids(True))

    @property
    def remainder_facts(self) -> Facts:
        return Facts((self.k_full, self.k_full), self.tile_pids(True))

    def tile_pids(self, interior: bool) -> tuple:
        return tuple((0, self.p_max.get(a, BIG)) if interior else (0, BIG) for a in range(3))

    @property
    def predicate_axes(self) -> dict[int, int]:
        """Axes whose interior test is a runtime comparison (0 <= p_max < BIG)."""
        return {a: p for a, p in self.p_max.items() if p < BIG}

    @property
    def any_interior_tile(self) -> bool:
        return all(p >= 0 for p in self.p_max.values())

    def remaining(self, load: Op, facts: Facts) -> list[Value]:
        """The conjuncts of `load`'s mask not proven under `facts`."""
        ev = Intervals(self.fn, self.scalars, self.iv, facts)
        return [c for c in self.conjuncts[id(load)] if ev.get(c) != (1, 1)]

    def with_edge(self, facts: Facts) -> Facts:
        return Facts(facts.k, self.tile_pids(False))


class Intervals:
    """Integer interval [lo, hi] of a tile-form value over all its elements; None
    when unknown.  Booleans are [0, 1] intervals ((1, 1): proven true)."""

    def __init__(self, fn: Function, scalars: dict, iv: Value, facts: Facts):
        self.params = {p.value.id: scalars.get(p.name) for p in fn.params if p.value is not None}
        self.iv, self.facts = iv, facts
        self.memo: dict[int, tuple | None] = {}

    def get(self, v: Value):
        if v.id not in self.memo:
            self.memo[v.id] = self._eval(v)
        return self.memo[v.id]

    def _eval(self, v: Value):
        if v is self.iv:
            return self.facts.k
        if v.id in self.params:
            x = self.params[v.id]
            return None if x is None or isinstance(x, bool) else (x, x)
        op = v.owner
        if not isinstance(op, Op):
            return None
        n = op.name
        if n == "const":
            x = op.attrs["value"]
            if isinstance(x, bool):
                return (int(x), int(x))
            return (x, x) if isinstance(x, int) else None
        if n == "program_id":
            return self.facts.pid[op.attrs.get("axis", 0)]
        if n == "arange":
            return (op.attrs["start"], op.attrs["end"] - 1)
        if n in ("splat", "broadcast", "expand_dims"):
            return self.get(op.operands[0])
        args = [self.get(o) for o in op.operands]
        if any(a is None for a in args):
            return None
        if n == "add":
            return (args[0][0] + args[1][0], args[0][1] + args[1][1])
        if n == "sub":
            return (args[0][0] - args[1][1], args[0][1] - args[1][0])
        if n == "mul":
            p = [x * y for x in args[0] for y in args[1]]
            return (min(p), max(p))
        if n in _CMP:
            true, false = _CMP[n](*args)
            return (1, 1) if true else (0, 0) if false else (0, 1)
        if n == "and" and all(a[0] >= 0 and a[1] <= 1 for a in args):
            return (min(a[0] for a in args), min(a[1] for a in args))
        return None


def mask_conjuncts(mask: Value) -> list[Value]:
    op = mask.owner
    if isinstance(op, Op) and op.name == "and" and isinstance(mask.type, TileType):
        return [c for o in op.operands for c in mask_conjuncts(o)]
    if isinstance(op, Op) and op.name == "broadcast" and isinstance(op.operands[0].type, TileType) \
            and len(op.operands[0].type.shape) == len(mask.type.shape):
        return mask_conjuncts(op.operands[0])
    return [mask]


def depends_on(v: Value, iv: Value) -> set:
    """Which of k / program_id(axis) a value depends on."""
    out, seen, todo = set(), set(), [v]
    while todo:
        w = todo.pop()
        if w.id in seen:
            continue
        seen.add(w.id)
        if w is iv:
            out.add("k")
        op = w.owner
        if isinstance(op, Op):
            if op.name == "program_id":
                out.add(("pid", op.attrs.get("axis", 0)))
            todo.extend(op.operands)
        elif isinstance(op, Block):
            out.add("block")
    return out


def staging_load(v: Value) -> Op | None:
    """The load an operand tile is exactly (the form that can be staged with vectors)."""
    op = v.owner
    return op if isinstance(op, Op) and op.name == "load" else None


def _loop_int(v: Value, fn: Function, scalars: dict) -> int | None:
    op = v.owner
    if isinstance(op, Op) and op.name == "const" and isinstance(op.attrs["value"], int):
        return op.attrs["value"]
    for p in fn.params:
        if p.value is v and isinstance(scalars.get(p.name), int):
            return scalars[p.name]
    return None


def prove_gemm_bounds(fn: Function, g: GemmPattern, scalars: dict) -> GemmBounds | None:
    """The bounds proofs for `g`, or None when the K loop's start, end or step is
    not a known integer (nothing is proven; every guard stays)."""
    lo, hi, step = (_loop_int(v, fn, scalars) for v in g.loop.operands[:3])
    if lo is None or hi is None or step is None or step != g.tile[2] or step <= 0:
        return None
    iv = g.loop.regions[0].args[0]
    loads = [op for op in map(staging_load, g.operands) if op is not None]
    # Every load feeding the operands (also those under casts) gets its proofs.
    for v in g.operands:
        for op in _loads_in(v):
            if op not in loads:
                loads.append(op)
    conj = {id(op): (mask_conjuncts(op.operands[1]) if len(op.operands) > 1 else []) for op in loads}
    b = GemmBounds(lo, hi, step, {}, loads, conj, fn=fn, scalars=scalars, iv=iv)
    # p_max per axis from the conjuncts that depend on that program id alone.
    for axis in range(3):
        own = [c for cs in conj.values() for c in cs if depends_on(c, iv) == {("pid", axis)}]
        if own:
            b.p_max[axis] = largest_proven(fn, scalars, iv, own, axis)
    for op in loads:
        b.aligned[id(op)] = is_aligned4(op, fn, scalars, iv, lo, step)
    return b


def _loads_in(v: Value) -> list[Op]:
    out, seen, todo = [], set(), [v]
    while todo:
        w = todo.pop()
        op = w.owner
        if w.id in seen or not isinstance(op, Op):
            continue
        seen.add(w.id)
        if op.name == "load":
            out.append(op)
        else:
            todo.extend(op.operands)
    return out


def largest_proven(fn, scalars, iv, conjuncts, axis) -> int:
    """The largest P such that every conjunct holds for program_id(axis) in [0, P]; -1 if
    none, BIG if all."""
    def ok(p):
        pids = tuple((0, p) if a == axis else (0, BIG) for a in range(3))
        ev = Intervals(fn, scalars, iv, Facts((0, BIG), pids))
        return all(ev.get(c) == (1, 1) for c in conjuncts)

    if ok(BIG):
        return BIG
    if not ok(0):
        return -1
    lo, hi = 0, BIG
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


# -- alignment ----------------------------------------------------------------------------------

def affine_form(v: Value, fn_params: dict, iv: Value, memo: dict):
    """{var: coefficient} (var: ("axis", i), "k", ("pid", a), "1") or None."""
    if v.id in memo:
        return memo[v.id]
    out = None
    if v is iv:
        out = {"k": 1}
    elif v.id in fn_params:
        x = fn_params[v.id]
        out = {"1": 0} if x == "ptr" else ({"1": x} if isinstance(x, int) else None)
    else:
        op = v.owner
        n = op.name if isinstance(op, Op) else None
        args = [affine_form(o, fn_params, iv, memo) for o in op.operands] if n else []
        if n is None or any(a is None for a in args):
            out = None
        elif n == "const":
            x = op.attrs["value"]
            out = {"1": x} if isinstance(x, int) and not isinstance(x, bool) else None
        elif n == "program_id":
            out = {("pid", op.attrs.get("axis", 0)): 1}
        elif n == "arange":
            out = {("axis", 0): 1, "1": op.attrs["start"]}
        elif n in ("splat", "broadcast"):
            out = args[0]
        elif n == "expand_dims":
            d = op.attrs["axis"]
            out = {(("axis", k[1] + 1) if isinstance(k, tuple) and k[0] == "axis"
                    and k[1] >= d else k): c for k, c in args[0].items()}
        elif n in ("add", "ptr_add", "sub"):
            sign = -1 if n == "sub" else 1
            out = dict(args[0])
            for k, c in args[1].items():
                out[k] = out.get(k, 0) + sign * c
        elif n == "mul":
            const = [a for a in args if set(a) <= {"1"}]
            if const:
                other = args[1] if args[0] is const[0] else args[0]
                f = const[0].get("1", 0)
                out = {k: c * f for k, c in other.items()}
    memo[v.id] = out
    return out


def is_aligned4(load: Op, fn: Function, scalars: dict, iv: Value, lo: int, step: int) -> bool:
    """Whether every group of 4 consecutive elements along the load's last axis
    (starting at a multiple of 4) is 4 contiguous, 4-aligned elements."""
    shape = load.results[0].type.shape
    if len(shape) != 2 or shape[-1] % 4:
        return False
    params = {}
    for p in fn.params:
        if p.value is None:
            continue
        if p.kind == "scalar":
            params[p.value.id] = scalars.get(p.name)
        else:
            params[p.value.id] = "ptr"
    f = affine_form(load.operands[0], params, iv, {})
    if f is None or f.get(("axis", 1), 0) != 1:
        return False
    f = dict(f)
    ck = f.pop("k", 0)
    f["1"] = f.get("1", 0) + ck * lo
    if (ck * step) % 4:
        return False
    f.pop(("axis", 1))
    return all(c % 4 == 0 for c in f.values())
