"""Decoding against a preallocated (static) key/value cache with launch parameters that never change: the
number of valid keys is a device tensor, the block lists have a fixed width, so one captured CUDA graph (or
one ``torch.compile`` graph) serves every step of a generation.

:func:`static_decode` is the public entry point: it checks its arguments (their metadata only: it never
reads ``length`` or ``block_table`` back) and calls the custom op ``torch.ops.topo_attn.static_decode``
(:func:`static_decode_op`, registered at import with a fake implementation, so ``torch.compile(fullgraph=True)``
traces through it). The op trusts its inputs and, by default, launches one kernel, without a host sync:

:func:`static_decode_split_kernel`, grid ``(num_splits, B * H / GROUP)``: each program reads the length from
the device, takes its chunk of the lane's key blocks (the ``cdiv(length, block_size)`` valid blocks when
dense, else its chunk of the ``W`` entries of the lane's block-table row) and runs the online softmax over
them (:func:`decode.decode_step`) for ``GROUP`` query heads x ``L`` queries of one key/value head. Then:

- ``merge="kernel"`` (the default), the split-K "semaphore": each program writes its float32 partial output
  and base-2 log-sum-exp to a workspace (empty chunks write ``-inf``) and counts itself done on its tile's
  counter (an int32 ``atomic_add``, acquire-release); the program that counts last merges the ``num_splits``
  partials of its tile's queries (:func:`decode.merge_partials`, the math of :func:`decode.decode_merge_kernel`),
  writes the output and sets the counter back to 0 for the next call. No program ever waits for another, so
  any order of execution is fine. With one split the program writes its output directly (no counter).
  (Triton's interpreter runs the programs one after another: only a GPU exercises the concurrent case.)
- ``merge="separate"``: the partials only; :func:`decode.decode_merge_kernel` merges them in a second launch
  (the two-launch path, kept for comparison).

At batch 1 a decoding step lasts tens of microseconds and a launch costs a few, so one launch instead of two
is worth having. The counters live in a small int32 workspace per (device, number of tiles), created zeroed
on the first call (:func:`merge_counters`) and left zeroed by every call, so no call (and no replay of a
captured CUDA graph) needs a memset. Because of that shared workspace, two streams must not run a
``merge="kernel"`` static decode with the same number of tiles (``B * H / GROUP``) on one device at the
same time; calls in order on one stream (or one captured graph) are fine.

The grid, the split count and every compile-time constant come from shapes (``S_max``, ``W``, ``B``, ``H``,
``L``, ``D``) and the merge mode, never from the length's value.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .._checks import (MAX_LANES, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, check_device_count, check_int,
                       check_kernel_block_size, check_scale, check_tensor)
from . import decode
from .decode import decode_step, merge_partials, query_tile
from .forward import LOG2E
from ..launch import INTERPRETED, launch

LENGTH_DTYPES = (torch.int32, torch.int64)
"""The dtypes :func:`static_decode` takes for ``length``."""

MERGE_MODES = ("kernel", "separate")
"""The ``merge`` values :func:`static_decode` takes: the partials merged inside the split kernel by the last
program of each tile (one launch), or by :func:`decode.decode_merge_kernel` (two launches)."""

COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}
"""The int32 split counters of ``merge="kernel"``, one workspace per (device, number of tiles), zero
between calls (:func:`merge_counters`)."""


@triton.jit
def merge_tile(OutPart, LsePart, Out, first_lane, q_len, num_splits,
               L_PAD: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
               MERGE_M: tl.constexpr, MERGE_S: tl.constexpr):
    """Merge the ``num_splits`` partials of one tile's ``GROUP`` heads x ``L`` queries (in
    :func:`static_decode_split_kernel`'s workspace ``OutPart``, ``LsePart``) into ``Out [B, H, L, D]``
    (contiguous, cast to its dtype). ``first_lane``: ``b * H + h0``, the tile's first (batch, head) pair.

    Works on ``MERGE_M`` tile rows at a time and folds ``MERGE_S`` splits per step
    (:func:`decode.merge_partials`), so the registers hold at most ``MERGE_M * MERGE_S * D`` partial values
    whatever the tile's size. A query whose partials are all ``-inf`` (it sees no key) gets zeros. The
    partials are read at L2 (``.cg``): other SMs wrote them during this launch."""
    dims = tl.arange(0, HEAD_DIM)
    offs_s = tl.arange(0, MERGE_S)
    for r0 in range(0, GROUP * L_PAD, MERGE_M):
        # -- these tile rows' queries (rows past GROUP heads or L queries are padding)
        rows = r0 + tl.arange(0, MERGE_M)
        real = (rows // L_PAD < GROUP) & (rows % L_PAD < q_len)
        query = (first_lane + rows // L_PAD) * q_len + rows % L_PAD
        m_i = tl.full((MERGE_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((MERGE_M,), tl.float32)
        acc = tl.zeros((MERGE_M, HEAD_DIM), tl.float32)

        # -- fold the splits in, MERGE_S at a time
        for s0 in range(0, num_splits, MERGE_S):
            slots = query[:, None] * num_splits + (s0 + offs_s)[None, :]
            present = real[:, None] & (s0 + offs_s < num_splits)[None, :]
            lse = tl.load(LsePart + slots, mask=present, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(OutPart + slots[:, :, None] * HEAD_DIM + dims[None, None, :], mask=present[:, :, None],
                        other=0.0, cache_modifier=".cg")
            m_i, l_i, acc = merge_partials(m_i, l_i, acc, lse, o, 1)

        # -- normalise and store (l = 0 for a query with no key: zeros)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        tl.store(Out + query[:, None] * HEAD_DIM + dims[None, :], (acc / l_safe[:, None]).to(Out.dtype.element_ty),
                 mask=real[:, None])


@triton.jit(do_not_specialize=["q_len", "max_len", "table_width", "num_splits"])
def static_decode_split_kernel(
    Q, K, V, Length, Table, OutPart, LsePart, Out, Counters,
    qk_scale,  # softmax scale * log2(e)
    q_len, max_len, num_heads, kv_group, table_rows, table_width, num_splits,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_tb, stride_tg, stride_tw,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, L_PAD: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DENSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr, UPCAST: tl.constexpr, WRITE: tl.constexpr,
    MERGE_M: tl.constexpr, MERGE_S: tl.constexpr,
):
    """Grid ``(num_splits, B * H / GROUP)``: program ``(split, pid)`` attends with the queries of tile ``pid``
    (query heads ``h0 .. h0 + GROUP`` of batch ``b``) to chunk ``split`` of their key blocks.

    ``Q [B, H, L, D]``, ``K, V [B, H_kv, S_max, D]`` are pointers (any strides, 64-bit offsets); query head
    ``h`` reads key/value head ``h // kv_group``, and ``GROUP`` divides ``kv_group`` (or is 1). Tile row ``m``
    is head ``h0 + m // L_PAD``, query ``m % L_PAD`` (rows past ``GROUP`` heads or ``L`` queries are padding).
    ``Length`` points to one int32 or int64: the valid keys ``n`` (clamped to ``0 .. max_len``); query ``i``
    sits at position ``n - L + i`` and sees key ``j <= n - L + i`` of a listed block; keys ``>= n`` are never
    read.

    ``DENSE``: the blocks are ``0 .. cdiv(n, BLOCK_SIZE)``, split into ``num_splits`` contiguous chunks
    (``Table`` unused). Otherwise ``Table [B, table_rows, table_width]`` (int32, strides ``stride_t*``) holds
    one row per batch and ``table_rows`` in {1, H_kv, H} (row ``h0 * table_rows // H``, shared by the tile's
    heads); its entries, split into chunks of ``cdiv(table_width, num_splits)``, are block indices in any
    order, each at most once; ``-1`` and blocks at or past ``cdiv(n, BLOCK_SIZE)`` are skipped.

    What it writes, by ``WRITE``, for every real ``(b, h, i)``:

    - ``"partials"``: slot ``split`` of ``OutPart [B, H, L, num_splits, D]`` (float32, the chunk's normalised
      output; zeros where the query sees nothing) and of ``LsePart [B, H, L, num_splits]`` (float32, base-2
      log-sum-exp of the chunk; ``-inf`` where it sees nothing). Both contiguous. ``Out``, ``Counters`` unused.
    - ``"merged"``: the partials, then one count on ``Counters[pid]`` (int32, 0 before the launch); the
      program that counts last merges its tile's ``num_splits`` partials into ``Out [B, H, L, D]``
      (:func:`merge_tile`, ``MERGE_M`` rows x ``MERGE_S`` splits at a time) and sets the counter back to 0.
      Nothing waits, so the programs may run in any order.
    - ``"direct"`` (``num_splits`` is 1: the chunk is the whole lane): the output straight into ``Out``.
      ``OutPart``, ``LsePart``, ``Counters`` unused."""
    # -- which chunk and heads this program owns
    split = tl.program_id(0)
    pid = tl.program_id(1)
    head_groups = num_heads // GROUP
    batch = pid // head_groups
    head0 = (pid % head_groups) * GROUP
    kv_head = head0 // kv_group

    # -- the number of valid keys, read on the device (clamped: the loads never leave the cache)
    kv_len = tl.minimum(tl.maximum(tl.load(Length), 0), max_len).to(tl.int32)
    valid_blocks = tl.cdiv(kv_len, BLOCK_SIZE)

    # -- the query tile ((head, query) pairs, their positions; padding rows are not real), loaded once
    q, q_pos, real, heads, qi = query_tile(Q, batch, head0, kv_len, q_len, stride_qb, stride_qh, stride_qm,
                                           stride_qd, BLOCK_M, L_PAD, GROUP, HEAD_DIM, UPCAST)
    offs_n = tl.arange(0, BLOCK_N)

    # -- running max (base 2), normaliser, accumulator
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

    # -- this program's chunk: of the valid blocks (dense), or of the entries of the lane's table row
    if DENSE:
        width = valid_blocks
    else:
        width = table_width
        row = Table + batch.to(tl.int64) * stride_tb + (head0 * table_rows // num_heads).to(tl.int64) * stride_tg
    chunk = tl.cdiv(width, num_splits)
    first = tl.minimum(split * chunk, width)
    end = tl.minimum(first + chunk, width)

    # -- its key blocks in BLOCK_N-wide sub-tiles, pipelined; every step masks (causal, and keys past n)
    SUBTILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    for t in tl.range(first * SUBTILES, end * SUBTILES, num_stages=NUM_STAGES):
        if DENSE:
            start_n = t * BLOCK_N
        else:
            block = tl.load(row + (t // SUBTILES) * stride_tw)
            # an empty slot (-1) or a block past the valid keys: point at keys >= n, which are all masked
            block = tl.where((block >= 0) & (block < valid_blocks), block, valid_blocks)
            start_n = block * BLOCK_SIZE + (t % SUBTILES) * BLOCK_N
        m_i, l_i, acc = decode_step(m_i, l_i, acc, q, K, V, batch, kv_head, start_n, offs_n, q_pos, kv_len, qk_scale,
                                     stride_kb, stride_kh, stride_kn, stride_kd,
                                     stride_vb, stride_vh, stride_vn, stride_vd,
                                     BLOCK_N, HEAD_DIM, DOT_PRECISION, UPCAST)

    # -- normalise; queries that saw nothing (an empty chunk) get -inf and zeros
    seen = real & (l_i > 0)
    l_safe = tl.where(seen, l_i, 1.0)
    out = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))

    query = (batch.to(tl.int64) * num_heads + heads) * q_len + qi
    dims = tl.arange(0, HEAD_DIM)
    if WRITE == "direct":
        # -- one split: the chunk is the whole lane, its output the answer
        tl.store(Out + query[:, None] * HEAD_DIM + dims[None, :], out.to(Out.dtype.element_ty), mask=real[:, None])
    else:
        # -- store slot `split` of each real query's partials
        slot = query * num_splits + split
        tl.store(LsePart + slot, lse, mask=real)
        tl.store(OutPart + slot[:, None] * HEAD_DIM + dims[None, :], out, mask=real[:, None])

    if WRITE == "merged":
        # -- count this split done (one thread, GPU scope): the barrier orders every thread's partial stores
        #    before the count, whose release publishes them; its acquire shows this program the partials of
        #    the splits that counted before
        tl.debug_barrier()
        done = tl.atomic_add(Counters + pid, 1, sem="acq_rel", scope="gpu")
        if done == num_splits - 1:
            # -- the last split of the tile to finish: merge every split's partials, write the output, and
            #    reset the count for the next call (every split has counted: nothing else touches it now);
            #    the barrier orders every thread's loads after the acquire
            tl.debug_barrier()
            merge_tile(OutPart, LsePart, Out, batch.to(tl.int64) * num_heads + head0, q_len, num_splits,
                       L_PAD, GROUP, HEAD_DIM, MERGE_M, MERGE_S)
            tl.store(Counters + pid, 0)


def merge_counters(device: torch.device, count: int) -> torch.Tensor:
    """The ``count`` int32 split counters of ``merge="kernel"`` on ``device``: made zeroed on the first call
    for this (device, count) and kept in :data:`COUNTERS`; every launch leaves them zero again.

    Raises ``RuntimeError`` when they do not exist yet and the current CUDA stream is capturing a graph (the
    zeroing would be captured, not run): call once eagerly (a warm-up) before capturing."""
    key = (device, count)
    counters = COUNTERS.get(key)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"static_decode(merge='kernel') makes its split counters ({count} on {device}) on "
                               f"its first call, which cannot happen during CUDA graph capture: call it once "
                               f"with these shapes before capturing (or use merge='separate')")
        counters = COUNTERS[key] = torch.zeros(count, dtype=torch.int32, device=device)
    return counters


def static_decode_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: torch.Tensor,
                          block_table: torch.Tensor | None, block_size: int, scale: float,
                          num_splits: int | None = None, merge: str = "kernel") -> torch.Tensor:
    """Launch :func:`static_decode_split_kernel`, which merges the splits itself (``merge="kernel"``), or
    then :func:`decode.decode_merge_kernel` (``merge="separate"``). The inputs are assumed valid (as
    :func:`static_decode` checks them): nothing is checked here.

    Arguments as in :func:`static_decode` (``scale`` resolved to a float); ``num_splits``: chunks per lane,
    ``None`` for the host's choice (:func:`decode.num_splits_for` over ``S_max`` keys when dense, over ``W``
    blocks with a table). Any value >= 1 is correct. Every launch parameter depends on shapes only.

    Returns ``out [B, H, L, D]`` in q's dtype (fresh, contiguous). With more than one split, allocates a
    float32 workspace of ``B * H * L * num_splits * (D + 1)`` values, and with ``merge="kernel"`` uses the
    counters of :func:`merge_counters` (``B * H / GROUP`` of them); never syncs with the host."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    kv_group = heads // kv_heads
    dense = block_table is None
    table_rows, table_width = (1, 1) if dense else (block_table.shape[1], block_table.shape[2])
    table = length if dense else block_table  # (a placeholder pointer when dense: never read)

    # -- query tile: GQA packing when the heads of a key/value head share their row (or there is no table)
    l_pad = triton.next_power_of_2(q_len)
    group = decode.heads_per_tile(kv_group, 0 if dense else table_rows, heads, l_pad)
    block_m = max(16, triton.next_power_of_2(group * l_pad))  # tl.dot needs M >= 16
    programs = batch * (heads // group)
    if num_splits is None:
        per_sm = 1 if block_m * head_dim >= decode.LARGE_TILE else decode.WAVES
        span = max_len if dense else table_width * block_size
        num_splits = decode.num_splits_for(span, block_size, programs, q.device, per_sm)
    config = decode.decode_config(block_size, head_dim, q.dtype, group, q_len)

    # -- what the split kernel writes: the output (one split), partials it merges itself, or partials only
    if merge == "separate":
        write = "partials"
    else:
        write = "direct" if num_splits == 1 else "merged"
    out = torch.empty((batch, heads, q_len, head_dim), dtype=q.dtype, device=q.device)
    if write == "direct":
        out_part = lse_part = out  # (placeholders: never written)
    else:
        out_part = torch.empty((batch, heads, q_len, num_splits, head_dim), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((batch, heads, q_len, num_splits), dtype=torch.float32, device=q.device)
    counters = merge_counters(q.device, programs) if write == "merged" else length  # (a placeholder otherwise)
    # the in-kernel merge reads [MERGE_M rows, MERGE_S splits, D] partials per step: decode.MERGE_TILE values
    merge_m = min(triton.next_power_of_2(group * l_pad), max(1, decode.MERGE_TILE // head_dim))
    merge_s = min(triton.next_power_of_2(num_splits), max(1, decode.MERGE_TILE // (merge_m * head_dim)))

    launch(static_decode_split_kernel, (num_splits, programs), (
        q, k_cache, v_cache, length, table, out_part, lse_part, out, counters,
        scale * LOG2E,
        q_len, max_len, heads, kv_group, table_rows, table_width, num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *(table.stride() if not dense else (0, 0, 0)),
    ), dict(
        BLOCK_SIZE=block_size, BLOCK_M=block_m, L_PAD=l_pad, GROUP=group, HEAD_DIM=head_dim, DENSE=dense,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16,
        WRITE=write, MERGE_M=merge_m if write == "merged" else 1, MERGE_S=merge_s if write == "merged" else 1,
        **config,
    ))
    if write != "partials":
        return out

    block_s = min(decode.MERGE_PARTS, triton.next_power_of_2(num_splits))
    block_d = min(head_dim, max(16, decode.MERGE_TILE // block_s))
    launch(decode.decode_merge_kernel, (batch * heads * q_len, head_dim // block_d),
           (out_part, lse_part, out, out, num_splits),
           dict(BLOCK_S=block_s, BLOCK_D=block_d, HEAD_DIM=head_dim, RETURN_LSE=False, num_warps=4))
    return out


@torch.library.custom_op("topo_attn::static_decode", mutates_args=())
def static_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: torch.Tensor,
                     block_table: Optional[torch.Tensor], block_size: int, scale: float,
                     merge: str = "kernel") -> torch.Tensor:
    """The custom op ``torch.ops.topo_attn.static_decode``: :func:`static_decode_forward` with the host's
    split count. Trusts its inputs (see :func:`static_decode`); no gradient. (``Optional``, not ``| None``:
    the form every torch's schema inference reads.) The split counters of ``merge="kernel"`` are internal
    state that every call leaves as it found it (zero), so the op declares no mutation."""
    return static_decode_forward(q, k_cache, v_cache, length, block_table, block_size, scale, merge=merge)


@static_decode_op.register_fake
def static_decode_fake(q, k_cache, v_cache, length, block_table, block_size, scale, merge="kernel"):
    return q.new_empty(q.shape)


def static_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: torch.Tensor,
                  block_table: torch.Tensor | None = None, block_size: int = 64,
                  scale: float | None = None, merge: str = "kernel") -> torch.Tensor:
    """Attention of the ``L`` newest queries against the first ``length`` keys of a static key/value cache.

    Every launch parameter depends on the shapes only, and the valid length is read on the device, so one
    captured CUDA graph or ``torch.compile`` graph serves every decoding step (the op is
    ``torch.ops.topo_attn.static_decode``). No host sync, no gradient.

    Parameters
    ----------
    q : Tensor ``[B, H, L, D]`` (float16 | bfloat16 | float32), ``1 <= L <= 16``, any strides
        The new queries: query ``i`` sits at position ``length - L + i``.
    k_cache, v_cache : Tensor ``[B, H_kv, S_max, D]``, q's dtype and device, ``H % H_kv == 0``, ``S_max >= L``,
        any strides; D in {16, 32, 64, 128, 256}
        The cache; keys at positions ``>= length`` may hold anything (NaN, inf) and are never read.
    length : Tensor, int32 | int64, one element, on q's device
        The valid keys, the ``L`` new ones included: ``L <= length <= S_max`` (other values give unspecified
        results; the kernel clamps them to ``0 .. S_max``, so it never reads outside the cache).
    block_table : Tensor ``[B, G, W]`` int32 on q's device, G in {1, H_kv, H}, ``W >= 1``, or None
        None: dense, every key block below ``cdiv(length, block_size)``. Otherwise one row per batch shared by
        every head (G = 1), per key/value head shared by its query heads (G = H_kv), or per query head
        (G = H); a row lists key block indices in any order, each at most once; ``-1`` marks an empty slot,
        and entries whose block starts at or past ``length`` are ignored. All ``L`` queries use the row.
    block_size : int, a power of two >= 16
        Tokens per key block.
    scale : float or None
        The softmax scale; None means ``1 / sqrt(D)``.
    merge : {"kernel", "separate"}
        Where the split partials are merged: in the split kernel by the last program of each tile, one launch
        (the default; its counters make two streams running same-shaped calls at once on one device unsafe,
        and it must be called once before CUDA graph capture), or in a second launch (for comparison).

    Returns
    -------
    Tensor ``[B, H, L, D]`` in q's dtype (contiguous): query ``i`` attends to the keys ``j <= length - L + i``
    of its row's blocks. A query that sees no key (only possible with an empty row) gets zeros.

    Raises
    ------
    TypeError, ValueError
        Before any launch, for a wrong type, dtype, shape, device, block size, scale or merge mode. Only
        metadata is checked: the values of ``length`` and ``block_table`` are never read.
    RuntimeError
        With ``merge="kernel"``, on the first call for its device and tile count during CUDA graph capture."""
    block_size, scale = check_static_decode(q, k_cache, v_cache, length, block_table, block_size, scale, merge)
    return static_decode_op(q, k_cache, v_cache, length, block_table, block_size, scale, merge)


def check_static_decode(q, k_cache, v_cache, length, block_table, block_size, scale,
                        merge="kernel") -> tuple[int, float]:
    """The checks of :func:`static_decode` (metadata only); returns the block size and the resolved scale."""
    q, k_cache, v_cache = check_tensor("q", q), check_tensor("k_cache", k_cache), check_tensor("v_cache", v_cache)
    if q.ndim != 4:
        raise ValueError(f"q must have shape [B, H, L, D], got shape {tuple(q.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"q is on {q.device}: the kernels need CUDA tensors (or TRITON_INTERPRET=1 set before "
                         f"triton is first imported, to run them in Triton's interpreter)")
    batch, heads, q_len, head_dim = q.shape
    if not 1 <= q_len <= decode.MAX_DECODE_QUERIES:
        raise ValueError(f"q must hold 1 to {decode.MAX_DECODE_QUERIES} queries (q.shape[2]), got {q_len}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dimension (q.shape[-1]) must be one of "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}, got {head_dim}")
    if batch * heads == 0 or batch * heads > MAX_LANES:
        raise ValueError(f"batch * heads must be 1 to {MAX_LANES}, got q shape {tuple(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; they must be on the same device")
        if t.ndim != 4:
            raise ValueError(f"{name} must have shape [B, H_kv, S_max, D], got shape {tuple(t.shape)}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    kv_batch, kv_heads, max_len, kv_dim = k_cache.shape
    if kv_batch != batch or kv_dim != head_dim:
        raise ValueError(f"k_cache must have shape [B, H_kv, S_max, D] with q's B ({batch}) and D ({head_dim}), "
                         f"got shape {tuple(k_cache.shape)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q's heads ({heads}) must be a multiple of k_cache's heads, got k_cache shape "
                         f"{tuple(k_cache.shape)}")
    if max_len < q_len:
        raise ValueError(f"k_cache must hold at least the L = {q_len} new positions (S_max >= L), got shape "
                         f"{tuple(k_cache.shape)}")

    check_device_count("length", length, q.device, "q", LENGTH_DTYPES)

    block_size = check_int("block_size", block_size)
    check_kernel_block_size(block_size)

    if block_table is not None:
        block_table = check_tensor("block_table", block_table)
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be an int32 tensor, got {block_table.dtype}")
        if block_table.device != q.device:
            raise ValueError(f"block_table is on {block_table.device} but q is on {q.device}; it must be on q's "
                             f"device")
        if block_table.ndim != 3 or block_table.shape[0] != batch or block_table.shape[1] not in (1, kv_heads, heads) \
                or block_table.shape[2] == 0:
            raise ValueError(f"block_table must have shape [B, G, W] with B = {batch}, G in "
                             f"{sorted({1, kv_heads, heads})} and W >= 1, got shape {tuple(block_table.shape)}")
    if not isinstance(merge, str):
        raise TypeError(f"merge must be a str ('kernel' or 'separate'), got {type(merge).__name__}")
    if merge not in MERGE_MODES:
        raise ValueError(f"merge must be 'kernel' or 'separate', got {merge!r}")
    return block_size, check_scale(scale, head_dim)
