#!/usr/bin/env bash
# The test command: set up the environment if needed, then run linters and all CPU tests.
# GPU tests (marker gpu) skip without CUDA. Extra arguments go to pytest, e.g. -m "not slow".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$("$root/scripts/bootstrap.sh" | tail -n 1)"
cd "$root"
# A private DDS domain so parallel runs on one machine do not see each other's test nodes.
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 100) + 100 ))}"
exec "$venv/bin/python" -m pytest -q -ra "$@"
