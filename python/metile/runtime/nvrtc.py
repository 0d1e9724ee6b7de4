"""NVRTC, found at run time, compiling CUDA translation units to cached cubins.

MLX's `cuda_kernel` compiles with NVRTC for the device's `sm_XY`; instructions
of an architecture-specific target (Hopper's `wgmma` needs `sm_90a`) are not
available there, so metile compiles such kernels itself and launches the cubin
(`CudaKernel(arch=...)`).  NVRTC needs no GPU: it compiles for any
architecture on any Linux machine.

The library is the first of:
  1. `$METILE_NVRTC`, the path of a libnvrtc.so;
  2. a libnvrtc already mapped into this process (MLX's CUDA build links it);
  3. the `nvidia-cuda-nvrtc` pip wheel;
  4. `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda` (`lib64/libnvrtc.so*`).
Headers (`cuda_fp16.h`, CCCL's `cuda/std/limits`) come from the include
directory beside that library first, then the wheels', the toolkits' and MLX's
own `include/cccl`.

Cubins are cached in memory and under `settings.cache_root()/cuda`, keyed by
the source, the architecture, NVRTC's version and the options.  A file is
published by atomic rename with its size and SHA-256 recorded beside it and
checked on read, so a truncated or damaged file is compiled again; a cache
directory that cannot be written costs only the reuse, with a warning.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from .. import settings
from ..errors import CompilationError

_ARCH = re.compile(r"sm_\d{2,3}[af]?")
# Enough of NVRTC's log to see the first errors; the rest is usually their echoes.
LOG_LINES = 60
ELF_MAGIC = b"\x7fELF"


class NvrtcUnavailable(RuntimeError):
    """No usable NVRTC (or its headers) was found; the message says where it looked."""


@dataclass(frozen=True)
class Toolkit:
    library: str               # path of libnvrtc.so
    includes: tuple[str, ...]  # -I directories, searched in order
    origin: str                # how the library was found, for messages


def _nvidia_wheel_roots() -> list[str]:
    """Folders such as site-packages/nvidia/cu13 holding lib/libnvrtc.so*."""
    try:
        import nvidia
    except ImportError:
        return []
    roots = []
    for base in getattr(nvidia, "__path__", []):
        for lib in sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*"))):
            roots.append(os.path.dirname(os.path.dirname(lib)))
    return list(dict.fromkeys(roots))


def _cuda_homes() -> list[str]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return list(dict.fromkeys(h for h in homes if h and os.path.isdir(h)))


def _mapped_nvrtc() -> str | None:
    """A libnvrtc this process has loaded already (MLX's CUDA backend links it):
    using the same copy avoids mixing two NVRTC versions in one process."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)
        path = fields[5].strip() if len(fields) == 6 else ""
        if path.startswith("/") and re.fullmatch(r"libnvrtc\.so(\.[\d.]+)?", os.path.basename(path)):
            return path
    return None


def _library() -> tuple[str, str]:
    """(path of libnvrtc, how it was found)."""
    explicit = os.environ.get("METILE_NVRTC")
    if explicit:
        if not os.path.isfile(explicit):
            raise settings.SettingError(
                f"METILE_NVRTC={explicit!r} is not a file; set it to the path of libnvrtc.so "
                f"(e.g. .../site-packages/nvidia/cu13/lib/libnvrtc.so.13) or unset it to search "
                f"the loaded libraries, the nvidia-cuda-nvrtc wheel and $CUDA_HOME")
        return explicit, "METILE_NVRTC"
    mapped = _mapped_nvrtc()
    if mapped:
        return mapped, "loaded in this process"
    for root in _nvidia_wheel_roots():
        return sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so*")))[0], "nvidia-cuda-nvrtc wheel"
    for home in _cuda_homes():
        found = sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
        if found:
            return found[0], home
    raise NvrtcUnavailable(
        "[cuda_kernel] NVRTC not found: set METILE_NVRTC to a libnvrtc.so, install the "
        "nvidia-cuda-nvrtc, nvidia-cuda-runtime and nvidia-cuda-cccl wheels, or set CUDA_HOME "
        f"to a CUDA toolkit (looked in: the loaded libraries, the nvidia wheels, "
        f"{', '.join(_cuda_homes()) or 'no CUDA_HOME, CUDA_PATH or /usr/local/cuda'})")


def _include_dirs(library: str) -> tuple[str, ...]:
    bases = [os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(library))), "include"),
             os.path.join(os.path.dirname(os.path.dirname(library)), "include")]
    bases += [os.path.join(root, "include") for root in _nvidia_wheel_roots()]
    bases += [os.path.join(home, "include") for home in _cuda_homes()]
    dirs = []
    for base in bases:
        dirs += [base, os.path.join(base, "cccl")]
    dirs.append(os.path.join(os.path.dirname(mx.__file__), "include", "cccl"))
    dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
    for header in ("cuda_fp16.h", os.path.join("cuda", "std", "limits")):
        if not any(os.path.exists(os.path.join(d, header)) for d in dirs):
            raise NvrtcUnavailable(
                f"[cuda_kernel] NVRTC at {library} has no {header} to include (searched: "
                f"{', '.join(dirs) or 'nothing'}); install the nvidia-cuda-runtime and "
                f"nvidia-cuda-cccl wheels or set CUDA_HOME to a CUDA toolkit")
    return tuple(dirs)


@functools.lru_cache(maxsize=None)
def _find(_env: tuple) -> Toolkit:
    library, origin = _library()
    return Toolkit(library, _include_dirs(library), origin)


def find_toolkit() -> Toolkit:
    """The NVRTC library and include directories this process uses (see the
    module docstring for the search order); raises NvrtcUnavailable or, for a
    bad METILE_NVRTC, settings.SettingError."""
    env = tuple(os.environ.get(k) for k in ("METILE_NVRTC", "CUDA_HOME", "CUDA_PATH"))
    return _find(env)


@functools.lru_cache(maxsize=None)
def _load(library: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(library)
    except OSError as e:
        raise NvrtcUnavailable(f"[cuda_kernel] cannot load NVRTC from {library}: {e}") from None
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for fn in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for fn in ("nvrtcGetProgramLog", "nvrtcGetCUBIN"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    return lib


def version(toolkit: Toolkit | None = None) -> tuple[int, int]:
    lib = _load((toolkit or find_toolkit()).library)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def options(arch: str, toolkit: Toolkit | None = None) -> list[str]:
    """NVRTC's options for `arch`: no -lineinfo, so the cubin (and its key) does
    not depend on where the source was."""
    return [f"--gpu-architecture={arch}", "-std=c++17",
            *(f"-I{d}" for d in (toolkit or find_toolkit()).includes)]


def compile_program(lib, program, opts) -> tuple[int, str]:
    """(NVRTC's status, its log) of compiling a created program with `opts`."""
    opts = [o.encode() for o in opts]
    status = lib.nvrtcCompileProgram(program, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    return status, log.value.decode(errors="replace")


def run_nvrtc(source: str, arch: str, toolkit: Toolkit | None = None,
              extra: tuple[str, ...] = ()) -> tuple[bool, str, bytes | None]:
    """One NVRTC compile, uncached: (success, NVRTC's log, cubin or None); `extra`
    options such as --ptxas-options=-v (resource reports in the log)."""
    toolkit = toolkit or find_toolkit()
    lib = _load(toolkit.library)
    program = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"metile.cu", 0, None, None)
    if status != 0:
        return False, f"nvrtcCreateProgram failed: {lib.nvrtcGetErrorString(status).decode()}", None
    try:
        status, text = compile_program(lib, program, (*options(arch, toolkit), *extra))
        if status != 0:
            return False, text or lib.nvrtcGetErrorString(status).decode(), None
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(program, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(program, cubin) != 0:
            return False, f"nvrtcGetCUBIN failed for {arch} (a virtual architecture has no cubin)", None
        return True, text, cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def check_arch(arch) -> str:
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ValueError(f"[cuda_kernel] arch must name a real GPU architecture such as 'sm_90a' or "
                         f"'sm_80' (NVRTC builds a cubin for it), got {arch!r}")
    return arch


def cache_dir() -> Path:
    return settings.cache_root() / "cuda"


def _key(source: str, arch: str, toolkit: Toolkit) -> str:
    h = hashlib.sha256()
    for part in (source, arch, "%d.%d" % version(toolkit), " ".join(options(arch, toolkit))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _read(path: Path) -> bytes | None:
    """The cubin at `path` if it is exactly what its record describes."""
    try:
        data = path.read_bytes()
        size, digest = _record(path).read_text().split()
    except (OSError, ValueError):
        return None
    if int(size) != len(data) or not data.startswith(ELF_MAGIC) or \
            hashlib.sha256(data).hexdigest() != digest:
        return None
    return data


def _write(path: Path, data: bytes) -> None:
    from .cache import shareable

    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # The record goes first: a reader that sees the new cubin with an old
        # record fails the check and compiles, never loads a damaged file.
        for target, content in ((_record(path), f"{len(data)} {hashlib.sha256(data).hexdigest()}\n".encode()),
                                (path, data)):
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
            try:
                shareable(fd)
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
                os.replace(tmp, target)
            except BaseException:
                os.unlink(tmp)
                raise
    except OSError as e:
        from .cache import warn_unwritable

        warn_unwritable(directory, e, "compiled CUDA kernels are not kept between runs, so each "
                                      "process compiles them again")


_memory: dict[str, bytes] = {}


def compile(source: str, arch: str, label: str = "kernel") -> bytes:
    """The cubin of `source` for `arch` (e.g. "sm_90a"), compiled on a cache miss.
    A source NVRTC rejects raises CompilationError with the arch and NVRTC's log."""
    check_arch(arch)
    toolkit = find_toolkit()
    key = _key(source, arch, toolkit)
    cubin = _memory.get(key)
    if cubin is not None:
        return cubin
    path = cache_dir() / f"{key}.cubin"
    cubin = _read(path)
    if cubin is None:
        ok, log, cubin = run_nvrtc(source, arch, toolkit)
        if not ok:
            lines = log.strip().splitlines()
            shown = "\n".join(lines[:LOG_LINES]) + (f"\n... ({len(lines) - LOG_LINES} more lines)"
                                                    if len(lines) > LOG_LINES else "")
            err = CompilationError(f"[cuda_kernel] NVRTC ({toolkit.library}) could not compile "
                                   f"kernel '{label}' for {arch}:\n{shown}")
            err.arch, err.log = arch, log
            raise err
        _write(path, cubin)
    _memory[key] = cubin
    return cubin
