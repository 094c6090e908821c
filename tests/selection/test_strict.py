"""Strict selection: no query's schedule depends on a later token."""

from __future__ import annotations

import pytest
import torch

from topo_attn import selection

BLOCK, SEQ = 16, 160  # 10 blocks
ROW_SCORED = ("window", "random", "topology", "centroid", "quest", "cluster", "cluster_centroid", "oracle")


def row_sets(schedule) -> list[list[frozenset]]:
    """Per lane, per query block, the set of scheduled key blocks."""
    mask = schedule.to_block_mask()
    mask = mask.reshape(-1, *mask.shape[-2:])
    return [[frozenset(torch.nonzero(row).flatten().tolist()) for row in lane] for lane in mask]


def perturbed(q, k, start, seed):
    """q and k with every position from ``start`` on replaced by fresh random values."""
    gen = torch.Generator().manual_seed(seed)
    q2, k2 = q.clone(), k.clone()
    q2[..., start:, :] = torch.randn(q2[..., start:, :].shape, generator=gen, dtype=q.dtype)
    k2[..., start:, :] = torch.randn(k2[..., start:, :].shape, generator=gen, dtype=k.dtype)
    return q2, k2


def test_previous_row_scores_shifts_rows():
    scores = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    out = selection.previous_row_scores(scores)
    assert torch.equal(out[..., 0, :], scores[..., 0, :]) and torch.equal(out[..., 1:, :], scores[..., :-1, :])


@pytest.mark.parametrize("name", ["centroid", "quest", "oracle"])
def test_strict_rows_ignore_later_tokens_and_pooled_rows_do_not(name):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, SEQ, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, SEQ, 8, generator=gen, dtype=torch.float64)
    changed_pooled = 0
    for block in (3, 5, 8):
        q2, k2 = perturbed(q, k, block * BLOCK + 5, seed=block)  # inside query block `block`
        for strict in (True, False):
            before = row_sets(selection.select(name, q, k, BLOCK, 1, 1, 2, strict=strict, per_query_head=True))
            after = row_sets(selection.select(name, q2, k2, BLOCK, 1, 1, 2, strict=strict, per_query_head=True))
            for lane_b, lane_a in zip(before, after):
                if strict:  # rows up to and including the perturbed block are chosen from earlier tokens only
                    assert lane_b[:block + 1] == lane_a[:block + 1]
                else:
                    changed_pooled += lane_b[block] != lane_a[block]
    assert changed_pooled > 0  # the pooled choice of a block does look at its later queries


def test_strict_keeps_the_budget_and_is_refused_for_topology_22():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, SEQ, 8, generator=gen)
    k = torch.randn(1, 2, SEQ, 8, generator=gen)
    for name in ROW_SCORED:
        pooled = selection.select(name, q, k, BLOCK, 1, 1, 3)
        strict = selection.select(name, q, k, BLOCK, 1, 1, 3, strict=True)
        assert torch.equal(strict.to_block_mask().sum(-1), pooled.to_block_mask().sum(-1)), name
    with pytest.raises(ValueError, match="topology_22"):
        selection.select("topology_22", q, k, BLOCK, 1, 1, 3, strict=True)
    with pytest.raises(TypeError, match="strict"):
        selection.select("centroid", q, k, BLOCK, 1, 1, 3, strict=1)
