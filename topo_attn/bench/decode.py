"""The ``decode`` suite of the benchmark runner: one query token against a long key/value cache, the kit's
scheduled attention (its split-K decode kernel for ``q_len <= 16``) next to SDPA's and FlexAttention's dense
decoding (``python -m topo_attn.bench --suite decode``).

Per case (a :class:`~topo_attn.bench.cases.Case` whose ``seq_len`` is the key/value length ``N``; the query is
one token, the last position, so it sees every key): random q ``[B, H, 1, D]`` and k, v ``[B, H_kv, N, D]`` in
the case's dtype, made on the device, and two schedules of the kit (``q_len=1``):

* ``dense``: every block (:func:`~topo_attn.dense_causal_schedule`, shared by all lanes);
* ``1/8``: per (batch, kv head) lane (lanes ``(B, H_kv)``: one row-set per kv head, shared by its query
  heads) the sink block 0, the last (current, maybe partial) block and random other blocks, ``nb // 8``
  blocks in all (at least those two; seeded, different per lane): :func:`one_in_eight_mask`.

Timed paths (one row each, :func:`run_decode_case`), each with ``median_ms(fn)``:

* ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)``, no mask;
* ``flex``: compiled FlexAttention, ``enable_gqa=True``, the block mask of ``create_block_mask`` for
  ``Q_LEN=1, KV_LEN=N`` with blocks of the case's ``block_size`` (64, not FlexAttention's default 128) and a
  mask_mod that lets the last position see every key (a block mask with heads of 1, so FlexAttention takes its
  decoding kernel);
* ``flex 1/8``: compiled FlexAttention with the ``1/8`` blocks (``BlockMask.from_kv_blocks``, all as full
  blocks). FlexAttention's decoding kernel takes a per-head block mask only without ``enable_gqa``, so the
  group is packed by hand: q viewed as ``[B, H_kv, H / H_kv, D]``, the group's query heads as the query
  rows of their kv head (the same result: one query position, no causal cut inside the blocks);
* ``ours dense`` and ``ours 1/8``: ``topo_attn.scheduled_attention(q, k, v, schedule)``.

A failing FlexAttention path is reported on stderr; its row holds ``ms=None`` and ``failure`` (the message).
``select_step(q, k)``, when given, is timed too (``select_ms`` with ``select_timer``, eagerly; and
``select_timed_ms`` with the suite's timer, a CUDA-graph replay with ``--timer graph``; in every row of the
case): a per-step block selection next to the attention it serves.

Bytes a call must read (:func:`decode_bytes`): q and the output, plus for a schedule the scheduled K and V
tokens (real token counts: the last block may be partial) of each (batch, kv head) lane, counted once per kv
head (the kit packs a kv head's query heads; :func:`scheduled_kv_reads`) and the CSR metadata
(:func:`metadata_bytes`); for SDPA and dense FlexAttention all of K and V; FlexAttention adds the block counts
and indices of its block mask that it reads (:func:`block_mask_bytes`). TB/s divide those bytes by the time;
``peak_fraction`` is over the GPU's datasheet peak (:func:`peak_tbps_for`; the runner passes it),
``copy_fraction`` over a device-to-device copy measured in the same process (:func:`device_copy_tbps`, bytes
read + written; pass ``copy_tbps`` to skip it).

Errors (``max_abs_error``, float32, on batches 0 and ``B - 1``): dense paths against float32 SDPA, ``1/8``
paths against float32 :func:`~topo_attn.dense_masked_attention` with the same blocks.

Row fields: the case's (``case``, ``suite``, ``batch``, ``heads``, ``kv_heads``, ``q_len``, ``kv_len``,
``head_dim``, ``block_size``, ``dtype``, ``kv_blocks`` = ``B * H_kv * nb``, ``flex_block_size``); the path's
(``path``, ``schedule``, ``ms``, ``failure``, ``scheduled_blocks`` and ``kv_tokens`` read over the kv lanes,
``scheduled_fraction`` of the blocks, ``kv_bytes``, ``metadata_bytes``, ``bytes``, ``tbps``, ``peak_fraction``,
``copy_fraction``, ``max_abs_error`` and its ``error_reference``, ``speedup_vs_sdpa`` = SDPA's time over the
path's, ``speedup_vs_flex`` = dense FlexAttention's over the path's); and the case's comparisons, the same in
each of its rows (``peak_tbps``, ``copy_tbps``, ``select_ms``, ``sdpa_over_ours_sparse``,
``flex_over_ours_sparse``, ``ours_dense_over_sdpa``, the ``goal_*`` fields). Not measured: None.

Goals, checked per case (``goal_*`` fields, ✓/✗ in :func:`decode_markdown`; None where not applicable or
not measured):

* ``goal_bandwidth``: ours ``1/8`` reaches >= 70% of the HBM peak on the bytes it must read
  (:data:`GOAL_PEAK_FRACTION`);
* ``goal_vs_sdpa``, ``goal_vs_flex``: at 128k keys (:data:`GOAL_SPEEDUP_KV_LEN`) ours ``1/8`` is >= 5x faster
  than SDPA's dense decode and than FlexAttention's dense decoding (:data:`GOAL_SPEEDUP`);
* ``goal_dense_vs_sdpa``: ours ``dense`` takes at most 1.2x SDPA's time (:data:`GOAL_DENSE_OVER_SDPA`).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable

import torch

from .cases import Case
from .table import markdown_header, shown

Q_LEN = 1
"""Query tokens per decode step."""

DATASHEET_TBPS = {"H200": 4.8, "H100 80GB HBM3": 3.35, "H100 NVL": 3.9, "H100 PCIe": 2.0}
"""Datasheet HBM bandwidth (TB/s) by a part of the GPU's name, for :func:`peak_tbps_for`."""
HBM_PEAK_TBPS = DATASHEET_TBPS["H200"]
"""The H200's datasheet HBM3e bandwidth, TB/s (the default peak)."""


def peak_tbps_for(gpu_name: str) -> float:
    """The datasheet HBM bandwidth of the GPU called ``gpu_name`` (``torch.cuda.get_device_name()``), TB/s:
    the first entry of :data:`DATASHEET_TBPS` whose key is in the name; :data:`HBM_PEAK_TBPS` (the H200's)
    for a GPU not listed."""
    return next((tbps for part, tbps in DATASHEET_TBPS.items() if part in gpu_name), HBM_PEAK_TBPS)

GOAL_PEAK_FRACTION = 0.70
GOAL_SPEEDUP = 5.0
GOAL_SPEEDUP_KV_LEN = 131072
GOAL_DENSE_OVER_SDPA = 1.2

SPARSE = "1/8"
"""The name of the sparse schedule (and the suffix of its paths)."""

PATHS = ("sdpa", "flex", f"flex {SPARSE}", "ours dense", f"ours {SPARSE}")
"""The timed paths, in the order of a case's rows (the FlexAttention ones only ``with_flex``)."""

DECODE_COLUMNS = ["case", "path", "blocks read", "MB read", "ms", "TB/s", "of peak", "of copy", "SDPA / this",
                  "flex / this", "max abs error", "select ms", "≥70% peak", "≥5x SDPA", "≥5x flex",
                  "≤1.2x SDPA"]


# ------------------------------------------------------------------------------------------- the schedule
def one_in_eight_mask(batch: int, kv_heads: int, nb: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A bool block mask ``[batch, kv_heads, 1, nb]`` for one query row per (batch, kv head) lane: the sink
    block 0, the last block ``nb - 1`` and random others drawn from ``generator`` (independently per lane),
    ``min(nb, max(2, nb // 8))`` blocks per lane. On the CPU (move it where it is needed)."""
    budget = min(nb, max(2, nb // 8))
    mask = torch.zeros(batch, kv_heads, 1, nb, dtype=torch.bool)
    mask[..., 0] = True
    mask[..., nb - 1] = True
    others = budget - min(nb, 2)
    if others > 0:
        scores = torch.rand(batch, kv_heads, nb - 2, generator=generator)
        picked = scores.topk(others, dim=-1).indices + 1  # among blocks 1 .. nb - 2
        mask[:, :, 0].scatter_(-1, picked, True)
    return mask


# --------------------------------------------------------------------------------------------- the bytes
def _entry_lanes(schedule) -> torch.Tensor:
    """The lane (0 .. ``num_lanes - 1``) of every entry of ``schedule`` (int64 ``[nnz]``): rows are
    lane-major, the same number per lane."""
    rows = schedule.offsets.numel() - 1
    per_lane = rows // schedule.num_lanes
    counts = (schedule.offsets[1:] - schedule.offsets[:-1]).long()
    lanes = torch.arange(rows, device=schedule.device) // per_lane
    return torch.repeat_interleave(lanes, counts, output_size=schedule.nnz)


def scheduled_kv_reads(schedule, batch: int, heads: int, kv_heads: int, packed_group: bool = False) -> tuple[int, int]:
    """Key blocks and key tokens (= value blocks and tokens) a call with ``schedule`` must read, summed over
    the key/value lanes: per lane the union over its rows of the scheduled blocks, each at its real token
    count (``min(block_size, seq_len - j * block_size)``: the last block may be partial). A shared schedule
    counts its blocks once for each of the ``batch x kv_heads`` kv lanes, and lanes ``(B, H_kv)`` their own:
    the kit's decode kernel reads a kv head's block once for the query heads that share it. Lanes ``(B, H)``
    (per query head) count every query head's blocks (the kernel gives each its own program there), or with
    ``packed_group`` the union over a kv head's query heads."""
    bs, seq_len, nb = schedule.block_size, schedule.seq_len, schedule.num_blocks
    lane = _entry_lanes(schedule)
    if schedule.lanes is None:
        repeat = batch * kv_heads
    elif tuple(schedule.lanes) == (batch, kv_heads):
        repeat = 1
    elif tuple(schedule.lanes) == (batch, heads):
        repeat = 1
        if packed_group:
            group = heads // kv_heads
            lane = (lane // heads) * kv_heads + (lane % heads) // group
    else:
        raise ValueError(f"schedule lanes {schedule.lanes} are neither (B, H) = {(batch, heads)} nor "
                         f"(B, H_kv) = {(batch, kv_heads)}")
    blocks = torch.unique(lane * nb + schedule.indices.long()) % nb
    tokens = torch.clamp(seq_len - blocks * bs, max=bs)
    return blocks.numel() * repeat, int(tokens.sum()) * repeat


def metadata_bytes(schedule) -> int:
    """Bytes of the schedule's CSR tensors (``offsets`` and ``indices``)."""
    return sum(t.numel() * t.element_size() for t in (schedule.offsets, schedule.indices))


def block_mask_bytes(block_mask) -> int:
    """Bytes a FlexAttention forward reads of a ``BlockMask``: its block counts (``kv_num_blocks`` and
    ``full_kv_num_blocks``) and the block indices they use (``kv_indices`` and ``full_kv_indices`` are padded
    to the number of blocks; only the first ``count`` of each row are read)."""
    total = 0
    for num, indices in ((block_mask.kv_num_blocks, block_mask.kv_indices),
                         (block_mask.full_kv_num_blocks, block_mask.full_kv_indices)):
        if num is not None:
            total += num.numel() * num.element_size() + int(num.sum()) * indices.element_size()
    return total


def decode_bytes(q: torch.Tensor, kv_tokens: int, head_dim: int, itemsize: int, metadata: int = 0) -> int:
    """Bytes a decode call must read and write: ``kv_tokens`` key and as many value tokens of ``head_dim``
    elements of ``itemsize`` bytes, q, the output (q's size) and ``metadata`` bytes."""
    return 2 * kv_tokens * head_dim * itemsize + 2 * q.numel() * q.element_size() + metadata


@functools.lru_cache(maxsize=None)
def device_copy_tbps(median_ms: Callable[[Callable[[], object]], float], device: str = "cuda",
                     nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, TB/s: ``dst.copy_(src)`` of ``nbytes`` (default 2 GiB) timed with
    ``median_ms``, bytes read + written over the time. Measured once per process for each (timer, device,
    size) and cached."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------------------ FlexAttention
def flex_decoders(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, block_size: int,
                  flex: Callable | None = None) -> dict[str, tuple[Callable[[], torch.Tensor], int]]:
    """The FlexAttention decode calls of a case, ``{path: (call, block-mask bytes)}`` for ``"flex"`` (dense,
    ``enable_gqa``, a block mask with batch and heads of 1 from ``create_block_mask``) and ``"flex 1/8"``
    (``mask``'s blocks, ``[B, H_kv, 1, nb]``, with the group packed as query rows: see the module's
    docstring). ``flex`` is the FlexAttention function (default the eager ``flex_attention``; pass a
    compiled one to time it). Each call returns ``[B, H, 1, D]``."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

    flex = flex_attention if flex is None else flex
    B, H, _, D = q.shape
    H_kv, N = k.shape[1], k.shape[2]
    group = H // H_kv

    def every_key(b, h, q_idx, kv_idx):  # the one query is the last position: causal sees every key
        return kv_idx <= q_idx + (N - 1)

    dense_mask = create_block_mask(every_key, None, None, Q_LEN, N, device=q.device, BLOCK_SIZE=block_size)

    mask = mask.to(q.device)
    full_num = mask.sum(dim=-1, dtype=torch.int32)  # [B, H_kv, 1]
    full_idx = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # scheduled first
    blocks = mask[:, :, 0]

    def scheduled(b, h, q_idx, kv_idx):  # what eager FlexAttention reads; compiled, the full blocks skip it
        return blocks[b, h, kv_idx // block_size]

    sparse_mask = BlockMask.from_kv_blocks(torch.zeros_like(full_num), torch.zeros_like(full_idx), full_num,
                                           full_idx, BLOCK_SIZE=block_size, mask_mod=scheduled,
                                           seq_lengths=(group, N))
    packed = q.reshape(B, H_kv, group, D)  # heads h = kv * group + g: the group's heads as query rows
    return {
        "flex": (lambda: flex(q, k, v, block_mask=dense_mask, enable_gqa=True), block_mask_bytes(dense_mask)),
        f"flex {SPARSE}": (lambda: flex(packed, k, v, block_mask=sparse_mask).view(B, H, Q_LEN, D),
                           block_mask_bytes(sparse_mask)),
    }


# -------------------------------------------------------------------------------------------------- a case
def quest_step(case: Case, sinks: int = 1, window: int = 1) -> Callable:
    """A decode step's block selection for ``case``, ``select_step(q, k)``: Quest's bound per key/value head
    (:func:`~topo_attn.selection.incremental.select_for_queries`) with statistics kept across calls (a
    :class:`~topo_attn.selection.incremental.KeyBlockStats`, as a ``TopoCache`` keeps them: the first call reads
    every complete block, later calls none), at the ``1/8`` schedule's size (``nb // 8`` blocks per row: the
    sinks, the window with the current block, and the rest chosen)."""
    from ..schedule import num_blocks
    from ..selection.incremental import KeyBlockStats, select_for_queries

    stats = KeyBlockStats(case.block_size)
    budget = max(0, num_blocks(case.seq_len, case.block_size) // 8 - sinks - window - 1)

    def select_step(q: torch.Tensor, k: torch.Tensor):
        return select_for_queries("quest", q, k, case.block_size, sinks, window, budget, stats)
    return select_step


def run_decode_case(case: Case, median_ms: Callable, with_flex: bool = True, device: str = "cuda",
                    select_step: Callable | None = None, copy_tbps: float | None = None,
                    peak_tbps: float = HBM_PEAK_TBPS, seed: int = 20260705,
                    select_timer: Callable | None = None) -> list[dict]:
    """Rows (one per timed path of :data:`PATHS`, the FlexAttention ones only ``with_flex``) for ``case`` (its
    ``seq_len`` is the key/value length; one query token) on ``device``. ``median_ms(fn)`` times a call.
    ``select_step(q, k)``, when given, is timed as ``select_ms``. ``copy_tbps``: the device's copy
    bandwidth, measured with :func:`device_copy_tbps` (once per process) when None; pass a number to skip
    the measurement (NaN: no ``copy_fraction``). ``peak_tbps``: the bandwidth ``peak_fraction`` is over.
    ``seed`` draws the inputs and the ``1/8`` blocks. ``select_timer`` times ``select_step`` (default
    ``median_ms``; a selection syncs with the host, so it cannot be timed as a CUDA graph).

    Needs the kit's decode API: ``dense_causal_schedule(..., q_len=1)``, ``BlockSchedule.from_block_mask(...,
    q_len=1)`` with lanes ``(B, H_kv)``, and :func:`~topo_attn.scheduled_attention` /
    :func:`~topo_attn.dense_masked_attention` on such schedules."""
    import torch.nn.functional as F

    import topo_attn as ta

    dtype = getattr(torch, case.dtype)
    B, H, H_kv, N, D, bs = case.batch, case.heads, case.kv_heads, case.seq_len, case.head_dim, case.block_size
    nb = ta.num_blocks(N, bs)
    if copy_tbps is None:
        copy_tbps = device_copy_tbps(median_ms, str(device))
    gen = torch.Generator(device=device).manual_seed(seed + N + B)
    q = torch.randn(B, H, Q_LEN, D, device=device, dtype=dtype, generator=gen)
    k = torch.randn(B, H_kv, N, D, device=device, dtype=dtype, generator=gen)
    v = torch.randn(B, H_kv, N, D, device=device, dtype=dtype, generator=gen)
    mask = one_in_eight_mask(B, H_kv, nb, torch.Generator().manual_seed(seed + N + B))
    dense = ta.dense_causal_schedule(N, bs, device, q_len=Q_LEN)
    sparse = ta.BlockSchedule.from_block_mask(mask.to(device), bs, seq_len=N, q_len=Q_LEN)

    # references, float32, on batches 0 and B - 1 (a wrong batch stride shows; a full B = 8, 128k float32
    # reference would take tens of GB)
    sample = sorted({0, B - 1})
    qs, ks, vs = (t[sample].float() for t in (q, k, v))
    dense_ref = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
    sample_schedule = ta.BlockSchedule.from_block_mask(mask[sample].to(device), bs, seq_len=N, q_len=Q_LEN)
    sparse_ref = ta.dense_masked_attention(qs, ks, vs, sample_schedule)
    del qs, ks, vs

    def error(out: torch.Tensor, reference: torch.Tensor) -> float:
        return (out[sample].float() - reference).abs().max().item()

    itemsize = k.element_size()
    all_kv = (B * H_kv * nb, B * H_kv * N)  # (blocks, tokens) of all of K
    sparse_reads = scheduled_kv_reads(sparse, B, H, H_kv)
    calls = {  # path: (call, reference, (kv blocks, kv tokens) read, metadata bytes)
        "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), dense_ref, all_kv, 0),
        "ours dense": (lambda: ta.scheduled_attention(q, k, v, dense), dense_ref,
                       scheduled_kv_reads(dense, B, H, H_kv), metadata_bytes(dense)),
        f"ours {SPARSE}": (lambda: ta.scheduled_attention(q, k, v, sparse), sparse_ref, sparse_reads,
                           metadata_bytes(sparse)),
    }
    failures: dict[str, str] = {}
    if with_flex:
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.reset()  # a fresh compile per case: past 8 shapes dynamo would fall back to eager
        try:
            flex = flex_decoders(q, k, v, mask, bs, torch.compile(flex_attention, dynamic=False))
        except Exception as exc:  # report, do not hide: the rows show None and the reason
            flex, message = {}, f"{type(exc).__name__}: {exc}"
            failures = {"flex": message, f"flex {SPARSE}": message}
            calls.update({p: (None, None, all_kv if p == "flex" else sparse_reads, 0) for p in failures})
        for path, (call, meta) in flex.items():
            reads, reference = (all_kv, dense_ref) if path == "flex" else (sparse_reads, sparse_ref)
            calls[path] = (call, reference, reads, meta)

    results: dict[str, dict] = {}
    for path in (p for p in PATHS if p in calls):
        call, reference, (blocks, tokens), meta = calls[path]
        ms = err = None
        if path not in failures:
            try:
                err = error(call(), reference)  # (FlexAttention compiles here)
                ms = median_ms(call)
            except Exception as exc:
                if not path.startswith("flex"):
                    raise
                failures[path] = f"{type(exc).__name__}: {exc}"
        if path in failures:
            print(f"  {path} failed on {case.name}: {failures[path][:200]}", file=sys.stderr)
        nbytes = decode_bytes(q, tokens, D, itemsize, meta)
        tbps = None if ms is None else nbytes / (ms * 1e-3) / 1e12
        results[path] = dict(
            path=path, schedule=SPARSE if path.endswith(SPARSE) else "dense", ms=ms, failure=failures.get(path),
            scheduled_blocks=blocks, scheduled_fraction=blocks / all_kv[0], kv_tokens=tokens,
            kv_bytes=2 * tokens * D * itemsize, metadata_bytes=meta, bytes=nbytes, tbps=tbps,
            peak_fraction=None if tbps is None else tbps / peak_tbps,
            copy_fraction=None if tbps is None else tbps / copy_tbps, max_abs_error=err,
            error_reference="dense_masked_attention float32" if path.endswith(SPARSE) else "sdpa float32")
    select_ms = select_timed_ms = None
    if select_step is not None:
        select_ms = (select_timer or median_ms)(lambda: select_step(q, k))
        try:  # with the suite's timer too (a CUDA graph with --timer graph: steady-state steps do not sync)
            select_timed_ms = median_ms(lambda: select_step(q, k))
        except Exception as exc:  # report, do not hide
            print(f"  select_step with the suite's timer failed on {case.name}: {exc}", file=sys.stderr)

    def ms_of(path: str) -> float | None:
        return results[path]["ms"] if path in results else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    sdpa_ms, flex_ms, ours_ms, ours_dense_ms = ms_of("sdpa"), ms_of("flex"), ms_of(f"ours {SPARSE}"), ms_of(
        "ours dense")
    sparse_row = results[f"ours {SPARSE}"]
    at_goal_length = N >= GOAL_SPEEDUP_KV_LEN

    def at_least(value: float | None, goal: float, applies: bool = True) -> bool | None:
        return None if value is None or not applies or math.isnan(value) else value >= goal

    shared = dict(
        case=case.name, suite="decode", batch=B, heads=H, kv_heads=H_kv, q_len=Q_LEN, kv_len=N, head_dim=D,
        block_size=bs, dtype=case.dtype, kv_blocks=B * H_kv * nb, flex_block_size=bs if with_flex else None,
        peak_tbps=peak_tbps, copy_tbps=copy_tbps, select_ms=select_ms, select_timed_ms=select_timed_ms,
        sdpa_over_ours_sparse=ratio(sdpa_ms, ours_ms), flex_over_ours_sparse=ratio(flex_ms, ours_ms),
        ours_dense_over_sdpa=ratio(ours_dense_ms, sdpa_ms),
    )
    shared.update(
        goal_bandwidth=at_least(sparse_row["peak_fraction"], GOAL_PEAK_FRACTION),
        goal_vs_sdpa=at_least(shared["sdpa_over_ours_sparse"], GOAL_SPEEDUP, at_goal_length),
        goal_vs_flex=at_least(shared["flex_over_ours_sparse"], GOAL_SPEEDUP, at_goal_length),
        goal_dense_vs_sdpa=None if shared["ours_dense_over_sdpa"] is None
        else shared["ours_dense_over_sdpa"] <= GOAL_DENSE_OVER_SDPA,
    )
    return [dict(shared, **r, speedup_vs_sdpa=ratio(sdpa_ms, r["ms"]), speedup_vs_flex=ratio(flex_ms, r["ms"]))
            for r in results.values()]


# -------------------------------------------------------------------------------------------- the table
def decode_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_decode_case`): one line per path; the goals' ✓/✗ on
    the row they concern (bandwidth and speed-ups on ``ours 1/8``, the speed-ups at 128k keys only, the dense
    bound on ``ours dense``), empty where not applicable or not measured; a failed path shows ``failed``."""
    def mark(value: bool | None) -> str:
        return "" if value is None else ("✓" if value else "✗")

    lines = markdown_header(DECODE_COLUMNS, left=2)
    for r in rows:
        sparse_kit, dense_kit = r["path"] == f"ours {SPARSE}", r["path"] == "ours dense"
        ms = "failed" if r.get("failure") else shown(r["ms"], ".3f")
        lines.append(
            f"| {r['case']} | {r['path']} | {r['scheduled_blocks']} / {r['kv_blocks']} | {r['bytes'] / 1e6:.1f} | "
            f"{ms} | {shown(r['tbps'], '.2f')} | {shown(r['peak_fraction'], '.0%')} | "
            f"{shown(r['copy_fraction'], '.0%')} | {shown(r['speedup_vs_sdpa'], '.2f', 'x')} | "
            f"{shown(r['speedup_vs_flex'], '.2f', 'x')} | {shown(r['max_abs_error'], '.1e')} | "
            f"{shown(r['select_ms'], '.3f') if sparse_kit else ''} | "
            f"{mark(r['goal_bandwidth']) if sparse_kit else ''} | {mark(r['goal_vs_sdpa']) if sparse_kit else ''} | "
            f"{mark(r['goal_vs_flex']) if sparse_kit else ''} | {mark(r['goal_dense_vs_sdpa']) if dense_kit else ''} |")
    return "\n".join(lines)
