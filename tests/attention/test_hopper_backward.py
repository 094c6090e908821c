"""The Gluon Hopper backward kernels (dK/dV: ``attention/hopper_backward.py``; dQ: ``attention/hopper_dq.py``)
against the float64 reference and the portable Triton kernels: dtypes, head dims, block sizes, a partial last
block, shared, per-query-head and per-key/value-head schedules, GQA, a padded schedule. Each GPU test skips with
:func:`hopper_backward_unsupported_reason`'s words when the Gluon path does not apply (no Hopper GPU, another
triton, the interpreter); the CPU tests check that it says so and that asking for it there fails before any
launch."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
import topo_attn.attention.backward as backward
from helpers import DEVICE, TOLERANCE, inputs, padded_copy, random_schedule, reference_grads  # in tests/
from topo_attn.attention import hopper_backward, hopper_dq


def _gradients(q, k, v, schedule, d_out, kernel):
    """(dq, dk, dv) of the kit's backward with the given dQ and dK/dV kernels, after the kit's forward."""
    scale = q.shape[-1] ** -0.5
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    return backward.scheduled_attention_backward(d_out, q, k, v, out, lse, schedule, scale,
                                                 dkdv_kernel=kernel, dq_kernel=kernel)


def _check(q, k, v, schedule, seed):
    reason = hopper_backward.hopper_backward_unsupported_reason(q, k, v, schedule)
    if reason is not None:
        pytest.skip(reason)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device, q.dtype)
    dq, dk, dv = _gradients(q, k, v, schedule, d_out, "hopper")
    _, (ref_dq, ref_dk, ref_dv) = reference_grads(q, k, v, schedule, d_out)
    pdq, pdk, pdv = _gradients(q, k, v, schedule, d_out, "portable")
    tol = TOLERANCE[q.dtype]
    for name, grad, ref, portable in (("dq", dq, ref_dq, pdq), ("dk", dk, ref_dk, pdk), ("dv", dv, ref_dv, pdv)):
        assert grad.dtype == q.dtype and grad.shape == ref.shape and torch.isfinite(grad).all(), name
        size = ref.abs().max().item()
        assert size > 0, "a zero reference gradient would test nothing"
        torch.testing.assert_close(grad.double(), ref, atol=tol * size, rtol=tol, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(grad.float(), portable.float(), atol=2 * tol * size, rtol=2 * tol,
                                   msg=lambda m: f"{name} vs portable: {m}")


def test_float32_gives_a_reason_and_asking_fails_before_any_launch(monkeypatch):
    """float32 inputs (any device: on the CPU the interpreter is the reason, on a GPU the dtype)."""
    q, k, v = inputs((1, 2, 128, 64), (1, 1, 128, 64), torch.float32, DEVICE, seed=0)
    schedule = ta.dense_causal_schedule(128, 64, DEVICE)
    reason = hopper_backward.hopper_backward_unsupported_reason(q, k, v, schedule)
    assert isinstance(reason, str) and reason
    assert isinstance(hopper_backward.hopper_backward_unsupported_reason(None, None, None, None), str)
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    monkeypatch.setattr(backward, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match="dkdv_kernel='hopper' cannot run this call: "):
        backward.scheduled_attention_backward(out, q, k, v, out, lse, schedule, 0.125, dkdv_kernel="hopper")
    with pytest.raises(ValueError, match="dkdv_kernel must be one of 'auto', 'portable', 'hopper', got 'gluon'"):
        backward.scheduled_attention_backward(out, q, k, v, out, lse, schedule, 0.125, dkdv_kernel="gluon")
    with pytest.raises(ValueError, match="dq_kernel='hopper' cannot run this call: "):
        backward.scheduled_attention_backward(out, q, k, v, out, lse, schedule, 0.125, dq_kernel="hopper",
                                              needs=(True, False, False))
    with pytest.raises(ValueError, match="dq_kernel must be one of 'auto', 'portable', 'hopper', got None"):
        backward.scheduled_attention_backward(out, q, k, v, out, lse, schedule, 0.125, dq_kernel=None)


@pytest.mark.parametrize("lanes", ["shared", "query heads", "kv heads"])
@pytest.mark.parametrize("block_size", [64, 128, 256])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_random_schedules_match_references(dtype, D, block_size, lanes):
    """B 2, H 4, H_kv 2 (GQA), S 700 (a partial last block), rows with and without their diagonal."""
    B, H, H_kv, S = 2, 4, 2, 700
    seed = D + block_size + len(lanes)
    lane_shape = {"shared": None, "query heads": (B, H), "kv heads": (B, H_kv)}[lanes]
    schedule = random_schedule(torch.Generator().manual_seed(seed), S, block_size, lanes=lane_shape, density=0.4,
                               device=DEVICE)
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), dtype, DEVICE, seed=seed)
    _check(q, k, v, schedule, seed)


def test_a_padded_schedule_and_a_model_layout():
    """A padded schedule (junk past its entries) and q, k, v as a model lays them out (``[B, S, H, D]`` memory)."""
    B, H, H_kv, S, D = 1, 8, 2, 1024, 64
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in
               inputs((B, H, S, D), (B, H_kv, S, D), torch.bfloat16, DEVICE, seed=3))
    schedule = random_schedule(torch.Generator().manual_seed(3), S, 64, lanes=(B, H_kv), device=DEVICE)
    _check(q, k, v, padded_copy(schedule, 37), seed=4)


def _form_case(D, consumers, H_kv, schedule_seed, out_seed, **density):
    """One consumer-form case (B 1, H 4, S 600, blocks of 128, per-query-head rows, bf16): ``(q, k, v, schedule,
    d_out, lse, delta)``, or a skip with the reason where the Gluon backward cannot run."""
    B, H, S, block_size = 1, 4, 600, 128
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), torch.bfloat16, DEVICE, seed=D + consumers)
    schedule = random_schedule(torch.Generator().manual_seed(schedule_seed), S, block_size, lanes=(B, H),
                               device=DEVICE, **density)
    reason = hopper_backward.hopper_backward_unsupported_reason(q, k, v, schedule)
    if reason is not None:
        pytest.skip(reason)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(out_seed)).to(DEVICE, q.dtype)
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    return q, k, v, schedule, d_out, lse, (out.float() * d_out.float()).sum(-1)


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipelined"])
@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("D", [64, 128])
def test_both_consumer_forms_match_the_reference(D, consumers, pipeline):
    """One consumer warp group per 64-key tile, or two sharing each Q/dO stage of a 128-key tile, each plain or
    with the dK product of a step under the next step's exponentials, through ``hopper_dkdv`` with its
    configuration given. GQA (a group of 4: each head's column ends its own pipeline)."""
    q, k, v, schedule, d_out, lse, delta = _form_case(D, consumers, 1, D, 1)
    config = hopper_backward.dkdv_tile_config(schedule.block_size, D, consumers, pipeline)
    dk, dv = hopper_backward.hopper_dkdv(q, k, v, d_out, lse, delta, schedule.transpose(), D ** -0.5, config)
    _, (_, ref_dk, ref_dv) = reference_grads(q, k, v, schedule, d_out)
    tol = TOLERANCE[q.dtype]
    for grad, ref in ((dk, ref_dk), (dv, ref_dv)):
        size = ref.abs().max().item()
        assert size > 0
        torch.testing.assert_close(grad.double(), ref, atol=tol * size, rtol=tol)


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("D", [64, 128])
def test_both_dq_consumer_forms_match_the_reference(D, consumers):
    """dQ by one consumer warp group per 64-row tile or two per 128-row tile, through ``hopper_dq`` with its
    configuration given; blocks of 128, GQA, per-query-head rows, a partial last block."""
    q, k, v, schedule, d_out, lse, delta = _form_case(D, consumers, 2, D + 1, 2, density=0.5)
    config = hopper_dq.dq_tile_config(schedule.block_size, D, consumers)
    dq = hopper_dq.hopper_dq(q, k, v, d_out, lse, delta, schedule, D ** -0.5, config)
    _, (ref_dq, _, _) = reference_grads(q, k, v, schedule, d_out)
    size = ref_dq.abs().max().item()
    assert size > 0
    tol = TOLERANCE[q.dtype]
    torch.testing.assert_close(dq.double(), ref_dq, atol=tol * size, rtol=tol)
