#!/usr/bin/env bash
# The next device call (after 2026-11-30): the stage-timing probe (metile's kernels as
# METILE_CUDA_WGMMA=1 and =whole emit them, the first without its per-tile copy test; metile's
# default 4096^3 kernel ran 341 us, the hand loop 228), the fused-GEMM benchmark for whole
# and 1, then the GEMM test files (one junit record; test_gemm_wgmma runs whole on the GPU).
# If whole passes its GPU tests and wins, make it the default (settings.wgmma_variant).
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 60 python3 tools/probes/wgmma_stage_timing.py \
  "$out/h200-wgmma-stage-timing.json" 2>&1 | tail -12 | tee -a "$log"
TESTS=0 TRITON=0 VARIANTS="whole 1" SIZES="1024 4096 8192" BENCH_SECONDS=60 LOG="$log" \
  bash tools/device_gemm_session.sh 2>&1 | grep -v fails | tail -12
files="test_gemm_wgmma test_gemm test_epilogue test_epilogue_reads test_linear_fused_reads
       test_gemm_transposed_b test_pointer_matmul test_gemm_stages_and_order test_dual_gemm
       test_gemm_async"
left=$((560 - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do echo "$repo/tests/$f.py"; done) > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
