"""Selectors: which key blocks a query block visits, at equal budget.

Each selector (:data:`SELECTORS`, :func:`select`) returns a :class:`~topo_attn.BlockSchedule` (shared for
``[S, D]`` inputs, one row-set per query head for ``[B, H, S, D]``) with the same ``sinks`` and ``window`` as
:func:`~topo_attn.topology_schedule` (the rule's base mask, :func:`topo_attn.rule.base_block_mask`). The
**budget** is the number of extra key blocks per query block beyond the sinks and the window: each equal-budget
selector adds, per row, the ``budget`` best-scored causal blocks outside the sinks and the window (all of them
when fewer exist, :func:`candidate_counts`), so every such selector visits exactly the same number of blocks in
every row. Only ``"topology_22"``, #22's rule itself (``topology_schedule`` with ``topk=budget``: one global
top-k per lane, of which a row keeps only the causal blocks and which may overlap the sinks and window) visits
fewer.

- ``"window"``: sinks and window only (budget ignored);
- ``"random"``: uniform random blocks (seeded);
- ``"topology_22"``: #22's rule, as above; ``"topology"``: the same elder-rule salience at equal budget;
- ``"centroid"``: the mean-pooled query of the query block dotted with each key-block centroid;
- ``"quest"`` (Quest, Tang et al. 2024, the page bound): per key block the element-wise minimum ``m`` and
  maximum ``M`` of its keys; a query's upper bound on ``q . k`` for any key of the block is
  ``sum_i max(q_i M_i, q_i m_i)``, and a query block scores the key block by the largest bound among its
  queries, an upper bound on every ``q . k`` of the tile;
- ``"cluster"`` (topology-aware and query-aware): the key-block centroids' minimum spanning tree is cut at its
  ``clusters - 1`` longest edges (the 0-dimensional persistence clusters that live longest); each cluster is
  scored by the query-block centroid against the cluster centroid, blocks of better clusters come first,
  the centroid score orders blocks within a cluster;
- ``"cluster_centroid"`` (topology-aware and query-aware): the centroid score plus the cluster's score, so a
  block is favoured both for its own match and for its cluster's;
- ``"oracle"``: the ``budget`` blocks with the most true attention mass
  (:func:`~topo_attn.selection.metrics.block_attention_mass`). Among equal-budget selectors it has the highest
  recall, because recall is additive over blocks.

A score function ``f(q, k, block_size, **options)`` takes q and k as :func:`select` does and returns float64
scores ``[n, n]`` (``[S, D]`` inputs) or ``[B, H, n, n]`` (higher is better; ``[qb, kb]`` scores key block ``kb``
for query block ``qb``); options it does not use are ignored.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .._checks import check_int, check_qkv
from ..rule import base_block_mask
from ..schedule import BlockSchedule, num_blocks
from ..topology import block_centroids, block_salience, minimum_spanning_tree, topology_schedule
from .metrics import DEFAULT_CHUNK, block_attention_mass


# ------------------------------------------------------------------------------------ scores -> schedule
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
                         budget: int) -> BlockSchedule:
    """The rule's base mask (sinks + window) plus, per row, the ``budget`` highest-scored causal blocks outside
    it (all of them when fewer exist; ties to the lower block index).

    Arguments:
        scores: real ``[n, n]`` (shared schedule) or ``[B, H, n, n]`` (one row-set per lane), ``[..., qb, kb]``
            the score of key block ``kb`` for query block ``qb``; compared in float64. Scores of blocks that
            cannot be added (non-causal, sinks, window) are ignored.
        block_size: tokens per block, ``>= 1``; seq_len: tokens, with ``n = ceil(seq_len / block_size)``.
        sinks, window, budget: ints ``>= 0``.

    Returns:
        A :class:`~topo_attn.BlockSchedule` on the scores' device.

    Raises:
        TypeError: ``budget`` is not an int.
        ValueError: ``budget < 0``, or ``n`` does not match ``seq_len`` and ``block_size`` (as
        :meth:`~topo_attn.BlockSchedule.from_block_mask` raises).
    """
    budget = check_int("budget", budget, 0)
    nb = scores.shape[-1]
    base = base_block_mask(nb, sinks, window, scores.device)
    causal = torch.ones(nb, nb, dtype=torch.bool, device=scores.device).tril()
    mask = base | choose_blocks(scores, causal & ~base, budget)
    return BlockSchedule.from_block_mask(mask, block_size, seq_len)


def rank_candidates(scores: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """The block indices of each row, best-scored candidate first (ties to the lower block index; a ``-inf``
    score still ranks before every non-candidate), then the non-candidates.

    Arguments:
        scores: real ``[..., c, n]``; candidates: bool ``[c, n]`` (or broadcastable).

    Returns:
        int64 ``[..., c, n]``.
    """
    lowest = torch.finfo(torch.float64).min
    masked = scores.to(torch.float64).clamp(min=lowest).masked_fill(~candidates, float("-inf"))
    return torch.sort(masked, dim=-1, descending=True, stable=True).indices


def choose_blocks(scores: torch.Tensor, candidates: torch.Tensor, budget: int) -> torch.Tensor:
    """The ``budget`` highest-scored candidates of each row (all of them when fewer; ties to the lower block
    index; a ``-inf`` score still beats a non-candidate; :func:`rank_candidates`).

    Arguments:
        scores: real ``[..., c, n]``; candidates: bool ``[c, n]`` (or broadcastable); budget: int ``>= 0``.

    Returns:
        bool ``[..., c, n]``.
    """
    chosen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    take = min(budget, scores.shape[-1])
    if take:
        order = rank_candidates(scores, candidates)[..., :take]
        chosen.scatter_(-1, order, torch.gather(candidates.expand(scores.shape), -1, order))
    return chosen


# ------------------------------------------------------------------------------------------------ scores
def _lanes(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as ``[B, H, S, D]`` with the key heads expanded to the query heads."""
    if q.ndim == 2:
        return q[None, None], k[None, None]
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q, k


def _shape_scores(scores: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Lane scores ``[B, H, n, n]`` as ``[n, n]`` for ``[S, D]`` inputs."""
    return scores[0, 0] if q.ndim == 2 else scores


def window_scores(q, k, block_size, **_) -> torch.Tensor:
    """All zeros (the window selector adds no blocks): float64 ``[..., n, n]``."""
    nb = num_blocks(q.shape[-2], block_size)
    return torch.zeros(*q.shape[:-2], nb, nb, dtype=torch.float64, device=q.device)


def random_scores(q, k, block_size, seed: int = 0, **_) -> torch.Tensor:
    """Uniform random scores from a CPU generator seeded with ``seed``: float64 ``[..., n, n]``."""
    nb = num_blocks(q.shape[-2], block_size)
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(*q.shape[:-2], nb, nb, generator=gen, dtype=torch.float64).to(q.device)


def topology_scores(q, k, block_size, **_) -> torch.Tensor:
    """The elder-rule salience of each key block (:func:`~topo_attn.block_salience` of the key-block
    centroids), the same for every row: ``[..., n, n]``."""
    q4, k4 = _lanes(q, k)
    sal = block_salience(block_centroids(k4.detach(), block_size))  # [B, H, n]
    return _shape_scores(sal[..., None, :].expand(*sal.shape[:-1], sal.shape[-1], sal.shape[-1]), q)


def centroid_scores(q, k, block_size, **_) -> torch.Tensor:
    """``mean(q of query block) . mean(k of key block)``, float64 ``[..., n, n]``."""
    q4, k4 = _lanes(q, k)
    qc, kc = block_centroids(q4.detach(), block_size), block_centroids(k4.detach(), block_size)
    return _shape_scores(qc @ kc.transpose(-1, -2), q)


def key_block_bounds(k: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The element-wise minimum and maximum of the keys of each key block (a partial last block: its real
    rows), from the detached keys ``[..., S, D]``: float64 ``(lo, hi)``, ``[..., n, D]`` each."""
    seq = k.shape[-2]
    nb = num_blocks(seq, block_size)
    pad = nb * block_size - seq
    keys = k.detach().to(torch.float64)
    # padding rows never win the min or the max
    hi = torch.nn.functional.pad(keys, (0, 0, 0, pad), value=float("-inf")).unflatten(-2, (nb, block_size))
    lo = torch.nn.functional.pad(keys, (0, 0, 0, pad), value=float("inf")).unflatten(-2, (nb, block_size))
    return lo.amin(-2), hi.amax(-2)


def quest_scores(q, k, block_size, **_) -> torch.Tensor:
    """Quest's page bound (Tang et al. 2024): with ``m[kb]`` and ``M[kb]`` the element-wise minimum and maximum
    of the keys of key block ``kb`` (a partial last block: its real rows), the score of ``[qb, kb]`` is the
    largest, over the queries of query block ``qb`` (a partial last block: its real rows), of
    ``sum_i max(q_i M_i, q_i m_i) = relu(q) . M + min(q, 0) . m``: an upper bound on every ``q . k`` of the
    tile. Float64 ``[..., n, n]`` from the detached inputs; per lane ``O(S (n + D))`` memory (float64 copies of
    q and k, the bounds ``[S, n]`` from two products ``[S, D] x [D, n]``; no ``[S, n, D]`` intermediate; the key
    bounds are taken per key head and then expanded to the query heads)."""
    bs = block_size
    seq = q.shape[-2]
    nb = num_blocks(seq, bs)
    pad = nb * bs - seq
    lo, hi = key_block_bounds(k, bs)  # per key head
    q4, hi4 = _lanes(q, hi)  # the key heads' bounds expanded to the query heads
    _, lo4 = _lanes(q, lo)
    q4 = q4.detach().to(torch.float64)
    bound = q4.clamp(min=0) @ hi4.transpose(-1, -2) + q4.clamp(max=0) @ lo4.transpose(-1, -2)  # [B, H, S, n]
    # the largest bound over each query block's real rows
    bound = torch.nn.functional.pad(bound, (0, 0, 0, pad), value=float("-inf"))
    return _shape_scores(bound.unflatten(-2, (nb, bs)).amax(-2), q)


def mst_clusters(centroids: torch.Tensor, clusters: int) -> np.ndarray:
    """The clusters left when the minimum spanning tree of the centroids is cut at its ``clusters - 1`` longest
    edges: single-linkage clusters, the components of the 0-dimensional persistence at that scale.

    Arguments:
        centroids: real ``[n, D]``, finite (as :func:`~topo_attn.minimum_spanning_tree` takes them).
        clusters: wanted cluster count, clamped to ``1..n``.

    Returns:
        int64 labels ``[n]``, ``0..c-1`` numbered in order of each cluster's first block.
    """
    n = centroids.shape[0]
    clusters = max(1, min(clusters, n))
    edges, lengths = minimum_spanning_tree(centroids)
    keep = np.ones(len(edges), dtype=bool)
    if clusters > 1:
        keep[np.argsort(-lengths, kind="stable")[:clusters - 1]] = False
    parent = np.arange(n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in edges[keep]:
        parent[find(int(i))] = find(int(j))
    roots = np.array([find(i) for i in range(n)])
    _, labels = np.unique(roots, return_inverse=True)
    first = {}
    for lab in labels:
        first.setdefault(int(lab), len(first))
    return np.array([first[int(lab)] for lab in labels], dtype=np.int64)


def _cluster_parts(q, k, block_size, clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per lane, the centroid score ``[B, H, n, n]`` and each key block's cluster score ``[B, H, n, n]``."""
    q4, k4 = _lanes(q, k)
    qc, kc = block_centroids(q4.detach(), block_size), block_centroids(k4.detach(), block_size)
    block_score = qc @ kc.transpose(-1, -2)
    b, h, nb, _ = kc.shape
    cluster_score = torch.empty_like(block_score)
    for bi in range(b):
        for hi in range(h):
            labels = torch.from_numpy(mst_clusters(kc[bi, hi], clusters)).to(kc.device)
            count = int(labels.max()) + 1
            sums = torch.zeros(count, kc.shape[-1], dtype=kc.dtype, device=kc.device).index_add_(0, labels, kc[bi, hi])
            centre = sums / torch.bincount(labels, minlength=count)[:, None].to(kc.dtype)
            cluster_score[bi, hi] = (qc[bi, hi] @ centre.T)[:, labels]
    return block_score, cluster_score


def cluster_scores(q, k, block_size, clusters: int = 4, **_) -> torch.Tensor:
    """Blocks of the best-scored persistence clusters (:func:`mst_clusters`) first; the centroid score orders
    blocks inside a cluster. Returned as ranks (higher is better), float64 ``[..., n, n]``."""
    block_score, cluster_score = _cluster_parts(q, k, block_size, clusters)
    # lexicographic: sort by the block score, then stably by the cluster score
    first = torch.sort(block_score, dim=-1, stable=True).indices
    second = torch.sort(torch.gather(cluster_score, -1, first), dim=-1, stable=True).indices
    order = torch.gather(first, -1, second)  # ascending
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device)
                                             .expand_as(order).contiguous())
    return _shape_scores(ranks.to(torch.float64), q)


def cluster_centroid_scores(q, k, block_size, clusters: int = 4, **_) -> torch.Tensor:
    """The centroid score plus the score of the block's persistence cluster, float64 ``[..., n, n]``."""
    block_score, cluster_score = _cluster_parts(q, k, block_size, clusters)
    return _shape_scores(block_score + cluster_score, q)


def oracle_scores(q, k, block_size, scale: float | None = None, chunk: int = DEFAULT_CHUNK, **_) -> torch.Tensor:
    """The true attention mass of each (query block, key block),
    :func:`~topo_attn.selection.metrics.block_attention_mass`: float64 ``[..., n, n]``."""
    return block_attention_mass(q, k, block_size, scale, chunk)


SELECTORS: dict[str, Callable[..., torch.Tensor]] = {
    "window": window_scores,
    "random": random_scores,
    "topology_22": topology_scores,  # scores unused: select() builds #22's rule itself
    "topology": topology_scores,
    "centroid": centroid_scores,
    "quest": quest_scores,
    "cluster": cluster_scores,
    "cluster_centroid": cluster_centroid_scores,
    "oracle": oracle_scores,
}
"""Selector names and their block-score functions ``f(q, k, block_size, **options) -> [..., n, n]``."""

DESCRIPTIONS = {
    "window": "sinks and window only (no extra blocks)",
    "random": "uniform random blocks (seeded)",
    "topology_22": "#22's rule: one global top-k of the elder-rule salience per lane (visits fewer blocks)",
    "topology": "the elder-rule salience, top-budget per row among the causal blocks outside sinks/window",
    "centroid": "mean-pooled query of the query block . key-block centroid",
    "quest": "Quest's page bound: max over the block's queries of relu(q) . max(keys) + min(q, 0) . min(keys)",
    "cluster": "persistence clusters (MST cut at its longest edges) ranked by query . cluster centroid, "
               "then blocks by the centroid score",
    "cluster_centroid": "centroid score + the score of the block's persistence cluster",
    "oracle": "the true attention mass of each block (an upper bound at equal budget)",
}
"""One line per selector, for tables."""

TOPOLOGY_AWARE = ("topology_22", "topology", "cluster", "cluster_centroid")
"""The selectors that use the key blocks' persistence (salience or clusters)."""

QUERY_AWARE = ("centroid", "quest", "cluster", "cluster_centroid", "oracle")
"""The selectors that read the queries."""


def previous_row_scores(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` (``[..., n, n]``) with each row ``qb >= 1`` replaced by row ``qb - 1`` (row 0 kept: it has
    no block to add). A row's choice then depends only on the queries of the query block before it, and, with
    a window of at least one block, only on key blocks that end before it: no query's schedule depends on a
    later token (see ``strict`` in :func:`select`)."""
    out = scores.clone()
    out[..., 1:, :] = scores[..., :-1, :]
    return out


def select(name: str, q: torch.Tensor, k: torch.Tensor, block_size: int, sinks: int = 1, window: int = 1,
           budget: int = 4, strict: bool = False, q_len: int | None = None, **options) -> BlockSchedule:
    """The schedule of selector ``name`` (see :data:`SELECTORS` and the module docstring).

    Arguments:
        name: a key of :data:`SELECTORS`.
        q, k: floating ``[S, D]`` each (shared schedule), or ``q [B, H, S, D]`` and ``k [B, H_kv, S, D]`` with
            ``H % H_kv == 0`` (one row-set per query head); same dtype and device.
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
        options: ``seed`` (random), ``clusters`` (cluster selectors), ``scale`` and ``chunk`` (oracle).

    Returns:
        A :class:`~topo_attn.BlockSchedule` on q's device: shared for ``[S, D]`` inputs, ``lanes == (B, H)``
        otherwise.

    Raises:
        ValueError: an unknown selector name, or a negative size or bad shapes, or ``strict`` with
            ``"topology_22"``.
        TypeError: a non-int size, or bad dtypes.
    """
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; expected one of {sorted(SELECTORS)}")
    check_qkv(q, k, k)
    block_size = check_int("block_size", block_size, 1)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    seq = q.shape[-2]
    if strict and name == "topology_22":
        raise ValueError("strict selection needs row scores; selector 'topology_22' has none")
    if name == "topology_22":
        q4, k4 = _lanes(q, k)
        return topology_schedule(k if q.ndim == 2 else k4, block_size, window, sinks, budget, q_len=q_len)
    if name == "window":
        budget = 0
    scores = SELECTORS[name](q, k, block_size, **options)
    if strict:
        scores = previous_row_scores(scores)
    schedule = schedule_from_scores(scores, block_size, seq, sinks, window, budget)
    return schedule if q_len is None else schedule.for_queries(q_len)
