#!/usr/bin/env bash
# The next device call (written 2026-12-01, second session): the stage-timing probe with the
# TMA form of the warpgroup loop (wgmma_tma.cu: device-side tensor maps from a template),
# the host cost of one launch (launch_cost.py), the small-size tiles (small_gemm_launches.py
# at 1024 and 2048) and ncu of the strict float32 GEMM at 4096.  At most 8 files come back.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 150 python3 tools/probes/wgmma_stage_timing.py "$out/h200-wgmma-tma-probe.json" 2>&1 | tail -14 | tee -a "$log"
timeout 90 python3 tools/probes/launch_cost.py "$out/h200-launch-cost.json" 2>&1 | tail -8 | tee -a "$log"
for n in 1024 2048; do
  timeout 90 python3 tools/probes/small_gemm_launches.py $n 2>&1 | tail -8 | tee -a "$log"
done
timeout 90 ncu --clock-control none --set full -k "regex:metile_matmul" --launch-skip 1 -c 1 \
  --page details --csv python3 tools/probes/f32_gemm_launch.py 4096 > "$out/ncu-f32-4096.csv" 2>> "$log"
grep -E '"(Duration|Registers Per Thread|Achieved Occupancy|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active)"' \
  "$out/ncu-f32-4096.csv" | awk -F'","' '{print $(NF-3), $(NF-1), $NF}' | head -12 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
