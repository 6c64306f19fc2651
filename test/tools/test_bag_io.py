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
"""rosbag2 read/write helpers (sqlite3 and MCAP) and the ``make-bag`` sources.

Run: ``pytest test/tools/test_bag_io.py`` (a few seconds on 2 cores). Bags are written to a
temporary folder; the image-folder case reads 4 frames of ``../shared/data/loop`` (skipped when
that folder is absent).
"""


import cv2
from lingbot_map_ros.ros.messages.conversions import camera_info_k, compressed_msg_to_rgb
from lingbot_map_ros.ros.messages.conversions import image_msg_to_rgb, stamp_to_ns
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.make_bag import BagSpec, folder_frames, image_files, video_frames
from lingbot_map_ros.tools.make_bag import write_frames
import numpy as np
import pytest

K = np.array([[50.0, 0.0, 16.0], [0.0, 52.0, 12.0], [0.0, 0.0, 1.0]])


def _frames(num: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    base = cv2.GaussianBlur(rng.integers(0, 255, (24, 64, 3), dtype=np.uint8), (5, 5), 0)
    return [np.ascontiguousarray(base[:, i:i + 32]) for i in range(num)]


@pytest.mark.parametrize('storage', ['sqlite3', 'mcap'])
@pytest.mark.parametrize('encoding', ['rgb8', 'bgr8'])
def test_raw_images_round_trip_exactly(tmp_path, storage, encoding):
    frames = _frames(3)
    spec = BagSpec(out=tmp_path / 'bag', storage=storage, encoding=encoding)
    assert write_frames(spec, frames, K, fps=20.0, start_ns=5_000_000_000) == 3
    suffix = '.db3' if storage == 'sqlite3' else '.mcap'
    assert list((tmp_path / 'bag').glob(f'*{suffix}'))
    with bag_io.open_bag(tmp_path / 'bag') as reader:
        topics = bag_io.list_topics(reader)
        assert {n: (t.msgtype, t.num_messages) for n, t in topics.items()} == {
            '/camera/image_raw': (bag_io.IMAGE_TYPE, 3),
            '/camera/camera_info': (bag_io.CAMERA_INFO_TYPE, 3)}
        raws = list(bag_io.read_raw(reader))
    assert [r.topic for r in raws] == ['/camera/image_raw', '/camera/camera_info'] * 3
    images = [bag_io.deserialize(r) for r in raws[0::2]]
    infos = [bag_io.deserialize(r) for r in raws[1::2]]
    for i, (img, info) in enumerate(zip(images, infos)):
        stamp = 5_000_000_000 + i * 50_000_000
        assert stamp_to_ns(img.header.stamp) == stamp == raws[2 * i].log_time_ns
        assert img.encoding == encoding and img.header.frame_id == 'camera_optical_frame'
        np.testing.assert_array_equal(image_msg_to_rgb(img), frames[i])
        np.testing.assert_array_equal(camera_info_k(info), K)
        assert (info.width, info.height) == (32, 24)
        assert stamp_to_ns(info.header.stamp) == stamp


def test_compressed_images_and_custom_topics(tmp_path):
    frames = _frames(2)
    spec = BagSpec(out=tmp_path / 'bag', storage='mcap', topic='/cam/front/image',
                   info_topic='/cam/info', compressed=True, frame_id='front')
    write_frames(spec, frames, None, fps=10.0, hfov_deg=90.0)
    with bag_io.open_bag(tmp_path / 'bag' / 'bag.mcap') as reader:  # the storage file works too
        info = bag_io.require_topic(reader, 'cam/front/image/compressed', bag_io.IMAGE_TYPES)
        assert (info.msgtype, info.num_messages) == (bag_io.COMPRESSED_TYPE, 2)
        raws = list(bag_io.read_raw(reader, ['/cam/front/image/compressed', '/cam/info']))
    decoded = compressed_msg_to_rgb(bag_io.deserialize(raws[0]))
    assert decoded.shape == (24, 32, 3)
    assert np.abs(decoded.astype(int) - frames[0]).mean() < 10.0  # JPEG q90 of a noisy image
    # Pinhole guess: 90 deg over 32 px -> f = 16, principal point at the centre.
    np.testing.assert_allclose(camera_info_k(bag_io.deserialize(raws[1])),
                               [[16, 0, 16], [0, 16, 12], [0, 0, 1]])


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(bag_io.BagError, match='does not exist'):
        with bag_io.open_bag(tmp_path / 'missing'):
            pass
    (tmp_path / 'empty').mkdir()
    with pytest.raises(bag_io.BagError, match='no metadata.yaml'):
        with bag_io.open_bag(tmp_path / 'empty'):
            pass
    write_frames(BagSpec(out=tmp_path / 'bag'), _frames(1), K, fps=10.0)
    with pytest.raises(bag_io.BagError, match='exists already'):
        bag_io.BagWriter(tmp_path / 'bag')
    with bag_io.open_bag(tmp_path / 'bag') as reader:
        with pytest.raises(bag_io.BagError) as missing:
            bag_io.require_topic(reader, '/nope', bag_io.IMAGE_TYPES)
        assert '/camera/image_raw [sensor_msgs/msg/Image] 1 msgs' in str(missing.value)
        with pytest.raises(bag_io.BagError, match='has type sensor_msgs/msg/CameraInfo'):
            bag_io.require_topic(reader, '/camera/camera_info', bag_io.IMAGE_TYPES)
    with pytest.raises(ValueError, match='storage'):
        bag_io.BagWriter(tmp_path / 'other', 'rosbag1')


def test_frames_of_different_sizes_are_refused(tmp_path):
    frames = _frames(1) + [np.zeros((10, 10, 3), np.uint8)]
    with pytest.raises(ValueError, match='frame 1 is 10x10'):
        write_frames(BagSpec(out=tmp_path / 'bag'), frames, K, fps=10.0)


def test_video_source(tmp_path):
    path = tmp_path / 'clip.avi'
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*'MJPG'), 15.0, (32, 24))
    for rgb in _frames(6):
        writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    writer.release()
    got = list(video_frames(path, stride=2, max_frames=None, width=16))
    assert len(got) == 3 and got[0].shape == (12, 16, 3)


def test_image_folder_source(tmp_path, shared_file):
    files = image_files(shared_file('data', 'loop'))
    assert len(files) == 237 and files[0].name == '000000.png'
    frames = list(folder_frames(files[:4], width=259))
    assert [f.shape for f in frames] == [(147, 259, 3)] * 4
    write_frames(BagSpec(out=tmp_path / 'loop'), frames, None, fps=10.0)
    with bag_io.open_bag(tmp_path / 'loop') as reader:
        assert bag_io.list_topics(reader)['/camera/image_raw'].num_messages == 4
