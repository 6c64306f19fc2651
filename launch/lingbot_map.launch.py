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
"""Start lingbot_map_node with the package's parameter file.

Example:
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw \
        weights:=/data/lingbot-map.pt

Topic names stay relative, so ``namespace`` moves the inputs and outputs together; the camera_info
topic is taken next to the image topic (``.../image_raw`` -> ``.../camera_info``).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node, SetParameter


def arguments():
    """Return (name, default, description) of every launch argument."""
    config = os.path.join(get_package_share_directory('lingbot_map_ros'), 'config')
    return (
        ('namespace', '', 'Namespace of the node and its topics'),
        ('params_file', os.path.join(config, 'lingbot_map.yaml'), 'Parameter file of the node'),
        ('use_sim_time', 'false', 'Use /clock (bag playback, simulation)'),
        ('log_level', 'info', 'Log level: debug, info, warn, error, fatal'),
        ('image_topic', 'camera/image_raw', 'Input image topic (raw; the node appends '
         '/compressed itself with input.transport: compressed)'),
        ('weights', '', 'Checkpoint path; empty keeps the value of params_file'),
    )


def _node(context, *_args, **_kwargs):
    """Build the node once the arguments are known (an empty weights must not override)."""
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    image_topic = arg('image_topic')
    info_topic = os.path.join(os.path.dirname(image_topic), 'camera_info')
    overrides = {'weights': arg('weights')} if arg('weights') else {}
    return [Node(
        package='lingbot_map_ros', executable='lingbot_map_node', name='lingbot_map',
        namespace=arg('namespace'), output='screen',
        parameters=[arg('params_file'), overrides],
        remappings=[('image', image_topic), ('camera_info', info_topic)],
        arguments=['--ros-args', '--log-level', arg('log_level')])]


def generate_launch_description():
    """Declare the arguments, set use_sim_time, start the node."""
    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in arguments()]
    return LaunchDescription(declared + [
        SetParameter(name='use_sim_time', value=LaunchConfiguration('use_sim_time')),
        OpaqueFunction(function=_node),
    ])
