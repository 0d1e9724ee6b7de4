"""Target capabilities as data: one frozen description per target.

The planner reads these descriptions and never branches on a target's name,
so adding a target is adding an entry to `TARGETS`.  A `MatrixPath` says how a
matrix backend runs on a target: its fragment shape (the unit a SIMD-group grid
must tile into), operand dtypes it computes exactly, dtypes it accepts only
under relaxed precision, the staging it supports and whether its lane layout is
visible to metile.

Sources for the numbers: Apple's Metal feature-set tables (32 KiB threadgroup
memory, 1024 threads, SIMD width 32 on apple7+); MLX's own dispatch for the
M5 paths (`steel_gemm_fused_nax` instantiated for f16/bf16/f32 with 16x16
fragments; float32 only when TF32 is enabled); CUDA's static shared memory
limit of 48 KiB per block; more (dynamic shared memory, up to the opt-in maximum
of each compute capability) only for kernels the GEMM lowering lays out itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

_F32, _F16, _BF16 = "float32", "float16", "bfloat16"


@dataclass(frozen=True)
class MatrixUnit:
    """A matrix instruction one of metile's emitters spells."""

    name: str                      # reported as meta["matmul"]["fragment"]
    shape: tuple[int, int, int]    # (rows, columns, depth) of one fragment product
    dtypes: tuple[str, ...]        # operand dtypes it takes (accumulator: float32)
    relaxed_only: bool = False     # reduced precision: only with RELAXED_PRECISION=True
    convert: str | None = None     # operand conversion after loading (e.g. "tf32")
    async_copy: bool = False       # 16-byte asynchronous global->shared copies (gemm_async)
    lane_coords: bool = False      # the emitter can name each accumulator element's (row, column)
    # With lane_coords, for general products held in the accumulator layout
    # (passes/mma_layout.py): the xor lane masks joining the lanes that hold one row of a
    # fragment, and for each accumulator element a lane holds, which of the lane's rows
    # it lies in (0, 1, ...).  Empty: not offered to that layout.
    row_xor: tuple[int, ...] = ()
    acc_rows: tuple[int, ...] = ()
    # Warpgroup MMA (Hopper wgmma): 4 warps issue one m64nNk16 product from shared-memory
    # descriptors; N is the tile's width.  Only on the targets listed, compiled for `arch`.
    warpgroup: bool = False
    # Threads of the copying warpgroup that feeds warpgroup MMA (METILE_CUDA_WGMMA=ws);
    # 0: every thread copies and multiplies.  One warp was measured too few on the H200 (a
    # 128x256x64 tile is 3072 16-byte copies per K step; the warp's address arithmetic took
    # longer than the step's products: 0.40x of cuBLAS against 0.65x for the single-role
    # pipeline, benchmarks/results/h200-gemm-float16-wgmma-*.json).
    producer_threads: int = 0
    # K loops whose copies are proven whole-or-empty 16-byte groups before the loop run a
    # copy of the loop without per-tile alignment and edge tests (METILE_CUDA_WGMMA=whole,
    # the default; gemm_async.whole_group_copies); measured on the H200 at 4096^3 float16:
    # 266 us against 343 for the loop with the tests (tools/probes, CUDA events).
    whole_copies: bool = False
    # Operand tiles by bulk tensor copies (TMA, cp.async.bulk.tensor) where a check before
    # the K loop proves each a strided 2-D tensor bounded by its masks (METILE_CUDA_WGMMA=tma;
    # gemm_wgmma.bulk_tensor_form); measured on the H200 at 4096^3 float16 as a hand-written
    # loop: 206 us against 229.5 for the same loop with cp.async (cuBLAS 181; tools/probes).
    bulk_tensor: bool = False
    targets: tuple[str, ...] | None = None   # None: every target of the language
    arch: str | None = None                  # NVRTC architecture the instruction needs
    # The matrix backend (MatrixPath) this unit lowers, when it is not the SIMD-group (warp)
    # path: Metal 4 tensor ops (passes/gemm_tensor_ops.py) for "tensor_ops" and "nax".
    path: str | None = None

    @property
    def warp_specialized(self) -> bool:
        return self.producer_threads > 0

    def takes(self, dtype: str, relaxed: bool) -> bool:
        return dtype in self.dtypes and (relaxed or not self.relaxed_only)

    def fits_tile(self, tile) -> bool:
        """Whether a BM x BN x BK tile is made of this unit's products: for warpgroup
        MMA, whole 64-element swizzle atoms on every axis and BN <= 256 (the widest
        product); other units are checked against their fragment grid by the planner."""
        if not self.warpgroup:
            return True
        bm, bn, bk = tile
        return bm % 64 == 0 and bn % 64 == 0 and bk % 64 == 0 and bn <= 256

    def on(self, target_name: str) -> bool:
        return self.targets is None or target_name in self.targets


# The one table of the matrix instructions metile lowers GEMMs to, per language:
# the planner (MatrixPath.units), the GEMM lowering (passes/lower_matmul.plan_gemm)
# and the emitters (their fragment spellings) all read it.
MATRIX_UNITS: dict[str, tuple[MatrixUnit, ...]] = {
    # Metal 4 tensor ops (apple10): mpp::tensor_ops::matmul2d with execution_simdgroup,
    # operands as inline tensors over device memory, float32 cooperative destinations.
    # tensor_ops: one matmul2d per SIMD-group sub-tile; nax: the sub-tile decomposed into
    # 16x16x16 products (the NAX fragment MLX's nax.h multiplies).  The shape is the
    # granule a SIMD-group grid tiles into.
    # simdgroup_matrix: lane l holds row (l/4 & 4) + (l/2) % 4, so lanes l ^ 1 and l ^ 8
    # share its row (codegen/msl.py acc_coord)
    "msl": (MatrixUnit("simdgroup_matrix 8x8", (8, 8, 8), (_F32, _F16, _BF16), lane_coords=True,
                       row_xor=(1, 8), acc_rows=(0, 0)),
            MatrixUnit("matmul2d (tensor_ops: one product per SIMD-group sub-tile)", (16, 16, 16),
                       (_F32, _F16, _BF16), targets=("apple10",), path="tensor_ops"),
            MatrixUnit("matmul2d 16x16x16 (nax: NAX fragment products)", (16, 16, 16),
                       (_F32, _F16, _BF16), targets=("apple10",), path="nax")),
    # Tensor cores through mma.sync.  Strict float32 has no unit (FFMA register
    # tiles); TF32 only under the kernel's RELAXED_PRECISION=True.
    # Hopper first: wgmma reads both operands from swizzled shared memory (sm_90a only,
    # so these kernels are compiled by metile and launched precompiled).
    "cuda": (MatrixUnit("wgmma m64nNk16 (warpgroup)", (64, 8, 16), (_F16, _BF16),
                        async_copy=True, lane_coords=True, warpgroup=True, targets=("sm_90",),
                        arch="sm_90a"),
             MatrixUnit("wgmma m64nNk16 (warpgroup, whole-group copies)", (64, 8, 16),
                        (_F16, _BF16), async_copy=True, lane_coords=True, warpgroup=True,
                        whole_copies=True, targets=("sm_90",), arch="sm_90a"),
             MatrixUnit("wgmma m64nNk16 (warpgroup, bulk tensor copies)", (64, 8, 16),
                        (_F16, _BF16), async_copy=True, lane_coords=True, warpgroup=True,
                        whole_copies=True, bulk_tensor=True, targets=("sm_90",), arch="sm_90a"),
             MatrixUnit("wgmma m64nNk16 (warpgroup, warp-specialized)", (64, 8, 16),
                        (_F16, _BF16), async_copy=True, lane_coords=True, warpgroup=True,
                        producer_threads=128, targets=("sm_90",), arch="sm_90a"),
             # mma.sync: lane l holds rows l/4 and l/4 + 8 (elements 2, 3, 6, 7), shared
             # with lanes l ^ 1, l ^ 2 (codegen/cuda.py acc_coord)
             MatrixUnit("mma.sync m16n8k16 (16x16x16 fragments)", (16, 16, 16), (_F16, _BF16),
                        async_copy=True, lane_coords=True, row_xor=(1, 2),
                        acc_rows=(0, 0, 1, 1, 0, 0, 1, 1)),
             MatrixUnit("mma.sync m16n8k8 tf32 (16x16x8 fragments)", (16, 16, 8), (_F32,),
                        relaxed_only=True, convert="tf32")),
}


def ring_depth_limit(scalar_fma: bool) -> int:
    """The most ring stages chosen automatically: 4; scalar FMA 3 (H200, strict float32
    4096^3, 128x64x16 on 4 warps: 3128 us with 3 stages against 3336 with 4;
    tools/probes/ffma_variants.py)."""
    return 3 if scalar_fma else 4


def ring_depth(room: int, stage_bytes: int, scalar_fma: bool) -> int:
    """The automatic number of ring stages: as many as fit `room` bytes, from 2 up to
    `ring_depth_limit`."""
    return max(2, min(ring_depth_limit(scalar_fma), room // stage_bytes))


def ffma_async_copies(units) -> bool:
    """Whether a target with these matrix units stages scalar-FMA (float32) GEMM operands
    through the cp.async ring: its warp MMA copies 16-byte groups asynchronously (CUDA,
    sm_80+).  The copies do not depend on the unit that reads the stages.  (These three
    live with the units: the planner reports them and passes/gemm_async lowers with them;
    the schedule package imports no compiler pass.)"""
    return any(u.async_copy and not u.warpgroup for u in units)


def units_for(language: str, target_name: str, warpgroup: "bool | str | None"
              ) -> tuple[MatrixUnit, ...]:
    """The units GEMMs lower to for a target: its language's entries of MATRIX_UNITS, less
    those made for other targets, and less the warpgroup unit unless `warpgroup`
    (settings.wgmma_variant(): on by default since it ran on the H200, 7x the warp MMA's
    rate for float16; METILE_CUDA_WGMMA=0 keeps mma.sync)."""
    ws, tma = warpgroup == "ws", warpgroup == "tma"
    whole = warpgroup in ("whole", "tma")
    return tuple(u for u in MATRIX_UNITS[language]
                 if u.on(target_name) and (not u.warpgroup or
                                           (warpgroup and u.warp_specialized == ws
                                            and u.whole_copies == whole
                                            and u.bulk_tensor == tma)))


@dataclass(frozen=True)
class MatrixPath:
    backend: str
    fragment: tuple[int, int, int]           # (rows, columns, depth) of one matrix instruction
    dtypes: tuple[str, ...]                  # operand dtypes computed at full precision
    relaxed_dtypes: tuple[str, ...] = ()     # on the matrix unit only with relaxed precision
    fallback_dtypes: tuple[str, ...] = ()    # computed with scalar FMA under strict precision
    stagings: tuple[str, ...] = ("threadgroup", "device")
    opaque: bool = False                     # lane ownership hidden by the SDK
    layout: str = ""
    summary: str = ""                        # plural noun phrase used in plan reasons
    units: tuple[MatrixUnit, ...] = ()       # the instructions metile lowers this path to

    def unit_for(self, dtypes, relaxed: bool) -> MatrixUnit | None:
        """The unit the lowering uses for these operand dtypes: the first that takes
        them all (None: none does; the GEMM then runs as FFMA micro-tiles)."""
        return next((u for u in self.units if all(u.takes(d, relaxed) for d in dtypes)), None)

    def fragment_for(self, dtypes, relaxed: bool) -> tuple[int, int, int]:
        """The fragment the lowering uses for these operand dtypes: the first unit
        that takes them all, else the path's hardware fragment."""
        unit = self.unit_for(dtypes, relaxed)
        return self.fragment if unit is None else unit.shape


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    language: str                            # "msl" or "cuda": what codegen emits
    simd_width: int
    max_threads_per_threadgroup: int
    threadgroup_memory_bytes: int
    matrix_paths: tuple[MatrixPath, ...]     # in order of automatic preference for matmul
    vector_widths: tuple[int, ...] = (1, 4)
    has_tensor_ops: bool = False
    has_nax: bool = False
    notes: tuple[str, ...] = field(default=())
    # The target's own words in plan reasons (field names stay Metal's, as recorded).
    # The most shared memory one block may opt in to (CUDA: cudaFuncAttribute
    # MaxDynamicSharedMemorySize); 0: no opt-in beyond threadgroup_memory_bytes.
    shared_memory_optin_bytes: int = 0
    group_word: str = "SIMD-group"
    shared_word: str = "threadgroup memory"
    terms_note: str = ""

    @property
    def backends(self) -> tuple[str, ...]:
        return ("elementwise",) + tuple(p.backend for p in self.matrix_paths)

    def matrix_path(self, backend: str) -> MatrixPath | None:
        for p in self.matrix_paths:
            if p.backend == backend:
                return p
        return None

    def with_note(self, note: str) -> "Target":
        return replace(self, notes=self.notes + (note,))


@dataclass(frozen=True)
class Lowering:
    """What metile's code generators materialize, as opposed to what a target's
    hardware offers.  `plan_schedule` without one plans against the hardware alone
    (the contract table); compilation passes `LOWERING`, so an automatic plan
    never picks a path that is neither lowered nor planned, and an explicit
    request for one is refused as not implemented."""
    matrix_backends: tuple[str, ...] = ("simdgroup", "simdgroup_inline", "tensor_ops", "nax")
    device_staged_gemm: bool = False     # GEMM fragments loaded straight from device memory
    # Hardware paths planned as on the hardware although their lowering is still being
    # built: the plan and a plan-only report can be inspected (explain()) for any target
    # on any machine, while generating the kernel refuses as not implemented
    # (compiler/planning.py `unlowered`).  A backend moves to matrix_backends once lowered.
    planned_backends: tuple[str, ...] = ()

    def plans(self, backend: str) -> bool:
        return backend in self.matrix_backends or backend in self.planned_backends


LOWERING = Lowering()

_SG_LAYOUT = "simdgroup_matrix 8x8 fragments (opaque lane ownership)"
_APPLE_SG = MatrixPath("simdgroup", (8, 8, 8), (_F32, _F16, _BF16), layout=_SG_LAYOUT,
                       summary="SIMD-group matrix (simdgroup_matrix) multiply-accumulates into "
                               "float32 accumulators",
                       units=tuple(u for u in MATRIX_UNITS["msl"] if u.path is None))
_APPLE_INLINE = MatrixPath("simdgroup_inline", (8, 8, 8), (_F32, _F16), layout=_SG_LAYOUT,
                           summary="kernel-owned 8x8 fragments")
_TENSOR_OPS = MatrixPath("tensor_ops", (16, 16, 16), (_F32, _F16, _BF16), stagings=("device",),
                         opaque=True,
                         layout="native SDK cooperative_tensor (opaque lane ownership)",
                         summary="Metal 4 tensor operations (matmul2d on cooperative tensors)",
                         units=tuple(u for u in MATRIX_UNITS["msl"] if u.path == "tensor_ops"))
_NAX = MatrixPath("nax", (16, 16, 16), (_F16, _BF16), relaxed_dtypes=(_F32,),
                  stagings=("device",), opaque=True,
                  layout="NAX 16x16 cooperative fragments (opaque lane ownership)",
                  summary="NAX 16x16 cooperative fragments",
                  units=tuple(u for u in MATRIX_UNITS["msl"] if u.path == "nax"))

_APPLE_COMMON = dict(language="msl", simd_width=32, max_threads_per_threadgroup=1024,
                     threadgroup_memory_bytes=32 * 1024)


def _apple(name: str, chips: str, m5: bool = False) -> Target:
    paths = (_TENSOR_OPS, _NAX, _APPLE_SG, _APPLE_INLINE) if m5 else (_APPLE_SG, _APPLE_INLINE)
    return Target(name, f"Apple GPU family {name[5:]}: {chips}", matrix_paths=paths,
                  has_tensor_ops=m5, has_nax=m5, **_APPLE_COMMON)


# CUDA: warp MMA (mma.sync m16n8k8) plays the SIMD-group matrix role.  Strict
# float32 is legal but runs as FFMA; TF32 tensor cores need relaxed precision,
# which the planner reports rather than silently applying.
# metile's CUDA fragments are 16x16 tiles of mma.sync m16n8k16 (m16n8k8 for tf32):
# the units of MATRIX_UNITS["cuda"]; (16, 16, 8) is the smallest of them.
_CUDA_SG = MatrixPath("simdgroup", (16, 16, 8), (_F16, _BF16), relaxed_dtypes=(_F32,),
                      fallback_dtypes=(_F32,), layout="warp MMA fragments (opaque lane ownership)",
                      summary="Warp-level MMA instructions (tensor cores) with float32 "
                              "accumulators",
                      units=tuple(u for u in MATRIX_UNITS["cuda"] if not u.warpgroup))
_CUDA_INLINE = MatrixPath("simdgroup_inline", (8, 8, 8), (_F16,), fallback_dtypes=(_F32,),
                          layout="warp-owned 8x8 fragments (opaque lane ownership)")


# Opt-in shared memory per block (CUDA programming guide, compute capability table).
_CUDA_OPTIN = {"sm_80": 163 * 1024, "sm_90": 227 * 1024, "sm_100": 227 * 1024}


def _cuda(name: str, chips: str) -> Target:
    return Target(name, f"NVIDIA {name}: {chips}", language="cuda", simd_width=32,
                  max_threads_per_threadgroup=1024, threadgroup_memory_bytes=48 * 1024,
                  shared_memory_optin_bytes=_CUDA_OPTIN[name],
                  matrix_paths=(_CUDA_SG, _CUDA_INLINE), group_word="warp",
                  shared_word="shared memory",
                  terms_note=f"On {name} a threadgroup is a thread block, a SIMD-group a warp, "
                             "threadgroup memory __shared__ memory and a threadgroup barrier "
                             "__syncthreads().")


TARGETS: dict[str, Target] = {t.name: t for t in (
    _apple("apple7", "M1, A14"),
    _apple("apple8", "M2, A15/A16"),
    _apple("apple9", "M3, M4, A17/A18"),
    _apple("apple10", "M5-class", m5=True),
    _cuda("sm_80", "A100-class"),
    _cuda("sm_90", "H100/H200"),
    _cuda("sm_100", "B200-class"),
    # The CPU runtime executes the MSL an Apple GPU would receive, emulating
    # simdgroup_matrix; its own target plans no Metal 4 tensor ops (target="apple10"
    # plans them, and the runtime's shim of <metal_tensor> runs them).
    Target("cpu_msl", "metile's MSL CPU runtime", matrix_paths=(_APPLE_SG, _APPLE_INLINE),
           **_APPLE_COMMON),
)}

# MLX reports Apple GPUs as "applegpu_g<gen><variant>"; generation -> family.
_APPLE_GEN = {13: "apple7", 14: "apple8", 15: "apple9", 16: "apple9", 17: "apple10"}


def _apple_family(arch: str | None) -> tuple[str, str | None]:
    if arch is None:
        return "apple9", "Apple GPU architecture unknown; assuming apple9 (no tensor ops / NAX)"
    a = arch.lower().strip()
    if a in TARGETS and a.startswith("apple"):
        return a, None
    m = re.fullmatch(r"applegpu_g(\d+)\w*", a)
    if m:
        gen = int(m.group(1))
        if gen in _APPLE_GEN:
            return _APPLE_GEN[gen], None
        if gen > max(_APPLE_GEN):
            return "apple10", (f"Apple GPU generation {gen} is newer than metile knows; "
                               "using apple10")
    raise ValueError(f"unknown Apple GPU architecture {arch!r}; expected apple7..apple10 or "
                     f"MLX's applegpu_g13..g17")


def _cuda_family(arch: str | None) -> tuple[str, str | None]:
    if arch is None:
        return "sm_90", "CUDA compute capability unknown; assuming sm_90 (H100/H200)"
    m = re.fullmatch(r"(?:sm_?|compute_?)?(\d+)\.?(\d)?a?", arch.lower().strip())
    if not m:
        raise ValueError(f"unknown CUDA architecture {arch!r}; expected e.g. sm_90, 9.0 or 90")
    major = int(m.group(1)) if m.group(2) is not None else int(m.group(1)) // 10
    if major < 8:
        raise ValueError(f"CUDA architecture {arch!r} is older than sm_80, which metile requires")
    if major == 8:
        return "sm_80", None
    if major == 9:
        return "sm_90", None
    return "sm_100", None if major == 10 else f"{arch} treated as sm_100"


def target_for(device_kind: str, arch: str | None = None) -> Target:
    """The target for an MLX device kind ("cpu", "metal" or "cuda") and architecture.

    arch: for Metal a family name ("apple10") or MLX's architecture string
    ("applegpu_g17s"); for CUDA "sm_90", "9.0" or "90".  Unknown architectures
    default to a conservative family and say so in `Target.notes`.
    """
    kind = device_kind.lower()
    if kind == "cpu":
        return TARGETS["cpu_msl"]
    if kind in ("metal", "apple", "mps"):
        name, note = _apple_family(arch)
    elif kind == "cuda":
        name, note = _cuda_family(arch)
    else:
        raise ValueError(f"unknown device kind {device_kind!r}; expected cpu, metal or cuda")
    target = TARGETS[name]
    return target.with_note(note) if note else target
