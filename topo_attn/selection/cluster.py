"""``cluster`` (topology-aware and query-aware): the key-block centroids' minimum spanning tree is cut at its
``clusters - 1`` longest edges (the 0-dimensional persistence clusters that live longest); each cluster is
scored by the query-block centroid against the cluster's centroid, blocks of better clusters come first, and
the centroid score orders the blocks inside a cluster. The cut runs in numpy, lane by lane (host syncs)."""

from __future__ import annotations

import numpy as np
import torch

from ..topology import block_centroids, minimum_spanning_tree
from .selector import Selector, to_groups
from .stats import query_block_means


def mst_clusters(centroids: torch.Tensor, clusters: int) -> np.ndarray:
    """The clusters left when the minimum spanning tree of the centroids is cut at its ``clusters - 1`` longest
    edges: single-linkage clusters, the components of the 0-dimensional persistence at that scale.

    Arguments:
        centroids: real ``[n, D]``, finite (as :func:`~topo_attn.minimum_spanning_tree` takes them).
        clusters: wanted cluster count, clamped to ``1..n``.

    Returns:
        int64 labels ``[n]``, ``0..c-1`` numbered in order of each cluster's first block.
    """
    n = centroids.shape[0]
    clusters = max(1, min(clusters, n))
    edges, lengths = minimum_spanning_tree(centroids)
    keep = np.ones(len(edges), dtype=bool)
    if clusters > 1:
        keep[np.argsort(-lengths, kind="stable")[:clusters - 1]] = False
    parent = np.arange(n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in edges[keep]:
        parent[find(int(i))] = find(int(j))
    roots = np.array([find(i) for i in range(n)])
    _, labels = np.unique(roots, return_inverse=True)
    first = {}
    for lab in labels:
        first.setdefault(int(lab), len(first))
    return np.array([first[int(lab)] for lab in labels], dtype=np.int64)


def cluster_parts(q, k, block_size, groups, dtype, clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The centroid score ``[B, groups, n, n]`` and each key block's cluster score ``[B, groups, n, n]`` (the
    query-block centroid against the centroid of the key block's cluster; clusters per key/value head)."""
    query = query_block_means(q, block_size, groups, dtype)
    keys = block_centroids(k.detach(), block_size, dtype)  # [B, H_kv, n, D]
    batch, kv_heads, nb, dim = keys.shape
    centres = torch.empty_like(keys)  # each block's cluster centroid
    for b in range(batch):
        for h in range(kv_heads):
            labels = torch.from_numpy(mst_clusters(keys[b, h], clusters)).to(keys.device)
            count = int(labels.max()) + 1
            sums = torch.zeros(count, dim, dtype=dtype, device=keys.device).index_add_(0, labels, keys[b, h])
            centres[b, h] = (sums / torch.bincount(labels, minlength=count)[:, None].to(dtype))[labels]
    block_score = query @ to_groups(keys, groups).transpose(-1, -2)
    return block_score, query @ to_groups(centres, groups).transpose(-1, -2)


def block_scores(q, k, block_size, groups, dtype, clusters: int = 4, **_) -> torch.Tensor:
    """Blocks of the best-scored clusters first, the centroid score inside a cluster, as ranks (higher is
    better) in ``dtype``: ``[B, groups, n, n]``."""
    block_score, cluster_score = cluster_parts(q, k, block_size, groups, dtype, clusters)
    # lexicographic: sort by the block score, then stably by the cluster score
    first = torch.sort(block_score, dim=-1, stable=True).indices
    second = torch.sort(torch.gather(cluster_score, -1, first), dim=-1, stable=True).indices
    order = torch.gather(first, -1, second)  # ascending
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device)
                                             .expand_as(order).contiguous())
    return ranks.to(dtype)


SELECTOR = Selector("cluster", "persistence clusters (MST cut at its longest edges) ranked by query . cluster "
                    "centroid, then blocks by the centroid score", block_scores, query_aware=True,
                    topology_aware=True, sync_free=False, host_scores=True)
