"""Structured control flow in the frontend: runtime `if`, `for`, `while`.

Python variables become SSA values.  A variable reassigned inside a loop and
live before it is loop-carried (a block argument of the body, yielded at the
end); one reassigned in the branches of a runtime `if` becomes a result of
the `if`.  A compile-time condition (constexpr, Python value) selects a branch
statically and nothing is emitted for the other.  Names bound on only some
paths become `Undefined` and are an error if read.  A composite compile-time
object with runtime parts (a block pointer: its offsets) is carried or merged
part by part; see `_flat`.
"""

from __future__ import annotations

import ast
import builtins as py_builtins

from ..ir.core import Block, Builder, Value
from ..ir.types import ScalarType, TileType, dtype_of, elem_type, is_pointer
from ..language import dtypes as dt
from ..errors import CompilationError
from .desugar_control import desugar
from .semantics import Semantics, describe, is_const
from .sentinels import RETURN_VALUE, UNSET
from .tuples import KernelTuple
from .views import nonnegative

_MISSING = object()



# the name a runtime `a if c else b` assigns in each branch of the `if` it becomes
CHOSEN = "<chosen>"


def _label(name: str) -> str:
    if name == CHOSEN:
        return "the value of `a if c else b`"
    return "the return value" if name == RETURN_VALUE else f"variable {name!r}"


def _composite(v):
    """`v` as a composite a loop or if carries part by part: a plain Python tuple (a
    shape, a constexpr argument) as a KernelTuple; anything else as it is."""
    return KernelTuple(v) if type(v) is tuple else v


def _what(v) -> str:
    """A composite named in a message: a tuple as describe() says it, else its repr."""
    return describe(v) if isinstance(v, tuple) else f"a {v!r}"


def _is_composite(v) -> bool:
    return hasattr(_composite(v), "loop_parts")


def _flat(name: str, v) -> list:
    """[(hint, value)] a loop or if carries for variable `name` holding `v`.  A composite
    object (frontend/block_pointers.py, a tuple) carries its `loop_parts()`; it rebuilds
    itself with `with_parts(values)` and says with `layout_differs(other)` why another
    object cannot take its slots (None when it can)."""
    v = _composite(v)
    if hasattr(v, "loop_parts"):
        return list(zip(v.loop_part_names(name), v.loop_parts()))
    return [(name, v)]


def _rebuild(like, values: list):
    return like.with_parts(values) if hasattr(like, "loop_parts") else values[0]


class Undefined:
    """A name bound only on some paths (one branch, inside a loop)."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason


# why a name first bound in a loop body is undefined after the loop
_MAY_NOT_RUN = ("it is first assigned inside a loop body, and a loop that may run no "
                "iteration leaves it unset; give it a value before the loop")
_FIRST_MAY_SKIP = ("it is first assigned inside a loop body, and its first iteration may not "
                   "assign it (a return, break, continue or runtime if before the "
                   "assignment); give it a value before the loop")


def _path_to(stmts, node, owner=None):
    """[(owner, statement list, index)] from `stmts` down to `node`, or None."""
    for i, s in enumerate(stmts):
        if s is node:
            return [(owner, stmts, i)]
        for inner in (getattr(s, "body", None), getattr(s, "orelse", None)):
            if isinstance(inner, list):
                found = _path_to(inner, node, s)
                if found is not None:
                    return [(owner, stmts, i)] + found
    return None


def _reads(node, name: str) -> bool:
    """Whether `node` reads `name` (an augmented assignment `name += v` reads it too)."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               or isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
               and n.target.id == name for n in ast.walk(node))


def _binds(target, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in ([target] if isinstance(target, ast.Name) else
                         ast.walk(target) if isinstance(target, (ast.Tuple, ast.List)) else []))


def _first_use(stmts, name: str):
    """True when `stmts` may read `name` before binding it, False when they bind it first
    on every path, None when they do neither.  A loop's body counts for its reads (before
    a binding in it) and never as a binding: it may run no iteration."""
    for s in stmts:
        if isinstance(s, ast.If):
            if _reads(s.test, name):
                return True
            sides = [_first_use(s.body, name), _first_use(s.orelse, name)]
            if True in sides:
                return True
            if sides == [False, False]:
                return False
        elif isinstance(s, (ast.For, ast.While)):
            heads = [s.iter] if isinstance(s, ast.For) else [s.test]
            # (a for binds its variable ahead of each run of its body)
            bound = isinstance(s, ast.For) and _binds(s.target, name)
            if any(_reads(h, name) for h in heads) or not bound and _first_use(s.body, name):
                return True
        elif _reads(s, name):
            return True
        elif isinstance(s, ast.Return):
            return False   # (nothing after it runs)
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            if any(_binds(t, name) for t in targets):
                return False
    return None


def assigned_names(stmts) -> set[str]:
    out: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
    return out


class ControlFlow:
    """Mixin of `Generator`: the statements that open regions."""

    # inside a first-iteration-peeled loop: the names the loops in its body peeled for
    # (`_peel_first`); None outside one
    _peeled_names: set | None = None

    def visit_If(self, node):
        cond = self.visit(node.test)
        if not isinstance(cond, Value):
            self.visit_body(node.body if cond else node.orelse)
            return
        self._runtime_if(self._scalar_condition(cond, "if"), node.body, node.orelse, node)

    def conditional_expression(self, cond, node):
        """`a if c else b` for a runtime scalar c: an `if` whose branches assign the value,
        so only the chosen side runs (its loads, atomics, stores and divisions), as in
        Python; values merge as an `if` statement's variables do (numbers of two kinds,
        tuples part by part)."""
        cond = self._scalar_condition(cond, "`a if c else b`")
        chosen = [ast.copy_location(ast.Assign([ast.Name(CHOSEN, ast.Store())], side), node)
                  for side in (node.body, node.orelse)]
        saved = self.env.get(CHOSEN, _MISSING)
        self._runtime_if(cond, chosen[:1], chosen[1:], node)
        value = self.env.pop(CHOSEN)
        if saved is not _MISSING:   # (a nested conditional inside a branch)
            self.env[CHOSEN] = saved
        return value

    def _runtime_if(self, cond, body, orelse, node):
        before = dict(self.env)
        branches = []
        for stmts in (body, orelse):
            block = Block()
            env = self._in_block(block, stmts, dict(before))
            branches.append((block, env))
        names = [n for n in branches[0][1] if n in branches[1][1]
                 and branches[0][1][n] is not branches[1][1][n]]
        # (a name left undefined by one branch stays undefined: no parts to merge)
        composites = {n: _split_parts(n, branches) for n in names
                      if any(_is_composite(branches[i][1][n]) for i in (0, 1))
                      and not any(isinstance(branches[i][1][n], Undefined) for i in (0, 1))}
        names = [m for n in names for m in composites.get(n, [n])
                 if branches[0][1][m] is not branches[1][1][m]]
        merged = self._merge(names, branches, node)
        results = []
        for block, env in branches:
            builder = Builder(block)
            builder.loc = self.b.loc
            builder.op("yield", [merged_value(env[n], t, builder) for n, t in merged], [])
        op = self.b.op("if", [cond], [t for _, t in merged], _exit_attrs(node),
                       regions=[b for b, _ in branches])
        results = dict(zip([n for n, _ in merged], op.results))
        (_, env_a), (_, env_b) = branches
        for n in set(env_a) | set(env_b):
            a, b = env_a.get(n, _MISSING), env_b.get(n, _MISSING)
            if n in results:
                self.env[n] = results[n]
            elif a is b or (is_const(a) and is_const(b) and a == b and type(a) is type(b)):
                self.env[n] = a
            elif (a is UNSET and b is not _MISSING) or (b is UNSET and a is not _MISSING):
                self.env[n] = b if a is UNSET else a
            else:
                self.env[n] = Undefined(n, "it is assigned in only one branch of an if")
        for n, parts in composites.items():
            self.env[n] = env_a[n].with_parts([self.env.pop(m) for m in parts])

    def _merge(self, names, branches, node):
        merged = []
        for n in names:
            a, b = branches[0][1][n], branches[1][1][n]
            if isinstance(a, Undefined) or isinstance(b, Undefined):
                continue
            if not isinstance(a, Value) and not isinstance(b, Value):
                if is_const(a) and is_const(b) and a == b and type(a) is type(b):
                    continue
                if a is UNSET or b is UNSET:
                    continue
                if not (is_const(a) and is_const(b)):
                    raise CompilationError(f"{_label(n)} holds different compile-time values "
                                           f"in the two branches of a runtime if "
                                           f"({describe(a)} and {describe(b)})")
            for x in (a, b):
                if not isinstance(x, Value) and not is_const(x) and x is not UNSET:
                    other = b if x is a else a
                    if n == RETURN_VALUE and x is None:
                        raise CompilationError(f"the helper returns a value ({other.type}) on one "
                                               f"path of this runtime if and nothing on the "
                                               f"other; return a value on every path")
                    raise CompilationError(f"{_label(n)} is {other.type} in one branch of a "
                                           f"runtime if and the compile-time {describe(x)} in "
                                           f"the other")
            ta = a.type if isinstance(a, Value) else None
            tb = b.type if isinstance(b, Value) else None
            t = ta or tb
            if ta and tb and ta != tb and all(getattr(x, "space", None) == "threadgroup"
                                              for x in (ta, tb)):
                raise CompilationError(f"conditional shared-pointer selection is unsupported: "
                                       f"variable {n!r} points into a different shared "
                                       f"allocation in each branch; select an offset instead")
            if ta and tb and is_pointer(ta) and is_pointer(tb) and \
                    elem_type(ta).root != elem_type(tb).root:
                # a pointer's type names its buffer: no cast turns one buffer into another
                raise CompilationError(
                    f"{_label(n)} points into {elem_type(ta).root!r} in one branch of a runtime "
                    f"if and into {elem_type(tb).root!r} in the other ({ta} and {tb}); a pointer "
                    f"names its buffer, so select an offset into one buffer, or load from (store "
                    f"to) each buffer in its own branch")
            if ta and tb and ta != tb:
                raise CompilationError(f"{_label(n)} is {ta} in one branch and {tb} in the "
                                       f"other; cast so both agree")
            if t is None:
                t = ScalarType(_const_dtype(a, b))
            merged.append((n, t))
        return merged

    def _scalar_condition(self, cond, what):
        if isinstance(cond.type, TileType):
            raise CompilationError(f"{what} condition must be a scalar, got a tile; use "
                                   f"metile.where for elementwise selection")
        if dtype_of(cond.type) != dt.bool_:
            cond = self.sem.binary("ne", cond, 0)
        return cond

    def _in_block(self, block: Block, stmts, env: dict) -> dict:
        saved_b, saved_sem, saved_env = self.b, self.sem, self.env
        builder = Builder(block)
        builder.loc = saved_b.loc
        self.b, self.sem, self.env = builder, Semantics(builder), env
        try:
            self.visit_body(stmts)
            return self.env
        finally:
            self.b, self.sem, self.env = saved_b, saved_sem, saved_env

    def _carried(self, body_stmts, include=()) -> list[str]:
        """The variables a loop carries: those its body assigns (and `include`) that hold a
        value before it."""
        names = []
        for n in sorted(assigned_names(body_stmts) | set(include)):
            if n not in self.env:
                continue
            v = self.env[n]
            if isinstance(v, Undefined):
                continue
            v = _composite(v)
            if hasattr(v, "loop_parts"):
                self.env[n] = v.with_parts([self.sem.to_value(p) for p in v.loop_parts()])
                names.append(n)
                continue
            if not isinstance(v, Value) and not is_const(v):
                raise CompilationError(f"variable {n!r} holds a compile-time {type(v).__name__} "
                                       f"and is reassigned inside a runtime loop")
            if is_const(v):
                self.env[n] = self.sem.to_value(v)
            names.append(n)
        return names

    def visit_For(self, node):
        if node.orelse:
            raise CompilationError("for/else is not supported")
        if not isinstance(node.target, ast.Name):
            raise CompilationError("the loop variable must be a single name")
        it = node.iter
        func = self.visit(it.func) if isinstance(it, ast.Call) else None
        kind = {py_builtins.range: "range"}.get(func) if func is not None else None
        builtin = getattr(func, "__metile_builtin__", None)
        if builtin in ("tile_range", "range", "static_range"):
            kind = builtin
        if kind is None:
            raise CompilationError("a kernel loop must iterate over range(...), metile.range(...), "
                                   "metile.static_range(...) or metile.tile_range(...)")
        args = [self.visit(a) for a in it.args]
        kwargs = {k.arg: self.visit(k.value) for k in it.keywords}
        if kind != "static_range":
            _loop_options(kind, kwargs, self.b.loc)
        elif kwargs:
            raise CompilationError(f"static_range() takes no keyword arguments, got "
                                   f"{', '.join(kwargs)}")
        if not 1 <= len(args) <= 3:
            raise CompilationError(f"{kind}() takes 1 to 3 positional arguments")
        if len(args) == 1:
            args = [0, args[0]]
        start, end, step = (args + [1])[:3]
        if is_const(step) and step == 0:
            raise CompilationError(f"{kind}() step must not be zero")
        if kind == "static_range":
            return self._unrolled(node, start, end, step)
        # (a float or bool bound is refused below, where it meets the int32 counter)
        runs = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)) \
            and len(range(start, end, step)) > 0
        unbound = _FIRST_MAY_SKIP if runs else _MAY_NOT_RUN
        if runs and self._peel_first(node, start):
            rest = range(start, end, step)[1:]
            if not rest:
                return
            start = rest.start
        bounds = []
        for v in (start, end, step):
            v = self.sem.to_value(v, dt.int32)
            if v.type != ScalarType(dt.int32):
                raise CompilationError(f"{kind}() bounds must be int32 scalars, got {v.type}")
            bounds.append(v)
        runtime_step = None
        if not is_const(step) or step < 0:
            # a step known only at launch may be negative or zero, a constant one negative:
            # the loop counts t = 0, 1, ... up to Python's trip count (none for a zero step,
            # where Python raises and a kernel cannot) with the variable start + t * step.
            # (`i < end; i += step` ran no iteration going down, or until i wrapped)
            runtime_step = bounds
            bounds = [self.sem.to_value(0, dt.int32), self._trips(*bounds),
                      self.sem.to_value(1, dt.int32)]
        # The loop variable is carried when it has a value before the loop: as in Python,
        # after the loop it holds what it held at the end of the last iteration (its
        # value before the loop when none ran).
        target = node.target.id
        if runs:
            # A constant range that runs: Python leaves the variable at its last value even
            # when it had none before, so it is carried from `start` (never seen: the first
            # iteration binds it) - only where it is read after the loop, so other loops
            # keep their form.  (user_target: the user's variable of a loop with a break,
            # which desugar_control binds in the body from its own counter.)
            for name in (target, getattr(node, "user_target", None)):
                if name and self._read_after(node, name) and \
                        isinstance(self.env.get(name, Undefined(name, "")), Undefined):
                    self.env[name] = self.sem.to_value(start, dt.int32)
        carried = self._carried(node.body, include=[target])
        body = Block()
        iv = body.add_arg(ScalarType(dt.int32), target)
        if runtime_step is None and nonnegative(bounds[0]):
            body.nonnegative.add(iv.id)   # counts up (a constant step > 0) from lo >= 0
        env = dict(self.env)
        if runtime_step is not None:
            bb = Builder(body)
            bb.loc = self.b.loc
            lo, _, st = runtime_step
            # in 64 bits: lo + t * step lies in [lo, hi) but its int32 product may not
            wide, bsem = dt.int64, Semantics(bb)
            iv = bsem.cast(bsem.binary("add", bsem.cast(lo, wide), bsem.binary(
                "mul", bsem.cast(iv, wide), bsem.cast(st, wide))), dt.int32)
        for n in carried:
            env[n] = self._block_args(body, n)
        env[target] = iv
        env = self._in_block(body, node.body, env)
        self._yield(body, env, carried, "loop")
        inits = self._carried_values(carried)
        op = self.b.op("for", bounds + inits, [v.type for v in inits], {"kind": kind}, [body])
        self._after_loop(env, carried, op.results, node, unbound)
        if target not in carried:
            self.env[target] = Undefined(target, "it is first assigned by the loop, and a loop "
                                                 "that runs no iteration leaves it unset; give "
                                                 "it a value before the loop")

    def _peel_first(self, node, start) -> bool:
        """A constant range that runs: a name first bound in the body and read after the
        loop is defined there, as in Python (and Triton), when the first iteration binds it
        on every path.  That iteration is compiled on its own, ahead of the loop over the
        rest, so the name holds a value of the body's own type before the loop and is
        carried; a name the first iteration may leave unbound (a break, continue or runtime
        if before its assignment) stays undefined.  Only a loop with such a name is split:
        others keep one copy of their body (and their form, which the GEMM lowering
        matches).  Returns whether the first iteration was compiled."""
        target = node.target.id
        names = assigned_names(node.body) | {target}
        unset = {n for n in names if isinstance(self.env.get(n, Undefined(n, "")), Undefined)}
        candidates = unset - {target}
        path = _path_to(desugar(self.src, self.is_helper), node) if candidates else None
        live = {n for n in candidates if self._live_after(node, n, path)}
        if not live:
            return False
        self.env[target] = self.sem.to_value(start, dt.int32)
        enclosing, self._peeled_names = self._peeled_names, set()
        try:
            self.visit_body(node.body)
            inner = self._peeled_names
        finally:
            self._peeled_names = enclosing
        if self._read_after(node, target):   # (as the loop variable of a loop that runs)
            live.add(target)
        if enclosing is not None:
            enclosing |= live | inner
        # the rest of the loop carries what had a value before it and what is read after
        # it, not the body's temporaries - except the names the loops inside it peeled
        # for: kept, the rest's copy of those loops carries them (the value left by the
        # iteration before, as in Python) instead of peeling again, so a nest of such
        # loops compiles its innermost body a number of times linear in the depth, not
        # 2**depth
        for n in unset - live:
            v = self.env.get(n)
            if n in inner and (isinstance(v, Value) or is_const(v) or _is_composite(v)):
                continue
            self.env[n] = Undefined(n, _FIRST_MAY_SKIP)
        return True

    def _live_after(self, node, name: str, path) -> bool:
        """Whether the code after loop `node` may read `name` before binding it again (on
        the statements this generator compiles: the desugared body, where a break is a
        flag; `path` is `_path_to` that body's `node`).  Conservative: a read on any path
        counts, and a binding counts only when it is certain (a plain assignment, or one in
        both branches of an if)."""
        if path is None:
            return self._read_after(node, name)
        for owner, stmts, i in reversed(path):
            later = _first_use(stmts[i + 1:], name)
            if later is not None:
                return later
            if isinstance(owner, ast.While) and _reads(owner.test, name) or \
                    isinstance(owner, (ast.For, ast.While)) and _first_use(owner.body, name):
                return True   # the enclosing loop's next iteration may read it
        return False

    def _read_after(self, node, name: str) -> bool:
        """Whether the kernel's source reads `name` on a line after the loop `node` (a
        conservative test: a read that a later assignment shadows counts too)."""
        last = max((getattr(n, "end_lineno", None) or getattr(n, "lineno", 0)
                    for n in ast.walk(node)), default=0)
        if not last:
            return False
        return any(_reads(n, name) and n.lineno > last for n in ast.walk(self.src.tree)
                   if isinstance(n, (ast.Name, ast.AugAssign)))

    def _trips(self, lo: Value, hi: Value, step: Value) -> Value:
        """len(range(lo, hi, step)) for a step of either sign, 0 for a zero step, counted in
        64 bits (hi - lo of two int32 bounds needs 33).  The loop counter is int32, so a
        range of more than 2**31 - 1 values stops after that many (no GPU thread runs that
        long a loop)."""
        sem = self.sem
        lo, hi, step = (sem.cast(v, dt.int64) for v in (lo, hi, step))
        up, down = sem.binary("gt", step, 0), sem.binary("lt", step, 0)
        span = sem.where(up, sem.binary("sub", hi, lo),
                         sem.where(down, sem.binary("sub", lo, hi), 0))
        span = sem.binary("maximum", span, 0)
        size = sem.where(up, step, sem.where(down, sem.binary("sub", 0, step), 1))
        trips = sem.binary("idiv", sem.binary("sub", sem.binary("add", span, size), 1), size)
        return sem.cast(sem.binary("minimum", trips, 2**31 - 1), dt.int32)

    def _unrolled(self, node, start, end, step):
        """static_range: the body once per value, the loop variable a compile-time int."""
        for v in (start, end, step):
            if isinstance(v, Value) or isinstance(v, bool) or not isinstance(v, int):
                raise CompilationError(f"static_range() bounds must be constexpr ints, got "
                                       f"{describe(v)}")
        if len(range(start, end, step)) > 4096:
            raise CompilationError(f"static_range({start}, {end}, {step}) unrolls "
                                   f"{len(range(start, end, step))} bodies; at most 4096")
        for i in range(start, end, step):
            self.env[node.target.id] = i
            self.visit_body(node.body)

    def _block_args(self, block, n):
        """Block arguments for carried variable `n` (one per part of a composite)."""
        entry = self.env[n]
        return _rebuild(entry, [block.add_arg(v.type, h) for h, v in _flat(n, entry)])

    def _carried_values(self, carried) -> list:
        return [v for n in carried for _, v in _flat(n, self.env[n])]

    def _yield(self, block, env, carried, what):
        values = []
        builder = Builder(block)
        builder.loc = self.b.loc
        slots = []
        for n in carried:
            v, entry = env.get(n), self.env[n]
            if isinstance(v, Undefined):
                raise CompilationError(f"variable {n!r} is undefined at the end of the {what} "
                                       f"body: {v.reason}")
            if hasattr(entry, "loop_parts"):
                why = entry.layout_differs(v)
                if why:
                    raise CompilationError(f"loop-carried {_label(n)} ({_what(entry)}) {why} "
                                           f"inside the {what}")
            slots += _flat(n, v) if hasattr(entry, "loop_parts") else [(n, v)]
        args = block.args[len(block.args) - len(slots):]
        for (n, v), arg in zip(slots, args):
            if is_const(v):
                v = Semantics(builder).literal(v, dtype_of(arg.type))
            if not isinstance(v, Value) or v.type != arg.type:
                got = v.type if isinstance(v, Value) else describe(v)
                raise CompilationError(f"loop-carried variable {n!r} changes type from {arg.type} "
                                       f"to {got} inside the {what}; cast it, or initialise it "
                                       f"with the final type (e.g. metile.zeros)")
            values.append(v)
        builder.op("yield", values, [])

    def _after_loop(self, body_env, carried, results, node, unbound=None):
        results = list(results)
        for n in carried:
            k = len(_flat(n, self.env[n]))
            self.env[n], results = _rebuild(self.env[n], results[:k]), results[k:]
        for n in assigned_names(node.body):
            if n not in carried:
                self.env[n] = Undefined(n, unbound or _MAY_NOT_RUN)

    def visit_While(self, node):
        if node.orelse:
            raise CompilationError("while/else is not supported")
        carried = self._carried(node.body)
        cond_block, body = Block(), Block()
        env = dict(self.env)
        for n in carried:
            env[n] = self._block_args(cond_block, n)
        saved_b, saved_sem, saved_env = self.b, self.sem, self.env
        self.b = Builder(cond_block)
        self.b.loc, self.sem, self.env = saved_b.loc, Semantics(self.b), env
        try:
            cond = self.visit(node.test)
            if not isinstance(cond, Value):
                raise CompilationError(f"while condition must be a runtime scalar, got the "
                                       f"compile-time {describe(cond)}: " + (
                                           "with no break or return in it the loop never ends"
                                           if cond else "the loop never runs"))
            cond = self._scalar_condition(cond, "while")
            self.b.op("condition", [cond], [])
        finally:
            self.b, self.sem, self.env = saved_b, saved_sem, saved_env
        env = dict(self.env)
        for n in carried:
            env[n] = self._block_args(body, n)
        env = self._in_block(body, node.body, env)
        self._yield(body, env, carried, "while loop")
        inits = self._carried_values(carried)
        op = self.b.op("while", inits, [v.type for v in inits], _exit_attrs(node),
                       [cond_block, body])
        self._after_loop(env, carried, op.results, node)


# Triton's loop options: accepted, and each one this compiler does not honour warns
# (the loop still runs, in order, once per iteration).
_LOOP_OPTIONS = {
    "num_stages": "software pipelining of a loop is not done here; metile pipelines the "
                  "K loop of a recognised GEMM, set by Schedule(num_stages=...)",
    "warp_specialize": "metile does not specialize warps",
    "loop_unroll_factor": "metile does not unroll runtime loops on request",
    "disallow_acc_multi_buffer": "metile does not multi-buffer accumulators",
    "flatten": "metile does not flatten loop nests",
    "disable_licm": "metile does not hoist loop invariants",
}


def _loop_options(kind, kwargs, loc) -> None:
    import warnings
    for name in list(kwargs):
        value = kwargs.pop(name)
        if name not in _LOOP_OPTIONS:
            raise CompilationError(f"{kind}() got an unexpected keyword argument {name!r}")
        if value is None or value is False or name == "num_stages" and value == 1:
            continue
        warnings.warn(f"{loc.file}:{loc.line}: {kind}({name}={value!r}) is accepted but not "
                      f"honoured: {_LOOP_OPTIONS[name]}", stacklevel=2)


def _split_parts(n: str, branches) -> list[str]:
    """Put the parts of composite variable `n` (changed by a runtime if) in each branch's
    environment under names of their own, for `_merge`; returns those names."""
    a, b = branches[0][1][n], branches[1][1][n]
    # a helper's return slot is UNSET on a path that has not returned: each part of the
    # other path's value (a tuple returned early) stands beside an UNSET part
    a, b = _composite(a), _composite(b)
    like, other = (a, b) if hasattr(a, "loop_parts") else (b, a)
    why = None if other is UNSET else like.layout_differs(other)
    if why:
        raise CompilationError(f"{_label(n)} ({_what(like)}) {why} in one branch of a "
                               f"runtime if")
    names = [h for h, _ in _flat(n, like)]
    for _, env in branches:
        v = env.pop(n)
        parts = [UNSET] * len(names) if v is UNSET else [p for _, p in _flat(n, v)]
        env.update(zip(names, parts))
        env[n] = like  # the layout, rebuilt from the merged parts after the if
    return names


def _const_dtype(*xs):
    """The type two branches' numbers merge in: bool, int32, uint32 where an int passes
    int32 and both fit 32 unsigned bits (words of bits: pair_fma's constants), int64 past
    that, else float32."""
    ints = [x for x in xs if isinstance(x, int) and not isinstance(x, bool)]
    if all(isinstance(x, bool) for x in xs if x is not UNSET):
        return dt.bool_
    if any(isinstance(x, float) for x in xs):
        return dt.float32
    if all(-2 ** 31 <= x < 2 ** 31 for x in ints):
        return dt.int32
    if all(0 <= x < 2 ** 32 for x in ints):
        return dt.uint32
    return dt.int64


def _exit_attrs(node) -> dict:
    """desugar_control's note of the return / break a guard stands for."""
    exit_ = getattr(node, "metile_exit", None)
    return {"exit": exit_} if exit_ else {}


def merged_value(v, t, builder):
    if isinstance(v, Value):
        return v
    sem = Semantics(builder)
    if v is UNSET:
        # Not read on this path (it has not returned): any value of the right type.
        if isinstance(t, TileType):
            return sem.broadcast_to(sem.const(0, t.elem.dtype), t.shape)
        if isinstance(t, ScalarType):
            return sem.const(0, t.dtype)
        raise CompilationError(f"a helper that returns a {t} under a runtime condition is not "
                               f"supported; return an offset or index instead")
    if isinstance(t, TileType):
        # a number on one path, a tile on the other: the number fills the tile
        return sem.broadcast_to(sem.literal(v, t.elem.dtype), t.shape)
    return sem.literal(v, t.dtype)
