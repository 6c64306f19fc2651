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
"""Counters of the node and their ``/diagnostics`` rendering.

:class:`NodeStats` is written by the subscription and worker threads and read by the diagnostics
timer, so every access takes its lock. Each diagnostics period turns the counters into three
``DiagnosticStatus`` entries named like ``diagnostic_updater`` names them
(``<node name>: <task>``), so ``diagnostic_aggregator`` analyzers and ``rqt_robot_monitor`` group
them as usual:

- ``input``: rates, queue, drops by reason. STALE when no image arrived for
  ``diagnostics.stale_after_s`` (or none yet), WARN when a frame was dropped in the period for any
  reason other than the live queue keeping only the newest frame (that is by design), else OK.
- ``engine``: backend, device, weights, latency, resets, non-finite numbers kept off the topics
  (``nonfinite.*``). ERROR when the engine raised an
  unexpected error in the period, WARN when the session was reset automatically in the period.
- ``cache``: the KV cache's own counters and the engine page pool's (``pool_*``, numbers from
  the start). Past 90 % of the keyframe or time-index ceiling it says what comes next
  (``next_at_capacity``): a rollover (OK; the node's sessions always roll over before either
  ceiling) or, without rollovers, an automatic reset (WARN).

Each status has the same keys in every state (before the first frame, while buffering, after a
reset): a value that does not exist yet reads ``n/a``, every known drop and reset reason is
listed with its count (0 included), and ``last_problem`` reads ``none`` until the first problem,
then the latest one (the level says whether it happened in the period). Latencies are those of
the last period that published frames (``n/a`` before the first), so a quiet period does not
read 0.
Monitors can then key on names without guarding against missing ones.

The node publishes these itself rather than through ``diagnostic_updater``: the message on the
wire is the same, the period is our own parameter, and the path is tested here.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
import threading
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from lingbot_map_ros.engine.session.reasons import node_reasons, POLICY, Reason
from lingbot_map_ros.engine.stats import (CACHE_STATS_FIELDS, CacheStats, FALLBACK_KINDS,
                                          POOL_STATS_FIELDS, SESSION_STATS_FIELDS, SessionStats)
from lingbot_map_ros.kernel_config import KernelConfig

OK, WARN, ERROR, STALE = (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR,
                          DiagnosticStatus.STALE)

# Fraction of a ceiling past which the cache status warns.
_NEAR_FULL = 0.9
# Reasons always listed (with 0) so the key set does not depend on what happened yet; what each
# one does (fault or normal operation) is the engine's one policy table.
KNOWN_DROPS = node_reasons(resets=False)
KNOWN_RESETS = node_reasons(resets=True)
KNOWN_NONFINITE = ('depth_pixels', 'depth_camera_info', 'odometry_twist', 'odometry_covariance')
"""Non-finite numbers kept off the topics (``outputs.py``): depth pixels written as 0, a depth
image + camera_info pair not published, an odometry twist published as zero, an IMU
dead-reckoning covariance published as unknown."""
NOT_AVAILABLE = 'n/a'
"""The value of a key whose quantity does not exist yet (e.g. the cache before a frame)."""


@dataclass
class PeriodReport:
    """What happened since the previous report, plus running totals."""

    elapsed_s: float
    received: int
    processed: int
    drops: dict[str, int]
    resets: dict[str, int]
    errors: int
    latency_ms: list[float]
    inference_ms: list[float]
    seconds_since_input: float | None
    drops_total: dict[str, int]
    resets_total: dict[str, int]
    received_total: int
    processed_total: int
    errors_total: int
    last_problem: str
    nonfinite_total: dict[str, int] = field(default_factory=dict)
    last_drop: str = ''
    """The latest input problem (a faulty drop) since start; '' before the first."""
    last_engine_problem: str = ''
    """The latest engine problem (an error or an automatic reset) since start."""


@dataclass
class NodeStats:
    """Thread-safe counters; :meth:`roll` returns a :class:`PeriodReport` and starts a period."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _received: int = 0
    _processed: int = 0
    _errors: int = 0
    _drops: collections.Counter = field(default_factory=collections.Counter)
    _resets: collections.Counter = field(default_factory=collections.Counter)
    _latency_ms: list = field(default_factory=list)
    _inference_ms: list = field(default_factory=list)
    _shown_ms: tuple = ([], [])  # latency and inference of the last period with frames
    _last_input: float | None = None
    _last_problem: str = ''
    _last_drop: str = ''
    _last_engine_problem: str = ''
    _nonfinite: collections.Counter = field(default_factory=collections.Counter)
    _mark: dict = field(default_factory=dict)
    _mark_time: float = field(default_factory=time.monotonic)

    def count_received(self) -> None:
        """Count one image message taken from the subscription."""
        with self._lock:
            self._received += 1
            self._last_input = time.monotonic()

    @property
    def received_total(self) -> int:
        """Image messages taken from the subscription since start."""
        with self._lock:
            return self._received

    def count_drop(self, reason: Reason | str, detail: str = '', num: int = 1) -> None:
        """Count ``num`` dropped frames under ``reason`` (a :class:`Reason` value)."""
        reason = Reason(reason)
        with self._lock:
            self._drops[reason.value] += num
            if detail and POLICY[reason].fault:
                self._last_problem = self._last_drop = f'dropped ({reason}): {detail}'

    def count_reset(self, reason: Reason | str, detail: str = '') -> None:
        """Count a session reset (``manual`` or an automatic reason)."""
        reason = Reason(reason)
        with self._lock:
            self._resets[reason.value] += 1
            if POLICY[reason].fault:
                self._last_problem = f'session reset ({reason}): {detail}'
                self._last_engine_problem = self._last_problem

    def count_error(self, detail: str) -> None:
        """Count an unexpected engine error."""
        with self._lock:
            self._errors += 1
            self._last_problem = self._last_engine_problem = f'engine error: {detail}'

    def count_nonfinite(self, kind: str, num: int = 1) -> None:
        """Count ``num`` non-finite numbers kept off a topic (one of :data:`KNOWN_NONFINITE`)."""
        with self._lock:
            self._nonfinite[kind] += num

    def count_output(self, latency_ms: float, inference_ms: float | None) -> None:
        """Count one published prediction and its latencies."""
        with self._lock:
            self._processed += 1
            self._latency_ms.append(latency_ms)
            if inference_ms is not None:
                self._inference_ms.append(inference_ms)

    def drops_total(self) -> dict[str, int]:
        """Return the drop counts by reason since start."""
        with self._lock:
            return dict(self._drops)

    def roll(self) -> PeriodReport:
        """Close the current period and return its report."""
        now = time.monotonic()
        with self._lock:
            if self._latency_ms:
                self._shown_ms = (self._latency_ms, self._inference_ms)
            mark = self._mark or {'received': 0, 'processed': 0, 'errors': 0,
                                  'drops': collections.Counter(),
                                  'resets': collections.Counter()}
            report = PeriodReport(
                elapsed_s=max(now - self._mark_time, 1e-6),
                received=self._received - mark['received'],
                processed=self._processed - mark['processed'],
                drops=dict(self._drops - mark['drops']),
                resets=dict(self._resets - mark['resets']),
                errors=self._errors - mark['errors'],
                latency_ms=self._shown_ms[0], inference_ms=self._shown_ms[1],
                seconds_since_input=None if self._last_input is None else now - self._last_input,
                drops_total=dict(self._drops), resets_total=dict(self._resets),
                received_total=self._received, processed_total=self._processed,
                errors_total=self._errors, last_problem=self._last_problem,
                nonfinite_total=dict(self._nonfinite), last_drop=self._last_drop,
                last_engine_problem=self._last_engine_problem)
            self._mark = {'received': self._received, 'processed': self._processed,
                          'errors': self._errors, 'drops': collections.Counter(self._drops),
                          'resets': collections.Counter(self._resets)}
            self._mark_time = now
            self._latency_ms, self._inference_ms = [], []
        return report


def _kv(values: dict[str, Any]) -> list[KeyValue]:
    out = []
    for key, value in values.items():
        if isinstance(value, float):
            value = f'{value:.3f}'
        elif value is None:
            value = NOT_AVAILABLE
        out.append(KeyValue(key=key, value=str(value)))
    return out


def _counts(prefix: str, known: tuple[str, ...], totals: dict[str, int]) -> dict[str, int]:
    """``{prefix.reason: count}`` for every known reason (0 included) and any other seen."""
    return {f'{prefix}.{k}': totals.get(k, 0) for k in sorted(set(known) | set(totals))}


def status(name: str, level: bytes, message: str, hardware_id: str,
           values: dict[str, Any]) -> DiagnosticStatus:
    """Build one status; floats rendered with 3 decimals, None as ``n/a``."""
    return DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                            values=_kv(values))


def input_status(node_name: str, report: PeriodReport, info: dict[str, Any],
                 stale_after_s: float) -> DiagnosticStatus:
    """Render the input status.

    Args:
        node_name: prefix of the status name.
        report: the period's counters.
        info: static facts to show (topic, transport, queue mode, queue length).
        stale_after_s: seconds without input after which the status is STALE.

    Returns:
        The ``<node>: input`` status.
    """
    faults = {k: v for k, v in report.drops.items() if POLICY[Reason(k)].fault}
    values = dict(info)
    values.update(input_rate_hz=report.received / report.elapsed_s,
                  processed_rate_hz=report.processed / report.elapsed_s,
                  received_total=report.received_total,
                  drops_total=sum(report.drops_total.values()))
    values.update(_counts('drops', KNOWN_DROPS, report.drops_total))
    values['last_problem'] = report.last_drop or 'none'  # the latest, not the period's
    since = report.seconds_since_input
    if since is None:
        level, msg = STALE, f"no image received yet on '{info.get('topic', '?')}'"
    elif since > stale_after_s:
        level, msg = STALE, f'no image for {since:.1f} s'
    elif faults:
        level = WARN
        msg = 'dropped ' + ', '.join(f'{v} {k}' for k, v in sorted(faults.items()))
    else:
        level, msg = OK, f'{values["input_rate_hz"]:.1f} Hz in, ' \
            f'{values["processed_rate_hz"]:.1f} Hz processed'
    return status(f'{node_name}: input', level, msg, info.get('topic', ''), values)


def engine_status(node_name: str, report: PeriodReport, session: SessionStats,
                  scale_frames: int) -> DiagnosticStatus:
    """Render the engine status from the period report and ``StreamingSession.stats()``.

    Args:
        node_name: prefix of the status name.
        report: the period's counters.
        session: the session's ``stats()`` (its ``cache`` goes to :func:`cache_status`).
        scale_frames: N_s, to say how far the scale phase has buffered.

    Returns:
        The ``<node>: engine`` status.
    """
    values: dict[str, Any] = {k: getattr(session, k) for k in SESSION_STATS_FIELDS
                              if k not in ('cache', 'fallbacks')}
    # The backend in use: 'auto' is resolved when the first frame builds the cache.
    if session.cache is not None:
        values['backend'] = session.cache.backend
    elif session.backend == 'auto':
        values['backend'] = 'auto (resolved at the first frame)'
    values.update(_counts('fallbacks', FALLBACK_KINDS, session.fallbacks))
    for name, samples in (('latency', report.latency_ms), ('inference', report.inference_ms)):
        values[f'{name}_mean_ms'] = sum(samples) / len(samples) if samples else None
        values[f'{name}_max_ms'] = max(samples) if samples else None
    values.update(_counts('resets', KNOWN_RESETS, report.resets_total))
    values['errors_total'] = report.errors_total
    values.update(_counts('nonfinite', KNOWN_NONFINITE, report.nonfinite_total))
    values['last_problem'] = report.last_engine_problem or 'none'  # the latest
    auto = {k: v for k, v in report.resets.items() if POLICY[Reason(k)].fault}
    if report.errors:
        level, msg = ERROR, f'{report.errors} engine error(s): {report.last_engine_problem}'
    elif auto:
        level, msg = WARN, 'session reset: ' + ', '.join(sorted(auto))
    elif session.frames_out == 0:
        level = OK
        msg = f'buffering scale frames ({session.pending_frames}/{scale_frames})'
    else:
        level, msg = OK, f'tracking: frame {session.frames_out}, {session.keyframes} keyframes'
    return status(f'{node_name}: engine', level, msg, session.device, values)


def _kernel_changes(summary: str) -> str:
    """Return the ``name=value`` items of a ``cache.kernel`` summary off their defaults, or ''."""
    defaults = set(KernelConfig().summary().split(','))
    return ','.join(item for item in summary.split(',') if item and item not in defaults)


def cache_status(node_name: str, cache: CacheStats | None, time_index: int,
                 max_frame_num: int, rollover_keyframes: int | None = None
                 ) -> DiagnosticStatus:
    """Render the KV cache status.

    Args:
        node_name: prefix of the status name.
        cache: ``stats().cache`` of the session; None before the first frame builds it.
        time_index: the session's current time index.
        max_frame_num: the time-index ceiling (``model.max_frame_num``).
        rollover_keyframes: ``stream.session_keyframes`` when sessions roll over (the node);
            a rollover at or before both ceilings means the cache never fills: near them the
            status says a rollover comes (OK), not a reset (WARN).

    Returns:
        The ``<node>: cache`` status.
    """
    values: dict[str, Any] = {k: None if cache is None else getattr(cache, k)
                              for k in CACHE_STATS_FIELDS}
    # The engine's page pool: numbers in every state (0 while no pages are held).
    values.update({k: 0 if cache is None else getattr(cache, k) for k in POOL_STATS_FIELDS})
    capacity = (cache.max_total_frames if cache is not None else 0) or 1
    frames = cache.frame_count if cache is not None else 0
    values['time_index'] = time_index
    values['max_frame_num'] = max_frame_num
    values['fill_percent'] = 100.0 * max(frames / capacity, time_index / max(max_frame_num, 1))
    rollover_first = rollover_keyframes is not None and \
        rollover_keyframes <= min(capacity, max_frame_num)
    values['next_at_capacity'] = 'rollover' if rollover_first else 'reset'
    near = frames >= _NEAR_FULL * capacity or time_index >= _NEAR_FULL * max_frame_num
    if near and rollover_first:
        level = OK
        msg = (f'{frames}/{capacity} keyframes, time index {time_index}/{max_frame_num}; a '
               f'rollover starts the next session at {rollover_keyframes} keyframes (no reset)')
    elif near:
        level = WARN
        msg = (f'near capacity ({frames}/{capacity} keyframes, time index '
               f'{time_index}/{max_frame_num}); the session resets when full')
    else:
        live = cache.live_pages if cache is not None else 0
        level, msg = OK, f'{frames} frames, {live} live pages'
    if cache is not None and cache.precision != 'faithful':
        msg += f'; cache.precision {cache.precision}: outside the fidelity gate'
    tuned = _kernel_changes(cache.kernel) if cache is not None else ''
    if tuned:
        msg += f'; cache.kernel tuned: {tuned}'
    return status(f'{node_name}: cache', level, msg, '', values)
