"""Hopper (sm_90) dK/dV kernel of the backward of block-scheduled causal attention, written in Gluon.

Same contract as the portable :func:`topo_attn.attention.backward.attention_bwd_dkdv_kernel` without atomics
(the deterministic path); the structure is the Gluon forward's (:mod:`topo_attn.attention.hopper`) with the
roles of queries and keys swapped:

* One program per (key tile of ``BLOCK_N`` keys, key/value lane ``(b, h_kv)``), the first key tiles (the
  longest columns) first. It walks the column schedule (``BlockSchedule.transpose()``: the query blocks that read
  its key block, the diagonal first) for every query head of the GQA group in turn, in query steps of
  ``BLOCK_M = 64`` rows (``BLOCK_SIZE // BLOCK_M`` per query block; the diagonal block from the key tile on).
* ``gl.warp_specialize`` splits the program into a **load partition** (one warp: the K and V tiles once, then
  the Q and dO tiles of every query step through TMA into a ``NUM_STAGES``-deep ring, with ready/empty mbarriers
  per stage and per operand) and the **consumers**: one warp group per 64 keys (``BLOCK_N`` 64: one; 128 with
  blocks of 128 or more: two, each with its own dK and dV, sharing each Q/dO stage and running unsynchronised,
  so one's exponentials overlap the other's matrix products, as in the forward).
* The consumer, per query step: ``S^T = K Q^T`` and ``dP^T = V dO^T`` as asynchronous ``warpgroup_mma``;
  ``P^T = exp2(S^T * scale * log2(e) - lse * log2(e))`` (queries before keys masked to 0: a no-op off the
  diagonal); ``dV += P^T dO``; ``dS^T = P^T (dP^T - delta)``; ``dK += dS^T Q``. P^T and dS^T go to their
  products from registers, in the input dtype, as the forward's P does. dK and dV stay in float32 registers.
* Epilogue: ``dK * scale`` and ``dV`` through shared memory (the K and V buffers) and TMA stores (keys past ``S``
  clipped). Key blocks nobody reads get zeros.

Queries past ``S`` read as zeros (TMA) with a log-sum-exp of ``+inf``, so their ``P`` is 0.

Supported: fp16/bf16, head dim 64 or 128, block size a power of two >= 64, shared or per-lane column schedules,
GQA, a whole sequence (``L == S``), TMA-addressable q, k, v, dO. :func:`hopper_backward_unsupported_reason` says why
a call falls outside. The Gluon API targeted is triton 3.6's; the module imports without it (or without a GPU),
and then every call is unsupported.
"""

from __future__ import annotations

import torch

from .hopper import GLUON_MISSING, hopper_unsupported_reason

if GLUON_MISSING is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    from .forward import LOG2E, tma_eligible
    from .hopper import shared_layout
    from ..launch import Tiles, launch

    _LOG2E: gl.constexpr = gl.constexpr(LOG2E)  # log2(e) inside the kernel: lse (natural log) to base 2

    @gluon.jit
    def _column(ColOffsets, ColIndices, batch, head, k_block, start_n, seq_len, lane_heads, lane_group,
                lane_row_stride, BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr):
        """The column of key block ``k_block`` for query head ``head``: its first entry, whether the diagonal
        block reads it, the diagonal block's query steps (from the key tile ``start_n`` to the block's end or the
        sequence's) and the steps in all."""
        row = (batch * lane_heads + head // lane_group) * lane_row_stride + k_block
        first = gl.load(ColOffsets + row)
        last = gl.load(ColOffsets + row + 1)
        has_diagonal = (first < last) & (gl.load(ColIndices + first, mask=first < last, other=-1) == k_block)
        diagonal_end = gl.minimum(k_block * BLOCK_SIZE + BLOCK_SIZE, seq_len)
        diagonal_steps = gl.where(has_diagonal, (diagonal_end - start_n + BLOCK_M - 1) // BLOCK_M, 0)
        n_steps = diagonal_steps + (last - first - has_diagonal.to(gl.int32)) * (BLOCK_SIZE // BLOCK_M)
        return first + has_diagonal.to(gl.int32), diagonal_steps, n_steps

    @gluon.jit
    def _step_start(ColIndices, off_diagonal, diagonal_steps, i, start_n,
                    BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr):
        """The first query position of query step ``i`` of a column (:func:`_column`)."""
        SUBTILES: gl.constexpr = BLOCK_SIZE // BLOCK_M
        if i < diagonal_steps:
            start_m = start_n + i * BLOCK_M
        else:
            j = i - diagonal_steps
            start_m = gl.load(ColIndices + off_diagonal + j // SUBTILES) * BLOCK_SIZE + (j % SUBTILES) * BLOCK_M
        return start_m

    @gluon.jit
    def _dkdv_load_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
                             kv_ready, q_ready, q_empty, do_ready, do_empty, ColOffsets, ColIndices,
                             batch, kv_head, k_block, start_n, seq_len, kv_group, lane_heads, lane_group,
                             lane_row_stride, BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr,
                             NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
        """One warp: TMA loads of the K and V tiles once (one piece per consumer), then of the Q and dO tiles of
        every query step of every query head of the group, each into ring stage ``t % NUM_STAGES`` once every
        consumer released it."""
        KEY_ROWS: gl.constexpr = k_desc.block_type.shape[2]
        for c in gl.static_range(CONSUMERS):
            mbarrier.expect(kv_ready.index(c), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [batch, kv_head, start_n + c * KEY_ROWS, 0], kv_ready.index(c),
                                            k_smem.index(c))
            tma.async_copy_global_to_shared(v_desc, [batch, kv_head, start_n + c * KEY_ROWS, 0], kv_ready.index(c),
                                            v_smem.index(c))
        t = 0
        for g in range(kv_group):
            head = kv_head * kv_group + g
            off_diagonal, diagonal_steps, n_steps = _column(ColOffsets, ColIndices, batch, head, k_block, start_n,
                                                            seq_len, lane_heads, lane_group, lane_row_stride,
                                                            BLOCK_SIZE, BLOCK_M)
            for i in range(n_steps):
                start_m = _step_start(ColIndices, off_diagonal, diagonal_steps, i, start_n, BLOCK_SIZE, BLOCK_M)
                stage = t % NUM_STAGES
                phase = (t // NUM_STAGES) & 1  # empty barriers start free: the first round waits on parity 1
                mbarrier.wait(q_empty.index(stage), phase ^ 1)
                mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [batch, head, start_m, 0], q_ready.index(stage),
                                                q_smem.index(stage))
                mbarrier.wait(do_empty.index(stage), phase ^ 1)
                mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(do_desc, [batch, head, start_m, 0], do_ready.index(stage),
                                                do_smem.index(stage))
                t += 1

    @gluon.jit
    def _step_rows(Lse, Delta, lane_offset, start_m, seq_len, col_layout: gl.constexpr, BLOCK_M: gl.constexpr):
        """A query step's positions, log-sum-exp (base 2) and delta; ``+inf`` past the queries, so that P = 0
        there."""
        queries = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
        inside = queries < seq_len
        lse = gl.load(Lse + lane_offset + queries, mask=inside, other=float("inf")) * _LOG2E
        delta = gl.load(Delta + lane_offset + queries, mask=inside, other=0.0)
        return queries, lse, delta

    @gluon.jit
    def score_products(a, b_smem, b_ready, c, d_smem, d_ready, stage, phase, layout: gl.constexpr,
                       ROWS: gl.constexpr, COLS: gl.constexpr, HEAD_DIM: gl.constexpr):
        """Wait for ring stage ``stage``'s tiles of ``b_smem`` and ``d_smem`` (``[COLS, HEAD_DIM]`` each) and issue
        ``a b^T`` and ``c d^T`` (``[ROWS, COLS]`` float32 in ``layout``), both asynchronous: the score pair of a
        backward step, ``S^T = K Q^T`` and ``dP^T = V dO^T`` for dK/dV, ``S = Q K^T`` and ``dP = dO V^T`` for dQ
        (:mod:`topo_attn.attention.hopper_dq`). Returns the two tiles and the two products in flight."""
        mbarrier.wait(b_ready.index(stage), phase)
        b_tile = b_smem.index(stage).reshape([COLS, HEAD_DIM])
        first = warpgroup_mma(a, b_tile.permute((1, 0)), gl.zeros([ROWS, COLS], gl.float32, layout),
                              use_acc=False, is_async=True)
        mbarrier.wait(d_ready.index(stage), phase)
        d_tile = d_smem.index(stage).reshape([COLS, HEAD_DIM])
        second = warpgroup_mma(c, d_tile.permute((1, 0)), gl.zeros([ROWS, COLS], gl.float32, layout),
                               use_acc=False, is_async=True)
        return b_tile, d_tile, first, second

    @gluon.jit
    def _pipelined_step(t, i, k, v, q_smem, do_smem, ds_op, dk, dv, keys, lse, delta, queries, qk_scale, q_ready,
                        q_empty, do_ready, do_empty, st_layout: gl.constexpr, a_layout: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                        NUM_STAGES: gl.constexpr):
        """Query step ``i`` of a head's column (ring position ``t``): ``S^T``, ``dP^T`` and the previous step's
        ``dK += dS^T Q`` in flight together; ``P^T`` while ``dP^T`` and that product run; ``dV += P^T dO``;
        ``dS^T``. Releases dO now and the previous step's Q (its ``dK`` product done). Returns this step's
        ``dS^T`` (its ``dK`` product is the next step's, or the head's drain) and ``dk``, ``dv``."""
        stage = t % NUM_STAGES
        previous = (t - 1) % NUM_STAGES
        phase = (t // NUM_STAGES) & 1
        q_tile, do_tile, st, dpt = score_products(k, q_smem, q_ready, v, do_smem, do_ready, stage, phase, st_layout,
                                                  BLOCK_N, BLOCK_M, HEAD_DIM)
        # the previous step's dK product; a head's first step has none: it adds dS^T = 0 times its own Q tile
        q_previous = q_smem.index(gl.where(i > 0, previous, stage)).reshape([BLOCK_M, HEAD_DIM])
        dk = warpgroup_mma(ds_op, q_previous, dk, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=2, deps=(st, ))
        pt = gl.exp2(st * qk_scale - lse[None, :])
        pt = gl.where(queries[None, :] >= keys[:, None], pt, 0.0)
        pt_op = gl.convert_layout(pt.to(k.dtype), a_layout)
        dv = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
        dpt = warpgroup_mma_wait(num_outstanding=2, deps=(dpt, ))
        ds_next = gl.convert_layout((pt * (dpt - delta[None, :])).to(k.dtype), a_layout)
        dk, dv, ds_op, pt_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, ds_op, pt_op))
        mbarrier.arrive(do_empty.index(stage), count=1)
        if i > 0:
            mbarrier.arrive(q_empty.index(previous), count=1)
        return ds_next, dk, dv

    @gluon.jit
    def _dkdv_consumer_partition(dk_desc, dv_desc, Lse, Delta, q_smem, do_smem, k_smem, v_smem,
                                 kv_ready, q_ready, q_empty, do_ready, do_empty, ColOffsets, ColIndices,
                                 batch, kv_head, k_block, start_n, seq_len, kv_group, lane_heads, lane_group,
                                 lane_row_stride, qk_scale, sm_scale, stride_lb, stride_lh,
                                 BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                 HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, num_warps: gl.constexpr,
                                 SUB_KEY: gl.constexpr, PIPELINE: gl.constexpr):
        """One warp group owning keys ``start_n + SUB_KEY .. + BLOCK_N`` of the program's key tile (``k_smem``,
        ``v_smem``, ``kv_ready``: its pieces): their dK and dV over every query step (see the module docstring),
        then the epilogue."""
        # -- layouts: wgmma accumulators of S^T, dP^T [N, M] and dK, dV [N, D]; P^T, dS^T as register A operands
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                             instr_shape=[16, HEAD_DIM, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
        key_layout: gl.constexpr = gl.SliceLayout(1, st_layout)
        dtype: gl.constexpr = dk_desc.dtype

        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        keys = start_n + SUB_KEY + gl.arange(0, BLOCK_N, layout=key_layout)
        mbarrier.wait(kv_ready, 0)
        k = k_smem.reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.reshape([BLOCK_N, HEAD_DIM])
        t = 0
        for g in range(kv_group):
            head = kv_head * kv_group + g
            off_diagonal, diagonal_steps, n_steps = _column(ColOffsets, ColIndices, batch, head, k_block, start_n,
                                                            seq_len, lane_heads, lane_group, lane_row_stride,
                                                            BLOCK_SIZE, BLOCK_M)
            lane_offset = batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
            if PIPELINE:  # the dK product of each step runs under the next step's exponentials
                ds_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, a_layout)
                for i in range(n_steps):
                    start_m = _step_start(ColIndices, off_diagonal, diagonal_steps, i, start_n, BLOCK_SIZE,
                                          BLOCK_M)
                    queries, lse, delta = _step_rows(Lse, Delta, lane_offset, start_m, seq_len, col_layout, BLOCK_M)
                    ds_op, dk, dv = _pipelined_step(t, i, k, v, q_smem, do_smem, ds_op, dk, dv, keys, lse, delta,
                                                    queries, qk_scale, q_ready, q_empty, do_ready, do_empty,
                                                    st_layout, a_layout, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES)
                    t += 1
                if n_steps > 0:  # the head's drain: its last step's dK product, then release that Q tile
                    last = (t - 1) % NUM_STAGES
                    dk = warpgroup_mma(ds_op, q_smem.index(last).reshape([BLOCK_M, HEAD_DIM]), dk, is_async=True)
                    dk, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ds_op))
                    mbarrier.arrive(q_empty.index(last), count=1)
            else:
                for i in range(n_steps):
                    start_m = _step_start(ColIndices, off_diagonal, diagonal_steps, i, start_n, BLOCK_SIZE, BLOCK_M)
                    stage = t % NUM_STAGES
                    phase = (t // NUM_STAGES) & 1
                    queries, lse, delta = _step_rows(Lse, Delta, lane_offset, start_m, seq_len, col_layout, BLOCK_M)
                    # -- S^T = K Q^T and dP^T = V dO^T, both asynchronous
                    q_tile, do_tile, st, dpt = score_products(k, q_smem, q_ready, v, do_smem, do_ready, stage, phase,
                                                              st_layout, BLOCK_N, BLOCK_M, HEAD_DIM)
                    # -- P^T, causal (queries at or after the key; a no-op off the diagonal); dV += P^T dO
                    st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
                    pt = gl.exp2(st * qk_scale - lse[None, :])
                    pt = gl.where(queries[None, :] >= keys[:, None], pt, 0.0)
                    pt_op = gl.convert_layout(pt.to(dtype), a_layout)
                    dv = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
                    # -- dS^T = P^T (dP^T - delta); dK += dS^T Q
                    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
                    ds_op = gl.convert_layout((pt * (dpt - delta[None, :])).to(dtype), a_layout)
                    dk = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
                    dv, dk, pt_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_op, ds_op))
                    mbarrier.arrive(q_empty.index(stage), count=1)
                    mbarrier.arrive(do_empty.index(stage), count=1)
                    t += 1

        # -- one factor of the softmax scale for dK; store both through the (now free) K and V buffers
        k.store((dk * sm_scale).to(dtype))
        v.store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [batch, kv_head, start_n + SUB_KEY, 0], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [batch, kv_head, start_n + SUB_KEY, 0], v_smem)
        tma.store_wait(pendings=0)

    @gluon.jit(do_not_specialize=["seq_len", "lane_row_stride", "stride_lb", "stride_lh"])
    def hopper_attention_bwd_dkdv_kernel(
        q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, ColOffsets, ColIndices,
        sm_scale, qk_scale,  # the softmax scale, and it times log2(e)
        seq_len, kv_heads, kv_group, lane_heads, lane_group, lane_row_stride,  # lane_row_stride: 0 when shared
        stride_lb, stride_lh,  # Lse and Delta: [B, H, S], the same strides
        BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
        NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PIPELINE: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """Grid ``(cdiv(S, BLOCK_N), B * H_kv)``: ``dK``, ``dV [B, H_kv, S, D]`` of keys ``BLOCK_N * i ..`` of
        key/value lane ``(b, h_kv)``, summed over the ``kv_group`` query heads of the group. ``q_desc``/``do_desc``:
        4-D TMA descriptors of ``[B, H, S, D]`` with block ``[1, 1, BLOCK_M, D]``; ``k_desc``, ``v_desc``,
        ``dk_desc``, ``dv_desc``: of ``[B, H_kv, S, D]`` with block ``[1, 1, BLOCK_N // CONSUMERS, D]``.
        ``CONSUMERS``: 1 (one consumer warp group, ``BLOCK_N = 64``) or 2 (two, each owning 64 keys of a 128-key
        tile and its own dK and dV, sharing each Q/dO stage and running unsynchronised; the second gets
        ``CONSUMER_REGS`` registers per thread). ``ColOffsets``/
        ``ColIndices``: the int32 column schedule (sorted absolute query blocks, the diagonal first when present),
        shared (``lane_row_stride = 0``) or ``lane_row_stride`` columns per lane ``b * lane_heads + h //
        lane_group``. A whole sequence (``L == S``); ``BLOCK_N // CONSUMERS == 16 * num_warps``; ``BLOCK_M`` and
        ``BLOCK_N`` divide ``BLOCK_SIZE``."""
        KEY_ROWS: gl.constexpr = BLOCK_N // CONSUMERS
        gl.static_assert(KEY_ROWS == 16 * num_warps, "one warp group per 64 keys")
        gl.static_assert(BLOCK_SIZE % BLOCK_N == 0, "a key tile lies in one key block")
        pid_n = gl.program_id(0)
        kv_lane = gl.program_id(1)
        batch = kv_lane // kv_heads
        kv_head = kv_lane % kv_heads
        start_n = pid_n * BLOCK_N
        k_block = start_n // BLOCK_SIZE

        # -- shared memory: the K and V tiles (reused for dK and dV), the Q and dO rings, their barriers
        dtype: gl.constexpr = q_desc.dtype
        k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + v_desc.block_type.shape, v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
        kv_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        do_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(kv_ready.index(c), count=1)
        for i in gl.static_range(NUM_STAGES):  # a stage is free once every consumer has released it
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=CONSUMERS)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(do_empty.index(i), count=CONSUMERS)

        # -- written out per branch: Gluon takes the partition list literally (as in the forward)
        if CONSUMERS == 1:
            gl.warp_specialize([
                (_dkdv_consumer_partition, (dk_desc, dv_desc, Lse, Delta, q_smem, do_smem, k_smem.index(0),
                                            v_smem.index(0), kv_ready.index(0), q_ready, q_empty, do_ready, do_empty,
                                            ColOffsets, ColIndices, batch, kv_head, k_block, start_n, seq_len, kv_group,
                                            lane_heads, lane_group, lane_row_stride, qk_scale, sm_scale, stride_lb,
                                            stride_lh, BLOCK_SIZE, BLOCK_M, KEY_ROWS, HEAD_DIM, NUM_STAGES, num_warps,
                                            0, PIPELINE)),
                (_dkdv_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready,
                                        q_ready, q_empty, do_ready, do_empty, ColOffsets, ColIndices, batch, kv_head,
                                        k_block, start_n, seq_len, kv_group, lane_heads, lane_group, lane_row_stride,
                                        BLOCK_SIZE, BLOCK_M, NUM_STAGES, CONSUMERS)),
            ], [1], [24])
        else:
            gl.warp_specialize([
                (_dkdv_consumer_partition, (dk_desc, dv_desc, Lse, Delta, q_smem, do_smem, k_smem.index(0),
                                            v_smem.index(0), kv_ready.index(0), q_ready, q_empty, do_ready, do_empty,
                                            ColOffsets, ColIndices, batch, kv_head, k_block, start_n, seq_len, kv_group,
                                            lane_heads, lane_group, lane_row_stride, qk_scale, sm_scale, stride_lb,
                                            stride_lh, BLOCK_SIZE, BLOCK_M, KEY_ROWS, HEAD_DIM, NUM_STAGES, num_warps,
                                            0, PIPELINE)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, Lse, Delta, q_smem, do_smem, k_smem.index(1),
                                            v_smem.index(1), kv_ready.index(1), q_ready, q_empty, do_ready, do_empty,
                                            ColOffsets, ColIndices, batch, kv_head, k_block, start_n, seq_len, kv_group,
                                            lane_heads, lane_group, lane_row_stride, qk_scale, sm_scale, stride_lb,
                                            stride_lh, BLOCK_SIZE, BLOCK_M, KEY_ROWS, HEAD_DIM, NUM_STAGES, num_warps,
                                            KEY_ROWS, PIPELINE)),
                (_dkdv_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready,
                                        q_ready, q_empty, do_ready, do_empty, ColOffsets, ColIndices, batch, kv_head,
                                        k_block, start_n, seq_len, kv_group, lane_heads, lane_group, lane_row_stride,
                                        BLOCK_SIZE, BLOCK_M, NUM_STAGES, CONSUMERS)),
            ], [num_warps, 1], [CONSUMER_REGS, 24])


def dkdv_tile_config(block_size: int, head_dim: int, consumers: int | None = None,
                     pipeline: bool | None = None) -> dict:
    """Launch configuration of :func:`hopper_attention_bwd_dkdv_kernel`: 64-query steps; ``CONSUMERS`` warp
    groups of 64 keys each (``num_warps`` 4 per group, the load warp on top), so ``BLOCK_N = 64 * CONSUMERS``
    keys per program; a ring of ``NUM_STAGES`` Q/dO stages; the per-thread register cap ``maxnreg`` at launch and
    ``CONSUMER_REGS``, the second consumer's registers; ``PIPELINE``: whether each step's ``dK`` product runs
    under the next step's exponentials (a Q tile then stays two steps in the ring, so the ring gets a stage more).
    ``consumers``: 1 or 2 (default: 2 at head dim 64 where a 128-key tile fits a block, ``block_size >= 128``,
    else 1: at head dim 128 the first consumer, capped at the launch's 168 registers, spills 272 bytes, where one
    consumer at 240 spills 36). ``pipeline``: default on for one consumer at head dim 64 only, where it measured
    5-8% faster (H100, ``data/benchmarks/dq_h100.json``); with two consumers it measured 4% slower and at head dim
    128 (spilling 108 bytes) 24% slower."""
    consumers = consumers or (2 if block_size >= 128 and head_dim <= 64 else 1)
    if pipeline is None:
        pipeline = consumers == 1 and head_dim <= 64
    if consumers == 2:
        return dict(BLOCK_M=64, BLOCK_N=128, NUM_STAGES=2 + pipeline, CONSUMERS=2, num_warps=4, maxnreg=168,
                    CONSUMER_REGS=240, PIPELINE=pipeline)
    return dict(BLOCK_M=64, BLOCK_N=64, NUM_STAGES=(3 if head_dim <= 64 else 2) + pipeline, CONSUMERS=1,
                num_warps=4, maxnreg=168 if head_dim <= 64 else 240, CONSUMER_REGS=0, PIPELINE=pipeline)


def hopper_backward_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule) -> str | None:
    """Why the Gluon backward kernels (:func:`hopper_dkdv`, :func:`~topo_attn.attention.hopper_dq.hopper_dq`)
    cannot take this call, or ``None`` when they can: the Gluon forward's conditions
    (:func:`~topo_attn.attention.hopper.hopper_unsupported_reason`: a Hopper GPU with triton 3.6, fp16/bf16, head
    dim 64 or 128, a block size a power of two >= 64, TMA-addressable q, k, v) plus a whole sequence
    (``L == S``). ``schedule``: the forward's row schedule. Never raises."""
    reason = hopper_unsupported_reason(q, k, v, schedule)
    if reason is not None:
        return reason
    return None if q.shape[2] == k.shape[2] else "not a whole sequence (L < S)"


def hopper_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, column, scale: float, config: dict | None = None) -> tuple[torch.Tensor, ...]:
    """dK and dV by :func:`hopper_attention_bwd_dkdv_kernel`, on inputs already validated by
    ``scheduled_attention`` and accepted by :func:`hopper_backward_unsupported_reason` (nothing is checked here).

    Arguments:
        q, do: ``[B, H, S, D]``; k, v: ``[B, H_kv, S, D]``; lse, delta: ``[B, H, S]`` float32 with the same
            strides (the forward's natural-log log-sum-exp, and ``rowsum(O * dO)``).
        column: the column schedule (``BlockSchedule.transpose()`` of the forward's row schedule).
        scale: the softmax scale.
        config: overrides :func:`dkdv_tile_config` (same keys; ``BLOCK_N`` must divide the block size).

    Returns ``(dk, dv)``, contiguous, in k's dtype. dO is copied to a contiguous tensor when TMA cannot address
    it (an expanded gradient, for one)."""
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    config = config or dkdv_tile_config(column.block_size, head_dim)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    key_rows = block_n // config["CONSUMERS"]
    if not tma_eligible(do):
        do = do.contiguous()
    dk, dv = torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)
    lane_heads, group = (0, 1) if column.lanes is None else (column.lanes[1], heads // column.lanes[1])
    q_layout, kv_layout = shared_layout(block_m, head_dim, q.dtype), shared_layout(key_rows, head_dim, q.dtype)
    launch(hopper_attention_bwd_dkdv_kernel, (-(-seq_len // block_n), batch * kv_heads), (
        Tiles(q, [1, 1, block_m, head_dim], q_layout), Tiles(k, [1, 1, key_rows, head_dim], kv_layout),
        Tiles(v, [1, 1, key_rows, head_dim], kv_layout), Tiles(do, [1, 1, block_m, head_dim], q_layout),
        Tiles(dk, [1, 1, key_rows, head_dim], kv_layout), Tiles(dv, [1, 1, key_rows, head_dim], kv_layout),
        lse, delta, column.offsets, column.index_buffer,
        scale, scale * LOG2E,
        seq_len, kv_heads, heads // kv_heads, lane_heads, group, 0 if column.lanes is None else column.rows_per_lane,
        lse.stride(0), lse.stride(1),
    ), dict(
        BLOCK_SIZE=column.block_size, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim,
        NUM_STAGES=config["NUM_STAGES"], CONSUMERS=config["CONSUMERS"], CONSUMER_REGS=config["CONSUMER_REGS"],
        PIPELINE=config["PIPELINE"], num_warps=config["num_warps"], maxnreg=config["maxnreg"],
    ))
    return dk, dv
