"""Split-K ("flash-decoding") Triton kernels for scheduled attention with a few queries at the end of a long
key/value sequence, and their launcher.

Decoding asks for ``L <= 16`` queries, the last ``L`` positions of an ``N``-token sequence (bottom-right
causal: query ``i`` sits at position ``N - L + i``). They fall in one or two query blocks, so each schedule
lane has ``R = nb - first_query_block`` rows (``R`` is 1 or 2), each row a long list of key blocks. The work
is a memory-bound read of the scheduled keys and values; the forward kernel's one-program-per-query-tile
grid would leave the GPU idle. Here instead:

1. :func:`decode_split_kernel`, grid ``(num_splits, R, B * H / GROUP)``: each program takes one contiguous
   chunk of one CSR row and runs the online softmax (base 2) over the chunk's key blocks for a tile of
   ``GROUP`` query heads x ``L`` queries that share one key/value head (GQA packing: every key/value block
   is read once for the whole group). It writes a float32 partial output and partial log-sum-exp per query
   to a workspace; queries outside the row's query block, and empty chunks, get a partial log-sum-exp of
   ``-inf``.
2. :func:`decode_merge_kernel`, grid ``(B * H * L, D / BLOCK_D)``: each program merges the ``num_splits * R``
   partials of one query (a slice of its head dims) into the output (and its natural-log log-sum-exp).

The number of splits is chosen on the host (:func:`num_splits_for`) from the sequence length, the grid and
the SM count, without reading anything back from the GPU.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..launch import launch
from .forward import INTERPRETED, LOG2E, mma_operand

MAX_DECODE_QUERIES = 16
"""The most queries (``L``) :func:`scheduled_decode_forward` takes; with ``block_size >= 16`` they span at
most two query blocks."""

MAX_TILE_ROWS = 128
"""The most rows (query heads x padded queries) one program packs into its query tile; larger GQA groups
are split over several programs (each reading the group's key/value blocks once)."""

INTERPRETER_SMS = 4
"""The SM count :func:`num_splits_for` assumes in Triton's interpreter (no GPU to ask)."""

WAVES = 2
"""Programs per SM that :func:`num_splits_for` aims for: two co-resident programs per SM stream keys and
values at about the best rate measured on an H200 (more splits add start-up latency and merge work)."""

LARGE_TILE = 8192
"""Query-tile values (rows x D) from which one program fills an SM's registers: :func:`num_splits_for` then
plans one program per SM (measured on an H200: L = 16 with four packed heads ran 20% faster so)."""

MERGE_PARTS = 128
"""The most partials :func:`decode_merge_kernel` weighs in one step (more take several)."""

MERGE_TILE = 4096
"""Values of one merge step's ``[parts, dims]`` tile: a query's head dims are spread over programs to
keep it within this."""


@triton.jit
def decode_step(
    m_i, l_i, acc, q, K, V, batch, kv_head, start_n, offs_n, q_pos, kv_len, qk_scale,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """One online-softmax step of the query tile ``q`` (row positions ``q_pos``) over keys ``start_n ..
    start_n + BLOCK_N`` of ``kv_head``: running max ``m_i`` (base 2), normaliser ``l_i``, float32
    accumulator ``acc``. Keys past ``kv_len`` read as zeros and are hidden, and key ``j`` is hidden from row
    ``m`` unless ``j <= q_pos[m]``; a row that has seen no key keeps max ``-inf`` and adds nothing."""
    cols = start_n + offs_n
    kv_rows = cols[:, None].to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)[None, :]
    in_seq = cols[:, None] < kv_len
    k = tl.load(K + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh + kv_rows * stride_kn
                + dims * stride_kd, mask=in_seq, other=0.0)
    s = tl.dot(q, mma_operand(tl.trans(k), UPCAST), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where((cols[None, :] <= q_pos[:, None]) & (cols[None, :] < kv_len), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: no -inf - -inf = NaN
    p = tl.math.exp2(s - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh + kv_rows * stride_vn
                + dims * stride_vd, mask=in_seq, other=0.0)
    p = mma_operand(p.to(v.dtype), UPCAST)
    acc = tl.dot(p, mma_operand(v, UPCAST), acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def query_tile(Q, batch, head0, kv_len, q_len, stride_qb, stride_qh, stride_qm, stride_qd,
               BLOCK_M: tl.constexpr, L_PAD: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
               UPCAST: tl.constexpr):
    """The query tile of a decode program: tile row ``m`` is query head ``head0 + m // L_PAD`` and query
    ``m % L_PAD`` of batch ``batch`` (rows past ``GROUP`` heads or ``q_len`` queries are padding, loaded as
    zeros). Returns ``(q [BLOCK_M, HEAD_DIM], q_pos, real, heads, qi)``: the tile (an MMA operand), each row's
    position ``kv_len - q_len + qi``, whether it is a real query, its head (int64) and its query index."""
    offs_m = tl.arange(0, BLOCK_M)
    g = offs_m // L_PAD
    qi = offs_m % L_PAD
    q_pos = kv_len - q_len + qi
    real = (g < GROUP) & (qi < q_len)
    heads = (head0 + g).to(tl.int64)
    q_ptrs = (Q + batch.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + qi[:, None].to(tl.int64) * stride_qm
              + tl.arange(0, HEAD_DIM)[None, :] * stride_qd)
    q = mma_operand(tl.load(q_ptrs, mask=real[:, None], other=0.0), UPCAST)
    return q, q_pos, real, heads, qi


@triton.jit(do_not_specialize=["kv_len", "q_len", "first_query_block", "num_splits"])
def decode_split_kernel(
    Q, K, V, OutPart, LsePart, Offsets, Indices,
    qk_scale,  # softmax scale * log2(e)
    kv_len, q_len, num_heads, kv_group, lane_heads, first_query_block, rows_per_lane, num_splits,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, L_PAD: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Grid ``(num_splits, R, B * H / GROUP)``: partial results of chunk ``split`` of row ``r`` (query block
    ``first_query_block + r``) of the lane of query heads ``h0 .. h0 + GROUP`` of batch ``b``.

    ``Q [B, H, L, D]``, ``K, V [B, H_kv, N, D]`` are pointers (any strides, 64-bit offsets); query head
    ``h`` reads key/value head ``h // kv_group``, and ``GROUP`` divides ``kv_group`` (or is 1). Tile row
    ``m`` is head ``h0 + m // L_PAD``, query ``m % L_PAD`` (rows past ``GROUP`` heads or ``L`` queries are
    padding). The lane's CSR row is ``lane * rows_per_lane + r`` with ``lane = b * lane_heads + h0 *
    lane_heads // H`` (0, one per query head, or one per key/value head). The row's entries are split into
    ``num_splits`` contiguous chunks of ``cdiv(row_len, num_splits)``.

    Writes, for every real ``(b, h, i)``, slot ``split * R + r`` of ``OutPart [B, H, L, num_splits * R, D]``
    (float32, the chunk's normalised output; zeros where the query sees nothing) and of ``LsePart [B, H, L,
    num_splits * R]`` (float32, base-2 log-sum-exp of the chunk; ``-inf`` for queries outside this query
    block and for an empty chunk). Both are contiguous."""
    # -- which chunk, row, heads and lane this program owns
    split = tl.program_id(0)
    r = tl.program_id(1)
    pid = tl.program_id(2)
    head_groups = num_heads // GROUP
    batch = pid // head_groups
    head0 = (pid % head_groups) * GROUP
    kv_head = head0 // kv_group
    lane = batch * lane_heads + head0 * lane_heads // num_heads
    q_block = first_query_block + r
    row = lane * rows_per_lane + r

    # -- the query tile, loaded once; which of its queries lie in this row's block
    q, q_pos, real, heads, qi = query_tile(Q, batch, head0, kv_len, q_len, stride_qb, stride_qh, stride_qm,
                                           stride_qd, BLOCK_M, L_PAD, GROUP, HEAD_DIM, UPCAST)
    mine = real & (q_pos // BLOCK_SIZE == q_block)
    offs_n = tl.arange(0, BLOCK_N)

    # -- running max (base 2), normaliser, accumulator
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

    # -- this program's chunk of the row
    row_start = tl.load(Offsets + row)
    row_end = tl.load(Offsets + row + 1)
    chunk = tl.cdiv(row_end - row_start, num_splits)
    first = tl.minimum(row_start + split * chunk, row_end)
    end = tl.minimum(first + chunk, row_end)

    # -- its key blocks in BLOCK_N-wide sub-tiles, pipelined; every step masks (causal, and keys past N):
    #    cheaper here than finding the row's diagonal entries first (one dependent load fewer per program)
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    for t in tl.range(first * SUBTILES, end * SUBTILES, num_stages=NUM_STAGES):
        start_n = tl.load(Indices + t // SUBTILES) * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N
        m_i, l_i, acc = decode_step(m_i, l_i, acc, q, K, V, batch, kv_head, start_n, offs_n, q_pos, kv_len,
                                     qk_scale,
                                     stride_kb, stride_kh, stride_kn, stride_kd,
                                     stride_vb, stride_vh, stride_vn, stride_vd,
                                     BLOCK_N, HEAD_DIM, DOT_PRECISION, UPCAST)

    # -- normalise; queries of the other query block, and queries that saw nothing, get -inf and zeros
    seen = mine & (l_i > 0)
    l_safe = tl.where(seen, l_i, 1.0)
    out = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))

    # -- store slot split * R + r of each real query's partials
    parts = num_splits * rows_per_lane
    query = (batch.to(tl.int64) * num_heads + heads) * q_len + qi
    slot = query * parts + split * rows_per_lane + r
    tl.store(LsePart + slot, lse, mask=real)
    tl.store(OutPart + slot[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], out, mask=real[:, None])


@triton.jit
def merge_partials(m_i, l_i, acc, lse, o, AXIS: tl.constexpr):
    """One step of the merge of split partials (the online softmax again, over partials instead of keys):
    fold the partials that lie along axis ``AXIS`` of ``lse`` (base-2 log-sum-exps) and of ``o`` (their
    normalised outputs: ``lse``'s shape plus a trailing head-dim axis) into the running max ``m_i`` (base 2)
    and normaliser ``l_i`` (``lse``'s shape without ``AXIS``) and the float32 accumulator ``acc`` (``o``'s
    shape without ``AXIS``). A partial of ``-inf`` weighs nothing; while every partial seen is ``-inf`` the
    state stays ``(-inf, 0, 0)``. The merged output is ``acc / l_i`` (where ``l_i > 0``)."""
    m_new = tl.maximum(m_i, tl.max(lse, AXIS))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet: no -inf - -inf
    w = tl.math.exp2(lse - tl.expand_dims(m_ref, AXIS))
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(w, AXIS)
    acc = acc * tl.expand_dims(alpha, -1) + tl.sum(tl.expand_dims(w, -1) * o, AXIS)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["parts"])
def decode_merge_kernel(
    OutPart, LsePart, Out, Lse, parts,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """Grid ``(B * H * L, HEAD_DIM / BLOCK_D)``: merge the ``parts`` partials of one query (program
    ``(b * H + h) * L + i``) of :func:`decode_split_kernel`'s workspace, ``BLOCK_S`` at a time (one step when
    ``parts <= BLOCK_S``), into dims ``BLOCK_D * j ..`` of ``Out [B, H, L, D]`` (contiguous, cast to its
    dtype) and, with ``RETURN_LSE`` (by the programs of ``j = 0``), ``Lse [B, H, L]`` (contiguous, float32,
    natural log). Partials with a log-sum-exp of ``-inf`` weigh nothing."""
    # -- this query's partials; running max (base 2), normaliser and accumulator over them
    query = tl.program_id(0).to(tl.int64)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_S)
    m_i = tl.max(tl.full((BLOCK_S,), float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros((BLOCK_S,), tl.float32), 0)
    acc = tl.zeros((BLOCK_D,), tl.float32)

    # -- weigh each partial output by exp2(its lse - the max), as in the online softmax (merge_partials)
    for s0 in range(0, parts, BLOCK_S):
        slots = s0 + offs_s
        lse = tl.load(LsePart + query * parts + slots, mask=slots < parts, other=float("-inf"))
        o = tl.load(OutPart + (query * parts + slots)[:, None] * HEAD_DIM + dims[None, :],
                    mask=(slots < parts)[:, None], other=0.0)
        m_i, l_i, acc = merge_partials(m_i, l_i, acc, lse, o, 0)

    # -- normalise and store; the log-sum-exp in natural log
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(Out + query * HEAD_DIM + dims, (acc / l_safe).to(Out.dtype.element_ty))
    if RETURN_LSE:
        if tl.program_id(1) == 0:
            tl.store(Lse + query, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)


def decode_config(block_size: int, head_dim: int, dtype: torch.dtype, group: int,
                  q_len: int = MAX_DECODE_QUERIES) -> dict:
    """Launch configuration of :func:`decode_split_kernel` (the tuned defaults, measured on an H200).

    Arguments:
        block_size: the schedule's block size (a power of two >= 16).
        head_dim: D.
        dtype: the inputs' dtype (float16, bfloat16 or float32).
        group: query heads packed into one program's tile (1 without GQA packing).
        q_len: L (the tile has ``group * next_pow2(L)`` rows); defaults to the largest.

    Returns a dict with ``BLOCK_N`` (divides ``block_size``), ``num_warps`` and ``NUM_STAGES`` (pipeline
    depth of the key loop). Raises nothing."""
    if dtype == torch.float32:  # IEEE float32 dots: the slowest step; two stages of wide tiles
        block_n, stages = 64, 2
    elif head_dim >= 256:  # bytes per key row: narrower sub-tiles
        block_n, stages = 32, 3
    else:
        block_n, stages = 64, 3
    rows = max(16, triton.next_power_of_2(group * triton.next_power_of_2(q_len)))
    warps = 8 if rows * head_dim >= 16384 else 4  # the float32 accumulator's registers
    return dict(BLOCK_N=min(block_size, block_n), num_warps=warps, NUM_STAGES=stages)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if INTERPRETED or device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def num_splits_for(kv_len: int, block_size: int, programs: int, device: torch.device | str,
                   programs_per_sm: int = WAVES) -> int:
    """How many chunks :func:`scheduled_decode_forward` splits each CSR row into, decided on the host (no
    GPU tensor is read, so no host-device sync).

    Arguments:
        kv_len: N, the key/value length.
        block_size: the schedule's block size.
        programs: programs per split (``R * B * H / GROUP``).
        device: where the kernels run (its SM count is read once and cached; the interpreter assumes
            :data:`INTERPRETER_SMS`).
        programs_per_sm: programs that run at once on one SM (:data:`WAVES`; 1 for large query tiles).

    Returns ``clamp((programs_per_sm * SMs) // programs, 1, nb)`` with ``nb = cdiv(N, block_size)``, the
    most entries a row can hold: one full wave of programs, rounded down (a partly filled extra wave costs a
    whole one), and never more chunks than blocks."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    nb = -(-kv_len // block_size)
    slots = programs_per_sm * _sm_count(device)
    return max(1, min(nb, slots // max(1, programs)))


def heads_per_tile(kv_group: int, lane_heads: int, heads: int, l_pad: int) -> int:
    """Query heads one program packs: the largest divisor of ``kv_group`` whose tile fits
    :data:`MAX_TILE_ROWS`, or 1 when the heads of a group may follow different schedule rows."""
    if lane_heads == heads:
        return 1
    for group in range(kv_group, 0, -1):
        if kv_group % group == 0 and group * l_pad <= MAX_TILE_ROWS:
            return group
    return 1


def scheduled_decode_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                             indices: torch.Tensor, block_size: int, first_query_block: int, lane_heads: int,
                             scale: float, return_lse: bool, num_splits: int | None = None,
                             config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split-K attention of ``L <= 16`` queries at the end of a key/value sequence: launch
    :func:`decode_split_kernel` then :func:`decode_merge_kernel`. The inputs are assumed already validated
    by the caller: nothing is checked here.

    Arguments:
        q: ``[B, H, L, D]``, ``1 <= L <= MAX_DECODE_QUERIES``, float16 | bfloat16 | float32, any strides, on
            CUDA (or the CPU in the interpreter). Query ``i`` sits at position ``N - L + i``.
        k, v: ``[B, H_kv, N, D]``, q's dtype and device, ``N >= L``, ``H % H_kv == 0``, any strides; D in
            {16, 32, 64, 128, 256}.
        offsets, indices: int32 CSR on q's device: ``num_lanes * R`` rows, ``R = nb - first_query_block``
            with ``nb = cdiv(N, block_size)``; row ``lane * R + r`` lists, sorted, unique and non-empty, the
            key blocks (each ``<= first_query_block + r``) that query block ``first_query_block + r`` of
            that lane attends to.
        block_size: the schedule's block size (a power of two >= 16).
        first_query_block: ``(N - L) // block_size``.
        lane_heads: 0 for one row-set shared by every ``(b, h)``; ``H`` for one per ``(b, h)`` (lane
            ``b * H + h``); ``H_kv`` (with ``H_kv < H``) for one per ``(b, kv head)`` shared by its query
            heads (lane ``b * H_kv + h // (H // H_kv)``).
        scale: the softmax scale.
        return_lse: also return the log-sum-exp.
        num_splits: chunks per CSR row; ``None`` picks :func:`num_splits_for`. Any value >= 1 is correct
            (chunks past a row's end are empty).
        config: overrides :func:`decode_config` (same keys; for tuning and tests).

    Query ``i`` sees key ``j`` when ``j``'s block is in the row of ``i``'s query block and ``j <= N - L +
    i``. Returns ``(out, lse)``: ``out [B, H, L, D]`` in q's dtype (a fresh contiguous tensor) and ``lse
    [B, H, L]`` float32 natural log, or ``None`` without ``return_lse``. Launches two kernels and allocates
    a float32 workspace of ``B * H * L * num_splits * R * (D + 1)`` values; never syncs with the host."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    kv_group = heads // kv_heads
    rows = -(-kv_len // block_size) - first_query_block
    l_pad = triton.next_power_of_2(q_len)
    group = heads_per_tile(kv_group, lane_heads, heads, l_pad)
    block_m = max(16, triton.next_power_of_2(group * l_pad))  # tl.dot needs M >= 16
    programs = batch * (heads // group)
    if num_splits is None:
        per_sm = 1 if block_m * head_dim >= LARGE_TILE else WAVES
        num_splits = num_splits_for(kv_len, block_size, rows * programs, q.device, per_sm)
    config = dict(config or decode_config(block_size, head_dim, q.dtype, group, q_len))

    parts = num_splits * rows
    out_part = torch.empty((batch, heads, q_len, parts, head_dim), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((batch, heads, q_len, parts), dtype=torch.float32, device=q.device)
    launch(decode_split_kernel, (num_splits, rows, programs), (
        q, k, v, out_part, lse_part, offsets, indices,
        scale * LOG2E,
        kv_len, q_len, heads, kv_group, lane_heads, first_query_block, rows, num_splits,
        *q.stride(), *k.stride(), *v.stride(),
    ), dict(
        BLOCK_SIZE=block_size, BLOCK_M=block_m, L_PAD=l_pad, GROUP=group, HEAD_DIM=head_dim,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16,
        **config,
    ))

    out = torch.empty((batch, heads, q_len, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device) if return_lse else out
    block_s = min(MERGE_PARTS, triton.next_power_of_2(parts))
    block_d = min(head_dim, max(16, MERGE_TILE // block_s))
    launch(decode_merge_kernel, (batch * heads * q_len, head_dim // block_d), (out_part, lse_part, out, lse, parts),
           dict(BLOCK_S=block_s, BLOCK_D=block_d, HEAD_DIM=head_dim, RETURN_LSE=return_lse, num_warps=4))
    return out, (lse if return_lse else None)
