#!/usr/bin/env bash
# The next device calls (rewritten 2026-12-01, sixth session; earlier modes are in git
# history).  One call after the MLX staging call (README, "Testing on the H200"), carry
# [".dev/part.ab", ".dev/wheels", ".dev/device-setup.sh"]:
#   OUT=$OUT bash tools/device_next.sh tests  -- the GPU test files of the GEMM paths, then
#       compute-sanitizer memcheck/racecheck over the strict float32 ring;
#   OUT=$OUT bash tools/device_next.sh ops17  -- issue 17's op benchmarks (norms/softmax/rope,
#       attention prefill and decode, int4 quantized matmul), float16;
#   OUT=$OUT bash tools/device_next.sh block  -- tools/probes/block_kernels.py: a converted
#       decoder block's forward against the unconverted one (T=2048) under MLX's CUDA-graph
#       settings (S6E_SETTINGS) and probe variants (S6E_VARIANTS, e.g. "--mlx-gated");
#   OUT=$OUT bash tools/device_next.sh s7     -- where the dual GEMM's in-graph time goes: ncu
#       durations of every metile kernel over 20 queued calls of each compiled form
#       (tools/probes/gated_in_graph.py), MLX_MAX_OPS_PER_BUFFER=1, then the eager launch
#       cost after the C++ relaunch guard (tools/probes/launch_cost.py), and ncu's
#       per-SASS-instruction stall samples of the strict float32 GEMM loop;
#   OUT=$OUT bash tools/device_next.sh s8     -- row kernels in runs of vectors: their GPU tests
#       and model_ops benchmarks (S8_OPS), then the dual GEMM's compiled form repeated;
#   OUT=$OUT bash tools/device_next.sh s9     -- GPU tests of the row-kernel changes, ncu of
#       the row kernels (tools/probes/row_kernels_profile.py), rope's benchmark.
#   OUT=$OUT bash tools/device_next.sh s11    -- row-kernel GPU tests, kernel-only durations of
#       metile's row kernels and MLX's ops (ncu), softmax/rms_norm benchmarks, then the
#       decoder block (float16, auto, T 512 and 2048).
#   OUT=$OUT bash tools/device_next.sh s13    -- row, rope and int4 tests, row/rope benchmarks, int4.
#   OUT=$OUT bash tools/device_next.sh s14    -- quantized and row tests, the int4 benchmark.
#   OUT=$OUT bash tools/device_next.sh s158   -- the GEMV with lanes interleaved along K, 4 rows a warp in the chain; the pair GEMV's GPU tests whole (s157 ran out of time at 34)
#   OUT=$OUT bash tools/device_next.sh s157   -- the library's W64 GEMV in the chain, twice; GPU tests of s46's changes
#   OUT=$OUT bash tools/device_next.sh s156   -- the pair GEMV's words two a 64-bit load in the chain, twice; the warps forms on the H200; Triton's int4 GEMV
#   OUT=$OUT bash tools/device_next.sh s155   -- the pair GEMV's K split over warps in the chain, read_floor's MLX side again
#   OUT=$OUT bash tools/device_next.sh s154   -- views, the loads probe (own arguments), read_floor.py, the loads probe's ncu kernel times, int4 prefill bf16/2048
#   OUT=$OUT bash tools/device_next.sh views  -- test_offset_views alone
#   OUT=$OUT bash tools/device_next.sh s153   -- after s152: the untransposed stall probe, int4 prefill bf16/2048 with BULK_X, test_untransposed
#   OUT=$OUT bash tools/device_next.sh s152   -- the int4 GEMV's reads without its arithmetic, x as 16-bit values, offset views and quantized GPU tests
#   OUT=$OUT bash tools/device_next.sh s151   -- (ready, not run) the untransposed stall settled, test_quantized_op and test_offset_views, int4 prefill bf16/2048 with BULK_X
#   OUT=$OUT bash tools/device_next.sh s150   -- the untransposed hang probe, mixed-bulk GPU tests, the s145 test files
#   OUT=$OUT bash tools/device_next.sh s149   -- x by bulk tensor copies beside the dequantizing threads (METILE_MIXED_BULK=1): GPU tests, A/B
#   OUT=$OUT bash tools/device_next.sh s148   -- ncu of the pair GEMM with its words read ahead, then the s145 GPU tests
#   OUT=$OUT bash tools/device_next.sh s147   -- the fused int4 GEMM's words read a K step ahead: its GPU tests, A/B against inline (tools/probes/staging_ahead.py)
#   OUT=$OUT bash tools/device_next.sh s146   -- (ready, not run) ncu of the pair-dequantizing GEMM's two tiles at 512 rows, the int4 prefill benchmark (auto's pair candidates included)
#   OUT=$OUT bash tools/device_next.sh s145   -- (ready, not run) GPU tests: quantized op (pair GEMM), bad inputs, routing, the trials' fixes
#   OUT=$OUT bash tools/device_next.sh s144   -- which shapes the pair-dequantizing GEMM finishes at, one process each
#   OUT=$OUT bash tools/device_next.sh s143   -- the pair-dequantizing fused GEMM on a 256x128 tile beside 128x256, 512 and 2048 rows
#   OUT=$OUT bash tools/device_next.sh s142   -- int4 prefill on the fused GEMM dequantizing in packed pairs, its GPU tests, then test_bad_inputs/test_routing/test_quantized_op
#   OUT=$OUT bash tools/device_next.sh s141   --  model layers with auto and the lead-in, the GPU tests s140 did not reach
#   OUT=$OUT bash tools/device_next.sh s140   -- the place penalty probe (tools/probes/order_penalty.py), GPU tests of the session's hostile-trial fixes
#   OUT=$OUT bash tools/device_next.sh s139   -- int4 prefill with the dequantize split along K (tools/probes/int4_prefill_split.py), n_regs GPU tests
#   OUT=$OUT bash tools/device_next.sh s138   -- model layers with benchmarks.common.rotate alternating two variants (it had kept one order), then gated_forms again
#   OUT=$OUT bash tools/device_next.sh s137   -- gated_mlp through benchmarks.model_layers (0.71x on the H100 in s128) against gated_forms.py with NumPy and mx.random weights
#   OUT=$OUT bash tools/device_next.sh s136   -- gated_mlp from the dual-GEMM kernel up to the op (tools/probes/gated_forms.py), decode at COMBINE_WARPS, attention GPU tests
#   OUT=$OUT bash tools/device_next.sh s135   -- decode attention's split kernel alone (no combine) against it with its combine and MLX's op: the bound of one kernel fewer
#   OUT=$OUT bash tools/device_next.sh s134   -- decode attention's combine on 1/2/4 warps against the plan's 32, then GPU tests of the session's last fixes
#   OUT=$OUT bash tools/device_next.sh s133   -- run-constant values once a run: decode attention and row ops A/B (METILE_RUN_CONSTANTS), GPU tests
#   OUT=$OUT bash tools/device_next.sh s132   -- attention_decode with per-row statistics (tools/probes/decode_variant_kernels.py) against the library kernel
#   OUT=$OUT bash tools/device_next.sh s131   -- L2 bulk prefetch ahead of decode attention's and the int4 GEMV's loads (tools/probes/decode_prefetch.py)
#   OUT=$OUT bash tools/device_next.sh s130   -- s38's fixes: attention's jvp/vmap on CUDA at ragged lengths, the touched test files
#   OUT=$OUT bash tools/device_next.sh s128   -- after s127: decoder block / model layers with one node an op, eager cost, GPU tests
#   OUT=$OUT bash tools/device_next.sh s127s  -- s127 for a short budget: node tests, its A/B, int4 decode, atomics/jvp tests
#   OUT=$OUT bash tools/device_next.sh s127   -- ops as one MetileOp node vs custom_function, timeline, int4 decode, cache in place, GPU tests
#   OUT=$OUT bash tools/device_next.sh s126   -- decode's fixed cost: short caches, one node's cost, ncu kernel times
#   OUT=$OUT bash tools/device_next.sh s125   -- decode configurations with no cache reused (8 caches a call) and one, then tests
#   OUT=$OUT bash tools/device_next.sh s124   -- decode attention 8 a compiled call (--chain 8) and 1, then s123's tests
#   OUT=$OUT bash tools/device_next.sh s123   -- the GPU test files s116/s120 ran out of time before
#   OUT=$OUT bash tools/device_next.sh s122   -- decode splits by length (32 / 64 at 32 heads) at 4096-32768 keys, decode GPU tests
#   OUT=$OUT bash tools/device_next.sh s121   -- decode attention's splits against MLX and a read of k and v, the decode benchmark
#   OUT=$OUT bash tools/device_next.sh s120   -- where the decode benchmark's time goes (op vs kernels, arguments vs captured), then s119
#   OUT=$OUT bash tools/device_next.sh s119   -- eager launch cost, then the GPU tests s116 left unrun and the load bounds
#   OUT=$OUT bash tools/device_next.sh s118   -- rope gradients vs the transpose, decode with 8 splits, tests
#   OUT=$OUT bash tools/device_next.sh s117   -- s116's first test files by name, decode warps/splits
#   OUT=$OUT bash tools/device_next.sh s116   -- rope array-offset probe, eager cost with new shapes, decode attention, GPU tests
#   OUT=$OUT bash tools/device_next.sh s115   -- model layers, eager cost, decode attention, GPU tests (one call)
#   OUT=$OUT bash tools/device_next.sh s114   -- eager cost with attention's replays, GPU tests of s31-s32's files
#   OUT=$OUT bash tools/device_next.sh s113   -- empty-barrier refills as the default: GPU tests, model layers A/B
#   OUT=$OUT bash tools/device_next.sh s32    -- shared launch configurations: GPU tests, launch parts and cost
#   OUT=$OUT bash tools/device_next.sh s31    -- decoder block A/A at more launches and rounds, T 512/2048
#   OUT=$OUT bash tools/device_next.sh s30    -- post-s29 GPU tests, eager cost, GEMV sweep, decoder block A/A
#   OUT=$OUT bash tools/device_next.sh s29    -- eager entry GPU tests and cost, fused int4 warp-specialized, decoder block
#   OUT=$OUT bash tools/device_next.sh s28    -- replays/launch memory GPU tests, eager cost, int4 GEMV one output a warp (ncu)
#   OUT=$OUT bash tools/device_next.sh s27    -- 128x192 warpgroup tiles: GPU tests, tiles timed, int4 prefill
#   OUT=$OUT bash tools/device_next.sh s26    -- fused int4 prefill with group-invariant loads: benchmark, one ragged test
#   OUT=$OUT bash tools/device_next.sh s25    -- GPU tests: replays, fragments, attention, fused int4 (ragged)
#   OUT=$OUT bash tools/device_next.sh s24    -- fused int4 prefill (tests, benchmark), replays' launch cost, prefill tiles
#   OUT=$OUT bash tools/device_next.sh s23    -- fragment/replay GPU tests, eager launch cost with replays, decode
#   OUT=$OUT bash tools/device_next.sh s22    -- general products on tensor cores: tests, attention prefill with/without
#   OUT=$OUT bash tools/device_next.sh s21    -- narrow rows, decode defaults: tests, JSON, ncu of the dequantize
#   OUT=$OUT bash tools/device_next.sh s20    -- decode attention without per-call fills: ncu, sweep, benchmark JSON
#   OUT=$OUT bash tools/device_next.sh s19    -- ncu kernel durations of the decode attention/GEMV candidates
#   OUT=$OUT bash tools/device_next.sh s18    -- decode attention splits/warps/combine, int4 GEMV ahead
#   OUT=$OUT bash tools/device_next.sh s17    -- attention_decode sweep vs MLX, row ops, attention tests
#   OUT=$OUT bash tools/device_next.sh s16    -- dequantize/GEMV after the placement and shift fixes
#   OUT=$OUT bash tools/device_next.sh s15    -- quantized tile sweep (incl. matvec_rows), eager
#       launch cost, then the row/quantized GPU tests for the rest of the budget.
# Logs go into one tarball (the device returns at most a few files).
set -uo pipefail
mode=${1:-tests}
repo=$(pwd); out=${OUT:-/tmp}; log=$out/log.txt; t0=$SECONDS; budget=${BUDGET:-560}
logs=$(mktemp -d)
export MLX_ENABLE_TF32=0 PYTHONUNBUFFERED=1
bash .dev/device-setup.sh > "$log" 2>&1 || { tail -5 "$log"; exit 3; }
python3 -m pip install -q --no-index --no-build-isolation --no-deps . >> "$log" 2>&1 || { tail -30 "$log"; exit 4; }
echo "setup: $((SECONDS-t0)) s" | tee -a "$log"

# gpu_tests SECONDS FILE...: the test files (names under tests/) on the GPU, the summary in
# the log and the record in $out/device-run.json
# (gpu_tests SECONDS -k EXPR FILE...: only the tests EXPR selects)
gpu_tests() {
  local limit=$1; shift
  local select=()
  if [ "${1:-}" = -k ]; then select=(-k "$2"); shift 2; fi
  (cd /tmp && timeout "$limit" python3 -m pytest -v -p no:cacheprovider --timeout 90 \
     --junitxml="$out/junit.xml" "${select[@]}" \
     $(for f in "$@"; do [ -f "$repo/tests/$f.py" ] && echo "$repo/tests/$f.py"; done) \
     > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
}

# ncu_times SECONDS NAME SCRIPT [ARGS...]: ncu's kernel durations (and $NCU_METRICS' others)
# of a python3 script in $logs/NAME.csv, the median a kernel in the log
ncu_times() {
  local limit=$1 name=$2; shift 2
  timeout "$limit" ncu --clock-control none --metrics "${NCU_METRICS:-gpu__time_duration.sum}" \
    --csv python3 "$@" > "$logs/$name.csv" 2>> "$log"
  python3 tools/probes/decode_kernels_ncu.py --summarize "$logs/$name.csv" 2>&1 | tee -a "$log"
}

# prefill_measure: causal attention prefill (1x32xLx128 float16): the tiles at 4096
# (tools/probes/attention_prefill_tiles.py), the op's benchmark against MLX at 1024, 4096 and
# 8192, then ncu's counters and stall samples of one 128x64 launch on 8 warps
prefill_measure() {
  timeout 150 python3 tools/probes/attention_prefill_tiles.py "$logs/h200-attention-prefill-tiles.json" 2>&1 | tail -12 | tee -a "$log"
  timeout 200 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -8 | tee -a "$log"
  local m=gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
  for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle selected; do
    m=$m,smsp__pcsamp_warps_issue_stalled_$r
  done
  timeout 100 ncu --kernel-name regex:attention_forward --launch-count 1 --metrics "$m" \
    python3 tools/probes/attention_prefill_once.py 128 64 8 2>&1 | grep -E "^ +[a-z_]+__" | tee -a "$log"
}

# eager_cost: the eager launch parts and cost probes, their JSON in $logs
eager_cost() {
  timeout 60 python3 tools/probes/launch_parts.py "$logs/h200-launch-parts.json" 2>&1 | tee -a "$log"
  timeout 100 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -24 | tee -a "$log"
}

# left: the seconds of BUDGET left, less 15 for packing the logs
left() { echo $((budget - 15 - (SECONDS - t0))); }

# hang_probe SECONDS REPEATS: tools/probes/untransposed_hang.py in the background, killed
# after SECONDS; where a launch stalls (faulthandler's "Timeout (" in its output), first the
# GPU's utilization (a kernel spinning, or none running) and gdb's native stacks where gdb
# is installed; then the stall lines and the last launch started in the log
hang_probe() {
  local limit=$1 repeats=$2 i pid
  python3 tools/probes/untransposed_hang.py --repeats "$repeats" --stall 60 > "$logs/untransposed-hang.txt" 2>&1 &
  pid=$!
  for i in $(seq 1 "$limit"); do
    sleep 1; kill -0 $pid 2>/dev/null || break
    if grep -q "^Timeout (" "$logs/untransposed-hang.txt"; then
      nvidia-smi --query-gpu=utilization.gpu,power.draw --format=csv | tee -a "$log"
      command -v gdb > /dev/null && timeout 25 gdb -p $pid -batch -ex "thread apply all bt 20" \
        > "$logs/untransposed-gdb.txt" 2>&1 && grep -E "^#|^Thread" "$logs/untransposed-gdb.txt" | head -40 | tee -a "$log"
      break
    fi
  done
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  echo "hang probe done after ${i}s" | tee -a "$log"
  grep -vE "^start" "$logs/untransposed-hang.txt" | tail -25 | tee -a "$log"
  grep -E "^start" "$logs/untransposed-hang.txt" | tail -2 | tee -a "$log"
}

if [ "$mode" = s158 ]; then
  # s47, after s157 (whose pair tests hit their 120 s limit at 34 passed): the GEMV with its
  # lanes interleaved along K (tools/probes/gemv_interleaved.py) twice, 4 rows a warp in the
  # chain, then the pair GEMV's GPU tests for what is left
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  ROUNDS=9 timeout 150 python3 tools/probes/gemv_interleaved.py --time "$logs/h200-gemv-interleaved.json" 2>&1 | tail -2 | tee -a "$log"
  FORMS=pairs,w64,rows4,rows4_w64 ROUNDS=9 timeout 130 python3 tools/probes/gemv_warps_chain.py "$logs/h200-gemv-rows4-chain.json" 2>&1 | tail -2 | tee -a "$log"
  [ "$(left)" -gt 200 ] && ROUNDS=9 timeout 150 python3 tools/probes/gemv_interleaved.py --time "$logs/h200-gemv-interleaved-2.json" 2>&1 | tail -2 | tee -a "$log"
  [ "$(left)" -gt 30 ] && \
  gpu_tests $(left) -k "words_two or pair" test_quantized_op
elif [ "$mode" = s157 ]; then
  # s46, after s156: the library's W64 GEMV (the words two a 64-bit load) against the default
  # and MLX in the chain, twice; the GPU tests of the session's changes
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  FORMS=pairs,w64,unrolled,rows16_2w,rows32_4w ROUNDS=9 timeout 150 python3 tools/probes/gemv_warps_chain.py "$logs/h200-gemv-w64-library-1.json" 2>&1 | tail -2 | tee -a "$log"
  FORMS=pairs,w64 ROUNDS=9 timeout 100 python3 tools/probes/gemv_warps_chain.py "$logs/h200-gemv-w64-library-2.json" 2>&1 | tail -2 | tee -a "$log"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_quantized_op.py -k "pair" 2>&1 | tail -6 | tee "$logs/tests-s157-pairs.txt" | tee -a "$log"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_dependencies.py tests/test_autotune.py tests/test_schedule_integration.py tests/test_launch_errors.py 2>&1 | tail -6 | tee "$logs/tests-s157-runtime.txt" | tee -a "$log"
  # Triton's own int4 GEMV has been timed on an H100 only
  timeout 150 python3 tools/probes/triton_int4_gemv.py "$logs/h200-triton-int4-gemv.json" 2>&1 | tail -3 | tee -a "$log"
elif [ "$mode" = s156 ]; then
  # s46: rows spread over 2-4 warps, the K split and the unrolled forms in the chain (never
  # timed on the H200), Triton's own int4 GEMV (the peer's reach), then the words two a
  # 64-bit load (s45's form) in the chain
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 240 python3 tools/probes/gemv_warps_chain.py "$logs/h200-gemv-warps-chain.json" 2>&1 | tail -3 | tee -a "$log"
  timeout 200 python3 tools/probes/triton_int4_gemv.py "$logs/h200-triton-int4-gemv.json" 2>&1 | tail -3 | tee -a "$log"
  FORMS=pairs,w64 timeout 150 python3 tools/probes/gemv_warps_chain.py "$logs/h200-gemv-w64-chain.json" 2>&1 | tail -3 | tee -a "$log"
elif [ "$mode" = s155 ]; then
  # s45, after s154: the pair GEMV's K split over 2-4 warps (LANES 64/128) timed in the chain,
  # then read_floor's MLX side with metile's kernels asked for
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 200 python3 tools/probes/gemv_warps_chain.py "$logs/h200-gemv-warps-chain.json" 2>&1 | tail -3 | tee -a "$log"
  timeout 120 python3 tools/probes/read_floor.py mlx "$logs/h200-read-floor-mlx.json" 2>&1 | tail -3 | tee -a "$log"
elif [ "$mode" = s154 ]; then
  # s45: the offset-view numbers on the GPU; the loads probe with each product its own
  # arguments, then ncu's kernel times of the same sides (2 a compiled call, one round);
  # int4 prefill bfloat16 / 2048 rows with BULK_X among auto's candidates
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests 100 test_offset_views
  cp "$out/junit.xml" "$out/junit-views.xml" 2>/dev/null; cp "$logs/pytest.txt" "$logs/pytest-views.txt"
  CHAIN=8 timeout 150 python3 tools/probes/gemv_loads_only.py "$logs/h200-gemv-loads-only.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 100 python3 tools/probes/read_floor.py mlx "$logs/h200-read-floor-mlx.json" 2>&1 | tail -3 | tee -a "$log"
  timeout 120 python3 tools/probes/read_floor.py torch "$logs/h200-read-floor-torch.json" 2>&1 | tail -3 | tee -a "$log"
  CHAIN=2 ROUNDS=1 ncu_times 130 gemv-loads-only-ncu tools/probes/gemv_loads_only.py "$logs/gemv-loads-only-under-ncu.json"
  [ "$(left)" -gt 60 ] && timeout $(( $(left) > 150 ? 150 : $(left) )) python3 -m benchmarks.quantized --dtype bfloat16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --rounds 5 --launches 50 --prefill 512 4096 11008 --prefill 2048 4096 11008 \
    --output "$logs/h200-quantized-int4-bfloat16-prefill-bulk-x.json" 2>&1 | grep -E "prefill" | tail -4 | tee -a "$log"
elif [ "$mode" = views ]; then
  # test_offset_views alone (s44: the pair GEMV's numbers on an offset x, on the GPU)
  gpu_tests $(left) test_offset_views
elif [ "$mode" = s153 ]; then
  # s44, after s152: the untransposed stall settled (every metile case before MLX's, 60 s a
  # launch), int4 prefill bfloat16 and 2048 rows with the 256x128 tile's BULK_X among auto's
  # candidates, then test_untransposed itself
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  hang_probe 150 5
  timeout 150 python3 -m benchmarks.quantized --dtype bfloat16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --rounds 5 --launches 50 --prefill 512 4096 11008 --prefill 2048 4096 11008 \
    --output "$logs/h200-quantized-int4-bfloat16-prefill-bulk-x.json" 2>&1 | grep -E "prefill" | tail -4 | tee -a "$log"
  gpu_tests $(left) -k "untransposed" test_quantized_op
elif [ "$mode" = s152 ]; then
  # s44: the pair GEMV with its K steps unrolled (MATVEC_PAIRS_UNROLLED); what its reads
  # cost without its arithmetic (its grid and loads, XORs for products; the weights alone as 4-byte and as 16-byte loads; a flat read of the same
  # bytes), the pair GEMV reading x as 16-bit values beside its uint64 form, then the GPU
  # tests waiting since s43: test_offset_views (csrc's refusal of a misaligned input: its
  # first GPU build) and test_quantized_op without test_untransposed (its stall: s153)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  CHAIN=8 timeout 150 python3 tools/probes/gemv_loads_only.py "$logs/h200-gemv-loads-only.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --prefill-off --chain 8 --rounds 5 --also-decode MATVEC_PAIRS_HALVES MATVEC_PAIRS_UNROLLED \
    --output "$logs/h200-quantized-int4-float16-decode-halves.json" 2>&1 | grep -E "decode" | tail -3 | tee -a "$log"
  gpu_tests 100 test_offset_views
  cp "$out/junit.xml" "$out/junit-views.xml" 2>/dev/null; cp "$logs/pytest.txt" "$logs/pytest-views.txt"
  gpu_tests $(left) -k "not untransposed" test_quantized_op
elif [ "$mode" = s151 ]; then
  # s43, for the next session: the untransposed stall settled (every metile case before
  # MLX's, 60 s a launch), test_quantized_op whole (its float32 transpose=False cases no
  # longer ask MLX's op on CUDA) and test_offset_views (every model op on views 2 bytes past
  # a 16-byte boundary: last, as a fault loses the context), then int4 prefill bfloat16 and
  # 2048 rows with the 256x128 tile's BULK_X among auto's candidates; first, the pair GEMV
  # reading x as 16-bit values timed beside its uint64 form
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  hang_probe 150 5
  # the pair GEMV reading x as 16-bit values (MATVEC_PAIRS_HALVES: any offset) beside the
  # uint64 view's form (MATVEC_PAIRS[0]) at decode, 8 products a compiled call
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --prefill-off --chain 8 --rounds 5 --also-decode MATVEC_PAIRS_HALVES \
    --output "$logs/h200-quantized-int4-float16-decode-halves.json" 2>&1 | grep -E "decode" | tail -3 | tee -a "$log"
  gpu_tests $(( $(left) - 120 )) test_quantized_op test_offset_views
  t=$(left); [ "$t" -gt 150 ] && t=150
  timeout $t python3 -m benchmarks.quantized --dtype bfloat16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --rounds 5 --launches 50 --prefill 512 4096 11008 --prefill 2048 4096 11008 \
    --output "$logs/h200-quantized-int4-bfloat16-prefill-bulk-x.json" 2>&1 | grep -E "prefill" | tail -4 | tee -a "$log"
elif [ "$mode" = s150 ]; then
  # s43: the pair GEMM's GPU tests, WGMMA_PAIRS_TALL now with x by bulk copies (its
  # BULK_X; s149's were poisoned by MLX's own fault on a misaligned x: the test now gives
  # MLX an aligned copy); which side of test_untransposed stops a GPU run (it hung in s125
  # and in s145's call); the int4 prefill benchmark (auto's candidates); then the test
  # files s145 never reached - each step inside what is left of BUDGET
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests $(left) -k "pair_dequantized or misaligned or bulk_x" test_quantized_op
  cp "$out/junit.xml" "$out/junit-pairs.xml" 2>/dev/null; cp "$logs/pytest.txt" "$logs/pytest-pairs.txt"
  t=$(left); [ "$t" -gt 180 ] && t=180
  hang_probe $t 10
  t=$(left); [ "$t" -gt 150 ] && t=150
  timeout $t python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --rounds 5 --launches 50 --prefill 512 4096 11008 --prefill 128 4096 11008 \
    --output "$logs/h200-quantized-int4-float16-prefill-bulk-x.json" 2>&1 | grep -E "prefill|auto" | tail -8 | tee -a "$log"
  [ "$(left)" -gt 30 ] && gpu_tests $(left) -k "not untransposed" test_bad_inputs test_routing \
    test_kernel_dependencies test_ops
elif [ "$mode" = s149 ]; then
  # s42, for the next session: the fused int4 GEMM with x by bulk tensor copies (TMA) while
  # the threads store the dequantized weight (METILE_MIXED_BULK=1, off by default): its GPU
  # tests under the switch first (each pair case compiles a ~17000-line kernel: 300 s), then
  # the A/B at 512 and 128 rows float16, 512 bfloat16
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  METILE_MIXED_BULK=1 gpu_tests 300 -k "warpgroup" test_quantized_op
  timeout 200 python3 tools/probes/staging_ahead.py "$logs/h200-mixed-bulk-float16.json" --switch METILE_MIXED_BULK --rows 512 128 2>&1 | tail -3 | cut -c1-1500 | tee -a "$log"
  timeout $((budget - 20 - (SECONDS - t0))) python3 tools/probes/staging_ahead.py "$logs/h200-mixed-bulk-bfloat16.json" --switch METILE_MIXED_BULK --rows 512 --dtype bfloat16 2>&1 | tail -2 | cut -c1-1500 | tee -a "$log"
elif [ "$mode" = s147 ]; then
  # s42: the fused int4 GEMM's packed words, scales and biases loaded a K step ahead into
  # registers (METILE_STAGING_AHEAD, default on): the warpgroup fused-GEMM tests, then the
  # A/B at 512 and 128 rows (float16), 512 bfloat16, 2048 float16
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests 200 -k "warpgroup or pair_dequantized" test_quantized_op
  timeout 200 python3 tools/probes/staging_ahead.py "$logs/h200-staging-ahead-float16.json" --rows 512 128 2>&1 | tail -3 | cut -c1-1500 | tee -a "$log"
  timeout 100 python3 tools/probes/staging_ahead.py "$logs/h200-staging-ahead-bfloat16.json" --rows 512 --dtype bfloat16 2>&1 | tail -2 | cut -c1-1500 | tee -a "$log"
  timeout $((budget - 20 - (SECONDS - t0))) python3 tools/probes/staging_ahead.py "$logs/h200-staging-ahead-float16-2048.json" --rows 2048 --tiles WGMMA_PAIRS_TALL 2>&1 | tail -2 | cut -c1-1500 | tee -a "$log"
elif [ "$mode" = s148 ]; then
  # s42: where the pair GEMM's K step waits with its words read ahead (ncu), then the GPU
  # tests s145 would run
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  for tile in WGMMA_PAIRS_TALL; do
    for ahead in 1; do
      METILE_STAGING_AHEAD=$ahead timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section LaunchStats --section SourceCounters -k regex:quantized_matmul --launch-count 1 \
        python3 tools/probes/pair_gemm_shapes.py 512 11008 4096 $tile > "$logs/ncu-pair-gemm-$tile-ahead$ahead.txt" 2>&1
      grep -E "Duration|Throughput|Registers|Warp Cycles|Issued|Eligible|Stall|stall|Bandwidth|Shared" \
        "$logs/ncu-pair-gemm-$tile-ahead$ahead.txt" | head -60 | tee -a "$log"
    done
  done
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_quantized_op test_bad_inputs test_routing \
    test_kernel_dependencies test_ops
elif [ "$mode" = s146 ]; then
  # s41, for the next session: where the pair-dequantizing GEMM's K step waits (512 rows:
  # 1.6x the dense product although it issues fewer instructions than the tensor cores take
  # cycles) - ncu sections of one launch of each tile, then the int4 prefill benchmark again
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  for tile in WGMMA_PAIRS_TALL WGMMA_PAIRS; do
    timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section LaunchStats -k regex:quantized_matmul --launch-count 1 \
      python3 tools/probes/pair_gemm_shapes.py 512 11008 4096 $tile > "$logs/ncu-pair-gemm-$tile.txt" 2>&1
    grep -E "Duration|Throughput|Occupancy|Registers|Warp Cycles|Active Warps|Issued|Eligible|L2|DRAM|stalled|Stall" \
      "$logs/ncu-pair-gemm-$tile.txt" | head -40 | tee -a "$log"
  done
  timeout 150 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --rounds 5 --launches 60 --prefill 512 4096 11008 --prefill 128 4096 11008 \
    --output "$logs/h200-quantized-int4-float16-prefill-pairs-shifts.json" 2>&1 | grep prefill | tee -a "$log"
elif [ "$mode" = s145 ]; then
  # s41, for the next session: the GPU tests s140-s143 ran out of time for, the pair GEMM's
  # tests first (each case compiles a ~17000-line kernel), and the trials' fixes
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_quantized_op test_bad_inputs test_routing \
    test_kernel_dependencies test_ops
elif [ "$mode" = s144 ]; then
  # s41: the shapes the pair-dequantizing GEMM finishes at (the GPU test at 200x512x4096 hung)
  for shape in "256 512 4096" "200 512 4096" "200 11008 4096" "512 512 4096" "7 256 1152"; do
    timeout 40 python3 tools/probes/pair_gemm_shapes.py $shape 2>&1 | tail -1 | tee -a "$log"
    echo "rc=$? for $shape" | tee -a "$log"
  done
elif [ "$mode" = s143 ]; then
  # s41: the pair-dequantizing fused GEMM on a 256x128 tile (half the staging a product)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests 100 -k "pair_dequantized" test_quantized_op
  for dt in float16 bfloat16; do
    timeout 150 python3 -m benchmarks.quantized --dtype $dt --bits 4 --group-size 64 --weights 4 \
      --decode-off --rounds 5 --launches 60 --prefill 512 4096 11008 --prefill 2048 4096 11008 \
      --also WGMMA_PAIRS WGMMA_PAIRS_TALL \
      --output "$logs/h200-quantized-int4-$dt-prefill-pairs-tall.json" 2>&1 | grep prefill | tee -a "$log"
  done
elif [ "$mode" = s142 ]; then
  # s41: int4 prefill on the fused warpgroup GEMM with its weight tile dequantized in packed
  # pairs (quantized_ops.WGMMA_PAIRS) beside the float form and dequantize + GEMM
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests 150 -k "pair_dequantized or fused_warpgroup" test_quantized_op
  cp "$out/junit.xml" "$out/junit-pairs.xml" 2>/dev/null; cp "$logs/pytest.txt" "$logs/pytest-pairs.txt"
  for dt in float16 bfloat16; do
    timeout 120 python3 -m benchmarks.quantized --dtype $dt --bits 4 --group-size 64 --weights 4 \
      --decode-off --rounds 5 --also WGMMA_GEMM WGMMA_PAIRS \
      --output "$logs/h200-quantized-int4-$dt-prefill-pairs.json" 2>&1 | tail -8 | tee -a "$log"
  done
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --prefill 2048 4096 11008 --prefill 128 4096 11008 --rounds 3 --also WGMMA_PAIRS \
    --output "$logs/h200-quantized-int4-float16-prefill-pairs-sizes.json" 2>&1 | tail -12 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_bad_inputs test_routing test_quantized_op
elif [ "$mode" = s141 ]; then
  # s40, for the next session: what auto gives on the model layers now that every timed
  # sample has a lead-in (rotate, the routing), then the test files s140 ran out of time for
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 300 python3 -m benchmarks.model_layers --dtypes float16 bfloat16 --tokens 512 2048 \
    --layers gated_mlp mlp --rounds 6 --output "$logs/h200-model-layers-auto.json" 2>&1 \
    | grep -E "T=" | tail -8 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_quantized_op test_bad_inputs test_routing
elif [ "$mode" = s140 ]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 100 python3 tools/probes/order_penalty.py "$logs/h200-order-penalty.json" 2>&1 | tail -4 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_launch_errors test_autotune test_triton_parity test_shape_and_scan_ops test_dsl_errors test_model_ops_norms test_quantized_op test_bad_inputs
elif [ "$mode" = s139 ]; then
  # s40: int4 prefill with the dequantize split along K, each part's product accumulated
  # (addmm): can the graph run part i+1's dequantize under part i's product?
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 200 python3 tools/probes/int4_prefill_split.py "$logs/h200-int4-prefill-split-float16.json" \
    --rows 512 2048 2>&1 | tail -3 | tee -a "$log"
  timeout 120 python3 tools/probes/int4_prefill_split.py "$logs/h200-int4-prefill-split-bfloat16.json" \
    --rows 512 --dtype bfloat16 2>&1 | tail -2 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_triton_launch_and_calls
elif [ "$mode" = s138 ]; then
  # s40: rotate() had run two variants in one order every round (metile's always second)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 330 python3 -m benchmarks.model_layers --dtypes float16 bfloat16 --tokens 512 2048 \
    --layers gated_mlp mlp linear_gelu --rounds 6 --output "$logs/h200-model-layers.json" 2>&1 \
    | grep -E "T=" | tail -12 | tee -a "$log"
  timeout 100 python3 tools/probes/gated_forms.py "$logs/h200-gated-forms-mlx.json" --tokens 512 \
    --dtypes float16 --weights mlx 2>&1 | tail -2 | tee -a "$log"
elif [ "$mode" = s137 ]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  for i in 1 2; do
    timeout 100 python3 -m benchmarks.model_layers --dtypes float16 --tokens 512 --layers gated_mlp \
      --rounds 5 --output "$logs/h200-model-layers-gated-$i.json" 2>&1 | grep -E "T=" | tail -3 | tee -a "$log"
    for w in numpy mlx; do
      timeout 100 python3 tools/probes/gated_forms.py "$logs/h200-gated-forms-$w-$i.json" --tokens 512 \
        --dtypes float16 --weights $w 2>&1 | tail -2 | tee -a "$log"
    done
  done
elif [ "$mode" = s136 ]; then
  # s40: why ops.gated_mlp(backend="metile") measured slower than its kernel launched
  # directly (float16 only), each form in one process; then decode at the new default
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 300 python3 tools/probes/gated_forms.py "$logs/h200-gated-forms.json" --tokens 512 2048 \
    2>&1 | tail -6 | tee -a "$log"
  timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths --decode-lengths 1024 4096 16384 --chain 8 --launches 20 --rounds 5 \
    --output "$logs/h200-attention-decode-chain8.json" 2>&1 | tail -4 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_attention_op
elif [ "$mode" = s135 ]; then
  # s40: the split kernel alone, the most one kernel fewer (the last split merging) can give
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  CHAIN=8 KEYS="1024 4096 16384" timeout 200 python3 tools/probes/decode_split_only.py \
    "$logs/h200-decode-split-only.json" 2>&1 | tail -6 | tee -a "$log"
elif [ "$mode" = s134 ]; then
  # s39: the combine on 1, 2, 4 warps against the plan's 32 (one thread an element of its
  # (32, 32) block, six barriers), 8 attentions a call, no cache read twice
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  CONFIGS="w2 w2_c1 w2_c2 w2_c4" CHAIN=8 KEYS="1024 4096 16384" timeout 170 python3 \
    tools/probes/decode_chain_configs.py "$logs/h200-decode-combine-warps.json" 2>&1 | tail -6 | tee -a "$log"
  # the hostile trial's fixes after s133 (peeled loops, warmup grids, atomic reads)
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_control_flow test_triton_launch_and_calls test_atomics_triton
elif [ "$mode" = s133 ]; then
  # s39: values equal along runs computed once a run (vectorize_rows.run_constant) - decode
  # attention's per-slot statistics - A/B against the old lowering (METILE_RUN_CONSTANTS=0)
  # in one run, against MLX's op each time, then the GPU tests of the session's changes
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  for i in 1 2; do
    for rc in 0 1; do
      echo "METILE_RUN_CONSTANTS=$rc ($i)" | tee -a "$log"
      METILE_RUN_CONSTANTS=$rc timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 \
        --head-dim 128 --prefill-lengths --decode-lengths 1024 4096 16384 --chain 8 --launches 20 \
        --rounds 5 --output "$logs/h200-attention-decode-chain8-rc$rc-$i.json" 2>&1 | tail -3 | tee -a "$log"
    done
  done
  for rc in 0 1; do
    METILE_RUN_CONSTANTS=$rc timeout 100 python3 -m benchmarks.model_ops --dtype float16 --rounds 5 \
      --output "$logs/h200-model-ops-rc$rc.json" 2>&1 | tail -8 | sed "s/^/rc=$rc /" | tee -a "$log"
  done
  # the split counts again, now that a loop step costs ~35% fewer instructions
  CHAIN=8 KEYS="4096 16384" timeout 150 python3 tools/probes/decode_chain_configs.py \
    "$logs/h200-decode-chain8-configs.json" 2>&1 | tail -12 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_vectorize_rows test_attention_op test_model_ops_norms test_control_flow test_atomics_triton test_triton_launch_and_calls
elif [ "$mode" = s132 ]; then
  # s39: is attention_decode bound by its instructions?  The variant with one exponential a
  # key (per-row statistics through threadgroup memory) against the library kernel
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  r1=replace=tools/probes/decode_variant_kernels.py:attention_decode_r1
  timeout 300 python3 tools/probes/decode_prefetch.py --all --variants none $r1 none $r1 \
    --output "$logs/h200-decode-variants.json" 2>&1 | tee -a "$log"
elif [ "$mode" = s131 ]; then
  # s39: do decode attention's split kernel and the int4 pair GEMV wait on HBM latency an L2
  # bulk prefetch hides?  Generated CUDA patched per variant, each in its own process,
  # measured as the benchmarks do against MLX's op in the same process
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 240 python3 tools/probes/decode_prefetch.py --all \
    --output "$logs/h200-decode-prefetch.json" 2>&1 | tee -a "$log"
  timeout 150 python3 tools/probes/decode_prefetch.py --target gemv --all --variants none whole none whole \
    > "$logs/gemv-prefetch.txt" 2>&1; grep -E "variant|decode 1x" "$logs/gemv-prefetch.txt" | sed -E 's/metile:kernel=(matvec|matvec_runs|matvec_rows|gemm),[^|]*us, //g' | tee -a "$log"
elif [ "$mode" = s130 ]; then
  # s38's changes on a GPU: attention's jvp/vmap at ragged lengths (Select in the node, no
  # per-launch guard inside an op's forward), then the files the session's fixes touched
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  METILE_DEBUG=op_nodes timeout 100 python3 tools/probes/attention_transforms.py 2>&1 | tail -12 | tee -a "$log"
  gpu_tests 200 test_ops_jvp test_ops_vmap test_op_node test_autotune test_triton_launch_and_calls
  cp "$logs/pytest.txt" "$logs/pytest-first.txt"; cp "$out/device-run.json" "$logs/device-run-first.json"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_control_flow test_dsl_errors test_attention_op test_linear_fused_reads
elif [ "$mode" = s128 ]; then
  # after s127: the model-level effect of one node an op - the decoder block converted
  # against unconverted (and the unconverted control), model layers, eager cost, then the
  # GPU tests of the files the node change touched
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  # s37: why attention's jvp on CUDA keeps mx.custom_function's nodes (H100 s127) - the
  # node fuse_op refused, named by METILE_DEBUG=op_nodes
  METILE_DEBUG=op_nodes timeout 60 python3 -c "
import mlx.core as mx, metile
q, k, v = (mx.random.normal((1, 4, 64, 64)) for _ in range(3))
f = lambda q: metile.ops.scaled_dot_product_attention(q, k, v, scale=0.125, mask='causal', backend='metile')
for _ in range(2):
    try:
        print('jvp ok', mx.jvp(f, [q], [mx.ones_like(q)])[1][0].shape)
    except Exception as e:
        print('jvp failed:', str(e)[:200])
" 2>&1 | tail -8 | tee -a "$log"
  # s38: issue 17's decode ratios after the one-node op (s127 measured them on an H100 only)
  timeout 150 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths --decode-lengths 1024 4096 16384 --chain 8 --launches 20 --rounds 5 \
    --output "$logs/h200-attention-decode-chain8-float16.json" 2>&1 | tail -5 | tee -a "$log"
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -1 | tee -a "$log"
  timeout 130 python3 -m benchmarks.model_layers --dtypes float16 --tokens 512 2048 \
    --layers gated_mlp mlp --rounds 5 --output "$logs/h200-model-layers.json" 2>&1 \
    | grep -E "T=" | tail -8 | tee -a "$log"
  eager_cost
  timeout 240 python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --rounds 7 --variants auto mlx-again \
    --output "$logs/h200-decoder-block-float16.json" 2>&1 | tee "$logs/decoder-block.log" \
    | tail -10 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_atomics_triton test_op_replay test_model_ops_norms test_eager_fast_path
elif [ "$mode" = s127s ]; then
  # s127 for a short budget (s37: ~800 s of device time left after refusals): the node's
  # CUDA tests, its A/B against mx.custom_function's nodes, the int4 decode step, then the
  # jvp and atomics tests (the new fences) for what is left
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests 140 test_op_node
  cp "$logs/pytest.txt" "$logs/pytest-first.txt"; cp "$out/device-run.json" "$logs/device-run-first.json"
  timeout 150 python3 tools/probes/decode_fixed_cost.py "$logs/h200-decode-fixed-cost.json" 2>&1 | tail -6 | tee -a "$log"
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -1 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_atomics_triton test_ops_jvp
elif [ "$mode" = s127 ]; then
  # s36: ops as one MetileOp node - first its GPU tests (the node's CUDA path has never run),
  # then the node against mx.custom_function's nodes in one run (decode_fixed_cost), the
  # GPU's timeline of both, the int4 decode step, s35's cache read in place, more tests
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  gpu_tests 170 test_op_node test_ops_jvp
  cp "$logs/pytest.txt" "$logs/pytest-first.txt"; cp "$out/device-run.json" "$logs/device-run-first.json"
  timeout 150 python3 tools/probes/decode_fixed_cost.py "$logs/h200-decode-fixed-cost.json" 2>&1 | tail -6 | tee -a "$log"
  KEYS="4096" timeout 100 python3 tools/probes/kernel_timeline.py "$logs/h200-kernel-timeline.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -1 | tee -a "$log"
  KEYS="1024 4096 16384" timeout 120 python3 tools/probes/decode_cache_ahead.py \
    "$logs/h200-decode-cache-ahead.json" 2>&1 | tail -4 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_ops_vmap test_input_layout test_attention_op
elif [ "$mode" = s126 ]; then
  # is decode attention's ~18 us an attention (s125) the GPU's or the host's? short caches,
  # a tiny one-kernel op 16 a call, then ncu's kernel durations of the same calls
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  which nsys ncu 2>&1 | tee -a "$log"
  timeout 120 python3 tools/probes/decode_fixed_cost.py "$logs/h200-decode-fixed-cost.json" 2>&1 | tail -6 | tee -a "$log"
  NCU=1 KEYS="1024 4096" ncu_times 150 decode-fixed-cost-ncu tools/probes/decode_fixed_cost.py
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_triton_parity
elif [ "$mode" = s125 ]; then
  # are s124's 8 splits on 4 warps (3.3 TB/s on an H100, reading one cache again and again)
  # as fast when no cache is read twice? 8 caches a compiled call, then one
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  CHAIN=8 KEYS="4096 16384 32768" timeout 150 python3 tools/probes/decode_chain_configs.py \
    "$logs/h200-decode-chain8-configs.json" 2>&1 | tail -4 | tee -a "$log"
  CHAIN=1 KEYS="4096 16384" timeout 100 python3 tools/probes/decode_chain_configs.py \
    "$logs/h200-decode-chain1-configs.json" 2>&1 | tail -4 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_split_k test_quantized_op test_triton_parity
elif [ "$mode" = s124 ]; then
  # issue 17's decode target with the call's host time shared by 8 attentions (a decode
  # step's layers in one graph, each over its own cache), beside one a call; then the GPU
  # test files s116/s120/s123 did not finish
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  timeout 150 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 1024 4096 16384 32768 \
    --chain 8 --output "$logs/h200-attention-decode-chain8-float16.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 90 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 1024 4096 16384 32768 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -4 | tee -a "$log"
  # warps and key blocks at the new split rule (metile's configurations against each other:
  # the probe's captured k and v slow MLX's op)
  DECODE_SET=warps timeout 120 python3 tools/probes/decode_ahead.py "$logs/h200-decode-warps.json" 2>&1 | tail -4 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_split_k test_quantized_op test_triton_parity
elif [ "$mode" = s123 ]; then
  # the GPU test files s116 and s120 ran out of time before
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_split_k test_quantized_op test_triton_parity
elif [ "$mode" = s122 ]; then
  # the split rule after s121 (32 splits at 32 heads, 64 from 16384 keys): splits 16/32/64
  # and MLX at 4096-32768 keys, the op's benchmark there, then the decode GPU tests
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  KEYS="4096 8192 16384 32768" DECODE_SET=splits timeout 100 python3 tools/probes/decode_op_gap.py \
    "$logs/h200-decode-splits.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 90 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 4096 8192 16384 32768 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -4 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "decode or split or rows" test_attention_op
elif [ "$mode" = s121 ]; then
  # issue 17's decode target on whatever card is lent: the kernels at 8/16/32 splits, MLX's
  # op and the bytes they must move read once by MLX's reduction, in one alternation; then
  # the op's benchmark
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit --format=csv | tee -a "$log"
  DECODE_SET=splits timeout 150 python3 tools/probes/decode_op_gap.py "$logs/h200-decode-splits.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 90 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 4096 16384 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -4 | tee -a "$log"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee -a "$log"
elif [ "$mode" = s120 ]; then
  # benchmarks.attention's decode (the op compiled with k, v as arguments) took 62.6 us at
  # 4096 keys where decode_ahead.py's compiled kernels took 21.7 (H100, s118): which of the
  # two differences costs it, then s119's eager cost and GPU tests
  timeout 150 python3 tools/probes/decode_op_gap.py "$logs/h200-decode-op-gap.json" 2>&1 | tail -4 | tee -a "$log"
  eager_cost
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_launch_errors test_row_reductions \
    test_split_k test_quantized_op test_triton_parity
elif [ "$mode" = s119 ]; then
  # the thirty-fourth session: eager launch cost (issue 14's <= 2x MLX), then the GPU tests
  # s116's list did not reach, with the launch-time load bounds first
  eager_cost
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_launch_errors test_row_reductions \
    test_split_k test_quantized_op test_triton_parity
elif [ "$mode" = s118 ]; then
  # rope's gradient (MLX's and metile's) against the rotation's transpose; decode attention
  # with 8 splits as the default (ROWS_TARGET_WARPS 512); the rope and attention GPU tests
  timeout 60 python3 tools/probes/rope_grad_mlx.py 2>&1 | tee -a "$log"
  timeout 60 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 4096 16384 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -4 | tee -a "$log"
  left=$((budget - 20 - (SECONDS - t0)))
  (cd /tmp && timeout $left python3 -m pytest -q -p no:cacheprovider --timeout 90 -rf --tb=short \
     --junitxml="$out/junit.xml" "$repo/tests/test_attention_op.py" "$repo/tests/test_op_replay.py" \
     "$repo/tests/test_model_ops_norms.py" > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed" "$logs/pytest.txt" | head -30 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
elif [ "$mode" = s117 ]; then
  # the GPU tests s116 ran out of time in (two failures among the first files, unnamed), then
  # decode attention's warp and split counts around the 4-warp form
  (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 90 -rf --tb=short \
     --junitxml="$out/junit.xml" "$repo/tests/test_launch_errors.py" "$repo/tests/test_cuda_launch.py" \
     "$repo/tests/test_cuda_scalars.py" "$repo/tests/test_op_replay.py" > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|^E  " "$logs/pytest.txt" | head -40 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  DECODE_SET=warps timeout 120 python3 tools/probes/decode_ahead.py "$logs/h200-decode-warps.json" 2>&1 | tail -4 | tee -a "$log"
elif [ "$mode" = s116 ]; then
  # the thirty-third session: which offset rope's kernel applies when it takes the offset
  # as a one-element array on CUDA (the replay form that rotated wrongly in s115), eager
  # cost with launches of new shapes (Dispatch._resized; first launches through their
  # binding), decode attention, then the GPU tests of the files sessions 32-33 changed
  timeout 60 python3 tools/probes/rope_array_replay.py 2>&1 | tee -a "$log"
  eager_cost
  timeout 45 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 4096 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -3 | tee -a "$log"
  # decode attention with two key blocks loaded ahead (AHEAD=2) against one and MLX
  timeout 90 python3 tools/probes/decode_ahead.py "$logs/h200-decode-ahead.json" 2>&1 | tail -4 | tee -a "$log"
  left=$((budget - 20 - (SECONDS - t0)))
  [ $left -gt 30 ] && gpu_tests $left test_eager_fast_path test_launch_errors test_cuda_launch \
    test_cuda_scalars test_op_replay test_attention_op test_split_k test_triton_parity \
    test_row_reductions test_model_ops_norms test_quantized_op
elif [ "$mode" = s115 ]; then
  # one call for the thirty-second session's short budget: issue 14's model layers with the
  # default (empty-barrier) refills, eager cost with attention's native replays, decode
  # attention, then the GPU tests of the files sessions 31-32 changed
  timeout 130 python3 -m benchmarks.model_layers --dtypes float16 bfloat16 --tokens 512 2048 \
    --layers gated_mlp mlp --rounds 5 --output "$logs/h200-model-layers.json" 2>&1 \
    | grep -E "T=" | tail -12 | tee -a "$log"
  eager_cost
  timeout 45 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 4096 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -3 | tee -a "$log"
  left=$((budget - 20 - (SECONDS - t0)))
  [ $left -gt 30 ] && gpu_tests $left test_op_replay test_attention_op test_quantized_op \
    test_autodiff_edges test_model_ops_norms test_ops test_convert test_atomics \
    test_dsl_kernels test_fragment_errors test_epilogue_reads
elif [ "$mode" = s114 ]; then
  # the thirty-second session: eager cost with attention's replays and backend="mlx" replays
  # (launch_cost.py), then the GPU tests of the files sessions 31-32 changed
  eager_cost
  left=$((budget - 20 - (SECONDS - t0)))
  [ $left -gt 30 ] && gpu_tests $left test_op_replay test_attention_op test_autodiff_edges \
    test_model_ops_norms test_ops test_quantized_op test_convert test_atomics test_dsl_kernels \
    test_fragment_errors test_triton_launch_and_calls test_epilogue_reads test_epilogue \
    test_autotune test_schedule_integration
elif [ "$mode" = s113 ]; then
  # the TMA loop's refills by empty mbarriers as the default (s112 measured them): issue 14's
  # model layers (gated MLP, the MLP forward) with the default and, as the control,
  # METILE_WGMMA_REFILL=barrier; decode attention; then the GPU tests of the bulk-tensor loop
  # and the dual GEMM for what is left of BUDGET
  for refill in empty barrier; do
    left=$((budget - 30 - (SECONDS - t0)))
    [ $left -gt 40 ] || break
    METILE_WGMMA_REFILL=$refill timeout $((left < 120 ? left : 120)) python3 -m benchmarks.model_layers \
      --dtypes float16 bfloat16 --tokens 512 2048 --layers gated_mlp mlp --rounds 5 \
      --output "$logs/h200-model-layers-refill-$refill.json" 2>&1 | grep -E "T=" | tail -12 | tee -a "$log"
  done
  left=$((budget - 30 - (SECONDS - t0)))
  [ $left -gt 30 ] && timeout 45 python3 -m benchmarks.attention --prefill-lengths --decode-lengths 4096 \
    --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -3 | tee -a "$log"
  left=$((budget - 20 - (SECONDS - t0)))
  [ $left -gt 30 ] && gpu_tests $left -k "gpu" test_dual_gemm test_gemm_tma
elif [ "$mode" = s111 ]; then
  # the twenty-ninth session's fixes on the GPU (conditional expressions that run one side,
  # the loop variable after a loop, ops handing numbers the kernels refuse to MLX's op, a
  # prepared launch keeping its schedule and target, autotune keyed by target) and rope
  # (s110, not run); then add_rms_norm, last measured in s10 (1.18x, target 1.5x): the
  # benchmark, ncu kernel durations of MLX's add + rms_norm against each fused
  # configuration, and the copy's rate (hbm_ceiling) that bounds both
  gpu_tests 200 -k "conditional_expression or loop_variable or refuse or numpy_array_offsets or prepared_launch_called or target_is_tuned or rope" \
    test_control_flow test_model_ops_norms test_schedule_integration test_autotune
  timeout 100 python3 -m benchmarks.model_ops --dtype float16 --rounds 3 --ops add_rms_norm \
    --output "$logs/h200-model-ops-add_rms_norm-float16.json" 2>&1 | grep -E "16384x8192|32768" | tail -4 | tee -a "$log"
  ncu_times 120 ncu-add-rms-vs-mlx tools/probes/row_kernels_vs_mlx.py add_rms_norm
  timeout 60 python3 tools/probes/hbm_ceiling.py torch "$logs/h200-hbm-ceiling-torch.json" 2>&1 | tail -3 | tee -a "$log"
elif [ "$mode" = refill ]; then
  # (branch exp/tma-empty-barriers) the bulk-tensor loop's refills by empty mbarriers: the
  # GPU tests of the TMA loop in that setting, then the probe at every MLP shape
  METILE_WGMMA_REFILL=empty gpu_tests 150 -k "gpu" test_gemm_tma test_gemm_wgmma
  timeout 200 python3 tools/probes/refill_order.py "$logs/h200-refill-order.json" --rounds 3 2>&1 | grep " us " | tee -a "$log"
elif [ "$mode" = s110 ]; then
  # rope on the GPU after its freqs gradient moved to the CPU stream (MLX's CUDA RoPE::vjp
  # refuses freqs, s108)
  gpu_tests 120 -k rope test_model_ops_norms
elif [ "$mode" = s104 ]; then
  # rope's freqs gradient and int32 positions, on the GPU
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "rope" test_model_ops_norms
elif [ "$mode" = s103 ]; then
  # relu keeping NaN in the GEMM epilogues and the dual GEMM, on the GPU
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "relu" test_ops test_epilogue test_dual_gemm \
    test_split_k test_linear_fused_reads
elif [ "$mode" = s102 ]; then
  # persistent pair GEMV programs (tools/probes/gemv_stream.py): kernel time and DRAM rate
  # beside the library's 8/4 form
  timeout 200 ncu --clock-control none -k regex:matvec_pairs \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
    python3 tools/probes/gemv_stream.py > "$logs/ncu-gemv-stream.txt" 2>&1
  grep -E "side|matvec_pairs|^ +[a-z_0-9]+__" "$logs/ncu-gemv-stream.txt" | head -120 | tee -a "$log"
elif [ "$mode" = s101 ]; then
  # the session's last code on the GPU: split-K (its epilogue on 4 columns a thread), tuples
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_split_k test_tuples
elif [ "$mode" = s100 ]; then
  # the pair GEMV's DRAM rate in every probe form (one warp a row block, K over 2-4 warps:
  # a row's 2 KB read at once by the warps of a program), to tell DRAM page locality from
  # the SM side
  m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
  m=$m,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
  m=$m,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_barrier
  timeout 200 ncu --clock-control none -k regex:matvec_pairs --launch-skip 0 --launch-count 18 \
    --metrics "$m" python3 tools/probes/decode_kernels_ncu.py --only pairs --repeat 1 \
    > "$logs/ncu-pairs-dram.txt" 2>&1
  grep -E "side|matvec_pairs|^ +[a-z_0-9]+__" "$logs/ncu-pairs-dram.txt" | head -200 | tee -a "$log"
elif [ "$mode" = s99 ]; then
  # where the pair GEMV's warps wait: every stall reason's samples, issue and L1 request
  # counters of one 8/4 launch and one 4/2 launch
  m=gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
  m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum
  m=$m,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
  m=$m,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum
  for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle \
           lg_throttle no_instruction not_selected dispatch_stall drain selected tex_throttle \
           branch_resolving imc_miss misc membar sleeping; do
    m=$m,smsp__pcsamp_warps_issue_stalled_$r
  done
  timeout 200 ncu --clock-control none -k regex:matvec_pairs --launch-skip 0 --launch-count 3 \
    --metrics "$m" python3 tools/probes/decode_kernels_ncu.py --only pairs --repeat 1 \
    > "$logs/ncu-pairs-stalls.txt" 2>&1
  grep -E "matvec_pairs|^ +[a-z_0-9]+__" "$logs/ncu-pairs-stalls.txt" | head -70 | tee -a "$log"
elif [ "$mode" = s98 ]; then
  # decode attention at 12 and 16 programs an SM (launch bounds; 8 at its 128 registers):
  # registers, duration and DRAM throughput (ncu), then chained compiled calls against MLX;
  # split-K's epilogue on 4 columns a thread (split_k_parts)
  timeout 120 ncu --clock-control none --section SpeedOfLight --section LaunchStats \
    --section Occupancy -k regex:attention_decode --launch-skip 0 --launch-count 6 \
    python3 tools/probes/decode_attention_occupancy.py --ncu > "$logs/ncu-decode-occupancy.txt" 2>&1
  grep -E "attention_decode|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|min_blocks" \
    "$logs/ncu-decode-occupancy.txt" | head -50 | tee -a "$log"
  timeout 150 python3 tools/probes/decode_attention_occupancy.py "$logs/h200-decode-attention-occupancy.json" 2>&1 | tee -a "$log"
  timeout 100 python3 tools/probes/split_k_parts.py "$logs/h200-split-k-parts.json" 2>&1 | tee -a "$log"
elif [ "$mode" = s97 ]; then
  # split-K after its epilogue's store was proven (no fills and merges): timed and ncu; then
  # decode attention's kernel times (4096 / 16384 keys, MLX's beside) and ncu sections of
  # the default attention_decode launch; the GPU tests of this session's changes
  timeout 100 python3 tools/probes/split_k_parts.py "$logs/h200-split-k-parts.json" 2>&1 | tee -a "$log"
  ncu_times 100 ncu-split-k tools/probes/split_k_parts.py --ncu
  ncu_times 100 ncu-decode-attention tools/probes/decode_attention_ncu.py --repeat 3
  timeout 100 ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
    -k regex:attention_decode --launch-skip 1 --launch-count 1 \
    python3 tools/probes/decode_attention_ncu.py --repeat 2 > "$logs/ncu-decode-attention-sections.txt" 2>&1
  grep -E "attention_decode|Duration|Throughput|Occupancy|Registers|Warp Cycles|Active Warps|L1|L2|DRAM|Waves|Grid|Block Size|stalled|Stall" \
    "$logs/ncu-decode-attention-sections.txt" | head -60 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "not gradients or split" test_split_k test_tuples
elif [ "$mode" = s96 ]; then
  # split-K at a skinny shape (512x2560x4096: 40 tiles of 128x256) against MLX, then ncu's
  # kernel durations of each side (the partial products and the summing epilogue); the
  # quantized op's pair/default tests after the launch refactor
  timeout 120 python3 tools/probes/split_k_parts.py "$logs/h200-split-k-parts.json" 2>&1 | tee -a "$log"
  ncu_times 150 ncu-split-k tools/probes/split_k_parts.py --ncu
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "pair or defaults" test_quantized_op
elif [ "$mode" = s95 ]; then
  # the GEMM's partial last wave split along K (tools/probes/wave_remainder.py), the nested
  # tuples on the GPU
  timeout 200 python3 tools/probes/wave_remainder.py "$logs/h200-wave-remainder.json" 2>&1 | tee -a "$log"
  gpu_tests 120 test_tuples
elif [ "$mode" = s94 ]; then
  # s93's prefill ran 10 launches a sync and read every side 1.5-3x slower than before
  # (dense 512x4096x11008 188.7 us against ~80): the same at the default 50 launches, the
  # decode step (8 products a call) and decode attention at 100 launches, as in s90 / s42
  for dt in float16 bfloat16; do
    timeout 90 python3 -m benchmarks.quantized --dtype $dt --bits 4 --group-size 64 --weights 4 \
      --decode-off --rounds 5 \
      --output "$logs/h200-quantized-int4-$dt-prefill.json" 2>&1 | tail -2 | tee -a "$log"
  done
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -1 | tee -a "$log"
  timeout 60 python3 tools/probes/decode_chain_ncu.py --wall 2>&1 | tee -a "$log"
  for dt in float16 bfloat16; do
    timeout 100 python3 -m benchmarks.quantized --dtype $dt --bits 4 --group-size 64 --weights 4 \
      --decode-off --prefill 128 4096 11008 --prefill 2048 4096 11008 --rounds 3 \
      --output "$logs/h200-quantized-int4-$dt-prefill-sizes.json" 2>&1 | tail -3 | tee -a "$log"
  done
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.attention --dtype float16 \
    --heads 32 --head-dim 128 --prefill-lengths 4096 --decode-lengths 4096 --launches 100 \
    --rounds 9 --output "$logs/h200-attention-float16.json" 2>&1 | tail -8 | tee -a "$log"
elif [ "$mode" = s93 ]; then
  # (twenty-seventh session) the pair GEMV's loads two words wide, one step ahead, rows over
  # warps, 8 words a lane: ncu kernel durations; then the int4 prefill (512x4096x11008 and
  # a smaller / larger row count) and attention (prefill and decode at 4096) re-measured
  # after issue 13's tiles
  ncu_times 170 ncu-gemv-pairs tools/probes/decode_kernels_ncu.py --only pairs93 --repeat 3
  grep -h "WRONG\|Error" "$logs/ncu-gemv-pairs.csv" | tee -a "$log"
  for dt in float16 bfloat16; do
    timeout 100 python3 -m benchmarks.quantized --dtype $dt --bits 4 --group-size 64 --weights 4 \
      --decode-off --prefill 512 4096 11008 --prefill 128 4096 11008 --prefill 2048 4096 11008 \
      --launches 10 --rounds 5 \
      --output "$logs/h200-quantized-int4-$dt-prefill.json" 2>&1 | tail -6 | tee -a "$log"
  done
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.attention --dtype float16 \
    --heads 32 --head-dim 128 --prefill-lengths 4096 --decode-lengths 4096 --launches 50 \
    --rounds 7 --output "$logs/h200-attention-float16.json" 2>&1 | tail -8 | tee -a "$log"
elif [ "$mode" = s92 ]; then
  # every decode candidate (the pair GEMV among them) and the defaults on the GPU
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "every_decode or defaults or any_magnitude" \
    test_quantized_op
elif [ "$mode" = s91 ]; then
  # the pair GEMV with K split over 2-4 warps a program (more warps an SM than one wave of
  # one-warp programs): ncu kernel durations
  ncu_times 150 ncu-gemv-pairs tools/probes/decode_kernels_ncu.py --only pairs --repeat 3
  grep -h "WRONG" "$logs/ncu-gemv-pairs.csv" | tee -a "$log"
elif [ "$mode" = s90 ]; then
  # (twenty-sixth session) the pair GEMV as the decode default: the decode benchmark (8
  # products a compiled call, 4 weights cycled) for float16 int4 / int8 and bfloat16 int4,
  # the compiled call's wall time (decode_chain_ncu.py), then the quantized GPU tests whole
  for spec in "float16 4" "bfloat16 4" "float16 8"; do
    set -- $spec
    timeout 110 python3 -m benchmarks.quantized --dtype $1 --bits $2 --group-size 64 --weights 4 \
      --chain 8 --prefill-off --launches 20 --rounds 7 \
      --output "$logs/h200-quantized-int$2-$1-decode-pairs.json" 2>&1 | tail -1 | tee -a "$log"
  done
  timeout 60 python3 tools/probes/decode_chain_ncu.py --wall 2>&1 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_pair_fma test_quantized_op
elif [ "$mode" = s89 ]; then
  # the pair GEMV (16-bit sums scaled by x's magnitude): its GPU tests, ncu kernel durations
  # of SPAN 2-8, the compiled 8-product call's wall time (tools/probes/decode_chain_ncu.py),
  # then the decode benchmark (8 products a call, 4 weights cycled)
  gpu_tests 150 -k "pair" test_pair_fma test_quantized_op
  ncu_times 150 ncu-gemv-pairs tools/probes/decode_kernels_ncu.py --only pairs --repeat 3
  timeout 60 python3 tools/probes/decode_chain_ncu.py --wall 2>&1 | tee -a "$log"
  timeout 150 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode-pairs.json" 2>&1 | tail -4 | tee -a "$log"
elif [ "$mode" = s88 ]; then
  # where the pair GEMV's time goes: ncu sections of one launch (ROWS 4, SPAN 2), then the
  # kernels a compiled 8-product call launches (ncu) beside its wall time a product
  timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
    -k regex:matvec_pairs --launch-skip 1 --launch-count 1 \
    python3 tools/probes/decode_kernels_ncu.py --only pairs --repeat 2 > "$logs/ncu-pairs-sections.txt" 2>&1
  grep -E "matvec_pairs|Duration|Throughput|Occupancy|Issue|Registers|Stall|Warp Cycles|Eligible|Active Warps|L1|L2|DRAM" \
    "$logs/ncu-pairs-sections.txt" | head -70 | tee -a "$log"
  timeout 60 python3 tools/probes/decode_chain_ncu.py --wall 2>&1 | tee -a "$log"
  ncu_times 100 ncu-decode-chain tools/probes/decode_chain_ncu.py
elif [ "$mode" = s87 ]; then
  # the pair GEMV with x as 64-bit words and the next step's loads ahead: ncu kernel
  # durations, then compiled calls (8 products a call) with the pair candidates
  ncu_times 200 ncu-gemv-pairs tools/probes/decode_kernels_ncu.py --only pairs --repeat 3
  timeout 150 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode-pairs.json" 2>&1 | tail -14 | tee -a "$log"
elif [ "$mode" = s86 ]; then
  # the pair GEMV with coalesced lanes (a lane a word, SPAN words) and in runs along K
  # (quantized_matvec_pair_runs): ncu kernel durations, then compiled calls (8 products a call)
  ncu_times 200 ncu-gemv-pairs tools/probes/decode_kernels_ncu.py --only pairs --repeat 3
  timeout 150 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 --also-decode MATVEC_PAIR_RUNS \
    --output "$logs/h200-quantized-int4-float16-decode-pairs.json" 2>&1 | tail -14 | tee -a "$log"
elif [ "$mode" = s85 ]; then
  # (twenty-sixth session) the int4 GEMV in packed 16-bit pair arithmetic
  # (quantized_matvec_pairs): its GPU tests, ncu kernel durations beside MLX's qmv and the
  # float GEMVs (1x4096x11008 group 64), then the decode benchmark's compiled calls (8
  # products a call, 4 weights cycled) with every candidate
  gpu_tests 150 -k "pair" test_pair_fma test_quantized_op
  ncu_times 150 ncu-gemv-pairs tools/probes/decode_kernels_ncu.py --only pairs --repeat 3
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --chain 8 --prefill-off --launches 20 --rounds 7 \
    --output "$logs/h200-quantized-int4-float16-decode-pairs.json" 2>&1 | tail -14 | tee -a "$log"
elif [ "$mode" = s83 ]; then
  # (twenty-fifth session, second round of hostile-trial fixes) MLX's own rope with a wide
  # offset array (tools/probes/rope_wide_offset.py), then the GPU tests of views masked below
  # zero (block pointers, split-K, GEMM), attention's 0-d mask, rope's second-order gradient
  timeout 60 python3 tools/probes/rope_wide_offset.py 2>&1 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "not every_decode_candidate" test_block_pointers \
    test_split_k test_model_ops_norms test_attention_op test_quantized_op test_gemm
elif [ "$mode" = s82 ]; then
  # (twenty-fifth session) GPU tests of the hostile-trial fixes (ranges at the int32 limits,
  # lowest-float attention masks, mixed-dtype promotion, layer_norm's dtype, rope's checks),
  # then what the 64-bit loop counters cost: the row ops and attention against MLX with
  # them and without (tools/probes/narrow_loops.py), alternating
  gpu_tests 170 test_control_flow test_attention_op test_ops test_model_ops_norms \
    test_vectorize_rows
  pass_=0
  for form in wide narrow wide narrow; do
    pass_=$((pass_ + 1))
    run=(python3 -m); [ $form = narrow ] && run=(python3 tools/probes/narrow_loops.py)
    for op in rms_norm layer_norm softmax; do
      [ $((SECONDS - t0)) -gt $((budget - 90)) ] && break
      timeout 60 "${run[@]}" benchmarks.model_ops --dtype float16 --rounds 2 --ops $op \
        --shapes 16384x8192 --output "$logs/h200-model-ops-$op-$form-$pass_.json" 2>&1 \
        | grep -E "16384x8192" | tail -6 | sed "s/^/$form /" | tee -a "$log"
    done
    [ $((SECONDS - t0)) -gt $((budget - 80)) ] && break
    timeout 70 "${run[@]}" benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
      --prefill-lengths 4096 --decode-lengths 4096 --launches 20 --rounds 3 \
      --output "$logs/h200-attention-$form-$pass_.json" 2>&1 | tail -4 | sed "s/^/$form /" | tee -a "$log"
  done
elif [ "$mode" = s81 ]; then
  # (twenty-fourth session) s79's GPU tests (the shapeless refusal's first CUDA compile),
  # the GEMM's time against its waves (tools/probes/gemm_waves.py), the MLP parts, then the
  # decoder block with the dual tile out of auto's candidates against its control
  gpu_tests 150 -k "not every_decode_candidate" test_gemm_wgmma test_gemm_stages_and_order \
    test_linear_fused_reads test_launch_errors
  timeout 120 python3 tools/probes/gemm_waves.py "$logs/h200-gemm-waves.json" 2>&1 | tee -a "$log"
  timeout 90 python3 tools/probes/mlp_parts.py "$logs/h200-mlp-parts-float16.json" \
    --tokens 512 2048 2>&1 | tee -a "$log"
  timeout $((budget - 30 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --rounds 7 --variants auto mlx-again \
    --output "$logs/h200-decoder-block-float16.json" 2>&1 | tee "$logs/decoder-block.log" \
    | tail -10 | tee -a "$log"
elif [ "$mode" = s80 ]; then
  # (s79 lost its machine) the warpgroup GEMM's GPU tests with as many stages as fit
  gpu_tests $((budget - 10 - (SECONDS - t0))) test_gemm_wgmma
elif [ "$mode" = s79 ]; then
  # the warpgroup GEMM with as many stages as fit (GPU tests), the MLP parts once more, then
  # the decoder block with the dual tile out of auto's candidates again, against its control
  # (the twenty-fourth session's first call: s79 lost its machine, s80 ran part of
  # test_gemm_wgmma; the CUDA primitive's shapeless refusal is compiled here first)
  gpu_tests 170 -k "not every_decode_candidate" test_gemm_wgmma test_gemm_stages_and_order \
    test_linear_fused_reads test_launch_errors
  timeout 100 python3 tools/probes/mlp_parts.py "$logs/h200-mlp-parts-float16.json" \
    --tokens 512 2048 2>&1 | tee -a "$log"
  timeout $((budget - 30 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --rounds 7 --variants auto mlx-again \
    --output "$logs/h200-decoder-block-float16.json" 2>&1 | tee "$logs/decoder-block.log" \
    | tail -10 | tee -a "$log"
elif [ "$mode" = s78 ]; then
  # the MLP layers at the ops' defaults after s77 (residual reads ahead of their stores, the
  # MUFU sigmoid), then the decoder block with the warpgroup dual tile back among
  # gated_mlp's auto candidates, against its A/A control
  timeout 200 python3 -m benchmarks.model_layers --dtypes float16 bfloat16 --tokens 512 2048 4096 \
    --output "$logs/h200-model-layers.json" 2>&1 | grep -E "x\)|Error|error" | tee -a "$log"
  timeout $((budget - 30 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --rounds 7 --variants auto mlx-again \
    --output "$logs/h200-decoder-block-float16.json" 2>&1 | tee "$logs/decoder-block.log" \
    | tail -10 | tee -a "$log"
elif [ "$mode" = s77 ]; then
  # the residual epilogue reading 16 pairs before storing them and sigmoid on MUFU.EX2/RCP
  # (mlp_parts: the MLP's parts against MLX), the MLP GEMMs at other tiles, stage counts and
  # program orders (mlp_gemm_tiles), then the GPU tests those changes touch
  timeout 150 python3 tools/probes/mlp_parts.py "$logs/h200-mlp-parts-float16.json" \
    --tokens 512 2048 2>&1 | tee -a "$log"
  timeout 170 python3 tools/probes/mlp_gemm_tiles.py "$logs/h200-mlp-gemm-tiles.json" 2>&1 | tee -a "$log"
  # Triton 3.6 (autotuned, fused leaky epilogue) and torch's cuBLAS at the MLP's shapes: how
  # far from cuBLAS a compiler's GEMM gets there
  timeout 120 python3 -m benchmarks.compiler.triton_peer --dtype float16 --time-anyway --rounds 5 \
    --shapes 2048x11008x4096 512x11008x4096 512x4096x11008 2048x4096x11008 \
    --output "$logs/h200-triton-mlp-shapes-float16.json" 2>&1 | tail -8 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "gpu or silu or sigmoid or residual or stages \
or gated or Residual" test_dual_gemm test_linear_fused_reads test_epilogue_reads \
    test_gemm_stages_and_order test_epilogue
elif [ "$mode" = s76 ]; then
  # the next session's first call (no device time was left for it in the twenty-second):
  # the GPU tests of its last changes - ops pickled by reference, one is_real / is_integer
  # check, stream=, rope under vmap/jvp, the joined dual GEMM (METILE_WGMMA_DUAL=joined,
  # against NumPy on ragged shapes) -
  # then the MLP's parts with the joined form beside the split one
  gpu_tests 300 -k "test_op_replay or numpy_scalar or wgmma_dual_on_the_gpu or joined or \
rope_jvp or test_ops_vmap" test_op_replay test_model_ops_norms test_dual_gemm test_ops_jvp \
    test_ops_vmap
  timeout $((budget - 30 - (SECONDS - t0))) python3 tools/probes/mlp_parts.py \
    "$logs/h200-mlp-parts-joined-float16.json" --tokens 512 2048 2>&1 | tee -a "$log"
elif [ "$mode" = s75 ]; then
  # where the MLP forward's time goes (tools/probes/mlp_parts.py): the gate/up half as MLX's
  # composite, the dual GEMM at its default and other tiles, two single GEMMs; the down
  # projection with and without the residual against MLX's addmm; float16 T 512/2048
  timeout $((budget - 30 - (SECONDS - t0))) python3 tools/probes/mlp_parts.py \
    "$logs/h200-mlp-parts-float16.json" --tokens 512 2048 2>&1 | tee -a "$log"
elif [ "$mode" = s74 ]; then
  # issue 14's MLP forward after issue 13's GEMM tiles: benchmarks.model_layers (gated_mlp,
  # the MLP forward with down_proj + residual, linear+bias+gelu) at the ops' default kernels,
  # float16 and bfloat16, T 512/2048/4096; then every candidate tile of the float16 MLP at 2048
  timeout 300 python3 -m benchmarks.model_layers --dtypes float16 bfloat16 --tokens 512 2048 4096 \
    --output "$logs/h200-model-layers.json" 2>&1 | grep -E "x\)|Error|error" | tee -a "$log"
  timeout $((budget - 30 - (SECONDS - t0))) python3 -m benchmarks.model_layers --dtypes float16 \
    --tokens 2048 --layers mlp gated_mlp --configs --output "$logs/h200-model-layers-configs.json" 2>&1 \
    | grep -E "x\)|Error|error" | tee -a "$log"
elif [ "$mode" = s73 ]; then
  # the entries' recent-hit cache and the replay's launch without a primals vector: the eager
  # parts, the eager cost three times (separate processes: the ratio's spread on one host),
  # then the entries' GPU tests and the quantized convert test's skip
  timeout 60 python3 tools/probes/launch_parts.py "$logs/h200-launch-parts.json" 2>&1 | tee -a "$log"
  for r in 1 2 3; do
    timeout 60 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost-run$r.json" 2>&1 | tail -16 | tee -a "$log"
  done
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "test_op_replay or test_eager_fast_path or \
convert_swaps_quantized" test_op_replay test_eager_fast_path test_quantized_op
elif [ "$mode" = s72 ]; then
  # the ops' eager entries (a C function per op, no Python frame for a replayed call): the
  # eager parts and cost, then the GPU tests of the entries and of what s71 did not reach
  # (its test files ran past the call's limit)
  eager_cost
  gpu_tests $((budget - 20 - (SECONDS - t0))) -k "test_op_replay or test_eager_fast_path or \
test_ops_jvp or test_ops_vmap or test_convert or sinks or numpy_scalar or mismatched_x" \
    test_op_replay test_eager_fast_path test_ops_jvp test_ops_vmap test_convert \
    test_attention_op test_quantized_op test_model_ops_norms
elif [ "$mode" = s71 ]; then
  # first call of the twenty-second session: the GPU tests of the twenty-first's last CPU-only
  # changes (NumPy scalars in rope/attention, attention's sinks and vmap, quantized_matmul's
  # message, the shared float dtype tuple)
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_model_ops_norms test_attention_op \
    test_quantized_op test_ops_vmap test_ops_jvp test_convert
elif [ "$mode" = s69 ]; then
  # the jvp rules (C++ replay and kernel primitives rebuilt), the NumPy-scalar fixes
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_ops_jvp test_ops_vmap test_op_replay \
    test_triton_parity
elif [ "$mode" = s68 ]; then
  # the FMA-contraction test fix and the helpers' language fixes on the GPU
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_triton_parity test_dsl_kernels test_small_ints \
    test_int64
elif [ "$mode" = s67 ]; then
  # the session's last call: the HBM ceiling for rms_norm's traffic (torch and MLX sides in
  # their own processes), attention prefill after the -inf start of the accumulator rows'
  # max fold, bfloat16 16x4096x4096 fused vs two launches in more rounds, then the GPU tests
  # of this session's fixes (half/bfloat conversions, constant shift/divisor errors, norms'
  # NumPy scalars, the fold starts)
  timeout 60 python3 tools/probes/hbm_ceiling.py torch "$logs/h200-hbm-ceiling-torch.json" 2>&1 | tail -3 | tee -a "$log"
  timeout 90 python3 tools/probes/hbm_ceiling.py mlx "$logs/h200-hbm-ceiling-mlx.json" 2>&1 | tail -3 | tee -a "$log"
  timeout 150 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 --decode-lengths --launches 20 --rounds 5 \
    --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -6 | tee -a "$log"
  timeout 90 python3 -m benchmarks.compiler.schedule_fusion --dtype bfloat16 --tile 128 128 64 \
    --num-simdgroups 8 --sizes --shapes 16x4096x4096 --rounds 11 --target-ms 20 --time-anyway \
    --output "$logs/h200-gemm-bfloat16-m16.json" 2>&1 | tail -3 | tee -a "$log"
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_triton_parity test_dsl_errors test_row_reductions \
    test_model_ops_norms test_dot_fragments
elif [ "$mode" = s65 ]; then
  # the int4 GEMV with K split over a program's warps and the scale and bias once a word
  # (tools/probes/gemv_split_words.py): ncu kernel durations against MLX's qmv and runs
  # 1024/1, then the routing and convert tests fixed after s63
  ncu_times 240 ncu-gemv-split tools/probes/gemv_split_words.py
  [ "${S65_TESTS:-1}" = 1 ] && gpu_tests $((budget - 20 - (SECONDS - t0))) test_routing test_convert
elif [ "$mode" = s63 ]; then
  # twenty-first session, first call: the GPU tests of the twentieth's last fixes (s62's
  # files), then issue 13's fused-GEMM benchmark at ops' default tiles for float16 and
  # bfloat16 (128x128x64 below a wave of 128x256 tiles, 128x256x64 above), kept in
  # /root/stash for s64's Triton merge
  gpu_tests 200 test_convert test_autotune test_tuning test_routing test_dsl_codegen test_control_flow
  mkdir -p /root/stash
  for dt in float16 bfloat16; do
    timeout 90 python3 -m benchmarks.compiler.schedule_fusion --dtype $dt --tile 128 128 64 \
      --num-simdgroups 8 --sizes 1024 2048 --shapes 16x4096x4096 --rounds 5 --target-ms 20 \
      --time-anyway --output "/root/stash/h200-gemm-$dt-small.json" 2>&1 | tail -6 | tee -a "$log"
    timeout 120 python3 -m benchmarks.compiler.schedule_fusion --dtype $dt --tile 128 256 64 \
      --num-simdgroups 8 --sizes 4096 8192 --shapes 512x4096x11008 --rounds 5 --target-ms 20 \
      --time-anyway --output "/root/stash/h200-gemm-$dt-large.json" 2>&1 | tail -6 | tee -a "$log"
  done
  cp /root/stash/h200-gemm-*.json "$logs/"
elif [ "$mode" = s64 ]; then
  # issue 13, second call: strict float32 at ops' float32 tile (128x64x16 on 4 warps), then
  # Triton's fused GEMM merged into every s63/s64 file
  mkdir -p /root/stash
  timeout 150 python3 -m benchmarks.compiler.schedule_fusion --dtype float32 --tile 128 64 16 \
    --num-simdgroups 4 --sizes 1024 2048 4096 --shapes 16x4096x4096 512x4096x11008 --rounds 5 \
    --target-ms 30 --time-anyway --output "/root/stash/h200-gemm-float32-strict.json" 2>&1 | tail -6 | tee -a "$log"
  for f in /root/stash/h200-gemm-*.json; do
    [ $((budget - 30 - (SECONDS - t0))) -gt 40 ] || break
    timeout $((budget - 30 - (SECONDS - t0))) python3 -m benchmarks.compiler.triton_peer --merge "$f" \
      --time-anyway 2>&1 | tail -4 | tee -a "$log"
    cp "$f" "$logs/"
  done
  cp /root/stash/h200-gemm-*.json "$logs/" 2>/dev/null
elif [ "$mode" = tests ]; then
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
elif [ "$mode" = block ]; then
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
  # issue 13: where the strict float32 loop stalls, per SASS instruction (warp-state samples)
  timeout 120 ncu --clock-control none --section WarpStateStats --section SourceCounters \
    -k regex:metile -c 1 --page source --print-source sass --csv \
    python3 tools/probes/ffma_variants.py --profile > "$logs/ncu-ffma-sass.csv" 2>> "$log"
  echo "ncu sass exit $?: $(wc -l < "$logs/ncu-ffma-sass.csv") lines" | tee -a "$log"
elif [ "$mode" = ops17 ]; then
  # one op per run, so an op that runs out of time keeps the others' JSON (all five in
  # one run passed 150 s on 2026-12-01 before reaching rms_norm, softmax and rope)
  for op in rms_norm softmax rope layer_norm add_rms_norm; do
    timeout 100 python3 -m benchmarks.model_ops --dtype float16 --rounds 3 --ops $op \
      --output "$logs/h200-model-ops-$op-float16.json" 2>&1 | grep -E "16384x8192|32768" | tail -4 | tee -a "$log"
  done
  timeout 150 python3 -m benchmarks.attention --dtype float16 --heads 32 --kv-heads 8 --head-dim 128 \
    --output "$logs/h200-attention-float16.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
elif [ "$mode" = s8 ]; then
  # lanes in runs (passes/vectorize_rows.py): the row kernels' GPU tests, then their
  # benchmarks; then whether the dual GEMM's in-graph time settles (same form repeated)
  gpu_tests 150 test_model_ops_norms test_vectorize_rows
  timeout 60 python3 tools/probes/norm_grads.py 2>&1 | tail -8 | tee -a "$log"
  METILE_CUDA_LAUNCH=mlx timeout 60 python3 tools/probes/norm_grads.py 2>&1 | tail -8 | sed "s/^/launch=mlx /" | tee -a "$log"
  for op in ${S8_OPS:-rms_norm layer_norm softmax add_rms_norm}; do
    timeout 100 python3 -m benchmarks.model_ops --dtype float16 --rounds 3 --ops $op \
      --output "$logs/h200-model-ops-$op-float16.json" 2>&1 | grep -E "4096x4096|16384x8192|32768" | tail -4 | tee -a "$log"
  done
  [ "${S8_GATED:-1}" = 1 ] && timeout 100 python3 tools/probes/gated_in_graph.py normed normed normed normed normed normed constants constants 2>&1 | tail -2 | tee -a "$log"
elif [ "$mode" = s9 ]; then
  # the GPU tests of what lanes in runs, the placement change and the one-barrier
  # reductions touch; ncu's view of the row kernels (issue 17's misses need their
  # profile); the row benchmarks once more
  gpu_tests 120 test_model_ops_norms test_vectorize_rows test_ops test_autodiff test_decoder_block
  timeout 75 ncu --clock-control none -k regex:metile --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats \
    python3 tools/probes/row_kernels_profile.py > "$logs/ncu-row-kernels.txt" 2>&1
  echo "ncu exit $?" | tee -a "$log"
  grep -E "metile_|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Reg|Warp Cycles Per Issued|Stall" \
    "$logs/ncu-row-kernels.txt" | head -40 | tee -a "$log"
  for op in ${S9_OPS:-rms_norm layer_norm softmax add_rms_norm}; do
    timeout 55 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops $op \
      --output "$logs/h200-model-ops-$op-float16.json" 2>&1 | grep -E "16384x8192|32768" | tail -8 | tee -a "$log"
  done
elif [ "$mode" = s11 ]; then
  gpu_tests 100 test_model_ops_norms test_vectorize_rows
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/probes/row_kernels_vs_mlx.py > "$logs/ncu-row-vs-mlx.csv" 2>> "$log"
  python3 - "$logs/ncu-row-vs-mlx.csv" <<'PY' 2>&1 | tee -a "$log"
import csv, sys, collections
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
us = collections.defaultdict(list)
for r in csv.DictReader(lines[start:]):
    us[r["Kernel Name"][:60]].append(float(r["Metric Value"].replace(",", "")) / 1e3)
for name, v in us.items():
    print(f"{name:60s} n={len(v):2d} us: " + " ".join(f"{u:.1f}" for u in v))
PY
  for op in ${S11_OPS:-softmax rms_norm}; do
    timeout 55 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops $op \
      --output "$logs/h200-model-ops-$op-float16.json" 2>&1 | grep -E "16384x8192|32768" | tail -8 | tee -a "$log"
  done
  timeout $((budget - 20 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --variants auto --output "$logs/h200-decoder-block-float16.json" 2>&1 \
    | tee "$logs/decoder-block.log" | tail -8 | tee -a "$log"
elif [ "$mode" = s12 ]; then
  # where the benchmark's per-call latency goes beyond the kernel (nsys timeline)
  if command -v nsys > /dev/null; then
    timeout 120 nsys profile -t cuda -o "$logs/gaps" python3 tools/probes/launch_gaps.py >> "$log" 2>&1
    timeout 60 nsys stats -r cuda_gpu_trace -f csv -o "$logs/gaps" "$logs/gaps.nsys-rep" >> "$log" 2>&1
    python3 tools/probes/gap_summary.py "$logs"/gaps_cuda_gpu_trace.csv 2>&1 | tee -a "$log"
  else
    timeout 120 python3 tools/probes/launch_gaps.py --torch 2>&1 | grep -v " done" | tail -12 | tee -a "$log"
  fi
  METILE_CUDA_LAUNCH=mlx timeout 55 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops softmax \
    --output "$logs/h200-model-ops-softmax-float16-mlx-launch.json" 2>&1 | grep -E "16384x8192" | tail -4 | sed "s/^/launch=mlx /" | tee -a "$log"
elif [ "$mode" = s13 ]; then
  # first GPU run of the word-held runs, piecewise rope addresses and still loads (eighth
  # session, CPU/NVRTC only then): row and rope tests, the row benchmarks, int4 decode
  gpu_tests 150 test_model_ops_norms test_vectorize_rows test_quantized_op
  for op in ${S13_OPS:-rope softmax rms_norm layer_norm}; do
    timeout 60 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops $op \
      --output "$logs/h200-model-ops-$op-float16.json" 2>&1 | grep -E "16384x8192|32768|x4096x128|fails" | tail -8 | tee -a "$log"
  done
  timeout $((budget - 20 - (SECONDS - t0))) python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
elif [ "$mode" = s14 ]; then
  # int4 decode through quantized_matvec_runs (packed words once per run), prefill through
  # the row-wise dequantize and ops' GEMM tile; the row tests s13 ran out of time for
  gpu_tests 200 test_quantized_op test_vectorize_rows
  timeout $((budget - 20 - (SECONDS - t0))) python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
elif [ "$mode" = s15 ]; then
  # quantized decode tiles incl. the untimed several-outputs GEMV (quantized_matvec_rows),
  # the eager host cost after ops launch through kernel[grid], the row GPU tests with the
  # masked run-constant loads (s13/s14 ran out of test time: compiling dominates)
  timeout 200 python3 tools/probes/quantized_parts.py --rounds 5 2>&1 | grep -E "^prefill|^decode|Error" | cut -c1-1500 | tee -a "$log"
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
  timeout 90 python3 tools/probes/decode_attention.py 2>&1 | grep -E "^decode_attention" | cut -c1-1200 | tee -a "$log"
  timeout 60 python3 tools/probes/launch_cost.py 2>&1 | tail -12 | tee -a "$log"
  gpu_tests $((budget - 40 - (SECONDS - t0))) test_vectorize_rows test_quantized_op test_model_ops_norms
elif [ "$mode" = s16 ]; then
  # the dequantize without threadgroup memory and with per-element shifts folded, the
  # rows-on-one-warp GEMV as the decode default; the row/quantized GPU tests
  timeout 200 python3 tools/probes/quantized_parts.py --rounds 5 2>&1 | grep -E "^prefill|^decode|Error" | cut -c1-1500 | tee -a "$log"
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -6 | tee -a "$log"
  gpu_tests $((budget - 30 - (SECONDS - t0))) test_vectorize_rows test_quantized_op
elif [ "$mode" = s17 ]; then
  # attention_decode (rows summed on lanes, no matrix products) against MLX and the split
  # kernel; the row-kernel benchmarks after axis reductions moved out of threadgroup
  # memory; the attention, row-reduction and row GPU tests
  timeout 150 python3 tools/probes/decode_attention.py 2>&1 | grep -E "^decode_attention" | cut -c1-1500 | tee -a "$log"
  for op in softmax rms_norm; do
    timeout 60 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops $op \
      --output "$logs/h200-model-ops-$op-float16.json" 2>&1 | grep -E "16384x8192|fails" | tail -4 | tee -a "$log"
  done
  # a per-head norm (qk-norm: 32 heads x 4096 tokens of 128): one narrow row a program
  timeout 60 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops rms_norm \
    --shapes 131072x128 --output "$logs/h200-model-ops-rms_norm-narrow-float16.json" 2>&1 | grep -E "131072|fails" | tail -3 | tee -a "$log"
  gpu_tests $((budget - 30 - (SECONDS - t0))) test_row_reductions test_attention_op test_vectorize_rows
elif [ "$mode" = s18 ]; then
  # decode attention with 1-2 warp programs over many splits and the one-shot combine;
  # the int4 GEMV that reads a block ahead; the attention and quantized GPU tests
  timeout 200 python3 tools/probes/decode_attention.py 2>&1 | grep -E "^decode_attention" | cut -c1-2500 | tee -a "$log"
  timeout 150 python3 tools/probes/quantized_parts.py --decode-only --rounds 5 2>&1 | grep -E "^decode|Error" | cut -c1-1500 | tee -a "$log"
  gpu_tests $((budget - 30 - (SECONDS - t0))) test_attention_op test_quantized_op
elif [ "$mode" = s19 ]; then
  # kernel-only durations (ncu) of the decode attention and int4 GEMV candidates and
  # MLX's kernels: the benchmarks time compiled calls, host work included
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/probes/decode_kernels_ncu.py --repeat 3 > "$logs/ncu-decode-kernels.csv" 2>> "$log"
  echo "ncu exit $?" | tee -a "$log"
  grep "^side" "$logs/ncu-decode-kernels.csv" | cut -c1-200 | tee -a "$log"
  python3 tools/probes/decode_kernels_ncu.py --summarize "$logs/ncu-decode-kernels.csv" 2>&1 | tee -a "$log"
elif [ "$mode" = s20 ]; then
  # decode attention after the per-call fills went (mask stand-in, combine store proven):
  # ncu kernel times of the configurations, the compiled-call sweep, the benchmark JSON
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/probes/decode_kernels_ncu.py --repeat 3 > "$logs/ncu-decode-kernels.csv" 2>> "$log"
  echo "ncu exit $?" | tee -a "$log"
  python3 tools/probes/decode_kernels_ncu.py --summarize "$logs/ncu-decode-kernels.csv" 2>&1 | grep -E "metile|qmv|cudnn" | tee -a "$log"
  timeout 120 python3 tools/probes/decode_attention.py 2>&1 | grep -E "^decode_attention" | cut -c1-2500 | tee -a "$log"
  timeout 150 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 --prefill-lengths \
    --decode-lengths 1024 4096 16384 --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -6 | tee -a "$log"
  timeout 100 python3 -m benchmarks.attention --dtype float16 --heads 32 --kv-heads 8 --head-dim 128 --prefill-lengths \
    --decode-lengths 4096 --output "$logs/h200-attention-decode-gqa-float16.json" 2>&1 | tail -4 | tee -a "$log"
elif [ "$mode" = s21 ]; then
  # several narrow rows a program (norms, softmax), decode attention and int4 decode
  # defaults: their GPU tests, the benchmarks' JSON, ncu of the prefill's dequantize
  (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 90 \
     --junitxml="$out/junit.xml" "$repo/tests/test_model_ops_norms.py" "$repo/tests/test_attention_op.py" \
     "$repo/tests/test_quantized_op.py" -k "several_rows or narrow or test_rms_norm or test_softmax or decode or one_query or combines or grouped or every_decode" \
     > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  for op in rms_norm softmax layer_norm; do
    timeout 50 python3 -m benchmarks.model_ops --dtype float16 --rounds 2 --ops $op --shapes 131072x128 \
      --output "$logs/h200-model-ops-$op-narrow-float16.json" 2>&1 | grep -E "131072|fails" | tail -4 | tee -a "$log"
  done
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --output "$logs/h200-quantized-int4-float16.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 60 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 --prefill-lengths \
    --decode-lengths 4096 --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -2 | tee -a "$log"
  timeout 60 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats -k regex:dequantize -c 1 \
    python3 tools/probes/dequantize_once.py > "$logs/ncu-dequantize.txt" 2>&1
  grep -E "Duration|Throughput|Warp Cycles|Achieved Occupancy|Registers|Stall|Eligible|Issued" "$logs/ncu-dequantize.txt" | head -30 | tee -a "$log"
elif [ "$mode" = s22 ]; then
  # general products on tensor cores (METILE_DOT_FRAGMENTS=1, not yet run on a GPU): their
  # tests and the attention tests with it, then attention prefill with and without it
  (cd /tmp && METILE_DOT_FRAGMENTS=1 timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 90 \
     --junitxml="$out/junit.xml" "$repo/tests/test_dot_fragments.py" "$repo/tests/test_attention_op.py" \
     -k "two_products or element or transposed or ragged or head_dims or grouped or half or masks or decode" \
     > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  for frag in 0 1; do
    METILE_DOT_FRAGMENTS=$frag timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
      --prefill-lengths 1024 4096 --decode-lengths --rounds 3 --launches 5 \
      --output "$logs/h200-attention-prefill-frag$frag-float16.json" 2>&1 | tail -3 | sed "s/^/frag=$frag /" | tee -a "$log"
  done
  # int4 with the weight out of L2 (each call the next of 4 weights), as a model reads it
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --output "$logs/h200-quantized-int4-float16-cold.json" 2>&1 | tail -4 | tee -a "$log"
elif [ "$mode" = s23 ]; then
  # fragment products now the CUDA default (their tests count CUDA's calls), op replays on
  # the GPU, the eager host cost per launch after the replays, decode attention unchanged?
  (cd /tmp && timeout 240 python3 -m pytest -q -p no:cacheprovider --timeout 90 \
     --junitxml="$out/junit.xml" "$repo/tests/test_dot_fragments.py" "$repo/tests/test_op_replay.py" \
     > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  timeout 90 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost-replays.json" 2>&1 | tail -14 | tee -a "$log"
  timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 --decode-lengths 4096 --rounds 3 --launches 5 \
    --output "$logs/h200-attention-float16.json" 2>&1 | tail -4 | tee -a "$log"
  # prefill per tile and warp count (rows_reduce's partials for 64-key rows now)
  timeout 120 python3 tools/probes/attention_prefill_tiles.py --length 4096 \
    "$logs/h200-attention-prefill-tiles.json" 2>&1 | tail -10 | tee -a "$log"
  timeout 100 python3 -m benchmarks.model_ops --dtype float16 --rounds 5 --ops softmax \
    --output "$logs/h200-model-ops-softmax-float16.json" 2>&1 | tail -3 | tee -a "$log"
elif [ "$mode" = s24 ]; then
  # the fused int4 prefill on warpgroup MMA (thread-dequantized K-major stage): its GPU
  # tests, then the quantized benchmark (weights out of L2); fragments, replays, prefill
  (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 120 \
     --junitxml="$out/junit.xml" "$repo/tests/test_quantized_op.py" -k "fused or prefill_candidates" \
     "$repo/tests/test_dot_fragments.py" "$repo/tests/test_op_replay.py" \
     > "$logs/pytest.txt" 2>&1)
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal" "$logs/pytest.txt" | tail -15 | tee -a "$log"
  python3 tools/summarize_run.py "$out/junit.xml" > "$out/device-run.json" 2>>"$log"
  (cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_triton_parity.py" \
     -k "same_width" 2>&1 | tail -2 | tee -a "$log")
  timeout 150 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --output "$logs/h200-quantized-int4-float16-fused.json" 2>&1 | tail -4 | tee -a "$log"
  timeout 60 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost-replays.json" 2>&1 | tail -14 | tee -a "$log"
  timeout 90 python3 tools/probes/attention_prefill_tiles.py --length 4096 \
    "$logs/h200-attention-prefill-tiles.json" 2>&1 | tail -10 | tee -a "$log"
elif [ "$mode" = s25 ]; then
  # GPU tests only: op replays (the C++ CudaLaunch path), fragment products, attention
  # after the coalesced key blocks (transposed fragment loads), the fused int4 GEMM ragged
  gpu_tests $((budget - 60 - (SECONDS - t0))) test_op_replay test_dot_fragments test_attention_op
  (cd /tmp && timeout $((budget - 20 - (SECONDS - t0))) python3 -m pytest -q -p no:cacheprovider \
     "$repo/tests/test_quantized_op.py" -k "fused_warpgroup and float16" 2>&1 | tail -4 | tee -a "$log")
elif [ "$mode" = s32 ]; then
  # the launch configuration shared by a bound signature's launches (no per-launch copies):
  # its GPU tests, then the eager launch's parts and cost
  gpu_tests 150 test_cuda_launch test_launch_errors test_input_layout test_ops_vmap test_launch_memory test_op_replay
  timeout 40 python3 tools/probes/launch_parts.py "$logs/h200-launch-parts.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 50 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -16 | tee -a "$log"
elif [ "$mode" = s31 ]; then
  # the decoder block against its A/A control at more launches per sample and rounds (s30's
  # forward+backward control read 0.96-0.99: the band a same-kernels variant falls in);
  # an eager launch's host time part by part
  timeout 40 python3 tools/probes/launch_parts.py "$logs/h200-launch-parts.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 230 python3 -m benchmarks.decoder_block --dtypes float16 --tokens 512 2048 --rounds 15 \
    --target-ms 250 --max-launches 60 --variants auto mlx-again \
    --output "$logs/h200-decoder-block-float16.json" 2>&1 | tee "$logs/decoder-block.log" \
    | tail -6 | tee -a "$log"
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 --rounds 15 --target-ms 250 --max-launches 60 --variants auto mlx-again \
    --residual-add --output "$logs/h200-decoder-block-float16-residual-add.json" 2>&1 \
    | tee "$logs/decoder-block-residual-add.log" | tail -3 | tee -a "$log"
elif [ "$mode" = s62 ]; then
  # first call of the twenty-first session: the GPU tests of the twentieth's last fixes
  # (nn.convert's tied / subclassed / mixed-dtype layers, autotune's agreement groups and
  # conflicting meta-parameters, damaged routing decisions, the checksummed kernel cache)
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_convert test_autotune test_tuning test_routing \
    test_dsl_codegen test_control_flow
elif [ "$mode" = s61 ]; then
  # the hostile-test fixes on the GPU: loops with steps known at launch (either sign, zero),
  # where() between buffers, the coverage proof, attention's routing of what the kernels do
  # not take, linear's bias dtype, rope's offset dtype
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_control_flow test_dsl_codegen test_bad_inputs \
    test_linear_fused_reads
elif [ "$mode" = s60 ]; then
  # the coverage proof's fixes on the GPU (an output proven whole is not pre-filled there);
  # the compiler peer: Triton's causal forward (each configuration in its own process,
  # torch's SDPA beside it), then metile against MLX in the same session, and the tiles
  # ranked again at 4096 after the strided copies
  gpu_tests 100 -k "cover or proven or reversed or swizzle or negative_bounds or mask_terms" \
    test_dsl_codegen test_ops_batched test_attention_op
  timeout 330 python3 tools/probes/triton_attention.py "$logs/h200-triton-attention.json" 2>&1 \
    | grep -v Warn | tee -a "$log"
  timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -4 | tee -a "$log"
  timeout $((budget - 15 - (SECONDS - t0))) python3 tools/probes/attention_prefill_tiles.py \
    --length 4096 "$logs/h200-attention-prefill-tiles.json" 2>&1 | tail -10 | tee -a "$log"
elif [ "$mode" = s59 ]; then
  # where the attention loop waits, per SASS instruction (warp-state samples of the second
  # launch at 4096), the SM's pipes and occupancy, then Triton's causal forward on the same
  # machine (its own python3 and process) as the compiler peer
  timeout 150 ncu --kernel-name regex:attention_forward --launch-skip 1 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
    python3 tools/probes/attention_prefill_once.py 128 64 8 > "$logs/ncu-attention-sass.csv" 2>> "$log"
  echo "ncu sass exit $?: $(wc -l < "$logs/ncu-attention-sass.csv") lines" | tee -a "$log"
  timeout 150 ncu --kernel-name regex:attention_forward --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
    python3 tools/probes/attention_prefill_once.py 128 64 8 > "$logs/ncu-attention-sections.txt" 2>> "$log"
  grep -E "Duration|Throughput|Pipe|Occupancy|Warp Cycles|Active Warps|Stall|Registers|Block Limit|Issued" \
    "$logs/ncu-attention-sections.txt" | head -60 | tee -a "$log"
  timeout $((budget - 15 - (SECONDS - t0))) python3 tools/probes/triton_attention.py \
    "$logs/h200-triton-attention.json" 2>&1 | tail -24 | tee -a "$log"
elif [ "$mode" = s58 ]; then
  # first call of the twentieth session: the strided cp.async copies (never run on a GPU
  # yet) and the outputs the mixed-radix coverage proof now takes (batched matmul, attention,
  # user kernels): their GPU tests, then the op against MLX and the loop's profile
  gpu_tests 240 test_attention_op test_dot_fragments test_ops_batched test_dsl_codegen test_vectorize_rows
  timeout 200 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -8 | tee -a "$log"
  m=gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread
  for r in long_scoreboard wait barrier selected; do m=$m,smsp__pcsamp_warps_issue_stalled_$r; done
  timeout 100 ncu --kernel-name regex:attention_forward --launch-skip 1 --launch-count 1 --metrics "$m" \
    python3 tools/probes/attention_prefill_once.py 128 64 8 2>&1 | grep -E "^ +[a-z_]+__" | tee -a "$log"
elif [ "$mode" = s57 ]; then
  # a first call onto fresh memory (s56's ncu: the op's first call 2194 us, its second 363):
  # the op, MLX's SDPA and x * 2, each 3 calls then 2 after mx.clear_cache(), every duration
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/probes/attention_kernels_ncu.py 4096 --first-call > "$logs/ncu-first-call.csv" 2>> "$log"
  python3 - "$logs/ncu-first-call.csv" <<'PY' 2>&1 | tee -a "$log"
import csv, io, sys
text = open(sys.argv[1]).read()
text = text[text.index('"ID"'):]
for row in csv.DictReader(io.StringIO(text)):
    name = row["Kernel Name"]
    if any(s in name for s in ("attention", "sdpa", "Multiply", "copy")):
        print(f"{name[:60]:60s} {row['Metric Value']}")
PY
  # the decoder block (its attention now without the written mask), converted against MLX
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --variants auto metile --output "$logs/h200-decoder-block-float16.json" 2>&1 \
    | tee "$logs/decoder-block.log" | tail -8 | tee -a "$log"
elif [ "$mode" = s56 ]; then
  # attention's output proven whole (no zero fill, written mask and merge a call): GPU
  # tests of attention and the coverage proofs, the op against MLX, every kernel's time
  gpu_tests 150 test_attention_op test_dsl_codegen
  timeout 200 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -8 | tee -a "$log"
  for n in 1024 4096; do
    ncu_times 60 ncu-attention-kernels-$n tools/probes/attention_kernels_ncu.py $n
  done
elif [ "$mode" = s55 ]; then
  # the carried value product against METILE_WGMMA_CARRY=0 in one run (tiles 128x64 and
  # 128x128), then every kernel's duration (ncu) of the op and MLX's SDPA at 1024 and 4096
  timeout 150 python3 tools/probes/attention_prefill_variants.py --rounds 7 \
    "$logs/h200-attention-prefill-variants.json" 2>&1 | grep -v Warn | tee -a "$log"
  for n in 1024 4096; do
    ncu_times 90 ncu-attention-kernels-$n tools/probes/attention_kernels_ncu.py $n
  done
  gpu_tests $((budget - 15 - (SECONDS - t0))) -k "in_flight or on_request or prefill" test_dot_fragments
elif [ "$mode" = s54 ]; then
  # the carried value product waited for before the next iteration's key product (so it
  # fits the two-blocks bound): attention GPU tests, tiles against MLX, then prefill_measure
  gpu_tests 120 test_attention_op test_dot_fragments
  timeout 100 python3 tools/probes/attention_prefill_variants.py --rounds 5 \
    "$logs/h200-attention-prefill-variants.json" 2>&1 | grep -v Warn | tee -a "$log"
  timeout 200 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -8 | tee -a "$log"
  m=gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
  for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle selected; do
    m=$m,smsp__pcsamp_warps_issue_stalled_$r
  done
  timeout 100 ncu --kernel-name regex:attention_forward --launch-count 1 --metrics "$m" \
    python3 tools/probes/attention_prefill_once.py 128 64 8 2>&1 | grep -E "^ +[a-z_]+__" | tee -a "$log"
elif [ "$mode" = s53 ]; then
  # the value product left in flight round the loop's back edge where no register bound
  # applies (lower_mma_layout.carried_products): tiles and warps against MLX (each checked
  # at a ragged length first), with and without the two-blocks bound; then the rest of
  # the attention GPU tests s52 did not reach
  timeout 170 python3 tools/probes/attention_prefill_variants.py --rounds 5 \
    "$logs/h200-attention-prefill-variants.json" 2>&1 | grep -v Warn | tee -a "$log"
  timeout 120 python3 tools/probes/attention_prefill_variants.py --rounds 5 --min-blocks-off \
    "$logs/h200-attention-prefill-variants-unbounded.json" 2>&1 | grep -v Warn | tee -a "$log"
  gpu_tests $((budget - 15 - (SECONDS - t0))) test_attention_op test_dot_fragments
elif [ "$mode" = s52 ]; then
  # the GEMM GPU files after s51's compiler changes (mask-and-shift coordinates, fmaxf,
  # whole-chunk copies, atom_offset's shifts) and attention's with the causal program order;
  # then prefill's tiles, warps and program order (HEAD_GROUP) against MLX at 1024/4096/8192,
  # with and without the two-blocks-an-SM register bound
  gpu_tests 200 test_gemm_async test_gemm_wgmma test_gemm_tma test_attention_op
  cp "$logs/pytest.txt" "$logs/pytest-tests.txt"
  timeout 170 python3 tools/probes/attention_prefill_variants.py --rounds 5 \
    "$logs/h200-attention-prefill-variants.json" 2>&1 | grep -v Warn | tee -a "$log"
  timeout $((budget - 15 - (SECONDS - t0))) python3 tools/probes/attention_prefill_variants.py \
    --rounds 5 --min-blocks-off "$logs/h200-attention-prefill-variants-unbounded.json" 2>&1 \
    | grep -v Warn | tee -a "$log"
elif [ "$mode" = s51 ]; then
  # one barrier an attention iteration (the next blocks copied after it): GPU tests of
  # attention, fragments and every kernel the chunk copies and the tile coordinates touch,
  # then prefill_measure
  gpu_tests 300 test_attention_op test_dot_fragments test_vectorize_rows test_row_reductions test_model_ops_norms test_quantized_op
  prefill_measure
elif [ "$mode" = s47 ] || [ "$mode" = s48 ] || [ "$mode" = s49 ] || [ "$mode" = s50 ]; then
  # attention prefill, 2026-12-03: s47 whole key blocks unmasked, cp.async copies, one-ahead
  # prefetch; s48 ldmatrix without run-time alignment tests, mask-and-shift coordinates,
  # fmaxf (its tests also ran row reductions, norms, vectorized rows, the cp.async GEMM and
  # int4); s49 the products as warpgroup MMA; s50 one-add descriptors, four-chain row
  # statistics, whole-chunk copies.  The attention and fragment GPU tests, then
  # prefill_measure
  gpu_tests 150 test_attention_op test_dot_fragments
  prefill_measure
elif [ "$mode" = s46 ]; then
  # attention prefill's CUDA tiles in the accumulator layout (128x64 on 8 warps first): GPU
  # tests, the op's benchmark at 1024/4096/8192 against MLX
  gpu_tests 120 test_attention_op test_dot_fragments
  timeout 200 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -8 | tee -a "$log"
elif [ "$mode" = s45 ]; then
  # attention prefill after padding its operand tiles' rows: GPU tests, the tiles at 4096,
  # ncu's stall samples and bank conflicts of one 64x64 launch
  gpu_tests 120 test_attention_op test_dot_fragments
  timeout 150 python3 tools/probes/attention_prefill_tiles.py "$logs/h200-attention-prefill-tiles.json" 2>&1 | tail -12 | tee -a "$log"
  M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_selected,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
    && timeout 100 ncu --kernel-name regex:attention_forward --launch-count 1 --metrics "$M" \
    python3 tools/probes/attention_prefill_once.py 64 64 4 2>&1 | grep -E "^ +[a-z_]+__" | tee -a "$log"
elif [ "$mode" = s44 ]; then
  # attention prefill with its products and softmax in the accumulator layout
  # (passes/mma_layout.py): GPU tests of attention and general products first, then the
  # tiles and warps against MLX's causal SDPA at 4096 and 2048, then the op's benchmark
  gpu_tests 170 test_attention_op test_dot_fragments
  timeout 150 python3 tools/probes/attention_prefill_tiles.py "$logs/h200-attention-prefill-tiles.json" 2>&1 | tail -12 | tee -a "$log"
  timeout 60 python3 tools/probes/attention_prefill_tiles.py --length 2048 2>&1 | tail -12 | tee -a "$log"
  timeout 150 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 \
    --prefill-lengths 1024 4096 8192 --decode-lengths --launches 20 --rounds 5 --output "$logs/h200-attention-prefill-float16.json" 2>&1 | tail -8 | tee -a "$log"
elif [ "$mode" = s43 ]; then
  # decode attention before s40 against now, in one run: compiled calls, then ncu
  timeout 90 python3 tools/probes/decode_attention_ab.py 2>&1 | grep -E "^decode_attention_ab [0-9]" | tee -a "$log"
  ncu_times 90 ncu-decode-attention-ab tools/probes/decode_attention_ab.py --once
elif [ "$mode" = s42 ]; then
  # decode attention's key blocks, warps and splits (compiled calls) at 4096 and 16384 keys,
  # and the benchmark, to choose the default (s41's ncu: 8 keys on 2 warps over 32 splits
  # 76.9 + 4.5 us cold, 64 keys 70.4 + 3.5, MLX's cuDNN kernel 74.8 + 3.3: latency-bound)
  timeout 150 python3 tools/probes/decode_attention.py 2>&1 | grep -E "^decode_attention" | cut -c1-2500 | tee -a "$log"
  timeout 200 python3 tools/probes/decode_attention.py --keys 16384 2>&1 | grep -E "^decode_attention" | cut -c1-2500 | tee -a "$log"
elif [ "$mode" = s41 ]; then
  # decode attention's kernel times (ncu, caches flushed): MLX's op and attention_decode's
  # configurations at 4096 and 16384 keys
  ncu_times 200 ncu-decode-attention tools/probes/decode_attention_ncu.py --repeat 3
elif [ "$mode" = s40 ]; then
  # decode attention with an online softmax per key slot (no barrier in its loop) on row
  # reductions held in their lanes: the probe's configurations at 4096 and 16384 keys,
  # the benchmark at 1024/4096/16384, the GPU tests of attention and row reductions
  timeout 100 python3 tools/probes/decode_attention.py 2>&1 | grep -E "^decode_attention" | cut -c1-2500 | tee -a "$log"
  timeout 120 python3 tools/probes/decode_attention.py --keys 16384 2>&1 | grep -E "^decode_attention" | cut -c1-2500 | tee -a "$log"
  timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 --prefill-lengths \
    --decode-lengths 1024 4096 16384 --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -6 | tee -a "$log"
  gpu_tests $((budget - 15 - (SECONDS - t0))) test_attention_op test_row_reductions test_model_ops_norms
elif [ "$mode" = s39 ]; then
  # softmax holding its exponentials (HOLD) and exp2 as one MUFU.EX2: the softmax benchmark
  # (each configuration, and the default one computing them again: precise=True's path),
  # decode attention (exp2 in its loop), and the GPU tests of both
  timeout 150 python3 -m benchmarks.model_ops --dtype float16 --rounds 3 --ops softmax \
    --output "$logs/h200-model-ops-softmax-float16.json" 2>&1 | grep -E "x8192|x4096" | tee -a "$log"
  timeout 120 python3 -m benchmarks.attention --dtype float16 --heads 32 --head-dim 128 --prefill-lengths \
    --decode-lengths 1024 4096 16384 --output "$logs/h200-attention-decode-float16.json" 2>&1 | tail -6 | tee -a "$log"
  gpu_tests $((budget - 15 - (SECONDS - t0))) test_model_ops_norms test_attention_op
elif [ "$mode" = s38 ]; then
  # settings checks skipped until os.environ changes (a dict watcher on this python): the
  # eager parts and cost, the replay/launch GPU tests, the decoder block against its A/A
  # control (not run since s31)
  eager_cost
  gpu_tests 150 test_op_replay test_eager_fast_path test_cuda_launch test_settings test_decoder_block
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --rounds 10 --target-ms 250 --max-launches 60 --variants auto mlx-again \
    --output "$logs/h200-decoder-block-float16.json" 2>&1 | tee "$logs/decoder-block.log" \
    | tail -8 | tee -a "$log"
elif [ "$mode" = s37 ]; then
  # the quantized op's GPU tests alone (s33 and s36 ran out of time before them): every
  # decode candidate (float16) incl. the mask-free GEMVs, dequantize, prefill candidates
  gpu_tests $((budget - 25 - (SECONDS - t0))) \
    -k "not fused_warpgroup and not convert and (not every_decode_candidate or float16)" \
    test_quantized_op
elif [ "$mode" = s36 ]; then
  # replays without extra copies: eager parts (the row ops' replays too) and cost; the GPU
  # tests of the changed GEMV/dequantize/replay code; the int4 prefill after the revert
  eager_cost
  gpu_tests 230 \
    -k "not fused_warpgroup and not convert and not gradients and (not every_decode_candidate or float16)" \
    test_cuda_scalars test_op_replay test_quantized_op
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.quantized --dtype float16 --bits 4 \
    --group-size 64 --weights 4 --decode-off --also DEQUANTIZE_MLX_GEMM --rounds 3 \
    --output "$logs/h200-quantized-int4-float16-prefill.json" 2>&1 | tail -2 | tee -a "$log"
elif [ "$mode" = s35 ]; then
  # op replays looked up in C++ (ReplayTable): the replay/op GPU tests, the eager cost; the
  # int4 decode with 8 products a compiled call (the call's host time shared, as in a step)
  gpu_tests 150 test_op_replay test_decoder_block test_ops_vmap test_model_ops_norms
  eager_cost
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --prefill-off \
    --weights 4 --chain 8 --launches 20 --rounds 5 --also-decode MATVEC_ROWS \
    --output "$logs/h200-quantized-int4-float16-decode-chain8.json" 2>&1 | tail -2 | tee -a "$log"
  M=gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    ncu_times 120 ncu-gemv tools/probes/decode_kernels_ncu.py --only gemv --repeat 3
  ncu_times 90 ncu-dequantize tools/probes/decode_kernels_ncu.py --only dequantize --repeat 3
  timeout $((budget - 20 - (SECONDS - t0))) python3 -m benchmarks.quantized --dtype float16 --bits 4 \
    --group-size 64 --weights 4 --decode-off --also DEQUANTIZE_MLX_GEMM --rounds 5 \
    --output "$logs/h200-quantized-int4-float16-prefill.json" 2>&1 | tail -2 | tee -a "$log"
elif [ "$mode" = s34 ]; then
  # every metile kernel on metile's own launch (scalar-less ones were MLX's cuda_kernel):
  # the launch GPU tests, the eager cost; the 1024-deep GEMV in the decode benchmark, and
  # every kernel a compiled decode call launches (its per-call time against its kernel's)
  gpu_tests 200 test_cuda_scalars test_cuda_launch test_launch_errors test_dsl_kernels test_op_replay test_launch_memory test_input_layout
  eager_cost
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --prefill-off \
    --weights 4 --rounds 7 --also-decode MATVEC_ROWS \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -2 | tee -a "$log"
  ncu_times 90 ncu-decode-compiled tools/probes/decode_compiled_kernels.py
elif [ "$mode" = s33 ]; then
  # the mask-free (EVEN_K) GEMVs: the decode candidates on the GPU, kernel time against the
  # masked form and MLX, their profile (sections), the decode benchmark's compiled calls
  gpu_tests 150 -k "every_decode_candidate or runs_read or transposed_decode" test_quantized_op
  timeout 60 python3 tools/probes/launch_parts.py "$logs/h200-launch-parts.json" 2>&1 | tee -a "$log"
  ncu_times 120 ncu-gemv tools/probes/decode_kernels_ncu.py --only gemv --repeat 3
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --prefill-off \
    --weights 4 --rounds 7 --also-decode MATVEC_ROWS \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -2 | tee -a "$log"
  timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section ComputeWorkloadAnalysis -k regex:"quantized_matvec|qmv" \
    python3 tools/probes/decode_kernels_ncu.py --only gemv --repeat 1 > "$logs/ncu-gemv-sections.txt" 2>&1
  tail -3 "$logs/ncu-gemv-sections.txt" | tee -a "$log"
elif [ "$mode" = s30 ]; then
  # the post-s29 changes on the GPU (vmap stand-ins, guard launches, lazy inputs), the eager
  # cost, the GEMV sweep (kernel time) and the decode benchmark with it, the decoder block
  # with its A/A control, then the residual-as-add probe while time is left
  gpu_tests 170 test_input_layout test_ops_vmap test_launch_errors test_launch_memory test_op_replay test_cuda_launch test_dsl_kernels
  timeout 50 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -16 | tee -a "$log"
  ncu_times 90 ncu-gemv tools/probes/decode_kernels_ncu.py --only gemv --repeat 3
  timeout 80 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --prefill-off \
    --weights 4 --rounds 7 --also-decode MATVEC_ROWS \
    --output "$logs/h200-quantized-int4-float16-decode.json" 2>&1 | tail -2 | tee -a "$log"
  timeout 110 python3 -m benchmarks.decoder_block --dtypes float16 --tokens 512 --rounds 9 \
    --variants auto mlx-again --output "$logs/h200-decoder-block-float16.json" 2>&1 \
    | tee "$logs/decoder-block.log" | tail -3 | tee -a "$log"
  timeout $((budget - 15 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 --rounds 9 --variants auto mlx-again --residual-add \
    --output "$logs/h200-decoder-block-float16-residual-add.json" 2>&1 \
    | tee "$logs/decoder-block-residual-add.log" | tail -3 | tee -a "$log"
elif [ "$mode" = s29 ]; then
  # eager entry after the guard launch, array signatures and tracer-only custom vjps; the
  # fused int4 prefill warp-specialized; the decoder block
  gpu_tests 130 test_launch_memory test_op_replay test_cuda_launch test_dsl_kernels
  timeout 60 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -14 | tee -a "$log"
  timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 \
    --weights 4 --decode-off --also DEQUANTIZE_MLX_GEMM --rounds 5 \
    --output "$logs/h200-quantized-int4-float16-dense-mlx.json" 2>&1 | tail -2 | tee -a "$log"
  METILE_CUDA_WGMMA=ws timeout 90 python3 -m benchmarks.quantized --dtype float16 --bits 4 \
    --group-size 64 --weights 4 --decode-off --also WGMMA_GEMM_WS --rounds 3 \
    --output "$logs/h200-quantized-int4-float16-fused-ws.json" 2>&1 | tail -2 | tee -a "$log"
  timeout $((budget - 20 - (SECONDS - t0))) python3 -m benchmarks.decoder_block --dtypes float16 \
    --tokens 512 2048 --variants auto --output "$logs/h200-decoder-block-float16.json" 2>&1 \
    | tee "$logs/decoder-block.log" | tail -8 | tee -a "$log"
elif [ "$mode" = s28 ]; then
  # replays without a custom vjp outside transforms, kept launches without their arrays
  # (C++ and dispatch), the eager cost after them; the int4 GEMV one output a warp
  gpu_tests 150 test_launch_memory test_op_replay test_cuda_launch
  (cd /tmp && timeout 100 python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_quantized_op.py" \
     -k "every_decode_candidate" 2>&1 | tail -2 | tee -a "$log")
  timeout 60 python3 tools/probes/launch_cost.py "$logs/h200-launch-cost.json" 2>&1 | tail -14 | tee -a "$log"
  timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/probes/decode_kernels_ncu.py --only gemv --repeat 3 > "$logs/ncu-gemv.csv" 2>> "$log"
  python3 tools/probes/decode_kernels_ncu.py --summarize "$logs/ncu-gemv.csv" 2>&1 | tee -a "$log"
  timeout 90 python3 tools/probes/quantized_parts.py --decode-only --rounds 5 2>&1 | tail -3 | tee -a "$log"
  timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section LaunchStats -k "regex:matvec_runs|matvec_warps|qmv" --launch-count 4 \
    python3 tools/probes/decode_kernels_ncu.py --only gemv --repeat 1 > "$logs/ncu-gemv-sections.txt" 2>&1
  grep -E "matvec|qmv|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue|Registers" \
    "$logs/ncu-gemv-sections.txt" | head -80 | tee -a "$log"
elif [ "$mode" = s27 ]; then
  # warpgroup tiles by waves: the 128x192 tile's GPU tests, the tiles timed, int4 prefill cold
  gpu_tests 150 test_gemm_wgmma
  timeout 200 python3 tools/probes/wave_tiles.py "$logs/h200-wave-tiles.json" 2>&1 | tail -8 | tee -a "$log"
  timeout 120 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --rounds 5 --output "$logs/h200-quantized-int4-float16-prefill.json" 2>&1 | tail -3 | tee -a "$log"
elif [ "$mode" = s26 ]; then
  # the fused int4 prefill with each group's word, scale and bias loaded once: timed beside
  # dequantize+gemm and MLX (validated against MLX first), then one ragged GPU test
  timeout 100 python3 -m benchmarks.quantized --dtype float16 --bits 4 --group-size 64 --weights 4 \
    --decode-off --also WGMMA_GEMM --rounds 5 \
    --output "$logs/h200-quantized-int4-float16-fused-groups.json" 2>&1 | tail -3 | tee -a "$log"
  (cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_quantized_op.py" \
     -k "fused_warpgroup and 200-300 and float16" 2>&1 | tail -2 | tee -a "$log")
  # the replay's native_launch<CudaLaunch> binding since the review refactor
  gpu_tests $((budget - 20 - (SECONDS - t0))) test_op_replay test_quantized_op
else
  echo "unknown mode $mode (tests, ops17, block, s7, s8, s9, s11, s12, s13, s14, s15, s16, s17, s18, s19, s20, s21, s22, s23, s24, s25, s26, s27, s28, s29, s30, s31, s32, s33, s34, s35, s36, s37)" | tee -a "$log"
fi
cp "$log" "$logs/"
tar -czf "$out/logs-$mode.tar.gz" -C "$logs" .
echo "total: $((SECONDS-t0)) s" | tee -a "$log"
