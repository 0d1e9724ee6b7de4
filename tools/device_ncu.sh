#!/usr/bin/env bash
# Hardware counters for metile's 4096^3 float16 warpgroup GEMM (the one-GPU machine runs
# Firecracker, where ncu reads counters: /work/.library/device/KINDS.md; leave the clocks
# alone).  Profiles one launch of metile's kernel (METILE_CUDA_WGMMA, default 1) and one of
# the hand-written loop from the stage-timing probe: warp-state stalls, issue activity,
# tensor-pipe utilization, L2/DRAM throughput, as text under $OUT.
set -uo pipefail
out=${OUT:-/tmp}; log=$out/log.txt
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
for k in metile_matmul probe; do
  timeout 240 ncu --clock-control none --set full -k "regex:^$k" --launch-skip 2 -c 1 \
    --page details --csv python3 tools/probes/wgmma_stage_timing.py > "$out/ncu-$k.csv" 2>> "$log"
  grep -E '"(Warp Cycles Per Issued Instruction|Issue Slots Busy|Stall|Tensor|L2 Cache Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Duration)' \
    "$out/ncu-$k.csv" | cut -c1-220 | head -40 | tee -a "$log"
done
