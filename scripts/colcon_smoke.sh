#!/usr/bin/env bash
# Build the package with colcon in a throw-away ROS 2 workspace, then start the INSTALLED node
# entry point for a few seconds with the tiny CPU demo parameters: it must come up, publish
# /diagnostics and exit cleanly on SIGINT.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$("$root/scripts/bootstrap.sh" | tail -n 1)"
ws="$(mktemp -d /tmp/lingbot_ws.XXXXXX)"
trap 'rm -rf "$ws"' EXIT
mkdir -p "$ws/src"
ln -s "$root" "$ws/src/lingbot_map_ros"
cd "$ws"
"$venv/bin/colcon" build --packages-select lingbot_map_ros --event-handlers console_direct- \
  >"$ws/build.log" 2>&1 || { cat "$ws/build.log"; exit 1; }
tail -n 3 "$ws/build.log"
node_exe="$ws/install/lingbot_map_ros/lib/lingbot_map_ros/lingbot_map_node"
share="$ws/install/lingbot_map_ros/share/lingbot_map_ros"
for f in "$node_exe" "${node_exe%/*}/lingbot_map_lifecycle_node" "$share/package.xml" \
         "$share/launch/lingbot_map.launch.py" \
         "$share/config/lingbot_map.yaml"; do
  [ -e "$f" ] || { echo "colcon install is missing $f"; exit 1; }
done
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 101) + 1 ))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
# The installed script runs with the venv's python (it carries torch and the ROS wheels).
PYTHONPATH="$ws/install/lingbot_map_ros/lib/python3.11/site-packages:${PYTHONPATH:-}" \
  timeout -s INT 40 "$venv/bin/python" "$node_exe" --ros-args \
  --params-file "$share/config/demo_tiny_cpu.yaml" -p diagnostics.period_s:=1.0 \
  >"$ws/node.log" 2>&1 &
node_pid=$!
"$venv/bin/python" - <<'PY'
import sys, time
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
rclpy.init()
node = rclpy.create_node('colcon_smoke_probe')
got = []
node.create_subscription(DiagnosticArray, '/diagnostics', got.append, 10)
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    rclpy.spin_once(node, timeout_sec=0.2)
rclpy.shutdown()
if not got:
    sys.exit('installed node published no /diagnostics within 30 s')
print('installed node is up: /diagnostics from', [s.name for s in got[0].status])
PY
kill -INT "$node_pid" 2>/dev/null || true
wait "$node_pid" || { rc=$?; [ "$rc" -eq 130 ] || [ "$rc" -eq 124 ] || \
  { cat "$ws/node.log"; echo "node exited with $rc"; exit 1; }; }
echo "colcon build + installed node: OK"
