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
"""``lingbot_map_demo``: the whole loop in one command -- scene, node, bag playback, trajectory.

1. Renders the embedded synthetic scene (a textured room, a known camera loop) into a rosbag2 bag
   with its ground truth (``bag/``, ``gt.tum``).
2. Starts ``lingbot_map_node`` as a child process in bag mode with reliable QoS and
   ``use_sim_time``: the tiny model on CPU with RANDOM weights (``config/demo_tiny_cpu.yaml``),
   or, with ``--weights``, the official model from ``config/lingbot_map.yaml``.
3. Plays the bag into it with ``/clock`` (the player of ``lingbot_map_replay play``) and records
   ``/lingbot_map/pose``.
4. Writes ``trajectory.tum``, ``trajectory.png`` (against the ground truth) and, when ``evo`` is
   installed, APE/RPE into ``summary.json``; the node's log is ``node.log``.
5. Writes ``map_gt.png`` / ``map_gt.ply``: the map the node's accumulator builds from the scene's
   *ground-truth* depth and poses (``tools/map_plot.py``), i.e. what ``~/map`` shows when depth
   and poses are right; the random-weight model's own depth is meaningless.

The pieces (:class:`NodeProcess`, :class:`PoseRecorder`, :func:`play_and_record`) are used by the
end-to-end test as well.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import logging
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from geometry_msgs.msg import PoseStamped
from lingbot_map_ros.config import load_yaml, MapConfig
from lingbot_map_ros.engine.image.geometry import quaternion_to_rotation
from lingbot_map_ros.engine.map.ply import write_ply
from lingbot_map_ros.ros.messages.conversions import map_axes_transform, stamp_to_ns
from lingbot_map_ros.ros.parameters.cli_help import plain
from lingbot_map_ros.tools import bag_io, strict_json, trajectory
from lingbot_map_ros.tools.config_files import find_config
from lingbot_map_ros.tools.make_bag import BagSpec, write_synthetic
from lingbot_map_ros.tools.map_plot import ground_truth_map, plot_map
from lingbot_map_ros.tools.player import BagPlayer, PlayOptions
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig, SyntheticSequence
import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

_LOG = logging.getLogger('lingbot_map_demo')
NODE_NAME = 'lingbot_map'
POSE_TOPIC = f'/{NODE_NAME}/pose'
GT_VOXEL_M = 0.02
"""Voxel of the ground-truth map picture: the synthetic scene is in metres."""


class NodeProcess:
    """``python -m lingbot_map_ros.ros.nodes.node`` as a child process, output in a log file."""

    def __init__(self, params_file: str | Path, overrides: dict[str, Any],
                 remaps: dict[str, str], log_path: str | Path, torch_threads: int = 1) -> None:
        """Describe the process; :meth:`start` runs it.

        Args:
            params_file: node parameter YAML.
            overrides: ``-p name:=value`` overrides.
            remaps: ``-r from:=to`` topic remaps.
            log_path: file that receives the node's stdout and stderr.
            torch_threads: ``OMP_NUM_THREADS`` of the child (1 is fastest on a busy CPU).
        """
        self.command = [sys.executable, '-m', 'lingbot_map_ros.ros.nodes.node', '--ros-args',
                        '--params-file', str(params_file)]
        for name, value in overrides.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            self.command += ['-p', f'{name}:={text}']
        for source, target in remaps.items():
            self.command += ['-r', f'{source}:={target}']
        self.log_path = Path(log_path)
        self._threads = torch_threads
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    def start(self) -> None:
        """Start the node."""
        env = dict(os.environ, OMP_NUM_THREADS=str(self._threads), PYTHONUNBUFFERED='1')
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, 'wb')
        self._proc = subprocess.Popen(self.command, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, env=env)

    def exit_code(self) -> int | None:
        """Return the exit code once the process has ended, else None."""
        return None if self._proc is None else self._proc.poll()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGINT (clean shutdown), then SIGKILL after ``timeout_s``; returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log_file.close()
        return self._proc.returncode

    def log_tail(self, num_lines: int = 20) -> str:
        """Return the last lines of the node's log."""
        if not self.log_path.exists():
            return ''
        text = self.log_path.read_text(encoding='utf-8', errors='replace')
        return '\n'.join(text.splitlines()[-num_lines:])


class PoseRecorder:
    """Records ``PoseStamped`` messages (reliable, deep history) as stamped ``c2w`` matrices."""

    def __init__(self, node: Node, topic: str = POSE_TOPIC, depth: int = 10000) -> None:
        """Subscribe on ``node`` (the caller spins it)."""
        self._lock = threading.Lock()
        self._stamps: list[int] = []
        self._poses: list[np.ndarray] = []
        qos = QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)
        self._sub = node.create_subscription(PoseStamped, topic, self._on_pose, qos)

    def _on_pose(self, msg: PoseStamped) -> None:
        p, q = msg.pose.position, msg.pose.orientation
        c2w = np.eye(4)
        c2w[:3, :3] = quaternion_to_rotation(np.array([q.x, q.y, q.z, q.w]))
        c2w[:3, 3] = (p.x, p.y, p.z)
        with self._lock:
            self._stamps.append(stamp_to_ns(msg.header.stamp))
            self._poses.append(c2w)

    @property
    def count(self) -> int:
        """Poses received so far."""
        with self._lock:
            return len(self._stamps)

    def trajectory(self) -> trajectory.Trajectory:
        """Return the poses received so far, in arrival order."""
        with self._lock:
            return trajectory.Trajectory(np.array(self._stamps, dtype=np.int64),
                                         np.array(self._poses).reshape(-1, 4, 4))


def node_overrides(num_frames: int, weights: str | None) -> dict[str, Any]:
    """Return the parameters that make the node take every frame of a played bag, in order."""
    values: dict[str, Any] = {
        'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
        'input.qos.depth': max(100, num_frames), 'input.queue_size': max(64, num_frames),
        'use_sim_time': True, 'publish.tf': False}
    if weights:
        values.update(weights=str(Path(weights).resolve()), allow_random_weights=False)
    return values


def _wait_for_node(player: BagPlayer, node: NodeProcess, timeout_s: float) -> None:
    """Wait until the node subscribes to the image topic; raise if it dies or takes too long."""
    deadline = time.monotonic() + timeout_s
    while not player.wait_for_subscribers(1, 0.5):
        if node.exit_code() is not None:
            raise RuntimeError(f'the node exited with code {node.exit_code()}:\n'
                               f'{node.log_tail()}')
        if time.monotonic() > deadline:
            raise RuntimeError(f'the node did not subscribe within {timeout_s:.0f} s:\n'
                               f'{node.log_tail()}')


def _wait_for_poses(recorder: PoseRecorder, node: NodeProcess, expected: int,
                    idle_s: float) -> None:
    """Wait for ``expected`` poses, giving up after ``idle_s`` without a new one."""
    last_count, last_change = -1, time.monotonic()
    while recorder.count < expected and node.exit_code() is None:
        if recorder.count != last_count:
            last_count, last_change = recorder.count, time.monotonic()
        elif time.monotonic() - last_change > idle_s:
            _LOG.warning('%d of %d poses after %.0f s without a new one; giving up',
                         last_count, expected, idle_s)
            return
        time.sleep(0.1)


def play_and_record(bag: str | Path, node: NodeProcess, expected: int, rate: float = 1.0,
                    timeout_s: float = 120.0) -> trajectory.Trajectory:
    """Start ``node``, play ``bag`` into it with /clock, and record its poses.

    Args:
        bag: rosbag2 folder with the image and camera_info topics the node listens to.
        node: the node process (started here, stopped before returning).
        expected: number of poses to wait for.
        rate: playback speed factor.
        timeout_s: longest wait for the node to start, and for each next pose after playback.

    Returns:
        The recorded poses, in arrival order (possibly fewer than ``expected`` on timeout).

    Raises:
        RuntimeError: the node exited or did not subscribe in time (its log tail is included).
    """
    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    ros_node = Node('lingbot_map_demo', context=context)
    try:
        recorder = PoseRecorder(ros_node)
        executor.add_node(ros_node)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        node.start()
        with bag_io.open_bag(bag) as reader:
            player = BagPlayer(ros_node, reader, PlayOptions(rate=rate, clock=True,
                                                             reliable=True,
                                                             qos_depth=max(100, expected)))
            _wait_for_node(player, node, timeout_s)
            _LOG.info('node is up; playing %s at rate %g', bag, rate)
            player.play()
        _wait_for_poses(recorder, node, expected, timeout_s)
        return recorder.trajectory()
    finally:
        code = node.stop()
        _LOG.info('node stopped (exit code %s); log: %s', code, node.log_path)
        executor.shutdown()
        ros_node.destroy_node()
        context.try_shutdown()


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    """Make the scene bag, run the node on it, write and evaluate the trajectory.

    Returns:
        The summary (also written to ``<out>/summary.json``).

    Raises:
        RuntimeError: the node failed or published no pose.
    """
    out = Path(args.out).resolve()
    bag, gt = out / 'bag', out / 'gt.tum'
    if bag.exists():
        shutil.rmtree(bag)  # our own output of an earlier run
    params = args.params_file or find_config('lingbot_map.yaml' if args.weights
                                             else 'demo_tiny_cpu.yaml')
    values = load_yaml(params)
    if args.frames < values.get('cache.scale_frames', 8):
        raise ValueError(f'--frames {args.frames} is less than cache.scale_frames='
                         f'{values.get("cache.scale_frames", 8)} of {params}: the node would '
                         'output nothing')
    map_axes = values.get('frames.map_axes', 'flu')
    scene = SceneConfig(num_frames=args.frames)
    seq = render_sequence(scene)  # once: the bag and the map picture show the same frames
    write_synthetic(BagSpec(out=bag), scene, gt, map_axes, seq)
    if not args.weights:
        _LOG.warning('*** no --weights: the node runs the tiny model with RANDOM weights, so '
                     'the trajectory is meaningless; this only shows the pipeline working. '
                     'Pass --weights /path/to/lingbot-map.pt for real poses. ***')
    node = NodeProcess(params, node_overrides(args.frames, args.weights),
                       {'image': '/camera/image_raw', 'camera_info': '/camera/camera_info'},
                       out / 'node.log', args.torch_threads)
    _LOG.info('starting the node: %s', ' '.join(node.command))
    start = time.monotonic()
    est = play_and_record(bag, node, expected=args.frames, rate=args.rate,
                          timeout_s=args.timeout)
    if est.stamps_ns.size == 0:
        raise RuntimeError(f'the node published no pose; see {node.log_path}:\n'
                           f'{node.log_tail()}')
    tum, png = out / 'trajectory.tum', out / 'trajectory.png'
    trajectory.write_tum(tum, est, [f'lingbot_map_demo: poses recorded from {POSE_TOPIC}',
                                    f'weights: {args.weights or "RANDOM (tiny preset)"}'])
    trajectory.plot(png, est, trajectory.read_tum(gt), map_axes=map_axes,
                    title=f'lingbot_map_demo: {est.stamps_ns.size} poses'
                          f'{"" if args.weights else " (RANDOM weights)"}')
    summary = {'frames': args.frames, 'poses': int(est.stamps_ns.size),
               'seconds': round(time.monotonic() - start, 1),
               'weights': args.weights or 'random', 'bag': str(bag), 'ground_truth': str(gt),
               'trajectory': str(tum), 'plot': str(png), 'node_log': str(node.log_path),
               'evaluation': trajectory.evaluate(tum, gt),
               'map_picture': str(write_map_picture(out, seq, values, map_axes))}
    strict_json.write(out / 'summary.json', summary)
    return summary


def write_map_picture(out: Path, seq: SyntheticSequence, values: dict[str, Any],
                      map_axes: str) -> Path:
    """Build the scene's map from its ground truth; write ``map_gt.ply`` and ``map_gt.png``.

    Args:
        out: output folder.
        seq: the rendered synthetic loop (the frames of the bag).
        values: node parameters (the ``map.*`` settings; the voxel is ``GT_VOXEL_M``).
        map_axes: axes of the map frame.

    Returns:
        The PNG's path.
    """
    num_frames = len(seq.images)
    config = replace(MapConfig.from_flat(values), voxel_size=GT_VOXEL_M)
    xyz, rgb = ground_truth_map(seq, config, map_axes).points()
    write_ply(out / 'map_gt.ply', xyz, rgb)
    png = out / 'map_gt.png'
    plot_map(png, xyz, rgb, (map_axes_transform(map_axes) @ seq.c2w)[:, :3, 3],
             title=f"the node's map accumulator on the synthetic scene's GROUND-TRUTH depth "
                   f'and poses ({num_frames} frames, voxel {GT_VOXEL_M} m, {len(xyz)} points)',
             map_axes=map_axes)
    return png


def build_parser() -> argparse.ArgumentParser:
    """Build the ``lingbot_map_demo`` argument parser."""
    parser = argparse.ArgumentParser(prog='lingbot_map_demo',
                                     description=plain(__doc__.split('\n\n', 1)[0]))
    parser.add_argument('--out', default='lingbot_map_demo_out',
                        help='output folder (default: %(default)s)')
    parser.add_argument('--weights', default=None,
                        help='LingBot-Map checkpoint; without it the tiny model runs with '
                             'random weights')
    parser.add_argument('--params-file', default=None,
                        help='node parameter YAML (default: config/demo_tiny_cpu.yaml, or '
                             'config/lingbot_map.yaml with --weights)')
    parser.add_argument('--frames', type=int, default=60,
                        help='frames of the synthetic loop (default: %(default)s)')
    parser.add_argument('--rate', type=float, default=1.0,
                        help='playback speed factor of the 10 fps bag (default: %(default)s)')
    parser.add_argument('--timeout', type=float, default=120.0,
                        help='seconds to wait for the node to start, and for each next pose '
                             'after playback (default: %(default)s)')
    parser.add_argument('--torch-threads', type=int, default=1,
                        help="CPU threads of the node's torch (default: %(default)s)")
    parser.add_argument('--log-level', default='INFO',
                        choices=('DEBUG', 'INFO', 'WARNING', 'ERROR'), help='logging level')
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format='[%(levelname)s] %(name)s: %(message)s')
    try:
        summary = run_demo(args)
    except (RuntimeError, ValueError, FileNotFoundError, bag_io.BagError) as exc:
        _LOG.error('%s', exc)
        return 1
    evaluation = summary['evaluation']
    weights = summary['weights'] if args.weights else \
        'RANDOM weights: the poses are meaningless, pass --weights for real ones'
    lines = [f'lingbot_map_demo: {summary["poses"]}/{summary["frames"]} poses in '
             f'{summary["seconds"]} s ({weights})',
             f'  bag:          {summary["bag"]}',
             f'  ground truth: {summary["ground_truth"]}',
             f'  trajectory:   {summary["trajectory"]}',
             f'  plot:         {summary["plot"]}',
             f'  map picture:  {summary["map_picture"]} (ground-truth depth and poses)',
             f'  node log:     {summary["node_log"]}']
    if evaluation:
        lines.append(f'  APE rmse {evaluation["ape_m"]["rmse"]:.3f} m, RPE rmse '
                     f'{evaluation["rpe_m"]["rmse"]:.3f} m (Sim(3)-aligned to the ground truth)')
    else:
        lines.append('  APE/RPE: skipped (pip install evo)')
    sys.stdout.write('\n'.join(lines) + '\n')
    return 0 if summary['poses'] == summary['frames'] else 1


if __name__ == '__main__':
    sys.exit(main())
