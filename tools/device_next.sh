#!/usr/bin/env bash
# The next device call (written 2026-12-01, third session): where an eager launch spends
# its host time on the H200 (cProfile: tools/probes/host_profile.py), and what the
# 1024^3 float16 fused GEMM's kernel itself costs on the GPU (ncu gpu__time_duration)
# under the bulk-tensor loop and the whole-tile loop, with scalars read through
# pointers (MLX's managed small pool) and passed by value; wall time per invocation too.
set -uo pipefail
out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 150 python3 tools/probes/host_profile.py "$out/host-profile.txt" 2>&1 | grep -E "^==" | tee -a "$log"
echo "host: $((SECONDS-t0)) s" | tee -a "$log"
for v in "tma array" "tma value" "whole array" "whole value"; do
  set -- $v
  { echo "## METILE_CUDA_WGMMA=$1 METILE_CUDA_SCALARS=$2"
    METILE_CUDA_WGMMA=$1 METILE_CUDA_SCALARS=$2 timeout 100 python3 tools/probes/small_gemm_launches.py 1024
    METILE_CUDA_WGMMA=$1 METILE_CUDA_SCALARS=$2 timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
      python3 tools/probes/small_gemm_launches.py 1024 --profile | grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" ; } \
    >> "$out/small-1024.txt" 2>&1
  echo "$v: $((SECONDS-t0)) s" | tee -a "$log"
done
python3 - "$out/small-1024.txt" <<'PY' | tee -a "$log"
import re, sys
name = None
for line in open(sys.argv[1]):
    if line.startswith("##") or "per invocation" in line:
        print(line.rstrip()); continue
    m = re.match(r"\s+(\S+).*\((\d+), (\d+), 1\)x\((\d+)", line)
    if m:
        name = f"{m.group(1)[:28]} grid {m.group(2)}x{m.group(3)} block {m.group(4)}"; continue
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        print(f"  {name}: {m.group(2)} {m.group(1)}")
PY
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
