"""``oracle``: the blocks with the most true attention mass (:func:`~topo_attn.selection.metrics.block_attention_mass`;
per token, the token's own mass). Among equal-budget selectors it has the highest recall, because recall is
additive over blocks: the ceiling the practical selectors are measured against. It needs the full attention,
so it is a yardstick, not a way to save work."""

from __future__ import annotations

import torch

from .._checks import check_scale
from ..schedule import num_blocks
from .metrics import DEFAULT_CHUNK, block_attention_mass
from .selector import Scorer, Selector


def block_scores(q, k, block_size, groups, dtype, scale: float | None = None, chunk: int = DEFAULT_CHUNK,
                 **_) -> torch.Tensor:
    """The true attention mass of each (query block, key block), summed over the group's heads: float64
    ``[B, groups, n, n]``."""
    mass = block_attention_mass(q, k, block_size, scale, chunk)  # [B, H, n, n]
    return mass.view(q.shape[0], groups, q.shape[1] // groups, *mass.shape[-2:]).sum(2).to(dtype)


def token_block_mass(q_rows: torch.Tensor, k: torch.Tensor, first: int, block_size: int,
                     scale: float) -> torch.Tensor:
    """The causal softmax mass of each query row on each key block.

    Arguments:
        q_rows: floating ``[B, H, c, D]``, the queries at positions ``first .. first + c - 1``.
        k: ``[B, H_kv, L, D]``, all keys; first, block_size: ints; scale: the softmax scale.

    Returns:
        float64 ``[B, H, c, n]`` (each row sums to 1), from float64 logits ``[B, H, c, L]``.
    """
    batch, heads, count, dim = q_rows.shape
    seq, kv_heads = k.shape[-2], k.shape[1]
    grouped = q_rows.detach().to(torch.float64).reshape(batch, kv_heads, -1, dim)  # the query heads of a group
    logits = (grouped @ k.detach().to(torch.float64).transpose(-1, -2) * scale).reshape(batch, heads, count, seq)
    positions = torch.arange(first, first + count, device=k.device)
    logits.masked_fill_(torch.arange(seq, device=k.device) > positions[:, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    n = num_blocks(seq, block_size)
    return torch.nn.functional.pad(probs, (0, n * block_size - seq)).unflatten(-1, (n, block_size)).sum(-1)


def token_scores(q, k, block_size, scale, seed) -> Scorer:
    """The token's causal softmax mass on each key block (:func:`token_block_mass`)."""
    scale = check_scale(scale, q.shape[-1])
    keys = k.detach().to(torch.float64)
    return lambda rows: token_block_mass(q[..., rows, :], keys, rows.start, block_size, scale)


SELECTOR = Selector("oracle", "the true attention mass of each block (an upper bound at equal budget)",
                    block_scores, None, token_scores, query_aware=True, sync_free=False, host_scores=True)
