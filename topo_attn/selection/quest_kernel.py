"""Triton kernel for Quest's block scores over a whole sequence (prefill), per key/value head.

Quest's page bound (Tang et al. 2024): with ``lo`` and ``hi`` the element-wise minimum and maximum of a key
block, ``relu(q) . hi + min(q, 0) . lo`` bounds ``q . k`` from above for every key of the block. A query block
scores a key block by the largest bound over its queries and, when a group of query heads chooses together,
over the group's heads.

One program per (query block row, lane). It loads the row's queries of every head of the group once, stacked
into one ``[GROUP * BLOCK, D]`` operand (split into its positive and negative parts, in the queries' dtype;
float32 queries multiply in IEEE float32, not TF32), then walks the key blocks ``TILE`` at a time up to the row's
last candidate (``qb - window - 1``): per tile, the tile's bounds, two products on the tensor cores into one
accumulator, and the largest bound per key block over the stacked rows. So the ``[S, n]`` bounds of every query
never reach memory, each query is read once per row, and the tiles after the row's candidates are never read.
(The kernel before it ran one program per row and tile and read the row's queries again for every tile: at 128k,
2048 rows x 16 tiles on average.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch

TILE_N = 64
"""Key blocks per step of a program."""


@triton.jit
def _quest_kernel(Q, Lo, Hi, Out, seq_len, q_offset, first, nb, rows_per_lane, kv_heads, window,
                  stride_qb, stride_qh, stride_qs, stride_qd, head_dim,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
                  HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    row = tl.program_id(0)
    lane = tl.program_id(1)
    qb = first + row
    batch = lane // kv_heads
    kv_head = lane % kv_heads
    # -- the row's queries of the whole group, stacked: row g * BLOCK + i is head kv_head * GROUP + g at absolute
    #    position qb * BLOCK + i (its real rows: queries from q_offset on, before seq_len)
    stacked = tl.arange(0, GROUP_PAD * BLOCK)
    g = stacked // BLOCK
    pos = qb * BLOCK + stacked % BLOCK
    real = (pos >= q_offset) & (pos < seq_len) & (g < GROUP)
    d = tl.arange(0, HEAD_DIM)
    q_at = (batch.to(tl.int64) * stride_qb + (kv_head * GROUP + g)[:, None].to(tl.int64) * stride_qh
            + (pos - q_offset)[:, None].to(tl.int64) * stride_qs + d[None, :] * stride_qd)
    q = tl.load(Q + q_at, mask=real[:, None] & (d[None, :] < head_dim), other=0.0)
    # -- the products run in the queries' dtype (compiled Triton may return float32 from a bf16 maximum)
    positive = tl.maximum(q, 0.0).to(Q.dtype.element_ty)
    negative = tl.minimum(q, 0.0).to(Q.dtype.element_ty)
    out = Out + (lane * rows_per_lane + row).to(tl.int64) * nb
    # -- the tiles that hold a candidate of the row (candidates end at qb - window - 1)
    for start in range(0, qb - window, TILE):
        kb = start + tl.arange(0, TILE)
        bound_at = (lane * nb + kb)[:, None].to(tl.int64) * head_dim + d[None, :]
        bound_mask = (kb[:, None] < nb) & (d[None, :] < head_dim)
        lo = tl.load(Lo + bound_at, mask=bound_mask, other=0.0).to(Q.dtype.element_ty)  # exact: keys' extremes
        hi = tl.load(Hi + bound_at, mask=bound_mask, other=0.0).to(Q.dtype.element_ty)
        # -- every stacked query's bound on every key of each block, then the largest over the real rows
        bound = tl.dot(positive, tl.trans(hi), input_precision=PRECISION)
        bound = tl.dot(negative, tl.trans(lo), bound, input_precision=PRECISION)
        bound = tl.where(real[:, None], bound, float("-inf"))
        tl.store(out + kb, tl.max(bound, axis=0), mask=kb < nb)


def quest_block_scores(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, block_size: int, window: int,
                       q_offset: int = 0) -> torch.Tensor:
    """Quest's scores of every (query block row, key block) for the queries ``q`` at the end of the keys whose
    block bounds are ``lo``/``hi``, pooled over each key/value head's query heads. One launch, no host sync.

    Arguments:
        q: ``[B, H, L, D]`` (fp16, bf16 or fp32; any strides), the queries at absolute positions
            ``q_offset .. q_offset + L - 1``; on a CUDA device or (Triton's interpreter) the CPU.
        lo, hi: float32 ``[B, H_kv, n, D]``, contiguous, with ``H % H_kv == 0``.
        block_size: tokens per block, a power of two ``>= 16``; window: the rule's window (the tiles after
            each row's candidates are skipped).
        q_offset: the absolute position of the first query; the keys number ``q_offset + L``.

    Returns:
        float32 ``[B, H_kv, R, n]`` (rows: the query blocks the queries touch, from ``q_offset // block_size``):
        the largest bound of the row's queries and group on each key block; ``-inf`` in the tiles of key blocks
        after the row's candidates (not scored).
    """
    batch, heads, length, dim = q.shape
    kv_heads, nb = lo.shape[1], lo.shape[2]
    first = q_offset // block_size
    rows = nb - first
    out = torch.full((batch, kv_heads, rows, nb), float("-inf"), dtype=torch.float32, device=q.device)
    group = heads // kv_heads
    stacked = triton.next_power_of_2(group) * block_size  # rows of the stacked operand: 32 per warp, 4 to 16 warps
    launch(_quest_kernel, (rows, batch * kv_heads),
           (q, lo, hi, out, q_offset + length, q_offset, first, nb, rows, kv_heads, window, *q.stride(), dim),
           dict(GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK=block_size, TILE=TILE_N,
                HEAD_DIM=max(16, triton.next_power_of_2(dim)),
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=min(16, max(4, stacked // 32))))
    return out
