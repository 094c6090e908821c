"""Selection for a decode step over a static key cache (topo_attn.selection.static_step): the statistics kept in
place equal KeyBlockStats' whatever lies past the length, the step's table holds select_for_queries' blocks (for
topology: the ranking of the kept salience, tests/selection/test_kept_salience.py), one traced graph serves every
length, and the errors."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from helpers import garbage_static_cache, write_in_steps, write_static_keys
from topo_attn.rule import budget_row_widths
from topo_attn.selection.incremental import KeyBlockStats, select_for_queries
from topo_attn.selection.registry import SELECTORS, names
from topo_attn.selection.static_step import STATIC_SELECTORS, StaticBlockStats, step_block_table
from topo_attn.selection.stats import key_block_bounds
from topo_attn.topology import block_centroids

BS = 8


def _rows(table: torch.Tensor) -> list[list[int]]:
    return [[b for b in row if b >= 0] for row in table.reshape(-1, table.shape[-1]).tolist()]


def _schedule_rows(schedule) -> list[set[int]]:
    offsets, indices = schedule.offsets.tolist(), schedule.indices.tolist()
    return [set(indices[a:b]) for a, b in pairwise(offsets)]


def _check_table(table, length: int, sinks: int, window: int, budget: int, adds: bool = True) -> list[list[int]]:
    """Width, dtype, -1 in the empty slots only, no duplicate, causal, and the budget rule's row width (``adds``:
    the selector adds blocks; ``window`` adds none)."""
    assert table.dtype == torch.int32 and table.shape[-1] == sinks + window + 1 + budget
    assert bool((table >= -1).all())
    rows = _rows(table)
    width = int(budget_row_widths(torch.tensor((length - 1) // BS), sinks, window, budget if adds else 0))
    for row in rows:
        assert len(set(row)) == len(row) == width
        assert max(row) < -(-length // BS)
    return rows


def _check_stats(stats: StaticBlockStats, keys: torch.Tensor, length: int) -> None:
    """Complete blocks equal KeyBlockStats', the partial block its real keys' statistics, nothing NaN anywhere."""
    dtype = stats.lo.dtype
    kept = KeyBlockStats(BS).update(keys[..., :length, :])
    complete = kept.complete
    if complete:
        assert torch.equal(stats.lo[..., :complete, :], kept.lo.to(dtype))
        assert torch.equal(stats.hi[..., :complete, :], kept.hi.to(dtype))
        torch.testing.assert_close(stats.centroids[..., :complete, :], kept.centroids.to(dtype))
    if length % BS:
        lo, hi = key_block_bounds(keys[..., :length, :], BS, dtype)
        assert torch.equal(stats.lo[..., complete, :], lo[..., -1, :])
        assert torch.equal(stats.hi[..., complete, :], hi[..., -1, :])
        torch.testing.assert_close(stats.centroids[..., complete, :],
                                   block_centroids(keys[..., :length, :], BS, dtype)[..., -1, :])
    for buffer in (stats.centroids, stats.lo, stats.hi):
        assert bool(torch.isfinite(buffer).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("max_len, prefill, chunk, last", [(150, 37, 11, 13), (128, 16, 20, 16), (97, 1, 8, 1)])
def test_update_keeps_the_block_statistics(dtype, max_len, prefill, chunk, last):
    """A prefill, a chunk, decode steps across block boundaries and a last chunk up to S_max: after each, the
    statistics are those of the keys so far, the garbage past them never leaks, the buffers stay in place; a
    second prompt written from position 0 over the first one's statistics too."""
    buffer, keys = garbage_static_cache(2, 3, max_len, 8, seed=max_len + prefill)
    stats = StaticBlockStats.for_cache(buffer, BS, dtype)
    pointers = [t.data_ptr() for t in (stats.centroids, stats.lo, stats.hi)]
    write_in_steps(buffer, keys, stats, prefill, chunk, last, _check_stats)
    second = torch.randn(keys.shape, generator=torch.Generator().manual_seed(max_len), dtype=keys.dtype)
    buffer[...] = float("nan")
    _check_stats(stats.update(buffer.copy_(second), torch.tensor(0), prefill + chunk), second, prefill + chunk)
    assert [t.data_ptr() for t in (stats.centroids, stats.lo, stats.hi)] == pointers


def test_the_registry_says_which_selectors_have_a_static_step():
    assert STATIC_SELECTORS == names("step", static_step=True) == ("window", "topology", "centroid", "quest")
    assert all(SELECTORS[name].step_scores is not None for name in STATIC_SELECTORS)


CONFIGS = [(1, 1, 3), (0, 0, 2), (2, 2, 4), (1, 0, 0), (0, 1, 1), (2, 1, 30)]  # budget 30 > nb_max = 19
EXACT = tuple(name for name in STATIC_SELECTORS if name != "topology")
"""The selectors whose step ranks what select_for_queries ranks (topology ranks its kept salience)."""


@pytest.mark.parametrize("selector", EXACT)
@pytest.mark.parametrize("sinks, window, budget", CONFIGS)
def test_the_table_holds_the_blocks_of_select_for_queries(selector, sinks, window, budget):
    """Decoding from length 1 to S_max (GQA, B = 2, float64 statistics): the rows of every step of the first
    blocks, around every block boundary and of every fifth step otherwise hold exactly the blocks
    select_for_queries chooses for that step, once each."""
    buffer, keys = garbage_static_cache(2, 2, 150, 8, seed=sinks + 3 * window + 7 * budget)
    stats, kept = StaticBlockStats.for_cache(buffer, BS, torch.float64), KeyBlockStats(BS)
    gen = torch.Generator().manual_seed(budget)
    for start in range(150):
        length = write_static_keys(buffer, keys, stats, start, 1)
        if length > 3 * BS and length % BS not in (0, 1, 2) and length % 5:
            continue
        q = torch.randn(2, 4, 1, 8, generator=gen)
        table = step_block_table(selector, q, stats, torch.tensor(length), sinks, window, budget)
        rows = _check_table(table, length, sinks, window, budget, SELECTORS[selector].adds_blocks)
        want = select_for_queries(selector, q, keys[..., :length, :], BS, sinks, window, budget, kept)
        assert [set(row) for row in rows] == _schedule_rows(want), f"length {length}"


@pytest.mark.parametrize("selector", ["quest", "centroid"])
def test_float32_statistics_choose_blocks_as_good(selector):
    """float32 statistics (the default) keep the base and choose candidates whose float64 scores sum to those of
    select_for_queries' choice (they may differ at a near tie only)."""
    sinks, window, budget = 1, 1, 3
    buffer, keys = garbage_static_cache(2, 2, 200, 16, seed=11)
    stats, kept = StaticBlockStats.for_cache(buffer, BS), KeyBlockStats(BS)
    chooser, gen = SELECTORS[selector], torch.Generator().manual_seed(12)
    for start in range(200):
        length = write_static_keys(buffer, keys, stats, start, 1)
        q = torch.randn(2, 4, 1, 16, generator=gen)
        rows = _check_table(step_block_table(selector, q, stats, torch.tensor(length), sinks, window, budget),
                            length, sinks, window, budget)
        want = _schedule_rows(select_for_queries(selector, q, keys[..., :length, :], BS, sinks, window, budget))
        qb = (length - 1) // BS
        if qb - window <= sinks:  # no candidate
            assert [set(row) for row in rows] == want
            continue
        kept.update(keys[..., :length, :])
        scores = chooser.step_scores(q, kept, qb, torch.zeros(1, dtype=torch.int64), 1, length, 0)
        scores = scores.reshape(4, -1)
        for lane, (row, wanted) in enumerate(zip(rows, want)):
            picked = {b for b in row if sinks <= b < qb - window}
            chosen = {b for b in wanted if sinks <= b < qb - window}
            assert set(row) - picked == wanted - chosen and len(picked) == len(chosen)
            total, best = (float(sum(scores[lane, b] for b in blocks)) for blocks in (picked, chosen))
            assert total == pytest.approx(best, rel=1e-5, abs=1e-5), f"length {length}"


@pytest.mark.parametrize("selector, dtype", [("quest", torch.float32), ("centroid", torch.float64),
                                             ("topology", torch.float32)])
def test_one_traced_graph_serves_every_step(selector, dtype):
    """update + step_block_table trace to one graph without a break (fullgraph), and later steps at other lengths
    and positions (inside a block, completing one, after one) run it again without recompiling, with the eager
    results."""
    torch._dynamo.reset()
    buffer, keys = garbage_static_cache(2, 2, 120, 8, seed=13)
    buffer[...] = keys
    salience = selector == "topology"
    traced, eager = (StaticBlockStats.for_cache(buffer, BS, dtype, salience) for _ in range(2))
    for stats in (traced, eager):
        stats.update(buffer, torch.tensor(0), 30)

    def step(stats, start, length, q):
        stats.update(buffer, start, 1)
        return step_block_table(selector, q, stats, length, 1, 1, 2)

    counter = CompileCounter()
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    gen = torch.Generator().manual_seed(14)
    for position in (30, 31, 32, 47, 48, 90, 95):
        q = torch.randn(2, 4, 1, 8, generator=gen)
        start, length = torch.tensor([position]), torch.tensor([position + 1])
        got, want = compiled(traced, start, length, q), step(eager, start, length, q)
        assert [set(row) for row in _rows(got)] == [set(row) for row in _rows(want)]
        assert torch.equal(traced.centroids, eager.centroids) and torch.equal(traced.hi, eager.hi)
        if salience:
            assert torch.equal(traced.salience, eager.salience)
    assert counter.frame_count == 1


def _error_cases():
    meta = torch.empty(2, 2, 1, 8, device="meta")
    update_cases = [
        (lambda s, k, q: s.update(k[..., :-1, :], torch.tensor(0), 1), ValueError, "whole static cache"),
        (lambda s, k, q: s.update(k.to(torch.int32), torch.tensor(0), 1), TypeError, "floating-point"),
        (lambda s, k, q: s.update(k.to("meta"), torch.tensor(0), 1), ValueError, "keys are on meta"),
        (lambda s, k, q: s.update(k, 0, 1), TypeError, "start must be a torch.Tensor"),
        (lambda s, k, q: s.update(k, torch.tensor(0.0), 1), TypeError, "start must be an integer tensor"),
        (lambda s, k, q: s.update(k, torch.tensor([0, 1]), 1), ValueError, "start must hold one element"),
        (lambda s, k, q: s.update(k, torch.tensor(0, device="meta"), 1), ValueError, "start is on meta"),
        (lambda s, k, q: s.update(k, torch.tensor(0), 0), ValueError, "q_len must be >= 1"),
        (lambda s, k, q: s.update(k, torch.tensor(0), True), TypeError, "q_len must be an int"),
        (lambda s, k, q: s.update(k, torch.tensor(0), 41), ValueError, "q_len must be <= the cache's 40"),
    ]
    step_cases = [
        (lambda s, k, q: step_block_table("random", q, s, torch.tensor(9)), ValueError,
         r"must be one of \['window', 'topology', 'centroid', 'quest'\]"),
        (lambda s, k, q: step_block_table("topology", q, StaticBlockStats(2, 2, 40, 8, BS), torch.tensor(9)),
         ValueError, "make the statistics with salience=True"),
        (lambda s, k, q: step_block_table(3, q, s, torch.tensor(9)), TypeError, "selector must be a str"),
        (lambda s, k, q: step_block_table("quest", q, KeyBlockStats(BS), torch.tensor(9)), TypeError,
         "stats must be a StaticBlockStats"),
        (lambda s, k, q: step_block_table("quest", q.expand(2, 4, 2, 8), s, torch.tensor(9)), ValueError,
         r"q must have shape \[B, H, 1, D\]"),
        (lambda s, k, q: step_block_table("quest", q[0], s, torch.tensor(9)), ValueError, r"\[B, H, 1, D\]"),
        (lambda s, k, q: step_block_table("quest", q.to(torch.int64), s, torch.tensor(9)), TypeError,
         "q must be a floating-point"),
        (lambda s, k, q: step_block_table("quest", q[:, :3], s, torch.tensor(9)), ValueError, "a multiple of 2"),
        (lambda s, k, q: step_block_table("quest", q[..., :4], s, torch.tensor(9)), ValueError, "got shape"),
        (lambda s, k, q: step_block_table("quest", q[:1], s, torch.tensor(9)), ValueError, r"\[2, a multiple"),
        (lambda s, k, q: step_block_table("quest", meta, s, torch.tensor(9)), ValueError, "q is on meta"),
        (lambda s, k, q: step_block_table("quest", q, s, torch.tensor(9.0)), TypeError, "length must be an int"),
        (lambda s, k, q: step_block_table("quest", q, s, torch.tensor(True)), TypeError, "length must be an int"),
        (lambda s, k, q: step_block_table("quest", q, s, torch.tensor([9, 9])), ValueError, "one element"),
        (lambda s, k, q: step_block_table("quest", q, s, 9), TypeError, "length must be a torch.Tensor"),
        (lambda s, k, q: step_block_table("quest", q, s, torch.tensor(9), sinks=-1), ValueError, "sinks must be"),
        (lambda s, k, q: step_block_table("quest", q, s, torch.tensor(9), budget=2.0), TypeError, "budget must"),
    ]
    build_cases = [
        (lambda s, k, q: StaticBlockStats(2, 2, 40, 8, 0), ValueError, "block_size must be >= 1"),
        (lambda s, k, q: StaticBlockStats(2, 2, 40, 8, BS, torch.float16), TypeError, "dtype must be"),
        (lambda s, k, q: StaticBlockStats(2, 2, 40, 8, BS, salience=1), TypeError, "salience must be a bool"),
        (lambda s, k, q: StaticBlockStats.for_cache(k, BS, salience="yes"), TypeError, "salience must be a bool"),
        (lambda s, k, q: StaticBlockStats.for_cache(k[0], BS), ValueError, r"\[B, H_kv, S_max, D\]"),
    ]
    return update_cases + step_cases + build_cases


@pytest.mark.parametrize("case", range(len(_error_cases())))
def test_errors_raise_before_any_work(case):
    """Each bad argument raises naming it; the statistics (the kept salience too) are left as they were (the keys
    given differ from the ones they hold, so an update that went ahead would change them)."""
    call, error, match = _error_cases()[case]
    gen = torch.Generator().manual_seed(case)
    stats = StaticBlockStats(2, 2, 40, 8, BS, salience=True)
    stats.update(torch.randn(2, 2, 40, 8, generator=gen), torch.tensor(0), 40)
    buffers = (stats.centroids, stats.lo, stats.hi, stats.salience)
    before = [t.clone() for t in buffers]
    with pytest.raises(error, match=match):
        call(stats, torch.randn(2, 2, 40, 8, generator=gen), torch.randn(2, 4, 1, 8, generator=gen))
    assert all(torch.equal(a, b) for a, b in zip(before, buffers))
