"""The strict Metal check: a kernel's full translation unit compiled with
`clang++ -std=c++14 -fsyntax-only` against include_strict/, a C++14 model of
the Metal API as strict as Metal's compiler (distinct address spaces, exact
simdgroup_matrix, simd_*, atomic and math signatures, no implicit vector
conversions; the model's header says what it rejects).  The runtime shim
(include/) is looser so that it can run everything Metal runs, and compiles as
C++20; this check is what keeps a kernel that passes on the CPU from failing
to compile on a Mac.

Metal Shading Language (up to MSL 3.2) is C++14.  Later C++ is refused: what
C++14 lacks outright (concepts, `auto` template parameters, class template
argument deduction) fails as it does on Metal, and what clang accepts in
C++14 only as an extension with a warning (if constexpr, structured bindings,
fold expressions, inline variables, nested namespace definitions, if/switch
initialisers, designated initialisers, hexadecimal floating literals) is an
error here too, as it is not MSL.

Enabled by METILE_MSL_STRICT=1 (the test suite turns it on) or by
`MetalKernel.check`.  A passing translation unit is remembered on disk next to
the compiled kernels, so each one is checked once per machine.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

from . import compiler

STRICT_INCLUDE_DIR = Path(__file__).parent / "include_strict"

# Kept from the runtime's flags: half/bfloat semantics.  Changed: the language
# is C++14, Metal's, with every later feature clang would accept as an
# extension an error.  Added: vectors convert only explicitly, as in Metal.
_FLAGS = [
    "-std=c++14",
    "-Werror=c++17-extensions",
    "-Werror=c++20-extensions",
    "-Werror=c++23-extensions",
    "-Werror=c++2c-extensions",
    "-fsyntax-only",
    "-fno-exceptions",   # MSL has none: throw and try are errors
    "-Xclang",
    "-ffloat16-excess-precision=none",
    "-Xclang",
    "-fbfloat16-excess-precision=none",
    "-flax-vector-conversions=none",
    "-Wno-unknown-attributes",
    "-Wno-ignored-attributes",
    "-Wno-c++11-narrowing",
    "-ferror-limit=8",
]
if os.uname().machine in ("x86_64", "AMD64"):
    _FLAGS.append("-mf16c")


def enabled() -> bool:
    """METILE_MSL_STRICT=1 (or the older METILE_MSL_CHECK_ADDRESS_SPACES=1)."""
    value = os.environ.get("METILE_MSL_STRICT") or os.environ.get("METILE_MSL_CHECK_ADDRESS_SPACES") or "0"
    if value not in ("0", "1"):
        from ...settings import SettingError   # (a ValueError, as every setting's error)
        raise SettingError(f"METILE_MSL_STRICT must be 0 or 1, got {value!r}")
    return value == "1"


def _fingerprint() -> str:
    # The flags too: a precompiled model is only valid in the language mode
    # it was built in.
    h = hashlib.sha256(compiler.shim_fingerprint().encode())
    h.update(" ".join(_FLAGS).encode())
    # And where the headers are: a precompiled header names them by absolute
    # path, so one built from a source checkout, used by a pip-installed copy
    # of the same headers, includes both and every definition twice.
    h.update(" ".join(_include_flags()).encode())
    for path in sorted(STRICT_INCLUDE_DIR.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(STRICT_INCLUDE_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


_model_fingerprint: str | None = None
# Every translation unit starts with these two includes; parsing them is most
# of a check's cost, so they are precompiled once per model version.
_PRELUDE = "#include <metal_stdlib>\n#include <metile_msl/mlx_utils.h>\n"


def _include_flags() -> list[str]:
    return [f"-I{STRICT_INCLUDE_DIR}", f"-I{compiler.INCLUDE_DIR}"]


def _precompiled_model(path: str) -> list[str]:
    """Flags that use a precompiled model header, built on first use; none
    (parse the headers each time) if the cache directory is not writable."""
    try:
        pch = compiler.cache_dir() / f"strict-{_model_fingerprint[:24]}.pch"
        if not pch.exists():
            with FileLock(str(pch) + ".lock"):
                if not pch.exists():
                    # The header stays: the precompiled file refers to it.
                    header = pch.with_suffix(".h")
                    header.write_text(_PRELUDE)
                    with tempfile.TemporaryDirectory(dir=pch.parent) as tmp:
                        out = Path(tmp) / "prelude.pch"
                        args = [path, *_FLAGS, *_include_flags(), "-x", "c++-header", str(header), "-o", str(out)]
                        args.remove("-fsyntax-only")
                        # Content is in the name; mtimes (a reinstall) must
                        # not invalidate it.
                        args[1:1] = ["-Xclang", "-fno-pch-timestamp"]
                        if subprocess.run(args, capture_output=True).returncode != 0:
                            return []
                        os.replace(out, pch)
        return ["-include-pch", str(pch)]
    except OSError:
        return []


# C++ that clang takes in C++14 but Metal's language does not have, found in the
# kernel's own text (its header and body; metile's generated parts are not scanned):
# (pattern, which segments, what Metal says).  Comments and literals are blanked first.
_NOT_METAL = [
    (re.compile(r"\bdouble\b"), ("header", "source"),
     "'double' is not a Metal type (MSL has no 64-bit float; use float)"),
    (re.compile(r"\bgoto\b"), ("header", "source"), "'goto' is not in MSL"),
    (re.compile(r"\bnew\b"), ("header", "source"), "'new' is not in MSL (no dynamic allocation)"),
    # (`= delete` declares a deleted function, which MSL has)
    (re.compile(r"(?<![=\s])\s*\bdelete\b|^\s*delete\b"), ("header", "source"),
     "'delete' is not in MSL (no dynamic allocation)"),
    (re.compile(r"\bvirtual\b"), ("header", "source"), "virtual functions are not in MSL"),
    (re.compile(r"\bstatic\b"), ("source",),
     "a static local variable is not in MSL (a kernel's locals are its thread's)"),
]
_LITERALS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def _segments(source: str):
    """(name, first line's text offset, text) of each `#line 1 "name"` segment."""
    parts = re.split(r'^#line 1 "([^"\n]*)"\n', source, flags=re.M)
    for i in range(1, len(parts) - 1, 2):
        yield parts[i], parts[i + 1]


def _refused_constructs(source: str) -> list[str]:
    """clang-style diagnostics for what _NOT_METAL finds in the kernel's header and body."""
    found = []
    for name, text in _segments(source):
        kind = "header" if name.endswith("(header)") else "source" if name.endswith("(source)") \
            else None
        if kind is None:
            continue
        # literals and comments blanked, their newlines kept, so lines stay where they were
        plain = _LITERALS.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
        for number, line in enumerate(plain.splitlines(), 1):
            for pattern, where, why in _NOT_METAL:
                if kind in where and pattern.search(line):
                    found.append(f"{name}:{number}: error: {why}")
    return found


def check(source: str, label: str) -> None:
    """Raises MslCompileError with clang's diagnostics if `source` is not valid
    against the strict Metal model."""
    refused = _refused_constructs(source)
    if refused:
        raise compiler.MslCompileError(
            f"[metal_kernel] kernel '{label}' failed to compile (strict Metal check, "
            f"METILE_MSL_STRICT=1):\n" + "\n".join(refused[:20]))
    global _model_fingerprint
    if _model_fingerprint is None:
        _model_fingerprint = _fingerprint()
    path, banner = compiler.find_compiler()
    h = hashlib.sha256()
    for part in (source, path, banner, " ".join(_FLAGS), _model_fingerprint):
        h.update(part.encode())
        h.update(b"\0")
    marker = None
    try:
        marker = compiler.cache_dir() / f"{h.hexdigest()[:32]}.strict-ok"
        if marker.exists():
            return
    except OSError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        pch = _precompiled_model(path)
        result = subprocess.run([path, *_FLAGS, *_include_flags(), *pch, str(src)], capture_output=True, text=True)
        if pch and result.returncode != 0:
            # Whatever the error, the headers decide: a damaged or stale
            # precompiled header must never fail a valid kernel.  If the unit
            # passes without it, the header is dropped (rebuilt next time).
            result = subprocess.run([path, *_FLAGS, *_include_flags(), str(src)], capture_output=True, text=True)
            if result.returncode == 0:
                Path(pch[1]).unlink(missing_ok=True)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()][:60]
        raise compiler.MslCompileError(
            f"[metal_kernel] kernel '{label}' failed to compile (strict Metal check, METILE_MSL_STRICT=1):\n"
            + "\n".join(lines)
        )
    if marker is not None:
        try:
            marker.touch()
        except OSError:
            pass
