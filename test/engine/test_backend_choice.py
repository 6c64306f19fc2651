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
"""``cache.backend``: ``auto``'s choice, its fallback, and refusing ``triton`` where it cannot run.

Run: ``python -m pytest test/engine/test_backend_choice.py`` (CPU, instant).
"""

from lingbot_map_ros.config import CacheConfig
from lingbot_map_ros.engine.attention import backend_choice
from lingbot_map_ros.engine.attention.backend import BACKEND_NAMES
from lingbot_map_ros.engine.attention.backend_choice import choose_backend, fa3_refusal, \
    resolve_backend, triton_refusal, unfaithful_refusal
from lingbot_map_ros.engine.cache import FlashInferKVCacheManager
import pytest
import torch

BF16 = torch.bfloat16


def test_auto_picks_triton_on_a_gpu_that_runs_it():
    for capability in ((9, 0), (8, 0), (10, 0)):
        assert choose_backend('cuda', capability, BF16, True)[0] == 'triton'
    assert choose_backend('cuda', (9, 0), torch.float16, True)[0] == 'triton'


@pytest.mark.parametrize('kind,capability,dtype,installed,why', [
    ('cpu', None, torch.float32, True, 'CUDA device'),
    ('cuda', (7, 5), BF16, True, 'compute capability >= 8.0'),
    ('cuda', (9, 0), torch.float32, True, 'bfloat16 or float16'),
    ('cuda', (9, 0), BF16, False, 'triton package')])
def test_auto_falls_back_to_sdpa_and_says_why(kind, capability, dtype, installed, why):
    chosen, reason = choose_backend(kind, capability, dtype, installed)
    assert chosen == 'sdpa'
    assert why in reason
    refusal = triton_refusal(kind, capability, dtype, installed)
    assert why in refusal and "'sdpa'" in refusal


def test_explicit_triton_is_refused_on_the_cpu_with_the_reason():
    with pytest.raises(ValueError, match="backend 'triton' needs a CUDA device.*'sdpa'"):
        resolve_backend('triton', torch.device('cpu'), torch.float32)
    with pytest.raises(ValueError, match="'triton' needs a CUDA device"):
        FlashInferKVCacheManager(num_blocks=1, max_num_frames=4, tokens_per_frame=10,
                                 num_heads=2, head_dim=8, dtype=torch.float32, device='cpu',
                                 scale_frames=1, sliding_window=2, max_total_frames=4,
                                 backend='triton')


def test_auto_resolves_to_sdpa_in_a_cpu_cache_and_the_cache_reports_it(caplog):
    assert 'auto' in BACKEND_NAMES and CacheConfig().backend == 'auto'
    assert resolve_backend('sdpa', torch.device('cpu'), torch.float32) == 'sdpa'
    with caplog.at_level('INFO'):
        cache = FlashInferKVCacheManager(
            num_blocks=1, max_num_frames=4, tokens_per_frame=10, num_heads=2, head_dim=8,
            dtype=torch.float32, device='cpu', scale_frames=1, sliding_window=2,
            max_total_frames=4, backend='auto')
    assert cache.backend_name == 'sdpa'
    assert "cache.backend 'auto' -> 'sdpa' (Triton needs a CUDA device" in caplog.text
    # The cache works through the chosen backend.
    k = torch.randn(10, 2, 8)
    cache.append_frame(0, k, k, keyframe=True)
    out = cache.compute_attention(0, torch.randn(10, 2, 8))
    assert out.shape == (10, 2, 8) and torch.isfinite(out).all()


@pytest.mark.parametrize('kind,capability,dtype,why', [
    ('cpu', None, torch.float32, 'got cpu'),
    ('cuda', (8, 0), BF16, 'compute capability 8.0'),
    ('cuda', (10, 0), BF16, 'compute capability 10.0'),
    ('cuda', (9, 0), torch.float32, 'bfloat16 or float16')])
def test_fa3_is_refused_off_hopper_and_in_float32(kind, capability, dtype, why):
    refusal = fa3_refusal(kind, capability, dtype)
    assert why in refusal and "'fa3'" in refusal
    assert fa3_refusal('cuda', (9, 0), BF16) is None


def test_explicit_fa3_on_the_cpu_and_without_its_package():
    with pytest.raises(ValueError, match="'fa3' needs a Hopper GPU"):
        resolve_backend('fa3', torch.device('cpu'), BF16)
    try:
        import fa3_fwd_interface  # noqa: F401
    except ImportError:
        from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention
        with pytest.raises(ImportError, match='fa3-fwd package'):
            Fa3RunAttention()


FP8 = torch.float8_e4m3fn


def test_auto_keeps_triton_for_fp8_kv_and_says_so_and_sdpa_off_cuda(caplog):
    chosen, why = choose_backend('cuda', (9, 0), BF16, True, FP8)
    assert chosen == 'triton' and 'two e4m3 terms (faithful)' in why
    assert choose_backend('cuda', (9, 0), BF16, True, BF16)[1] == \
        choose_backend('cuda', (9, 0), BF16, True)[1]
    # Where Triton cannot run, FP8 K/V go to sdpa (which widens them on read), with the reason.
    for kind, capability, installed, reason in (('cuda', (7, 5), True, 'compute capability'),
                                                ('cuda', (9, 0), False, 'triton package'),
                                                ('cpu', None, True, 'CUDA device')):
        chosen, why = choose_backend(kind, capability, BF16, installed, FP8)
        assert chosen == 'sdpa' and reason in why
    with caplog.at_level('INFO'):
        assert resolve_backend('auto', torch.device('cpu'), torch.float32, FP8) == 'sdpa'
    assert "cache.backend 'auto' -> 'sdpa'" in caplog.text


# Every device a choice depends on: (type, capability, triton installed, fa3 installed).
DEVICES = [('cuda', (9, 0), True, True), ('cuda', (9, 0), True, False),
           ('cuda', (9, 0), False, True), ('cuda', (10, 0), True, True),
           ('cuda', (8, 9), True, True), ('cuda', (8, 0), True, False),
           ('cuda', (7, 5), True, False), ('cpu', None, True, True)]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('storage', [BF16, FP8])
def test_auto_never_chooses_a_combination_outside_the_gate_under_faithful(device, storage):
    kind, capability, triton_installed, fa3_installed = device
    chosen, why = choose_backend(kind, capability, BF16, triton_installed, storage,
                                 fa3_installed, 'faithful')
    # FA3's FP8 kernel (e4m3 queries) fails the long-sequence gate: never for FP8 K/V.
    assert unfaithful_refusal(chosen, storage, 'faithful') is None
    assert not (chosen == 'fa3' and storage == FP8)
    hopper_fa3 = kind == 'cuda' and capability == (9, 0) and triton_installed and fa3_installed
    triton_runs = kind == 'cuda' and capability >= (8, 0) and triton_installed
    expected = 'fa3' if hopper_fa3 and storage == BF16 else 'triton' if triton_runs else 'sdpa'
    assert chosen == expected, (device, storage, why)


def test_fast_approximate_allows_fa3_fp8_on_hopper_and_warns(caplog):
    chosen, why = choose_backend('cuda', (9, 0), BF16, True, FP8, True, 'fast_approximate')
    assert chosen == 'fa3' and 'fast_approximate' in why
    assert choose_backend('cuda', (9, 0), BF16, True, FP8, False, 'fast_approximate') == \
        ('triton', 'the Triton kernel runs here; FP8 keys go as stored into its FP8 QK '
         'product, one e4m3 query term')
    with caplog.at_level('WARNING'):
        assert resolve_backend('sdpa', torch.device('cpu'), torch.float32, FP8,
                               'fast_approximate') == 'sdpa'
    assert 'fast_approximate' in caplog.text and 'official bf16' in caplog.text
    caplog.clear()
    with caplog.at_level('WARNING'):
        resolve_backend('sdpa', torch.device('cpu'), torch.float32, FP8, 'faithful')
    assert 'fast_approximate' not in caplog.text


def test_explicit_fa3_with_fp8_kv_is_refused_under_faithful(monkeypatch):
    monkeypatch.setattr(backend_choice, 'device_facts', lambda _d: ('cuda', (9, 0), True))
    with pytest.raises(ValueError, match='fidelity gate.*fast_approximate'):
        resolve_backend('fa3', torch.device('cpu'), BF16, FP8, 'faithful')
    assert resolve_backend('fa3', torch.device('cpu'), BF16, FP8, 'fast_approximate') == 'fa3'
    assert resolve_backend('fa3', torch.device('cpu'), BF16, BF16, 'faithful') == 'fa3'
    with pytest.raises(ValueError, match="cache.precision='exact'"):
        resolve_backend('sdpa', torch.device('cpu'), BF16, FP8, 'exact')


def test_fp8_products_only_where_fp8_tensor_cores_exist(monkeypatch):
    assert backend_choice.fp8_products(torch.device('cpu'))  # the interpreter emulates them
    for capability, expected in [((8, 0), False), ((8, 7), False), ((8, 9), True),
                                 ((9, 0), True)]:
        backend_choice.fp8_products.cache_clear()
        monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda _d, c=capability: c)
        assert backend_choice.fp8_products(torch.device('cuda', 0)) is expected, capability
    backend_choice.fp8_products.cache_clear()


def test_a_fa3_wheel_that_does_not_load_is_not_used_and_says_why(monkeypatch, caplog):
    import importlib
    import importlib.util
    real_find, real_import = importlib.util.find_spec, importlib.import_module

    def find(name, *args):
        return object() if name == 'fa3_fwd_interface' else real_find(name, *args)

    def load(name, *args):
        if name == 'fa3_fwd_interface':
            raise OSError('undefined symbol: _ZN3c10 (built for another torch)')
        return real_import(name, *args)
    monkeypatch.setattr(importlib.util, 'find_spec', find)
    monkeypatch.setattr(importlib, 'import_module', load)
    backend_choice.fa3_usable.cache_clear()
    with caplog.at_level('WARNING'):
        assert backend_choice.fa3_usable() is False
    assert 'does not load' in caplog.text and 'undefined symbol' in caplog.text
    backend_choice.fa3_usable.cache_clear()
