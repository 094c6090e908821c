"""``random``: uniform random blocks, seeded (the floor any informed selector must beat)."""

from __future__ import annotations

import torch

from .selector import Scorer, Selector


def block_scores(q, k, block_size, groups, dtype, seed: int = 0, **_) -> torch.Tensor:
    """Uniform scores ``[B, groups, n, n]`` from a generator on q's device seeded with ``seed`` (no copy to the
    device, so no wait; a GPU draws other numbers than the CPU)."""
    n = -(-q.shape[-2] // block_size)
    generator = torch.Generator(device=q.device).manual_seed(seed)
    return torch.rand(q.shape[0], groups, n, n, generator=generator, dtype=dtype, device=q.device)


def step_scores(q, stats, first, rows, num_rows, seq_len, seed) -> torch.Tensor:
    """Uniform scores ``[B, H_kv, R, complete]`` from a CPU generator seeded with ``seed + seq_len`` (a new draw
    each step)."""
    generator = torch.Generator().manual_seed(seed + seq_len)
    scores = torch.rand(q.shape[0], stats.centroids.shape[1], num_rows, stats.complete, generator=generator,
                        dtype=torch.float64)
    return scores.to(q.device)


def token_scores(q, k, block_size, scale, seed) -> Scorer:
    """``torch.rand([B, H, L, n])`` in float64 from a generator on q's device seeded with ``seed``."""
    generator = torch.Generator(device=q.device).manual_seed(seed)
    shape = (*q.shape[:-1], -(-q.shape[-2] // block_size))
    scores = torch.rand(shape, generator=generator, dtype=torch.float64, device=q.device)
    return lambda rows: scores[..., rows, :]


SELECTOR = Selector("random", "uniform random blocks (seeded)", block_scores, step_scores, token_scores)
