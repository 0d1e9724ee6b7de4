#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): does MLX overlap host and GPU
# work (tools/probes/host_gpu_overlap.py); the 1024^3 fused GEMM by tile (Triton's pick
# there is 64x64x64, 4 warps); ncu sections of the default 1024^3 kernel.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 150 python3 tools/probes/host_gpu_overlap.py "$out/h200-host-gpu-overlap.json" 2>&1 | tee -a "$log"
echo "overlap: $((SECONDS-t0)) s" | tee -a "$log"
sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway --dtype float16 --sizes 1024 2048"
for t in "64 64 64 4" "64 128 64 4" "128 64 64 4" "128 128 64 8" "64 256 64 4"; do
  set -- $t
  timeout 60 $sf --tile $1 $2 $3 --num-simdgroups $4 --output "$out/h200-gemm-float16-1024-$1x$2x$3w$4.json" 2>&1 \
    | grep -E "\^3" | sed "s/^/$1x$2x$3 w$4: /" | tee -a "$log"
done
echo "tiles: $((SECONDS-t0)) s" | tee -a "$log"
timeout 150 ncu --clock-control none --kernel-name regex:metile_matmul_epilogue --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --section MemoryWorkloadAnalysis \
  python3 tools/probes/gemm_call_floor.py --ncu --ways=raw --calls=3 > "$out/ncu-1024-sections.txt" 2>&1
grep -E "Duration|Throughput|Stall|Warp Cycles|Issued|Eligible|Active Warps|Registers|Shared Memory|Theoretical Occ|Achieved Occ|Waves" "$out/ncu-1024-sections.txt" | head -60 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
