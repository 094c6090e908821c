"""Selection over a whole sequence (prefill, training, the harness): :func:`select` runs a selector of the
registry (:mod:`topo_attn.selection.registry`; one module per selector) and the budget rule.

The **budget** is the number of extra key blocks per query block beyond the sinks and the window (the rule's
base, :func:`topo_attn.rule.base_block_mask`): each equal-budget selector adds, per row, the ``budget``
best-scored causal blocks outside the sinks and the window (all of them when fewer exist,
:func:`candidate_counts`), so every such selector visits exactly the same number of blocks in every row. Only
``"topology_22"``, #22's rule itself (:func:`~topo_attn.topology_schedule` with ``topk=budget``), visits fewer.

By default the query heads of each key/value head choose together (one row-set per key/value head, lanes
``(B, H_kv)``), as the decode path and NSA do: the kernels then read each chosen block once per group, and
budgets compare at equal key/value blocks read. ``per_query_head=True`` gives every query head its own choice.

The path from scores to schedule waits for no host sync: the scores are computed on the inputs' device (float32
on a GPU; float64 on the CPU, the harness's exact reference), each row's best candidates come from one
``topk`` (:func:`~topo_attn.selection.topk.top_candidates`), and the CSR from arithmetic on rows of known
width (:func:`~topo_attn.rule.budget_schedule`); on a GPU one kernel does both for float32 scores
(:mod:`~topo_attn.selection.budget_rows_kernel`, the same schedule in one launch). ``"topology_22"``'s rows have
no known width: on a GPU its schedule is padded (:attr:`~topo_attn.BlockSchedule.padded`), its entry count left
on the device. Which selectors' scores are sync-free too: ``Selector.sync_free``.
"""

from __future__ import annotations

import torch

from .._checks import check_int, check_qkv
from ..rule import base_block_mask, budget_schedule, check_budget_entries
from ..schedule import BlockSchedule
from ..topology import topology_schedule
from .registry import SELECTORS, get, names
from .selector import to_groups
from .topk import top_candidates

DESCRIPTIONS: dict[str, str] = {name: selector.description for name, selector in SELECTORS.items()}
"""One line per selector, for tables."""

TOPOLOGY_AWARE = names(topology_aware=True)
"""The selectors that use the key blocks' persistence (salience or clusters)."""

QUERY_AWARE = names(query_aware=True)
"""The selectors that read the queries."""


def candidate_counts(nb: int, sinks: int, window: int) -> torch.Tensor:
    """Per row, the causal blocks outside the sinks and the window (what a budget can add).

    Arguments:
        nb: blocks per side, ``>= 0``; sinks, window: ints ``>= 0``.

    Returns:
        int64 ``[nb]`` on the CPU.
    """
    causal = torch.ones(nb, nb, dtype=torch.bool).tril()
    return (causal & ~base_block_mask(nb, sinks, window)).sum(-1)


def schedule_from_scores(scores: torch.Tensor, block_size: int, seq_len: int, sinks: int, window: int,
                         budget: int, q_len: int | None = None) -> BlockSchedule:
    """The rule's base mask (sinks + window) plus, per row, the ``budget`` highest-scored causal blocks outside
    it (all of them when fewer exist; ties to the lower block index). No host sync.

    Arguments:
        scores: real ``[n, n]`` (shared schedule) or ``[B, Hl, n, n]`` (one row-set per lane), ``[..., qb, kb]``
            the score of key block ``kb`` for query block ``qb``; float64 scores are ranked by a stable sort,
            others by one ``topk`` of an int64 key (:mod:`~topo_attn.selection.topk`). Scores of blocks that
            cannot be added (non-causal, sinks, window) are ignored.
        block_size: tokens per block, ``>= 1``; seq_len: tokens, with ``n = ceil(seq_len / block_size)``.
        sinks, window, budget: ints ``>= 0``.
        q_len: the rows of the last ``q_len`` queries only (default: every row).

    Returns:
        A :class:`~topo_attn.BlockSchedule` on the scores' device.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size is negative, ``n`` does not match ``seq_len`` and ``block_size``, or the schedule would
            hold more entries than its int32 offsets address (:func:`~topo_attn.rule.check_budget_entries`).
    """
    block_size, seq_len = check_int("block_size", block_size, 1), check_int("seq_len", seq_len, 1)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    nb = -(-seq_len // block_size)
    if scores.shape[-1] != nb or scores.shape[-2] != nb or scores.ndim not in (2, 4):
        raise ValueError(f"scores must have shape [{nb}, {nb}] or [B, H, {nb}, {nb}] ({nb} blocks of {block_size} "
                         f"for seq_len={seq_len}), got shape {tuple(scores.shape)}")
    q_len = seq_len if q_len is None else check_int("q_len", q_len, 1)
    first = (seq_len - q_len) // block_size
    rows = scores[..., first:, :]
    lanes = None if scores.ndim == 2 else (scores.shape[0], scores.shape[1])
    check_budget_entries(1 if lanes is None else lanes[0] * lanes[1], first, nb, sinks, window, budget)
    if rows.is_cuda:
        from . import budget_rows_kernel  # triton is imported on first use

        if budget_rows_kernel.applies(rows):  # one launch instead of ~40 small ones
            return budget_rows_kernel.budget_rows(rows, block_size, seq_len, sinks, window, budget, q_len, lanes)
    return budget_schedule(top_candidates(rows, first, sinks, window, budget), block_size, seq_len, sinks, window,
                           q_len, lanes)


def previous_row_scores(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` (``[..., n, n]``) with each row ``qb >= 1`` replaced by row ``qb - 1`` (row 0 kept: it has
    no block to add). A row's choice then depends only on the queries of the query block before it, and, with
    a window of at least one block, only on key blocks that end before it: no query's schedule depends on a
    later token (see ``strict`` in :func:`select`)."""
    out = scores.clone()
    out[..., 1:, :] = scores[..., :-1, :]
    return out


def block_scores(name: str, q: torch.Tensor, k: torch.Tensor, block_size: int, per_query_head: bool = False,
                 dtype: torch.dtype | None = None, **options) -> torch.Tensor:
    """The whole-sequence scores of selector ``name`` (its module's ``block_scores``), for ``[S, D]`` inputs
    ``[n, n]``, else ``[B, H_kv, n, n]`` (``[B, H, n, n]`` with ``per_query_head``); ``dtype``: float64 on the
    CPU and float32 on a GPU by default. Inputs as for :func:`select` (checked there)."""
    selector = get(name, "block")
    if selector.block_scores is None:
        raise ValueError(f"selector {name!r} has no block scores (it builds its schedule itself)")
    dtype = dtype or (torch.float32 if q.is_cuda else torch.float64)
    q4, k4 = (q[None, None], k[None, None]) if q.ndim == 2 else (q, k)
    groups = q4.shape[1] if per_query_head else k4.shape[1]
    scores = selector.block_scores(q4, k4, block_size, groups, dtype, **options)
    return scores[0, 0] if q.ndim == 2 else scores


def select(name: str, q: torch.Tensor, k: torch.Tensor, block_size: int, sinks: int = 1, window: int = 1,
           budget: int = 4, strict: bool = False, q_len: int | None = None, per_query_head: bool = False,
           dtype: torch.dtype | None = None, **options) -> BlockSchedule:
    """The schedule of selector ``name`` (see the module docstring and :data:`SELECTORS`).

    Arguments:
        name: a key of :data:`SELECTORS`.
        q, k: floating ``[S, D]`` each (shared schedule), or ``q [B, H, S, D]`` and ``k [B, H_kv, S, D]`` with
            ``H % H_kv == 0``; same dtype and device.
        block_size: tokens per block, ``>= 1``.
        sinks, window, budget: ints ``>= 0`` (``budget`` is ignored by ``"window"``; it is #22's ``topk`` for
            ``"topology_22"``).
        strict: choose each query block's extra blocks from the scores of the query block before it
            (:func:`previous_row_scores`; with ``window >= 1`` those are key blocks wholly before the row).
            Row-pooled scores (the mean query of a block, the oracle's block mass, Quest's bound over the
            block's queries) otherwise let the queries after position ``t`` in its block decide which blocks
            position ``t`` sees: harmless for a prompt known in full, a look-ahead when the model is scored on
            predicting those tokens (perplexity). The key-side statistics of ``topology``, ``cluster`` and
            ``cluster_centroid`` (a spanning tree over all key blocks) still span later blocks. Not for
            ``"topology_22"`` (no row scores).
        q_len: the rows of the last ``q_len`` queries only (:meth:`~topo_attn.BlockSchedule.for_queries`: the
            schedule of the whole sequence restricted to a suffix of queries, for chunked prefill).
        per_query_head: one row-set per query head (lanes ``(B, H)``) instead of one per key/value head
            (``(B, H_kv)``, the group choosing together: the sum of the group's centroid scores, the largest of
            its Quest bounds, the sum of its attention mass).
        dtype: the scores' dtype: float64 on the CPU and float32 on a GPU by default.
        options: ``seed`` (random), ``clusters`` (cluster selectors), ``scale`` and ``chunk`` (oracle).

    Returns:
        A :class:`~topo_attn.BlockSchedule` on q's device: shared for ``[S, D]`` inputs, lanes ``(B, H_kv)``
        (or ``(B, H)``) otherwise.

    Raises:
        ValueError: an unknown selector name, or a negative size or bad shapes, or ``strict`` with
            ``"topology_22"``.
        TypeError: a non-int size, or bad dtypes.
    """
    selector = get(name)
    check_qkv(q, k, k)
    block_size = check_int("block_size", block_size, 1)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    if strict and name == "topology_22":
        raise ValueError("strict selection needs row scores; selector 'topology_22' has none")
    seq = q.shape[-2]
    if name == "topology_22":
        keys = k if q.ndim == 2 or not per_query_head else to_groups(k, q.shape[1])
        return topology_schedule(keys, block_size, window, sinks, budget, q_len=q_len, check=False)
    if not selector.adds_blocks:
        budget = 0
    # Quest's kernel skips the tiles after each row's candidates; a strict row reads the row before it
    scores = block_scores(name, q, k, block_size, per_query_head, dtype, window=window - strict, **options)
    if strict:
        scores = previous_row_scores(scores)
    return schedule_from_scores(scores, block_size, seq, sinks, window, budget, q_len)
