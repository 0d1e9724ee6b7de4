#!/usr/bin/env bash
# The first full device call planned after 2026-11-30 (after the MLX staging call, README
# "Testing on the H200"): re-run the tests whose CUDA expectations were fixed without a GPU,
# the warpgroup tests (both variants, the producer warpgroup of `ws` included) and the big-
# buffer tests, then the float16 fused-GEMM benchmark for METILE_CUDA_WGMMA=ws and 1 with
# Triton merged in, then bfloat16 for ws.  At most 8 files come back from $OUT.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
log=$out/log.txt; t0=$SECONDS
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
echo "setup+build: $((SECONDS-t0)) s" | tee -a "$log"
files=(test_gemm_wgmma test_pointer_matmul test_debug_ops test_block_pointers test_int64
       test_epilogue test_wide_offsets)
(cd /tmp && timeout "${TEST_SECONDS:-200}" python3 -m pytest -q -p no:cacheprovider --timeout 120 \
   --junitxml="$out/junit.xml" $(for f in "${files[@]}"; do echo "$repo/tests/$f.py"; done) 2>&1 \
   | grep -E "^(FAILED|ERROR)|passed|failed|Timeout" | tail -30) | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "tests done: $((SECONDS-t0)) s" | tee -a "$log"
TESTS=0 VARIANTS="ws 1" SIZES="1024 4096 8192" BENCH_SECONDS=90 TRITON_SECONDS=90 LOG="$log" \
  bash tools/device_gemm_session.sh 2>&1 | tail -20
TESTS=0 TRITON=0 VARIANTS=ws DTYPE=bfloat16 SIZES="4096 8192" SHAPES="512x4096x11008" \
  BENCH_SECONDS=70 LOG="$log" bash tools/device_gemm_session.sh 2>&1 | tail -6
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
