#!/usr/bin/env bash
# Schedule benchmarks on the H200 (after ../shared/device/stage-mlx-cuda; see README,
# "Testing on the H200").  JSON reports go to $OUT for benchmarks/results/.
#   bandwidth: elementwise bandwidth with 4-wide loads, plus the same kernel
#              hand-written through mx.fast.cuda_kernel / metile.cuda_kernel
#   gemm:      the fused f16/f32 GEMM with required schedules (double buffering,
#              4-wide staging, a 128x128x32 tile) paired against the automatic one
set -uo pipefail
bash .dev/device-setup.sh > /dev/null || exit 3
python3 -m pip install -q --no-index --no-build-isolation --no-deps . 2>&1 | tail -3
export MLX_ENABLE_TF32=0
out=${OUT:-/tmp}
budget=${BENCH_SECONDS:-150}
fusion() {  # name, extra arguments
  local name=$1; shift
  timeout "$budget" python3 -m benchmarks.compiler.schedule_fusion --sizes 1024 2048 4096 --rounds 5 \
    --target-ms 30 --time-anyway --output "$out/h200-schedule-fusion-$name.json" "$@" | tail -8
}
[ $# -gt 0 ] || set -- bandwidth gemm
for what in "$@"; do
  case $what in
    bandwidth)
      timeout "$budget" python3 -m benchmarks.cuda_bandwidth --sizes-mib 16 64 256 --blocks 2048 4096 \
        --num-simdgroups 0 8 --vector-width 4 --rounds 7 --raw-peers \
        --output "$out/h200-cuda-bandwidth-vec4.json" | tail -18 ;;
    gemm)
      fusion float16-vector4 --dtype float16 --vector-width 4
      fusion float16-128x128x32-double-buffer --dtype float16 --tile 128 128 32 --num-simdgroups 8 --double-buffer on
      fusion float32-double-buffer --dtype float32 --double-buffer on ;;
  esac
done
