"""Schedule and Config: what a caller may require of a kernel's execution.

A `Schedule` states requirements (backend, SIMD-group count, staging, vector
width, double buffering, operand stage count, GEMM program order); `plan_schedule` either honours every stated field or
raises `ScheduleError` naming it.  Fields left automatic are chosen by the
planner.  Values are checked here, at construction, so a typo fails where the
user wrote it rather than deep inside compilation.

A `Config` is one autotuning candidate: constexpr meta-parameters (BLOCK_M,
...) plus an optional SIMD-group count, which kernels written against the
older convention read as the NUM_SG constexpr.  Triton's `num_warps` and
`num_stages` are accepted and passed to the launch as written.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..errors import ScheduleError

BACKENDS = ("auto", "simdgroup", "simdgroup_inline", "tensor_ops", "nax", "elementwise")
STAGINGS = ("auto", "device", "threadgroup")
VECTOR_WIDTHS = (None, 1, 4)
MAX_SIMDGROUPS = 32
# Fields added after the first recorded format, with their defaults: keys and reprs
# show them only when set.
_LATER_DEFAULTS = {"num_stages": None, "program_order": "auto", "group_size": None}
MAX_STAGES = 8
PROGRAM_ORDERS = ("auto", "linear", "grouped")
# Large enough for any useful L2 group; small enough that group_size x programs along
# axis 1 (at most 65535 on CUDA) stays far inside the int32 index math.
MAX_GROUP_SIZE = 4096


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(value, field: str, most: int) -> None:
    if value is None:
        return
    if not _is_int(value):
        raise TypeError(f"Schedule: {field} must be an int from 1 through {most} or None, "
                        f"got {type(value).__name__} {value!r}")
    if not 1 <= value <= most:
        raise ValueError(f"Schedule: {field} must be from 1 through {most}, got {value}")


def check_num_simdgroups(value, owner: str) -> None:
    if value is None:
        return
    if not _is_int(value):
        raise TypeError(f"{owner}: num_simdgroups must be an int from 1 through {MAX_SIMDGROUPS} "
                        f"or None, got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_SIMDGROUPS:
        raise ValueError(f"{owner}: num_simdgroups must be from 1 through {MAX_SIMDGROUPS}, "
                         f"got {value}")


@dataclass(frozen=True)
class Schedule:
    """Execution requirements; every field defaults to automatic selection."""

    backend: str = "auto"
    num_simdgroups: int | None = None
    staging: str = "auto"
    vector_width: int | None = None
    double_buffer: bool | None = None
    # Operand stages of a GEMM's K loop (1: single staging, 2: double buffering, more:
    # an asynchronous-copy ring where the target has one); None: the planner chooses.
    num_stages: int | None = None
    # Order in which a GEMM's programs take output tiles: "linear" (launch order),
    # "grouped" (group_size tiles along axis 0 per sweep of axis 1, for L2 reuse);
    # "auto" is "linear" today, or "grouped" when group_size is given.
    program_order: str = "auto"
    group_size: int | None = None

    def __post_init__(self):
        for field in ("backend", "staging", "program_order"):
            value = getattr(self, field)
            if isinstance(value, str) and type(value) is not str:
                # a NumPy string (a name read from an array or a config) as the str it
                # holds: its repr went into the compile and tuning keys as np.str_('...')
                object.__setattr__(self, field, str(value))
        for field in ("num_simdgroups", "vector_width", "num_stages", "group_size"):
            value = getattr(self, field)
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                # a NumPy integer (a count read from a config) as the int it holds, so keys
                # and reports print it as one
                object.__setattr__(self, field, int(value))
        if type(self.double_buffer).__module__ == "numpy" and \
                type(self.double_buffer).__name__ in ("bool", "bool_"):
            # a NumPy bool as the bool it holds, as NumPy integers above
            object.__setattr__(self, "double_buffer", bool(self.double_buffer))
        for field, value, allowed in (("backend", self.backend, BACKENDS),
                                      ("staging", self.staging, STAGINGS),
                                      ("program_order", self.program_order, PROGRAM_ORDERS)):
            if not isinstance(value, str):
                raise TypeError(f"Schedule: {field} must be a string, one of "
                                f"{', '.join(allowed)}; got {type(value).__name__} {value!r}")
            if value not in allowed:
                raise ValueError(f"Schedule: unknown {field} {value!r}; "
                                 f"expected one of {', '.join(allowed)}")
        check_num_simdgroups(self.num_simdgroups, "Schedule")
        vw = self.vector_width
        if vw is not None and not _is_int(vw):
            raise TypeError(f"Schedule: vector_width must be None, 1 or 4, "
                            f"got {type(vw).__name__} {vw!r}")
        if vw not in VECTOR_WIDTHS:
            raise ValueError(f"Schedule: vector_width must be None, 1 or 4, got {vw}")
        if self.double_buffer is not None and not isinstance(self.double_buffer, bool):
            raise TypeError(f"Schedule: double_buffer must be None, True or False, "
                            f"got {type(self.double_buffer).__name__} {self.double_buffer!r}")
        _check_count(self.num_stages, "num_stages", MAX_STAGES)
        _check_count(self.group_size, "group_size", MAX_GROUP_SIZE)
        if self.group_size is not None and self.program_order == "linear":
            raise ValueError(f"Schedule: group_size={self.group_size} contradicts "
                             "program_order='linear'; group_size applies to "
                             "program_order='grouped'")

    @property
    def is_automatic(self) -> bool:
        """True when no field constrains the plan (Schedule() still specializes integer
        scalars for shape proofs; that is the compiler's business, not the planner's)."""
        return self == Schedule()

    def to_dict(self) -> dict:
        return {"backend": self.backend, "num_simdgroups": self.num_simdgroups,
                "staging": self.staging, "vector_width": self.vector_width,
                "double_buffer": self.double_buffer, "num_stages": self.num_stages,
                "program_order": self.program_order, "group_size": self.group_size}

    def key(self) -> str:
        """A stable text key for compile and tuning caches (independent of hash seeds).
        Fields added after the first recorded format appear only when set, so the keys
        of schedules that do not use them stay what they were."""
        return "Schedule(" + ",".join(f"{k}={v!r}" for k, v in self._recorded_fields()) + ")"

    def _recorded_fields(self):
        return [(k, v) for k, v in self.to_dict().items()
                if k not in _LATER_DEFAULTS or v != _LATER_DEFAULTS[k]]

    def __repr__(self) -> str:
        # Like the key: the later fields only when set, so printed schedules (and
        # benchmark records) keep their recorded form.
        return "Schedule(" + ", ".join(f"{k}={v!r}" for k, v in self._recorded_fields()) + ")"

    def requirement(self, field: str) -> str:
        """How an error names one of this schedule's fields, e.g. "vector_width=4"."""
        return f"{field}={getattr(self, field)!r}"


class Config:
    """One autotuning candidate: constexpr meta-parameters and a SIMD-group count.

    Immutable and hashable, so candidates can be cache-key parts and dict keys.
    `num_simdgroups` is passed to kernels as NUM_SG; giving both with different
    values is a contradiction and rejected.  Triton's forms are taken too: the
    meta-parameters as a dict (`Config({"BLOCK": 64}, num_warps=4)`); `num_warps` and
    `num_stages` are kept as written and the launch reads them as `num_simdgroups` and
    `Schedule(num_stages=)` (README, "Triton names").
    """

    __slots__ = ("_nsg", "_meta")

    def __init__(self, num_simdgroups: int | dict | None = None, **meta):
        # NumPy numbers (a sweep over np.arange, counts read from a config) as the Python
        # numbers they hold, as a launch and Schedule take them: they were refused as no
        # int, and Config(BLOCK=np.int64(64)) was a candidate other than Config(BLOCK=64)
        num_simdgroups = plain_number(num_simdgroups)
        meta = {k: plain_number(v) for k, v in meta.items()}
        if isinstance(num_simdgroups, dict):
            # Triton's form, Config({"BLOCK": 64}, num_warps=4): the meta-parameters as a dict
            # (it was refused as a num_simdgroups that is no int)
            clash = sorted(set(num_simdgroups) & set(meta))
            if clash:
                raise ValueError(f"Config: {', '.join(clash)} given in the dict and as a "
                                 f"keyword")
            if not all(isinstance(k, str) for k in num_simdgroups):
                raise TypeError("Config: the meta-parameter dict's keys must be strings")
            num_simdgroups, meta = None, {**{k: plain_number(v) for k, v in
                                             num_simdgroups.items()}, **meta}
        check_num_simdgroups(num_simdgroups, "Config")
        if "NUM_SG" in meta:
            legacy = meta["NUM_SG"]
            check_num_simdgroups(legacy, "Config NUM_SG")
            if num_simdgroups is not None and legacy != num_simdgroups:
                raise ValueError(f"Config: NUM_SG={legacy} contradicts "
                                 f"num_simdgroups={num_simdgroups}")
            num_simdgroups = legacy
        _check_triton_options(meta, num_simdgroups)
        for name, value in meta.items():
            try:
                hash(value)
            except TypeError:
                raise TypeError(f"Config: meta-parameter {name}={value!r} must be hashable") \
                    from None
        object.__setattr__(self, "_nsg", num_simdgroups)
        object.__setattr__(self, "_meta", tuple(sorted(meta.items())))

    def __setattr__(self, name, value):
        raise AttributeError("Config is immutable")

    @property
    def num_simdgroups(self) -> int | None:
        return self._nsg

    @property
    def meta(self) -> dict:
        return {k: v for k, v in self._meta if k != "NUM_SG"}

    def launch_kwargs(self) -> dict:
        """The constexpr keyword arguments a launch receives (NUM_SG included when set)."""
        out = self.meta
        if self._nsg is not None:
            out["NUM_SG"] = self._nsg
        return out

    # Triton's Config attributes, which its pruning functions and perf models read
    # (`conf.kwargs["BLOCK_M"]`, `conf.num_warps`): metile's candidates answer them
    @property
    def kwargs(self) -> dict:
        """Triton's `Config.kwargs`: the meta-parameters (without num_warps/num_stages)."""
        return {k: v for k, v in self.meta.items() if k not in ("num_warps", "num_stages")}

    @property
    def num_warps(self) -> int | None:
        """Triton's `Config.num_warps`: the SIMD-groups (warps) given, or None (the plan
        chooses)."""
        return self._nsg if self._nsg is not None else self.meta.get("num_warps")

    @property
    def num_stages(self) -> int | None:
        """Triton's `Config.num_stages`, or None where the candidate gives none."""
        return self.meta.get("num_stages")

    def all_kwargs(self) -> dict:
        """Triton's `Config.all_kwargs()`: the meta-parameters with num_warps and
        num_stages where given."""
        out = self.kwargs
        for name in ("num_warps", "num_stages"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def key(self) -> str:
        return "Config(" + ",".join(f"{k}={v!r}" for k, v in
                                    sorted(self.launch_kwargs().items())) + ")"

    def __eq__(self, other):
        return isinstance(other, Config) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        parts = [f"num_simdgroups={self._nsg}"] if self._nsg is not None else []
        parts += [f"{k}={v!r}" for k, v in sorted(self.meta.items())]
        return f"Config({', '.join(parts)})"


def plain_number(value):
    """A NumPy integer, float or bool as the Python number it holds; anything else as is."""
    if isinstance(value, np.generic) and isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return value


def _check_triton_options(meta: dict, num_simdgroups) -> None:
    """Triton's num_warps / num_stages stay launch keywords of the candidate (a kernel with
    parameters of those names receives them as arguments; otherwise they are
    num_simdgroups and Schedule(num_stages=)); their values are checked here, early."""
    warps = meta.get("num_warps")
    if warps is not None:
        if not _is_int(warps) or not 1 <= warps <= MAX_SIMDGROUPS:
            raise ValueError(f"Config: num_warps must be an int from 1 through {MAX_SIMDGROUPS}, "
                             f"got {warps!r}")
        if num_simdgroups is not None and warps != num_simdgroups:
            raise ValueError(f"Config: num_warps={warps} contradicts "
                             f"num_simdgroups={num_simdgroups}")
    stages = meta.get("num_stages")
    if stages is not None and (not _is_int(stages) or not 1 <= stages <= MAX_STAGES):
        raise ValueError(f"Config: num_stages must be an int from 1 through {MAX_STAGES}, "
                         f"got {stages!r}")


def check_legacy_geometry(meta: dict, plan, schedule: Schedule | None = None) -> None:
    """Check the older NUM_SG / WM / WN constexprs against a plan.

    Kernels written before Schedule existed pick their geometry with these
    constexprs; they stay legal but must agree with what the plan selected (and
    with any explicit Schedule), or the kernel would index with one geometry
    while launching another.  WM/WN count SIMD-groups along the tile's rows /
    columns, i.e. `simdgroup_grid`.
    """
    nsg = plan.num_simdgroups
    if "NUM_SG" in meta:
        legacy = meta["NUM_SG"]
        if schedule is not None and schedule.num_simdgroups not in (None, legacy):
            raise ScheduleError(f"NUM_SG={legacy!r}",
                                f"contradicts Schedule(num_simdgroups={schedule.num_simdgroups})")
        if legacy != nsg:
            raise ScheduleError(f"NUM_SG={legacy!r}",
                                f"the {plan.backend} plan launches {nsg} SIMD-groups "
                                f"(threadgroup {list(plan.threadgroup_size)})")
    wm, wn = meta.get("WM"), meta.get("WN")
    if wm is None and wn is None:
        return
    named = ", ".join(f"{k}={meta[k]!r}" for k in ("WM", "WN") if k in meta)
    if plan.simdgroup_grid is None:
        raise ScheduleError(named, f"the {plan.backend} plan has no SIMD-group grid; "
                                   "WM/WN only place SIMD-groups over a GEMM tile")
    grid = list(plan.simdgroup_grid)
    for given, actual, axis in ((wm, grid[0], "WM (rows)"), (wn, grid[1], "WN (columns)")):
        if given is not None and given != actual:
            raise ScheduleError(named, f"the plan's SIMD-group grid is {grid}; "
                                       f"{axis} must be {actual}")
