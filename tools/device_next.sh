#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): the 1024^3 call floor with
# independent and chained calls (does MLX running independent calls concurrently cost?).
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 120 python3 tools/probes/gemm_outside_mlx.py "$out/h200-gemm-outside-mlx-graphs.json" 2>&1 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
