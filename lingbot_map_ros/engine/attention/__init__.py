"""Attention backends over the paged KV cache: 'flashinfer', 'sdpa', 'reference'."""

from lingbot_map_ros.engine.attention.backend import AttentionBackend, BACKEND_NAMES, \
    make_backend

__all__ = ['AttentionBackend', 'BACKEND_NAMES', 'make_backend']
