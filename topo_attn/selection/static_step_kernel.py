"""One Triton kernel for a decode step's block table over a static cache: the selection of
:func:`~topo_attn.selection.static_step.step_block_table` in one launch per layer-step.

The torch path scores every block, masks, builds order keys, ranks with ``topk`` and assembles the row: several
launches, more than the attention they choose for at short caches. Here one program per key/value head lane
``(b, kv_head)`` does all of it:

1. read the length on the device: the query's block ``qb = (length - 1) // block_size``, the candidates
   ``sinks <= kb < qb - window``;
2. score the candidates in float32 from the kept statistics, ``BLOCK_N`` blocks at a time, as the selector's
   ``step_scores`` does (``quest``: the group's largest ``relu(q) . hi + min(q, 0) . lo``; ``centroid``: the
   group's mean query ``. centroid``; ``salience``: ``topology``'s kept salience, read as it is), and write each
   score's order key (:func:`~topo_attn.selection.topk.order_key`:
   the float's order-preserving bits above the reversed block index, so equal scores go to the lower block) to a
   workspace row;
3. read the row back whole and take the ``budget`` largest keys, one round of ``max`` each;
4. write ``[sinks + window + 1 + budget]`` int32: the sinks below the window, the window and ``qb``, then the
   chosen blocks best first, ``-1`` in empty slots.

At a one-token step (``update``, :func:`~topo_attn.selection.static_step.decode_step_table`) the program first
writes the statistics of the block the new key went into (and, when the key completes it, ``topology``'s kept
salience), so the step's whole selection is one launch. A query-blind row (``salience``) can be kept between
steps (``keep``): it changes only when the query's block changes or a block completes, so on the other steps the
program copies its kept row and ranks nothing.

The query-aware scores (``quest``, ``centroid``) are ranked by several programs per lane when the statistics'
``counters`` are passed (the ops always pass them): :func:`_split_table_kernel` gives each program a chunk of
candidates (:func:`split_chunk`), which it scores, ranks by counting larger keys and cuts to its best ``budget``;
the lane's last program to finish (an acquire-release count) ranks those lists the same way and writes the row.
``salience`` and ``none`` keep one program per lane (the salience's update when a block completes changes the
scores other programs would read).

Measured on an H100 (8 key/value heads, D = 64, budget 32, the update and table in one launch, 20 launches per
CUDA graph; ``topo_attn/selection/NOTES.md``): one program per lane takes 16-22 us at 32k keys (B1, B8), 37-59 us
at B1 128k and 45-73 us at B8 128k; the split ranking 12-17, 31-33 and 55-70 us. ``topology`` takes 13 us (18
when a block completes) and 4 us with a kept row. The ranking loops are latency-bound (each tile of comparisons
waits for its load), and one ``tl.sort`` of the row was slower than ``budget`` rounds of a maximum.

Every launch parameter follows from shapes (``nb_max``, ``D``, the group, the row width); the length and the
candidates' count stay on the device, so one captured graph serves every step. The op
``torch.ops.topo_attn.static_step_table`` (:func:`static_step_table_op`, with a fake implementation) lets
``torch.compile(fullgraph=True)`` trace through it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

SCORES = ("none", "salience", "centroid", "quest")
"""The kernel's scores: ``none`` (the window rule: no candidate is added), ``salience`` (``topology``: the kept
salience of each block, no arithmetic), ``centroid``, ``quest``."""

INDEX_BITS = 16
"""The reversed block index lives in an order key's low bits: the kernel holds ``nb_max < 2**INDEX_BITS``."""

_NO_KEY = -(2 ** 48)  # below every candidate's key (those are >= -2**31 * 2**INDEX_BITS)


@triton.jit
def _probe():
    pass


INTERPRETED: bool = isinstance(_probe, InterpretedFunction)
"""True when ``TRITON_INTERPRET=1`` was set before triton was imported: the kernel then runs on the CPU."""


@triton.jit
def _update_block(
    Cache, Centroids, Lo, Hi, Salience, batch, kv_head, length, block_size, head_dim,
    stride_cb, stride_ch, stride_cs, stride_cd,
    stride_tb, stride_th, stride_tn, stride_td,
    stride_ab, stride_ah, stride_an,
    SALIENCE: tl.constexpr, BS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """The statistics of lane ``(batch, kv_head)``'s block that the step's key (position ``length - 1``) went
    into, from its keys so far: the mean, minimum and maximum (float32); when the key completes the block and
    ``SALIENCE``, the kept salience's update (:func:`~topo_attn.selection.kept_salience.update_kept_salience`):
    the block's bar is its distance to the nearest older block, and each older block ``m``'s bar is cut to
    ``max(d[m], min_{o < m} d[o])`` over the new block's distance row ``d``."""
    position = length - 1
    block = position // block_size
    count = position - block * block_size + 1  # the block's keys so far, this step's included
    r = tl.arange(0, BS_PAD)
    d = tl.arange(0, HEAD_DIM)
    inside = (r[:, None] < count) & (d[None, :] < head_dim)
    cache = (Cache + batch.to(tl.int64) * stride_cb + kv_head.to(tl.int64) * stride_ch
             + (block * block_size + r)[:, None].to(tl.int64) * stride_cs + d[None, :] * stride_cd)
    keys = tl.load(cache, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(keys, axis=0) / count.to(tl.float32)
    lo = tl.min(tl.where(inside, keys, float("inf")), axis=0)
    hi = tl.max(tl.where(inside, keys, float("-inf")), axis=0)
    lane = batch.to(tl.int64) * stride_tb + kv_head.to(tl.int64) * stride_th
    at = lane + block.to(tl.int64) * stride_tn + d * stride_td
    tl.store(Centroids + at, mean, mask=d < head_dim)
    tl.store(Lo + at, lo, mask=d < head_dim)
    tl.store(Hi + at, hi, mask=d < head_dim)
    if SALIENCE:
        if count == block_size:  # the block completed: its bar, and the older bars it shortens
            bars = Salience + batch.to(tl.int64) * stride_ab + kv_head.to(tl.int64) * stride_ah
            nearest = tl.full([BLOCK_N], float("inf"), tl.float32)  # element-wise minimum of d so far
            for start in range(0, block, BLOCK_N):
                o = start + tl.arange(0, BLOCK_N)
                older = o < block
                centroids = tl.load(Centroids + lane + o[:, None].to(tl.int64) * stride_tn + d[None, :] * stride_td,
                                    mask=older[:, None] & (d[None, :] < head_dim), other=0.0)
                diff = centroids - mean[None, :]
                dist = tl.where(older, tl.sqrt(tl.sum(diff * diff, axis=1)), float("inf"))
                # min_{o < m} d[o]: within this chunk (a masked [m, o] minimum), then over the chunks before
                before = tl.min(tl.where(o[None, :] < o[:, None], dist[None, :], float("inf")), axis=1)
                before = tl.minimum(before, tl.min(nearest, axis=0))
                bar = tl.load(bars + o.to(tl.int64) * stride_an, mask=older, other=float("inf"))
                tl.store(bars + o.to(tl.int64) * stride_an, tl.minimum(bar, tl.maximum(dist, before)), mask=older)
                nearest = tl.minimum(nearest, dist)
            tl.store(bars + block.to(tl.int64) * stride_an, tl.min(nearest, axis=0))


@triton.jit
def _order_keys(
    Q, First, Second, batch, kv_head, kb, end, nb,
    stride_qb, stride_qh, stride_qd, stride_sb, stride_sh, stride_sn, stride_sd, head_dim,
    SCORE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    INDEX_BITS: tl.constexpr,
):
    """The order keys ``[BLOCK_N]`` int64 of lane ``(batch, kv_head)``'s blocks ``kb`` (those ``< end`` are
    read; the others' keys are garbage): the block's float32 score (``salience``: the kept salience, column 0 of
    ``First``; ``quest``: the group's largest ``relu(q) . hi + min(q, 0) . lo``, ``hi`` in ``First``, ``lo`` in
    ``Second``; ``centroid``: the group's mean query ``. centroid``, in ``First``) as its order-preserving bits
    (-0.0 as 0.0) above the reversed block index ``nb - 1 - kb``, so that equal scores go to the lower block."""
    d = tl.arange(0, HEAD_DIM)
    q_base = Q + batch.to(tl.int64) * stride_qb + (kv_head * GROUP).to(tl.int64) * stride_qh
    stat_base = batch.to(tl.int64) * stride_sb + kv_head.to(tl.int64) * stride_sh
    at = stat_base + kb[:, None].to(tl.int64) * stride_sn + d[None, :] * stride_sd
    inside = (kb[:, None] < end) & (d[None, :] < head_dim)
    if SCORE == "salience":  # the kept salience is the score
        score = tl.load(First + stat_base + kb.to(tl.int64) * stride_sn, mask=kb < end, other=0.0)
    elif SCORE == "quest":  # the group's largest page bound, hi in First, lo in Second
        first = tl.load(First + at, mask=inside, other=0.0)
        second = tl.load(Second + at, mask=inside, other=0.0)
        score = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for g in range(GROUP):
            q = tl.load(q_base + g * stride_qh + d * stride_qd, mask=d < head_dim, other=0.0).to(tl.float32)
            bound = (tl.sum(tl.maximum(q, 0.0)[None, :] * first, axis=1)
                     + tl.sum(tl.minimum(q, 0.0)[None, :] * second, axis=1))
            score = tl.maximum(score, bound)
    else:  # centroid: the group's mean query . the centroid in First
        first = tl.load(First + at, mask=inside, other=0.0)
        total = tl.zeros([HEAD_DIM], tl.float32)
        for g in range(GROUP):
            total += tl.load(q_base + g * stride_qh + d * stride_qd, mask=d < head_dim, other=0.0).to(tl.float32)
        score = tl.sum((total / GROUP)[None, :] * first, axis=1)
    bits = tl.where(score == 0.0, 0.0, score).to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    return (ordered << INDEX_BITS) + (nb - 1 - kb)


@triton.jit
def _write_order_keys(
    Q, First, Second, key_base, batch, kv_head, first, stop, nb,
    stride_qb, stride_qh, stride_qd, stride_sb, stride_sh, stride_sn, stride_sd, head_dim,
    SCORE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    INDEX_BITS: tl.constexpr,
):
    """The order keys (:func:`_order_keys`) of blocks ``first <= kb < stop`` to ``key_base[kb]``, ``BLOCK_N`` at a
    time, then a barrier: the keys are read back by other threads of the program."""
    for start in range(first, stop, BLOCK_N):
        kb = start + tl.arange(0, BLOCK_N)
        key = _order_keys(Q, First, Second, batch, kv_head, kb, stop, nb, stride_qb, stride_qh, stride_qd,
                          stride_sb, stride_sh, stride_sn, stride_sd, head_dim, SCORE, GROUP, BLOCK_N, HEAD_DIM,
                          INDEX_BITS)
        tl.store(key_base + kb, key, mask=kb < stop)
    tl.debug_barrier()


@triton.jit
def _rank(keys, Source, first, stop, NO_KEY: tl.constexpr, TILE: tl.constexpr):
    """For each of ``keys`` (int64, distinct where they matter), how many of ``Source[first:stop]`` are larger,
    ``TILE`` of them at a time (read from L2: others' writes are seen)."""
    rank = tl.zeros(keys.shape, tl.int32)
    for start in range(first, stop, TILE):
        j = start + tl.arange(0, TILE)
        other = tl.load(Source + j, mask=j < stop, other=NO_KEY, cache_modifier=".cg")
        rank += tl.sum((other[None, :] > keys[:, None]).to(tl.int32), axis=1)
    return rank


@triton.jit
def _base_row(slot, qb, sinks, window):
    """The base of a table row at ``slot``: the sinks below the window (``slot < min(sinks, qb - window)``), then
    the window ``qb - window .. qb`` (blocks ``>= 0``); ``-1`` everywhere else, the budget's slots included."""
    window_block = qb - window + (slot - sinks)
    return tl.where(slot < sinks, tl.where(slot < qb - window, slot, -1),
                    tl.where((slot < sinks + window + 1) & (window_block >= 0), window_block, -1))


@triton.jit
def _step_table_kernel(
    Q, First, Second, Length, Keys, Out,
    nb, kv_heads, block_size, sinks, window, take, width,
    stride_qb, stride_qh, stride_qd,
    stride_sb, stride_sh, stride_sn, stride_sd,
    head_dim,
    Cache, Centroids, Lo, Hi, Salience, Kept, Last,
    stride_cb, stride_ch, stride_cs, stride_cd,
    stride_tb, stride_th, stride_tn, stride_td,
    stride_ab, stride_ah, stride_an,
    SCORE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, NB_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, ROW_PAD: tl.constexpr, NO_KEY: tl.constexpr, INDEX_BITS: tl.constexpr,
    UPDATE: tl.constexpr, SALIENCE: tl.constexpr, BS_PAD: tl.constexpr, REUSE: tl.constexpr,
):
    """Grid ``(B * H_kv,)``: the table row of lane ``(b, kv_head)``.

    ``Q [B, H, 1, D]`` (any strides); ``First``, ``Second`` ``[B, H_kv, nb, D]`` float32 of one set of strides:
    ``hi``, ``lo`` for ``quest``, the centroids twice for ``centroid``, the kept salience ``[B, H_kv, nb, 1]``
    twice for ``salience`` (its column 0 read), unread for ``none``. ``Length``: one
    integer, the valid keys. ``Keys``: int64 workspace ``[B * H_kv, nb]``. ``Out``: int32 ``[B * H_kv, width]``,
    contiguous. With ``UPDATE``, first :func:`_update_block` from the key cache ``Cache [B, H_kv, S_max, D]``
    into the statistics ``Centroids``, ``Lo``, ``Hi`` (float32, one set of strides) and, with ``SALIENCE``,
    ``Salience [B, H_kv, nb]``; unread otherwise. With ``REUSE``, ``Kept`` int32 ``[B * H_kv, width]`` and
    ``Last`` int64 ``[B * H_kv]``: each lane's last row and the length it was made for."""
    lane = tl.program_id(0)
    batch = lane // kv_heads
    kv_head = lane % kv_heads
    length = tl.load(Length).to(tl.int64)
    if UPDATE:
        _update_block(Cache, Centroids, Lo, Hi, Salience, batch, kv_head, length, block_size, head_dim,
                      stride_cb, stride_ch, stride_cs, stride_cd, stride_tb, stride_th, stride_tn, stride_td,
                      stride_ab, stride_ah, stride_an, SALIENCE, BS_PAD, BLOCK_N, HEAD_DIM)
        tl.debug_barrier()  # the statistics just written are read below by other threads of the program
    # -- the query's block and the candidates sinks <= kb < end, from the length on the device
    qb = tl.where(length > 0, (length - 1) // block_size, -1)
    end = tl.minimum(tl.maximum(qb - window, 0), nb)
    # -- the base: the sinks below the window, then the window up to qb; -1 before block 0
    slot = tl.arange(0, ROW_PAD)
    row = _base_row(slot, qb, sinks, window)
    # -- a kept row (Kept, Last) is reused when nothing it depends on changed since the lane's last step: the
    #    previous step was length - 1, the query's block is the same, and no block completed (the kept
    #    salience changes only then); else the row is computed and kept
    compute = True
    if REUSE:
        last = tl.load(Last + lane)
        compute = (last != length - 1) | (length % block_size == 0) | ((length - 1) % block_size == 0)
    if SCORE != "none":
        if compute:
            # -- every candidate's order key to the workspace, BLOCK_N blocks at a time
            key_base = Keys + lane.to(tl.int64) * nb
            _write_order_keys(Q, First, Second, key_base, batch, kv_head, sinks, end, nb, stride_qb, stride_qh,
                              stride_qd, stride_sb, stride_sh, stride_sn, stride_sd, head_dim,
                              SCORE, GROUP, BLOCK_N, HEAD_DIM, INDEX_BITS)
            # -- the budget: `take` rounds of the largest key (each key is unique: its index breaks ties)
            kb = tl.arange(0, NB_PAD)
            keys = tl.load(key_base + kb, mask=(kb >= sinks) & (kb < end), other=NO_KEY)
            rounds = tl.minimum(take, tl.maximum(end - sinks, 0))
            for r in range(rounds):
                best = tl.max(keys, axis=0)
                block = nb - 1 - (best & ((1 << INDEX_BITS) - 1))
                row = tl.where(slot == sinks + window + 1 + r, block, row)
                keys = tl.where(keys == best, NO_KEY, keys)
    if REUSE:
        kept = tl.load(Kept + lane.to(tl.int64) * width + slot, mask=slot < width, other=-1)
        row = tl.where(compute, row, kept)
        tl.store(Kept + lane.to(tl.int64) * width + slot, row.to(tl.int32), mask=slot < width)
        tl.store(Last + lane, length)
    tl.store(Out + lane.to(tl.int64) * width + slot, row.to(tl.int32), mask=slot < width)


@triton.jit
def _split_table_kernel(
    Q, First, Second, Length, Keys, Partial, Counters, Out,
    nb, kv_heads, block_size, sinks, window, take, width, splits,
    stride_qb, stride_qh, stride_qd,
    stride_sb, stride_sh, stride_sn, stride_sd,
    head_dim,
    Cache, Centroids, Lo, Hi, Salience,
    stride_cb, stride_ch, stride_cs, stride_cd,
    stride_tb, stride_th, stride_tn, stride_td,
    stride_ab, stride_ah, stride_an,
    SCORE: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, ROW_PAD: tl.constexpr, TAKE_LOCAL: tl.constexpr, MERGE_PAD: tl.constexpr,
    LOCAL_TILE: tl.constexpr, MERGE_TILE: tl.constexpr, NO_KEY: tl.constexpr, INDEX_BITS: tl.constexpr,
    UPDATE: tl.constexpr, SALIENCE: tl.constexpr, BS_PAD: tl.constexpr,
):
    """Grid ``(B * H_kv, splits)``: split ``s`` of lane ``(b, kv_head)`` ranks the candidates
    ``sinks + s * CHUNK <= kb < sinks + (s + 1) * CHUNK`` (those below ``end``), and the lane's last split to
    finish merges every split's best into the table row. For the query-aware scores (``quest``, ``centroid``).

    Arguments as :func:`_step_table_kernel`'s, and: ``Partial`` int64 ``[B * H_kv, splits, TAKE_LOCAL]``
    (each split's best keys, best first, then ``NO_KEY``); ``Counters`` int32 ``[B * H_kv]``, zero before the
    launch and left zero. With ``UPDATE``, split 0 writes the statistics of the step's block (the query's block:
    never a candidate) and, with ``SALIENCE``, the kept salience's update (which these scores do not read), so
    no other split reads what it writes."""
    lane = tl.program_id(0)
    split = tl.program_id(1)
    batch = lane // kv_heads
    kv_head = lane % kv_heads
    length = tl.load(Length).to(tl.int64)
    if UPDATE:
        if split == 0:
            _update_block(Cache, Centroids, Lo, Hi, Salience, batch, kv_head, length, block_size, head_dim,
                          stride_cb, stride_ch, stride_cs, stride_cd, stride_tb, stride_th, stride_tn, stride_td,
                          stride_ab, stride_ah, stride_an, SALIENCE, BS_PAD, BLOCK_N, HEAD_DIM)
    qb = tl.where(length > 0, (length - 1) // block_size, -1)
    end = tl.minimum(tl.maximum(qb - window, 0), nb)
    # -- 1. this split's candidates first <= kb < stop: their order keys to the lane's workspace row
    first = sinks + split * CHUNK
    stop = tl.minimum(first + CHUNK, end)
    key_base = Keys + lane.to(tl.int64) * nb
    _write_order_keys(Q, First, Second, key_base, batch, kv_head, first, stop, nb, stride_qb, stride_qh, stride_qd,
                      stride_sb, stride_sh, stride_sn, stride_sd, head_dim, SCORE, GROUP, BLOCK_N, HEAD_DIM,
                      INDEX_BITS)
    # -- 2. the split's best TAKE_LOCAL keys, best first (a key's rank among the split's: how many are larger;
    #    keys are distinct, so the ranks of the n candidates are 0 .. n - 1), NO_KEY in the slots after them
    c = first + tl.arange(0, CHUNK)
    mine = tl.load(key_base + c, mask=c < stop, other=NO_KEY)
    rank = _rank(mine, key_base, first, stop, NO_KEY, LOCAL_TILE)
    part = Partial + (lane.to(tl.int64) * splits + split) * TAKE_LOCAL
    tl.store(part + rank, mine, mask=(c < stop) & (rank < TAKE_LOCAL))
    t = tl.arange(0, TAKE_LOCAL)
    tl.store(part + t, tl.full([TAKE_LOCAL], NO_KEY, tl.int64), mask=t >= stop - first)
    # -- 3. the lane's last split to finish (an acquire-release count) merges: the global rank of each split's
    #    best, the row (the base, the chosen blocks best first, -1 after them), and the count back to zero
    tl.debug_barrier()
    done = tl.atomic_add(Counters + lane, 1, sem="acq_rel", scope="gpu")
    if done == splits - 1:
        tl.debug_barrier()
        lane_part = Partial + lane.to(tl.int64) * splits * TAKE_LOCAL
        m = tl.arange(0, MERGE_PAD)
        best = tl.load(lane_part + m, mask=m < splits * TAKE_LOCAL, other=NO_KEY, cache_modifier=".cg")
        order = _rank(best, lane_part, 0, splits * TAKE_LOCAL, NO_KEY, MERGE_TILE)
        chosen = tl.minimum(take, tl.maximum(end - sinks, 0))
        base = sinks + window + 1
        slot = tl.arange(0, ROW_PAD)
        row = _base_row(slot, qb, sinks, window)
        out = Out + lane.to(tl.int64) * width
        tl.store(out + slot, row.to(tl.int32), mask=(slot < width) & ((slot < base) | (slot >= base + chosen)))
        block = nb - 1 - (best & ((1 << INDEX_BITS) - 1))
        tl.store(out + base + order, block.to(tl.int32), mask=(best != NO_KEY) & (order < chosen))
        tl.store(Counters + lane, 0)


def split_chunk(nb: int, take: int) -> int:
    """Candidates per program of the split ranking (:func:`_split_table_kernel`) for ``nb`` blocks and a budget of
    ``take``: 128 up to 1024 blocks, else 256 (the fastest measured at 32k and 128k keys, B1 and B8, budget 32: 5
    and 9 splits a lane; 64 was slower than one program, the merge then ranking up to 33 lists), made larger
    (to 1024 at most) so that a lane has at most ``max(1, 512 // next_pow2(take))`` splits and its merge ranks
    at most 512 keys when ``take <= 512``."""
    most = max(1, 512 // triton.next_power_of_2(max(take, 1)))
    return min(1024, max(128 if nb <= 1024 else 256, triton.next_power_of_2(-(-nb // most))))


def static_step_table(q: torch.Tensor, first: torch.Tensor, second: torch.Tensor, length: torch.Tensor,
                      score: str, block_size: int, sinks: int, window: int, budget: int,
                      update: tuple | None = None, keep: tuple | None = None, counters: torch.Tensor | None = None,
                      chunk: int | None = None) -> torch.Tensor:
    """A decode step's block table in one launch, no host sync. Trusts its inputs (checked by
    :func:`~topo_attn.selection.static_step.step_block_table`).

    Arguments:
        q: ``[B, H, 1, D]``, floating (any strides), on a CUDA device or (Triton's interpreter) the CPU.
        first, second: float32 ``[B, H_kv, nb, D]`` of the same strides, ``H % H_kv == 0``,
            ``nb < 2**INDEX_BITS``: ``hi`` and ``lo`` for ``quest``, the centroids twice for ``centroid``, the kept
            salience ``[B, H_kv, nb, 1]`` twice for ``salience``, any such tensor for ``none`` (never read).
        length: integer tensor of one element on q's device, the valid keys (read on the device).
        score: one of :data:`SCORES`. block_size: tokens per block, ``>= 1``. sinks, window, budget: ``>= 0``.
        update: None, or ``(cache, centroids, lo, hi, salience)``: first write, in the same launch, the
            statistics of the block the key at ``length - 1`` went into (:meth:`StaticBlockStats.update
            <topo_attn.selection.static_step.StaticBlockStats.update>` of one key): ``cache`` the key cache
            ``[B, H_kv, S_max, D]``; ``centroids``, ``lo``, ``hi`` float32 ``[B, H_kv, nb, D]`` of one set of
            strides; ``salience`` ``[B, H_kv, nb]`` float32 or None (no kept salience).
        keep: None, or ``(kept, last)``, int32 ``[B, H_kv, width]`` and int64 ``[B, H_kv]`` buffers kept
            between steps: a lane's row is taken from ``kept`` when ``last`` holds ``length - 1``, the query's
            block is unchanged and no block completes at this step (for a query-blind score, ``salience`` or
            ``none``, whose rows change only then), else computed; either way written to ``kept`` with ``last =
            length``. ``last = -1`` forces the computation (after any other change to the statistics).
        counters: None, or int32 ``[B * H_kv]`` zeros (left zero by every launch): the query-aware scores
            (``quest``, ``centroid``) are then ranked by several programs per lane (:func:`_split_table_kernel`,
            ``chunk`` candidates each, default :func:`split_chunk`), the last of which merges their best; else
            (and for ``salience`` and ``none``) by one program per lane. Both give the same rows.

    Returns:
        int32 ``[B, H_kv, sinks + window + 1 + budget]``: per lane the sinks ``kb < min(sinks, qb - window)``,
        the window ``qb - window .. qb`` (blocks ``>= 0``), then up to ``budget`` candidates
        ``sinks <= kb < qb - window`` best first (ties to the lower block); ``-1`` in every other slot.
    """
    batch, heads, _, dim = q.shape
    kv_heads, nb = first.shape[1], first.shape[2]
    width = sinks + window + 1 + budget
    out = _empty_table(q, kv_heads, sinks, window, budget)
    keys = torch.empty((batch * kv_heads, nb if score != "none" else 1), dtype=torch.int64, device=q.device)
    head_dim = triton.next_power_of_2(dim)
    cache, centroids, lo, hi, salience = update if update is not None else (first,) * 4 + (None,)
    bars = salience if salience is not None else first[..., 0]
    kept, last = keep if keep is not None else (out, length)
    block_n = max(1, min(64, 4096 // head_dim))
    if counters is not None and score in ("quest", "centroid"):
        take = min(budget, nb)
        chunk = split_chunk(nb, take) if chunk is None else chunk
        splits = -(-nb // chunk)
        take_local = min(triton.next_power_of_2(max(take, 1)), chunk)
        merge_pad = triton.next_power_of_2(splits * take_local)
        partial = torch.empty((batch * kv_heads, splits, take_local), dtype=torch.int64, device=q.device)
        _split_table_kernel[(batch * kv_heads, splits)](
            q, first, second, length, keys, partial, counters, out,
            nb, kv_heads, block_size, sinks, window, take, width, splits,
            q.stride(0), q.stride(1), q.stride(3), *first.stride(),
            dim,
            cache, centroids, lo, hi, bars,
            *cache.stride(), *centroids.stride(), *bars.stride(),
            SCORE=score, GROUP=heads // kv_heads, CHUNK=chunk, BLOCK_N=min(block_n, chunk), HEAD_DIM=head_dim,
            ROW_PAD=triton.next_power_of_2(width), TAKE_LOCAL=take_local, MERGE_PAD=merge_pad,
            LOCAL_TILE=max(1, min(64, 8192 // chunk)), MERGE_TILE=max(1, min(64, 8192 // merge_pad)),
            NO_KEY=_NO_KEY, INDEX_BITS=INDEX_BITS, UPDATE=update is not None, SALIENCE=salience is not None,
            BS_PAD=triton.next_power_of_2(block_size),
            num_warps=4 if max(chunk, merge_pad) <= 256 else 8,
        )
        return out
    nb_pad = triton.next_power_of_2(nb)
    _step_table_kernel[(batch * kv_heads,)](
        q, first, second, length, keys, out,
        nb, kv_heads, block_size, sinks, window, min(budget, nb), width,
        q.stride(0), q.stride(1), q.stride(3), *first.stride(),
        dim,
        cache, centroids, lo, hi, bars, kept, last,
        *cache.stride(), *centroids.stride(), *bars.stride(),
        SCORE=score, GROUP=heads // kv_heads, BLOCK_N=block_n, NB_PAD=nb_pad,
        HEAD_DIM=head_dim, ROW_PAD=triton.next_power_of_2(width), NO_KEY=_NO_KEY, INDEX_BITS=INDEX_BITS,
        UPDATE=update is not None, SALIENCE=salience is not None, BS_PAD=triton.next_power_of_2(block_size),
        REUSE=keep is not None,
        num_warps=4 if nb_pad <= 1024 else 8,
    )
    return out


def _empty_table(q: torch.Tensor, kv_heads: int, sinks: int, window: int, budget: int) -> torch.Tensor:
    """The uninitialised int32 table ``[B, H_kv, sinks + window + 1 + budget]`` on q's device (also what the ops'
    fake implementations return)."""
    return torch.empty((q.shape[0], kv_heads, sinks + window + 1 + budget), dtype=torch.int32, device=q.device)


def score_operands(score: str, centroids: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                   salience: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``first, second`` statistics that :func:`static_step_table` reads for ``score``: ``hi, lo`` for
    ``quest``, the kept salience as a ``[B, H_kv, nb, 1]`` column twice for ``salience``, the centroids twice
    otherwise (``centroid``; unread for ``none``)."""
    if score == "quest":
        return hi, lo
    if score == "salience":  # one value per block: a column of the [B, H_kv, nb, D] layout
        return salience[..., None], salience[..., None]
    return centroids, centroids


@torch.library.custom_op("topo_attn::static_step_table", mutates_args=("counters",))
def static_step_table_op(q: torch.Tensor, first: torch.Tensor, second: torch.Tensor, length: torch.Tensor,
                         counters: torch.Tensor, score: str, block_size: int, sinks: int, window: int,
                         budget: int) -> torch.Tensor:
    """The custom op ``torch.ops.topo_attn.static_step_table``: :func:`static_step_table` with the split ranking's
    ``counters`` (zero before and after; trusts its inputs)."""
    return static_step_table(q, first, second, length, score, block_size, sinks, window, budget, counters=counters)


@static_step_table_op.register_fake
def static_step_table_fake(q, first, second, length, counters, score, block_size, sinks, window, budget):
    return _empty_table(q, first.shape[1], sinks, window, budget)


@torch.library.custom_op("topo_attn::static_step_update_table",
                         mutates_args=("centroids", "lo", "hi", "salience", "kept", "last", "counters"))
def static_step_update_table_op(q: torch.Tensor, cache: torch.Tensor, centroids: torch.Tensor, lo: torch.Tensor,
                                hi: torch.Tensor, salience: torch.Tensor | None, kept: torch.Tensor | None,
                                last: torch.Tensor | None, counters: torch.Tensor, length: torch.Tensor, score: str,
                                block_size: int, sinks: int, window: int, budget: int) -> torch.Tensor:
    """The custom op ``torch.ops.topo_attn.static_step_update_table``: :func:`static_step_table` with the
    statistics' update of the step's key in the same launch (``update=(cache, centroids, lo, hi, salience)``;
    the scores read ``hi, lo``, the centroids twice, or the salience as ``score`` says), reusing the rows kept in
    ``kept``, ``last`` when given (``keep``), the query-aware scores ranked by the split programs (``counters``,
    zero before and after). Writes ``centroids``, ``lo``, ``hi``, ``salience``, ``kept`` and ``last`` in place;
    trusts its inputs."""
    first, second = score_operands(score, centroids, lo, hi, salience)
    return static_step_table(q, first, second, length, score, block_size, sinks, window, budget,
                             update=(cache, centroids, lo, hi, salience),
                             keep=None if kept is None else (kept, last), counters=counters)


@static_step_update_table_op.register_fake
def static_step_update_table_fake(q, cache, centroids, lo, hi, salience, kept, last, counters, length, score,
                                  block_size, sinks, window, budget):
    return _empty_table(q, centroids.shape[1], sinks, window, budget)
