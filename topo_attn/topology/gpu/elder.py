"""The elder rule over a minimum spanning tree in Prim order: the union-find sweep of
``persistence.elder_salience`` without the sweep, in two passes parallel over positions.

In Prim order every cluster of Kruskal's merge tree is a run of consecutive positions, and the edge at position
``t`` merges the runs ``[a, t - 1]`` and ``[t, b]``, where ``a`` and ``b + 1`` are the nearest positions on
either side holding a heavier edge (the merge tree is the Cartesian tree of the edge keys). The run lengths are
the component sizes, so each edge knows which side moves (the smaller; equal sizes: the side holding the lower
endpoint ``i``): :func:`merge_sides`. A block's salience is the length of the heaviest edge whose moving side
contains it, the last merge that moved it: :func:`elder_rows`. Both passes compare every position with every
edge, a tile of positions at a time, instead of ``n - 1`` dependent union-find steps. They run at the end of
the Prim program for small trees (the Prim kernels call them) or in two grids (:func:`elder_in_grids`).

The inputs, per lane of ``n`` blocks (int32 unless noted, ``[L, n]``): ``Order[t]``, the block that joined at
Prim step ``t``; ``Pair[t] = lo * n + hi`` and ``Length[t]`` (the distances' dtype) of the tree edge that brought
it (``t >= 1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...launch import launch
from .pdl import pdl_options, wait_for_inputs

ELDER_ROWS = 16
"""Positions per program (or per step of an in-program pass)."""

ELDER_COLS = 256
"""Most edges a pass compares its positions with per step."""


def elder_tile(n: int) -> tuple[int, int]:
    """``(ROWS, COLS)`` constexprs of :func:`merge_sides` and :func:`elder_rows` for trees of ``n`` blocks:
    :data:`ELDER_ROWS` and :data:`ELDER_COLS`, the latter at most ``next_power_of_2(n)``."""
    return ELDER_ROWS, min(ELDER_COLS, triton.next_power_of_2(n))


@triton.jit
def merge_sides(Order, Pair, Length, SideLo, SideHi, base, n, start_t, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Which positions the edges at Prim positions ``start_t .. start_t + ROWS - 1`` of the lane at ``base``
    move: written as the closed range ``[SideLo, SideHi]`` per position (empty, ``[1, 0]``, at position 0)."""
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
def elder_rows(Order, Length, SideLo, SideHi, Salience, base, n, start_p, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Salience of the blocks at Prim positions ``start_p .. start_p + ROWS - 1`` of the lane at ``base``,
    from the moving sides of :func:`merge_sides`: written to ``Salience`` at the blocks' own indices."""
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


@triton.jit
def elder_in_program(Order, Pair, Length, SideLo, SideHi, Salience, base, n, ROWS: tl.constexpr,
                     COLS: tl.constexpr):
    """Both passes for the lane at ``base`` in the calling program (all its threads), ``ROWS`` positions at
    a time; each pass reads what every thread of the program wrote before it."""
    tl.debug_barrier()
    for start_t in range(0, n, ROWS):
        merge_sides(Order, Pair, Length, SideLo, SideHi, base, n, start_t, ROWS, COLS)
    tl.debug_barrier()
    for start_p in range(0, n, ROWS):
        elder_rows(Order, Length, SideLo, SideHi, Salience, base, n, start_p, ROWS, COLS)


@triton.jit
def _merge_sides_kernel(Order, Pair, Length, SideLo, SideHi, n, ROWS: tl.constexpr, COLS: tl.constexpr,
                        PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- one program per (tile of positions, lane)
    merge_sides(Order, Pair, Length, SideLo, SideHi, tl.program_id(1).to(tl.int64) * n, n,
                tl.program_id(0) * ROWS, ROWS, COLS)


@triton.jit
def _elder_kernel(Order, Length, SideLo, SideHi, Salience, n, ROWS: tl.constexpr, COLS: tl.constexpr,
                  PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # -- one program per (tile of positions, lane), after every merge side is known
    elder_rows(Order, Length, SideLo, SideHi, Salience, tl.program_id(1).to(tl.int64) * n, n,
               tl.program_id(0) * ROWS, ROWS, COLS)


def elder_in_grids(order: torch.Tensor, pair: torch.Tensor, length: torch.Tensor, side_lo: torch.Tensor,
                   side_hi: torch.Tensor, salience: torch.Tensor) -> None:
    """The elder rule for larger trees: the two passes in two launches, each a grid over (tiles of
    :data:`ELDER_ROWS` positions, lanes).

    Arguments:
        order, pair: int32 ``[L, n]``, contiguous: the Prim order and each position's edge pair (see the module).
        length: ``[L, n]``, float32 or float64, contiguous: each position's edge length.
        side_lo, side_hi: int32 ``[L, n]`` scratch, contiguous: the moving sides.
        salience: ``[L, n]`` of ``length``'s dtype, contiguous: receives the saliences by block index.
    """
    lanes, n = order.shape
    rows, cols = elder_tile(n)
    grid = (triton.cdiv(n, rows), lanes)
    pdl = pdl_options(order.device, lanes)
    launch(_merge_sides_kernel, grid, (order, pair, length, side_lo, side_hi, n),
           dict(ROWS=rows, COLS=cols, num_warps=4, **pdl))
    launch(_elder_kernel, grid, (order, length, side_lo, side_hi, salience, n),
           dict(ROWS=rows, COLS=cols, num_warps=4, **pdl))
