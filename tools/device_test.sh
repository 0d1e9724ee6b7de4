#!/usr/bin/env bash
# The H200 test workflow: run through the device tool (see README, "Testing on
# the H200") after ../shared/device/stage-mlx-cuda.  Installs MLX's CUDA build,
# builds metile against it, runs the whole test suite with MLX's default
# device (the GPU), and writes a summary to $OUT/device-run.json for
# tests/device-runs/.  Arguments: test paths relative to the repository
# (default: tests).
set -euo pipefail
repo=$(pwd)
# Strict FP32 for MLX's own matmuls in reference paths (MLX's CUDA default is TF32).
export MLX_ENABLE_TF32=0
bash .dev/device-setup.sh
python3 -m pip install -q --no-index --no-build-isolation --no-deps "$repo" 2>&1 | tail -3
out=${OUT:-/tmp}
cd /tmp  # import the installed package, not the source tree
set +e
targets=()
for t in "${@:-tests}"; do targets+=("$repo/$t"); done
# the log goes to $OUT as it is written: a run cut off by the device's time limit
# still brings back how far it got
python3 -m pytest -q -p no:cacheprovider --durations=15 --junitxml="$out/junit.xml" "${targets[@]}" 2>&1 \
  | tee "$out/pytest.log" | tail -45
set -e
python3 "$repo/tools/summarize_run.py" "$out/junit.xml" > "$out/device-run.json"
cat "$out/device-run.json"
