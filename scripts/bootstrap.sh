#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install everything the demo
# and the tests need: CPU torch 2.13.0, ROS 2 Kilted PyPI wheels, rosbags, and this package.
# Idempotent: a second run only checks that the install is complete.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LINGBOT_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.lingbot_bootstrap"
want="$(cat "$root/requirements-dev.txt" "$root/setup.py" | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$root/requirements-dev.txt"
  "$venv/bin/python" -m pip install -q --no-deps -e "$root"
  echo "$want" > "$stamp"
fi
echo "$venv"
