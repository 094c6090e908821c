"""Triton kernels. ``forward``: the scheduled-attention forward pass."""

from .forward import INTERPRETED, scheduled_attention_forward, tile_config

__all__ = ["INTERPRETED", "scheduled_attention_forward", "tile_config"]
