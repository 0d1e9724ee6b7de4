#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): where loading another GPU's
# cubin crashes (cuda-gdb backtrace of tools/probes/foreign_cubin.py), then the GPU tests
# of the launch paths and the GEMM/op files without that test.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-420}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
timeout 90 cuda-gdb -batch -ex run -ex bt --args python3 tools/probes/foreign_cubin.py > "$out/foreign-cubin-gdb.txt" 2>&1
grep -E "refused|SIGSEGV|^#[0-9]" "$out/foreign-cubin-gdb.txt" | head -25 | tee -a "$log"
echo "gdb: $((SECONDS-t0)) s" | tee -a "$log"
files="test_cuda_launch test_cuda_precompiled test_cuda_scalars test_gemm_tma test_gemm_wgmma test_ops test_cuda_kernel
       test_epilogue_reads test_linear_fused_reads test_gemm_transposed_b test_ops_batched test_gemm_async"
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 -k "not foreign" \
   --junitxml="$out/junit.xml" $(for f in $files; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
   > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
