"""METILE_* environment settings, read and validated in one place.

A setting with a value metile does not understand is an error naming the
variable, its value and what is accepted: a typo such as
`METILE_RACE_CHECK=yes please` must not silently leave a check off.
Unknown words in a list setting (METILE_DEBUG) are a warning, since a
misspelt debug switch costs only output.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

# What METILE_DEBUG may name (comma-separated): the compile steps that print or
# dump what they produced (compiler/pipeline.py), and older words for the same;
# "asserts" compiles kernels with their device_assert checks (debug_asserts).
DEBUG_WORDS = ("uniformity", "pointer_recurrence", "plan_schedule", "lower_tiles",
               "lower_fragments", "emit_msl", "emit_cuda", "tile_ir", "thread_ir", "msl", "cuda",
               "schedule", "asserts", "op_nodes")


# os.environ's own dict where CPython keeps one (POSIX; os.environ writes and
# monkeypatch.setenv update it): os.environ.get encodes each key and decodes each value,
# ~0.7 us a read, and a cached launch's key reads six settings (runtime/dispatch.py).
_ENVIRON_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
if not isinstance(_ENVIRON_DATA, dict):
    _ENVIRON_DATA = None


def raw_values(names: tuple[str, ...]) -> tuple:
    """The raw values of the environment variables `names` (None where unset), compared
    only for equality (a cached launch's key): bytes where os.environ's dict is read
    directly, else str."""
    if _ENVIRON_DATA is None:
        return tuple(os.environ.get(n) for n in names)
    return tuple(map(_ENVIRON_DATA.get, _encoded(names)))


def raw_source(names: tuple[str, ...]) -> tuple[dict, tuple] | None:
    """(os.environ's dict, the keys raw_values reads there for `names`): what a check in
    C++ reads to compare raw_values(names) with an earlier result without building it
    (runtime/dispatch.py, _ext.LaunchGuard).  None where raw_values reads os.environ.get."""
    if _ENVIRON_DATA is None:
        return None
    return _ENVIRON_DATA, _encoded(names)


_ENCODED: dict = {}


def _encoded(names: tuple[str, ...]) -> tuple:
    found = _ENCODED.get(names)
    if found is None:
        found = _ENCODED[names] = tuple(os.fsencode(n) for n in names)
    return found


def _get(name: str, default: str | None = None) -> str | None:
    """os.environ.get(name), read from os.environ's own dict where there is one (a
    launch of new arguments reads a dozen settings; os.environ.get encodes each name and
    goes through the mapping's Python methods)."""
    if _ENVIRON_DATA is None:
        return os.environ.get(name, default)
    raw = _ENVIRON_DATA.get(_encoded((name,))[0])
    return default if raw is None else os.fsdecode(raw)


class SettingError(ValueError):
    """An environment variable metile reads holds a value it does not accept."""


def flag(name: str, default: bool = False) -> bool:
    """A boolean setting: empty, 0/false/no/off or 1/true/yes/on; unset is `default`."""
    raw = _get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean; use 1 (on) or 0 (off)")


def wgmma_variant() -> str | None:
    """METILE_CUDA_WGMMA: "tma" (the default: warpgroups that also issue the copies, one
    product group in flight; the operand tiles arrive by bulk tensor copies where a check
    before the K loop proves each operand a strided 2-D tensor bounded by its masks
    (gemm_wgmma.bulk_tensor_form), else as under "whole"), "whole" (16-byte cp.async
    groups, with a copy of the K loop without per-tile copy tests where a check before the
    loop proves every copy a whole or empty group), "1" (cp.async with the per-tile tests
    only), "ws" (warp-specialized: a producer warpgroup copies) or None (0: no warpgroup
    MMA, GEMMs on sm_90 take mma.sync).  Measured on the H200 with a fused epilogue,
    float16, against mx.compile in the same run: 4096^3 257.7 us for "tma" (mx.compile
    235.3) against 271-285 for "whole" (227-240); 8192^3 1830 against 2013-2216 (mx.compile
    1781-1848); "1" 370-381 at 4096^3, ws 478, mma.sync 2620
    (benchmarks/results/h200-gemm-float16-wgmma-*-2026-12-01.json)."""
    value = choice("METILE_CUDA_WGMMA", ("0", "1", "ws", "whole", "tma"), "tma")
    return None if value == "0" else value


def cuda_scalars() -> str | None:
    """METILE_CUDA_SCALARS: how CUDA kernels receive their int32/float32/bool runtime
    scalars: "value" (kernel parameters by value, precompiled_cuda_kernel's `scalars`;
    every kernel with such a scalar is then compiled by metile's NVRTC and launched
    precompiled, for its target's architecture unless it names one) or "array" (each a 0-d
    MLX array read through its pointer, as MLX's cuda_kernel passes them).

    The default is "value" wherever metile finds NVRTC and the CUDA headers
    (runtime/nvrtc.py), else "array".  Measured on the H200
    (benchmarks/results/h200-gemm-1024-scalars-kernel-durations-2026-12-01.txt, ncu): the
    1024^3 float16 GEMM's kernel took 27-30 us with arrays and 13 us by value (128x128
    tile; cuBLAS 7.1), and an eager ops.matmul's host time fell from 528 to 72 us.  The
    likely cause, not isolated (a one-thread kernel reading one 0-d array showed no
    difference, tools/probes/launch_floor.py): MLX keeps every allocation of at most 8
    bytes in one managed pool advised ReadMostly.  None when unset: the backend record decides
    (compiler/backend.py, resolve_backend)."""
    return choice("METILE_CUDA_SCALARS", ("array", "value"), None)


def cuda_launch() -> str:
    """METILE_CUDA_LAUNCH: how a cubin metile compiled is launched: "metile" (the default
    where metile's C++ layer was built against MLX's CUDA backend: its own MLX primitive,
    the module loaded once per device, csrc/cuda_launch.cpp) or "mlx"
    (mx.fast.precompiled_cuda_kernel).  A launch with an `init_value` always takes "mlx"
    (its outputs are filled by MLX's fill kernel).  Measured on the H200 (MLX 0.32.4): MLX's
    precompiled launch hashes the whole cubin on every evaluation, so a no-op kernel from a
    161 KB module cost 45.5 us per call against 8.8 us from a 3 KB one, and the 1024^3
    GEMM's 116 KB cubin ~20 us per call on top of its 10 us kernel
    (benchmarks/results/h200-memory-form-module-size-2026-12-01.json)."""
    return choice("METILE_CUDA_LAUNCH", ("metile", "mlx"), "metile")


def op_nodes() -> bool:
    """METILE_OP_NODES: whether a metile op under a transform, and a replayed eager op call,
    is one MLX node (`MetileOp`, csrc/op_node.h: the default) or its launches, reshapes and
    copies inside mx.custom_function's nodes as before the thirty-sixth session (0: a
    switch should the one-node form misbehave somewhere).  Read when metile is imported."""
    return flag("METILE_OP_NODES", True)


def wgmma_refill() -> str:
    """METILE_WGMMA_REFILL: what orders a stage's refill after its products in the
    warpgroup GEMM's bulk-tensor (TMA) loop (passes/gemm_wgmma.py): "empty" (the default:
    each stage also has an "empty" mbarrier every warp arrives at once its wait for
    products shows the stage's tile done; thread 0 waits on it, after issuing the step's
    products, before refilling the stage; no block barrier in the loop) or "barrier" (a
    block barrier every K step, after which thread 0 copies).  The step's block barrier was
    the top stall of the 512x11008x4096 float16 product (ncu, H200, s107: 2,452 samples);
    "empty" against it at the MLP's shapes (s112, tools/probes/refill_order.py): the dual
    GEMM 152.8 -> 147.2 us at T=512 and 608.8 -> 599.6 at 2048, 2048x11008x4096
    323.1 -> 314.1, the other products within 1%."""
    return choice("METILE_WGMMA_REFILL", ("barrier", "empty"), "empty")


def staging_ahead() -> bool:
    """METILE_STAGING_AHEAD: whether a GEMM's operand tile that the threads evaluate while
    staging it (a weight dequantized inside the warpgroup GEMM: quantized_matmul's fused
    GEMM) loads its packed words, scales and biases one K step ahead into registers
    (passes/gemm_async.py `carried_loads`; the default) or in the step that stores it, as
    before the forty-second session (0: the A/B switch of tools/probes/staging_ahead.py)."""
    return flag("METILE_STAGING_AHEAD", True)


def mixed_bulk() -> bool:
    """METILE_MIXED_BULK: whether a warpgroup GEMM with an operand tile the threads compute
    while staging it (quantized_matmul's fused GEMM: the dequantized weight) takes its
    loaded operand (x) by bulk tensor copies (TMA), one thread issuing them, the threads
    evaluating the computed tile beside them (passes/gemm_wgmma.py `_wgmma_tma_steps`), or
    by every thread's 16-byte cp.async groups (the default).  Built in the forty-second
    session to take x's copies (~90 of the 256x128 pair GEMM's 402 SASS instructions a K
    step and thread) out of a loop whose warps wait on their own instruction stream (ncu
    s148: 0.40 issued a cycle a scheduler, 2 warps each).  Measured (H100, s149) it wins
    on that tile at 512 rows (110.4 against 113.9 us) and loses on the 128x256 tile and at
    128 rows, so it stays off here and a configuration asks it for its own launches
    (quantized_ops.WGMMA_PAIRS_TALL's BULK_X)."""
    return flag("METILE_MIXED_BULK", False)


def wgmma_dual() -> str:
    """METILE_WGMMA_DUAL: how a dual GEMM (ops.gated_mlp's kernel) multiplies on Hopper's
    warpgroup unit: "split" (the default: one m64nBN product per B tile, each re-reading
    the A tile from shared memory) or "joined" (where both weights are read as stored,
    (N, K), with BLOCK_K 64 and 2 BLOCK_N <= 256: the two B tiles adjacent in each stage,
    one m64n(2 BLOCK_N) product over both, the up projection's accumulators the gate's
    columns + BLOCK_N; passes/gemm_wgmma.py).  Off: measured on the H200 (float16,
    tools/probes/mlp_parts.py) it is no faster than the split form - 150.5 against 151.0
    us at T=512, 602.2 against 593.5 at T=2048 (s77; s76: 156.4/161.3, 630.2/641.6)."""
    return choice("METILE_WGMMA_DUAL", ("split", "joined"), "split")


def wgmma_enabled() -> bool:
    """Unless METILE_CUDA_WGMMA=0: GEMMs on sm_90 may take the warpgroup MMA path."""
    return wgmma_variant() is not None


def choice(name: str, allowed: tuple[str, ...], default: str | None = None) -> str | None:
    raw = _get(name)
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise SettingError(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return raw


def target(known) -> str | None:
    """METILE_TARGET: the hardware family to plan and emit for (e.g. apple10 to see
    and run an M5 plan on this machine), or None for the device's own.  A name not
    in `known` (schedule.targets.TARGETS, passed in: this module imports nothing of
    metile's) is an error listing the known ones."""
    raw = _get("METILE_TARGET")
    if raw is None or raw.strip() == "":
        return None
    name = raw.strip()
    if name not in known:
        raise SettingError(f"METILE_TARGET={raw!r} is not a known target; known: "
                           f"{', '.join(known)}")
    return name


def cache_root() -> Path:
    """Where metile keeps what it compiles and measures: $METILE_CACHE_DIR, else
    $XDG_CACHE_HOME/metile, else ~/.cache/metile.  Each cache is a folder below."""
    # "~/cache" written where no shell expands it (a .env file, a service unit) made a
    # folder named "~" in the working directory; blank values count as unset, as "" does
    explicit = (_get("METILE_CACHE_DIR") or "").strip()
    if explicit:
        return Path(os.path.expanduser(explicit))
    xdg = (_get("XDG_CACHE_HOME") or "").strip()
    return Path(os.path.expanduser(xdg or "~/.cache")) / "metile"


_warned: set[str] = set()


def debug_flags() -> set[str]:
    """The words of METILE_DEBUG; an unknown word warns once."""
    words = {w.strip() for w in _get("METILE_DEBUG", "").split(",") if w.strip()}
    unknown = sorted(words.difference(DEBUG_WORDS))
    if unknown and ",".join(unknown) not in _warned:
        _warned.add(",".join(unknown))
        warnings.warn(f"METILE_DEBUG: unknown word(s) {', '.join(unknown)}; known: "
                      f"{', '.join(DEBUG_WORDS)}", stacklevel=3)
    return words


def debug_asserts() -> bool:
    """METILE_DEBUG=asserts: kernels keep their device_assert checks (Triton's
    TRITON_DEBUG=1), unless a kernel or launch says debug=False."""
    return "asserts" in debug_flags()
