#!/usr/bin/env bash
# Issue #35's GPU proof of the one runner (one frame is a batch of one), from the repository
# root on the H200 machine, in as few calls as the device budget allows. Writes to $OUT.
# The tree before the change is a copy of the earlier commit's lingbot_map_ros/ in $BEFORE
# (default .gpu_data/before: `git archive <commit> lingbot_map_ros bench | tar x -C ...`).
#   STAGE=speed: `bench model` at the defaults (compiled, 504x378, 200 frames), before and
#     after in turns, in one call: the pose path, one camera and two cameras
#     (--cameras 1, 2); then golden set A through the robot path on the new tree.
#   STAGE=repeat: the FA3 GPU tests (fa3-fwd carried in .whl/), then the pairs again, after
#     first: pose twice, depth, two cameras.
#   STAGE=verify: the GPU tests of the runner and its users (GPU_TESTS), the depth path at the
#     defaults, and the long-sequence fidelity gate over the defaults (needs .gpu_data/long
#     and .gpu_data/loop).
set -uo pipefail
out="${OUT:-bench/results/raw}"
stage="${STAGE:-speed}"
budget="${BUDGET_S:-560}"
. bench/h200_setup.sh
after_path="$PYTHONPATH"
before_path="${PYTHONPATH%"$PWD"}$PWD/${BEFORE:-.gpu_data/before}"
args="--weights /tmp/bench_weights.safetensors --compile --camera-head-dtype bfloat16 \
--frames 200 --backend auto --kv-dtype float8_e4m3fn"
model() {  # model NAME TREE_PATH LIMIT FLAGS...: bench model on one tree
  local name=$1 path=$2 limit=$3; shift 3
  step "$name" "$limit" env PYTHONPATH="$path" python3 -m lingbot_map_ros.tools.bench model \
    $args "$@"
}
if [ "$stage" = speed ]; then
  for run in pose:"" cameras1:"--cameras 1" cameras2:"--cameras 2"; do
    name=${run%%:*}; flags=${run#*:}
    model "before_$name" "$before_path" 85 $flags
    model "after_$name" "$after_path" 85 $flags
  done
  robot="--device cuda --dtype bfloat16 --backend auto --kv-dtype float8_e4m3fn \
--fast-path whole_frame --compile --camera-head-dtype bfloat16"
  step golden_A_after 120 python3 -m lingbot_map_ros.tools.golden .gpu_data/golden/stream_A $robot
elif [ "$stage" = repeat ]; then
  # With fa3-fwd in .whl/: the FA3 GPU tests of the runner's paths, then the speed pairs again
  # in the other order (after first) to see the run-to-run spread, and the depth path.
  step gpu_tests_fa3 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
    test/engine/test_whole_batch.py test/engine/test_kernel_config.py \
    test/engine/test_attention_conformance.py
  for run in pose:"" depth:"--depth" pose2:"" cameras2:"--cameras 2"; do
    name=${run%%:*}; flags=${run#*:}
    model "after_$name" "$after_path" 85 $flags
    model "before_$name" "$before_path" 85 $flags
  done
elif [ "$stage" = verify ]; then
  tests="${GPU_TESTS:-$(ls test/engine/test_whole_batch.py test/engine/test_frame_graphs.py \
test/engine/test_lanes.py test/engine/test_fast_path.py test/engine/test_heads.py \
test/engine/test_kernel_config.py test/engine/test_staged_runs.py test/engine/test_staged_frames.py \
test/engine/test_camera_batch.py test/engine/test_profiling.py test/engine/test_model_verifier.py \
test/engine/test_prepared_rollover.py test/engine/test_attention_conformance.py \
test/engine/test_scale_phase_memory.py test/engine/loop/test_verify_pacing.py 2>/dev/null)}"
  # The gate itself runs as the fidelity step (its GPU test runs the same defaults).
  step gpu_tests 260 python3 -m pytest -q -m gpu -p no:cacheprovider -rs $tests
  model after_depth "$after_path" 85 --depth
  step fidelity 200 python3 -m lingbot_map_ros.tools.bench fidelity --set .gpu_data/long/stream_D \
    --frames-dir .gpu_data/loop --json-out "$out/fidelity.json" \
    --weights-cache /tmp/golden_D.safetensors --combos default
fi
tar czf "$out/logs.tgz" -C "$out" $(cd "$out" && ls *.txt *.json 2>/dev/null) && \
  (cd "$out" && rm -f *.txt *.json)
ls -la "$out"
