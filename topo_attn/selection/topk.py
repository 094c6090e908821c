"""Each row's best candidates under the budget rule, on the device, without a host sync.

Row ``r`` of a score matrix is the absolute query block ``qb = first + r``; its **candidates** are the causal
blocks outside its sinks and window, ``sinks <= kb < qb - window`` (:func:`topo_attn.rule.budget_row_widths`).
:func:`top_candidates` ranks them by score, ties to the lower block index (a ``-inf`` score still ranks before
every non-candidate), and returns the first ``budget``; :func:`topo_attn.rule.budget_schedule` turns them into
the CSR schedule.

Float64 scores are ranked by a stable sort (the exact order of the selection harness); other floating scores by
``torch.topk`` over one int64 key per entry, the score's order-preserving bits above the reversed block index,
so equal scores still go to the lower index without a sort of the whole row.
"""

from __future__ import annotations

import torch

from ..rule import budget_candidates

_LOW_BITS = 32  # the reversed block index lives in the key's low 32 bits (n < 2**32)


def candidate_mask(first: int, rows: int, nb: int, sinks: int, window: int, device) -> torch.Tensor:
    """bool ``[rows, nb]``: block ``kb`` is a candidate of row ``r`` (absolute query block ``first + r``)
    (:func:`topo_attn.rule.budget_candidates`: ``sinks <= kb < first + r - window``)."""
    cols = torch.arange(nb, device=device)[None, :]
    return budget_candidates(cols, torch.arange(first, first + rows, device=device)[:, None], sinks, window)


def order_key(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys ``[..., n]`` ordered as ``(score, -block index)``: a larger key is a larger float32 score, or the
    same score at a lower block index. ``-0.0`` and ``0.0`` are one score."""
    bits = (scores.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into 0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # float order as signed int order
    reversed_index = scores.shape[-1] - 1 - torch.arange(scores.shape[-1], device=scores.device)
    return ordered * 2**_LOW_BITS + reversed_index


def ranked_candidates(scores: torch.Tensor, candidates: torch.Tensor, take: int) -> torch.Tensor:
    """The ``take`` best-scored candidates of each row, best first for float64 scores, in some order otherwise
    (ties to the lower block index; a ``-inf`` score still ranks before every non-candidate); when a row has
    fewer candidates, blocks that are not candidates fill its remaining slots.

    Arguments:
        scores: real ``[..., R, n]``; candidates: bool ``[R, n]`` (or broadcastable); take: ``0 <= take <= n``.

    Returns:
        int64 ``[..., R, take]`` on the scores' device.
    """
    if scores.dtype == torch.float64:
        lowest = torch.finfo(torch.float64).min
        masked = scores.clamp(min=lowest).masked_fill(~candidates, float("-inf"))
        return torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :take]
    keys = order_key(scores).masked_fill(~candidates, torch.iinfo(torch.int64).min)
    return torch.topk(keys, take, dim=-1, sorted=False).indices


def top_candidates(scores: torch.Tensor, first: int, sinks: int, window: int, budget: int) -> torch.Tensor:
    """The ``budget`` best-scored candidates of each row of the budget rule (:func:`ranked_candidates`).

    Arguments:
        scores: real ``[..., R, n]``; row ``r`` scores the key blocks for absolute query block ``first + r``.
            Entries of non-candidates are ignored.
        first: the absolute query block of row 0; sinks, window, budget: ints ``>= 0``.

    Returns:
        int64 ``[..., R, min(budget, n)]`` on the scores' device: each row holds its ``min(budget, c)`` best
        candidates (``c`` candidates) in some order, and in the remaining slots blocks that are not candidates,
        which :func:`topo_attn.rule.budget_schedule` leaves out.
    """
    rows, nb = scores.shape[-2], scores.shape[-1]
    take = min(budget, nb)
    if take == 0:
        return torch.empty(*scores.shape[:-1], 0, dtype=torch.int64, device=scores.device)
    return ranked_candidates(scores, candidate_mask(first, rows, nb, sinks, window, scores.device), take)


def choose_blocks(scores: torch.Tensor, candidates: torch.Tensor, budget: int) -> torch.Tensor:
    """The ``budget`` highest-scored candidates of each row as a mask (all of them when fewer; ties to the lower
    block index; a ``-inf`` score still beats a non-candidate; :func:`ranked_candidates`).

    Arguments:
        scores: real ``[..., c, n]``; candidates: bool ``[c, n]`` (or broadcastable); budget: int ``>= 0``.

    Returns:
        bool ``[..., c, n]``.
    """
    chosen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    take = min(budget, scores.shape[-1])
    if take:
        order = ranked_candidates(scores, candidates, take)
        chosen.scatter_(-1, order, torch.gather(candidates.expand(scores.shape), -1, order))
    return chosen
