"""The selection metrics against a direct dense float64 computation, and recall 1 for the dense causal
schedule."""

from __future__ import annotations

import math

import pytest
import torch

from topo_attn import BlockSchedule, dense_causal_schedule, selection


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
def test_metrics_agree_with_a_direct_dense_computation(heads, seq, random_qkv):
    q, k, v = random_qkv(seq, 16, heads, seed=seq)
    for name in ("window", "random", "centroid", "topology_22"):
        schedule = selection.select(name, q, k, 16, sinks=1, window=1, budget=2)
        m = selection.schedule_quality(q, k, v, schedule, chunk=40)  # chunks that cut through blocks
        recall, rel, cos, lse = direct_metrics(q, k, v, schedule)
        torch.testing.assert_close(m.recall, recall, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m.rel_l2, rel, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(m.cos_err, cos, rtol=1e-7, atol=1e-12)
        torch.testing.assert_close(m.lse_err, lse, rtol=1e-9, atol=1e-12)
        assert m.blocks_per_row == schedule.nnz / schedule.num_rows


def test_block_attention_mass_matches_direct_probabilities(random_qkv):
    q, k, _ = random_qkv(100, 8, heads=2, seed=3)  # 7 blocks of 16 with head_dim 8: two indicator groups
    mass = selection.block_attention_mass(q, k, 16, chunk=33)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    probs = torch.softmax(scores.masked_fill(~torch.ones(100, 100, dtype=torch.bool).tril(), -math.inf), -1)
    blocks = torch.arange(100) // 16
    onehot = torch.nn.functional.one_hot(blocks, 7).double()
    expected = onehot.T @ probs @ onehot  # [qb, kb]
    torch.testing.assert_close(mass, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mass.sum(-1), torch.bincount(blocks).double().expand(1, 2, 7))


@pytest.mark.parametrize("heads", [None, 2])
def test_recall_is_one_for_the_dense_causal_schedule(heads, random_qkv):
    q, k, v = random_qkv(130, 16, heads, seed=1, spread=4.0)
    m = selection.schedule_quality(q, k, v, dense_causal_schedule(130, 32), chunk=50)
    torch.testing.assert_close(m.recall, torch.ones_like(m.recall), rtol=0, atol=1e-12)
    assert float(m.recall_min.min()) > 1 - 1e-12
    assert float(m.rel_l2.max()) < 1e-12 and float(m.lse_err.max()) < 1e-12
