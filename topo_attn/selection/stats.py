"""Per-block statistics that selectors score against: the mean, minimum and maximum of each block's rows.

Key blocks give the centroid (:func:`~topo_attn.block_centroids`, for ``centroid`` and ``topology``) and Quest's
page bounds (:func:`key_block_bounds`, the element-wise minimum and maximum); query blocks give the mean query
(``centroid``), pooled over the query heads of a key/value head when the group chooses together. Every function
reads the tensor in its own dtype and strides (no float copy of the keys), so a long cache costs one read per
statistic; a partial last block counts its real rows only.
"""

from __future__ import annotations

import torch

from ..topology import block_centroids


def key_block_bounds(k: torch.Tensor, block_size: int,
                     dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The element-wise minimum and maximum of the keys of each block (a partial last block: its real rows),
    from the detached keys ``[..., S, D]``: ``(lo, hi)``, ``[..., n, D]`` each, in ``dtype`` (exact: the minimum
    and maximum are keys). On a GPU, float32 or float64 bounds come from one pass of the block-statistics kernel
    (:func:`topo_attn.topology.gpu.centroids.block_statistics_kernel`)."""
    k = k.detach()
    seq = k.shape[-2]
    if k.is_cuda and dtype in (torch.float32, torch.float64):  # one pass over the keys, one launch
        from ..topology.gpu.centroids import block_statistics_kernel  # triton is imported on first use

        _, lo, hi = block_statistics_kernel(k.reshape(-1, seq, k.shape[-1]), block_size, dtype)
        return lo.view(*k.shape[:-2], *lo.shape[-2:]), hi.view(*k.shape[:-2], *hi.shape[-2:])
    full = seq // block_size
    lo_parts, hi_parts = [], []
    if full:
        blocks = k[..., :full * block_size, :].unflatten(-2, (full, block_size))
        lo_parts.append(blocks.amin(-2))
        hi_parts.append(blocks.amax(-2))
    if full * block_size < seq:
        tail = k[..., full * block_size:, :]
        lo_parts.append(tail.amin(-2, keepdim=True))
        hi_parts.append(tail.amax(-2, keepdim=True))
    return torch.cat(lo_parts, -2).to(dtype), torch.cat(hi_parts, -2).to(dtype)


def query_block_means(q: torch.Tensor, block_size: int, groups: int, dtype: torch.dtype = torch.float32,
                      q_offset: int = 0) -> torch.Tensor:
    """The mean query of each query block (:func:`~topo_attn.block_centroids` of the queries), averaged over the
    query heads of each of ``groups`` head groups.

    Arguments:
        q: ``[B, H, L, D]``, the queries at absolute positions ``q_offset .. q_offset + L - 1``.
        block_size: tokens per block; groups: ``H_kv`` to pool each key/value head's query heads (``H`` keeps
            every head).
        q_offset: the absolute position of the first query (blocks stay aligned at position 0).

    Returns:
        ``[B, groups, R, D]`` in ``dtype``, rows the query blocks ``q_offset // block_size ..`` that the queries
        touch (a partial first or last block: the mean of its real queries).
    """
    batch, heads, length, dim = q.shape
    lead = q_offset % block_size  # positions of the first block before the first query
    padded = q.detach() if not lead else torch.nn.functional.pad(q.detach(), (0, 0, lead, 0))
    means = block_centroids(padded, block_size, dtype)  # [B, H, R, D]; the first row also counts the padding
    if lead:
        counted = min(block_size, lead + length)
        means[..., 0, :] *= counted / (counted - lead)
    return means.view(batch, groups, heads // groups, means.shape[-2], dim).mean(2)
