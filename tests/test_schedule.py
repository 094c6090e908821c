"""Tests of the ``BlockSchedule`` type: construction, conversions, counts, transpose and FlexAttention interop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention

from topo_attn import BlockSchedule, dense_causal_schedule, dense_masked_attention, num_blocks
from helpers import padded_copy  # in tests/

Lanes = tuple[int, int] | None


# ----------------------------------------------------------------------------------------------- helpers
def random_causal_mask(n: int, lanes: Lanes = None, density: float = 0.4, seed: int = 0,
                       diagonal: bool = True) -> torch.Tensor:
    """A random causal bool block mask ``[n, n]`` or ``[B, H, n, n]``, diagonal forced on if asked."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n, n) if lanes is None else (*lanes, n, n)
    mask = (torch.rand(shape, generator=gen) < density).tril()
    if diagonal:
        mask |= torch.eye(n, dtype=torch.bool)
    return mask


def rows_of(schedule: BlockSchedule) -> list[list[int]]:
    """Every CSR row as a Python list."""
    offsets, indices = schedule.offsets.tolist(), schedule.indices.tolist()
    return [indices[offsets[r]:offsets[r + 1]] for r in range(len(offsets) - 1)]


def loop_token_mask(block_mask: torch.Tensor, block_size: int, seq_len: int) -> torch.Tensor:
    """Token mask by plain loops: ``i`` sees ``j`` iff block (i // bs, j // bs) is set and ``j <= i``."""
    lead = block_mask.shape[:-2]
    flat = block_mask.reshape(-1, *block_mask.shape[-2:]).tolist()
    out = torch.zeros(len(flat), seq_len, seq_len, dtype=torch.bool)
    for lane, blocks in enumerate(flat):
        for i in range(seq_len):
            for j in range(i + 1):
                if blocks[i // block_size][j // block_size]:
                    out[lane, i, j] = True
    return out.reshape(*lead, seq_len, seq_len)


def num_lanes(lanes: Lanes) -> int:
    return 1 if lanes is None else lanes[0] * lanes[1]


LANE_CASES = [None, (2, 3)]


# ------------------------------------------------------------------------------------ dense causal
@pytest.mark.parametrize("seq_len, block_size", [(1, 1), (5, 1), (64, 16), (97, 16), (200, 64), (33, 7)])
def test_dense_causal_rows_hold_all_earlier_blocks(seq_len: int, block_size: int) -> None:
    """Row ``i`` of the dense causal schedule is exactly ``0..i``."""
    schedule = dense_causal_schedule(seq_len, block_size)
    n = num_blocks(seq_len, block_size)
    assert schedule.num_blocks == n and schedule.is_shared and not schedule.transposed
    assert rows_of(schedule) == [list(range(i + 1)) for i in range(n)]
    assert schedule.offsets.dtype == torch.int32 and schedule.indices.dtype == torch.int32


@pytest.mark.parametrize("seq_len, block_size", [(64, 16), (97, 16), (13, 1)])
def test_dense_causal_counts(seq_len: int, block_size: int) -> None:
    """Scheduled = causal = n (n + 1) / 2 and nothing is skipped."""
    n = num_blocks(seq_len, block_size)
    counts = dense_causal_schedule(seq_len, block_size).counts()
    assert counts.scheduled_blocks == n * (n + 1) // 2
    assert counts.causal_blocks == n * (n + 1) // 2
    assert counts.reduction == 0.0 and counts.density == 1.0


def test_dense_causal_partial_last_block() -> None:
    """seq_len 97 with block 16 gives 7 blocks, the last one holding a single token."""
    schedule = dense_causal_schedule(97, 16)
    assert schedule.num_blocks == 7
    assert schedule.offsets.numel() == 8 and schedule.nnz == 28
    assert torch.equal(schedule.to_token_mask(), torch.ones(97, 97, dtype=torch.bool).tril())


# ------------------------------------------------------------------------------ block mask round trip
@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("n, block_size, seq_len", [(1, 16, 16), (6, 16, 96), (7, 16, 97), (9, 5, 43)])
def test_block_mask_round_trip(lanes: Lanes, n: int, block_size: int, seq_len: int) -> None:
    """from_block_mask then to_block_mask gives the mask back; rows come out strictly increasing."""
    mask = random_causal_mask(n, lanes, seed=n * 31 + block_size)
    schedule = BlockSchedule.from_block_mask(mask, block_size, seq_len)
    assert schedule.lanes == lanes and schedule.seq_len == seq_len and schedule.block_size == block_size
    assert schedule.num_rows == num_lanes(lanes) * n and schedule.nnz == int(mask.sum())
    assert torch.equal(schedule.to_block_mask(), mask)
    flat = mask.reshape(-1, n, n)
    expected_rows = [torch.nonzero(flat[lane, i]).flatten().tolist()
                     for lane in range(flat.shape[0]) for i in range(n)]
    rows = rows_of(schedule)
    assert rows == expected_rows
    assert all(row == sorted(set(row)) for row in rows)


@pytest.mark.parametrize("lanes", LANE_CASES)
def test_csr_tensors_are_int32(lanes: Lanes) -> None:
    """from_block_mask stores int32 offsets and indices."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(5, lanes, seed=3), 16)
    assert schedule.offsets.dtype == torch.int32 and schedule.indices.dtype == torch.int32


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.uint8])
def test_other_integer_inputs_are_stored_as_int32(dtype: torch.dtype) -> None:
    """Any integer dtype given to the constructor is stored as int32 with the same values."""
    reference = BlockSchedule.from_block_mask(random_causal_mask(6, seed=11), 16, 90)
    schedule = BlockSchedule(reference.offsets.to(dtype), reference.indices.to(dtype), 16, 90)
    assert schedule.offsets.dtype == torch.int32 and schedule.indices.dtype == torch.int32
    assert torch.equal(schedule.offsets, reference.offsets)
    assert torch.equal(schedule.indices, reference.indices)
    assert schedule.offsets.is_contiguous() and schedule.indices.is_contiguous()


def test_seq_len_defaults_to_full_blocks() -> None:
    """Without seq_len, from_block_mask assumes n whole blocks."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(4, seed=2), 8)
    assert schedule.seq_len == 32 and schedule.num_blocks == 4


# ------------------------------------------------------------------------------------- token mask
@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("n, block_size, seq_len", [(4, 16, 64), (7, 16, 97), (5, 7, 31), (3, 1, 3)])
def test_token_mask_matches_python_loops(lanes: Lanes, n: int, block_size: int, seq_len: int) -> None:
    """to_token_mask equals the mask built token by token."""
    mask = random_causal_mask(n, lanes, density=0.5, seed=seq_len + n)
    schedule = BlockSchedule.from_block_mask(mask, block_size, seq_len)
    token = schedule.to_token_mask()
    expected = loop_token_mask(mask, block_size, seq_len)
    assert token.shape == expected.shape
    assert torch.equal(token, expected)


# ----------------------------------------------------------------------------------------- counts
@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_counts(lanes: Lanes, density: float) -> None:
    """scheduled = nnz, causal = lanes * n (n + 1) / 2, reduction = 1 - scheduled / causal."""
    n = 8
    mask = random_causal_mask(n, lanes, density=density, seed=int(density * 10) + 5)
    schedule = BlockSchedule.from_block_mask(mask, 16, 120)
    counts = schedule.counts()
    causal = num_lanes(lanes) * n * (n + 1) // 2
    assert counts.scheduled_blocks == int(mask.sum()) == schedule.nnz
    assert counts.causal_blocks == causal
    assert counts.reduction == pytest.approx(1.0 - int(mask.sum()) / causal)
    assert counts.density + counts.reduction == pytest.approx(1.0)
    assert str(counts).startswith(f"{int(mask.sum())} / {causal}")


# -------------------------------------------------------------------------------------- transpose
@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("diagonal", [True, False])
def test_transpose_is_the_transposed_block_mask(lanes: Lanes, diagonal: bool) -> None:
    """The transposed schedule's block mask is the original mask transposed on the last two dims."""
    n = 7
    mask = random_causal_mask(n, lanes, density=0.35, seed=17, diagonal=diagonal)
    mask[..., :, 0] = True  # keep every row non-empty without forcing the diagonal
    schedule = BlockSchedule.from_block_mask(mask, 16, 100)
    transposed = schedule.transpose()
    assert transposed.transposed and transposed.lanes == lanes
    assert transposed.offsets.dtype == torch.int32 and transposed.indices.dtype == torch.int32
    assert torch.equal(transposed.to_block_mask(), mask.transpose(-1, -2))
    assert torch.equal(transposed.to_token_mask(), schedule.to_token_mask())
    # the transposed schedule passes the constructor's own validation
    BlockSchedule(transposed.offsets, transposed.indices, 16, 100, lanes, transposed=True)


def test_transpose_allows_empty_rows() -> None:
    """A schedule whose rows all list only block 0 transposes to one full row and empty others."""
    n = 5
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:, 0] = True
    transposed = BlockSchedule.from_block_mask(mask, 16).transpose()
    assert rows_of(transposed) == [list(range(n))] + [[] for _ in range(n - 1)]
    assert transposed.offsets.tolist() == [0] + [n] * n


@pytest.mark.parametrize("lanes", LANE_CASES)
def test_transpose_twice_is_identity(lanes: Lanes) -> None:
    """Transposing twice gives back identical offsets and indices."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(9, lanes, seed=23), 16, 140)
    back = schedule.transpose().transpose()
    assert not back.transposed and back.lanes == lanes
    assert back.offsets.dtype == torch.int32 and back.indices.dtype == torch.int32
    assert torch.equal(back.offsets, schedule.offsets)
    assert torch.equal(back.indices, schedule.indices)


@pytest.mark.parametrize("lanes", LANE_CASES)
def test_transposed_rows_list_later_query_blocks(lanes: Lanes) -> None:
    """Row c of a transposed lane lists, sorted, query blocks >= c."""
    n = 8
    transposed = BlockSchedule.from_block_mask(random_causal_mask(n, lanes, seed=29), 16).transpose()
    for row, entries in enumerate(rows_of(transposed)):
        key_block = row % n
        assert entries == sorted(set(entries))
        assert all(key_block <= query_block < n for query_block in entries)


# ------------------------------------------------------------------------------------------ device
def test_to_cpu_keeps_content() -> None:
    """to('cpu') keeps every field."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(6, (2, 2), seed=31), 16, 81)
    moved = schedule.to("cpu")
    assert moved.device == torch.device("cpu")
    assert torch.equal(moved.offsets, schedule.offsets) and torch.equal(moved.indices, schedule.indices)
    assert (moved.block_size, moved.seq_len, moved.lanes, moved.transposed) == (16, 81, (2, 2), False)
    moved_t = schedule.transpose().to(torch.device("cpu"))
    assert moved_t.transposed


@pytest.mark.cuda
def test_to_cuda_keeps_content() -> None:
    """to('cuda') moves both tensors and keeps the content."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(6, (2, 2), seed=37), 16, 81)
    moved = schedule.to("cuda")
    assert moved.device.type == "cuda" and moved.indices.device.type == "cuda"
    assert torch.equal(moved.offsets.cpu(), schedule.offsets)
    assert torch.equal(moved.indices.cpu(), schedule.indices)
    assert torch.equal(moved.to_block_mask().cpu(), schedule.to_block_mask())
    assert (moved.block_size, moved.seq_len, moved.lanes) == (16, 81, (2, 2))


# ------------------------------------------------------------------------------------ FlexAttention
@pytest.mark.parametrize("lanes", LANE_CASES)
def test_flex_block_mask_layout(lanes: Lanes) -> None:
    """Counts per row: the diagonal as one partial block, the rest as full blocks; dense form matches."""
    n = 7
    mask = random_causal_mask(n, lanes, seed=41)
    block_mask = BlockSchedule.from_block_mask(mask, 16, 97).to_flex_block_mask()
    assert isinstance(block_mask, BlockMask)
    lead = (1, 1) if lanes is None else lanes
    assert block_mask.kv_num_blocks.shape == (*lead, n)
    assert block_mask.full_kv_num_blocks.shape == (*lead, n)
    assert block_mask.seq_lengths == (97, 97)
    assert tuple(block_mask.BLOCK_SIZE) == (16, 16)
    lead_mask = mask if lanes is not None else mask[None, None]
    assert torch.equal(block_mask.kv_num_blocks, torch.ones(*lead, n, dtype=torch.int32))
    assert torch.equal(block_mask.full_kv_num_blocks, lead_mask.sum(-1, dtype=torch.int32) - 1)
    assert torch.equal(block_mask.to_dense().bool(), lead_mask)


@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("seq_len", [112, 97])
def test_flex_block_mask_round_trip(lanes: Lanes, seq_len: int) -> None:
    """from_flex_block_mask(to_flex_block_mask()) gives the identical schedule."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(7, lanes, seed=seq_len), 16, seq_len)
    back = BlockSchedule.from_flex_block_mask(schedule.to_flex_block_mask())
    assert torch.equal(back.offsets, schedule.offsets) and torch.equal(back.indices, schedule.indices)
    assert (back.lanes, back.seq_len, back.block_size) == (lanes, seq_len, 16)


def test_flex_block_mask_rejects_transposed() -> None:
    """Only row schedules convert to a BlockMask."""
    with pytest.raises(ValueError, match="to_flex_block_mask needs a row schedule"):
        dense_causal_schedule(64, 16).transpose().to_flex_block_mask()


@pytest.mark.parametrize("seq_len, block_size", [(64, 16), (97, 16), (80, 32)])
def test_from_torch_causal_block_mask(seq_len: int, block_size: int) -> None:
    """A BlockMask from torch's own create_block_mask with a causal mask_mod is the dense causal schedule."""
    block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, seq_len, seq_len,
                                   device="cpu", BLOCK_SIZE=block_size)
    schedule = BlockSchedule.from_flex_block_mask(block_mask)
    dense = dense_causal_schedule(seq_len, block_size)
    assert schedule.is_shared and (schedule.seq_len, schedule.block_size) == (seq_len, block_size)
    assert torch.equal(schedule.offsets, dense.offsets) and torch.equal(schedule.indices, dense.indices)


@pytest.mark.parametrize("lanes", LANE_CASES)
def test_flex_mask_mod_is_the_token_mask(lanes: Lanes) -> None:
    """The BlockMask's mask_mod, evaluated on every token pair, is the schedule's token mask."""
    schedule = BlockSchedule.from_block_mask(random_causal_mask(5, lanes, seed=43), 16, 70)
    block_mask = schedule.to_flex_block_mask()
    batch, heads = (1, 1) if lanes is None else lanes
    dense = create_mask(block_mask.mask_mod, batch, heads, 70, 70, device="cpu")
    expected = schedule.to_token_mask()
    assert torch.equal(dense, expected.expand(batch, heads, 70, 70))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_flex_attention_matches_reference(lanes: Lanes, dtype: torch.dtype, tol: float) -> None:
    """Eager FlexAttention with the converted BlockMask equals dense_masked_attention in float64."""
    batch, heads, seq_len, dim = (2, 3, 97, 16) if lanes is not None else (2, 2, 97, 16)
    schedule = BlockSchedule.from_block_mask(random_causal_mask(7, lanes, seed=47), 16, seq_len)
    gen = torch.Generator().manual_seed(53)
    q, k, v = (torch.randn(batch, heads, seq_len, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    out = flex_attention(q.to(dtype), k.to(dtype), v.to(dtype), block_mask=schedule.to_flex_block_mask())
    expected = dense_masked_attention(q, k, v, schedule)
    causal = dense_masked_attention(q, k, v, dense_causal_schedule(seq_len, 16))
    assert out.dtype == dtype
    assert (expected - causal).abs().max() > 1e-2  # the schedule really is sparser than causal
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


# -------------------------------------------------------------------------------------- hypothesis
@st.composite
def random_schedules(draw) -> tuple[torch.Tensor, int, int]:
    """A random causal block mask with the diagonal on, a block size and a seq_len valid for it."""
    n = draw(st.integers(1, 8))
    block_size = draw(st.integers(1, 64))
    seq_len = draw(st.integers((n - 1) * block_size + 1, n * block_size))
    lanes = draw(st.none() | st.tuples(st.integers(1, 2), st.integers(1, 3)))
    shape = (n, n) if lanes is None else (*lanes, n, n)
    bits = draw(st.lists(st.booleans(), min_size=num_lanes(lanes) * n * n, max_size=num_lanes(lanes) * n * n))
    mask = torch.tensor(bits, dtype=torch.bool).reshape(shape).tril() | torch.eye(n, dtype=torch.bool)
    return mask, block_size, seq_len


@settings(max_examples=60, deadline=None)
@given(random_schedules())
def test_random_schedules_validate_and_round_trip(case: tuple[torch.Tensor, int, int]) -> None:
    """Every valid random schedule validates, round-trips and transposes back to itself."""
    mask, block_size, seq_len = case
    schedule = BlockSchedule.from_block_mask(mask, block_size, seq_len)
    assert schedule.validate() is schedule
    assert schedule.num_blocks == mask.shape[-1]
    assert torch.equal(schedule.to_block_mask(), mask)
    rebuilt = BlockSchedule(schedule.offsets.long(), schedule.indices.long(), block_size, seq_len, schedule.lanes)
    assert torch.equal(rebuilt.offsets, schedule.offsets) and torch.equal(rebuilt.indices, schedule.indices)
    back = schedule.transpose().transpose()
    assert torch.equal(back.offsets, schedule.offsets) and torch.equal(back.indices, schedule.indices)
    assert schedule.counts().scheduled_blocks == int(mask.sum())
    token = mask.repeat_interleave(block_size, -2).repeat_interleave(block_size, -1)[..., :seq_len, :seq_len]
    assert torch.equal(schedule.to_token_mask(), token & torch.ones(seq_len, seq_len, dtype=torch.bool).tril())


def test_internal_schedules_are_validated_when_the_switch_is_on(monkeypatch) -> None:
    """BlockSchedule.unchecked (the kit's own builders) skips validation unless TOPO_ATTN_CHECK_SCHEDULES=1,
    which the tests set; a user's BlockSchedule(...) is always validated."""
    from topo_attn.schedule import CHECK_ENV

    offsets, indices = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)  # row 0 lists block 1
    monkeypatch.setenv(CHECK_ENV, "1")
    with pytest.raises(ValueError, match="not causal"):
        BlockSchedule.unchecked(offsets, indices, 16, 32)
    monkeypatch.setenv(CHECK_ENV, "0")
    assert BlockSchedule.unchecked(offsets, indices, 16, 32).nnz == 2  # trusted, not checked
    with pytest.raises(ValueError, match="not causal"):
        BlockSchedule(offsets, indices, 16, 32)


# -------------------------------------------------------------------------------------- padded
@pytest.mark.parametrize("lanes", LANE_CASES)
@pytest.mark.parametrize("extra", [0, 1, 37])
def test_a_padded_schedule_is_its_entries(lanes: Lanes, extra: int) -> None:
    """A padded schedule reads as the exact one (indices, nnz, counts, masks, device moves), its buffer keeps
    the unused tail for the kernels, and its transpose is padded too, equal to the exact transpose in its
    entries, and transposes back."""
    exact = BlockSchedule.from_block_mask(random_causal_mask(9, lanes, density=0.3, seed=41), 16, 140)
    padded = padded_copy(exact, extra)
    assert padded.padded and not exact.padded
    assert padded.index_buffer.numel() == exact.nnz + extra
    assert int(padded.entry_count()) == exact.nnz
    assert torch.equal(padded.indices, exact.indices) and padded.nnz == exact.nnz
    assert padded.counts().scheduled_blocks == exact.counts().scheduled_blocks
    assert padded.causal_blocks == exact.counts().causal_blocks
    assert torch.equal(padded.to_block_mask(), exact.to_block_mask())
    assert padded.validate() is padded
    moved = padded_copy(exact, extra).to("cpu")
    assert moved.padded and torch.equal(moved.indices, exact.indices)
    column, want = padded_copy(exact, extra).transpose(), exact.transpose()
    assert column.padded and column.transposed and column.index_buffer.numel() == exact.nnz + extra
    assert torch.equal(column.offsets, want.offsets) and torch.equal(column.indices, want.indices)
    back = column.transpose()
    assert torch.equal(back.offsets, exact.offsets) and torch.equal(back.indices, exact.indices)


def test_a_padded_schedule_whose_offsets_overrun_its_buffer_fails_validation(monkeypatch) -> None:
    """A padded buffer shorter than ``offsets[-1]`` is caught by the validation switch, like any bad CSR."""
    from topo_attn.schedule import CHECK_ENV

    offsets, buffer = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([0, 0], dtype=torch.int32)
    monkeypatch.setenv(CHECK_ENV, "1")
    with pytest.raises(ValueError, match="offsets must end at nnz"):
        BlockSchedule.unchecked(offsets, buffer, 16, 32, padded=True)
