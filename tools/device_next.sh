#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): the 1024^3 fused GEMM's call
# floor for the TMA (default) and cp.async ("whole") warpgroup variants, and the GPU time
# of the CUDA graphs MLX runs 20 back-to-back calls in (ncu --graph-profiling graph),
# against the same kernels one at a time.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
show() { python3 - "$1" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; k = head.index("Kernel Name") if "Kernel Name" in head else 4; v = head.index("Metric Value")
for r in rows[1:][-45:]:
    print(f"  {r[k][:60]:60s} {r[v]}")
PY
}
for variant in tma whole; do
  METILE_CUDA_WGMMA=$variant timeout 120 python3 tools/probes/gemm_call_floor.py "$out/h200-gemm-call-floor-$variant.json" 2>&1 | tee -a "$log"
  for way in raw nop mlx; do
    [ $variant = whole ] && [ $way != raw ] && continue
    echo "== graphs, $variant $way, 20 calls ==" | tee -a "$log"
    METILE_CUDA_WGMMA=$variant timeout 120 ncu --clock-control none --graph-profiling graph \
      --metrics gpu__time_duration.sum --csv python3 tools/probes/gemm_call_floor.py --ncu \
      --ways=$way --calls=20 > "$out/ncu-graph-$variant-$way.csv" 2> "$out/ncu-graph-$variant-$way.err"
    show "$out/ncu-graph-$variant-$way.csv" | tee -a "$log"
  done
  echo "$variant: $((SECONDS-t0)) s" | tee -a "$log"
done
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
