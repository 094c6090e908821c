"""Triton kernels assembling #22's rule (sinks + window + top-k) into CSR rows on the GPU, straight from the
saliences, in two launches (top-k and counts, then the rows into a buffer of the most entries the rule can
give) around one cumulative sum; the host sync that reads the entry count back comes last.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..validation import raise_unless_finite


@triton.jit
def _rule_candidates(Top, lane, rows, nb, sinks, window, topk, stride_top, M: tl.constexpr):
    """The rule's candidate blocks ``[rows, M]`` for query blocks ``rows`` and which of them are kept."""
    j = tl.arange(0, M)
    # -- candidates per row: sinks 0..sinks-1, the window qb-window..qb, then the lane's top-k blocks
    is_sink = j < sinks
    is_window = (j >= sinks) & (j < sinks + window + 1)
    is_top = (j >= sinks + window + 1) & (j < sinks + window + 1 + topk)
    top = tl.load(Top + lane * stride_top + (j - sinks - window - 1), mask=is_top, other=0)
    qb = rows[:, None]
    value = tl.where(is_sink[None, :], j[None, :], tl.where(is_window[None, :], qb - (j - sinks)[None, :], top[None, :]))
    # -- each block once (a sink before a window block before a top-k block), causal, inside the sequence
    valid = (is_sink | is_window | is_top)[None, :] & (qb < nb) & (value >= 0) & (value <= qb)
    valid &= ~is_window[None, :] | (value >= sinks)
    valid &= ~is_top[None, :] | ((value >= sinks) & (value < qb - window))
    return value, valid


@triton.jit
def _top_counts_kernel(Sal, Top, Counts, nb, sinks, window, topk, stride_sal, stride_top,
                       RANK_ROWS: tl.constexpr, RANK_COLS: tl.constexpr, BLOCK_R: tl.constexpr, M: tl.constexpr):
    lane = tl.program_id(0).to(tl.int64)
    sal = Sal + lane * stride_sal
    # -- each block's rank: the blocks more salient than it, or as salient with a lower index; the top-k
    # blocks (ranks below topk) go to Top in rank order
    for start_b in range(0, nb, RANK_ROWS):
        b = start_b + tl.arange(0, RANK_ROWS)
        s_b = tl.load(sal + b, mask=b < nb, other=0.0)
        rank = tl.zeros([RANK_ROWS], tl.int32)
        for start_j in range(0, nb, RANK_COLS):
            j = start_j + tl.arange(0, RANK_COLS)
            s_j = tl.load(sal + j, mask=j < nb, other=0.0)
            ahead = (s_j[None, :] > s_b[:, None]) | ((s_j[None, :] == s_b[:, None]) & (j[None, :] < b[:, None]))
            rank += tl.sum((ahead & (j < nb)[None, :]).to(tl.int32), 1)
        tl.store(Top + lane * stride_top + rank, b, mask=(b < nb) & (rank < topk))
    # -- every row's entry count, from the top-k blocks all threads of the program wrote above
    tl.debug_barrier()
    for start_r in range(0, nb, BLOCK_R):
        rows = start_r + tl.arange(0, BLOCK_R)
        _, valid = _rule_candidates(Top, lane, rows, nb, sinks, window, topk, stride_top, M)
        tl.store(Counts + lane * nb + rows, tl.sum(valid.to(tl.int32), 1), mask=rows < nb)


@triton.jit
def _rule_rows_kernel(Top, Offsets, Indices, nb, sinks, window, topk, stride_top,
                      BLOCK_R: tl.constexpr, M: tl.constexpr):
    lane = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # query blocks
    value, valid = _rule_candidates(Top, lane, rows, nb, sinks, window, topk, stride_top, M)
    count = tl.sum(valid.to(tl.int32), 1)
    # -- the row's blocks in increasing order at its CSR offset
    ordered = tl.sort(tl.where(valid, value, nb), 1)
    start = tl.load(Offsets + lane * nb + rows, mask=rows < nb, other=0)
    j = tl.arange(0, M)
    tl.store(Indices + start[:, None].to(tl.int64) + j[None, :], ordered, mask=j[None, :] < count[:, None])


def rule_bound(nb: int, topk: int, sinks: int, window: int) -> int:
    """Most entries one lane's rule rows can hold: row ``qb`` holds at most ``min(qb + 1, sinks + window + 1 +
    topk)`` blocks (no host sync: an upper bound for an indices buffer filled before the count is known)."""
    width = sinks + window + 1 + topk
    if width >= nb:
        return nb * (nb + 1) // 2
    return width * (width + 1) // 2 + (nb - width) * width


def rule_launch(salience: torch.Tensor, topk: int, sinks: int, window: int,
                finite: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rule_rows` without its host sync (so it can run inside a CUDA graph): returns ``offsets``, an
    indices buffer of :func:`rule_bound` entries per lane whose first ``offsets[-1]`` entries are the rows,
    and a device ``int64 [2]`` status ``(offsets[-1], finite)`` (``finite``: a device bool, True if None)."""
    lanes, nb = salience.shape
    device = salience.device
    m = triton.next_power_of_2(sinks + window + 1 + topk)
    block_r = max(1, min(64, 4096 // m))
    top = torch.empty(lanes, max(topk, 1), dtype=torch.int32, device=device)
    counts = torch.empty(lanes * nb, dtype=torch.int32, device=device)
    offsets = torch.zeros(lanes * nb + 1, dtype=torch.int32, device=device)
    rank_cols = min(64, triton.next_power_of_2(nb))
    _top_counts_kernel[(lanes,)](salience, top, counts, nb, sinks, window, topk, salience.stride(0), top.stride(0),
                                 RANK_ROWS=64, RANK_COLS=rank_cols, BLOCK_R=block_r, M=m, num_warps=8)
    torch.cumsum(counts, dim=0, out=offsets[1:])
    indices = torch.empty(lanes * rule_bound(nb, topk, sinks, window), dtype=torch.int32, device=device)
    grid = (triton.cdiv(nb, block_r), lanes)
    _rule_rows_kernel[grid](top, offsets, indices, nb, sinks, window, topk, top.stride(0), BLOCK_R=block_r, M=m)
    status = torch.stack([offsets[-1].long(), offsets.new_ones((), dtype=torch.int64) if finite is None
                          else finite.long()])
    return offsets, indices, status


def rule_rows(salience: torch.Tensor, topk: int, sinks: int, window: int,
              finite: tuple[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR ``(offsets, indices)`` (int32) of the rule for saliences ``[L, nb]`` (float32 or float64, finite):
    per query block ``qb`` of each lane, the blocks ``0..sinks-1``, ``qb-window..qb`` and those of the lane's
    ``topk`` most salient blocks (ties to the lower index, as :func:`~topo_attn.top_salient_blocks`) that
    are ``<= qb``, sorted and without duplicates. ``sinks <= nb``, ``window < nb`` and ``topk <= nb``. One
    host sync (the number of entries); ``finite=(name, flag)`` reads a device bool back in the same sync and
    raises :func:`~topo_attn.validation.check_finite`'s error for ``name`` if it is False."""
    offsets, indices, status = rule_launch(salience, topk, sinks, window, finite[1] if finite else None)
    total, is_finite = status.tolist()
    if finite:
        raise_unless_finite(finite[0], bool(is_finite))
    return offsets, indices[:total]
