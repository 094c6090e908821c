"""Triton backward kernels for block-scheduled causal attention, and their launcher.

Two paths (:func:`backward_path` picks one):

- ``"deterministic"`` (the default; three launches, no atomics, gradients bit-for-bit reproducible): the
  preprocess ``attention_bwd_preprocess_kernel`` (``delta = rowsum(O * dO)`` per query, float32), then
  ``attention_bwd_dq_kernel``, one program per (query tile, query lane) walking the CSR row of its query block
  like the forward (off-diagonal blocks unmasked, the diagonal block last with the causal mask), recomputing
  ``P`` and accumulating ``dQ = dS K * scale``, and ``attention_bwd_dkdv_kernel`` without ``ATOMIC_DQ``: one
  program per (key tile, key/value lane) walking the column of its key block (``BlockSchedule.transpose()``:
  the query blocks that read it) for every query head of its GQA group, accumulating ``dV = P^T dO`` and
  ``dK = dS^T Q * scale`` in registers (seven products per pair in all).
- ``"atomic"`` (``deterministic=False``; two launches and a cast): the preprocess, then
  ``attention_bwd_dkdv_kernel`` with ``ATOMIC_DQ``, which besides dK and dV adds each query tile's share
  ``dS K * scale`` of dQ to a float32 buffer with atomic adds (five products per key/query tile pair, as
  FlashAttention-2). The order of the atomic adds varies from run to run, so dQ may differ in its last bits.
  Fewer products, but measured slower than the deterministic path with today's tiles (NOTES.md), so it is not
  the default.

``P = exp2(Q K^T * scale * log2(e) - lse * log2(e))`` and ``dS = P * (dP - delta)`` with ``dP = dO V^T``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch
from .forward import INTERPRETED, LOG2E, load_tile, mma_operand, store_tile

LOG2E_K: tl.constexpr = tl.constexpr(LOG2E)  # log2(e) inside the kernels: lse (natural log) to base 2


@triton.jit(do_not_specialize=["seq_len", "stride_lb", "stride_lh"])
def attention_bwd_preprocess_kernel(
    Out, dOut, Delta,
    seq_len, num_heads,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """Grid ``(cdiv(S, BLOCK_M), B * H)``: ``Delta [B, H, S]`` (float32) ``= rowsum(Out * dOut)`` for queries
    ``BLOCK_M * i ..`` of lane ``(b, h)``; ``Out``, ``dOut``: ``[B, H, S, HEAD_DIM]``, any strides."""
    # -- one tile of BLOCK_M queries of one (batch, head) lane
    lane = tl.program_id(1)
    batch = (lane // num_heads).to(tl.int64)
    head = (lane % num_heads).to(tl.int64)
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)

    # -- delta = rowsum(O * dO) in float32
    o = load_tile(Out, batch, head, start_m, seq_len, stride_ob, stride_oh, stride_om, stride_od,
                  BLOCK_M, HEAD_DIM, False, True)
    do = load_tile(dOut, batch, head, start_m, seq_len, stride_dob, stride_doh, stride_dom, stride_dod,
                   BLOCK_M, HEAD_DIM, False, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + batch * stride_lb + head * stride_lh + offs_m, delta, mask=offs_m < seq_len)


@triton.jit
def _attn_bwd_dq_step(
    dq, q, do, lse, delta, kt_ptrs, vt_ptrs, start_n, offs_m, offs_n, seq_len, qk_scale, stride_kn, stride_vn,
    DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Add the ``BLOCK_N`` keys from ``start_n`` to the query tile's unscaled float32 ``dq`` (query positions
    ``offs_m``; ``offs_n = arange(BLOCK_N)``): ``P`` from ``lse`` (base 2), ``dS = P * (dO V^T - delta)``,
    ``dq += dS K``. ``kt_ptrs``/``vt_ptrs``: ``[HEAD_DIM, BLOCK_N]`` pointers to K^T and V^T, at the lane's
    first key (off-diagonal; ``start_n`` is added here, in 64 bits) or already at ``start_n`` (``DIAGONAL``:
    masked loads and the causal mask)."""
    if DIAGONAL:  # keys past seq_len read as zeros; the causal mask below hides them
        cols = start_n + offs_n
        kt = mma_operand(tl.load(kt_ptrs, mask=cols[None, :] < seq_len, other=0.0), UPCAST)
        vt = mma_operand(tl.load(vt_ptrs, mask=cols[None, :] < seq_len, other=0.0), UPCAST)
    else:
        kt = mma_operand(tl.load(kt_ptrs + start_n * stride_kn), UPCAST)
        vt = mma_operand(tl.load(vt_ptrs + start_n * stride_vn), UPCAST)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
    if DIAGONAL:
        s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
    p = tl.math.exp2(s - lse[:, None])
    dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
    ds = mma_operand((p * (dp - delta[:, None])).to(kt_ptrs.dtype.element_ty), UPCAST)
    return tl.dot(ds, tl.trans(kt), dq, input_precision=DOT_PRECISION)


@triton.jit
def _attn_bwd_dq_inner(
    kt_ptrs, vt_ptrs, dq, q, do, lse, delta, Indices, first, end, start_m, offs_m, offs_n, seq_len, qk_scale,
    stride_kn, stride_vn,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
):
    """``dq`` of the query tile over a run of key tiles, one :func:`_attn_bwd_dq_step` each; the runs are the
    forward's (``_attn_fwd_inner``): ``DIAGONAL=False``: CSR entries ``first .. end``, pipelined
    ``NUM_STAGES`` deep; ``DIAGONAL=True``: the query block's own key block, a plain loop that advances the
    pointers. ``kt_ptrs`` and ``vt_ptrs`` point at keys ``0 .. BLOCK_N`` of the lane (``[HEAD_DIM, BLOCK_N]``,
    32-bit in-tile offsets; key offsets are added in 64 bits)."""
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    if DIAGONAL:
        diagonal_start = (start_m // BLOCK_SIZE) * BLOCK_SIZE
        kt_ptrs += diagonal_start.to(tl.int64) * stride_kn
        vt_ptrs += diagonal_start.to(tl.int64) * stride_vn
        for start_n in range(diagonal_start, start_m + BLOCK_M, BLOCK_N):
            dq = _attn_bwd_dq_step(dq, q, do, lse, delta, kt_ptrs, vt_ptrs, start_n, offs_m, offs_n, seq_len,
                                   qk_scale, stride_kn, stride_vn, True, DOT_PRECISION, UPCAST)
            kt_ptrs += BLOCK_N * stride_kn
            vt_ptrs += BLOCK_N * stride_vn
    else:
        for t in tl.range(first * SUBTILES, end * SUBTILES, num_stages=NUM_STAGES):
            k_block = tl.load(Indices + t // SUBTILES)
            start_n = (k_block * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N).to(tl.int64)
            dq = _attn_bwd_dq_step(dq, q, do, lse, delta, kt_ptrs, vt_ptrs, start_n, offs_m, offs_n, seq_len,
                                   qk_scale, stride_kn, stride_vn, False, DOT_PRECISION, UPCAST)
    return dq


@triton.jit(do_not_specialize=["seq_len", "q_len", "q_offset", "first_block", "lane_row_stride", "stride_lb",
                               "stride_lh"])
def attention_bwd_dq_kernel(
    Q, K, V, dOut, Lse, Delta, dQ, Offsets, Indices,
    sm_scale, qk_scale,  # softmax scale, and softmax scale * log2(e)
    seq_len, q_len, q_offset, first_block,  # keys, queries, the first query's position, its block
    num_heads, kv_group, lane_heads, lane_group, lane_row_stride,  # lane_row_stride: 0 for a shared schedule
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_lb, stride_lh,  # Lse and Delta: [B, H, S], the same strides
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
):
    """Grid ``(cdiv(S - tile0, BLOCK_M), B * H)``: ``dQ [B, H, L, D]`` (q's dtype) of the queries at absolute
    positions ``tile0 + BLOCK_M * i ..`` of lane ``(b, h)`` over the row schedule ``Offsets``/``Indices`` (the
    layout, ``tile0`` and the schedule lanes as in the forward kernel), from the forward's natural-log ``Lse``
    and the preprocess's ``Delta`` (float32 ``[B, H, L]``, same strides). ``BLOCK_M`` and ``BLOCK_N`` divide
    ``BLOCK_SIZE``."""
    # -- which queries, lane and schedule row this program owns (last query tiles, the longest rows, first)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    lane = tl.program_id(1)
    batch = (lane // num_heads).to(tl.int64)
    head = lane % num_heads
    row = (batch * lane_heads + head // lane_group) * lane_row_stride
    kv_head = (head // kv_group).to(tl.int64)
    head = head.to(tl.int64)
    start_m = (q_offset // BLOCK_M) * BLOCK_M + pid_m * BLOCK_M  # absolute position of the tile
    q_block = start_m // BLOCK_SIZE
    row = (row + q_block - first_block).to(tl.int32)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_q = offs_m - q_offset  # rows of Q, dO, Lse, Delta
    rows = (offs_q >= 0) & (offs_q < q_len)
    kt_ptrs = K + batch * stride_kb + kv_head * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    vt_ptrs = V + batch * stride_vb + kv_head * stride_vh + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd

    # -- load the query tile, its output gradient, log-sum-exp (base 2) and delta once
    q = load_tile(Q, batch, head, start_m - q_offset, q_len, stride_qb, stride_qh, stride_qm, stride_qd,
                  BLOCK_M, HEAD_DIM, False, True)
    q = mma_operand(q, UPCAST)
    do = load_tile(dOut, batch, head, start_m - q_offset, q_len, stride_dob, stride_doh, stride_dom, stride_dod,
                   BLOCK_M, HEAD_DIM, False, True)
    do = mma_operand(do, UPCAST)
    # positions that are not queries get lse = +inf, so their P is 0
    lse = tl.load(Lse + batch * stride_lb + head * stride_lh + offs_q, mask=rows, other=float("inf")) * LOG2E_K
    delta = tl.load(Delta + batch * stride_lb + head * stride_lh + offs_q, mask=rows, other=0.0)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

    # -- the row's entries; the diagonal block, if scheduled, is the last one
    first = tl.load(Offsets + row)
    last = tl.load(Offsets + row + 1)
    has_diagonal = tl.load(Indices + last - 1) == q_block
    end_full = last - has_diagonal.to(tl.int32)

    # -- off-diagonal blocks lie wholly before the queries: no mask
    dq = _attn_bwd_dq_inner(kt_ptrs, vt_ptrs, dq, q, do, lse, delta, Indices, first, end_full, start_m, offs_m,
                            offs_n, seq_len, qk_scale, stride_kn, stride_vn,
                            BLOCK_SIZE, BLOCK_M, BLOCK_N, False, DOT_PRECISION, NUM_STAGES, UPCAST)

    # -- the diagonal block: causal mask (which also hides keys past seq_len)
    if has_diagonal:
        dq = _attn_bwd_dq_inner(kt_ptrs, vt_ptrs, dq, q, do, lse, delta, Indices, first, end_full, start_m, offs_m,
                                offs_n, seq_len, qk_scale, stride_kn, stride_vn,
                                BLOCK_SIZE, BLOCK_M, BLOCK_N, True, DOT_PRECISION, NUM_STAGES, UPCAST)

    # -- dS was taken w.r.t. the scaled scores: one factor of the softmax scale; store
    store_tile(dQ, dq * sm_scale, batch, head, start_m - q_offset, q_len, stride_dqb, stride_dqh, stride_dqm,
               stride_dqd, BLOCK_M, HEAD_DIM, False)


@triton.jit
def _dkdv_query_tile(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m, offs_n, q_len, q_offset, qk_scale,
    sm_scale, stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, ATOMIC_DQ: tl.constexpr,
):
    """Add one tile of BLOCK_M queries (at absolute positions ``start_m ..``; row ``p - q_offset`` of Q) of
    one query head (``q_base``, ``do_base``, ``lse_base``, ``delta_base``, ``dq_base``: that lane's rows) to the
    key tile's dK and dV accumulators and, with ``ATOMIC_DQ``, the tile's share of dQ to the float32 rows at
    ``dq_base`` (atomic adds). Positions that are not queries (before ``q_offset``, past the partial last block)
    are masked; ``CAUSAL`` masks keys after the query."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_q = offs_m - q_offset
    offs_d = tl.arange(0, HEAD_DIM)
    rows = (offs_q >= 0) & (offs_q < q_len)
    q = tl.load(q_base + offs_q[:, None].to(tl.int64) * stride_qm + offs_d[None, :] * stride_qd,
                mask=rows[:, None], other=0.0)
    do = tl.load(do_base + offs_q[:, None].to(tl.int64) * stride_dom + offs_d[None, :] * stride_dod,
                 mask=rows[:, None], other=0.0)
    dtype = q.dtype
    q, do = mma_operand(q, UPCAST), mma_operand(do, UPCAST)
    lse = tl.load(lse_base + offs_q, mask=rows, other=float("inf")) * LOG2E_K  # +inf off the queries: P = 0
    delta = tl.load(delta_base + offs_q, mask=rows, other=0.0)
    # P^T (keys x queries), recomputed from the saved log-sum-exp
    st = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
    if CAUSAL:
        st = tl.where(offs_m[None, :] >= offs_n[:, None], st, float("-inf"))
    pt = tl.math.exp2(st - lse[None, :])
    # dV += P^T dO
    dv = tl.dot(mma_operand(pt.to(dtype), UPCAST), do, dv, input_precision=DOT_PRECISION)
    # dS^T = P^T * (dP^T - delta) with dP^T = V dO^T; dK += dS^T Q (the scale is applied once, at the end)
    dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    dst = mma_operand((pt * (dpt - delta[None, :])).to(dtype), UPCAST)
    dk = tl.dot(dst, q, dk, input_precision=DOT_PRECISION)
    # dQ += dS K * scale, shared with the other key tiles of these queries: atomic adds in float32
    if ATOMIC_DQ:
        dq = tl.dot(tl.trans(dst), k, input_precision=DOT_PRECISION) * sm_scale
        tl.atomic_add(dq_base + offs_q[:, None].to(tl.int64) * stride_dqm + offs_d[None, :] * stride_dqd, dq,
                      mask=rows[:, None], sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["seq_len", "q_len", "q_offset", "lane_row_stride", "stride_lb", "stride_lh"])
def attention_bwd_dkdv_kernel(
    Q, K, V, dOut, Lse, Delta, dK, dV, dQ, ColOffsets, ColIndices,  # the column (transposed) schedule
    sm_scale, qk_scale,  # softmax scale, and softmax scale * log2(e)
    seq_len, q_len, q_offset,  # keys, queries, the first query's position
    num_heads, kv_heads, kv_group, lane_heads, lane_group, lane_row_stride,  # lane_row_stride: 0 when shared
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,  # dQ: float32 [B, H, L, D], with ATOMIC_DQ
    stride_lb, stride_lh,  # Lse and Delta: [B, H, S], the same strides
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr, ATOMIC_DQ: tl.constexpr,
):
    """Grid ``(cdiv(S, BLOCK_N), B * H_kv)``: ``dK``, ``dV [B, H_kv, S, D]`` (k's dtype) of keys
    ``BLOCK_N * i ..`` of key/value lane ``(b, h_kv)``, summed over the ``kv_group`` query heads of the group
    in registers. ``ColOffsets``/``ColIndices``: the int32 column schedule (``BlockSchedule.transpose()``:
    sorted absolute query blocks, the diagonal first when present), shared or ``n`` columns per schedule lane
    ``b * lane_heads + h // lane_group``. Queries as in the forward kernel (row ``p - q_offset`` of Q for
    absolute position ``p``). Key blocks nobody reads get zeros. ``BLOCK_M`` and ``BLOCK_N`` divide
    ``BLOCK_SIZE``. With ``ATOMIC_DQ``, also adds ``dS K * sm_scale`` to ``dQ`` (float32, zeroed by the caller;
    atomic adds, so its rounding depends on the order the programs run in); without it ``dQ`` is not read."""
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_M
    # -- which keys and key/value lane this program owns (first key tiles, the longest columns, first)
    pid_n = tl.program_id(0)
    kv_lane = tl.program_id(1)
    batch = (kv_lane // kv_heads).to(tl.int64)
    kv_head = (kv_lane % kv_heads).to(tl.int64)
    start_n = pid_n * BLOCK_N
    k_block = start_n // BLOCK_SIZE
    offs_n = start_n + tl.arange(0, BLOCK_N)

    # -- load the key and value tiles once; dK and dV accumulate in float32 registers
    k = load_tile(K, batch, kv_head, start_n, seq_len, stride_kb, stride_kh, stride_kn, stride_kd,
                  BLOCK_N, HEAD_DIM, False, True)
    v = load_tile(V, batch, kv_head, start_n, seq_len, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK_N, HEAD_DIM, False, True)
    k, v = mma_operand(k, UPCAST), mma_operand(v, UPCAST)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)

    # -- every query head of the GQA group, each with its own column when the schedule is per lane
    for g in range(kv_group):
        head = kv_head * kv_group + g
        row = ((batch * lane_heads + head // lane_group) * lane_row_stride + k_block).to(tl.int32)
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = dOut + batch * stride_dob + head * stride_doh
        lse_base = Lse + batch * stride_lb + head * stride_lh
        delta_base = Delta + batch * stride_lb + head * stride_lh
        dq_base = dQ + batch * stride_dqb + head * stride_dqh

        # -- the column's entries (query blocks >= k_block, sorted); the diagonal block, if read, is the first
        first = tl.load(ColOffsets + row)
        last = tl.load(ColOffsets + row + 1)
        has_diagonal = tl.load(ColIndices + first, mask=first < last, other=-1) == k_block

        # -- the diagonal block: causal mask; only the query tiles at or after this key tile
        if has_diagonal:
            diagonal_end = tl.minimum(k_block * BLOCK_SIZE + BLOCK_SIZE, seq_len)
            for start_m in range(start_n - start_n % BLOCK_M, diagonal_end, BLOCK_M):
                dk, dv = _dkdv_query_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m,
                                          offs_n, q_len, q_offset, qk_scale, sm_scale, stride_qm, stride_qd,
                                          stride_dom, stride_dod, stride_dqm, stride_dqd,
                                          BLOCK_M, HEAD_DIM, True, DOT_PRECISION, UPCAST, ATOMIC_DQ)

        # -- off-diagonal query blocks lie wholly after the keys: no causal mask (rows past seq_len are)
        start_full = first + has_diagonal.to(tl.int32)
        for t in tl.range(start_full * SUBTILES, last * SUBTILES, num_stages=NUM_STAGES):
            q_block = tl.load(ColIndices + t // SUBTILES)
            start_m = q_block * BLOCK_SIZE + (t % SUBTILES) * BLOCK_M
            dk, dv = _dkdv_query_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m,
                                      offs_n, q_len, q_offset, qk_scale, sm_scale, stride_qm, stride_qd,
                                      stride_dom, stride_dod, stride_dqm, stride_dqd,
                                      BLOCK_M, HEAD_DIM, False, DOT_PRECISION, UPCAST, ATOMIC_DQ)

    # -- one factor of the softmax scale for dK; store (key blocks nobody reads get zeros)
    store_tile(dK, dk * sm_scale, batch, kv_head, start_n, seq_len, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
               BLOCK_N, HEAD_DIM, False)
    store_tile(dV, dv, batch, kv_head, start_n, seq_len, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
               BLOCK_N, HEAD_DIM, False)


def backward_tile_config(block_size: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Launch configurations of :func:`attention_bwd_dq_kernel` and :func:`attention_bwd_dkdv_kernel` (the
    tuned defaults; the sweep is in NOTES.md).

    Arguments:
        block_size: the schedule's block size (a power of two >= 16).
        head_dim: D.
        dtype: the inputs' dtype (float16, bfloat16 or float32).

    Returns ``dict(dq=..., dkdv=...)``, each with ``BLOCK_M``, ``BLOCK_N`` (both divide ``block_size``),
    ``num_warps`` and ``NUM_STAGES``. ``dq``: ``BLOCK_M`` queries per program, ``BLOCK_N`` keys per step.
    ``dkdv``: ``BLOCK_N`` keys per program, ``BLOCK_M`` queries per step; that program keeps four
    ``BLOCK_N x D`` tiles (K, V and two float32 accumulators) resident, so its key tile shrinks with the head
    dimension. Raises nothing."""
    if dtype == torch.float32:  # IEEE fp32 dots, twice the bytes per tile
        dq = (32, 32, 4, 2) if head_dim <= 128 else (32, 16, 4, 1)
        dkdv = (32, 32, 4, 2) if head_dim <= 128 else (16, 32, 8, 1)
    elif head_dim <= 64:
        dq, dkdv = (64, 64, 4, 3), (64, 64, 4, 3)
    elif head_dim <= 128 and block_size >= 128:
        dq, dkdv = (128, 64, 8, 3), (64, 128, 8, 3)
    elif head_dim <= 128:
        dq, dkdv = (64, 32, 4, 5), (32, 64, 4, 5)
    else:
        dq, dkdv = (32, 32, 4, 2), (32, 32, 8, 2)
    as_dict = lambda m, n, warps, stages: dict(BLOCK_M=min(block_size, m), BLOCK_N=min(block_size, n),  # noqa: E731
                                               num_warps=warps, NUM_STAGES=stages)
    return dict(dq=as_dict(*dq), dkdv=as_dict(*dkdv))


KERNEL_CHOICES = ("auto", "portable", "hopper")
"""The ``dq_kernel`` and ``dkdv_kernel`` choices of :func:`scheduled_attention_backward`."""


def backward_path(deterministic: bool = True) -> str:
    """Which backward :func:`scheduled_attention_backward` runs: ``"deterministic"`` (no atomics) when
    ``deterministic`` is True or while ``torch.use_deterministic_algorithms(True)`` is in force; else
    ``"atomic"`` (dQ accumulated with atomic adds; its last bits may vary between runs). The one place that
    chooses."""
    return "deterministic" if deterministic or torch.are_deterministic_algorithms_enabled() else "atomic"


def scheduled_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 out: torch.Tensor, lse: torch.Tensor, schedule, scale: float,
                                 needs: tuple[bool, bool, bool] = (True, True, True),
                                 config: dict | None = None,
                                 path: str = "deterministic",
                                 dkdv_kernel: str = "auto",
                                 dq_kernel: str = "auto") -> tuple[torch.Tensor | None, ...]:
    """Gradients of the forward, on inputs already validated by ``scheduled_attention`` (nothing is checked
    here). ``path`` (from :func:`backward_path`): ``"deterministic"``, delta, dQ over the row schedule and
    dK/dV over the column schedule, no atomics; or ``"atomic"``, delta then dK/dV over the column schedule with
    dQ added atomically (used when dQ and dK or dV are needed; otherwise the deterministic kernels run).

    Arguments:
        do: ``[B, H, L, D]``, the output gradient (any strides, also expanded ones).
        q: ``[B, H, L, D]``, float16 | bfloat16 | float32, any strides.
        k, v: ``[B, H_kv, S, D]``, q's dtype and device, ``H % H_kv == 0``, ``L <= S`` (queries at the end).
        out: ``[B, H, L, D]``, the forward's output.
        lse: ``[B, H, L]`` float32, the forward's natural-log log-sum-exp.
        schedule: the forward's row ``BlockSchedule`` (its column form is built here, once per call).
        scale: the softmax scale.
        needs: which of dq, dk, dv to compute; the others come back ``None``.
        config: overrides :func:`backward_tile_config` (same keys).
        dkdv_kernel: ``"auto"`` (the default) runs the Gluon warp-specialised dK/dV kernel
            (:mod:`topo_attn.attention.hopper_backward`) on the deterministic path where it applies
            (:func:`~topo_attn.attention.hopper_backward.hopper_backward_unsupported_reason`), else
            :func:`attention_bwd_dkdv_kernel`; ``"portable"`` always the latter; ``"hopper"`` the Gluon one or a
            ``ValueError`` saying why it cannot run, before any launch.
        dq_kernel: the same choice for dQ on the deterministic path, between the Gluon dQ kernel
            (:mod:`topo_attn.attention.hopper_dq`, under the same conditions; the default ``"auto"`` takes it) and
            :func:`attention_bwd_dq_kernel`.

    Returns ``(dq, dk, dv)`` in the inputs' shapes and dtype, contiguous (or ``None`` where not needed)."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, seq_len = k.shape[1], k.shape[2]
    q_offset = seq_len - q_len
    config = config or backward_tile_config(schedule.block_size, head_dim, q.dtype)
    common = dict(BLOCK_SIZE=schedule.block_size, HEAD_DIM=head_dim,
                  DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                  UPCAST=INTERPRETED and q.dtype == torch.bfloat16)
    shared = schedule.is_shared
    lane_heads, group = (0, 1) if shared else (schedule.lanes[1], heads // schedule.lanes[1])
    lse = lse.contiguous()
    atomic = path == "atomic" and needs[0] and (needs[1] or needs[2])
    for name, choice in (("dkdv_kernel", dkdv_kernel), ("dq_kernel", dq_kernel)):
        if choice not in KERNEL_CHOICES:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, KERNEL_CHOICES))}, got {choice!r}")
    column = schedule.transpose() if needs[1] or needs[2] else None  # dK and dV walk the column schedule
    # -- the Gluon kernels where they apply, decided here, before any launch
    gluon_dkdv = dkdv_kernel != "portable" and column is not None
    gluon_dq = dq_kernel != "portable" and needs[0]
    if gluon_dkdv or gluon_dq:
        from .hopper_backward import hopper_backward_unsupported_reason

        reason = "the atomic path asked for" if atomic else hopper_backward_unsupported_reason(q, k, v, schedule)
        if reason is not None:
            for name, choice, wanted in (("dkdv_kernel", dkdv_kernel, gluon_dkdv), ("dq_kernel", dq_kernel, gluon_dq)):
                if wanted and choice == "hopper":
                    raise ValueError(f"{name}='hopper' cannot run this call: {reason}")
            gluon_dkdv = gluon_dq = False

    # -- delta = rowsum(O * dO)
    delta = torch.empty_like(lse)
    pre_block = min(128, 8192 // head_dim)
    launch(attention_bwd_preprocess_kernel, (triton.cdiv(q_len, pre_block), batch * heads),
           (out, do, delta, q_len, heads, *out.stride(), *do.stride(), lse.stride(0), lse.stride(1)),
           dict(BLOCK_M=pre_block, HEAD_DIM=head_dim))

    # -- dQ over the row schedule (deterministic), or a zeroed float32 buffer the dK/dV kernel adds to (atomic)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic else None
    if gluon_dq:
        from .hopper_dq import hopper_dq

        dq = hopper_dq(q, k, v, do, lse, delta, schedule, scale)
    elif needs[0] and not atomic:
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        cfg = config["dq"]
        tile0 = q_offset // cfg["BLOCK_M"] * cfg["BLOCK_M"]
        launch(attention_bwd_dq_kernel, (triton.cdiv(seq_len - tile0, cfg["BLOCK_M"]), batch * heads), (
            q, k, v, do, lse, delta, dq, schedule.offsets, schedule.index_buffer,
            scale, scale * LOG2E, seq_len, q_len, q_offset, schedule.first_query_block,
            heads, heads // kv_heads, lane_heads, group, 0 if shared else schedule.rows_per_lane,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), lse.stride(0), lse.stride(1),
        ), dict(**common, **cfg))

    # -- dK and dV over the column schedule
    dk = dv = None
    if gluon_dkdv:
        from .hopper_backward import hopper_dkdv

        dk, dv = hopper_dkdv(q, k, v, do, lse, delta, column, scale)
    elif column is not None:
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        cfg = config["dkdv"]
        launch(attention_bwd_dkdv_kernel, (triton.cdiv(seq_len, cfg["BLOCK_N"]), batch * kv_heads), (
            q, k, v, do, lse, delta, dk, dv, dq if atomic else dk, column.offsets, column.index_buffer,
            scale, scale * LOG2E, seq_len, q_len, q_offset,
            heads, kv_heads, heads // kv_heads, lane_heads, group, 0 if shared else column.rows_per_lane,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
            *(dq.stride() if atomic else (0, 0, 0, 0)), lse.stride(0), lse.stride(1),
        ), dict(ATOMIC_DQ=atomic, **common, **cfg))
    if atomic:
        dq = dq.to(q.dtype)
    return dq, (dk if needs[1] else None), (dv if needs[2] else None)
