"""Triton kernel: the budget rule's CSR schedule from a whole sequence's scores, in one launch.

:func:`topo_attn.selection.schedule_from_scores` on a GPU used to take about forty small launches per layer: the
order keys, the candidate mask, ``topk``, then :func:`topo_attn.rule.budget_schedule`'s slots, sort, offsets
and gather. Here one program per (query block row, lane) does all of it:

1. **Offsets by arithmetic.** Row ``qb`` holds ``min(sinks, qb - window)`` sinks, the window's causal blocks
   and ``min(budget, c)`` chosen candidates (:func:`topo_attn.rule.budget_row_widths`). Each term is a clipped
   linear function of ``qb``, so the entries before a row have a closed form (:func:`_entries_before`) and no
   program waits for another.
2. **The row's threshold by radix selection.** The row's candidate scores (the causal blocks
   ``sinks .. qb - window - 1``) are held in registers as order-preserving integers. Thirty-two passes, one per
   bit from the highest, find the ``take``-th largest value ``T``; every candidate above ``T`` is chosen, and of
   those equal to ``T`` the lowest block indices (a running count), which is the tie rule of
   :func:`topo_attn.selection.topk.ranked_candidates`.
3. **The row in block order without a sort.** Sinks lie below every candidate and the window above, so the row
   is the sinks, then the chosen candidates in index order (each one's place is a running count of the chosen
   before it), then the window.

The chosen set equals the torch path's for float32 scores (and for bf16/fp16 scores, read as float32), ``-inf``
and equal scores included. Rows of up to :data:`MAX_BLOCKS` blocks fit in one program's registers; longer
sequences take the torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch
from ..rule import budget_entries
from ..schedule import BlockSchedule, num_blocks

MAX_BLOCKS = 8192
"""The most key blocks a row may have for this kernel (its scores are held in one program's registers)."""


@triton.jit
def _clipped_sum(x, a, m):
    """``sum(clip(q - a, 0, m) for q in range(x))`` (``x, a, m >= 0``), by arithmetic."""
    t = tl.maximum(tl.minimum(x, a + m) - a, 0)
    return t * (t - 1) // 2 + m * tl.maximum(x - a - m, 0)


@triton.jit
def _entries_before(x, sinks, window, budget):
    """The entries of rows ``qb < x`` of the budget rule: per row its sinks ``clip(qb - window, 0, sinks)``, its
    window ``clip(qb, 0, window) + 1`` and its chosen ``clip(qb - window - sinks, 0, budget)``."""
    return (_clipped_sum(x, window, sinks) + _clipped_sum(x, 0, window) + x
            + _clipped_sum(x, window + sinks, budget))


@triton.jit
def _budget_rows_kernel(
    Scores, Offsets, Indices,
    first, rows, heads, lane_entries, total_entries, sinks, window, budget,
    stride_sb, stride_sh, stride_sr, stride_sc,
    BLOCK_N: tl.constexpr,
):
    """Grid ``(rows, lanes)``: row ``r`` (absolute query block ``first + r``) of lane ``(b, h)``, from the scores
    at ``Scores + b * stride_sb + h * stride_sh + r * stride_sr + kb * stride_sc``."""
    r = tl.program_id(0)
    lane = tl.program_id(1)
    qb = (first + r).to(tl.int64)
    start = (lane.to(tl.int64) * lane_entries + _entries_before(qb, sinks, window, budget)
             - _entries_before(first.to(tl.int64), sinks, window, budget))
    tl.store(Offsets + lane * rows + r, start.to(tl.int32))
    if (r == 0) & (lane == 0):
        tl.store(Offsets + tl.num_programs(1) * rows, total_entries)
    kb = tl.arange(0, BLOCK_N)
    # -- the sinks below the window
    sink_count = tl.minimum(tl.maximum(qb - window, 0), sinks)
    tl.store(Indices + start + kb, kb.to(tl.int32), mask=kb < sink_count)
    # -- the chosen candidates, in block order
    candidates = (kb >= sinks) & (kb < qb - window)
    take = tl.minimum(tl.maximum(qb - window - sinks, 0), budget)
    if take > 0:
        batch = lane // heads
        head = lane % heads
        at = (batch.to(tl.int64) * stride_sb + head.to(tl.int64) * stride_sh + r.to(tl.int64) * stride_sr
              + kb.to(tl.int64) * stride_sc)
        score = tl.load(Scores + at, mask=candidates, other=0.0).to(tl.float32)
        bits = tl.where(score == 0.0, 0.0, score).to(tl.int32, bitcast=True)  # -0.0 and 0.0 are one score
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) + 2**31  # float order, in [0, 2^32)
        ordered = tl.where(candidates, ordered, -1)
        # the take-th largest value, one bit at a time from the highest
        threshold = tl.zeros([], tl.int64)
        for bit in tl.static_range(31, -1, -1):
            trial = threshold + (1 << bit)
            enough = tl.sum((ordered >= trial).to(tl.int32), axis=0) >= take
            threshold = tl.where(enough, trial, threshold)
        above = ordered > threshold
        tied = (ordered == threshold).to(tl.int32)
        needed = take - tl.sum(above.to(tl.int32), axis=0)
        chosen = (above | ((tied == 1) & (tl.cumsum(tied, axis=0) <= needed))).to(tl.int32)
        place = tl.cumsum(chosen, axis=0) - chosen
        tl.store(Indices + start + sink_count + place, kb.to(tl.int32), mask=chosen == 1)
    # -- the window's causal blocks
    window_first = tl.maximum(qb - window, 0)
    tl.store(Indices + start + sink_count + take + kb, (window_first + kb).to(tl.int32),
             mask=kb < qb - window_first + 1)


def applies(scores: torch.Tensor) -> bool:
    """Whether :func:`budget_rows` takes these scores: not float64 (the exact reference ranks those by a stable
    sort) and at most :data:`MAX_BLOCKS` key blocks."""
    return scores.dtype != torch.float64 and scores.shape[-1] <= MAX_BLOCKS


def budget_rows(scores: torch.Tensor, block_size: int, seq_len: int, sinks: int, window: int, budget: int,
                q_len: int | None = None, lanes: tuple[int, int] | None = None) -> BlockSchedule:
    """The budget rule's schedule from ``scores``, in one launch and without a host sync: what
    ``budget_schedule(top_candidates(scores, first, sinks, window, budget), ...)`` builds (the same blocks per
    row; ties to the lower block index). Trusts its inputs (checked by
    :func:`~topo_attn.selection.schedule_from_scores`).

    Arguments:
        scores: float32, bf16 or fp16 ``[R, n]`` (shared) or ``[B, Hl, R, n]``, any strides (an expanded view
            too); row ``r`` scores the key blocks of absolute query block ``first + r`` with
            ``first = (seq_len - q_len) // block_size``, and only its candidates are read. On a CUDA device or
            (Triton's interpreter) the CPU. ``n <= MAX_BLOCKS``.
        block_size, seq_len: ``n = ceil(seq_len / block_size)``; sinks, window, budget: ints ``>= 0``.
        q_len: queries at the end of the keys (default ``seq_len``); lanes: ``(B, Hl)`` for 4-D scores.

    Returns:
        A :class:`~topo_attn.BlockSchedule` on the scores' device, built unchecked (valid by construction).
    """
    nb = num_blocks(seq_len, block_size)
    q_len = seq_len if q_len is None else q_len
    first = (seq_len - q_len) // block_size
    rows = nb - first
    scores4 = scores[None, None] if scores.ndim == 2 else scores
    lane_count = scores4.shape[0] * scores4.shape[1]
    entries = budget_entries(first, nb, sinks, window, budget)
    total = lane_count * entries  # within int32: checked by the caller (rule.check_budget_entries)
    offsets = torch.empty(lane_count * rows + 1, dtype=torch.int32, device=scores.device)
    indices = torch.empty(total, dtype=torch.int32, device=scores.device)
    block_n = max(16, triton.next_power_of_2(nb))
    launch(_budget_rows_kernel, (rows, lane_count),
           (scores4, offsets, indices, first, rows, scores4.shape[1], entries, total, sinks, window, budget,
            *scores4.stride()),
           dict(BLOCK_N=block_n, num_warps=min(16, max(4, block_n // 256))))
    return BlockSchedule.unchecked(offsets, indices, block_size, seq_len, lanes, False, q_len)
