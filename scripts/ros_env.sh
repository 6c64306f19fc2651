#!/usr/bin/env bash
# Source with a venv path: exports the library path the ROS 2 PyPI wheels need in that venv
# (<venv>/lib holds e.g. librcl_action.so on Jazzy; site-packages/ros_*.libs the vendored
# libraries). Set explicitly rather than through ros-wheels-bootstrapper's re-exec, so a run for
# one distribution started from another's process cannot inherit the wrong path.
#   . scripts/ros_env.sh "$venv"
_venv="$1"
_site="$("$_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
_libs="$_venv/lib"
for _d in "$_site"/ros_*.libs; do
  [ -d "$_d" ] && _libs="$_libs:$_d"
done
export LD_LIBRARY_PATH="$_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
unset _venv _site _libs _d
