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
set -uo pipefail
out="${OUT:-bench/results/raw}"
stage="${STAGE:-main}"
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__)"
} > "$out/env.txt" 2>&1
# Random (golden-formula) weights written once, so each benchmark only loads them.
[ -f /tmp/bench_weights.safetensors ] || python3 - <<'PY'
from safetensors.torch import save_file
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
import torch
with torch.device('meta'):
    shapes = {k: tuple(v.shape) for k, v in LingbotMapModel().state_dict().items()}
save_file(golden_state_dict(shapes, salt=0), '/tmp/bench_weights.safetensors')
PY
bench="python3 -m lingbot_map_ros.tools.bench model --weights /tmp/bench_weights.safetensors"
golden="python3 -m lingbot_map_ros.tools.golden .gpu_data/stream_A.safetensors --device cuda"
if [ "$stage" = check ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider test/engine/test_staged_frames.py \
    test/engine/test_frame_graphs.py > "$out/gpu_tests_check.txt" 2>&1
  $golden --dtype bfloat16 --backend sdpa --cuda-graphs --compile > "$out/golden_A_check.txt" 2>&1
elif [ "$stage" = long ]; then
  timeout "${LONG_RUN_S:-560}" $bench --backend sdpa --compile --frames 10000 \
    --keyframe-interval 10 --progress 100 > "$out/model_sdpa_compile_10k.txt" 2>&1
elif [ "$stage" = fp8 ]; then
  python3 bench/fp8_attention.py > "$out/fp8_attention.txt" 2>&1
else
  python3 -m pytest -q -m gpu -p no:cacheprovider test/engine/test_flashinfer_cache.py \
    test/engine/test_split_attention.py test/engine/test_staged_frames.py \
    test/engine/test_frame_graphs.py > "$out/gpu_tests.txt" 2>&1
  { $golden --dtype bfloat16 --backend sdpa --cuda-graphs --compile
    [ "$stage" = sdpa ] || $golden --dtype bfloat16 --backend flashinfer --cuda-graphs --compile
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
