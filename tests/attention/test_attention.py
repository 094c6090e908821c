"""The Triton kernel against the float64 reference: shapes, dtypes, GQA, odd lengths, block sizes, shared and
per-lane schedules, random valid CSR schedules. On the CPU the kernel runs in Triton's interpreter."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topo_attn as ta
from helpers import TOLERANCE, inputs as _inputs, random_schedule as _random_schedule  # in tests/


def _check(out, ref, dtype):
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


CASES = [
    # B, H, H_kv, S, D, block_size, dtype
    (1, 1, 1, 128, 64, 64, torch.float16),
    (2, 2, 2, 97, 32, 16, torch.float16),
    (1, 4, 2, 200, 64, 32, torch.bfloat16),
    (1, 4, 1, 256, 16, 128, torch.float32),
    (2, 2, 1, 160, 128, 64, torch.bfloat16),
    (1, 1, 1, 300, 256, 128, torch.float16),
    (1, 2, 2, 77, 256, 16, torch.float32),
    (1, 3, 3, 129, 32, 32, torch.float32),
]


@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-lane"])
@pytest.mark.parametrize("B,H,H_kv,S,D,block_size,dtype", CASES)
def test_topology_schedule_matches_reference(B, H, H_kv, S, D, block_size, dtype, per_lane, device):
    q, k, v = _inputs((B, H, S, D), (B, H_kv, S, D), dtype, device, seed=S * D + H)
    keys = k.repeat_interleave(H // H_kv, dim=1)
    schedule = ta.topology_schedule(keys, block_size, window=1, sinks=1, topk=2,
                                    shared_lane=None if per_lane else (0, 0))
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    ref, ref_lse = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule, return_lse=True)
    _check(out, ref, dtype)
    assert lse.dtype == torch.float32 and lse.shape == (B, H, S)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    seq_len=st.integers(1, 260),
    block_size=st.sampled_from([16, 32, 64, 128]),
    head_dim=st.sampled_from([16, 32, 64]),
    heads=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2)]),
    per_lane=st.booleans(),
    diagonal=st.sampled_from([None, True, False]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
)
def test_random_valid_schedules_match_reference(seed, seq_len, block_size, head_dim, heads, per_lane, diagonal,
                                                dtype):
    """Any valid CSR schedule, not only topology ones: rows with and without the diagonal block, partial last
    blocks, lengths shorter than one block."""
    from helpers import DEVICE

    H, H_kv = heads
    gen = torch.Generator().manual_seed(seed)
    schedule = _random_schedule(gen, seq_len, block_size, lanes=(1, H) if per_lane else None,
                                diagonal=diagonal, device=DEVICE)
    q, k, v = _inputs((1, H, seq_len, head_dim), (1, H_kv, seq_len, head_dim), dtype, DEVICE, seed)
    out = ta.scheduled_attention(q, k, v, schedule)
    _check(out, ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule), dtype)


@pytest.mark.parametrize("S,D,block_size", [(200, 64, 32), (64, 16, 64), (97, 128, 16)])
def test_two_dimensional_inputs(S, D, block_size, device):
    q, k, v = _inputs((S, D), (S, D), torch.float16, device, seed=S)
    schedule = ta.topology_schedule(k, block_size, window=0, sinks=1, topk=1)
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    assert out.shape == (S, D) and lse.shape == (S,)
    ref, ref_lse = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule, return_lse=True)
    _check(out, ref, torch.float16)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-5)


def test_dense_schedule_equals_full_causal_attention(device):
    """With every causal block scheduled the kernel is plain causal attention (checked with torch's SDPA)."""
    q, k, v = _inputs((2, 2, 150, 64), (2, 2, 150, 64), torch.float32, device, seed=7)
    out = ta.scheduled_attention(q, k, v, ta.dense_causal_schedule(150, 32, device=device))
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    _check(out, expected, torch.float32)


def test_custom_scale(device):
    q, k, v = _inputs((1, 2, 96, 32), (1, 2, 96, 32), torch.float32, device, seed=3)
    schedule = ta.dense_causal_schedule(96, 32, device=device)
    out = ta.scheduled_attention(q, k, v, schedule, scale=0.05)
    _check(out, ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule, scale=0.05), torch.float32)
    assert not torch.allclose(out, ta.scheduled_attention(q, k, v, schedule), atol=1e-3)


def test_autocast_runs_attention_in_its_dtype(device):
    """Under torch.autocast, as inside a model (q and k float32 after the rotary embedding, v bfloat16 from its
    projection), the inputs are cast to autocast's dtype like SDPA's: the output is the kernel's on the cast
    inputs (bit for bit, and near the float64 reference), the gradients come back in each input's dtype and equal
    the cast run's, and without autocast the mix is refused."""
    q, k, v = _inputs((1, 2, 96, 32), (1, 2, 96, 32), torch.float32, device, seed=5)
    v = v.to(torch.bfloat16)
    schedule = ta.dense_causal_schedule(96, 32, device=device)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    grad_out = torch.randn(1, 2, 96, 32, generator=torch.Generator().manual_seed(6)).to(device, torch.bfloat16)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out = ta.scheduled_attention(q, k, v, schedule)
    assert out.dtype == torch.bfloat16
    out.backward(grad_out)
    q2, k2 = (t.detach().to(torch.bfloat16).requires_grad_(True) for t in (q, k))
    v2 = v.detach().clone().requires_grad_(True)
    want = ta.scheduled_attention(q2, k2, v2, schedule)
    want.backward(grad_out)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    _check(out, ta.dense_masked_attention(q2.double(), k2.double(), v2.double(), schedule), torch.bfloat16)
    assert (q.grad.dtype, k.grad.dtype, v.grad.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    for got, cast in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(got, cast.to(got.dtype), atol=0, rtol=0)
    with pytest.raises(TypeError, match="v must have the same dtype as q"):
        ta.scheduled_attention(q, k, v, schedule)


def test_non_contiguous_inputs(device):
    """Strides are runtime arguments: a [B, S, H, D] layout viewed as [B, H, S, D] needs no copy."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 130, 4, 32, generator=gen).to(device, torch.float16).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    schedule = ta.topology_schedule(k.float(), 32, window=1, sinks=0, topk=1)
    out = ta.scheduled_attention(q, k, v, schedule)
    _check(out, ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule), torch.float16)


def test_unscheduled_blocks_are_never_read(device):
    """Changing keys and values in blocks that the last query block does not schedule must leave that block's
    output bit for bit unchanged."""
    S, block_size = 256, 32
    q, k, v = _inputs((1, 2, S, 64), (1, 2, S, 64), torch.float16, device, seed=5)
    schedule = ta.topology_schedule(k, block_size, window=0, sinks=0, topk=1, shared_lane=(0, 0))
    last = schedule.num_blocks - 1
    unused = (~schedule.to_block_mask()[last]).nonzero().flatten().tolist()
    assert len(unused) >= 5, "the last row should skip most key blocks"
    out = ta.scheduled_attention(q, k, v, schedule)
    k2, v2 = k.clone(), v.clone()
    for b in unused:
        k2[..., b * block_size:(b + 1) * block_size, :] = 1e4
        v2[..., b * block_size:(b + 1) * block_size, :] = float("nan")
    rows = slice(last * block_size, S)
    assert torch.equal(ta.scheduled_attention(q, k2, v2, schedule)[..., rows, :], out[..., rows, :])


def test_output_is_fully_written(device):
    """Every output element is written: a NaN-poisoned buffer would show through; compare two layouts."""
    q, k, v = _inputs((1, 1, 333, 32), (1, 1, 333, 32), torch.float32, device, seed=9)
    schedule = ta.topology_schedule(k, 64, window=1, sinks=1, topk=1)
    out = ta.scheduled_attention(q, k, v, schedule)
    assert torch.isfinite(out).all()
    out_2d = ta.scheduled_attention(q[0, 0], k[0, 0], v[0, 0], schedule)
    torch.testing.assert_close(out[0, 0], out_2d, atol=0, rtol=0)


def test_per_lane_schedules_differ_per_head(device):
    """One row-set per lane really is applied per lane: head 1 with head 0's schedule gives another answer."""
    B, H, S = 1, 2, 256
    q, k, v = _inputs((B, H, S, 32), (B, H, S, 32), torch.float32, device, seed=13)
    gen = torch.Generator().manual_seed(1)
    schedule = _random_schedule(gen, S, 32, lanes=(B, H), density=0.3, device=device)
    out = ta.scheduled_attention(q, k, v, schedule)
    _check(out, ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule), torch.float32)
    mask = schedule.to_block_mask()
    assert not torch.equal(mask[0, 0], mask[0, 1])
    head1_with_head0 = ta.BlockSchedule.from_block_mask(mask[0, 0], 32, S).to(device)
    other = ta.scheduled_attention(q[0, 1], k[0, 1], v[0, 1], head1_with_head0)
    assert not torch.allclose(other, out[0, 1], atol=1e-3)


@pytest.mark.cuda
def test_new_sequence_length_does_not_recompile():
    """Sequence length is a runtime argument: after one launch, other lengths reuse the compiled kernel."""
    from topo_attn.attention import forward

    def compiled() -> set:
        return {key for cache in forward.attention_fwd_kernel.device_caches.values() for key in cache[0]}

    lengths = [1024, 1000, 1536, 777, 2048]
    for i, S in enumerate(lengths):
        q, k, v = _inputs((1, 2, S, 64), (1, 2, S, 64), torch.float16, "cuda", seed=S)
        schedule = ta.topology_schedule(k, 64, window=1, sinks=1, topk=2)
        out = ta.scheduled_attention(q, k, v, schedule)
        _check(out, ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule), torch.float16)
        if i == 0:
            after_first = compiled()
    assert compiled() == after_first, f"new kernel variants: {compiled() - after_first}"


@pytest.mark.cuda
def test_offsets_beyond_32_bits():
    """B * H * S * D > 2^31: the last head's addresses overflow int32 unless the kernel uses 64-bit offsets.
    A diagonal-only schedule keeps the reference cheap (causal attention within each block)."""
    H, S, D, block_size = 66, 262144, 128, 128
    assert H * S * D > 2**31
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    n = S // block_size
    schedule = ta.BlockSchedule(torch.arange(n + 1, device="cuda"), torch.arange(n, device="cuda"), block_size, S)
    out = ta.scheduled_attention(q, k, v, schedule)
    blocks = [t[0, -1].double().view(n, block_size, D) for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*blocks, is_causal=True).view(S, D)
    torch.testing.assert_close(out[0, -1].double(), ref, atol=TOLERANCE[torch.bfloat16], rtol=TOLERANCE[torch.bfloat16])
    del q, k, v, out


def test_tolerances_follow_dtype():
    """The bounds above are a few units of each dtype's rounding, not loose constants."""
    for dtype in (torch.float16, torch.bfloat16):
        assert TOLERANCE[dtype] == 4 * torch.finfo(dtype).eps
    assert TOLERANCE[torch.float32] < 1e-4 and not math.isnan(TOLERANCE[torch.float32])


def test_reference_rows_equal_the_full_reference():
    """``dense_masked_attention(rows=...)`` (used to check long sequences on a sample) equals the full one, up
    to the last bit of float64 (BLAS may block a product over fewer rows differently: 1e-16 on AMD EPYC)."""
    gen = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    schedule = _random_schedule(gen, 300, 32, lanes=(1, 2))
    full, full_lse = ta.dense_masked_attention(q, k, v, schedule, return_lse=True)
    part, part_lse = ta.dense_masked_attention(q, k, v, schedule, return_lse=True, rows=slice(170, 300))
    torch.testing.assert_close(part, full[..., 170:, :], rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(part_lse, full_lse[..., 170:], rtol=1e-14, atol=1e-15)
    assert torch.equal(schedule.to_token_mask(slice(5, 40)), schedule.to_token_mask()[..., 5:40, :])


@pytest.mark.parametrize("B, H, H_kv, S, D, block_size, dtype, per_lane", [
    (1, 2, 1, 200, 128, 64, torch.bfloat16, False),
    (2, 2, 2, 97, 32, 32, torch.float16, True),
    (1, 1, 1, 160, 64, 128, torch.float16, False),
])
def test_tma_and_pointer_paths_agree(B, H, H_kv, S, D, block_size, dtype, per_lane, device):
    """Tiles read through TMA descriptors and through pointers give the reference's answer, for partial last
    blocks (the descriptor pads rows past the sequence with zeros and clips the store), GQA and per-lane rows."""
    from topo_attn.attention.forward import scheduled_attention_forward, tile_config, tma_eligible

    q, k, v = _inputs((B, H, S, D), (B, H_kv, S, D), dtype, device, seed=S + D)
    assert tma_eligible(q, k, v) == (q.device.type == "cpu" or torch.cuda.get_device_capability()[0] >= 9)
    lanes = (B, H) if per_lane else None
    schedule = _random_schedule(torch.Generator().manual_seed(S), S, block_size, lanes, device=device)
    ref = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule)
    outs = []
    for tma in (False, True):
        config = {**tile_config(block_size, D, dtype), "TMA": tma}
        out, lse = scheduled_attention_forward(q, k, v, schedule, D ** -0.5, True, config)
        _check(out, ref, dtype)
        outs.append((out, lse))
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=1e-5)


def test_misaligned_inputs_take_the_pointer_path(device):
    """A view whose strides are not multiples of 16 bytes cannot be a TMA descriptor: the kernel falls back
    to pointer loads and stays correct."""
    from topo_attn.attention.forward import tma_eligible

    gen = torch.Generator().manual_seed(4)
    base = torch.randn(1, 2, 130, 128 + 1, generator=gen).to(device, torch.bfloat16)
    q = k = v = base[..., :128]  # row stride 129 elements = 258 bytes
    assert not tma_eligible(q, k, v)
    schedule = ta.topology_schedule(k.float(), 64, window=1, sinks=1, topk=1)
    out = ta.scheduled_attention(q, k, v, schedule)
    _check(out, ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule), torch.bfloat16)
