"""Hopper (sm_90) dQ kernel of the backward of block-scheduled causal attention, written in Gluon.

Same contract as the portable :func:`topo_attn.attention.backward.attention_bwd_dq_kernel` for a whole
sequence; the structure is the Gluon forward's (:mod:`topo_attn.attention.hopper`), with three products per key
step in place of two:

* One program per (query tile of ``BLOCK_M = min(block_size, 128)`` rows, lane ``(b, h)``), the last tiles
  (the longest rows) first, walking the forward's row schedule in key steps of ``BLOCK_N = 64`` keys.
* ``gl.warp_specialize`` splits it into a **load partition** (one warp: the dO tile once, then the forward's
  :func:`~topo_attn.attention.hopper.row_load_partition`: the Q tile once and the K and V tiles of every key step
  through TMA into a ``NUM_STAGES``-deep ring) and the **consumers**: one warp group per 64 query rows (two for
  128-row tiles, each with its own piece of Q, dO and dQ, running unsynchronised as in the forward).
* Each consumer keeps its rows' log-sum-exp and ``delta`` in registers for the whole row. Key step ``j`` issues
  ``S_j = Q K_j^T``, ``dP_j = dO V_j^T`` and ``dQ += dS_{j-1} K_{j-1}`` as asynchronous ``warpgroup_mma``, then
  computes ``P_j = exp2(S_j * scale * log2(e) - lse * log2(e))`` while the other two run, and
  ``dS_j = P_j (dP_j - delta)`` once ``dP_j`` is in. dS goes to its product from registers, in the input dtype.
  V_j is released after ``dP_j``, K_j only after ``dQ += dS_j K_j`` in the next step, so K stays two steps in the
  ring (three stages keep the loads ahead).
* Steps of the diagonal block from the tile on are masked (``query >= key``: it also hides keys past the
  sequence, whose rows TMA reads as zeros); queries past the sequence read as zeros with a log-sum-exp of
  ``+inf``, so their ``P`` is 0.
* Epilogue: ``dQ * scale`` through shared memory (the Q piece, free once the last ``S`` is in) and a TMA store
  (rows past ``S`` clipped).

Supported where :func:`~topo_attn.attention.hopper_backward.hopper_backward_unsupported_reason` says so (the
Gluon dK/dV kernel's conditions: the forward's, and a whole sequence). The Gluon API targeted is triton 3.6's;
the module imports without it (or without a GPU), and then every call is unsupported.
"""

from __future__ import annotations

import torch

from .hopper import GLUON_MISSING

if GLUON_MISSING is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    from .forward import LOG2E, tma_eligible
    from .hopper import row_load_partition, shared_layout
    from .hopper_backward import score_products
    from ..launch import Tiles, launch

    _LOG2E: gl.constexpr = gl.constexpr(LOG2E)  # log2(e) inside the kernel: lse (natural log) to base 2

    @gluon.jit
    def _dq_load_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, do_ready,
                           k_ready, k_empty, v_ready, v_empty, Indices, first, n_steps, batch, head, kv_head, q_row,
                           BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                           CONSUMERS: gl.constexpr):
        """One warp: the dO tile once (one piece per consumer), then the forward's loads (the Q tile once, the
        K and V tiles of the row's key steps through the ring)."""
        ROWS: gl.constexpr = do_desc.block_type.shape[2]
        for c in gl.static_range(CONSUMERS):
            mbarrier.expect(do_ready.index(c), do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [batch, head, q_row + c * ROWS, 0], do_ready.index(c),
                                            do_smem.index(c))
        row_load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, k_empty, v_ready,
                           v_empty, Indices, first, n_steps, batch, head, kv_head, q_row, BLOCK_SIZE, BLOCK_N,
                           NUM_STAGES, CONSUMERS)

    @gluon.jit
    def _key_start(Indices, first, plain_blocks, q_block, j, BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
        """The first key of key step ``j`` of a row whose first ``plain_blocks`` entries (from ``first``) lie
        before its diagonal block ``q_block``."""
        SUBTILES: gl.constexpr = BLOCK_SIZE // BLOCK_N
        if j < plain_blocks * SUBTILES:
            start_n = gl.load(Indices + first + j // SUBTILES) * BLOCK_SIZE + (j % SUBTILES) * BLOCK_N
        else:
            start_n = q_block * BLOCK_SIZE + (j - plain_blocks * SUBTILES) * BLOCK_N
        return start_n

    @gluon.jit
    def _gradient_of_scores(s, dp, lse, delta, queries, start_n, qk_scale, MASKED: gl.constexpr,
                            ds_layout: gl.constexpr, DTYPE: gl.constexpr):
        """``dS = P (dP - delta)`` with ``P = exp2(S * qk_scale - lse)`` (``lse`` base 2), as the A operand of the
        dQ product. ``MASKED``: keys from ``start_n`` after a query get ``P = 0``."""
        p = gl.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            keys = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
            p = gl.where(queries[:, None] >= keys[None, :], p, 0.0)
        return gl.convert_layout((p * (dp - delta[:, None])).to(DTYPE), ds_layout)

    @gluon.jit
    def _dq_step(j, q, do, ds, dq, lse, delta, queries, start_n, qk_scale, k_smem, v_smem, k_ready, k_empty,
                 v_ready, v_empty, s_layout: gl.constexpr, ds_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, MASKED: gl.constexpr):
        """Key step ``j >= 1``: ``S_j = Q K_j^T``, ``dP_j = dO V_j^T`` and ``dQ += dS_{j-1} K_{j-1}`` on the
        tensor cores while ``P_j`` is computed; returns ``dS_j`` and ``dQ``."""
        stage = j % NUM_STAGES
        previous = (j - 1) % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        # -- issue S_j, dP_j and the previous step's dQ product, all asynchronous
        _, _, s, dp = score_products(q, k_smem, k_ready, do, v_smem, v_ready, stage, phase, s_layout, BLOCK_M,
                                     BLOCK_N, HEAD_DIM)
        dq = warpgroup_mma(ds, k_smem.index(previous).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
        # -- S_j in: its probabilities while dP_j and the dQ product run; dP_j in: release V_j, form dS_j
        s = warpgroup_mma_wait(num_outstanding=2, deps=(s, ))
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp, ))
        mbarrier.arrive(v_empty.index(stage), count=1)
        ds_next = _gradient_of_scores(s, dp, lse, delta, queries, start_n, qk_scale, MASKED, ds_layout, q.dtype)
        # -- the dQ product done: release K_{j-1}
        dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
        mbarrier.arrive(k_empty.index(previous), count=1)
        return ds_next, dq

    @gluon.jit
    def _dq_consumer_partition(dq_desc, Lse, Delta, Indices, q_smem, do_smem, k_smem, v_smem, q_ready, do_ready,
                               k_ready, k_empty, v_ready, v_empty, first, plain_blocks, n_steps, masked_steps,
                               q_block, qk_scale, sm_scale, seq_len, batch, head, q_row, stride_lb, stride_lh,
                               BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, num_warps: gl.constexpr,
                               SUB_ROW: gl.constexpr):
        """One warp group owning rows ``q_row + SUB_ROW .. + BLOCK_M`` of the query tile (``q_smem``,
        ``do_smem``: its pieces of Q and dO): their dQ over the row's ``n_steps`` key steps (the last
        ``masked_steps`` causally masked), then the epilogue."""
        # -- layouts: wgmma accumulators of S, dP [M, N] and dQ [M, D]; dS as the register A operand of dS K
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        # -- the rows' log-sum-exp (base 2) and delta, once; +inf past the sequence, so that P = 0 there
        queries = q_row + SUB_ROW + gl.arange(0, BLOCK_M, layout=row_layout)
        inside = queries < seq_len
        lane_offset = batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
        lse = gl.load(Lse + lane_offset + queries, mask=inside, other=float("inf")) * _LOG2E
        delta = gl.load(Delta + lane_offset + queries, mask=inside, other=0.0)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
        mbarrier.wait(q_ready, 0)
        q = q_smem.reshape([BLOCK_M, HEAD_DIM])
        mbarrier.wait(do_ready, 0)
        do = do_smem.reshape([BLOCK_M, HEAD_DIM])

        # -- step 0: S_0 and dP_0 alone (masked: a no-op unless it is a diagonal step)
        _, _, s, dp = score_products(q, k_smem, k_ready, do, v_smem, v_ready, 0, 0, s_layout, BLOCK_M, BLOCK_N,
                                     HEAD_DIM)
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
        mbarrier.arrive(v_empty.index(0), count=1)
        start_n = _key_start(Indices, first, plain_blocks, q_block, 0, BLOCK_SIZE, BLOCK_N)
        ds = _gradient_of_scores(s, dp, lse, delta, queries, start_n, qk_scale, True, ds_layout, q.dtype)

        # -- steps before the diagonal block's masked ones: no mask
        n_plain = n_steps - masked_steps
        for j in range(1, n_plain):
            ds, dq = _dq_step(j, q, do, ds, dq, lse, delta, queries, 0, qk_scale, k_smem, v_smem, k_ready, k_empty,
                              v_ready, v_empty, s_layout, ds_layout, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, False)
        # -- the diagonal block's steps from the tile on: causal mask
        for j in range(gl.maximum(n_plain, 1), n_steps):
            start_n = _key_start(Indices, first, plain_blocks, q_block, j, BLOCK_SIZE, BLOCK_N)
            ds, dq = _dq_step(j, q, do, ds, dq, lse, delta, queries, start_n, qk_scale, k_smem, v_smem, k_ready,
                              k_empty, v_ready, v_empty, s_layout, ds_layout, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                              True)

        # -- drain: dQ += dS_last K_last
        last = (n_steps - 1) % NUM_STAGES
        dq = warpgroup_mma(ds, k_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
        dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
        mbarrier.arrive(k_empty.index(last), count=1)

        # -- one factor of the softmax scale; store through the (now free) Q piece and TMA (rows past S clipped)
        q.store((dq * sm_scale).to(q.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [batch, head, q_row + SUB_ROW, 0], q_smem)
        tma.store_wait(pendings=0)

    @gluon.jit(do_not_specialize=["seq_len", "lane_row_stride", "stride_lb", "stride_lh"])
    def hopper_attention_bwd_dq_kernel(
        q_desc, k_desc, v_desc, do_desc, dq_desc, Lse, Delta, Offsets, Indices,
        sm_scale, qk_scale,  # the softmax scale, and it times log2(e)
        seq_len, num_heads, kv_group, lane_heads, lane_group, lane_row_stride,  # lane_row_stride: 0 when shared
        stride_lb, stride_lh,  # Lse and Delta: [B, H, S], the same strides
        BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
        NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):
        """Grid ``(cdiv(S, BLOCK_M), B * H)``: ``dQ [B, H, S, D]`` of query rows ``BLOCK_M * i ..`` of lane
        ``(b, h)``, reading key/value head ``h // kv_group``, from the forward's natural-log ``Lse`` and the
        preprocess's ``Delta``. ``q_desc``, ``do_desc``, ``dq_desc``: 4-D TMA descriptors of ``[B, H, S, D]`` with
        block ``[1, 1, BLOCK_M // CONSUMERS, D]``; ``k_desc``/``v_desc``: of ``[B, H_kv, S, D]`` with block
        ``[1, 1, BLOCK_N, D]``. ``Offsets``/``Indices``: the forward's int32 row schedule (sorted, causal, the
        diagonal last when present), shared (``lane_row_stride = 0``) or ``lane_row_stride`` rows per lane
        ``b * lane_heads + h // lane_group``. ``CONSUMERS``: 1 or 2 warp groups of 64 rows (``BLOCK_M = 64 *
        CONSUMERS``; the second gets ``CONSUMER_REGS`` registers per thread). ``BLOCK_M`` and ``BLOCK_N`` divide
        ``BLOCK_SIZE``; a whole sequence (``L == S``)."""
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        gl.static_assert(ROWS == 16 * num_warps, "one warp group per 64 query rows")
        gl.static_assert(BLOCK_SIZE % BLOCK_M == 0, "a query tile lies in one query block")
        gl.static_assert(BLOCK_M % BLOCK_N == 0, "the diagonal's masked steps cover the tile")
        # -- which queries, lane and schedule row this program owns (last query tiles, the longest rows, first)
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
        lane = gl.program_id(1)
        batch = lane // num_heads
        head = lane % num_heads
        kv_head = head // kv_group
        q_row = pid_m * BLOCK_M
        q_block = q_row // BLOCK_SIZE
        row = (batch * lane_heads + head // lane_group) * lane_row_stride + q_block

        # -- the row's key steps: BLOCK_SIZE // BLOCK_N per entry before the diagonal, the diagonal up to the tile
        first = gl.load(Offsets + row)
        last = gl.load(Offsets + row + 1)
        has_diagonal = gl.load(Indices + last - 1) == q_block
        plain_blocks = last - first - has_diagonal.to(gl.int32)
        diagonal_steps = gl.where(has_diagonal, (q_row - q_block * BLOCK_SIZE + BLOCK_M) // BLOCK_N, 0)
        n_steps = plain_blocks * (BLOCK_SIZE // BLOCK_N) + diagonal_steps
        masked_steps = gl.where(has_diagonal, BLOCK_M // BLOCK_N, 0)

        # -- shared memory: Q (reused for dQ) and dO, one piece per consumer; the K and V rings; their barriers
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + do_desc.block_type.shape, do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_ready.index(c), count=1)
            mbarrier.init(do_ready.index(c), count=1)
        for i in gl.static_range(NUM_STAGES):  # a stage is free once every consumer has released it
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=CONSUMERS)

        # -- written out per branch: Gluon takes the partition list literally (as in the forward)
        if CONSUMERS == 1:
            gl.warp_specialize([
                (_dq_consumer_partition, (dq_desc, Lse, Delta, Indices, q_smem.index(0), do_smem.index(0), k_smem,
                                          v_smem, q_ready.index(0), do_ready.index(0), k_ready, k_empty, v_ready,
                                          v_empty, first, plain_blocks, n_steps, masked_steps, q_block, qk_scale,
                                          sm_scale, seq_len, batch, head, q_row, stride_lb, stride_lh, BLOCK_SIZE,
                                          ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES, num_warps, 0)),
                (_dq_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready,
                                      do_ready, k_ready, k_empty, v_ready, v_empty, Indices, first, n_steps, batch,
                                      head, kv_head, q_row, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CONSUMERS)),
            ], [1], [24])
        else:
            gl.warp_specialize([
                (_dq_consumer_partition, (dq_desc, Lse, Delta, Indices, q_smem.index(0), do_smem.index(0), k_smem,
                                          v_smem, q_ready.index(0), do_ready.index(0), k_ready, k_empty, v_ready,
                                          v_empty, first, plain_blocks, n_steps, masked_steps, q_block, qk_scale,
                                          sm_scale, seq_len, batch, head, q_row, stride_lb, stride_lh, BLOCK_SIZE,
                                          ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES, num_warps, 0)),
                (_dq_consumer_partition, (dq_desc, Lse, Delta, Indices, q_smem.index(1), do_smem.index(1), k_smem,
                                          v_smem, q_ready.index(1), do_ready.index(1), k_ready, k_empty, v_ready,
                                          v_empty, first, plain_blocks, n_steps, masked_steps, q_block, qk_scale,
                                          sm_scale, seq_len, batch, head, q_row, stride_lb, stride_lh, BLOCK_SIZE,
                                          ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES, num_warps, ROWS)),
                (_dq_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready,
                                      do_ready, k_ready, k_empty, v_ready, v_empty, Indices, first, n_steps, batch,
                                      head, kv_head, q_row, BLOCK_SIZE, BLOCK_N, NUM_STAGES, CONSUMERS)),
            ], [num_warps, 1], [CONSUMER_REGS, 24])


def dq_tile_config(block_size: int, head_dim: int, consumers: int | None = None) -> dict:
    """Launch configuration of :func:`hopper_attention_bwd_dq_kernel`: ``CONSUMERS`` warp groups of 64 query rows
    (``BLOCK_M = 64 * CONSUMERS``; default 2 where a 128-row tile fits a block, ``block_size >= 128``, as the
    forward), key steps of ``BLOCK_N = 64``, a ring of ``NUM_STAGES`` K/V stages (K stays two steps), ``num_warps``
    per consumer, the register cap ``maxnreg`` at launch and ``CONSUMER_REGS``, the second consumer's registers.
    One consumer at head dim 64 takes 128 registers and a 3-stage ring (66 KB), so two programs share an SM: 1.4-1.5x
    faster than 168 registers and 4 stages (H100, ``data/benchmarks/dq_h100.json``)."""
    consumers = consumers or (2 if block_size >= 128 else 1)
    if consumers == 2:
        return dict(BLOCK_M=128, BLOCK_N=64, NUM_STAGES=3 if head_dim > 64 else 4, CONSUMERS=2, num_warps=4,
                    maxnreg=168, CONSUMER_REGS=240)
    # one consumer: at head dim 64, 128 registers and 66 KB, so two programs share an SM
    return dict(BLOCK_M=64, BLOCK_N=64, NUM_STAGES=3, CONSUMERS=1, num_warps=4,
                maxnreg=128 if head_dim <= 64 else 240, CONSUMER_REGS=0)


def hopper_dq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
              delta: torch.Tensor, schedule, scale: float, config: dict | None = None) -> torch.Tensor:
    """dQ by :func:`hopper_attention_bwd_dq_kernel`, on inputs already validated by ``scheduled_attention`` and
    accepted by :func:`~topo_attn.attention.hopper_backward.hopper_backward_unsupported_reason` (nothing is
    checked here).

    Arguments:
        q, do: ``[B, H, S, D]``; k, v: ``[B, H_kv, S, D]``; lse, delta: ``[B, H, S]`` float32 with the same
            strides (the forward's natural-log log-sum-exp, and ``rowsum(O * dO)``).
        schedule: the forward's row schedule.
        scale: the softmax scale.
        config: overrides :func:`dq_tile_config` (same keys).

    Returns ``dq``, contiguous, in q's dtype. dO is copied to a contiguous tensor when
    TMA cannot address it (an expanded gradient, for one)."""
    batch, heads, seq_len, head_dim = q.shape
    config = config or dq_tile_config(schedule.block_size, head_dim)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    rows = block_m // config["CONSUMERS"]
    if not tma_eligible(do):
        do = do.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lane_heads, group = (0, 1) if schedule.lanes is None else (schedule.lanes[1], heads // schedule.lanes[1])
    q_layout, kv_layout = shared_layout(rows, head_dim, q.dtype), shared_layout(block_n, head_dim, q.dtype)
    launch(hopper_attention_bwd_dq_kernel, (-(-seq_len // block_m), batch * heads), (
        Tiles(q, [1, 1, rows, head_dim], q_layout), Tiles(k, [1, 1, block_n, head_dim], kv_layout),
        Tiles(v, [1, 1, block_n, head_dim], kv_layout), Tiles(do, [1, 1, rows, head_dim], q_layout),
        Tiles(dq, [1, 1, rows, head_dim], q_layout),
        lse, delta, schedule.offsets, schedule.index_buffer,
        scale, scale * LOG2E,
        seq_len, heads, heads // k.shape[1], lane_heads, group, 0 if schedule.lanes is None else schedule.rows_per_lane,
        lse.stride(0), lse.stride(1),
    ), dict(
        BLOCK_SIZE=schedule.block_size, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim,
        NUM_STAGES=config["NUM_STAGES"], CONSUMERS=config["CONSUMERS"], CONSUMER_REGS=config["CONSUMER_REGS"],
        num_warps=config["num_warps"], maxnreg=config["maxnreg"],
    ))
    return dq
