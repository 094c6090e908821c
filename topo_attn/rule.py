"""The schedule rule, sinks + window + top-k, defined once on the host.

For ``n`` key blocks, query block ``qb`` of a lane attends to

- the **sinks**: blocks ``0 .. sinks-1``;
- the **window**: blocks ``qb-window .. qb`` (the diagonal block always);
- the lane's **top-k** blocks (chosen once per lane, e.g. the most salient ones by
  :func:`~topo_attn.top_salient_blocks`) that are ``<= qb``;

sorted and without duplicates, so every row is causal and non-empty. Everything here is plain torch and runs on
any device; :mod:`topo_attn.topology.gpu.rows` builds the same rows in Triton kernels and is tested against
:func:`rule_schedule`. The selectors of :mod:`topo_attn.selection` keep the sinks and the window
(:func:`base_block_mask`) and replace the top-k part by a per-row budget.

Layering: this module imports only :mod:`topo_attn._checks` and :mod:`topo_attn.schedule`.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ._checks import check_int, check_tensor
from .schedule import BlockSchedule, num_blocks

SKIPPED, SINK, WINDOW, TOPOLOGY = 0, 1, 2, 3
"""Source labels of a block (int8 values of :func:`source_labels`): not scheduled, a sink, in the window, a
top-k (topology) block."""

SOURCE_NAMES = ("skipped", "sink", "window", "topology")
"""Names of the source labels, indexed by the label: ``SOURCE_NAMES[SINK] == "sink"``."""


def clamp_to_blocks(nb: int, topk: int, sinks: int, window: int) -> tuple[int, int, int]:
    """The rule's ``(topk, sinks, window)`` for ``nb`` blocks: at most ``nb`` top-k and sink blocks, a window of
    at most ``nb - 1`` blocks back. Clamping never changes the rule's rows; it bounds the work per row.

    Arguments:
        nb: number of blocks, ``>= 1``.
        topk, sinks, window: non-negative ints (not checked here; the callers check them).

    Returns:
        ``(min(topk, nb), min(sinks, nb), min(window, nb - 1))``.
    """
    return min(topk, nb), min(sinks, nb), min(window, nb - 1)


def base_block_mask(nb: int, sinks: int, window: int, device: torch.device | str = "cpu",
                    first: int = 0) -> torch.Tensor:
    """The rule without its top-k part: the sinks and the window of every row, causal.

    Arguments:
        nb: number of blocks per side, ``>= 0``.
        sinks, window: non-negative ints; any size is allowed (the mask is causal either way).
        device: where the mask is made.
        first: the first query block (row) wanted, ``0 <= first <= nb`` (queries at the end of the keys).

    Returns:
        bool ``[nb - first, nb]``: ``mask[qb - first, kb]`` is True when ``kb <= qb`` and (``kb < sinks`` or
        ``kb >= qb - window``).
    """
    rows = torch.arange(first, nb, device=device)[:, None]
    cols = torch.arange(nb, device=device)[None, :]
    return (cols <= rows) & ((cols < sinks) | (cols >= rows - window))


def rule_schedule(top: torch.Tensor, block_size: int, seq_len: int, sinks: int, window: int,
                  lanes: tuple[int, int] | None = None) -> BlockSchedule:
    """The rule's CSR schedule for given top-k blocks per lane, vectorised over lanes and rows.

    Row ``qb`` of lane ``l`` holds the sinks ``0..sinks-1``, the window ``qb-window..qb`` and the entries of
    ``top[l]`` that are ``<= qb``, sorted and without duplicates. Entries of ``top`` outside ``0..qb`` are left
    out of row ``qb`` (so any integers are accepted; a negative one never appears). Memory: the candidates
    ``[L, n, sinks + window + 1 + k]`` (after :func:`clamp_to_blocks`), not ``[L, n, n]``. No host sync.

    Arguments:
        top: integer ``[L, k]``, the top-k blocks of each lane (any order; duplicates allowed), on the device the
            schedule is built on. ``L`` is 1 for a shared schedule, ``B * H`` with ``lanes=(B, H)``.
        block_size: tokens per block, ``>= 1``.
        seq_len: tokens, ``>= 1``; ``n = ceil(seq_len / block_size)`` blocks.
        sinks, window: non-negative ints.
        lanes: ``None`` (shared schedule, ``L == 1``) or ``(B, H)`` with ``B * H == L``.

    Returns:
        A :class:`~topo_attn.BlockSchedule` on ``top``'s device (built unchecked: it is valid by construction).

    Raises:
        TypeError: ``top`` is not an integer tensor, or a size is not an int.
        ValueError: ``top`` is not 2-D, a size is out of range, or ``L`` does not match ``lanes``.
    """
    top = check_tensor("top", top)
    if top.ndim != 2:
        raise ValueError(f"top must have shape [L, k], got shape {tuple(top.shape)}")
    if top.is_floating_point() or top.is_complex() or top.dtype == torch.bool:
        raise TypeError(f"top must be an integer tensor, got {top.dtype}")
    block_size, seq_len = check_int("block_size", block_size, 1), check_int("seq_len", seq_len, 1)
    sinks, window = check_int("sinks", sinks), check_int("window", window)
    lane_count = top.shape[0]
    expected = 1 if lanes is None else lanes[0] * lanes[1]
    if lane_count != expected:
        raise ValueError(f"top holds {lane_count} lanes, but lanes={lanes} needs {expected}")
    nb = num_blocks(seq_len, block_size)
    _, sinks, window = clamp_to_blocks(nb, 0, sinks, window)
    device, k = top.device, top.shape[1]
    rows = torch.arange(nb, device=device)
    # -- candidates [L, n, sinks + window + 1 + k]: the sinks, then the window, then the top-k blocks
    sink_part = torch.arange(sinks, device=device).expand(lane_count, nb, sinks)
    window_part = (rows[:, None] - torch.arange(window + 1, device=device)).expand(lane_count, nb, window + 1)
    top_part = top.to(torch.int64)[:, None, :].expand(lane_count, nb, k)
    candidates = torch.cat([sink_part, window_part, top_part], dim=-1)
    # -- drop non-causal and negative candidates, sort each row, keep the first of each run of equal values
    valid = (candidates >= 0) & (candidates <= rows[:, None])
    candidates = torch.where(valid, candidates, nb).sort(dim=-1).values
    keep = candidates < nb
    keep[..., 1:] &= candidates[..., 1:] != candidates[..., :-1]
    # -- CSR: offsets from the per-row counts, indices in row order
    counts = keep.sum(dim=-1, dtype=torch.int32).reshape(-1)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=device)
    torch.cumsum(counts, dim=0, out=offsets[1:])
    indices = candidates[keep].to(torch.int32)
    # valid by construction (sorted, unique, causal, the diagonal in every row): skip the checks' syncs
    return BlockSchedule.unchecked(offsets, indices, block_size, seq_len, lanes)


def budget_candidates(blocks: torch.Tensor, qb: torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """Whether key block ``blocks`` is a candidate of query block ``qb`` under the budget rule
    (:func:`budget_schedule`): causal and outside the sinks and the window, ``sinks <= kb < qb - window``
    (tensors that broadcast)."""
    return (blocks >= sinks) & (blocks < qb - window)


def budget_row_widths(qb, sinks: int, window: int, budget: int):
    """Blocks per row of the budget rule (:func:`budget_schedule`), by arithmetic, for the absolute query blocks
    ``qb`` (an int64 numpy array or torch tensor; the result is of the same kind): the sinks before the window,
    the window's causal blocks, and ``min(budget, c)`` chosen blocks, where row ``qb`` has
    ``c = max(0, qb - window - sinks)`` candidates (the causal blocks ``sinks .. qb - window - 1``)."""
    sink_count = (qb - window).clip(min=0, max=sinks)
    window_count = qb.clip(max=window) + 1
    return sink_count + window_count + (qb - window - sinks).clip(min=0, max=budget)


MAX_ENTRIES = 2**31 - 1
"""The most entries a schedule's int32 offsets can address."""


@functools.lru_cache(maxsize=64)
def budget_entries(first: int, nb: int, sinks: int, window: int, budget: int) -> int:
    """The entries of one lane's rows ``first .. nb - 1`` under the budget rule (:func:`budget_row_widths`),
    kept for the sizes a model's layers repeat."""
    return int(budget_row_widths(np.arange(first, nb), sinks, window, budget).sum())


def check_budget_entries(lanes: int, first: int, nb: int, sinks: int, window: int, budget: int) -> int:
    """The entries of a budget-rule schedule of ``lanes`` lanes (rows ``first .. nb - 1``); raises
    ``ValueError`` when they exceed :data:`MAX_ENTRIES` (int32 offsets would wrap silently)."""
    total = lanes * budget_entries(first, nb, sinks, window, budget)
    if total > MAX_ENTRIES:
        raise ValueError(f"the schedule would hold {total} block entries ({lanes} lanes of {nb - first} rows, "
                         f"budget {budget}), more than its int32 offsets address ({MAX_ENTRIES}); use fewer lanes "
                         f"(batch, heads) per call or a smaller budget")
    return total


def budget_schedule(chosen: torch.Tensor, block_size: int, seq_len: int, sinks: int, window: int,
                    q_len: int | None = None, lanes: tuple[int, int] | None = None) -> BlockSchedule:
    """The budget rule's CSR schedule, built by arithmetic without a host sync: row ``qb`` holds the sinks
    ``0 .. sinks - 1``, the window ``qb - window .. qb`` (causal) and its chosen blocks, sorted.

    The selectors' rule (:mod:`topo_attn.selection`): every row adds ``min(budget, c)`` of its ``c`` candidates
    (the blocks ``sinks .. qb - window - 1``), so each row's width is known from the sizes alone
    (:func:`budget_row_widths`); the offsets and the number of entries follow by arithmetic, and the entries are
    gathered into place, with no ``nonzero`` and no wait for the device.

    Arguments:
        chosen: int64 ``[R, budget]`` (shared) or ``[B, Hl, R, budget]``, the chosen blocks of rows
            ``first .. nb - 1`` (``first = (seq_len - q_len) // block_size``), any order; entries that are not
            candidates of their row are left out, and the candidates among a row's entries must be distinct and
            number ``min(budget, c)``. Not checked: the kit's ranker builds it so
            (:func:`topo_attn.selection.topk.top_candidates`).
        block_size, seq_len: ints ``>= 1``; ``nb = ceil(seq_len / block_size)`` blocks.
        sinks, window: ints ``>= 0``.
        q_len: queries at the end of the keys (default ``seq_len``).
        lanes: ``None`` for a shared schedule (``chosen`` 2-D), else ``(B, Hl)`` matching ``chosen``.

    Returns:
        A :class:`~topo_attn.BlockSchedule` on ``chosen``'s device (built unchecked: valid by construction).
    """
    nb = num_blocks(seq_len, block_size)
    q_len = seq_len if q_len is None else q_len
    first = (seq_len - q_len) // block_size
    rows, budget = chosen.shape[-2], chosen.shape[-1]
    device = chosen.device
    lane_count = 1 if lanes is None else lanes[0] * lanes[1]
    qb = torch.arange(first, nb, device=device)[:, None]  # [R, 1]
    # slots per row: the sinks, the window, then the chosen blocks; a slot that is not used holds nb
    sink_slots = torch.arange(sinks, device=device)[None, :].expand(rows, sinks)
    sink_slots = torch.where(sink_slots < qb - window, sink_slots, nb)
    window_slots = qb - window + torch.arange(window + 1, device=device)[None, :]
    window_slots = torch.where(window_slots >= 0, window_slots, nb)
    picks = chosen.reshape(lane_count, rows, budget)
    picks = torch.where(budget_candidates(picks, qb, sinks, window), picks, nb)  # the candidates among the picks
    base = torch.cat([sink_slots, window_slots], dim=1).expand(lane_count, rows, sinks + window + 1)
    slots = torch.cat([base, picks], dim=-1).sort(dim=-1).values  # the used slots first, in block order
    # CSR by arithmetic: the widths are known, the used slots lead each sorted row
    nnz = check_budget_entries(lane_count, first, nb, sinks, window, budget)
    widths = budget_row_widths(qb[:, 0], sinks, window, budget).repeat(lane_count)  # [lanes * R], lane-major
    offsets = torch.zeros(widths.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(widths, dim=0, out=offsets[1:])
    row_of = torch.repeat_interleave(torch.arange(widths.numel(), device=device), widths, output_size=nnz)
    within = torch.arange(nnz, device=device) - offsets[row_of]
    indices = slots.reshape(-1, slots.shape[-1])[row_of, within].to(torch.int32)
    return BlockSchedule.unchecked(offsets.to(torch.int32), indices, block_size, seq_len, lanes, False, q_len)


def source_labels(mask: torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """Which part of the rule puts each block of a block mask there, as int8 labels.

    ``[..., qb, kb]`` is :data:`SINK` when the block is scheduled and ``kb < sinks``, else :data:`WINDOW` when it
    is scheduled and ``kb >= qb - window``, else :data:`TOPOLOGY` when it is scheduled (for the rule's own
    schedules: a top-k block), else :data:`SKIPPED`. A block that two parts pick takes the first label in that
    order, so the labelled blocks are exactly the mask's blocks.

    Arguments:
        mask: bool ``[..., n, n]`` (e.g. :meth:`~topo_attn.BlockSchedule.to_block_mask`), rows query blocks.
        sinks, window: non-negative ints.

    Returns:
        int8 ``[..., n, n]`` on the mask's device; ``SOURCE_NAMES[label]`` names a label.

    Raises:
        TypeError: ``mask`` is not a bool tensor, or ``sinks`` / ``window`` is not an int.
        ValueError: ``mask`` is not square in its last two dimensions, or ``sinks`` / ``window`` is negative.
    """
    mask = check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if mask.ndim < 2 or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(f"mask must have shape [..., n, n], got shape {tuple(mask.shape)}")
    sinks, window = check_int("sinks", sinks), check_int("window", window)
    blocks = torch.arange(mask.shape[-1], device=mask.device)
    labels = torch.where(mask, TOPOLOGY, SKIPPED)
    labels = torch.where(mask & (blocks[None, :] >= blocks[:, None] - window), WINDOW, labels)
    return torch.where(mask & (blocks[None, :] < sinks), SINK, labels).to(torch.int8)
