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
"""A stand-in network that returns ground-truth poses, distorted per session by a random Sim(3).

Each input image encodes its frame number in its colour (red = n % 256, green = n // 256, a
flat image survives any resize). The oracle answers with the ground-truth camera of that frame,
seen from a frame of its own that each session draws at its first output (a random rotation,
translation and scale, as a real session picks its own origin and scale), plus pose noise.
``sibling`` gives a rollover's second stream, which shares the draws (``sessions`` lists every
session's frame in start order) and runs its scale pass unit by unit as ``ScalePass`` does.
With depth on it also returns depth maps: the frame's ground-truth depth (a slowly changing
plane) in the session's scale, with per-pixel noise (``depth_noise``, relative). Asked for
place descriptors, it gives each frame one that encodes its true camera centre and heading.
It enforces the RoPE table and the cache capacity like the real model, so a test that never
sees a limit reset shows that the rollover came first.
"""

from __future__ import annotations

import time

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.errors import CachePoolExhaustedError, TimeIndexLimitError
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.runner.jobs import Job, Outcome
from lingbot_map_ros.engine.scale_pass import scale_units
from lingbot_map_ros.engine.session.pipeline import StreamingSession
import numpy as np
from tiny_engine import tiny_config
import torch


def frame_image(index: int, size_hw: tuple[int, int] = (48, 64)) -> np.ndarray:
    """Flat RGB image encoding ``index`` (< 65536)."""
    image = np.zeros((*size_hw, 3), np.uint8)
    image[..., 0], image[..., 1] = index % 256, index // 256
    return image


def ground_truth(num: int, seed: int = 0) -> np.ndarray:
    """``[num, 4, 4]`` c2w of a camera wandering over a smooth loop (about 0.05 per frame)."""
    t = np.arange(num) * 0.01
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, 3)
    centres = np.stack([3 * np.sin(t + phase[0]), 0.3 * np.sin(3 * t + phase[1]),
                        3 * np.cos(0.7 * t + phase[2])], axis=1)
    poses = np.tile(np.eye(4), (num, 1, 1))
    for i, (yaw, pitch) in enumerate(zip(0.5 * t, 0.2 * np.sin(2 * t))):
        cy, sy, cp, sp = np.cos(yaw), np.sin(yaw), np.cos(pitch), np.sin(pitch)
        yaw_m = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
        pitch_m = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
        poses[i, :3, :3] = yaw_m @ pitch_m
    poses[:, :3, 3] = centres
    return poses


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


class OracleModel(torch.nn.Module):
    """Implements what ``StreamingSession`` calls on its stream (``engine.EngineStream``).

    It stands in for the stream's engine too: a session's jobs come to :meth:`run`
    (``Engine.run``), each to its stream's :meth:`forward_scale` or :meth:`forward_frame`.
    """

    def __init__(self, gt_c2w: np.ndarray, config: EngineConfig, noise: float = 0.0,
                 seed: int = 0, depth_noise: float = 0.0,
                 outliers: dict[int, float] | None = None) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
        self.gt = gt_c2w
        self.noise = noise
        self.depth_noise = depth_noise
        self.rng = np.random.default_rng(seed)
        self.max_frame_num = config.model.max_frame_num
        self.depth_layers = config.model.depth
        self.capacity = config.cache.max_total_frames
        self.outliers = outliers or {}
        """Session number -> factor on its drawn scale (implausible sessions)."""
        self.cached = 0
        self.sessions: list[tuple[float, np.ndarray, np.ndarray]] = []
        """Every session's frame, in the order the sessions started (shared by siblings)."""
        self.siblings: list[OracleModel] = []
        self.scale_passes: list[OracleScalePass] = []
        self.frame: int | None = None
        """This stream's session frame (index into ``sessions``), drawn at its first output."""

    @property
    def engine(self) -> 'OracleModel':
        """Return the stand-in for the stream's engine: the oracle itself (:meth:`run`)."""
        return self

    @property
    def state(self) -> 'OracleModel':
        """Return what a job names as its stream: the oracle itself."""
        return self

    def run(self, jobs: list[Job], overlap=None) -> list[Outcome]:
        """Run each job alone on its stream, as ``Engine.run``; a refused one gets its error."""
        outcomes = []
        for job in jobs:
            stream, start = job.stream, time.perf_counter()
            try:
                if job.mode == 'scale':
                    out = stream.forward_scale(job.images, job.with_depth, job.with_descriptor)
                else:
                    out = stream.forward_frame(job.images, job.time_index,
                                               job.mode == 'keyframe', job.with_depth,
                                               job.with_descriptor)
            except Exception as exc:  # noqa: BLE001 - as Engine.run: the job's error, its outcome
                out = exc
            model_ms = 0.0 if isinstance(out, Exception) else (time.perf_counter() - start) * 1e3
            outcomes.append(Outcome(out, model_ms, 1))
        if overlap is not None:
            overlap()
        return outcomes

    def start(self, size_hw) -> None:
        """Lease the stream's pages (nothing to lease: the oracle keeps no keys)."""

    def clear(self) -> None:
        """Empty the caches, keeping the pages (the warm-up's reset; never called on the CPU)."""
        self.cached = 0

    def close(self) -> None:
        """End the stream."""

    def reset(self) -> None:
        """Empty the stream: its next output starts a new session frame."""
        self.cached = 0
        self.frame = None

    def _session_frame(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Return this session's frame x_session = s * R @ x_gt + t (drawn at its start)."""
        if self.frame is None:
            scale = float(np.exp(self.rng.uniform(-1, 1)))
            scale *= self.outliers.get(len(self.sessions), 1.0)
            self.sessions.append((scale, _random_rotation(self.rng), self.rng.normal(size=3)))
            self.frame = len(self.sessions) - 1
        return self.sessions[self.frame]

    def cache_stats(self) -> None:
        return None  # the oracle keeps no KV cache

    @staticmethod
    def _index(image: torch.Tensor) -> int:
        red, green = (int(round(float(image[c, 0, 0]) * 255)) for c in (0, 1))
        return red + 256 * green

    def _outputs(self, images: torch.Tensor, with_depth: bool) -> dict:
        out = {'pose_enc': self._encode(images)}
        if with_depth:
            scale = self._session_frame()[0]
            maps = []
            for image in images:
                plane = 2.0 + 0.5 * np.sin(0.05 * self._index(image))
                noise = self.rng.normal(scale=self.depth_noise, size=image.shape[1:])
                maps.append(scale * plane * (1.0 + noise))
            out['depth'] = torch.tensor(np.stack(maps), dtype=torch.float32)
            out['depth_conf'] = torch.ones_like(out['depth'])
        return out

    def _encode(self, images: torch.Tensor) -> torch.Tensor:
        scale, rot, trans = self._session_frame()
        rows = []
        for image in images:
            gt = self.gt[self._index(image)]
            c2w = np.eye(4)
            c2w[:3, :3] = rot @ gt[:3, :3]
            c2w[:3, 3] = scale * rot @ gt[:3, 3] + trans
            c2w[:3, 3] += self.rng.normal(scale=self.noise * scale, size=3)
            quat = np.asarray(geometry.rotation_to_quaternion(c2w[:3, :3]))
            rows.append(np.concatenate([c2w[:3, 3], quat, [1.0, 1.2]]))
        return torch.tensor(np.stack(rows))

    def _take(self, num: int) -> None:
        if self.cached + num > self.capacity:
            raise CachePoolExhaustedError(f'oracle: {self.cached} cached, no room for {num}')
        self.cached += num

    def forward_scale(self, images: torch.Tensor, with_depth: bool = False,
                      with_descriptor: bool = False) -> dict:
        self._take(len(images))
        return self._with_descriptor(self._outputs(images, with_depth), images, with_descriptor)

    def sibling(self) -> 'OracleModel':
        """Return a second stream (a rollover's next session) with the same ground truth."""
        other = OracleModel.__new__(OracleModel)
        torch.nn.Module.__init__(other)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if not k.startswith('_')})
        other.reset()
        self.siblings.append(other)
        return other

    def scale_pass(self, images: torch.Tensor, with_depth: bool = False) -> 'OracleScalePass':
        """Return the scale pass, run unit by unit as ``engine.scale_pass.ScalePass`` does."""
        return OracleScalePass(self, images, with_depth)

    def forward_frame(self, image: torch.Tensor, time_index: int, keyframe: bool,
                      with_depth: bool = False, with_descriptor: bool = False) -> dict:
        if time_index >= self.max_frame_num:
            raise TimeIndexLimitError(f'oracle: time index {time_index} past the RoPE table')
        self._take(int(keyframe))
        return self._with_descriptor(self._outputs(image, with_depth), image, with_descriptor)

    def _with_descriptor(self, out: dict, images: torch.Tensor, wanted: bool) -> dict:
        """Add place descriptors that encode the place: the true camera centre and heading."""
        if wanted:
            rows = []
            for image in images:
                gt = self.gt[self._index(image)]
                rows.append(np.concatenate([gt[:3, 3], gt[:3, 2]]))
            desc = torch.tensor(np.stack(rows), dtype=torch.float32)
            out['descriptor'] = desc / desc.norm(dim=-1, keepdim=True)
        return out


class OracleScalePass:
    """``ScalePass``'s protocol over the oracle: the same unit count, the outputs at the end."""

    def __init__(self, stream: OracleModel, images: torch.Tensor, with_depth: bool) -> None:
        stream.reset()  # a new session
        self.stream = stream
        self.units = scale_units(len(images), stream.depth_layers, with_depth)
        self.done_units = 0
        self.step_ms = 0.0
        self.installed = False
        self._images, self._with_depth = images, with_depth
        self._out: dict | None = None
        stream.scale_passes.append(self)

    @property
    def done(self) -> bool:
        return self._out is not None

    def step(self) -> None:
        if self.done:
            return
        self.done_units += 1
        if self.done_units == self.units:
            self.stream._take(len(self._images))
            self._out = self.stream._outputs(self._images, self._with_depth)

    def run_all(self) -> int:
        left = self.units - self.done_units
        while not self.done:
            self.step()
        return left

    def install(self, ending: OracleModel | None = None) -> dict:
        self.run_all()
        self.installed = True
        return self._out

    def cancel(self) -> None:
        self.stream.reset()


def oracle_session(gt_c2w: np.ndarray, noise: float = 0.0, seed: int = 0,
                   depth_noise: float = 0.0, outliers: dict[int, float] | None = None,
                   **values) -> tuple[StreamingSession, OracleModel]:
    """Build a real ``StreamingSession`` (tiny preset, CPU) whose network is the oracle."""
    config = tiny_config({'stream.image_width': 56, 'cache.scale_frames': 2}, values)
    session = StreamingSession(config, allow_random_weights=True)
    oracle = OracleModel(gt_c2w, config, noise, seed, depth_noise, outliers)
    session.replace_stream(oracle)  # the stand-in replaces the stream's network, nothing else
    return session, oracle
