"""Triton kernel for the key-block centroids of ``topology.block_centroids``: the mean of each block of
``block_size`` key rows, summed in the result's dtype (float32 or float64) and divided by the block's real row
count (``block_size``, or fewer for a partial last block). In the same pass it can also keep the element-wise
minimum and maximum of the block's rows (Quest's page bounds, ``selection.stats.key_block_bounds``).

One program per (block, lane, feature tile): it reads its block's rows in chunks of :data:`ROW_CHUNK`, so the
keys are read once, in their own dtype and strides, with no padded or converted copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...launch import launch
from .pdl import pdl_options, wait_for_inputs

ROW_CHUNK = 64
"""Most key rows a program loads at once; larger blocks are summed over several chunks."""

FEATURE_TILE = 64
"""Most features per program; a wider head dim is split over the grid's third axis."""

NUM_WARPS = 1
"""Warps per program: one was the fastest in an H200 sweep of 1, 2, 4 and 8 (topology/NOTES.md, "Numbers that
were in the code")."""


@triton.jit
def _centroid_kernel(Keys, KeysAt, Out, Lo, Hi, seq, dim, block_size, stride_kl, stride_ks, stride_kd, stride_ol,
                     stride_on, stride_od, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, INDIRECT: tl.constexpr,
                     BOUNDS: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    if INDIRECT:  # -- the keys' address read when the program runs (a CUDA graph replayed for moving keys)
        Keys = tl.load(KeysAt).to(tl.pointer_type(Keys.dtype.element_ty))
    block = tl.program_id(0)
    lane = tl.program_id(1).to(tl.int64)
    start = block.to(tl.int64) * block_size
    count = tl.minimum(seq - start, block_size)  # real rows: fewer in a partial last block
    rows = tl.arange(0, BLOCK_R)
    cols = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    keys = Keys + lane * stride_kl + start * stride_ks + cols[None, :].to(tl.int64) * stride_kd
    acc = tl.zeros([BLOCK_D], Out.dtype.element_ty)
    lo = tl.full([BLOCK_D], float("inf"), Out.dtype.element_ty)
    hi = tl.full([BLOCK_D], float("-inf"), Out.dtype.element_ty)
    for r in range(0, count, BLOCK_R):
        # -- a chunk of rows, masked past the block's end and the head dim, converted and summed over rows
        mask = (r + rows[:, None] < count) & (cols[None, :] < dim)
        x = tl.load(keys + (r + rows[:, None]).to(tl.int64) * stride_ks, mask=mask, other=0.0)
        x = x.to(Out.dtype.element_ty)
        acc += tl.sum(x, 0)
        if BOUNDS:  # -- the element-wise extremes of the real rows
            lo = tl.minimum(lo, tl.min(tl.where(mask, x, float("inf")), 0))
            hi = tl.maximum(hi, tl.max(tl.where(mask, x, float("-inf")), 0))
    # -- the mean, correctly rounded as torch's (fp32 `/` is approximate in Triton, fp64 `/` is not)
    if Out.dtype.element_ty == tl.float32:
        mean = tl.math.div_rn(acc, count.to(tl.float32))
    else:
        mean = acc / count.to(tl.float64)
    at = lane * stride_ol + block.to(tl.int64) * stride_on + cols * stride_od
    tl.store(Out + at, mean, mask=cols < dim)
    if BOUNDS:
        tl.store(Lo + at, lo, mask=cols < dim)
        tl.store(Hi + at, hi, mask=cols < dim)


def block_centroids_kernel(keys: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float64,
                           out: torch.Tensor | None = None, keys_at: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of each block of ``block_size`` key rows, summed in ``dtype``; a partial last block averages its
    real rows. One launch, no host sync.

    Arguments:
        keys: ``[L, S, D]``, any float dtype, any strides, on a CUDA device or (Triton's interpreter) the CPU.
        block_size: rows per block, ``>= 1``.
        dtype: the dtype of the sums and the result, float32 or float64.
        out: an ``[L, n, D]`` tensor of ``dtype`` on the keys' device, any strides, to write into (a CUDA
            graph's input), or None.
        keys_at: an int64 ``[1]`` tensor the kernel can read (device or pinned host memory) holding the address
            of the keys to read when the kernel runs, or None; ``keys`` then only gives their dtype, shape and
            strides.

    Returns:
        ``[L, n, D]`` in ``dtype`` (``out`` if given) with ``n = ceil(S / block_size)``.

    Raises:
        TypeError: ``dtype`` is not float32 or float64.
    """
    _check_dtype(dtype)
    lanes, seq, dim = keys.shape
    if out is None:
        out = torch.empty(lanes, triton.cdiv(seq, block_size), dim, dtype=dtype, device=keys.device)
    _launch(keys, keys_at, out, None, block_size)
    return out


def block_statistics_kernel(keys: torch.Tensor, block_size: int,
                            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean, element-wise minimum and element-wise maximum of each block of ``block_size`` key rows (a
    partial last block: its real rows), in one pass over the keys: ``(mean, lo, hi)``, contiguous ``[L, n, D]``
    each in ``dtype`` (float32 or float64; the extremes are keys, so exact). ``keys``: ``[L, S, D]``, any float
    dtype and strides, on a CUDA device or (Triton's interpreter) the CPU. One launch, no host sync."""
    _check_dtype(dtype)
    lanes, seq, dim = keys.shape
    mean, lo, hi = (torch.empty(lanes, triton.cdiv(seq, block_size), dim, dtype=dtype, device=keys.device)
                    for _ in range(3))
    _launch(keys, None, mean, (lo, hi), block_size)
    return mean, lo, hi


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")


def _launch(keys: torch.Tensor, keys_at: torch.Tensor | None, out: torch.Tensor,
            bounds: tuple[torch.Tensor, torch.Tensor] | None, block_size: int) -> None:
    """:func:`_centroid_kernel` over ``keys [L, S, D]`` into ``out`` (and ``bounds = (lo, hi)``, with ``out``'s
    strides), nothing when ``out`` is empty."""
    if out.numel() == 0:
        return
    lanes, seq, dim = keys.shape
    block_r = min(ROW_CHUNK, triton.next_power_of_2(block_size))
    block_d = min(FEATURE_TILE, triton.next_power_of_2(dim))
    grid = (out.shape[1], lanes, triton.cdiv(dim, block_d))
    lo, hi = bounds if bounds is not None else (out, out)
    launch(_centroid_kernel, grid, (keys, keys if keys_at is None else keys_at, out, lo, hi, seq, dim, block_size,
                                    *keys.stride(), *out.stride()),
           dict(BLOCK_R=block_r, BLOCK_D=block_d, INDIRECT=keys_at is not None, BOUNDS=bounds is not None,
                num_warps=NUM_WARPS, **pdl_options(out.device, lanes)))
