"""Helpers shared by the kernel tests (tests/test_attention.py, tests/test_backward.py): random inputs, random
valid schedules, and the per-dtype error bound."""

from __future__ import annotations

import torch

import topo_attn as ta

# Error bound per dtype: a few units of the dtype's rounding (output and P are rounded to it), fp32 tight.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4 * 2.0**-10, torch.bfloat16: 4 * 2.0**-7}


def inputs(shape_q, shape_kv, dtype, device, seed):
    """Fresh random ``q, k, v`` (``torch.randn``, drawn on the CPU so every device sees the same values)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=gen).to(device, dtype)
    k = torch.randn(shape_kv, generator=gen).to(device, dtype)
    v = torch.randn(shape_kv, generator=gen).to(device, dtype)
    return q, k, v


def random_schedule(gen: torch.Generator, seq_len: int, block_size: int, lanes=None, density: float = 0.4,
                    diagonal: bool | None = None, device="cpu") -> ta.BlockSchedule:
    """A random valid schedule: random causal blocks, at least one per row; the diagonal is present in some
    rows and absent in others unless ``diagonal`` says otherwise."""
    n = ta.num_blocks(seq_len, block_size)
    shape = (n, n) if lanes is None else (*lanes, n, n)
    mask = (torch.rand(shape, generator=gen) < density).tril()
    eye = torch.eye(n, dtype=torch.bool)
    if diagonal is True:
        mask |= eye
    elif diagonal is False:
        mask &= ~eye
        mask[..., 0, 0] = True  # row 0 can only hold block 0
    empty = ~mask.any(-1)  # rows left empty get one random causal block
    pick = (torch.rand(shape[:-1], generator=gen) * (torch.arange(n) + 1)).long()
    mask |= empty[..., None] & (torch.arange(n) == pick[..., None])
    return ta.BlockSchedule.from_block_mask(mask, block_size, seq_len).to(device)
