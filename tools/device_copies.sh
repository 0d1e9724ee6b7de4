#!/usr/bin/env bash
# Device call after the GEMM staging copies became one zero-filling cp.async per 16-byte
# group (in-bounds prefix counted, no per-group mask branch): the GEMM tests on the GPU
# (the warpgroup path, and mma.sync with METILE_CUDA_WGMMA=0), the stage-timing probe
# (metile's kernel against the hand-written loop and cuBLAS), then the fused-GEMM benchmark.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
files="test_gemm_wgmma test_gemm_async test_gemm test_pointer_matmul test_epilogue test_epilogue_reads
       test_gemm_transposed_b test_linear_fused_reads test_gemm_stages_and_order test_dual_gemm"
(cd /tmp && timeout 170 python3 -m pytest -q -p no:cacheprovider --timeout 60 -x \
   --junitxml="$out/junit.xml" $(for f in $files; do echo "$repo/tests/$f.py"; done) 2>&1 \
   | grep -E "^(FAILED|ERROR)|passed|failed|Timeout|Error" | tail -15) | tee -a "$log"
(cd /tmp && METILE_CUDA_WGMMA=0 timeout 90 python3 -m pytest -q -p no:cacheprovider --timeout 60 -x \
   "$repo/tests/test_gemm_async.py" "$repo/tests/test_gemm.py" 2>&1 | tail -3) | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "tests done: $((SECONDS-t0)) s" | tee -a "$log"
timeout 120 python3 tools/probes/wgmma_stage_timing.py "$out/h200-wgmma-stage-timing-fill.json" 2>&1 | tail -12 | tee -a "$log"
TESTS=0 TRITON=0 VARIANTS=1 SIZES="1024 4096 8192" BENCH_SECONDS=120 LOG="$log" \
  bash tools/device_gemm_session.sh 2>&1 | grep -v fails | tail -8
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
