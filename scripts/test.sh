#!/usr/bin/env bash
# The test command: set up the environments if needed, then run the linters and every CPU test on
# ROS 2 Kilted, and the ROS-facing tests (node, lifecycle node, player, replay, launch file) again
# on ROS 2 Jazzy. GPU tests (marker gpu) skip without CUDA.
# Extra arguments go to both pytest runs, e.g. -m "not slow" or test/ros/test_launch.py.
# LINGBOT_DISTROS="kilted" (or "jazzy") runs one distribution only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# A private DDS domain so parallel runs on one machine do not see each other's test nodes.
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 100) + 100 ))}"
# What Jazzy runs again: everything that touches rclpy or the launch file.
jazzy_paths=(test/ros test/tools/test_player.py test/tools/test_replay.py
             test/tools/test_end_to_end.py)
# Test paths among the arguments replace the default selection on both distributions.
for arg in "$@"; do
  [ -e "${arg%%::*}" ] && jazzy_paths=()
done
failed=()
for distro in ${LINGBOT_DISTROS:-kilted jazzy}; do
  venv="$(LINGBOT_DISTRO="$distro" bash "$root/scripts/bootstrap.sh" | tail -n 1)"
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
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "== all test runs passed"
