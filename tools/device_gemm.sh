#!/usr/bin/env bash
# The fast-GEMM check on the H200 (issue 13): build, the GEMM correctness tests on the
# GPU, ptxas resources and SASS instruction counts of carried kernels (.dev/sass/*.cu,
# written by the lowering on CPU), then the fused-GEMM benchmark.  Results under $OUT.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > /dev/null || exit 3
python3 -m pip install -q --no-index --no-build-isolation --no-deps . 2>&1 | tail -3
(cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider -x "$repo/tests/test_gemm_async.py" \
  "$repo/tests/test_gemm.py" "$repo/tests/test_epilogue.py" 2>&1 | tail -6)
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
for f in .dev/sass/*.cu; do
  [ -n "$nvcc" ] || break
  "$nvcc" -arch=sm_90 -cubin -Xptxas -v -o /tmp/k.cubin "$f" 2>&1 | grep -E "registers|spill" | head -3
  cuobjdump -sass /tmp/k.cubin > "$out/$(basename "$f" .cu).sass" 2>/dev/null
  echo "$f: $(grep -cE 'LDGSTS' "$out/$(basename "$f" .cu).sass") LDGSTS $(grep -cE 'HMMA' "$out/$(basename "$f" .cu).sass") HMMA $(grep -cE 'LDSM' "$out/$(basename "$f" .cu).sass") LDSM $(grep -cE 'STG' "$out/$(basename "$f" .cu).sass") STG $(grep -cE 'BAR' "$out/$(basename "$f" .cu).sass") BAR"
done
bench() {  # name, arguments
  local name=$1; shift
  timeout "${BENCH_SECONDS:-120}" python3 -m benchmarks.compiler.schedule_fusion --rounds 5 --target-ms 30 \
    --time-anyway --output "$out/h200-gemm-$name.json" "$@" | tail -4
}
for spec in "${@}"; do
  set -- $spec; bench "$@"
done
