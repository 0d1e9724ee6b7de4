#!/usr/bin/env bash
# Device call after the wgmma pipeline kept a product group in flight (2026-11-30, evening):
# the warpgroup tests on the GPU, then float16 and bfloat16 fused GEMMs for variant 1 at
# 128x256x64, and float16 at 128x128x64 for the small and skinny shapes.
set -uo pipefail
out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export LOG=$log TRITON=0
TEST_SECONDS=200 VARIANTS=1 SIZES="1024 2048 4096 8192" BENCH_SECONDS=120 bash tools/device_gemm_session.sh 2>&1 | tail -25
TESTS=0 VARIANTS=1 DTYPE=bfloat16 SIZES="4096 8192" SHAPES="512x4096x11008" BENCH_SECONDS=70 \
  bash tools/device_gemm_session.sh 2>&1 | tail -6
TESTS=0 VARIANTS=1 TILE="128 128 64" TAG=-128x128 SIZES="1024 2048 4096" SHAPES="16x4096x4096 512x4096x11008" \
  BENCH_SECONDS=90 bash tools/device_gemm_session.sh 2>&1 | tail -8
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
