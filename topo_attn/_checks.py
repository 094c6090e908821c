"""Argument and tensor checks shared by every public entry point (a leaf: imports nothing from the package).

Each check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (wrong value or shape)
naming the argument, what was given and what was expected. Everything here runs on the host before any
kernel launch.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import NamedTuple

import torch
from torch.autograd.forward_ad import unpack_dual

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_LANES = 65535  # CUDA grid dimension limit for the (batch * heads) axis


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an ``int`` >= ``minimum``; bools and floats are rejected."""
    if type(value) is not int:  # (the exact type first: the ABC check below costs a microsecond)
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_kernel_block_size(block_size: int) -> None:
    """The kernel needs a power-of-two block size of at least 16 (a tensor-core tile)."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")


def check_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_device_count(name: str, value: object, device: torch.device, owner: str,
                       dtypes: tuple[torch.dtype, ...] | None = None) -> torch.Tensor:
    """``value`` as a count or position kept on the device (a static cache's length, a step's start): a tensor
    of one integer element (of one of ``dtypes`` when given) on ``device``, where ``owner`` (named in the
    message) lives. Reads metadata only, never the value (that would make a step wait for the device)."""
    value = check_tensor(name, value)
    if dtypes is not None and value.dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be an {allowed} tensor, got {value.dtype}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
    if value.numel() != 1:
        raise ValueError(f"{name} must hold one element, got shape {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but {owner} is on {device}; they must be on one device (a "
                         f"host tensor would make the step wait)")
    return value


def check_finite(name: str, value: torch.Tensor) -> None:
    """Reject NaN or Inf entries (one host sync)."""
    raise_unless_finite(name, bool(torch.isfinite(value).all()))


def raise_unless_finite(name: str, finite: bool) -> None:
    """The error of :func:`check_finite`, for callers that read ``torch.isfinite(value).all()`` back in a
    host sync they make anyway."""
    if not finite:
        raise ValueError(f"{name} contains NaN or Inf values; expected finite values")


def check_keys(keys: object, finite: bool = True) -> torch.Tensor:
    """Keys for a schedule builder: a floating tensor ``[S, D]`` or ``[B, H, S, D]``, finite unless
    ``finite=False`` (for callers that check the block centroids instead: one host sync on less data)."""
    keys = check_tensor("keys", keys)
    if keys.ndim not in (2, 4):
        raise ValueError(f"keys must have shape [S, D] or [B, H, S, D], got shape {tuple(keys.shape)}")
    if not keys.is_floating_point():
        raise TypeError(f"keys must be a floating-point tensor, got {keys.dtype}")
    if keys.shape[-2] == 0 or keys.shape[-1] == 0:
        raise ValueError(f"keys must have at least one token and one feature, got shape {tuple(keys.shape)}")
    if finite:
        check_finite("keys", keys)
    return keys


class AttentionShape(NamedTuple):
    """Sizes of a validated attention call; 2-D inputs count as ``B = H = H_kv = 1``. ``seq_len``: the query
    length; ``kv_len``: the key length (equal, except for queries at the end of a longer key sequence)."""

    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    rank: int
    kv_len: int

    @property
    def lanes(self) -> tuple[int, int]:
        return (self.batch, self.heads)


def check_qkv(q: object, k: object, v: object, shorter_q: bool = False) -> AttentionShape:
    """Shapes and dtypes of ``q, k, v``: ``[S, D]`` each, or ``q: [B, H, S, D]`` with
    ``k, v: [B, H_kv, S, D]`` and ``H % H_kv == 0`` (grouped-query attention). With ``shorter_q``, q may hold
    fewer positions than k and v (``q_len <= kv_len``: queries at the end of the key sequence)."""
    q, k, v = check_tensor("q", q), check_tensor("k", k), check_tensor("v", v)
    if q.ndim not in (2, 4):
        raise ValueError(f"q must have shape [S, D] or [B, H, S, D], got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.ndim != q.ndim:
            raise ValueError(f"{name} must have the same rank as q ({q.ndim}), got shape {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have the same dtype as q ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; they must be on the same device")
    if not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor, got {q.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    seq_len, head_dim, kv_len = q.shape[-2], q.shape[-1], k.shape[-2]
    if shorter_q and kv_len < seq_len:
        raise ValueError(
            f"k must hold at least as many positions as q ({seq_len}): the queries are the last q_len "
            f"positions of the key sequence, got k shape {tuple(k.shape)}"
        )
    if not shorter_q and kv_len != seq_len:
        raise ValueError(
            f"k must have the same sequence length as q ({seq_len}) for causal self-attention, "
            f"got k shape {tuple(k.shape)}"
        )
    if k.shape[-1] != head_dim:
        raise ValueError(f"k must have the same head dimension as q ({head_dim}), got k shape {tuple(k.shape)}")
    if seq_len == 0:
        raise ValueError("q must hold at least one token, got sequence length 0")
    if q.ndim == 2:
        return AttentionShape(1, 1, 1, seq_len, head_dim, 2, kv_len)
    batch, heads = q.shape[0], q.shape[1]
    if k.shape[0] != batch:
        raise ValueError(f"k must have the same batch size as q ({batch}), got k shape {tuple(k.shape)}")
    kv_heads = k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the number of query heads ({heads}) must be a multiple of the number of key/value heads "
            f"({kv_heads}), got q shape {tuple(q.shape)} and k shape {tuple(k.shape)}"
        )
    if batch * heads == 0:
        raise ValueError(f"q must have at least one batch and head, got shape {tuple(q.shape)}")
    return AttentionShape(batch, heads, kv_heads, seq_len, head_dim, 4, kv_len)


def check_scale(scale: object, head_dim: int) -> float:
    """Softmax scale: ``None`` means ``1 / sqrt(head_dim)``; otherwise a finite non-zero real."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, Real):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"scale must be finite and non-zero, got {scale}")
    return scale


def check_kernel_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: AttentionShape, schedule,
                        interpreted: bool) -> None:
    """What the Triton kernels need beyond a well-formed call: supported dtype, head dimension and block
    size, a device they can run on, and no forward-mode AD tangents (the backward is reverse mode only;
    inputs may require grad)."""
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32 for the kernel, got {q.dtype}")
    if shape.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head dimension (q.shape[-1]) must be one of {', '.join(map(str, SUPPORTED_HEAD_DIMS))}, "
            f"got {shape.head_dim}"
        )
    check_kernel_block_size(schedule.block_size)
    if shape.batch * shape.heads > MAX_LANES:
        raise ValueError(f"batch * heads must be <= {MAX_LANES}, got {shape.batch * shape.heads}")
    if q.device.type != "cuda" and not interpreted:
        raise ValueError(
            f"q is on {q.device}: the compiled kernel needs CUDA tensors. Without a GPU, set "
            f"TRITON_INTERPRET=1 in the environment before triton is first imported to run the same kernel "
            f"in Triton's interpreter"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if unpack_dual(t).tangent is not None:
            raise ValueError(
                f"{name} is a forward-mode AD dual tensor (torch.autograd.forward_ad), but scheduled_attention "
                f"has no forward-mode derivative; use reverse mode (requires_grad and backward())"
            )
