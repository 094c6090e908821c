"""``scheduled_attention``: causal attention that visits only the scheduled key blocks, differentiable
w.r.t. q, k and v."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._checks import check_kernel_inputs, check_qkv, check_scale
from ..schedule import BlockSchedule, check_schedule_for


FORWARD_KERNELS = ("auto", "portable", "hopper")
"""The ``kernel`` choices of :func:`scheduled_attention` (see :func:`forward_kernel`)."""


def forward_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: BlockSchedule, scale: float,
                   kernel: str = "auto") -> tuple[str, str | None]:
    """The forward kernel a call of :func:`scheduled_attention` runs, and why not the other: the one place
    that picks it. ``("hopper", None)``: the Gluon warp-specialised forward
    (:mod:`topo_attn.attention.hopper`); ``("portable", reason)``: the Triton forward
    (:mod:`topo_attn.attention.forward`), with why the Hopper one does not apply (``"asked for"`` when
    ``kernel="portable"``).

    ``kernel``: ``"auto"`` takes the Hopper kernel where it applies (a Hopper GPU, triton 3.6, fp16/bf16, head
    dim 64 or 128, ...; :func:`~topo_attn.attention.hopper.hopper_unsupported_reason`), else the portable one;
    ``"portable"`` always the portable one; ``"hopper"`` the Hopper one or a ``ValueError`` with the reason.
    Inputs are those of :func:`scheduled_attention`, already validated. Raises ``ValueError`` for another
    ``kernel``. No device synchronisation."""
    if kernel not in FORWARD_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(map(repr, FORWARD_KERNELS))}, got {kernel!r}")
    if kernel == "portable":
        return "portable", "asked for"
    from .hopper import hopper_unsupported_reason

    reason = hopper_unsupported_reason(q, k, v, schedule)
    if reason is None and scale < 0:
        reason = "a negative softmax scale"
    if reason is not None and kernel == "hopper":
        raise ValueError(f"kernel='hopper' cannot run this call: {reason}")
    return ("hopper", None) if reason is None else ("portable", reason)


def _forward(kernel: str, q, k, v, schedule: BlockSchedule, scale: float, return_lse: bool):
    """Launch the forward ``kernel`` (``"hopper"`` or ``"portable"``, from :func:`forward_kernel`)."""
    if kernel == "hopper":
        from .hopper import hopper_forward

        return hopper_forward(q, k, v, schedule, scale, return_lse)
    from .forward import scheduled_attention_forward

    return scheduled_attention_forward(q, k, v, schedule, scale, return_lse)


class _ScheduledAttention(torch.autograd.Function):
    """Forward and backward Triton kernels on validated ``[B, H, S, D]`` inputs. The forward saves
    ``q, k, v, out`` and the log-sum-exp; the backward recomputes the probabilities from them. The
    log-sum-exp output is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, schedule: BlockSchedule, scale: float, kernel: str, backward_path: str):
        out, lse = _forward(kernel, q, k, v, schedule, scale, True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.schedule, ctx.scale, ctx.backward_path = schedule, scale, backward_path
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable  # a second derivative raises instead of silently giving a wrong one
    def backward(ctx, d_out, _d_lse):
        from . import backward

        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward.scheduled_attention_backward(d_out, q, k, v, out, lse, ctx.schedule, ctx.scale,
                                                           needs=tuple(ctx.needs_input_grad[:3]),
                                                           path=ctx.backward_path)
        return dq, dk, dv, None, None, None, None


def _decode_queries() -> int:
    from .decode import MAX_DECODE_QUERIES

    return MAX_DECODE_QUERIES


def decode_kernel_reason(q_len: int, kv_len: int, grad: bool, kernel: str = "auto") -> str | None:
    """Why a call of :func:`scheduled_attention` with ``q_len`` queries at the end of ``kv_len`` keys does not
    run the split-K decode kernel (:mod:`topo_attn.attention.decode`), or ``None`` when it does: the one place
    that decides. The decode kernel takes a decode step, ``q_len < kv_len`` and ``q_len <=``
    :data:`~topo_attn.attention.decode.MAX_DECODE_QUERIES` (16), without gradients (``grad``: autograd is on
    and an input requires grad; it has no backward) and with ``kernel="auto"``; any other call runs the
    forward kernel that :func:`forward_kernel` picks. Raises nothing; imports triton (the decode module)."""
    if grad:
        return "gradients are needed (the decode kernel has no backward)"
    if kernel != "auto":
        return f"kernel={kernel!r} asked for"
    if q_len >= kv_len:
        return "not a decode step (the queries span the whole sequence, L = S)"
    if q_len > _decode_queries():
        return f"{q_len} queries, more than the decode kernel's {_decode_queries()}"
    return None


def autocast_inputs(q, k, v) -> tuple:
    """``q, k, v`` as attention runs them under ``torch.autocast``: in autocast's dtype for q's device type when
    autocast is enabled there, as SDPA runs (floating tensors only; anything else is left for the checks), else
    unchanged. Inside a model under autocast the rotary embedding leaves q and k in float32 while v comes out of
    its projection in bfloat16; without this the kernels would refuse the mix, or run a float32 model's
    attention in float32 (several times slower than in bfloat16)."""
    if not isinstance(q, torch.Tensor) or not torch.is_autocast_enabled(q.device.type):
        return q, k, v
    dtype = torch.get_autocast_dtype(q.device.type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in (q, k, v))


def scheduled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: BlockSchedule,
                        scale: float | None = None, return_lse: bool = False, *, deterministic: bool = True,
                        kernel: str = "auto"):
    """Causal softmax attention over the key blocks that ``schedule`` lists for each query block, computed
    by Triton kernels (on CUDA, or in Triton's interpreter on the CPU when ``TRITON_INTERPRET=1`` was set
    before triton was imported).

    q: ``[L, D]`` or ``[B, H, L, D]`` (float16 | bfloat16 | float32); k, v: ``[S, D]`` or
    ``[B, H_kv, S, D]`` with ``H % H_kv == 0`` (grouped-query attention) and ``L <= S``; D in
    {16, 32, 64, 128, 256}; any lengths. Query ``i`` sits at position ``S - L + i`` (bottom-right causal; ``L ==
    S`` for a whole sequence). schedule: a :class:`BlockSchedule` for ``seq_len = S`` and ``q_len = L``, shared
    or with lanes ``(B, H)`` or ``(B, H_kv)``, on q's device, block size a power of two >= 16. scale: defaults
    to ``1 / sqrt(D)``.

    Kernels: a forward kernel (one program per query tile: on a Hopper GPU with triton 3.6 the Gluon
    warp-specialised one where it applies, else the portable Triton one; ``kernel`` = ``"auto"``,
    ``"portable"`` or ``"hopper"``, and :func:`forward_kernel` says which runs and why), or, with
    ``kernel="auto"`` for decode steps (``L < S`` and ``L <=``
    :data:`topo_attn.attention.decode.MAX_DECODE_QUERIES` = 16) without gradients, the split-K decode kernel
    (the scheduled key blocks of each lane spread over programs, the query heads of a key/value head packed in
    one tile when the schedule is shared or per key/value head; :func:`decode_kernel_reason` decides).

    Under ``torch.autocast`` (enabled for q's device type) q, k and v are first cast to autocast's dtype, as SDPA
    does (:func:`autocast_inputs`), and the output comes in that dtype.

    Returns the output in q's shape and dtype and, with ``return_lse``, the per-query log-sum-exp (natural
    log, float32, ``[L]`` or ``[B, H, L]``). Equal to :func:`dense_masked_attention` up to rounding.

    Differentiable w.r.t. q, k and v (a Triton backward pass; gradients come back in the inputs' shapes and
    dtypes). By default the backward runs without atomics, bit for bit reproducible; ``deterministic=False``
    accumulates dQ with atomic adds in float32 (its last bits may vary between runs; measured slower today, see
    ``attention/NOTES.md``) unless ``torch.use_deterministic_algorithms(True)`` is in force
    (:func:`topo_attn.attention.backward.backward_path` decides). The schedule carries no
    gradient, and the returned log-sum-exp is not differentiable (it is marked so: backpropagating through it
    alone raises). Second derivatives are not supported and raise.

    Raises ``TypeError`` / ``ValueError`` naming the argument, before any launch, for bad shapes, dtypes,
    devices (CPU tensors without ``TRITON_INTERPRET=1``), forward-mode dual tensors, k shorter than q, a
    schedule built for another key or query length, lanes or device, a non-finite, zero or non-float
    scale, a ``deterministic`` that is not a bool, and a ``kernel`` not in :data:`FORWARD_KERNELS` or
    ``kernel="hopper"`` where the Hopper kernel does not apply (the message says why)."""
    from .forward import INTERPRETED  # triton is imported on first use

    q, k, v = autocast_inputs(q, k, v)
    shape = check_qkv(q, k, v, shorter_q=True)
    check_schedule_for(schedule, shape, q.device)
    scale = check_scale(scale, shape.head_dim)
    check_kernel_inputs(q, k, v, shape, schedule, INTERPRETED)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {type(deterministic).__name__}")
    if shape.rank == 2:
        q, k, v = q[None, None], k[None, None], v[None, None]
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    decode = decode_kernel_reason(shape.seq_len, shape.kv_len, grad, kernel) is None
    name = None if decode else forward_kernel(q, k, v, schedule, scale, kernel)[0]
    if grad:
        from .backward import backward_path

        out, lse = _ScheduledAttention.apply(q, k, v, schedule, scale, name, backward_path(deterministic))
    elif decode:
        from . import decode as decoding  # a few queries at the end of the keys: the split-K decode kernel

        out, lse = decoding.scheduled_decode_forward(q, k, v, schedule.offsets, schedule.index_buffer,
                                                     schedule.block_size, schedule.first_query_block,
                                                     0 if schedule.lanes is None else schedule.lanes[1], scale,
                                                     return_lse)
    else:
        out, lse = _forward(name, q, k, v, schedule, scale, return_lse)
    if shape.rank == 2:
        out, lse = out[0, 0], (lse[0, 0] if lse is not None else None)
    return (out, lse) if return_lse else out
