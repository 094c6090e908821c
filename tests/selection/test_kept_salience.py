"""topology's kept salience over a static cache (topo_attn.selection.kept_salience through StaticBlockStats): the
buffer equals the rule computed by a direct float64 loop whatever the updates' sizes and whatever lies past the
length; a hand-worked case; where the rule is exact by construction (far outliers around one point) the step
chooses select_for_queries' blocks at every step; where it is not (a far pair), it differs as documented."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import garbage_static_cache, write_in_steps, write_static_keys
from topo_attn.selection.incremental import KeyBlockStats, select_for_queries
from topo_attn.selection.static_step import StaticBlockStats, step_block_table
from topo_attn.topology import block_centroids, block_salience

BS = 8


def rule_by_loop(centroids: torch.Tensor) -> list[float]:
    """The kept salience of blocks ``0 .. n - 1`` completed one after the other, in float64 Python floats, written
    out from the rule: the new block's distance to its nearest older block (block 0: inf), then each older block
    ``m`` cut by the path ``m -> new -> o`` with ``o < m``."""
    c = centroids.to(torch.float64).tolist()
    bars: list[float] = []
    for n in range(len(c)):
        dist = [math.dist(c[n], c[o]) for o in range(n)]
        bars.append(min(dist, default=math.inf))
        for m in range(1, n):
            bars[m] = min(bars[m], max(dist[m], min(dist[:m])))
    return bars


def _check_salience(stats: StaticBlockStats, keys: torch.Tensor, length: int) -> None:
    """Every complete block's kept bar equals the loop's, lane by lane (float64 statistics: to rounding; float32:
    to float32 rounding of the distances)."""
    complete = length // BS
    if not complete:
        return
    centroids = block_centroids(keys[..., :complete * BS, :], BS)  # float64 [B, H_kv, complete, D]
    want = torch.tensor([rule_by_loop(lane) for lane in centroids.reshape(-1, complete, keys.shape[-1])],
                        dtype=torch.float64).reshape(centroids.shape[:-1])
    got = stats.salience[..., :complete].to(torch.float64)
    assert torch.isinf(got[..., 0]).all() and torch.isfinite(got[..., 1:]).all()
    tol = dict(rtol=1e-12, atol=1e-12) if stats.salience.dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got[..., 1:], want[..., 1:], **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("max_len, prefill, chunk, last", [(150, 37, 11, 13), (128, 16, 20, 16), (97, 1, 8, 1)])
def test_the_buffer_follows_the_rule(dtype, max_len, prefill, chunk, last):
    """A prefill (several blocks completing in one update), a chunk, one-token steps across block boundaries and
    a last chunk up to S_max, over a cache of garbage: after each update the kept bars of the complete blocks
    equal the loop's; a second prompt written from position 0 starts the rule over; the buffer stays in place."""
    buffer, keys = garbage_static_cache(2, 3, max_len, 8, seed=max_len + prefill)
    stats = StaticBlockStats.for_cache(buffer, BS, dtype, salience=True)
    pointer = stats.salience.data_ptr()
    write_in_steps(buffer, keys, stats, prefill, chunk, last, _check_salience)
    second = torch.randn(keys.shape, generator=torch.Generator().manual_seed(max_len), dtype=keys.dtype)
    buffer[...] = float("nan")
    stats.update(buffer.copy_(second), torch.tensor(0), prefill + chunk)
    _check_salience(stats, second, prefill + chunk)
    assert stats.salience.data_ptr() == pointer


def test_a_hand_worked_case():
    """Blocks on a line at 0, 10, 5, 7.5 (the last one completing in a one-token step): bars inf, then 10; 5 cut
    to 5 by the block at 5 (path 10 -> 5 -> 0) which gets 5; the block at 7.5 gets 2.5 and cuts the block at 5 to
    2.5 (5 -> 7.5 -> 10), not the one at 10 (its path through 7.5 still needs the step 7.5 -> 0)."""
    centres = torch.tensor([0.0, 10.0, 5.0, 7.5], dtype=torch.float64)
    keys = torch.zeros(1, 1, 4 * BS, 2, dtype=torch.float64)
    keys[..., 0] = centres.repeat_interleave(BS)
    stats = StaticBlockStats.for_cache(keys, BS, torch.float64, salience=True)
    stats.update(keys, torch.tensor(0), 2 * BS)
    assert stats.salience[0, 0, :2].tolist() == [math.inf, 10.0]
    stats.update(keys, torch.tensor(2 * BS), 2 * BS - 1)
    assert stats.salience[0, 0, :3].tolist() == [math.inf, 5.0, 5.0]
    stats.update(keys, torch.tensor(4 * BS - 1), 1)
    assert stats.salience[0, 0].tolist() == [math.inf, 5.0, 2.5, 2.5]


def _far_outliers(max_len: int, dim: int) -> torch.Tensor:
    """``[1, 2, max_len, dim]``: every block's keys at one point (the origin; lane 1 shifted), but for outlier
    blocks (from block 3 on, so the rest is already a component of more than one block) on axes of their own at
    distinct radii: each outlier's nearest block is any of the rest (at its radius), two outliers are farther
    apart than either is from the rest. So #22's salience gives each outlier its radius and the rest 0, and so
    does the kept rule (block 0, a sink here, aside)."""
    keys = torch.zeros(1, 2, max_len, dim, dtype=torch.float64)
    keys[:, 1] += 0.25
    for axis, (block, radius) in enumerate([(3, 20.0), (7, 50.0), (8, 30.0), (12, 40.0), (15, 10.0)]):
        keys[:, :, block * BS:(block + 1) * BS, axis] += radius
    return keys


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("budget", [1, 2, 3, 6])
def test_where_the_rule_is_exact_the_step_chooses_as_select_for_queries(dtype, budget):
    """Far outliers around one point: at every one-token step from length 1 to S_max the table holds the blocks of
    select_for_queries (the exact prefix salience), and the kept bars of the candidates equal the exact salience
    of the prefix."""
    keys = _far_outliers(150, 8)
    q = torch.randn(1, 4, 1, 8, generator=torch.Generator().manual_seed(budget), dtype=torch.float64)
    stats, kept = StaticBlockStats.for_cache(keys, BS, dtype, salience=True), KeyBlockStats(BS)
    for start in range(150):
        stats.update(keys, torch.tensor(start), 1)
        length = start + 1
        table = step_block_table("topology", q.to(dtype), stats, torch.tensor(length), 1, 1, budget)
        want = select_for_queries("topology", q, keys[..., :length, :], BS, 1, 1, budget, kept)
        offsets, indices = want.offsets.tolist(), want.indices.tolist()
        assert [{b for b in row if b >= 0} for row in table.reshape(2, -1).tolist()] == \
            [set(indices[a:b]) for a, b in zip(offsets, offsets[1:])], f"length {length}"
        qb = (length - 1) // BS
        if qb >= 2:
            exact = kept.update(keys[..., :length, :]).salience(qb)
            assert torch.equal(stats.salience[..., 1:qb].to(torch.float64), exact[..., 1:].to(dtype).double())


def test_where_the_rule_is_not_exact_a_far_pair():
    """A far pair of blocks (8 and 9, close together, far from a line of blocks): #22's rule gives both the pair's
    distance to the line (the pair is the smaller component); the kept rule gives it to the older block only, the
    younger one its distance to its twin (below block 10's bar, its gap of 0.3 along the line). So with a budget
    of 2 the exact choice is the pair, the kept one block 8 and block 10."""
    keys = torch.zeros(1, 1, 12 * BS, 4, dtype=torch.float64)
    keys[..., :, 0] = torch.arange(12 * BS, dtype=torch.float64) // BS * 0.1  # the rest: a line of small steps
    keys[..., 8 * BS:10 * BS, 1] = 30.0
    keys[..., 9 * BS:10 * BS, 2] = 0.05
    stats = StaticBlockStats.for_cache(keys, BS, torch.float64, salience=True).update(keys, torch.tensor(0),
                                                                                    12 * BS)
    exact = block_salience(block_centroids(keys[..., :11 * BS, :], BS))[0, 0]
    assert exact[8] == exact[9] > 29 and float(stats.salience[0, 0, 8]) == pytest.approx(float(exact[8]), rel=1e-12)
    assert float(stats.salience[0, 0, 9]) == pytest.approx(math.sqrt(0.1 ** 2 + 0.05 ** 2), rel=1e-12)
    q = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    table = step_block_table("topology", q, stats, torch.tensor(12 * BS), 1, 0, 2)
    want = select_for_queries("topology", q, keys, BS, 1, 0, 2)
    assert set(want.indices.tolist()) == {0, 8, 9, 11}
    assert set(table.flatten().tolist()) - {-1} == {0, 8, 11, 10}


@pytest.mark.parametrize("group", [4, 256])
def test_rebuild_gives_the_rule_whatever_came_before(group, monkeypatch):
    """Statistics made without a salience (a prefill, one-token steps) get the loop's bars from rebuild_salience,
    in groups of 4 blocks or in one; a rewrite from a later position leaves bars cut by blocks that are gone (the
    documented limitation), and a rebuild makes them the rule's again."""
    import topo_attn.selection.static_step as module

    monkeypatch.setattr(module, "REBUILD_GROUP", group)
    buffer, keys = garbage_static_cache(2, 2, 150, 8, seed=21)
    plain = StaticBlockStats.for_cache(buffer, BS, torch.float64)
    length = write_static_keys(buffer, keys, plain, 0, 61)
    while length < 83:
        length = write_static_keys(buffer, keys, plain, length, 1)
    assert plain.salience is None
    _check_salience(plain.rebuild_salience(torch.tensor([length])), keys, length)

    kept = StaticBlockStats.for_cache(buffer, BS, torch.float64, salience=True)
    write_static_keys(buffer, keys, kept, 0, 150)
    other = torch.randn(keys.shape, generator=torch.Generator().manual_seed(22), dtype=keys.dtype)
    keys[..., 40:, :] = other[..., 40:, :]
    write_static_keys(buffer, keys, kept, 40, 60)  # a rewrite from position 40 to 100
    with pytest.raises(AssertionError):
        _check_salience(kept, keys, 100)
    _check_salience(kept.rebuild_salience(torch.tensor(100)), keys, 100)


def test_rebuild_checks_its_length():
    stats = StaticBlockStats(1, 1, 40, 8, BS)
    with pytest.raises(TypeError, match="length must be a torch.Tensor"):
        stats.rebuild_salience(40)
    with pytest.raises(TypeError, match="length must be an integer tensor"):
        stats.rebuild_salience(torch.tensor(40.0))
    assert stats.salience is None
