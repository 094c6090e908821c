"""Prim's order over a minimum spanning tree without sequential steps: two Euler tours and binary lifting, one
program per lane, ``O(log n)`` barrier-separated rounds instead of ``n - 1`` dependent ones (an alternative
to ``salience._tree_prim_kernel``, the default up to ``salience.PARALLEL_ORDER_MAX_BLOCKS`` blocks: on the H200
28 us instead of 104 at 512 blocks).

Why it works (``kernels/NOTES.md`` v5): root the tree at block 0 and let ``p'(v)`` be the lower end of the
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

SLOTS = tl.constexpr(14)
"""Scratch arrays of ``ARCS`` entries per lane, besides the lifting tables."""

WARPS = 8
"""Warps of the one program per lane (8 as first timed; Boruvka's hooks, also one latency-bound program per
lane, got 5% faster with 16 at 512 blocks: a candidate for the next sweep, NOTES.md v8)."""


@triton.jit
def _list_rank(Dist, Nxt, succ, mask, rounds, SIZE: tl.constexpr):
    # -- each node's distance to the end of its list (succ < 0 there), by pointer jumping
    i = tl.arange(0, SIZE)
    dist = tl.where(mask & (succ >= 0), 1, 0)
    nxt = tl.where(mask, succ, -1)
    for _ in range(rounds):
        tl.store(Dist + i, dist)
        tl.store(Nxt + i, nxt)
        tl.debug_barrier()
        live = nxt >= 0
        far = tl.load(Dist + nxt, mask=live, other=0)
        skip = tl.load(Nxt + nxt, mask=live, other=-1)
        tl.debug_barrier()
        dist = dist + far
        nxt = tl.where(live, skip, nxt)
    return dist


@triton.jit
def _prim_order_kernel(EdgeLo, EdgeHi, EdgeLen, ByRank, Order, Pair, Length, Scratch, n, levels, rounds,
                       ARCS: tl.constexpr):
    lane = tl.program_id(0).to(tl.int64)
    out = lane * n
    base = Scratch + lane * (SLOTS + 2 * levels) * ARCS
    RANK_OF = base                    # rank of each edge; later: down-arc marks in tour order
    SORTED_ARC = base + ARCS          # tour 1: arc at each sorted position; later: prefix counts
    SORTED_KEY = base + 2 * ARCS      # sorted sources (tour 1), sorted parents (tour 2)
    POS = base + 3 * ARCS             # sorted position of each arc; later: children in order
    FIRST = base + 4 * ARCS           # first sorted position per source; later: first child
    NEXT = base + 5 * ARCS            # next position around a source; later: next sibling
    DIST = base + 6 * ARCS            # list ranking
    NXT = base + 7 * ARCS
    TOUR = base + 8 * ARCS            # tour position of each arc (tour 1, then tour 2)
    PARENT = base + 9 * ARCS
    PE = base + 10 * ARCS             # rank of the edge above each block (root: BIG)
    EDGE_ABOVE = base + 11 * ARCS
    BELOW_RANK = base + 12 * ARCS     # the block below the edge of each rank
    PPRIME = base + 13 * ARCS
    UP = base + SLOTS * ARCS
    MX = UP + levels * ARCS
    BIG: tl.constexpr = 2147483647
    i = tl.arange(0, ARCS)            # arcs, blocks, edges or ranks, by context
    m = 2 * (n - 1)
    edge_real = i < n - 1
    block_real = i < n
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
    tl.store(SORTED_ARC + i, s_arc)
    tl.store(SORTED_KEY + i, s_src)
    tl.store(POS + s_arc, i, mask=arc_real)
    tl.debug_barrier()
    prev_src = tl.load(SORTED_KEY + i - 1, mask=i > 0, other=-1)
    next_src = tl.load(SORTED_KEY + i + 1, mask=i + 1 < m, other=-1)
    tl.store(FIRST + s_src, i, mask=arc_real & (prev_src != s_src))
    tl.debug_barrier()
    first = tl.load(FIRST + s_src, mask=arc_real, other=0)
    tl.store(NEXT + i, tl.where(next_src == s_src, i + 1, first), mask=arc_real)
    tl.debug_barrier()
    # after arc u -> v comes the arc after v -> u around v; the tour ends where it would return to its start
    twin_pos = tl.load(POS + (i ^ 1), mask=arc_real, other=0)
    succ = tl.load(SORTED_ARC + tl.load(NEXT + twin_pos, mask=arc_real, other=0), mask=arc_real, other=0)
    succ = tl.where(succ == tl.load(SORTED_ARC), -1, succ)
    # (the clamps below only matter for NaN distances, where the tree may not span: no access out of bounds)
    tour = tl.minimum(tl.maximum((m - 1) - _list_rank(DIST, NXT, succ, arc_real, rounds, ARCS), 0), ARCS - 1)
    tl.store(TOUR + i, tour, mask=arc_real)
    tl.debug_barrier()
    # -- rooted at block 0: each edge's first arc in the tour goes down
    t_even = tl.load(TOUR + 2 * i, mask=edge_real, other=0)
    t_odd = tl.load(TOUR + 2 * i + 1, mask=edge_real, other=0)
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
    up = parent
    mx = pe
    for k in range(levels):
        tl.store(UP + k * ARCS + i, up, mask=block_real)
        tl.store(MX + k * ARCS + i, mx, mask=block_real)
        tl.debug_barrier()
        mx = tl.maximum(mx, tl.load(MX + k * ARCS + up, mask=block_real, other=BIG))
        up = tl.load(UP + k * ARCS + up, mask=block_real, other=0)
    # -- p'(v): from the parent, climb while every edge on the way is lighter than v's own
    x = parent
    for j in range(levels):
        k = levels - 1 - j
        mx_k = tl.load(MX + k * ARCS + x, mask=block_real, other=BIG)
        up_k = tl.load(UP + k * ARCS + x, mask=block_real, other=0)
        x = tl.where(mx_k < pe, up_k, x)
    kid = (i >= 1) & block_real
    tl.store(PPRIME + i, x, mask=block_real)
    # -- tour 2 over p', each block's children by the rank of their edge
    key2 = tl.sort(tl.where(kid, x * ARCS + pe, BIG))
    s_par = key2 // ARCS
    s_kid = tl.load(BELOW_RANK + key2 % ARCS, mask=edge_real, other=0)
    tl.store(SORTED_KEY + i, s_par)
    tl.store(POS + i, s_kid, mask=edge_real)
    tl.store(FIRST + i, -1)
    tl.store(NEXT + i, -1)
    tl.debug_barrier()
    prev_par = tl.load(SORTED_KEY + i - 1, mask=i > 0, other=-1)
    next_par = tl.load(SORTED_KEY + i + 1, mask=i + 1 < n - 1, other=-1)
    sibling = tl.load(POS + i + 1, mask=i + 1 < n - 1, other=-1)
    tl.store(FIRST + s_par, s_kid, mask=edge_real & (prev_par != s_par))
    tl.store(NEXT + s_kid, sibling, mask=edge_real & (next_par == s_par))
    tl.debug_barrier()
    # arcs 2w (down into w) and 2w + 1 (up out of w) for blocks w >= 1
    w = i // 2
    w_real = (w >= 1) & (w < n)
    first_child = tl.load(FIRST + w, mask=w_real, other=-1)
    next_sibling = tl.load(NEXT + w, mask=w_real, other=-1)
    pp = tl.load(PPRIME + w, mask=w_real, other=0)
    after_up = tl.where(next_sibling >= 0, 2 * next_sibling, tl.where(pp > 0, 2 * pp + 1, -1))
    succ2 = tl.where(i % 2 == 0, tl.where(first_child >= 0, 2 * first_child, i + 1), after_up)
    tour2 = tl.minimum(tl.maximum((m - 1) - _list_rank(DIST, NXT, succ2, w_real, rounds, ARCS), 0), ARCS - 1)
    # -- pre-order: the down arcs up to each one's tour position
    tl.store(RANK_OF + i, 0)
    tl.debug_barrier()
    tl.store(RANK_OF + tour2, 1, mask=w_real & (i % 2 == 0))
    tl.store(TOUR + i, tour2, mask=w_real)
    tl.debug_barrier()
    tl.store(SORTED_ARC + i, tl.cumsum(tl.load(RANK_OF + i), 0))
    tl.debug_barrier()
    t_down = tl.load(TOUR + 2 * i, mask=kid, other=0)
    position = tl.where(kid, tl.minimum(tl.load(SORTED_ARC + t_down, mask=kid, other=0), n - 1), 0)
    # -- each position's block and the edge that brought it
    e_above = tl.load(EDGE_ABOVE + i, mask=kid, other=0)
    pair = tl.load(EdgeLo + out + e_above, mask=kid, other=0) * n + tl.load(EdgeHi + out + e_above, mask=kid, other=0)
    tl.store(Order + out + position, i, mask=block_real)
    tl.store(Pair + out + position, pair, mask=kid)
    tl.store(Length + out + position, tl.load(EdgeLen + out + e_above, mask=kid, other=0.0), mask=kid)



def prim_order_parallel(edge_lo: torch.Tensor, edge_hi: torch.Tensor, edge_len: torch.Tensor, by_rank: torch.Tensor,
                        order: torch.Tensor, pair: torch.Tensor, length: torch.Tensor) -> None:
    """Prim's order from block 0 over trees ``(edge_lo, edge_hi, edge_len)`` (each ``[L, n]``, the ``n - 1``
    edges of each lane first) with ``by_rank [L, n]`` (the edge of each rank): writes ``order[l, t]`` (the
    block that joins at step ``t``), ``pair[l, t] = lo * n + hi`` and ``length[l, t]`` of the edge that
    brought it (``t >= 1``), as ``salience._tree_prim_kernel``. Trees that do not span (NaN distances) give
    meaningless orders but no access out of bounds."""
    lanes, n = order.shape
    arcs = max(2, triton.next_power_of_2(2 * n))
    levels = max(1, (n - 1).bit_length())
    rounds = max(1, (arcs - 1).bit_length())
    scratch = torch.empty(lanes * (SLOTS.value + 2 * levels) * arcs, dtype=torch.int32, device=order.device)
    _prim_order_kernel[(lanes,)](edge_lo, edge_hi, edge_len, by_rank, order, pair, length, scratch, n, levels, rounds,
                                 ARCS=arcs, num_warps=WARPS)
