"""Triton kernel assembling #22's rule (sinks + window + top-k) into CSR rows on the GPU, in two launches
(count, then write) around one cumulative sum: the torch version in ``topology.schedule_from_salience`` takes
about twenty small launches for the same job.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..validation import raise_unless_finite


@triton.jit
def _rule_rows_kernel(Top, Counts, Offsets, Indices, nb, sinks, window, topk, stride_top,
                      BLOCK_R: tl.constexpr, M: tl.constexpr, WRITE: tl.constexpr):
    lane = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # query blocks
    j = tl.arange(0, M)
    # -- candidates per row: sinks 0..sinks-1, the window qb-window..qb, then the lane's top-k blocks
    is_sink = j < sinks
    is_window = (j >= sinks) & (j < sinks + window + 1)
    is_top = (j >= sinks + window + 1) & (j < sinks + window + 1 + topk)
    top = tl.load(Top + lane.to(tl.int64) * stride_top + (j - sinks - window - 1), mask=is_top, other=0)
    qb = rows[:, None]
    value = tl.where(is_sink[None, :], j[None, :], tl.where(is_window[None, :], qb - (j - sinks)[None, :], top[None, :]))
    # -- each block once (a sink before a window block before a top-k block), causal, inside the sequence
    valid = (is_sink | is_window | is_top)[None, :] & (qb < nb) & (value >= 0) & (value <= qb)
    valid &= ~is_window[None, :] | (value >= sinks)
    valid &= ~is_top[None, :] | ((value >= sinks) & (value < qb - window))
    count = tl.sum(valid.to(tl.int32), 1)
    row_ids = lane.to(tl.int64) * nb + rows
    if WRITE:
        # -- the row's blocks in increasing order at its CSR offset
        ordered = tl.sort(tl.where(valid, value, nb), 1)
        start = tl.load(Offsets + row_ids, mask=rows < nb, other=0)
        tl.store(Indices + start[:, None].to(tl.int64) + j[None, :], ordered, mask=j[None, :] < count[:, None])
    else:
        tl.store(Counts + row_ids, count, mask=rows < nb)


def rule_rows(top: torch.Tensor, nb: int, sinks: int, window: int,
              finite: tuple[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR ``(offsets, indices)`` (int32) of the rule for ``L`` lanes: per query block ``qb`` of each lane, the
    blocks ``0..sinks-1``, ``qb-window..qb`` and those of the lane's ``top [L, topk]`` (distinct block indices)
    that are ``<= qb``, sorted and without duplicates. ``sinks <= nb`` and ``window < nb``. One host sync (the
    number of entries); ``finite=(name, flag)`` reads a device bool back in the same sync and raises
    :func:`~topo_attn.validation.check_finite`'s error for ``name`` if it is False."""
    lanes, topk = top.shape
    top = top.to(torch.int32).contiguous()
    m = triton.next_power_of_2(sinks + window + 1 + topk)
    block_r = max(1, min(64, 4096 // m))
    grid = (triton.cdiv(nb, block_r), lanes)
    counts = torch.empty(lanes * nb, dtype=torch.int32, device=top.device)
    offsets = torch.zeros(lanes * nb + 1, dtype=torch.int32, device=top.device)
    # the count pass writes no indices: counts stands in for the indices pointer
    _rule_rows_kernel[grid](top, counts, offsets, counts, nb, sinks, window, topk, top.stride(0),
                            BLOCK_R=block_r, M=m, WRITE=False)
    torch.cumsum(counts, dim=0, out=offsets[1:])
    total, is_finite = torch.stack([offsets[-1], finite[1] if finite else offsets[-1].new_ones(())]).tolist()
    if finite:
        raise_unless_finite(finite[0], bool(is_finite))
    indices = torch.empty(total, dtype=torch.int32, device=top.device)
    _rule_rows_kernel[grid](top, counts, offsets, indices, nb, sinks, window, topk, top.stride(0),
                            BLOCK_R=block_r, M=m, WRITE=True)
    return offsets, indices
