"""The Gluon Hopper forward (``attention/hopper.py``) against the float64 reference and the portable Triton
forward: dtypes, head dims, block sizes, partial last blocks, shared and per-lane schedules, GQA, queries at
the end of longer keys, the log-sum-exp. Each GPU test skips with :func:`hopper_unsupported_reason`'s words
when the Gluon path does not apply (no Hopper GPU, another triton, the interpreter)."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from helpers import DEVICE, TOLERANCE, inputs, random_schedule  # in tests/
from topo_attn.attention import hopper


def _skip_unless_supported(q, k, v, schedule) -> None:
    reason = hopper.hopper_unsupported_reason(q, k, v, schedule)
    if reason is not None:
        pytest.skip(reason)


def _check_against_references(q, k, v, schedule, scale=None, config=None):
    """Out and lse of the Gluon kernel (``config``: a tile configuration other than the default) against the
    float64 reference (the dtype's error bound) and against the portable Triton forward (twice that bound:
    both round P and the output)."""
    from topo_attn.attention import forward

    dtype = q.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out, lse = hopper.hopper_forward(q, k, v, schedule, scale, True, config)
    assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    ref, ref_lse = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule, scale=scale,
                                             return_lse=True)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-5)
    portable, portable_lse = forward.scheduled_attention_forward(q, k, v, schedule, scale, True)
    torch.testing.assert_close(out.float(), portable.float(), atol=2 * tol, rtol=2 * tol)
    torch.testing.assert_close(lse, portable_lse, atol=1e-4, rtol=1e-5)
    out_only, no_lse = hopper.hopper_forward(q, k, v, schedule, scale, False, config)
    assert no_lse is None
    torch.testing.assert_close(out_only, out, atol=0, rtol=0)


def test_cpu_tensors_give_a_reason():
    """Never raises, and says why on CPU tensors (with or without a schedule)."""
    q = torch.randn(1, 1, 128, 64)
    assert isinstance(hopper.hopper_unsupported_reason(q, q, q, None), str)
    schedule = ta.dense_causal_schedule(128, 64)
    assert isinstance(hopper.hopper_unsupported_reason(q, q, q, schedule), str)
    assert isinstance(hopper.hopper_unsupported_reason(None, None, None, None), str)


@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-lane"])
@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_topology_schedule_matches_references(dtype, D, block_size, per_lane):
    """B 2, H 4, H_kv 2 (GQA), S not a multiple of the block (partial last block)."""
    B, H, H_kv, S = 2, 4, 2, 700
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), dtype, DEVICE, seed=S * D + block_size)
    keys = k.repeat_interleave(H // H_kv, dim=1)
    schedule = ta.topology_schedule(keys, block_size, window=1, sinks=1, topk=2,
                                    shared_lane=None if per_lane else (0, 0))
    _skip_unless_supported(q, k, v, schedule)
    _check_against_references(q, k, v, schedule)


@pytest.mark.parametrize("lanes", ["shared", "query heads", "kv heads"])
@pytest.mark.parametrize("diagonal", [True, None], ids=["diagonal", "some-diagonal"])
@pytest.mark.parametrize("block_size", [64, 128, 256])
def test_random_schedules_match_references(block_size, diagonal, lanes):
    """Random causal block masks: every row with its diagonal, or rows with and without it; shared,
    ``(B, H)`` and ``(B, H_kv)`` lanes; a block larger than the 128-row tile."""
    B, H, H_kv, S, D = 2, 4, 2, 1000, 128
    gen = torch.Generator().manual_seed(block_size + len(lanes))
    lane_shape = {"shared": None, "query heads": (B, H), "kv heads": (B, H_kv)}[lanes]
    schedule = random_schedule(gen, S, block_size, lanes=lane_shape, density=0.4, diagonal=diagonal, device=DEVICE)
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), torch.bfloat16, DEVICE, seed=block_size)
    _skip_unless_supported(q, k, v, schedule)
    _check_against_references(q, k, v, schedule)


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("lanes", ["shared", "kv heads"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("block_size", [128, 256])
def test_one_or_two_consumer_partitions(block_size, D, lanes, consumers):
    """128-row tiles with one consumer partition or two (each owning 64 rows, released stages counted
    twice); rows with and without the diagonal, a partial last block, GQA."""
    B, H, H_kv, S = 2, 4, 2, 1000
    gen = torch.Generator().manual_seed(block_size + D + consumers)
    schedule = random_schedule(gen, S, block_size, lanes=None if lanes == "shared" else (B, H_kv), density=0.4,
                               diagonal=None, device=DEVICE)
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), torch.float16, DEVICE, seed=block_size + D)
    _skip_unless_supported(q, k, v, schedule)
    _check_against_references(q, k, v, schedule, config=hopper.tile_config(block_size, D, consumers))


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_queries_at_the_end_of_longer_keys(dtype, block_size):
    """``L < S`` with ``S - L`` a multiple of the tile (256): bottom-right causal alignment."""
    B, H, H_kv, S, D = 2, 4, 2, 777, 64
    q_len = S - 256
    q, k, v = inputs((B, H, q_len, D), (B, H_kv, S, D), dtype, DEVICE, seed=q_len)
    gen = torch.Generator().manual_seed(q_len)
    schedule = random_schedule(gen, S, block_size, lanes=(B, H), density=0.5, device=DEVICE, q_len=q_len)
    _skip_unless_supported(q, k, v, schedule)
    _check_against_references(q, k, v, schedule)


def test_dense_schedule_and_custom_scale():
    """Every causal block (long rows: many trips around the K/V ring) and a non-default scale."""
    B, H, S, D = 1, 2, 2048 + 17, 128
    q, k, v = inputs((B, H, S, D), (B, H, S, D), torch.bfloat16, DEVICE, seed=3)
    schedule = ta.dense_causal_schedule(S, 128, device=DEVICE)
    _skip_unless_supported(q, k, v, schedule)
    _check_against_references(q, k, v, schedule, scale=0.05)


def test_strided_inputs():
    """A ``[B, S, H, D]`` layout viewed as ``[B, H, S, D]``: TMA addresses it without a copy, and the output
    comes back in the same layout (a model's ``[B, S, H, D]`` output needs no transposing copy)."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 300, 4, 64, generator=gen).to(DEVICE, torch.float16).transpose(1, 2)
               for _ in range(3))
    schedule = ta.topology_schedule(k.float(), 64, window=1, sinks=1, topk=1)
    _skip_unless_supported(q, k, v, schedule)
    _check_against_references(q, k, v, schedule)
    out, _ = hopper.hopper_forward(q, k, v, schedule, 0.125, False)
    assert out.stride() == q.stride() and out.transpose(1, 2).is_contiguous()


@pytest.mark.cuda
def test_reasons_on_a_gpu():
    """Unsupported calls get a reason naming what is wrong (meaningful on a Hopper GPU with triton 3.6)."""
    q, k, v = inputs((1, 2, 256, 64), (1, 2, 256, 64), torch.bfloat16, "cuda", seed=1)
    schedule = ta.dense_causal_schedule(256, 64, device="cuda")
    _skip_unless_supported(q, k, v, schedule)
    why = hopper.hopper_unsupported_reason
    assert "dtype" in why(q.float(), k.float(), v.float(), schedule)
    q96 = torch.zeros(1, 2, 256, 96, device="cuda", dtype=torch.bfloat16)
    assert "head dim 96" in why(q96, q96, q96, schedule)
    assert "block size 32" in why(q, k, v, ta.dense_causal_schedule(256, 32, device="cuda"))
    short = q[:, :, :200]
    assert "aligned" in why(short, k, v, ta.dense_causal_schedule(256, 64, device="cuda", q_len=200))
    odd = torch.zeros(1, 2, 256, 65, device="cuda", dtype=torch.bfloat16)[..., 1:]
    assert "TMA" in why(odd, odd, odd, schedule)


def test_the_kernel_choice_says_why(device):
    """``forward_kernel`` is the one place that picks the forward: without a Hopper GPU and triton 3.6 the
    portable kernel runs with the reason; ``kernel="hopper"`` then raises that reason before any launch;
    ``kernel="portable"`` equals the default where the default is portable; another name raises."""
    q, k, v = inputs((1, 2, 200, 64), (1, 1, 200, 64), torch.float16, device, seed=21)
    schedule = random_schedule(torch.Generator().manual_seed(21), 200, 64, device=device)
    name, reason = ta.forward_kernel(q, k, v, schedule, 0.125)
    assert (name, reason) == (("hopper", None) if reason is None else ("portable", reason))
    assert ta.forward_kernel(q, k, v, schedule, 0.125, "portable") == ("portable", "asked for")
    assert ta.forward_kernel(q, k, v, schedule, -0.125)[0] == "portable"
    with pytest.raises(ValueError, match="kernel must be one of 'auto', 'portable', 'hopper', got 'gluon'"):
        ta.scheduled_attention(q, k, v, schedule, kernel="gluon")
    if name == "portable":
        with pytest.raises(ValueError, match=f"kernel='hopper' cannot run this call: {reason}"):
            ta.scheduled_attention(q, k, v, schedule, kernel="hopper")
    out = ta.scheduled_attention(q, k, v, schedule)
    ref = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule)
    torch.testing.assert_close(out.double(), ref, atol=TOLERANCE[torch.float16], rtol=TOLERANCE[torch.float16])
    portable = ta.scheduled_attention(q, k, v, schedule, kernel="portable")
    if name == "portable":
        assert torch.equal(out, portable)
    else:
        torch.testing.assert_close(out.float(), portable.float(), atol=2 * TOLERANCE[torch.float16], rtol=0)
