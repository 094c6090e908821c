"""Drop-in replacements for the four functions of triton-lang/kernels#22.

Same names, signatures, int64 ``(offsets, indices)`` schedules and error keywords, so code written against
#22 runs unchanged; underneath they use :class:`~topo_attn.BlockSchedule` and the package's builder,
reference and kernel. Differences: sequence lengths need not be multiples of ``block_size`` in
``dense_masked_attention`` and ``scheduled_attention``; CPU inputs run in Triton's interpreter when
``TRITON_INTERPRET=1`` (#22 rejected them); top-k ties are broken towards the lower block index (#22 left
them to ``torch.topk``).
"""

from __future__ import annotations

import torch

from . import attention
from ._checks import check_int
from .schedule import BlockSchedule, dense_causal_schedule
from .topology import topology_schedule

__all__ = [
    "build_dense_causal_block_schedule",
    "build_topology_block_schedule",
    "dense_masked_attention",
    "scheduled_attention",
]


def _as_int64(schedule: BlockSchedule) -> tuple[torch.Tensor, torch.Tensor]:
    return schedule.offsets.long(), schedule.indices.long()


def _schedule(offsets: torch.Tensor, indices: torch.Tensor, block_size: int, seq_len: int) -> BlockSchedule:
    for name, t in (("offsets", offsets), ("indices", indices)):
        if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got "
                             f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    block_size = check_int("block_size", block_size, 1)
    return BlockSchedule(offsets, indices, block_size, seq_len)


def build_dense_causal_block_schedule(num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower-triangular CSR over ``num_blocks`` blocks: int64 ``offsets [n + 1]``, ``indices [n (n + 1) / 2]``."""
    num_blocks = check_int("num_blocks", num_blocks, 1)
    return _as_int64(dense_causal_schedule(num_blocks, 1))


def build_topology_block_schedule(keys: torch.Tensor, block_size: int, local_radius_blocks: int,
                                  sink_blocks: int, topk_topology_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """#22's builder: keys ``[seq, dim]`` with ``seq % block_size == 0``; int64 CSR on the keys' device."""
    if keys.ndim != 2:
        raise ValueError(f"keys must have shape [seq, dim], got shape {tuple(keys.shape)}")
    if check_int("block_size", block_size) <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if keys.shape[0] % block_size != 0:
        raise ValueError(f"sequence length {keys.shape[0]} must be divisible by block_size {block_size}")
    check_int("local_radius_blocks", local_radius_blocks)
    check_int("sink_blocks", sink_blocks)
    check_int("topk_topology_blocks", topk_topology_blocks)
    return _as_int64(topology_schedule(keys, block_size, local_radius_blocks, sink_blocks, topk_topology_blocks))


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                           indices: torch.Tensor, block_size: int) -> torch.Tensor:
    """#22's reference: q, k, v ``[seq, dim]`` or ``[batch, heads, seq, dim]``, one schedule for all lanes."""
    schedule = _schedule(offsets, indices, block_size, q.shape[-2]).to(q.device)
    return attention.dense_masked_attention(q, k, v, schedule)


def scheduled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                        indices: torch.Tensor, block_size: int) -> torch.Tensor:
    """#22's kernel entry point: q, k, v ``[seq, dim]`` or ``[batch, heads, seq, dim]``, the schedule on
    q's device. Output in q's dtype."""
    if isinstance(block_size, int) and not isinstance(block_size, bool) and block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    schedule = _schedule(offsets, indices, block_size, q.shape[-2])
    return attention.scheduled_attention(q, k, v, schedule)
