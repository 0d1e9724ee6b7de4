"""ExecutionReport: what lowering actually materialized for a SchedulePlan.

The plan says what was decided before lowering; the report adds what the
passes produced (their names in the order they ran, each emitted loop's width,
threadgroup allocations and their bytes, whether a double buffer and vector
loads exist, how many epilogue regions were fused).  `to_dict()` uses the field
names of the recorded benchmark reports so results from different machines
compare field by field; `REPORT_SCHEMA` pins that format.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .plan import SchedulePlan
from ..errors import ScheduleError


@dataclass(frozen=True)
class LoopReport:
    """One emitted loop.  elements_per_lane is the emitter's vectorization factor,
    not fragment ownership; lanes counts launched x-dimension threads."""

    induction_variable: str
    kind: str            # "loop", "interior" (complete iterations), "remainder" (guarded)
    lanes: int
    elements_per_lane: int
    iteration_step: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class AllocationReport:
    name: str
    space: str           # "threadgroup" (the only space that costs capacity)
    dtype: str
    elements: int
    bytes: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


DEFAULT_NOTES = (
    "Widths are those of the emitted source operations; the GPU compiler may still change them.",
    "Masked tail accesses can stay scalar while aligned interiors use vectors.",
)


@dataclass(frozen=True)
class ExecutionReport:
    plan: SchedulePlan
    passes: tuple[str, ...] = ()
    loops: tuple[LoopReport, ...] = ()
    allocations: tuple[AllocationReport, ...] = ()
    double_buffered: bool = False
    vectorized_loads: int = 0
    epilogue_regions: int = 0
    notes: tuple[str, ...] = ()
    num_stages: int | None = None    # operand stages the GEMM lowering emitted (None: no K loop)

    @classmethod
    def build(cls, plan: SchedulePlan, *, passes=(), loops=(), allocations=(),
              double_buffered: bool = False, vectorized_loads: int = 0, epilogue_regions: int = 0,
              notes=(), num_stages: int | None = None) -> "ExecutionReport":
        """A report with the standard notes for what materialized, then `notes`."""
        standard = list(DEFAULT_NOTES)
        if not double_buffered:
            standard.append("No software double buffer was materialized.")
        if "opaque" in plan.cooperative_layout:
            standard.append("Lane ownership of matrix fragments is opaque and not reported.")
        return cls(plan, tuple(passes), tuple(loops), tuple(allocations), bool(double_buffered),
                   int(vectorized_loads), int(epilogue_regions), tuple(standard) + tuple(notes),
                   num_stages)

    @property
    def threadgroup_bytes(self) -> int:
        return sum(a.bytes for a in self.allocations if a.space == "threadgroup")

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "passes": list(self.passes),
                "loops": [lp.to_dict() for lp in self.loops],
                "allocations": [a.to_dict() for a in self.allocations],
                "double_buffered": self.double_buffered,
                "vectorized_loads": self.vectorized_loads,
                "epilogue_regions": self.epilogue_regions, "notes": list(self.notes),
                "num_stages": self.num_stages}

    def explain(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def validate_report(report: ExecutionReport, threadgroup_memory_bytes: int | None = None) -> None:
    """Check that what materialized honours the plan's requirements (the last step of
    compilation).  A failure is a compiler bug or a requirement lowering could not meet;
    either way the kernel must not run as if it had been honoured."""
    plan = report.plan
    if plan.double_buffer is True and not report.double_buffered:
        raise ScheduleError("double_buffer=True", "lowering did not materialize a double buffer")
    if plan.double_buffer is False and report.double_buffered:
        raise ScheduleError("double_buffer=False", "lowering materialized a double buffer")
    if plan.num_stages is not None and report.num_stages is not None and \
            plan.num_stages != report.num_stages:
        raise ScheduleError(f"num_stages={plan.num_stages}",
                            f"lowering emitted {report.num_stages} operand stages")
    if plan.program_order == "grouped" and "grouped_program_order" not in report.passes:
        raise ScheduleError("program_order='grouped'",
                            "lowering did not remap the program ids")
    if plan.vector_width == 4 and report.vectorized_loads == 0:
        raise ScheduleError("vector_width=4", "lowering emitted no 4-wide loads")
    if plan.vector_width == 1 and report.vectorized_loads:
        raise ScheduleError("vector_width=1",
                            f"lowering emitted {report.vectorized_loads} vector loads")
    if plan.staging == "device" and report.threadgroup_bytes and plan.backend not in \
            ("elementwise", "simdgroup_inline"):
        raise ScheduleError("staging='device'", f"lowering allocated {report.threadgroup_bytes} "
                                                "bytes of threadgroup staging")
    if threadgroup_memory_bytes is not None and report.threadgroup_bytes > threadgroup_memory_bytes:
        # shared() arrays count here too, so the plan's staging is not necessarily the cause
        raise ScheduleError("the threadgroup memory limit",
                            f"allocations (shared() arrays and operand staging) use "
                            f"{report.threadgroup_bytes} bytes of threadgroup memory; the target "
                            f"has {threadgroup_memory_bytes}: use smaller shared() arrays or tiles")


# -- the JSON format ------------------------------------------------------------------------

_INT = {"type": "integer", "minimum": 0}
_STRS = {"type": "array", "items": {"type": "string"}}


def _obj(props: dict, optional: dict | None = None) -> dict:
    """An object with exactly `props` required; `optional` fields were added after the
    recorded format, so reports written before them stay valid."""
    return {"type": "object", "properties": {**props, **(optional or {})},
            "required": list(props), "additionalProperties": False}


_STAGES = {"type": ["integer", "null"], "minimum": 1}


PLAN_SCHEMA = _obj({
    "backend": {"enum": ["simdgroup", "simdgroup_inline", "tensor_ops", "nax", "elementwise"]},
    "threadgroup_size": {"type": "array", "items": _INT, "minItems": 3, "maxItems": 3},
    "simdgroup_grid": {"type": ["array", "null"], "items": _INT, "minItems": 2, "maxItems": 2},
    "tile_shape": {"type": "array", "items": _INT, "minItems": 1},
    "staging": {"enum": ["device", "threadgroup"]},
    "vector_width": {"enum": [None, 1, 4]},
    "double_buffer": {"enum": [None, True, False]},
    "reasons": _STRS,
    "cooperative_layout": {"type": "string"},
    "outer_bounds_proven": {"type": "boolean"},
}, optional={
    "num_stages": _STAGES,
    "program_order": {"enum": ["linear", "grouped"]},
    "group_size": {"type": ["integer", "null"], "minimum": 1},
})
REPORT_SCHEMA = _obj({
    "plan": PLAN_SCHEMA,
    "passes": _STRS,
    "loops": {"type": "array", "items": _obj({
        "induction_variable": {"type": "string"}, "kind": {"type": "string"}, "lanes": _INT,
        "elements_per_lane": _INT, "iteration_step": _INT})},
    "allocations": {"type": "array", "items": _obj({
        "name": {"type": "string"}, "space": {"type": "string"}, "dtype": {"type": "string"},
        "elements": _INT, "bytes": _INT})},
    "double_buffered": {"type": "boolean"},
    "vectorized_loads": _INT,
    "epilogue_regions": _INT,
    "notes": _STRS,
}, optional={"num_stages": _STAGES})

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int}


def _is(value, name: str) -> bool:
    if name == "integer" and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def check_schema(value, schema: dict = REPORT_SCHEMA, path: str = "$") -> None:
    """Validate against the subset of JSON Schema used above (no dependency needed);
    raises ValueError naming the offending path."""
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_is(value, t) for t in types):
            raise ValueError(f"{path}: expected {' or '.join(types)}, got {value!r}")
    if "enum" in schema and not any(value is e or (value == e and type(value) is type(e))
                                    for e in schema["enum"]):
        raise ValueError(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, int) and "minimum" in schema and value < schema["minimum"]:
        raise ValueError(f"{path}: {value} is below {schema['minimum']}")
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", ()) if k not in value]
        extra = [k for k in value if k not in schema.get("properties", {})]
        if missing or (extra and schema.get("additionalProperties") is False):
            raise ValueError(f"{path}: missing {missing}, unexpected {extra}")
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                check_schema(value[k], sub, f"{path}.{k}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            raise ValueError(f"{path}: {len(value)} items out of range")
        for i, item in enumerate(value):
            check_schema(item, schema.get("items", {}), f"{path}[{i}]")


# -- METILE_DEBUG=schedule ------------------------------------------------------------------

def debug_enabled() -> bool:
    from ..settings import debug_flags
    return bool({"schedule", "plan_schedule"} & debug_flags())


def debug_dump(name: str, plan: SchedulePlan, report: ExecutionReport | None = None,
               directory: str | os.PathLike = "debug_output/schedule") -> Path | None:
    """With METILE_DEBUG=schedule: print the plan (and report) and save them as JSON under
    `directory`; the file name carries a content hash so specializations do not overwrite
    each other.  Returns the path written, or None when the flag is off."""
    if not debug_enabled():
        return None
    data = {"kernel": name, "plan": plan.to_dict(),
            "execution_report": None if report is None else report.to_dict()}
    text = json.dumps(data, indent=2)
    print(f"// metile schedule {name}\n{text}", file=sys.stdout)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{safe}-{digest}.json"
    path.write_text(text + "\n")
    return path
