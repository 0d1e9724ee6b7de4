"""What every benchmark report records about where it ran, and how it is written."""

from __future__ import annotations

import datetime
import json
import platform

import mlx.core as mx


def device_name() -> str:
    """The default device as MLX names it (e.g. "NVIDIA H200", the CPU model)."""
    return mx.device_info().get("device_name", str(mx.default_device()))


def machine() -> dict:
    return {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "device": device_name(),
        "mlx_version": mx.__version__,
    }


def write_report(path: str | None, report: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
