"""Content keys and the on-disk cache of generated kernels.

A compiled specialization is identified by what determines its code, never
by a user-chosen name: the kernel's source, the source of every
@metile.inline helper it reaches, the values of the globals it reads, the
constexpr values, the argument kinds/dtypes/ranks, the lane geometry request,
the backend, and a fingerprint of the compiler's own source files.

The disk cache stores the generated source and launch metadata as JSON under
`settings.cache_root()/dsl` (`$METILE_CACHE_DIR`, default `~/.cache/metile`).  The backend's own
compile of that source is cached separately by the runtime that runs it.
Writes are atomic (write to a temp file, then rename); unreadable entries are
ignored and regenerated.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import types
import warnings
from pathlib import Path

from .. import settings
from ..language.dtypes import DType
from . import dependencies

_COMPILER_DIRS = ("compiler", "frontend", "ir", "passes", "codegen", "language", "schedule")
_fingerprint: str | None = None


def compiler_fingerprint() -> str:
    """Hash of the compiler's source files: a compiler change invalidates every entry."""
    global _fingerprint
    if _fingerprint is None:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        files = [root / "runtime" / "kernel.py", root / "runtime" / "cache.py", root / "errors.py"]
        for d in _COMPILER_DIRS:
            files += sorted((root / d).glob("*.py"))
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
        _fingerprint = h.hexdigest()[:16]
    return _fingerprint


def _describe(value, seen: set) -> str:
    if getattr(value, "__metile_inline__", False):
        return "inline:" + source_fingerprint(value.__wrapped__, seen)
    if getattr(value, "__metile_kernel__", False):
        # a kernel called from a kernel is inlined: its source is part of the caller's
        return "kernel:" + source_fingerprint(value.fn, seen)
    if isinstance(value, types.ModuleType):
        return "module:" + value.__name__
    if isinstance(value, (types.BuiltinFunctionType, type)):
        return f"builtin:{getattr(value, '__module__', '')}.{value.__qualname__}"
    if callable(value) and hasattr(value, "__metile_builtin__"):
        return "metile:" + value.__metile_builtin__
    if isinstance(value, (int, float, bool, str, type(None), DType, tuple)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, types.FunctionType):
        return f"function:{value.__module__}.{value.__qualname__}"
    return f"{type(value).__qualname__}:{dependencies.text(value)}"


def source_fingerprint(fn, seen: set | None = None) -> str:
    """Hash of `fn`'s source plus the globals/closure values it names (recursively
    through @metile.inline helpers and kernels called from the kernel)."""
    from ..frontend.source import function_source

    seen = set() if seen is None else seen
    if fn in seen:
        return "recursive"
    seen.add(fn)
    src = function_source(fn)
    h = hashlib.sha256(src.text.encode())
    # where it is: a failed device_assert names its file and line, compiled into the code
    # (the same text elsewhere reused a kernel naming the first one's place)
    h.update(f"@{src.file}:{src.first_line}:{src.indent};".encode())
    scope = {**fn.__globals__, **src.closure()}
    for name, attrs in dependencies.names(src.tree):
        if name not in scope:
            continue
        value = dependencies.follow(scope[name], attrs)
        if value is not dependencies.MISSING:
            # consts.SCALE, pkg.consts.SCALE, cfg.VAL: the value read, not only the
            # module's name or the object's repr
            h.update(f"{'.'.join((name, *attrs))}={_describe(value, seen)};".encode())
    # default values, evaluated when the function was defined: the source names the
    # expression (`s=FACTOR`), not the value it had - a helper's default fed by a changed
    # global reused the kernel built with the old one (a hostile trial)
    for value in fn.__defaults__ or ():
        h.update(f"default={_describe(value, seen)};".encode())
    for key, value in sorted((fn.__kwdefaults__ or {}).items()):
        h.update(f"default {key}={_describe(value, seen)};".encode())
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    return settings.cache_root() / "dsl"


def key_hash(parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def disk_load(key: str) -> dict | None:
    """The generated kernel stored under `key`, or None (none, unreadable, or damaged: the
    entry carries the sha256 of its contents, and a flipped bit in a cached source would
    otherwise compile and run another kernel)."""
    if settings.flag("METILE_DISABLE_DISK_CACHE"):
        return None
    path = cache_dir() / f"{key}.json"
    try:
        text = path.read_bytes()
    except OSError:                                 # (none yet, or unreadable)
        return None
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):            # (UnicodeDecodeError is a ValueError;
        entry = None                                # RecursionError: nested past the parser)
    if not (isinstance(entry, dict) and entry.get("key") == key
            and isinstance(entry.get("data"), dict)):
        why = "it is not a cache entry (truncated or overwritten)"
    elif entry.get("sha256") != _digest(entry["data"]):
        why = "its contents do not match their checksum"
    else:
        return dict(entry["data"], key=key)
    warnings.warn(f"metile: ignoring the damaged kernel cache entry {path} ({why}); "
                  f"generating the kernel again")
    return None
    return dict(entry["data"], key=key)


# The process's umask, read once (os.umask can only be read by setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def shareable(fd: int) -> None:
    """Give a file made by tempfile.mkstemp (0600) the mode an ordinary new file gets
    (0666 less the umask), so a cache directory shared by several users stays readable."""
    os.fchmod(fd, 0o666 & ~_UMASK)


def disk_store(key: str, data: dict) -> None:
    if settings.flag("METILE_DISABLE_DISK_CACHE"):
        return
    d = cache_dir()
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
        shareable(fd)
        data = json.loads(json.dumps(data))     # what a load will see (tuples as lists)
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "sha256": _digest(data), "data": data}, f)
        os.replace(tmp, d / f"{key}.json")
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        entry = d / f"{key}.json"
        if isinstance(e, IsADirectoryError) and str(e.filename2 or "") == str(entry):
            # (the folder is fine: this entry's own path is taken)
            warn_unwritable(entry, e, "this kernel's generated source is not kept between "
                                      "runs, so each process generates it again",
                            what="cache entry")
            return
        # A read-only or full cache directory only costs a recompile.
        warn_unwritable(d, e, "generated kernel sources are not kept between runs, so each process "
                              "generates them again")


_warned_dirs: set[str] = set()


def warn_unwritable(directory: Path, error: OSError, consequence: str,
                    what: str = "cache directory") -> None:
    """Warn, once per directory (or entry), that a cache cannot be written, why, and what
    it costs."""
    if str(directory) in _warned_dirs:
        return
    _warned_dirs.add(str(directory))
    reason = error.strerror or str(error)
    warnings.warn(
        f"metile: cannot write the {what} {directory} ({reason}); {consequence}. " +
        ("Point METILE_CACHE_DIR at a writable directory." if what == "cache directory" else
         "Remove what is there, or point METILE_CACHE_DIR elsewhere."),
        RuntimeWarning,
        stacklevel=3,
    )
