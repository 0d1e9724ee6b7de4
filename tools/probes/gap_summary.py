"""Kernel durations and the gaps before them, per kernel name, from nsys's
cuda_gpu_trace CSV (tools/probes/launch_gaps.py's timeline)."""
import csv
import sys

from launch_gaps import summarize


def main(path):
    rows = [r for r in csv.DictReader(open(path))
            if r.get("Name") and "memcpy" not in r["Name"].lower()]
    summarize([(int(r["Start (ns)"]) / 1e3, (int(r["Start (ns)"]) + int(r["Duration (ns)"])) / 1e3,
                r["Name"]) for r in rows])


if __name__ == "__main__":
    main(sys.argv[1])
