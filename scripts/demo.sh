#!/usr/bin/env bash
# The demo command: set up the environment if needed, then run the embedded default end to end:
# a procedurally generated scene with a known camera loop is written as a rosbag2, replayed into
# the running lingbot_map_node (tiny model on the CPU, random weights enabled explicitly), and
# the recorded poses are written as a TUM trajectory and a plot under demo_out/.
# Extra arguments go to lingbot_map_demo (e.g. --weights /path/lingbot-map.pt --out DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$("$root/scripts/bootstrap.sh" | tail -n 1)"
cd "$root"
# A domain of its own within ROS 2's safe range on Linux (0-101), and discovery kept on this
# host: the demo's player and node talk to each other only.
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 101) + 1 ))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
args=("$@")
[[ " $* " == *" --out "* ]] || args=(--out demo_out "${args[@]}")
exec "$venv/bin/lingbot_map_demo" "${args[@]}"
