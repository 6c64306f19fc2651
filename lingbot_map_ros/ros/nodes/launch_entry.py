# Copyright 2026 The lingbot_map_ros Authors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""``lingbot_map_launch``: the package's launch file without ``ros2 launch`` (the PyPI set-up).

``lingbot_map_launch image_topic:=/camera/image_raw weights:=/path/lingbot-map.safetensors``
does what ``ros2 launch lingbot_map_ros lingbot_map.launch.py ...`` does, through the launch API
(``LaunchService``), so it also runs where ros2cli is missing (the ROS 2 PyPI wheels plus the
launch wheels, README "With the PyPI wheels"). Every argument is ``name:=value``; an argument
the launch file does not declare is refused with the nearest declared names. Where the package
is not on the ament index (a pip install, not colcon), a temporary install prefix is laid out
as colcon's (``share/lingbot_map_ros`` with the launch, config and rviz files,
``lib/lingbot_map_ros`` with the two node executables run by this interpreter) and put on
``AMENT_PREFIX_PATH`` for the launch. Ctrl-C or SIGTERM stop it as they stop ``ros2 launch``.
"""

from __future__ import annotations

import os
from pathlib import Path
import sys
import tempfile

from lingbot_map_ros.ros.parameters.param_names import unknown_problem

PACKAGE = 'lingbot_map_ros'
LAUNCH_FILE = 'lingbot_map.launch.py'
EXECUTABLES = {'lingbot_map_node': 'lingbot_map_ros.ros.nodes.entry',
               'lingbot_map_lifecycle_node': 'lingbot_map_ros.ros.nodes.lifecycle_node'}
_SHARED = ('launch', 'config', 'rviz', 'package.xml')
_USAGE = """usage: lingbot_map_launch [-h] [NAME:=VALUE ...]

Start lingbot_map_node (or, with lifecycle:=true, the lifecycle node) through the package's
launch file, as `ros2 launch lingbot_map_ros lingbot_map.launch.py NAME:=VALUE ...` does.
Example (the CPU demo model, random weights):
  lingbot_map_launch params_file:=config/demo_tiny_cpu.yaml image_topic:=/cam/image_raw
"""


def parse_arguments(argv: list[str]) -> dict[str, str]:
    """``['image_topic:=/cam', ...]`` -> ``{'image_topic': '/cam'}``.

    Raises:
        ValueError: an item that is not ``name:=value``.
    """
    out = {}
    for item in argv:
        name, sep, value = item.partition(':=')
        if not sep or not name:
            raise ValueError(f"'{item}' is not NAME:=VALUE (run lingbot_map_launch --help)")
        out[name] = value
    return out


def share_source() -> Path | None:
    """Return the folder holding ``launch/``, ``config/``, ``rviz/`` and ``package.xml``.

    The checkout (an editable install) or ``<prefix>/share/lingbot_map_ros`` (a pip install).
    """
    for folder in (Path(__file__).resolve().parents[3], Path(sys.prefix) / 'share' / PACKAGE):
        if (folder / 'launch' / LAUNCH_FILE).is_file():
            return folder
    return None


def indexed_launch_file() -> Path | None:
    """Return the launch file of a package on the ament index (colcon install), or None."""
    try:
        from ament_index_python.packages import get_package_share_directory
        path = Path(get_package_share_directory(PACKAGE)) / 'launch' / LAUNCH_FILE
    except (ImportError, LookupError, OSError):  # OSError: AMENT_PREFIX_PATH unset
        return None
    return path if path.is_file() else None


def make_prefix(root: Path, source: Path) -> Path:
    """Lay out an install prefix as colcon's under ``root``; return its launch file."""
    index = root / 'share' / 'ament_index' / 'resource_index' / 'packages'
    index.mkdir(parents=True)
    (index / PACKAGE).write_text('', encoding='utf-8')
    share = root / 'share' / PACKAGE
    share.mkdir()
    for name in _SHARED:
        if (source / name).exists():
            (share / name).symlink_to(source / name)
    lib = root / 'lib' / PACKAGE
    lib.mkdir(parents=True)
    for exe, module in EXECUTABLES.items():
        script = lib / exe
        script.write_text(f'#!{sys.executable}\nimport sys\nfrom {module} import main\n'
                          'sys.exit(main())\n', encoding='utf-8')
        script.chmod(0o755)
    return share / 'launch' / LAUNCH_FILE


def main(argv: list[str] | None = None) -> int:
    """Run the launch file with the ``name:=value`` arguments until it ends; its exit status.

    Returns:
        The launch's exit status; 1 when it cannot start (no launch packages, an unknown
        argument), 2 for an argument that is not ``name:=value``.
    """
    argv = sys.argv[1:] if argv is None else argv
    if '-h' in argv or '--help' in argv:
        print(_USAGE + '\nArguments (ros2 launch ... --show-args lists the same):\n'
              + _described_arguments())
        return 0
    try:
        arguments = parse_arguments(argv)
    except ValueError as exc:
        print(f'lingbot_map_launch: {exc}', file=sys.stderr)
        return 2
    try:
        from launch import LaunchService  # noqa: F401 - checked before anything is laid out
        import launch_ros  # noqa: F401
    except ImportError as exc:
        print(f'lingbot_map_launch: needs the launch and launch_ros packages ({exc}); on a '
              'PyPI set-up install ../shared/wheels/launch (README "With the PyPI wheels")',
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix='lingbot_map_launch_') as tmp:
        path = _launch_file(Path(tmp))
        if path is None:
            print(f'lingbot_map_launch: {LAUNCH_FILE} not found (neither on the ament index '
                  f'nor in {sys.prefix}/share/{PACKAGE})', file=sys.stderr)
            return 1
        declared = [a.name for a in _description(path).get_launch_arguments()]
        problem = unknown_problem(arguments, declared, 'launch argument',
                                  'lingbot_map_launch --help lists them')
        if problem:
            print(f'lingbot_map_launch: {problem}', file=sys.stderr)
            return 1
        return _run(path, arguments)


def _launch_file(tmp: Path) -> Path | None:
    """Return the launch file, making a prefix in ``tmp`` when the index does not have it."""
    indexed = indexed_launch_file()
    if indexed is not None:
        return indexed
    source = share_source()
    if source is None:
        return None
    path = make_prefix(tmp, source)
    os.environ['AMENT_PREFIX_PATH'] = os.pathsep.join(
        p for p in (str(tmp), os.environ.get('AMENT_PREFIX_PATH')) if p)
    return path


def _description(path: Path):
    from launch.launch_description_sources import get_launch_description_from_python_launch_file
    return get_launch_description_from_python_launch_file(str(path))


def _run(path: Path, arguments: dict[str, str]) -> int:
    from launch import LaunchDescription, LaunchService
    from launch.actions import IncludeLaunchDescription
    from launch.launch_description_sources import PythonLaunchDescriptionSource

    service = LaunchService(argv=[f'{k}:={v}' for k, v in arguments.items()])
    service.include_launch_description(LaunchDescription([IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(path)), launch_arguments=arguments.items())]))
    return service.run()


def _described_arguments() -> str:
    """List the launch file's arguments with defaults and descriptions (without ROS running)."""
    try:
        from launch import LaunchService  # noqa: F401
    except ImportError as exc:
        return f'  (the launch package is not installed: {exc})'
    with tempfile.TemporaryDirectory(prefix='lingbot_map_launch_') as tmp:
        path = _launch_file(Path(tmp))
        if path is None:
            return f'  ({LAUNCH_FILE} not found)'
        lines = []
        for arg in _description(path).get_launch_arguments():
            default = ''.join(getattr(s, 'text', '?') for s in arg.default_value or [])
            default = default.replace(f'{tmp}/share/{PACKAGE}/', '<package share>/')
            lines.append(f'  {arg.name}:={default!r}: {arg.description}')
        return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
