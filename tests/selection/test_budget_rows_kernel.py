"""The one-launch budget rule (topo_attn.selection.budget_rows_kernel) against the torch path it replaces on a GPU,
``budget_schedule(top_candidates(...))``: the same CSR bit for bit (offsets and indices), over rule sizes,
budgets below, at and above the candidates, suffixes of queries, shared and per-lane scores, expanded (row
broadcast) scores, exact ties, ``-inf`` and ``-0.0`` scores, and bf16 scores; and ``schedule_from_scores``
dispatching to it on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from topo_attn.rule import budget_row_widths, budget_schedule
from topo_attn.selection import budget_rows_kernel as kernel
from topo_attn.selection.topk import top_candidates


def torch_path(scores, block_size, seq_len, sinks, window, budget, q_len=None, lanes=None):
    first = (seq_len - (seq_len if q_len is None else q_len)) // block_size
    return budget_schedule(top_candidates(scores, first, sinks, window, budget), block_size, seq_len, sinks,
                           window, q_len, lanes)


def assert_same(got, want):
    assert torch.equal(got.offsets.cpu(), want.offsets.cpu().to(torch.int32))
    assert torch.equal(got.indices.cpu(), want.indices.cpu().to(torch.int32))
    assert (got.lanes, got.q_len, got.seq_len, got.block_size) == (want.lanes, want.q_len, want.seq_len,
                                                                    want.block_size)
    got.validate()


def coarse(shape, seed, device, levels=3):
    """Scores from a few values (many exact ties), with some -inf and -0.0 entries."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(-levels, levels + 1, shape, generator=gen).float() / 4
    scores[torch.rand(shape, generator=gen) < 0.1] = float("-inf")
    scores[scores == 0] = torch.where(torch.rand(shape, generator=gen) < 0.5, -0.0, 0.0)[scores == 0]
    return scores.to(device)


@pytest.mark.parametrize("sinks, window, budget", [(1, 1, 3), (0, 0, 2), (2, 3, 5), (1, 1, 0), (3, 2, 40),
                                                   (0, 1, 1), (4, 0, 7)])
@pytest.mark.parametrize("seq_len", [16 * 23, 16 * 23 - 5, 16])
def test_per_lane_scores_match_the_torch_path(device, seq_len, sinks, window, budget):
    nb = -(-seq_len // 16)
    for seed, scores in enumerate((coarse((2, 3, nb, nb), 1, device),
                                   torch.randn(2, 3, nb, nb, device=device))):
        got = kernel.budget_rows(scores, 16, seq_len, sinks, window, budget, lanes=(2, 3))
        assert_same(got, torch_path(scores, 16, seq_len, sinks, window, budget, lanes=(2, 3)))


@pytest.mark.parametrize("q_len", [1, 15, 16, 17, 100, 16 * 30])
def test_a_suffix_of_queries(device, q_len):
    seq_len, bs = 16 * 30, 16
    first = (seq_len - q_len) // bs
    scores = coarse((1, 2, 30 - first, 30), 2, device)
    got = kernel.budget_rows(scores, bs, seq_len, 1, 1, 4, q_len=q_len, lanes=(1, 2))
    assert_same(got, torch_path(scores, bs, seq_len, 1, 1, 4, q_len=q_len, lanes=(1, 2)))


def test_shared_scores(device):
    scores = coarse((20, 20), 3, device)
    assert_same(kernel.budget_rows(scores, 32, 20 * 32, 1, 2, 3), torch_path(scores, 32, 20 * 32, 1, 2, 3))


def test_row_broadcast_and_strided_scores(device):
    """topology's scores are one salience per key block, expanded over the rows (row stride 0); a transposed
    view has other strides."""
    salience = coarse((2, 2, 1, 25), 4, device)
    expanded = salience.expand(2, 2, 25, 25)
    assert expanded.stride(2) == 0
    assert_same(kernel.budget_rows(expanded, 16, 400, 1, 1, 6, lanes=(2, 2)),
                torch_path(expanded.contiguous(), 16, 400, 1, 1, 6, lanes=(2, 2)))
    transposed = coarse((2, 25, 25, 2), 5, device).permute(0, 3, 1, 2)
    assert_same(kernel.budget_rows(transposed, 16, 400, 1, 1, 6, lanes=(2, 2)),
                torch_path(transposed.contiguous(), 16, 400, 1, 1, 6, lanes=(2, 2)))


def test_bf16_scores_rank_as_float32(device):
    scores = torch.randn(1, 2, 25, 25, device=device).to(torch.bfloat16)
    assert_same(kernel.budget_rows(scores, 16, 400, 1, 1, 5, lanes=(1, 2)),
                torch_path(scores, 16, 400, 1, 1, 5, lanes=(1, 2)))


def test_every_row_has_the_rule_width_and_its_best_candidates(device):
    """Independent of the torch path: each row's width is budget_row_widths', its blocks are the sinks, the
    window and the best-scored candidates (the lowest indices among equal scores)."""
    nb, sinks, window, budget = 27, 2, 1, 4
    scores = coarse((nb, nb), 6, device, levels=1)
    got = kernel.budget_rows(scores, 16, nb * 16, sinks, window, budget)
    widths = budget_row_widths(np.arange(nb), sinks, window, budget)
    offsets, indices, s = got.offsets.cpu().long(), got.indices.cpu().long(), scores.cpu().double()
    assert torch.equal(offsets.diff(), torch.as_tensor(widths))
    for qb in range(nb):
        row = indices[offsets[qb]:offsets[qb + 1]].tolist()
        base = [kb for kb in range(min(sinks, max(qb - window, 0)))] + list(range(max(qb - window, 0), qb + 1))
        candidates = list(range(sinks, max(qb - window, sinks)))
        best = sorted(candidates, key=lambda kb: (-s[qb, kb].item(), kb))[:budget]
        assert row == sorted(base + best), qb


def test_schedule_from_scores_uses_the_kernel_on_a_gpu(monkeypatch):
    """On a CUDA device, float32 scores take the kernel (its result is the torch path's, above); float64 scores
    and the CPU keep the torch path."""
    from topo_attn.selection import selectors

    calls = []
    real = kernel.budget_rows
    monkeypatch.setattr(kernel, "budget_rows", lambda *a, **k: calls.append(a[0].dtype) or real(*a, **k))
    scores = torch.randn(2, 2, 10, 10)
    want = torch_path(scores, 16, 160, 1, 1, 3, lanes=(2, 2))
    assert_same(selectors.schedule_from_scores(scores, 16, 160, 1, 1, 3), want)
    assert calls == []  # the CPU: the torch path
    if torch.cuda.is_available():
        got = selectors.schedule_from_scores(scores.cuda(), 16, 160, 1, 1, 3)
        assert calls == [torch.float32]
        assert_same(got, want)
        selectors.schedule_from_scores(scores.cuda().double(), 16, 160, 1, 1, 3)
        assert calls == [torch.float32]


def test_applies():
    assert kernel.applies(torch.zeros(2, 2)) and kernel.applies(torch.zeros(2, 2, dtype=torch.bfloat16))
    assert not kernel.applies(torch.zeros(2, 2, dtype=torch.float64))
    assert not kernel.applies(torch.zeros(1, kernel.MAX_BLOCKS + 1))


def test_a_schedule_too_large_for_int32_offsets_is_refused_before_any_work():
    """512 lanes of 8192 rows with a budget of 1024 would hold more than 2**31 - 1 entries: a ValueError from the
    sizes alone (the scores are an expanded view of one number, so nothing of that size exists)."""
    from topo_attn.selection import selectors

    scores = torch.zeros(1, 1, 1, 1).expand(512, 1, 8192, 8192)
    with pytest.raises(ValueError, match="int32 offsets"):
        selectors.schedule_from_scores(scores, 64, 8192 * 64, 1, 1, 1024)
    small = torch.zeros(1, 1, 1, 1).expand(2, 1, 64, 64)
    assert selectors.schedule_from_scores(small, 64, 64 * 64, 1, 1, 4).nnz > 0
