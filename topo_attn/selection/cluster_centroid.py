"""``cluster_centroid`` (topology-aware and query-aware): the centroid score plus the score of the block's
persistence cluster (:mod:`.cluster`), so a block is favoured both for its own match and for its cluster's."""

from __future__ import annotations

import torch

from .cluster import cluster_parts
from .selector import Selector


def block_scores(q, k, block_size, groups, dtype, clusters: int = 4, **_) -> torch.Tensor:
    """The centroid score plus the cluster score, ``[B, groups, n, n]`` in ``dtype``."""
    block_score, cluster_score = cluster_parts(q, k, block_size, groups, dtype, clusters)
    return block_score + cluster_score


SELECTOR = Selector("cluster_centroid", "centroid score + the score of the block's persistence cluster",
                    block_scores, query_aware=True, topology_aware=True, sync_free=False, host_scores=True)
