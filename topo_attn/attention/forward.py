"""Triton forward kernel for block-scheduled causal attention, and its launcher.

One program handles ``BLOCK_M`` queries of one (batch, head) lane. It walks the CSR row of its query block:
first every off-diagonal (full) key block with no masking, in one pipelined loop over ``BLOCK_N``-wide
sub-tiles, then, if the row holds it, the diagonal block with the causal mask. Online softmax in base 2.

Tiles are read through TMA tensor descriptors (Hopper's bulk-copy engine; rows past the sequence read as
zeros) when the inputs allow it, else through pointers; ``USE_TMA`` picks the path at compile time.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

try:  # host-side tensor descriptors: triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: pointer loads only
    TensorDescriptor = None

LOG2E = 1.4426950408889634


@triton.jit
def _mma_operand(x, UPCAST: tl.constexpr):
    # Triton's interpreter multiplies the bit patterns of bfloat16 operands in tl.dot
    # (triton-lang/triton#11584); on the CPU we hand it float32 copies of the same values.
    if UPCAST:
        return x.to(tl.float32)
    return x


@triton.jit
def _load_tile(X, batch, head, start, seq_len, stride_b, stride_h, stride_s, stride_d,
               BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr, MASKED: tl.constexpr):
    # rows start..start+BLOCK of one (batch, head) as [BLOCK, HEAD_DIM]; rows past seq_len read as zeros
    if USE_TMA:
        return X.load([batch, head, start, 0]).reshape(BLOCK, HEAD_DIM)
    else:
        rows = start + tl.arange(0, BLOCK)
        ptrs = (X + batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_s
                + tl.arange(0, HEAD_DIM)[None, :] * stride_d)
        if MASKED:
            return tl.load(ptrs, mask=rows[:, None] < seq_len, other=0.0)
        return tl.load(ptrs)


@triton.jit(do_not_specialize=["seq_len", "lane_row_stride", "stride_lb", "stride_lh"])
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
    USE_TMA: tl.constexpr,
):
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    # -- which queries, lane and schedule row this program owns (last query tiles, the longest rows, first)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    lane = tl.program_id(1)
    batch = lane // num_heads
    head = lane % num_heads
    kv_head = head // kv_group
    start_m = pid_m * BLOCK_M
    q_block = start_m // BLOCK_SIZE
    row = lane * lane_row_stride + q_block

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)

    # -- load the query tile once; running max (base 2), normaliser and accumulator
    q = _load_tile(Q, batch, head, start_m, seq_len, stride_qb, stride_qh, stride_qm, stride_qd,
                   BLOCK_M, HEAD_DIM, USE_TMA, True)
    q = _mma_operand(q, UPCAST)
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
        start_n = k_block * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N
        k = _load_tile(K, batch, kv_head, start_n, seq_len, stride_kb, stride_kh, stride_kn, stride_kd,
                       BLOCK_N, HEAD_DIM, USE_TMA, False)
        s = tl.dot(q, _mma_operand(tl.trans(k), UPCAST), input_precision=DOT_PRECISION) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_tile(V, batch, kv_head, start_n, seq_len, stride_vb, stride_vh, stride_vn, stride_vd,
                       BLOCK_N, HEAD_DIM, USE_TMA, False)
        p = _mma_operand(p.to(v.dtype), UPCAST)
        acc = tl.dot(p, _mma_operand(v, UPCAST), acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    # -- the diagonal block: causal mask, and key bounds for a partial last block
    if has_diagonal:
        for start_n in range(q_block * BLOCK_SIZE, start_m + BLOCK_M, BLOCK_N):
            cols = start_n + offs_n
            k = _load_tile(K, batch, kv_head, start_n, seq_len, stride_kb, stride_kh, stride_kn, stride_kd,
                           BLOCK_N, HEAD_DIM, USE_TMA, True)
            s = tl.dot(q, _mma_operand(tl.trans(k), UPCAST), input_precision=DOT_PRECISION) * qk_scale
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = _load_tile(V, batch, kv_head, start_n, seq_len, stride_vb, stride_vh, stride_vn, stride_vd,
                           BLOCK_N, HEAD_DIM, USE_TMA, True)
            p = _mma_operand(p.to(v.dtype), UPCAST)
            acc = tl.dot(p, _mma_operand(v, UPCAST), acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new

    # -- normalise and store; the log-sum-exp in natural log for the backward and for merging
    acc = acc / l_i[:, None]
    if USE_TMA:  # the descriptor clips rows past the sequence
        Out.store([batch, head, start_m, 0], acc.to(Out.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_ptrs = (Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + offs_m[:, None].to(tl.int64) * stride_om
                  + tl.arange(0, HEAD_DIM)[None, :] * stride_od)
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < seq_len)
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(Lse + batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + offs_m, lse, mask=offs_m < seq_len)


INTERPRETED: bool = isinstance(_scheduled_attention_fwd, InterpretedFunction)
"""True when ``TRITON_INTERPRET=1`` was set before triton was imported: the kernel then runs on the CPU."""


def tile_config(block_size: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Tile sizes, warps, pipeline depth and whether to read tiles through TMA descriptors (``TMA``, used only
    where :func:`tma_eligible` allows); tiles divide the schedule's block size. Chosen by
    ``python -m topo_attn.attention.tune`` on an H200 (see NOTES.md)."""
    tma = False
    if dtype == torch.float32:  # fp32 operands: IEEE dots, twice the bytes per tile
        block_m, block_n, warps, stages = (64 if head_dim <= 64 else 32), 32, 4, 2
    elif head_dim == 128:  # TMA pays here (NOTES.md, v2)
        block_m, block_n, warps, stages, tma = (128, 128, 8, 2, True) if block_size >= 128 else (64, 64, 4, 2, True)
    elif block_size >= 128 and head_dim <= 128:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    else:
        block_m, block_n, warps, stages = 64, (64 if head_dim <= 128 else 32), 4, (4 if head_dim <= 128 else 2)
    return dict(BLOCK_M=min(block_size, block_m), BLOCK_N=min(block_size, block_n), num_warps=warps,
                NUM_STAGES=stages, TMA=tma)


def tma_eligible(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can address these ``[B, H, S, D]`` tensors: triton has host descriptors, the
    GPU is a Hopper or newer (or the interpreter runs), the last dimension is contiguous and the base and the
    other strides are multiples of 16 bytes."""
    if TensorDescriptor is None:
        return False
    if not INTERPRETED and torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(st * size % 16 for st in t.stride()[:-1]):
            return False
    return True


def _descriptor(t: torch.Tensor, block_rows: int) -> "TensorDescriptor":
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_rows, t.shape[-1]])


def scheduled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                                indices: torch.Tensor, block_size: int, shared: bool, scale: float,
                                return_lse: bool, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch on validated inputs. q: ``[B, H, S, D]``; k, v: ``[B, H_kv, S, D]`` (any strides);
    offsets/indices: int32 CSR on q's device. ``config`` overrides :func:`tile_config` (for tuning and tests).
    Returns ``out [B, H, S, D]`` (q's dtype) and, if asked, ``lse [B, H, S]`` float32."""
    batch, heads, seq_len, head_dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_len), dtype=torch.float32, device=q.device) if return_lse else out
    config = dict(config or tile_config(block_size, head_dim, q.dtype))
    use_tma = bool(config.pop("TMA", False)) and tma_eligible(q, k, v, out)
    nb = -(-seq_len // block_size)
    grid = (triton.cdiv(seq_len, config["BLOCK_M"]), batch * heads)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    tiles = ((_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), _descriptor(out, block_m))
             if use_tma else (q, k, v, out))
    _scheduled_attention_fwd[grid](
        *tiles, lse, offsets, indices,
        scale * LOG2E,
        seq_len, heads, heads // k.shape[1], 0 if shared else nb,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        lse.stride(0), lse.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, RETURN_LSE=return_lse,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16, USE_TMA=use_tma,
        **config,
    )
    return out, (lse if return_lse else None)
