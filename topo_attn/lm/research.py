"""``python -m topo_attn.lm research``: topology-aware selectors tried on the kit's LM, against the query-aware
baselines, at equal budget.

Every selector here is a score function ``f(q, k, block_size, **options) -> float64 [B, H, n, n]`` (the
convention of :mod:`topo_attn.selection.selectors`; ``[qb, kb]`` scores key block ``kb`` for query block
``qb``, higher is better) turned into a schedule by :func:`~topo_attn.selection.schedule_from_scores`, so each
visits exactly the sinks, the window and ``budget`` more causal blocks per row, as many as ``centroid``. Inputs
are ``q [B, H, S, D]`` and ``k [B, H_kv, S, D]`` (grouped-query attention: what is computed per key head is
shared by the query heads of its group).

The **prefix trees** of a key head (:func:`prefix_trees`): for each query block ``qb``, the minimum spanning
tree of the key-block centroids ``0..qb`` only (the 0-dimensional persistence of the Rips filtration of the
prefix cloud; no future block), and the elder-rule salience of each of its blocks
(:func:`~topo_attn.topology.persistence.elder_salience`, the definition of ``topology``).

The ideas:

- ``topology_causal`` (query-blind, causal): the elder-rule salience of key block ``kb`` in the prefix tree of
  ``qb``;
- ``centroid_salience``: ``z(centroid) + lam * z(topology_causal)``;
- ``score_persistence``: the centroid scores of row ``qb`` as a function on the prefix tree of ``qb``; its
  superlevel-set 0-dimensional persistence gives each local maximum a bar (its score minus the score at which
  its component joins one with a higher maximum, the elder rule; the global maximum: its score minus the
  lowest), every other block 0 (:func:`tree_superlevel_persistence`); the score is
  ``z(centroid) + lam * z(bar)``;
- ``quest_mst``: ``quest + lam * (mean quest score of the block's neighbours in the prefix tree)``.

``z`` standardises each row over its causal blocks (:func:`causal_zscore`). ``lam`` is chosen per layer from
a grid (:data:`LAMBDAS`) by the mean recall at the tuning budget on **training** documents (the corpus'
training split, :func:`training_documents`), never on the evaluation documents, which are read only after the
tuning. Baselines (``random``, ``topology``, ``centroid``, ``quest``, ``oracle``) are the score functions of
:data:`topo_attn.selection.SELECTORS`, through the same path.

**Recall** (:func:`mean_recall`): the share of each query's causal softmax mass inside its scheduled keys,
averaged over queries (the definition of :func:`~topo_attn.selection.schedule_quality`), computed from the
true block mass (:func:`~topo_attn.selection.block_attention_mass`, which the oracle ranks by), for all rows
and for the late rows (query blocks starting at or after half the length).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import cli
from .._checks import check_int, check_qkv
from ..provenance import run_record
from ..schedule import num_blocks
from ..selection import block_scores, schedule_from_scores
from ..topology import block_centroids
from ..topology.persistence import centroid_distances, check_centroids, elder_salience, merge_order, prim_tree
from .corpus import documents, find_sources, pack, split_sources
from .results import LM_RESEARCH_SUITE
from .study import (DEFAULT_MODEL, capture_qkv, check_device, check_eval_set, check_model_folder, eval_set_path,
                    load_documents, load_model)

PROG = "python -m topo_attn.lm research"
LAMBDAS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, -0.25)
"""The grid of ``lam`` tried per layer (ties go to the earlier value, so 0 wins a tie)."""

BASELINES = ("random", "topology", "centroid", "quest", "oracle")
"""Selectors of :data:`topo_attn.selection.SELECTORS` run beside the ideas."""


def head_scores(name: str, q: torch.Tensor, k: torch.Tensor, block_size: int, **options) -> torch.Tensor:
    """The float64 block scores of selector ``name`` per query head, ``[B, H, n, n]``
    (:func:`~topo_attn.selection.block_scores` with ``per_query_head=True``), the ideas' convention."""
    return block_scores(name, q, k, block_size, per_query_head=True, dtype=torch.float64, **options)

TUNED = ("centroid_salience", "score_persistence", "quest_mst")
"""The ideas with a ``lam`` tuned per layer."""

IDEAS = ("topology_causal",) + TUNED
"""The topology-aware ideas of this module."""


# ------------------------------------------------------------------------------------------ prefix trees
@dataclass(frozen=True)
class PrefixTrees:
    """Per key head and query block ``qb``, the minimum spanning tree of the key-block centroids ``0..qb``.

    ``salience``: float64 ``[B, H_kv, n, n]``, ``[..., qb, kb]`` the elder-rule salience of block ``kb`` in the
    tree of ``qb`` (0 for ``kb > qb``). ``adjacency``: bool ``[B, H_kv, n, n, n]``, ``[..., qb, i, j]`` whether
    ``(i, j)`` is an edge of the tree of ``qb`` (symmetric; ``i, j <= qb``)."""

    salience: torch.Tensor
    adjacency: torch.Tensor


def prefix_trees(centroids: torch.Tensor) -> PrefixTrees:
    """The :class:`PrefixTrees` of centroids ``[..., n, D]`` (float64 distances, Prim and the elder rule of
    :mod:`topo_attn.topology.persistence` on each prefix; numpy, ``O(n^3)`` per lane).

    The tree of a prefix is :func:`~topo_attn.topology.persistence.prim_tree` of the prefix's distances, so the
    salience row ``qb`` equals :func:`~topo_attn.topology.persistence.lane_saliences` of ``centroids[..., :qb +
    1, :]``.

    Returns:
        :class:`PrefixTrees` with leading dimensions ``centroids.shape[:-2]``, on the centroids' device.

    Raises:
        TypeError, ValueError: non-floating, non-finite or block-less centroids.
    """
    centroids = check_centroids(centroids, batched=True)
    n, dim = centroids.shape[-2], centroids.shape[-1]
    flat = centroids.detach().reshape(-1, n, dim).to("cpu", torch.float64)
    salience = np.zeros((flat.shape[0], n, n))
    adjacency = np.zeros((flat.shape[0], n, n, n), dtype=bool)
    for lane in range(flat.shape[0]):
        dist = centroid_distances(flat[lane])
        for m in range(1, n + 1):
            edges, lengths = prim_tree(dist[:m, :m])
            order = merge_order(edges, lengths)
            salience[lane, m - 1, :m] = elder_salience(m, edges[order], lengths[order])
            adjacency[lane, m - 1, edges[:, 0], edges[:, 1]] = True
            adjacency[lane, m - 1, edges[:, 1], edges[:, 0]] = True
    lead = centroids.shape[:-2]
    return PrefixTrees(torch.from_numpy(salience).reshape(*lead, n, n).to(centroids.device),
                       torch.from_numpy(adjacency).reshape(*lead, n, n, n).to(centroids.device))


def key_prefix_trees(k: torch.Tensor, block_size: int) -> PrefixTrees:
    """:func:`prefix_trees` of the float64 key-block centroids of ``k [B, H_kv, S, D]``."""
    return prefix_trees(block_centroids(k.detach(), block_size))


# ------------------------------------------------------------------------------- superlevel persistence
UNREACHED = -torch.finfo(torch.float64).max
"""Prim's key of a vertex no tree edge reaches yet (above the ``-inf`` of the vertices already taken)."""


def prim_order(values: torch.Tensor, adjacency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prim's order of the maximum spanning tree of each graph for edge weights ``min(f(i), f(j))``, started at
    the highest vertex (the first on ties); the highest-weight edge leaving the tree next (the lowest vertex on
    ties). For a tree this visits its own edges; vertices ``-inf`` and unreached come last, by index.

    Arguments:
        values: float64 ``[P, m]``, ``-inf`` for padding vertices.
        adjacency: bool ``[P, m, m]``, symmetric.

    Returns:
        ``order`` int64 ``[P, m]`` (the vertex taken at each step) and ``weight`` float64 ``[P, m]`` (the
        weight of the edge that took it; ``+inf`` at step 0). For ``i < j`` the weakest edge weight of the tree
        path between ``order[i]`` and ``order[j]`` is ``min(weight[i + 1..j])`` (the maximin property of
        Prim's order).
    """
    count, m = values.shape
    rows = torch.arange(count, device=values.device)
    taken = torch.zeros(count, m, dtype=torch.bool, device=values.device)
    best = torch.full((count, m), UNREACHED, dtype=torch.float64, device=values.device)
    order = torch.empty(count, m, dtype=torch.int64, device=values.device)
    weight = torch.full((count, m), float("inf"), dtype=torch.float64, device=values.device)
    vertex = values.argmax(-1)
    for step in range(m):
        if step:
            vertex = best.argmax(-1)
            weight[:, step] = best[rows, vertex]
        order[:, step] = vertex
        taken[rows, vertex] = True
        reach = adjacency[rows, vertex] & ~taken
        through = torch.minimum(values[rows, vertex][:, None], values)
        best = torch.where(reach, torch.maximum(best, through), best)
        best[rows, vertex] = float("-inf")
    return order, weight


def tree_superlevel_persistence(values: torch.Tensor, adjacency: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The 0-dimensional persistence of the superlevel sets of ``values`` on each tree, per vertex.

    Vertices enter from the highest value down; an edge enters with its lower vertex. When two components
    meet, the one with the lower maximum dies (the elder rule; on equal values the lower vertex index is the
    elder). A local maximum ``v`` gets ``values[v] - d`` with ``d`` the value at which its component first
    holds a higher vertex, i.e. the largest, over higher vertices ``u``, of the lowest value on the tree path
    ``v .. u``; the global maximum gets its value minus the lowest; every other vertex 0. (gudhi's
    ``SimplexTree`` with vertex filtration ``-values`` and edges at the larger of their vertices' filtrations
    gives the same bars.)

    Arguments:
        values: real ``[P, m]``; only entries where ``real`` is True are read, finite there.
        adjacency: bool ``[P, m, m]``, symmetric; over the real vertices of each problem a spanning tree, no
            edge touching another vertex.
        real: bool ``[P, m]``, at least one True per problem.

    Returns:
        float64 ``[P, m]`` (>= 0; 0 for vertices not real), on ``values``' device.

    Raises:
        ValueError: shapes that do not match.
    """
    if values.ndim != 2 or adjacency.shape != (*values.shape, values.shape[-1]) or real.shape != values.shape:
        raise ValueError(f"expected values [P, m], adjacency [P, m, m] and real [P, m], got "
                         f"{tuple(values.shape)}, {tuple(adjacency.shape)} and {tuple(real.shape)}")
    vals = values.to(torch.float64).masked_fill(~real, float("-inf"))
    m = vals.shape[-1]
    order, weight = prim_order(vals, adjacency)
    # weakest[i, j]: the weakest path weight between the vertices taken at steps i and j
    later = torch.ones(m, m, dtype=torch.bool, device=vals.device).triu(1)
    weakest = torch.where(later, weight[:, None, :], float("inf")).cummin(-1).values
    weakest = torch.minimum(weakest, weakest.transpose(-1, -2))
    fo, real_o = vals.gather(-1, order), real.gather(-1, order)
    higher = (fo[:, None, :] > fo[:, :, None]) | ((fo[:, None, :] == fo[:, :, None])
                                                  & (order[:, None, :] < order[:, :, None]))
    death = torch.where(higher & real_o[:, None, :], weakest, float("-inf")).amax(-1)
    lowest = vals.masked_fill(~real, float("inf")).amin(-1, keepdim=True)
    death = torch.where(death == float("-inf"), lowest, death)  # the global maximum
    bars = (fo - death).masked_fill(~real_o, 0.0)
    return torch.zeros_like(bars).scatter_(-1, order, bars)


# ------------------------------------------------------------------------------------- score functions
def causal_zscore(scores: torch.Tensor) -> torch.Tensor:
    """Each row ``qb`` of ``scores [..., n, n]`` standardised over its causal blocks ``kb <= qb`` (mean 0,
    population standard deviation 1; a constant row becomes 0), 0 for ``kb > qb``: float64, same shape."""
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    count = causal.sum(-1, keepdim=True).to(torch.float64)
    x = scores.to(torch.float64).masked_fill(~causal, 0.0)
    dev = (x - x.sum(-1, keepdim=True) / count).masked_fill(~causal, 0.0)
    std = torch.sqrt((dev ** 2).sum(-1, keepdim=True) / count)
    return dev / torch.where(std > 0, std, torch.ones_like(std))


def _tree_parts(q: torch.Tensor, k: torch.Tensor, block_size: int,
                trees: PrefixTrees | None) -> tuple[int, PrefixTrees]:
    """The group size of ``q [B, H, S, D]`` over ``k [B, H_kv, S, D]`` and the keys' prefix trees (``trees``
    when given, checked against the keys' shape)."""
    shape = check_qkv(q, k, k)
    if shape.rank != 4:
        raise ValueError(f"q and k must have shape [B, H, S, D] and [B, H_kv, S, D], got {tuple(q.shape)}")
    block_size = check_int("block_size", block_size, 1)
    if trees is None:
        trees = key_prefix_trees(k, block_size)
    nb = num_blocks(shape.seq_len, block_size)
    if trees.salience.shape != (shape.batch, shape.kv_heads, nb, nb):
        raise ValueError(f"trees must be for [{shape.batch}, {shape.kv_heads}] key heads of {nb} blocks, got "
                         f"salience of shape {tuple(trees.salience.shape)}")
    return shape.heads // shape.kv_heads, trees


def topology_causal_scores(q, k, block_size, trees: PrefixTrees | None = None, **_) -> torch.Tensor:
    """Query-blind and causal: ``[..., qb, kb]`` is the elder-rule salience of key block ``kb`` in the prefix
    tree of ``qb`` (:func:`prefix_trees`; ``trees`` of ``k`` when already computed), 0 for ``kb > qb``.
    Float64 ``[B, H, n, n]`` on q's device."""
    group, trees = _tree_parts(q, k, block_size, trees)
    return trees.salience.repeat_interleave(group, dim=1).to(q.device)


def centroid_salience_terms(q, k, block_size, trees: PrefixTrees | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z(centroid), z(topology_causal))``, float64 ``[B, H, n, n]`` each."""
    return (causal_zscore(head_scores("centroid", q, k, block_size)),
            causal_zscore(topology_causal_scores(q, k, block_size, trees)))


def score_persistence_terms(q, k, block_size, trees: PrefixTrees | None = None,
                            chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z(centroid), z(bar))``: ``bar[..., qb, kb]`` is :func:`tree_superlevel_persistence` of the centroid
    scores of row ``qb`` on the prefix tree of ``qb`` (blocks ``0..qb``), computed ``chunk`` rows at a time.
    Float64 ``[B, H, n, n]`` each."""
    group, trees = _tree_parts(q, k, block_size, trees)
    scores = head_scores("centroid", q, k, block_size)
    nb = scores.shape[-1]
    adjacency = trees.adjacency.to(q.device).repeat_interleave(group, dim=1).reshape(-1, nb, nb)
    causal = torch.ones(nb, nb, dtype=torch.bool, device=q.device).tril().expand(scores.shape).reshape(-1, nb)
    flat = scores.reshape(-1, nb)
    bars = torch.cat([tree_superlevel_persistence(flat[s:s + chunk], adjacency[s:s + chunk], causal[s:s + chunk])
                      for s in range(0, flat.shape[0], chunk)])
    return causal_zscore(scores), causal_zscore(bars.reshape(scores.shape))


def quest_mst_terms(q, k, block_size, trees: PrefixTrees | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(quest, mean quest score of the block's neighbours in the prefix tree of the row)`` (0 for a block
    without neighbours), float64 ``[B, H, n, n]`` each."""
    group, trees = _tree_parts(q, k, block_size, trees)
    quest = head_scores("quest", q, k, block_size)
    b, h, nb, _ = quest.shape
    adjacency = trees.adjacency.to(q.device, torch.float64)  # [B, H_kv, qb, i, j]
    grouped = quest.reshape(b, h // group, group, nb, nb)
    total = torch.einsum("bgqij,bgrqj->bgrqi", adjacency, grouped)
    degree = adjacency.sum(-1)[:, :, None]  # [B, H_kv, 1, qb, i]
    return quest, (total / degree.clamp_min(1.0)).reshape(b, h, nb, nb)


def combine(terms: tuple[torch.Tensor, torch.Tensor], lam: float) -> torch.Tensor:
    """``base + lam * extra`` for ``terms = (base, extra)``."""
    base, extra = terms
    return base + lam * extra


TERMS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "centroid_salience": centroid_salience_terms,
    "score_persistence": score_persistence_terms,
    "quest_mst": quest_mst_terms,
}
"""The two terms ``(base, extra)`` of each tuned idea, ``f(q, k, block_size, trees=None)``."""


def tuned_scores(name: str) -> Callable[..., torch.Tensor]:
    """The score function of tuned idea ``name``: ``f(q, k, block_size, lam=0.25, trees=None, **_)`` is
    :func:`combine` of its :data:`TERMS` with ``lam`` (0.25 untuned; the driver tunes it per layer)."""
    def scores(q, k, block_size, lam: float = 0.25, trees: PrefixTrees | None = None, **_) -> torch.Tensor:
        return combine(TERMS[name](q, k, block_size, trees), lam)

    scores.__name__ = f"{name}_scores"
    return scores


RESEARCH_SELECTORS: dict[str, Callable[..., torch.Tensor]] = {
    "topology_causal": topology_causal_scores, **{name: tuned_scores(name) for name in TUNED}}
"""The ideas' score functions ``f(q, k, block_size, **options) -> float64 [B, H, n, n]``."""


# --------------------------------------------------------------------------------------------- recall
def mean_recall(mass: torch.Tensor, mask: torch.Tensor, block_size: int, seq_len: int, start: int = 0) -> torch.Tensor:
    """Per lane, the mean over the queries of the query blocks whose first position is ``>= start`` of the
    share of each query's causal softmax mass inside its scheduled key blocks: the recall of
    :func:`~topo_attn.selection.schedule_quality` (which is this with ``start = 0``).

    Arguments:
        mass: float64 ``[..., n, n]``, :func:`~topo_attn.selection.block_attention_mass`.
        mask: bool ``[..., n, n]``, the schedule's block mask (:meth:`~topo_attn.BlockSchedule.to_block_mask`).
        block_size, seq_len: the blocks' size and the tokens, ``n = ceil(seq_len / block_size)``.
        start: first query position counted, ``0 <= start < seq_len``.

    Returns:
        float64 ``[...]``.

    Raises:
        ValueError: ``start`` outside ``0..seq_len - 1``.
    """
    if not 0 <= start < seq_len:
        raise ValueError(f"start must be in 0..{seq_len - 1}, got {start}")
    nb = mass.shape[-1]
    first = torch.arange(nb, device=mass.device) * block_size
    queries = (torch.clamp(first + block_size, max=seq_len) - first).to(torch.float64)
    counted = first >= start
    kept = (mass * mask).sum(-1)
    return kept[..., counted].sum(-1) / queries[counted].sum()


@dataclass(frozen=True)
class Settings:
    """What a run measures: documents of ``length`` tokens in blocks of ``block_size``, schedules with
    ``sinks`` and ``window`` plus ``budgets`` extra blocks, ``lam`` tuned at ``tune_budget`` over ``lambdas``;
    ``seed`` for ``random`` and for the choice of training files."""

    length: int = 8192
    block_size: int = 64
    sinks: int = 1
    window: int = 1
    budgets: tuple[int, ...] = (2, 6, 14, 30)
    tune_budget: int = 6
    lambdas: tuple[float, ...] = LAMBDAS
    seed: int = 0

    @property
    def late_start(self) -> int:
        """The first position of the late rows: half the length."""
        return self.length // 2


def schedule_recall(mass: torch.Tensor, scores: torch.Tensor, budget: int, settings: Settings) -> dict:
    """The schedule :func:`~topo_attn.selection.schedule_from_scores` builds from ``scores [B, H, n, n]`` at
    ``budget``: ``{"all": [B * H], "late": [B * H]}`` recall (float64, :func:`mean_recall`) and
    ``"blocks"``, its blocks per row."""
    mask = schedule_from_scores(scores, settings.block_size, settings.length, settings.sinks, settings.window,
                                budget).to_block_mask()
    return {"all": mean_recall(mass, mask, settings.block_size, settings.length).reshape(-1),
            "late": mean_recall(mass, mask, settings.block_size, settings.length,
                                settings.late_start).reshape(-1),
            "blocks": mask.sum(-1).to(torch.float64).mean()}


# ---------------------------------------------------------------------------------------------- parts
@dataclass
class LayerParts:
    """What one layer of one document contributes: ``mass`` (float64 ``[B, H, n, n]``, the true block mass,
    also the oracle's scores), ``scores`` of the selectors without ``lam`` and ``terms`` of the tuned ones."""

    mass: torch.Tensor
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    terms: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def layer_parts(q: torch.Tensor, k: torch.Tensor, settings: Settings) -> LayerParts:
    """:class:`LayerParts` of ``q [B, H, S, D]`` and ``k [B, H_kv, S, D]``: the baselines through
    :data:`~topo_attn.selection.SELECTORS`, the ideas through :data:`RESEARCH_SELECTORS` and :data:`TERMS`
    (the prefix trees computed once)."""
    bs = settings.block_size
    mass = head_scores("oracle", q, k, bs)
    parts = LayerParts(mass, {"oracle": mass})
    for name in BASELINES:
        if name != "oracle":
            parts.scores[name] = head_scores(name, q, k, bs, seed=settings.seed)
    trees = key_prefix_trees(k, bs)
    parts.scores["topology_causal"] = RESEARCH_SELECTORS["topology_causal"](q, k, bs, trees=trees)
    for name in TUNED:
        parts.terms[name] = TERMS[name](q, k, bs, trees)
    return parts


def document_parts(model, doc: np.ndarray, settings: Settings) -> dict[int, LayerParts]:
    """Per layer index, the :class:`LayerParts` of the model's own queries and keys on ``doc`` (``uint8
    [length]``), captured by :func:`.study.capture_qkv`."""
    captured = capture_qkv(model, torch.from_numpy(doc.astype(np.int64))[None])
    return {layer: layer_parts(q, k, settings) for layer, (q, k, _) in sorted(captured.items())}


# ------------------------------------------------------------------------------------ tuning and rows
def tune_lambda(parts: list[LayerParts], name: str, settings: Settings) -> tuple[float, dict[float, float]]:
    """The ``lam`` of :attr:`Settings.lambdas` with the highest mean recall (all rows, all lanes of all
    ``parts``) of tuned idea ``name`` at :attr:`Settings.tune_budget` (ties to the earlier value), and the
    mean recall of each."""
    recall = {}
    for lam in settings.lambdas:
        values = [schedule_recall(p.mass, combine(p.terms[name], lam), settings.tune_budget, settings)["all"]
                  for p in parts]
        recall[lam] = float(torch.cat(values).mean())
    best = max(settings.lambdas, key=lambda lam: recall[lam])  # the first of equal maxima
    return best, recall


def tune_lambdas(train_parts: list[dict[int, LayerParts]], settings: Settings) -> tuple[dict, dict]:
    """Per tuned idea and layer, :func:`tune_lambda` over the training documents' parts: ``({name: {layer:
    lam}}, {name: {layer: {lam: recall}}})``."""
    lambdas, tuning = {}, {}
    for name in TUNED:
        lambdas[name], tuning[name] = {}, {}
        for layer in sorted(train_parts[0]):
            lambdas[name][layer], tuning[name][layer] = tune_lambda([d[layer] for d in train_parts], name, settings)
    return lambdas, tuning


def layer_recalls(parts: LayerParts, lambdas: dict[str, float], settings: Settings) -> dict[tuple[str, int], dict]:
    """``{(selector, budget): schedule_recall(...)}`` of every baseline and idea on one layer, the tuned ideas
    with their ``lambdas`` (``{name: lam}``)."""
    out = {}
    for name in BASELINES + IDEAS:
        scores = parts.scores[name] if name in parts.scores else combine(parts.terms[name], lambdas[name])
        for budget in settings.budgets:
            out[(name, budget)] = schedule_recall(parts.mass, scores, budget, settings)
    return out


def summary_rows(recalls: list[dict[int, dict]], settings: Settings) -> list[dict]:
    """One row per (selector, budget) from per-document ``{layer: layer_recalls(...)}``: the mean recall over
    layers, heads and documents for all rows and the late rows, per layer too, and the blocks per row."""
    rows = []
    layers = sorted(recalls[0])
    for name in BASELINES + IDEAS:
        for budget in settings.budgets:
            per = {part: [torch.cat([d[layer][(name, budget)][part] for d in recalls]).mean().item()
                          for layer in layers] for part in ("all", "late")}
            blocks = float(np.mean([d[layer][(name, budget)]["blocks"].item() for d in recalls for layer in layers]))
            rows.append(dict(selector=name, budget=budget, recall=float(np.mean(per["all"])),
                             late_recall=float(np.mean(per["late"])), recall_per_layer=per["all"],
                             late_recall_per_layer=per["late"], blocks_per_row=blocks))
    return rows


# ------------------------------------------------------------------------------------------- driver
def training_documents(count: int, length: int, seed: int = 0, roots: list | None = None) -> np.ndarray:
    """``count`` documents of ``length`` bytes (``uint8 [count, length]``) from the training split of the
    corpus (:func:`.corpus.find_sources` of ``roots``, :func:`.corpus.split_sources`): training files shuffled
    by ``seed``, the first ones that fill the documents packed (:func:`.corpus.pack`) and cut
    (:func:`.corpus.documents`). Raises ``ValueError`` when the training files are too few."""
    count, length = check_int("count", count, 1), check_int("length", length, 1)
    train, _ = split_sources(find_sources(roots))
    order = np.random.default_rng(seed).permutation(len(train))
    chosen, size = [], 0
    for i in order:
        if size >= count * length:
            break
        chosen.append(train[i])
        size += train[i].size
    return documents(pack(chosen), length, count)


def research(args: argparse.Namespace, argv: list[str] | None = None,
             train_documents: np.ndarray | None = None) -> dict:
    """Everything of the module docstring for parsed ``args``; ``train_documents`` (``uint8 [N, length]``)
    replaces the corpus' training documents. Returns the result dict (also written to ``args.out``)."""
    from tqdm.auto import tqdm

    progress = args.progress  # None: a bar when stderr is a terminal
    started = time.perf_counter()
    settings = Settings(args.length, args.block_size, args.sinks, args.window, tuple(args.budgets), args.tune_budget,
                        tuple(args.lambdas), args.seed)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = load_model(args.model, args.device, dtype)
    if train_documents is None:
        train_documents = training_documents(args.train_documents, settings.length, settings.seed)
    if train_documents.ndim != 2 or train_documents.shape[1] != settings.length:
        raise ValueError(f"train_documents must be [N, {settings.length}], got {train_documents.shape}")
    train_parts = [document_parts(model, doc, settings)
                   for doc in tqdm(train_documents, desc="training documents",
                                   disable=not cli.progress_enabled(progress))]
    lambdas, tuning = tune_lambdas(train_parts, settings)
    del train_parts
    # the evaluation documents are read only now, after the tuning
    eval_docs = load_documents(eval_set_path(args), args.eval_documents, settings.length)
    recalls = []
    for doc in tqdm(eval_docs, desc="evaluation documents", disable=not cli.progress_enabled(progress)):
        parts = document_parts(model, doc, settings)
        recalls.append({layer: layer_recalls(p, {n: lambdas[n][layer] for n in TUNED}, settings)
                        for layer, p in parts.items()})

    result = dict(
        suite=LM_RESEARCH_SUITE, model=str(args.model),
        **run_record(args.device, "python -m topo_attn.lm research " + " ".join(argv or [])),
        settings=dict(asdict(settings), eval_set=str(args.eval_set or Path(args.model) / "eval_set.npz"),
                      eval_documents=len(eval_docs), train_documents=len(train_documents),
                      dtype=str(dtype).removeprefix("torch."), device=args.device),
        rows=summary_rows(recalls, settings),
        lambdas={name: [lambdas[name][layer] for layer in sorted(lambdas[name])] for name in TUNED},
        tuning={name: [{str(lam): r for lam, r in tuning[name][layer].items()} for layer in sorted(tuning[name])]
                for name in TUNED})
    result["seconds"] = time.perf_counter() - started
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


def summary_table(result: dict) -> str:
    """Markdown: one line per selector, one column per budget, cells ``all / late`` mean recall; then the tuned
    ``lam`` per layer."""
    budgets = result["settings"]["budgets"]
    lines = ["| selector | " + " | ".join(f"budget {b}: all / late" for b in budgets) + " |",
             "|" + " --- |" * (len(budgets) + 1)]
    cell = {(r["selector"], r["budget"]): f"{r['recall']:.3f} / {r['late_recall']:.3f}" for r in result["rows"]}
    for name in dict.fromkeys(r["selector"] for r in result["rows"]):
        lines.append(f"| {name} | " + " | ".join(cell[(name, b)] for b in budgets) + " |")
    lines.append("")
    lines += [f"lam per layer, {name}: {values}" for name, values in result["lambdas"].items()]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="model folder (default: data/lm)")
    parser.add_argument("--eval-set", default=None, help="documents .npz (default: <model>/eval_set.npz)")
    parser.add_argument("--eval-documents", type=int, default=4, help="the first N documents of the eval set")
    parser.add_argument("--train-documents", type=int, default=4,
                        help="documents from the corpus' training split, for tuning lam")
    parser.add_argument("--length", type=int, default=8192, help="tokens per document")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 6, 14, 30],
                        help="extra key blocks per query block beyond sinks and window")
    parser.add_argument("--tune-budget", type=int, default=6, help="the budget lam is tuned at")
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS), help="the grid of lam")
    parser.add_argument("--seed", type=int, default=0, help="random's seed and the training files' shuffle")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    cli.add_progress_argument(parser)


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``python -m topo_attn.lm research``'s command line (``add_help=False``: as a parent parser)."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help)


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for parsed ``args`` that :func:`research` would reject late (the
    evaluation set is read after the tuning) or unclearly; the files last."""
    cli.check_at_least("--eval-documents", args.eval_documents, 1)
    cli.check_at_least("--train-documents", args.train_documents, 1)
    cli.check_at_least("--length", args.length, 1)
    cli.check_at_least("--block-size", args.block_size, 1)
    cli.check_at_least("--sinks", args.sinks, 0)
    cli.check_at_least("--window", args.window, 0)
    cli.check_at_least("--budgets", args.budgets, 0, "budget")
    cli.check_at_least("--tune-budget", args.tune_budget, 0)
    check_device("--device", args.device)
    check_model_folder(args.model)
    check_eval_set(args)


def main(argv: list[str] | None = None, train_documents: np.ndarray | None = None) -> int:
    """The command line (``argv`` without ``research``); ``train_documents`` as for :func:`research`. Raises
    :class:`~topo_attn.cli.UsageError` for a bad value (:func:`check_args`) before anything loads."""
    argv = sys.argv[2:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    print(summary_table(research(args, argv, train_documents)))
    return 0
