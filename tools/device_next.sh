#!/usr/bin/env bash
# The next device call (written 2026-12-01, second session): METILE_CUDA_WGMMA=tma (the
# warpgroup GEMM's operands by bulk tensor copies, device-side tensor maps).  A smoke check
# of one product, then the fused-GEMM benchmark for float16 (Triton merged) and bfloat16
# with tma, then the TMA and warpgroup GPU tests.  At most 8 files come back.
set -uo pipefail
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-520}
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1
export METILE_CUDA_WGMMA=tma
timeout 60 python3 - <<'PY' 2>&1 | tail -4 | tee -a "$log"
import sys; sys.path.insert(0, "kernels")
import mlx.core as mx, numpy as np
from metile_kernels.gemm import grid, matmul
for m, n, k in [(1000, 1000, 1000), (4096, 4096, 4096)]:
    a = mx.random.normal((m, k)).astype(mx.float16); b = mx.random.normal((k, n)).astype(mx.float16)
    d = matmul[grid(m, n, 128, 256)].prepare(a, b, mx.zeros((m, n)), m, n, k, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)
    ref = np.array(a.astype(mx.float32)) @ np.array(b.astype(mx.float32))
    got = np.array(d())
    print(m, n, k, "bulk_tensor_copies" in d.variant.data["passes"], float(np.abs(got - ref).max() / np.abs(ref).max()), flush=True)
PY
shapes="16x4096x4096 512x4096x11008"
for dtype in float16 bfloat16; do
  timeout 110 python3 -m benchmarks.compiler.schedule_fusion --dtype $dtype --tile 128 256 64 --num-simdgroups 8 \
    --sizes 1024 2048 4096 8192 --shapes $shapes --rounds 3 --target-ms 20 --time-anyway \
    --output "$out/h200-gemm-$dtype-wgmma-tma.json" 2>&1 | grep -v fails | tail -7 | tee -a "$log"
  if [ $dtype = float16 ]; then
    timeout 100 python3 -m benchmarks.compiler.triton_peer --merge "$out/h200-gemm-float16-wgmma-tma.json" --dtype float16 \
      --sizes 1024 2048 4096 8192 --shapes $shapes --time-anyway 2>&1 | tail -7 | tee -a "$log"
  fi
done
left=$((budget - (SECONDS - t0)))
(cd /tmp && timeout "$left" python3 -m pytest -q -p no:cacheprovider --timeout 60 \
   --junitxml="$out/junit.xml" "$repo/tests/test_gemm_tma.py" "$repo/tests/test_gemm_wgmma.py" \
   "$repo/tests/test_linear_fused_reads.py" > "$out/pytest.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -20 | tee -a "$log"
python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
