#!/usr/bin/env bash
# The next device call (2026-12-01, after paired epilogue stores): the stage-timing probe
# (metile's whole kernel against the hand loop and cuBLAS), ncu stall samples of the whole
# kernel (is the epilogue still a quarter of them?), the float16 fused-GEMM benchmark with
# Triton merged and bfloat16, then the GEMM test files whose kernels run the warpgroup
# epilogue (one junit record).  At most 8 files come back.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 60 python3 tools/probes/wgmma_stage_timing.py "$out/h200-wgmma-stage-timing.json" 2>&1 | tail -9 | tee -a "$log"
timeout 100 ncu --clock-control none --set full -k "regex:^metile_matmul" --launch-skip 2 -c 1 -f -o /tmp/whole \
  python3 tools/probes/wgmma_stage_timing.py --only "metile whole" >> "$log" 2>&1
ncu -i /tmp/whole.ncu-rep --page source --csv --print-source sass > "$out/ncu-whole.csv" 2>> "$log"
echo "ncu: $((SECONDS-t0)) s" | tee -a "$log"
shapes="16x4096x4096 512x4096x11008"
timeout 100 python3 -m benchmarks.compiler.schedule_fusion --dtype float16 --tile 128 256 64 --num-simdgroups 8 \
  --sizes 1024 2048 4096 8192 --shapes $shapes --rounds 3 --target-ms 20 --time-anyway \
  --output "$out/h200-gemm-float16-wgmma-whole.json" 2>&1 | grep -v fails | tail -7 | tee -a "$log"
timeout 100 python3 -m benchmarks.compiler.triton_peer --merge "$out/h200-gemm-float16-wgmma-whole.json" --dtype float16 \
  --sizes 1024 2048 4096 8192 --shapes $shapes --time-anyway 2>&1 | tail -7 | tee -a "$log"
timeout 90 python3 -m benchmarks.compiler.schedule_fusion --dtype bfloat16 --tile 128 256 64 --num-simdgroups 8 \
  --sizes 1024 4096 8192 --shapes $shapes --rounds 3 --target-ms 20 --time-anyway \
  --output "$out/h200-gemm-bfloat16-wgmma-whole.json" 2>&1 | grep -v fails | tail -5 | tee -a "$log"
echo "benchmarks: $((SECONDS-t0)) s" | tee -a "$log"
files="test_gemm_wgmma test_epilogue test_epilogue_reads test_linear_fused_reads test_gemm_transposed_b
       test_dual_gemm test_gemm"
left=$((550 - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do echo "$repo/tests/$f.py"; done) > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
