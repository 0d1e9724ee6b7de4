"""Paired A/B regression check of a benchmark between a baseline tree and this one.

    python -m benchmarks.regression.paired_regression --baseline-root /path/to/old/tree \
        [--rounds-per-sample 5] [--samples 2] [--threshold 0.15] [--output FILE] \
        [--benchmark benchmarks.compiler.schedule_fusion] [-- extra benchmark args]

Each sample runs the benchmark module in fresh processes in ABBA order
(baseline, this tree, this tree, baseline), so slow drift of the machine
affects both sides alike.  For every case and timed variant the change is the
median over samples of this/baseline latency; a change above `--threshold`
(default 15%) is flagged as a regression.  Failed runs are kept in the JSON
with their output instead of being dropped.

Both trees import their own Python sources (PYTHONPATH=<root>/python,
<root>/kernels, <root>); a tree without a built extension borrows the
installed `metile._ext`, which the report records (C++ changes are then not
part of the comparison).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def _ensure_extension(root: Path) -> str | None:
    """Borrow the installed extension for a tree that has none built in place."""
    package = root / "python" / "metile"
    if glob.glob(str(package / "_ext*.so")):
        return None
    import metile._ext as ext  # the installed build

    target = package / Path(ext.__file__).name
    shutil.copy2(ext.__file__, target)
    return f"{root}: borrowed {ext.__file__}"


def _run(root: Path, module: str, args: list[str], rounds: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "python"), str(root / "kernels"), str(root)])
    cmd = [sys.executable, "-m", module, *args, "--rounds", str(rounds), "--output", out]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    record = {"root": str(root), "command": cmd, "returncode": proc.returncode}
    if proc.returncode != 0:
        record["output"] = (proc.stdout + proc.stderr)[-4000:]
        return record
    with open(out) as f:
        record["result"] = json.load(f)
    os.unlink(out)
    return record


def latencies(result: dict) -> dict[str, float]:
    """Flatten a benchmark report into {"<case>/<variant>": microseconds}."""
    flat = {}
    for case in result.get("cases", []):
        name = "x".join(str(s) for s in case.get("shape", [])) or str(case.get("name"))
        for pair in ("fusion_pair_us", "mlx_pair_us"):
            for variant, value in case.get(pair, {}).items():
                if variant != "speedup":
                    flat[f"{name}/{pair[:-3]}/{variant}"] = float(value)
    return flat


def compare(baseline_runs: list[dict], current_runs: list[dict], threshold: float) -> list[dict]:
    base = [latencies(r["result"]) for r in baseline_runs if "result" in r]
    cur = [latencies(r["result"]) for r in current_runs if "result" in r]
    rows = []
    for key in sorted(set().union(*base, *cur) if base and cur else []):
        b = [x[key] for x in base if key in x]
        c = [x[key] for x in cur if key in x]
        if not b or not c:
            continue
        change = statistics.median(c) / statistics.median(b) - 1.0
        rows.append({"case": key, "baseline_us": statistics.median(b), "current_us": statistics.median(c),
                     "change": change, "regression": change > threshold})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-root", required=True, type=Path)
    parser.add_argument("--current-root", type=Path, default=HERE)
    parser.add_argument("--benchmark", default="benchmarks.compiler.schedule_fusion")
    parser.add_argument("--rounds-per-sample", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2, help="ABBA blocks")
    parser.add_argument("--threshold", type=float, default=0.15)
    parser.add_argument("--output")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    for flag, root in (("--baseline-root", args.baseline_root), ("--current-root",
                                                                   args.current_root)):
        if not (root / "python" / "metile").is_dir():
            raise SystemExit(f"{flag} {root} is not a metile source tree (no python/metile)")
    notes = [n for n in (_ensure_extension(args.baseline_root.resolve()),
                         _ensure_extension(args.current_root.resolve())) if n]

    runs = {"baseline": [], "current": []}
    roots = {"baseline": args.baseline_root.resolve(), "current": args.current_root.resolve()}
    for _ in range(args.samples):
        for side in ("baseline", "current", "current", "baseline"):
            runs[side].append(_run(roots[side], args.benchmark, extra, args.rounds_per_sample))
    failed = [r for side in runs.values() for r in side if r["returncode"] != 0]
    rows = compare(runs["baseline"], runs["current"], args.threshold)
    for row in rows:
        flag = "REGRESSION" if row["regression"] else "ok"
        print(f"{row['case']:48s} {row['baseline_us']:10.1f} -> {row['current_us']:10.1f} us "
              f"({row['change']:+.1%}) {flag}")
    for r in failed:
        print(f"failed run in {r['root']} (exit {r['returncode']}):\n{r['output']}", file=sys.stderr)
    report = {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(), "benchmark": args.benchmark, "benchmark_args": extra,
        "order": "ABBA per sample (A = baseline)", "samples": args.samples,
        "rounds_per_sample": args.rounds_per_sample, "threshold": args.threshold, "notes": notes,
        "comparisons": rows, "regressions": [r["case"] for r in rows if r["regression"]],
        "runs": runs,
    }
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=2)
    sys.exit(1 if failed or report["regressions"] else 0)


if __name__ == "__main__":
    main()
