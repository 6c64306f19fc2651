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
"""``lingbot_map_replay``: run a rosbag2 bag through the engine offline, play it, or make one.

Subcommands:

- ``run BAG``: every image of one topic, in bag order, goes through the node's conversion
  functions (``ros/messages/conversions.py``) into the engine's ``StreamingSession`` -- no ROS
  graph, no dropped frames, deterministic. It writes ``trajectory.tum`` (the poses the node would
  publish on ``~/pose``, in the same map axes), ``trajectory.png``, ``summary.json``, and with
  ``--depth`` / ``--ply`` the depth maps and the node's map (``map.ply``). With ``--gt`` it reports
  APE/RPE (evo). ``--depth-topic`` pairs a depth camera's images (16UC1 mm / 32FC1 m, aligned to
  the colour image) with the frames, as the node does with ``metric.source: depth``: the outputs
  are then in metres. ``--imu-topic`` fuses the bag's IMU during the run as the node does
  (``replay_imu.py``): the outputs are in metres once the IMU scale locks, and the summary's
  ``imu`` block gives the scale, the lock, drops and, with ``--gt``, the metric ATE and the
  gravity error.
  Frames are handled as the node handles them: unreadable images and frames the engine refuses
  are counted drops, a stamp that is not newer is dropped, a stamp jump back or a session limit
  resets the session and starts a new map segment (listed in the summary and the TUM header).
- ``run BAG --cameras front=/cam_front/image_raw,left=/cam_left/image_raw``: several cameras
  on one engine, each camera's outputs in ``OUT/<name>/`` and the fused odometry; the same path
  as one camera, which is a list of one (see ``replay_cameras.py``).
- ``play BAG``: publish the image and camera_info topics into a live ROS graph with the recorded
  timing, like ``ros2 bag play --clock`` (see ``player.py``).
- ``make-bag``: write a bag from an image folder, a video or the synthetic scene
  (see ``make_bag.py``).

Exit codes: 0 success, 1 a bag, topic, config or weights problem (the message says which), 2 bad
command-line usage.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
import sys
from typing import Any

from lingbot_map_ros.config import GridConfig, load_yaml, LoopConfig, MapConfig, MetricConfig
from lingbot_map_ros.config import section_from_flat
from lingbot_map_ros.engine.errors import LingbotMapError
from lingbot_map_ros.ros.parameters import params
from lingbot_map_ros.tools import bag_io, make_bag, replay_cameras, replay_imu
from lingbot_map_ros.tools.config_files import find_config, parse_set
from lingbot_map_ros.tools.offline import RunOptions
import torch

_LOG = logging.getLogger('lingbot_map_replay')
DEFAULT_PARAMS = 'lingbot_map.yaml'


def run_options(args: argparse.Namespace) -> tuple[dict[str, Any], RunOptions]:
    """Merge the parameter file with the flags into node-style values and run options.

    Returns:
        ``(flat parameter values, run options)``.

    Raises:
        ValueError: a parameter the node does not know (in the file or ``--set``: the node's
            own check, ``params.check_names``) or a bad value.
    """
    params_file = args.params_file or find_config(DEFAULT_PARAMS)
    values = load_yaml(params_file)
    overrides = parse_set(args.set)
    cameras = list(values.get('input.cameras') or ())
    if args.cameras:
        cameras += list(replay_cameras.parse_cameras(args.cameras))
    for source, names in ((str(params_file), values), ('--set', overrides)):
        try:
            params.check_names(names, cameras)
        except ValueError as exc:
            raise ValueError(f'{source}: {exc}') from None
    values.update(overrides)
    if args.weights:
        values['weights'] = args.weights
    if args.allow_random_weights:
        values['allow_random_weights'] = True
    if args.seed is not None:
        values['seed'] = args.seed
    if args.device:
        values['stream.device'] = args.device
    if args.depth_topic:  # metric scale from a depth camera
        values['metric.source'] = 'depth'
    if args.depth or args.ply or args.grid or values.get('metric.source') == 'depth':
        values['stream.enable_depth'] = True
    if getattr(args, 'imu_truth', None) and not getattr(args, 'imu_topic', None):
        raise ValueError('--imu-truth needs --imu-topic')
    imu = replay_imu.ImuRun.from_values(values, _absolute(args.imu_topic),
                                        replay_imu.read_truth(args.imu_truth)) \
        if getattr(args, 'imu_topic', None) else None
    options = RunOptions(
        map_axes=args.map_axes,
        backwards_reset_s=float(values.get('input.backwards_reset_s',
                                           RunOptions.backwards_reset_s)),
        forward_jump_s=float(values.get('input.forward_jump_s', RunOptions.forward_jump_s)),
        resolution_change_frames=int(values.get('input.resolution_change_frames',
                                                RunOptions.resolution_change_frames)),
        save_depth=args.depth, save_ply=args.ply, map=MapConfig.from_flat(values),
        max_frames=args.max_frames, metric=MetricConfig.from_flat(values),
        depth_topic=_absolute(args.depth_topic or ''),
        loop=section_from_flat(LoopConfig, 'loop', {**values, 'loop.enable': True})
        if getattr(args, 'loop_closure', False) else None,
        grid=GridConfig.from_flat(values) if getattr(args, 'grid', False) else None,
        imu=imu)
    return values, options


def _absolute(topic: str) -> str:
    return topic if not topic or topic.startswith('/') else '/' + topic


def run_bag(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand; returns the exit code.

    One camera (``--topic``, or the bag's only image topic) and several (``--cameras``) take
    one path, one camera being a list of one (``replay_cameras.py``).
    """
    values, options = run_options(args)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    cameras = replay_cameras.parse_cameras(args.cameras) if args.cameras else \
        {'': args.topic or ''}
    if args.imu_topic and args.cameras:
        raise ValueError('--imu-topic runs with one camera (no --cameras)')
    result = replay_cameras.run_cameras(args.bag, cameras, values, options, Path(args.out),
                                        gt=args.gt)
    code = replay_cameras.exit_code(result)
    if result.get('imu') is not None:
        replay_imu.add_evaluation(Path(args.out), result, args.gt,
                                  replay_imu.read_truth(args.imu_truth))
    return code


def _add_run_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser('run', help='run every image of a bag through the engine offline')
    p.add_argument('bag', help='rosbag2 folder (sqlite3 or MCAP)')
    p.add_argument('--topic', default=None,
                   help='image topic (Image or CompressedImage); default: the only one')
    p.add_argument('--out', required=True, help='output folder')
    p.add_argument('--params-file', default=None,
                   help=f"node parameter YAML (default: the package's {DEFAULT_PARAMS})")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument('--weights', default=None, help='checkpoint file (overrides the YAML)')
    weights.add_argument('--allow-random-weights', action='store_true',
                         help='run a random-weight model (meaningless poses; demos, tests)')
    p.add_argument('--seed', type=int, default=None, help='seed of the random weights')
    p.add_argument('--device', default=None, help="engine device override, e.g. 'cpu'")
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='override any parameter of the YAML, e.g. cache.scale_frames=4')
    p.add_argument('--map-axes', choices=('flu', 'optical'), default='flu',
                   help='axes of the world of the TUM poses (camera optical frames): flu = x '
                        'forward, y left, z up at the first camera; optical = the first '
                        "camera's optical axes (default: %(default)s)")
    p.add_argument('--gt', default=None,
                   help='ground-truth TUM file: APE/RPE (needs evo); with --cameras, of the '
                        'fused odometry')
    p.add_argument('--depth', action='store_true',
                   help='save depth/<stamp_ns>.npz per frame: depth, depth_conf, intrinsics, c2w '
                        '(turns stream.enable_depth on)')
    p.add_argument('--ply', action='store_true',
                   help="save the map of the keyframes as map.ply: the node's ~/map, built "
                        'with the map.* parameters of the YAML (e.g. --set map.voxel_size=0.02'
                        '); with --loop-closure in the map frame, placed by the corrected '
                        'keyframes, and the odom-frame map as map_odom.ply; turns '
                        'stream.enable_depth on')
    p.add_argument('--grid', action='store_true',
                   help='save the occupancy grid of the keyframes as map-server files '
                        "grid.yaml + grid.pgm (the node's ~/grid, grid.* of the YAML; heights "
                        'from z = 0 of the output axes, the first camera: set the band, e.g. '
                        '--set grid.min_height=-1.0 --set grid.max_height=0.5); with '
                        '--loop-closure in the map frame; turns stream.enable_depth on')
    p.add_argument('--depth-topic', default=None,
                   help='depth images aligned to the colour images (16UC1 mm or 32FC1 m): '
                        'metric outputs, as the node with metric.source:=depth')
    p.add_argument('--imu-topic', default=None,
                   help='sensor_msgs/Imu topic of the bag, fused during the run as in the node '
                        '(imu.* of the YAML): metric outputs once its scale locks; the imu '
                        'block of the summary (docs/imu.md)')
    p.add_argument('--imu-truth', default=None,
                   help='with --imu-topic: mounting and time offset of the IMU (replacing '
                        'imu.imu_from_camera and imu.time_offset_s) and its true gravity, for '
                        'the gravity error (the <bag>_imu.json of make-bag --imu)')
    p.add_argument('--cameras', default=None, metavar='NAME=TOPIC,...',
                   help='several cameras, one engine: one TUM per camera in OUT/NAME/, the '
                        'fused odometry in OUT/trajectory.tum (README "Several cameras"; '
                        'mountings from frames.cameras.NAME.base_to_camera of the YAML)')
    p.add_argument('--max-frames', type=int, default=None, help='stop after this many images')
    p.add_argument('--loop-closure', action='store_true',
                   help='close loops (loop.* of the parameter file, enabled): also write '
                        'trajectory_map.tum, the poses in the map frame (needs gtsam)')
    p.add_argument('--torch-threads', type=int, default=0,
                   help='CPU threads of torch (0: torch default; 1 is fastest on a busy '
                        'machine with few cores)')
    p.set_defaults(handler=run_bag)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``lingbot_map_replay`` argument parser with its three subcommands."""
    parser = argparse.ArgumentParser(
        prog='lingbot_map_replay',
        description='Run a rosbag2 bag through the engine offline, play it, or make one.',
        epilog='Run "lingbot_map_replay SUBCOMMAND --help" for the options of each.')
    parser.add_argument('--log-level', default='INFO',
                        choices=('DEBUG', 'INFO', 'WARNING', 'ERROR'), help='logging level')
    subparsers = parser.add_subparsers(dest='command', required=True, metavar='SUBCOMMAND')
    _add_run_parser(subparsers)
    try:
        # `play` needs rclpy; `run` and `make-bag` work without any ROS install.
        from lingbot_map_ros.tools import player
    except ImportError as exc:
        reason = f'play needs rclpy and rosgraph_msgs ({exc})'
        stand_in = subparsers.add_parser('play', help=f'unavailable here: {reason}')
        stand_in.add_argument('args', nargs=argparse.REMAINDER, help='ignored')
        stand_in.set_defaults(handler=lambda _args: _unavailable(reason))
    else:
        player.add_parser(subparsers)
    make_bag.add_parser(subparsers)
    return parser


def _unavailable(reason: str) -> int:
    _LOG.error('%s', reason)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format='[%(levelname)s] %(name)s: %(message)s')
    try:
        return args.handler(args)
    except (bag_io.BagError, LingbotMapError, ValueError, FileNotFoundError) as exc:
        _LOG.error('%s', exc)
        return 1
    except KeyboardInterrupt:
        _LOG.warning('interrupted')
        return 130


if __name__ == '__main__':
    sys.exit(main())
