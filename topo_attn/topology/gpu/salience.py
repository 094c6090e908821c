"""Triton kernels for #22's elder-rule salience, for many lanes at once (a lane: a (batch, head) pair or a
shared schedule's single lane), with no host round trip and no Python loop over lanes or blocks.

1. ``_distance_kernel``: the distance matrix, ``sqrt(sum((c_i - c_j)^2))``, upper-triangle tiles mirrored.
2. The minimum spanning tree under the strict order ``(distance, min(i, j), max(i, j))`` (the same unique
   tree as ``persistence.prim_tree``) and its *Prim order*: position ``t`` holds the block that joined at step
   ``t`` and the key of its tree edge. Two ways, picked by :func:`choose_mst`:

   - ``_salience_kernel``: Prim over all pairs, one program per lane, one distance row read per step;
   - Boruvka rounds (``_round_kernel``; the first round's search fused into ``_distance_kernel``): a grid
     over upper-triangle tiles finds each block's lightest edge to another component; then each component
     takes its lightest edge, hooks and jumps pointers (``_hooks``), in a launch of its own
     (``_hook_kernel``) or, for a single lane, in the last of the lane's search programs to finish
     (:data:`HOOKS_IN_SEARCH_MAX_LANES`). ``ceil(log2(n))`` rounds in parallel over the whole matrix; then ``_edge_rank_kernel`` ranks the
     ``n - 1`` tree edges and Prim's order over them alone (Prim over the tree takes the same edges in the
     same order) comes from :mod:`.prim_order` (Euler tours and binary lifting, ``O(log n)`` rounds) or,
     above :data:`PARALLEL_ORDER_MAX_BLOCKS` blocks, from ``_tree_prim_kernel``: one integer minimum over
     registers per step.
3. The union-find sweep of ``persistence.elder_salience``, without the sweep, in two grid kernels (or, up to
   :data:`ELDER_IN_PROGRAM` blocks, at the end of the Prim program). In Prim order every cluster of
   Kruskal's merge tree is a run of consecutive positions, and the edge at position ``t`` merges the runs
   ``[a, t - 1]`` and ``[t, b]``, where ``a`` and ``b + 1`` are the nearest positions on either side holding
   a heavier edge (the merge tree is the Cartesian tree of the edge keys). The run lengths are the component
   sizes, so each edge knows which side moves (the smaller; equal sizes: the side holding the lower
   endpoint ``i``) (``_merge_sides``). A block's salience is the length of the heaviest edge whose moving
   side contains it: the last merge that moved it (``_elder_rows``). Both passes compare every position
   with every edge, a tile of positions at a time, instead of ``n - 1`` dependent union-find steps.

Prim keeps its per-block state in registers, ``BLOCK = next_power_of_2(n)`` wide, so ``n`` is limited to
:data:`MAX_BLOCKS`.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import MAX_BLOCKS
from .pdl import pdl_options, wait_for_inputs
from .prim_order import prim_order_parallel


@triton.jit
def _distance_kernel(C, Dist, PLen, PKey, Finite, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count,
                     Arrived, Pending, n, dim, slots, stride_cl, stride_cd, stride_cn, stride_dl, stride_dn,
                     BLOCK: tl.constexpr, MIRROR: tl.constexpr, MINIMA: tl.constexpr, FINITE: tl.constexpr,
                     HOOKS: tl.constexpr, HOOK_BLOCK: tl.constexpr, SLOTS: tl.constexpr,
                     JUMPS: tl.constexpr, UNROLL: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    tile_i, tile_j = tl.program_id(0), tl.program_id(1)
    # -- upper-triangle tiles only: tile (i, j) also stands for (j, i)
    if tile_j >= tile_i:
        lane = tl.program_id(2).to(tl.int64)
        rows = tile_i * BLOCK + tl.arange(0, BLOCK)
        cols = tile_j * BLOCK + tl.arange(0, BLOCK)
        a_ptrs = C + lane * stride_cl + rows * stride_cn
        b_ptrs = C + lane * stride_cl + cols * stride_cn
        # -- squared differences summed one feature after another (the same order for (i, j) and (j, i))
        acc = tl.zeros([BLOCK, BLOCK], C.dtype.element_ty)
        finite = tl.full([BLOCK], 1, tl.int1)
        for start in range(0, dim, UNROLL):
            for u in tl.static_range(UNROLL):
                d = start + u
                feature = rows * 0 + d < dim  # (a tail step reads zeros, which add exactly nothing)
                a = tl.load(a_ptrs + d * stride_cd, mask=(rows < n) & feature, other=0.0)
                b = tl.load(b_ptrs + d * stride_cd, mask=(cols < n) & feature, other=0.0)
                diff = a[:, None] - b[None, :]
                acc += diff * diff
                if FINITE:
                    finite = finite & (tl.abs(a) < float("inf"))  # False for NaN too
        dist = tl.sqrt(acc)
        # -- a diagonal tile flags whether its blocks' centroids are all finite
        if FINITE:
            if tile_j == tile_i:
                tl.store(Finite + lane * slots + tile_i, tl.min(finite.to(tl.int32), 0))
        # -- store the tile and, for Prim's full rows, its mirror image
        out = Dist + lane * stride_dl
        inside = (rows[:, None] < n) & (cols[None, :] < n)
        tl.store(out + rows[:, None].to(tl.int64) * stride_dn + cols[None, :], dist, mask=inside)
        if MIRROR:
            if tile_j > tile_i:
                tl.store(out + cols[:, None].to(tl.int64) * stride_dn + rows[None, :], tl.trans(dist),
                         mask=(cols[:, None] < n) & (rows[None, :] < n))
        # -- Boruvka's first round for free: every block is its own component
        if MINIMA:
            _tile_minima(dist, rows, cols, rows, cols, n, PLen, PKey, lane * n * slots, slots, tile_i, tile_j)
            # -- and, in the lane's last program to finish, the first round's hooks
            if HOOKS:
                _hooks_when_last(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi,
                                 EdgeLen, Count, Arrived, Pending, HOOK_BLOCK, SLOTS, JUMPS, True)


@triton.jit
def _tile_minima(length, rows, cols, comp_row, comp_col, n, PLen, PKey, base, slots, tile_i, tile_j):
    """Within one upper-triangle tile of distances ``length [rows, cols]``: each row's lightest edge to
    another component and, off the diagonal, each column's; stored as the partial minimum of that block
    over that tile (``[block, other tile]`` of ``PLen`` / ``PKey``, every slot written once)."""
    NONE = n * n
    outside = (comp_row[:, None] != comp_col[None, :]) & (rows[:, None] < n) & (cols[None, :] < n)
    length = tl.where(outside, length, float("inf"))
    pair = tl.where(outside, tl.minimum(rows[:, None], cols[None, :]) * n + tl.maximum(rows[:, None], cols[None, :]),
                    NONE)
    # -- the shortest length, then the lowest pair among the edges of that length (two plain reductions)
    row_len = tl.min(length, 1)
    row_key = tl.min(tl.where(length == row_len[:, None], pair, NONE), 1)
    tl.store(PLen + base + rows * slots + tile_j, row_len, mask=rows < n)
    tl.store(PKey + base + rows * slots + tile_j, row_key, mask=rows < n)
    if tile_j > tile_i:  # the mirror tile (j, i): the columns' edges to these rows
        col_len = tl.min(length, 0)
        col_key = tl.min(tl.where(length == col_len[None, :], pair, NONE), 0)
        tl.store(PLen + base + cols * slots + tile_i, col_len, mask=cols < n)
        tl.store(PKey + base + cols * slots + tile_i, col_key, mask=cols < n)


def _distance_tile(dtype: torch.dtype, lanes: int, n: int) -> tuple[int, int]:
    """(tile, warps) of the distance kernel, which also sets the tiles of Boruvka's searches and so the
    partial minima per block (``n / tile``). From H200 sweeps (NOTES.md): 32 x 32 on 4 warps for both
    dtypes (float32 per-lane builds at 32k: 0.58 ms with 64 x 64 tiles on 8 warps, 0.49 ms with these).
    (Smaller tiles, fewer warps or several features per step computed bare distances faster for some
    shapes, but lost more in the fused first-round search and the hooks' longer partial rows, or in
    register pressure.)"""
    return 32, 4


def _distance_unroll(lanes: int) -> int:
    """Features per step of the distance kernel's loop, unrolled (the sums keep their order). H200, 512
    blocks of dimension 128 (NOTES.md v9): one lane (one wave of tiles, latency-bound) 32.8 -> 27.7 us with 4
    (the shared 32k build's graph 134.5 -> 118.8 us in float64); 32 lanes 225.5 -> 214.6 us with 2 (4: 227)."""
    return 4 if lanes == 1 else 2


def distances(centroids: torch.Tensor, mirror: bool = True, minima: tuple[torch.Tensor, torch.Tensor] | None = None,
              finite: torch.Tensor | None = None, forest: "_Forest | None" = None) -> torch.Tensor:
    """``sqrt(sum((c_i - c_j)^2))`` for centroids ``[L, n, D]`` -> ``[L, n, n]`` in their dtype: no
    Gram-matrix shortcut (duplicates are exactly 0 apart), exactly symmetric. ``mirror=False`` writes only
    the upper-triangle tiles (of :func:`_distance_tile`'s size; the rest stays unset), half the bytes, all
    Boruvka reads. ``minima=(lengths, keys)``, each ``[L, n, tiles]``: also writes Boruvka's first-round
    partial minima (every block its own component), as :func:`_tile_minima`; with ``forest`` (a
    :class:`_Forest`), each lane's last program also runs the first round's hooks. ``finite``: an int32
    ``[L, tiles]`` buffer that gets 1 where a tile's centroids are all finite, else 0 (checked on the diagonal
    tiles' loads)."""
    lanes, n, dim = centroids.shape
    features_first = centroids.transpose(1, 2).contiguous()  # [L, D, n]: one feature of 64 blocks is one load
    dist = torch.empty(lanes, n, n, dtype=centroids.dtype, device=centroids.device)
    block, warps = _distance_tile(centroids.dtype, lanes, n)
    tiles = triton.cdiv(n, block)
    grid = (tiles, tiles, lanes)
    plen, pkey = minima if minima is not None else (dist, dist)  # (unused without minima)
    hooks = forest is not None and minima is not None
    state = forest.pointers(0) if hooks else (dist,) * 9  # (unused without hooks)
    _distance_kernel[grid](features_first, dist, plen, pkey, dist if finite is None else finite, *state, n, dim,
                           tiles, *features_first.stride(), dist.stride(0), dist.stride(1), BLOCK=block,
                           MIRROR=mirror, MINIMA=minima is not None, FINITE=finite is not None,
                           HOOKS=hooks, **_hook_sizes(n, tiles), UNROLL=_distance_unroll(lanes), num_warps=warps,
                           **pdl_options(dist.device, lanes))
    return dist


def finite_flags(lanes: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The int32 ``[L, tiles]`` buffer for :func:`distances`' finiteness flags."""
    return torch.empty(lanes, triton.cdiv(n, _distance_tile(dtype, lanes, n)[0]), dtype=torch.int32, device=device)


@triton.jit
def _lighter(length_a, key_a, length_b, key_b):
    """The lighter of two candidate edges under the strict order (length, key)."""
    a_first = (length_a < length_b) | ((length_a == length_b) & (key_a < key_b))
    return tl.where(a_first, length_a, length_b), tl.where(a_first, key_a, key_b)


@triton.jit
def _salience_kernel(Dist, Order, Pair, Length, SideLo, SideHi, Salience, n, stride_lane, stride_row,
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
        # -- the lightest edge leaving the tree, ties to the lowest (low, high) pair, in one reduction (on the
        # H200 5-10% faster than a minimum and then a minimum among the ties)
        length, edge = tl.reduce((best, key), 0, _lighter)
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

    if ELDER:
        # -- small trees: the elder rule in this program, ROWS positions at a time; each pass reads what all
        # threads of the program wrote before it
        tl.debug_barrier()
        for start_t in range(0, n, ROWS):
            _merge_sides(Order, Pair, Length, SideLo, SideHi, out, n, start_t, ROWS, COLS)
        tl.debug_barrier()
        for start_p in range(0, n, ROWS):
            _elder_rows(Order, Length, SideLo, SideHi, Salience, out, n, start_p, ROWS, COLS)


@triton.jit
def _round_kernel(Dist, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, Arrived, Pending, n,
                  slots, stride_lane, stride_row, BLOCK: tl.constexpr, HOOKS: tl.constexpr,
                  HOOK_BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- a Boruvka round after the first. Per upper-triangle tile, each block's lightest edge to another
    # component (a lane whose tree is complete does nothing)
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
        _tile_minima(length, rows, cols, comp_row, comp_col, n, PLen, PKey, lane * n * slots, slots, tile_i, tile_j)
        # -- then, in the lane's last program to finish, the hooks
        if HOOKS:
            _hooks_when_last(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen,
                             Count, Arrived, Pending, HOOK_BLOCK, SLOTS, JUMPS, False)


@triton.jit
def _hook_kernel(Comp, PLen, PKey, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, Pending, n, slots,
                 HOOK_BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr, FIRST: tl.constexpr,
                 PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- the hooks in a launch of their own (see HOOKS_IN_SEARCH_MAX_LANES), one program per lane
    lane = tl.program_id(0).to(tl.int64)
    if tl.load(Count + lane) < n - 1:  # (a complete tree has nothing to hook)
        _hooks(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, Pending,
               HOOK_BLOCK, SLOTS, JUMPS, FIRST)


@triton.jit
def _hooks_when_last(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count,
                     Arrived, Pending, HOOK_BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr,
                     FIRST: tl.constexpr):
    """Counts a search program's arrival in ``Arrived[lane]``; the lane's last one runs :func:`_hooks`. (The
    barrier and the release/acquire of the count order every program's partial minima before the hooks read
    them: the pattern of CUDA's threadfence reduction, with no wait on other programs.)"""
    arrivals = slots * (slots + 1) // 2  # the upper-triangle tiles (one slot per tile)
    tl.debug_barrier()
    ticket = tl.atomic_add(Arrived + lane, 1, sem="acq_rel", scope="gpu")
    if ticket == arrivals - 1:
        tl.debug_barrier()
        _hooks(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, Pending,
               HOOK_BLOCK, SLOTS, JUMPS, FIRST)


@triton.jit
def _hooks(lane, n, slots, PLen, PKey, Comp, CompBits, CompKey, EdgeLo, EdgeHi, EdgeLen, Count, Pending,
           BLOCK: tl.constexpr, SLOTS: tl.constexpr, JUMPS: tl.constexpr, FIRST: tl.constexpr):
    """Boruvka, part 2, for one lane whose tree is not complete: each component takes its lightest outgoing
    edge and hooks onto the component across it; labels then follow the hooks to the new roots. ``Pending``
    (the round's int32 flag, zeroed) is set to 1 if the lane's tree is still not complete."""
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
        length, key = _lighter(length, key, chunk_len, chunk_key)
    valid = inside & (key < NONE)
    # lengths are >= 0 (or +inf), so their bit patterns order as integers: a min on the bits, then on the pair
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
    tl.atomic_max(Pending, (count < n - 1).to(tl.int32))  # (another round is needed: see SKIP_ROUNDS_FROM)
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


@triton.jit
def _edge_rank_kernel(EdgeLo, EdgeHi, EdgeLen, ByRank, n, ROWS: tl.constexpr, COLS: tl.constexpr,
                      PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- each tree edge's rank under the strict order (length, lo, hi); ByRank[rank] is the edge
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
        lighter = (len_f[None, :] < len_e[:, None]) | ((len_f[None, :] == len_e[:, None]) & (pair_f[None, :] < pair_e[:, None]))
        rank += tl.sum((lighter & real_f[None, :]).to(tl.int32), 1)
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
    pair_t = tl.load(EdgeLo + out + edge_t, mask=t < n, other=0) * n + tl.load(EdgeHi + out + edge_t, mask=t < n, other=0)
    length_t = tl.load(EdgeLen + out + edge_t, mask=t < n, other=0.0)
    tl.debug_barrier()
    tl.store(Pair + out + t, pair_t, mask=t < n)
    tl.store(Length + out + t, length_t, mask=t < n)

    if ELDER:
        tl.debug_barrier()
        for start_t in range(0, n, ROWS):
            _merge_sides(Order, Pair, Length, SideLo, SideHi, out, n, start_t, ROWS, COLS)
        tl.debug_barrier()
        for start_p in range(0, n, ROWS):
            _elder_rows(Order, Length, SideLo, SideHi, Salience, out, n, start_p, ROWS, COLS)


@triton.jit
def _merge_sides_kernel(Order, Pair, Length, SideLo, SideHi, n, ROWS: tl.constexpr, COLS: tl.constexpr,
                        PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- larger trees: one program per (tile of positions, lane)
    _merge_sides(Order, Pair, Length, SideLo, SideHi, tl.program_id(1).to(tl.int64) * n, n,
                 tl.program_id(0) * ROWS, ROWS, COLS)


@triton.jit
def _elder_kernel(Order, Length, SideLo, SideHi, Salience, n, ROWS: tl.constexpr, COLS: tl.constexpr,
                  PDL: tl.constexpr):
    wait_for_inputs(PDL)
    _elder_rows(Order, Length, SideLo, SideHi, Salience, tl.program_id(1).to(tl.int64) * n, n,
                tl.program_id(0) * ROWS, ROWS, COLS)


@triton.jit
def _merge_sides(Order, Pair, Length, SideLo, SideHi, base, n, start_t, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Which positions the edges at Prim positions ``start_t .. start_t + ROWS - 1`` move: ``[SideLo, SideHi]``."""
    t = start_t + tl.arange(0, ROWS)  # Prim positions: the edge that joined block Order[t]
    edge = (t >= 1) & (t < n)
    length_t = tl.load(Length + base + t, mask=edge, other=0.0)
    pair_t = tl.load(Pair + base + t, mask=edge, other=0)
    # -- the nearest heavier edges on either side (none: the ends of the order)
    left = tl.zeros([ROWS], tl.int32)
    right = tl.full([ROWS], n, tl.int32)
    for start in range(0, n, COLS):
        s = start + tl.arange(0, COLS)
        length_s = tl.load(Length + base + s, mask=(s >= 1) & (s < n), other=0.0)
        pair_s = tl.load(Pair + base + s, mask=(s >= 1) & (s < n), other=0)
        heavier = (length_s[None, :] > length_t[:, None]) | (
            (length_s[None, :] == length_t[:, None]) & (pair_s[None, :] > pair_t[:, None]))
        heavier &= ((s >= 1) & (s < n))[None, :]
        left = tl.maximum(left, tl.max(tl.where(heavier & (s[None, :] < t[:, None]), s[None, :], 0), 1))
        right = tl.minimum(right, tl.min(tl.where(heavier & (s[None, :] > t[:, None]), s[None, :], n), 1))
    # -- the edge merges positions [left, t - 1] with [t, right - 1]; the smaller run moves, on equal sizes
    # the run holding the lower endpoint i (the new block Order[t] is on the right)
    block_t = tl.load(Order + base + t, mask=edge, other=0)
    i_on_right = pair_t // n == block_t
    left_size, right_size = t - left, right - t
    i_moves = tl.where(i_on_right, right_size <= left_size, left_size <= right_size)
    right_moves = i_on_right == i_moves
    side_lo = tl.where(edge, tl.where(right_moves, t, left), 1)  # no edge at position 0: an empty side
    side_hi = tl.where(edge, tl.where(right_moves, right - 1, t - 1), 0)
    tl.store(SideLo + base + t, side_lo, mask=t < n)
    tl.store(SideHi + base + t, side_hi, mask=t < n)


@triton.jit
def _elder_rows(Order, Length, SideLo, SideHi, Salience, base, n, start_p, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Salience of the blocks at Prim positions ``start_p .. start_p + ROWS - 1``."""
    p = start_p + tl.arange(0, ROWS)
    # -- the heaviest edge whose moving side holds the position (0 if none ever moved it)
    salience = tl.zeros([ROWS], Length.dtype.element_ty)
    for start in range(0, n, COLS):
        t = start + tl.arange(0, COLS)
        side_lo = tl.load(SideLo + base + t, mask=t < n, other=1)
        side_hi = tl.load(SideHi + base + t, mask=t < n, other=0)
        length = tl.load(Length + base + t, mask=(t >= 1) & (t < n), other=0.0)
        moved = (side_lo[None, :] <= p[:, None]) & (p[:, None] <= side_hi[None, :])
        salience = tl.maximum(salience, tl.max(tl.where(moved, length[None, :], 0.0), 1))
    # -- back from Prim positions to block indices
    block = tl.load(Order + base + p, mask=p < n, other=0)
    tl.store(Salience + base + block, salience, mask=p < n)


def _num_warps(block: int) -> int:
    # Prim: its time grows with the blocks each thread holds until the reduction across warps dominates; on
    # the H200 (NOTES.md) 8 warps took 35% off at 512 blocks, 16 took 30% off at 1024 and 2048
    return 4 if block <= 256 else 8 if block <= 512 else 16


def _hook_warps(block: int) -> int:
    # Boruvka's hooks: one block per thread from 512 blocks (H200, shared 32k build: the graph's GPU time
    # 144 -> 138 us with 16 warps instead of 8; 4 warps: 159)
    return 16 if block >= 512 else _num_warps(block)


ELDER_IN_PROGRAM = 64
"""Most blocks for which the elder-rule passes run at the end of the Prim program; larger trees get a grid
of programs for each pass (on the H200 the grid was faster from 128 blocks; at 512 blocks the in-program
passes took 0.26 ms, the grid's 0.04 ms)."""


HOOKS_IN_SEARCH_MAX_LANES = 1
"""Builds of up to this many lanes run each Boruvka round's hooks in the last of its search programs to
finish (one launch per round, the search on as many warps as the hooks); more lanes get the hooks in a
launch of their own after the search (two per round). On the H200 fused rounds took one lane's graph from
117.8 to 115.7 us at 512 blocks and from 102.3 to 95 at 256 (NOTES.md v9); in v8 they doubled
the per-lane 32k build (0.59 -> 1.27 ms): each lane's hooks waited for its slowest search program."""

FIRST_HOOKS_IN_DISTANCES = False
"""With fused rounds, whether the distance kernel's last program also runs the first round's hooks (on the
distance kernel's 4 warps) instead of a hook launch of their own (H200, shared 32k build: the graph's GPU
time 115.7 us with the launch, 123.3 without; NOTES.md v9)."""


SKIP_ROUNDS_FROM: int | None = None
"""Inside a CUDA graph, run the Boruvka rounds after the round of this index (0: the first) each under a
conditional node of the graph, nested, so that they are skipped once every lane's tree is complete (each
round's hooks set a flag when it is not). ``ceil(log2 n)`` rounds are launched; on random keys at 512 blocks
only three do work, on real keys three to five, and an empty round costs the graph about 1.6 us for one
lane, 7 us for 32 (H200, NOTES.md v10). Needs a PyTorch with ``CUDAGraph.begin_capture_to_if_node``; the
H200's torch 2.11 has none, so this has not run on a GPU yet: off (None) until it has. Outside a graph
capture it has no effect."""


def _skip_rounds_from(centroids: torch.Tensor) -> int | None:
    """:data:`SKIP_ROUNDS_FROM` while a CUDA graph is being captured on the current stream, else None."""
    if SKIP_ROUNDS_FROM is None or not centroids.is_cuda:
        return None
    if not hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"):
        return None
    return SKIP_ROUNDS_FROM if torch.cuda.is_current_stream_capturing() else None


@contextlib.contextmanager
def _only_if(flag: torch.Tensor):
    """Capture what runs inside into a conditional node of the graph being captured: it runs at replay only
    if the 0-dim bool CUDA tensor ``flag`` is true then."""
    graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    graph.begin_capture_to_if_node(flag)
    try:
        yield
    finally:
        graph.end_capture_to_conditional_node()


class _Forest(NamedTuple):
    """Boruvka's state for ``L`` lanes of ``n`` blocks (int32 ``[L * n]`` unless noted): component labels,
    each component's lightest edge (its length's bits, int64 or int32, and its pair), the tree edges found so far (``lo``, ``hi``, ``length`` in the distances' dtype), the count of
    edges per lane (``[L]``), per round how many of a lane's search programs have finished (``[rounds, L]``,
    zeroed) and whether any lane's tree is still not complete after it (``[rounds]``, zeroed)."""

    comp: torch.Tensor
    comp_bits: torch.Tensor
    comp_key: torch.Tensor
    edge_lo: torch.Tensor
    edge_hi: torch.Tensor
    edge_len: torch.Tensor
    count: torch.Tensor
    arrived: torch.Tensor
    pending: torch.Tensor

    def pointers(self, round: int) -> tuple[torch.Tensor, ...]:
        """The kernel arguments for one round (its row of ``arrived``, its entry of ``pending``)."""
        return (*self[:7], self.arrived[round], self.pending[round:round + 1])


def _hook_sizes(n: int, tiles: int) -> dict:
    """The constexprs of :func:`_hooks` for ``n`` blocks in ``tiles`` tiles per row."""
    block = triton.next_power_of_2(n)
    return dict(HOOK_BLOCK=block, SLOTS=min(triton.next_power_of_2(tiles), max(1, 8192 // block)),
                JUMPS=(n - 1).bit_length() + 1)


def _boruvka(centroids: torch.Tensor, finite: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Minimum spanning trees of centroids ``[L, n, D]`` under the strict order ``(distance, i, j)`` by
    Boruvka rounds: ``(lo, hi, length)``, each ``[L, n]`` with the ``n - 1`` tree edges (``lo < hi``) of
    each lane first, in no particular order, a zeroed int32 ``[L, n]`` buffer (for the edge ranks) and the
    rounds' flags (int32 ``[ceil(log2(n))]``: 1 where some lane's tree was still not complete after the round).
    Only the upper-triangle tiles of the distances are written; the distance kernel also does the first
    round's search and hooks (and writes ``finite``, see :func:`distances`). ``ceil(log2(n))`` rounds of one
    launch each (components at least halve each round; the programs of a lane whose tree is complete return
    at once), with no host sync."""
    lanes, n, _ = centroids.shape
    device = centroids.device
    tile = _distance_tile(centroids.dtype, lanes, n)[0]
    tiles = triton.cdiv(n, tile)
    log_n = (n - 1).bit_length()
    plen = torch.empty(lanes, n, tiles, dtype=centroids.dtype, device=device)
    pkey = torch.empty(lanes, n, tiles, dtype=torch.int32, device=device)
    # one zeroed buffer: with NaN distances the tree may not span, and the unfilled edge slots must still
    # index blocks; the counts of recorded edges and of arrivals start at 0
    zeroed = torch.zeros(3 * lanes * n + lanes + log_n * lanes + log_n, dtype=torch.int32, device=device)
    edge_lo, edge_hi, by_rank = zeroed[:3 * lanes * n].view(3, lanes * n).unbind(0)
    count = zeroed[3 * lanes * n:3 * lanes * n + lanes]
    arrived = zeroed[3 * lanes * n + lanes:-log_n].view(log_n, lanes)
    pending = zeroed[-log_n:]
    comp, comp_key = torch.empty(2, lanes * n, dtype=torch.int32, device=device).unbind(0)
    edge_len = torch.empty(lanes * n, dtype=centroids.dtype, device=device)
    bits = torch.int64 if centroids.dtype == torch.float64 else torch.int32
    comp_bits = torch.empty(lanes * n, dtype=bits, device=device)
    forest = _Forest(comp, comp_bits, comp_key, edge_lo, edge_hi, edge_len, count, arrived, pending)
    fused = lanes <= HOOKS_IN_SEARCH_MAX_LANES
    first_fused = fused and FIRST_HOOKS_IN_DISTANCES
    dist = distances(centroids, mirror=False, minima=(plen, pkey), finite=finite,
                     forest=forest if first_fused else None)
    sizes = _hook_sizes(n, tiles)
    hook_warps = _hook_warps(sizes["HOOK_BLOCK"])
    skip = _skip_rounds_from(centroids)
    pdl = pdl_options(device, lanes)
    with contextlib.ExitStack() as later_rounds:
        for round in range(log_n):
            if round:  # (the distance kernel did the first round's search)
                _round_kernel[(tiles, tiles, lanes)](dist, plen, pkey, *forest.pointers(round), n, tiles,
                                                     dist.stride(0), dist.stride(1), BLOCK=tile, HOOKS=fused,
                                                     **sizes, num_warps=hook_warps if fused else 4, **pdl)
            if not fused or (round == 0 and not first_fused):
                _hook_kernel[(lanes,)](forest.comp, plen, pkey, *forest[1:7], pending[round:round + 1], n, tiles,
                                       **sizes, FIRST=round == 0, num_warps=hook_warps, **pdl)
            # -- in a CUDA graph, the rounds after this one only run while some lane's tree is not complete
            if skip is not None and skip <= round < log_n - 1:
                later_rounds.enter_context(_only_if(pending.view(torch.bool)[4 * round]))
    view = lambda x: x.view(lanes, n)  # noqa: E731
    return view(edge_lo), view(edge_hi), view(edge_len), view(by_rank), pending


PARALLEL_ORDER_MAX_BLOCKS = 2048
"""Up to this many blocks Boruvka builds find Prim's order with :mod:`.prim_order` by default (H200, 512
blocks: 28 us instead of the step-by-step walk's 104; 2048 blocks: 251 instead of 782; not timed above)."""

PRIM_MAX_BLOCKS = 32
"""Up to this many blocks Prim over all pairs is used; above, Boruvka + Prim over the tree. On the H200
(NOTES.md v8) Boruvka was faster at 128 blocks (shared builds 0.19 vs 0.23 ms at S = 8k, 0.18-0.28 vs 0.33 at
16k with 128-token blocks) and as fast or slightly faster at 64."""

BORUVKA_MAX_BYTES = 48 * 2**20
"""Above this many bytes of stored distances (the upper triangle, all lanes) Prim over all pairs is used:
each Boruvka round reads all of them, which pays while they stay in the H200's 50 MB L2."""


def choose_mst(lanes: int, n: int, dtype: torch.dtype) -> str:
    """The tree search that :func:`salience_kernels` uses by default: ``"prim"`` or ``"boruvka"``."""
    big = lanes * n * n // 2 * torch.finfo(dtype).bits // 8 > BORUVKA_MAX_BYTES
    return "prim" if n <= PRIM_MAX_BLOCKS or big else "boruvka"


def salience_kernels(centroids: torch.Tensor, num_warps: int | None = None,
                     elder_in_program: bool | None = None, mst: str | None = None,
                     parallel_order: bool | None = None) -> torch.Tensor:
    """Elder-rule salience of centroids ``[L, n, D]`` (float32 or float64, on a CUDA device or, in Triton's
    interpreter, the CPU) -> ``[L, n]`` in the centroids' dtype and device; ``n <= MAX_BLOCKS``.
    ``num_warps`` overrides Prim's warp count, ``elder_in_program`` where the elder-rule passes run (by
    default in the Prim program up to :data:`ELDER_IN_PROGRAM` blocks, in a grid of programs above).
    ``mst``: ``"boruvka"`` finds the tree in parallel rounds and then walks Prim's order over its edges
    alone; ``"prim"`` runs Prim over the whole distance matrix; by default :func:`choose_mst` picks.
    ``parallel_order``: with Boruvka, find Prim's order with :mod:`.prim_order` (Euler tours and binary
    lifting, no sequential steps) instead of one step per block; by default up to
    :data:`PARALLEL_ORDER_MAX_BLOCKS` blocks.

    Distances are ``sqrt(sum((c_i - c_j)^2))`` in the centroids' dtype (no Gram-matrix shortcut), so they are
    exactly symmetric; they differ from the CPU path's only in the rounding of the sum. Centroids that are
    not finite give meaningless saliences (but no read out of bounds): callers check them."""
    return salience_and_finite(centroids, num_warps, elder_in_program, mst, parallel_order=parallel_order)[0]


RANK_ROWS, RANK_COLS = 16, 512
"""Edges per program of ``_edge_rank_kernel`` and edges it compares them with per step (H200, 512 blocks:
7.1 -> 3.0 us for one lane, 9.3 -> 6.6 for 32, against 64 x 64; NOTES.md v8)."""


def salience_and_finite(centroids: torch.Tensor, num_warps: int | None = None, elder_in_program: bool | None = None,
                        mst: str | None = None, out: torch.Tensor | None = None,
                        finite: torch.Tensor | None = None, parallel_order: bool | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`salience_kernels` and device flags (int32 or bool, some shape) that are all nonzero if and only
    if the centroids are finite, found on the way (by the distance kernel). ``out``: a
    contiguous ``[L, n]`` tensor of the centroids' dtype for the saliences; ``finite``: a
    :func:`finite_flags` buffer for the flags (``n > 1``)."""
    lanes, n, _ = centroids.shape
    if n == 1:  # a single block: #22's convention
        salience = torch.ones(lanes, 1, dtype=centroids.dtype, device=centroids.device)
        return (salience if out is None else out.copy_(salience)), torch.isfinite(centroids).all(-1)
    block = triton.next_power_of_2(n)
    device = centroids.device
    order, pair, side_lo, side_hi = torch.empty(4, lanes, n, dtype=torch.int32, device=device).unbind(0)
    length = torch.empty(lanes, n, dtype=centroids.dtype, device=device)
    salience = torch.empty_like(length) if out is None else out
    if finite is None:
        finite = finite_flags(lanes, n, centroids.dtype, device)
    in_program = n <= ELDER_IN_PROGRAM if elder_in_program is None else elder_in_program
    pdl = pdl_options(device, lanes)
    rows, cols = 16, min(256, block)
    if mst is None:
        mst = choose_mst(lanes, n, centroids.dtype)
    if mst not in ("prim", "boruvka"):
        raise ValueError(f"mst must be 'prim' or 'boruvka', got {mst!r}")
    if parallel_order is None:  # (the walk keeps the elder passes in its program for small trees)
        parallel_order = n <= PARALLEL_ORDER_MAX_BLOCKS and not in_program
    if mst == "boruvka":
        edge_lo, edge_hi, edge_len, by_rank, _ = _boruvka(centroids, finite)
        _edge_rank_kernel[(triton.cdiv(n, RANK_ROWS), lanes)](edge_lo, edge_hi, edge_len, by_rank, n,
                                                              ROWS=RANK_ROWS, COLS=min(RANK_COLS, block),
                                                              num_warps=4, **pdl)
        if parallel_order:
            prim_order_parallel(edge_lo, edge_hi, edge_len, by_rank, order, pair, length)
            in_program = False  # the elder passes in their grids
        else:
            _tree_prim_kernel[(lanes,)](edge_lo, edge_hi, edge_len, by_rank, order, pair, length, side_lo,
                                        side_hi, salience, n, BLOCK=block, ROWS=rows, COLS=cols, ELDER=in_program,
                                        num_warps=num_warps or _num_warps(block), **pdl)
    else:
        dist = distances(centroids, finite=finite)
        _salience_kernel[(lanes,)](dist, order, pair, length, side_lo, side_hi, salience, n, dist.stride(0),
                                   dist.stride(1), BLOCK=block, ROWS=rows, COLS=cols, ELDER=in_program,
                                   num_warps=num_warps or _num_warps(block), **pdl)
    if not in_program:
        grid = (triton.cdiv(n, rows), lanes)
        _merge_sides_kernel[grid](order, pair, length, side_lo, side_hi, n, ROWS=rows, COLS=cols, num_warps=4,
                                  **pdl)
        _elder_kernel[grid](order, length, side_lo, side_hi, salience, n, ROWS=rows, COLS=cols, num_warps=4, **pdl)
    return salience, finite
