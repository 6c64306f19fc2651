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
"""The worker-thread side of the node: one input frame in, outputs published, errors absorbed.

For each queued message of its camera :class:`SessionRunner` converts the image and tags it
(:meth:`~SessionRunner.prepare`; :class:`~lingbot_map_ros.engine.frames.FrameTag`: stamp, camera
frame, receipt time), hands its
:class:`~lingbot_map_ros.engine.session.stream_feeder.StreamFeeder` (which checks the stamp and
holds the drop and reset policy) to the camera group's batch (:meth:`~SessionRunner.begin`;
``camera_group.py``, one camera being a group of one) and publishes the predictions
(:meth:`~SessionRunner.finish`), each with the frame and latency its tag carries back. Every
failure ends as a counted drop or a counted reset (a
:class:`~lingbot_map_ros.engine.session.reasons.Reason`, logged at its policy's level), never as
an exception into the executor:

=======================  ===============================================================
condition                what happens
=======================  ===============================================================
bad image                dropped, reason from the converter (encoding/size/step/...)
invalid stamp            dropped as ``stamp_invalid`` (nanosec outside [0, 1e9))
stamp not newer          dropped as ``stamp_out_of_order`` (small step back, duplicate)
stamp far ahead          held; fed when the next frame confirms it, else ``stamp_jump_ahead``
new size, not yet seen   dropped as ``resolution_mismatch`` (``resolution_change_frames``)
stamp jumps back         session reset (``clock_jump``), the frame starts the new map
engine refuses frame     dropped as ``invalid_frame``
session full             rollover (``engine/session/rollover.py``): no reset, poses stay continuous
session limit            session reset (``time_index_limit``, ``cache_full``,
                         ``resolution_changed``), the frame is fed again
non-finite pose          session reset (``nan_pose``), the frame is dropped
anything else            counted engine error, session reset (``engine_error``)
=======================  ===============================================================

One lock serialises a feed (``begin`` to ``finish``) and ``reset`` so the path, the stamp history
and the session always agree; the reset service waits at most one frame for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.reasons import POLICY, Reason
from lingbot_map_ros.engine.session.stream_feeder import FeedResult, StreamFeeder
from lingbot_map_ros.engine.stats import RolloverStats, SessionStats
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters.node_options import NodeOptions
from lingbot_map_ros.ros.publishers.diagnostics import NodeStats
from lingbot_map_ros.ros.publishers.outputs import Outputs
import numpy as np

DEFAULT_CAMERA_FRAME = 'camera_optical_frame'
_THROTTLE_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class InputFrame:
    """A message as it left the subscription callback."""

    msg: Any
    compressed: bool
    received_s: float
    """``time.monotonic()`` at reception, for the end-to-end latency."""
    camera: str = ''
    """The camera's name (``input.cameras``); '' with one camera."""


class SessionRunner:
    """Feeds frames to a ``StreamingSession`` and publishes what comes out."""

    def __init__(self, session: Any, outputs: Outputs, stats: NodeStats, logger: Any,
                 options: NodeOptions,
                 convert_raw: Callable[[Any], np.ndarray],
                 extra_outputs: Sequence[Any] = (), depth_input: Any = None) -> None:
        """Wire the runner.

        Args:
            session: the engine's ``StreamingSession``.
            outputs: the publishers.
            stats: shared counters.
            logger: the node's logger.
            options: the node options at start (``set_options`` replaces them).
            convert_raw: ``sensor_msgs/Image`` -> RGB converter (cv_bridge or ours).
            extra_outputs: more outputs with ``publish(pred, camera_frame, opts)`` and
                ``clear()``, served after ``outputs`` (the map).
            depth_input: the ``DepthInput`` pairing depth images with the frames
                (``metric.source: depth``), or None.
        """
        self._session = session
        self._outputs = outputs
        self._stats = stats
        self._log = logger
        self._options = options
        self._convert_raw = convert_raw
        self._extra_outputs = tuple(extra_outputs)
        self.depth_input = depth_input
        self._lock = threading.Lock()
        self._feeder = StreamFeeder(session, reset_on_error=True,
                                    on_reset=self._on_session_reset)
        self._pending_reset: Reason | None = None
        self._pending_config: EngineConfig | None = None
        self._camera_k: np.ndarray | None = None
        self._camera_k_logged = False
        self._drop_log: dict[Reason, tuple[float, int]] = {}
        self._session_stats: SessionStats = session.stats()
        self._rollover_stats: RolloverStats = session.rollover_stats()
        self._busy_since: float | None = None

    def session_stats(self) -> SessionStats:
        """Return the session's ``stats()`` as of the last frame or reset (never blocks)."""
        return self._session_stats

    def rollover_stats(self) -> RolloverStats:
        """Return the rollover counters as of the last frame or reset (never blocks)."""
        return self._rollover_stats

    def _take_snapshot(self) -> None:
        self._session_stats = self._session.stats()
        self._rollover_stats = self._session.rollover_stats()

    def set_options(self, options: NodeOptions) -> None:
        """Use ``options`` from the next frame on (safe from any thread)."""
        self._options = options

    @property
    def reset_pending(self) -> bool:
        """Return True when a reset waits for the next frame (after a wait for a busy frame)."""
        return self._pending_reset is not None

    def busy_s(self) -> float | None:
        """Seconds the frame in progress has taken so far, None when idle (never blocks)."""
        since = self._busy_since
        return None if since is None else time.monotonic() - since

    def set_camera_k(self, k: np.ndarray) -> None:
        """Store the camera_info intrinsics, to compare once with the estimate."""
        self._camera_k = k

    def set_pending_config(self, config: EngineConfig) -> None:
        """Use ``config`` (only its live fields may differ) from the next reset on."""
        self._pending_config = config

    def request_reset(self, reason: Reason | str) -> None:
        """Reset before the next frame (safe from any thread, never blocks).

        Raises:
            ValueError: ``reason`` is not a :class:`Reason` value.
        """
        self._pending_reset = Reason(reason)

    def reset(self, reason: Reason | str, timeout_s: float, detail: str = ''
              ) -> dict[str, int] | None:
        """Reset now, waiting at most ``timeout_s`` for the frame in progress.

        Returns:
            What was cleared, or None when the lock was busy (a reset is then requested for
            the next frame).

        Raises:
            ValueError: ``reason`` is not a :class:`Reason` value.
        """
        reason = Reason(reason)
        if not self._lock.acquire(timeout=timeout_s):
            self.request_reset(reason)
            return None
        try:
            return self._reset_locked(reason, detail)
        finally:
            self._lock.release()

    def add_outputs(self, *outputs: Any) -> None:
        """Serve ``outputs`` too, after those given at start (before the first frame)."""
        self._extra_outputs += outputs

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Mark a frame in progress for :meth:`busy_s` (the stall watch) while in the block."""
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = None

    @property
    def lock(self) -> threading.Lock:
        """Return the lock :meth:`begin` and :meth:`finish` run under (with ``reset``)."""
        return self._lock

    @property
    def session(self) -> Any:
        """Return the session this runner feeds."""
        return self._session

    def prepare(self, item: InputFrame, opts: NodeOptions
                ) -> tuple[np.ndarray, FrameTag] | None:
        """Convert and tag a frame; None when it was dropped (counted and logged)."""
        image = self._convert(item)
        if image is None:
            return None
        try:
            stamp_ns = conversions.stamp_to_ns(item.msg.header.stamp)
        except conversions.InvalidStampError as exc:
            self._drop(Reason.STAMP_INVALID, str(exc))
            return None
        frame_id = opts.camera_frame or item.msg.header.frame_id
        if not frame_id:
            frame_id = DEFAULT_CAMERA_FRAME
            self._log.warning(f"input image has no frame_id; using '{frame_id}' (set "
                              'frames.camera_frame)', throttle_duration_sec=60.0)
        if self.depth_input is not None:  # metric scale: the frame's depth, before it is fed
            self.depth_input.pair(stamp_ns, image.shape[:2], self._session.metric)
        return image, FrameTag(stamp_ns, frame_id, item.received_s)

    def begin(self, opts: NodeOptions) -> StreamFeeder:
        """Run a pending reset and return the feeder set to ``opts`` (hold :attr:`lock`)."""
        if self._pending_reset is not None:
            self._reset_locked(self._pending_reset, 'requested')
        self._feeder.backwards_reset_s = opts.backwards_reset_s
        self._feeder.jump_guard.forward_jump_s = opts.forward_jump_s
        self._feeder.resolution_guard.change_frames = opts.resolution_change_frames
        return self._feeder

    def finish(self, fed: FeedResult, opts: NodeOptions) -> None:
        """Count, log and publish what a feed gave (hold :attr:`lock`)."""
        self._report(fed)
        self._publish(fed.predictions, opts)
        self._take_snapshot()

    def _convert(self, item: InputFrame) -> np.ndarray | None:
        try:
            if item.compressed:
                return conversions.compressed_msg_to_rgb(item.msg)
            return self._convert_raw(item.msg)
        except conversions.ImageConversionError as exc:
            self._drop(Reason(exc.reason), str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. CvBridgeError; never kill the thread
            self._drop(Reason.DECODE, f'{type(exc).__name__}: {exc}')
        return None

    def _drop(self, reason: Reason, detail: str) -> None:
        self._stats.count_drop(reason, detail)
        # Throttled per reason, so a flood of one kind does not hide the first of another.
        now = time.monotonic()
        last, suppressed = self._drop_log.get(reason, (-_THROTTLE_S, 0))
        if now - last < _THROTTLE_S:
            self._drop_log[reason] = (last, suppressed + 1)
            return
        more = f' ({suppressed} more since the last message)' if suppressed else ''
        # One call site per severity: rclpy's logger refuses to change it at a call site.
        message = f'dropped frame ({reason}): {detail}{more}'
        if POLICY[reason].log_level >= logging.WARNING:
            self._log.warning(message)
        else:
            self._log.debug(message)
        self._drop_log[reason] = (now, 0)

    def _report(self, fed: FeedResult) -> None:
        for reset in fed.resets:
            if POLICY[reset.reason].error:
                error = f'{type(reset.error).__name__}: {reset.error}'
                self._stats.count_error(error)
                self._log.error(f'engine error, resetting the session: {error}',
                                throttle_duration_sec=_THROTTLE_S)
            self._record_reset(reset.reason, reset.detail, reset.cleared)
        if fed.held_drop is not None:
            self._drop(fed.held_drop.reason, fed.held_drop.detail)
        if fed.drop is not None:
            self._drop(fed.drop.reason, fed.drop.detail)

    def _publish(self, preds: list[FramePrediction], opts: NodeOptions) -> None:
        for pred in preds:
            tag = pred.tag  # the frame's own: its camera frame and when it came in
            try:
                self._outputs.publish(pred, tag.frame_id, opts)
            except ValueError as exc:
                self._reset_locked(Reason.NAN_POSE, str(exc))
                return
            for extra in self._extra_outputs:
                extra.publish(pred, tag.frame_id, opts)
            received = time.monotonic() if tag.received_s is None else tag.received_s
            self._stats.count_output((time.monotonic() - received) * 1e3,
                                     pred.timings_ms.get('total'))
            self._compare_camera_info(pred)

    def _reset_locked(self, reason: Reason, detail: str) -> dict[str, int]:
        return self._record_reset(reason, detail, self._feeder.reset())

    def _on_session_reset(self) -> None:
        """Run by the feeder right after every session reset, before any frame is fed again."""
        self._pending_reset = None
        if self._pending_config is not None:
            # Applied here so that a frame fed again after a limit reset already sees it.
            self._session.apply_config(self._pending_config)
            self._pending_config = None

    def _record_reset(self, reason: Reason, detail: str, cleared: dict[str, int]
                      ) -> dict[str, int]:
        cleared = {**cleared, 'path_poses': self._outputs.clear()}
        for extra in self._extra_outputs:
            extra.clear()
        self._stats.count_reset(reason, detail)
        summary = ', '.join(f'{k}={v}' for k, v in cleared.items())
        level = POLICY[reason].log_level
        message = f'session reset ({reason}): {detail}; cleared {summary}'
        if level >= logging.ERROR:
            self._log.error(message, throttle_duration_sec=1.0)
        elif level >= logging.WARNING:
            self._log.warning(message, throttle_duration_sec=1.0)
        else:
            self._log.info(f'session reset on request; cleared {summary}')
        self._take_snapshot()
        return cleared

    def _compare_camera_info(self, pred: FramePrediction) -> None:
        if self._camera_k is None or self._camera_k_logged:
            return
        self._camera_k_logged = True
        ours, theirs = pred.intrinsics_original, self._camera_k
        self._log.info(
            'intrinsics estimated for the input image vs camera_info: '
            f'fx {ours[0, 0]:.1f} vs {theirs[0, 0]:.1f}, fy {ours[1, 1]:.1f} vs '
            f'{theirs[1, 1]:.1f}, cx {ours[0, 2]:.1f} vs {theirs[0, 2]:.1f}, cy '
            f'{ours[1, 2]:.1f} vs {theirs[1, 2]:.1f} (camera_info is only compared, not used)')
