#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install everything the demo and the tests need:
# CPU torch 2.13.0, the ROS 2 PyPI wheels of one distribution, rosbags, the linters, the launch
# wheels from ../shared/wheels/launch, and this package (editable).
#   LINGBOT_DISTRO=kilted (default): .venv,       requirements-dev.txt   (LINGBOT_VENV overrides)
#   LINGBOT_DISTRO=jazzy:            .venv-jazzy, requirements-jazzy.txt (LINGBOT_JAZZY_VENV)
# Idempotent: a second run only checks the install.
# Prints the venv path on its last line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
distro="${LINGBOT_DISTRO:-kilted}"
case "$distro" in
  kilted) requirements="$root/requirements-dev.txt"; venv="${LINGBOT_VENV:-$root/.venv}" ;;
  jazzy) requirements="$root/requirements-jazzy.txt"
         venv="${LINGBOT_JAZZY_VENV:-$root/.venv-jazzy}" ;;
  *) echo "LINGBOT_DISTRO must be kilted or jazzy, not '$distro'" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
launch_wheels="$root/../shared/wheels/launch"
# Triton for its CPU interpreter only (TRITON_INTERPRET=1 in scripts/test.sh: our GPU kernels'
# tests run on the CPU). Installed beside the Kilted venv's site-packages, not into it, so no
# other test sees a triton package (CPU torch has none).
triton_cpu="triton==3.9.0"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.lingbot_bootstrap"
want="$( (cat "$requirements" "$root/requirements-common.txt" "$root/setup.py"; \
          ls "$launch_wheels" 2>/dev/null; echo "$triton_cpu") | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -r "$requirements" >&2
  if compgen -G "$launch_wheels/launch_ros-*.whl" >/dev/null; then
    # --no-deps: their metadata names ament_index_python (ros-ament-index-python on PyPI).
    # Not launch_testing: its pytest plugin (Jazzy's) does not load in the pytest used here,
    # and the launch tests drive LaunchService directly.
    "$venv/bin/python" -m pip install -q --no-deps "$launch_wheels"/launch-*.whl \
      "$launch_wheels"/launch_ros-*.whl "$launch_wheels"/launch_xml-*.whl \
      "$launch_wheels"/launch_yaml-*.whl "$launch_wheels"/composition_interfaces_standin-*.whl >&2
  else
    echo "bootstrap: no launch wheels in $launch_wheels; the launch tests will skip" >&2
  fi
  "$venv/bin/python" -m pip install -q --no-deps -e "$root" >&2
  if [ "$distro" = kilted ]; then
    "$venv/bin/python" -m pip install -q --no-deps --upgrade --target "$venv/triton-interpreter" \
      "$triton_cpu" >&2 || echo "bootstrap: $triton_cpu not installed; the interpreter tests skip" >&2
  fi
  echo "$want" > "$stamp"
fi
echo "$venv"
