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
"""``lingbot_map_replay run BAG``: the bag's cameras offline, one engine; one camera or several.

One code path for any number of cameras, one camera being a list of one: every camera's topic
runs through its own :class:`~lingbot_map_ros.tools.offline.OfflineRunner`, all sessions streams
of one engine (the weights loaded once, one page pool), exactly as the node's cameras (README
"Several cameras"), and each camera writes what a single-camera run writes (:func:`run_camera`:
``trajectory.tum``, its camera pose in its map axes; ``trajectory.png``, ``summary.json``,
``--depth``, ``--ply``, ``--loop-closure``'s ``trajectory_map.tum``). The one unnamed camera
(``--topic``, or the bag's only image topic) writes into ``OUT/``, with ``metric.source: depth``
its depth images paired from ``--depth-topic``, its IMU fused from ``--imu-topic``
(``replay_imu.py``), and ``--gt`` compares its trajectory.

Named cameras (``--cameras a=/topic_a,b=/topic_b``) write into ``OUT/<name>/``. Then the node's
fusion runs on them (:class:`~lingbot_map_ros.engine.cameras.camera_rig.CameraRig`): each
camera's ``base_frame`` trajectory (through its mounting ``frames.cameras.<name>.base_to_camera``)
aligned to the primary's, the source camera chosen by bag time (a camera without a pose for
``diagnostics.stale_after_s`` hands over), and ``OUT/trajectory.tum`` is the fused odometry:
``base_frame`` in ``odom``, what ``~/pose`` carries. ``OUT/<name>/aligned.tum`` is each camera's
base trajectory in that ``odom`` (``~/<name>/pose``). ``OUT/summary.json`` holds every camera's
summary and the alignment. With ``--gt`` the fused odometry is compared with the ground truth
(APE/RPE after a Sim(3) alignment, ``OUT/trajectory.png``). With ``--ply`` each camera writes its
own map in its own map axes (``OUT/<name>/map.ply``); there is no fused map file. Every file
written is logged, and so is a camera whose alignment to the primary is degenerate.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from lingbot_map_ros.engine.cameras.camera_rig import CameraRig
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.publishers.odom_frames import OdomFrames
from lingbot_map_ros.tools import bag_io, replay_imu, strict_json, trajectory
from lingbot_map_ros.tools.offline import make_session, OfflineRunner, RunOptions
import numpy as np

_LOG = logging.getLogger('lingbot_map_replay')


def parse_cameras(text: str) -> dict[str, str]:
    """``'front=/cam_front/image_raw,left=/cam_left/image_raw'`` -> ``{name: topic}``.

    Raises:
        ValueError: an item without ``=``, an empty name or topic, or a name or topic twice.
    """
    cameras: dict[str, str] = {}
    for item in (i.strip() for i in text.split(',') if i.strip()):
        name, sep, topic = (part.strip() for part in item.partition('='))
        if not sep or not name or not topic:
            raise ValueError(f"--cameras: '{item}' is not NAME=TOPIC")
        topic = topic if topic.startswith('/') else '/' + topic
        if name in cameras or topic in cameras.values():
            raise ValueError(f"--cameras: '{name}' or '{topic}' is given twice")
        cameras[name] = topic
    if not cameras:
        raise ValueError('--cameras: no camera given (NAME=TOPIC,NAME=TOPIC)')
    return cameras


def make_sessions(values: dict[str, Any], names: list[str]) -> dict[str, StreamingSession]:
    """One session per camera on one engine (weights once, a pool stream per camera)."""
    streams = max(int(values.get('cache.streams', 1)), len(names))
    values = {**values, 'cache.streams': streams}
    first = make_session(values)
    config = first.config
    sessions = {names[0]: first}
    for name in names[1:]:
        sessions[name] = StreamingSession(config, engine=first.engine)
    return sessions


def run_cameras(bag: str, cameras: dict[str, str], values: dict[str, Any],
                options: RunOptions, out: Path, gt: str | None = None) -> dict[str, Any]:
    """Replay every camera, fuse named ones, write the outputs; return the summary.

    Args:
        bag: the rosbag2 folder.
        cameras: ``{name: image topic}``; ``{'': topic}`` is the one unnamed camera (topic
            '': the bag's only image topic).
        values: node-style parameter values.
        options: what to write (per camera).
        out: output folder.
        gt: optional ground-truth TUM file, compared with the odometry (fused when named).

    Returns:
        The one camera's summary, or with named cameras each one's, the fusion's and the
        alignment (:func:`exit_code` reads either).

    Raises:
        BagError: a topic is missing or not an image topic (checked before the model is
            built).
        ValueError: bad parameters (cameras, mountings) or a bad engine value.
    """
    names = list(cameras)
    solo = names == ['']
    if options.metric.enabled and not solo:
        raise ValueError("metric.source 'depth' is not available with --cameras")
    if options.imu is not None and not solo:
        raise ValueError('--imu-topic is not available with --cameras')
    primary = '' if solo else values.get('input.primary_camera') or names[0]
    if primary not in cameras:
        raise ValueError(f"input.primary_camera '{primary}' is not one of --cameras")
    mounts = {n: values.get(f'frames.cameras.{n}.base_to_camera',
                            values.get('frames.base_to_camera', [0, 0, 0, 0, 0, 0, 1]))
              for n in names}
    # Checks the mountings first; the one camera's base pose is not written (no fusion).
    frames = {} if solo else {n: OdomFrames(m) for n, m in mounts.items()}
    # The topics before the model: a typo must not cost the weights' load (a minute at 4.6 GB).
    with bag_io.open_bag(bag) as reader:
        for topic in cameras.values():
            camera_topics(reader, topic, options)
        if options.imu is not None:
            replay_imu.require_topic(reader, options.imu.config.topic)
    sessions = make_sessions(values, names)
    summaries, runners = {}, {}
    with bag_io.open_bag(bag) as reader:
        for name, topic in cameras.items():
            runners[name], summaries[name] = run_camera(
                reader, str(bag), name, topic, sessions[name], options, out / name,
                gt if solo else None)
    if solo:
        return summaries['']
    fused, aligned, rig = fuse(runners, frames, primary, options.map_axes,
                               int(round(float(values.get('input.sync_tolerance_s', 0.01)) * 1e9)),
                               float(values.get('diagnostics.stale_after_s', 5.0)))
    for name, runner in runners.items():
        if runner.trajectory.stamps_ns.size:
            trajectory.write_tum(out / name / 'aligned.tum', aligned[name],
                                 [f'lingbot_map_replay --cameras: {name}: base_frame in odom '
                                  f'(aligned to {primary}), as ~/{name}/pose'])
    states = rig.states(float('inf'))
    result = {'bag': str(bag), 'cameras': summaries, 'primary': primary,
              'fused_poses': int(fused.stamps_ns.size), 'switches': rig.switches,
              'alignment': {s.name: dataclasses.asdict(s) for s in states}}
    if fused.stamps_ns.size:
        trajectory.write_tum(out / 'trajectory.tum', fused,
                             [f'lingbot_map_replay --cameras {",".join(names)}: the fused '
                              f'odometry, base_frame in odom (~/pose); primary {primary}; '
                              f'{rig.switches} source switches'])
        if gt:
            _compare(out, fused, gt, result)
    out.mkdir(parents=True, exist_ok=True)
    strict_json.write(out / 'summary.json', result)
    _log_outputs(states, summaries, out)
    _LOG.info('fused odometry: %d poses, %d source switches', result['fused_poses'],
              result['switches'])
    return result


def exit_code(result: dict[str, Any]) -> int:
    """Return the run's exit code: 2 storage broke mid-bag, 1 no odometry, 0 otherwise."""
    cameras = result.get('cameras', {'': result})
    if any(c.get('storage_error') for c in cameras.values()):
        return 2  # outputs cover the bag up to the broken storage only
    return 0 if result.get('fused_poses', result.get('poses')) else 1


def run_camera(reader: Any, bag: str, name: str, topic: str, session: StreamingSession,
               options: RunOptions, out: Path, gt: str | None
               ) -> tuple[OfflineRunner, dict[str, Any]]:
    """Replay one camera's topic (and its depth topic) and write its outputs into ``out``.

    Returns:
        The camera's runner and its summary (also written as ``out/summary.json``).

    Raises:
        BagError: the topic (or the depth topic) is missing or not an image topic.
        ValueError: ``metric.source: depth`` without a depth topic.
    """
    info, depth = camera_topics(reader, topic, options)
    topics = [info.name] + ([depth.name] if depth is not None else []) + \
        ([options.imu.config.topic] if options.imu is not None else [])
    runner = OfflineRunner(session, options, out)
    summary = runner.run(bag_io.read_raw(reader, topics), info.num_messages)
    summary.update(bag=bag, topic=info.name, msgtype=info.msgtype)
    if name:
        summary['camera'] = name
    if runner.trajectory.stamps_ns.size == 0:
        _LOG.error('%sno poses: %d frames read, drops %s', f'camera {name}: ' if name else '',
                   summary['frames_read'], summary['drops'])
    else:
        write_trajectory(out, bag, runner, summary, options.map_axes, gt)
    out.mkdir(parents=True, exist_ok=True)
    strict_json.write(out / 'summary.json', summary)
    log_summary(summary, out)
    return runner, summary


def _compare(out: Path, fused: trajectory.Trajectory, gt: str, result: dict[str, Any]) -> None:
    """Plot the fused odometry against the ground truth and add APE/RPE to ``result``."""
    trajectory.plot(out / 'trajectory.png', fused, trajectory.read_tum(gt),
                    title=f'fused odometry: {fused.stamps_ns.size} poses')
    result['evaluation'] = evaluation = trajectory.evaluate(out / 'trajectory.tum', gt)
    if evaluation is None:
        _LOG.warning('--gt: evo is not installed; no APE/RPE')
        return
    _LOG.info('fused odometry vs ground truth (Sim(3)-aligned, %d pairs): APE rmse %.4f, '
              'RPE rmse %.4f', evaluation['num_pairs'], evaluation['ape_m']['rmse'],
              evaluation['rpe_m']['rmse'])


def _log_outputs(states: list[Any], summaries: dict[str, Any], out: Path) -> None:
    """Log each camera's alignment (a WARN when degenerate) and every file written."""
    for state in states:
        _LOG.info('camera %s: %d poses, alignment scale %.4f, residual %.4f (%d common stamps)',
                  state.name, summaries[state.name]['poses'], state.scale, state.residual,
                  state.matched)
        if state.degenerate:
            _LOG.warning('camera %s: its alignment to the primary is degenerate (too few '
                         'common stamps or too little motion); its aligned poses are not '
                         'trustworthy', state.name)
    names = ['trajectory.tum', 'trajectory.png', 'summary.json'] + [
        f'{state.name}/aligned.tum' for state in states]  # each camera's own: run_camera
    for name in names:
        if (out / name).exists():
            _LOG.info('wrote %s', out / name)


def camera_topics(reader: Any, topic: str, options: RunOptions
                  ) -> tuple[bag_io.TopicInfo, bag_io.TopicInfo | None]:
    """Return one camera's image topic and depth topic (None without metric depth).

    Raises:
        BagError: the topic (or the depth topic) is missing or not an image topic.
        ValueError: ``metric.source: depth`` without a depth topic.
    """
    depth = None
    if options.metric.enabled:
        if not options.depth_topic:
            raise ValueError("metric.source is 'depth': name the depth topic with "
                             '--depth-topic')
        try:  # checked first: a missing one is not a reason to ask for --topic
            depth = bag_io.require_topic(reader, options.depth_topic, (bag_io.IMAGE_TYPE,))
        except bag_io.BagError as exc:
            raise bag_io.BagError(f'--depth-topic: {exc}') from None
    return pick_topic(reader, topic or None, options.depth_topic), depth


def pick_topic(reader: Any, topic: str | None, depth_topic: str = '') -> bag_io.TopicInfo:
    """Return ``topic``'s info, or without one the bag's only image topic (not the depth's).

    Raises:
        BagError: the topic is missing, or none given and the bag has not one image topic.
    """
    if topic:
        return bag_io.require_topic(reader, topic, bag_io.IMAGE_TYPES)
    topics = bag_io.list_topics(reader)
    images = [t for t in topics.values()
              if t.msgtype in bag_io.IMAGE_TYPES and t.name != depth_topic]
    if len(images) != 1:
        raise bag_io.BagError(f'the bag has {len(images)} image topics; pick one with --topic:'
                              f'\n{bag_io.describe_topics(topics)}')
    return images[0]


def write_trajectory(out: Path, bag: str, runner: OfflineRunner, summary: dict[str, Any],
                     map_axes: str, gt: str | None) -> None:
    """Write a camera's TUM files and plot; with ``gt`` add APE/RPE to ``summary``."""
    tum = out / 'trajectory.tum'
    trajectory.write_tum(tum, runner.trajectory, runner.tum_comments(summary))
    map_tum = out / 'trajectory_map.tum'
    if runner.map_trajectory is not None:  # --loop-closure
        trajectory.write_tum(map_tum, runner.map_trajectory, runner.tum_comments(summary) + [
            'loop closure: poses in the map frame (the pose graph, corrected after the run)'])
    truth = trajectory.read_tum(gt) if gt else None
    trajectory.plot(out / 'trajectory.png', runner.trajectory, truth,
                    title=f'{Path(bag).name}: {summary["poses"]} poses', map_axes=map_axes)
    if gt:
        if len(summary['segments']) > 1:
            _LOG.warning('%d map segments (session resets): APE/RPE over all of them mixes '
                         'frames', len(summary['segments']))
        summary['evaluation'] = trajectory.evaluate(tum, gt)
        if map_tum.exists():
            summary['evaluation_map'] = trajectory.evaluate(map_tum, gt)


def log_summary(summary: dict[str, Any], out: Path) -> None:
    """Log a camera's counts, resets, evaluation and every file it wrote."""
    drops = ', '.join(f'{k}={v}' for k, v in summary['drops'].items()) or 'none'
    camera = f"camera {summary['camera']}: " if summary.get('camera') else ''
    _LOG.info('%sframes read %d, poses %d, drops: %s; %.1f s, %.2f frames/s '
              '(engine %.0f ms/frame)', camera, summary['frames_read'], summary['poses'], drops,
              summary['wall_s'], summary['frames_per_s'], summary['engine_ms_mean'])
    for seg in summary['segments'][1:]:
        _LOG.warning('%ssession reset (%s) at stamp %s: new map segment %d', camera,
                     seg['reason'], seg['start_stamp_ns'], seg['index'])
    evaluation = summary.get('evaluation')
    if evaluation:
        _LOG.info('vs ground truth (Sim(3)-aligned, %d pairs): APE rmse %.4f, RPE rmse %.4f',
                  evaluation['num_pairs'], evaluation['ape_m']['rmse'],
                  evaluation['rpe_m']['rmse'])
    evaluation = summary.get('evaluation_map')
    if evaluation:
        _LOG.info('map frame (loop closure) vs ground truth: APE rmse %.4f, RPE rmse %.4f',
                  evaluation['ape_m']['rmse'], evaluation['rpe_m']['rmse'])
    for name in ('trajectory.tum', 'trajectory_map.tum', 'trajectory.png', 'map.ply',
                 'map_odom.ply', 'depth', 'summary.json'):
        if (out / name).exists():
            _LOG.info('wrote %s', out / name)


def fuse(runners: dict[str, OfflineRunner], frames: dict[str, OdomFrames], primary: str,
         map_axes: str, tolerance_ns: int, stale_after_s: float
         ) -> tuple[trajectory.Trajectory, dict[str, trajectory.Trajectory], CameraRig]:
    """Run the node's fusion over the cameras' poses, in stamp order (bag time as the clock).

    Returns:
        The fused trajectory, each camera's aligned base trajectory, and the rig.
    """
    world_from_map = np.linalg.inv(conversions.map_axes_transform(map_axes))
    events = []
    for order, (name, runner) in enumerate(runners.items()):
        starts = {s['start_stamp_ns'] for s in runner.segments[1:]}
        traj = runner.trajectory
        for stamp, c2w in zip(traj.stamps_ns.tolist(), traj.c2w):
            events.append((stamp, name != primary, order, name, world_from_map @ c2w,
                           stamp in starts))
    events.sort(key=lambda e: e[:3])
    rig = CameraRig(list(runners), primary, tolerance_ns, stale_after_s)
    fused_s, fused_p = [], []
    aligned: dict[str, tuple[list, list]] = {n: ([], []) for n in runners}
    for stamp, _, _, name, c2w, new_segment in events:
        if new_segment:  # a reset: the camera's odom starts again, as in the node
            frames[name].clear()
            rig.clear(name)
        update = rig.add(name, stamp, frames[name].base_in_odom(c2w), stamp * 1e-9)
        aligned[name][0].append(stamp)
        aligned[name][1].append(update.aligned)
        if update.fused is not None:
            fused_s.append(stamp)
            fused_p.append(update.fused)
    as_traj = {n: _trajectory(*a) for n, a in aligned.items()}
    return _trajectory(fused_s, fused_p), as_traj, rig


def _trajectory(stamps: list[int], poses: list[np.ndarray]) -> trajectory.Trajectory:
    return trajectory.Trajectory(np.array(stamps, dtype=np.int64),
                                 np.array(poses, dtype=np.float64).reshape(-1, 4, 4))
