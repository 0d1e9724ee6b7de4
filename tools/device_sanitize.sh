#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over a representative subset of the
# DSL kernel tests on the H200 (run after tools/device_test.sh installed metile).
# Logs go to $OUT/sanitizer-*.log; the last lines of each are printed.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp}
export MLX_ENABLE_TF32=0
subset="float32 and (vector_add or scale_bias or softmax or layernorm or transpose or matmul or block_sum or relaunch) or ragged_shapes or affine"
cd /tmp
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 99 \
    python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_dsl_kernels.py" "$repo/tests/test_cuda_kernel.py" "$repo/tests/test_gemm.py" "$repo/tests/test_epilogue.py" \
    -k "$subset or cu_ or shared_memory" > "$out/sanitizer-$tool.log" 2>&1
  echo "== $tool exit $? =="
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/sanitizer-$tool.log" | tail -3
  # schedule lowering (4-wide loads, double-buffered stages, interior/remainder
  # splits) and 8x8 warp fragments (shuffles, masked tails through shared scratch)
  compute-sanitizer --tool "$tool" --error-exitcode 99 \
    python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_schedule_lowering.py" "$repo/tests/test_fragments.py" \
    -k "width_four or double_buffer or ragged or two_products or masked_tiles or attention or per_simdgroup or column_major or negative_origin" \
    > "$out/sanitizer-$tool-schedules.log" 2>&1
  echo "== $tool (schedules, fragments) exit $? =="
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/sanitizer-$tool-schedules.log" | tail -3
done
