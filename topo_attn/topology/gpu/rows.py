"""Triton kernels assembling #22's rule (sinks + window + top-k) into CSR rows on the GPU, straight from the
saliences, in two grids: each block's rank and whether it is a top-k block that joins rows as such (not a
sink); then, per tile of rows, the row offsets (counted in closed form: the sinks and the window depend only on
the row, a top-k block ``b`` is in every row from ``b + window + 1`` on), the rows themselves (sinks, top-k
blocks, window: already in increasing order, no sort) into a buffer of the most entries the rule can give,
and a status of the entry count and a finiteness flag. The host sync that reads the status back comes last.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...launch import launch
from .pdl import pdl_options, wait_for_inputs


@triton.jit
def _fixed_count(q, sinks, window):
    """Entries of row ``q`` that do not depend on the saliences: the sinks up to ``q``, then the window blocks
    that are not sinks."""
    return tl.minimum(sinks, q + 1) + tl.maximum(q - tl.maximum(sinks, q - window) + 1, 0)


@triton.jit
def _top_flags_kernel(Sal, Flags, Parts, nb, sinks, window, topk, stride_sal, ROWS: tl.constexpr,
                      COLS: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    lane = tl.program_id(1).to(tl.int64)
    tile = tl.program_id(0)
    b = tile * ROWS + tl.arange(0, ROWS)
    sal = Sal + lane * stride_sal
    # -- each block's rank: the blocks more salient than it, or as salient with a lower index
    s_b = tl.load(sal + b, mask=b < nb, other=0.0)
    rank = tl.zeros([ROWS], tl.int32)
    for start in range(0, nb, COLS):
        j = start + tl.arange(0, COLS)
        s_j = tl.load(sal + j, mask=j < nb, other=0.0)
        ahead = (s_j[None, :] > s_b[:, None]) | ((s_j[None, :] == s_b[:, None]) & (j[None, :] < b[:, None]))
        rank += tl.sum((ahead & (j < nb)[None, :]).to(tl.int32), 1)
    # -- a top-k block that is not a sink joins every row from ``b + window + 1`` on; the tile's share of the
    # lane's entry count
    flag = (b < nb) & (rank < topk) & (b >= sinks)
    tl.store(Flags + lane * nb + b, flag.to(tl.int8), mask=b < nb)
    rows_with_b = tl.maximum(nb - b - window - 1, 0)
    tl.store(Parts + lane * tl.num_programs(0) + tile, tl.sum(tl.where(flag, rows_with_b, 0), 0))


@triton.jit
def _rule_rows_kernel(Flags, Parts, Finite, Offsets, Indices, Status, RowsAt, lanes, nb, sinks, window,
                      parts_per_lane, finite_count, BLOCK_R: tl.constexpr, COLS: tl.constexpr,
                      INDIRECT: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    if INDIRECT:  # -- the rows buffer's address read when the program runs (a CUDA graph's fresh output)
        Offsets = tl.load(RowsAt).to(tl.pointer_type(tl.int32))
        Indices = Offsets + lanes * nb + 1
    lane = tl.program_id(1).to(tl.int64)
    qb = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # query blocks
    flags = Flags + lane * nb
    # -- per row: the entries of the rows before it in the lane, and its top-k entries (top-k blocks that
    # are neither sinks nor in the window); and the lane's fixed entries (sinks and window) in all
    before = tl.zeros([BLOCK_R], tl.int64)
    top_count = tl.zeros([BLOCK_R], tl.int32)
    fixed_total = tl.zeros([COLS], tl.int64)
    for start in range(0, nb, COLS):
        c = start + tl.arange(0, COLS)
        real = c < nb
        fixed = tl.where(real, _fixed_count(c, sinks, window), 0)
        flag = tl.load(flags + c, mask=real, other=0).to(tl.int32)
        later_rows = tl.maximum(qb[:, None] - c[None, :] - window - 1, 0)  # rows q < qb holding block c
        before += tl.sum(tl.where(c[None, :] < qb[:, None], fixed[None, :], 0) + flag[None, :] * later_rows, 1)
        top_count += tl.sum(flag[None, :] * (c[None, :] <= qb[:, None] - window - 1), 1)
        fixed_total += fixed
    lane_fixed = tl.sum(fixed_total, 0)
    # -- the lane's first entry: the entries of the lanes before it
    base = lane * lane_fixed
    for start in range(0, lane * parts_per_lane, COLS):
        p = start + tl.arange(0, COLS)
        base += tl.sum(tl.load(Parts + p, mask=p < lane * parts_per_lane, other=0).to(tl.int64), 0)
    row = qb < nb
    start_q = base + before
    tl.store(Offsets + lane * nb + qb, start_q.to(tl.int32), mask=row)
    # -- the row's blocks in increasing order: sinks, top-k blocks, window
    sink_count = tl.minimum(sinks, qb + 1)
    for start in range(0, sinks, COLS):
        j = start + tl.arange(0, COLS)
        tl.store(Indices + start_q[:, None] + j[None, :], j[None, :], mask=row[:, None] & (j[None, :] < sink_count[:, None]))
    seen = tl.zeros([BLOCK_R], tl.int32)
    for start in range(0, nb, COLS):
        c = start + tl.arange(0, COLS)
        flag = tl.load(flags + c, mask=c < nb, other=0).to(tl.int32)
        at = seen[:, None] + tl.cumsum(flag, 0)[None, :] - flag[None, :]
        keep = row[:, None] & (flag[None, :] != 0) & (c[None, :] <= qb[:, None] - window - 1)
        tl.store(Indices + (start_q + sink_count)[:, None] + at, c[None, :], mask=keep)
        seen += tl.sum(flag, 0)
    window_lo = tl.maximum(sinks, qb - window)
    window_count = tl.maximum(qb - window_lo + 1, 0)
    for start in range(0, window + 1, COLS):
        j = start + tl.arange(0, COLS)
        tl.store(Indices + (start_q + sink_count + top_count)[:, None] + j[None, :], window_lo[:, None] + j[None, :],
                 mask=row[:, None] & (j[None, :] < window_count[:, None]))
    # -- the last lane's first program: the closing offset and the status (entry count, finiteness flag)
    if (tl.program_id(0) == 0) & (lane == lanes - 1):
        total = base + lane_fixed
        for start in range(0, parts_per_lane, COLS):
            p = start + tl.arange(0, COLS)
            total += tl.sum(tl.load(Parts + lane * parts_per_lane + p, mask=p < parts_per_lane, other=0).to(tl.int64), 0)
        tl.store(Offsets + lanes * nb, total.to(tl.int32))
        finite = tl.full([COLS], 1, tl.int32)
        for start in range(0, finite_count, COLS):
            f = start + tl.arange(0, COLS)
            finite = tl.minimum(finite, (tl.load(Finite + f, mask=f < finite_count, other=1) != 0).to(tl.int32))
        tl.store(Status, total)
        tl.store(Status + 1, tl.min(finite, 0).to(tl.int64))


def rule_bound(nb: int, topk: int, sinks: int, window: int) -> int:
    """Most entries one lane's rule rows can hold (no host sync: an upper bound for an indices buffer filled
    before the count is known).

    Arguments:
        nb: blocks per lane, ``>= 1``.
        topk, sinks, window: the rule, non-negative.

    Returns:
        The sum over rows ``qb`` of ``min(qb + 1, sinks + window + 1 + topk)``.
    """
    width = sinks + window + 1 + topk
    if width >= nb:
        return nb * (nb + 1) // 2
    return width * (width + 1) // 2 + (nb - width) * width


RANK_TILE = (16, 256)
"""(blocks, columns) per step of the ranking grid: each program ranks ``blocks`` blocks against ``columns``
others at a time."""

ROW_TILE = (4, 512)
"""(rows, columns) per step of the rows grid: each program writes ``rows`` rows, reading ``columns`` flags at a
time. Both tiles from an H200 sweep (topology/NOTES.md, "Numbers that were in the code")."""


def rows_size(lanes: int, nb: int, topk: int, sinks: int, window: int) -> int:
    """Entries of :func:`rule_launch`'s rows buffer for ``lanes`` lanes of ``nb`` blocks and the rule ``(topk,
    sinks, window)``: ``lanes * nb + 1`` offsets, then :func:`rule_bound` per lane."""
    return lanes * nb + 1 + lanes * rule_bound(nb, topk, sinks, window)


def rule_launch(salience: torch.Tensor, topk: int, sinks: int, window: int, finite: torch.Tensor | None = None,
                status: torch.Tensor | None = None, rows_at: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """:func:`rule_rows` without its host sync (so it can run inside a CUDA graph), in two launches.

    Arguments:
        salience, topk, sinks, window, finite: as :func:`rule_rows`.
        status: an int64 ``[2]`` tensor to write the status to (e.g. pinned host memory, which the host reads
            after a sync with no copy launched), or None (a new device tensor).
        rows_at: an int64 ``[1]`` tensor the kernel can read (device or pinned host memory) holding the address
            of a rows buffer of :func:`rows_size` entries to write when the kernel runs, or None (a new buffer).

    Returns:
        ``(rows, status)``. ``rows``: one int32 buffer of :func:`rows_size` entries (None with ``rows_at``)
        holding the offsets (``L * nb + 1``) and then room for :func:`rule_bound` entries per lane, whose first
        ``offsets[-1]`` entries are the indices (see :func:`split_rows`). ``status``: int64 ``[2]``,
        ``(offsets[-1], finite)`` with ``finite`` 1 if every flag is nonzero, else 0.
    """
    lanes, nb = salience.shape
    device = salience.device
    rank_rows, rank_cols = RANK_TILE
    block_r, cols = ROW_TILE[0], min(ROW_TILE[1], triton.next_power_of_2(nb))
    parts_per_lane = triton.cdiv(nb, rank_rows)
    flags = torch.empty(lanes, nb, dtype=torch.int8, device=device)
    parts = torch.empty(lanes, parts_per_lane, dtype=torch.int32, device=device)
    pdl = pdl_options(device, lanes)
    launch(_top_flags_kernel, (parts_per_lane, lanes),
           (salience, flags, parts, nb, sinks, window, topk, salience.stride(0)),
           dict(ROWS=rank_rows, COLS=min(rank_cols, triton.next_power_of_2(nb)), num_warps=4, **pdl))
    rows = None if rows_at is not None else torch.empty(rows_size(lanes, nb, topk, sinks, window),
                                                         dtype=torch.int32, device=device)
    if status is None:
        status = torch.empty(2, dtype=torch.int64, device=device)
    if finite is None:
        finite = status[:0]  # no flags
    elif finite.dtype == torch.bool:
        finite = finite.view(torch.uint8)
    finite = finite.reshape(-1)
    offsets, indices = (parts, parts) if rows is None else (rows, rows[lanes * nb + 1:])  # (int32; unused then)
    launch(_rule_rows_kernel, (triton.cdiv(nb, block_r), lanes),
           (flags, parts, finite, offsets, indices, status, status if rows_at is None else rows_at, lanes, nb,
            sinks, window, parts_per_lane, finite.numel()),
           dict(BLOCK_R=block_r, COLS=cols, INDIRECT=rows_at is not None, num_warps=4, **pdl))
    return rows, status


def rule_rows(salience: torch.Tensor, topk: int, sinks: int, window: int, finite: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """CSR rows of the rule (sinks + window + top-k) from the saliences, assembled on the GPU, with one host sync
    (the number of entries, which also reads back the flags ``finite``).

    Per query block ``qb`` of each lane: the blocks ``0..sinks-1``, ``qb-window..qb`` and those of the lane's
    ``topk`` most salient blocks (ties to the lower index, as ``topo_attn.top_salient_blocks``) that are
    ``<= qb``, sorted and without duplicates.

    Arguments:
        salience: ``[L, nb]``, float32 or float64, last stride 1 (finite for meaningful rows), on a CUDA device
            or (Triton's interpreter) the CPU.
        topk, sinks, window: the rule, with ``topk <= nb``, ``sinks <= nb`` and ``window < nb``.
        finite: device flags (any shape, bool or integer) that are all nonzero for valid input, or None (valid).

    Returns:
        ``(offsets, indices, finite)``: int32 ``[L * nb + 1]`` and ``[offsets[-1]]`` on the saliences' device,
        and whether every flag was nonzero. The caller raises on ``finite == False`` (the rows are then
        meaningless but in bounds).
    """
    rows, status = rule_launch(salience, topk, sinks, window, finite)
    total, is_finite = status.tolist()
    offsets, entries = split_rows(rows, salience.numel())
    return offsets, entries[:total], bool(is_finite)


def split_rows(rows: torch.Tensor, row_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offsets, entries)`` views of :func:`rule_launch`'s rows buffer for ``row_count = L * nb`` rows: the
    ``row_count + 1`` offsets, and the entries whose first ``offsets[-1]`` (the status' count) are the CSR
    indices."""
    return rows[:row_count + 1], rows[row_count + 1:]
