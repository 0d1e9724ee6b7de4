#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): the own launch primitive's
# modules now load when a launch is built; GPU tests of the launch paths and the GEMM/op
# files, compute-sanitizer memcheck over the launch tests, Triton merged into the float16
# own-launch benchmark files (carried in .dev/bench), the launch floor probe.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-520}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
(cd /tmp && timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 python3 -m pytest -q -p no:cacheprovider \
   "$repo/tests/test_cuda_launch.py" > "$out/sanitizer-own-launch-memcheck.log" 2>&1)
echo "== memcheck exit $? ==" | tee -a "$log"
grep -E "ERROR SUMMARY|passed|failed" "$out/sanitizer-own-launch-memcheck.log" | tail -2 | tee -a "$log"
timeout 60 python3 tools/probes/launch_floor.py "$out/h200-launch-floor-own-launch.json" 2>&1 | head -14 | tee -a "$log"
for f in .dev/bench/*.json; do
  cp "$f" "$out/"
  timeout 90 python3 -m benchmarks.compiler.triton_peer --merge "$out/$(basename $f)" --dtype float16 --time-anyway 2>&1 | tail -2 | tee -a "$log"
done
echo "probes: $((SECONDS-t0)) s" | tee -a "$log"
files="test_cuda_launch test_cuda_precompiled test_cuda_scalars test_gemm_tma test_gemm_wgmma test_ops test_cuda_kernel
       test_epilogue_reads test_linear_fused_reads test_gemm_transposed_b test_ops_batched test_gemm_async"
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
   > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
