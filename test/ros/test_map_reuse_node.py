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
"""Map reuse through the real node: ``~/save_map``, ``~/load_map``, localization (rclpy, CPU).

A first node maps a route driven twice (the oracle network and verifier of
``test_loop_node.py``) and saves its keyframe map while frames stream. A second node starts with
``map.load_path`` in ``localization`` mode and replays the route from another place, in a
session of its own (another origin, rotation and scale): until the first match ``~/map_pose`` is
silent and the ``loop`` status says ``searching``; afterwards every ``~/map_pose`` puts the
camera where the loaded map has that place. Hostile maps given to ``~/load_map`` are refused
with the reason and the running map stays.

Run: ``pytest test/ros/test_map_reuse_node.py`` (needs gtsam; about a minute on 2 busy cores;
``rostest``).
"""

import itertools
import json
from pathlib import Path
import shutil
import sys
import threading

from geometry_msgs.msg import PoseWithCovarianceStamped
from lingbot_map_ros.engine.mapping.store.map_format import seal_metadata
from lingbot_map_ros.engine.mapping.store.map_store import load_map
from nav_msgs.srv import SetMap
from node_harness import Graph, image_msg, stamp_ns, wait_for, wait_status
import numpy as np
import pytest
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool
from std_srvs.srv import Trigger
from test_loop_node import drifting, feed_route, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import (LandmarkVerifier, Places, ReplayPlaces, route,  # noqa: E402,I100,I202
                         WrongFirst)
from oracle_model import frame_image  # noqa: E402,I100,I202

pytest.importorskip('gtsam')
pytestmark = pytest.mark.rostest

LAP = 30
NUM = 2 * LAP
START = 11
"""The second node's route starts at this place."""
LIVE = 24
_TIMEOUT_S = 120.0
_ns = itertools.count()


class ShiftedPlaces(Places):
    """The places of the second node's frames (frame k is at place START + k)."""

    def place(self, keyframe: int) -> int:
        """Return the place of frame ``keyframe`` of the replay."""
        return (START + keyframe) % self.num_per_lap


class TwoRunVerifier(LandmarkVerifier):
    """The oracle verifier with each run's own units (the map's session scale, the live one's)."""

    def __init__(self, truth_of, places, num_map: int, map_units: float, live_units) -> None:
        """Keep both runs' units."""
        super().__init__(truth_of, places)
        self._num_map, self._map_units, self._live_units = num_map, map_units, live_units

    def _view(self, keyframe: int) -> np.ndarray:
        pose = self._truth_of(keyframe)
        world = self._places.landmarks[self._places.place(keyframe)]
        units = self._map_units if keyframe < self._num_map else self._live_units()
        return units * ((world - pose[:3, 3]) @ pose[:3, :3])


@pytest.fixture(scope='module')
def graph():
    g = Graph()
    yield g
    g.close()


def _call(probe, name: str, request=None, srv=Trigger):
    client = probe.create_client(srv, f'lingbot_map/{name}')
    return probe.call(client, request or srv.Request(), _TIMEOUT_S)


@pytest.fixture(scope='module')
def mapped(graph, tmp_path_factory):
    """Map the route with a first node, saving while the frames stream; return the facts."""
    folder = tmp_path_factory.mktemp('maps') / 'route'
    truth = route(LAP, lap_offset=0.1)
    places = Places(truth, LAP)
    node, probe, rec, _, oracle = start(graph, places, drifting(truth), truth,
                                        **{'map.save_path': str(folder)})
    answers = []
    saver_done = threading.Event()

    def saver():  # saves while the frames stream (the service never blocks a frame)
        while not saver_done.is_set():
            answers.append(_call(probe, 'save_map'))
    thread = threading.Thread(target=saver)
    stamps = feed_route(probe, NUM)
    wait_for(lambda: rec.count('odometry') >= 5, _TIMEOUT_S, 'the first frames')
    thread.start()
    wait_for(lambda: rec.count('odometry') >= NUM, _TIMEOUT_S, f'{NUM} odometry messages')
    saver_done.set()
    thread.join(_TIMEOUT_S)
    closer = node.core.pipeline.loop_output.feed.closer
    assert closer.wait_idle(_TIMEOUT_S)
    final = _call(probe, 'save_map')
    facts = {'folder': folder, 'truth': truth, 'answers': answers, 'final': final,
             'stamps': stamps, 'odometry_stamps': [stamp_ns(m) for m in rec.got['odometry']],
             'poses': closer.corrected_poses(), 'stats': closer.stats(),
             'units': oracle.sessions[0][0]}
    graph.remove(probe)
    graph.remove(node)
    return facts


def test_save_while_frames_stream_loses_no_frame(mapped) -> None:
    assert mapped['odometry_stamps'] == mapped['stamps']  # every frame, in order
    assert mapped['answers'] and all(a.success for a in mapped['answers']), \
        [a.message for a in mapped['answers'] if not a.success]
    final = mapped['final']
    assert final.success and final.message.startswith(str(mapped['folder']))
    loaded = load_map(mapped['folder'])
    # The last save holds the graph as the closer has it, every keyframe and image.
    assert loaded.graph.num_keyframes == NUM == mapped['stats']['keyframes']
    np.testing.assert_allclose(loaded.graph.poses, mapped['poses'], atol=1e-12)
    assert (loaded.graph.edges_kind == 1).sum() == mapped['stats']['accepted'] > 0
    assert loaded.model_hash.startswith('random:') and loaded.image_size_hw[1] == 112


def _stamp(k: int) -> int:
    return 2_000_000_000 + k * 100_000_000  # feed_route's stamps


def _stamps(rec, topic: str) -> set[int]:
    with rec.lock:
        return {stamp_ns(m) for m in rec.got[topic]}


def _publish_frame(probe, k: int) -> None:
    probe.image_pub.publish(image_msg(frame_image(k, (48, 64)), _stamp(k)))


def _hostile(folder: Path, tmp: Path, how: str) -> Path:
    bad = tmp / how
    shutil.copytree(folder, bad)
    if how == 'truncated':
        data = (bad / 'poses.npy').read_bytes()
        (bad / 'poses.npy').write_bytes(data[:100])
    elif how == 'other_model':
        meta = json.loads((bad / 'metadata.json').read_text())
        meta['model_hash'] = 'sha256:' + 'f' * 64
        (bad / 'metadata.json').write_bytes(seal_metadata(meta))  # sealed: the hash is judged
    return bad


def _second_node(graph, mapped, **overrides):
    """Start a node on the replay (its own session) with the saved map; return its parts."""
    truth = mapped['truth']
    num_map = NUM
    live_truth = np.stack([truth[(START + k) % LAP] for k in range(LIVE)])
    odometry = drifting(live_truth, seed=5)
    places = ShiftedPlaces(truth, LAP)
    values = {'map.load_path': str(mapped['folder']), 'map.mode': 'localization', **overrides}
    node, probe, rec, _, oracle = start(graph, places, odometry, truth, **values)
    verifier = TwoRunVerifier(lambda k: truth[k] if k < num_map else live_truth[k - num_map],
                              ReplayPlaces(truth, LAP, num_map, START), num_map, mapped['units'],
                              lambda: oracle.sessions[0][0])
    node.core.pipeline.loop_output.feed.use_verifier(verifier)
    return node, probe, rec, verifier


def test_localization_from_another_start_and_hostile_maps_refused(graph, mapped,
                                                                  tmp_path) -> None:
    node, probe, rec, verifier = _second_node(graph, mapped)
    loaded = load_map(mapped['folder'])
    verifier.gate = threading.Event()
    try:
        feed_route(probe, 3)
        wait_for(lambda: rec.count('odometry') >= 3, _TIMEOUT_S, 'the first frames')
        wait_for(lambda: verifier.calls, _TIMEOUT_S, 'the first match being checked')
        _, message, values = wait_status(
            probe, node, 'loop', lambda lv, m, v: v.get('state') == 'searching', 'searching')
        assert values['map_state'] == 'searching' and values['map_mode'] == 'localization'
        assert values['map_keyframes'] == str(NUM) and message.startswith('searching')
        assert rec.count('map_pose') == 0  # nothing in map until localized

        # A hostile map is refused with the reason; the running map stays.
        closer = node.core.pipeline.loop_output.feed.closer
        for how, reason in (('truncated', 'truncated'), ('other_model', 'another model')):
            hostile = _hostile(mapped['folder'], tmp_path, how)
            assert probe.set_params(map__load_path=str(hostile))[0].successful
            answer = _call(probe, 'load_map')
            assert not answer.success and reason in answer.message, answer.message
        _, _, values = wait_status(probe, node, 'loop',
                                   lambda lv, m, v: 'refused' in v.get('map_error', ''),
                                   'the refusal in the status')
        assert values['map_path'] == str(mapped['folder'])
    finally:
        verifier.gate.set()
    # The rest of the replay; its last frames one at a time, each after the loop closer is
    # idle, so that their map poses carry every correction so far (no race with the worker).
    settled = range(LIVE - 4, LIVE)
    for k in range(3, LIVE):
        _publish_frame(probe, k)
        if k + 1 >= settled[0]:
            wait_for(lambda: _stamp(k) in _stamps(rec, 'map_pose'), _TIMEOUT_S,
                     f'the map pose of frame {k}')
            assert closer.wait_idle(_TIMEOUT_S)
    assert node.core.pipeline.loop_output.feed.closer is closer  # never replaced
    _, _, values = wait_status(probe, node, 'loop',
                               lambda lv, m, v: v.get('map_state') == 'localized', 'localized')
    assert values['state'] == 'running'
    # The camera is where the map has that place (the map's first lap; its second lap of a
    # place is 0.1 route units higher, as the route is).
    scale = mapped['units'] * 3.0  # the route's radius in the map's units
    frame = loaded.frame_from_graph
    places = [(START + k) % LAP for k in range(LIVE)]
    centres = loaded.graph.poses[places][:, :3, 3]
    # The graph's live keyframes that were fed after the closer went idle: how many keyframes
    # came before the first match, and so how well those are placed, depends on the machine's
    # load (a waiting candidate is replaced by a newer one).
    live = closer.corrected_poses()[NUM:, :3, 3]
    in_graph = np.linalg.norm(live[list(settled)] - centres[list(settled)], axis=1)
    assert np.median(in_graph) <= 0.05 * scale, (in_graph, scale)
    expected = {_stamp(k): frame[:3, :3] @ centres[k] + frame[:3, 3] for k in range(LIVE)}
    with rec.lock:
        got = {stamp_ns(m): m.pose.pose.position for m in rec.got['map_pose']}
    # How many frames came before the first match depends on the machine's load: only the
    # settled frames (each waited for above) are certain to have a map pose.
    assert all(_stamp(k) in got for k in settled), sorted(got)
    errors = [np.linalg.norm([got[_stamp(k)].x, got[_stamp(k)].y, got[_stamp(k)].z] -
                             expected[_stamp(k)]) for k in settled]
    assert np.max(errors) <= 0.05 * scale, (errors, scale)
    with rec.lock:  # the same frames in odom (this run's own start): far from there
        odom = {stamp_ns(m): m.pose.pose.position for m in rec.got['odometry']}
    far = [np.linalg.norm([odom[_stamp(k)].x, odom[_stamp(k)].y, odom[_stamp(k)].z] -
                          expected[_stamp(k)]) for k in settled]
    assert np.min(far) >= 5 * np.max(errors), (far, errors)
    # Localization never grows the map: a save writes the loaded one.
    assert probe.set_params(map__save_path=str(tmp_path / 'again'))[0].successful
    assert _call(probe, 'save_map').success
    again = load_map(tmp_path / 'again')
    assert again.graph.poses.tobytes() == loaded.graph.poses.tobytes()


def test_localize_in_map_with_a_far_hint_finds_nothing(graph, mapped) -> None:
    node, probe, rec, verifier = _second_node(graph, mapped)
    loaded = load_map(mapped['folder'])
    request = SetMap.Request()
    request.initial_pose.header.frame_id = 'map'
    far = (START + LAP // 2) % LAP  # across the route from the replay's start
    frame = loaded.frame_from_graph
    position = frame[:3, :3] @ loaded.graph.poses[far][:3, 3] + frame[:3, 3]
    p = request.initial_pose.pose.pose.position
    p.x, p.y, p.z = (float(v) for v in position)
    assert _call(probe, 'localize_in_map', request, SetMap).success
    feed_route(probe, 6)
    wait_for(lambda: rec.count('odometry') >= 6, _TIMEOUT_S, 'six frames')
    closer = node.core.pipeline.loop_output.feed.closer
    assert closer.wait_idle(_TIMEOUT_S)
    assert closer.map_state == 'searching' and verifier.calls == []
    assert rec.count('map_pose') == 0


def test_mapping_into_the_loaded_map_saves_both_runs(graph, mapped, tmp_path) -> None:
    node, probe, rec, verifier = _second_node(graph, mapped, **{
        'map.mode': 'mapping', 'map.save_path': str(tmp_path / 'both')})
    stamps = feed_route(probe, LIVE)
    wait_for(lambda: rec.count('odometry') >= LIVE, _TIMEOUT_S, f'{LIVE} odometry messages')
    with rec.lock:
        assert [stamp_ns(m) for m in rec.got['odometry']] == stamps
    closer = node.core.pipeline.loop_output.feed.closer
    assert closer.wait_idle(_TIMEOUT_S)
    assert closer.map_state == 'localized'
    answer = _call(probe, 'save_map')
    assert answer.success, answer.message
    both = load_map(tmp_path / 'both')
    first = load_map(mapped['folder'])
    assert both.graph.num_keyframes == NUM + LIVE
    assert both.graph.stamps_ns[:NUM].tolist() == first.graph.stamps_ns.tolist()
    assert both.graph.stamps_ns[NUM:].tolist() == stamps
    assert both.frame_from_graph.tobytes() == first.frame_from_graph.tobytes()
    loops = both.graph.edges_ij[both.graph.edges_kind == 1]
    assert ((loops[:, 0] < NUM) & (loops[:, 1] >= NUM)).sum() >= 3  # the runs are tied
    # ~/map_path: both runs' keyframes, each with its own image stamp.
    wait_for(lambda: rec.count('map_path') and len(rec.last('map_path').poses) == NUM + LIVE,
             _TIMEOUT_S, 'the map path of both runs')
    path = rec.last('map_path')
    assert [stamp_ns(p) for p in path.poses] == both.graph.stamps_ns.tolist()


def _localized_flags(probe) -> list[bool]:
    got: list[bool] = []
    latched = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
    probe.create_subscription(Bool, 'lingbot_map/localized', lambda m: got.append(m.data),
                              latched)
    return got


def test_a_wrong_first_match_then_true_ones_localizes_and_says_so(graph, mapped) -> None:
    node, probe, rec, verifier = _second_node(graph, mapped)
    wrong = WrongFirst(verifier)
    node.core.pipeline.loop_output.feed.use_verifier(wrong)
    flags = _localized_flags(probe)
    wait_for(lambda: flags == [False], _TIMEOUT_S, '~/localized false while searching')
    feed_route(probe, 3)
    wait_for(lambda: rec.count('odometry') >= 3, _TIMEOUT_S, 'the first frames')
    output = node.core.pipeline.loop_output
    closer = output.feed.closer
    seen, held = [], []
    for k in range(3, LIVE):
        _publish_frame(probe, k)
        wait_for(lambda: rec.count('odometry') >= k + 1, _TIMEOUT_S, f'frame {k}')
        wait_for(lambda: len(output.feed.stamps) >= k + 1, _TIMEOUT_S, f'keyframe {k} fed')
        assert closer.wait_idle(_TIMEOUT_S)
        seen.append((closer.map_state, closer.stats()['map_matches']))
        held.append(output.map_from_odom())
    assert wrong.wrong is not None, 'no match was made wrong: the test would prove nothing'
    assert closer.map_state == 'localized'
    first = next(i for i, (state, _) in enumerate(seen) if state == 'localized')
    assert all(matches < 3 for _, matches in seen[:first])  # never localized on fewer
    # map -> odom held (identity since the start in the map) while searching, then one jump.
    assert all(np.array_equal(m, np.eye(4)) for m in held[:first])
    assert not np.allclose(held[-1], np.eye(4), atol=1e-3)
    edges = {(e.query, e.candidate): e for e in closer.loop_edges()}
    assert edges[wrong.wrong].reason == 'inconsistent' and not edges[wrong.wrong].accepted
    wait_for(lambda: flags == [False, True], _TIMEOUT_S, '~/localized true once')
    _, _, values = wait_status(probe, node, 'loop',
                               lambda lv, m, v: v.get('localized') == 'true', 'localized')
    assert values['map_state'] == 'localized' and values['map_matches'] == '3/3'
    assert 'inconsistent' in values['last_rejection'] or values['last_rejection'] != 'none'
    # The live keyframes sit where the map has their places (the wrong match pulled nothing).
    loaded = load_map(mapped['folder'])
    scale = mapped['units'] * 3.0
    live = closer.corrected_poses()[NUM:, :3, 3]
    centres = loaded.graph.poses[[(START + k) % LAP for k in range(LIVE)]][:, :3, 3]
    error = np.linalg.norm(live[first + 3:] - centres[first + 3:], axis=1)
    assert np.median(error) <= 0.05 * scale, (error, scale)
    graph.remove(probe)
    graph.remove(node)


def test_a_refused_map_leaves_nothing_in_map(graph, mapped, tmp_path) -> None:
    bad = _hostile(mapped['folder'], tmp_path, 'truncated')
    node, probe, rec, _ = _second_node(graph, {**mapped, 'folder': bad})
    flags = _localized_flags(probe)
    feed_route(probe, 6)
    wait_for(lambda: rec.count('odometry') >= 6, _TIMEOUT_S, 'six frames')
    level, message, values = wait_status(
        probe, node, 'loop', lambda lv, m, v: v.get('map_state') == 'refused', 'refused')
    assert values['localized'] == 'false' and 'truncated' in values['map_error']
    assert message.startswith('not localized: ') and level == b'\x01'  # WARN
    assert rec.count('map_pose') == 0 and rec.count('map_path') == 0
    wait_for(lambda: flags == [False], _TIMEOUT_S, '~/localized false')
    graph.remove(probe)
    graph.remove(node)


def test_initialpose_seeds_the_search_near_it(graph, mapped) -> None:
    node, probe, rec, verifier = _second_node(graph, mapped)
    loaded = load_map(mapped['folder'])
    far = (START + LAP // 2) % LAP  # across the route from the replay's start
    frame = loaded.frame_from_graph
    position = frame[:3, :3] @ loaded.graph.poses[far][:3, 3] + frame[:3, 3]
    msg = PoseWithCovarianceStamped()
    msg.header.frame_id = 'odom'  # not the map frame: refused, with the reason
    pub = probe.create_publisher(PoseWithCovarianceStamped, '/initialpose', 10)
    wait_for(lambda: pub.get_subscription_count() > 0, _TIMEOUT_S, '/initialpose subscriber')
    pub.publish(msg)
    wait_status(probe, node, 'loop', lambda lv, m, v: "frame 'odom'" in v.get('map_error', ''),
                'the refusal of a pose in odom')
    msg.header.frame_id = 'map'
    p = msg.pose.pose.position
    p.x, p.y, p.z = (float(v) for v in position)
    pub.publish(msg)
    wait_status(probe, node, 'loop', lambda lv, m, v: v.get('map_error') == '',
                'the hint taken')
    feed_route(probe, 6)
    wait_for(lambda: rec.count('odometry') >= 6, _TIMEOUT_S, 'six frames')
    closer = node.core.pipeline.loop_output.feed.closer
    assert closer.wait_idle(_TIMEOUT_S)
    # Only map keyframes near the far hint are candidates: the replay's start is not.
    assert closer.map_state == 'searching' and verifier.calls == []
    assert rec.count('map_pose') == 0
    graph.remove(probe)
    graph.remove(node)
