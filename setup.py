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
"""Install lingbot_map_ros as an ament_python package (colcon) or with pip.

colcon puts the console scripts in ``lib/lingbot_map_ros`` (see setup.cfg) so that
``ros2 run lingbot_map_ros lingbot_map_node`` and launch files find them, and installs the
launch and config files under ``share/lingbot_map_ros``.
"""

from glob import glob

from setuptools import find_packages, setup

package_name = 'lingbot_map_ros'

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        ('share/' + package_name + '/launch', glob('launch/*.launch.py')),
        ('share/' + package_name + '/config', glob('config/*.yaml')),
        ('share/' + package_name + '/rviz', glob('rviz/*.rviz')),
        ('share/doc/' + package_name, ['LICENSE']),
    ],
    python_requires='>=3.10',
    # Only what `import lingbot_map_ros` and the node need beyond ROS. On a robot apt provides
    # numpy, yaml, pillow and cv2 (python3-opencv) through rosdep; OpenCV from pip is an extra
    # so it never shadows apt's cv2.
    install_requires=['setuptools', 'numpy', 'pyyaml', 'pillow', 'safetensors'],
    extras_require={
        # torch is not pinned: GPU users install the build that matches their CUDA. 2.5 is the
        # first release whose cuDNN attention op takes (attn_bias, compute_log_sumexp), as
        # engine/attention/split.py calls it; torch.nn.attention.sdpa_kernel needs >= 2.3.
        'torch': ['torch>=2.5'],
        # Replay, demo, bench, bag tools (rosbags has no rosdep key).
        'tools': ['rosbags', 'tqdm', 'matplotlib'],
        # A machine without apt's python3-opencv (the PyPI-wheel CI).
        'opencv': ['opencv-python-headless'],
        # Loop closure (engine/loop): the pose graph and the place index.
        'loop': ['gtsam>=4.3', 'faiss-cpu'],
        # Hopper GPUs (H100, H200): FlashAttention-3's forward, which cache.backend 'auto'
        # takes for bf16 K/V, and for FP8 K/V only under cache.precision fast_approximate
        # (outside the fidelity gate, docs/performance.md). Its wheel is built for one torch
        # release (0.0.3: torch 2.10, ran under 2.11); where it does not load, 'auto' says so
        # and keeps the Triton kernel.
        'hopper': ['fa3-fwd'],
    },
    zip_safe=True,
    maintainer='lingbot_map_ros developers',
    maintainer_email='dev@lingbot-map-ros.local',
    url='https://github.com/Robbyant/lingbot-map',
    description='Online camera mapping with the LingBot-Map streaming transformer (ROS 2).',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'lingbot_map_node = lingbot_map_ros.ros.nodes.entry:main',
            'lingbot_map_lifecycle_node = lingbot_map_ros.ros.nodes.lifecycle_node:main',
            'lingbot_map_launch = lingbot_map_ros.ros.nodes.launch_entry:main',
            'lingbot_map_replay = lingbot_map_ros.tools.replay:main',
            'lingbot_map_bench = lingbot_map_ros.tools.bench:main',
            'lingbot_map_golden = lingbot_map_ros.tools.golden:main',
            'lingbot_map_convert = lingbot_map_ros.tools.convert:main',
            'lingbot_map_demo = lingbot_map_ros.tools.demo:main',
        ],
    },
)
