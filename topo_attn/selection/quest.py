"""``quest``: Quest's page bound (Tang et al. 2024). Per key block the element-wise minimum ``lo`` and maximum
``hi`` of its keys; ``relu(q) . hi + min(q, 0) . lo`` bounds ``q . k`` from above for every key of the block,
and a query block (with a group of query heads choosing together: the group too) scores the key block by the
largest bound among its queries: an upper bound on every logit of the tile.

On a GPU the whole-sequence scores come from one Triton kernel (:mod:`.quest_kernel`) that keeps the largest
bound in registers; elsewhere (and for float64 scores, block sizes the kernel does not take) from torch
products, ``[B, H, S, n]`` at once.
"""

from __future__ import annotations

import torch

from .selector import Scorer, Selector, to_groups
from .stats import key_block_bounds


def page_bound(query: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Quest's bound ``relu(q) . hi + min(q, 0) . lo`` of every query ``[..., L, D]`` on every block of bounds
    ``[..., n, D]``: ``[..., L, n]`` (one dtype throughout)."""
    return query.clamp(min=0) @ hi.transpose(-1, -2) + query.clamp(max=0) @ lo.transpose(-1, -2)


def _kernel_applies(q: torch.Tensor, block_size: int, dtype: torch.dtype) -> bool:
    return (q.is_cuda and dtype == torch.float32 and block_size >= 16 and block_size & (block_size - 1) == 0
            and q.shape[-1] <= 256)


def block_scores(q, k, block_size, groups, dtype, window: int = 0, **_) -> torch.Tensor:
    """The largest bound of each query block's queries (and group) on each key block: ``[B, groups, n, n]`` in
    ``dtype``. ``window``: on a GPU, the tiles of key blocks after a row's candidates are left ``-inf``."""
    lo, hi = key_block_bounds(k, block_size, torch.float64 if dtype == torch.float64 else torch.float32)
    if _kernel_applies(q, block_size, dtype):
        from .quest_kernel import quest_block_scores  # triton is imported on first use

        lo, hi = to_groups(lo, groups).contiguous(), to_groups(hi, groups).contiguous()
        return quest_block_scores(q, lo, hi, block_size, window)
    seq, heads = q.shape[-2], q.shape[1]
    nb = lo.shape[-2]
    pad = nb * block_size - seq
    query = q.detach().to(lo.dtype)
    lo, hi = (to_groups(t, heads) for t in (lo, hi))  # every query head's bounds, then the group's largest
    bound = page_bound(query, lo, hi)  # [B, H, S, n]
    bound = torch.nn.functional.pad(bound, (0, 0, 0, pad), value=float("-inf"))  # padding rows never win
    bound = bound.unflatten(-2, (nb, block_size)).amax(-2).to(dtype)
    return bound.view(q.shape[0], groups, heads // groups, nb, nb).amax(2)


def step_scores(q, stats, first, rows, num_rows, seq_len, seed) -> torch.Tensor:
    """The largest bound over each row's queries and the group's heads, from the kept bounds: ``[B, H_kv, R, n]``
    in the bounds' dtype (float64 for ``KeyBlockStats``), ``n`` the blocks the stats hold."""
    batch, heads, q_len, dim = q.shape
    kv_heads = stats.lo.shape[1]
    in_row = rows[None, :] == torch.arange(num_rows, device=q.device)[:, None]  # [R, L]
    grouped = q.detach().to(stats.lo.dtype).reshape(batch, kv_heads, heads // kv_heads, q_len, dim)
    bound = page_bound(grouped, stats.lo[:, :, None], stats.hi[:, :, None])  # [B, H_kv, G, L, n]
    bound = bound.amax(2)  # the group's largest
    masked = bound[:, :, None].masked_fill(~in_row[None, None, :, :, None], float("-inf"))  # [B, H_kv, R, L, n]
    return masked.amax(3)


def token_scores(q, k, block_size, scale, seed) -> Scorer:
    """``relu(q_t) . hi + min(q_t, 0) . lo`` in float64."""
    lo, hi = (to_groups(t, q.shape[1]) for t in key_block_bounds(k, block_size))

    def scores(rows: slice) -> torch.Tensor:
        return page_bound(q[..., rows, :].to(torch.float64), lo, hi)
    return scores


SELECTOR = Selector("quest", "Quest's page bound: max over the block's queries of relu(q) . max(keys) + "
                    "min(q, 0) . min(keys)", block_scores, step_scores, token_scores, query_aware=True,
                    static_step=True)
