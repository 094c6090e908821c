"""Triton kernels. ``forward``: the scheduled-attention forward pass; ``backward``: its gradients."""

from .backward import backward_tile_config, scheduled_attention_backward
from .forward import INTERPRETED, scheduled_attention_forward, tile_config

__all__ = ["INTERPRETED", "backward_tile_config", "scheduled_attention_backward", "scheduled_attention_forward",
           "tile_config"]
