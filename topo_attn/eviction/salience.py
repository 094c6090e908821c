"""``salience``: keep the blocks whose centroids are the most salient among the blocks in the cache
(0-dimensional persistence, query-blind).

Definition. At each choice, over the ``m`` blocks in the cache (all ``n`` blocks at the end of the prefill; the
kept blocks plus those written since at an update), in increasing position: the centroid of each block
(:func:`~topo_attn.block_centroids`, the mean of its keys, a partial last block the mean of its real keys),
then the elder-rule salience of each centroid among those ``m`` centroids (:func:`~topo_attn.block_salience`:
Kruskal over pairs ordered by ``(distance, i, j)``, every block of the smaller component taking the merge
distance). The score of a block is its salience; the budget rule keeps the sinks, the window and the
``keep - sinks - window`` most salient other blocks, ties to the lower block index.

It reads only the keys of the blocks in the cache, carries nothing between choices, and so an update is the
choice from scratch over the blocks still in the cache. The centroids are recomputed from the cache's keys at
each choice (a read of ``keep`` blocks per block completed, less than the ``O(m^2 D)`` of the salience).
"""

from __future__ import annotations

import torch

from ..topology import block_centroids, block_salience
from .policy import BlockScores, CacheView, EvictionConfig, EvictionPolicy


def scores(view: CacheView, config: EvictionConfig) -> BlockScores:
    """The elder-rule salience of each block's centroid among the cache's blocks: float64 ``[B, H_kv, m]``."""
    centroids = block_centroids(view.keys, config.block_size, torch.float64)
    return BlockScores(block_salience(centroids, check=False).to(torch.float64), None)


POLICY = EvictionPolicy("salience", "the most salient block centroids (elder rule) among the blocks in the cache",
                        scores, topology_aware=True)
