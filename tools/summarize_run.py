"""Summarise a pytest JUnit XML report with the machine it ran on (JSON on stdout)."""

import datetime
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET

import mlx.core as mx


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip()
    except (OSError, subprocess.CalledProcessError):
        return "none"


def main(path: str) -> None:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    print(json.dumps({
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_name(),
        "mlx_version": mx.__version__,
        "default_device": str(mx.default_device()),
        "python": platform.python_version(),
        "passed": tests - failures - errors - skipped,
        "failed": failures + errors,
        "skipped": skipped,
        "failed_tests": failed,
        "seconds": float(suite.get("time", 0)),
    }, indent=2))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/summarize_run.py JUNIT_XML")
    main(sys.argv[1])
