#!/usr/bin/env bash
# Schedule benchmarks on the H200 (after ../shared/device/stage-mlx-cuda; see README,
# "Testing on the H200"): elementwise bandwidth with 4-wide loads, and the fused GEMM
# with required double buffering / 4-wide staging paired against its automatic
# schedule.  JSON reports go to $OUT for benchmarks/results/.
set -uo pipefail
bash .dev/device-setup.sh > /dev/null || exit 3
python3 -m pip install -q --no-index --no-build-isolation --no-deps . 2>&1 | tail -3
export MLX_ENABLE_TF32=0
out=${OUT:-/tmp}
budget=${BENCH_SECONDS:-150}
timeout "$budget" python3 -m benchmarks.cuda_bandwidth --sizes-mib 16 64 256 --blocks 2048 4096 \
  --num-simdgroups 0 8 --vector-width 4 --rounds 7 --output "$out/h200-cuda-bandwidth-vec4.json" | tail -15
for dtype in float16 float32; do
  timeout "$budget" python3 -m benchmarks.compiler.schedule_fusion --dtype "$dtype" --sizes 1024 2048 4096 \
    --double-buffer on --rounds 5 --target-ms 30 --time-anyway \
    --output "$out/h200-schedule-fusion-$dtype-double-buffer.json" | tail -8
done
