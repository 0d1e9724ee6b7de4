"""Kernel durations and the gaps before them, per kernel name, from nsys's
cuda_gpu_trace CSV (tools/probes/launch_gaps.py's timeline)."""
import collections
import csv
import sys


def main(path):
    rows = [r for r in csv.DictReader(open(path))
            if r.get("Name") and "memcpy" not in r["Name"].lower()]
    rows.sort(key=lambda r: int(r["Start (ns)"]))
    stats = collections.defaultdict(lambda: ([], []))
    prev_end = None
    for r in rows:
        start, dur = int(r["Start (ns)"]), int(r["Duration (ns)"])
        durs, gaps = stats[r["Name"][:50]]
        durs.append(dur / 1e3)
        if prev_end is not None:
            gaps.append((start - prev_end) / 1e3)
        prev_end = start + dur
    for name, (durs, gaps) in stats.items():
        if len(durs) < 10:
            continue
        durs, gaps = sorted(durs), sorted(gaps)
        print(f"{name:50s} n={len(durs):3d} kernel median {durs[len(durs) // 2]:7.1f} us, "
              f"gap before it median {gaps[len(gaps) // 2]:6.1f} us, p90 "
              f"{gaps[9 * len(gaps) // 10]:6.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
