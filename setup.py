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
    ],
    python_requires='>=3.10',
    # torch is not pinned: GPU users install the build that matches their CUDA.
    install_requires=['setuptools', 'numpy', 'pyyaml', 'pillow', 'opencv-python-headless',
                      'safetensors', 'rosbags', 'tqdm', 'matplotlib'],
    extras_require={'torch': ['torch>=2.1']},
    zip_safe=True,
    maintainer='lingbot_map_ros maintainers',
    maintainer_email='maintainers@lingbot-map-ros.invalid',
    description='Online camera mapping with the LingBot-Map streaming transformer (ROS 2).',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'lingbot_map_node = lingbot_map_ros.ros.entry:main',
            'lingbot_map_replay = lingbot_map_ros.tools.replay:main',
            'lingbot_map_bench = lingbot_map_ros.tools.bench:main',
            'lingbot_map_golden = lingbot_map_ros.tools.golden:main',
            'lingbot_map_convert = lingbot_map_ros.tools.convert:main',
            'lingbot_map_demo = lingbot_map_ros.tools.demo:main',
        ],
    },
)
