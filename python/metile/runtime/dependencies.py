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
import hashlib
import types

from ..language.dtypes import DType

MISSING = object()
# Values compared by identity: immutable, or replaced (not mutated) when a user
# edits them.  Anything else (lists, dicts, arrays) is also compared by repr, so
# an in-place edit counts as a change.
_BY_IDENTITY = (int, float, bool, str, bytes, type(None), DType, types.FunctionType,
                types.ModuleType, types.BuiltinFunctionType, type)


def _by_identity(value) -> bool:
    if isinstance(value, tuple):
        return all(_by_identity(v) for v in value)
    return isinstance(value, _BY_IDENTITY) or callable(value)


def text(value) -> str | None:
    """What stands for `value`'s contents: its repr, or for a NumPy array (whose repr
    elides the middle of a large one, so an edit there would go unseen) its shape, dtype
    and a digest of its bytes."""
    try:
        if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
            digest = hashlib.sha256(value.tobytes()).hexdigest()[:32]
            return f"ndarray{value.shape}:{value.dtype}:{digest}"
        return repr(value)
    except Exception:  # no usable repr: fall back to identity
        return None



def _contents(value):
    """What a launch compares to see a value edited in place: its text, or a NumPy
    array's shape, dtype and bytes (a copy: comparing it costs a sixth of digesting the
    bytes again, 0.5 against 3 ms a launch for a 4 MB array on the 2-core CI machine)."""
    if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
        try:
            return ("ndarray", value.shape, str(value.dtype), value.tobytes())
        except Exception:
            return None
    return text(value)


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


def names(tree: ast.AST) -> list[tuple[str, tuple[str, ...]]]:
    """Global names read, as (name, ()), and attribute chains on them as (name, attrs):
    `consts.SCALE`, `pkg.consts.SCALE`, `cfg.inner.VAL` (a module's, class's or object's
    attributes, at any depth; every prefix of a chain is one too), once each in a stable
    order (the disk key hashes them in it); never the function's own locals."""
    local = _locals(tree)
    found = set()
    # a function's body only: its decorators, defaults and annotations (`@metile.kernel`,
    # `BLOCK: metile.constexpr`) were evaluated once, at definition, and are not read again
    # (each was a reference every launch checked)
    roots = tree.body if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)) else [tree]
    for node in (n for root in roots for n in ast.walk(root)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and \
                node.id not in local:
            found.add((node.id, ()))
        elif isinstance(node, ast.Attribute):
            attrs, base = [], node
            while isinstance(base, ast.Attribute):
                attrs.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id not in local:
                found.add((base.id, tuple(reversed(attrs))))
    return sorted(found)


def has_attributes(value) -> bool:
    """Whether `value` stands for its attributes rather than a value of its own: modules
    and classes (their repr does not show their attributes), whose reads the chains that
    name them follow."""
    return isinstance(value, (types.ModuleType, type))


def follow(value, attrs: tuple):
    """`value.a.b...` for attrs (a, b, ...), or MISSING where one is absent (or its
    property raises); metile's own functions end the chain (their attributes are not
    what a kernel reads)."""
    for attr in attrs:
        if _ends_chain(value):
            return MISSING
        try:
            value = getattr(value, attr)
        except Exception:
            return MISSING
    return value


def _ends_chain(value) -> bool:
    """Whether no attribute of `value` is followed: absent, or one of metile's own."""
    return value is MISSING or hasattr(value, "__metile_builtin__")


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
        for name, attrs in names(src.tree):
            if name in cells:
                get = _cell_getter(cells[name])
            else:
                # (a builtin, a local, or a global defined later: its absence is recorded)
                get = _dict_getter(glob, name)
            value = get()
            for i, attr in enumerate(attrs):
                if _ends_chain(value):
                    value = MISSING
                    break
                if has_attributes(value):
                    # a module's or class's attribute: read from that object (as bound
                    # now) at each check, the cheap common case (consts.SCALE)
                    get = _attr_getter(value, attr)
                    value = get()
                else:
                    # an object's (cfg.inner.VAL): followed from the object's own name
                    # each time, so rebinding `cfg` or `cfg.inner` is a change too
                    get = _chain_getter(get, attrs[i:])
                    value = get()
                    break
            # Names that are not globals (locals, builtins), modules and metile's
            # own functions cannot change what a kernel means between launches.
            if value is MISSING or has_attributes(value) or \
                    hasattr(value, "__metile_builtin__"):
                continue
            shown = None if _by_identity(value) else _contents(value)
            self._refs.append((get, value, shown))
            if getattr(value, "__metile_inline__", False):
                self._walk(value.__wrapped__, seen)
            elif getattr(value, "__metile_kernel__", False):
                self._walk(value.fn, seen)  # called from this kernel: inlined

    def changed(self) -> bool:
        for get, value, shown in self._refs:
            now = get()
            if now is value and shown is None:
                continue
            # by identity, or (lists, dicts, namespaces, arrays) by their text: the same
            # object edited in place is a change too; an equal number or tuple made anew
            # (an attribute such as an array's `.shape` builds one a read) is not
            if shown is not None:
                if _contents(now) != shown:
                    return True
            elif now is not value and not (type(now) is type(value) and _plain(value)
                                           and repr(now) == repr(value)):
                return True
        return False


def _plain(value) -> bool:
    """Numbers, strings and tuples of them: their repr is their value (-0.0 and NaN
    included, which == would not keep)."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, (int, float, bool, str, bytes, type(None)))


def _dict_getter(d: dict, name: str):
    return lambda: d.get(name, MISSING)


def _cell_getter(cell):
    def get():
        try:
            return cell.cell_contents
        except ValueError:
            return MISSING
    return get


def _attr_getter(owner, attr: str):
    return lambda: getattr(owner, attr, MISSING)


def _chain_getter(root, attrs: tuple):
    return lambda: follow(root(), attrs)
