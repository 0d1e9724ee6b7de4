"""What a kernel's generated code depends on outside its own text: the global and
closure values it reads, through every @metile.inline helper it reaches.

The disk cache key (cache.source_fingerprint) hashes those values; the in-memory
caches of a Kernel (specializations, resolved launches) are keyed only on the
call signature, so they ask `Snapshot.changed()` before reusing anything.  That
is what makes a notebook's `SCALE = 2.0`, or a redefined helper, take effect on
the next launch instead of silently running the old code.

Taking a snapshot resolves each name once; checking it is a handful of dict
lookups and identity comparisons, cheap enough for every launch.
"""

from __future__ import annotations

import ast
import types

from ..language.dtypes import DType

_MISSING = object()
# Values compared by identity: immutable, or replaced (not mutated) when a user
# edits them.  Anything else (lists, dicts, arrays) is also compared by repr, so
# an in-place edit counts as a change.
_BY_IDENTITY = (int, float, bool, str, bytes, type(None), DType, types.FunctionType,
                types.ModuleType, types.BuiltinFunctionType, type)


def _by_identity(value) -> bool:
    if isinstance(value, tuple):
        return all(_by_identity(v) for v in value)
    return isinstance(value, _BY_IDENTITY) or callable(value)


def _repr(value) -> str | None:
    try:
        return repr(value)
    except Exception:  # no usable repr: fall back to identity
        return None


def _locals(tree: ast.AST) -> set:
    """The function's parameters and the names it assigns: Python makes those local
    throughout it (less any declared global or nonlocal), so they never read a global of
    the same name, and a global's value must not key or invalidate the kernel."""
    out, declared = set(), set()
    if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = tree.args
        out.update(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                   if x is not None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
    return out - declared


def names(tree: ast.AST) -> list[tuple[str, str | None]]:
    """Global names read, and `name.attr` chains (a module's or class's attributes, such
    as a helper defined in another module or a setting on a class) as (name, attr) pairs,
    once each in a stable order (the disk key hashes them in it); never the function's
    own locals."""
    local = _locals(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and \
                node.id not in local:
            found.add((node.id, None))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id not in local:
            found.add((node.value.id, node.attr))
    return sorted(found, key=lambda p: (p[0], p[1] or ""))


def has_attributes(value) -> bool:
    """Whether `name.attr` reads of `value` are followed attribute by attribute: modules
    and classes, whose repr does not show their attributes."""
    return isinstance(value, (types.ModuleType, type))


class Snapshot:
    """The values `fn` (and the helpers it reaches) read, as seen now."""

    def __init__(self, fn):
        self._refs: list[tuple] = []  # (getter, token)
        self._walk(fn, set())

    def _walk(self, fn, seen: set) -> None:
        from ..frontend.source import function_source

        if fn in seen:
            return
        seen.add(fn)
        src = function_source(fn)
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        glob = fn.__globals__
        for name, attr in names(src.tree):
            if name in cells:
                get = _cell_getter(cells[name])
            elif name in glob:
                get = _dict_getter(glob, name)
            else:
                # A builtin, a local, or a global defined later: record its absence.
                get = _dict_getter(glob, name)
            value = get()
            if attr is not None:
                if not has_attributes(value):
                    continue
                get = _attr_getter(value, attr)
                value = get()
            # Names that are not globals (locals, builtins), modules and metile's
            # own functions cannot change what a kernel means between launches.
            if value is _MISSING or has_attributes(value) or \
                    hasattr(value, "__metile_builtin__"):
                continue
            text = None if _by_identity(value) else _repr(value)
            self._refs.append((get, value, text))
            if getattr(value, "__metile_inline__", False):
                self._walk(value.__wrapped__, seen)
            elif getattr(value, "__metile_kernel__", False):
                self._walk(value.fn, seen)  # called from this kernel: inlined

    def changed(self) -> bool:
        for get, value, text in self._refs:
            now = get()
            # by identity, or (lists, dicts, namespaces) by repr: the same object edited
            # in place is a change too
            if (now is not value) if text is None else (_repr(now) != text):
                return True
        return False


def _dict_getter(d: dict, name: str):
    return lambda: d.get(name, _MISSING)


def _cell_getter(cell):
    def get():
        try:
            return cell.cell_contents
        except ValueError:
            return _MISSING
    return get


def _attr_getter(module, attr: str):
    return lambda: getattr(module, attr, _MISSING)
