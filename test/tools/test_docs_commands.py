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
"""The shell commands of README.md and docs/*.md agree with the code (issue #38).

Every fenced ``bash`` block is read, continuation lines joined and comments dropped. Each command
of ours is then checked against the real code: a ``lingbot_map_*`` tool's arguments go through
its real argument parser (subcommands and flags must exist) and its ``--set`` keys through the
node's name check; ``lingbot_map_node`` / ``ros2 run ... lingbot_map_node`` ``-p`` names must be
declared parameters and a ``config/`` parameter file must exist; launch arguments
(``ros2 launch ... lingbot_map.launch.py``, ``lingbot_map_launch``) must be declared by the launch
file. The CPU-runnable bag commands of docs/tools.md run for real (marked slow).
Run: ``pytest test/tools/test_docs_commands.py`` (a few seconds without slow).
"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path
import re
import shlex
import subprocess
import sys

from lingbot_map_ros import config
from lingbot_map_ros.ros.parameters import params
from lingbot_map_ros.tools.config_files import parse_set
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / 'README.md'] + sorted((ROOT / 'docs').glob('*.md'))
LAUNCH = ROOT / 'launch' / 'lingbot_map.launch.py'
NODES = ('lingbot_map_node', 'lingbot_map_lifecycle_node')


def doc_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every command line in a fenced bash block of the docs."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding='utf-8')
        for block in re.findall(r'```bash\n(.*?)```', text, flags=re.DOTALL):
            joined = re.sub(r'\\\n\s*', ' ', block)
            for line in joined.splitlines():
                line = line.strip()
                if not line or line.startswith('#'):
                    continue
                try:
                    argv = shlex.split(line, comments=True)
                except ValueError:  # a shell construct we do not parse
                    continue
                if argv:
                    found.append((f'{path.relative_to(ROOT)}: {line[:60]}', argv))
    return found


def console_scripts() -> dict[str, str]:
    text = (ROOT / 'setup.py').read_text(encoding='utf-8')
    return dict(re.findall(r"'(lingbot_map_\w+) = ([\w.]+:\w+)'", text))


def launch_arguments() -> list[str]:
    tree = ast.parse(LAUNCH.read_text(encoding='utf-8'))
    [arguments] = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                   and n.name == 'arguments']
    return [t.elts[0].value for t in ast.walk(arguments)
            if isinstance(t, ast.Tuple) and len(t.elts) == 3]


COMMANDS = doc_commands()
_ROS2 = (['ros2', 'launch', 'lingbot_map_ros'], ['ros2', 'run', 'lingbot_map_ros'])
OURS = [(where, argv) for where, argv in COMMANDS
        if argv[0] in console_scripts() or argv[:3] in _ROS2]


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def parse(exe: str, args: list[str], monkeypatch) -> argparse.Namespace:
    """Parse ``args`` with ``exe``'s real parser (its main stops right after parsing)."""
    real = argparse.ArgumentParser.parse_args

    def stop(self, *a, **k):
        raise _Parsed(real(self, *a, **k))
    monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', stop)
    module, _, function = console_scripts()[exe].partition(':')
    try:
        getattr(importlib.import_module(module), function)(args)
    except _Parsed as parsed:
        return parsed.namespace
    finally:
        monkeypatch.undo()
    raise AssertionError(f'{exe} {args} did not parse its arguments')


def check_file(value: str) -> None:
    if value.startswith('config/'):
        assert (ROOT / value).is_file(), value


def check_ros_args(args: list[str]) -> None:
    names = []
    for flag, value in zip(args, args[1:]):
        if flag == '-p':
            names.append(value.partition(':=')[0])
        elif flag == '--params-file':
            check_file(value)
    params.check_names(names)


def check_launch_args(args: list[str]) -> None:
    declared = launch_arguments()
    for item in args:
        name, sep, value = item.partition(':=')
        assert sep, item
        assert name in declared, f'launch argument {name} is not declared'
        if name == 'params_file':
            check_file(value)


def test_the_docs_hold_commands_of_every_kind():
    kinds = {argv[0] if argv[0] != 'ros2' else ' '.join(argv[:2]) for _, argv in OURS}
    assert {'lingbot_map_replay', 'lingbot_map_launch', 'ros2 launch', 'ros2 run'} <= kinds, \
        kinds
    assert len(OURS) >= 15


@pytest.mark.parametrize('where,argv', OURS, ids=[w for w, _ in OURS])
def test_command_parses_with_the_real_code(where, argv, monkeypatch):
    if argv[:2] == ['ros2', 'launch']:
        assert argv[3] == LAUNCH.name
        check_launch_args(argv[4:])
        return
    if argv[:2] == ['ros2', 'run']:
        assert argv[3] in NODES, argv
        check_ros_args(argv[4:])
        return
    exe, args = argv[0], argv[1:]
    if exe in NODES:
        check_ros_args(args)
    elif exe == 'lingbot_map_launch':
        check_launch_args(args)
    else:
        namespace = parse(exe, args, monkeypatch)
        for key in ('params_file', 'config'):
            value = getattr(namespace, key, None)
            if isinstance(value, str):
                check_file(value if '/' in value else f'config/{value}')
        # bench fidelity's --set names a fidelity set, not parameters.
        if getattr(namespace, 'set', None) and getattr(namespace, 'command', '') != 'fidelity':
            params.check_names(parse_set(namespace.set))


def test_two_cameras_yaml_is_lingbot_map_yaml_with_cameras():
    robot = config.load_yaml(ROOT / 'config' / 'lingbot_map.yaml')
    two = config.load_yaml(ROOT / 'config' / 'two_cameras.yaml')
    # Loop closure runs with one camera only (docs/loop_closure.md): off in the rig's file.
    cameras = {'input.cameras', 'input.primary_camera', 'loop.enable'} | {
        k for k in two if k.startswith('frames.cameras.')}
    assert {k: v for k, v in two.items() if k not in cameras} == \
        {k: v for k, v in robot.items() if k not in cameras}
    assert two['input.cameras'] == ['front', 'left']
    assert robot['loop.enable'] and not two['loop.enable']


def _tools_cpu_commands() -> list[list[str]]:
    """docs/tools.md's bag commands that run on the CPU: synthetic bags and the tiny config."""
    return [argv for where, argv in OURS if where.startswith('docs/tools.md')
            and argv[0] == 'lingbot_map_replay' and argv[1] in ('make-bag', 'run')
            and ('--synthetic' in argv or 'config/demo_tiny_cpu.yaml' in argv)]


@pytest.mark.slow
def test_the_cpu_bag_commands_of_tools_md_run_as_written(tmp_path):
    commands = _tools_cpu_commands()
    assert len(commands) >= 5, commands
    (tmp_path / 'config').symlink_to(ROOT / 'config')
    entry = console_scripts()['lingbot_map_replay'].partition(':')[0]
    for argv in commands:
        code = f'import sys\nfrom {entry} import main\nsys.exit(main())\n'
        result = subprocess.run([sys.executable, '-c', code, *argv[1:]], cwd=tmp_path,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (argv, result.stderr[-3000:])
        assert 'Traceback' not in result.stderr, argv
        if argv[1] == 'run':
            out = tmp_path / argv[argv.index('--out') + 1]
            assert (out / 'trajectory.tum').is_file() and (out / 'summary.json').is_file()
            if '--gt' in argv:
                assert 'APE rmse' in result.stderr, result.stderr[-2000:]


def test_bags_made_by_the_docs_commands_land_in_an_ignored_folder():
    # A new user copying the commands must not leave bags in the repository's root.
    ignored = {line.strip().strip('/') for line in (ROOT / '.gitignore').read_text().splitlines()
               if line.startswith('/') and line.rstrip().endswith('/')}
    made = [argv[argv.index('--out') + 1] for _, argv in OURS
            if argv[:2] == ['lingbot_map_replay', 'make-bag'] and '--out' in argv]
    assert len(made) >= 5, made
    outside = [path for path in made if Path(path).parts[0] not in ignored]
    assert outside == [], (outside, sorted(ignored))


def test_the_docs_spell_each_parameter_choice_as_the_code_does():
    # 'map.mode: localization': prose that says "localisation" leads users to a refused value.
    choices = {c for spec in params.all_specs() for c in spec.choices or ()
               if isinstance(c, str) and 'iz' in c}
    variants = {c.replace('iz', 'is') for c in choices}
    assert 'localisation' in variants
    for path in DOCS:
        text = path.read_text(encoding='utf-8').lower()
        found = sorted(v for v in variants if v in text)
        assert found == [], (path.name, found)


def test_the_pypi_route_activates_the_venv_before_its_console_scripts():
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    start = readme.index('### With the PyPI wheels')
    section = readme[start:readme.find('\n## ', start)]
    activate = section.find('source .venv/bin/activate')
    first_script = section.find('\n  lingbot_map_')  # the first command of the section's blocks
    assert 0 <= activate < first_script, 'activate .venv before the console scripts'
    assert '. scripts/ros_env.sh .venv' in section
