#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): the 1024^3 call floor under
# MLX's graph settings (MLX_USE_CUDA_GRAPHS=0; MLX_MAX_OPS_PER_BUFFER larger/smaller).
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
for env in "MLX_USE_CUDA_GRAPHS=0" "MLX_MAX_OPS_PER_BUFFER=200" "MLX_MAX_OPS_PER_BUFFER=5" "MLX_USE_CUDA_GRAPHS=1"; do
  echo "== $env ==" | tee -a "$log"
  env $env timeout 100 python3 tools/probes/gemm_call_floor.py "$out/h200-gemm-call-floor-$env.json" 2>&1 | grep -E "x200|build" | tee -a "$log"
done
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
