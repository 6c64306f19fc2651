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
"""lingbot_map_node on a real rclpy graph with the tiny random-weight engine on CPU.

Run: ``pytest test/ros/test_node.py`` (10-20 s on 2 cores; markers ``rostest``, one ``slow``).

Each test talks to the node through ROS only (topics, the reset service, the parameter service,
/diagnostics), as a user would, and asserts on values: stamps and frame ids of the outputs, the
cache counters in the diagnostics, the drop counters by reason, the refusal reasons. The one
exception makes the real engine fail on purpose (NaN pose, crash) by wrapping its ``step``.
"""

import itertools
from pathlib import Path
import sys

from builtin_interfaces.msg import Time
from lingbot_map_ros.engine import errors
from lingbot_map_ros.ros.nodes.node import LingbotMapNode, main
from lingbot_map_ros.ros.publishers.odometry_status import ODOMETRY_KEYS
from lingbot_map_ros.ros.publishers.outputs import UNKNOWN_VARIANCE
# node_harness sits next to this file (pytest puts test/ros on sys.path).
from node_harness import (bag, image_msg, jpeg_msg, make_image, no_callback_errors,  # noqa: F401
                          Probe, publish, SEC, stamp_ns, stamps, TIMEOUT_S, TINY_CPU, wait_for,
                          wait_poses, wait_status)
import numpy as np
import pytest
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock
from std_srvs.srv import Trigger

# The oracle network of the engine tests (test/engine/oracle_model.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from oracle_model import frame_image, ground_truth, OracleModel  # noqa: E402,I100,I202

pytestmark = pytest.mark.rostest

_ns = itertools.count()
_TIMEOUT_S, _SEC = TIMEOUT_S, SEC


def start(graph, **overrides):
    """Start a node under test and a probe in a fresh namespace."""
    namespace = f'/t{next(_ns)}'
    values = {**TINY_CPU, **{k.replace('__', '.'): v for k, v in overrides.items()}}
    return graph.start_node(namespace, values,
                            compressed=values.get('input.transport') == 'compressed')


def test_raw_images_give_poses_with_matching_stamps_and_frames(graph):
    node, probe = start(graph, **bag(publish__path_max_poses=5))
    sent = stamps(100.0, 8)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(sent)])
    wait_poses(probe, 8)
    wait_for(lambda: probe.count(probe.odometry) >= 8, _TIMEOUT_S, 'odometry')
    wait_for(lambda: probe.paths and stamp_ns(probe.paths[-1].poses[-1]) == sent[-1],
             _TIMEOUT_S, 'the last path')
    assert [stamp_ns(p) for p in probe.poses] == sent
    assert {p.header.frame_id for p in probe.poses} == {'odom'}
    assert [stamp_ns(o) for o in probe.odometry] == sent
    assert {o.child_frame_id for o in probe.odometry} == {'base_link'}
    # No uncertainty from the model: marked unknown, never an all-zero (exact) covariance.
    for cov in [o.pose.covariance for o in probe.odometry] + [probe.odometry[-1].twist.covariance]:
        assert list(cov[::7]) == [UNKNOWN_VARIANCE] * 6 and sum(cov) == 6 * UNKNOWN_VARIANCE
    # REP 105: odom starts at the first pose of base_link.
    first = probe.poses[0].pose
    # Exact on purpose: the anchoring pose is the identity by contract (OdomFrames returns it
    # as such, not as a BLAS-dependent product), so this holds on every CPU.
    assert (first.position.x, first.position.y, first.position.z) == (0.0, 0.0, 0.0)
    assert abs(first.orientation.w) == pytest.approx(1.0, abs=1e-9)
    quat = probe.poses[-1].pose.orientation
    assert abs(quat.x ** 2 + quat.y ** 2 + quat.z ** 2 + quat.w ** 2 - 1.0) < 1e-6
    # Bounded path: the newest 5 poses, in order.
    assert [stamp_ns(p) for p in probe.paths[-1].poses] == sent[-5:]
    graph.remove(node)


def test_cache_diagnostics_follow_the_stream_and_reset(graph):
    node, probe = start(graph, **bag())
    window = TINY_CPU['cache.sliding_window']
    frame_counts = []
    for chunk in range(3):
        publish(probe, [image_msg(make_image(i), t)
                        for i, t in enumerate(stamps(10.0 + chunk, 4), start=4 * chunk)])
        wait_poses(probe, 4 * (chunk + 1))
        # A status from before the first frame has no frame_count yet.
        _, _, cache = wait_status(
            # Compared as text: the key exists in every state, 'n/a' before the cache does.
            probe, node, 'cache', lambda lvl, msg, v: v['frame_count'] == str(4 * (chunk + 1)),
            f'cache frame_count {4 * (chunk + 1)}')
        frame_counts.append(int(cache['frame_count']))
        assert int(cache['scale_pages']) == TINY_CPU['cache.scale_frames']
        assert 0 < int(cache['live_pages']) <= window
        assert int(cache['kv_bytes']) > 0 and int(cache['max_total_frames']) == 320
    assert frame_counts == [4, 8, 12]
    assert int(cache['live_pages']) == window  # full window after 12 frames
    level, _, engine = wait_status(probe, node, 'engine', lambda *a: True, 'engine status')
    assert engine['backend'] == 'sdpa' and engine['device'] == 'cpu'
    assert engine['weights'].startswith('random') and float(engine['latency_max_ms']) >= 0
    reply = probe.call(probe.reset_client, Trigger.Request())
    assert reply.success
    assert 'frames=12' in reply.message and 'path_poses=12' in reply.message
    _, _, cache = wait_status(probe, node, 'cache',
                              lambda lvl, msg, v: v['frame_count'] == '0', 'empty cache')
    assert int(cache['live_pages']) == 0 and int(cache['special_tokens']) == 0
    _, _, engine = wait_status(probe, node, 'engine', lambda *a: True, 'engine status')
    assert engine['resets.manual'] == '1'
    graph.remove(node)


def test_reset_answers_during_a_stream_and_mapping_resumes(graph):
    node, probe = start(graph, **bag())
    sent = stamps(50.0, 16)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(sent[:10])])
    wait_poses(probe, 3)  # the scale phase is over, the rest is queued or running
    reply = probe.call(probe.reset_client, Trigger.Request(), timeout_s=15.0)
    assert reply.success and reply.message.startswith('cleared frames=')
    done_before = probe.count(probe.poses)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(sent[10:], start=10)])
    wait_for(lambda: probe.count(probe.poses) > done_before and
             stamp_ns(probe.poses[-1]) == sent[-1], _TIMEOUT_S, 'poses after the reset')
    # The path restarted at the reset: it holds only post-reset poses.
    wait_for(lambda: stamp_ns(probe.paths[-1].poses[-1]) == sent[-1], _TIMEOUT_S, 'path')
    assert len(probe.paths[-1].poses) < len(sent)
    graph.remove(node)


def test_compressed_images_give_poses(graph):
    node, probe = start(graph, **bag(input__transport='compressed'))
    sent = stamps(7.0, 5)
    publish(probe, [jpeg_msg(make_image(i), t, 'jpeg_cam') for i, t in enumerate(sent)])
    wait_poses(probe, 5)
    assert [stamp_ns(p) for p in probe.poses] == sent
    wait_for(lambda: probe.count(probe.odometry) >= 5, _TIMEOUT_S, 'odometry')
    assert probe.odometry[-1].child_frame_id == 'base_link'
    # Corrupt and cut JPEGs are dropped; the stream goes on.
    good = jpeg_msg(make_image(9), int(8.0 * _SEC))
    cut = jpeg_msg(make_image(9), int(8.1 * _SEC))
    cut.data = bytes(good.data)[:len(good.data) // 2]
    corrupt = jpeg_msg(make_image(9), int(8.2 * _SEC))
    corrupt.data = b'\xff\xd8' + bytes(200) + b'\xff\xd9'
    publish(probe, [cut, corrupt, good, jpeg_msg(make_image(10), int(8.3 * _SEC))])
    wait_poses(probe, 7)
    _, _, values = wait_status(probe, node, 'input',
                               lambda lvl, msg, v: v.get('drops.truncated') == '1' and
                               v.get('drops.decode') == '1', 'compressed drop counters')
    assert stamp_ns(probe.poses[-1]) == int(8.3 * _SEC)
    graph.remove(node)


def bad_corpus(base_s):
    """Every kind of bad raw frame, each with a fresh stamp, and what it counts as."""
    def frame(offset, **fields):
        msg = image_msg(make_image(0), int((base_s + offset) * _SEC))
        for key, value in fields.items():
            setattr(msg, key, value)
        return msg
    short = frame(0.2)
    short.data = bytes(short.data)[:100]
    return [(frame(0.1, encoding='weird_encoding'), 'encoding'),
            (short, 'truncated'),
            (frame(0.3, step=10), 'step'),
            (frame(0.4, height=0, width=0, step=0, data=b''), 'size'),
            (frame(0.5, encoding='32FC1'), 'encoding')]


def test_bad_input_corpus_is_dropped_counted_and_the_node_goes_on(graph):
    node, probe = start(graph, **bag())
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(stamps(20.0, 4))])
    wait_poses(probe, 4)
    corpus = bad_corpus(20.5)
    publish(probe, [msg for msg, _ in corpus])
    # Stamps: equal to the last one and slightly back are reordered frames (dropped) ...
    last = int(20.3 * _SEC)
    publish(probe, [image_msg(make_image(1), last), image_msg(make_image(1), last - 10**8)])
    level, msg, values = wait_status(
        probe, node, 'input', lambda lvl, msg, v: v.get('drops.stamp_out_of_order') == '2',
        'stamp drops')
    # ... the bad frames are counted by reason, with a WARN in the period they happened.
    assert values['drops.encoding'] == '2'
    assert values['drops.truncated'] == values['drops.step'] == values['drops.size'] == '1'
    assert values['drops_total'] == '7'
    assert any(s.level == b'\x01' and s.name.endswith('input')
               for a in probe.diagnostics for s in a.status)
    # A big jump back is a clock jump: the session resets and the frame starts a new map.
    count = probe.count(probe.poses)
    jump = stamps(1.0, 4)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(jump)])
    wait_poses(probe, count + 4)
    assert [stamp_ns(p) for p in probe.poses[-4:]] == jump
    _, emsg, engine = wait_status(probe, node, 'engine',
                                  lambda lvl, m, v: v.get('resets.clock_jump') == '1',
                                  'clock-jump reset')
    assert any(s.level == b'\x01' and 'clock_jump' in s.message
               for a in probe.diagnostics for s in a.status)
    graph.remove(node)


def test_parameter_changes_are_validated(graph):
    node, probe = start(graph, **bag())
    refused = {
        'cache.sliding_window': (8, 'read-only'),
        'model.preset': ('official', 'read-only'),
        'publish.cloud_stride': (0, 'out of range'),
        'diagnostics.period_s': (0.0, 'out of range'),
        'publish.cloud': (True, 'stream.enable_depth'),
        'publish.tf': ('yes', ''),
    }
    for name, (value, reason) in refused.items():
        [result] = probe.set_params(**{name.replace('.', '__'): value})
        assert not result.successful, name
        assert reason in result.reason, (name, result.reason)
    assert node.get_parameter('publish.cloud_stride').value == 4
    accepted = probe.set_params(publish__path_max_poses=2, stream__keyframe_interval=3,
                                diagnostics__period_s=0.2)
    assert all(r.successful for r in accepted)
    assert node.get_parameter('publish.path_max_poses').value == 2
    # Turning depth on makes the cloud acceptable in the same request.
    results = probe.set_params(stream__enable_depth=True, publish__cloud=True)
    assert all(r.successful for r in results), results
    # Engine changes apply from the next reset: every 3rd streaming frame is then a keyframe.
    assert probe.call(probe.reset_client, Trigger.Request()).success
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(stamps(90.0, 9))])
    wait_poses(probe, 9)
    wait_for(lambda: probe.count(probe.clouds) == 9, _TIMEOUT_S, 'clouds after the reset')
    _, _, engine = wait_status(probe, node, 'engine',
                               lambda lvl, m, v: v['frames_out'] == '9', 'nine frames')
    assert engine['keyframes'] == '5'  # 3 scale frames + streaming frames 3 and 6
    graph.remove(node)


def test_live_mode_keeps_the_newest_frame(graph):
    node, probe = start(graph)
    # Scale phase first, paced, so that the burst below meets a streaming session.
    for i, t in enumerate(stamps(29.0, 3)):
        publish(probe, [image_msg(make_image(i), t)])
        wait_status(probe, node, 'engine', lambda lvl, m, v, i=i: int(v['frames_in']) > i,
                    'scale frame taken')
    wait_poses(probe, 3)
    sent = stamps(30.0, 20, step_s=0.01)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(sent)])
    wait_for(lambda: probe.poses and stamp_ns(probe.poses[-1]) == sent[-1], _TIMEOUT_S,
             'the newest frame to come out')
    level, _, values = wait_status(
        probe, node, 'input', lambda lvl, msg, v: int(v['received_total']) > 0 and
        int(v.get('drops.queue_overflow', 0)) > 0, 'queue overflow counted')
    received = int(values['received_total'])
    assert probe.count(probe.poses) + int(values['drops.queue_overflow']) == received
    # Keeping only the newest frame is the live policy, not a fault: no WARN for it.
    assert not any(s.level != b'\x00' and s.name.endswith(': input') and 'dropped' in s.message
                   for a in probe.diagnostics for s in a.status)
    graph.remove(node)


def test_depth_and_cloud_outputs(graph):
    node, probe = start(graph, **bag(stream__enable_depth=True, publish__depth=True,
                                     publish__cloud=True, publish__cloud_stride=4))
    sent = stamps(40.0, 4)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(sent)])
    wait_for(lambda: probe.count(probe.clouds) >= 4 and probe.count(probe.depths) >= 4,
             _TIMEOUT_S, 'depth and clouds')
    depth = probe.depths[-1]
    assert (depth.encoding, depth.height, depth.width, depth.step) == ('32FC1', 84, 112, 448)
    assert depth.header.frame_id == 'cam_optical' and stamp_ns(depth) == sent[-1]
    values = np.frombuffer(bytes(depth.data), '<f4')
    assert values.size == 84 * 112 and np.all(np.isfinite(values))
    cloud = probe.clouds[-1]
    assert cloud.header.frame_id == 'odom' and stamp_ns(cloud) == sent[-1]
    assert [f.name for f in cloud.fields] == ['x', 'y', 'z', 'rgb']
    assert 0 < cloud.width <= 21 * 28 and len(cloud.data) == 16 * cloud.width
    xyz = np.frombuffer(bytes(cloud.data), '<f4').reshape(-1, 4)[:, :3]
    assert np.all(np.isfinite(xyz))
    graph.remove(node)


def test_rollovers_publish_one_continuous_trajectory(graph):
    # Sessions of 8 keyframes in a RoPE table of 8: every 5 frames a rollover, never a reset.
    node, probe = start(graph, **bag(model__max_frame_num=8, stream__session_keyframes=8,
                                     stream__overlap_keyframes=3))
    num = 40
    session = node.core.pipeline.session.session
    gt = ground_truth(num)
    session.replace_stream(OracleModel(gt, session.config, noise=0.001, seed=1))
    sent = stamps(60.0, num)
    publish(probe, [image_msg(frame_image(i), t) for i, t in enumerate(sent)])
    wait_poses(probe, num)
    assert [stamp_ns(p) for p in probe.poses] == sent
    _, _, values = wait_status(probe, node, 'odometry',
                               lambda lvl, m, v: v.get('rollovers') == '7', '7 rollovers')
    assert list(values) == list(ODOMETRY_KEYS) and values['sessions'] == '8'
    _, _, engine = wait_status(probe, node, 'engine', lambda *_: True, 'engine status')
    assert not [k for k, v in engine.items() if k.startswith('resets.') and v != '0']
    wait_for(lambda: len(probe.paths[-1].poses) == num, _TIMEOUT_S, 'one path, never cleared')
    xyz = np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z]
                    for p in probe.poses])
    steps = np.linalg.norm(np.diff(xyz, axis=0), axis=1)
    assert steps.max() < 3 * np.median(steps), steps  # no jump at any rollover
    graph.remove(node)


def test_resolution_change_nan_pose_and_engine_errors_reset(graph, monkeypatch):
    node, probe = start(graph, **bag(input__resolution_change_frames=1))
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(stamps(70.0, 4))])
    wait_poses(probe, 4)
    # The camera switches resolution: a new map at the new size.
    publish(probe, [image_msg(make_image(i, 120, 80), t)
                    for i, t in enumerate(stamps(71.0, 3))])
    wait_poses(probe, 7)
    session = node.core.pipeline.session
    failures = [errors.NonFiniteOutputError('pose is NaN'), RuntimeError('CUDA went away')]

    def failing(real):
        def call(*args, **kwargs):
            if failures:
                raise failures.pop(0)
            return real(*args, **kwargs)
        return call
    # A frame's model output reaches the session in finish_job (step_tensor where it runs
    # alone). The failures land on the next two that reach the model: the first frame, then
    # the new session's scale pass (its frames are buffered before), so 7 frames end posed.
    for name in ('step_tensor', 'finish_job'):
        monkeypatch.setattr(session, name, failing(getattr(session, name)))
    sent = stamps(72.0, 7)
    publish(probe, [image_msg(make_image(i, 120, 80), t) for i, t in enumerate(sent)])
    wait_for(lambda: stamp_ns(probe.poses[-1]) == sent[-1], _TIMEOUT_S, 'recovery')
    _, _, values = wait_status(probe, node, 'engine',
                               lambda lvl, m, v: v.get('resets.engine_error') == '1',
                               'engine error reset')
    assert values['resets.resolution_changed'] == values['resets.nan_pose'] == '1'
    assert values['errors_total'] == '1'
    assert any(s.level == b'\x02' and 'CUDA went away' in s.message
               for a in probe.diagnostics for s in a.status)
    graph.remove(node)


def test_no_weights_refuses_to_start(graph):
    overrides = {**TINY_CPU, 'allow_random_weights': False}
    with pytest.raises(ValueError, match="parameter 'weights' is empty"):
        LingbotMapNode(context=graph.context, namespace='/noweights',
                       parameter_overrides=[Parameter(k, value=v)
                                            for k, v in overrides.items()])
    assert main(['lingbot_map_node', '--ros-args', '-r', '__ns:=/noweights_main']) == 1


def test_sim_clock_jumping_back_resets_the_session(graph):
    node, probe = start(graph, **bag(use_sim_time=True))
    clock_pub = probe.create_publisher(Clock, '/clock', 10)
    wait_for(lambda: clock_pub.get_subscription_count() > 0, _TIMEOUT_S, '/clock subscriber')

    def set_clock(seconds):
        clock_pub.publish(Clock(clock=Time(sec=seconds)))
        wait_for(lambda: node.get_clock().now().nanoseconds == seconds * _SEC, _TIMEOUT_S,
                 f'sim time {seconds} s')
    set_clock(200)
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(stamps(200.0, 4))])
    wait_poses(probe, 4)
    set_clock(100)  # a bag loop: /clock goes back, image stamps will follow
    later = stamps(201.0, 3)  # still newer stamps: only the clock can trigger this reset
    publish(probe, [image_msg(make_image(i), t) for i, t in enumerate(later)])
    wait_poses(probe, 7)
    _, _, engine = wait_status(probe, node, 'engine',
                               lambda lvl, m, v: v.get('resets.clock_jump') == '1', 'reset')
    wait_for(lambda: [stamp_ns(p) for p in probe.paths[-1].poses] == later, _TIMEOUT_S,
             'a path restarted at the jump')
    graph.remove(node)
