#!/usr/bin/env bash
# One full device call for issue 13 (README, "Testing on the H200"; after the MLX staging
# call): build, the warpgroup GEMM tests on the GPU, the float16 fused-GEMM benchmark for
# each warpgroup variant (ws = warp-specialized, 1 = drained per step, 0 = mma.sync), and
# Triton's fused GEMM merged into the ws file.  At most 8 files come back from $OUT:
# log.txt, junit.xml, device-run.json and one JSON per variant.
# VARIANTS (default "ws 1"), DTYPE (float16), SIZES, SHAPES, TILE ("128 256 64"), TAG (file
# name suffix) override.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
dtype=${DTYPE:-float16}; sizes=${SIZES:-"2048 4096 8192"}; shapes=${SHAPES:-"16x4096x4096 512x4096x11008"}
log=${LOG:-$out/log.txt}; t0=$SECONDS
bash .dev/device-setup.sh >> "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
echo "setup+build: $((SECONDS-t0)) s" | tee -a "$log"
if [ "${TESTS:-1}" = 1 ]; then
  (cd /tmp && timeout "${TEST_SECONDS:-150}" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
     --junitxml="$out/junit.xml" "$repo/tests/test_gemm_wgmma.py" "$repo/tests/test_cuda_precompiled.py" 2>&1 \
     | tail -40) | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  echo "tests done: $((SECONDS-t0)) s" | tee -a "$log"
fi
for v in ${VARIANTS:-ws 1}; do
  warps=$([ "$v" = ws ] && echo 12 || echo 8)  # ws: 2 multiplying warpgroups + the producer
  tile=${TILE:-"128 256 64"}; [ "$v" = 0 ] && tile="128 128 32"
  METILE_CUDA_WGMMA=$v timeout "${BENCH_SECONDS:-140}" python3 -m benchmarks.compiler.schedule_fusion \
    --dtype "$dtype" --tile $tile --num-simdgroups "$warps" --sizes $sizes --shapes $shapes \
    --rounds 3 --target-ms 20 --time-anyway --output "$out/h200-gemm-$dtype-wgmma-$v${TAG:-}.json" 2>&1 | tail -12 | tee -a "$log"
  echo "variant $v done: $((SECONDS-t0)) s" | tee -a "$log"
done
first=$(set -- ${VARIANTS:-ws 1}; echo $1)
[ "${TRITON:-1}" = 1 ] && timeout "${TRITON_SECONDS:-120}" python3 -m benchmarks.compiler.triton_peer \
  --merge "$out/h200-gemm-$dtype-wgmma-$first.json" --dtype "$dtype" --sizes $sizes --shapes $shapes --time-anyway 2>&1 | tail -12 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
