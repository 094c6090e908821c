"""``dense_masked_attention``: the torch reference that defines what scheduled attention computes."""

from __future__ import annotations

import torch

from .._checks import check_qkv, check_scale
from ..schedule import BlockSchedule, check_schedule_for


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: BlockSchedule,
                           scale: float | None = None, return_lse: bool = False, rows: slice | None = None):
    """Softmax attention restricted to the schedule's token mask (:meth:`BlockSchedule.to_token_mask`).

    q: ``[L, D]`` or ``[B, H, L, D]``; k, v: ``[S, D]`` or ``[B, H_kv, S, D]`` (GQA when ``H_kv < H``), with
    ``L <= S``: query ``i`` sits at position ``S - L + i`` (the schedule's ``q_len`` must be ``L``); any
    floating dtype (float64 for a reference). Computed in the inputs' dtype with ``O(L S)`` memory.
    Returns the output in the inputs' shape and dtype and, with ``return_lse``, the natural-log
    log-sum-exp of the scaled scores per query, ``[L]`` or ``[B, H, L]``. ``rows`` computes only those
    query rows (``[..., len(rows), D]``), so long sequences can be checked on a sample.

    Raises ``TypeError`` / ``ValueError`` like :func:`scheduled_attention` for mismatched shapes, a schedule
    built for another length, lanes or device, and a bad scale (any floating dtype and device are accepted)."""
    shape = check_qkv(q, k, v, shorter_q=True)
    check_schedule_for(schedule, shape, q.device)
    scale = check_scale(scale, shape.head_dim)
    if shape.rank == 4 and shape.kv_heads != shape.heads:
        group = shape.heads // shape.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if rows is not None:
        q = q[..., rows, :]
    mask = schedule.to_token_mask(rows)
    if mask.ndim == 4 and mask.shape[1] != shape.heads:  # one row-set per key/value head
        mask = mask.repeat_interleave(shape.heads // mask.shape[1], dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v
    return (out, lse) if return_lse else out
