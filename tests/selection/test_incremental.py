"""Selection for queries at the end of a growing key cache (topo_attn.selection.incremental): the per-token
choice of the token-granularity evaluation for one query, the group's choice for GQA, chunk rows chosen from
their own queries, statistics kept incrementally, and the errors."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from topo_attn.lm.token_attention import TokenSettings, token_block_choice
from topo_attn.rule import budget_row_widths
from topo_attn.selection.incremental import INCREMENTAL_SELECTORS, KeyBlockStats, select_for_queries


def _qk(B, H, H_kv, L, S, D, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, L, D, generator=gen), torch.randn(B, H_kv, S, D, generator=gen)


@pytest.mark.parametrize("selector", ["centroid", "quest", "topology"])
@pytest.mark.parametrize("S", [100, 96, 161])
def test_one_query_matches_the_token_choice(selector, S):
    """With one query per key/value head, the last token's choice is the token-granularity evaluation's."""
    bs, sinks, window, budget = 16, 1, 1, 2
    q, k = _qk(2, 3, 3, S, S, 8, seed=S)
    settings = TokenSettings(selector, bs, sinks, window, budget)
    want = token_block_choice(q, k, settings)[..., -1, :]
    schedule = select_for_queries(selector, q[..., -1:, :], k, bs, sinks, window, budget).validate()
    assert schedule.lanes == (2, 3) and schedule.q_len == 1 and schedule.num_query_blocks == 1
    assert torch.equal(schedule.to_block_mask()[..., 0, :], want)


def test_a_group_chooses_with_its_mean_query():
    """GQA, centroid: the group's choice is the choice of the group's mean query."""
    q, k = _qk(1, 4, 2, 1, 150, 8, seed=1)
    group = select_for_queries("centroid", q, k, 16, 1, 1, 3)
    mean = q.reshape(1, 2, 2, 1, 8).mean(2)
    assert torch.equal(group.to_block_mask(), select_for_queries("centroid", mean, k, 16, 1, 1, 3).to_block_mask())


def test_a_group_chooses_by_its_largest_quest_bound():
    """GQA, quest: each block is scored by the largest bound over the group's heads, written out per key."""
    bs, budget = 16, 3
    q, k = _qk(1, 4, 2, 1, 150, 8, seed=2)
    schedule = select_for_queries("quest", q, k, bs, 1, 1, budget)
    nb = ta.num_blocks(150, bs)
    for h_kv in range(2):
        keys = k[0, h_kv].double()
        bound = torch.zeros(nb, dtype=torch.float64)
        for kb in range(nb - 1):  # complete blocks
            block = keys[kb * bs:(kb + 1) * bs]
            hi, lo = block.max(0).values, block.min(0).values
            per_head = [torch.maximum(q[0, h, 0].double() * hi, q[0, h, 0].double() * lo).sum()
                        for h in (2 * h_kv, 2 * h_kv + 1)]
            bound[kb] = max(per_head)
        candidates = list(range(1, nb - 2))  # not the sink, not the window (nb - 2, nb - 1)
        best = sorted(candidates, key=lambda b: -bound[b].item())[:budget]
        want = sorted({0, nb - 2, nb - 1, *best})
        row = schedule.indices[schedule.offsets[h_kv]:schedule.offsets[h_kv + 1]].tolist()
        assert row == want


@pytest.mark.parametrize("selector", INCREMENTAL_SELECTORS)
def test_chunk_rows_are_chosen_from_their_own_queries(selector):
    """A chunk of 20 queries straddling a block boundary: each row is the single-row choice of that row's
    queries over the keys up to them."""
    bs, S, L = 16, 120, 20  # queries at 100..119: blocks 6 and 7
    q, k = _qk(1, 2, 1, L, S, 8, seed=3)
    schedule = select_for_queries(selector, q, k, bs, 1, 1, 2, seed=5)
    assert schedule.num_query_blocks == 2 and schedule.first_query_block == 6
    mask = schedule.to_block_mask()
    if selector != "random":  # random draws depend on the call's length
        first_row = select_for_queries(selector, q[..., :12, :], k[..., :112, :], bs, 1, 1, 2).to_block_mask()
        assert torch.equal(mask[..., :1, :7], first_row)
    if selector not in ("random", "topology", "topology_22"):  # (topology: the first row's prefix for all)
        second = select_for_queries(selector, q[..., 12:, :], k, bs, 1, 1, 2).to_block_mask()
        assert torch.equal(mask[..., 1:, :], second)
    budget = 0 if selector == "window" else 2
    assert mask.sum(-1).tolist() == [[[1 + 2 + min(budget, 4), 1 + 2 + min(budget, 5)]]]


def test_statistics_grow_block_by_block():
    """Decoding token by token: the kept statistics equal fresh ones, each block is read once, and the
    schedules equal those from fresh statistics."""
    bs = 16
    q, k = _qk(1, 2, 2, 60, 100, 8, seed=4)
    stats = KeyBlockStats(bs)
    for length in range(50, 101, 3):
        kept = select_for_queries("quest", q[..., length - 41:length - 40, :], k[..., :length, :], bs, 1, 1, 2, stats)
        fresh = select_for_queries("quest", q[..., length - 41:length - 40, :], k[..., :length, :], bs, 1, 1, 2)
        assert torch.equal(kept.indices, fresh.indices) and torch.equal(kept.offsets, fresh.offsets)
        assert stats.complete == length // bs
    assert stats.blocks_read == 100 // bs
    assert torch.allclose(stats.centroids, ta.block_centroids(k[..., :96, :], bs))
    lo, hi = k[..., :96, :].double().unflatten(-2, (6, bs)).amin(-2), k[..., :96, :].double().unflatten(-2, (6, bs)).amax(-2)
    assert torch.equal(stats.lo, lo) and torch.equal(stats.hi, hi)
    first = stats.salience(5)
    assert stats.salience(5) is first  # kept
    assert torch.allclose(stats.salience(6), ta.block_salience(ta.block_centroids(k[..., :96, :], bs)).double())
    stats.update(k[..., :40, :])  # a shorter cache (a crop) starts over
    assert stats.complete == 2 and stats.blocks_read == 6 + 2


def test_errors():
    q, k = _qk(1, 2, 1, 1, 64, 8, seed=6)
    with pytest.raises(ValueError, match="selector must be one of"):
        select_for_queries("oracle", q, k, 16)
    with pytest.raises(ValueError, match="k must hold at least as many positions as q"):
        select_for_queries("centroid", torch.randn(1, 2, 80, 8), k, 16)
    with pytest.raises(ValueError, match="block_size=32, not 16"):
        select_for_queries("centroid", q, k, 16, stats=KeyBlockStats(32))
    with pytest.raises(ValueError, match=r"\[B, H, L, D\]"):
        select_for_queries("centroid", q[0, 0], k[0, 0], 16)
    with pytest.raises(ValueError, match="blocks must be in 1..4"):
        KeyBlockStats(16).update(k).salience(5)


@pytest.mark.parametrize("selector", ["quest", "centroid", "topology", "random"])
def test_rows_have_the_budget_rules_widths(selector):
    """Every row holds its sinks, its window and min(budget, candidates) chosen blocks: the widths the CSR is
    built from by arithmetic (no nonzero); the schedule is valid and its chosen blocks are the row's best
    candidates (checked per query against the token choice above)."""
    for S, L, sinks, window, budget in ((300, 1, 1, 1, 3), (300, 20, 2, 1, 4), (257, 16, 1, 2, 5),
                                        (160, 1, 1, 1, 7), (160, 1, 1, 1, 8), (40, 8, 1, 1, 4)):
        q, k = _qk(2, 4, 2, L, S, 8, seed=S + L)
        schedule = select_for_queries(selector, q, k, 16, sinks, window, budget, seed=2).validate()
        first = (S - L) // 16
        widths = budget_row_widths(torch.arange(first, -(-S // 16)), sinks, window, budget)
        assert torch.equal(schedule.offsets.diff().view(2, 2, -1), widths.int().expand(2, 2, -1))
