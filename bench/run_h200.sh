#!/usr/bin/env bash
# The GPU runs behind bench/results/. Run from the repository root on a CUDA machine with
# FlashInfer installed (../shared/tools/gpu-wheels.sh fetches the wheels into .whl/) and golden
# set A copied to .gpu_data/. Writes to $OUT (default bench/results/raw).
#   STAGE=main (default): GPU tests, golden set A in bf16 through the fast path (CUDA graphs +
#     torch.compile) with SDPA and FlashInfer, `bench model` at upstream's profiling shape
#     (504x378, N_s=8, W=64, bf16): pose and depth with per-part timings, FlashInfer, the
#     uncompiled graphs, and a profile.
#   STAGE=sdpa: the main stage's GPU tests, golden set A and benchmarks of the robot
#     configuration (SDPA, compiled, whole-frame graphs) only: no FlashInfer, no uncompiled run.
#   STAGE=check: the CUDA-graph/compile GPU tests and golden set A (SDPA, compiled) only.
#   STAGE=fp8: bench/fp8_attention.py (cuDNN FP8 attention at our shape: speed and error).
#   STAGE=long: 10,000 frames at K=10 (compiled, pose path), progress every 100 frames.
#   STAGE=issue13: GPU speed and memory (docs/gpu_memory.md): the attention kernel candidates
#     (bench/attention_kernels.py), the Triton/FP8 tests, golden set A with an FP8 KV cache,
#     `bench model` (SDPA, compiled) at the default config (pose, depth) and with
#     config/small_gpu.yaml's cache (W 24, FP8, 330 keyframes), the memory of each phase with
#     FP8 KV and 330 keyframes (`bench memory`), then h200_summary.json. At most
#     ~9.5 min (each step has a timeout), typically ~7.
#   STAGE=long20k: issue #24's run: 20,000 frames at K=1 through rollovers at the defaults (FP8
#     K/V, `auto` backend, compiled, pose path, progress every 100 frames), started with setsid so it outlives one 10-minute call; the
#     call returns after LONG_WAIT_S (default 585) with the log so far. STAGE=collect, called
#     while the machine is still warm, waits for the run to end and returns the whole log and
#     rollover_20k.json: the run's rollover keys (issue #24: rollover_over_median,
#     max_streaming_over_median, flatness_steady, prepare_*, peak memory with and without
#     rollovers) for bench/results/h200_summary.json.
#   STAGE=rollover: issue #24's short check: ROLLOVER_FRAMES (default 1100) frames at K=1 with
#     the next session prepared ahead (3 rollovers at 320 keyframes), progress every 100
#     frames; ROLLOVER_COMPILE=0 skips torch.compile (a shorter warm-up). ~2 min.
#   STAGE=final: one call that checks a release on the H200: every GPU test, golden set A in
#     bf16 through the robot path, `bench model` pose and depth with per-part timings, the map
#     accumulator at 504x378 (`bench map`), and the Triton kernel against the others (--quick).
#   STAGE=round6: the merged code of round 6 at its defaults (FP8 K/V, `auto` -> triton, the
#     rollover prepared ahead), ~9 min: GPU tests beside the memory-only runs (`bench memory
#     --depth` at 504x378 and 518x392, small_gpu.yaml) and golden set A (bf16 K/V and FP8 K/V,
#     robot path); then alone `bench model --compile --kv-dtype float8_e4m3fn` over
#     ROUND6_FRAMES (default 3000: ~9 rollovers) with per-block peaks, with depth (200 frames),
#     and `bench model --cameras N` for N = 1..4. Logs in round6_logs.tar.gz.
#   STAGE=round7: the GPU tests; issue #24's rollover check at the defaults (FP8 K/V, compiled,
#     ROUND7_FRAMES frames, default 1100: 3 prepared rollovers); `bench model --cameras N`
#     (N = 1, 2, 3; 200 frames each) for issue #19's batch gain. Logs in $OUT/round7/. ~6 min.
#   STAGE=round8: issue #24's units launched during the frames: the prepared-rollover GPU tests,
#     bench/prepare_units.py (each unit's time and memory) and the ROUND8_FRAMES (1100) check
#     at the defaults. Logs in $OUT/round8/. ~5 min.
#   STAGE=cams_profile: issue #19: `bench model --cameras N --profile` for N = 1 and 2 (compiled,
#     FP8 K/V): ten frames' kernels under torch.profiler each, one camera against a batch of two.
#   STAGE=dtypes: `bench model --compile` pose and depth (200 frames) with bf16 K/V, then FP8
#     K/V, one run at a time on one tree: the default KV dtype's measurement. ~5 min.
#   STAGE=kernels: bench/attention_kernels.py alone (e.g. with flash-attn-4 carried in .fa4/).
#   STAGE=round5: the merged code of round 5 at its defaults: GPU tests and three memory-only
#     `bench memory` runs side by side (defaults with depth, bf16 and FP8 KV; small_gpu.yaml with
#     depth), then golden set A (bf16, robot path) and `bench model` pose and depth. ~7 min.
#   STAGE=memory: issue #25 (docs/gpu_memory.md), ~4 min: the Triton/FP8 tests; three
#     memory-only `bench memory` runs side by side (defaults + Triton FP8 KV at 518x392, the
#     small-GPU file with W 24 and W 16; their times are not reported); then alone, for speed:
#     bench/attention_kernels.py --quick and `bench memory` at 504x378 with the depth head and
#     without, for Triton + FP8 KV and for SDPA + bf16 KV. Logs in one tarball,
#     memory_logs.tar.gz, and every run's JSON line on stdout.
#   STAGE=memory_fp8: the second call of issue #25, ~1.5 min (see the stage below).
#   STAGE=fp8kv: issues #21/#25, FP8 K/V at bf16 speed: the FP8 kernel table
#     (bench/attention_kernels.py --fp8: our Triton kernel bf16/FP8, FA3 as backend fa3 runs
#     it where fa3-fwd is in .whl/), golden set A with FP8 K/V (backend FP8KV_BACKEND, default
#     auto), `bench memory --depth` with FP8 K/V at 504 and 518 width, `bench model --compile`
#     with FP8 K/V pose and depth and with bf16 K/V (+ fa3 in bf16 if time is left). ~4 min.
#     FP8KV_QUICK=1: the kernel table and golden set A only (~2 min).
#   STAGE=faithful: issue #37, faithful by default: bench/faithful_h200.sh's gate stage (the
#     attention GPU tests, `lingbot_map_bench fidelity` on .gpu_data/long/stream_D, then `bench
#     model` at the defaults beside it). ~9 min.
#   STAGE=loop: issue #33's loop-closure cost, paced (docs/loop_closure.md): the verifier's
#     GPU tests, then `lingbot_map_bench loop --checks 10` (official size, random weights,
#     504x378, the defaults) at the config's loop.verify_unit_interval (its JSON also holds the
#     back-to-back N = 1 phase), the same with the depth head, and at N = 3; then the pose
#     graph on the CPU, `lingbot_map_bench graph --keyframes 1000 10000` (bench_graph.txt;
#     needs gtsam and faiss-cpu wheels in .whl_loop/, docs/loop_closure.md). Logs and
#     bench_loop.json (each run's JSON line) in $OUT/loop/ (OUT=bench/results/h200_round12).
#     About 6 minutes.
#   STAGE=issue13b: the `triton` cache backend: golden set A (bf16 KV and FP8 KV) and `bench
#     model` (pose; depth with FP8 KV and 330 keyframes). About 4 minutes.
set -uo pipefail
out="${OUT:-bench/results/raw}"
stage="${STAGE:-main}"
# Issue #37's gate: the attention GPU tests, the long-sequence fidelity table and the speed at
# the defaults in one call (bench/faithful_h200.sh, its own set-up).
[ "$stage" = faithful ] && exec env STAGE=gate bash bench/faithful_h200.sh
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
fi
# flash-attn-4 and its CuTe DSL, carried as an xz tarball of an installed tree (its wheels are
# over the per-call limit; docs/gpu_memory.md): appended to the path, so that the machine's
# own packages win where both have one. The repository root is always on the path.
case ":${PYTHONPATH:-}:" in *":$PWD:"*) ;; *) export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}";; esac
# bench/fa4_bundle.sh splits it in two parts (.aa, .ab), carried in two calls.
if [ -f .fa4/fa4site.tar.xz.aa ] && [ -f .fa4/fa4site.tar.xz.ab ]; then
  mkdir -p /tmp/fa4 && cat .fa4/fa4site.tar.xz.* | tar -xJf - -C /tmp/fa4 || exit 1
  export PYTHONPATH="$PYTHONPATH:/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages"
fi
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__)"
} > "$out/env.txt" 2>&1
# Random (golden-formula) weights written once, so each benchmark only loads them.
make_weights() { python3 bench/bench_weights.py; }
# STAGE=fp8kv and STAGE=round6 make them later, beside other work.
[ "$stage" = kernels ] || [ "$stage" = fp8kv ] || [ "$stage" = round6 ] || [ "$stage" = round7 ] \
  || make_weights
bench="python3 -m lingbot_map_ros.tools.bench model --weights /tmp/bench_weights.safetensors"
# The rollover figures of a `bench model` log's JSON line (issue #24), as one JSON object.
rollover_keys() {
  python3 - "$1" <<'PY'
import json, sys
from lingbot_map_ros.tools.bench_rollover import HEADLINE_KEYS
doc = next((json.loads(line) for line in reversed(open(sys.argv[1]).read().splitlines())
            if line.startswith('{')), {})
out = {k: doc.get(k) for k in HEADLINE_KEYS + ('peak_gpu_memory_gib', 'ms_p50', 'frames')}
long_run = doc.get('long_run') or {}
out.update({k: v for k, v in long_run.items() if k not in out and k != 'block_ms'})
out['rollover'] = doc.get('rollover')
print(json.dumps(out))
PY
}
golden="python3 -m lingbot_map_ros.tools.golden .gpu_data/stream_A.safetensors --device cuda"
if [ "$stage" = check ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/engine/test_staged_frames.py \
    test/engine/test_frame_graphs.py > "$out/gpu_tests_check.txt" 2>&1
  $golden --dtype bfloat16 --backend sdpa --fast-path whole_frame --compile > "$out/golden_A_check.txt" 2>&1
elif [ "$stage" = long ]; then
  timeout "${LONG_RUN_S:-560}" $bench --backend sdpa --compile --frames 10000 \
    --keyframe-interval 10 --progress 100 > "$out/model_sdpa_compile_10k.txt" 2>&1
elif [ "$stage" = long20k ] || [ "$stage" = collect ]; then
  log=/tmp/model_default_20k.txt
  if [ "$stage" = long20k ]; then
    setsid nohup $bench --compile --kv-dtype float8_e4m3fn --frames 20000 --progress 100 \
      > "$log" 2>&1 &
    echo $! > /tmp/long20k.pid
  fi
  end=$((SECONDS + ${LONG_WAIT_S:-585}))
  while [ $SECONDS -lt $end ] && kill -0 "$(cat /tmp/long20k.pid)" 2>/dev/null; do sleep 5; done
  cp "$log" "$out/"
  rollover_keys "$log" > "$out/rollover_20k.json"
elif [ "$stage" = rollover ]; then
  log="$out/model_sdpa_rollover_${ROLLOVER_FRAMES:-1100}.txt"
  compile=--compile; [ "${ROLLOVER_COMPILE:-1}" = 0 ] && compile=
  timeout "${ROLLOVER_RUN_S:-400}" $bench --backend sdpa $compile \
    --frames "${ROLLOVER_FRAMES:-1100}" --progress 100 > "$log" 2>&1
  rollover_keys "$log" | tee "$out/rollover.json"
elif [ "$stage" = final ]; then
  # BENCH_ONLY=1: the three benchmarks alone (after a fix that touched only them).
  if [ -z "${BENCH_ONLY:-}" ]; then
    timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider test/engine \
      > "$out/gpu_tests.txt" 2>&1
    timeout 90 $golden --dtype bfloat16 --backend sdpa --fast-path whole_frame --compile \
      > "$out/golden_A_cuda.txt" 2>&1
  fi
  timeout 85 $bench --backend sdpa --compile --components 30 > "$out/model_sdpa_compile_pose.txt" 2>&1
  timeout 85 $bench --backend sdpa --compile --depth --components 30 \
    > "$out/model_sdpa_compile_depth.txt" 2>&1
  timeout 40 python3 -m lingbot_map_ros.tools.bench map --device cuda --width 504 --height 378 \
    > "$out/map_h200.txt" 2>&1
  [ -n "${BENCH_ONLY:-}" ] || \
    timeout 100 python3 bench/attention_kernels.py --quick > "$out/attention_kernels.txt" 2>&1
elif [ "$stage" = issue13 ]; then
  timeout 120 python3 bench/attention_kernels.py > "$out/attention_kernels.txt" 2>&1
  timeout 45 python3 -m pytest -q -p no:cacheprovider test/engine/test_triton_attention.py \
    test/engine/test_fp8_cache.py > "$out/gpu_tests_issue13.txt" 2>&1
  timeout 80 $golden --dtype bfloat16 --backend sdpa --fast-path whole_frame --compile \
    --kv-dtype float8_e4m3fn > "$out/golden_A_fp8_kv.txt" 2>&1
  timeout 70 $bench --backend sdpa --compile > "$out/model_default_pose.txt" 2>&1
  timeout 70 $bench --backend sdpa --compile --depth > "$out/model_default_depth.txt" 2>&1
  timeout 70 $bench --backend sdpa --compile --depth --kv-dtype float8_e4m3fn \
    --max-total-frames 330 --window 24 > "$out/model_small_gpu_depth.txt" 2>&1
  timeout 70 python3 -m lingbot_map_ros.tools.bench memory --depth \
    --set cache.dtype=float8_e4m3fn --set cache.max_total_frames=330 \
    --weights /tmp/bench_weights.safetensors > "$out/memory_fp8_depth.txt" 2>&1
  python3 bench/h200_summary.py "$out" > "$out/summary.txt" 2>&1
elif [ "$stage" = issue13b ]; then
  # The Triton backend end to end, with the cache.kernel JSON in KERNEL, else the best of
  # STAGE=issue13's attention_kernels.json if it is in $out (bench/kernel_json.py), else the
  # defaults.
  best=$(python3 -c "import json; print(json.dumps(json.load(open('$out/attention_kernels.json'))\
['triton_best'] or {}))" 2>/dev/null || echo '{}')
  kernel="${KERNEL:-$(python3 bench/kernel_json.py triton "$best")}"
  timeout 80 $golden --dtype bfloat16 --backend triton --fast-path whole_frame --compile \
    --kernel "$kernel" > "$out/golden_A_triton.txt" 2>&1
  timeout 80 $golden --dtype bfloat16 --backend triton --fast-path whole_frame --compile \
    --kv-dtype float8_e4m3fn --kernel "$kernel" > "$out/golden_A_triton_fp8_kv.txt" 2>&1
  timeout 70 $bench --backend triton --compile --kernel "$kernel" \
    > "$out/model_triton_pose.txt" 2>&1
  timeout 70 $bench --backend triton --compile --depth --kv-dtype float8_e4m3fn \
    --max-total-frames 330 --kernel "$kernel" > "$out/model_triton_fp8_depth.txt" 2>&1
elif [ "$stage" = round5 ]; then
  # The merged round-5 code at its defaults (cache.backend auto, camera head bf16, the engine's
  # page pool): GPU tests beside three memory-only `bench memory` runs (their times are not
  # used), then alone golden set A in bf16 through the robot path and `bench model` pose and
  # depth. Logs in round5_logs.tar.gz; the key lines on stdout.
  logs=/tmp/r5 && mkdir -p $logs
  mem="python3 -m lingbot_map_ros.tools.bench memory --weights /tmp/bench_weights.safetensors"
  timeout 160 python3 -m pytest -q -m gpu -p no:cacheprovider test/engine \
    > $logs/gpu_tests.txt 2>&1 &
  timeout 150 $mem --depth > $logs/memory_default_depth.txt 2>&1 &
  timeout 150 $mem --depth --set cache.dtype=float8_e4m3fn > $logs/memory_fp8_depth.txt 2>&1 &
  timeout 150 $mem --config small_gpu.yaml --depth > $logs/memory_small_gpu_depth.txt 2>&1 &
  wait
  timeout 90 $golden --dtype bfloat16 --backend auto --fast-path whole_frame --compile \
    > $logs/golden_A_cuda.txt 2>&1
  timeout 80 $bench --compile > $logs/model_pose.txt 2>&1
  timeout 80 $bench --compile --depth > $logs/model_depth.txt 2>&1
  tar czf "$out/round5_logs.tar.gz" -C $logs .
  tail -n 3 $logs/gpu_tests.txt $logs/golden_A_cuda.txt
  for f in $logs/memory_*.txt $logs/model_*.txt; do echo "== $f"; tail -n 1 "$f" | cut -c1-1500; done
elif [ "$stage" = memory ]; then
  # MEMORY_BUDGET_S: no new speed run starts after that many seconds of this script.
  logs=/tmp/memlogs && mkdir -p $logs
  pack() { tar czf "$out/memory_logs.tar.gz" -C $logs .; }
  mem="python3 -m lingbot_map_ros.tools.bench memory --weights /tmp/bench_weights.safetensors"
  fp8="--set cache.backend=triton --set cache.dtype=float8_e4m3fn"
  timeout 100 python3 -m pytest -q -p no:cacheprovider test/engine/test_triton_attention.py \
    test/engine/test_fp8_cache.py > $logs/gpu_tests_memory.txt 2>&1 &
  timeout 150 $mem --depth $fp8 --width 518 --height 392 > $logs/memory_fp8_triton_518_depth.txt 2>&1 &
  timeout 150 $mem --config small_gpu.yaml --depth --set cache.backend=triton \
    > $logs/memory_small_w24_depth.txt 2>&1 &
  timeout 150 $mem --config small_gpu.yaml --depth --set cache.backend=triton \
    --set cache.sliding_window=16 > $logs/memory_small_w16_depth.txt 2>&1 &
  wait; pack
  timeout 50 python3 bench/attention_kernels.py --quick > $logs/attention_kernels.txt 2>&1
  cp "$out/attention_kernels.json" $logs/ 2>/dev/null; pack
  for run in "fp8_triton_depth --depth $fp8" "fp8_triton_pose --no-depth $fp8" \
      "bf16_sdpa_depth --depth --set cache.backend=sdpa --set cache.dtype=bfloat16" \
      "bf16_sdpa_pose --no-depth --set cache.backend=sdpa --set cache.dtype=bfloat16"; do
    [ $SECONDS -lt "${MEMORY_BUDGET_S:-250}" ] || break
    set -- $run; name=$1; shift
    timeout 70 $mem "$@" > $logs/memory_$name.txt 2>&1; pack
  done
  for f in $logs/*.txt; do echo "== $f"; tail -n 1 "$f" | cut -c1-1200; done
elif [ "$stage" = memory_fp8 ]; then
  # After the first memory call's FP8 compile error: the Triton/FP8 tests, `bench memory` with
  # Triton + FP8 KV at the defaults with the depth head (alone, for speed), the small-GPU file
  # with depth (started 15 s later: its compilation overlaps, its timed frames come after),
  # then the kernel at the best config in bf16 and FP8 while time is left.
  timeout 60 python3 -m pytest -q -p no:cacheprovider test/engine/test_triton_attention.py \
    > "$out/gpu_tests_fp8.txt" 2>&1 &
  mem="python3 -m lingbot_map_ros.tools.bench memory --weights /tmp/bench_weights.safetensors"
  (sleep 15; timeout 70 $mem --config small_gpu.yaml --depth --set cache.backend=triton \
    --steady 20 > "$out/memory_small_triton_depth.txt" 2>&1) &
  timeout 70 $mem --depth --set cache.backend=triton --set cache.dtype=float8_e4m3fn \
    --steady 20 > "$out/memory_fp8_triton_depth.txt" 2>&1
  wait
  [ $SECONDS -ge "${MEMORY_BUDGET_S:-60}" ] || timeout 20 python3 bench/attention_kernels.py \
    --checks 1 --rotate 2 --configs '[{"block_m": 128, "block_n": 64, "num_warps": 4,
    "num_stages": 3, "splits": 2}, {"block_m": 128, "block_n": 128, "num_warps": 8,
    "num_stages": 3, "splits": 2}]' > "$out/attention_kernels_fp8.txt" 2>&1
elif [ "$stage" = fp8kv ]; then
  # FP8 K/V (`auto` -> triton; FP8KV_BACKEND=fa3 for FlashAttention-3) against bf16 K/V. The FA3
  # rows and the fa3 bf16 run need the fa3-fwd wheel in .whl/ (bench/results/README.md says how
  # to fetch it). ~4 min; FP8KV_BUDGET_S (default 300): the optional run starts only before.
  logs=/tmp/fp8kv && mkdir -p $logs
  pack() { tar czf "$out/fp8kv_logs.tar.gz" -C $logs .; }
  mem="python3 -m lingbot_map_ros.tools.bench memory --weights /tmp/bench_weights.safetensors"
  [ -n "${FP8KV_QUICK:-}" ] || make_weights > $logs/weights.txt 2>&1 &
  wpid=$!
  # 1. Kernels alone on the GPU (the weights are made on the CPU meanwhile).
  timeout 100 python3 bench/attention_kernels.py --fp8 > $logs/attention_kernels.txt 2>&1
  cp "$out/attention_kernels.json" $logs/ 2>/dev/null; pack
  # 2. Timings not used: golden set A (FP8 K/V through FP8KV_BACKEND, default auto, robot
  # path), the GPU tests of the FP8 path, and the peak memory with depth (rollover included)
  # at 504x378 and 518x392. FP8KV_QUICK=1: the kernel table and golden set A only.
  timeout 150 $golden --dtype bfloat16 --backend "${FP8KV_BACKEND:-auto}" --fast-path \
    whole_frame --compile --kv-dtype float8_e4m3fn > $logs/golden_A_fp8.txt 2>&1 &
  timeout 100 python3 -m pytest -q -p no:cacheprovider test/engine/test_fa3_fp8.py \
    test/engine/test_triton_attention.py > $logs/gpu_tests_fp8kv.txt 2>&1 &
  [ -z "${FP8KV_QUICK:-}" ] || { wait; pack; tail -n 14 $logs/attention_kernels.txt | \
    cut -c1-170; tail -n 3 $logs/gpu_tests_fp8kv.txt; tail -n 1 $logs/golden_A_fp8.txt | \
    cut -c1-1600; exit 0; }
  wait $wpid
  timeout 150 $mem --depth --set cache.dtype=float8_e4m3fn > $logs/memory_fp8_depth.txt 2>&1 &
  timeout 150 $mem --depth --set cache.dtype=float8_e4m3fn --width 518 --height 392 \
    > $logs/memory_fp8_518_depth.txt 2>&1 &
  wait; pack
  # 3. Speed, one run at a time: FP8 K/V (auto) pose and depth, then bf16 K/V.
  timeout 90 $bench --compile --kv-dtype float8_e4m3fn > $logs/model_fp8_pose.txt 2>&1; pack
  timeout 90 $bench --compile --kv-dtype float8_e4m3fn --depth > $logs/model_fp8_depth.txt 2>&1
  pack
  timeout 90 $bench --compile --kv-dtype bfloat16 > $logs/model_bf16_pose.txt 2>&1; pack
  [ $SECONDS -ge "${FP8KV_BUDGET_S:-300}" ] || ! python3 -c 'import fa3_fwd_interface' || \
    timeout 90 $bench --compile --kv-dtype bfloat16 --backend fa3 \
      > $logs/model_fa3_bf16_pose.txt 2>&1
  pack
  tail -n 28 $logs/attention_kernels.txt | cut -c1-170
  tail -n 4 $logs/gpu_tests_fp8kv.txt $logs/weights.txt
  for f in $logs/golden_*.txt $logs/memory_*.txt $logs/model_*.txt; do
    echo "== $f"; tail -n 1 "$f" | cut -c1-1600; done
elif [ "$stage" = round6 ]; then
  logs=/tmp/r6 && mkdir -p $logs
  pack() { tar czf "$out/round6_logs.tar.gz" -C $logs .; }
  mem="python3 -m lingbot_map_ros.tools.bench memory --weights /tmp/bench_weights.safetensors"
  fp8="--kv-dtype float8_e4m3fn"
  # 1. Correctness and memory side by side (their times are not used).
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/engine \
    > $logs/gpu_tests.txt 2>&1 &
  tests=$!
  make_weights > $logs/weights.txt 2>&1
  timeout 150 $mem --depth > $logs/memory_default_depth.txt 2>&1 &
  timeout 150 $mem --depth --width 518 --height 392 > $logs/memory_default_518_depth.txt 2>&1 &
  timeout 150 $mem --config small_gpu.yaml --depth > $logs/memory_small_gpu_depth.txt 2>&1 &
  timeout 150 $golden --dtype bfloat16 --backend auto --fast-path whole_frame --compile \
    > $logs/golden_A_bf16.txt 2>&1 &
  timeout 150 $golden --dtype bfloat16 --backend auto --fast-path whole_frame --compile $fp8 \
    > $logs/golden_A_fp8.txt 2>&1 &
  wait; pack
  # 2. Speed, one run at a time.
  timeout 170 $bench --compile $fp8 --frames "${ROUND6_FRAMES:-3000}" --progress 100 \
    > $logs/model_pose_rollovers.txt 2>&1; pack
  rollover_keys $logs/model_pose_rollovers.txt > $logs/rollover.json 2>&1
  timeout 90 $bench --compile $fp8 --depth > $logs/model_depth.txt 2>&1; pack
  for n in 1 2 3 4; do
    timeout 60 $bench $fp8 --cameras $n --frames 60 --warmup 20 > $logs/model_cameras$n.txt 2>&1
  done
  pack
  tail -n 3 $logs/gpu_tests.txt
  for f in $logs/golden_*.txt $logs/memory_*.txt $logs/rollover.json $logs/model_*.txt; do
    echo "== $f"; tail -n 1 "$f" | cut -c1-1500; done
elif [ "$stage" = round7 ]; then
  logs="$out/round7" && mkdir -p "$logs"
  fp8="--kv-dtype float8_e4m3fn"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider test/engine \
    > "$logs/gpu_tests.txt" 2>&1 &
  make_weights > "$logs/weights.txt" 2>&1
  wait
  timeout 200 $bench --compile $fp8 --frames "${ROUND7_FRAMES:-1100}" --progress 100 \
    > "$logs/model_pose_rollovers.txt" 2>&1
  rollover_keys "$logs/model_pose_rollovers.txt" > "$logs/rollover.json" 2>&1
  for n in 1 2 3; do
    timeout 90 $bench $fp8 --cameras $n --frames 200 --warmup 20 > "$logs/model_cameras$n.txt" 2>&1
  done
  tail -n 3 "$logs/gpu_tests.txt"; cat "$logs/rollover.json"
  for f in "$logs"/model_cameras*.txt; do echo "== $f"; grep -E "^(aggregate|tick|batch|fallbacks|peak)" "$f"; done
elif [ "$stage" = round8 ]; then
  logs="$out/round8" && mkdir -p "$logs"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider test/engine/test_prepared_rollover.py \
    test/engine/test_staged_frames.py test/engine/test_whole_batch.py test/engine/test_lanes.py \
    > "$logs/gpu_tests.txt" 2>&1 &
  make_weights > "$logs/weights.txt" 2>&1
  wait
  timeout 90 python3 bench/prepare_units.py > "$logs/prepare_units.txt" 2>&1
  timeout 200 $bench --compile --kv-dtype float8_e4m3fn --frames "${ROUND8_FRAMES:-1100}" \
    --progress 100 > "$logs/model_pose_rollovers.txt" 2>&1
  rollover_keys "$logs/model_pose_rollovers.txt" > "$logs/rollover.json" 2>&1
  tail -n 3 "$logs/gpu_tests.txt"; tail -c 1500 "$logs/prepare_units.txt"; cat "$logs/rollover.json"
elif [ "$stage" = cams_profile ]; then
  for n in 1 2; do
    timeout 200 $bench --compile --kv-dtype float8_e4m3fn --cameras $n --frames 100 --warmup 20 \
      --profile $((10 / n)) > "$out/cams${n}_profile.txt" 2>&1
  done
  for n in 1 2; do grep -E "^(aggregate_fps|tick)" "$out/cams${n}_profile.txt"; done
elif [ "$stage" = dtypes ]; then
  for kv in bfloat16 float8_e4m3fn; do
    timeout 100 $bench --compile --kv-dtype $kv > "$out/model_${kv}_pose.txt" 2>&1
    timeout 100 $bench --compile --kv-dtype $kv --depth > "$out/model_${kv}_depth.txt" 2>&1
  done
  for f in "$out"/model_*.txt; do echo "== $f"; tail -n 1 "$f" | cut -c1-400; done
elif [ "$stage" = loop ]; then
  logs="$out/loop" && mkdir -p "$logs"
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider test/engine/test_model_verifier.py \
    test/engine/loop/test_verify_pacing.py > "$logs/loop_gpu_tests.txt" 2>&1
  loop="python3 -m lingbot_map_ros.tools.bench loop --checks 10"
  timeout 130 $loop > "$logs/bench_loop_pose.txt" 2>&1
  timeout 130 $loop --depth > "$logs/bench_loop_depth.txt" 2>&1
  timeout 130 $loop --verify-unit-interval 3 > "$logs/bench_loop_pose_n3.txt" 2>&1
  # The pose graph on the CPU (gtsam, faiss-cpu: not in the image, carried in .whl_loop/).
  if ls .whl_loop/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site_loop .whl_loop/*.whl > "$logs/graph_install.txt" 2>&1
  fi
  PYTHONPATH="/tmp/site_loop:$PYTHONPATH" timeout 240 python3 -m lingbot_map_ros.tools.bench \
    graph --keyframes 1000 10000 > "$logs/bench_graph.txt" 2>&1
  tail -n 1 "$logs/bench_graph.txt" | grep '^{' > "$logs/bench_graph.json"
  for f in pose depth pose_n3; do
    tail -n 1 "$logs/bench_loop_$f.txt" | grep '^{' | sed "s/^{/{\"run\": \"$f\", /"
  done > "$logs/bench_loop.json"
  tail -n 3 "$logs/loop_gpu_tests.txt"
  for f in "$logs"/bench_loop_*.txt "$logs/bench_graph.txt"; do
    echo "== $f"; grep -v '^{' "$f" | tail -n 8
  done
elif [ "$stage" = kernels ]; then
  timeout 300 python3 bench/attention_kernels.py > "$out/attention_kernels.txt" 2>&1
elif [ "$stage" = fp8 ]; then
  python3 bench/fp8_attention.py > "$out/fp8_attention.txt" 2>&1
else
  python3 -m pytest -q -m gpu -p no:cacheprovider test/engine/test_flashinfer_cache.py \
    test/engine/test_split_attention.py test/engine/test_staged_frames.py \
    test/engine/test_frame_graphs.py > "$out/gpu_tests.txt" 2>&1
  { $golden --dtype bfloat16 --backend sdpa --fast-path whole_frame --compile
    [ "$stage" = sdpa ] || $golden --dtype bfloat16 --backend flashinfer --fast-path whole_frame --compile
  } > "$out/golden_A_cuda.txt" 2>&1
  $bench --backend sdpa --compile --components 30 > "$out/model_sdpa_compile_pose.txt" 2>&1
  $bench --backend sdpa --compile --depth --components 30 \
    > "$out/model_sdpa_compile_depth.txt" 2>&1
  if [ "$stage" != sdpa ]; then
    $bench --backend flashinfer --compile > "$out/model_flashinfer_compile_pose.txt" 2>&1
    $bench --backend sdpa > "$out/model_sdpa_pose.txt" 2>&1
  fi
  $bench --backend sdpa --compile --frames 100 --profile 10 > "$out/profile_sdpa_compile.txt" 2>&1
fi
for f in "$out"/*.txt; do echo "== $f"; tail -n 3 "$f" | cut -c1-1500; done
if [ "$stage" = issue13 ] || [ "$stage" = kernels ]; then
  echo "== the kernel table and the summary"
  tail -n 24 "$out/attention_kernels.txt" | cut -c1-160
  if [ -f "$out/summary.txt" ]; then cat "$out/summary.txt"; fi
fi
