#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): which memory traffic of a
# GEMM-shaped launch is slow inside MLX (tools/probes/memory_form.py).
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
for env in x; do

  timeout 150 python3 tools/probes/memory_form.py "$out/h200-memory-form.json" 2>&1 | tee -a "$log"
done
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
