"""The distances between block centroids, ``sqrt(sum((c_i - c_j)^2))``, for many lanes at once, and what the
distance kernel finds on the way: the finiteness of the centroids and, for Boruvka's first round, each block's
lightest edge per tile.

The kernel computes upper-triangle tiles of :data:`DISTANCE_TILE` x :data:`DISTANCE_TILE` distances; a tile
``(i, j)`` also stands for ``(j, i)`` (mirrored for Prim over all pairs, left unset for Boruvka, which reads only
the upper triangle). Edges are ordered strictly by ``(length, min(i, j), max(i, j))``: :func:`lighter` compares
two candidates, :func:`tile_minima` reduces a tile to each block's lightest candidate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...launch import launch
from .pdl import pdl_options, wait_for_inputs

DISTANCE_TILE = 32
"""Rows and columns of a distance tile; it also sets the tiles of Boruvka's searches and so the partial minima
per block (``n / DISTANCE_TILE``). From H200 sweeps, for float32 and float64 alike (topology/NOTES.md, "Numbers
that were in the code")."""

DISTANCE_WARPS = 4
"""Warps per distance tile (from the same H200 sweeps)."""


def distance_unroll(lanes: int) -> int:
    """Features per step of the distance kernel's loop, unrolled (the sums keep their order and bits): 4 for one
    lane (a latency-bound single wave of tiles), 2 for more (H200 sweep, topology/NOTES.md)."""
    return 4 if lanes == 1 else 2


@triton.jit
def lighter(length_a, key_a, length_b, key_b):
    """The lighter of two candidate edges under the strict order ``(length, key)``: ``(length, key)`` of it,
    elementwise (a combine function for ``tl.reduce``)."""
    a_first = (length_a < length_b) | ((length_a == length_b) & (key_a < key_b))
    return tl.where(a_first, length_a, length_b), tl.where(a_first, key_a, key_b)


@triton.jit
def tile_minima(length, rows, cols, comp_row, comp_col, n, PLen, PKey, base, slots, tile_i, tile_j):
    """Within one upper-triangle tile of distances ``length [rows, cols]``: each row's lightest edge to
    another component (``comp_row != comp_col``) and, off the diagonal, each column's; stored as the partial
    minimum of that block over that tile (``[block, other tile]`` of ``PLen`` / ``PKey`` from ``base``, row
    stride ``slots``; every slot written once). The key of edge ``(i, j)``, ``i < j``, is ``i * n + j``; a
    block with no such edge gets ``(inf, n * n)``."""
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


@triton.jit
def _distance_kernel(C, Dist, PLen, PKey, Finite, n, dim, slots, stride_cl, stride_cd, stride_cn, stride_dl,
                     stride_dn, BLOCK: tl.constexpr, MIRROR: tl.constexpr, MINIMA: tl.constexpr,
                     FINITE: tl.constexpr, UNROLL: tl.constexpr, PDL: tl.constexpr):
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
            tile_minima(dist, rows, cols, rows, cols, n, PLen, PKey, lane * n * slots, slots, tile_i, tile_j)


def distances(centroids: torch.Tensor, mirror: bool = True, minima: tuple[torch.Tensor, torch.Tensor] | None = None,
              finite: torch.Tensor | None = None) -> torch.Tensor:
    """Distances between the centroids of each lane, in one launch: no Gram-matrix shortcut (duplicates are
    exactly 0 apart), exactly symmetric (the sum for ``(i, j)`` and ``(j, i)`` is taken once).

    Arguments:
        centroids: ``[L, n, D]``, float32 or float64, on a CUDA device or (Triton's interpreter) the CPU.
        mirror: write every entry (True) or only the upper-triangle tiles (False: half the bytes; the other
            entries stay unset), which is all that Boruvka reads.
        minima: ``(lengths, keys)``, each ``[L, n, tiles]`` with ``tiles = cdiv(n, DISTANCE_TILE)`` (lengths in
            the centroids' dtype, keys int32), or None. Given, the kernel also writes Boruvka's first-round
            partial minima into them (every block its own component), as :func:`tile_minima`.
        finite: an int32 :func:`finite_flags` buffer ``[L, tiles]``, or None. Given, the kernel writes 1 where
            a tile's centroids are all finite, else 0 (NaN or Inf).

    Returns:
        ``[L, n, n]`` in the centroids' dtype and device: ``sqrt(sum((c_i - c_j)^2))``.
    """
    lanes, n, dim = centroids.shape
    features_first = centroids.transpose(1, 2).contiguous()  # [L, D, n]: one feature of 64 blocks is one load
    dist = torch.empty(lanes, n, n, dtype=centroids.dtype, device=centroids.device)
    tiles = triton.cdiv(n, DISTANCE_TILE)
    plen, pkey = minima if minima is not None else (dist, dist)  # (unused without minima)
    launch(_distance_kernel, (tiles, tiles, lanes),
           (features_first, dist, plen, pkey, dist if finite is None else finite, n, dim, tiles,
            *features_first.stride(), dist.stride(0), dist.stride(1)),
           dict(BLOCK=DISTANCE_TILE, MIRROR=mirror, MINIMA=minima is not None, FINITE=finite is not None,
                UNROLL=distance_unroll(lanes), num_warps=DISTANCE_WARPS, **pdl_options(dist.device, lanes)))
    return dist


def finite_flags(lanes: int, n: int, device: torch.device) -> torch.Tensor:
    """The buffer for :func:`distances`' finiteness flags.

    Arguments:
        lanes, n: the centroids' lanes and blocks (``n >= 1``).
        device: the centroids' device.

    Returns:
        An uninitialised int32 ``[lanes, cdiv(n, DISTANCE_TILE)]`` tensor on ``device``.
    """
    return torch.empty(lanes, triton.cdiv(n, DISTANCE_TILE), dtype=torch.int32, device=device)
