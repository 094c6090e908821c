"""Selection quality: how much of full causal attention a block schedule keeps, and selectors to compare.

**Metrics** (:func:`schedule_quality`), per lane (batch, head) and aggregated, of a schedule against full
causal attention, both computed by the package reference :func:`~topo_attn.dense_masked_attention` (the
full one with :func:`~topo_attn.dense_causal_schedule`), blockwise over query rows so that ``S = 2k`` fits
on a CPU and ``S = 16k`` on a GPU:

- *recall*: per query, the share of its causal softmax mass that falls inside its scheduled key tokens. It is
  ``exp(lse_schedule - lse_full)`` exactly (both log-sum-exps come from the reference), averaged over queries;
- *rel_l2*: ``||O_schedule - O_full|| / ||O_full||`` over all queries of the lane;
- *cos_err*: the mean over queries of ``1 - cos(o_schedule, o_full)``;
- *lse_err*: the mean over queries of ``lse_full - lse_schedule`` (``>= 0``; equals ``-log recall`` per query).

**Selectors** (:data:`SELECTORS`, :func:`select`): each returns a :class:`~topo_attn.BlockSchedule` (shared
for ``[S, D]`` inputs, one row-set per query head for ``[B, H, S, D]``) with the same ``sinks`` and
``window`` as :func:`~topo_attn.topology_schedule`. The **budget** is the number of extra key blocks per query
block beyond the sinks and the window: each equal-budget selector adds, per row, the ``budget`` best-scored
causal blocks outside the sinks and the window (all of them when fewer exist), so every such selector visits
exactly the same number of blocks in every row. Only ``"topology_22"``, #22's rule itself
(``topology_schedule`` with ``topk=budget``: one global top-k per lane, of which a row keeps only the causal
blocks and which may overlap the sinks and window) visits fewer.

- ``"window"``: sinks and window only (budget ignored);
- ``"random"``: uniform random blocks (seeded);
- ``"topology_22"``: #22's rule, as above; ``"topology"``: the same elder-rule salience at equal budget;
- ``"centroid"``: the mean-pooled query of the query block dotted with each key-block centroid;
- ``"cluster"`` (topology-aware and query-aware): the key-block centroids' minimum spanning tree is cut at its
  ``clusters - 1`` longest edges (the 0-dimensional persistence clusters that live longest); each cluster is
  scored by the query-block centroid against the cluster centroid, blocks of better clusters come first,
  the centroid score orders blocks within a cluster;
- ``"cluster_centroid"`` (topology-aware and query-aware): the centroid score plus the cluster's score, so a
  block is favoured both for its own match and for its cluster's;
- ``"oracle"``: the ``budget`` blocks with the most true attention mass (:func:`block_attention_mass`).
  Among equal-budget selectors it has the highest recall, because recall is additive over blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import check_int, check_qkv
from ..attention import dense_masked_attention
from ..schedule import BlockSchedule, dense_causal_schedule, num_blocks
from ..topology import block_centroids, block_salience, minimum_spanning_tree, topology_schedule

DEFAULT_CHUNK = 256  # query rows per reference call


# ------------------------------------------------------------------------------------------------ metrics
@dataclass(frozen=True)
class Reference:
    """Full causal attention computed once for reuse: ``out [..., S, D]`` and ``lse [..., S]`` (float64)."""

    out: torch.Tensor
    lse: torch.Tensor


@dataclass(frozen=True)
class QualityMetrics:
    """Per-lane metrics ``[L]`` (``L = B * H``, or 1 for ``[S, D]`` inputs); see the module docstring.
    ``recall_min`` is the lowest per-query recall of the lane; ``blocks_per_row`` the mean scheduled blocks per
    query block."""

    recall: torch.Tensor
    recall_min: torch.Tensor
    rel_l2: torch.Tensor
    cos_err: torch.Tensor
    lse_err: torch.Tensor
    blocks_per_row: float

    def summary(self) -> dict[str, float]:
        """Aggregates over lanes: means, and the lowest ``recall_min``."""
        return {"blocks_per_row": self.blocks_per_row, "recall": float(self.recall.mean()),
                "recall_min": float(self.recall_min.min()), "rel_l2": float(self.rel_l2.mean()),
                "cos_err": float(self.cos_err.mean()), "lse_err": float(self.lse_err.mean())}


def _chunks(seq_len: int, chunk: int) -> Iterable[slice]:
    chunk = check_int("chunk", chunk, 1)
    return (slice(s, min(s + chunk, seq_len)) for s in range(0, seq_len, chunk))


def _as64(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(torch.float64) for t in ts)


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, scale: float | None = None,
                   chunk: int = DEFAULT_CHUNK) -> Reference:
    """Full causal attention in float64 by the reference, ``chunk`` query rows at a time."""
    q, k, v = _as64(q, k, v)
    full = dense_causal_schedule(q.shape[-2], block_size, q.device)
    parts = [dense_masked_attention(q, k, v, full, scale, return_lse=True, rows=r) for r in _chunks(q.shape[-2], chunk)]
    return Reference(torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1))


def schedule_quality(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: BlockSchedule,
                     scale: float | None = None, reference: Reference | None = None,
                     chunk: int = DEFAULT_CHUNK) -> QualityMetrics:
    """Metrics of ``schedule`` against full causal attention (``reference``, from :func:`full_attention`,
    computed here when not given). q, k, v as for :func:`~topo_attn.dense_masked_attention`; everything is
    computed in float64, ``chunk`` query rows at a time."""
    shape = check_qkv(q, k, v)
    q, k, v = _as64(q, k, v)
    if reference is None:
        reference = full_attention(q, k, v, schedule.block_size, scale, chunk)
    seq = shape.seq_len
    lanes = shape.batch * shape.heads
    recall_sum = torch.zeros(lanes, dtype=torch.float64, device=q.device)
    recall_min = torch.ones(lanes, dtype=torch.float64, device=q.device)
    diff_sq = torch.zeros_like(recall_sum)
    ref_sq = torch.zeros_like(recall_sum)
    cos_sum = torch.zeros_like(recall_sum)
    lse_sum = torch.zeros_like(recall_sum)
    for rows in _chunks(seq, chunk):
        out, lse = dense_masked_attention(q, k, v, schedule, scale, return_lse=True, rows=rows)
        ref_out = reference.out[..., rows, :].reshape(lanes, -1, shape.head_dim)
        ref_lse = reference.lse[..., rows].reshape(lanes, -1)
        out, lse = out.reshape(lanes, -1, shape.head_dim), lse.reshape(lanes, -1)
        gap = (ref_lse - lse).clamp_min(0.0)  # the schedule's mass is a part of the full mass
        recall = torch.exp(-gap)
        recall_sum += recall.sum(-1)
        recall_min = torch.minimum(recall_min, recall.min(-1).values)
        lse_sum += gap.sum(-1)
        diff_sq += ((out - ref_out) ** 2).sum((-1, -2))
        ref_sq += (ref_out ** 2).sum((-1, -2))
        cos_sum += (1.0 - torch.nn.functional.cosine_similarity(out, ref_out, dim=-1, eps=1e-30)).sum(-1)
    blocks_per_row = schedule.nnz / schedule.num_rows
    return QualityMetrics(recall_sum / seq, recall_min, torch.sqrt(diff_sq / ref_sq.clamp_min(1e-300)),
                          cos_sum / seq, lse_sum / seq, blocks_per_row)


def block_attention_mass(q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float | None = None,
                         chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """True attention mass per (query block, key block): ``[n, n]`` for ``[S, D]`` inputs, ``[B, H, n, n]``
    otherwise, float64. Entry ``[qb, kb]`` sums, over the queries of block ``qb``, the causal softmax
    probability on the keys of block ``kb``, so a row sums to the number of queries in the block.

    Computed by the reference with one-hot block-indicator values (``v[j, c] = 1`` when key ``j`` is in block
    ``c``), ``head_dim`` blocks at a time."""
    check_qkv(q, k, k)
    q, k = _as64(q, k)
    seq, dim = q.shape[-2], q.shape[-1]
    nb = num_blocks(seq, block_size)
    full = dense_causal_schedule(seq, block_size, q.device)
    key_block = torch.arange(seq, device=q.device) // block_size
    qblock = torch.arange(seq, device=q.device) // block_size
    groups = []
    for first in range(0, nb, dim):
        onehot = (key_block[:, None] == first + torch.arange(dim, device=q.device)[None, :]).to(torch.float64)
        v = onehot.expand_as(k)
        probs = torch.cat([dense_masked_attention(q, k, v, full, scale, rows=r) for r in _chunks(seq, chunk)], -2)
        # sum the queries of each query block: [..., n, dim]
        summed = torch.zeros(*probs.shape[:-2], nb, dim, dtype=torch.float64, device=q.device)
        summed.index_add_(-2, qblock, probs)
        groups.append(summed[..., :min(dim, nb - first)])
    return torch.cat(groups, dim=-1)


# ---------------------------------------------------------------------------------------------- selectors
def base_block_mask(nb: int, sinks: int, window: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool ``[n, n]``: the sinks ``0..sinks-1`` and the window ``qb-window..qb`` of each row (causal)."""
    rows = torch.arange(nb, device=device)[:, None]
    cols = torch.arange(nb, device=device)[None, :]
    return (cols <= rows) & ((cols < sinks) | (cols >= rows - window))


def candidate_counts(nb: int, sinks: int, window: int) -> torch.Tensor:
    """Per row, the causal blocks outside the sinks and the window (what a budget can add), int64 ``[n]``."""
    causal = torch.ones(nb, nb, dtype=torch.bool).tril()
    return (causal & ~base_block_mask(nb, sinks, window)).sum(-1)


def schedule_from_scores(scores: torch.Tensor, block_size: int, seq_len: int, sinks: int, window: int,
                         budget: int) -> BlockSchedule:
    """Sinks + window + per row the ``budget`` highest-scored causal blocks outside them (ties to the lower
    block index). scores: ``[n, n]`` (shared schedule) or ``[B, H, n, n]`` (one row-set per lane)."""
    budget = check_int("budget", budget, 0)
    nb = scores.shape[-1]
    base = base_block_mask(nb, sinks, window, scores.device)
    causal = torch.ones(nb, nb, dtype=torch.bool, device=scores.device).tril()
    candidate = causal & ~base
    mask = base.expand(scores.shape).clone()
    take = min(budget, nb)
    if take:
        masked = scores.to(torch.float64).masked_fill(~candidate, float("-inf"))
        order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :take]
        ok = torch.gather(candidate.expand(scores.shape), -1, order)
        mask.scatter_(-1, order, ok | torch.gather(mask, -1, order))
    return BlockSchedule.from_block_mask(mask, block_size, seq_len)


def _lanes(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as ``[B, H, S, D]`` with the key heads expanded to the query heads."""
    if q.ndim == 2:
        return q[None, None], k[None, None]
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q, k


def _shape_scores(scores: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return scores[0, 0] if q.ndim == 2 else scores


def window_scores(q, k, block_size, **_) -> torch.Tensor:
    nb = num_blocks(q.shape[-2], block_size)
    return torch.zeros(*q.shape[:-2], nb, nb, dtype=torch.float64, device=q.device)


def random_scores(q, k, block_size, seed: int = 0, **_) -> torch.Tensor:
    nb = num_blocks(q.shape[-2], block_size)
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(*q.shape[:-2], nb, nb, generator=gen, dtype=torch.float64).to(q.device)


def topology_scores(q, k, block_size, **_) -> torch.Tensor:
    """The elder-rule salience of each key block, the same for every row."""
    q4, k4 = _lanes(q, k)
    sal = block_salience(block_centroids(k4.detach(), block_size))  # [B, H, n]
    return _shape_scores(sal[..., None, :].expand(*sal.shape[:-1], sal.shape[-1], sal.shape[-1]), q)


def centroid_scores(q, k, block_size, **_) -> torch.Tensor:
    """``mean(q of query block) . mean(k of key block)``, ``[..., n, n]``."""
    q4, k4 = _lanes(q, k)
    qc, kc = block_centroids(q4.detach(), block_size), block_centroids(k4.detach(), block_size)
    return _shape_scores(qc @ kc.transpose(-1, -2), q)


def mst_clusters(centroids: torch.Tensor, clusters: int) -> np.ndarray:
    """Labels ``[n]`` (int64, ``0..c-1`` in order of first block) of the clusters left when the minimum
    spanning tree of centroids ``[n, D]`` is cut at its ``clusters - 1`` longest edges: single-linkage
    clusters, the components of the 0-dimensional persistence at that scale."""
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
    """Blocks of the best-scored persistence clusters first; the centroid score orders blocks inside a
    cluster. Returned as ranks (higher is better)."""
    block_score, cluster_score = _cluster_parts(q, k, block_size, clusters)
    # lexicographic: sort by the block score, then stably by the cluster score
    first = torch.sort(block_score, dim=-1, stable=True).indices
    second = torch.sort(torch.gather(cluster_score, -1, first), dim=-1, stable=True).indices
    order = torch.gather(first, -1, second)  # ascending
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device)
                                             .expand_as(order).contiguous())
    return _shape_scores(ranks.to(torch.float64), q)


def cluster_centroid_scores(q, k, block_size, clusters: int = 4, **_) -> torch.Tensor:
    """The centroid score plus the score of the block's persistence cluster."""
    block_score, cluster_score = _cluster_parts(q, k, block_size, clusters)
    return _shape_scores(block_score + cluster_score, q)


def oracle_scores(q, k, block_size, scale: float | None = None, chunk: int = DEFAULT_CHUNK, **_) -> torch.Tensor:
    """The true attention mass of each (query block, key block), :func:`block_attention_mass`."""
    return block_attention_mass(q, k, block_size, scale, chunk)


SELECTORS: dict[str, Callable[..., torch.Tensor]] = {
    "window": window_scores,
    "random": random_scores,
    "topology_22": topology_scores,  # scores unused: select() builds #22's rule itself
    "topology": topology_scores,
    "centroid": centroid_scores,
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
    "cluster": "persistence clusters (MST cut at its longest edges) ranked by query . cluster centroid, "
               "then blocks by the centroid score",
    "cluster_centroid": "centroid score + the score of the block's persistence cluster",
    "oracle": "the true attention mass of each block (an upper bound at equal budget)",
}
"""One line per selector, for tables."""

TOPOLOGY_AWARE = ("topology_22", "topology", "cluster", "cluster_centroid")
QUERY_AWARE = ("centroid", "cluster", "cluster_centroid", "oracle")


def select(name: str, q: torch.Tensor, k: torch.Tensor, block_size: int, sinks: int = 1, window: int = 1,
           budget: int = 4, **options) -> BlockSchedule:
    """The schedule of selector ``name`` (see :data:`SELECTORS`) for queries and keys ``[S, D]`` (shared
    schedule) or ``[B, H, S, D]`` / ``[B, H_kv, S, D]`` (one row-set per query head). Options:
    ``seed`` (random), ``clusters`` (cluster selectors), ``scale`` and ``chunk`` (oracle)."""
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; expected one of {sorted(SELECTORS)}")
    check_qkv(q, k, k)
    block_size = check_int("block_size", block_size, 1)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    seq = q.shape[-2]
    if name == "topology_22":
        q4, k4 = _lanes(q, k)
        return topology_schedule(k if q.ndim == 2 else k4, block_size, window, sinks, budget)
    if name == "window":
        budget = 0
    scores = SELECTORS[name](q, k, block_size, **options)
    return schedule_from_scores(scores, block_size, seq, sinks, window, budget)


def compare_selectors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, budgets: Sequence[int],
                      selectors: Sequence[str] | None = None, sinks: int = 1, window: int = 1,
                      per_lane: bool = False, chunk: int = DEFAULT_CHUNK, **options) -> list[dict]:
    """Every selector at every budget on one input: a list of dicts (one per selector and budget, or per
    selector, budget and lane with ``per_lane``) with ``selector``, ``budget``, ``blocks_per_row`` and the
    metrics (``lane`` = ``b * H + h`` with ``per_lane``). Full attention is computed once."""
    selectors = list(SELECTORS) if selectors is None else list(selectors)
    reference = full_attention(q, k, v, block_size, options.get("scale"), chunk)
    mass = None
    heads = 1 if q.ndim == 2 else q.shape[1]
    rows = []
    for budget in budgets:
        for name in selectors:
            if name == "oracle":  # the block mass does not depend on the budget: compute it once
                if mass is None:
                    mass = block_attention_mass(q, k, block_size, options.get("scale"), chunk)
                schedule = schedule_from_scores(mass, block_size, q.shape[-2], sinks, window, budget)
            else:
                schedule = select(name, q, k, block_size, sinks, window, budget, **options)
            m = schedule_quality(q, k, v, schedule, options.get("scale"), reference, chunk)
            if per_lane:
                for lane in range(m.recall.numel()):
                    rows.append({"selector": name, "budget": budget, "lane": lane,
                                 "b": lane // heads, "h": lane % heads,
                                 "blocks_per_row": m.blocks_per_row, "recall": float(m.recall[lane]),
                                 "recall_min": float(m.recall_min[lane]), "rel_l2": float(m.rel_l2[lane]),
                                 "cos_err": float(m.cos_err[lane]), "lse_err": float(m.lse_err[lane])})
            else:
                rows.append({"selector": name, "budget": budget, **m.summary()})
    return rows


# ------------------------------------------------------------------------------------------------- data
def synthetic_qkv(keys: torch.Tensor, block_size: int = 64, seed: int = 0,
                  sharpness: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and values for a key set ``[S, D]`` (e.g. :func:`topo_attn.samples.load_key_set`), float32.

    The keys are centred and scaled to unit mean norm times ``sqrt(D)``; each query block looks for one earlier
    key block chosen at random (its query tokens are that block's centroid times ``sharpness`` plus unit
    noise), so attention concentrates on a few blocks, as in real heads. Values are standard normal."""
    gen = torch.Generator().manual_seed(seed)
    k = keys.to(torch.float32)
    k = k - k.mean(0)
    k = k / k.norm(dim=-1).mean() * k.shape[-1] ** 0.5
    seq, dim = k.shape
    nb = num_blocks(seq, block_size)
    centroids = block_centroids(k, block_size, torch.float32)
    target = (torch.rand(nb, generator=gen) * (torch.arange(nb) + 1)).long()  # a block <= qb
    q = (sharpness * centroids[target]).repeat_interleave(block_size, 0)[:seq]
    q = q + torch.randn(seq, dim, generator=gen)
    v = torch.randn(seq, dim, generator=gen)
    return q, k, v


REAL_QKV = "minilm_qkv.npz"


def load_real_qkv(path=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """The captured real q, k, v ``[layers, heads, S, head_dim]`` float16 (``data/minilm_qkv.npz``, written
    by ``data/capture_real_qk.py``) and a dict of what made them (model, package and version, layers, text)."""
    from ..samples import DATA_DIR

    with np.load(DATA_DIR / REAL_QKV if path is None else path, allow_pickle=False) as data:
        q, k, v = (torch.from_numpy(data[name]) for name in ("q", "k", "v"))
        info = {name: data[name].tolist() for name in data.files if name not in ("q", "k", "v")}
    return q, k, v, info


# ---------------------------------------------------------------------------------------------- verdict
def verdict(rows: Sequence[Mapping], budget: int) -> str:
    """Plain sentences on ``compare_selectors`` rows (aggregated or per lane, averaged) at ``budget``: which
    selector wins, by how much, and the best topology-aware selector's recall as a fraction of the oracle's."""
    recall: dict[str, list[float]] = {}
    blocks: dict[str, float] = {}
    for r in rows:
        if int(r["budget"]) == budget:
            recall.setdefault(r["selector"], []).append(float(r["recall"]))
            blocks[r["selector"]] = float(r["blocks_per_row"])
    if not recall:
        raise ValueError(f"no rows at budget {budget}")
    mean = {name: float(np.mean(v)) for name, v in recall.items()}
    ranked = sorted((n for n in mean if n != "oracle"), key=lambda n: -mean[n])
    lines = [f"budget {budget} extra blocks per query block ({blocks.get(ranked[0], float('nan')):.2f} blocks "
             f"per row visited, sinks and window included):"]
    if len(ranked) > 1:
        best, second = ranked[0], ranked[1]
        gap = mean[best] - mean[second]
        lines.append(f"  winner (without the oracle): {best}, recall {mean[best]:.4f}, ahead of {second} "
                     f"({mean[second]:.4f}) by {gap:+.4f}" + (" (a tie to 4 decimals)" if gap < 5e-5 else ""))
    if "oracle" in mean:
        lines.append(f"  oracle recall {mean['oracle']:.4f}; " + ", ".join(
            f"{n} {mean[n] / mean['oracle']:.3f}" for n in ranked) + " of it")
        topo = [n for n in ranked if n in TOPOLOGY_AWARE]
        if topo:
            t = topo[0]
            closes = "closes" if mean[t] >= 0.98 * mean["oracle"] else "does not close"
            lines.append(f"  best topology-aware selector: {t}, recall {mean[t]:.4f} = "
                         f"{mean[t] / mean['oracle']:.3f} of the oracle's ({closes} the gap to 0.98)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m topo_attn.selection.quality``: the selection-quality summary on a synthetic set and the real keys."""
    import argparse

    from ..samples import load_key_set

    parser = argparse.ArgumentParser(description="Selection quality of every selector at equal budget.")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--report-budget", type=int, default=4)
    parser.add_argument("--key-set", default="outliers")
    parser.add_argument("--block-size", type=int, default=32, help="for the synthetic set")
    parser.add_argument("--real-block-size", type=int, default=16)
    parser.add_argument("--sinks", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--clusters", type=int, default=4)
    args = parser.parse_args(argv)
    common = dict(sinks=args.sinks, window=args.window, clusters=args.clusters)
    q, k, v = synthetic_qkv(load_key_set(args.key_set), args.block_size, seed=0, sharpness=0.5)
    rows = compare_selectors(q, k, v, args.block_size, args.budgets, **common)
    print(f"synthetic: key set {args.key_set!r} {tuple(k.shape)}, blocks of {args.block_size}")
    _print_table(rows)
    print(verdict(rows, args.report_budget))
    q, k, v, info = load_real_qkv()
    rows = compare_selectors(q, k, v, args.real_block_size, args.budgets, per_lane=True, **common)
    print(f"\nreal: {info['model']} ({info['package']} {info['package_version']}), layers {info['layers']}, "
          f"q/k/v {tuple(q.shape)}, blocks of {args.real_block_size}; mean over layers and heads")
    _print_table(rows)
    print(verdict(rows, args.report_budget))


def _print_table(rows: Sequence[Mapping]) -> None:
    groups: dict[tuple[str, int], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((r["selector"], int(r["budget"])), []).append(r)
    print(f"{'selector':<18}{'budget':>7}{'blocks/row':>11}{'recall':>9}{'rel_l2':>9}{'cos_err':>9}{'lse_err':>9}")
    for (name, budget), sel in sorted(groups.items(), key=lambda kv: (kv[0][1], list(SELECTORS).index(kv[0][0]))):
        m = {key: float(np.mean([float(r[key]) for r in sel])) for key in
             ("blocks_per_row", "recall", "rel_l2", "cos_err", "lse_err")}
        print(f"{name:<18}{budget:>7}{m['blocks_per_row']:>11.2f}{m['recall']:>9.4f}{m['rel_l2']:>9.4f}"
              f"{m['cos_err']:>9.4f}{m['lse_err']:>9.4f}")


if __name__ == "__main__":
    main()
