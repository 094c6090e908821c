"""What a selector is: a name, what it reads, and the score functions of the paths it supports.

A selector ranks the candidate key blocks of each query block row; the budget rule (:mod:`topo_attn.rule`)
keeps the sinks and the window and adds the ``budget`` best-scored candidates. Each selector lives in its own
module of :mod:`topo_attn.selection` and describes itself with one :class:`Selector`; the registry
(:mod:`topo_attn.selection.registry`) collects them, and everything that picks blocks (``select`` over a whole
sequence, ``select_for_queries`` at the end of a cache, the per-token evaluation of :mod:`topo_attn.lm`, the
harness, the transformers backend) reads it.

The three score functions, each optional (higher is better):

- ``block_scores(q, k, block_size, groups, dtype, **options) -> [B, groups, n, n]``, over a whole sequence
  (prefill): ``q [B, H, S, D]``, ``k [B, H_kv, S, D]``, ``[..., qb, kb]`` the score of key block ``kb`` for
  query block ``qb``; ``groups`` is ``H_kv`` (each key/value head's query heads choose together) or ``H`` (every
  query head chooses); ``dtype`` the scores' dtype (float32 on the fast path, float64 for the harness).
  Options a function does not use are ignored.
- ``step_scores(q, stats, first, rows, num_rows, seq_len, seed) -> [B, H_kv, R, w]``, for ``L`` queries at the
  end of ``seq_len`` cached keys (decode, chunked prefill) from the cache's kept
  :class:`~topo_attn.selection.incremental.KeyBlockStats`: ``q [B, H, L, D]``, ``rows`` the row of each query
  (int64 ``[L]``), row ``r`` the absolute query block ``first + r``; scores of blocks ``0 .. w - 1``, in the
  stats' dtype. A selector flagged ``static_step`` that adds blocks scores the same way from a static cache's
  :class:`~topo_attn.selection.static_step.StaticBlockStats` (every one of its ``nb_max`` blocks, whatever their
  state) without a host sync; there ``first`` and ``seq_len`` are int64 device tensors, not ints.
- ``token_scores(q, k, block_size, scale, seed) -> (rows: slice) -> [B, H, len(rows), n]``, one query token at
  a time (what generation does; the evaluation of :mod:`topo_attn.lm.token_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

BlockScores = Callable[..., torch.Tensor]
StepScores = Callable[..., torch.Tensor]
Scorer = Callable[[slice], torch.Tensor]
TokenScores = Callable[..., Scorer]


@dataclass(frozen=True)
class Selector:
    """One selector (module docstring). ``query_aware``: it reads the queries; ``topology_aware``: it reads the
    key blocks' persistence (salience or clusters); ``sync_free``: its whole-sequence selection on a GPU waits
    for no host sync (``topology_22``'s rows, of no known width, come as a padded schedule); ``host_scores``:
    its whole-sequence scores are computed on the host or wait for it many times per layer (the oracle's chunked
    attention, the cluster cuts): slow at long context; ``adds_blocks``: it adds ``budget`` blocks per row
    (``window`` adds none); ``equal_budget``: every row adds exactly ``min(budget, candidates)`` blocks
    (``topology_22``, #22's rule, adds fewer); ``static_step``: it chooses a decode step from a static cache's
    statistics in fixed shapes, reading the length from a device tensor
    (:func:`~topo_attn.selection.static_step.step_block_table`: one captured graph serves every step)."""

    name: str
    description: str
    block_scores: BlockScores | None = None
    step_scores: StepScores | None = None
    token_scores: TokenScores | None = None
    query_aware: bool = False
    topology_aware: bool = False
    sync_free: bool = True
    host_scores: bool = False
    adds_blocks: bool = True
    equal_budget: bool = True
    static_step: bool = False


def to_groups(stats: torch.Tensor, groups: int) -> torch.Tensor:
    """Per key/value head statistics ``[B, H_kv, ...]`` for ``groups`` head groups: themselves when ``groups ==
    H_kv``, else each repeated for the query heads of its group (``groups = H``)."""
    kv_heads = stats.shape[1]
    return stats if groups == kv_heads else stats.repeat_interleave(groups // kv_heads, dim=1)
