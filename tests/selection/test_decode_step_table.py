"""decode_step_table: a one-token step's statistics update and block table, in one launch on the kernel path
(fused=True, the custom op topo_attn::static_step_update_table) against the two calls of the torch path
(StaticBlockStats.update, then step_block_table): step by step over a garbage-filled static cache, the same
statistics (up to float32 rounding of the sums), the same kept salience, and the table the kernel's own ranking
gives over the statistics it wrote; nothing past the step's block written; one traced graph for every length;
the errors."""

from __future__ import annotations

import pytest
import torch
from helpers import garbage_static_cache
from torch._dynamo.testing import CompileCounter

from topo_attn.selection.static_step import (STATIC_SELECTORS, StaticBlockStats, decode_step_table,
                                             step_block_table)

BS = 8


def _prefilled(buffer: torch.Tensor, keys: torch.Tensor, prefix: int, device: str) -> StaticBlockStats:
    """Statistics (with the kept salience) after a prefill of ``prefix`` keys written into ``buffer``."""
    buffer[..., :prefix, :] = keys[..., :prefix, :]
    stats = StaticBlockStats.for_cache(buffer, BS, salience=True)
    return stats.update(buffer, torch.tensor(0, device=device), prefix)


@pytest.mark.parametrize("selector", STATIC_SELECTORS)
@pytest.mark.parametrize("sinks, window, budget", [(1, 1, 3), (2, 0, 30)])
def test_one_launch_equals_the_two_calls_step_by_step(selector, sinks, window, budget, device):
    """From a 13-key prefill, one key per step to a full cache of 152 (19 blocks, every completion): after each
    step the kernel's statistics equal the torch path's (centroids, minima, maxima up to rounding; the kept
    salience of every complete block up to rounding), and its table is the table of its own statistics."""
    buffer, keys = garbage_static_cache(2, 2, 152, 16, seed=sinks + 5 * budget)
    buffer, keys = buffer.to(device), keys.to(device)
    q = torch.randn(2, 4, 1, 16, generator=torch.Generator().manual_seed(budget)).to(device)
    fused, torch_path = (_prefilled(buffer.clone(), keys, 13, device) for _ in range(2))
    cache_fused, cache_torch = buffer.clone(), buffer.clone()
    cache_fused[..., :13, :] = cache_torch[..., :13, :] = keys[..., :13, :]
    for n in range(14, 153):
        for cache in (cache_fused, cache_torch):
            cache[..., n - 1, :] = keys[..., n - 1, :]
        length = torch.tensor([n], device=device)
        table = decode_step_table(selector, q, cache_fused, fused, length, sinks, window, budget, fused=True)
        want = decode_step_table(selector, q, cache_torch, torch_path, length, sinks, window, budget, fused=False)
        blocks, complete = -(-n // BS), n // BS
        for got, expected in ((fused.centroids, torch_path.centroids), (fused.lo, torch_path.lo),
                              (fused.hi, torch_path.hi)):
            torch.testing.assert_close(got[:, :, :blocks], expected[:, :, :blocks], rtol=1e-5, atol=1e-6,
                                       msg=f"statistics after length {n}")
        torch.testing.assert_close(fused.salience[:, :, :complete], torch_path.salience[:, :, :complete],
                                   rtol=1e-5, atol=1e-6, msg=f"kept salience after length {n}")
        assert torch.equal(table, step_block_table(selector, q, fused, length, sinks, window, budget, fused=True))
        base = sinks + window + 1
        assert torch.equal(table[..., :base], want[..., :base]), f"length {n}"
        assert table.shape == want.shape == (2, 2, base + budget)


def test_only_the_steps_block_is_written(device):
    """A step writes the statistics of the block holding its key and nothing else: every other block (and the
    kept salience, when the key does not complete its block) stays as it was, garbage included."""
    buffer, keys = garbage_static_cache(1, 2, 64, 8, seed=3)
    buffer, keys = buffer.to(device), keys.to(device)
    stats = _prefilled(buffer, keys, 20, device)
    for values in (stats.centroids, stats.lo, stats.hi, stats.salience):
        values[:, :, 3:].fill_(7.0)  # blocks 3.. : never written by a key at position 20 (block 2)
    before = [v.clone() for v in (stats.centroids, stats.lo, stats.hi, stats.salience)]
    buffer[..., 20, :] = keys[..., 20, :]
    q = torch.randn(1, 2, 1, 8, generator=torch.Generator().manual_seed(4)).to(device)
    decode_step_table("topology", q, buffer, stats, torch.tensor(21, device=device), fused=True)
    for now, then in zip((stats.centroids, stats.lo, stats.hi, stats.salience), before):
        changed = (now != then).any(-1) if now.ndim == 4 else (now != then)
        assert changed[..., [0, 1]].logical_not().all() and changed[..., 3:].logical_not().all()
    assert (stats.centroids[:, :, 2] != before[0][:, :, 2]).any()  # block 2 took key 20
    torch.testing.assert_close(stats.centroids[:, :, 2], buffer[..., 16:21, :].mean(-2))


@pytest.mark.parametrize("selector", ["topology", "quest"])
def test_one_traced_graph_serves_every_length(selector, device):
    """torch.compile(fullgraph=True) around decode_step_table(fused=True): one frame for every length, the
    statistics it mutates and the tables equal to the eager calls'."""
    torch._dynamo.reset()
    buffer, keys = garbage_static_cache(1, 2, 96, 16, seed=6)
    buffer, keys = buffer.to(device), keys.to(device)
    q = torch.randn(1, 4, 1, 16, generator=torch.Generator().manual_seed(7)).to(device)
    eager, compiled_stats = (_prefilled(buffer.clone(), keys, 30, device) for _ in range(2))
    buffer[..., :30, :] = keys[..., :30, :]

    def step(stats, length):
        return decode_step_table(selector, q, buffer, stats, length, 1, 1, 3, fused=True)

    counter = CompileCounter()
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    length = torch.tensor([31], device=device)
    for n in range(31, 50):
        buffer[..., n - 1, :] = keys[..., n - 1, :]
        length.fill_(n)
        assert torch.equal(compiled(compiled_stats, length), step(eager, length))
        for got, want in ((compiled_stats.centroids, eager.centroids), (compiled_stats.salience, eager.salience)):
            assert torch.equal(got, want), f"length {n}"
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_bad_arguments_raise(device):
    """Before any launch: keys that are not the whole cache, float64 statistics for the kernel, topology without
    a kept salience, a wrong length."""
    buffer, _ = garbage_static_cache(1, 1, 40, 8, seed=9)
    buffer = buffer.to(device)
    q = torch.randn(1, 2, 1, 8).to(device)
    stats = StaticBlockStats.for_cache(buffer, BS, salience=True)
    float64 = StaticBlockStats(1, 1, 40, 8, BS, torch.float64, device)
    length = torch.tensor(9, device=device)
    with pytest.raises(ValueError, match=r"keys must be the whole static cache of shape \[1, 1, 40, 8\]"):
        decode_step_table("quest", q, buffer[..., :20, :], stats, length)
    with pytest.raises(ValueError, match="fused=True: the kernel updates float32 statistics, got torch.float64"):
        decode_step_table("window", q, buffer, float64, length, fused=True)
    with pytest.raises(ValueError, match="make the statistics with salience=True"):
        decode_step_table("topology", q, buffer, StaticBlockStats.for_cache(buffer, BS), length)
    with pytest.raises(TypeError, match="length"):
        decode_step_table("quest", q, buffer, stats, 9)
    assert torch.equal(stats.lo, torch.zeros_like(stats.lo))  # nothing was written


def test_topology_keeps_its_rows_between_block_boundaries(device):
    """With the kept-row buffers (StaticBlockStats.kept_table) the kernel gives, step by step, the rows it gives
    without them, and does reuse: a salience changed by hand inside a block leaves the next step's row as it
    was, and the row follows the change at the next boundary. A step that does not follow the last one (a jump,
    or after update, which forgets the kept rows) computes its rows."""
    sinks, window, budget = 1, 1, 3
    buffer, keys = garbage_static_cache(1, 2, 96, 16, seed=12)
    buffer, keys = buffer.to(device), keys.to(device)
    q = torch.randn(1, 4, 1, 16, generator=torch.Generator().manual_seed(13)).to(device)
    keeping, plain = (_prefilled(buffer.clone(), keys, 21, device) for _ in range(2))
    kept, last = keeping.kept_table(sinks, window, budget)
    assert (last == -1).all() and kept.shape == (1, 2, sinks + window + 1 + budget)
    buffer[..., :21, :] = keys[..., :21, :]

    def step(stats, n):
        return decode_step_table("topology", q, buffer, stats, torch.tensor(n, device=device), sinks, window,
                                 budget, fused=True)

    for n in range(22, 60):
        buffer[..., n - 1, :] = keys[..., n - 1, :]
        assert torch.equal(step(keeping, n), step(plain, n)), f"length {n}"
        assert (last == n).all() and torch.equal(kept, step(plain, n))
    # inside block 7 (lengths 57 .. 64): a salience changed by hand (the chosen blocks' bars set to 0) is not
    # looked at until the block completes
    before = kept.clone()
    chosen = before[..., sinks + window + 1:].long()
    keeping.salience.scatter_(2, chosen, 0.0)
    buffer[..., 59, :] = keys[..., 59, :]
    assert torch.equal(step(keeping, 60), before)
    length = torch.tensor(60, device=device)
    assert not torch.equal(step_block_table("topology", q, keeping, length, sinks, window, budget, fused=True),
                           before)  # what a computed row would have been
    for n in range(61, 65):
        buffer[..., n - 1, :] = keys[..., n - 1, :]
        table = step(keeping, n)
    length = torch.tensor(64, device=device)
    assert torch.equal(table, step_block_table("topology", q, keeping, length, sinks, window, budget, fused=True))
    assert not torch.equal(table, before)
    # a jump, and an update, make the kernel compute
    keeping.update(buffer, torch.tensor(0, device=device), 64)
    assert (last == -1).all()
    assert torch.equal(step(keeping, 64), step(plain, 64)) and (last == 64).all()
    assert torch.equal(step(keeping, 70), step(plain, 70))
