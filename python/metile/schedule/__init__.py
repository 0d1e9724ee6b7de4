"""Execution schedules: requirements (Schedule), target capabilities, the pre-lowering
plan (plan_schedule -> SchedulePlan) and the report of what lowering materialized
(ExecutionReport).  Self-contained: nothing here imports the compiler."""

from . import targets
from .plan import KernelTraits, SchedulePlan, plan_schedule
from .report import (REPORT_SCHEMA, AllocationReport, ExecutionReport, LoopReport, check_schema,
                     debug_dump, validate_report)
from .schedule import Config, Schedule, ScheduleError, check_legacy_geometry
from .targets import LOWERING, TARGETS, Lowering, MatrixPath, Target, target_for

__all__ = ["Schedule", "Config", "ScheduleError", "check_legacy_geometry", "KernelTraits",
           "SchedulePlan", "plan_schedule", "ExecutionReport", "LoopReport", "AllocationReport",
           "REPORT_SCHEMA", "check_schema", "validate_report", "debug_dump", "targets", "Target",
           "MatrixPath", "Lowering", "LOWERING", "TARGETS", "target_for"]
