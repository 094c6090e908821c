"""Inputs shared by the selection tests, as factory fixtures."""

from __future__ import annotations

import pytest
import torch

from topo_attn import samples, selection


def _random_qkv(seq: int, dim: int, heads: int | None = None, seed: int = 0, spread: float = 2.0):
    gen = torch.Generator().manual_seed(seed)
    shape = (seq, dim) if heads is None else (1, heads, seq, dim)
    return tuple(spread * torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))


def _clustered_qkv(seq: int = 512, block_size: int = 32, seed: int = 0):
    keys = samples.clustered_keys(seq, 16, block_size=block_size, clusters=3, outlier_blocks=2, seed=seed)
    return selection.synthetic_qkv(keys, block_size, seed=seed, sharpness=0.5)


@pytest.fixture
def random_qkv():
    """``random_qkv(seq, dim, heads=None, seed=0, spread=2.0)``: float64 normal q, k, v (``[S, D]``, or
    ``[1, heads, S, D]``) times ``spread``."""
    return _random_qkv


@pytest.fixture
def clustered_qkv():
    """``clustered_qkv(seq=512, block_size=32, seed=0)``: :func:`topo_attn.selection.synthetic_qkv` of clustered
    sample keys (3 clusters, 2 outlier blocks, dim 16)."""
    return _clustered_qkv
