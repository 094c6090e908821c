"""Minimum spanning trees by Boruvka rounds, for many lanes at once, with no host round trip.

A round has two parts. The search: a grid over the upper-triangle distance tiles finds, per tile, each block's
lightest edge to another component (:func:`.distances.tile_minima`; the first round's search is done by the
distance kernel itself). The hooks (:func:`_hooks`): per lane, each component takes its lightest edge, hooks onto
the component across it, records the edge, and labels follow the hooks by pointer jumping. Builds of up to
:data:`HOOKS_IN_SEARCH_MAX_LANES` lanes run a round's hooks in the last of the lane's search programs to finish
(one launch per round); more lanes get the hooks in a launch of their own (two per round). Components at least
halve each round, so ``ceil(log2(n))`` rounds complete every tree; the programs of a lane whose tree is complete
return at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...launch import launch
from .distances import DISTANCE_TILE, distances, lighter, tile_minima
from .pdl import pdl_options, wait_for_inputs

HOOKS_IN_SEARCH_MAX_LANES = 1
"""Builds of up to this many lanes run each round's hooks (after the first round's) in the last of the lane's
search programs to finish, with the search on as many warps as the hooks; more lanes get a hook launch after each
search. From H200 timings (topology/NOTES.md, "Numbers that were in the code"): fused rounds helped one lane and
slowed many lanes, whose hooks each waited for the lane's slowest search program."""


def hook_warps(block: int) -> int:
    """Warps of the hooks for ``block = next_power_of_2(n)`` blocks: 16 (one block per thread) from 512 blocks,
    else 4 (H200 timings, topology/NOTES.md)."""
    return 16 if block >= 512 else 4


@triton.jit
def _round_kernel(Dist, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, Arrived, n, slots,
                  stride_lane, stride_row, BLOCK: tl.constexpr, HOOKS: tl.constexpr, HOOK_BLOCK: tl.constexpr,
                  SLOTS: tl.constexpr, JUMPS: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- a round after the first. Per upper-triangle tile, each block's lightest edge to another component
    # (a lane whose tree is complete does nothing)
    tile_i, tile_j = tl.program_id(0), tl.program_id(1)
    lane = tl.program_id(2).to(tl.int64)
    if (tile_j >= tile_i) & (tl.load(Count + lane) < n - 1):
        rows = tile_i * BLOCK + tl.arange(0, BLOCK)
        cols = tile_j * BLOCK + tl.arange(0, BLOCK)
        comp = Comp + lane * n
        comp_row = tl.load(comp + rows, mask=rows < n, other=-1)
        comp_col = tl.load(comp + cols, mask=cols < n, other=-2)
        outside = (comp_row[:, None] != comp_col[None, :]) & (rows[:, None] < n) & (cols[None, :] < n)
        dist = Dist + lane * stride_lane + rows[:, None].to(tl.int64) * stride_row + cols[None, :]
        length = tl.load(dist, mask=outside, other=float("inf"))
        tile_minima(length, rows, cols, comp_row, comp_col, n, PLen, PKey, lane * n * slots, slots, tile_i, tile_j)
        # -- then, in the lane's last program to finish, the hooks
        if HOOKS:
            _hooks_when_last(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen,
                             Count, Arrived, HOOK_BLOCK, SLOTS, JUMPS, False)


@triton.jit
def _hook_kernel(Comp, PLen, PKey, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, n, slots,
                 HOOK_BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr, FIRST: tl.constexpr,
                 PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- the hooks in a launch of their own, one program per lane
    lane = tl.program_id(0).to(tl.int64)
    if tl.load(Count + lane) < n - 1:  # (a complete tree has nothing to hook)
        _hooks(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count,
               HOOK_BLOCK, SLOTS, JUMPS, FIRST)


@triton.jit
def _hooks_when_last(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count,
                     Arrived, HOOK_BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr,
                     FIRST: tl.constexpr):
    """Counts a search program's arrival in ``Arrived[lane]``; the lane's last one runs :func:`_hooks`. (The
    barrier and the release/acquire of the count order every program's partial minima before the hooks read
    them: the pattern of CUDA's threadfence reduction, with no wait on other programs.)"""
    arrivals = slots * (slots + 1) // 2  # the upper-triangle tiles (one slot per tile)
    tl.debug_barrier()
    ticket = tl.atomic_add(Arrived + lane, 1, sem="acq_rel", scope="gpu")
    if ticket == arrivals - 1:
        tl.debug_barrier()
        _hooks(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count,
               HOOK_BLOCK, SLOTS, JUMPS, FIRST)


@triton.jit
def _hooks(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count,
           BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr, FIRST: tl.constexpr):
    """Boruvka, part 2, for one lane whose tree is not complete: each component takes its lightest outgoing
    edge and hooks onto the component across it; labels then follow the hooks to the new roots. ``FIRST``:
    the first round, every block its own component (``Comp`` is not read)."""
    count = tl.load(Count + lane)
    base = lane * n
    v = tl.arange(0, BLOCK)
    inside = v < n
    NONE = n * n
    if FIRST:  # every block its own component
        comp = v
    else:
        comp = tl.load(Comp + base + v, mask=inside, other=0)
    # -- each block's lightest edge to another component: the least of its partial minima over the tiles,
    # SLOTS tiles at a time
    length = tl.full([BLOCK], float("inf"), PLen.dtype.element_ty)
    key = tl.full([BLOCK], NONE, tl.int32)
    for start in range(0, slots, SLOTS):
        s = start + tl.arange(0, SLOTS)
        slot = base * slots + v[:, None] * slots + s[None, :]
        real = inside[:, None] & (s[None, :] < slots)
        partial_len = tl.load(PLen + slot, mask=real, other=float("inf"))
        partial_key = tl.load(PKey + slot, mask=real, other=NONE)
        chunk_len = tl.min(partial_len, 1)
        chunk_key = tl.min(tl.where(partial_len == chunk_len[:, None], partial_key, NONE), 1)
        length, key = lighter(length, key, chunk_len, chunk_key)
    valid = inside & (key < NONE)
    # -- each component's lightest edge: lengths are >= 0 (or +inf), so their bit patterns order as integers:
    # a min on the bits, then on the pair
    bits = length.to(CompBits.dtype.element_ty, bitcast=True)
    infinite = tl.full([BLOCK], float("inf"), PLen.dtype.element_ty).to(CompBits.dtype.element_ty, bitcast=True)
    tl.store(CompBits + base + v, infinite, mask=inside)
    tl.store(CompKey + base + v, tl.full([BLOCK], NONE, tl.int32), mask=inside)
    tl.debug_barrier()
    tl.atomic_min(CompBits + base + comp, bits, mask=valid)
    tl.debug_barrier()
    shortest = tl.load(CompBits + base + comp, mask=valid, other=0)
    tl.atomic_min(CompKey + base + comp, key, mask=valid & (bits == shortest))
    tl.debug_barrier()
    # -- a root hooks onto the component across its edge; when two components chose the same edge, the one
    # with the lower label stays a root and records the edge (every tree edge is recorded once)
    is_root = inside & (comp == v)
    chosen = tl.load(CompKey + base + v, mask=inside, other=NONE)  # each component's edge, at its root
    edge = tl.where(is_root, chosen, NONE)
    has_edge = is_root & (edge < NONE)
    lo, hi = edge // n, edge % n
    if FIRST:
        comp_lo, comp_hi = lo, hi
    else:  # (tl.gather: labels from registers, not memory)
        comp_lo = tl.gather(comp, tl.where(has_edge, lo, 0), 0)
        comp_hi = tl.gather(comp, tl.where(has_edge, hi, 0), 0)
    target = tl.where(has_edge, tl.where(comp_lo == v, comp_hi, comp_lo), 0)
    mutual = tl.gather(chosen, target, 0) == edge
    hooks = has_edge & ~(mutual & (v < target))
    records = has_edge & ~(mutual & (v > target))
    at = count + tl.cumsum(records.to(tl.int32), 0) - 1
    records = records & (at < n - 1)  # always true for finite distances (a forest has at most n - 1 edges)
    edge_len = tl.load(CompBits + base + v, mask=records, other=0).to(EdgeLen.dtype.element_ty, bitcast=True)
    tl.store(EdgeLo + base + at, lo, mask=records)
    tl.store(EdgeHi + base + at, hi, mask=records)
    tl.store(EdgeLen + base + at, edge_len, mask=records)
    count += tl.sum(records.to(tl.int32), 0)
    tl.store(Count + lane, count)
    # -- pointer jumping in registers: roots point across their hook (or to themselves), other blocks to
    # their root; until no label changes (at most JUMPS times: hooks form trees whose roots point to themselves)
    jump = tl.where(inside, tl.where(hooks, target, comp), 0)
    moving = True
    jumps = 0
    while moving & (jumps < JUMPS):
        after = tl.gather(jump, jump, 0)
        moving = tl.max((after != jump).to(tl.int32), 0) > 0
        jump = after
        jumps += 1
    tl.store(Comp + base + v, jump, mask=inside)


class _Forest(NamedTuple):
    """Boruvka's state for ``L`` lanes of ``n`` blocks (int32 ``[L * n]`` unless noted): component labels,
    each component's lightest edge (its length's bits, int64 or int32, and its pair), the tree edges found so
    far (``lo``, ``hi``, ``length`` in the distances' dtype), the count of edges per lane (``[L]``) and, per
    round, how many of a lane's search programs have finished (``[rounds, L]``, zeroed)."""

    comp: torch.Tensor
    comp_bits: torch.Tensor
    comp_key: torch.Tensor
    edge_lo: torch.Tensor
    edge_hi: torch.Tensor
    edge_len: torch.Tensor
    count: torch.Tensor
    arrived: torch.Tensor

    def pointers(self, round: int) -> tuple[torch.Tensor, ...]:
        """The kernel arguments for one round (its row of ``arrived``)."""
        return (*self[:7], self.arrived[round])


def _hook_sizes(n: int, tiles: int) -> dict:
    """The constexprs of :func:`_hooks` for ``n`` blocks in ``tiles`` tiles per row."""
    block = triton.next_power_of_2(n)
    return dict(HOOK_BLOCK=block, SLOTS=min(triton.next_power_of_2(tiles), max(1, 8192 // block)),
                JUMPS=(n - 1).bit_length() + 1)


def boruvka(centroids: torch.Tensor, finite: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Minimum spanning trees of the centroids of each lane under the strict order ``(distance, i, j)``, by
    ``ceil(log2(n))`` Boruvka rounds (one or two launches each, after the distance kernel), with no host sync.
    Only the upper-triangle tiles of the distances are computed.

    Arguments:
        centroids: ``[L, n, D]``, float32 or float64, ``n >= 2``, on a CUDA device or (Triton's interpreter)
            the CPU.
        finite: a :func:`.distances.finite_flags` buffer that receives the centroids' finiteness flags, or None.

    Returns:
        ``(lo, hi, length, by_rank)``, each ``[L, n]``, contiguous: the ``n - 1`` tree edges of each lane first,
        in no particular order (int32 ``lo < hi``; ``length`` in the centroids' dtype), and a zeroed int32
        buffer for :func:`.prim.edge_ranks`. With NaN distances a tree may not span; its unfilled slots then
        still hold block 0 (meaningless but in bounds).
    """
    lanes, n, _ = centroids.shape
    device = centroids.device
    tiles = triton.cdiv(n, DISTANCE_TILE)
    log_n = (n - 1).bit_length()
    plen = torch.empty(lanes, n, tiles, dtype=centroids.dtype, device=device)
    pkey = torch.empty(lanes, n, tiles, dtype=torch.int32, device=device)
    # one zeroed buffer: with NaN distances the tree may not span, and the unfilled edge slots must still
    # index blocks; the counts of recorded edges and of arrivals start at 0
    zeroed = torch.zeros(3 * lanes * n + lanes + log_n * lanes, dtype=torch.int32, device=device)
    edge_lo, edge_hi, by_rank = zeroed[:3 * lanes * n].view(3, lanes * n).unbind(0)
    count = zeroed[3 * lanes * n:3 * lanes * n + lanes]
    arrived = zeroed[3 * lanes * n + lanes:].view(log_n, lanes)
    comp, comp_key = torch.empty(2, lanes * n, dtype=torch.int32, device=device).unbind(0)
    edge_len = torch.empty(lanes * n, dtype=centroids.dtype, device=device)
    bits = torch.int64 if centroids.dtype == torch.float64 else torch.int32
    comp_bits = torch.empty(lanes * n, dtype=bits, device=device)
    forest = _Forest(comp, comp_bits, comp_key, edge_lo, edge_hi, edge_len, count, arrived)
    fused = lanes <= HOOKS_IN_SEARCH_MAX_LANES
    # -- the distances and the first round's search
    dist = distances(centroids, mirror=False, minima=(plen, pkey), finite=finite)
    sizes = _hook_sizes(n, tiles)
    warps = hook_warps(sizes["HOOK_BLOCK"])
    pdl = pdl_options(device, lanes)
    for round in range(log_n):
        # -- the search (the distance kernel did the first round's), with the hooks when fused
        if round:
            launch(_round_kernel, (tiles, tiles, lanes),
                   (dist, plen, pkey, *forest.pointers(round), n, tiles, dist.stride(0), dist.stride(1)),
                   dict(BLOCK=DISTANCE_TILE, HOOKS=fused, **sizes, num_warps=warps if fused else 4, **pdl))
        # -- the hooks in a launch of their own: always in the first round, in every round when not fused
        if not fused or round == 0:
            launch(_hook_kernel, (lanes,), (forest.comp, plen, pkey, *forest[1:7], n, tiles),
                   dict(**sizes, FIRST=round == 0, num_warps=warps, **pdl))
    view = lambda x: x.view(lanes, n)  # noqa: E731
    return view(edge_lo), view(edge_hi), view(edge_len), view(by_rank)
