"""``centroid``: the mean query of the query block dotted with the mean key of the key block (the centroid
score; with a group of query heads choosing together, the mean over the group's heads)."""

from __future__ import annotations

import torch

from ..topology import block_centroids
from .selector import Scorer, Selector, to_groups
from .stats import query_block_means


def block_scores(q, k, block_size, groups, dtype, **_) -> torch.Tensor:
    """``mean(q of query block, group) . mean(k of key block)``: one batched product ``[B, groups, n, n]`` in
    ``dtype``."""
    query = query_block_means(q, block_size, groups, dtype)
    keys = to_groups(block_centroids(k.detach(), block_size, dtype), groups)
    return query @ keys.transpose(-1, -2)


def step_scores(q, stats, first, rows, num_rows, seq_len, seed) -> torch.Tensor:
    """The mean of each row's queries over the group's heads, dotted with the kept block centroids:
    ``[B, H_kv, R, n]`` in the centroids' dtype (float64 for ``KeyBlockStats``), ``n`` the blocks the stats
    hold."""
    batch, heads, q_len, dim = q.shape
    kv_heads, dtype = stats.centroids.shape[1], stats.centroids.dtype
    in_row = rows[None, :] == torch.arange(num_rows, device=q.device)[:, None]  # [R, L]
    weights = in_row.to(dtype) / in_row.sum(-1, keepdim=True).clamp(min=1)  # the row's mean
    grouped = q.detach().to(dtype).reshape(batch, kv_heads, heads // kv_heads, q_len, dim)
    mean = torch.einsum("rl,bkgld->bkrd", weights, grouped) / (heads // kv_heads)
    return mean @ stats.centroids.transpose(-1, -2)


def token_scores(q, k, block_size, scale, seed) -> Scorer:
    """``q_t . mean(keys of kb)`` in float64."""
    centroids = to_groups(block_centroids(k.detach(), block_size), q.shape[1])  # float64 [B, H, n, D]
    return lambda rows: q[..., rows, :].to(torch.float64) @ centroids.transpose(-1, -2)


SELECTOR = Selector("centroid", "mean-pooled query of the query block . key-block centroid", block_scores,
                    step_scores, token_scores, query_aware=True, static_step=True)
