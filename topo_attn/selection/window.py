"""``window``: the sinks and the window only; the budget adds nothing (StreamingLLM's pattern)."""

from __future__ import annotations

import torch

from .selector import Selector


def block_scores(q, k, block_size, groups, dtype, **_) -> torch.Tensor:
    """Zeros ``[B, groups, n, n]`` (an expanded view; nothing is added from them)."""
    n = -(-q.shape[-2] // block_size)
    return torch.zeros((), dtype=dtype, device=q.device).expand(q.shape[0], groups, n, n)


def step_scores(q, stats, first, rows, num_rows, seq_len, seed) -> torch.Tensor:
    """Zeros ``[B, H_kv, R, complete]`` (nothing is added from them)."""
    return torch.zeros((), dtype=torch.float64, device=q.device).expand(q.shape[0], stats.centroids.shape[1],
                                                                        num_rows, stats.complete)


SELECTOR = Selector("window", "sinks and window only (no extra blocks)", block_scores, step_scores,
                    adds_blocks=False, static_step=True)
