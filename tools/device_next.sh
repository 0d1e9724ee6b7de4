#!/usr/bin/env bash
# The next device calls (written 2026-12-01, fifth session): what this session changed
# without a GPU.  Two calls after the MLX staging call (README, "Testing on the H200"),
# carry [".dev/part.ab", ".dev/wheels", ".dev/device-setup.sh"]:
#   OUT=$OUT bash tools/device_next.sh tests   -- the GPU test files the strict-float32 ring
#       (cp.async stages, 16-byte operand reads: passes/lower_matmul.py) and the gated_mlp
#       tile fix touch, then compute-sanitizer memcheck/racecheck over the new path;
#   OUT=$OUT bash tools/device_next.sh bench   -- strict float32 tiles against mx.compile
#       (1024/2048/4096), float16/bfloat16 tiles at 1024^3 with the own launch, then the
#       decoder block (float16) with the time left;
#   OUT=$OUT bash tools/device_next.sh ffma    -- the float32 ring with whole-group copies:
#       kernel variants alone against cuBLAS (tools/probes/ffma_variants.py), its GPU tests,
#       the fused-GEMM benchmark at every size, then the decoder block (backward GEMMs in the
#       operand dtype);
#   OUT=$OUT bash tools/device_next.sh final  -- BK=8 float32 tiles (cuBLAS's 128x128x8 form, 128
#       registers: two blocks per SM) alone and in the fused benchmark at 4096^3, then the
#       decoder block (MLX composites in the operand dtype);
#   OUT=$OUT bash tools/device_next.sh ops17   -- issue 17's op benchmarks with the own CUDA
#       launch (never re-measured since it landed): norms/softmax/rope, attention
#       (prefill and decode), int4 quantized matmul (decode and prefill), float16.
#   OUT=$OUT bash tools/device_next.sh s6      -- (sixth session) ncu of the strict float32
#       kernel and cuBLAS's SGEMM at 4096^3 (stalls, issue, occupancy), issue 17's op
#       benchmarks, and the eager launch cost
#   OUT=$OUT bash tools/device_next.sh s6b     -- 16x8 float32 micro-tiles (cuBLAS's form)
#       alone against cuBLAS and fused at 4096^3, then the bfloat16 decoder block
#   OUT=$OUT bash tools/device_next.sh s6c     -- the dual GEMM on the warpgroup MMA: GPU tests,
#       memcheck, gated_mlp / MLP / linear+gelu against the MLX composites, float16 decoder block
#   OUT=$OUT bash tools/device_next.sh s6d     -- the kernels of one converted decoder-block
#       forward (T=2048, ncu durations: tools/probes/block_kernels.py), then GPU tests
#   OUT=$OUT bash tools/device_next.sh s6e     -- the converted block's host time against MLX's
#       CUDA-graph settings (cache thrashing check, graphs off, a larger graph cache)
#   OUT=$OUT bash tools/device_next.sh s7      -- (next session) where the dual GEMM's in-graph
#       time goes: ncu durations of every kernel over 20 queued calls of each compiled form
#       (tools/probes/gated_in_graph.py), MLX_MAX_OPS_PER_BUFFER=1, then the eager launch cost
# Logs go into one tarball (the device returns at most a few files).
set -uo pipefail
mode=${1:-tests}
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-560}
logs=$(mktemp -d)
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
echo "setup: $((SECONDS-t0)) s" | tee -a "$log"

if [ "$mode" = tests ]; then
  files="test_gemm_async test_gemm test_gemm_precision test_dual_gemm test_epilogue test_epilogue_reads
         test_linear_fused_reads test_ops test_split_k test_gemm_transposed_b test_ops_batched
         test_launch_errors test_cuda_launch test_pointer_matmul test_autodiff test_decoder_block
         test_gemm_stages_and_order test_schedule_integration"
  (cd /tmp && timeout $((budget - 150 - (SECONDS - t0))) python3 -m pytest -q -p no:cacheprovider \
     --timeout 90 --junitxml="$out/junit.xml" \
     $(for f in $files; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
     > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -25 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  for tool in memcheck racecheck; do
    (cd /tmp && timeout 70 compute-sanitizer --tool $tool --error-exitcode 99 python3 -m pytest -q \
       -p no:cacheprovider "$repo/tests/test_gemm_async.py" -k "float32" > "$logs/sanitizer-ffma-$tool.log" 2>&1)
    echo "== $tool exit $? ==" | tee -a "$log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$logs/sanitizer-ffma-$tool.log" | tail -2 | tee -a "$log"
  done
elif [ "$mode" = s6 ]; then
  timeout 150 ncu --clock-control none --set full -c 3 --page details --csv \
    python3 tools/probes/ffma_variants.py --profile > "$logs/ncu-ffma.csv" 2>> "$log"
  echo "ncu exit $?: $((SECONDS-t0)) s" | tee -a "$log"
  grep -E '"(Warp Cycles Per Issued Instruction|Issue Slots Busy|Stall|Registers Per Thread|Achieved Occupancy|Duration|Block Size|Executed Ipc Active|Shared Memory Configuration Size|L1/TEX Hit|Bank)' \
    "$logs/ncu-ffma.csv" | cut -c1-200 | head -60 | tee -a "$log"
  timeout 40 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -10 | tee -a "$log"
  timeout 150 python3 -m benchmarks.model_ops --dtype float16 --rounds 3 --output "$logs/h200-model-ops-float16.json" \
    2>&1 | tail -14 | tee -a "$log"
  timeout 100 python3 -m benchmarks.attention --dtype float16 --heads 32 --kv-heads 8 --head-dim 128 \
    --output "$logs/h200-attention-float16.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 80 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
elif [ "$mode" = s6b ]; then
  timeout 150 python3 tools/probes/ffma_variants.py "$logs/h200-ffma-variants-16x8-4096.json" 2>&1 | tail -9 | tee -a "$log"
  sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway --dtype float32 --sizes 4096"
  for tile in "128 256 8 8" "256 128 8 8"; do
    set -- $tile
    timeout 50 $sf --tile $1 $2 $3 --num-simdgroups $4 \
      --output "$logs/h200-gemm-float32-strict-${1}x${2}x${3}w$4.json" 2>&1 | grep -E "\]:" | sed "s/^/$1x$2x$3w$4 /" | tee -a "$log"
  done
  left=$((budget - (SECONDS - t0)))
  [ "$left" -gt 90 ] && BENCH_SECONDS=$((left - 10)) OUT=$logs timeout "$left" \
    bash tools/device_decoder_block.sh bfloat16 -- --variants auto 2>&1 | tail -12 | tee -a "$log"
elif [ "$mode" = s6c ]; then
  files="test_dual_gemm test_ops test_decoder_block test_gemm_wgmma test_linear_fused_reads test_gemm_tma"
  (cd /tmp && timeout 170 python3 -m pytest -q -p no:cacheprovider --timeout 90 --junitxml="$out/junit.xml" \
     $(for f in $files; do echo "$repo/tests/$f.py"; done) > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  echo "tests: $((SECONDS-t0)) s" | tee -a "$log"
  (cd /tmp && timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 python3 -m pytest -q \
     -p no:cacheprovider "$repo/tests/test_dual_gemm.py" -k "wgmma_dual_on_the_gpu and float16" > "$logs/sanitizer-dual-memcheck.log" 2>&1)
  echo "== memcheck exit $? ==" | tee -a "$log"
  grep -E "ERROR SUMMARY|passed|failed" "$logs/sanitizer-dual-memcheck.log" | tail -2 | tee -a "$log"
  timeout 200 python3 -m benchmarks.model_layers --dtypes float16 bfloat16 --tokens 512 2048 \
    --layers gated_mlp mlp --configs --rounds 3 --output "$logs/h200-model-layers-dual-wgmma.json" 2>&1 \
    | grep -E "^(gated|mlp|linear)|rror" | cut -c1-400 | tee -a "$log"
  left=$((budget - (SECONDS - t0)))
  [ "$left" -gt 90 ] && BENCH_SECONDS=$((left - 10)) OUT=$logs timeout "$left" \
    bash tools/device_decoder_block.sh float16 -- --variants auto 2>&1 | tail -12 | tee -a "$log"
elif [ "$mode" = s6d ]; then
  timeout 150 python3 tools/probes/block_kernels.py tune 2048 2>&1 | tail -2 | tee -a "$log"
  timeout 60 python3 tools/probes/block_kernels.py trace 2048 float16 --time 2>&1 | tail -3 | tee -a "$log"
  echo "tune+time: $((SECONDS-t0)) s" | tee -a "$log"
  timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/probes/block_kernels.py trace 2048 > "$logs/block-kernels-2048.csv" 2>> "$log"
  echo "ncu exit $?: $((SECONDS-t0)) s" | tee -a "$log"
  python3 - "$logs/block-kernels-2048.csv" <<'PY' 2>&1 | tee -a "$log"
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
rows = list(csv.DictReader(lines[start:]))
part, out = -1, {}
for r in rows:
    name = r["Kernel Name"]
    if "scan" in name.lower() or "cumsum" in name.lower():
        part += 1
        continue
    if part >= 0:
        out.setdefault(part, []).append((name[:90], float(r["Metric Value"].replace(",", "")) / 1e3))
for p, ks in out.items():
    print(f"== variant {p}: {len(ks)} kernels, {sum(t for _, t in ks):.1f} us")
    for n, t in ks:
        print(f"   {t:9.1f} us  {n}")
PY
  files="test_gemm_wgmma test_gemm_tma test_linear_fused_reads"
  left=$((budget - (SECONDS - t0) - 20))
  (cd /tmp && timeout $left python3 -m pytest -q -p no:cacheprovider --timeout 90 --junitxml="$out/junit.xml" \
     $(for f in $files; do echo "$repo/tests/$f.py"; done) "$repo/tests/test_dual_gemm.py" -k "not library_kernel" > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
elif [ "$mode" = s6e ]; then
  timeout 150 python3 tools/probes/block_kernels.py tune 2048 2>&1 | tail -1 | tee -a "$log"
  for flags in $S6E_VARIANTS; do
    echo "== ${flags//,/ }" | tee -a "$log"
    timeout 60 python3 tools/probes/block_kernels.py trace 2048 float16 --time ${flags//,/ } 2>&1 | tail -2 | tee -a "$log"
  done
  for setting in ${S6E_SETTINGS:-"" MLX_ENABLE_CACHE_THRASHING_CHECK=1 MLX_USE_CUDA_GRAPHS=0 MLX_CUDA_GRAPH_CACHE_SIZE=2000 MLX_MAX_OPS_PER_BUFFER=11}; do
    echo "== $setting" | tee -a "$log"
    env $setting timeout 60 python3 tools/probes/block_kernels.py trace 2048 float16 --time $S6E_FLAGS 2>&1 | tail -4 | tee -a "$log"
  done
elif [ "$mode" = s7 ]; then
  timeout 60 python3 tools/probes/gated_in_graph.py normed constants normed inputs normed 2>&1 | tail -2 | tee -a "$log"
  MLX_MAX_OPS_PER_BUFFER=1 timeout 60 python3 tools/probes/gated_in_graph.py normed constants inputs 2>&1 | tail -2 | sed "s/^/ops-per-buffer=1 /" | tee -a "$log"
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k regex:metile \
    python3 tools/probes/gated_in_graph.py constants normed > "$logs/ncu-gated-in-graph.csv" 2>> "$log"
  python3 - "$logs/ncu-gated-in-graph.csv" <<'PY' 2>&1 | tee -a "$log"
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
us = [float(r["Metric Value"].replace(",", "")) / 1e3 for r in csv.DictReader(lines[start:])]
print(len(us), "metile kernels, us:", " ".join(f"{u:.0f}" for u in us))
PY
  timeout 40 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -8 | tee -a "$log"
elif [ "$mode" = ops17 ]; then
  timeout 200 python3 -m benchmarks.model_ops --dtype float16 --output "$logs/h200-model-ops-float16.json" \
    2>&1 | tail -12 | tee -a "$log"
  timeout 150 python3 -m benchmarks.attention --dtype float16 --heads 32 --kv-heads 8 --head-dim 128 \
    --output "$logs/h200-attention-float16.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
elif [ "$mode" = final ]; then
  timeout 60 python3 tools/probes/ffma_variants.py "$logs/h200-ffma-variants-bk8-4096.json" 2>&1 | tail -8 | tee -a "$log"
  sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway --dtype float32 --sizes 4096"
  for tile in "128 128 8 8" "128 64 16 4"; do
    set -- $tile
    timeout 45 $sf --tile $1 $2 $3 --num-simdgroups $4 \
      --output "$logs/h200-gemm-float32-strict-${1}x${2}x${3}w$4.json" 2>&1 | grep -E "\]:" | sed "s/^/$1x$2x$3w$4 /" | tee -a "$log"
  done
  left=$((budget - (SECONDS - t0)))
  [ "$left" -gt 90 ] && BENCH_SECONDS=$((left - 10)) OUT=$logs timeout "$left" \
    bash tools/device_decoder_block.sh float16 -- --variants auto 2>&1 | tail -12 | tee -a "$log"
elif [ "$mode" = ffma ]; then
  timeout 120 python3 tools/probes/ffma_variants.py "$logs/h200-ffma-variants-4096.json" 2>&1 | tail -12 | tee -a "$log"
  echo "variants: $((SECONDS-t0)) s" | tee -a "$log"
  files="test_gemm_async test_gemm_stages_and_order test_dual_gemm test_ops test_gemm_transposed_b
         test_autodiff test_linear_fused_reads test_ops_batched test_decoder_block test_epilogue_reads"
  (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 90 --junitxml="$out/junit.xml" \
     $(for f in $files; do echo "$repo/tests/$f.py"; done) > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  echo "tests: $((SECONDS-t0)) s" | tee -a "$log"
  sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway --dtype float32"
  timeout 100 $sf --tile 128 128 16 --num-simdgroups 8 --sizes 4096 8192 --shapes 512x4096x11008 \
    --output "$logs/h200-gemm-float32-strict-whole-128x128x16w8.json" 2>&1 | grep -E "\]:" | tee -a "$log"
  timeout 60 $sf --tile 64 64 16 --num-simdgroups 4 --sizes 1024 2048 --shapes 16x4096x4096 \
    --output "$logs/h200-gemm-float32-strict-whole-64x64x16w4.json" 2>&1 | grep -E "\]:" | tee -a "$log"
  left=$((budget - (SECONDS - t0)))
  [ "$left" -gt 90 ] && BENCH_SECONDS=$((left - 15)) OUT=$logs timeout "$left" \
    bash tools/device_decoder_block.sh float16 2>&1 | tail -12 | tee -a "$log"
else
  sf="python3 -m benchmarks.compiler.schedule_fusion --rounds 3 --target-ms 20 --time-anyway"
  for tile in "128 128 16 8" "128 128 32 8" "64 64 16 4" "128 64 16 4"; do
    set -- $tile
    timeout 75 $sf --dtype float32 --tile $1 $2 $3 --num-simdgroups $4 --sizes 1024 2048 4096 \
      --output "$logs/h200-gemm-float32-strict-ffma-ring-${1}x${2}x${3}w$4.json" 2>&1 | grep -E "\]:|rror" | tee -a "$log"
  done
  echo "float32: $((SECONDS-t0)) s" | tee -a "$log"
  for dtype in float16 bfloat16; do
    for tile in "128 128 64 8" "64 128 64 4" "64 64 64 4" "128 64 64 8"; do
      set -- $tile
      timeout 40 $sf --rounds 5 --dtype $dtype --tile $1 $2 $3 --num-simdgroups $4 --sizes 1024 \
        --output "$logs/h200-gemm-$dtype-1024-${1}x${2}x${3}w$4-own-launch.json" 2>&1 | grep -E "\]:|rror" \
        | sed "s/^/$1x$2x$3w$4 /" | tee -a "$log"
    done
  done
  echo "16-bit: $((SECONDS-t0)) s" | tee -a "$log"
  left=$((budget - (SECONDS - t0)))
  [ "$left" -gt 90 ] && BENCH_SECONDS=$((left - 15)) OUT=$logs timeout "$left" \
    bash tools/device_decoder_block.sh float16 2>&1 | tail -12 | tee -a "$log"
fi
cp "$log" "$logs/"
tar -czf "$out/logs-$mode.tar.gz" -C "$logs" .
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
