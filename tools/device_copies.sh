#!/usr/bin/env bash
# Device call for the branch-free GEMM staging copies (one zero-filling cp.async per group
# under one alignment test of all a thread's groups): the warpgroup tests and the
# mma.sync staging tests on the GPU, the stage-timing probe (metile's kernel against the
# hand-written loop, the recorded source variants and cuBLAS), the fused-GEMM benchmark.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
(cd /tmp && timeout 110 python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" "$repo/tests/test_gemm_wgmma.py" "$repo/tests/test_wide_offsets.py" \
   > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -8 | tee -a "$log"
(cd /tmp && METILE_CUDA_WGMMA=0 timeout 50 python3 -m pytest -q -p no:cacheprovider --timeout 40 \
   "$repo/tests/test_gemm_async.py" 2>&1 | tail -2) | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "tests done: $((SECONDS-t0)) s" | tee -a "$log"
timeout 60 python3 tools/probes/wgmma_stage_timing.py "$out/h200-wgmma-stage-timing-fill.json" 2>&1 | tail -10 | tee -a "$log"
TESTS=0 TRITON=0 VARIANTS=1 SIZES="1024 4096 8192" BENCH_SECONDS=60 LOG="$log" \
  bash tools/device_gemm_session.sh 2>&1 | grep -v fails | tail -6
TESTS=0 TRITON=0 VARIANTS=1 DTYPE=bfloat16 SIZES="4096" SHAPES="512x4096x11008" BENCH_SECONDS=30 LOG="$log" \
  bash tools/device_gemm_session.sh 2>&1 | grep -v fails | tail -3
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
