"""Triton backward kernels for block-scheduled causal attention, and their launcher.

Three launches, no atomics (so gradients are bit-for-bit deterministic):

1. ``_attention_bwd_preprocess``: ``delta = rowsum(O * dO)`` per query, float32.
2. ``_scheduled_attention_bwd_dq``: one program per (query tile, query lane). It walks the CSR row of its
   query block like the forward (off-diagonal blocks unmasked, the diagonal block last with the causal mask),
   recomputes ``P`` from the saved log-sum-exp and accumulates ``dQ = dS K * scale``.
3. ``_scheduled_attention_bwd_dkdv``: one program per (key tile, key/value lane). It walks the *column* of
   its key block (``BlockSchedule.transpose()``: the query blocks that read it), for every query head of its
   GQA group, and accumulates ``dV = P^T dO`` and ``dK = dS^T Q * scale`` in registers.

``P = exp2(Q K^T * scale * log2(e) - lse * log2(e))`` and ``dS = P * (dP - delta)`` with ``dP = dO V^T``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .forward import INTERPRETED, LOG2E, _mma_operand

LOG2E_K: tl.constexpr = tl.constexpr(LOG2E)  # log2(e) inside the kernels: lse (natural log) to base 2


@triton.jit(do_not_specialize=["seq_len", "stride_lb", "stride_lh"])
def _attention_bwd_preprocess(
    Out, dOut, Delta,
    seq_len, num_heads,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    # -- one tile of BLOCK_M queries of one (batch, head) lane
    lane = tl.program_id(1)
    batch = (lane // num_heads).to(tl.int64)
    head = (lane % num_heads).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < seq_len

    # -- delta = rowsum(O * dO) in float32
    o = tl.load(Out + batch * stride_ob + head * stride_oh + offs_m[:, None].to(tl.int64) * stride_om
                + offs_d[None, :] * stride_od, mask=rows[:, None], other=0.0)
    do = tl.load(dOut + batch * stride_dob + head * stride_doh + offs_m[:, None].to(tl.int64) * stride_dom
                 + offs_d[None, :] * stride_dod, mask=rows[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + batch * stride_lb + head * stride_lh + offs_m, delta, mask=rows)


@triton.jit(do_not_specialize=["seq_len", "lane_row_stride", "stride_lb", "stride_lh"])
def _scheduled_attention_bwd_dq(
    Q, K, V, dOut, Lse, Delta, dQ, Offsets, Indices,
    sm_scale, qk_scale,  # softmax scale, and softmax scale * log2(e)
    seq_len, num_heads, kv_group, lane_row_stride,  # lane_row_stride: 0 for a shared schedule, else n
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_lb, stride_lh,  # Lse and Delta: [B, H, S], the same strides
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
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
    rows = offs_m < seq_len
    kt_ptrs = K + batch * stride_kb + kv_head * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    vt_ptrs = V + batch * stride_vb + kv_head * stride_vh + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd

    # -- load the query tile, its output gradient, log-sum-exp (base 2) and delta once
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None].to(tl.int64) * stride_qm
                + offs_d[None, :] * stride_qd, mask=rows[:, None], other=0.0)
    q = _mma_operand(q, UPCAST)
    do = tl.load(dOut + batch * stride_dob + head * stride_doh + offs_m[:, None].to(tl.int64) * stride_dom
                 + offs_d[None, :] * stride_dod, mask=rows[:, None], other=0.0)
    do = _mma_operand(do, UPCAST)
    # queries past seq_len get lse = +inf, so their P is 0
    lse = tl.load(Lse + batch * stride_lb + head * stride_lh + offs_m, mask=rows, other=float("inf")) * LOG2E_K
    delta = tl.load(Delta + batch * stride_lb + head * stride_lh + offs_m, mask=rows, other=0.0)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

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
        vt = _mma_operand(tl.load(vt_ptrs + start_n * stride_vn), UPCAST)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
        ds = _mma_operand((p * (dp - delta[:, None])).to(Q.dtype.element_ty), UPCAST)
        dq = tl.dot(ds, tl.trans(kt), dq, input_precision=DOT_PRECISION)

    # -- the diagonal block: causal mask (which also hides keys past seq_len)
    if has_diagonal:
        diagonal_start = q_block * BLOCK_SIZE
        kt_ptrs += diagonal_start.to(tl.int64) * stride_kn
        vt_ptrs += diagonal_start.to(tl.int64) * stride_vn
        for start_n in range(diagonal_start, start_m + BLOCK_M, BLOCK_N):
            cols = start_n + offs_n
            kt = _mma_operand(tl.load(kt_ptrs, mask=cols[None, :] < seq_len, other=0.0), UPCAST)
            vt = _mma_operand(tl.load(vt_ptrs, mask=cols[None, :] < seq_len, other=0.0), UPCAST)
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
            p = tl.math.exp2(s - lse[:, None])
            dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
            ds = _mma_operand((p * (dp - delta[:, None])).to(Q.dtype.element_ty), UPCAST)
            dq = tl.dot(ds, tl.trans(kt), dq, input_precision=DOT_PRECISION)
            kt_ptrs += BLOCK_N * stride_kn
            vt_ptrs += BLOCK_N * stride_vn

    # -- dS was taken w.r.t. the scaled scores: one factor of the softmax scale; store
    dq_ptrs = dQ + batch * stride_dqb + head * stride_dqh + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :] * stride_dqd
    tl.store(dq_ptrs, (dq * sm_scale).to(dQ.dtype.element_ty), mask=rows[:, None])


@triton.jit
def _dkdv_query_tile(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n, seq_len, qk_scale,
    stride_qm, stride_qd, stride_dom, stride_dod,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Add one tile of BLOCK_M queries (starting at ``start_m``) of one query head to the key tile's dK and
    dV accumulators. Queries past ``seq_len`` (the partial last block) are masked; ``CAUSAL`` masks keys
    after the query."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < seq_len
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :] * stride_qd,
                mask=rows[:, None], other=0.0)
    do = tl.load(do_base + offs_m[:, None].to(tl.int64) * stride_dom + offs_d[None, :] * stride_dod,
                 mask=rows[:, None], other=0.0)
    dtype = q.dtype
    q, do = _mma_operand(q, UPCAST), _mma_operand(do, UPCAST)
    lse = tl.load(lse_base + offs_m, mask=rows, other=float("inf")) * LOG2E_K  # +inf past seq_len: P = 0
    delta = tl.load(delta_base + offs_m, mask=rows, other=0.0)
    # P^T (keys x queries), recomputed from the saved log-sum-exp
    st = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
    if CAUSAL:
        st = tl.where(offs_m[None, :] >= offs_n[:, None], st, float("-inf"))
    pt = tl.math.exp2(st - lse[None, :])
    # dV += P^T dO
    dv = tl.dot(_mma_operand(pt.to(dtype), UPCAST), do, dv, input_precision=DOT_PRECISION)
    # dS^T = P^T * (dP^T - delta) with dP^T = V dO^T; dK += dS^T Q (the scale is applied once, at the end)
    dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    dst = _mma_operand((pt * (dpt - delta[None, :])).to(dtype), UPCAST)
    dk = tl.dot(dst, q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["seq_len", "lane_row_stride", "stride_lb", "stride_lh"])
def _scheduled_attention_bwd_dkdv(
    Q, K, V, dOut, Lse, Delta, dK, dV, ColOffsets, ColIndices,  # the column (transposed) schedule
    sm_scale, qk_scale,  # softmax scale, and softmax scale * log2(e)
    seq_len, num_heads, kv_heads, kv_group, lane_row_stride,  # lane_row_stride: 0 for a shared schedule, else n
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_lb, stride_lh,  # Lse and Delta: [B, H, S], the same strides
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr,
):
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_M
    # -- which keys and key/value lane this program owns (first key tiles, the longest columns, first)
    pid_n = tl.program_id(0)
    kv_lane = tl.program_id(1)
    batch = (kv_lane // kv_heads).to(tl.int64)
    kv_head = (kv_lane % kv_heads).to(tl.int64)
    start_n = pid_n * BLOCK_N
    k_block = start_n // BLOCK_SIZE

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n < seq_len

    # -- load the key and value tiles once; dK and dV accumulate in float32 registers
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None].to(tl.int64) * stride_kn
                + offs_d[None, :] * stride_kd, mask=keys[:, None], other=0.0)
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None].to(tl.int64) * stride_vn
                + offs_d[None, :] * stride_vd, mask=keys[:, None], other=0.0)
    k, v = _mma_operand(k, UPCAST), _mma_operand(v, UPCAST)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)

    # -- every query head of the GQA group, each with its own column when the schedule is per lane
    for g in range(kv_group):
        head = kv_head * kv_group + g
        row = ((batch * num_heads + head) * lane_row_stride + k_block).to(tl.int32)
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = dOut + batch * stride_dob + head * stride_doh
        lse_base = Lse + batch * stride_lb + head * stride_lh
        delta_base = Delta + batch * stride_lb + head * stride_lh

        # -- the column's entries (query blocks >= k_block, sorted); the diagonal block, if read, is the first
        first = tl.load(ColOffsets + row)
        last = tl.load(ColOffsets + row + 1)
        has_diagonal = tl.load(ColIndices + first, mask=first < last, other=-1) == k_block

        # -- the diagonal block: causal mask; only the query tiles at or after this key tile
        if has_diagonal:
            diagonal_end = tl.minimum(k_block * BLOCK_SIZE + BLOCK_SIZE, seq_len)
            for start_m in range(start_n - start_n % BLOCK_M, diagonal_end, BLOCK_M):
                dk, dv = _dkdv_query_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n,
                                          seq_len, qk_scale, stride_qm, stride_qd, stride_dom, stride_dod,
                                          BLOCK_M, HEAD_DIM, True, DOT_PRECISION, UPCAST)

        # -- off-diagonal query blocks lie wholly after the keys: no causal mask (rows past seq_len are)
        start_full = first + has_diagonal.to(tl.int32)
        for t in tl.range(start_full * SUBTILES, last * SUBTILES, num_stages=NUM_STAGES):
            q_block = tl.load(ColIndices + t // SUBTILES)
            start_m = q_block * BLOCK_SIZE + (t % SUBTILES) * BLOCK_M
            dk, dv = _dkdv_query_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n,
                                      seq_len, qk_scale, stride_qm, stride_qd, stride_dom, stride_dod,
                                      BLOCK_M, HEAD_DIM, False, DOT_PRECISION, UPCAST)

    # -- one factor of the softmax scale for dK; store (key blocks nobody reads get zeros)
    dk_ptrs = dK + batch * stride_dkb + kv_head * stride_dkh + offs_n[:, None].to(tl.int64) * stride_dkn + offs_d[None, :] * stride_dkd
    dv_ptrs = dV + batch * stride_dvb + kv_head * stride_dvh + offs_n[:, None].to(tl.int64) * stride_dvn + offs_d[None, :] * stride_dvd
    tl.store(dk_ptrs, (dk * sm_scale).to(dK.dtype.element_ty), mask=keys[:, None])
    tl.store(dv_ptrs, dv.to(dV.dtype.element_ty), mask=keys[:, None])


def backward_tile_config(block_size: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Tiles, warps and pipeline depth of the two gradient kernels; tiles divide the schedule's block size.

    ``dq``: ``BLOCK_M`` queries per program, ``BLOCK_N`` keys per step. ``dkdv``: ``BLOCK_N`` keys per
    program, ``BLOCK_M`` queries per step. The dK/dV program keeps four ``BLOCK_N x D`` tiles (K, V and two
    float32 accumulators) resident, so its key tile shrinks with the head dimension. Head dim 65-128 in
    fp16/bf16: the fastest of a sweep on the H200 (``kernels/NOTES.md``, backward); the others are conservative
    choices that fit Hopper's 228 KB of shared memory per SM."""
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


def scheduled_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 out: torch.Tensor, lse: torch.Tensor, schedule, scale: float,
                                 needs: tuple[bool, bool, bool] = (True, True, True),
                                 config: dict | None = None) -> tuple[torch.Tensor | None, ...]:
    """Gradients of the forward on validated inputs. q, out, do: ``[B, H, S, D]``; k, v: ``[B, H_kv, S, D]``
    (any strides); lse: the forward's float32 ``[B, H, S]`` (natural log); schedule: the row
    ``BlockSchedule`` of the forward (its column form is built here, once per call). ``needs`` says which of
    dq, dk, dv to compute (the others come back ``None``). ``config`` overrides :func:`backward_tile_config`.
    Returns ``dq, dk, dv`` in the inputs' dtypes, contiguous."""
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    config = config or backward_tile_config(schedule.block_size, head_dim, q.dtype)
    common = dict(BLOCK_SIZE=schedule.block_size, HEAD_DIM=head_dim,
                  DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                  UPCAST=INTERPRETED and q.dtype == torch.bfloat16)
    lane_row_stride = 0 if schedule.is_shared else schedule.num_blocks
    lse = lse.contiguous()

    # -- delta = rowsum(O * dO)
    delta = torch.empty_like(lse)
    pre_block = min(128, 8192 // head_dim)
    _attention_bwd_preprocess[(triton.cdiv(seq_len, pre_block), batch * heads)](
        out, do, delta, seq_len, heads, *out.stride(), *do.stride(), lse.stride(0), lse.stride(1),
        BLOCK_M=pre_block, HEAD_DIM=head_dim,
    )

    # -- dQ over the row schedule
    dq = None
    if needs[0]:
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        cfg = config["dq"]
        _scheduled_attention_bwd_dq[(triton.cdiv(seq_len, cfg["BLOCK_M"]), batch * heads)](
            q, k, v, do, lse, delta, dq, schedule.offsets, schedule.indices,
            scale, scale * LOG2E, seq_len, heads, heads // kv_heads, lane_row_stride,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), lse.stride(0), lse.stride(1),
            **common, **cfg,
        )

    # -- dK and dV over the column schedule
    dk = dv = None
    if needs[1] or needs[2]:
        column = schedule.transpose()
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        cfg = config["dkdv"]
        _scheduled_attention_bwd_dkdv[(triton.cdiv(seq_len, cfg["BLOCK_N"]), batch * kv_heads)](
            q, k, v, do, lse, delta, dk, dv, column.offsets, column.indices,
            scale, scale * LOG2E, seq_len, heads, kv_heads, heads // kv_heads, lane_row_stride,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
            lse.stride(0), lse.stride(1),
            **common, **cfg,
        )
    return dq, (dk if needs[1] else None), (dv if needs[2] else None)
