"""The selectors' schedules: well formed, with the rule's sinks and window, and exactly the budget per row."""

from __future__ import annotations

import pytest
import torch

from topo_attn import BlockSchedule, selection, topology_schedule
from topo_attn.rule import base_block_mask


def test_selectors_return_valid_schedules_with_sinks_window_and_budget(random_qkv):
    q, k, v = random_qkv(200, 16, heads=2, seed=5)
    block, nb = 16, 13
    for sinks, window, budget in [(1, 1, 3), (2, 0, 1), (0, 2, 5), (1, 1, 0), (1, 1, 50)]:
        base = base_block_mask(nb, sinks, window)
        extra = torch.minimum(selection.candidate_counts(nb, sinks, window), torch.tensor(budget))
        for name in selection.SELECTORS:
            schedule = selection.select(name, q, k, block, sinks=sinks, window=window, budget=budget, seed=1,
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


def test_shared_and_gqa_inputs(random_qkv):
    q, k, v = random_qkv(128, 16, seed=2)
    s = selection.select("centroid", q, k, 32, budget=1)
    assert s.lanes is None and s.num_rows == 4
    q4, k4, _ = random_qkv(128, 16, heads=4, seed=2)
    k2 = k4[:, :2]
    s4 = selection.select("oracle", q4, k2, 32, budget=1)
    assert s4.lanes == (1, 2)  # one row-set per key/value head by default
    assert selection.select("oracle", q4, k2, 32, budget=1, per_query_head=True).lanes == (1, 4)
    m = selection.schedule_quality(q4, k2, k2, s4)
    assert m.recall.shape == (4,)


def test_random_selector_is_seeded_and_unknown_name_raises(random_qkv):
    q, k, _ = random_qkv(256, 16, seed=0)
    a, b = (selection.select("random", q, k, 16, budget=3, seed=7) for _ in range(2))
    assert torch.equal(a.indices, b.indices)
    with pytest.raises(ValueError, match="selector must be one of"):
        selection.select("nope", q, k, 16)


def test_mst_clusters_cut_the_longest_edges():
    centroids = torch.tensor([[0.0], [0.1], [5.0], [5.2], [20.0]], dtype=torch.float64)
    assert selection.mst_clusters(centroids, 3).tolist() == [0, 0, 1, 1, 2]
    assert selection.mst_clusters(centroids, 1).tolist() == [0] * 5
    assert selection.mst_clusters(centroids, 9).tolist() == [0, 1, 2, 3, 4]
