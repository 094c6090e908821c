"""Prim's algorithm on the GPU, one program per lane, started at block 0, under the strict edge order
``(distance, min(i, j), max(i, j))`` (the unique tree of ``persistence.prim_tree``). Two ways to the same
*Prim order* (position ``t`` holds the block that joined at step ``t`` and the pair and length of its tree edge):

- :func:`prim_all_pairs`: Prim over the whole distance matrix, one distance row read per step;
- :func:`tree_prim_order`: Prim over the ``n - 1`` edges of a tree found by Boruvka rounds, given their ranks
  (:func:`edge_ranks`): Prim over the tree takes the same edges in the same order, and each step is one integer
  minimum over registers. (:mod:`.prim_order` finds the same order without sequential steps.)

Both can end with the elder rule's passes in the same program (small trees: :func:`.elder.elder_in_program`).
Prim keeps its per-block state in registers, ``next_power_of_2(n)`` wide, so ``n`` is limited to
:data:`~topo_attn.topology.gpu.MAX_BLOCKS`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...launch import launch
from .distances import lighter
from .elder import elder_in_program, elder_tile
from .pdl import pdl_options, wait_for_inputs

RANK_ROWS = 16
"""Tree edges per program of the rank kernel."""

RANK_COLS = 512
"""Most edges the rank kernel compares its edges with per step. Both rank tiles from an H200 sweep
(topology/NOTES.md, "Numbers that were in the code")."""


def prim_warps(block: int) -> int:
    """Warps of a Prim program holding ``block`` blocks (a power of two): 4 up to 256, 8 at 512, 16 above. Its
    time grows with the blocks each thread holds until the reduction across warps dominates (H200 sweep,
    topology/NOTES.md)."""
    return 4 if block <= 256 else 8 if block <= 512 else 16


@triton.jit
def _prim_kernel(Dist, Order, Pair, Length, SideLo, SideHi, Salience, n, stride_lane, stride_row,
                 BLOCK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, ELDER: tl.constexpr,
                 PDL: tl.constexpr):
    wait_for_inputs(PDL)
    lane = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    dist = Dist + lane * stride_lane
    out = lane * n
    # -- the tree starts as block 0. best[u] is the lightest edge from the tree to u, key[u] its strict-order
    # key: pair * 2 + (u is the high endpoint), with pair = low * BLOCK + high; blocks in the tree hold NONE
    NONE: tl.constexpr = 2 * BLOCK * BLOCK
    outside = (offs < n) & (offs != 0)
    best = tl.load(dist + offs, mask=outside, other=float("inf"))
    key = tl.where(outside, offs * 2 + 1, NONE)
    tl.store(Order + out, 0)
    for step in range(1, n):
        # -- the lightest edge leaving the tree, ties to the lowest (low, high) pair, in one reduction
        length, edge = tl.reduce((best, key), 0, lighter)
        pair_low, pair_high = (edge // 2) // BLOCK, (edge // 2) % BLOCK
        # (the clamp only matters for NaN distances, which the callers reject: no read out of bounds)
        new = tl.minimum(tl.where(edge % 2 == 1, pair_high, pair_low), n - 1)
        tl.store(Order + out + step, new)
        tl.store(Pair + out + step, pair_low * n + pair_high)
        tl.store(Length + out + step, length)
        # -- the new block joins the tree; its edges may be the lightest way to blocks still outside
        joins = offs == new
        outside = outside & ~joins
        best = tl.where(joins, float("inf"), best)
        key = tl.where(joins, NONE, key)
        row = tl.load(dist + new.to(tl.int64) * stride_row + offs, mask=outside, other=float("inf"))
        new_key = (tl.minimum(offs, new) * BLOCK + tl.maximum(offs, new)) * 2 + (offs > new)
        closer = outside & ((row < best) | ((row == best) & (new_key < key)))
        best = tl.where(closer, row, best)
        key = tl.where(closer, new_key, key)
    # -- small trees: the elder rule in this program
    if ELDER:
        elder_in_program(Order, Pair, Length, SideLo, SideHi, Salience, out, n, ROWS, COLS)


@triton.jit
def _edge_rank_kernel(EdgeLo, EdgeHi, EdgeLen, ByRank, n, ROWS: tl.constexpr, COLS: tl.constexpr,
                      PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- each tree edge's rank under the strict order (length, lo, hi): the edges lighter than it
    lane = tl.program_id(1).to(tl.int64)
    base = lane * n
    e = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    real_e = e < n - 1
    len_e = tl.load(EdgeLen + base + e, mask=real_e, other=0.0)
    pair_e = tl.load(EdgeLo + base + e, mask=real_e, other=0) * n + tl.load(EdgeHi + base + e, mask=real_e, other=0)
    rank = tl.zeros([ROWS], tl.int32)
    for start in range(0, n - 1, COLS):
        f = start + tl.arange(0, COLS)
        real_f = f < n - 1
        len_f = tl.load(EdgeLen + base + f, mask=real_f, other=0.0)
        pair_f = tl.load(EdgeLo + base + f, mask=real_f, other=0) * n + tl.load(EdgeHi + base + f, mask=real_f, other=0)
        lighter_f = (len_f[None, :] < len_e[:, None]) | (
            (len_f[None, :] == len_e[:, None]) & (pair_f[None, :] < pair_e[:, None]))
        rank += tl.sum((lighter_f & real_f[None, :]).to(tl.int32), 1)
    # -- ByRank[rank] is the edge
    tl.store(ByRank + base + rank, e, mask=real_e)


@triton.jit
def _tree_prim_kernel(EdgeLo, EdgeHi, EdgeLen, ByRank, Order, Pair, Length, SideLo, SideHi, Salience, n,
                      BLOCK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, ELDER: tl.constexpr,
                      PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- Prim's order over the tree's n - 1 edges alone (the same order as over all pairs: Prim only ever
    # takes tree edges), edges in rank order, each edge's endpoint flags in registers: one integer minimum
    # and no memory read per step
    lane = tl.program_id(0).to(tl.int64)
    out = lane * n
    r = tl.arange(0, BLOCK)  # the edge of rank r
    real = r < n - 1
    edge = tl.load(ByRank + out + r, mask=real, other=0)
    lo = tl.load(EdgeLo + out + edge, mask=real, other=0)
    hi = tl.load(EdgeHi + out + edge, mask=real, other=0)
    NONE: tl.constexpr = BLOCK * BLOCK
    lo_in = real & (lo == 0)
    hi_in = real & (hi == 0)
    tl.store(Order + out, 0)
    for step in range(1, n):
        # -- the lowest-ranked edge with one end in the tree; key = rank * BLOCK + its end outside the tree
        key = tl.where(lo_in != hi_in, r * BLOCK + tl.where(lo_in, hi, lo), NONE)
        chosen = tl.min(key, 0)
        new = chosen % BLOCK
        tl.store(Order + out + step, new)
        tl.store(Pair + out + step, chosen // BLOCK)  # the rank for now: pairs and lengths after the loop
        lo_in = lo_in | (real & (lo == new))
        hi_in = hi_in | (real & (hi == new))
    # -- each position's edge: from its rank to its pair and length
    tl.debug_barrier()
    t = r + 1
    # (the clamp only matters for NaN distances, where the tree may not span: no read out of bounds)
    rank_t = tl.minimum(tl.load(Pair + out + t, mask=t < n, other=0), n - 2)
    edge_t = tl.load(ByRank + out + rank_t, mask=t < n, other=0)
    pair_t = (tl.load(EdgeLo + out + edge_t, mask=t < n, other=0) * n
              + tl.load(EdgeHi + out + edge_t, mask=t < n, other=0))
    length_t = tl.load(EdgeLen + out + edge_t, mask=t < n, other=0.0)
    tl.debug_barrier()
    tl.store(Pair + out + t, pair_t, mask=t < n)
    tl.store(Length + out + t, length_t, mask=t < n)
    # -- small trees: the elder rule in this program
    if ELDER:
        elder_in_program(Order, Pair, Length, SideLo, SideHi, Salience, out, n, ROWS, COLS)


def prim_all_pairs(dist: torch.Tensor, order: torch.Tensor, pair: torch.Tensor, length: torch.Tensor,
                   side_lo: torch.Tensor, side_hi: torch.Tensor, salience: torch.Tensor, elder: bool) -> None:
    """Prim's order of each lane over all pairs of blocks, one program per lane.

    Arguments:
        dist: ``[L, n, n]`` distances (float32 or float64, every entry set, last stride 1), ``n >= 2``.
        order: int32 ``[L, n]``, contiguous: receives the block that joins at each step (``order[:, 0] == 0``).
        pair: int32 ``[L, n]``, contiguous: receives ``lo * n + hi`` of the edge that brought ``order[:, t]``
            (``t >= 1``).
        length: ``[L, n]`` of ``dist``'s dtype, contiguous: receives that edge's length (``t >= 1``).
        side_lo, side_hi, salience: as :func:`.elder.elder_in_grids`; written only with ``elder``.
        elder: also run the elder rule's passes at the end of the program (writing ``salience``).
    """
    lanes, n = order.shape
    block = triton.next_power_of_2(n)
    rows, cols = elder_tile(n)
    launch(_prim_kernel, (lanes,),
           (dist, order, pair, length, side_lo, side_hi, salience, n, dist.stride(0), dist.stride(1)),
           dict(BLOCK=block, ROWS=rows, COLS=cols, ELDER=elder, num_warps=prim_warps(block),
                **pdl_options(order.device, lanes)))


def edge_ranks(edge_lo: torch.Tensor, edge_hi: torch.Tensor, edge_len: torch.Tensor, by_rank: torch.Tensor) -> None:
    """The rank of each tree edge under the strict order ``(length, lo, hi)``, a grid over (tiles of
    :data:`RANK_ROWS` edges, lanes).

    Arguments:
        edge_lo, edge_hi: int32 ``[L, n]``, contiguous: the ``n - 1`` tree edges of each lane first (``lo < hi``).
        edge_len: ``[L, n]``, float32 or float64, contiguous: their lengths.
        by_rank: int32 ``[L, n]``, contiguous: receives the edge of each rank (``by_rank[l, r]``, ``r < n - 1``).
    """
    lanes, n = by_rank.shape
    launch(_edge_rank_kernel, (triton.cdiv(n, RANK_ROWS), lanes), (edge_lo, edge_hi, edge_len, by_rank, n),
           dict(ROWS=RANK_ROWS, COLS=min(RANK_COLS, triton.next_power_of_2(n)), num_warps=4,
                **pdl_options(by_rank.device, lanes)))


def tree_prim_order(edge_lo: torch.Tensor, edge_hi: torch.Tensor, edge_len: torch.Tensor, by_rank: torch.Tensor,
                    order: torch.Tensor, pair: torch.Tensor, length: torch.Tensor, side_lo: torch.Tensor,
                    side_hi: torch.Tensor, salience: torch.Tensor, elder: bool) -> None:
    """Prim's order of each lane over its tree edges alone, one program per lane, step by step.

    Arguments:
        edge_lo, edge_hi, edge_len, by_rank: a tree and its ranks, as :func:`edge_ranks` (``n >= 2``).
        order, pair, length: receive the Prim order, as :func:`prim_all_pairs`.
        side_lo, side_hi, salience: as :func:`.elder.elder_in_grids`; written only with ``elder``.
        elder: also run the elder rule's passes at the end of the program (writing ``salience``).

    Trees that do not span (NaN distances) give meaningless orders but no access out of bounds.
    """
    lanes, n = order.shape
    block = triton.next_power_of_2(n)
    rows, cols = elder_tile(n)
    launch(_tree_prim_kernel, (lanes,),
           (edge_lo, edge_hi, edge_len, by_rank, order, pair, length, side_lo, side_hi, salience, n),
           dict(BLOCK=block, ROWS=rows, COLS=cols, ELDER=elder, num_warps=prim_warps(block),
                **pdl_options(order.device, lanes)))
