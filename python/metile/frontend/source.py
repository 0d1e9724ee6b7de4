"""Reading a kernel's (or helper's) Python source and mapping AST nodes to
file:line:col in the user's file."""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field

from ..ir.core import Loc
from ..errors import CompilationError


@dataclass
class FunctionSource:
    fn: object
    file: str
    first_line: int
    indent: int
    text: str
    tree: ast.FunctionDef
    # desugar_control's body, per "inlined as a helper" flag
    desugared: dict = field(default_factory=dict)

    def loc(self, node: ast.AST) -> Loc:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        return Loc(self.file, self.first_line + line - 1, col + self.indent)

    @property
    def globals(self) -> dict:
        return self.fn.__globals__

    def closure(self) -> dict:
        names = self.fn.__code__.co_freevars
        cells = self.fn.__closure__ or ()
        out = {}
        for name, cell in zip(names, cells):
            try:
                out[name] = cell.cell_contents
            except ValueError:
                pass
        return out


_cache: dict[object, FunctionSource] = {}
# (lines, first line, file) of each kernel and helper, read when it was defined
_captured: dict[object, tuple] = {}


def capture(fn) -> None:
    """Read `fn`'s source now, as its decorator runs, so that a file edited after the
    import (no reload) cannot give the function another text - lines inserted above a
    kernel made its first compile read the body of the function below it.  A function
    with no readable source (exec'd) is left to function_source's error."""
    try:
        lines, first = inspect.getsourcelines(fn)
        _captured[fn] = (lines, first, inspect.getsourcefile(fn) or "<unknown>")
    except (OSError, TypeError):
        pass


def function_source(fn) -> FunctionSource:
    src = _cache.get(fn)
    if src is not None:
        return src
    try:
        lines, first, file = _captured.get(fn) or (*inspect.getsourcelines(fn),
                                                  inspect.getsourcefile(fn) or "<unknown>")
    except (OSError, TypeError) as e:
        raise CompilationError(f"cannot read the source of {fn.__qualname__}: {e}") from None
    raw = "".join(lines)
    indent = len(lines[0]) - len(lines[0].lstrip())
    text = textwrap.dedent(raw)
    try:
        module = ast.parse(text)
    except SyntaxError:
        module = ast.Module(body=[], type_ignores=[])
    tree = next((n for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                None)
    if tree is None:  # a lambda: its source line is some other statement
        what = "a lambda" if fn.__name__ == "<lambda>" else fn.__qualname__
        raise CompilationError(f"{what} cannot be a kernel or helper: write it with def",
                               Loc(file, first, indent))
    if isinstance(tree, ast.AsyncFunctionDef):
        raise CompilationError("async functions cannot be kernels", Loc(file, first, indent))
    if tree.name != fn.__name__:
        # (source read after its file changed: the lines now hold another function)
        raise CompilationError(f"the source of {fn.__qualname__} in {file} at line {first} is "
                               f"now the function {tree.name!r}: the file changed since it "
                               f"was imported; reload the module",
                               Loc(file, first, indent))
    src = FunctionSource(fn, file, first, indent, text, tree)
    _cache[fn] = src
    return src
