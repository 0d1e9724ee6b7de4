#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): metile's own CUDA launch
# primitive (csrc/cuda_launch.cpp) built and tested on the GPU, the 1024^3 call floor
# with it (fused) against MLX's precompiled path (raw), then the fused-GEMM benchmark.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
python3 -c "from metile import _ext; print('has_cuda_launch', _ext.has_cuda_launch)" | tee -a "$log"
(cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 120 -x \
   --junitxml="$out/junit-launch.xml" "$repo/tests/test_cuda_launch.py" "$repo/tests/test_cuda_precompiled.py" \
   "$repo/tests/test_cuda_scalars.py" "$repo/tests/test_gemm_tma.py" > "$out/pytest-launch.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed|Error" "$out/pytest-launch.txt" | tail -15 | tee -a "$log"
echo "tests: $((SECONDS-t0)) s" | tee -a "$log"
timeout 100 python3 tools/probes/gemm_call_floor.py "$out/h200-gemm-call-floor-own-launch.json" 2>&1 | grep -E "x200|build|launch|Error" | tee -a "$log"
echo "floor: $((SECONDS-t0)) s" | tee -a "$log"
sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway"
timeout 150 $sf --dtype float16 --tile 128 128 64 --num-simdgroups 8 --sizes 1024 2048 \
  --shapes 16x4096x4096 --output "$out/h200-gemm-float16-own-launch-128x128x64.json" 2>&1 | grep -E "\^3|x4096" | tee -a "$log"
timeout 150 $sf --dtype float16 --tile 128 256 64 --num-simdgroups 8 --sizes 4096 8192 \
  --shapes 512x4096x11008 --output "$out/h200-gemm-float16-own-launch-128x256x64.json" 2>&1 | grep -E "\^3|x11008" | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
