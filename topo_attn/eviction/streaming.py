"""``streaming``: StreamingLLM, the attention sinks and the most recent blocks only.

Definition. The score of a block is its absolute index, so the budget rule keeps the ``sinks`` first blocks and
the ``keep - sinks`` most recent ones (the window, and as many blocks before it as the budget holds). It reads
neither keys nor queries; an update is the choice from scratch over the blocks still in the cache (the most
recent blocks are always there).
"""

from __future__ import annotations

import torch

from .policy import BlockScores, CacheView, EvictionConfig, EvictionPolicy


def scores(view: CacheView, config: EvictionConfig) -> BlockScores:
    """Each block's absolute index, float64 ``[B, H_kv, m]`` (the more recent, the higher)."""
    return BlockScores(view.blocks.to(torch.float64), None)


POLICY = EvictionPolicy("streaming", "StreamingLLM: the sinks and the most recent blocks", scores)
