"""Triton peer for the fused GEMM epilogue benchmark (schedule_fusion.py), issue 13.

    python3 -m benchmarks.compiler.triton_peer --merge metile.json \
        [--sizes 1024 2048 4096 8192] [--shapes 16x4096x4096 512x4096x11008] \
        [--dtype float16|bfloat16|float32] [--output triton.json]

Computes out = leaky_relu(ALPHA * (A @ B) + BETA, SLOPE) with schedule_fusion's
constants, float32 accumulation and epilogue, output in the input dtype (what
metile's matmul_epilogue EPILOGUE="affine_leaky" writes), through a Triton kernel
written here and autotuned on M, N, K; torch eager (addmm + in-place leaky_relu)
is timed beside it.  Run it in its own process, apart from metile/MLX, so the two
CUDA contexts never share a process.

Correctness: against a torch float64 reference of the same rounded inputs, with
schedule_fusion's elementwise rtol/atol gate (a failing variant is reported and,
unless --time-anyway, not timed) plus the relative Frobenius error.

Timing: a sample replays a CUDA graph of `launches` calls (chosen so a sample lasts
~--target-ms) between two CUDA events, so it is device time without Python launch
overhead (--timing loop enqueues the calls from Python instead); Triton and torch
alternate ABAB/BABA per round and each figure is the median over rounds, warm-up
excluded.  When one input set fits in L2, calls rotate over three sets.

With --merge FILE holding schedule_fusion's JSON, a "triton" section and
"triton_versions" are added to that file; a missing or unreadable FILE is reported
and the results go to --output (or FILE.triton.json) instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

# Kept equal to schedule_fusion.py's (which imports MLX, so it is not imported here).
ALPHA, BETA, SLOPE = 1.25, -0.5, 0.1
TOLERANCE = {"float32": (3e-4, 3e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): Hopper-typical tiles, and
# narrow ones for skinny M (decode-like 16xNxK) and small squares.
CONFIGS = [
    (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (64, 256, 32, 4, 4),
    (128, 64, 32, 4, 4), (64, 64, 32, 4, 5), (64, 64, 64, 4, 4), (32, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
]
SHARED_MEMORY_BYTES = 227 * 1024  # H100/H200 per-block opt-in maximum
DEFAULT_L2_BYTES = 50 * 1024 * 1024


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxNxK (e.g. 512x4096x11008)") from None
    if min(m, n, k) <= 0:
        raise argparse.ArgumentTypeError(f"shape {text!r} has a non-positive extent")
    return m, n, k


def shape_key(shape) -> str:
    return "x".join(str(d) for d in shape)


def load_merge(path: str | None) -> tuple[dict | None, str | None]:
    """The JSON object in `path`, or None and why it cannot be merged into."""
    if not path:
        return None, None
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path} is not readable JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{path} holds a JSON {type(data).__name__}, not an object"
    return data, None


def resolve_arguments(args, merged: dict | None):
    """Fill --dtype and --sizes from the metile JSON when not given; a dtype that
    disagrees with it would put incomparable numbers side by side, so it is refused."""
    configuration = (merged or {}).get("configuration") or {}
    metile_dtype = configuration.get("dtype")
    if args.dtype is None:
        args.dtype = metile_dtype if metile_dtype in TOLERANCE else "float16"
    elif metile_dtype is not None and metile_dtype != args.dtype:
        raise SystemExit(f"--dtype {args.dtype} disagrees with {args.merge}, measured in {metile_dtype}")
    if args.sizes is None:
        sizes = configuration.get("sizes")
        args.sizes = [] if args.shapes else [1024, 2048, 4096]
        if isinstance(sizes, list) and all(isinstance(s, int) and s > 0 for s in sizes):
            args.sizes = sizes
    shapes = [(n, n, n) for n in args.sizes] + list(args.shapes or [])
    if not shapes:
        raise SystemExit("nothing to measure: give --sizes or --shapes")
    return list(dict.fromkeys(shapes))


def fits_shared_memory(block_m: int, block_n: int, block_k: int, stages: int, element_bytes: int) -> bool:
    return stages * (block_m * block_k + block_k * block_n) * element_bytes <= SHARED_MEMORY_BYTES


def launches_for(seconds_per_call: float, target_ms: float, lo: int = 3, hi: int = 5000) -> int:
    return int(min(hi, max(lo, target_ms / 1e3 / max(seconds_per_call, 1e-7))))


def input_sets_for(set_bytes: int, l2_bytes: int) -> int:
    # Three sets of inputs that fit in L2 make consecutive calls read from HBM
    # as they would in a model; larger inputs already do.
    return 3 if set_bytes < l2_bytes else 1


def metile_square_rows(merged: dict | None) -> dict:
    """schedule_fusion's fused and mx.compile latencies keyed like the Triton cases."""
    rows = {}
    for case in (merged or {}).get("cases") or []:
        pair = case.get("mlx_pair_us") if isinstance(case, dict) else None
        if pair and isinstance(case.get("shape"), list):
            rows[shape_key(case["shape"])] = (pair.get("fused"), pair.get("mlx_compile"))
    return rows


def merge_report(merged: dict | None, section: dict, versions: dict) -> dict:
    report = dict(merged) if merged is not None else {}
    report["triton"] = section
    report["triton_versions"] = versions
    return report


def output_path(args, merge_problem: str | None) -> str | None:
    if args.merge and merge_problem is None:
        return args.merge
    if args.output:
        return args.output
    return args.merge + ".triton.json" if args.merge else None


def table(section: dict, merged: dict | None) -> str:
    metile = metile_square_rows(merged)
    lines = [f"{'shape':>18} {'triton us':>10} {'TFLOP/s':>8} {'torch us':>10} {'metile us':>10} "
             f"{'mx.compile':>10} {'rel err':>9}  config"]

    def fmt(value, width, spec=".1f"):
        return f"{value:{width}{spec}}" if isinstance(value, (int, float)) else f"{'-':>{width}}"

    for key, case in section["cases"].items():
        fused, mlx = metile.get(key, (None, None))
        cfg = case.get("best_config") or {}
        cfg_text = (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} w{cfg['num_warps']} "
                    f"s{cfg['num_stages']}") if cfg else "-"
        lines.append(f"{key:>18} {fmt(case.get('us'), 10)} {fmt(case.get('tflops'), 8)} "
                     f"{fmt(case.get('torch_us'), 10)} {fmt(fused, 10)} {fmt(mlx, 10)} "
                     f"{fmt(case['error']['relative_frobenius'], 9, '.2e')}  {cfg_text}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--merge", help="schedule_fusion JSON to add the 'triton' section to")
    p.add_argument("--output", help="where to write when there is no mergeable --merge file")
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help="square sizes (default: the --merge file's, else 1024 2048 4096)")
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=[], metavar="MxNxK")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default=None,
                   help="default: the --merge file's, else float16")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-ms", type=float, default=25.0, help="device time per sample")
    p.add_argument("--timing", choices=("graph", "loop"), default="graph")
    p.add_argument("--time-anyway", action="store_true",
                   help="also time variants that fail the tolerance gate (marked in the JSON)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.rounds < 1 or args.target_ms <= 0:
        raise SystemExit("--rounds must be >= 1 and --target-ms > 0")
    merged, merge_problem = load_merge(args.merge)
    if merge_problem:
        print(f"warning: not merging: {merge_problem}; writing a new report", file=sys.stderr)
    shapes = resolve_arguments(args, merged)

    # torch and Triton only from here on, so this module imports without them
    try:
        from benchmarks.compiler import triton_gemm
    except ImportError as e:
        raise SystemExit(f"triton_peer needs torch and Triton (the H200 image's python3 has "
                         f"both): {e}") from None

    section, versions = triton_gemm.measure(shapes, args)
    # Re-read so results written to the file meanwhile are kept.
    merged, late_problem = load_merge(args.merge)
    if merge_problem is None and late_problem:
        print(f"warning: {late_problem} now; writing a new report", file=sys.stderr)
        merge_problem = late_problem
    report = merge_report(merged, section, versions)
    path = output_path(args, merge_problem)
    if path:
        Path(path).write_text(json.dumps(report, indent=2))
        print(f"wrote {path}")
    print(table(section, merged))


def recorded_at() -> dict:
    return {"recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "platform": platform.platform()}


def median(values) -> float:
    return float(statistics.median(values))


if __name__ == "__main__":
    main()
