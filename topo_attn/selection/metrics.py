"""Selection metrics: how much of full causal attention a block schedule keeps.

Metrics (:func:`schedule_quality`), per lane (batch, head) and aggregated, of a schedule against full causal
attention, both computed by the package reference :func:`~topo_attn.dense_masked_attention` (the full one with
:func:`~topo_attn.dense_causal_schedule`), blockwise over query rows so that ``S = 2k`` fits on a CPU and
``S = 16k`` on a GPU:

- *recall*: per query, the share of its causal softmax mass that falls inside its scheduled key tokens. It is
  ``exp(lse_schedule - lse_full)`` exactly (both log-sum-exps come from the reference), averaged over queries;
- *rel_l2*: ``||O_schedule - O_full|| / ||O_full||`` over all queries of the lane;
- *cos_err*: the mean over queries of ``1 - cos(o_schedule, o_full)``;
- *lse_err*: the mean over queries of ``lse_full - lse_schedule`` (``>= 0``; equals ``-log recall`` per query).

:func:`block_attention_mass` gives the true attention mass of every (query block, key block) pair, what the
oracle selector ranks by.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .._checks import check_int, check_qkv
from ..attention import dense_masked_attention
from ..schedule import BlockSchedule, dense_causal_schedule, num_blocks

DEFAULT_CHUNK = 256
"""Query rows per reference call."""


@dataclass(frozen=True)
class Reference:
    """Full causal attention computed once for reuse: ``out [..., S, D]`` and ``lse [..., S]`` (float64)."""

    out: torch.Tensor
    lse: torch.Tensor


@dataclass(frozen=True)
class QualityMetrics:
    """Per-lane metrics, float64 ``[L]`` (``L = B * H``, or 1 for ``[S, D]`` inputs); see the module docstring.
    ``recall_min`` is the lowest per-query recall of the lane; ``blocks_per_row`` the mean scheduled blocks per
    query block."""

    recall: torch.Tensor
    recall_min: torch.Tensor
    rel_l2: torch.Tensor
    cos_err: torch.Tensor
    lse_err: torch.Tensor
    blocks_per_row: float

    def summary(self) -> dict[str, float]:
        """Aggregates over lanes: means, and the lowest ``recall_min``."""
        return {"blocks_per_row": self.blocks_per_row, "recall": float(self.recall.mean()),
                "recall_min": float(self.recall_min.min()), "rel_l2": float(self.rel_l2.mean()),
                "cos_err": float(self.cos_err.mean()), "lse_err": float(self.lse_err.mean())}


def _chunks(seq_len: int, chunk: int) -> Iterable[slice]:
    """Slices of ``chunk`` query rows covering ``0..seq_len``; ``ValueError`` for ``chunk < 1``."""
    chunk = check_int("chunk", chunk, 1)
    return (slice(s, min(s + chunk, seq_len)) for s in range(0, seq_len, chunk))


def _as64(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(torch.float64) for t in ts)


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, scale: float | None = None,
                   chunk: int = DEFAULT_CHUNK) -> Reference:
    """Full causal attention in float64 by the reference, ``chunk`` query rows at a time.

    Arguments:
        q, k, v: as for :func:`~topo_attn.dense_masked_attention`: ``[S, D]`` each, or ``q [B, H, S, D]`` with
            ``k, v [B, H_kv, S, D]``; any floating dtype (converted to float64).
        block_size: the block size of the dense causal schedule, ``>= 1`` (the result does not depend on it).
        scale: the softmax scale, ``1 / sqrt(D)`` when None.
        chunk: query rows per reference call, ``>= 1``.

    Returns:
        :class:`Reference` with ``out`` like ``q`` and ``lse [..., S]``, float64, on ``q``'s device.

    Raises:
        TypeError, ValueError: as the reference, for bad shapes, dtypes or sizes.
    """
    q, k, v = _as64(q, k, v)
    full = dense_causal_schedule(q.shape[-2], block_size, q.device)
    parts = [dense_masked_attention(q, k, v, full, scale, return_lse=True, rows=r) for r in _chunks(q.shape[-2], chunk)]
    return Reference(torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1))


def schedule_quality(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: BlockSchedule,
                     scale: float | None = None, reference: Reference | None = None,
                     chunk: int = DEFAULT_CHUNK) -> QualityMetrics:
    """Metrics of ``schedule`` against full causal attention; everything in float64, ``chunk`` query rows at a
    time.

    Arguments:
        q, k, v: as for :func:`~topo_attn.dense_masked_attention` (``[S, D]``, or ``[B, H, S, D]`` and
            ``[B, H_kv, S, D]``), any floating dtype.
        schedule: a row :class:`~topo_attn.BlockSchedule` for these inputs (shared or one row-set per lane).
        scale: the softmax scale, ``1 / sqrt(D)`` when None.
        reference: full attention from :func:`full_attention` for the same inputs and scale; computed here when
            None.
        chunk: query rows per reference call, ``>= 1``.

    Returns:
        :class:`QualityMetrics`, per lane ``[L]`` (``L = B * H``, 1 for ``[S, D]`` inputs).

    Raises:
        TypeError, ValueError: for q, k, v of bad shapes, dtypes or devices, or a schedule that does not fit them
        (as the reference raises).
    """
    shape = check_qkv(q, k, v)
    q, k, v = _as64(q, k, v)
    if reference is None:
        reference = full_attention(q, k, v, schedule.block_size, scale, chunk)
    seq = shape.seq_len
    lanes = shape.batch * shape.heads
    recall_sum = torch.zeros(lanes, dtype=torch.float64, device=q.device)
    recall_min = torch.ones(lanes, dtype=torch.float64, device=q.device)
    diff_sq = torch.zeros_like(recall_sum)
    ref_sq = torch.zeros_like(recall_sum)
    cos_sum = torch.zeros_like(recall_sum)
    lse_sum = torch.zeros_like(recall_sum)
    for rows in _chunks(seq, chunk):
        out, lse = dense_masked_attention(q, k, v, schedule, scale, return_lse=True, rows=rows)
        ref_out = reference.out[..., rows, :].reshape(lanes, -1, shape.head_dim)
        ref_lse = reference.lse[..., rows].reshape(lanes, -1)
        out, lse = out.reshape(lanes, -1, shape.head_dim), lse.reshape(lanes, -1)
        gap = (ref_lse - lse).clamp_min(0.0)  # the schedule's mass is a part of the full mass
        recall = torch.exp(-gap)
        recall_sum += recall.sum(-1)
        recall_min = torch.minimum(recall_min, recall.min(-1).values)
        lse_sum += gap.sum(-1)
        diff_sq += ((out - ref_out) ** 2).sum((-1, -2))
        ref_sq += (ref_out ** 2).sum((-1, -2))
        cos_sum += (1.0 - torch.nn.functional.cosine_similarity(out, ref_out, dim=-1, eps=1e-30)).sum(-1)
    blocks_per_row = schedule.nnz / schedule.num_rows
    return QualityMetrics(recall_sum / seq, recall_min, torch.sqrt(diff_sq / ref_sq.clamp_min(1e-300)),
                          cos_sum / seq, lse_sum / seq, blocks_per_row)


def block_attention_mass(q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float | None = None,
                         chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """True attention mass per (query block, key block). Entry ``[qb, kb]`` sums, over the queries of block
    ``qb``, the causal softmax probability on the keys of block ``kb``, so a row sums to the number of queries
    in the block.

    Computed by the reference with one-hot block-indicator values (``v[j, c] = 1`` when key ``j`` is in block
    ``c``), ``head_dim`` blocks at a time.

    Arguments:
        q, k: ``[S, D]`` each, or ``q [B, H, S, D]`` and ``k [B, H_kv, S, D]``; any floating dtype.
        block_size: tokens per block, ``>= 1``; ``n = ceil(S / block_size)``.
        scale: the softmax scale, ``1 / sqrt(D)`` when None.
        chunk: query rows per reference call, ``>= 1``.

    Returns:
        float64 ``[n, n]`` for ``[S, D]`` inputs, ``[B, H, n, n]`` otherwise, on ``q``'s device.

    Raises:
        TypeError, ValueError: for bad q, k or sizes.
    """
    check_qkv(q, k, k)
    q, k = _as64(q, k)
    seq, dim = q.shape[-2], q.shape[-1]
    nb = num_blocks(seq, block_size)
    full = dense_causal_schedule(seq, block_size, q.device)
    key_block = torch.arange(seq, device=q.device) // block_size
    qblock = torch.arange(seq, device=q.device) // block_size
    groups = []
    for first in range(0, nb, dim):
        onehot = (key_block[:, None] == first + torch.arange(dim, device=q.device)[None, :]).to(torch.float64)
        v = onehot.expand_as(k)
        probs = torch.cat([dense_masked_attention(q, k, v, full, scale, rows=r) for r in _chunks(seq, chunk)], -2)
        # sum the queries of each query block: [..., n, dim]
        summed = torch.zeros(*probs.shape[:-2], nb, dim, dtype=torch.float64, device=q.device)
        summed.index_add_(-2, qblock, probs)
        groups.append(summed[..., :min(dim, nb - first)])
    return torch.cat(groups, dim=-1)
