"""Selection for queries at the end of a growing key cache (decode, chunked prefill), kept incremental.

A decode step has ``L`` new queries (``q [B, H, L, D]``) at the end of ``S`` cached keys (``k [B, H_kv, S, D]``);
query ``i`` sits at position ``S - L + i``. Reading every cached key to choose blocks would cost as much as
dense attention, so the selectors read per-block statistics instead (:class:`KeyBlockStats`): for each
*complete* key block its centroid, the element-wise minimum and maximum of its keys (Quest's page bounds) and,
when asked for, its elder-rule salience among the complete blocks. They are computed when a block completes,
from that block's keys only; the salience is recomputed once per completed block, not once per step.

:func:`select_for_queries` gives the schedule of such a step with one row-set per **key/value head** (lanes
``(B, H_kv)``): the query heads of a group choose together, so the decode kernel reads every scheduled block
once per group. Row ``r`` is absolute query block ``first + r`` (``first = (S - L) // block_size``); it holds
the rule's base mask (the sinks and the window, :func:`~topo_attn.rule.base_block_mask`) and the ``budget``
best-scored candidates, the causal blocks before the row's block outside the base (all complete blocks),
chosen by :func:`~topo_attn.selection.topk.top_candidates`, scored from the queries of that row:

- ``centroid``: the mean of the row's queries over the group's heads, dotted with each block centroid;
- ``quest``: the largest page bound ``relu(q) . max + min(q, 0) . min`` over the row's queries and the group's
  heads (an upper bound on every ``q . k`` of the block);
- ``topology`` (and ``topology_22``, at decode the same equal-budget rule): the block's elder-rule salience
  among the blocks before the step's first query block (the prefix salience of
  :mod:`topo_attn.lm.token_attention` for one query); later candidates of a chunk's later rows score ``-inf``;
- ``random``: uniform scores from a CPU generator seeded with ``seed + S`` (a new draw each step);
- ``window``: nothing beyond the base.

With ``L = 1`` and one query head per key/value head this is the per-token choice of
:mod:`topo_attn.lm.token_attention` (the centroid, Quest and topology scores agree with it exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._checks import check_int, check_qkv
from ..rule import budget_schedule
from ..schedule import BlockSchedule, num_blocks
from ..topology import block_centroids, block_salience
from .registry import get, names
from .stats import key_block_bounds
from .topk import top_candidates

INCREMENTAL_SELECTORS = names("step")
"""The selectors :func:`select_for_queries` supports, those with step scores (``oracle`` and the cluster
selectors need every key or a spanning-tree cut per step and have none)."""


@dataclass
class KeyBlockStats:
    """Per complete key block statistics of one layer's key cache ``[B, H_kv, S, D]``, extended as the cache
    grows (:meth:`update`). ``complete``: the number of complete blocks covered; ``centroids``, ``lo``, ``hi``:
    float64 ``[B, H_kv, complete, D]`` (mean, element-wise minimum and maximum of each block's keys); the
    salience of a prefix of blocks (:meth:`salience`) is computed on demand and kept until another prefix is
    asked for (a decode step asks for a new one when a block completes);
    ``blocks_read``: blocks whose keys were read so far (a count over the object's life).

    ``block_size``: tokens per block, ``>= 1``."""

    block_size: int
    complete: int = 0
    centroids: torch.Tensor | None = None
    lo: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    blocks_read: int = 0
    _salience: tuple[int, torch.Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.block_size = check_int("block_size", self.block_size, 1)

    def reset(self) -> None:
        """Forget every statistic (the cache was cropped, reordered or reset); ``blocks_read`` keeps counting."""
        self.complete = 0
        self.centroids = self.lo = self.hi = self._salience = None

    def update(self, keys: torch.Tensor) -> "KeyBlockStats":
        """Cover every complete block of ``keys`` (``[B, H_kv, S, D]``, the whole cache), reading only the
        blocks that completed since the last call. A cache shorter than what is covered, or of another batch,
        head count or device, starts over (after a crop or a reorder). Returns ``self``."""
        bs = self.block_size
        complete = keys.shape[-2] // bs
        if self.centroids is not None and (complete < self.complete or self.centroids.shape[:2] != keys.shape[:2]
                                           or self.centroids.device != keys.device):
            self.reset()
        if complete == self.complete:
            return self
        new = keys[..., self.complete * bs:complete * bs, :].detach()
        centroids = block_centroids(new, bs, torch.float64)
        lo, hi = key_block_bounds(new, bs)
        if self.centroids is None:
            self.centroids, self.lo, self.hi = centroids, lo, hi
        else:
            self.centroids = torch.cat([self.centroids, centroids], dim=-2)
            self.lo, self.hi = torch.cat([self.lo, lo], dim=-2), torch.cat([self.hi, hi], dim=-2)
        self.blocks_read += complete - self.complete
        self.complete = complete
        return self

    def salience(self, blocks: int) -> torch.Tensor:
        """The elder-rule salience of blocks ``0 .. blocks - 1`` among themselves (``block_salience`` of their
        centroids), float64 ``[B, H_kv, blocks]``; kept until another prefix is asked for. Raises
        ``ValueError`` unless ``1 <= blocks <= complete``."""
        if not 1 <= blocks <= self.complete:
            raise ValueError(f"blocks must be in 1..{self.complete} (the complete blocks), got {blocks}")
        if self._salience is None or self._salience[0] != blocks:
            self._salience = (blocks, block_salience(self.centroids[..., :blocks, :]).to(torch.float64))
        return self._salience[1]


def query_rows(seq_len: int, q_len: int, block_size: int, device) -> tuple[int, torch.Tensor]:
    """``(first, rows)``: the first absolute query block and, per query, its row ``block - first`` (int64
    ``[q_len]``) for ``q_len`` queries at the end of ``seq_len`` keys."""
    first = (seq_len - q_len) // block_size
    positions = torch.arange(seq_len - q_len, seq_len, device=device)
    return first, positions // block_size - first


def select_for_queries(selector: str, q: torch.Tensor, k: torch.Tensor, block_size: int, sinks: int = 1,
                       window: int = 1, budget: int = 4, stats: KeyBlockStats | None = None,
                       seed: int = 0) -> BlockSchedule:
    """The schedule of ``selector`` for the queries ``q`` at the end of the keys ``k`` (module docstring).

    Arguments:
        selector: one of :data:`INCREMENTAL_SELECTORS`.
        q: ``[B, H, L, D]``; k: ``[B, H_kv, S, D]`` with ``L <= S`` and ``H % H_kv == 0``; floating, one device.
        block_size: tokens per block, ``>= 1``.
        sinks, window, budget: ints ``>= 0``, as in :func:`~topo_attn.selection.select`.
        stats: the cache's :class:`KeyBlockStats` (updated here from ``k``, reading only new blocks); None
            computes them from every complete block of ``k``.
        seed: the random selector's seed.

    Returns:
        A row :class:`~topo_attn.BlockSchedule` with ``seq_len = S``, ``q_len = L`` and lanes ``(B, H_kv)``,
        on q's device.

    Raises:
        ValueError: an unknown selector, shapes that do not fit, a negative size, stats for another block size.
        TypeError: a non-int size.
    """
    chooser = get(selector, "step")
    shape = check_qkv(q, k, k, shorter_q=True)
    if shape.rank != 4:
        raise ValueError(f"q and k must be [B, H, L, D] and [B, H_kv, S, D], got q shape {tuple(q.shape)}")
    block_size = check_int("block_size", block_size, 1)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    if stats is None:
        stats = KeyBlockStats(block_size)
    elif stats.block_size != block_size:
        raise ValueError(f"stats were kept for block_size={stats.block_size}, not {block_size}")
    seq_len, q_len = shape.kv_len, shape.seq_len
    nb = num_blocks(seq_len, block_size)
    first, rows = query_rows(seq_len, q_len, block_size, q.device)
    num_rows = nb - first
    lanes = (shape.batch, shape.kv_heads)
    chosen = torch.empty(*lanes, num_rows, 0, dtype=torch.int64, device=q.device)
    if chooser.adds_blocks and budget and nb - 1 >= sinks + window + 1:  # some row has a candidate
        stats.update(k)
        scores = torch.full((*lanes, num_rows, nb), float("-inf"), dtype=torch.float64, device=q.device)
        if first > 0 or not chooser.topology_aware:  # the prefix salience needs a block before the step
            found = chooser.step_scores(q, stats, first, rows, num_rows, seq_len, seed)
            scores[..., :found.shape[-1]] = found
        chosen = top_candidates(scores, first, sinks, window, budget)
    # rows of known width: the CSR by arithmetic, no nonzero and no wait for the device
    return budget_schedule(chosen, block_size, seq_len, sinks, window, q_len, lanes)
