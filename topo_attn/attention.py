"""``scheduled_attention``: causal attention that visits only the scheduled key blocks."""

from __future__ import annotations

import torch

from .schedule import BlockSchedule
from .validation import check_kernel_inputs, check_qkv, check_scale, check_schedule_for


def scheduled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: BlockSchedule,
                        scale: float | None = None, return_lse: bool = False):
    """Causal softmax attention over the key blocks that ``schedule`` lists for each query block, computed
    by a Triton kernel (on CUDA, or in Triton's interpreter on the CPU when ``TRITON_INTERPRET=1`` was set
    before triton was imported).

    q: ``[S, D]`` or ``[B, H, S, D]`` (float16 | bfloat16 | float32); k, v: ``[S, D]`` or
    ``[B, H_kv, S, D]`` with ``H % H_kv == 0`` (grouped-query attention); D in {16, 32, 64, 128, 256}; any
    S. schedule: a :class:`BlockSchedule` for sequence length S, shared or with lanes ``(B, H)``, on q's
    device, block size a power of two >= 16. scale: defaults to ``1 / sqrt(D)``.

    Returns the output in q's shape and dtype and, with ``return_lse``, the per-query log-sum-exp (natural
    log, float32, ``[S]`` or ``[B, H, S]``). Equal to :func:`dense_masked_attention` up to rounding.
    Not differentiable yet: inputs that require grad raise ``ValueError``."""
    from .kernels.forward import INTERPRETED, scheduled_attention_forward  # triton is imported on first use

    shape = check_qkv(q, k, v)
    check_schedule_for(schedule, shape, q.device)
    scale = check_scale(scale, shape.head_dim)
    check_kernel_inputs(q, k, v, shape, schedule, INTERPRETED)
    if shape.rank == 2:
        q, k, v = q[None, None], k[None, None], v[None, None]
    out, lse = scheduled_attention_forward(q, k, v, schedule.offsets, schedule.indices, schedule.block_size,
                                           schedule.is_shared, scale, return_lse)
    if shape.rank == 2:
        out, lse = out[0, 0], (lse[0, 0] if lse is not None else None)
    return (out, lse) if return_lse else out
