"""The one-launch kernel of a static decode step's block table (topo_attn.selection.static_step_kernel, through
step_block_table(fused=True)) against the torch path (fused=False): the same base in the same slots and the
same chosen blocks, over lengths, rule sizes, GQA and exact ties; one traced graph for every length; the
dispatch and its errors. Scores are exact here (dyadic keys and queries), so the two paths must agree bit for
bit; Gaussian inputs are compared by the float64 scores of what they choose."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import topo_attn.selection.static_step_kernel as kernel
from topo_attn.selection.registry import SELECTORS
from topo_attn.selection.static_step import (FUSED_MAX_BLOCKS, STATIC_SELECTORS, StaticBlockStats,
                                             step_block_table)

BS = 8
LENGTHS = (1, 3, 8, 9, 16, 17, 24, 25, 33, 40, 63, 64, 65, 100, 149, 150)
"""From the first token, inside the first block, at and after block boundaries, to a full cache of 19 blocks."""


def _dyadic(shape, seed: int, levels: int = 8) -> torch.Tensor:
    """Multiples of 1/8 in [-1, 1]: every score below is exact in float32, whatever the order of its sums."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-levels, levels + 1, shape, generator=gen).float() / 8


def _stats(keys: torch.Tensor, block_size: int = BS) -> StaticBlockStats:
    """float32 statistics of the whole static cache ``keys``, the kept salience too (both paths read the same
    buffers)."""
    stats = StaticBlockStats.for_cache(keys, block_size, salience=True)
    return stats.update(keys, torch.tensor(0, device=keys.device), keys.shape[2])


def _budget_part(table: torch.Tensor, base: int) -> torch.Tensor:
    return table[..., base:].sort(-1).values


def assert_same_table(got: torch.Tensor, want: torch.Tensor, sinks: int, window: int, context: str = "") -> None:
    """The same base slot by slot, the same chosen blocks (and -1s) as a multiset: the torch path's order of the
    chosen blocks is not specified."""
    base = sinks + window + 1
    assert got.dtype == want.dtype == torch.int32 and got.shape == want.shape, context
    assert torch.equal(got[..., :base], want[..., :base]), f"base differs {context}\n{got}\n{want}"
    assert torch.equal(_budget_part(got, base), _budget_part(want, base)), f"chosen differ {context}\n{got}\n{want}"


def compare_paths(selector, q, stats, sinks, window, budget, lengths=LENGTHS, length_dtype=torch.int64):
    for n in lengths:
        length = torch.tensor([n], dtype=length_dtype, device=q.device)
        got = step_block_table(selector, q, stats, length, sinks, window, budget, fused=True)
        want = step_block_table(selector, q, stats, length, sinks, window, budget, fused=False)
        assert_same_table(got, want, sinks, window, f"{selector} length {n} (sinks, window, budget) = "
                                                    f"{(sinks, window, budget)}")


# (sinks, window, budget): 0, 1, 2 sinks and windows; budgets 0, 1, 3, and 30 > the 19 blocks there are
CONFIGS = [(1, 1, 3), (0, 0, 1), (2, 2, 3), (1, 0, 0), (0, 1, 30), (2, 1, 1), (0, 2, 3)]


@pytest.mark.parametrize("selector", STATIC_SELECTORS)
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (2, 2)])
@pytest.mark.parametrize("sinks, window, budget", CONFIGS)
def test_kernel_gives_the_torch_paths_table(selector, heads, kv_heads, sinks, window, budget, device):
    """B = 2, GQA (4 query heads over 2) or one query head per key/value head, every length of LENGTHS: the
    kernel's rows equal the torch path's."""
    keys = _dyadic((2, kv_heads, 150, 16), seed=sinks + 3 * window + 7 * budget + heads).to(device)
    q = _dyadic((2, heads, 1, 16), seed=100 + budget).to(device)
    compare_paths(selector, q, _stats(keys), sinks, window, budget)


@pytest.mark.parametrize("selector", ["centroid", "quest", "topology"])
def test_many_blocks_several_tiles(selector, device):
    """150 blocks (several tiles of blocks per program, a padded row of 256), head dim 24 (padded to 32), an
    int32 length, a query of strides that are not contiguous."""
    keys = _dyadic((2, 2, 600, 24), seed=5).to(device)
    q = _dyadic((2, 24, 4, 1), seed=6).to(device).permute(0, 2, 3, 1)  # [2, 4, 1, 24], strided
    stats = _stats(keys, block_size=4)
    compare_paths(selector, q, stats, 2, 1, 9, lengths=(1, 50, 64, 257, 333, 599, 600), length_dtype=torch.int32)
    compare_paths(selector, q, stats, 1, 2, 200, lengths=(13, 600))  # budget beyond the candidates


@pytest.mark.parametrize("selector", ["centroid", "quest"])
@pytest.mark.parametrize("chunk", [4, 32])
def test_the_split_ranking_merges_many_programs(selector, chunk, device):
    """The query-aware scores ranked by several programs per lane (``chunk`` candidates each, so up to 38 splits
    of 150 blocks, budgets below, at and above a split's size), the last to finish merging: the torch path's
    rows, the one-program kernel's rows slot for slot, and the counters zero after every launch."""
    keys = _dyadic((2, 2, 600, 16), seed=chunk).to(device)
    q = _dyadic((2, 4, 1, 16), seed=chunk + 1).to(device)
    stats = _stats(keys, block_size=4)
    first, second = kernel.score_operands(selector, stats.centroids, stats.lo, stats.hi, stats.salience)
    counters = torch.zeros(4, dtype=torch.int32, device=device)
    for sinks, window, budget in [(1, 1, 9), (0, 0, 1), (2, 1, 40)]:
        for n in (5, 257, 600):
            length = torch.tensor([n], device=device)
            args = (q, first, second, length, selector, 4, sinks, window, budget)
            split = kernel.static_step_table(*args, counters=counters, chunk=chunk)
            assert not counters.any(), f"counters left at {counters.tolist()}"
            one = kernel.static_step_table(*args)
            context = f"{selector} chunk {chunk} length {n} (sinks, window, budget) = {(sinks, window, budget)}"
            assert torch.equal(split, one), f"{context}\n{split}\n{one}"
            want = step_block_table(selector, q, stats, length, sinks, window, budget, fused=False)
            assert_same_table(split, want, sinks, window, context)


def _pairs(keys: torch.Tensor, block_size: int = BS) -> torch.Tensor:
    """``keys`` with block ``2k + 1`` a copy of block ``2k``: every score comes twice."""
    blocks = keys.unflatten(2, (-1, block_size)).clone()
    blocks[:, :, 1::2] = blocks[:, :, 0:-1:2]
    return blocks.flatten(2, 3)


@pytest.mark.parametrize("selector", ["centroid", "quest"])
@pytest.mark.parametrize("sinks, window, budget", [(1, 1, 3), (0, 0, 5), (2, 0, 1)])
def test_exact_ties_go_to_the_lower_block(selector, sinks, window, budget, device):
    """Duplicate key blocks (pairs of equal scores): an odd budget splits a pair, and both paths keep its lower
    block; blocks all alike: the lowest candidates, and the kernel lists them in order (best first, ties lower
    first)."""
    keys = _pairs(_dyadic((2, 2, 152, 16), seed=budget)).to(device)
    q = _dyadic((2, 4, 1, 16), seed=7).to(device)
    stats = _stats(keys)
    compare_paths(selector, q, stats, sinks, window, budget)
    for n in (64, 152):  # the lower block of each pair of duplicates, never the upper alone
        table = step_block_table(selector, q, stats, torch.tensor(n, device=device), sinks, window, budget,
                                 fused=True)
        for row in table[..., sinks + window + 1:].reshape(4, -1).tolist():
            assert all(b - 1 in row for b in row if b % 2 and b - 1 >= sinks), f"length {n}: {row}"

    same = keys[:, :, :BS].repeat(1, 1, 19, 1)  # every block alike: every candidate scores the same
    stats = _stats(same)
    compare_paths(selector, q, stats, sinks, window, budget)
    qb = (same.shape[2] - 1) // BS
    table = step_block_table(selector, q, stats, torch.tensor(same.shape[2], device=device), sinks, window,
                             budget, fused=True)
    lowest = list(range(sinks, min(sinks + budget, qb - window)))
    assert table[..., sinks + window + 1:].reshape(4, -1).tolist() == [lowest + [-1] * (budget - len(lowest))] * 4

    signs = same.abs() * torch.tensor([-1.0, 1.0], device=device).repeat_interleave(BS).repeat(10)[:152, None]
    stats = _stats(signs + 0.5 * torch.sign(signs))  # blocks of keys < 0 and > 0 in turn
    table = step_block_table(selector, q * 0, stats, torch.tensor(152, device=device), sinks, window, budget,
                             fused=True)  # a zero query: every score 0 (-0.0 and 0.0 are one score: on a GPU
    # a sum of -0.0 products may give -0.0; the interpreter's sums give 0.0)
    assert table[..., sinks + window + 1:].reshape(4, -1).tolist() == [lowest + [-1] * (budget - len(lowest))] * 4


@pytest.mark.parametrize("selector", ["centroid", "quest"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gaussian_inputs_choose_as_well(selector, dtype, device):
    """Gaussian keys and queries (fp32, fp16, bf16 queries): the same base, and chosen blocks whose float64 scores
    (from the same statistics) add up to the torch path's choice: the sums of the two paths differ in order,
    so they may split a tie within rounding differently, never more. The kernel's chosen blocks come best first."""
    sinks, window, budget = 1, 1, 4
    gen = torch.Generator().manual_seed(8)
    keys = torch.randn(2, 2, 200, 32, generator=gen).to(device)
    stats = _stats(keys)
    for n in (1, 9, 40, 97, 160, 200):
        q = torch.randn(2, 4, 1, 32, generator=gen).to(device, dtype)
        length = torch.tensor(n, device=device)
        got = step_block_table(selector, q, stats, length, sinks, window, budget, fused=True)
        want = step_block_table(selector, q, stats, length, sinks, window, budget, fused=False)
        base = sinks + window + 1
        assert torch.equal(got[..., :base], want[..., :base])
        scores = SELECTORS[selector].step_scores(q.double(), _as_float64(stats), 0,
                                                 torch.zeros(1, dtype=torch.int64, device=device), 1, n, 0)[..., 0, :]
        for lane in range(4):
            picked, wanted = (t.reshape(4, -1)[lane, base:].tolist() for t in (got, want))
            picked_scores = [float(scores.reshape(4, -1)[lane, b]) for b in picked if b >= 0]
            assert picked_scores == sorted(picked_scores, reverse=True)  # best first
            assert len(picked_scores) == sum(b >= 0 for b in wanted)
            best = sum(float(scores.reshape(4, -1)[lane, b]) for b in wanted if b >= 0)
            assert sum(picked_scores) == pytest.approx(best, rel=1e-5, abs=1e-5), f"length {n}"


def test_kept_salience_ties_and_infinities(device):
    """topology's scores are the kept salience as it is: set by hand to dyadic values with many ties, a few inf
    (block 0's bar) and zeros, the kernel's rows equal the torch path's, and list the chosen blocks best first,
    ties lower first."""
    sinks, window, budget = 0, 1, 5
    stats = StaticBlockStats(2, 2, 150, 16, BS, salience=True, device=device)
    stats.salience.copy_(_dyadic(stats.salience.shape, seed=15, levels=2).abs())
    stats.salience[:, 1, 3] = float("inf")
    stats.salience[0, :, 0] = float("inf")
    q = _dyadic((2, 4, 1, 16), seed=16).to(device)
    compare_paths("topology", q, stats, sinks, window, budget)
    compare_paths("topology", q, stats, 2, 0, 30)
    table = step_block_table("topology", q, stats, torch.tensor(150, device=device), sinks, window, budget,
                             fused=True)
    salience = stats.salience.cpu()
    for lane, row in enumerate(table[..., sinks + window + 1:].reshape(4, -1).tolist()):
        keys = [(-float(salience.reshape(4, -1)[lane, b]), b) for b in row]
        assert keys == sorted(keys), f"lane {lane}: {row}"


def _as_float64(stats: StaticBlockStats) -> StaticBlockStats:
    copy = StaticBlockStats(*stats.lo.shape[:2], stats.max_len, stats.lo.shape[3], stats.block_size, torch.float64,
                            stats.lo.device)
    for mine, theirs in ((copy.lo, stats.lo), (copy.hi, stats.hi), (copy.centroids, stats.centroids)):
        mine.copy_(theirs)
    return copy


@pytest.mark.parametrize("selector", STATIC_SELECTORS)
def test_one_traced_graph_serves_every_length(selector, device):
    """torch.compile(fullgraph=True) around step_block_table(fused=True) traces the op without a break; new
    length values (new tensors, or one refilled in place) run the same frame, with the eager tables."""
    torch._dynamo.reset()
    keys = _dyadic((2, 2, 150, 16), seed=9).to(device)
    q = _dyadic((2, 4, 1, 16), seed=10).to(device)
    stats = _stats(keys)

    def step(q, length):
        return step_block_table(selector, q, stats, length, 1, 1, 3, fused=True)

    counter = CompileCounter()
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    length = torch.tensor([30], device=device)
    for n in (30, 31, 64, 65, 149):
        length.fill_(n)
        assert torch.equal(compiled(q, length), step(q, length))
        fresh = torch.tensor([n - 7], device=device)
        assert torch.equal(compiled(q, fresh), step(q, fresh))
    assert counter.frame_count == 1
    assert counter.op_count >= 1
    torch._dynamo.reset()


def test_custom_op_registered():
    op = torch.ops.topo_attn.static_step_table.default
    assert "str score" in str(op._schema) and "SymInt budget" in str(op._schema)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list:
    """The kernel's launches, recorded (they still run)."""
    calls = []
    real = kernel.static_step_table

    def recorded(*args, **kwargs):
        calls.append(args[4])
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel, "static_step_table", recorded)
    return calls


def test_dispatch(launches):
    """fused=None on the CPU: the torch path (no launch); fused=True: the kernel, in the interpreter; False: the
    torch path. window needs no statistics' dtype: fused=True takes float64 ones."""
    if not kernel.INTERPRETED:
        pytest.skip("the CPU runs the kernel in the interpreter only")
    keys = _dyadic((1, 1, 40, 8), seed=11)
    q = _dyadic((1, 2, 1, 8), seed=12)
    stats, length = _stats(keys), torch.tensor(33)
    for fused in (None, False):
        step_block_table("quest", q, stats, length, fused=fused)
        step_block_table("topology", q, stats, length, fused=fused)
    assert launches == []
    step_block_table("quest", q, stats, length, fused=True)
    step_block_table("window", q, _as_float64(stats), length, fused=True)
    step_block_table("topology", q, stats, length, fused=True)
    assert launches == ["quest", "none", "salience"]


def test_bad_arguments_raise(launches):
    """fused=True where the kernel does not apply, and a fused that is no bool, raise before any launch."""
    q = _dyadic((1, 2, 1, 8), seed=13)
    float64 = StaticBlockStats(1, 1, 40, 8, BS, torch.float64)
    too_many = StaticBlockStats(1, 1, FUSED_MAX_BLOCKS + 1, 8, 1)
    meta = StaticBlockStats(1, 1, 40, 8, BS, device="meta")
    cases = [
        (lambda: step_block_table("quest", q, float64, torch.tensor(9), fused=True), ValueError,
         "fused=True: the kernel scores float32 statistics, got torch.float64"),
        (lambda: step_block_table("centroid", q, too_many, torch.tensor(9), fused=True), ValueError,
         f"fused=True: the kernel holds nb_max <= {FUSED_MAX_BLOCKS} blocks, got {FUSED_MAX_BLOCKS + 1}"),
        (lambda: step_block_table("quest", q.to("meta"), meta, torch.tensor(9, device="meta"), fused=True),
         ValueError, "the statistics are on meta: the kernel needs a CUDA device"),
        (lambda: step_block_table("quest", q, float64, torch.tensor(9), fused=1), TypeError,
         "fused must be None, True or False, got int 1"),
        (lambda: step_block_table("topology", q, StaticBlockStats(1, 1, 40, 8, BS), torch.tensor(9), fused=True),
         ValueError, "make the statistics with salience=True"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    assert launches == []
    # fused=None falls back where fused=True raises (float64, too many blocks)
    step_block_table("quest", q, float64, torch.tensor(9))
    step_block_table("centroid", q, too_many, torch.tensor(9))
    assert launches == []
