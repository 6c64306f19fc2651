"""The inference engine: KV cache, attention backends, model and streaming session.

Nothing under ``engine`` imports rclpy or any ROS message package.
"""
