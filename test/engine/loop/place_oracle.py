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
"""The oracle network with place descriptors, and a drifting odometry for it to answer.

:class:`PlaceOracle` is test/engine/oracle_model.py's ``OracleModel`` that also gives every
keyframe the descriptor of its place (``loop_scenes.Places``), as the model's pooled DINO
tokens would; :func:`drifting` turns a ground-truth route into what a drifting odometry sees.
Used by the node and replay loop-closure tests.
"""

from pathlib import Path
import sys

from lingbot_map_ros.engine import sim3
from loop_scenes import Places, rotation
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oracle_model import OracleModel  # noqa: E402,I100,I202


def drifting(truth: np.ndarray, seed: int = 0) -> np.ndarray:
    """Return the route as a drifting odometry sees it (steps grow 1 % a frame, heading drifts)."""
    rng = np.random.default_rng(seed)
    out = [truth[0]]
    for k in range(1, len(truth)):
        rel = sim3.inverse(truth[k - 1]) @ truth[k]
        rel[:3, 3] *= np.exp(0.01 * k)
        noise = sim3.make(rotation([0, 1, 0], 0.004 + 0.002 * rng.normal()), np.zeros(3))
        out.append(out[-1] @ rel @ noise)
    return np.stack(out)


class PlaceOracle(OracleModel):
    """The oracle network, plus each keyframe's place descriptor (``Places``)."""

    def __init__(self, odometry: np.ndarray, config, places: Places) -> None:
        """Answer with ``odometry`` (no noise) and ``places``' descriptors."""
        super().__init__(odometry, config, noise=0.0, seed=1)
        self.places = places

    def _with_descriptors(self, out: dict, images: torch.Tensor, wanted: bool) -> dict:
        if wanted:
            rows = [self.places.descriptor(self._index(image)) for image in images]
            out['descriptor'] = torch.tensor(np.stack(rows))
        return out

    def forward_scale(self, images, with_depth=False, with_descriptor=False):
        """Run the oracle's scale pass with descriptors."""
        return self._with_descriptors(super().forward_scale(images, with_depth), images,
                                      with_descriptor)

    def forward_frame(self, image, time_index, keyframe, with_depth=False,
                      with_descriptor=False):
        """Run the oracle's frame with its descriptor."""
        return self._with_descriptors(
            super().forward_frame(image, time_index, keyframe, with_depth), image,
            with_descriptor)
