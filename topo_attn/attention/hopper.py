"""Hopper (sm_90) forward of block-scheduled causal attention, written in Gluon.

Same contract as :func:`topo_attn.attention.forward.scheduled_attention_forward`; the structure is
FlashAttention-3's, with free-running consumer warp groups in place of its explicit ping-pong:

* One program per (query tile of ``BLOCK_M`` rows, lane ``(b, h)``), the last tiles (the longest CSR rows)
  first. ``BLOCK_M = BLOCK_N = min(block_size, 128)``: a tile lies in one query block, and a key step of
  ``BLOCK_N`` keys lies in one scheduled key block (``block_size // BLOCK_N`` steps per scheduled block, the
  diagonal block walked only up to the tile).
* ``gl.warp_specialize`` splits the program into a **load partition** (one warp: the Q tile once, then the
  K and V tiles of the row's key steps through TMA into a ``NUM_STAGES``-deep shared-memory ring, with
  ready/empty mbarriers per stage and per operand) and the **consumers**, registers moved to them from the
  load warp by ``setmaxnreg``. 128-row tiles: two consumer partitions of one warp group each, each owning
  64 rows of the tile (its own piece of Q and of O) and releasing a ring stage by one arrival of two. They
  share no barrier, so they drift apart and one's softmax runs under the other's matrix products (the
  effect of FA3's ping-pong, without its ordering). 64-row tiles: one warp group.
* The consumer overlaps the tensor cores with the softmax inside each warp group: step ``j`` issues
  ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` as asynchronous ``warpgroup_mma``, waits for ``S_j`` only,
  runs the online softmax of ``S_j`` (base 2, ``scale * log2(e)`` folded into one multiply-add) while
  ``P_{j-1} V_{j-1}`` runs, then waits for it and rescales ``O``. P goes to the second GEMM from
  registers, in the input dtype. Only the diagonal step (the row's last) is masked (``query >= key``, which
  also hides keys past the sequence: TMA reads them as zeros).
* Epilogue: ``O / l`` through shared memory (the Q buffer) and a TMA store (rows past ``L`` clipped); the
  natural-log log-sum-exp with a plain store.

Supported: fp16/bf16, head dim 64 or 128, block size a power of two >= 64, shared or per-lane schedules,
GQA, ``L <= S`` with ``S - L`` a multiple of ``BLOCK_M``, TMA-addressable q, k, v. :func:`hopper_unsupported_reason`
says why a call falls outside. The Gluon API targeted is triton 3.6's; the module imports without it (or
without a GPU), and then every call is unsupported.
"""

from __future__ import annotations

import functools

import torch


try:  # the Gluon Hopper API of triton 3.6; any failure here makes every call unsupported
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    from .forward import INTERPRETED, LOG2E, device_capability, tma_eligible
    from ..launch import Tiles, launch

    GLUON_MISSING = None
    if not triton.__version__.startswith("3.6."):  # 3.9's warp_specialize, for one, no longer compiles this
        GLUON_MISSING = f"triton {triton.__version__}: the Gluon kernel is written for triton 3.6's API"
except Exception as error:  # noqa: BLE001 - ImportError, AttributeError, ...: any mismatch of the API
    GLUON_MISSING = f"triton has no gluon Hopper API ({type(error).__name__}: {error})"


if GLUON_MISSING is None:  # (GLUON_MISSING: why this triton cannot run the Gluon kernels, or None)

    @gluon.jit
    def row_load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, k_empty, v_ready,
                           v_empty, Indices, first, n_steps, batch, head, kv_head, q_row,
                           BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                           CONSUMERS: gl.constexpr):
        """One warp: TMA loads of the Q tile (one piece per consumer), then of the K and V tiles of key steps
        ``0 .. n_steps - 1`` of the CSR row starting at entry ``first`` (step ``t``: sub-tile ``t % SUBTILES`` of
        block ``Indices[first + t // SUBTILES]``), each into ring stage ``t % NUM_STAGES`` once every consumer
        has released it."""
        SUBTILES: gl.constexpr = BLOCK_SIZE // BLOCK_N
        # -- the query tile, once: one piece of Q_ROWS rows per consumer
        Q_ROWS: gl.constexpr = q_desc.block_type.shape[2]
        for c in gl.static_range(CONSUMERS):
            mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [batch, head, q_row + c * Q_ROWS, 0], q_ready.index(c),
                                            q_smem.index(c))
        # -- the key steps of the row, K then V, NUM_STAGES ahead of the consumer
        for t in range(n_steps):
            stage = t % NUM_STAGES
            phase = (t // NUM_STAGES) & 1  # empty barriers start free: the first round waits on parity 1
            start_n = gl.load(Indices + first + t // SUBTILES) * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N
            mbarrier.wait(k_empty.index(stage), phase ^ 1)
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [batch, kv_head, start_n, 0], k_ready.index(stage),
                                            k_smem.index(stage))
            mbarrier.wait(v_empty.index(stage), phase ^ 1)
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [batch, kv_head, start_n, 0], v_ready.index(stage),
                                            v_smem.index(stage))

    @gluon.jit
    def _online_softmax(s, m_i, l_i, qk_scale, limit, MASKED: gl.constexpr, p_layout: gl.constexpr,
                        o_row_layout: gl.constexpr, DTYPE: gl.constexpr):
        """Fold the raw scores ``s [BLOCK_M, BLOCK_N]`` (float32, wgmma accumulator layout) into the running
        max ``m_i`` (base 2, scaled) and normaliser ``l_i``. ``MASKED``: keep only ``col - row <= limit``
        (``limit = 0``: the causal diagonal). Returns ``p`` (``DTYPE``, the A-operand layout of the P V
        wgmma), ``m_i``, ``l_i`` and the rescale factor ``alpha`` of the output rows."""
        if MASKED:
            rows = gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s.type.layout))
            cols = gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
            s = gl.where((cols[None, :] - rows[:, None]) <= limit, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        p = gl.convert_layout(p.to(DTYPE), p_layout)
        return p, m_new, l_i, gl.convert_layout(alpha, o_row_layout)

    @gluon.jit
    def _attention_step(j, q, p, o, m_i, l_i, qk_scale, limit, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                        s_layout: gl.constexpr, p_layout: gl.constexpr, o_row_layout: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                        NUM_STAGES: gl.constexpr, MASKED: gl.constexpr):
        """Key step ``j >= 1``: ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` on the tensor cores while the
        softmax of ``S_j`` runs; returns ``P_j`` and the state rescaled to step ``j``'s max."""
        k_stage = j % NUM_STAGES
        v_stage = (j - 1) % NUM_STAGES
        # -- issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; both asynchronous
        mbarrier.wait(k_ready.index(k_stage), (j // NUM_STAGES) & 1)
        k_t = k_smem.index(k_stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k_t, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(v_stage), ((j - 1) // NUM_STAGES) & 1)
        v = v_smem.index(v_stage).reshape([BLOCK_N, HEAD_DIM])
        o = warpgroup_mma(p, v, o, is_async=True)
        # -- S_j is ready (P V may still run): release K_j, softmax of S_j
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        mbarrier.arrive(k_empty.index(k_stage), count=1)
        p_next, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, limit, MASKED, p_layout, o_row_layout,
                                                  q.dtype)
        # -- P_{j-1} V_{j-1} done: release V_{j-1}, rescale O to the new max
        o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
        mbarrier.arrive(v_empty.index(v_stage), count=1)
        o = o * alpha[:, None]
        return p_next, o, m_i, l_i

    @gluon.jit
    def _consumer_partition(o_desc, Lse, q_smem, k_smem, v_smem, q_ready, k_ready, k_empty, v_ready, v_empty,
                            n_steps, has_diagonal, qk_scale, q_len, batch, head, q_row, stride_lb, stride_lh,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                            NUM_STAGES: gl.constexpr, RETURN_LSE: gl.constexpr, num_warps: gl.constexpr,
                            SUB_ROW: gl.constexpr):
        """``BLOCK_M // 16`` warps (one warp group per 64 rows) owning rows ``SUB_ROW .. SUB_ROW + BLOCK_M``
        of the query tile (``q_smem``: their Q piece, reused for O): the online softmax over the row's
        ``n_steps`` key steps (the last one causally masked when ``has_diagonal``), then the epilogue."""
        # -- layouts: wgmma accumulators of S [M, N] and O [M, D]; P as the register A operand of P V
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        s_row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

        mbarrier.wait(q_ready, 0)
        q = q_smem.reshape([BLOCK_M, HEAD_DIM])
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_row_layout)
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, s_row_layout)
        o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

        # -- step 0: S_0 alone (masked when it is the diagonal, i.e. the only step)
        mbarrier.wait(k_ready.index(0), 0)
        k_t = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k_t, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        mbarrier.arrive(k_empty.index(0), count=1)
        only_diagonal = has_diagonal & (n_steps == 1)
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, gl.where(only_diagonal, SUB_ROW, BLOCK_N), True,
                                             p_layout, o_row_layout, q.dtype)

        # -- steps 1 .. without the diagonal: no mask
        for j in range(1, n_steps - has_diagonal.to(gl.int32)):
            p, o, m_i, l_i = _attention_step(j, q, p, o, m_i, l_i, qk_scale, 0, k_smem, v_smem, k_ready, k_empty,
                                             v_ready, v_empty, s_layout, p_layout, o_row_layout, BLOCK_M, BLOCK_N,
                                             HEAD_DIM, NUM_STAGES, False)
        # -- the diagonal step, last: causal mask (it also hides keys past the sequence)
        if has_diagonal & (n_steps > 1):
            p, o, m_i, l_i = _attention_step(n_steps - 1, q, p, o, m_i, l_i, qk_scale, SUB_ROW, k_smem, v_smem, k_ready,
                                             k_empty, v_ready, v_empty, s_layout, p_layout, o_row_layout, BLOCK_M,
                                             BLOCK_N, HEAD_DIM, NUM_STAGES, True)

        # -- drain: O += P_last V_last
        last = n_steps - 1
        mbarrier.wait(v_ready.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
        v = v_smem.index(last % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM])
        o = warpgroup_mma(p, v, o, is_async=True)
        o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
        mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)

        # -- normalise; store O through the (now free) Q buffer and TMA (rows past L are clipped)
        l_o = gl.convert_layout(l_i, o_row_layout)
        o = o / l_o[:, None]
        q.store(o.to(q.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [batch, head, q_row + SUB_ROW, 0], q_smem)
        # -- the log-sum-exp, natural log
        if RETURN_LSE:
            m_o = gl.convert_layout(m_i, o_row_layout)
            lse = (m_o + gl.log2(l_o)) * 0.6931471805599453
            rows = q_row + SUB_ROW + gl.arange(0, BLOCK_M, layout=o_row_layout)
            gl.store(Lse + batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh + rows, lse,
                     mask=rows < q_len)
        tma.store_wait(pendings=0)

    @gluon.jit(do_not_specialize=["q_len", "q_offset", "first_block", "lane_row_stride", "stride_lb", "stride_lh"])
    def hopper_attention_fwd_kernel(
        q_desc, k_desc, v_desc, o_desc, Lse, Offsets, Indices,
        qk_scale,  # softmax scale * log2(e)
        q_len, q_offset, first_block,  # queries, the first query's position (a multiple of BLOCK_M), its block
        num_heads, kv_group, lane_heads, lane_group, lane_row_stride,  # lane_row_stride: 0 for a shared schedule
        stride_lb, stride_lh,
        BLOCK_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
        NUM_STAGES: gl.constexpr, RETURN_LSE: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """Grid ``(cdiv(L, BLOCK_M), B * H)``: ``Out [B, H, L, D]`` and, with ``RETURN_LSE``, ``Lse [B, H, L]``
        (float32, natural log) of query rows ``BLOCK_M * i ..`` of lane ``(b, h)``, reading key/value head
        ``h // kv_group``. ``q_desc``/``o_desc``: 4-D TMA descriptors of ``[B, H, L, D]`` with block
        ``[1, 1, BLOCK_M, D]``; ``k_desc``/``v_desc``: of ``[B, H_kv, S, D]`` with block ``[1, 1, BLOCK_N, D]``
        (zero padding past ``S``). ``Offsets``/``Indices``: the int32 CSR rows of the absolute query blocks
        ``first_block ..`` (sorted, causal, diagonal last when present), shared (``lane_row_stride = 0``) or
        ``lane_row_stride`` rows per lane ``b * lane_heads + h // lane_group``. ``BLOCK_M == BLOCK_N``, both
        divide ``BLOCK_SIZE``. ``CONSUMERS``: 1 (one consumer partition of ``num_warps = BLOCK_M // 16``
        warps) or 2 (two partitions of ``num_warps = BLOCK_M // 32`` warps, each owning half the rows and
        running unsynchronised, so one's softmax can overlap the other's matrix products; the second gets
        ``CONSUMER_REGS`` registers per thread); ``q_desc``/``o_desc`` blocks then hold ``BLOCK_M //
        CONSUMERS`` rows."""
        gl.static_assert(BLOCK_M == BLOCK_N, "the diagonal mask assumes square tiles")
        gl.static_assert(BLOCK_M == 16 * num_warps * CONSUMERS, "one warp group per 64 query rows")
        # -- which queries, lane and schedule row this program owns (last query tiles, the longest rows, first)
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
        lane = gl.program_id(1)
        batch = lane // num_heads
        head = lane % num_heads
        kv_head = head // kv_group
        q_row = pid_m * BLOCK_M  # row of Q and Out
        start_m = q_offset + q_row  # absolute position of the tile
        q_block = start_m // BLOCK_SIZE
        row = (batch * lane_heads + head // lane_group) * lane_row_stride + q_block - first_block

        # -- the row's key steps: BLOCK_SIZE // BLOCK_N per off-diagonal entry, the diagonal one up to the tile
        first = gl.load(Offsets + row)
        last = gl.load(Offsets + row + 1)
        has_diagonal = gl.load(Indices + last - 1) == q_block
        n_full = last - first - has_diagonal.to(gl.int32)
        diagonal_steps = gl.where(has_diagonal, (start_m - q_block * BLOCK_SIZE) // BLOCK_N + 1, 0)
        n_steps = n_full * (BLOCK_SIZE // BLOCK_N) + diagonal_steps

        # -- shared memory: the Q tile in one piece per consumer (reused for O), the K and V rings, their barriers
        dtype: gl.constexpr = q_desc.dtype
        Q_ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_ready.index(c), count=1)
        for i in gl.static_range(NUM_STAGES):  # a stage is free once every consumer has released it
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=CONSUMERS)

        # -- consumer warp groups (the default partition, and a second one when split) and the TMA load warp;
        #    written out per branch: Gluon takes the partition list literally (a tuple bound to a name fails)
        if CONSUMERS == 1:
            gl.warp_specialize([
                (_consumer_partition, (o_desc, Lse, q_smem.index(0), k_smem, v_smem, q_ready.index(0), k_ready,
                                       k_empty, v_ready, v_empty, n_steps, has_diagonal, qk_scale, q_len, batch, head,
                                       q_row, stride_lb, stride_lh, Q_ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                       RETURN_LSE, num_warps, 0)),
                (row_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, k_empty,
                                      v_ready, v_empty, Indices, first, n_steps, batch, head, kv_head, q_row,
                                      BLOCK_SIZE, BLOCK_N, NUM_STAGES, CONSUMERS)),
            ], [1], [24])
        else:
            gl.warp_specialize([
                (_consumer_partition, (o_desc, Lse, q_smem.index(0), k_smem, v_smem, q_ready.index(0), k_ready,
                                       k_empty, v_ready, v_empty, n_steps, has_diagonal, qk_scale, q_len, batch, head,
                                       q_row, stride_lb, stride_lh, Q_ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                       RETURN_LSE, num_warps, 0)),
                (_consumer_partition, (o_desc, Lse, q_smem.index(1), k_smem, v_smem, q_ready.index(1), k_ready,
                                       k_empty, v_ready, v_empty, n_steps, has_diagonal, qk_scale, q_len, batch, head,
                                       q_row, stride_lb, stride_lh, Q_ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                       RETURN_LSE, num_warps, Q_ROWS)),
                (row_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, k_empty,
                                      v_ready, v_empty, Indices, first, n_steps, batch, head, kv_head, q_row,
                                      BLOCK_SIZE, BLOCK_N, NUM_STAGES, CONSUMERS)),
            ], [num_warps, 1], [CONSUMER_REGS, 24])


def tile_config(block_size: int, head_dim: int, consumers: int | None = None) -> dict:
    """Launch configuration of :func:`hopper_attention_fwd_kernel` for a supported call (measured on an H200,
    NOTES.md, "Gluon Hopper forward"; the choices fit Hopper's 227 KB of shared memory and 64K registers
    per SM).

    Returns ``BLOCK_M = BLOCK_N = min(block_size, 128)``, ``NUM_STAGES`` (depth of the K/V ring),
    ``CONSUMERS`` (consumer partitions: 1, or 2 each owning half the rows), ``num_warps`` (the warps of one
    consumer partition, ``BLOCK_M // (16 * CONSUMERS)``; the load warp comes on top), ``maxnreg`` (the
    per-thread register cap before ``setmaxnreg`` moves the load warp's registers to the consumers) and
    ``CONSUMER_REGS`` (the second consumer's registers when split). 128-row tiles: one program per SM (Q + two
    K/V stages = 160 KB at D 128), 12 warps with the padding of the load warp's group: 168 registers each at
    launch, then 240 for the consumers and 24 for the load warp. ``consumers``: 1 or 2 for 128-row tiles
    (default 2, the split form: 13-18% faster than one partition of two warp groups). 64-row tiles: one
    consumer, two programs per SM (a third stage or a fourth measured no faster)."""
    block = min(block_size, 128)
    if block == 128:
        consumers = consumers or 2
        return dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2 if head_dim > 64 else 3, CONSUMERS=consumers,
                    num_warps=8 // consumers, maxnreg=168, CONSUMER_REGS=240 if consumers == 2 else 0)
    return dict(BLOCK_M=64, BLOCK_N=64, NUM_STAGES=2 if head_dim > 64 else 3, CONSUMERS=1, num_warps=4,
                maxnreg=128, CONSUMER_REGS=0)


def hopper_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule) -> str | None:
    """Why :func:`hopper_forward` cannot take this call, or ``None`` when it can.

    Arguments as in :func:`hopper_forward` (``schedule`` may be anything: a non-schedule gives a reason).
    Cheap (no device synchronisation, no compilation; what depends only on devices, dtypes, ranks and sizes is
    decided once per combination) and never raises."""
    try:
        if GLUON_MISSING is not None:
            return GLUON_MISSING
        block_size = getattr(schedule, "block_size", None)
        reason = _static_reason(q.device, q.dtype, k.dtype, v.dtype, (q.ndim, k.ndim, v.ndim), q.shape[-1],
                                block_size if isinstance(block_size, int) else None,
                                getattr(schedule, "transposed", True))
        if reason is not None:
            return reason
        block_m = tile_config(block_size, q.shape[-1])["BLOCK_M"]
        q_offset = k.shape[2] - q.shape[2]
        if q_offset < 0 or q_offset % block_m:
            return f"queries not aligned to the {block_m}-row tile (S - L = {q_offset})"
        if not tma_eligible(q, k, v):
            return "strides not TMA-addressable (last stride 1, base and other strides 16-byte aligned)"
        return None
    except Exception as error:  # noqa: BLE001 - a reason, never an exception
        return f"could not inspect the inputs ({type(error).__name__}: {error})"


@functools.lru_cache(maxsize=256)
def _static_reason(device: torch.device, q_dtype, k_dtype, v_dtype, ranks: tuple, head_dim: int,
                   block_size: int | None, transposed: bool) -> str | None:
    """The part of :func:`hopper_unsupported_reason` that depends on no address, stride or length."""
    if INTERPRETED:
        return "Triton interpreter (the Gluon kernel needs a compiled Hopper target)"
    if device.type != "cuda":
        return f"tensors on {device.type}, not on a CUDA GPU"
    major, minor = device_capability(device)
    if (major, minor) != (9, 0):
        return f"not a Hopper GPU (sm_{major}{minor})"
    if q_dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {str(q_dtype).removeprefix('torch.')}"
    if k_dtype != q_dtype or v_dtype != q_dtype:
        return f"mixed dtypes {q_dtype}, {k_dtype}, {v_dtype}"
    if ranks != (4, 4, 4):
        return "inputs not [B, H, L, D] / [B, H_kv, S, D]"
    if head_dim not in (64, 128):
        return f"head dim {head_dim}"
    if block_size is None or transposed:
        return "not a row BlockSchedule"
    if block_size < 64 or block_size & (block_size - 1):
        return f"block size {block_size}"
    return None


@functools.lru_cache(maxsize=None)
def shared_layout(block_rows: int, head_dim: int, dtype: torch.dtype):
    """The swizzled shared-memory layout of a ``[1, 1, block_rows, head_dim]`` tile (computed once: it costs
    microseconds on the launch path)."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, block_rows, head_dim],
                                                gl.float16 if dtype == torch.float16 else gl.bfloat16)


def hopper_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule, scale: float,
                   return_lse: bool, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch :func:`hopper_attention_fwd_kernel` on inputs already validated by ``scheduled_attention`` and
    accepted by :func:`hopper_unsupported_reason` (nothing is checked here).

    Arguments:
        q: ``[B, H, L, D]``, float16 | bfloat16, D in {64, 128}, on a Hopper GPU, TMA-addressable strides.
        k, v: ``[B, H_kv, S, D]``, q's dtype and device, ``H % H_kv == 0``, ``L <= S``, ``S - L`` a multiple
            of the query tile (``min(block_size, 128)``).
        schedule: the row :class:`~topo_attn.BlockSchedule` for ``seq_len = S`` and ``q_len = L``, shared or
            with lanes ``(B, H)`` or ``(B, H_kv)``, block size a power of two >= 64, on q's device.
        scale: the softmax scale.
        return_lse: also return the log-sum-exp.
        config: overrides :func:`tile_config` (same keys, same ``BLOCK_M``; for tuning and tests).

    Returns ``(out, lse)``: ``out [B, H, L, D]`` in q's dtype, laid out like ``torch.empty_like(q)`` (a model's
    ``[B, L, H, D]`` memory stays so: its output then needs no transposing copy), and ``lse [B, H, L]`` float32 natural
    log, or ``None`` without ``return_lse``."""
    batch, heads, q_len, head_dim = q.shape
    seq_len = k.shape[2]
    config = config or tile_config(schedule.block_size, head_dim)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    q_rows = block_m // config["CONSUMERS"]
    out = torch.empty_like(q)  # q's strides: TMA-addressable, as hopper_unsupported_reason checked for q
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device) if return_lse else out
    lane_heads, group = (0, 1) if schedule.lanes is None else (schedule.lanes[1], heads // schedule.lanes[1])
    grid = (-(-q_len // block_m), batch * heads)
    q_layout, kv_layout = shared_layout(q_rows, head_dim, q.dtype), shared_layout(block_n, head_dim, q.dtype)
    launch(hopper_attention_fwd_kernel, grid, (
        Tiles(q, [1, 1, q_rows, head_dim], q_layout), Tiles(k, [1, 1, block_n, head_dim], kv_layout),
        Tiles(v, [1, 1, block_n, head_dim], kv_layout), Tiles(out, [1, 1, q_rows, head_dim], q_layout),
        lse, schedule.offsets, schedule.index_buffer,
        scale * LOG2E,
        q_len, seq_len - q_len, schedule.first_query_block,
        heads, heads // k.shape[1], lane_heads, group, 0 if schedule.lanes is None else schedule.rows_per_lane,
        lse.stride(0), lse.stride(1),
    ), dict(
        BLOCK_SIZE=schedule.block_size, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim,
        NUM_STAGES=config["NUM_STAGES"], RETURN_LSE=return_lse, CONSUMERS=config["CONSUMERS"],
        CONSUMER_REGS=config["CONSUMER_REGS"], num_warps=config["num_warps"], maxnreg=config["maxnreg"],
    ))
    return out, (lse if return_lse else None)
