#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): the foreign-cubin refusal
# without iostreams, the launch tests (all) and the transposed-B graph test.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
timeout 60 python3 tools/probes/foreign_cubin.py 2>&1 | tail -3 | tee -a "$log"
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider --timeout 60 --junitxml="$out/junit.xml" \
   "$repo/tests/test_cuda_launch.py" "$repo/tests/test_gemm_transposed_b.py" > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$out/pytest.txt" | tail -10 | tee -a "$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
