#!/usr/bin/env bash
# The next device call (written 2026-12-01, third session), with runtime scalars passed by
# value by default (the backend record's `scalars`): the launch floor probe, the eager
# host profile, the fused-GEMM benchmark for float16 / bfloat16 (Triton merged) at the
# default 128x256x64 tile and at 128x128x64 for the small and skinny shapes, then the
# GEMM and op test files on the GPU.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-560}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 90 python3 tools/probes/launch_floor.py "$out/h200-launch-floor.json" 2>&1 | tee -a "$log"
timeout 90 python3 tools/probes/host_profile.py "$out/host-profile-value.txt" 2>&1 | grep -E "^==" | tee -a "$log"
echo "probes: $((SECONDS-t0)) s" | tee -a "$log"
sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway"
for dt in float16 bfloat16; do
  f="$out/h200-gemm-$dt-value-128x256x64.json"
  timeout 150 $sf --dtype $dt --tile 128 256 64 --num-simdgroups 8 --sizes 1024 2048 4096 8192 \
    --shapes 16x4096x4096 512x4096x11008 --output "$f" 2>&1 | grep -v fails | tail -7 | tee -a "$log"
  timeout 100 python3 -m benchmarks.compiler.triton_peer --merge "$f" --dtype $dt --time-anyway 2>&1 | tail -3 | tee -a "$log"
  timeout 80 $sf --dtype $dt --tile 128 128 64 --num-simdgroups 8 --sizes 1024 2048 \
    --shapes 16x4096x4096 512x4096x11008 --output "$out/h200-gemm-$dt-value-128x128x64.json" 2>&1 | grep -v fails | tail -5 | tee -a "$log"
  echo "$dt: $((SECONDS-t0)) s" | tee -a "$log"
done
files="test_gemm_tma test_gemm_wgmma test_gemm_transposed_b test_epilogue_reads test_linear_fused_reads
       test_gemm_async test_gemm test_epilogue test_ops test_ops_batched test_cuda_scalars test_cuda_kernel test_cuda_precompiled"
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
   > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
