"""The Quest selector: its scores against a brute-force loop, the bound it promises, and its equal budget."""

from __future__ import annotations

import math

import pytest
import torch

from topo_attn import selection


def _fresh(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return 1.5 * torch.randn(*shape, generator=gen, dtype=torch.float64)


def _brute_quest(q: torch.Tensor, k: torch.Tensor, block: int) -> torch.Tensor:
    """Quest's page bound of one lane, straight from the definition: for each (query block, key block), the
    largest over the block's queries of ``sum_i max(q_i * M_i, q_i * m_i)``, plain Python floats."""
    q, k = q.tolist(), k.tolist()
    seq, dim = len(q), len(q[0])
    nb = math.ceil(seq / block)
    out = torch.empty(nb, nb, dtype=torch.float64)
    for kb in range(nb):
        rows = k[kb * block:min(seq, (kb + 1) * block)]
        big = [max(r[i] for r in rows) for i in range(dim)]
        small = [min(r[i] for r in rows) for i in range(dim)]
        for qb in range(nb):
            out[qb, kb] = max(sum(max(x[i] * big[i], x[i] * small[i]) for i in range(dim))
                              for x in q[qb * block:min(seq, (qb + 1) * block)])
    return out


def _tile_max(q: torch.Tensor, k: torch.Tensor, block: int) -> torch.Tensor:
    """The largest ``q . k`` of every (query block, key block) tile of one lane, float64 ``[n, n]``."""
    seq = q.shape[0]
    nb = math.ceil(seq / block)
    dots = q @ k.T
    return torch.tensor([[float(dots[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block].max())
                          for kb in range(nb)] for qb in range(nb)], dtype=torch.float64)


@pytest.mark.parametrize("seq, block", [(77, 16), (50, 7), (9, 16)])
def test_quest_scores_equal_a_brute_force_loop_shared(seq, block):
    q, k = _fresh((seq, 6), seed=seq), _fresh((seq, 6), seed=seq + 1)
    got = selection.block_scores("quest", q, k, block, per_query_head=True)
    assert got.dtype == torch.float64 and got.shape == (math.ceil(seq / block),) * 2
    torch.testing.assert_close(got, _brute_quest(q, k, block), rtol=1e-12, atol=1e-12)


def test_quest_scores_equal_a_brute_force_loop_gqa():
    seq, block, heads, kv_heads = 61, 8, 4, 2
    q, k = _fresh((2, heads, seq, 5), seed=11), _fresh((2, kv_heads, seq, 5), seed=12)
    got = selection.block_scores("quest", q.to(torch.float32), k.to(torch.float32), block,
                                per_query_head=True)  # computed in float64 on the CPU
    nb = math.ceil(seq / block)
    assert got.dtype == torch.float64 and got.shape == (2, heads, nb, nb)
    q32, k32 = q.to(torch.float32).to(torch.float64), k.to(torch.float32).to(torch.float64)
    for b in range(2):
        for h in range(heads):
            want = _brute_quest(q32[b, h], k32[b, h // (heads // kv_heads)], block)
            torch.testing.assert_close(got[b, h], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape_q, shape_k", [((93, 8), (93, 8)), ((1, 4, 93, 8), (1, 2, 93, 8))])
def test_quest_score_bounds_every_dot_of_its_causal_tiles(shape_q, shape_k):
    block = 16
    q, k = _fresh(shape_q, seed=21), _fresh(shape_k, seed=22)
    scores = selection.block_scores("quest", q, k, block, per_query_head=True)
    q4 = q[None, None] if q.ndim == 2 else q
    k4 = k[None, None] if k.ndim == 2 else k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s4 = scores[None, None] if q.ndim == 2 else scores
    nb = s4.shape[-1]
    causal = torch.ones(nb, nb, dtype=torch.bool).tril()
    for b in range(q4.shape[0]):
        for h in range(q4.shape[1]):
            tile = _tile_max(q4[b, h], k4[b, h], block)
            assert bool((s4[b, h] >= tile - 1e-9)[causal].all()), (b, h)
            assert bool((s4[b, h] - tile)[causal].max() > 1e-6)  # a bound, not the tile maximum itself


def test_quest_ranks_differently_from_the_centroid_score():
    # one key block with a single large key in a block of small ones: the mean hides it, the max does not
    seq, block = 64, 16
    q, k = _fresh((seq, 4), seed=31) * 0.1, _fresh((seq, 4), seed=32) * 0.1
    q[48:] = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    k[16:32] = -0.5 * torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    k[20] = torch.tensor([5.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    quest = selection.select("quest", q, k, block, sinks=0, window=0, budget=1).to_block_mask()
    centroid = selection.select("centroid", q, k, block, sinks=0, window=0, budget=1).to_block_mask()
    assert bool(quest[3, 1]) and not bool(centroid[3, 1])


@pytest.mark.parametrize("sinks, window, budget", [(1, 1, 0), (1, 1, 2), (0, 2, 3), (2, 0, 50)])
def test_quest_visits_as_many_blocks_per_row_as_centroid(sinks, window, budget):
    seq, block = 150, 16  # 10 blocks, the last one partial
    q, k = _fresh((1, 4, seq, 8), seed=budget), _fresh((1, 2, seq, 8), seed=budget + 100)
    opts = dict(sinks=sinks, window=window, budget=budget)
    quest = selection.select("quest", q, k, block, **opts)
    centroid = selection.select("centroid", q, k, block, **opts)
    quest.validate()
    assert quest.lanes == centroid.lanes == (1, 2)  # one row-set per key/value head
    assert torch.equal(quest.to_block_mask().sum(-1), centroid.to_block_mask().sum(-1))
    shared = selection.select("quest", q[0, 0], k[0, 0], block, **opts)
    assert shared.lanes is None
    assert torch.equal(shared.to_block_mask().sum(-1),
                       selection.select("centroid", q[0, 0], k[0, 0], block, **opts).to_block_mask().sum(-1))


def test_quest_is_registered():
    from topo_attn.selection import quest

    assert selection.SELECTORS["quest"] is quest.SELECTOR and quest.SELECTOR.step_scores is quest.step_scores
    assert "quest" in selection.QUERY_AWARE and "quest" not in selection.TOPOLOGY_AWARE
    assert "quest" in selection.DESCRIPTIONS and "quest" in selection.names("token")
