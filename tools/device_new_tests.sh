#!/usr/bin/env bash
# The test files added in the session of 2026-11-30 (afternoon), none yet run on a GPU:
# one device call after the MLX staging call (README, "Testing on the H200").  Writes
# $OUT/junit.xml, $OUT/pytest.log and $OUT/device-run.json (for tests/device-runs/).
set -uo pipefail
# (tests/test_gemm_wgmma.py turns the warpgroup path on for itself; elsewhere it stays off)
exec bash tools/device_test.sh \
  tests/test_gemm_wgmma.py tests/test_cuda_precompiled.py tests/test_split_k.py \
  tests/test_shared_optin.py tests/test_ops_batched.py tests/test_int64.py \
  tests/test_random.py tests/test_scans_sort.py tests/test_block_pointers.py \
  tests/test_debug_ops.py tests/test_pointer_matmul.py tests/test_triton_small_names.py \
  tests/test_model_ops_norms.py tests/test_attention_op.py tests/test_quantized_op.py \
  tests/test_dual_gemm.py tests/test_epilogue.py
