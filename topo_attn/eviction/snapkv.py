"""``snapkv``: SnapKV, the blocks the last window of queries attends to most.

Definition. At each choice the observation window is the last ``o = min(config.observation, L)`` of the ``L``
queries given (at the end of the prefill: the last prefill queries; at an update: the last of the queries written
since). Each of them (of each query head) spreads a causal softmax (scale ``config.scale``) over the keys in the
cache up to its position. A block's *mass* is what it receives, summed over its keys, the ``o`` queries and the
query heads of its key/value head (GQA). Its score is the largest mass of the blocks in the cache within
``config.pool`` blocks of it by absolute index (``pool = 0``, the default: its own mass), SnapKV's max-pooling
moved from tokens to blocks: SnapKV pools token scores over a few tokens (a kernel of 5 to 7), less than a block
of the usual sizes, so by default this does not pool. The budget rule keeps the sinks, the window and the
``keep - sinks - window`` best-scored other blocks, ties to the lower block index.

Nothing is carried between choices: an update is the choice from scratch over the blocks still in the cache, with
the new queries as the observation window (with ``pool > 0`` the neighbours are by absolute index, so evicted
neighbours no longer count).
"""

from __future__ import annotations

import torch

from .policy import BlockScores, CacheView, EvictionConfig, EvictionPolicy, received_attention


def pooled(mass: torch.Tensor, blocks: torch.Tensor, pool: int) -> torch.Tensor:
    """``out[..., u] = max(mass[..., v] for v with |blocks[v] - blocks[u]| <= pool)`` over the blocks of a
    cache (``blocks`` increasing, so such ``v`` are within ``pool`` positions of ``u``)."""
    out = mass.clone()
    m = mass.shape[-1]
    for shift in range(1, min(pool, m - 1) + 1):
        near = (blocks[..., shift:] - blocks[..., :-shift]) <= pool  # [..., m - shift]: pairs (u, u + shift)
        lower = torch.where(near, mass[..., shift:], float("-inf"))  # the later block, seen from the earlier
        upper = torch.where(near, mass[..., :-shift], float("-inf"))
        out[..., :-shift] = torch.maximum(out[..., :-shift], lower)
        out[..., shift:] = torch.maximum(out[..., shift:], upper)
    return out


def scores(view: CacheView, config: EvictionConfig) -> BlockScores:
    """The observation window's mass per block, max-pooled over ``config.pool`` blocks: float64 ``[B, H_kv, m]``."""
    window = view.queries[..., -config.observation:, :]
    mass = received_attention(view.keys, window, config.block_size, config.scale)
    return BlockScores(pooled(mass, view.blocks, config.pool) if config.pool else mass, None)


POLICY = EvictionPolicy("snapkv", "SnapKV: the most attention from the last window of queries", scores,
                        query_aware=True)
