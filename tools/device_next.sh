#!/usr/bin/env bash
# The next device call (written 2026-12-01, second session), with METILE_CUDA_WGMMA=tma the
# default: the fused-GEMM benchmark for float16 with "whole" and with the default back to
# back (where does the bulk-tensor loop lose: small and skinny shapes?), then the GEMM and
# op test files on the GPU under the new default.  At most 8 files come back.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-520}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
shapes="16x4096x4096 512x4096x11008 4096x4096x4096"
for variant in whole tma; do
  METILE_CUDA_WGMMA=$variant timeout 90 python3 -m benchmarks.compiler.schedule_fusion --dtype float16 --tile 128 256 64 \
    --num-simdgroups 8 --sizes 1024 2048 --shapes $shapes --rounds 3 --target-ms 20 --time-anyway \
    --output "$out/h200-gemm-float16-wgmma-$variant-small.json" 2>&1 | grep -v fails | tail -5 | tee -a "$log"
done
files="test_gemm_transposed_b test_epilogue_reads test_linear_fused_reads test_gemm_async test_gemm test_epilogue
       test_ops test_ops_batched test_convert"
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" $(for f in $files; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
   > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
