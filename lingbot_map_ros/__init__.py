"""LingBot-Map streaming mapping for ROS 2: engine (torch), ROS node and tools."""

__version__ = '0.1.0'
