#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): metile's 1024^3 kernel launched
# outside MLX with CuPy, back to back (tools/probes/gemm_outside_mlx.py), TMA and whole.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
for variant in tma whole; do
  METILE_CUDA_WGMMA=$variant timeout 120 python3 tools/probes/gemm_outside_mlx.py "$out/h200-gemm-outside-mlx-$variant.json" 2>&1 | tail -8 | tee -a "$log"
done
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
