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
"""lingbot_map_node with ``metric.source: depth`` on a real rclpy graph (CPU, oracle network).

The oracle network (test/engine/oracle_model.py) answers each session with the ground truth
divided by an unknown factor, plus noise; a depth topic carries the ground-truth depth (16UC1
mm, with holes and wild pixels). Over many rollovers the published poses, depth image, saved
trajectory and map must be in metres. Hostile depth messages must end as counted drops by
reason, with every colour frame still published.

Run: ``pytest test/ros/test_metric_node.py`` (20-40 s on 2 busy cores; marker ``rostest``).
"""

import itertools
from pathlib import Path
import sys

from lingbot_map_ros.config import MapConfig, MetricConfig
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.engine.map.ply import read_ply
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.ros.inference.depth_input import DEPTH_DROP_REASONS
from lingbot_map_ros.ros.parameters import node_params, params
from lingbot_map_ros.ros.publishers.odometry_status import ODOMETRY_KEYS
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.bag_io import depth_message
from lingbot_map_ros.tools.offline import OfflineRunner, RunOptions
from lingbot_map_ros.tools.trajectory import read_tum
from node_harness import (image_msg, no_callback_errors, stamp_ns,  # noqa: F401
                          TINY_CPU, wait_for, wait_status)
import numpy as np
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
from std_srvs.srv import Trigger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from oracle_model import (  # noqa: E402,I100,I202
    frame_image, ground_truth, oracle_session, OracleModel)

pytestmark = pytest.mark.rostest

_ns = itertools.count()
_TIMEOUT_S = 90.0
_SEC = 1_000_000_000
SIZE_HW = (48, 64)
PROCESSED_HW = (84, 112)  # 48 x 64 at stream.image_width 112
ENGINE = {'stream.enable_depth': True, 'model.max_frame_num': 8, 'stream.session_keyframes': 8,
          'stream.overlap_keyframes': 3}
MAP = {'map.voxel_size': 0.02, 'map.confidence_percentile': 0.0, 'map.pixel_stride': 2}


def plane_m(index: int) -> float:
    """Return the oracle's ground-truth depth of frame ``index`` (a plane), metres."""
    return 2.0 + 0.5 * np.sin(0.05 * index)


def depth_msg(mm: np.ndarray, stamp: int, encoding: str = '16UC1') -> Image:
    """Build a depth image message from millimetres (uint16; other encodings as given)."""
    array = np.ascontiguousarray(mm, dtype='<u2')
    msg = Image(height=array.shape[0], width=array.shape[1], encoding=encoding,
                is_bigendian=0, step=2 * array.shape[1])
    msg.header.frame_id = 'cam_optical'
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, _SEC)
    msg.data = array.tobytes()
    return msg


def sensor_mm(index: int, rng: np.random.Generator, size_hw=SIZE_HW) -> np.ndarray:
    """Return the depth camera's image of frame ``index`` in mm: holes and 10 % wild pixels."""
    mm = np.full(size_hw, round(plane_m(index) * 1000), np.uint16)
    mm[:, :6] = 0
    wild = rng.random(size_hw) < 0.1
    mm[wild] = rng.integers(200, 10_000, wild.sum())
    return mm


def start(graph, tmp_path, **overrides):
    """Start a metric node (bag mode, short sessions) with the oracle, a probe and a depth pub."""
    values = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
              'input.qos.depth': 100, 'publish.depth': True, **ENGINE,
              'metric.source': 'depth', 'metric.settle_keyframes': 4,
              'metric.depth_wait_s': 5.0, 'output.directory': str(tmp_path),
              'map.period_s': 0.1, **MAP, **overrides}
    node, probe = graph.start_node(f'/metric{next(_ns)}', values)
    session = node.core.pipeline.session.session
    gt = ground_truth(200)
    session.replace_stream(OracleModel(gt, session.config, noise=0.001, seed=1, depth_noise=0.02))
    depth_pub = probe.create_publisher(Image, 'depth', QoSProfile(
        depth=300, reliability=ReliabilityPolicy.RELIABLE))
    depth_sub = next(s for s in node.subscriptions if s.topic_name.endswith('/depth'))
    wait_for(lambda: depth_sub.get_publisher_count() > 0, _TIMEOUT_S, 'depth matching')
    return node, probe, depth_pub, gt


def rms_radius(points: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.sum((points - points.mean(axis=0)) ** 2, axis=1))))


def positions(poses) -> np.ndarray:
    return np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z]
                     for p in poses])


def test_poses_depth_trajectory_and_map_are_metric_over_rollovers(graph, tmp_path):
    node, probe, depth_pub, gt = start(graph, tmp_path)
    num = 40
    rng = np.random.default_rng(2)
    sent = [int((60.0 + 0.1 * i) * _SEC) for i in range(num)]
    for i, t in enumerate(sent):
        depth_pub.publish(depth_msg(sensor_mm(i, rng), t))
        probe.image_pub.publish(image_msg(frame_image(i, SIZE_HW), t))
    wait_for(lambda: probe.count(probe.poses) >= num, _TIMEOUT_S, f'{num} poses')
    assert [stamp_ns(p) for p in probe.poses] == sent
    _, _, values = wait_status(probe, node, 'odometry',
                               lambda lvl, m, v: v.get('rollovers') == '7', '7 rollovers',
                               _TIMEOUT_S)
    assert list(values) == list(ODOMETRY_KEYS)
    assert values['metric.state'] == 'locked' and values['metric.depth_drops'] == '0'
    assert values['metric.frames_without_depth'] == '0'
    # The checks beside it: the overlap's depth ratio agrees closely; the Sim(3) fit of three
    # nearly collinear, noisy centres only roughly.
    scale = float(values['metric.scale'])
    assert float(values['last_alignment_scale']) == pytest.approx(scale, rel=0.02)
    assert float(values['metric.sim3_scale']) == pytest.approx(scale, rel=0.3)
    # Each session had its own factor (e^-1 .. e^1): the published positions are metres.
    truth = gt[:num, :3, 3]
    assert rms_radius(positions(probe.poses)) == pytest.approx(rms_radius(truth), rel=0.02)
    steps = np.linalg.norm(np.diff(positions(probe.poses), axis=0), axis=1)
    np.testing.assert_allclose(steps, np.linalg.norm(np.diff(truth, axis=0), axis=1),
                               rtol=0.05, atol=0.004)  # pose noise 0.001 per axis
    # ~/depth/image is 32FC1 metres.
    wait_for(lambda: probe.count(probe.depths) >= num, _TIMEOUT_S, 'depth images')
    for msg in probe.depths:
        index = sent.index(stamp_ns(msg))
        assert (msg.encoding, msg.height, msg.width) == ('32FC1', *PROCESSED_HW)
        depth = np.frombuffer(bytes(msg.data), '<f4')
        assert np.median(depth) == pytest.approx(plane_m(index), rel=0.02)
    # ~/save: the trajectory and the map in metres.
    accumulator = node.core.pipeline.map_output.accumulator
    wait_for(lambda: accumulator.num_keyframes == num, _TIMEOUT_S, 'keyframes in the map')
    reply = probe.call(probe.create_client(Trigger, 'lingbot_map/save'), Trigger.Request())
    assert reply.success, reply.message
    folder = Path(reply.message)
    saved = read_tum(folder / 'trajectory.tum')
    assert rms_radius(saved.positions) == pytest.approx(rms_radius(truth), rel=0.02)
    map_xyz, _ = read_ply(folder / 'map.ply')
    k = geometry.pose_encoding_to_intrinsics(np.array([0, 0, 0, 0, 0, 0, 1, 1.0, 1.2]),
                                             PROCESSED_HW)
    reference = MapAccumulator(MapConfig.from_flat(MAP))
    for i in range(num):
        reference.add(np.full(PROCESSED_HW, plane_m(i), np.float32), None, None, k, gt[i])
    assert rms_radius(map_xyz) == pytest.approx(rms_radius(reference.points()[0]), rel=0.02)
    graph.remove(node)
    # The offline replay of the same messages publishes the same trajectory (other axes: the
    # distances between all camera centres are compared).
    offline = replay_offline(tmp_path / 'bag', sent, np.random.default_rng(2), gt)
    np.testing.assert_allclose(distances(offline.positions), distances(positions(probe.poses)),
                               rtol=0, atol=1e-6)


def replay_offline(bag, sent, rng, gt):
    """Write the messages the node got into a bag and replay it with the same oracle."""
    with bag_io.BagWriter(bag) as writer:
        for i, t in enumerate(sent):
            writer.write('/depth', t, depth_message(sensor_mm(i, rng) * 1e-3, t, 'cam_optical'))
            writer.write('/image', t, bag_io.image_message(frame_image(i, SIZE_HW), t, 'cam'))
    values = {k: v for k, v in {**TINY_CPU, **ENGINE}.items()
              if k.partition('.')[0] in ('model', 'cache', 'stream')}
    session, _ = oracle_session(gt, noise=0.001, seed=1, depth_noise=0.02, **values)
    metric = MetricConfig(source='depth', settle_keyframes=4)
    runner = OfflineRunner(RolloverSession(session, metric), RunOptions(
        map_axes='optical', metric=metric, depth_topic='/depth'), bag.parent / 'offline')
    with bag_io.open_bag(bag) as reader:
        runner.run(bag_io.read_raw(reader, ['/image', '/depth']))
    return runner.trajectory


def distances(xyz: np.ndarray) -> np.ndarray:
    return np.linalg.norm(xyz[:, None] - xyz[None], axis=-1)


def test_hostile_depth_is_counted_and_no_colour_frame_is_lost(graph, tmp_path):
    # A small buffer (queue 4 + history 5 + 8 = 17); messages go out at most 5 at a time, so
    # the middleware's history of 5 never loses one.
    node, probe, depth_pub, _ = start(graph, tmp_path, **{
        'stream.session_keyframes': 40, 'model.max_frame_num': 64, 'input.queue_size': 4,
        'input.qos.depth': 5})
    depth_input = node.core.pipeline.runner.depth_input
    rng = np.random.default_rng(3)
    sent = [int((80.0 + 0.1 * i) * _SEC) for i in range(12)]

    def publish_depth(msgs):
        for start in range(0, len(msgs), 5):
            before = depth_input.received_total
            for msg in msgs[start:start + 5]:
                depth_pub.publish(msg)
            wait_for(lambda: depth_input.received_total == before + len(msgs[start:start + 5]),
                     _TIMEOUT_S, 'depth messages taken')

    def publish_frame(i, with_depth=True):
        if with_depth:
            publish_depth([depth_msg(sensor_mm(i, rng), sent[i])])
        probe.image_pub.publish(image_msg(frame_image(i, SIZE_HW), sent[i]))
        if i >= 2:  # the first poses come with the third frame (cache.scale_frames)
            wait_for(lambda: probe.count(probe.poses) > i, _TIMEOUT_S, f'pose {i}')

    for i in range(6):
        publish_frame(i)
    publish_depth([
        depth_msg(sensor_mm(6, rng), sent[6], encoding='rgb8'),      # wrong encoding
        depth_msg(np.zeros(SIZE_HW), sent[6]),                       # all zeros
        depth_msg(sensor_mm(0, rng), sent[0]),                       # stale: frame 0 is done
        depth_msg(sensor_mm(0, rng), sent[5] + 100 * _SEC)])         # 100 s in the future
    # A flood of depth without colour (between frames 6 and 7): 40 into a buffer of 17.
    publish_depth([depth_msg(sensor_mm(6, rng), sent[6] + (j + 1) * 1_000_000)
                   for j in range(40)])
    publish_depth([depth_msg(sensor_mm(7, rng, (24, 32)), sent[7])])  # another size
    publish_frame(6, with_depth=False)
    publish_frame(7, with_depth=False)
    for i in range(8, 12):
        publish_frame(i)
    assert [stamp_ns(p) for p in probe.poses] == sent
    # Unpaired: all 40 of the flood, 24 pushed out of the full buffer and 16 passed by frame 7.
    expected = {'depth_encoding': 1, 'depth_no_valid_pixels': 1, 'depth_size': 1,
                'depth_stamp_stale': 1, 'depth_stamp_future': 1, 'depth_unpaired': 40}
    _, _, inputs = wait_status(
        probe, node, 'input',
        lambda lvl, m, v: all(v.get(f'drops.{k}') == str(n) for k, n in expected.items()),
        'every depth drop counted', _TIMEOUT_S)
    assert {r: int(inputs[f'drops.{r}']) for r in DEPTH_DROP_REASONS} == \
        {**dict.fromkeys(DEPTH_DROP_REASONS, 0), **expected}
    _, _, odometry = wait_status(
        probe, node, 'odometry', lambda lvl, m, v: v.get('metric.depth_drops') == '45' and
        v.get('metric.session_keyframes') == '12', 'the metric block after the last frame',
        _TIMEOUT_S)
    # Frames 6 and 7 had no usable depth; the scale was locked before and is unchanged.
    assert odometry['metric.state'] == 'locked'
    assert odometry['metric.frames_without_depth'] == '2'
    assert odometry['metric.frames_with_depth'] == '10'
    graph.remove(node)


def test_metric_needs_depth_from_the_model(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode
    from rclpy.parameter import Parameter

    values = {**TINY_CPU, 'metric.source': 'depth'}
    with pytest.raises(ValueError, match='stream.enable_depth'):
        LingbotMapNode(context=graph.context, namespace=f'/metric{next(_ns)}',
                       parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
    # Nor may depth be turned off at run time under a metric node.
    current = {s.name: s.default for s in params.all_specs('tiny')}
    current.update({'metric.source': 'depth', 'stream.enable_depth': True})
    assert node_params.check_changes({'stream.keyframe_interval': 2}, current) is None
    assert 'metric.source' in node_params.check_changes({'stream.enable_depth': False}, current)
    assert 'max_dt_s' in node_params.check_changes({'metric.max_dt_s': -1.0}, current)
