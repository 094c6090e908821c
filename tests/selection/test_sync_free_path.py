"""The pieces of the sync-free selection path: the budget rule's CSR by arithmetic
(:func:`topo_attn.rule.budget_schedule`), the ranking of each row's candidates (:mod:`topo_attn.selection.topk`),
the block statistics (:mod:`topo_attn.selection.stats`) and Quest's fused score kernel (in Triton's interpreter
on the CPU), each against a plain float64 reference written from the rules."""

from __future__ import annotations

import itertools

import pytest
import torch

from topo_attn.rule import budget_row_widths, budget_schedule
from topo_attn.schedule import num_blocks
from topo_attn.selection.stats import key_block_bounds, query_block_means
from topo_attn.topology import block_centroids
from topo_attn.selection.topk import order_key, top_candidates


def reference_mask(scores: torch.Tensor, first: int, sinks: int, window: int, budget: int) -> torch.Tensor:
    """The budget rule row by row in Python: sinks and window, plus the ``budget`` best candidates of each row by
    float64 score (ties to the lower block index). scores ``[L, R, n]`` -> bool ``[L, R, n]``."""
    lanes, rows, nb = scores.shape
    mask = torch.zeros(lanes, rows, nb, dtype=torch.bool)
    for lane, r in itertools.product(range(lanes), range(rows)):
        qb = first + r
        for kb in range(qb + 1):
            mask[lane, r, kb] = kb < sinks or kb >= qb - window
        candidates = [kb for kb in range(sinks, qb - window)]
        ranked = sorted(candidates, key=lambda kb: (-float(scores[lane, r, kb]), kb))
        for kb in ranked[:budget]:
            mask[lane, r, kb] = True
    return mask


@pytest.mark.parametrize("seq, block, sinks, window, budget, q_len",
                         [(1, 16, 1, 1, 4, None), (37, 16, 0, 0, 1, None), (200, 16, 1, 1, 3, None),
                          (513, 32, 3, 2, 40, None), (300, 16, 2, 1, 5, 20), (300, 16, 1, 0, 2, 1),
                          (160, 16, 0, 3, 0, None)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_budget_schedule_matches_the_rule(seq, block, sinks, window, budget, q_len, dtype):
    nb = num_blocks(seq, block)
    first = (seq - (q_len or seq)) // block
    gen = torch.Generator().manual_seed(seq + budget)
    scores = torch.randn(6, nb - first, nb, generator=gen, dtype=torch.float64).to(dtype)
    scores[..., ::3] = 0.5  # ties, broken toward the lower block index
    chosen = top_candidates(scores.view(2, 3, nb - first, nb), first, sinks, window, budget)
    schedule = budget_schedule(chosen, block, seq, sinks, window, q_len, (2, 3))
    schedule.validate()  # the unchecked construction is a valid schedule
    expected = reference_mask(scores.double(), first, sinks, window, budget).view(2, 3, nb - first, nb)
    assert torch.equal(schedule.to_block_mask(), expected)
    widths = budget_row_widths(torch.arange(first, nb), sinks, window, budget)
    assert torch.equal(schedule.offsets.diff().view(2, 3, -1), widths.expand(2, 3, -1).int())


def test_budget_schedule_shared_and_minus_infinity():
    scores = torch.full((8, 8), float("-inf"))
    scores[7, 2] = 1.0
    schedule = budget_schedule(top_candidates(scores, 0, 1, 1, 3), 16, 128, 1, 1)
    mask = schedule.to_block_mask()
    assert schedule.lanes is None and mask[7].tolist() == [True] * 4 + [False, False, True, True]  # -inf fills up
    assert torch.equal(mask, reference_mask(scores[None].double(), 0, 1, 1, 3)[0])


def test_order_key_orders_scores_then_lower_index():
    scores = torch.tensor([0.5, -0.0, 0.0, float("-inf"), 3.0, -2.0, 0.5, float("inf")])
    order = torch.argsort(order_key(scores), descending=True).tolist()
    assert order == [7, 4, 0, 6, 1, 2, 5, 3]


def test_key_block_statistics_against_float64():
    """What the selectors score against: the float32 centroids and bounds of bfloat16 keys, a partial last block."""
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(2, 3, 70, 8, generator=gen).to(torch.bfloat16)
    mean, (lo32, _) = block_centroids(k, 16, torch.float32), key_block_bounds(k, 16, torch.float32)
    ref = torch.nn.functional.pad(k.double(), (0, 0, 0, 10), value=float("nan")).unflatten(-2, (5, 16))
    assert torch.allclose(mean.double(), ref.nanmean(-2), atol=1e-6)
    lo, hi = key_block_bounds(k, 16)
    assert torch.equal(lo, ref.nan_to_num(float("inf")).amin(-2)) and torch.equal(hi, ref.nan_to_num(-float("inf")).amax(-2))
    assert lo32.dtype == torch.float32 and torch.equal(lo32.double(), lo)


@pytest.mark.parametrize("length, offset", [(64, 0), (50, 0), (37, 27), (1, 99)])
def test_query_block_means_pool_the_group(length, offset):
    gen = torch.Generator().manual_seed(length)
    q = torch.randn(2, 4, length, 8, generator=gen, dtype=torch.float64)
    means = query_block_means(q, 16, 2, torch.float64, offset)
    pos = torch.arange(offset, offset + length)
    rows = pos // 16 - offset // 16
    for r in range(int(rows.max()) + 1):
        expected = q[:, :, rows == r].mean(2).view(2, 2, 2, 8).mean(2)
        assert torch.allclose(means[:, :, r], expected)


@pytest.mark.parametrize("batch, heads, kv_heads, seq, length, dim, block",
                         [(1, 4, 2, 200, 200, 32, 16), (2, 2, 2, 130, 130, 20, 32), (1, 4, 1, 300, 17, 64, 16),
                          (1, 6, 2, 150, 150, 16, 16), (2, 4, 2, 100, 100, 32, 16)])
def test_quest_kernel_matches_float64_bounds(batch, heads, kv_heads, seq, length, dim, block, device):
    """Also a group of 3 heads (padded to 4 in the stacked operand) and, for the last case, queries in
    transformers' layout (a [B, S, H, D] tensor viewed as [B, H, S, D])."""
    from topo_attn.selection.quest_kernel import quest_block_scores

    gen = torch.Generator().manual_seed(seq)
    q = torch.randn(batch, heads, length, dim, generator=gen)
    if seq == 100:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    k = torch.randn(batch, kv_heads, seq, dim, generator=gen)
    lo, hi = key_block_bounds(k, block, torch.float32)
    window = 1
    out = quest_block_scores(q.to(device), lo.to(device), hi.to(device), block, window, seq - length).cpu()
    # float64 reference: every query's bound, the largest over the row's queries and the group's heads
    lo64, hi64 = (t.repeat_interleave(heads // kv_heads, 1) for t in key_block_bounds(k, block))
    bound = q.double().clamp(min=0) @ hi64.transpose(-1, -2) + q.double().clamp(max=0) @ lo64.transpose(-1, -2)
    nb, first = lo.shape[2], (seq - length) // block
    row_of = torch.arange(seq - length, seq) // block - first
    expected = torch.stack([bound[:, :, row_of == r].amax(2) for r in range(nb - first)], 2)
    expected = expected.view(batch, kv_heads, heads // kv_heads, nb - first, nb).amax(2)
    cols, qb = torch.arange(nb)[None, :], torch.arange(first, nb)[:, None]
    scored = cols < qb - window  # every candidate's tile is scored
    assert torch.allclose(out.double()[..., scored], expected[..., scored], rtol=1e-5, atol=1e-4)
