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
"""``lingbot_map_bench graph``: the pose graph's CPU cost and the loop closer's memory by size.

What it measures and why (issue 33: the optimisation time at 1k and 10k keyframes, memory
growth at most 50 MB per 1,000 keyframes, images excluded): loop closure's graph runs on the
CPU, on the loop closer's worker, and grows with the run. Per ``--keyframes`` size, on a
synthetic run (a camera circling a room, ``--lap`` keyframes a lap, odometry steps with noise
of ``--noise`` times the ``loop.odometry_*_sigma`` standard deviations, so the odometry drifts
in position, rotation and scale):

* ``add``: the engine's iSAM2 graph (``engine/mapping/graph/pose_graph.py``) fed keyframe by
  keyframe as the worker does: its odometry edge and its pose read back (``add``), then its
  marginal covariance (``covariance``): mean, p99 and mean of the last 100 keyframes, in ms;
* ``loop``: ``--loops`` true loop edges at the end of the run, ``--loop-gap`` keyframes
  apart, the first when the camera is back at the start, each to the keyframe that was at
  the same place at the start of the run (a loop across the whole run: iSAM2's worst case):
  the graph's ``add_loop`` (the gate's chi-square test, its updates, the residual check), mean,
  first and max in ms, and how many were kept;
* ``wrong``: ``--wrong`` wrong loops (a look-alike place: the true relative pose times
  1 unit and 20 degrees), each halfway between two timed loops, after the first: how many the
  gate let in (``wrong_kept``, 0 is the target) and what it costs to refuse one (``judge_ms``);
* ``stats``: the graph's counters (``PoseGraph.stats``: recoveries, loops rejected by cause);
* ``read``: the whole estimate read back after a correction (``poses()``), ms;
* ``batch``: ``optimize_pose_graph`` over the same poses and edges, covariances not computed
  (sizes up to 1,000 keyframes; every size with ``--batch-10k``);
* ``error``: RMS position error against the truth of the odometry, the incremental graph and
  the batch solve (node 0 is the truth's, no alignment): a loop must lower it;
* ``memory``: the RSS growth per 1,000 keyframes of a ``LoopCloser`` fed the run with
  1024-float random descriptors and no images (``loop.image_store_mb`` 0), in a fresh spawned
  process, between the end of the first tenth of the run and its end, so one-time
  allocations do not count: graph, place index, records, estimate, and what gtsam and faiss
  allocate outside Python (tracemalloc would miss those). No descriptor scores as a
  candidate, so no verification runs.

CPU only: gtsam (and faiss where installed); no torch. The last line printed is one JSON
document; ``meets_targets`` says whether every size's memory growth is within the target.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.graph.batch_solve import optimize_pose_graph, PoseGraphEdge
from lingbot_map_ros.engine.mapping.graph.pose_graph import PoseGraph
from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord, Verification
from lingbot_map_ros.engine.optional_dependencies import faiss_or_none, require_gtsam
from lingbot_map_ros.loop_config import LoopConfig
import numpy as np

MEMORY_TARGET_MB = 50.0
"""Issue 33: the loop closer's RAM grows at most this much per 1,000 keyframes (no images)."""
DESCRIPTOR_DIM = 1024
"""Place descriptor length (the official model's pooled DINO tokens)."""
STEP_M = 0.1
"""True distance between two keyframes (pose units)."""
WRONG_ERROR = (1.0, 20.0)
"""A wrong loop's error: translation (pose units) and rotation (degrees)."""
LOOP_SIGMAS = (0.01, 0.002, 0.002)
"""A loop edge's standard deviations: translation (pose units), rotation (rad), log-scale."""
BATCH_MAX_KEYFRAMES = 1000
"""Largest size solved in batch unless ``--batch-10k``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the ``graph`` subcommand to ``parser``."""
    parser.add_argument('--keyframes', type=int, nargs='+', default=[1000, 10000],
                        help='run sizes (keyframes), each timed on its own graph')
    parser.add_argument('--loops', type=int, default=3, help='loop edges timed per size')
    parser.add_argument('--loop-gap', type=int, default=10,
                        help='keyframes between two timed loops')
    parser.add_argument('--wrong', type=int, default=1,
                        help='wrong loops (1 unit, 20 degrees off) among the timed ones '
                             '(at most --loops - 1)')
    parser.add_argument('--lap', type=int, default=100, help='keyframes per lap of the room')
    parser.add_argument('--noise', type=float, default=0.5,
                        help="odometry noise, a fraction of the config's loop.odometry_*_sigma")
    parser.add_argument('--seed', type=int, default=0, help='noise and descriptor seed')
    parser.add_argument('--batch-10k', action='store_true',
                        help='solve every size in batch, not only those up to 1,000 keyframes')
    parser.add_argument('--memory', action=argparse.BooleanOptionalAction, default=True,
                        help="measure the loop closer's memory growth (a second pass per size)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by ``args``; print the table and return the JSON dict."""
    _check_args(args)
    require_gtsam()
    config = LoopConfig(image_store_mb=0.0)
    sizes = {}
    for num in args.keyframes:
        truth, odom = drifting_run(num, lap=args.lap, loops=args.loops, gap=args.loop_gap,
                                   noise=args.noise, seed=args.seed, config=config)
        report = _time_graph(truth, odom, config, args)
        if args.batch_10k or num <= BATCH_MAX_KEYFRAMES:
            report['batch'] = _batch(truth, odom, config, args)
        if args.memory:
            report['memory'] = closer_memory(num, lap=args.lap, loops=args.loops,
                                             gap=args.loop_gap, noise=args.noise,
                                             seed=args.seed)
        sizes[str(num)] = report
    result = {'benchmark': 'graph', 'cpu_count': os.cpu_count(), 'loops': args.loops,
              'lap': args.lap, 'noise': args.noise, 'seed': args.seed,
              'index_backend': 'faiss' if faiss_or_none() is not None else 'numpy',
              'memory_target_mb_per_1000': MEMORY_TARGET_MB, 'sizes': sizes}
    growths = [s['memory']['mb_per_1000'] for s in sizes.values() if 'memory' in s]
    result['meets_targets'] = max(growths) <= MEMORY_TARGET_MB if growths else None
    _print_table(result)
    return result


def _check_args(args: argparse.Namespace) -> None:
    if args.loops < 1 or args.loop_gap < 1 or args.lap < 3:
        raise ValueError(f'--loops={args.loops} and --loop-gap={args.loop_gap} must be >= 1, '
                         f'--lap={args.lap} >= 3')
    if not 0 <= args.wrong < args.loops or (args.wrong and args.loop_gap < 2):
        raise ValueError(f'--wrong={args.wrong} must be in [0, --loops) and needs '
                         '--loop-gap >= 2')
    if not (np.isfinite(args.noise) and args.noise >= 0):
        raise ValueError(f'--noise={args.noise} must be a finite number >= 0')
    least = args.lap + (args.loops - 1) * args.loop_gap + 1
    for num in args.keyframes:
        if num < least:
            raise ValueError(f'--keyframes {num}: needs at least {least} (a lap of '
                             f'{args.lap} before the first loop, then the loops)')


def loop_keyframes(num: int, loops: int, gap: int) -> list[tuple[int, int]]:
    """Return the (place, query) pairs of the timed loops, in the order they are added.

    The first query passes the run's start again, each next one ``gap`` keyframes later, the
    last is the run's last keyframe; each one's place is the keyframe that was there first.
    """
    first = num - 1 - (loops - 1) * gap
    return [(k * gap, first + k * gap) for k in range(loops)]


def drifting_run(num: int, *, lap: int, loops: int, gap: int, noise: float, seed: int,
                 config: LoopConfig) -> tuple[np.ndarray, np.ndarray]:
    """Return (truth, odometry), float64 [num, 4, 4] each: laps of a room, drifting odometry.

    The truth circles the room, ``STEP_M`` between keyframes and about ``lap`` keyframes a
    lap (adjusted so that the first loop's query is back at the start: whole laps before
    it), bobbing up and down; the odometry composes the true steps, each times a random
    Sim(3) of standard deviations ``noise`` times the config's odometry sigmas. Both start
    at the truth's first pose.
    """
    rng = np.random.default_rng(seed)
    back = loop_keyframes(num, loops, gap)[0][1]
    lap_len = back / max(round(back / lap), 1)
    angles = 2 * np.pi * np.arange(num) / lap_len
    radius = lap_len * STEP_M / (2 * np.pi)
    truth = np.stack([
        sim3.make(_rotation(np.array([0.0, 0.0, a])),
                  [radius * np.cos(a), radius * np.sin(a), 0.2 * np.sin(3 * a)])
        for a in angles])
    odom = truth.copy()
    for n in range(1, num):
        step = sim3.inverse(truth[n - 1]) @ truth[n]
        t_sigma = noise * config.odometry_translation_sigma * np.linalg.norm(step[:3, 3])
        error = sim3.make(_rotation(rng.normal(0, noise * config.odometry_rotation_sigma, 3)),
                          rng.normal(0, t_sigma, 3),
                          float(np.exp(rng.normal(0, noise * config.odometry_scale_sigma))))
        odom[n] = odom[n - 1] @ step @ error
    return truth, odom


def odometry_edge(odom: np.ndarray, n: int, config: LoopConfig) -> PoseGraphEdge:
    """Return the edge ``n - 1 -> n`` with the loop closer's odometry information rule."""
    measured = sim3.inverse(odom[n - 1]) @ odom[n]
    # loop_closer.py's rule: translation sigma relative to the step, floored for a still camera.
    sigma_t = max(config.odometry_translation_sigma * float(np.linalg.norm(measured[:3, 3])),
                  1e-3)
    sigmas = [sigma_t] * 3 + [config.odometry_rotation_sigma] * 3 + [config.odometry_scale_sigma]
    return PoseGraphEdge(n - 1, n, measured, np.diag(1.0 / np.square(sigmas)), 'odometry')


def loop_edges(truth: np.ndarray, loops: int, gap: int) -> list[PoseGraphEdge]:
    """Return the true loop edges of :func:`loop_keyframes`, in order."""
    sigmas = [LOOP_SIGMAS[0]] * 3 + [LOOP_SIGMAS[1]] * 3 + [LOOP_SIGMAS[2]]
    information = np.diag(1.0 / np.square(sigmas))
    return [PoseGraphEdge(place, query, sim3.inverse(truth[place]) @ truth[query],
                          information, 'loop')
            for place, query in loop_keyframes(len(truth), loops, gap)]


def wrong_loop_edges(truth: np.ndarray, loops: int, gap: int, wrong: int
                     ) -> list[PoseGraphEdge]:
    """Return ``wrong`` wrong loops, each halfway between two timed loops (after the first).

    Each measures the true relative pose of its keyframes times :data:`WRONG_ERROR` (a place
    that looks like the one it is not), with a true loop's information.
    """
    pairs = loop_keyframes(len(truth), loops, gap)
    metres, degrees = WRONG_ERROR
    error = sim3.make(_rotation(np.array([0.0, np.radians(degrees), 0.0])), [metres, 0, 0])
    sigmas = [LOOP_SIGMAS[0]] * 3 + [LOOP_SIGMAS[1]] * 3 + [LOOP_SIGMAS[2]]
    information = np.diag(1.0 / np.square(sigmas))
    out = []
    for place, query in pairs[:wrong]:
        place, query = place + gap // 2, query + gap // 2
        out.append(PoseGraphEdge(place, query, sim3.inverse(truth[place]) @ truth[query]
                                 @ error, information, 'loop'))
    return out


def _time_graph(truth: np.ndarray, odom: np.ndarray, config: LoopConfig,
                args: argparse.Namespace) -> dict[str, Any]:
    """Feed the iSAM2 graph keyframe by keyframe, its loops at their keyframes; time each."""
    graph = PoseGraph(max_residual=config.max_residual)
    loops = {e.j: e for e in loop_edges(truth, args.loops, args.loop_gap)}
    wrong = {e.j: e for e in wrong_loop_edges(truth, args.loops, args.loop_gap, args.wrong)}
    add_ms, covariance_ms, loop_ms, residuals, kept = [], [], [], [], 0
    judge_ms, wrong_kept = [], 0
    for n in range(len(odom)):
        start = time.perf_counter()
        graph.add_node(odom[n], odometry_edge(odom, n, config) if n else None)
        graph.pose(n)
        middle = time.perf_counter()
        graph.covariance(n)
        add_ms.append(1e3 * (middle - start))
        covariance_ms.append(1e3 * (time.perf_counter() - middle))
        if n in loops:
            start = time.perf_counter()
            outcome = graph.add_loop(loops[n])
            loop_ms.append(1e3 * (time.perf_counter() - start))
            kept += outcome.accepted
            residuals.append(round(outcome.residual, 3))
        if n in wrong:
            start = time.perf_counter()
            wrong_kept += graph.add_loop(wrong[n]).accepted
            judge_ms.append(1e3 * (time.perf_counter() - start))
    read_ms = []
    for _ in range(3):
        start = time.perf_counter()
        corrected = graph.poses()
        read_ms.append(1e3 * (time.perf_counter() - start))
    return {
        'add_ms': _spread(add_ms), 'covariance_ms': _spread(covariance_ms),
        'loop_ms': {'mean': _r(statistics.fmean(loop_ms)), 'first': _r(loop_ms[0]),
                    'max': _r(max(loop_ms))},
        'loops_kept': kept, 'loop_residuals': residuals,
        'wrong': {'loops': len(wrong), 'wrong_kept': wrong_kept,
                  'judge_ms': _r(statistics.fmean(judge_ms)) if judge_ms else None},
        'stats': graph.stats(),
        'read_ms': _r(statistics.fmean(read_ms)),
        'error_m': {'odometry': _r(_position_rms(odom, truth), 4),
                    'graph': _r(_position_rms(corrected, truth), 4)},
    }


def _spread(times_ms: list[float]) -> dict[str, float]:
    return {'mean': _r(statistics.fmean(times_ms)), 'p99': _r(np.percentile(times_ms, 99)),
            'last_100_mean': _r(statistics.fmean(times_ms[-100:]))}


def _batch(truth: np.ndarray, odom: np.ndarray, config: LoopConfig,
           args: argparse.Namespace) -> dict[str, Any]:
    """Solve the same graph in one batch from the odometry (covariances not computed)."""
    edges = [odometry_edge(odom, n, config) for n in range(1, len(odom))]
    edges += sorted(loop_edges(truth, args.loops, args.loop_gap)
                    + wrong_loop_edges(truth, args.loops, args.loop_gap, args.wrong),
                    key=lambda e: e.j)  # the order the live graph saw them in
    start = time.perf_counter()
    result = optimize_pose_graph(odom, edges, max_residual=config.max_residual,
                                 covariances=False)
    elapsed_ms = 1e3 * (time.perf_counter() - start)
    return {'solve_ms': _r(elapsed_ms), 'rejected': len(result.rejected),
            'wrong_kept': sum(edges[k].kind == 'loop' and k not in result.rejected
                              and not np.allclose(edges[k].measurement, sim3.inverse(
                                  truth[edges[k].i]) @ truth[edges[k].j], atol=1e-9)
                              for k in range(len(edges))),
            'error_m': _r(_position_rms(result.poses, truth), 4)}


def closer_memory(num: int, **run: Any) -> dict[str, Any]:
    """Measure a ``LoopCloser``'s RSS growth over ``num`` keyframes in a fresh process.

    ``run`` holds :func:`drifting_run`'s keyword arguments but ``config``.
    """
    with multiprocessing.get_context('spawn').Pool(1) as pool:
        return pool.apply(_closer_memory, (num, run))


class _Refuser:
    """A verifier that refuses every pair (random descriptors never make candidates)."""

    def verify(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Verification:
        return Verification(False, 'bench', None, 0.0, float('nan'), None)


def _closer_memory(num: int, run: dict[str, Any]) -> dict[str, Any]:
    """Feed a ``LoopCloser`` ``num`` keyframes; RSS at the first tenth and at the end."""
    config = LoopConfig(image_store_mb=0.0)
    _, odom = drifting_run(num, config=config, **run)
    rng = np.random.default_rng(run['seed'] + 1)
    closer = LoopCloser(_Refuser(), config, use_faiss=True)
    start_at = max(num // 10, 1)
    try:
        for n in range(num):
            if n == start_at:
                _wait(closer, n)
                rss_start = _rss_bytes()
            descriptor = rng.standard_normal(DESCRIPTOR_DIM).astype(np.float32)
            closer.add_keyframe(KeyframeRecord(n, n * 100_000_000, odom[n], descriptor))
        _wait(closer, num)
        rss_end = _rss_bytes()
        stats = closer.stats()
    finally:
        closer.close()
    growth = (rss_end - rss_start) / (num - start_at) * 1000 / 1e6
    return {'method': 'rss', 'mb_per_1000': _r(growth), 'rss_start_mb': _r(rss_start / 1e6, 1),
            'rss_end_mb': _r(rss_end / 1e6, 1), 'measured_keyframes': num - start_at,
            'candidates': stats['candidates'], 'errors': stats['errors'],
            'descriptor_mb_per_1000': _r(2 * 4 * DESCRIPTOR_DIM * 1000 / 1e6)}


def _wait(closer: LoopCloser, num: int) -> None:
    if not closer.wait_idle(600.0):
        raise RuntimeError(f'the loop closer did not take {num} keyframes within 600 s')


def _rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc/self/statm``)."""
    with open('/proc/self/statm', encoding='ascii') as statm:
        return int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _rotation(vector: np.ndarray) -> np.ndarray:
    """Rotation matrix of an axis-angle vector (Rodrigues)."""
    angle = float(np.linalg.norm(vector))
    if angle < 1e-12:
        return np.eye(3)
    k = np.asarray(vector, dtype=np.float64) / angle
    cross = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross


def _position_rms(poses: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.sum((poses[:, :3, 3] - truth[:, :3, 3]) ** 2, axis=1))))


def _verdict(met: bool | None) -> str:
    return 'not measured' if met is None else 'met' if met else 'NOT met'


def _r(value: float, digits: int = 3) -> float:
    return round(float(value), digits)


def _print_table(result: dict[str, Any]) -> None:
    print(f"pose graph on the CPU ({result['cpu_count']} cores), {result['loops']} loops a "
          f"size across the whole run, index {result['index_backend']}")
    print(f"{'keyframes':>9} {'add ms':>7} {'p99':>7} {'last100':>7} {'cov ms':>7} "
          f"{'loop ms':>8} {'first':>8} {'kept':>5} {'wrong':>5} {'read ms':>7} {'batch ms':>8} "
          f"{'err odom':>8} {'graph':>7} {'batch':>7} {'MB/1000':>7}")
    for num, size in result['sizes'].items():
        add, loop = size['add_ms'], size['loop_ms']
        batch, memory = size.get('batch') or {}, size.get('memory') or {}
        print(f"{num:>9} {add['mean']:7.3f} {add['p99']:7.3f} {add['last_100_mean']:7.3f} "
              f"{size['covariance_ms']['mean']:7.3f} {loop['mean']:8.1f} {loop['first']:8.1f} "
              f"{size['loops_kept']:>5} {size['wrong']['wrong_kept']:>5} {size['read_ms']:7.2f} "
              f"{_optional(batch.get('solve_ms'), '.1f'):>8} "
              f"{size['error_m']['odometry']:8.3f} {size['error_m']['graph']:7.3f} "
              f"{_optional(batch.get('error_m'), '.3f'):>7} "
              f"{_optional(memory.get('mb_per_1000'), '.1f'):>7}")
    print(f'memory growth (RSS, no images) <= {MEMORY_TARGET_MB:.0f} MB per 1,000 keyframes: '
          f"{_verdict(result['meets_targets'])}")
    print(json.dumps(result))


def _optional(value: float | None, spec: str) -> str:
    return '-' if value is None else format(value, spec)
