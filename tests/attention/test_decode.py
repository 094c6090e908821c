"""The split-K decode kernel (``topo_attn.attention.decode``) against the float64 reference: a few queries at
the end of a longer key sequence (bottom-right causal), shared / per-query-head / per-kv-head schedules, GQA,
partial blocks, queries straddling a block boundary, forced split counts. On the CPU the kernels run in
Triton's interpreter, so the shapes stay small."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from helpers import DEVICE, TOLERANCE, inputs  # in tests/
from topo_attn.attention import decode

LANES = ("shared", "query", "kv")


def _schedule(gen: torch.Generator, N: int, L: int, block_size: int, lanes: tuple[int, int] | None = None,
              density: float = 0.4) -> ta.BlockSchedule:
    """A random valid bottom-right schedule: each row ``r`` (absolute query block ``first + r``) holds random
    blocks ``0 .. first + r`` (at least one), shared or one row-set per lane."""
    nb = ta.num_blocks(N, block_size)
    first = (N - L) // block_size
    rows = nb - first
    shape = (rows, nb) if lanes is None else (*lanes, rows, nb)
    allowed = torch.arange(nb)[None, :] <= (first + torch.arange(rows))[:, None]
    mask = (torch.rand(shape, generator=gen) < density) & allowed
    pick = (torch.rand(shape[:-1], generator=gen) * (first + torch.arange(rows) + 1)).long()
    mask |= ~mask.any(-1, keepdim=True) & (torch.arange(nb) == pick[..., None])
    return ta.BlockSchedule.from_block_mask(mask, block_size, seq_len=N, q_len=L)


def _lane_heads(schedule: ta.BlockSchedule) -> int:
    return 0 if schedule.lanes is None else schedule.lanes[1]


def _decode(q, k, v, schedule, num_splits=None, return_lse=True, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return decode.scheduled_decode_forward(q, k, v, schedule.offsets, schedule.indices, schedule.block_size,
                                           schedule.first_query_block, _lane_heads(schedule), scale, return_lse,
                                           num_splits=num_splits)


def _check(q, k, v, schedule, out, lse, scale=None):
    ref, ref_lse = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule, scale=scale,
                                             return_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    assert torch.isfinite(out).all()
    tol = TOLERANCE[q.dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-5)


CASES = [
    # B, H, H_kv, N, L, D, block_size, dtype            (R: query blocks touched)
    (1, 1, 1, 97, 1, 32, 16, torch.float32),             # R = 1, partial last block
    (2, 4, 2, 130, 3, 32, 32, torch.bfloat16),           # R = 2: queries 127 | 128 129
    (1, 4, 1, 200, 16, 64, 64, torch.float16),           # R = 2: 184..191 | 192..199, partial last block
    (2, 2, 2, 300, 16, 16, 16, torch.float32),           # R = 2, many rows' worth of blocks
    (1, 4, 2, 143, 3, 64, 16, torch.float16),            # R = 1, queries inside a partial last block
    (2, 4, 1, 66, 3, 16, 16, torch.bfloat16),            # R = 2: 63 | 64 65, a one-key last block
    (1, 2, 1, 16, 16, 32, 16, torch.float32),            # N == L: a whole causal block of queries
    (1, 2, 2, 5, 3, 16, 32, torch.bfloat16),             # N < block_size
]


def _case_id(case) -> str:
    B, H, H_kv, N, L, D, bs, dtype = case
    return f"B{B}-H{H}-Hkv{H_kv}-N{N}-L{L}-D{D}-bs{bs}-{str(dtype).split('.')[-1]}"


# per-kv-head lanes only with GQA (without it they are per-query-head lanes)
PARAMS = [pytest.param(case, lanes, id=f"{_case_id(case)}-{lanes}")
          for case in CASES for lanes in LANES if not (lanes == "kv" and case[1] == case[2])]


@pytest.mark.parametrize("case,lanes", PARAMS)
def test_decode_matches_reference(case, lanes, device):
    """Every forced split count (one chunk, two, more chunks than most rows have entries) and the host's
    choice give the reference's output and log-sum-exp, on fresh inputs and a fresh schedule for each."""
    B, H, H_kv, N, L, D, block_size, dtype = case
    for i, num_splits in enumerate((1, 2, 7, None)):
        seed = 1000 * CASES.index(case) + 10 * LANES.index(lanes) + i
        gen = torch.Generator().manual_seed(seed)
        lane_shape = {"shared": None, "query": (B, H), "kv": (B, H_kv)}[lanes]
        schedule = _schedule(gen, N, L, block_size, lane_shape).to(device)
        q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), dtype, device, seed)
        out, lse = _decode(q, k, v, schedule, num_splits=num_splits)
        _check(q, k, v, schedule, out, lse)


def test_query_segment_straddles_a_block_boundary():
    """The cases above that claim two query blocks really have them (the R == 2 path is exercised)."""
    two_rows = [c for c in CASES if ta.num_blocks(c[3], c[6]) - (c[3] - c[4]) // c[6] == 2]
    assert len(two_rows) >= 3


def test_merge_in_several_steps(device, monkeypatch):
    """The merge weighs a query's partials a few at a time when there are many (here forced to 4 a step):
    a later step with a larger log-sum-exp rescales the earlier ones. Most chunks are empty."""
    monkeypatch.setattr(decode, "MERGE_PARTS", 4)
    B, H, H_kv, N, L, D, block_size = 1, 2, 1, 300, 16, 16, 16
    gen = torch.Generator().manual_seed(17)
    schedule = _schedule(gen, N, L, block_size, density=0.7).to(device)
    assert schedule.num_query_blocks == 2
    q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), torch.float32, device, seed=17)
    k = k * 3  # spread the chunks' log-sum-exps apart
    for num_splits in (3, 40):
        out, lse = _decode(q, k, v, schedule, num_splits=num_splits)
        _check(q, k, v, schedule, out, lse)


@pytest.mark.parametrize("H,H_kv", [(4, 2), (4, 1)])
def test_per_query_head_rows_differ_within_a_gqa_group(H, H_kv, device):
    """One row-set per query head whose heads of one key/value head follow different rows: no packing of the
    group (GROUP = 1), each head reads its own rows. Head 1 answered with head 0's rows differs."""
    B, N, L, D, block_size = 2, 150, 3, 32, 16
    gen = torch.Generator().manual_seed(H * 10 + H_kv)
    schedule = _schedule(gen, N, L, block_size, (B, H), density=0.3).to(device)
    mask = schedule.to_block_mask()
    assert not torch.equal(mask[:, 0], mask[:, 1]), "heads 0 and 1 share a kv head but should differ"
    q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), torch.float32, device, seed=H + H_kv)
    out, lse = _decode(q, k, v, schedule, num_splits=2)
    _check(q, k, v, schedule, out, lse)

    head0_rows = ta.BlockSchedule.from_block_mask(mask[:, :1].expand(B, H, -1, -1).contiguous(), block_size,
                                                  seq_len=N, q_len=L).to(device)
    other, _ = _decode(q, k, v, head0_rows, num_splits=2)
    assert not torch.allclose(other[:, 1], out[:, 1], atol=1e-3)


def test_per_kv_head_lanes_are_shared_by_the_group(device):
    """(B, H_kv) lanes: every query head of a key/value head follows that lane's rows, and differently
    scheduled kv heads give different answers than one shared row-set would."""
    B, H, H_kv, N, L, D, block_size = 1, 4, 2, 120, 1, 32, 16
    gen = torch.Generator().manual_seed(21)
    schedule = _schedule(gen, N, L, block_size, (B, H_kv), density=0.3).to(device)
    mask = schedule.to_block_mask()
    assert not torch.equal(mask[0, 0], mask[0, 1])
    q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), torch.float32, device, seed=21)
    out, lse = _decode(q, k, v, schedule)
    _check(q, k, v, schedule, out, lse)
    shared = ta.BlockSchedule.from_block_mask(mask[0, 0], block_size, seq_len=N, q_len=L).to(device)
    other, _ = _decode(q, k, v, shared)
    assert not torch.allclose(other[:, 2:], out[:, 2:], atol=1e-3)


def test_without_lse_and_custom_scale(device):
    """``return_lse=False`` returns ``None`` and the same output; a custom scale is applied."""
    B, H, H_kv, N, L, D = 1, 4, 2, 90, 3, 32
    gen = torch.Generator().manual_seed(5)
    schedule = _schedule(gen, N, L, 32, (B, H_kv)).to(device)
    q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), torch.float32, device, seed=5)
    out, lse = _decode(q, k, v, schedule, num_splits=3, scale=0.05)
    _check(q, k, v, schedule, out, lse, scale=0.05)
    out2, none = _decode(q, k, v, schedule, num_splits=3, return_lse=False, scale=0.05)
    assert none is None
    torch.testing.assert_close(out2, out, atol=0, rtol=0)
    default, _ = _decode(q, k, v, schedule, num_splits=3)
    assert not torch.allclose(default, out, atol=1e-3)


def test_non_contiguous_inputs(device):
    """Any strides: ``[B, S, H, D]`` buffers viewed as ``[B, H, S, D]``, and a query slice of a longer one."""
    B, H, H_kv, N, L, D = 1, 4, 2, 140, 3, 32
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(B, 2 * L, H, D, generator=gen).to(device, torch.float16).transpose(1, 2)[:, :, L:]
    k, v = (torch.randn(B, N, H_kv, D, generator=gen).to(device, torch.float16).transpose(1, 2) for _ in range(2))
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    schedule = _schedule(gen, N, L, 16).to(device)
    out, lse = _decode(q, k, v, schedule, num_splits=2)
    _check(q, k, v, schedule, out, lse)


def test_unscheduled_blocks_are_never_read(device):
    """Keys and values of blocks that no row schedules may hold anything, NaN included: the output is
    unchanged bit for bit."""
    B, H, H_kv, N, L, D, block_size = 1, 2, 1, 256, 1, 32, 16
    gen = torch.Generator().manual_seed(3)
    schedule = _schedule(gen, N, L, block_size, density=0.2).to(device)
    used = schedule.to_block_mask().any(0)
    unused = (~used).nonzero().flatten().tolist()
    assert len(unused) >= 5
    q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), torch.bfloat16, device, seed=3)
    out, lse = _decode(q, k, v, schedule, num_splits=4)
    k2, v2 = k.clone(), v.clone()
    for b in unused:
        k2[..., b * block_size:(b + 1) * block_size, :] = float("nan")
        v2[..., b * block_size:(b + 1) * block_size, :] = float("nan")
    out2, lse2 = _decode(q, k2, v2, schedule, num_splits=4)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_num_splits_for_bounds():
    """Host-side split count: at least 1, at most the number of key blocks, fewer for a larger grid."""
    assert decode.num_splits_for(100, 64, 1, DEVICE) == 2  # capped by nb = 2
    assert decode.num_splits_for(5, 16, 1, DEVICE) == 1
    assert decode.num_splits_for(2**20, 64, 10**6, DEVICE) == 1
    many = decode.num_splits_for(2**17, 64, 1, DEVICE)
    few = decode.num_splits_for(2**17, 64, 64, DEVICE)
    assert 1 <= few < many <= 2**17 // 64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_config_tiles_divide_the_block(dtype):
    for block_size in (16, 32, 64, 128, 256):
        for head_dim in (16, 32, 64, 128, 256):
            for group in (1, 2, 4, 8):
                config = decode.decode_config(block_size, head_dim, dtype, group)
                assert block_size % config["BLOCK_N"] == 0 and config["BLOCK_N"] >= 16
                assert config["NUM_STAGES"] >= 1 and config["num_warps"] in (1, 2, 4, 8)


@pytest.mark.cuda
def test_no_host_sync_on_cuda():
    """Choosing the split count and launching never reads a GPU tensor back (no host-device sync)."""
    B, H, H_kv, N, L, D = 2, 8, 2, 4096, 1, 128
    gen = torch.Generator().manual_seed(0)
    schedule = _schedule(gen, N, L, 64, (B, H_kv), density=0.125).to("cuda")
    q, k, v = inputs((B, H, L, D), (B, H_kv, N, D), torch.bfloat16, "cuda", seed=0)
    _decode(q, k, v, schedule)  # compile outside the sync check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, lse = _decode(q, k, v, schedule)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _check(q, k, v, schedule, out, lse)
