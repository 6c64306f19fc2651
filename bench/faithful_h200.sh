#!/usr/bin/env bash
# Issue #37's GPU runs: faithful defaults (the long-sequence fidelity gate) and their speed, in
# one call. From the repository root on the H200 machine, with the fa3-fwd wheel in .whl/
# (optional), the gate's set in .gpu_data/long/ (stream_D.json + .safetensors) and its frames in
# .gpu_data/loop/. Writes to $OUT. Steps run in order while BUDGET_S (default 560) seconds
# remain, each under its own timeout.
#   STAGE=speed: the GPU tests of the attention paths, the FP8 kernel table
#     (attention_kernels.py --fp8: bf16, FP8 widened, FP8 with the queries in two e4m3 terms,
#     one term, FA3), then `bench model --compile` (504x378, 200 frames, pose path) for each
#     combination in SPEED_COMBOS (default: the defaults, then the others of the table).
#   STAGE=gate: the attention GPU tests and the gate's GPU test, the FP8 kernel table, `lingbot_map_bench fidelity`
#     over the defaults (compiled) and the table's other combinations (whole-frame graphs), then
#     `bench model` pose and depth at the defaults, bf16 K/V through fa3, and one and two
#     cameras: the fidelity table and the speed side by side. Logs in logs.tgz.
#   STAGE=sweep: golden sets A and B through the robot path at the defaults, the tile sweep of
#     the faithful FP8 kernel (bench/faithful_sweep.py), then, with its fastest config as the
#     kernel config, the gate over the compiled defaults and `bench model` pose and depth.
#     Golden sets in .gpu_data/golden/.
#   STAGE=model: `bench model` at the defaults only: pose, depth, one and two cameras.
#   STAGE=verify: a tree's check before it lands: the GPU tests (GPU_TESTS, default: the
#     attention, kernel-config, batch, gate, loop and map files), `bench model` pose and depth
#     at the defaults, golden set A through the robot path (compiled); every log in one logs.tgz.
set -uo pipefail
out="${OUT:-bench/results/raw}"
stage="${STAGE:-gate}"
budget="${BUDGET_S:-560}"
. bench/h200_setup.sh
bench="python3 -m lingbot_map_ros.tools.bench model --weights /tmp/bench_weights.safetensors \
--compile --camera-head-dtype bfloat16 --frames 200"
combo() {  # combo NAME: the bench model flags of a named combination
  case "$1" in
    defaults) echo "--backend auto --kv-dtype float8_e4m3fn" ;;
    triton_bf16) echo "--backend triton --kv-dtype bfloat16" ;;
    fa3_bf16) echo "--backend fa3 --kv-dtype bfloat16" ;;
    triton_fp8_fast) echo "--backend triton --kv-dtype float8_e4m3fn --precision fast_approximate" ;;
    fa3_fp8_fast) echo "--backend fa3 --kv-dtype float8_e4m3fn --precision fast_approximate" ;;
  esac
}
if [ "$stage" = speed ]; then
  step gpu_tests 120 python3 -m pytest -q -p no:cacheprovider test/engine/test_triton_attention.py \
    test/engine/test_backend_choice.py test/engine/test_fa3_fp8.py test/bench/test_triton_fp8.py
  step attention_kernels 100 python3 bench/attention_kernels.py --fp8
  for c in ${SPEED_COMBOS:-defaults fa3_bf16 triton_bf16 fa3_fp8_fast}; do
    step "model_${c}_pose" 100 $bench $(combo "$c")
  done
  step model_defaults_depth 100 $bench $(combo defaults) --depth
elif [ "$stage" = gate ]; then
  # The GPU tests of the attention paths and the gate's own GPU test (the defaults on the set).
  step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider test/engine/test_triton_attention.py \
    test/engine/test_backend_choice.py test/tools/test_fidelity_gate.py
  step attention_kernels 80 python3 bench/attention_kernels.py --fp8
  # The defaults as the robot runs them (compiled), then each other combination of the table
  # through the whole-frame graphs without torch.compile (compiling each costs ~35 s).
  wf="stream.fast_path=whole_frame,stream.compile=false"
  step fidelity 260 python3 -m lingbot_map_ros.tools.bench fidelity --set .gpu_data/long/stream_D \
    --frames-dir .gpu_data/loop --json-out "$out/fidelity.json" \
    --weights-cache /tmp/golden_D.safetensors --combos default \
    "cache.backend=triton,cache.dtype=float8_e4m3fn,cache.precision=fast_approximate,$wf" \
    "cache.backend=fa3,cache.dtype=float8_e4m3fn,cache.precision=fast_approximate,$wf" \
    "cache.backend=fa3,cache.dtype=bfloat16,$wf" "cache.backend=triton,cache.dtype=bfloat16,$wf" \
    "cache.backend=sdpa,cache.dtype=float8_e4m3fn,$wf" \
    "cache.backend=triton,cache.dtype=float8_e4m3fn,$wf"
  step model_defaults_pose 80 $bench $(combo defaults)
  step model_defaults_depth 80 $bench $(combo defaults) --depth
  step model_fa3_bf16_pose 70 $bench $(combo fa3_bf16)
  step model_defaults_cameras1 70 $bench $(combo defaults) --cameras 1
  step model_defaults_cameras2 80 $bench $(combo defaults) --cameras 2
  tar czf "$out/logs.tgz" -C "$out" $(cd "$out" && ls *.txt) 2>/dev/null
elif [ "$stage" = sweep ]; then
  robot="--device cuda --dtype bfloat16 --backend auto --kv-dtype float8_e4m3fn \
--fast-path whole_frame --compile --camera-head-dtype bfloat16"
  step golden_A_defaults 70 python3 -m lingbot_map_ros.tools.golden .gpu_data/golden/stream_A $robot
  step golden_B_defaults 50 python3 -m lingbot_map_ros.tools.golden .gpu_data/golden/stream_B $robot
  step faithful_sweep 170 python3 bench/faithful_sweep.py --budget-s ${SWEEP_S:-140}
  # The sweep's best as cache.kernel fields (bench/kernel_json.py): --kernel for bench model,
  # a combination of cache.kernel.* keys for the fidelity gate.
  kernel='{}'; best_combo=''
  if [ -s "$out/faithful_best.json" ]; then
    kernel="$(python3 bench/kernel_json.py triton "$out/faithful_best.json")"
    best_combo="$(python3 bench/kernel_json.py triton "$out/faithful_best.json" --combo)"
    echo "kernel config: $kernel"
  fi
  step fidelity_best 150 python3 -m lingbot_map_ros.tools.bench fidelity --set .gpu_data/long/stream_D \
    --frames-dir .gpu_data/loop --json-out "$out/fidelity_best.json" \
    --weights-cache /tmp/golden_D.safetensors --combos "${best_combo:-default}"
  step model_best_pose 80 $bench $(combo defaults) --kernel "$kernel"
  step model_best_depth 80 $bench $(combo defaults) --depth --kernel "$kernel"
elif [ "$stage" = verify ]; then
  robot="--device cuda --dtype bfloat16 --backend auto --kv-dtype float8_e4m3fn \
--fast-path whole_frame --compile --camera-head-dtype bfloat16"
  tests="${GPU_TESTS:-$(ls test/engine/test_triton_attention.py test/engine/test_backend_choice.py \
test/engine/test_kernel_config.py test/engine/test_lanes.py test/engine/test_whole_batch.py \
test/engine/test_staged_runs.py test/tools/test_fidelity_gate.py test/engine/test_anchored_map.py \
test/engine/loop/test_verify_pacing.py test/engine/test_model_verifier.py \
test/engine/test_attention_conformance.py test/engine/test_frame_graphs.py \
test/engine/test_profiling.py test/engine/test_camera_batch.py test/engine/test_place_descriptor.py \
test/engine/test_fp8_cache.py 2>/dev/null)}"
  # The gate's own GPU test (test_fidelity_gate.py) runs the defaults over the long set.
  step gpu_tests 230 python3 -m pytest -q -m gpu -p no:cacheprovider -rs $tests
  step model_defaults_pose 70 $bench $(combo defaults)
  step model_defaults_depth 70 $bench $(combo defaults) --depth
  step golden_A_defaults 170 python3 -m lingbot_map_ros.tools.golden .gpu_data/golden/stream_A $robot
  tar czf "$out/logs.tgz" -C "$out" $(cd "$out" && ls *.txt *.json 2>/dev/null) && \
    (cd "$out" && rm -f *.txt *.json)
elif [ "$stage" = model ]; then
  step model_defaults_pose 80 $bench $(combo defaults)
  step model_defaults_depth 80 $bench $(combo defaults) --depth
  step model_defaults_cameras1 70 $bench $(combo defaults) --cameras 1
  step model_defaults_cameras2 80 $bench $(combo defaults) --cameras 2
fi
ls -la "$out"
