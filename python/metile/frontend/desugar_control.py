"""desugar_control: `return`, `break` and `continue` -> structured if / for / while.

Tile IR has only structured control flow (if, for and while regions; no
jumps), so before the generator walks a kernel or an @metile.inline helper,
this pass rewrites the function's AST until no `break` or `continue` is left
and the only `return` is a helper's final `return <value>`:

* Tail merge.  When every path through one branch of an `if` ends in
  return / break / continue, the statements after the `if` move into the
  other branch.  `if pid >= n: return` thus puts the rest of the kernel under
  `else`, and `if c: return a` / `return b` becomes one `if` whose branches
  assign the return value, merged by the generator like any variable: per
  program or per thread at runtime, statically for a compile-time condition.
* Flags otherwise.  A bool per function (returned) and per loop (broke,
  continued) is set where the statement was; what follows a statement that
  may set one runs under `if not flag`.  A `for` body runs under
  `if not (broke or returned)`; a `while` loop tests `not (broke or
  returned)` and then its own condition inside the body, so the condition is
  evaluated exactly when Python would evaluate it.  Flags nobody reads are
  dropped, and a function without these statements comes back unchanged, so
  its Tile IR and MSL do not change.

A helper's return value starts as `UNSET`: a path that has not returned yet
holds no value (the generator merges it with any type) and a path that falls
off the end returns None.  Generated names are not Python identifiers, so
they cannot collide with the user's.  Guards made here carry `metile_exit`
("return at line N"), which the generator puts on the `if` / `while` op so
that the uniformity check can say which statement made a barrier divergent.
"""

from __future__ import annotations

import ast

from .sentinels import RETURN_VALUE, UNSET
from ..errors import CompilationError

RETURNED = "<returned>"
_EXITS = (ast.Return, ast.Break, ast.Continue)
_KIND = {ast.Return: "return", ast.Break: "break", ast.Continue: "continue"}


def desugar(src, is_helper: bool) -> list[ast.stmt]:
    """The body of `src` (a FunctionSource) without break / continue / early returns."""
    cached = src.desugared.get(is_helper)
    if cached is None:
        cached = src.desugared[is_helper] = _Desugar(src, is_helper).function(src.tree.body)
    return cached


def _branches(stmt) -> list[list]:
    """The statement lists the generator walks inside `stmt`: exits elsewhere (try, with,
    nested defs) are rejected with the construct itself."""
    if isinstance(stmt, (ast.If, ast.For, ast.While)):
        return [stmt.body, stmt.orelse]
    return []


def _exits(stmts) -> set[str]:
    """Which of return / break / continue can leave the current loop iteration from `stmts`
    (break and continue of nested loops stay in those loops)."""
    out = set()
    for s in stmts:
        if isinstance(s, _EXITS):
            out.add(_KIND[type(s)])
        elif isinstance(s, ast.If):
            out |= _exits(s.body) | _exits(s.orelse)
        elif isinstance(s, (ast.For, ast.While)):
            out |= _exits(s.body + s.orelse) & {"return"}
    return out


def _first_exit(stmts, kinds=("return", "break", "continue")):
    for s in stmts:
        if isinstance(s, _EXITS):
            if _KIND[type(s)] in kinds:
                return s
            continue
        inner_kinds = kinds if isinstance(s, ast.If) else tuple(k for k in kinds if k == "return")
        for branch in _branches(s):
            found = _first_exit(branch, inner_kinds)
            if found is not None:
                return found
    return None


def _always_exits(stmts) -> bool:
    for s in stmts:
        if isinstance(s, _EXITS):
            return True
        if isinstance(s, ast.If) and _always_exits(s.body) and _always_exits(s.orelse):
            return True
    return False


def _walk_stmts(stmts, in_loop=False):
    """(statement, inside a loop) for every statement the generator may visit."""
    for s in stmts:
        yield s, in_loop
        for branch in _branches(s):
            yield from _walk_stmts(branch, in_loop or isinstance(s, (ast.For, ast.While)))


class _Loop:
    def __init__(self, index: int):
        self.broke = f"<broke {index}>"
        self.continued = f"<continued {index}>"
        self.variable = f"<loop variable {index}>"


class _Desugar:
    def __init__(self, src, is_helper: bool):
        self.src, self.is_helper = src, is_helper
        self.loops: list[_Loop] = []
        self.live: set[str] = set()
        self.returns_value = False
        self.count = 0

    def error(self, message: str, node) -> CompilationError:
        return CompilationError(message, self.src.loc(node))

    # -- the function --------------------------------------------------------------
    def function(self, body: list) -> list:
        needs_rewrite = False
        for s, in_loop in _walk_stmts(body):
            if isinstance(s, ast.Return) and s.value is not None:
                if not self.is_helper:
                    raise self.error("a kernel cannot return a value; store results into an "
                                     "output buffer", s)
                self.returns_value = True
            if isinstance(s, (ast.Break, ast.Continue)) or (
                    isinstance(s, ast.Return) and s is not body[-1]):
                needs_rewrite = True
        if not needs_rewrite:
            return body
        if self.returns_value:
            for s, in_loop in _walk_stmts(body):
                if isinstance(s, ast.Return) and in_loop:
                    raise self.error("return inside a loop of an @metile.inline helper that "
                                     "returns a value is not supported; keep the result in a "
                                     "variable set before the loop, break, and return it after "
                                     "the loop", s)
        stmts = list(body)
        if self.returns_value and not _always_exits(stmts):
            stmts.append(self.at(ast.Return(value=None), body[-1]))
        out = self.block(stmts)
        first = body[0]
        prologue = [self.assign(RETURNED, False, first)]
        if self.returns_value:
            prologue.append(self.assign(RETURN_VALUE, UNSET, first))
            out.append(self.at(ast.Return(value=ast.Name(RETURN_VALUE, ast.Load())), body[-1]))
        return _prune(prologue + out, self.live | {RETURN_VALUE})

    # -- statement lists -----------------------------------------------------------------
    def block(self, stmts: list) -> list:
        out = []
        for i, s in enumerate(stmts):
            rest = stmts[i + 1:]
            if isinstance(s, _EXITS):
                if rest:
                    raise self.error(f"code after {_KIND[type(s)]} never runs", rest[0])
                out.extend(self.exit(s))
                return out
            if isinstance(s, ast.If) and _exits([s]):
                body_exits, else_exits = _always_exits(s.body), _always_exits(s.orelse)
                if body_exits or else_exits:
                    if body_exits and else_exits and rest:
                        raise self.error("code after an if whose branches all end in "
                                         "return / break / continue never runs", rest[0])
                    new = ast.If(s.test, self.block(s.body + ([] if body_exits else rest)),
                                 self.block(s.orelse + ([] if else_exits else rest)))
                    out.append(self.mark(self.at(new, s), s.body if body_exits else s.orelse))
                    return out
            if isinstance(s, ast.If):
                out.append(self.at(ast.If(s.test, self.block(s.body), self.block(s.orelse)), s))
            elif isinstance(s, (ast.For, ast.While)):
                out.extend(self.loop(s))
            else:
                out.append(s)
            flags = self.flags_set_by(s)
            if rest and flags:
                exit_stmt = _first_exit([s])
                guard = ast.If(self.none_of(flags, exit_stmt), self.block(rest), [])
                out.append(self.mark(self.at(guard, exit_stmt), [s]))
                return out
        return out

    def exit(self, s) -> list:
        if isinstance(s, ast.Return):
            out = [self.assign(RETURNED, True, s)]
            if self.returns_value:
                value = s.value if s.value is not None else self.at(ast.Constant(None), s)
                out.insert(0, self.at(ast.Assign([ast.Name(RETURN_VALUE, ast.Store())], value), s))
            return out
        loop = self.loops[-1]
        return [self.assign(loop.broke if isinstance(s, ast.Break) else loop.continued, True, s)]

    def flags_set_by(self, s) -> list[str]:
        kinds = _exits([s])
        flags = []
        if self.loops:
            loop = self.loops[-1]
            flags += [loop.continued] if "continue" in kinds else []
            flags += [loop.broke] if "break" in kinds else []
        return flags + ([RETURNED] if "return" in kinds else [])

    # -- loops ---------------------------------------------------------------------
    def loop(self, s) -> list:
        what = "for" if isinstance(s, ast.For) else "while"
        if s.orelse:
            raise self.error(f"{what}/else is not supported", s)
        kinds = _exits(s.body)
        self.count += 1
        loop = _Loop(self.count)
        self.loops.append(loop)
        try:
            body = self.block(s.body)
        finally:
            self.loops.pop()
        if not kinds:
            return [self.at(type(s)(**{**_fields(s), "body": body}), s)]
        stops = [loop.broke] if "break" in kinds or (what == "while" and "return" in kinds) else []
        stops += [RETURNED] if "return" in kinds else []
        prefix = [self.assign(loop.continued, False, s)] if "continue" in kinds else []
        exit_stmt = _first_exit(s.body, ("return", "break"))
        before = [self.assign(loop.broke, False, s)] if loop.broke in stops else []
        if what == "for":
            target = s.target
            if stops:
                if isinstance(target, ast.Name):
                    # the iterations after a break still count: the user's variable is
                    # bound only in those that run, so after the loop it holds the value
                    # it had at the break, as in Python
                    body = [self.at(ast.Assign([ast.Name(target.id, ast.Store())],
                                               ast.Name(loop.variable, ast.Load())), s)] + body
                    target = self.at(ast.Name(loop.variable, ast.Store()), target)
                guard = ast.If(self.none_of(stops, s), body, [])
                body = [self.mark(self.at(guard, exit_stmt), s.body, ("return", "break"))]
            new = ast.For(target, s.iter, prefix + body, [], getattr(s, "type_comment", None))
            if target is not s.target:
                new.user_target = s.target.id   # (bound by the first iteration: control.py)
        elif stops:
            run = ast.If(s.test, body, [self.assign(loop.broke, True, s)])
            new = ast.While(self.none_of(stops, s), prefix + [self.at(run, s)], [])
            self.mark(new, s.body, ("return", "break"))
        else:
            new = ast.While(s.test, prefix + body, [])
        return before + [self.at(new, s)]

    # -- building nodes ---------------------------------------------------------------
    def at(self, node, ref):
        ast.copy_location(node, ref)
        return ast.fix_missing_locations(node)

    def assign(self, name: str, value, ref) -> ast.Assign:
        return self.at(ast.Assign([ast.Name(name, ast.Store())], ast.Constant(value)), ref)

    def none_of(self, flags: list[str], ref):
        self.live.update(flags)
        names = [ast.Name(f, ast.Load()) for f in flags]
        either = names[0] if len(names) == 1 else ast.BoolOp(ast.Or(), names)
        return self.at(ast.UnaryOp(ast.Not(), either), ref)

    def mark(self, node, stmts, kinds=("return", "break", "continue")):
        """Record which exit statement this guard stands for (uniformity's message)."""
        exit_stmt = _first_exit(stmts, kinds)
        if exit_stmt is not None:
            node.metile_exit = f"{_KIND[type(exit_stmt)]} at line {self.src.loc(exit_stmt).line}"
        return node


def _fields(node) -> dict:
    return {f: getattr(node, f) for f in node._fields if hasattr(node, f)}


def _prune(stmts: list, live: set[str]) -> list:
    """Drop assignments to flags nothing reads (a tail-merged return needs no flag)."""
    out = []
    for s in stmts:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id.startswith("<") and s.targets[0].id not in live:
            continue
        if isinstance(s, (ast.If, ast.For, ast.While)):
            s.body = _prune(s.body, live) or [ast.copy_location(ast.Pass(), s)]
            s.orelse = _prune(s.orelse, live)
        out.append(s)
    return out
