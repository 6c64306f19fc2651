"""Transformer building blocks shared by the DINO trunk, the aggregator and the heads."""

from .attention import Attend, dense_attention, Rope, SelfAttention
from .block import Block
from .layer_scale import LayerScale
from .mlp import Mlp
from .norm import LayerNorm, wide_dtype

__all__ = ['Attend', 'Block', 'dense_attention', 'LayerNorm', 'LayerScale', 'Mlp', 'Rope',
           'SelfAttention', 'wide_dtype']
