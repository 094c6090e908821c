"""Queries at the end of a longer key sequence (``q_len < kv_len``, bottom-right causal): the schedule's
layout, the float64 reference, and the forward and backward kernels against it, for shared, per-query-head
and per-key/value-head schedules, GQA, odd lengths and partial first and last rows. On the CPU the kernels
run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from topo_attn import selection
from helpers import TOLERANCE, inputs, random_schedule  # in tests/


# ------------------------------------------------------------------------------------------ the schedule
@pytest.mark.parametrize("seq_len,q_len,block_size", [(100, 1, 16), (100, 37, 16), (128, 64, 32), (97, 97, 32),
                                                      (300, 17, 64), (64, 16, 16)])
def test_dense_suffix_schedule_is_the_last_rows_of_the_square_one(seq_len, q_len, block_size):
    """The token mask of the suffix schedule is the last ``q_len`` rows of the square causal mask, with the
    same blocks per row, and its counts are those rows' causal blocks."""
    full = ta.dense_causal_schedule(seq_len, block_size)
    part = ta.dense_causal_schedule(seq_len, block_size, q_len=q_len)
    assert part.q_len == q_len and part.q_offset == seq_len - q_len
    assert part.first_query_block == (seq_len - q_len) // block_size
    assert part.num_query_blocks == full.num_blocks - part.first_query_block == part.to_block_mask().shape[0]
    assert torch.equal(part.to_token_mask(), full.to_token_mask()[seq_len - q_len:])
    assert torch.equal(part.to_block_mask(), full.to_block_mask()[part.first_query_block:])
    assert part.counts().causal_blocks == part.nnz  # dense: every causal block of its rows
    assert "q_len" in repr(part) or q_len == seq_len


@pytest.mark.parametrize("lanes", [None, (2, 3)])
@pytest.mark.parametrize("seq_len,q_len,block_size", [(100, 37, 16), (130, 3, 32), (64, 64, 16)])
def test_for_queries_keeps_the_last_rows(seq_len, q_len, block_size, lanes):
    gen = torch.Generator().manual_seed(seq_len + q_len)
    full = random_schedule(gen, seq_len, block_size, lanes)
    part = full.for_queries(q_len).validate()
    assert part.lanes == full.lanes and part.q_len == q_len
    assert torch.equal(part.to_token_mask(), full.to_token_mask()[..., seq_len - q_len:, :])
    assert torch.equal(part.for_queries(1).to_token_mask(), full.to_token_mask()[..., -1:, :])


@pytest.mark.parametrize("lanes", [None, (1, 2)])
@pytest.mark.parametrize("seq_len,q_len,block_size", [(100, 37, 16), (130, 3, 32), (97, 80, 16)])
def test_transpose_round_trip_and_token_mask(seq_len, q_len, block_size, lanes):
    gen = torch.Generator().manual_seed(seq_len * q_len)
    schedule = random_schedule(gen, seq_len, block_size, lanes, q_len=q_len)
    column = schedule.transpose().validate()
    assert column.transposed and column.rows_per_lane == schedule.num_blocks
    assert int(column.indices.min()) >= schedule.first_query_block
    assert torch.equal(column.to_token_mask(), schedule.to_token_mask())
    back = column.transpose()
    assert torch.equal(back.offsets, schedule.offsets) and torch.equal(back.indices, schedule.indices)


def test_suffix_schedule_validation():
    # 100 keys in blocks of 16 (7 blocks); 37 queries start at 63, in block 3: rows for blocks 3..6
    rows = torch.ones(4, 7, dtype=torch.bool).tril(3)
    schedule = ta.BlockSchedule.from_block_mask(rows, 16, 100, q_len=37)
    assert schedule.num_rows == 4 and schedule.counts().causal_blocks == 4 + 5 + 6 + 7
    with pytest.raises(ValueError, match="touch 4 blocks"):
        ta.BlockSchedule.from_block_mask(rows[1:], 16, 100, q_len=37)
    with pytest.raises(ValueError, match="not causal"):
        ta.BlockSchedule.from_block_mask(torch.ones(4, 7, dtype=torch.bool).tril(4), 16, 100, q_len=37)
    with pytest.raises(ValueError, match="q_len must be <= seq_len"):
        ta.dense_causal_schedule(100, 16, q_len=101)
    with pytest.raises(ValueError, match="offsets has length"):
        ta.BlockSchedule(schedule.offsets, schedule.indices, 16, 100, q_len=10)  # 10 queries touch 1 block
    with pytest.raises(ValueError, match="indices are not causal"):  # row 0 is block 3: block 4 is after it
        ta.BlockSchedule(torch.tensor([0, 1, 2, 3, 4]), torch.tensor([4, 4, 5, 6]), 16, 100, q_len=37)
    with pytest.raises(ValueError, match="q_len=37"):
        schedule.to_flex_block_mask()
    with pytest.raises(ValueError, match="<= the schedule's q_len"):
        schedule.for_queries(38)


# ------------------------------------------------------------------------------------------ the kernels
CASES = [
    # B, H, H_kv, kv_len, q_len, D, block_size, dtype
    (1, 2, 2, 100, 37, 32, 16, torch.float32),  # partial first and last rows
    (2, 4, 2, 130, 64, 16, 32, torch.float16),  # GQA, q_len a multiple of the block, kv_len not
    (1, 4, 1, 200, 3, 64, 64, torch.bfloat16),  # a few queries, one row
    (1, 2, 1, 97, 80, 32, 16, torch.float32),
    (1, 1, 1, 77, 77, 16, 16, torch.float16),  # q_len == kv_len through the same path
    (1, 2, 2, 160, 50, 128, 64, torch.bfloat16),  # straddles a block boundary with the TMA tile config
]


def _lanes(kind, B, H, H_kv):
    return {"shared": None, "heads": (B, H), "kv_heads": (B, H_kv)}[kind]


def _grads(fn, q, k, v, d_out, dtype):
    leaves = [t.detach().clone().to(dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(d_out.to(dtype))
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("lane_kind", ["shared", "heads", "kv_heads"])
@pytest.mark.parametrize("B,H,H_kv,kv_len,q_len,D,block_size,dtype", CASES)
def test_forward_and_backward_match_reference(B, H, H_kv, kv_len, q_len, D, block_size, dtype, lane_kind, device):
    q, _, _ = inputs((B, H, q_len, D), (1,), dtype, device, seed=kv_len + q_len)
    _, k, v = inputs((1,), (B, H_kv, kv_len, D), dtype, device, seed=kv_len * 3 + q_len)
    gen = torch.Generator().manual_seed(kv_len + 7 * q_len)
    schedule = random_schedule(gen, kv_len, block_size, _lanes(lane_kind, B, H, H_kv), device=device, q_len=q_len)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(q_len)).to(device)

    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    ref, ref_lse = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule, return_lse=True)
    tol = TOLERANCE[dtype]
    assert out.shape == q.shape and lse.shape == (B, H, q_len)
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-3)

    _, grads = _grads(lambda *t: ta.scheduled_attention(*t, schedule), q, k, v, d_out, dtype)
    _, refs = _grads(lambda *t: ta.dense_masked_attention(*t, schedule), q, k, v, d_out, torch.float64)
    for name, grad, want in zip(("dq", "dk", "dv"), grads, refs):
        assert grad.dtype == dtype and grad.shape == want.shape, name
        scale = want.abs().max().item() or 1.0
        torch.testing.assert_close(grad.double(), want, atol=tol * scale, rtol=tol, msg=lambda m: f"{name}: {m}")


def test_suffix_equals_the_last_rows_of_the_full_call(device):
    """Chunked prefill: the last ``q_len`` queries against all keys give the last rows of the full call, and
    the keys before the queries' rows still get gradients from them."""
    B, H, S, D, bs, L = 1, 2, 150, 32, 32, 45
    q, k, v = inputs((B, H, S, D), (B, H, S, D), torch.float32, device, seed=5)
    full = random_schedule(torch.Generator().manual_seed(3), S, bs, (B, H), device=device)
    whole = ta.scheduled_attention(q, k, v, full)
    part = ta.scheduled_attention(q[:, :, S - L:], k, v, full.for_queries(L))
    torch.testing.assert_close(part, whole[:, :, S - L:], atol=2e-5, rtol=2e-5)


def test_two_dimensional_suffix(device):
    q, _, _ = inputs((5, 16), (1,), torch.float32, device, seed=1)
    _, k, v = inputs((1,), (70, 16), torch.float32, device, seed=2)
    schedule = ta.dense_causal_schedule(70, 16, device, q_len=5)
    out = ta.scheduled_attention(q, k, v, schedule)
    # bottom-right causal, written out: query i at position 65 + i sees keys 0 .. 65 + i
    visible = torch.ones(5, 70, dtype=torch.bool, device=device).tril(65)
    scores = ((q.double() @ k.double().T) / 4.0).masked_fill(~visible, float("-inf"))
    torch.testing.assert_close(out.double(), torch.softmax(scores, dim=-1) @ v.double(), atol=2e-5, rtol=2e-5)


def test_decode_steps_take_the_decode_kernel(device, monkeypatch):
    """Without gradients, a few queries at the end of the keys go to the split-K decode kernel (equal to the
    reference); a whole sequence, more than 16 queries, or gradients go to the forward kernel."""
    import topo_attn.attention.decode as decode

    calls = []
    launch = decode.scheduled_decode_forward
    monkeypatch.setattr(decode, "scheduled_decode_forward", lambda *a, **kw: calls.append(a[2].shape) or launch(*a, **kw))
    _, k, v = inputs((1,), (1, 2, 90, 32), torch.float32, device, seed=11)
    for q_len, grad, taken in ((1, False, True), (16, False, True), (17, False, False), (90, False, False),
                               (4, True, False)):
        q = torch.randn(1, 4, q_len, 32, generator=torch.Generator().manual_seed(q_len)).to(device)
        schedule = random_schedule(torch.Generator().manual_seed(q_len), 90, 16, (1, 2), device=device, q_len=q_len)
        calls.clear()
        with torch.set_grad_enabled(grad):
            out = ta.scheduled_attention(q.requires_grad_(grad), k, v, schedule)
        assert bool(calls) == taken, (q_len, grad)
        ref = ta.dense_masked_attention(q.detach().double(), k.double(), v.double(), schedule)
        torch.testing.assert_close(out.detach().double(), ref, atol=2e-5, rtol=2e-5)


def test_builders_take_q_len():
    """The topology builder and the selectors give the rows of the last q_len queries of their full schedule."""
    gen = torch.Generator().manual_seed(9)
    q, k = torch.randn(1, 2, 150, 16, generator=gen), torch.randn(1, 2, 150, 16, generator=gen)
    full = ta.topology_schedule(k, 16, 1, 1, 2)
    part = ta.topology_schedule(k, 16, 1, 1, 2, q_len=40)
    assert part.q_len == 40 and torch.equal(part.to_token_mask(), full.to_token_mask()[..., 110:, :])
    for name in ("centroid", "topology_22"):
        whole = selection.select(name, q, k, 16, budget=2)
        tail = selection.select(name, q, k, 16, budget=2, q_len=7)
        assert tail.q_len == 7 and torch.equal(tail.to_token_mask(), whole.to_token_mask()[..., 143:, :])
