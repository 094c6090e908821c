"""``random``: a uniformly random set of blocks, seeded (the floor every informed policy must beat).

Definition. At each choice, over the ``m`` blocks in the cache in increasing position, the scores are
``torch.rand(B, H_kv, m, dtype=float64, generator=torch.Generator().manual_seed(seed + length))`` (a CPU
generator, ``length`` the tokens written so far, so a new draw at each choice), moved to the keys' device; the
budget rule keeps the sinks, the window and the ``keep - sinks - window`` best-scored others, a uniformly random
subset of the candidates. It reads nothing of the cache and carries nothing.
"""

from __future__ import annotations

import torch

from .policy import BlockScores, CacheView, EvictionConfig, EvictionPolicy


def scores(view: CacheView, config: EvictionConfig) -> BlockScores:
    """Uniform float64 scores ``[B, H_kv, m]`` seeded with ``seed + length``."""
    generator = torch.Generator().manual_seed(config.seed + view.length)
    draws = torch.rand(*view.blocks.shape, generator=generator, dtype=torch.float64)
    return BlockScores(draws.to(view.blocks.device), None)


POLICY = EvictionPolicy("random", "uniformly random blocks (seeded)", scores)
