"""The rule (``topo_attn.rule``): its rows against a per-row loop, its base mask, and ``schedule_sources``
labelling exactly the blocks of ``schedule_from_salience``, each by the part of the rule (sink, window,
topology) that picks it first."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import topo_attn as ta
from topo_attn.rule import (SINK, SKIPPED, TOPOLOGY, WINDOW, base_block_mask, clamp_to_blocks, rule_schedule,
                            source_labels)


def salience_for(seq_len: int, block_size: int, lanes: int = 0, seed: int = 0) -> torch.Tensor:
    """Salience of random keys ([n], or [lanes, n]); ties included (a single block gets 1, some blocks 0)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (seq_len, 8) if not lanes else (lanes, 1, seq_len, 8)
    keys = torch.randn(*shape, generator=gen)
    sal = ta.block_salience(ta.block_centroids(keys, block_size))
    return sal if not lanes else sal[:, 0]


def check(salience: torch.Tensor, block_size: int, seq_len: int, window: int, sinks: int, topk: int) -> None:
    lanes = None if salience.ndim == 1 else (salience.shape[0], 1)
    schedule = ta.schedule_from_salience(salience, block_size, seq_len, window, sinks, topk, lanes)
    labels = ta.schedule_sources(salience, block_size, seq_len, window, sinks, topk)
    n = schedule.num_blocks
    assert labels.dtype == torch.int8 and labels.shape == (*salience.shape[:-1], n, n)
    mask = schedule.to_block_mask()
    assert torch.equal(labels.reshape(mask.shape) > SKIPPED, mask)  # the union of labelled blocks
    qb, kb = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    flat = labels.reshape(-1, n, n)
    for lane in range(flat.shape[0]):
        top = set(ta.top_salient_blocks(salience.reshape(-1, n)[lane], topk).tolist())
        lab = flat[lane]
        assert torch.equal(lab == SINK, (kb < sinks) & (kb <= qb))
        assert torch.equal(lab == WINDOW, (kb >= sinks) & (kb >= qb - window) & (kb <= qb))
        is_top = torch.tensor([b in top for b in range(n)])[None, :].expand(n, n)
        assert torch.equal(lab == TOPOLOGY, is_top & (kb < qb - window) & (kb >= sinks))


@pytest.mark.parametrize("seq_len, block_size", [(97, 16), (128, 32), (1000, 64), (64, 64), (50, 7)])
def test_labels_match_schedule_grid(seq_len: int, block_size: int) -> None:
    sal = salience_for(seq_len, block_size, seed=seq_len)
    n = -(-seq_len // block_size)
    for window, sinks, topk in itertools.product((0, 1, 3, n + 2), (0, 1, 2, n + 1), (0, 1, 4, n + 5)):
        check(sal, block_size, seq_len, window, sinks, topk)


def test_labels_per_lane() -> None:
    sal = salience_for(300, 32, lanes=3, seed=1)
    check(sal, 32, 300, 1, 1, 3)


@settings(max_examples=40, deadline=None)
@given(seq_len=st.integers(1, 400), block_size=st.sampled_from([1, 16, 32, 64]), window=st.integers(0, 6),
       sinks=st.integers(0, 4), topk=st.integers(0, 8), seed=st.integers(0, 10))
def test_labels_match_schedule_random(seq_len, block_size, window, sinks, topk, seed) -> None:
    check(salience_for(seq_len, block_size, seed=seed), block_size, seq_len, window, sinks, topk)


def test_labels_of_a_small_case() -> None:
    """Four blocks, block 3 the most salient: row 3 sees the sink 0 and the window 2..3 (3 is both window and
    top-1, labelled window); with no sink and no window, block 1 (second most salient) is topology."""
    sal = torch.tensor([0.0, 1.0, 0.5, 9.0], dtype=torch.float64)
    labels = ta.schedule_sources(sal, 16, 64, window=1, sinks=1, topk=1)
    assert labels.tolist() == [[1, 0, 0, 0], [1, 2, 0, 0], [1, 2, 2, 0], [1, 0, 2, 2]]
    labels = ta.schedule_sources(sal, 16, 64, window=0, sinks=0, topk=2)
    assert labels.tolist() == [[2, 0, 0, 0], [0, 2, 0, 0], [0, 3, 2, 0], [0, 3, 0, 2]]  # top-2: blocks 3, 1
    assert [ta.SOURCE_NAMES[i] for i in range(4)] == ["skipped", "sink", "window", "topology"]


@pytest.mark.parametrize("kwargs, error", [
    (dict(window=-1), ValueError), (dict(topk=1.5), TypeError), (dict(seq_len=100), ValueError)])
def test_bad_arguments_raise(kwargs, error) -> None:
    args = dict(salience=torch.zeros(4, dtype=torch.float64), block_size=16, seq_len=64, window=1, sinks=1, topk=1)
    with pytest.raises(error):
        ta.schedule_sources(**{**args, **kwargs})


def loop_rows(top: list[int], nb: int, sinks: int, window: int) -> list[list[int]]:
    """The rule row by row: sinks ``< qb + 1``, the window ``max(0, qb - window)..qb`` and the top blocks in
    ``0..qb``, sorted."""
    rows = []
    for qb in range(nb):
        chosen = {b for b in range(sinks) if b <= qb} | set(range(max(0, qb - window), qb + 1))
        chosen |= {b for b in top if 0 <= b <= qb}
        rows.append(sorted(chosen))
    return rows


@settings(max_examples=60, deadline=None)
@given(nb=st.integers(1, 40), lanes=st.integers(1, 3), k=st.integers(0, 6), sinks=st.integers(0, 45),
       window=st.integers(0, 45), seed=st.integers(0, 100))
def test_rule_rows_match_a_loop(nb, lanes, k, sinks, window, seed) -> None:
    """Any top blocks (duplicates, negative or past the last block included) give the loop's rows."""
    gen = torch.Generator().manual_seed(seed)
    top = torch.randint(-2, nb + 2, (lanes, k), generator=gen)
    schedule = rule_schedule(top, 16, nb * 16 - 5 if nb > 1 else 16, sinks, window,
                             None if lanes == 1 else (lanes, 1))
    schedule.validate()
    assert schedule.offsets.dtype == schedule.indices.dtype == torch.int32
    offsets, indices = schedule.offsets.tolist(), schedule.indices.tolist()
    for lane in range(lanes):
        for qb, want in enumerate(loop_rows(top[lane].tolist(), nb, sinks, window)):
            row = lane * nb + qb
            assert indices[offsets[row]:offsets[row + 1]] == want, (lane, qb)


def test_base_mask_is_the_rule_without_top_blocks() -> None:
    for nb, sinks, window in itertools.product((1, 2, 7), (0, 1, 3, 9), (0, 1, 2, 9)):
        base = base_block_mask(nb, sinks, window)
        assert base.dtype == torch.bool and base.shape == (nb, nb)
        none = rule_schedule(torch.zeros(1, 0, dtype=torch.int64), 8, 8 * nb, sinks, window)
        assert torch.equal(base, none.to_block_mask())
        want = torch.tensor([[kb in row for kb in range(nb)] for row in loop_rows([], nb, sinks, window)])
        assert torch.equal(base, want)
    assert clamp_to_blocks(5, 9, 7, 6) == (5, 5, 4) and clamp_to_blocks(5, 2, 1, 3) == (2, 1, 3)


def test_source_labels_of_any_mask() -> None:
    """Labels follow the order sink, window, topology for any mask, e.g. a selector's, not only the rule's."""
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert source_labels(mask, sinks=1, window=0).tolist() == [[1, 0, 0, 0], [1, 2, 0, 0], [0, 3, 2, 0],
                                                               [1, 3, 0, 2]]
    assert source_labels(mask[None].expand(2, 4, 4), 0, 1).shape == (2, 4, 4)


@pytest.mark.parametrize("call, error", [
    (lambda: rule_schedule(torch.zeros(1, 2), 16, 64, 1, 1), TypeError),
    (lambda: rule_schedule(torch.zeros(2, dtype=torch.int64), 16, 64, 1, 1), ValueError),
    (lambda: rule_schedule(torch.zeros(2, 1, dtype=torch.int64), 16, 64, 1, 1), ValueError),
    (lambda: rule_schedule(torch.zeros(1, 1, dtype=torch.int64), 16, 64, -1, 1), ValueError),
    (lambda: source_labels(torch.ones(3, 3, dtype=torch.int8), 1, 1), TypeError),
    (lambda: source_labels(torch.ones(3, 4, dtype=torch.bool), 1, 1), ValueError),
])
def test_rule_bad_arguments_raise(call, error) -> None:
    with pytest.raises(error):
        call()
