"""Deterministic sample keys for demos, notebooks and tests."""

from __future__ import annotations

import torch


def clustered_keys(seq_len: int, dim: int, block_size: int = 64, clusters: int = 4, outlier_blocks: int = 2,
                   seed: int = 0) -> torch.Tensor:
    """Keys ``[seq_len, dim]`` float32 whose blocks sit in ``clusters`` well-separated clusters (runs of
    consecutive blocks share a cluster, as topics do in text), plus ``outlier_blocks`` blocks far from
    all clusters: the blocks that a 0-dimensional persistence salience should rank first."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-seq_len // block_size)
    centres = 4.0 * torch.randn(clusters, dim, generator=gen)
    run = max(1, nb // clusters)
    block_centre = centres[(torch.arange(nb) // run) % clusters]
    if outlier_blocks:
        picks = torch.randperm(max(nb - 1, 1), generator=gen)[:min(outlier_blocks, nb - 1)] + 1
        block_centre[picks] = 12.0 * torch.randn(len(picks), dim, generator=gen)
    keys = block_centre.repeat_interleave(block_size, dim=0)[:seq_len]
    return keys + torch.randn(seq_len, dim, generator=gen)
