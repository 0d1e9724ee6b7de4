#!/usr/bin/env bash
# One device call (after the MLX staging call, README "Testing on the H200"): the test files
# a poisoned CUDA context kept from running on 2026-11-30 plus the warpgroup GEMM tests,
# after the fused-GEMM benchmark for several warpgroup configurations (tests get the
# time left of BUDGET seconds).  At most 8 files come back from $OUT.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
log=$out/log.txt; t0=$SECONDS
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
echo "setup+build: $((SECONDS-t0)) s" | tee -a "$log"
bench() {  # variant tile... name
  local v=$1 name=$5
  METILE_CUDA_WGMMA=$v timeout 70 python3 -m benchmarks.compiler.schedule_fusion --dtype float16 \
    --tile $2 $3 $4 --num-simdgroups $([ "$v" = ws ] && echo 12 || echo 8) --sizes 4096 8192 --shapes 512x4096x11008 \
    --rounds 3 --target-ms 20 --time-anyway --output "$out/$name" 2>&1 | grep -E "us|Error" | tail -4 | tee -a "$log"
  echo "$name done: $((SECONDS-t0)) s" | tee -a "$log"
}
bench 1 128 256 64 h200-gemm-f16-wgmma-1-128x256x64.json
bench ws 128 256 64 h200-gemm-f16-wgmma-ws4-128x256x64.json
bench 1 128 128 64 h200-gemm-f16-wgmma-1-128x128x64.json
files=(test_debug_ops test_int64 test_block_pointers test_gemm_wgmma test_pointer_matmul
       test_triton_small_names test_dual_gemm test_epilogue test_model_ops_norms
       test_quantized_op)
(cd /tmp && timeout $(( ${BUDGET:-540} - (SECONDS - t0) )) python3 -m pytest -q -p no:cacheprovider --timeout 240 --session-timeout $(( ${BUDGET:-540} - 20 - (SECONDS - t0) )) \
   --junitxml="$out/junit.xml" $(for f in "${files[@]}"; do echo "$repo/tests/$f.py"; done) 2>&1 \
   | grep -E "^(FAILED|ERROR)|passed|failed|Timeout" | tail -40) | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "tests done: $((SECONDS-t0)) s" | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
