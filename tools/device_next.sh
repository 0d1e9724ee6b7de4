#!/usr/bin/env bash
# The next device call (written 2026-12-01, fourth session): where a 1024^3 fused GEMM's
# wall time per mx.compile'd call goes (tools/probes/gemm_call_floor.py, then every kernel
# its calls launch under ncu), the > 2^31-element tests on the GPU, and compute-sanitizer
# over the default GEMM path (TMA copies, scalars by value).
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
timeout 150 python3 tools/probes/gemm_call_floor.py "$out/h200-gemm-call-floor.json" 2>&1 | tee -a "$log"
echo "floor: $((SECONDS-t0)) s" | tee -a "$log"
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 400 \
  python3 tools/probes/gemm_call_floor.py --ncu > "$out/ncu-call-floor.csv" 2> "$out/ncu-call-floor.err"
python3 - "$out/ncu-call-floor.csv" <<'PY' | tee -a "$log"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; k, v = head.index("Kernel Name"), head.index("Metric Value")
for r in rows[1:][-60:]:
    print(f"{r[k][:70]:70s} {r[v]}")
PY
echo "ncu: $((SECONDS-t0)) s" | tee -a "$log"
(cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 180 \
   --junitxml="$out/junit-wide.xml" "$repo/tests/test_wide_offsets.py" > "$out/pytest-wide.txt" 2>&1)
tail -3 "$out/pytest-wide.txt" | tee -a "$log"
echo "wide: $((SECONDS-t0)) s" | tee -a "$log"
for tool in memcheck racecheck; do
  (cd /tmp && timeout 110 compute-sanitizer --tool $tool --error-exitcode 99 \
     python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_gemm_tma.py" "$repo/tests/test_cuda_scalars.py" \
     -k "not nvrtc and not sass" > "$out/sanitizer-tma-$tool.log" 2>&1)
  echo "== $tool exit $? ==" | tee -a "$log"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/sanitizer-tma-$tool.log" | tail -3 | tee -a "$log"
done
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
