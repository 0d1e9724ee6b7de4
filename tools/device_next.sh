#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): with metile's own CUDA launch
# primitive: the fused-GEMM benchmark (float16, bfloat16; 128x128x64 for the small and
# skinny shapes, 128x256x64 for the large), the eager host profile, the GPU tests of the
# launch paths and the GEMM/op files, compute-sanitizer memcheck over the launch tests.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-540}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
python3 -c "from metile import _ext; print('has_cuda_launch', _ext.has_cuda_launch)" | tee -a "$log"
sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway"
for dt in float16 bfloat16; do
  timeout 80 $sf --dtype $dt --tile 128 128 64 --num-simdgroups 8 --sizes 1024 2048 \
    --shapes 16x4096x4096 --output "$out/h200-gemm-$dt-own-launch-128x128x64.json" 2>&1 | grep -E "\]:" | tee -a "$log"
  timeout 100 $sf --dtype $dt --tile 128 256 64 --num-simdgroups 8 --sizes 4096 8192 \
    --shapes 512x4096x11008 --output "$out/h200-gemm-$dt-own-launch-128x256x64.json" 2>&1 | grep -E "\]:" | tee -a "$log"
  echo "$dt: $((SECONDS-t0)) s" | tee -a "$log"
done
timeout 60 python3 tools/probes/host_profile.py "$out/host-profile-own-launch.txt" 2>&1 | grep -E "^==" | tee -a "$log"
timeout 60 python3 tools/probes/launch_floor.py "$out/h200-launch-floor-own-launch.json" 2>&1 | head -12 | tee -a "$log"
echo "probes: $((SECONDS-t0)) s" | tee -a "$log"
(cd /tmp && timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 python3 -m pytest -q -p no:cacheprovider \
   "$repo/tests/test_cuda_launch.py" > "$out/sanitizer-own-launch-memcheck.log" 2>&1)
echo "== memcheck exit $? ==" | tee -a "$log"
grep -E "ERROR SUMMARY|passed|failed" "$out/sanitizer-own-launch-memcheck.log" | tail -2 | tee -a "$log"
files="test_cuda_launch test_cuda_precompiled test_cuda_scalars test_gemm_tma test_gemm_wgmma test_ops test_cuda_kernel
       test_epilogue_reads test_linear_fused_reads test_gemm_transposed_b test_ops_batched test_gemm_async"
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
   > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
