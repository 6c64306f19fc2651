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
"""The offline core of ``lingbot_map_replay run``: bag messages in, poses (depth, map) out.

:class:`OfflineRunner` treats each frame as the node's worker does
(``ros/inference/session_runner.py``): both feed the session through the same
``engine/session/stream_feeder.py`` policy, so offline results equal what the node publishes in bag
mode:

=======================  ===============================================================
condition                what happens
=======================  ===============================================================
bad image                dropped, reason from ``conversions.ImageConversionError``
undeserializable message dropped as ``bad_message`` (truncated/garbage CDR, bad UTF-8)
invalid stamp            dropped as ``stamp_invalid`` (nanosec outside [0, 1e9))
stamp not newer          dropped as ``stamp_out_of_order``
stamp far ahead          held; fed when the next frame confirms it, else ``stamp_jump_ahead``
new size, not yet seen   dropped as ``resolution_mismatch`` (``resolution_change_frames``)
stamp jumps back         session reset (``clock_jump``), the frame starts a new segment
engine refuses frame     dropped as ``invalid_frame``
session full             rollover (``engine/session/rollover.py``): same segment, continuous poses
session limit            session reset, new segment, the frame is fed again
non-finite pose          session reset (``nan_pose``), the frame is dropped
anything else            raised: unlike the node, the run stops
=======================  ===============================================================

Poses are expressed in the node's map axes (``frames.map_axes``). Rollovers keep one
continuous trajectory; every reset re-anchors the map at the next frame, so poses of
different segments are in different frames; the TUM header lists the segments. Storage that
breaks mid-bag (a corrupt sqlite page) ends the run early: what was read is flushed and
written, and the summary says why under ``storage_error``. ``--ply`` builds the node's
``~/map`` with the same ``map.*`` settings (``tools/replay_map.py``: the odom-frame map, and with
loop closure the ``map``-frame one of keyframe pieces), one ``map.ply`` per segment. With
``metric.source: depth`` and ``RunOptions.depth_topic`` the depth images of that topic are
paired with the frames by the node's
:class:`~lingbot_map_ros.ros.inference.depth_input.DepthInput` (each colour frame is fed once the
messages recorded before the next one were read), so poses, depth and map are in metres.
With ``RunOptions.imu`` (``--imu-topic``) the IMU readings of the bag feed the session's IMU
hook during the run as in the node (``tools/replay_imu.py``): poses, depth and map are in
metres once a session's IMU scale locks, and the summary has an ``imu`` block.
"""

from __future__ import annotations

from collections.abc import Iterable
import dataclasses
from dataclasses import dataclass
import logging
from pathlib import Path
import time
from typing import Any

from lingbot_map_ros.config import EngineConfig, GridConfig, LoopConfig, MapConfig, MetricConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.reasons import POLICY, Reason
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stream_feeder import FeedResult, SessionReset, StreamFeeder
from lingbot_map_ros.engine.stats import RolloverStats
from lingbot_map_ros.ros.inference.depth_input import DepthInput
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.replay_imu import ImuRun, ReplayImu
from lingbot_map_ros.tools.replay_loop import LoopReplay
from lingbot_map_ros.tools.replay_map import ReplayMap
from lingbot_map_ros.tools.trajectory import Trajectory
import numpy as np
from tqdm import tqdm

_LOG = logging.getLogger(__name__)
_ENGINE_SECTIONS = ('model', 'cache', 'stream')


@dataclass(frozen=True)
class RunOptions:
    """What the offline run writes and how it treats stamps."""

    map_axes: str = 'flu'
    """Axes of the map frame of the output poses ('flu' or 'optical'), as the node's."""
    backwards_reset_s: float = 1.0
    """A stamp this much older than the last resets the session (as the node's parameter)."""
    forward_jump_s: float = 0.1
    """A stamp this far ahead waits for the next frame to confirm it (as the node's parameter)."""
    resolution_change_frames: int = 3
    """Frames of a new size before the map restarts at it (as the node's parameter)."""
    save_depth: bool = False
    """Write ``depth/<stamp_ns>.npz`` per frame (depth, depth_conf, intrinsics, c2w)."""
    save_ply: bool = False
    """Write the map of the keyframes as ``map.ply`` (``map_seg<N>.ply`` for later segments;
    with loop closure in ``map``, and the odom-frame one as ``map_odom.ply``)."""
    map: MapConfig = MapConfig()  # noqa: A003 - the map section
    """Settings of that map: the node's ``map.*`` parameters."""
    max_frames: int | None = None
    """Stop after this many image messages."""
    metric: MetricConfig = MetricConfig()
    """The node's ``metric.*`` parameters (metric scale from a depth camera)."""
    depth_topic: str = ''
    """Topic of the depth images among the messages (with ``metric.source: depth``)."""
    loop: LoopConfig | None = None
    """Loop closure (``--loop-closure``): the node's ``loop.*`` parameters; None: off."""
    grid: GridConfig | None = None
    """The occupancy grid (``--grid``): the node's ``grid.*`` parameters, written as map-server
    files ``grid.yaml`` + ``grid.pgm`` per segment; None: none."""
    imu: ImuRun | None = None
    """The IMU fused during the run (``--imu-topic``; its topic's messages among the run's):
    settings and mounting; None: no IMU."""


def make_session(values: dict[str, Any]) -> StreamingSession:
    """Build the engine session from node-style parameter values.

    Args:
        values: flat values as in the node's YAML (engine keys plus ``weights``,
            ``allow_random_weights`` and ``seed``).

    Returns:
        A new session.

    Raises:
        ValueError: no weights and random weights not allowed, or a bad engine value.
        WeightsError: the checkpoint does not match the model.
    """
    config = EngineConfig.from_flat({k: v for k, v in values.items()
                                     if k.partition('.')[0] in _ENGINE_SECTIONS})
    weights = values.get('weights') or None
    random_ok = bool(values.get('allow_random_weights', False))
    if weights is None and not random_ok:
        raise ValueError('no weights: pass --weights /path/to/lingbot-map.pt, or '
                         '--allow-random-weights for a demo with meaningless poses')
    return StreamingSession(config, weights, allow_random_weights=random_ok,
                            seed=int(values.get('seed', 0)))


class OfflineRunner:
    """Feeds raw bag messages to a session and collects what the node would publish."""

    def __init__(self, session: StreamingSession, options: RunOptions, out_dir: Path, *,
                 verifier: Any = None) -> None:
        """Prepare an empty run.

        Args:
            session: a fresh engine session (wrapped in a ``RolloverSession`` unless it is one).
            options: what to write.
            out_dir: output folder (created when something is written).
            verifier: loop candidates' verifier with ``options.loop`` (None: the model's).
        """
        if not isinstance(session, RolloverSession):
            session = RolloverSession(session, options.metric)
        self._session = session
        self._options = options
        self._out = Path(out_dir)
        self._axes = conversions.map_axes_transform(options.map_axes)
        self._feeder = StreamFeeder(session, options.backwards_reset_s,
                                    forward_jump_s=options.forward_jump_s,
                                    resolution_change_frames=options.resolution_change_frames)
        self._stamps: list[int] = []
        self._poses: list[np.ndarray] = []
        self._engine_ms: list[float] = []
        self._drops: dict[str, int] = {}
        self._segments: list[dict[str, Any]] = [
            {'index': 0, 'reason': 'start', 'start_stamp_ns': None, 'poses': 0}]
        # Metric scale: the node's pairing, without waiting (the bag order is known).
        self._depth = DepthInput(options.metric, 64, self._drop, _LOG.debug) \
            if options.metric.enabled and options.depth_topic else None
        self._loop = LoopReplay(session, options.loop, verifier=verifier,
                                scale_fixed=options.metric.enabled) \
            if options.loop is not None else None
        self._map = ReplayMap(options.map, session.config.stream.device, self._axes,
                              self._loop, grid=options.grid, save_ply=options.save_ply) \
            if options.save_ply or options.grid is not None else None
        self._map_poses: np.ndarray | None = None
        self._imu = ReplayImu.from_run(options.imu) if options.imu is not None else None
        if self._imu is not None:  # the node's IMU hook (engine/session/imu_session.py)
            self._imu.attach(session)

    @classmethod
    def from_values(cls, values: dict[str, Any], options: RunOptions,
                    out_dir: Path) -> 'OfflineRunner':
        """Build the session from node-style values (see :func:`make_session`), then the runner."""
        return cls(make_session(values), options, out_dir)

    @property
    def segments(self) -> list[dict[str, Any]]:
        """Return the map segments so far: index, reason, start stamp, poses (first: start)."""
        return self._segments

    @property
    def map_trajectory(self) -> Trajectory | None:
        """Every pose in the loop closure's ``map`` (map axes), after the run; None without."""
        if self._map_poses is None:
            return None
        rigid = [sim3.make(sim3.rotation_of(p), p[:3, 3]) for p in self._map_poses]
        return Trajectory(np.array(self._stamps, dtype=np.int64),
                          np.array([self._axes @ p for p in rigid]).reshape(-1, 4, 4))

    @property
    def trajectory(self) -> Trajectory:
        """Every pose so far, in the map axes, in output order."""
        return Trajectory(np.array(self._stamps, dtype=np.int64),
                          np.array(self._poses).reshape(-1, 4, 4))

    def run(self, messages: Iterable[bag_io.RawMessage], total: int | None = None
            ) -> dict[str, Any]:
        """Process image messages in order, flush the scale buffer, write depth and the map.

        Args:
            messages: raw Image or CompressedImage messages.
            total: number of messages, for the progress bar.

        Returns:
            The summary: frames read, poses, drops by reason, segments, timing.
        """
        limit = self._options.max_frames
        if limit is not None:
            total = limit if total is None else min(total, limit)
        start = time.perf_counter()
        num_read, storage_error = 0, None
        with tqdm(total=total, desc='replay', unit='frame') as bar:
            try:
                for raw in self._with_depth(self._with_imu(messages)):
                    if limit is not None and num_read >= limit:
                        break
                    num_read += 1
                    self._handle(raw)
                    bar.update(1)
            except bag_io.StorageError as exc:
                _LOG.error('%s; stopping after %d messages, writing what was read', exc,
                           num_read)
                storage_error = str(exc)
        self._report(self._feeder.finish(), None)
        wall_s = time.perf_counter() - start
        self._write_map()
        loop = None
        if self._loop is not None:
            self._map_poses = self._loop.map_poses()
            loop = self._loop.summary()
            self._loop.close()
        return {'frames_read': num_read, 'poses': len(self._stamps),
                'drops': dict(sorted(self._drops.items())), 'segments': self._segments,
                **_session_counts(self._session.rollover_stats()),
                'wall_s': round(wall_s, 3),
                'frames_per_s': round(num_read / wall_s, 3) if wall_s > 0 else 0.0,
                'engine_ms_mean': round(float(np.mean(self._engine_ms)), 2)
                if self._engine_ms else 0.0,
                'weights': self._session.weights, 'map_axes': self._options.map_axes,
                'config': self._session.config.to_flat(), 'storage_error': storage_error,
                'metric': {**dataclasses.asdict(self._session.metric.stats()),
                           'depth_drops': 0 if self._depth is None else self._depth.drops_total},
                'loop': loop,
                **({} if self._imu is None else {'imu': self._imu.summary(self._axes)})}

    def tum_comments(self, summary: dict[str, Any]) -> list[str]:
        """Header lines of the TUM file: source, model, drops and map segments."""
        lines = [f'lingbot_map_replay: {summary.get("bag", "")} {summary.get("topic", "")}',
                 f'weights {summary["weights"]}; map axes {summary["map_axes"]}; '
                 'camera optical frame in the map frame; '
                 f'{_units(summary.get("metric", {}).get("state", "off"), summary.get("imu"))}',
                 f'frames read {summary["frames_read"]}, poses {summary["poses"]}, drops '
                 f'{summary["drops"] or "none"}']
        if summary.get('rollovers'):
            lines.append(f'{summary["rollovers"]} session rollovers, Sim(3)-stitched: continuous '
                         'within each segment')
        if len(self._segments) > 1:
            lines.append('session resets split the map: each segment has its own origin/scale')
            lines += [f'segment {s["index"]} ({s["reason"]}) starts at stamp '
                      f'{s["start_stamp_ns"]}, {s["poses"]} poses' for s in self._segments]
        return lines

    def _handle(self, raw: bag_io.RawMessage) -> None:
        try:
            msg = bag_io.deserialize(raw)
            stamp_ns = conversions.stamp_to_ns(msg.header.stamp)
        except (bag_io.BadMessageError, conversions.InvalidStampError) as exc:
            reason = Reason.BAD_MESSAGE if isinstance(exc, bag_io.BadMessageError) \
                else Reason.STAMP_INVALID
            self._drop(reason, str(exc))
            return
        try:
            if raw.msgtype == bag_io.COMPRESSED_TYPE:
                image = conversions.compressed_msg_to_rgb(msg)
            else:
                image = conversions.image_msg_to_rgb(msg)
        except conversions.ImageConversionError as exc:
            self._drop(Reason(exc.reason), str(exc))
            return
        if self._depth is not None:  # metric scale: the frame's depth, before it is fed
            self._depth.pair(stamp_ns, image.shape[:2], self._session.metric, wait=False)
        self._report(self._feeder.feed(image, stamp_ns), stamp_ns)

    def _report(self, fed: FeedResult, stamp_ns: int | None) -> None:
        """Count what feeding a frame (or ending the stream) did, then collect the poses."""
        for reset in fed.resets:
            self._start_segment(reset, stamp_ns)
        for drop in (fed.held_drop, fed.drop):
            if drop is not None:
                self._drop(drop.reason, drop.detail)
        self._collect(fed.predictions)

    def _with_imu(self, messages: Iterable[bag_io.RawMessage]) -> Iterable[bag_io.RawMessage]:
        """Without an IMU the messages; with one, its readings put, the rest each in turn."""
        if self._imu is None:
            return messages
        return self._imu.order(messages, [self._options.depth_topic] if self._depth else [])

    def _with_depth(self, messages: Iterable[bag_io.RawMessage]
                    ) -> Iterable[bag_io.RawMessage]:
        """Yield the image messages; each once the messages up to the next one were read.

        The depth images in between go into the pairing buffer, so a frame finds its depth
        whether it was recorded just before or just after it.
        """
        if self._depth is None:
            yield from messages
            return
        waiting = None
        for raw in messages:
            if raw.topic == self._options.depth_topic:
                try:
                    self._depth.put(bag_io.deserialize(raw))
                except bag_io.BadMessageError as exc:
                    self._drop(Reason.BAD_MESSAGE, f'depth: {exc}')
                continue
            try:
                self._depth.note_colour(bag_io.deserialize(raw).header.stamp)
            except bag_io.BadMessageError:
                pass  # dropped with its reason when it is handled
            if waiting is not None:
                yield waiting
            waiting = raw
        if waiting is not None:
            yield waiting

    def _drop(self, reason: Reason | str, detail: str) -> None:
        reason = Reason(reason)
        self._drops[reason.value] = self._drops.get(reason.value, 0) + 1
        # The first drop of each kind is worth seeing; the summary counts the rest.
        level = POLICY[reason].log_level if self._drops[reason.value] == 1 else logging.DEBUG
        _LOG.log(level, 'dropped frame (%s): %s', reason, detail)

    def _start_segment(self, reset: SessionReset, stamp_ns: int | None) -> None:
        self._write_map()
        _LOG.log(POLICY[reset.reason].log_level, 'session reset (%s): %s; cleared %s',
                 reset.reason, reset.detail, reset.cleared)
        self._segments.append({'index': len(self._segments), 'reason': reset.reason.value,
                               'start_stamp_ns': stamp_ns, 'poses': 0})
        if self._loop is not None:
            self._loop.reset()
        if self._imu is not None:
            self._imu.new_segment()

    def _collect(self, preds: list[FramePrediction]) -> None:
        segment = self._segments[-1]
        for pred in preds:
            c2w = self._axes @ pred.c2w
            if segment['start_stamp_ns'] is None:
                segment['start_stamp_ns'] = pred.stamp_ns
            segment['poses'] += 1
            self._stamps.append(pred.stamp_ns)
            self._poses.append(c2w)
            self._engine_ms.append(pred.timings_ms.get('total', 0.0))
            if self._imu is not None:
                self._imu.note_pose(pred.stamp_ns)
            if self._loop is not None:
                self._loop.add(pred)
            if pred.depth is not None:
                self._save_dense_outputs(pred, c2w)

    def _save_dense_outputs(self, pred: FramePrediction, c2w: np.ndarray) -> None:
        if self._options.save_depth:
            folder = self._out / 'depth'
            folder.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(folder / f'{pred.stamp_ns}.npz', depth=pred.depth.cpu().numpy(),
                                depth_conf=pred.depth_conf.cpu().numpy(),
                                intrinsics=pred.intrinsics, c2w=c2w)
        if self._map is not None and pred.is_keyframe:
            self._map.add(pred)

    def _write_map(self) -> None:
        """Write the current segment's maps (before its loop closure ends) and start anew."""
        if self._map is not None:
            self._map.write(self._out, len(self._segments) - 1)


def _session_counts(rollover: RolloverStats) -> dict[str, Any]:
    """``sessions`` (engine sessions, rollovers included) and the rollover numbers."""
    return {'sessions': rollover.sessions, 'rollovers': rollover.rollovers,
            'degenerate_alignments': rollover.degenerate_alignments,
            'max_rollover_ms': round(rollover.max_rollover_ms, 2)}


def _units(metric_state: str, imu: dict[str, Any] | None = None) -> str:
    """Say in which units the poses are, from the depth camera's or the IMU's state."""
    if metric_state in ('locked', 'settling'):
        return 'metres (metric scale from the depth camera)'
    if imu and imu.get('lock_stamp_ns') is not None:
        return (f"metres from stamp {imu['lock_stamp_ns']} on (IMU scale), the model's "
                'units before it')
    return 'non-metric scale'
