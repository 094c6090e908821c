"""Triton kernels for #22's elder-rule salience, one program per lane (a (batch, head) pair or a shared
schedule's single lane), with no host round trip and no Python loop over lanes or blocks.

1. ``_prim_kernel``: Prim's minimum spanning tree of the complete graph on the block centroids under the
   strict order ``(distance, min(i, j), max(i, j))``: the same unique tree as ``persistence._prim``.
2. the tree edges are put in merge order ``(distance, i, j)`` with two stable torch sorts;
3. ``_elder_kernel``: the union-find sweep of ``persistence._elder_salience``: at each merge every block of
   the smaller component (equal sizes: the one holding ``i``) takes the merge distance.

Each program keeps its per-block state (lightest edge into the tree, component label and size) in registers,
``BLOCK = next_power_of_2(n)`` wide, so ``n`` is limited to :data:`MAX_BLOCKS`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCKS = 4096
"""Largest number of key blocks per lane the kernels take (the per-block state lives in registers)."""


@triton.jit
def _distance_kernel(C, Dist, n, dim, stride_cl, stride_cn, stride_dl, stride_dn,
                     BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    lane = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    a_ptrs = C + lane * stride_cl + rows * stride_cn
    b_ptrs = C + lane * stride_cl + cols * stride_cn
    # -- squared differences summed one feature after another (the same order for (i, j) and (j, i))
    acc = tl.zeros([BLOCK_I, BLOCK_J], C.dtype.element_ty)
    for d in range(dim):
        diff = tl.load(a_ptrs + d, mask=rows < n, other=0.0)[:, None] - tl.load(b_ptrs + d, mask=cols < n, other=0.0)[None, :]
        acc += diff * diff
    tl.store(Dist + lane * stride_dl + rows[:, None].to(tl.int64) * stride_dn + cols[None, :], tl.sqrt(acc),
             mask=(rows[:, None] < n) & (cols[None, :] < n))


def distances(centroids: torch.Tensor) -> torch.Tensor:
    """``sqrt(sum((c_i - c_j)^2))`` for centroids ``[L, n, D]`` -> ``[L, n, n]`` in their dtype: no
    Gram-matrix shortcut (duplicates are exactly 0 apart), exactly symmetric."""
    lanes, n, dim = centroids.shape
    centroids = centroids.contiguous()
    dist = torch.empty(lanes, n, n, dtype=centroids.dtype, device=centroids.device)
    block = 64
    grid = (triton.cdiv(n, block), triton.cdiv(n, block), lanes)
    _distance_kernel[grid](centroids, dist, n, dim, centroids.stride(0), centroids.stride(1), dist.stride(0),
                           dist.stride(1), BLOCK_I=block, BLOCK_J=block, num_warps=4)
    return dist


@triton.jit
def _prim_kernel(Dist, EdgeLo, EdgeHi, EdgeLen, n, stride_lane, stride_row, BLOCK: tl.constexpr):
    lane = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    dist = Dist + lane * stride_lane
    edge = lane * (n - 1)
    # -- the tree starts as block 0: best[u] is the lightest edge from the tree to u, source[u] its tree end
    outside = (offs < n) & (offs != 0)
    best = tl.load(dist + offs, mask=outside, other=float("inf"))
    source = tl.zeros([BLOCK], tl.int32)
    for step in range(n - 1):
        # -- the lightest edge leaving the tree; among equal lengths the lowest (low, high) endpoint pair.
        # key = pair * 2 + (u is the high endpoint): one minimum gives the pair and which end is new
        length = tl.min(tl.where(outside, best, float("inf")), 0)
        low, high = tl.minimum(offs, source), tl.maximum(offs, source)
        key = tl.where(outside & (best == length), (low * BLOCK + high) * 2 + (offs == high), 2 * BLOCK * BLOCK)
        key = tl.min(key, 0)
        pair_low, pair_high = (key // 2) // BLOCK, (key // 2) % BLOCK
        new = tl.where(key % 2 == 1, pair_high, pair_low)
        tl.store(EdgeLo + edge + step, pair_low)
        tl.store(EdgeHi + edge + step, pair_high)
        tl.store(EdgeLen + edge + step, length)
        # -- the new block joins the tree; its edges may be the lightest way to blocks still outside
        outside = outside & (offs != new)
        row = tl.load(dist + new.to(tl.int64) * stride_row + offs, mask=outside, other=float("inf"))
        new_pair = tl.minimum(offs, new) * BLOCK + tl.maximum(offs, new)
        closer = outside & ((row < best) | ((row == best) & (new_pair < low * BLOCK + high)))
        best = tl.where(closer, row, best)
        source = tl.where(closer, new, source)


@triton.jit
def _elder_kernel(EdgeLo, EdgeHi, EdgeLen, Salience, n, BLOCK: tl.constexpr):
    lane = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    edge = lane * (n - 1)
    # -- every block starts as its own component (label = block index) of size 1
    label = offs.to(tl.int64)
    size = tl.full([BLOCK], 1, tl.int64)
    salience = tl.zeros([BLOCK], EdgeLen.dtype.element_ty)
    for e in range(n - 1):
        i = tl.load(EdgeLo + edge + e)
        j = tl.load(EdgeHi + edge + e)
        length = tl.load(EdgeLen + edge + e)
        # -- label and size of both endpoints' components in one reduction: 16 bits each, i low, j high
        record = label | (size << 16)
        packed = tl.sum(tl.where(offs == i, record, 0) + tl.where(offs == j, record << 32, 0), 0)
        label_i, size_i = packed & 0xFFFF, (packed >> 16) & 0xFFFF
        label_j, size_j = (packed >> 32) & 0xFFFF, (packed >> 48) & 0xFFFF
        # -- the smaller component (equal sizes: i's) takes the merge distance and joins the other
        i_moves = size_i <= size_j
        small = tl.where(i_moves, label_i, label_j)
        large = tl.where(i_moves, label_j, label_i)
        moved = label == small
        joined = moved | (label == large)
        salience = tl.where(moved, length, salience)
        label = tl.where(moved, large, label)
        size = tl.where(joined, size_i + size_j, size)
    tl.store(Salience + lane * n + offs, salience, mask=offs < n)


def _num_warps(block: int) -> int:
    # Prim: its two reductions per step cost less than the row load; 8 warps halved its time from 512
    # blocks up on the H200 (NOTES.md)
    return 4 if block <= 256 else 8


def salience_kernels(centroids: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
    """Elder-rule salience of centroids ``[L, n, D]`` (float32 or float64, on a CUDA device or, in Triton's
    interpreter, the CPU) -> ``[L, n]`` in the centroids' dtype and device; ``n <= MAX_BLOCKS``.

    Distances are ``sqrt(sum((c_i - c_j)^2))`` in the centroids' dtype (no Gram-matrix shortcut), so they are
    exactly symmetric; they differ from the CPU path's only in the rounding of the sum."""
    lanes, n, _ = centroids.shape
    if n == 1:  # a single block: #22's convention
        return torch.ones(lanes, 1, dtype=centroids.dtype, device=centroids.device)
    dist = distances(centroids)
    block = triton.next_power_of_2(n)
    warps = num_warps or _num_warps(block)
    low = torch.empty(lanes, n - 1, dtype=torch.int32, device=centroids.device)
    high = torch.empty_like(low)
    length = torch.empty(lanes, n - 1, dtype=centroids.dtype, device=centroids.device)
    _prim_kernel[(lanes,)](dist, low, high, length, n, dist.stride(0), dist.stride(1), BLOCK=block,
                           num_warps=warps)
    # merge order (length, i, j): sort by the pair, then stably by the length
    order = torch.argsort(low.long() * n + high, dim=-1, stable=True)
    order = order.gather(-1, torch.argsort(length.gather(-1, order), dim=-1, stable=True))
    low, high, length = (t.gather(-1, order).contiguous() for t in (low, high, length))
    salience = torch.empty(lanes, n, dtype=centroids.dtype, device=centroids.device)
    _elder_kernel[(lanes,)](low, high, length, salience, n, BLOCK=block, num_warps=num_warps or 4)
    return salience
