"""``topology_schedule``: sinks + a local window + the top-k most salient key blocks (#22's rule)."""

from __future__ import annotations

import torch

from .persistence import block_centroids, block_salience, top_salient_blocks
from .schedule import BlockSchedule, num_blocks
from .validation import check_int, check_keys


def schedule_from_salience(salience: torch.Tensor, block_size: int, seq_len: int, window: int, sinks: int,
                           topk: int, lanes: tuple[int, int] | None = None) -> BlockSchedule:
    """The schedule for given saliences ``[n]`` (shared) or ``[L, n]`` (one per lane, ``L = B * H``).

    Per query block ``qb``: sink blocks ``0..sinks-1``, the window ``qb-window..qb``, and those of the
    ``topk`` most salient blocks (chosen once per lane, ties to the lower index) that are ``<= qb``;
    sorted and without duplicates. Vectorised over lanes and rows."""
    nb = num_blocks(seq_len, block_size)
    device = salience.device
    sal = salience.reshape(-1, nb)
    lane_count = sal.shape[0]
    sinks, window, topk = min(sinks, nb), min(window, nb - 1), min(topk, nb)
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
    return BlockSchedule(offsets, indices, block_size, seq_len, lanes)


def topology_schedule(keys: torch.Tensor, block_size: int, window: int, sinks: int, topk: int, *,
                      shared_lane: tuple[int, int] | None = None) -> BlockSchedule:
    """Build a causal block schedule from the topology of the key blocks.

    keys: ``[S, D]`` gives a shared schedule; ``[B, H, S, D]`` gives one schedule per lane, or, with
    ``shared_lane=(b, h)``, one shared schedule built from ``keys[b, h]`` (what #22 does with ``k[0, 0]``).
    For GQA, pass the key heads expanded to the query heads (``k.repeat_interleave(H // H_kv, 1)``) to get
    per-query-head lanes, or use ``shared_lane``.

    Per query block ``qb``: sinks ``0..sinks-1``, the window ``qb-window..qb`` and the ``topk`` most salient
    blocks (elder-rule salience of the block centroids, :func:`block_salience`) that are ``<= qb``. The
    schedule lives on the keys' device. ``S`` need not be a multiple of ``block_size``."""
    keys = check_keys(keys)
    block_size = check_int("block_size", block_size, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    lanes = None
    if keys.ndim == 4:
        if shared_lane is not None:
            b, h = shared_lane
            if not (0 <= b < keys.shape[0] and 0 <= h < keys.shape[1]):
                raise ValueError(f"shared_lane must index keys' (B, H) = {tuple(keys.shape[:2])}, got {shared_lane}")
            keys = keys[b, h]
        else:
            lanes = (keys.shape[0], keys.shape[1])
    elif shared_lane is not None:
        raise ValueError("shared_lane applies only to keys of shape [B, H, S, D]")
    keys = keys.detach()
    salience = block_salience(block_centroids(keys, block_size))
    return schedule_from_salience(salience, block_size, keys.shape[-2], window, sinks, topk, lanes)
