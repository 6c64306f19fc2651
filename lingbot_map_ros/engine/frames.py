"""Frame vocabulary shared by the model, the heads, the session and its predictions.

A call of the streaming schedule runs frames in one of three roles (model spec 5.3):
``'scale'`` (phase 1: the N_s scale frames together), ``'keyframe'`` (cached) and
``'non-keyframe'`` (attends to the cache, then discarded). Every frame carries
``NUM_SPECIAL_TOKENS`` learned tokens ahead of its patch tokens: [camera, register x 4, scale].
"""

from typing import Literal

Role = Literal['scale', 'keyframe', 'non-keyframe']
"""What a frame is in the streaming schedule; also the mode of a model call."""

ROLES: tuple[Role, ...] = ('scale', 'keyframe', 'non-keyframe')
"""Every role, in schedule order."""

NUM_SPECIAL_TOKENS = 6
"""Special tokens per frame, ahead of the patch tokens: camera, 4 registers, scale."""
