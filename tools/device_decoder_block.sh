#!/usr/bin/env bash
# benchmarks/decoder_block.py on the H200: the llama-style decoder block converted to
# metile (auto and forced metile) against the unconverted MLX block, forward and
# forward+backward, hidden 4096 / MLP 11008 / T 512 and 2048, batch 1.  One device call
# after the MLX staging call (README, "Testing on the H200"): carry
# [".dev/part.ab", ".dev/wheels", ".dev/device-setup.sh"], command
#   bash tools/device_decoder_block.sh [float16] [bfloat16] [-- extra benchmark arguments]
# JSON (and the printed log) go to $OUT for benchmarks/results/.  The run time per dtype
# has not been measured; if both dtypes do not fit one 10-minute call, pass one.
set -uo pipefail
bash .dev/device-setup.sh > /dev/null || exit 3
python3 -m pip install -q --no-index --no-build-isolation --no-deps . 2>&1 | tail -3
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
dtypes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do dtypes+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#dtypes[@]} -gt 0 ] || dtypes=(float16 bfloat16)
for dtype in "${dtypes[@]}"; do
  timeout "${BENCH_SECONDS:-270}" python3 -m benchmarks.decoder_block --dtypes "$dtype" \
    --tokens 512 2048 --output "$out/h200-decoder-block-$dtype.json" "$@" 2>&1 \
    | tee "$out/decoder-block-$dtype.log" | tail -8
done
