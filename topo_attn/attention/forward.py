"""Triton forward kernel for block-scheduled causal attention, and its launcher.

One program handles ``BLOCK_M`` queries of one (batch, head) lane. It walks the CSR row of its query block:
first every off-diagonal (full) key block with no masking, in one pipelined loop over ``BLOCK_N``-wide
sub-tiles, then, if the row holds it, the diagonal block with the causal mask. Both walks run the same
online-softmax step (:func:`_attn_fwd_inner`, base 2).

Tiles are read through TMA tensor descriptors (Hopper's bulk-copy engine; rows past the sequence read as
zeros) when the inputs allow it, else through pointers; ``USE_TMA`` picks the path at compile time. The tile
helpers :func:`load_tile`, :func:`store_tile` and :func:`mma_operand` are shared with the backward kernels.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

try:  # host-side tensor descriptors: triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: pointer loads only
    TensorDescriptor = None

from ..launch import INTERPRETED, Tiles, launch

LOG2E = 1.4426950408889634
"""log2(e): the kernels work in base 2 (``exp2``), so the softmax scale is multiplied by it."""


@triton.jit
def mma_operand(x, UPCAST: tl.constexpr):
    """``x`` as a ``tl.dot`` operand: a float32 copy of the same values when ``UPCAST``, else ``x`` itself.

    ``UPCAST`` is set for bfloat16 in Triton's interpreter, which multiplies the bit patterns of bfloat16
    operands (triton-lang/triton#11584); compiled kernels never set it."""
    if UPCAST:
        return x.to(tl.float32)
    return x


@triton.jit
def load_tile(X, batch, head, start, seq_len, stride_b, stride_h, stride_s, stride_d,
              BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr, MASKED: tl.constexpr):
    """Rows ``start .. start + BLOCK`` of lane ``(batch, head)`` of a ``[B, H, S, HEAD_DIM]`` tensor, as a
    ``[BLOCK, HEAD_DIM]`` tile in the tensor's dtype.

    ``X`` is a pointer (addressed with the four strides, 64-bit offsets) or, with ``USE_TMA``, a 4-D tensor
    descriptor with block ``[1, 1, BLOCK, HEAD_DIM]`` (strides unused; rows past the sequence read as zeros).
    On the pointer path ``MASKED`` reads rows ``< 0`` or ``>= seq_len`` as zeros; without it every row must
    exist."""
    if USE_TMA:
        return X.load([batch, head, start, 0]).reshape(BLOCK, HEAD_DIM)
    else:
        rows = start + tl.arange(0, BLOCK)
        ptrs = (X + batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_s
                + tl.arange(0, HEAD_DIM)[None, :] * stride_d)
        if MASKED:
            return tl.load(ptrs, mask=(rows[:, None] >= 0) & (rows[:, None] < seq_len), other=0.0)
        return tl.load(ptrs)


@triton.jit
def store_tile(X, tile, batch, head, start, seq_len, stride_b, stride_h, stride_s, stride_d,
               BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr):
    """Write the ``[BLOCK, HEAD_DIM]`` ``tile``, cast to ``X``'s dtype, to rows ``start .. start + BLOCK`` of
    lane ``(batch, head)`` of a ``[B, H, S, HEAD_DIM]`` tensor; rows ``< 0`` or ``>= seq_len`` are not written. ``X`` as
    in :func:`load_tile` (the descriptor clips the rows past the sequence)."""
    if USE_TMA:
        X.store([batch, head, start, 0], tile.to(X.dtype).reshape(1, 1, BLOCK, HEAD_DIM))
    else:
        rows = start + tl.arange(0, BLOCK)
        ptrs = (X + batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_s
                + tl.arange(0, HEAD_DIM)[None, :] * stride_d)
        tl.store(ptrs, tile.to(X.dtype.element_ty), mask=(rows[:, None] >= 0) & (rows[:, None] < seq_len))


@triton.jit
def _attn_fwd_step(
    m_i, l_i, acc, q, K, V, batch, kv_head, start_n, offs_m, offs_n, seq_len, qk_scale,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DIAGONAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One step of the online softmax: the ``BLOCK_N`` keys from ``start_n`` into the running max ``m_i``
    (base 2), normaliser ``l_i`` and float32 accumulator ``acc`` of the query tile ``q`` (query positions
    ``offs_m``, absolute; ``offs_n = arange(BLOCK_N)``; ``seq_len``: the key length). ``DIAGONAL``: masked
    loads and the causal mask; else every key precedes every query."""
    cols = start_n + offs_n
    k = load_tile(K, batch, kv_head, start_n, seq_len, stride_kb, stride_kh, stride_kn, stride_kd,
                  BLOCK_N, HEAD_DIM, USE_TMA, DIAGONAL)
    s = tl.dot(q, mma_operand(tl.trans(k), UPCAST), input_precision=DOT_PRECISION) * qk_scale
    if DIAGONAL:  # causal mask; it also hides the keys past seq_len
        s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = load_tile(V, batch, kv_head, start_n, seq_len, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK_N, HEAD_DIM, USE_TMA, DIAGONAL)
    p = mma_operand(p.to(v.dtype), UPCAST)
    acc = tl.dot(p, mma_operand(v, UPCAST), acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attn_fwd_inner(
    m_i, l_i, acc, q, K, V, Indices, first, end, batch, kv_head, start_m, offs_m, offs_n, seq_len, qk_scale,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """The online softmax of the query tile over a run of key tiles, one :func:`_attn_fwd_step` each.
    ``DIAGONAL=False``: the key blocks of CSR entries ``first .. end`` (wholly before the queries), in
    ``BLOCK_N``-wide sub-tiles, the block index read indirectly, pipelined ``NUM_STAGES`` deep.
    ``DIAGONAL=True``: the query block's own key block up to the tile's last query, a plain loop."""
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    if DIAGONAL:
        q_block = start_m // BLOCK_SIZE
        for start_n in range(q_block * BLOCK_SIZE, start_m + BLOCK_M, BLOCK_N):
            m_i, l_i, acc = _attn_fwd_step(m_i, l_i, acc, q, K, V, batch, kv_head, start_n, offs_m, offs_n,
                                           seq_len, qk_scale,
                                           stride_kb, stride_kh, stride_kn, stride_kd,
                                           stride_vb, stride_vh, stride_vn, stride_vd,
                                           BLOCK_N, HEAD_DIM, True, DOT_PRECISION, UPCAST, USE_TMA)
    else:
        for t in tl.range(first * SUBTILES, end * SUBTILES, num_stages=NUM_STAGES):
            start_n = tl.load(Indices + t // SUBTILES) * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N
            m_i, l_i, acc = _attn_fwd_step(m_i, l_i, acc, q, K, V, batch, kv_head, start_n, offs_m, offs_n,
                                           seq_len, qk_scale,
                                           stride_kb, stride_kh, stride_kn, stride_kd,
                                           stride_vb, stride_vh, stride_vn, stride_vd,
                                           BLOCK_N, HEAD_DIM, False, DOT_PRECISION, UPCAST, USE_TMA)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["seq_len", "q_len", "q_offset", "first_block", "lane_row_stride", "stride_lb",
                               "stride_lh"])
def attention_fwd_kernel(
    Q, K, V, Out, Lse, Offsets, Indices,
    qk_scale,  # softmax scale * log2(e)
    seq_len, q_len, q_offset, first_block,  # keys, queries, the first query's position, its block
    num_heads, kv_group, lane_heads, lane_group, lane_row_stride,  # lane_row_stride: 0 for a shared schedule
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    RETURN_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Grid ``(cdiv(S - tile0, BLOCK_M), B * H)`` with ``tile0 = q_offset // BLOCK_M * BLOCK_M``: ``Out
    [B, H, L, D]`` and, with ``RETURN_LSE``, the natural-log ``Lse [B, H, L]`` (float32) of the queries at
    absolute positions ``tile0 + BLOCK_M * i ..`` of lane ``(b, h)``, reading key/value head ``h // kv_group``.
    Query ``j`` of Q sits at absolute position ``q_offset + j`` (``L = q_len`` queries at the end of
    ``S = seq_len`` keys). ``Offsets``/``Indices``: int32 CSR rows (sorted, causal, the diagonal last when
    present) of the absolute query blocks ``first_block ..``: shared (``lane_row_stride = 0``) or
    ``lane_row_stride`` rows per schedule lane ``b * lane_heads + h // lane_group``. ``BLOCK_M`` and
    ``BLOCK_N`` divide ``BLOCK_SIZE``. Q, K, V, Out are descriptors with ``USE_TMA``, else pointers."""
    # -- which queries, lane and schedule row this program owns (last query tiles, the longest rows, first)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    lane = tl.program_id(1)
    batch = lane // num_heads
    head = lane % num_heads
    kv_head = head // kv_group
    start_m = (q_offset // BLOCK_M) * BLOCK_M + pid_m * BLOCK_M  # absolute position of the tile
    q_block = start_m // BLOCK_SIZE
    row = (batch * lane_heads + head // lane_group) * lane_row_stride + q_block - first_block

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)

    # -- load the query tile once (positions before q_offset read as zeros); max (base 2), normaliser, accumulator
    q = load_tile(Q, batch, head, start_m - q_offset, q_len, stride_qb, stride_qh, stride_qm, stride_qd,
                  BLOCK_M, HEAD_DIM, USE_TMA, True)
    q = mma_operand(q, UPCAST)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

    # -- the row's entries; the diagonal block, if scheduled, is the last one
    first = tl.load(Offsets + row)
    last = tl.load(Offsets + row + 1)
    has_diagonal = tl.load(Indices + last - 1) == q_block
    end_full = last - has_diagonal.to(tl.int32)

    # -- off-diagonal blocks lie wholly before the queries: no mask
    m_i, l_i, acc = _attn_fwd_inner(m_i, l_i, acc, q, K, V, Indices, first, end_full, batch, kv_head, start_m,
                                    offs_m, offs_n, seq_len, qk_scale,
                                    stride_kb, stride_kh, stride_kn, stride_kd,
                                    stride_vb, stride_vh, stride_vn, stride_vd,
                                    BLOCK_SIZE, BLOCK_M, BLOCK_N, HEAD_DIM, False, DOT_PRECISION, NUM_STAGES,
                                    UPCAST, USE_TMA)

    # -- the diagonal block: causal mask, and key bounds for a partial last block
    if has_diagonal:
        m_i, l_i, acc = _attn_fwd_inner(m_i, l_i, acc, q, K, V, Indices, first, end_full, batch, kv_head, start_m,
                                        offs_m, offs_n, seq_len, qk_scale,
                                        stride_kb, stride_kh, stride_kn, stride_kd,
                                        stride_vb, stride_vh, stride_vn, stride_vd,
                                        BLOCK_SIZE, BLOCK_M, BLOCK_N, HEAD_DIM, True, DOT_PRECISION, NUM_STAGES,
                                        UPCAST, USE_TMA)

    # -- normalise and store; the log-sum-exp in natural log for the backward and for merging
    acc = acc / l_i[:, None]
    store_tile(Out, acc, batch, head, start_m - q_offset, q_len, stride_ob, stride_oh, stride_om, stride_od,
               BLOCK_M, HEAD_DIM, USE_TMA)
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        offs_q = offs_m - q_offset
        tl.store(Lse + batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + offs_q, lse,
                 mask=(offs_q >= 0) & (offs_q < q_len))


def tile_config(block_size: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Launch configuration of :func:`attention_fwd_kernel` (the tuned defaults; numbers in NOTES.md).

    Arguments:
        block_size: the schedule's block size (a power of two >= 16).
        head_dim: D.
        dtype: the inputs' dtype (float16, bfloat16 or float32).

    Returns a dict with ``BLOCK_M`` and ``BLOCK_N`` (each divides ``block_size``), ``num_warps``,
    ``NUM_STAGES`` (pipeline depth of the off-diagonal loop) and ``TMA`` (read tiles through tensor
    descriptors where :func:`tma_eligible` allows). Raises nothing."""
    tma = False
    if dtype == torch.float32:  # fp32 operands: IEEE dots, twice the bytes per tile
        block_m, block_n, warps, stages = (64 if head_dim <= 64 else 32), 32, 4, 2
    elif head_dim == 128:  # TMA descriptors, measured faster here
        block_m, block_n, warps, stages, tma = (128, 128, 8, 2, True) if block_size >= 128 else (64, 64, 4, 2, True)
    elif block_size >= 128 and head_dim <= 128:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    else:
        block_m, block_n, warps, stages = 64, (64 if head_dim <= 128 else 32), 4, (4 if head_dim <= 128 else 2)
    return dict(BLOCK_M=min(block_size, block_m), BLOCK_N=min(block_size, block_n), num_warps=warps,
                NUM_STAGES=stages, TMA=tma)


@functools.lru_cache(maxsize=None)
def device_capability(device: torch.device) -> tuple[int, int]:
    """``torch.cuda.get_device_capability(device)`` for a CUDA device, read once per device (the launch path
    asks on every call)."""
    return torch.cuda.get_device_capability(device)


def tma_eligible(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can address all these ``[B, H, S, D]`` tensors.

    True when triton has host descriptors, the GPU is a Hopper or newer (or the interpreter runs), and every
    tensor's last dimension is contiguous with its base address and other strides multiples of 16 bytes.
    Raises nothing for CPU tensors; for CUDA tensors the device is queried."""
    if TensorDescriptor is None:
        return False
    if not INTERPRETED and device_capability(tensors[0].device)[0] < 9:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(st * size % 16 for st in t.stride()[:-1]):
            return False
    return True


def scheduled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule, scale: float,
                                return_lse: bool, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch :func:`attention_fwd_kernel` on inputs already validated by ``scheduled_attention`` (nothing is
    checked here).

    Arguments:
        q: ``[B, H, L, D]``, float16 | bfloat16 | float32, any strides, on CUDA (or the CPU in the interpreter).
        k, v: ``[B, H_kv, S, D]``, q's dtype and device, ``H % H_kv == 0``, ``L <= S``.
        schedule: the row :class:`~topo_attn.BlockSchedule` for ``seq_len = S`` and ``q_len = L``, shared or
            with lanes ``(B, H)`` or ``(B, H_kv)``, on q's device.
        scale: the softmax scale.
        return_lse: also return the log-sum-exp.
        config: overrides :func:`tile_config` (same keys; for tuning and tests).

    Returns ``(out, lse)``: ``out [B, H, L, D]`` in q's dtype (contiguous like ``torch.empty_like(q)``) and
    ``lse [B, H, L]`` float32 natural log, or ``None`` without ``return_lse``."""
    batch, heads, q_len, head_dim = q.shape
    seq_len = k.shape[2]
    block_size = schedule.block_size
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device) if return_lse else out
    config = dict(config or tile_config(block_size, head_dim, q.dtype))
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    q_offset = seq_len - q_len
    # TMA tiles of q and out must start inside the tensor: the first query tile must be aligned
    use_tma = bool(config.pop("TMA", False)) and q_offset % block_m == 0 and tma_eligible(q, k, v, out)
    tile0 = q_offset // block_m * block_m
    grid = (triton.cdiv(seq_len - tile0, block_m), batch * heads)
    tiles = (q, k, v, out)
    if use_tma:
        tiles = (Tiles(q, [1, 1, block_m, head_dim]), Tiles(k, [1, 1, block_n, head_dim]),
                 Tiles(v, [1, 1, block_n, head_dim]), Tiles(out, [1, 1, block_m, head_dim]))
    lane_heads, group = (0, 1) if schedule.lanes is None else (schedule.lanes[1], heads // schedule.lanes[1])
    launch(attention_fwd_kernel, grid, (
        *tiles, lse, schedule.offsets, schedule.index_buffer,
        scale * LOG2E,
        seq_len, q_len, q_offset, schedule.first_query_block,
        heads, heads // k.shape[1], lane_heads, group, 0 if schedule.lanes is None else schedule.rows_per_lane,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        lse.stride(0), lse.stride(1),
    ), dict(
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, RETURN_LSE=return_lse,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16, USE_TMA=use_tma,
        **config,
    ))
    return out, (lse if return_lse else None)
