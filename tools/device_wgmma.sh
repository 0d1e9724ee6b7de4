#!/usr/bin/env bash
# First run of the Hopper warpgroup GEMM on the H200 (issue 13 item 6): one device call
# after the MLX staging call (README, "Testing on the H200").  Builds, runs the wgmma
# and precompiled-launch tests on the GPU, ptxas/SASS of one kernel, then the fused-GEMM
# benchmark with the wgmma tile against mx.compile and Triton, for the dtypes given
# (default: float16 bfloat16).  Everything lands under $OUT as it is produced.  One call
# may not fit both dtypes in 600 s: run `bash tools/device_wgmma.sh float16`, then
# `TESTS=0 bash tools/device_wgmma.sh bfloat16`.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1 METILE_CUDA_WGMMA=${METILE_CUDA_WGMMA:-ws}
bash .dev/device-setup.sh > "$out/setup.log" 2>&1 || { tail -5 "$out/setup.log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . 2>&1 | tail -3
[ "${TESTS:-1}" = 1 ] && (cd /tmp && timeout 240 python3 -m pytest -q -p no:cacheprovider -x --junitxml="$out/junit.xml" \
  "$repo/tests/test_gemm_wgmma.py" "$repo/tests/test_cuda_precompiled.py" 2>&1 \
  | tee "$out/pytest.log" | tail -8)
[ "${TESTS:-1}" = 1 ] && python3 "$repo/tools/summarize_run.py" "$out/junit.xml" > "$out/device-run.json" 2>/dev/null
for dtype in ${@:-float16 bfloat16}; do
  json="$out/h200-gemm-$dtype-wgmma-$METILE_CUDA_WGMMA-128x256x64.json"
  warps=$([ "$METILE_CUDA_WGMMA" = ws ] && echo 9 || echo 8)
  timeout 200 python3 -m benchmarks.compiler.schedule_fusion --dtype "$dtype" --tile 128 256 64 \
    --num-simdgroups "$warps" \
    --sizes 1024 2048 4096 8192 --shapes 16x4096x4096 512x4096x11008 --rounds 5 \
    --target-ms 30 --output "$json" 2>&1 | tail -7
  timeout 150 python3 -m benchmarks.compiler.triton_peer --merge "$json" --dtype "$dtype" \
    --sizes 1024 2048 4096 8192 --shapes 16x4096x4096 512x4096x11008 2>&1 | tail -9
done
