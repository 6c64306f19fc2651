#!/usr/bin/env bash
# The test command: set up the environments if needed, then run the linters and every CPU test on
# ROS 2 Kilted, and the ROS-facing tests (node, lifecycle node, player, replay, launch file) again
# on ROS 2 Jazzy. GPU tests (marker gpu) skip without CUDA.
# Extra arguments go to both pytest runs, e.g. -m "not slow" or test/ros/test_launch.py.
# LINGBOT_DISTROS="kilted" (or "jazzy") runs one distribution only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# A private DDS domain so parallel runs on one machine do not see each other's test nodes,
# within ROS 2's safe range on Linux (0-101; 0 left to whatever else runs unset).
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 101) + 1 ))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
# What Jazzy runs again: everything that touches rclpy or the launch file.
jazzy_paths=(test/ros test/tools/test_player.py test/tools/test_replay.py
             test/tools/test_end_to_end.py)
# Test paths among the arguments replace the default selection on both distributions.
for arg in "$@"; do
  [ -e "${arg%%::*}" ] && jazzy_paths=()
done
failed=()
kilted_venv=''
for distro in ${LINGBOT_DISTROS:-kilted jazzy}; do
  venv="$(LINGBOT_DISTRO="$distro" bash "$root/scripts/bootstrap.sh" | tail -n 1)"
  [ "$distro" = kilted ] && kilted_venv="$venv"
  paths=()
  [ "$distro" = jazzy ] && paths=("${jazzy_paths[@]}")
  echo "== pytest on ROS 2 $distro ($venv)"
  rc=0
  ( . "$root/scripts/ros_env.sh" "$venv"
    exec "$venv/bin/python" -m pytest -q -ra "${paths[@]}" "$@" ) || rc=$?
  # 5 = nothing collected: only acceptable when the caller's own filter selected nothing here.
  if [ "$rc" -ne 0 ] && ! { [ "$rc" -eq 5 ] && [ "$#" -gt 0 ]; }; then
    failed+=("$distro (pytest exit $rc)")
  fi
done
# Our Triton kernels (the GPU default) under Triton's CPU interpreter, at tiny shapes: triton
# comes from beside the Kilted venv (scripts/bootstrap.sh), TRITON_INTERPRET must be set before
# it is imported. Only in the full run (no arguments).
interpret_tests=(test/engine/test_attention_conformance.py test/engine/test_triton_attention.py
                 test/engine/test_fa3_parts.py test/engine/test_fa3_fp8.py
                 test/bench/test_triton_fp8.py test/bench/test_triton_int8.py)
if [ -n "$kilted_venv" ] && [ "$#" -eq 0 ] && [ -d "$kilted_venv/triton-interpreter/triton" ]; then
  echo "== Triton kernels under the CPU interpreter ($kilted_venv/triton-interpreter)"
  rc=0
  ( . "$root/scripts/ros_env.sh" "$kilted_venv"
    export TRITON_INTERPRET=1 PYTHONPATH="$kilted_venv/triton-interpreter${PYTHONPATH:+:$PYTHONPATH}"
    exec "$kilted_venv/bin/python" -m pytest -q -ra -m 'not gpu' -p no:cacheprovider \
      "${interpret_tests[@]}" ) || rc=$?
  [ "$rc" -ne 0 ] && failed+=("triton interpreter (pytest exit $rc)")
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "== all test runs passed"
