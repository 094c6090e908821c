"""Prim's order over a minimum spanning tree without sequential steps: two Euler tours and binary lifting, one
program per lane, ``O(log n)`` barrier-separated rounds instead of ``n - 1`` dependent ones (the same order as
:func:`.prim.tree_prim_order`; :mod:`.salience` uses it for Boruvka builds of up to
``salience.PARALLEL_ORDER_MAX_BLOCKS`` blocks).

Why it works (topology/NOTES.md, "Prim's order"): root the tree at block 0 and let ``p'(v)`` be the lower end of the
nearest edge above ``v`` on its root path that is heavier than ``v``'s own parent edge (block 0 if none).
Prim's order from block 0 is the pre-order of the tree ``p'`` with each block's children in increasing rank
of their parent edges. So:

1. tour 1 over the tree (arcs grouped by source with one sort, each arc's successor, list ranking by pointer
   jumping) roots it: an edge's first arc in the tour goes down;
2. binary lifting over the rooted tree (ancestors and the heaviest edge rank over ``2^k`` steps) gives
   ``p'``;
3. tour 2 over ``p'`` (children sorted by rank) and a count of the down arcs in tour order give each block's
   position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...launch import launch
from .pdl import pdl_options, wait_for_inputs

SLOTS = tl.constexpr(10)
"""Scratch arrays of ``ARCS`` entries per lane, besides the lifting tables."""

WARPS = 16
"""Warps of the one program per lane (the fastest of 4, 8 and 16 in an H200 sweep; topology/NOTES.md, "Numbers
that were in the code")."""


@triton.jit
def _list_rank(succ, mask, rounds):
    # -- each node's distance to the end of its list (succ < 0 there), by pointer jumping in registers
    # (tl.gather: no round trip through memory per round)
    dist = tl.where(mask & (succ >= 0), 1, 0)
    nxt = tl.where(mask, succ, -1)
    for _ in range(rounds):
        live = nxt >= 0
        at = tl.where(live, nxt, 0)
        dist += tl.where(live, tl.gather(dist, at, 0), 0)
        nxt = tl.where(live, tl.gather(nxt, at, 0), -1)
    return dist


@triton.jit
def _prim_order_kernel(EdgeLo, EdgeHi, EdgeLen, ByRank, Order, Pair, Length, Scratch, n, levels, rounds,
                       ARCS: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # Values indexed by this program's own tensors are read with tl.gather; only scatters (a store at a
    # computed index) go through the scratch memory, each followed by a barrier before it is read
    lane = tl.program_id(0).to(tl.int64)
    out = lane * n
    base = Scratch + lane * (SLOTS + 2 * levels) * ARCS
    RANK_OF = base                    # rank of each edge
    POS = base + ARCS                 # tour 1: sorted position of each arc
    FIRST = base + 2 * ARCS           # tour 1: first sorted position per source
    PARENT = base + 3 * ARCS
    PE = base + 4 * ARCS              # rank of the edge above each block (root: BIG)
    EDGE_ABOVE = base + 5 * ARCS
    BELOW_RANK = base + 6 * ARCS      # the block below the edge of each rank
    CHILD = base + 7 * ARCS           # tour 2: first child + 1 (0: none)
    SIBLING = base + 8 * ARCS         # tour 2: next sibling + 1 (0: none)
    MARK = base + 9 * ARCS            # down arcs marked at their tour position
    UP = base + SLOTS * ARCS
    MX = UP + levels * ARCS
    BIG: tl.constexpr = 2147483647
    i = tl.arange(0, ARCS)            # arcs, blocks, edges or ranks, by context
    m = 2 * (n - 1)
    edge_real = i < n - 1
    block_real = i < n
    before = tl.maximum(i - 1, 0)
    after = tl.minimum(i + 1, ARCS - 1)
    # -- zeroed scratch and order: with NaN distances the tree may not span and some entries are never
    # written; they must still index blocks (the results are then meaningless but in bounds)
    for slot in range(2 * levels + SLOTS):
        tl.store(base + slot * ARCS + i, 0)
    tl.store(Order + out + i, 0, mask=block_real)
    tl.debug_barrier()
    # -- each edge's rank
    e_of_rank = tl.load(ByRank + out + i, mask=edge_real, other=0)
    tl.store(RANK_OF + e_of_rank, i, mask=edge_real)
    # -- tour 1 over the tree: arcs 2e (lo -> hi) and 2e + 1 (hi -> lo) grouped by source
    arc_real = i < m
    e = i // 2
    lo = tl.load(EdgeLo + out + e, mask=arc_real, other=0)
    hi = tl.load(EdgeHi + out + e, mask=arc_real, other=0)
    src = tl.where(i % 2 == 0, lo, hi)
    key = tl.sort(tl.where(arc_real, src * ARCS + i, BIG))
    s_arc = key % ARCS
    s_src = key // ARCS
    prev_src = tl.where(i > 0, tl.gather(s_src, before, 0), -1)
    next_src = tl.where(i + 1 < m, tl.gather(s_src, after, 0), -1)
    tl.store(POS + s_arc, i, mask=arc_real)
    tl.store(FIRST + s_src, i, mask=arc_real & (prev_src != s_src))
    tl.debug_barrier()
    # after arc u -> v comes the arc after v -> u around v; the tour ends where it would return to its start
    first = tl.load(FIRST + s_src, mask=arc_real, other=0)
    around = tl.where(arc_real, tl.where(next_src == s_src, i + 1, first), 0)  # the next position around
    twin_pos = tl.load(POS + (i ^ 1), mask=arc_real, other=0)
    succ = tl.gather(s_arc, tl.gather(around, twin_pos, 0), 0)
    succ = tl.where(succ == tl.gather(s_arc, i * 0, 0), -1, succ)
    # (the clamps below only matter for NaN distances, where the tree may not span: no access out of bounds)
    tour = tl.minimum(tl.maximum((m - 1) - _list_rank(succ, arc_real, rounds), 0), ARCS - 1)
    # -- rooted at block 0: each edge's first arc in the tour goes down
    t_even = tl.gather(tour, tl.minimum(2 * i, ARCS - 1), 0)
    t_odd = tl.gather(tour, tl.minimum(2 * i + 1, ARCS - 1), 0)
    e_lo = tl.load(EdgeLo + out + i, mask=edge_real, other=0)
    e_hi = tl.load(EdgeHi + out + i, mask=edge_real, other=0)
    goes_up = t_odd < t_even  # hi -> lo comes first: lo is the child
    child = tl.where(goes_up, e_lo, e_hi)
    rank_e = tl.minimum(tl.maximum(tl.load(RANK_OF + i, mask=edge_real, other=0), 0), n - 2)
    tl.store(PARENT + child, tl.where(goes_up, e_hi, e_lo), mask=edge_real)
    tl.store(PE + child, rank_e, mask=edge_real)
    tl.store(EDGE_ABOVE + child, i, mask=edge_real)
    tl.store(BELOW_RANK + rank_e, child, mask=edge_real)
    tl.store(PARENT, 0)
    tl.store(PE, BIG)
    tl.debug_barrier()
    parent = tl.load(PARENT + i, mask=block_real, other=0)
    pe = tl.load(PE + i, mask=block_real, other=BIG)
    # -- binary lifting: UP[k][x] the 2^k-th ancestor, MX[k][x] the heaviest of the 2^k edges from x upward
    # (computed in registers, kept in memory for the climb)
    up = parent
    mx = pe
    for k in range(levels):
        tl.store(UP + k * ARCS + i, up, mask=block_real)
        tl.store(MX + k * ARCS + i, mx, mask=block_real)
        mx = tl.where(block_real, tl.maximum(mx, tl.gather(mx, up, 0)), BIG)
        up = tl.where(block_real, tl.gather(up, up, 0), 0)
    tl.debug_barrier()
    # -- p'(v): from the parent, climb while every edge on the way is lighter than v's own
    x = parent
    for j in range(levels):
        k = levels - 1 - j
        mx_k = tl.load(MX + k * ARCS + x, mask=block_real, other=BIG)
        up_k = tl.load(UP + k * ARCS + x, mask=block_real, other=0)
        x = tl.where(mx_k < pe, up_k, x)
    kid = (i >= 1) & block_real
    # -- tour 2 over p', each block's children by the rank of their edge
    key2 = tl.sort(tl.where(kid, x * ARCS + pe, BIG))
    s_par = key2 // ARCS
    s_kid = tl.load(BELOW_RANK + key2 % ARCS, mask=edge_real, other=0)
    prev_par = tl.where(i > 0, tl.gather(s_par, before, 0), -1)
    next_par = tl.where(i + 1 < n - 1, tl.gather(s_par, after, 0), -1)
    sibling = tl.where(i + 1 < n - 1, tl.gather(s_kid, after, 0), -1)
    tl.store(CHILD + s_par, s_kid + 1, mask=edge_real & (prev_par != s_par))
    tl.store(SIBLING + s_kid, sibling + 1, mask=edge_real & (next_par == s_par))
    tl.debug_barrier()
    # arcs 2w (down into w) and 2w + 1 (up out of w) for blocks w >= 1
    w = i // 2
    w_real = (w >= 1) & (w < n)
    first_child = tl.load(CHILD + w, mask=w_real, other=0) - 1
    next_sibling = tl.load(SIBLING + w, mask=w_real, other=0) - 1
    pp = tl.where(w_real, tl.gather(x, w, 0), 0)
    after_up = tl.where(next_sibling >= 0, 2 * next_sibling, tl.where(pp > 0, 2 * pp + 1, -1))
    succ2 = tl.where(i % 2 == 0, tl.where(first_child >= 0, 2 * first_child, i + 1), after_up)
    tour2 = tl.minimum(tl.maximum((m - 1) - _list_rank(succ2, w_real, rounds), 0), ARCS - 1)
    # -- pre-order: the down arcs up to each one's tour position
    tl.store(MARK + tour2, 1, mask=w_real & (i % 2 == 0))
    tl.debug_barrier()
    down_before = tl.cumsum(tl.load(MARK + i), 0)
    t_down = tl.gather(tour2, tl.minimum(2 * i, ARCS - 1), 0)
    position = tl.where(kid, tl.minimum(tl.gather(down_before, t_down, 0), n - 1), 0)
    # -- each position's block and the edge that brought it
    e_above = tl.load(EDGE_ABOVE + i, mask=kid, other=0)
    pair = tl.load(EdgeLo + out + e_above, mask=kid, other=0) * n + tl.load(EdgeHi + out + e_above, mask=kid, other=0)
    tl.store(Order + out + position, i, mask=block_real)
    tl.store(Pair + out + position, pair, mask=kid)
    tl.store(Length + out + position, tl.load(EdgeLen + out + e_above, mask=kid, other=0.0), mask=kid)


def prim_order_parallel(edge_lo: torch.Tensor, edge_hi: torch.Tensor, edge_len: torch.Tensor, by_rank: torch.Tensor,
                        order: torch.Tensor, pair: torch.Tensor, length: torch.Tensor) -> None:
    """Prim's order from block 0 over each lane's tree, in one launch of one program per lane.

    Arguments:
        edge_lo, edge_hi, edge_len, by_rank: the tree (the ``n - 1`` edges of each lane first) and the edge of
            each rank, as :func:`.prim.edge_ranks` (each ``[L, n]``, contiguous, ``n >= 2``).
        order, pair, length: receive the Prim order as :func:`.prim.tree_prim_order`: ``order[l, t]``, the
            block that joins at step ``t``; ``pair[l, t] = lo * n + hi`` and ``length[l, t]`` of the edge that
            brought it (``t >= 1``).

    Trees that do not span (NaN distances) give meaningless orders but no access out of bounds.
    """
    lanes, n = order.shape
    arcs = max(2, triton.next_power_of_2(2 * n))
    levels = max(1, (n - 1).bit_length())
    rounds = max(1, (arcs - 1).bit_length())
    scratch = torch.empty(lanes * (SLOTS.value + 2 * levels) * arcs, dtype=torch.int32, device=order.device)
    launch(_prim_order_kernel, (lanes,),
           (edge_lo, edge_hi, edge_len, by_rank, order, pair, length, scratch, n, levels, rounds),
           dict(ARCS=arcs, num_warps=WARPS, **pdl_options(order.device, lanes)))
