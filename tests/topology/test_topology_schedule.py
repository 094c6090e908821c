"""Tests of topo_attn.topology_schedule against #22's per-row loop over the all-pairs elder-rule salience."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import all_pairs_salience, loop_schedule
from topo_attn import BlockSchedule, block_centroids, block_salience, centroid_distances, topology_schedule

SETTINGS = settings(max_examples=40, deadline=None)


def reference_schedule(keys: torch.Tensor, block_size: int, window: int, sinks: int,
                       topk: int) -> tuple[list[int], list[int]]:
    """#22's loop over the all-pairs salience of the keys' block centroids ([S, D] keys)."""
    centroids = block_centroids(keys.detach(), block_size)
    salience = all_pairs_salience(centroid_distances(centroids))
    return loop_schedule(salience, len(salience), window, sinks, topk)


def csr(schedule: BlockSchedule) -> tuple[list[int], list[int]]:
    """The schedule's CSR as plain lists."""
    return schedule.offsets.tolist(), schedule.indices.tolist()


def lane_rows(schedule: BlockSchedule, lane: int) -> tuple[list[int], list[int]]:
    """One lane's rows of a per-lane schedule, as a CSR of its own."""
    nb = schedule.num_blocks
    off = schedule.offsets[lane * nb:(lane + 1) * nb + 1]
    return (off - off[0]).tolist(), schedule.indices[int(off[0]):int(off[-1])].tolist()


def integer_block_keys(centroids: list[list[int]], block_size: int, seed: int) -> torch.Tensor:
    """Keys [n * block_size, D] (block_size even) whose block means are exactly ``centroids``: each block
    holds its centroid plus integer noise rows in +-pairs, so every sum is exact."""
    gen = torch.Generator().manual_seed(seed)
    c = torch.tensor(centroids, dtype=torch.float32)
    noise = torch.randint(-3, 4, (len(centroids), block_size // 2, c.shape[1]), generator=gen).float()
    rows = torch.cat([noise, -noise], dim=1)
    rows = rows[:, torch.randperm(block_size, generator=gen)]
    keys = (c[:, None, :] + rows).reshape(-1, c.shape[1])
    assert torch.equal(block_centroids(keys, block_size), c.double())
    return keys


# -------------------------------------------------------------------------------------- against #22's loop
@pytest.mark.parametrize("seq, block_size", [(97, 16), (200, 16), (333, 32), (97, 2), (200, 64), (333, 64),
                                             (60, 1), (50, 7), (128, 32)])
def test_matches_loop_reference_grid(seq: int, block_size: int) -> None:
    """Random keys, S not always a multiple of block_size, over a grid of window/sinks/topk including 0 and
    values larger than the block count."""
    gen = torch.Generator().manual_seed(seq * 131 + block_size)
    keys = torch.randn(seq, 32, generator=gen) * 2 + torch.randn(32, generator=gen)
    nb = -(-seq // block_size)
    centroids = block_centroids(keys, block_size)
    salience = all_pairs_salience(centroid_distances(centroids))
    big = nb + 3
    for window, sinks, topk in itertools.product((0, 1, 3, big), (0, 2, big), (0, 1, 4, big)):
        want = loop_schedule(salience, nb, window, sinks, topk)
        got = topology_schedule(keys, block_size, window, sinks, topk)
        assert got.lanes is None and got.num_blocks == nb and got.seq_len == seq
        assert csr(got) == want, (window, sinks, topk)


def test_large_block_count_single_config() -> None:
    """Block size 1 over 333 tokens (333 blocks) with a mid-size top-k."""
    gen = torch.Generator().manual_seed(333)
    keys = torch.randn(333, 16, generator=gen)
    assert csr(topology_schedule(keys, 1, 5, 2, 17)) == reference_schedule(keys, 1, 5, 2, 17)


@SETTINGS
@given(seq=st.integers(1, 70), block_size=st.integers(1, 16), dim=st.integers(1, 6), integer=st.booleans(),
       window=st.integers(0, 12), sinks=st.integers(0, 12), topk=st.integers(0, 12),
       seed=st.integers(0, 2**31 - 1))
def test_matches_loop_reference_hypothesis(seq: int, block_size: int, dim: int, integer: bool, window: int,
                                           sinks: int, topk: int, seed: int) -> None:
    """Small random cases; integer-valued keys produce tied centroids and saliences."""
    gen = torch.Generator().manual_seed(seed)
    if integer:
        keys = torch.randint(-1, 2, (seq, dim), generator=gen).float()
    else:
        keys = torch.randn(seq, dim, generator=gen)
    got = topology_schedule(keys, block_size, window, sinks, topk)
    assert csr(got) == reference_schedule(keys, block_size, window, sinks, topk)


# ------------------------------------------------------------------------------------------------ lanes
def test_per_lane_keys() -> None:
    """[B, H, S, D] keys: lanes == (B, H) and each lane's rows are the schedule of that lane's keys."""
    gen = torch.Generator().manual_seed(42)
    keys = torch.randn(2, 3, 203, 16, generator=gen)
    args = (16, 1, 1, 3)
    sched = topology_schedule(keys, *args)
    assert sched.lanes == (2, 3) and sched.num_rows == 6 * 13
    per_lane = []
    for lane, (b, h) in enumerate(itertools.product(range(2), range(3))):
        shared = topology_schedule(keys[b, h], *args)
        assert lane_rows(sched, lane) == csr(shared)
        assert csr(shared) == reference_schedule(keys[b, h], *args)
        per_lane.append(csr(shared))
    assert len({str(s) for s in per_lane}) > 1  # the lanes really differ, so a lane mix-up would show


def test_shared_lane() -> None:
    """shared_lane=(b, h) gives the shared schedule of keys[b, h]."""
    gen = torch.Generator().manual_seed(43)
    keys = torch.randn(2, 3, 150, 8, generator=gen)
    args = (16, 0, 1, 4)
    sched = topology_schedule(keys, *args, shared_lane=(1, 2))
    assert sched.lanes is None and sched.num_rows == 10
    assert csr(sched) == csr(topology_schedule(keys[1, 2], *args))
    assert csr(sched) == reference_schedule(keys[1, 2], *args)
    assert csr(sched) != csr(topology_schedule(keys[0, 0], *args))


# --------------------------------------------------------------------------------------------- top-k ties
def test_topk_ties_go_to_lower_block_collinear() -> None:
    """Equally spaced collinear centroids (spacing d = sqrt 5): the merges (0,1), (1,2), ... all have length
    d; the first joins equal sizes and writes block 0, each later one writes the new single block. So the
    saliences are [d, 0, d, d, d, d] and top-2 must be blocks 0 and 2, the lowest-index ones among the ties."""
    keys = integer_block_keys([[2 * b, -b, 3] for b in range(6)], 4, seed=0)
    d = math.sqrt(5.0)
    assert block_salience(block_centroids(keys, 4)).tolist() == [d, 0.0, d, d, d, d]
    sched = topology_schedule(keys, 4, window=0, sinks=0, topk=2)
    rows = [sched.indices[sched.offsets[r]:sched.offsets[r + 1]].tolist() for r in range(6)]
    assert rows == [[0], [0, 1], [0, 2], [0, 2, 3], [0, 2, 4], [0, 2, 5]]
    assert csr(sched) == reference_schedule(keys, 4, 0, 0, 2)


def test_topk_ties_go_to_lower_block_duplicates() -> None:
    """Duplicated centroids A, A, B, B, C, C with |AB| = 1, |BC| = 5, |AC| = sqrt 32: saliences [1, 1, 0, 0, 5, 5].
    top-1 is block 4 (not 5); top-3 is {4, 5, 0} (0 beats 1)."""
    cents = [[0, 0], [0, 0], [1, 0], [1, 0], [4, 4], [4, 4]]  # |AB| = 1, |BC| = 5, |AC| = sqrt 32
    keys = integer_block_keys(cents, 2, seed=1)
    assert block_salience(block_centroids(keys, 2)).tolist() == [1.0, 1.0, 0.0, 0.0, 5.0, 5.0]
    one = topology_schedule(keys, 2, window=0, sinks=0, topk=1)
    assert one.indices.tolist() == [0, 1, 2, 3, 4, 4, 5]
    three = topology_schedule(keys, 2, window=0, sinks=0, topk=3)
    rows = [three.indices[three.offsets[r]:three.offsets[r + 1]].tolist() for r in range(6)]
    assert rows == [[0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 4, 5]]
    assert csr(three) == reference_schedule(keys, 2, 0, 0, 3)


# --------------------------------------------------------------------------------------- structure, device
@pytest.mark.parametrize("seed", range(6))
def test_schedule_is_valid_and_has_diagonal(seed: int) -> None:
    """validate() passes, every row holds its own block, and the tensors live on the keys' device."""
    gen = torch.Generator().manual_seed(seed)
    seq = int(torch.randint(1, 300, (1,), generator=gen))
    block_size = int(torch.randint(1, 40, (1,), generator=gen))
    window, sinks, topk = (int(v) for v in torch.randint(0, 6, (3,), generator=gen))
    keys = torch.randn(2, 2, seq, 8, generator=gen) if seed % 2 else torch.randn(seq, 8, generator=gen)
    sched = topology_schedule(keys, block_size, window, sinks, topk)
    assert sched.validate() is sched
    mask = sched.to_block_mask()
    assert mask.diagonal(dim1=-2, dim2=-1).all()
    assert sched.device == keys.device == torch.device("cpu")
    assert sched.offsets.device == keys.device and sched.indices.device == keys.device
    assert sched.offsets.dtype == torch.int32 and sched.indices.dtype == torch.int32


def test_keys_requiring_grad() -> None:
    """Keys that require grad give the same schedule as their detached copy, with no graph."""
    gen = torch.Generator().manual_seed(9)
    keys = torch.randn(2, 2, 90, 16, generator=gen, requires_grad=True)
    sched = topology_schedule(keys, 16, 1, 1, 2)
    assert csr(sched) == csr(topology_schedule(keys.detach(), 16, 1, 1, 2))
    shared = topology_schedule(keys[0, 1], 16, 1, 1, 2)
    assert csr(shared) == reference_schedule(keys[0, 1], 16, 1, 1, 2)
    assert not sched.offsets.requires_grad and keys.grad is None


# -------------------------------------------------------------------------------------------- bad input
def random_keys(*shape: int) -> torch.Tensor:
    """Random float keys for the error tests."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_nan_keys_rejected() -> None:
    keys = random_keys(64, 8)
    keys[10, 3] = float("nan")
    with pytest.raises(ValueError, match="keys contains NaN or Inf"):
        topology_schedule(keys, 16, 1, 1, 2)


def test_inf_keys_rejected() -> None:
    keys = random_keys(2, 2, 64, 8)
    keys[1, 0, 5, 0] = float("-inf")
    with pytest.raises(ValueError, match="keys contains NaN or Inf"):
        topology_schedule(keys, 16, 1, 1, 2)


@pytest.mark.parametrize("name", ["window", "sinks", "topk"])
def test_negative_arguments_rejected(name: str) -> None:
    args = {"window": 1, "sinks": 1, "topk": 2, name: -1}
    with pytest.raises(ValueError, match=f"{name} must be >= 0"):
        topology_schedule(random_keys(64, 8), 16, **args)


def test_non_int_topk_rejected() -> None:
    with pytest.raises(TypeError, match="topk must be an int"):
        topology_schedule(random_keys(64, 8), 16, 1, 1, 1.5)


def test_rank_three_keys_rejected() -> None:
    with pytest.raises(ValueError, match=r"keys must have shape \[S, D\] or \[B, H, S, D\]"):
        topology_schedule(random_keys(2, 64, 8), 16, 1, 1, 2)


def test_integer_keys_rejected() -> None:
    with pytest.raises(TypeError, match="keys must be a floating-point tensor"):
        topology_schedule(torch.randint(-3, 4, (64, 8)), 16, 1, 1, 2)


@pytest.mark.parametrize("lane", [(2, 0), (0, 3), (-1, 0)])
def test_shared_lane_out_of_range_rejected(lane: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="shared_lane must index"):
        topology_schedule(random_keys(2, 3, 64, 8), 16, 1, 1, 2, shared_lane=lane)


def test_shared_lane_with_2d_keys_rejected() -> None:
    with pytest.raises(ValueError, match=r"shared_lane applies only to keys of shape \[B, H, S, D\]"):
        topology_schedule(random_keys(64, 8), 16, 1, 1, 2, shared_lane=(0, 0))
