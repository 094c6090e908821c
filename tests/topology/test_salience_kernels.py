"""The salience kernels (Prim + elder rule, one program per lane) against the CPU path: on the CPU in Triton's
interpreter, compiled on a GPU. Random centroids, exact ties, float32, shared and per-lane schedules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import topo_attn as ta
from topo_attn.topology.gpu import MAX_BLOCKS
from topo_attn.topology.gpu.salience import choose_mst, salience_kernels


def _cpu_salience(centroids: torch.Tensor) -> torch.Tensor:
    return ta.block_salience(centroids.cpu().double())


def _schedule(salience: torch.Tensor, window=1, sinks=1, topk=3) -> tuple[list, list]:
    n = salience.shape[-1]
    lanes = None if salience.shape[0] == 1 else (salience.shape[0], 1)
    s = ta.schedule_from_salience(salience.cpu(), 16, 16 * n, window, sinks, topk, lanes)
    return s.offsets.tolist(), s.indices.tolist()


def _assert_cpu_saliences(got: torch.Tensor, centroids: torch.Tensor) -> None:
    """float64 kernel saliences ``[L, n]`` against the CPU path's for ``centroids [L, n, D]``: bit for bit in
    lanes of integer centroids (sums of small integers are exact in any order); elsewhere within the last
    bits (a compiled kernel may round the sum of squares in another order, e.g. with fused multiply-adds), with
    the same trees: every salience one of the lane's tree lengths, in the same places, and the same schedule."""
    want = _cpu_salience(centroids)
    for lane in range(centroids.shape[0]):
        if torch.equal(centroids[lane], centroids[lane].round()):
            assert torch.equal(got[lane], want[lane]), f"lane {lane} (integer centroids)"
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
    assert torch.equal(got.argsort(dim=-1, stable=True), want.argsort(dim=-1, stable=True))
    assert _schedule(got) == _schedule(want)


@pytest.mark.parametrize("mst", ["prim", "boruvka"])
@pytest.mark.parametrize("lanes, n, dim", [(1, 2, 4), (3, 5, 8), (2, 33, 16), (1, 64, 32), (2, 100, 8), (1, 300, 4)])
def test_kernels_equal_the_cpu_path_on_random_centroids(lanes, n, dim, mst, device):
    gen = torch.Generator().manual_seed(n * dim)
    centroids = torch.randn(lanes, n, dim, generator=gen, dtype=torch.float64)
    got = salience_kernels(centroids.to(device), mst=mst).cpu()
    assert got.dtype == torch.float64 and got.shape == (lanes, n)
    _assert_cpu_saliences(got, centroids)


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 40), st.integers(1, 3), st.integers(0, 2**31 - 1), st.sampled_from(["prim", "boruvka"]))
def test_kernels_break_ties_like_the_cpu_path(n, dim, seed, mst):
    """Integer centroids on a small lattice: many exactly equal distances and duplicate centroids. Sums of
    small integers are exact in any order, so the saliences must be equal bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    centroids = torch.randint(0, 3, (2, n, dim), generator=gen).double()
    device = "cuda" if torch.cuda.is_available() and not _interpreted() else "cpu"
    assert torch.equal(salience_kernels(centroids.to(device), mst=mst).cpu(), _cpu_salience(centroids))


@pytest.mark.parametrize("in_program, mst, parallel_order", [(True, "prim", False), (True, "boruvka", False),
                                                            (False, "boruvka", False), (False, "boruvka", True)])
def test_kernels_break_ties_like_the_cpu_path_past_one_column_chunk(in_program, mst, parallel_order):
    """300 blocks: the merge-side and elder passes walk the edges in several chunks, in the Prim program or in
    a grid of programs (two lanes: each grid program must find its lane); Boruvka's rows span two column
    chunks and its ranks several tiles; its Prim order step by step or in parallel."""
    gen = torch.Generator().manual_seed(300)
    centroids = torch.randint(0, 4, (2, 300, 2), generator=gen).double()
    device = "cuda" if torch.cuda.is_available() and not _interpreted() else "cpu"
    got = salience_kernels(centroids.to(device), elder_in_program=in_program, mst=mst,
                           parallel_order=parallel_order).cpu()
    assert torch.equal(got, _cpu_salience(centroids))


def _interpreted() -> bool:
    from topo_attn.attention.forward import INTERPRETED

    return INTERPRETED


def test_choose_mst_by_blocks_and_stored_bytes():
    """Prim up to 32 blocks; Boruvka above, up to 256 MiB of stored distances: the 128k prefill's 8 lanes of 2048
    float32 blocks (64 MiB) and 32 such lanes (256 MiB) take Boruvka, 32 lanes of 2048 float64 blocks (1 GiB) Prim
    (topology/NOTES.md has the timings)."""
    assert choose_mst(8, 32, torch.float32) == "prim" and choose_mst(1, 33, torch.float32) == "boruvka"
    assert choose_mst(8, 2048, torch.float32) == "boruvka" and choose_mst(32, 2048, torch.float32) == "boruvka"
    assert choose_mst(32, 2048, torch.float64) == "prim" and choose_mst(33, 2048, torch.float32) == "prim"


def test_single_block_gets_one(device):
    centroids = torch.randn(2, 1, 8, dtype=torch.float64, device=device)
    assert torch.equal(salience_kernels(centroids).cpu(), torch.ones(2, 1, dtype=torch.float64))


@pytest.mark.parametrize("lanes, n, dim, ties", [(1, 2, 4, False), (2, 5, 8, False), (1, 33, 16, False),
                                                 (2, 100, 8, False), (1, 300, 4, False), (1, 200, 1, False),
                                                 (2, 150, 1, True), (3, 64, 2, True)])
def test_parallel_prim_order_equals_the_steps(lanes, n, dim, ties, device):
    """Prim's order by Euler tours and binary lifting (:mod:`topo_attn.topology.gpu.prim_order`) against the
    step-by-step walk over the same Boruvka trees: the same blocks, pairs and lengths at every position.
    Random centroids, one dimension (the tree is a path: deep tours and long climbs) and lattice ties."""
    from topo_attn.topology.gpu.boruvka import boruvka
    from topo_attn.topology.gpu.prim import edge_ranks, tree_prim_order
    from topo_attn.topology.gpu.prim_order import prim_order_parallel

    gen = torch.Generator().manual_seed(n * dim + lanes)
    centroids = torch.randint(0, 6, (lanes, n, dim), generator=gen).double() if ties else \
        torch.randn(lanes, n, dim, generator=gen, dtype=torch.float64)
    lo, hi, length, by_rank = boruvka(centroids.to(device))
    edge_ranks(lo, hi, length, by_rank)
    outputs = []
    for parallel in (False, True):
        order, pair = torch.zeros(2, lanes, n, dtype=torch.int32, device=device).unbind(0)
        lengths = torch.zeros(lanes, n, dtype=torch.float64, device=device)
        if parallel:
            prim_order_parallel(lo, hi, length, by_rank, order, pair, lengths)
        else:
            unused = torch.zeros(2, lanes, n, dtype=torch.int32, device=device)
            tree_prim_order(lo, hi, length, by_rank, order, pair, lengths, unused[0], unused[1], lengths.clone(),
                            elder=False)
        outputs.append((order.cpu(), pair[:, 1:].cpu(), lengths[:, 1:].cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    got = salience_kernels(centroids.to(device), mst="boruvka", parallel_order=True).cpu()
    assert torch.equal(got, salience_kernels(centroids.to(device), mst="boruvka", parallel_order=False).cpu())


@pytest.mark.parametrize("lanes, n", [(1, 40), (2, 1100)])
def test_edge_ranks_sort_the_tree_edges(lanes, n, device):
    """The rank kernel against a sort by ``(length, lo, hi)``: ``n - 1`` distinct edges per lane in random order
    with lattice lengths (many ties, broken by the pair). 1100 blocks: each edge is compared with the others in
    three column chunks, and each lane's ranks come from many programs."""
    from topo_attn.topology.gpu.prim import edge_ranks

    gen = torch.Generator().manual_seed(n + lanes)
    lo, hi, length = torch.zeros(3, lanes, n, dtype=torch.float64)
    want = []
    for lane in range(lanes):
        order = torch.randperm(n - 1, generator=gen)
        lo_l = order  # (distinct low ends: distinct pairs)
        hi_l = lo_l + 1 + (torch.rand(n - 1, generator=gen) * (n - 1 - lo_l)).long()
        length_l = torch.randint(0, 4, (n - 1,), generator=gen).double()
        lo[lane, :n - 1], hi[lane, :n - 1], length[lane, :n - 1] = lo_l, hi_l, length_l
        want.append(sorted(range(n - 1), key=lambda e: (length_l[e].item(), lo_l[e].item() * n + hi_l[e].item())))
    assert bool((hi[:, :n - 1] < n).all() and (lo < hi)[:, :n - 1].all())
    by_rank = torch.zeros(lanes, n, dtype=torch.int32, device=device)
    edge_ranks(lo.int().to(device), hi.int().to(device), length.to(device), by_rank)
    assert by_rank[:, :n - 1].tolist() == want


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 70), st.integers(1, 4), st.booleans(), st.integers(0, 2**31 - 1))
def test_parallel_prim_order_gives_the_cpu_saliences(n, dim, ties, seed):
    """Random sizes (every power-of-two tour width up to 256 arcs), dimensions and lattice ties: Boruvka with
    the parallel Prim order gives the CPU path's saliences (bit for bit on the lattice)."""
    gen = torch.Generator().manual_seed(seed)
    centroids = torch.randint(0, 3, (2, n, dim), generator=gen).double() if ties else \
        torch.randn(2, n, dim, generator=gen, dtype=torch.float64)
    device = "cuda" if torch.cuda.is_available() and not _interpreted() else "cpu"
    got = salience_kernels(centroids.to(device), mst="boruvka", parallel_order=True).cpu()
    _assert_cpu_saliences(got, centroids)


@pytest.mark.parametrize("lanes", [[0], [1], [0, 1, 2]], ids=["random-alone", "ties-alone", "three-lanes"])
def test_boruvka_hooks_fused_or_launched_alone_give_the_cpu_saliences(lanes, device):
    """Builds of one lane run each round's hooks (after the first round's own launch) in the last search
    program of the lane to finish; builds of more lanes in a launch of their own: both give the CPU path's
    saliences (lanes of 150 blocks in 5 x 5 tiles; lattice ties in the second lane)."""
    from topo_attn.topology.gpu.boruvka import HOOKS_IN_SEARCH_MAX_LANES

    assert (len(lanes) <= HOOKS_IN_SEARCH_MAX_LANES) == (len(lanes) == 1)  # one path each
    gen = torch.Generator().manual_seed(150)
    centroids = torch.randn(3, 150, 6, generator=gen, dtype=torch.float64)
    centroids[1] = torch.randint(0, 3, (150, 6), generator=gen).double()
    centroids = centroids[lanes]
    got = salience_kernels(centroids.to(device), mst="boruvka").cpu()
    _assert_cpu_saliences(got, centroids)


@pytest.mark.parametrize("mst, parallel_order", [("prim", False), ("boruvka", False), ("boruvka", True)])
def test_non_finite_centroids_stay_in_bounds(mst, parallel_order, device):
    """NaN distances may leave the tree unfinished: the kernels must still read and write only their own
    buffers (callers reject such centroids; here only the run and the shape are checked)."""
    centroids = torch.randn(2, 40, 4, dtype=torch.float64)
    centroids[1, 5:9] = float("nan")
    got = salience_kernels(centroids.to(device), mst=mst, parallel_order=parallel_order)
    assert got.shape == (2, 40)
    torch.testing.assert_close(got[0].cpu(), _cpu_salience(centroids[:1])[0], rtol=1e-13, atol=0)


@pytest.mark.parametrize("mst", ["prim", "boruvka"])
def test_float32_gives_the_same_schedules_on_random_keys(mst, device):
    gen = torch.Generator().manual_seed(7)
    centroids = torch.randn(3, 80, 32, generator=gen)
    got = salience_kernels(centroids.to(device), mst=mst)
    assert got.dtype == torch.float32
    want = _cpu_salience(centroids)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=0)
    assert _schedule(got) == _schedule(want)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-lane"])
def test_gpu_topology_schedule_equals_the_cpu_one(per_lane, dtype):
    B, H, S, D, block_size = 2, 4, 64 * 300 + 17, 64, 64
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(B, H, S, D, generator=gen).to(torch.bfloat16)
    kwargs = {} if per_lane else {"shared_lane": (1, 2)}
    cpu = ta.topology_schedule(keys, block_size, 2, 1, 20, **kwargs)
    gpu = ta.topology_schedule(keys.cuda(), block_size, 2, 1, 20, dtype=dtype, **kwargs)
    assert gpu.offsets.is_cuda and gpu.lanes == cpu.lanes
    gpu.validate()
    assert torch.equal(gpu.offsets.cpu(), cpu.offsets) and torch.equal(gpu.indices.cpu(), cpu.indices)
    trusted = ta.topology_schedule(keys.cuda(), block_size, 2, 1, 20, dtype=dtype, check=False, **kwargs)
    assert trusted.padded and trusted.index_buffer.numel() >= cpu.nnz  # (the selectors' path: no host sync)
    assert torch.equal(trusted.offsets.cpu(), cpu.offsets) and torch.equal(trusted.indices.cpu(), cpu.indices)


@pytest.mark.parametrize("lanes, seq, block_size, rule", [(1, 16 * 40 + 3, 16, (5, 1, 2)), (3, 8 * 33, 8, (4, 0, 0)),
                                                          (2, 50, 16, (9, 9, 9))])
def test_build_rows_equals_the_cpu_schedule(lanes, seq, block_size, rule, device):
    """The GPU build (keys to CSR rows, launch by launch in the interpreter, from a CUDA graph on a GPU) against
    the CPU path; keys in bfloat16 and not contiguous."""
    from topo_attn.topology.gpu.graph import build_rows

    gen = torch.Generator().manual_seed(seq + lanes)
    keys = torch.randn(lanes, 24, seq, generator=gen).to(torch.bfloat16).transpose(1, 2)  # [L, S, D], strided
    topk, sinks, window = rule
    want = ta.topology_schedule(keys[:, None], block_size, window, sinks, topk) if lanes > 1 else \
        ta.topology_schedule(keys[0], block_size, window, sinks, topk)
    nb = want.num_blocks
    offsets, indices, finite = build_rows(keys.to(device), block_size, torch.float64, min(topk, nb), min(sinks, nb),
                                          min(window, nb - 1))
    assert finite is True
    assert torch.equal(offsets.cpu(), want.offsets) and torch.equal(indices.cpu(), want.indices)
    # without reading the status back: the same offsets, the rows at the head of a buffer of the rule's bound
    offsets, buffer, finite = build_rows(keys.to(device), block_size, torch.float64, min(topk, nb), min(sinks, nb),
                                         min(window, nb - 1), read_status_back=False)
    assert finite is None and buffer.numel() >= want.nnz
    assert torch.equal(offsets.cpu(), want.offsets) and torch.equal(buffer[:want.nnz].cpu(), want.indices)
    # a non-finite key in the first block, then in the last (in the last distance tile when there are several):
    # flagged, for the caller to raise
    for row, value in ((5, float("nan")), (seq - 1, float("inf"))):
        bad = keys.clone()
        bad[-1, row, 3] = value
        offsets, indices, finite = build_rows(bad.to(device), block_size, torch.float64, min(topk, nb),
                                              min(sinks, nb), min(window, nb - 1))
        assert finite is False and offsets.shape == (lanes * nb + 1,)


@pytest.mark.cuda
@pytest.mark.parametrize("poll", [True, False])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("heads, blocks", [(3, 70), (4, 300)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_build_graph_replays_new_keys_without_aliasing(dtype, heads, blocks, strided, poll):
    """Three builds of one shape, back to back, replay one cached graph that reads each build's keys in place:
    each equals the CPU schedule for its own keys, the first is unchanged by the later replays, keys changed
    in place give their new schedule, and the launch-by-launch build gives the same rows. 8 lanes of 300
    blocks: the lanes are split into groups on parallel streams. Contiguous keys and keys with other strides;
    the status polled from pinned memory (the rows may still be being written when a build returns) or read
    after a stream sync."""
    from topo_attn.topology.gpu import graph as build

    def rows(keys, **options):  # topology_schedule's GPU build of [B, H, S, D] keys, with the build's options
        spins = build.STATUS_SPINS if poll else 0
        offsets, indices, finite = build.build_rows(keys.reshape(-1, *keys.shape[2:]), 64, dtype, 6, 1, 1,
                                                    status_spins=spins, **options)
        return offsets, indices, finite

    def assert_cpu_schedule(got, keys):
        want = ta.topology_schedule(keys, 64, 1, 1, 6)
        assert got[2] is True
        assert torch.equal(got[0].cpu(), want.offsets) and torch.equal(got[1].cpu(), want.indices)

    gen = torch.Generator().manual_seed(11)
    keys = [torch.randn(2, heads, 64 * blocks, 32, generator=gen) for _ in range(3)]
    if strided:  # [B, H, S, D] views of [S, B, H, D] tensors
        keys = [k.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for k in keys]
    assert build.lane_groups(2 * heads, blocks, dtype) == (1 if blocks < build.GROUP_MIN_BLOCKS else build.LANE_GROUPS)
    build.clear_graphs()
    on_gpu = [k.cuda() for k in keys]
    got = [rows(k) for k in on_gpu]
    assert build.cached_graphs() == 1
    for k, rows_k in zip(keys, got):
        assert_cpu_schedule(rows_k, k)
    on_gpu[1].copy_(keys[2].flip(2))
    assert_cpu_schedule(rows(on_gpu[1]), keys[2].flip(2))
    eager = rows(on_gpu[0], use_graph=False)
    assert eager[2] is True
    assert torch.equal(eager[0], got[0][0]) and torch.equal(eager[1], got[0][1])
    bad = keys[1].cuda()
    bad[1, 2, 100, 0] = float("inf")
    assert rows(bad)[2] is False
    with pytest.raises(ValueError, match="keys contains NaN or Inf"):
        ta.topology_schedule(bad, 64, 1, 1, 6, dtype=dtype)
    assert build.cached_graphs() == 1


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_padded_builds_back_to_back_while_the_gpu_lags(dtype):
    """Padded builds (``read_status_back=False``, the sync-free selectors' path) return before the GPU has run
    them, so the host issues the next build while this one waits in the stream: here the stream is held back by
    a sleep kernel before four builds of different keys (one shape, one cached graph), then a build that reads
    its status back. Each equals the CPU schedule of its own keys (a build that took its inputs from host memory
    would read the last build's)."""
    from topo_attn.topology.gpu import graph as build

    gen = torch.Generator().manual_seed(12)
    keys = [torch.randn(6, 64 * 40, 32, generator=gen) for _ in range(5)]
    build.clear_graphs()
    on_gpu = [k.cuda() for k in keys]
    build.build_rows(on_gpu[0], 64, dtype, 6, 1, 1, read_status_back=False)  # captures the graph
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time: the host runs ahead
    got = [build.build_rows(k, 64, dtype, 6, 1, 1, read_status_back=False) for k in on_gpu[:4]]
    got.append(build.build_rows(on_gpu[4], 64, dtype, 6, 1, 1))
    for k, (offsets, indices, _) in zip(keys, got):
        want = ta.topology_schedule(k[:, None], 64, 1, 1, 6)
        assert torch.equal(offsets.cpu(), want.offsets)
        assert torch.equal(indices[:want.nnz].cpu(), want.indices)


@pytest.mark.parametrize("lanes, blocks, block_size", [(1, 1, 16), (3, 5, 16), (2, 40, 8)])
def test_salience_of_keys_equals_the_salience_of_the_centroids(lanes, blocks, block_size, device):
    """The keys' saliences (the topology selector's path: centroids, then saliences; launch by launch in the
    interpreter) equal the CPU path's saliences of the float64 centroids, and key_block_salience picks it."""
    from topo_attn.topology import key_block_salience
    from topo_attn.topology.gpu.graph import salience_of_keys

    gen = torch.Generator().manual_seed(blocks)
    keys = torch.randn(lanes, blocks * block_size - (block_size // 2 if blocks > 1 else 0), 12, generator=gen)
    want = ta.block_salience(ta.block_centroids(keys, block_size))  # float64, the CPU path
    got = salience_of_keys(keys.to(device), block_size, torch.float64, use_graph=False)
    assert got.dtype == torch.float64
    # compiled kernels sum the centroids in another order than the CPU: equal to float64 rounding, not bitwise
    torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12)
    four = keys.view(1, lanes, *keys.shape[1:])
    torch.testing.assert_close(key_block_salience(four.to(device), block_size, torch.float64).cpu(),
                               want.view(1, lanes, -1), rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.parametrize("heads, blocks", [(3, 70), (4, 300)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_salience_graph_replays_new_keys_without_aliasing(dtype, heads, blocks):
    """The topology selector's saliences on a GPU: one cached graph for one (lanes, blocks, features, dtype),
    the centroids written into it before each replay; each call equals the launch-by-launch result for its
    own keys (8 lanes of 300 blocks: lane groups on parallel streams), a result is unchanged by later calls,
    and three calls back to back without a sync stay in order."""
    from topo_attn.topology.gpu import graph as build

    gen = torch.Generator().manual_seed(5)
    keys = [torch.randn(2 * heads, 64 * blocks, 32, generator=gen).cuda() for _ in range(3)]
    build.clear_graphs()
    got = [build.salience_of_keys(k, 64, dtype) for k in keys]  # no sync between them
    assert build.cached_graphs() == 1
    eager = [build.salience_of_keys(k, 64, dtype, use_graph=False) for k in keys]
    for g, e in zip(got, eager):
        assert torch.equal(g, e)
    assert not torch.equal(got[0], got[1])
    want = ta.block_salience(ta.block_centroids(keys[0].cpu(), 64))
    if dtype == torch.float64:  # the GPU sums in another order than the CPU: equal to float64 rounding
        torch.testing.assert_close(got[0].cpu(), want, rtol=1e-12, atol=1e-12)
    # inside a caller's capture (a captured forward) the kernels are captured there, launch by launch
    build.clear_graphs()
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        captured = build.salience_of_keys(keys[2], 64, dtype)
    outer.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager[2]) and build.cached_graphs() == 0


def _ruler_keys(lanes: int, blocks: int, block_size: int, dim: int) -> torch.Tensor:
    """Keys ``[1, lanes, blocks * block_size, dim]`` whose block centroids lie on a line with the gap
    ``1 + v`` between blocks ``i`` and ``i + 1``, ``v`` the number of times 2 divides ``i + 1``: each Boruvka
    round only merges neighbouring components in pairs, so the tree needs all ``log2(blocks)`` rounds for a
    power of two (300 blocks: 8 of 9).
    Small integers (scaled per lane), so centroids and distances are exact in float32 too."""
    i = torch.arange(1, blocks)
    gaps = 1 + (i & -i).log2().long()
    line = torch.cat([torch.zeros(1, dtype=torch.long), gaps.cumsum(0)]).double()
    keys = torch.zeros(1, lanes, blocks * block_size, dim, dtype=torch.float64)
    keys[..., 0] = line.repeat_interleave(block_size) * torch.arange(1, lanes + 1).double()[:, None]
    keys[..., 1] = 3.0
    return keys


def _boruvka_rounds(centroids: torch.Tensor) -> int:
    """How many Boruvka rounds the minimum spanning tree of ``centroids [n, D]`` needs (a plain loop over all
    pairs: each component hooks its lightest edge under the strict order ``(distance, i, j)``)."""
    n = centroids.shape[0]
    dist = torch.cdist(centroids, centroids, compute_mode="donot_use_mm_for_euclid_dist").tolist()
    comp, rounds = list(range(n)), 0
    while len(set(comp)) > 1:
        lightest = {}
        for i in range(n):
            for j in range(i + 1, n):
                if comp[i] != comp[j]:
                    for c in (comp[i], comp[j]):
                        lightest[c] = min(lightest.get(c, (dist[i][j], i, j)), (dist[i][j], i, j))
        for _, i, j in lightest.values():
            old, new = max(comp[i], comp[j]), min(comp[i], comp[j])
            comp = [new if c == old else c for c in comp]
        rounds += 1
    return rounds


@pytest.mark.parametrize("blocks", [16, 64])
def test_boruvka_completes_trees_that_need_every_round(blocks, device):
    """Ruler centroids of 2^k blocks need every Boruvka round (each round merges neighbouring components in
    pairs): alone (the hooks in the searches) and next to a lane of random centroids (the hooks in launches of
    their own), the kernels give the CPU path's saliences."""
    ruler = ta.block_centroids(_ruler_keys(1, blocks, 1, 3)[0, 0], 1, torch.float64)
    random = torch.randn(blocks, 3, generator=torch.Generator().manual_seed(blocks), dtype=torch.float64)
    assert _boruvka_rounds(ruler) == (blocks - 1).bit_length() > _boruvka_rounds(random)
    for centroids in (ruler[None], torch.stack([ruler, random])):
        got = salience_kernels(centroids.to(device), mst="boruvka").cpu()
        _assert_cpu_saliences(got, centroids)


@pytest.mark.cuda
@pytest.mark.parametrize("lanes, blocks", [(1, 512), (8, 300)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_build_graph_runs_every_round_that_a_tree_needs(dtype, lanes, blocks):
    """One cached graph replayed for random keys (a few Boruvka rounds do work) and for ruler keys (every
    round does): every build equals the CPU schedule."""
    from topo_attn.topology.gpu import graph as build

    gen = torch.Generator().manual_seed(blocks)
    random = torch.randn(1, lanes, blocks * 64, 32, generator=gen, dtype=torch.float64)
    build.clear_graphs()
    for keys in (random, _ruler_keys(lanes, blocks, 64, 32), -random):
        got = ta.topology_schedule(keys.cuda().float(), 64, 1, 1, 8, dtype=dtype)
        want = ta.topology_schedule(keys.float(), 64, 1, 1, 8)
        assert torch.equal(got.offsets.cpu(), want.offsets) and torch.equal(got.indices.cpu(), want.indices)
    assert build.cached_graphs() == 1


@pytest.mark.cuda
def test_gpu_salience_at_the_largest_size():
    gen = torch.Generator().manual_seed(5)
    centroids = torch.randn(1, MAX_BLOCKS, 128, generator=gen, dtype=torch.float64)
    got = ta.block_salience(centroids.cuda()).cpu()
    want = _cpu_salience(centroids)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
    assert torch.equal(got.argsort(dim=-1, stable=True), want.argsort(dim=-1, stable=True))


@pytest.mark.cuda
def test_more_blocks_than_the_kernels_take_use_the_cpu_path():
    centroids = torch.randn(MAX_BLOCKS + 1, 4, dtype=torch.float64)
    got = ta.block_salience(centroids.cuda())
    assert got.is_cuda
    assert torch.equal(got.cpu(), _cpu_salience(centroids))


@pytest.mark.parametrize("lanes", [1, 2])
def test_distances_are_exact_differences(lanes, device):
    """The distance kernel: symmetric bit for bit, zero on the diagonal and between duplicates, equal to the
    difference formula up to the rounding of the sum. (One lane takes 4 features per step, more lanes 2: 19
    features leave a partial last step for both.)"""
    from topo_attn.topology.gpu.distances import distance_unroll, distances

    assert 19 % distance_unroll(lanes) != 0
    gen = torch.Generator().manual_seed(2)
    centroids = torch.randn(lanes, 45, 19, generator=gen, dtype=torch.float64)
    centroids[:, 7] = centroids[:, 30]  # duplicates
    dist = distances(centroids.to(device)).cpu()
    assert torch.equal(dist, dist.mT)
    assert torch.all(dist.diagonal(dim1=1, dim2=2) == 0) and torch.all(dist[:, 7, 30] == 0)
    exact = torch.cdist(centroids, centroids, compute_mode="donot_use_mm_for_euclid_dist")
    torch.testing.assert_close(dist, exact, rtol=1e-13, atol=0)


@pytest.mark.parametrize("lanes, nb, sinks, window, topk", [(1, 1, 1, 0, 1), (1, 40, 1, 1, 5), (3, 33, 0, 0, 4),
                                                            (2, 17, 3, 4, 17), (1, 64, 64, 63, 64), (2, 50, 2, 0, 0),
                                                            (2, 150, 1, 2, 19)])
def test_rule_rows_kernel_equals_the_torch_assembly(lanes, nb, sinks, window, topk, device):
    """The GPU assembly of sinks + window + top-k into CSR rows against the vectorised torch one (what the CPU
    path runs), on random saliences with ties (so the top-k holds sinks and window blocks too). 150 blocks:
    the ranks are counted over several tiles."""
    from topo_attn.topology.gpu.rows import rule_rows

    gen = torch.Generator().manual_seed(nb * 7 + topk)
    salience = torch.randint(0, 5, (lanes, nb), generator=gen).double()
    want = ta.schedule_from_salience(salience, 16, 16 * nb, window, sinks, topk, None if lanes == 1 else (lanes, 1))
    sinks, window, topk = min(sinks, nb), min(window, nb - 1), min(topk, nb)
    offsets, indices, finite = rule_rows(salience.to(device), topk, sinks, window)
    assert finite is True
    assert torch.equal(offsets.cpu(), want.offsets) and torch.equal(indices.cpu(), want.indices)


@pytest.mark.parametrize("lanes, nb, sinks, window, topk", [(1, 40, 1, 1, 5), (3, 150, 2, 3, 19)])
def test_rule_rows_written_through_their_address(lanes, nb, sinks, window, topk, device):
    """With ``rows_at`` the rows kernel writes the buffer at the address it holds (a CUDA graph's new output
    per build): the same rows and status as a buffer of its own."""
    from topo_attn.topology.gpu.rows import rows_size, rule_launch

    gen = torch.Generator().manual_seed(nb + lanes)
    salience = torch.randint(0, 5, (lanes, nb), generator=gen).double().to(device)
    want, want_status = rule_launch(salience, topk, sinks, window)
    rows = torch.full((rows_size(lanes, nb, topk, sinks, window),), -7, dtype=torch.int32, device=device)
    rows_at = torch.tensor([rows.data_ptr()], dtype=torch.int64)
    none, status = rule_launch(salience, topk, sinks, window, rows_at=rows_at.pin_memory() if rows.is_cuda else rows_at)
    total = int(status[0])
    assert none is None and torch.equal(status.cpu(), want_status.cpu()) and total > lanes * nb
    assert torch.equal(rows[:lanes * nb + 1 + total].cpu(), want[:lanes * nb + 1 + total].cpu())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_schedule_from_salience_rejects_non_finite_saliences(bad, device):
    salience = torch.rand(2, 40, dtype=torch.float64)
    salience[1, 3] = bad
    with pytest.raises(ValueError, match="salience contains NaN or Inf"):
        ta.schedule_from_salience(salience.to(device), 16, 640, 1, 1, 4, (2, 1))


def test_build_status_is_polled_then_synced():
    """The build's status read: a status already written is returned at once; one still unwritten (-1) after
    the polls is read after the stream sync; still unwritten after the sync raises instead of returning a
    count of -1."""
    import numpy as np

    from topo_attn.topology.gpu import graph as build

    class Stream:
        def __init__(self, status, value):
            self.status, self.value, self.syncs = status, value, 0

        def synchronize(self):
            self.syncs += 1
            if self.value is not None:
                self.status[:] = self.value

    class Graph:
        def __init__(self, status, value):
            self.status_numpy = status
            self.stream = Stream(status, value)

    written = Graph(np.array([37, 1]), None)
    assert build.read_status(written, build.STATUS_SPINS) == (37, 1) and written.stream.syncs == 0
    late = Graph(np.array([-1, -1]), (12, 0))
    assert build.read_status(late, 5) == (12, 0) and late.stream.syncs == 1
    half = Graph(np.array([40, -1]), None)  # the count written, the flag not yet
    with pytest.raises(RuntimeError, match="without writing its status"):
        build.read_status(half, 5)
    synced = Graph(np.array([-1, -1]), (3, 1))  # no polls: the sync at once
    assert build.read_status(synced, 0) == (3, 1) and synced.stream.syncs == 1


def test_pdl_is_off_where_it_cannot_run():
    """Programmatic dependent launch only on CUDA devices: CPU tensors (the interpreter) get plain launches."""
    from topo_attn.topology.gpu.pdl import pdl_options

    assert pdl_options(torch.device("cpu"), 1) == {"PDL": 0}
    assert pdl_options(torch.device("cpu"), 32) == {"PDL": 0}
