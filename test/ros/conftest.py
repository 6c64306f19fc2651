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
"""Shared set-up of the ROS tests: a private DDS domain and a real rclpy graph helper.

The domain is chosen before any test initialises rclpy, so parallel runs on one machine (other
engineers, CI) never see each other's nodes. ``scripts/test.sh`` sets ``ROS_DOMAIN_ID`` already;
a bare ``pytest test/ros`` gets a random one here.
"""

import os
import random

import pytest
import torch

# Within ROS 2's safe range on Linux (0-101); 0, the default, is left to anything run unset.
os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(1, 101)))
# Keep discovery on this host (Kilted name; ROS_LOCALHOST_ONLY is the older spelling).
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')

# Two cores shared with other jobs: torch's default intra-op threads spin against each other
# (a tiny-model frame goes from ~25 ms to ~1 s). One thread keeps the node tests fast.
torch.set_num_threads(1)


@pytest.fixture(scope='module')
def graph():
    """Yield a real rclpy context with its executor, one per test module."""
    from node_harness import Graph

    g = Graph()
    yield g
    g.close()


@pytest.fixture(scope='module')
def context():
    """Yield an initialised rclpy Context without an executor, one per test module."""
    import rclpy

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    yield ctx
    rclpy.shutdown(context=ctx)
