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
"""The pure conversions (ros/messages/conversions.py): every encoding, every drop reason, poses.

Run: ``pytest test/ros/test_conversions.py`` (a second; no ROS graph).

Messages are built both as rclpy messages (``array.array`` data) and as ``rosbags`` messages
(``numpy`` data, after a CDR round trip), the two kinds the node and the replay tool see.
"""

import cv2
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.messages.conversions import ImageConversionError
import numpy as np
import pytest
from rosbags.typesys import get_typestore, Stores
from sensor_msgs.msg import CameraInfo, CompressedImage, Image

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (5, 6, 3), dtype=np.uint8)
_TS = get_typestore(Stores.ROS2_HUMBLE)


def raw(pixels, encoding, step=None, bigendian=False, **fields):
    """Return an rclpy Image holding ``pixels`` (rows padded to ``step`` bytes)."""
    height, width = pixels.shape[:2]
    row = pixels.reshape(height, -1).view(np.uint8)
    step = row.shape[1] if step is None else step
    data = np.zeros((height, step), np.uint8)
    data[:, :row.shape[1]] = row[:, :step]
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=int(bigendian),
                step=step)
    msg.data = data.tobytes()
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def rosbags_copy(msg):
    """Return the same Image as rosbags deserialises it from a bag (numpy data)."""
    cls = _TS.types['sensor_msgs/msg/Image']
    header = _TS.types['std_msgs/msg/Header'](
        stamp=_TS.types['builtin_interfaces/msg/Time'](sec=1, nanosec=2), frame_id='cam')
    data = np.frombuffer(bytes(msg.data), np.uint8)
    made = cls(header=header, height=msg.height, width=msg.width, encoding=msg.encoding,
               is_bigendian=msg.is_bigendian, step=msg.step, data=data)
    return _TS.deserialize_cdr(_TS.serialize_cdr(made, cls.__msgtype__), cls.__msgtype__)


@pytest.mark.parametrize('encoding,pixels', [
    ('rgb8', RGB), ('bgr8', RGB[..., ::-1]), ('8UC3', RGB[..., ::-1]),
    ('rgba8', np.dstack([RGB, np.full(RGB.shape[:2], 9, np.uint8)])),
    ('bgra8', np.dstack([RGB[..., ::-1], np.full(RGB.shape[:2], 9, np.uint8)])),
])
@pytest.mark.parametrize('pad', [0, 5])
def test_colour_encodings_give_rgb(encoding, pixels, pad):
    msg = raw(np.ascontiguousarray(pixels), encoding, step=pixels.shape[1] * pixels.shape[2] + pad)
    for m in (msg, rosbags_copy(msg)):
        out = conversions.image_msg_to_rgb(m)
        assert out.dtype == np.uint8 and out.flags.c_contiguous and out.flags.writeable
        np.testing.assert_array_equal(out, RGB)


@pytest.mark.parametrize('encoding', ['mono8', '8UC1'])
def test_mono8_is_replicated(encoding):
    gray = RGB[..., 0].copy()
    out = conversions.image_msg_to_rgb(raw(gray, encoding, step=gray.shape[1] + 3))
    np.testing.assert_array_equal(out, np.dstack([gray] * 3))


@pytest.mark.parametrize('encoding', ['mono16', '16UC1'])
@pytest.mark.parametrize('bigendian', [False, True])
def test_mono16_scaled_to_8_bit_with_endianness(encoding, bigendian):
    values = (np.arange(30).reshape(5, 6) * 2000).astype('>u2' if bigendian else '<u2')
    out = conversions.image_msg_to_rgb(raw(values, encoding, step=6 * 2 + 4,
                                           bigendian=bigendian))
    expected = (values.astype(np.uint32) >> 8).astype(np.uint8)
    np.testing.assert_array_equal(out[..., 1], expected)
    assert out[4, 5, 0] == (29 * 2000) >> 8


def test_rgb16_is_scaled():
    values = RGB.astype('<u2') * 257
    np.testing.assert_array_equal(conversions.image_msg_to_rgb(raw(values, 'rgb16')), RGB)


def test_bayer_rggb_red_scene_stays_red():
    height, width = 8, 8
    mosaic = np.zeros((height, width), np.uint8)
    mosaic[0::2, 0::2] = 200  # R sites of RGGB; G and B sites see nothing of a red scene
    out = conversions.image_msg_to_rgb(raw(mosaic, 'bayer_rggb8'))
    np.testing.assert_array_equal(out[2:6, 2:6], np.broadcast_to([200, 0, 0], (4, 4, 3)))


def test_uyvy_grey_round_trip():
    # Y = 128 with neutral chroma is mid grey.
    uyvy = np.tile(np.array([128, 128, 128, 128], np.uint8), (4, 2)).reshape(4, 8)
    out = conversions.image_msg_to_rgb(raw(uyvy.reshape(4, 4, 2), 'yuv422'))
    assert out.shape == (4, 4, 3)
    assert np.all(np.abs(out.astype(int) - 128) <= 2)


@pytest.mark.parametrize('mutate,reason', [
    ({'encoding': '32FC1'}, 'encoding'),
    ({'encoding': 'weird'}, 'encoding'),
    ({'height': 0, 'width': 0, 'step': 0}, 'size'),
    ({'width': 100000}, 'size'),
    ({'step': 10}, 'step'),
    ({'step': -1}, 'step'),
    ({'encoding': 'mono16', 'step': 17}, 'step'),
    ({'encoding': 'yuv422', 'width': 5, 'step': 10}, 'size'),
])
def test_bad_headers_are_refused_with_reason(mutate, reason):
    msg = raw(RGB, 'rgb8')
    for key, value in mutate.items():
        setattr(msg, key, value)
    with pytest.raises(ImageConversionError) as info:
        conversions.image_msg_to_rgb(msg)
    assert info.value.reason == reason
    assert str(info.value)


def test_truncated_data_is_refused():
    msg = raw(RGB, 'rgb8')
    msg.data = bytes(msg.data)[:-1]
    with pytest.raises(ImageConversionError, match='needs 90') as info:
        conversions.image_msg_to_rgb(msg)
    assert info.value.reason == 'truncated'


def test_check_returns_the_data_without_copying():
    msg = raw(RGB, 'rgb8', step=20)
    assert conversions.check_image_msg(msg).size == 100
    msg.encoding = 'bayer_rggb16'
    with pytest.raises(ImageConversionError, match='unsupported encoding'):
        conversions.check_image_msg(msg)


def compressed(ext, image, fmt):
    ok, data = cv2.imencode(ext, image)
    assert ok
    return CompressedImage(format=fmt, data=data.tobytes())


def test_png_is_lossless_and_formats_are_accepted():
    for fmt in ('png', 'bgr8; png compressed bgr8', ''):
        msg = compressed('.png', RGB[..., ::-1].copy(), fmt)
        np.testing.assert_array_equal(conversions.compressed_msg_to_rgb(msg), RGB)


def test_jpeg_gray_and_16_bit_png():
    smooth = np.tile(np.linspace(0, 255, 32, dtype=np.uint8), (16, 1))
    out = conversions.compressed_msg_to_rgb(compressed('.jpg', smooth, 'jpeg'))
    assert out.shape == (16, 32, 3)
    assert np.abs(out[..., 0].astype(int) - smooth).max() < 12
    deep = (smooth.astype(np.uint16) * 256)
    out16 = conversions.compressed_msg_to_rgb(compressed('.png', deep, '16UC1; png '
                                                         'compressed mono16'))
    np.testing.assert_array_equal(out16[..., 2], smooth)


@pytest.mark.parametrize('data,fmt,reason', [
    (b'', 'jpeg', 'truncated'),
    ('half_jpeg', 'jpeg', 'truncated'),
    (b'\xff\xd8' + bytes(range(256)) * 4 + b'\xff\xd9', 'jpeg', 'decode'),
    (b'\x89PNG\r\n\x1a\n' + b'\x00' * 64, 'png', 'truncated'),
    (b'GIF89a' + b'\x00' * 32, 'gif', 'encoding'),
    (b'garbage that is no image', 'jpeg', 'decode'),
    (b'\x00' * 12 + b'\x89PNG', '16UC1; compressedDepth png', 'encoding'),
])
def test_bad_compressed_images_are_refused(data, fmt, reason):
    if data == 'half_jpeg':
        full = compressed('.jpg', RGB, 'jpeg').data
        data = bytes(full)[:len(full) // 2]
    with pytest.raises(ImageConversionError) as info:
        conversions.compressed_msg_to_rgb(CompressedImage(format=fmt, data=data))
    assert info.value.reason == reason


def test_reasons_are_the_documented_ones():
    assert set(conversions.DROP_REASONS) == {'encoding', 'size', 'step', 'truncated', 'decode'}


def test_stamps_round_trip():
    for ns in (0, 1, 999_999_999, 1_700_000_000_123_456_789):
        sec, nanosec = conversions.ns_to_sec_nanosec(ns)
        assert 0 <= nanosec < 1_000_000_000
        msg = Image()
        conversions.fill_stamp(msg.header.stamp, ns)
        assert conversions.stamp_to_ns(msg.header.stamp) == ns == sec * 10**9 + nanosec


def random_rotation(rng):
    q = rng.normal(size=4)
    return np.asarray(geometry.quaternion_to_rotation(q / np.linalg.norm(q)))


def test_quaternion_matches_rotation_including_half_turns():
    rotations = [random_rotation(RNG) for _ in range(50)]
    rotations += [np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, 1.0, -1.0]),
                  np.diag([-1.0, -1.0, 1.0]), np.eye(3)]
    for rot in rotations:
        q = conversions.rotation_to_quaternion(rot)
        assert q[3] >= 0 and abs(np.linalg.norm(q) - 1) < 1e-12
        np.testing.assert_allclose(geometry.quaternion_to_rotation(np.array(q)), rot,
                                   atol=1e-9)


def test_c2w_to_pose_and_refusals():
    c2w = np.eye(4)
    c2w[:3, :3] = random_rotation(RNG)
    c2w[:3, 3] = [1.0, -2.0, 3.5]
    position, quat = conversions.c2w_to_pose(c2w)
    assert position == (1.0, -2.0, 3.5)  # copied from the matrix, not computed: exact
    assert isinstance(quat[0], float)
    with pytest.raises(ValueError, match='non-finite'):
        conversions.c2w_to_pose(np.full((4, 4), np.nan))
    with pytest.raises(ValueError, match='4x4'):
        conversions.c2w_to_pose(np.eye(3))


def test_flu_map_axes_put_the_first_camera_looking_along_x():
    flu = conversions.map_axes_transform('flu')
    # The optical z axis (forward) becomes map x; optical y (down) becomes map -z.
    np.testing.assert_array_equal(flu[:3, :3] @ [0, 0, 1], [1, 0, 0])
    np.testing.assert_array_equal(flu[:3, :3] @ [0, 1, 0], [0, 0, -1])
    assert np.array_equal(conversions.map_axes_transform('optical'), np.eye(4))
    with pytest.raises(ValueError):
        conversions.map_axes_transform('enu')


def test_twist_in_camera_frame():
    prev = np.eye(4)
    cur = np.eye(4)
    cur[:3, :3] = cv2.Rodrigues(np.array([0.0, 0.2, 0.0]))[0]
    cur[:3, 3] = [0.0, 0.0, 0.5]
    linear, angular = conversions.twist_between(prev, cur, 0.5)
    np.testing.assert_allclose(linear, [0.0, 0.0, 1.0])
    np.testing.assert_allclose(angular, [0.0, 0.4, 0.0], atol=1e-12)
    with pytest.raises(ValueError):
        conversions.twist_between(prev, cur, 0.0)


def test_cloud_packing_strides_masks_and_colours():
    points = np.arange(4 * 6 * 3, dtype=np.float32).reshape(4, 6, 3)
    points[0, 2] = np.nan
    colours = np.zeros((4, 6, 3), np.uint8)
    colours[..., 0], colours[..., 2] = 255, 7
    valid = np.ones((4, 6), bool)
    valid[2, 4] = False
    num, data = conversions.xyz_rgb_cloud(points, colours, 2, valid)
    record = np.frombuffer(data, dtype=[('x', '<f4'), ('y', '<f4'), ('z', '<f4'),
                                        ('rgb', '<u4')])
    assert num == 4 == record.shape[0]  # 6 strided points, one NaN, one masked
    np.testing.assert_array_equal(record['x'], [0.0, 12.0, 36.0, 42.0])
    assert set(record['rgb'].tolist()) == {0xFF0007}


def test_camera_info_k():
    info = CameraInfo()
    info.k = [500.0, 0.0, 320.0, 0.0, 501.0, 240.0, 0.0, 0.0, 1.0]
    k = conversions.camera_info_k(info)
    assert k[1, 1] == 501.0 and k.shape == (3, 3)
