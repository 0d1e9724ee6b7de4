#!/usr/bin/env bash
# The next device call (written 2026-12-01): first the scalar-argument probe (is the ~20 us
# a metile CUDA launch spends reading its scalars from MLX's managed small pool real, and
# do by-value scalars remove it?), then the fused-GEMM benchmark at 1024-8192 with Triton
# merged, the same with METILE_CUDA_SCALARS=value, then the GEMM test files (with
# test_cuda_scalars, whose GPU test runs the by-value launch).  If value wins and its tests
# pass, make it the default (settings.cuda_scalars).  At most 8 files come back.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-530}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 120 python3 tools/probes/scalar_args.py "$out/h200-scalar-args.json" 1024 4096 2>&1 | tail -4 | tee -a "$log"
shapes="16x4096x4096 512x4096x11008"
timeout 100 python3 -m benchmarks.compiler.schedule_fusion --dtype float16 --tile 128 256 64 --num-simdgroups 8 \
  --sizes 1024 2048 4096 8192 --shapes $shapes --rounds 3 --target-ms 20 --time-anyway \
  --output "$out/h200-gemm-float16-wgmma-whole.json" 2>&1 | grep -v fails | tail -7 | tee -a "$log"
timeout 100 python3 -m benchmarks.compiler.triton_peer --merge "$out/h200-gemm-float16-wgmma-whole.json" --dtype float16 \
  --sizes 1024 2048 4096 8192 --shapes $shapes --time-anyway 2>&1 | tail -7 | tee -a "$log"
METILE_CUDA_SCALARS=value timeout 80 python3 -m benchmarks.compiler.schedule_fusion --dtype float16 --tile 128 256 64 \
  --num-simdgroups 8 --sizes 1024 2048 4096 8192 --shapes $shapes --rounds 3 --target-ms 20 --time-anyway \
  --output "$out/h200-gemm-float16-wgmma-whole-scalars-by-value.json" 2>&1 | grep -v fails | tail -7 | tee -a "$log"
timeout 90 ncu --clock-control none --set full -k "regex:^metile_matmul" --launch-skip 1 -c 1 \
  --page details --csv python3 tools/probes/f32_gemm_launch.py 4096 > "$out/ncu-f32-4096.csv" 2>> "$log"
grep -E '"(Duration|Issue Slots Busy|Shared|Bank|Warp Cycles Per Issued)' "$out/ncu-f32-4096.csv" | cut -c1-200 | head -12 | tee -a "$log"
files="test_cuda_scalars test_gemm_wgmma test_gemm_transposed_b test_epilogue_reads test_linear_fused_reads test_dual_gemm
       test_gemm_async test_gemm test_epilogue"
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do echo "$repo/tests/$f.py"; done) > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
