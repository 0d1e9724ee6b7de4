#!/usr/bin/env bash
# The next device call (after 2026-11-30): the GEMM test files on the H200 with the
# in-flight warpgroup pipeline and the branch-free staging copies (one junit record), then
# the stage-timing probe with the recorded source variants (tools/probes), which attributes
# the remaining gap between metile's 4096^3 kernel (341 us) and the hand loop (228 us).
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
files="test_gemm_wgmma test_gemm test_epilogue test_epilogue_reads test_linear_fused_reads
       test_gemm_transposed_b test_pointer_matmul test_gemm_stages_and_order test_dual_gemm
       test_gemm_async"
(cd /tmp && timeout "${TEST_SECONDS:-400}" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do echo "$repo/tests/$f.py"; done) > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
timeout 90 python3 tools/probes/wgmma_stage_timing.py "$out/h200-wgmma-stage-timing.json" 2>&1 \
  | tail -12 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
