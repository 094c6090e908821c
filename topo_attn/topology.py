"""``topology_schedule``: sinks + a local window + the top-k most salient key blocks (#22's rule).

``schedule_sources`` says, for each scheduled block, which part of the rule put it there.
"""

from __future__ import annotations

import torch

from .persistence import MAX_GPU_BLOCKS, _salience, block_centroids, top_salient_blocks
from .schedule import BlockSchedule, num_blocks
from .validation import check_finite, check_int, check_keys, check_tensor


def _clamped(nb: int, topk: int, sinks: int, window: int) -> tuple[int, int, int]:
    """The rule's ``(topk, sinks, window)`` for ``nb`` blocks: at most ``nb`` top-k and sink blocks, a window
    of at most ``nb - 1`` blocks back."""
    return min(topk, nb), min(sinks, nb), min(window, nb - 1)


def schedule_from_salience(salience: torch.Tensor, block_size: int, seq_len: int, window: int, sinks: int,
                           topk: int, lanes: tuple[int, int] | None = None) -> BlockSchedule:
    """The schedule for given saliences ``[n]`` (shared) or ``[L, n]`` (one per lane, ``L = B * H``).

    Per query block ``qb``: sink blocks ``0..sinks-1``, the window ``qb-window..qb``, and those of the
    ``topk`` most salient blocks (chosen once per lane, ties to the lower index) that are ``<= qb``;
    sorted and without duplicates. Vectorised over lanes and rows. Saliences must be finite (``ValueError``
    otherwise)."""
    block_size, seq_len = check_int("block_size", block_size, 1), check_int("seq_len", seq_len, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    nb = num_blocks(seq_len, block_size)
    salience = check_tensor("salience", salience)
    if salience.ndim == 0 or salience.shape[-1] != nb:
        raise ValueError(f"salience must have shape [..., {nb}] ({nb} blocks of {block_size} for "
                         f"seq_len={seq_len}), got shape {tuple(salience.shape)}")
    device = salience.device
    sal = salience.reshape(-1, nb)
    lane_count = sal.shape[0]
    if lanes is not None:
        lanes = (check_int("lanes[0]", lanes[0], 1), check_int("lanes[1]", lanes[1], 1))
    if lane_count != (1 if lanes is None else lanes[0] * lanes[1]):
        raise ValueError(f"salience holds {lane_count} lanes, but lanes={lanes} needs "
                         f"{1 if lanes is None else lanes[0] * lanes[1]}")
    topk, sinks, window = _clamped(nb, topk, sinks, window)
    if sal.is_cuda:  # two Triton launches instead of about twenty small torch ones
        from .kernels.rule_rows import rule_rows

        if not sal.is_floating_point() or sal.dtype not in (torch.float32, torch.float64):
            sal = sal.to(torch.float64)
        # the saliences' finiteness is read back in the assembly's host sync
        offsets, indices = rule_rows(sal, topk, sinks, window, ("salience", torch.isfinite(sal).all()))
        return BlockSchedule._trusted(offsets, indices, block_size, seq_len, lanes)
    check_finite("salience", sal)
    rows = torch.arange(nb, device=device)
    # candidates [L, n, m]: sinks, then the window, then the top-k blocks
    sink_part = torch.arange(sinks, device=device).expand(lane_count, nb, sinks)
    window_part = (rows[:, None] - torch.arange(window + 1, device=device)).expand(lane_count, nb, window + 1)
    top_part = top_salient_blocks(sal, topk)[:, None, :].expand(lane_count, nb, topk)
    candidates = torch.cat([sink_part, window_part, top_part], dim=-1)
    # drop non-causal and negative candidates, sort each row, keep the first of each run of equal values
    valid = (candidates >= 0) & (candidates <= rows[:, None])
    candidates = torch.where(valid, candidates, nb).sort(dim=-1).values
    keep = candidates < nb
    keep[..., 1:] &= candidates[..., 1:] != candidates[..., :-1]
    counts = keep.sum(dim=-1, dtype=torch.int32).reshape(-1)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=device)
    torch.cumsum(counts, dim=0, out=offsets[1:])
    indices = candidates[keep].to(torch.int32)
    # valid by construction (sorted, unique, causal, the diagonal in every row): skip the checks' syncs
    return BlockSchedule._trusted(offsets, indices, block_size, seq_len, lanes)


SKIPPED, SINK, WINDOW, TOPOLOGY = 0, 1, 2, 3
SOURCE_NAMES = ("skipped", "sink", "window", "topology")  # indexed by the labels above


def schedule_sources(salience: torch.Tensor, block_size: int, seq_len: int, window: int, sinks: int,
                     topk: int) -> torch.Tensor:
    """Why each block of :func:`schedule_from_salience`'s schedule is scheduled, as int8 labels.

    salience: ``[n]`` (shared) or ``[..., n]`` (one per lane, e.g. ``[L, n]`` or ``[B, H, n]``) -> int8
    ``[..., n, n]`` on the salience's device. ``[..., qb, kb]`` is ``SINK`` (1) when ``kb < sinks``, else
    ``WINDOW`` (2) when ``qb - window <= kb``, else ``TOPOLOGY`` (3) when ``kb`` is one of the ``topk`` most
    salient blocks, else ``SKIPPED`` (0); blocks after the query block (``kb > qb``) are ``SKIPPED``. A block
    that two parts of the rule pick takes the first label in that order. The labelled blocks are exactly the
    schedule's block mask. ``SOURCE_NAMES[label]`` names a label."""
    salience = check_tensor("salience", salience)
    block_size, seq_len = check_int("block_size", block_size, 1), check_int("seq_len", seq_len, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    nb = num_blocks(seq_len, block_size)
    if salience.ndim == 0 or salience.shape[-1] != nb:
        raise ValueError(f"salience must have shape [..., {nb}] ({nb} blocks of {block_size} for "
                         f"seq_len={seq_len}), got shape {tuple(salience.shape)}")
    lanes = None if salience.ndim == 1 else (salience.numel() // nb, 1)
    scheduled = schedule_from_salience(salience, block_size, seq_len, window, sinks, topk, lanes).to_block_mask()
    # every scheduled block that is neither a sink nor in the window was put there by its salience
    rows = torch.arange(nb, device=salience.device)
    labels = torch.where(scheduled, TOPOLOGY, SKIPPED)
    labels = torch.where(scheduled & (rows[None, :] >= rows[:, None] - window), WINDOW, labels)
    labels = torch.where(scheduled & (rows[None, :] < sinks), SINK, labels).to(torch.int8)
    return labels.reshape(*salience.shape[:-1], nb, nb)


def topology_schedule(keys: torch.Tensor, block_size: int, window: int, sinks: int, topk: int, *,
                      shared_lane: tuple[int, int] | None = None,
                      dtype: torch.dtype = torch.float64) -> BlockSchedule:
    """Build a causal block schedule from the topology of the key blocks.

    keys: ``[S, D]`` gives a shared schedule; ``[B, H, S, D]`` gives one schedule per lane, or, with
    ``shared_lane=(b, h)``, one shared schedule built from ``keys[b, h]`` (what #22 does with ``k[0, 0]``).
    For GQA, pass the key heads expanded to the query heads (``k.repeat_interleave(H // H_kv, 1)``) to get
    per-query-head lanes, or use ``shared_lane``.

    Per query block ``qb``: sinks ``0..sinks-1``, the window ``qb-window..qb`` and the ``topk`` most salient
    blocks (elder-rule salience of the block centroids, :func:`block_salience`) that are ``<= qb``. The
    schedule lives on the keys' device. ``S`` need not be a multiple of ``block_size``.

    Keys on a CUDA device are handled there from end to end, all lanes at once, in Triton kernels (up to
    4096 blocks): centroids, distances, minimum spanning trees, saliences, top-k and the CSR assembly, the
    host waiting only for the entry count (the schedule's tensors may still be being written when this
    returns; like any CUDA result they are ordered on the current stream); every launch is replayed from a
    CUDA graph cached per shape (:mod:`topo_attn.kernels.build`). ``dtype`` is the precision of centroids and distances: float64 (the default) gives
    exactly the CPU path's schedules; float32 is faster on GPUs and gives the same schedules unless key
    blocks nearly tie (see :func:`block_salience`). The CPU path always computes in float64. Keys that
    require grad are detached: the schedule carries no gradient."""
    keys = check_keys(keys, finite=False)  # the centroids of the lanes used are checked below
    block_size = check_int("block_size", block_size, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    lanes = None
    if keys.ndim == 4:
        if shared_lane is not None:
            b, h = shared_lane
            if not (0 <= b < keys.shape[0] and 0 <= h < keys.shape[1]):
                raise ValueError(f"shared_lane must index keys' (B, H) = {tuple(keys.shape[:2])}, got {shared_lane}")
            keys = keys[b:b + 1, h]  # [1, S, D]: the GPU build's layout, one view (a shared schedule)
        else:
            lanes = (keys.shape[0], keys.shape[1])
    elif shared_lane is not None:
        raise ValueError("shared_lane applies only to keys of shape [B, H, S, D]")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    seq, nb = keys.shape[-2], num_blocks(keys.shape[-2], block_size)
    if keys.is_cuda and nb <= MAX_GPU_BLOCKS:
        from .kernels.build import build_rows  # triton is imported on first use

        # NaN or Inf keys (or block sums that overflow) reach the centroids, whose finiteness is read back with
        # the entry count (the kernels stay in bounds on any input; they only read the keys, so
        # keys that require grad need no detached view)
        flat = keys if keys.ndim == 3 else keys.reshape(-1, seq, keys.shape[-1])
        offsets, indices = build_rows(flat, block_size, dtype, *_clamped(nb, topk, sinks, window))
        return BlockSchedule._trusted(offsets, indices, block_size, seq, lanes)
    keys = (keys[0] if keys.ndim == 3 else keys).detach()  # (a shared lane: [S, D])
    centroids = block_centroids(keys, block_size, dtype if keys.is_cuda else torch.float64)
    check_finite("keys", centroids)
    return schedule_from_salience(_salience(centroids), block_size, seq, window, sinks, topk, lanes)
