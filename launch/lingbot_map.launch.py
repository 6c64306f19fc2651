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
"""Start lingbot_map_node (or its lifecycle version) with the package's parameter file.

Example:
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw \
        weights:=/data/lingbot-map.pt base_frame:=base_link rviz:=true

Mapping with loop closure, metric depth and the occupancy grid ``~/grid`` (docs/map.md), then
``ros2 service call /lingbot_map/save_map std_srvs/srv/Trigger``:
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw \
        depth_topic:=/camera/aligned_depth_to_color/image_raw weights:=/data/lingbot-map.pt \
        loop_closure:=true grid:=true rviz:=true

Localizing in that saved map (RViz "2D Pose Estimate" on /initialpose gives a first guess):
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw \
        depth_topic:=/camera/aligned_depth_to_color/image_raw weights:=/data/lingbot-map.pt \
        loop_closure:=true map_load_path:=$HOME/.ros/lingbot_map/map map_mode:=localization

Several cameras (README "Several cameras", config/two_cameras.yaml):
    ros2 launch lingbot_map_ros lingbot_map.launch.py cameras:=front,left \
        params_file:=config/two_cameras.yaml weights:=/data/lingbot-map.pt

Topic names stay relative, so ``namespace`` moves the inputs and outputs together; the
camera_info topic is taken next to the image topic (``.../image_raw`` -> ``.../camera_info``).
With ``cameras:=a,b`` the node subscribes ``a/image``, ``a/camera_info``, ``b/image``, ... in
its namespace (``image_topic`` is not used); ``cameras:=a=/cam_a/image_raw,b=/cam_b/image_raw``
remaps each camera's image (and the camera_info beside it). Arguments whose default is empty
keep the value of ``params_file``. ``lifecycle:=true`` starts the managed node and, with
``autostart:=true``, configures and activates it (as nav2's lifecycle manager would).
"""

import os
import shutil

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, LogInfo, OpaqueFunction
from launch.actions import RegisterEventHandler
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node, SetParameter
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition

# Launch argument -> node parameter, applied only when the argument is not empty.
OVERRIDES = {'weights': 'weights', 'allow_random_weights': 'allow_random_weights',
             'odom_frame': 'frames.odom_frame', 'base_frame': 'frames.base_frame',
             'map_frame': 'frames.map_frame', 'camera_frame': 'frames.camera_frame',
             'publish_tf': 'publish.tf', 'transport': 'input.transport',
             'loop_closure': 'loop.enable', 'map_load_path': 'map.load_path',
             'map_mode': 'map.mode', 'grid': 'grid.enable'}


def arguments():
    """Return (name, default, description) of every launch argument."""
    share = get_package_share_directory('lingbot_map_ros')
    return (
        ('namespace', '', 'Namespace of the node and its topics'),
        ('params_file', os.path.join(share, 'config', 'lingbot_map.yaml'),
         'Parameter file of the node'),
        ('use_sim_time', 'false', 'Use /clock (bag playback, simulation)'),
        ('log_level', 'info', 'Log level: debug, info, warn, error, fatal'),
        ('image_topic', 'camera/image_raw', 'Input image topic (raw; with transport:=compressed '
         'the node subscribes to <image_topic>/compressed)'),
        ('weights', '', 'Checkpoint path (frees params_file of its weights value)'),
        ('allow_random_weights', '', 'true: run without weights (demo, meaningless poses)'),
        ('odom_frame', '', 'Continuous frame of the poses, path and TF (frames.odom_frame)'),
        ('base_frame', '', 'Frame whose pose is published (frames.base_frame)'),
        ('map_frame', '', 'frames.map_frame: the frame of map -> odom (default map)'),
        ('camera_frame', '', "Camera optical frame; empty keeps the images' frame_id"),
        ('publish_tf', '', 'true/false: broadcast odom_frame -> base_frame (publish.tf)'),
        ('transport', '', 'Input transport: raw or compressed (input.transport)'),
        ('cameras', '', 'Comma-separated camera names (input.cameras), each optionally '
         'name=image_topic: one stream per camera on <name>/image and <name>/camera_info; '
         'empty: one camera on image_topic'),
        ('depth_topic', '', 'Set: depth image aligned to the image (16UC1 mm / 32FC1 m) for '
         'metric outputs (metric.source depth, stream.enable_depth true)'),
        ('loop_closure', '', 'true/false: loop closure and the map frame (loop.enable, '
         'docs/loop_closure.md)'),
        ('map_load_path', '', 'A saved map folder (~/save_map) to load at start (map.load_path)'),
        ('map_mode', '', 'With a loaded map: mapping (grow it) or localization (map.mode)'),
        ('grid', '', 'true/false: the occupancy grid ~/grid for nav2 (grid.enable, docs/map.md)'),
        ('lifecycle', 'false', 'true: start the managed (lifecycle) node instead'),
        ('autostart', 'true', 'With lifecycle:=true, configure and activate at start'),
        ('rviz', 'false', 'true: also start rviz2 with rviz/lingbot_map.rviz (if installed)'),
    )


def _overrides(arg):
    """Node parameters from the non-empty launch arguments (strings typed like YAML)."""
    typed = {'true': True, 'false': False}
    values = {param: typed.get(arg(name).lower(), arg(name))
              for name, param in OVERRIDES.items() if arg(name)}
    names = list(camera_topics(arg('cameras')))
    if names:  # several cameras, one model (README "Several cameras")
        values['input.cameras'] = names
    if arg('depth_topic'):  # metric scale from a depth camera (docs/odometry.md)
        values.update({'metric.source': 'depth', 'stream.enable_depth': True})
    return values


def camera_topics(text):
    """``'a=/cam_a/image_raw,b'`` -> ``{'a': '/cam_a/image_raw', 'b': ''}`` (order kept)."""
    pairs = (item.strip().partition('=') for item in text.split(',') if item.strip())
    return {name.strip(): topic.strip() for name, _, topic in pairs}


def _camera_remaps(text):
    """Remap ``<name>/image`` and ``<name>/camera_info`` of each camera given a topic."""
    remaps = []
    for name, topic in camera_topics(text).items():
        if topic:
            remaps += [(f'{name}/image', topic),
                       (f'{name}/camera_info', os.path.join(os.path.dirname(topic),
                                                            'camera_info'))]
    return remaps


def _actions(context, *_args, **_kwargs):
    """Build the node (and rviz) once the arguments are known."""
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    image_topic = arg('image_topic')
    info_topic = os.path.join(os.path.dirname(image_topic), 'camera_info')
    managed = arg('lifecycle').lower() == 'true'
    kind = LifecycleNode if managed else Node
    node = kind(
        package='lingbot_map_ros', name='lingbot_map', namespace=arg('namespace'),
        executable='lingbot_map_lifecycle_node' if managed else 'lingbot_map_node',
        output='screen', parameters=[arg('params_file'), _overrides(arg)],
        remappings=[('image', image_topic), ('camera_info', info_topic)] +
        ([('depth', arg('depth_topic'))] if arg('depth_topic') else []) +
        _camera_remaps(arg('cameras')),
        arguments=['--ros-args', '--log-level', arg('log_level')])
    actions = [node]
    if managed and arg('autostart').lower() == 'true':
        actions += [
            RegisterEventHandler(OnStateTransition(
                target_lifecycle_node=node, goal_state='inactive',
                entities=[EmitEvent(event=ChangeState(
                    lifecycle_node_matcher=matches_action(node),
                    transition_id=Transition.TRANSITION_ACTIVATE))])),
            EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                        transition_id=Transition.TRANSITION_CONFIGURE))]
    if arg('rviz').lower() == 'true':
        actions.append(rviz_action())
    return actions


def rviz_action():
    """Return rviz2 with the package's view, or a message when rviz2 is not installed."""
    if shutil.which('rviz2') is None:
        return LogInfo(msg='rviz:=true but rviz2 is not installed: not started')
    config = os.path.join(get_package_share_directory('lingbot_map_ros'), 'rviz',
                          'lingbot_map.rviz')
    return Node(package='rviz2', executable='rviz2', name='rviz2', output='screen',
                arguments=['-d', config])


def generate_launch_description():
    """Declare the arguments, set use_sim_time, start the node."""
    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in arguments()]
    return LaunchDescription(declared + [
        SetParameter(name='use_sim_time', value=LaunchConfiguration('use_sim_time')),
        OpaqueFunction(function=_actions),
    ])
