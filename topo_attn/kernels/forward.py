"""Triton forward kernel for block-scheduled causal attention, and its launcher.

One program handles ``BLOCK_M`` queries of one (batch, head) lane. It walks the CSR row of its query block:
first every off-diagonal (full) key block with no masking, in one pipelined loop over ``BLOCK_N``-wide
sub-tiles, then, if the row holds it, the diagonal block with the causal mask. Online softmax in base 2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

LOG2E = 1.4426950408889634


@triton.jit
def _mma_operand(x, UPCAST: tl.constexpr):
    # Triton's interpreter multiplies the bit patterns of bfloat16 operands in tl.dot
    # (triton-lang/triton#11584); on the CPU we hand it float32 copies of the same values.
    if UPCAST:
        return x.to(tl.float32)
    return x


@triton.jit(do_not_specialize=["seq_len", "lane_row_stride"])
def _scheduled_attention_fwd(
    Q, K, V, Out, Lse, Offsets, Indices,
    qk_scale,  # softmax scale * log2(e)
    seq_len, num_heads, kv_group, lane_row_stride,  # lane_row_stride: 0 for a shared schedule, else n
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    RETURN_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
):
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    # -- which queries, lane and schedule row this program owns (last query tiles, the longest rows, first)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    lane = tl.program_id(1)
    batch = (lane // num_heads).to(tl.int64)
    head = lane % num_heads
    kv_head = (head // kv_group).to(tl.int64)
    head = head.to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_block = start_m // BLOCK_SIZE
    row = lane * lane_row_stride + q_block

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :] * stride_qd
    kt_ptrs = K + batch * stride_kb + kv_head * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    # -- load the query tile once; running max (base 2), normaliser and accumulator
    q = _mma_operand(tl.load(q_ptrs, mask=offs_m[:, None] < seq_len, other=0.0), UPCAST)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

    # -- the row's entries; the diagonal block, if scheduled, is the last one
    first = tl.load(Offsets + row)
    last = tl.load(Offsets + row + 1)
    has_diagonal = tl.load(Indices + last - 1) == q_block
    end_full = last - has_diagonal.to(tl.int32)

    # -- off-diagonal blocks lie wholly before the queries: no mask
    for t in tl.range(first * SUBTILES, end_full * SUBTILES, num_stages=NUM_STAGES):
        k_block = tl.load(Indices + t // SUBTILES)
        start_n = (k_block * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N).to(tl.int64)
        kt = _mma_operand(tl.load(kt_ptrs + start_n * stride_kn), UPCAST)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start_n * stride_vn)
        p = _mma_operand(p.to(V.dtype.element_ty), UPCAST)
        acc = tl.dot(p, _mma_operand(v, UPCAST), acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    # -- the diagonal block: causal mask, and key bounds for a partial last block
    if has_diagonal:
        diagonal_start = q_block * BLOCK_SIZE
        kt_ptrs += diagonal_start.to(tl.int64) * stride_kn
        v_ptrs += diagonal_start.to(tl.int64) * stride_vn
        for start_n in range(diagonal_start, start_m + BLOCK_M, BLOCK_N):
            cols = start_n + offs_n
            kt = _mma_operand(tl.load(kt_ptrs, mask=cols[None, :] < seq_len, other=0.0), UPCAST)
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptrs, mask=cols[:, None] < seq_len, other=0.0)
            p = _mma_operand(p.to(V.dtype.element_ty), UPCAST)
            acc = tl.dot(p, _mma_operand(v, UPCAST), acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new
            kt_ptrs += BLOCK_N * stride_kn
            v_ptrs += BLOCK_N * stride_vn

    # -- normalise and store; the log-sum-exp in natural log for the backward and for merging
    acc = acc / l_i[:, None]
    o_ptrs = Out + batch * stride_ob + head * stride_oh + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < seq_len)
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(Lse + batch * stride_lb + head * stride_lh + offs_m, lse, mask=offs_m < seq_len)


INTERPRETED: bool = isinstance(_scheduled_attention_fwd, InterpretedFunction)
"""True when ``TRITON_INTERPRET=1`` was set before triton was imported: the kernel then runs on the CPU."""


def tile_config(block_size: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Tile sizes, warps and pipeline depth for a launch; tiles divide the schedule's block size. Chosen by
    ``python -m topo_attn.kernels.tune`` on an H200 (see NOTES.md)."""
    if dtype == torch.float32:  # fp32 operands: IEEE dots, twice the bytes per tile
        block_m, block_n, warps, stages = (64 if head_dim <= 64 else 32), 32, 4, 2
    elif block_size >= 128 and head_dim <= 128:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    else:
        block_m, block_n, warps, stages = 64, (64 if head_dim <= 128 else 32), 4, (4 if head_dim <= 128 else 2)
    return dict(BLOCK_M=min(block_size, block_m), BLOCK_N=min(block_size, block_n), num_warps=warps,
                NUM_STAGES=stages)


def scheduled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                                indices: torch.Tensor, block_size: int, shared: bool, scale: float,
                                return_lse: bool, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch on validated inputs. q: ``[B, H, S, D]``; k, v: ``[B, H_kv, S, D]`` (any strides);
    offsets/indices: int32 CSR on q's device. ``config`` overrides :func:`tile_config` (for tuning).
    Returns ``out [B, H, S, D]`` (q's dtype) and, if asked, ``lse [B, H, S]`` float32."""
    batch, heads, seq_len, head_dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device) if return_lse else out
    config = config or tile_config(block_size, head_dim, q.dtype)
    nb = -(-seq_len // block_size)
    grid = (triton.cdiv(seq_len, config["BLOCK_M"]), batch * heads)
    _scheduled_attention_fwd[grid](
        q, k, v, out, lse, offsets, indices,
        scale * LOG2E,
        seq_len, heads, heads // k.shape[1], 0 if shared else nb,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        lse.stride(0), lse.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, RETURN_LSE=return_lse,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16,
        **config,
    )
    return out, (lse if return_lse else None)
