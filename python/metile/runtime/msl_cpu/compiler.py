"""Compile kernel translation units with clang and cache the libraries.

The cache key is the full generated source, the compiler's identity and
version, the flags, and a hash of the shim headers: a kernel is compiled once
per machine and reused across processes (on-disk cache) and within one
(in-memory cache).  Concurrent processes building the same kernel serialise
on a file lock and publish the library by atomic rename.

Loading a damaged shared object can kill the process (a truncated file maps
pages past its end: SIGBUS inside dlopen), so each library's size and SHA-256
are recorded beside it when it is written and checked before it is handed
out; one that fails is rebuilt.  A cache directory that cannot be written
costs only the reuse: kernels are built in a private temporary directory, with
a warning.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

INCLUDE_DIR = Path(__file__).parent / "include"

# Debian 12's default clang is 14, which lacks usable _Float16 on x86; bfloat
# arithmetic needs clang >= 17.  Try the versioned names first.
_CANDIDATES = [f"clang++-{v}" for v in range(22, 16, -1)] + ["clang++"]
MIN_CLANG = 17

INSTALL_HINT = (
    "metile's MSL CPU runtime needs clang++ >= 17 with compiler-rt "
    "(Debian/Ubuntu: `apt-get install clang-19 libclang-rt-19-dev`), "
    "or set METILE_CXX to a suitable clang++."
)

_FLAGS = [
    "-std=c++20",
    "-O2",
    "-fPIC",
    "-shared",
    "-fno-strict-aliasing",
    # MSL has no exceptions: a kernel's `throw` (or try/catch) is a compile error, as
    # Metal's; compiled in, an uncaught throw terminated the Python process.
    "-fno-exceptions",
    # C++ lets the compiler assume every loop without side effects ends, so a
    # kernel's endless loop would be deleted and return garbage at once; a GPU
    # would spin.  Keep such loops, so the METILE_MSL_TIMEOUT_S watchdog and
    # Ctrl-C see them.
    "-fno-finite-loops",
    # Integer arithmetic wraps, as Triton's (LLVM's add/mul carry no `nsw`) and a GPU's;
    # C++'s signed overflow is undefined, and clang folds `(x + 1) > x` to true.
    "-fwrapv",
    # A divisor the compiler can prove zero (`x / 0`, `x / (a - a)`) is C++'s undefined
    # behaviour, and clang deleted the store it fed: no error, an unwritten output.  A
    # checked division traps instead (x86: `ud1` with the check's kind, which the runtime
    # reports as the division by zero it is), at a compare and branch a division.
    "-fsanitize=integer-divide-by-zero",
    "-fsanitize-trap=integer-divide-by-zero",
    # Likewise a load through a pointer known to be null was deleted, not made.
    "-fno-delete-null-pointer-checks",
    # Round every half/bfloat operation like the GPU instead of keeping
    # float intermediates.
    "-Xclang",
    "-ffloat16-excess-precision=none",
    "-Xclang",
    "-fbfloat16-excess-precision=none",
    # bfloat conversions live in compiler-rt's builtins, not libgcc.
    "--rtlib=compiler-rt",
    "-fvisibility=hidden",
    # Probe every page of a large frame, so a kernel overflowing its fiber stack
    # hits the guard page (a reported fault) instead of jumping past it into
    # other memory.
    "-fstack-clash-protection",
    "-Wno-unknown-attributes",
    "-Wno-c++11-narrowing",
    "-Wno-ignored-attributes",
    "-ferror-limit=8",
]
if os.uname().machine in ("x86_64", "AMD64"):
    _FLAGS.append("-mf16c")
else:  # Metal's `char` (an int8 element) is signed; aarch64 Linux's is not
    _FLAGS.append("-fsigned-char")


class MslCompileError(RuntimeError):
    """The kernel's MSL did not compile; the message holds clang's diagnostics."""


@functools.lru_cache(maxsize=None)
def find_compiler() -> tuple[str, str]:
    """(path, version banner) of the clang++ used for kernels."""
    candidates = [os.environ["METILE_CXX"]] if os.environ.get("METILE_CXX") else _CANDIDATES
    for name in candidates:
        path = shutil.which(name)
        if not path:
            continue
        banner = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        match = re.search(r"clang version (\d+)", banner)
        if match and int(match[1]) >= MIN_CLANG:
            return path, banner.splitlines()[0]
    if os.environ.get("METILE_CXX"):
        raise RuntimeError(f"[metal_kernel] METILE_CXX={os.environ['METILE_CXX']!r} is not a "
                           f"clang++ {MIN_CLANG} or later on PATH; unset it to search for one, "
                           f"or point it at one. {INSTALL_HINT}")
    raise RuntimeError(f"[metal_kernel] no suitable C++ compiler found. {INSTALL_HINT}")


@functools.lru_cache(maxsize=None)
def shim_fingerprint() -> str:
    h = hashlib.sha256()
    for path in sorted(INCLUDE_DIR.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(INCLUDE_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


_usable_dirs: dict[Path, Path] = {}


def cache_dir() -> Path:
    """Where libraries are built and kept: `$METILE_CACHE_DIR/msl_cpu`, or a
    private temporary directory (with a warning) when that cannot be written."""
    from ... import settings
    path = settings.cache_root() / "msl_cpu"
    usable = _usable_dirs.get(path)
    if usable is None:
        usable = _usable_dirs[path] = _writable_or_private(path)
    return usable


def _writable_or_private(path: Path) -> Path:
    # Probing with a real file, not os.access: as root, permission bits do
    # not stop writes, and a read-only mount or a path through a regular file
    # is only found by trying.
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return path
    except OSError as e:
        from ..cache import warn_unwritable

        warn_unwritable(path, e, "compiled kernels are not kept between runs, so each process "
                              "compiles them again")
        return _private_dir()


@functools.lru_cache(maxsize=None)
def _private_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="metile-msl-cpu-"))
    atexit.register(shutil.rmtree, path, True)
    return path


# Paths whose library passed the check in this process, with the file's
# identity then: a library is hashed once per process, not once per load.
_verified: dict[Path, tuple] = {}


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _intact(library: Path) -> bool:
    """Whether `library` is exactly the file its record describes."""
    try:
        st = library.stat()
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        if _verified.get(library) == identity:
            return True
        size, digest = _record_path(library).read_text().split()
        if int(size) != st.st_size or digest != _digest(library):
            return False
    except (OSError, ValueError):
        return False
    _verified[library] = identity
    return True


def _publish(built: Path, target: Path) -> None:
    # The record goes first: a reader that sees the new library with the old
    # record fails the check and waits on the lock, where both are current.
    record = built.with_name(built.name + ".sha256")
    record.write_text(f"{built.stat().st_size} {_digest(built)}\n")
    os.replace(record, _record_path(target))
    os.replace(built, target)


def _key(source: str, flags: list[str]) -> str:
    compiler, banner = find_compiler()
    h = hashlib.sha256()
    for part in (source, compiler, banner, " ".join(flags), shim_fingerprint()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _diagnostics(stderr: str) -> str:
    # Keep the diagnostics about the user's code; clang's notes from inside
    # the shim rarely help a kernel author.
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return "\n".join(lines[:60])


def _run(args: list[str], label: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise MslCompileError(f"[metal_kernel] kernel '{label}' failed to compile:\n{_diagnostics(result.stderr)}")


# libraries that could not be published where they belong (target -> private copy)
_kept_privately: dict[Path, Path] = {}


def compile_library(source: str, label: str) -> Path:
    """Path of the shared library for `source`, compiling it on a cache miss."""
    compiler, _ = find_compiler()
    flags = _FLAGS + [f"-I{INCLUDE_DIR}"]
    key = _key(source, flags)
    directory = cache_dir()
    target = directory / f"{key}.so"
    if _intact(target):
        return target
    if target in _kept_privately and _intact(_kept_privately[target]):
        return _kept_privately[target]
    lock = FileLock(str(target) + ".lock")
    try:
        lock.acquire()
    except OSError as e:
        # (another user's lock left in a shared cache, or a directory where it goes): the
        # cache stays usable for reading; this library is built and kept privately
        private = _keep_privately(target, f"cannot take the compile lock {target}.lock ({e})")
        if not _intact(private):
            _build(source, key, label, compiler, flags, _private_dir(), private)
        return private
    try:
        if _intact(target):
            return target
        return _build(source, key, label, compiler, flags, directory, target)
    finally:
        lock.release()


def _build(source, key, label, compiler, flags, directory: Path, target: Path) -> Path:
    """Compile `source` in a temporary folder under `directory` and publish it at
    `target` (or, where it cannot go, in the private folder)."""
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        src = Path(tmp) / f"{key}.cpp"
        src.write_text(source)
        out = Path(tmp) / f"{key}.so"
        _run([compiler, *flags, str(src), "-o", str(out)], label)
        try:
            _publish(out, target)
        except OSError as e:   # (a directory, say, where the library goes)
            private = _keep_privately(target, f"cannot keep the compiled kernel at {target} ({e})")
            _publish(out, private)
            return private
    return target


def _keep_privately(target: Path, why: str) -> Path:
    """The private folder's path for `target`'s library, remembered for this process, with
    a warning saying why the shared cache cannot hold it."""
    import warnings
    warnings.warn(f"metile: {why}; the kernel is compiled in a private folder, again in each "
                  f"process", RuntimeWarning, stacklevel=3)
    private = _kept_privately[target] = _private_dir() / target.name
    return private
