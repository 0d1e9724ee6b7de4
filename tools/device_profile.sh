#!/usr/bin/env bash
# One device call (after the MLX staging call): where the default (whole) warpgroup GEMM
# loses to the hand-written loop and to cuBLAS.  ncu per-instruction stall samples (SASS)
# of metile's 4096^3 float16 kernel and of the hand loop; ncu GPU durations against the
# per-invocation wall time at 1024^3 for three tiles; then the fused-GEMM benchmark for
# bfloat16 (Triton merged) and strict float32 (two tiles).  At most 8 files come back:
# log.txt, ncu-{whole,probe}.csv, small.txt, three JSON.
set -uo pipefail
out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
for k in "metile whole:metile_matmul:whole" "probe S=4 whole:probe:probe"; do
  IFS=: read -r only regex name <<< "$k"
  timeout 150 ncu --clock-control none --set full --import-source yes -k "regex:^$regex" \
    --launch-skip 2 -c 1 -f -o "/tmp/$name" python3 tools/probes/wgmma_stage_timing.py --only "$only" >> "$log" 2>&1
  ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$out/ncu-$name.csv" 2>> "$log" \
    || ncu -i "/tmp/$name.ncu-rep" --page raw --csv > "$out/ncu-$name.csv" 2>> "$log"
  echo "ncu $name: $(wc -l < "$out/ncu-$name.csv") lines, $((SECONDS-t0)) s" | tee -a "$log"
done
{ timeout 90 python3 tools/probes/small_gemm_launches.py 1024
  timeout 120 ncu --clock-control none --section SpeedOfLight python3 tools/probes/small_gemm_launches.py 1024 --profile \
    | grep -E "^  [a-zA-Z_].*\(|Duration" ; } > "$out/small.txt" 2>&1
tail -6 "$out/small.txt" | tee -a "$log"; echo "small: $((SECONDS-t0)) s" | tee -a "$log"
for dt in bfloat16; do
  timeout 150 python3 -m benchmarks.compiler.schedule_fusion --dtype $dt --tile 128 256 64 --num-simdgroups 8 \
    --sizes 1024 2048 4096 8192 --shapes 16x4096x4096 512x4096x11008 --rounds 3 --target-ms 20 --time-anyway \
    --output "$out/h200-gemm-$dt-wgmma-whole.json" 2>&1 | grep -v fails | tail -7 | tee -a "$log"
  timeout 120 python3 -m benchmarks.compiler.triton_peer --merge "$out/h200-gemm-$dt-wgmma-whole.json" --dtype $dt \
    --sizes 1024 2048 4096 8192 --shapes 16x4096x4096 512x4096x11008 --time-anyway 2>&1 | tail -7 | tee -a "$log"
done
echo "bf16: $((SECONDS-t0)) s" | tee -a "$log"
for t in "64 64 16 4" "128 128 32 8"; do
  set -- $t
  timeout 110 python3 -m benchmarks.compiler.schedule_fusion --dtype float32 --tile $1 $2 $3 --num-simdgroups $4 \
    --sizes 1024 2048 4096 --rounds 3 --target-ms 20 --time-anyway \
    --output "$out/h200-gemm-float32-strict-$1x$2x$3.json" 2>&1 | grep -v fails | tail -4 | tee -a "$log"
done
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
