#!/usr/bin/env bash
# ncu of metile's 1024^3 float16 fused GEMM (128x256x64 warpgroup tile): its GPU time there
# was 32-35 us against 7.1 for cuBLAS (benchmarks/results/h200-gemm-1024-kernel-durations-*),
# far above the 4096^3 kernel's time per K step.  Details and per-instruction stall
# samples, warm caches (--cache-control none) as in the benchmark.
set -uo pipefail
out=${OUT:-/tmp}; log=$out/log.txt
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 120 ncu --clock-control none --cache-control none --set full -k "regex:^metile_matmul_epilogue" \
  --launch-skip 1 -c 1 -f -o /tmp/small python3 tools/probes/small_gemm_launches.py 1024 --profile >> "$log" 2>&1
ncu -i /tmp/small.ncu-rep --page details --csv > "$out/ncu-1024-details.csv" 2>> "$log"
ncu -i /tmp/small.ncu-rep --page source --csv --print-source sass > "$out/ncu-1024-source.csv" 2>> "$log"
grep -E '"(Duration|Elapsed Cycles|SM Frequency|Issue Slots Busy|Registers Per Thread|DRAM Throughput|L2 Hit Rate|Warp Cycles Per Issued Instruction)"' \
  "$out/ncu-1024-details.csv" | cut -d, -f5,13-15 | head -30 | tee -a "$log"
