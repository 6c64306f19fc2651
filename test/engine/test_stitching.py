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
"""align_sim3: the contract (exact, noisy, static, straight line, single frame, bad input, timing).

Run: ``python -m pytest test/engine/test_stitching.py`` (about a second).
"""

from __future__ import annotations

import time

from lingbot_map_ros.engine.session.stitching import align_sim3
import numpy as np
import pytest


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _poses(rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    out = np.tile(np.eye(4), (len(centres), 1, 1))
    for i, c in enumerate(centres):
        out[i, :3, :3] = _rotation(rng)
        out[i, :3, 3] = c
    return out


def _sim3(scale: float, rot: np.ndarray, trans: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    out = c2w.copy()
    out[:, :3, :3] = rot @ c2w[:, :3, :3]
    out[:, :3, 3] = scale * c2w[:, :3, 3] @ rot.T + trans
    return out


def _case(seed: int, centres: np.ndarray, scale: float = 2.5):
    """Session poses, their reference poses under a known Sim(3), and that Sim(3)."""
    rng = np.random.default_rng(seed)
    session = _poses(rng, centres)
    rot, trans = _rotation(rng), rng.normal(size=3)
    return session, _sim3(scale, rot, trans, session), (scale, rot, trans)


def test_exact_inputs_are_recovered_at_round_off_level():
    rng = np.random.default_rng(1)
    session, reference, (scale, rot, trans) = _case(1, rng.normal(size=(12, 3)))
    fit = align_sim3(reference, session)
    assert not fit.degenerate
    assert abs(fit.scale - scale) < 1e-12
    assert np.abs(fit.rotation - rot).max() < 1e-12
    assert np.abs(fit.translation - trans).max() < 1e-12
    assert fit.residual < 1e-12
    assert np.abs(fit.apply(session) - reference).max() < 1e-12
    assert fit.rotation.shape == (3, 3) and fit.translation.shape == (3,)


def test_apply_keeps_leading_dimensions_and_the_documented_formula():
    session, reference, _ = _case(2, np.random.default_rng(2).normal(size=(6, 3)))
    fit = align_sim3(reference, session)
    grid = session.reshape(2, 3, 4, 4)
    mapped = fit.apply(grid)
    assert mapped.shape == (2, 3, 4, 4)
    one = session[4]
    assert np.allclose(mapped[1, 1, :3, :3], fit.rotation @ one[:3, :3], atol=1e-12)
    assert np.allclose(mapped[1, 1, :3, 3],
                       fit.scale * fit.rotation @ one[:3, 3] + fit.translation, atol=1e-12)
    # The last row is written as constants, never computed: exact.
    assert np.array_equal(mapped[..., 3, :], np.broadcast_to([0.0, 0.0, 0.0, 1.0], (2, 3, 4)))
    with pytest.raises(ValueError, match=r'\[\.\.\., 4, 4\]'):
        fit.apply(np.eye(3))


def test_noisy_inputs_give_the_transform_within_the_noise():
    rng = np.random.default_rng(3)
    session, reference, (scale, rot, trans) = _case(3, rng.normal(size=(40, 3)), scale=0.4)
    noisy = reference.copy()
    noisy[:, :3, 3] += rng.normal(scale=0.01, size=(40, 3))
    fit = align_sim3(noisy, session)
    assert not fit.degenerate
    assert abs(fit.scale / scale - 1) < 0.03
    assert np.abs(fit.rotation - rot).max() < 1e-12  # the orientations were not perturbed
    assert 0.005 < fit.residual < 0.03  # about the noise (0.01 per axis, RMS over 3 axes)


def test_straight_line_overlap_aligns_through_the_orientations():
    # Centres on one line: they leave the rotation about the line free; orientations fix it.
    centres = np.outer(np.linspace(0, 1, 8), [0.3, -0.2, 1.0])
    session, reference, (scale, rot, trans) = _case(4, centres, scale=1.7)
    fit = align_sim3(reference, session)
    assert not fit.degenerate
    assert abs(fit.scale - scale) < 1e-12
    assert np.abs(fit.rotation - rot).max() < 1e-12
    assert np.abs(fit.apply(session) - reference).max() < 1e-12


@pytest.mark.parametrize('jitter', [0.0, 1e-6])
def test_static_camera_is_degenerate_and_uses_the_fallback_scale(jitter):
    # Both sessions see the same still camera, each with its own estimation noise.
    rng = np.random.default_rng(5)
    session, reference, (_, rot, _) = _case(5, np.full((10, 3), 0.5), scale=3.0)
    session[:, :3, 3] += rng.normal(scale=jitter, size=(10, 3))
    reference[:, :3, 3] += rng.normal(scale=jitter, size=(10, 3))
    fit = align_sim3(reference, session, fallback_scale=0.8)
    assert fit.degenerate and fit.scale == 0.8  # the fallback passed through: exact
    assert np.abs(fit.rotation - rot).max() < 1e-9
    # The mean centre still lands on the mean centre.
    mapped = fit.apply(session)[:, :3, 3].mean(axis=0)
    assert np.abs(mapped - reference[:, :3, 3].mean(axis=0)).max() < 1e-9
    assert fit.residual < 1e-5


def test_single_frame_is_degenerate_and_maps_that_frame_exactly():
    session, reference, (_, rot, _) = _case(6, np.array([[1.0, 2.0, 3.0]]))
    fit = align_sim3(reference, session)
    assert fit.degenerate and fit.scale == 1.0  # the default fallback passed through: exact
    assert np.abs(fit.rotation - rot).max() < 1e-12
    assert np.abs(fit.apply(session) - reference).max() < 1e-12
    assert fit.residual < 1e-12


def test_bad_input_raises_value_error():
    good = np.tile(np.eye(4), (3, 1, 1))
    bad = good.copy()
    bad[1, 0, 3] = np.nan
    inf = good.copy()
    inf[2, 1, 1] = np.inf
    for ref, ses, match in ((good, good[:2], 'same frames'), (good[0], good[0], r'\[N, 4, 4\]'),
                            (good[:0], good[:0], r'\[N, 4, 4\]'), (bad, good, 'NaN'),
                            (good, inf, 'NaN or Inf'), (good[:, :3], good[:, :3], r'\[N, 4, 4\]')):
        with pytest.raises(ValueError, match=match):
            align_sim3(ref, ses)
    for fallback in (0.0, -1.0, float('nan')):
        with pytest.raises(ValueError, match='fallback_scale'):
            align_sim3(good, good, fallback_scale=fallback)


def test_five_hundred_frames_take_well_under_50_ms():
    rng = np.random.default_rng(7)
    session, reference, _ = _case(7, rng.normal(size=(500, 3)))
    align_sim3(reference, session)
    start = time.perf_counter()
    for _ in range(5):
        align_sim3(reference, session)
    assert (time.perf_counter() - start) / 5 < 0.010
