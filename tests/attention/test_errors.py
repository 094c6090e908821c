"""Bad inputs raise ``TypeError`` / ``ValueError`` naming the argument, on the host, before any kernel launch."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import topo_attn.attention.forward as forward
from topo_attn import BlockSchedule, dense_causal_schedule, dense_masked_attention, scheduled_attention

REPO = Path(__file__).resolve().parents[2]
GEN = torch.Generator().manual_seed(20240611)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fresh random (non-zero) values."""
    return torch.randn(*shape, generator=GEN, dtype=torch.float64).to(dtype)


def qkv(batch: int = 1, heads: int = 2, kv_heads: int = 2, seq_len: int = 48, dim: int = 16,
        dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``q [B, H, S, D]`` and ``k, v [B, H_kv, S, D]`` on ``device``."""
    return (randn(batch, heads, seq_len, dim, dtype=dtype).to(device),
            randn(batch, kv_heads, seq_len, dim, dtype=dtype).to(device),
            randn(batch, kv_heads, seq_len, dim, dtype=dtype).to(device))


def random_schedule(n: int, block_size: int, seq_len: int, lanes: tuple[int, int] | None = None,
                    seed: int = 0) -> BlockSchedule:
    """A random causal schedule with the diagonal on."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n, n) if lanes is None else (*lanes, n, n)
    mask = (torch.rand(shape, generator=gen) < 0.5).tril() | torch.eye(n, dtype=torch.bool)
    return BlockSchedule.from_block_mask(mask, block_size, seq_len)


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any kernel launch fail loudly, so an error must come from validation before it."""
    def launched(*args, **kwargs):
        raise AssertionError("the kernel was launched")
    monkeypatch.setattr(forward, "scheduled_attention_forward", launched)


# ----------------------------------------------------------------------- BlockSchedule construction
# A valid 3-block schedule (seq_len 48, block 16): rows [0], [0, 1], [0, 1, 2].
OFFSETS = [0, 1, 3, 6]
INDICES = [0, 0, 1, 0, 1, 2]


def build(offsets=OFFSETS, indices=INDICES, block_size: int = 16, seq_len: int = 48, lanes=None) -> BlockSchedule:
    """BlockSchedule from lists (or tensors) with int64 defaults."""
    as_tensor = lambda x: x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return BlockSchedule(as_tensor(offsets), as_tensor(indices), block_size, seq_len, lanes)


def test_valid_base_schedule_builds() -> None:
    """The base case itself is valid, so each error below comes from the one change it makes."""
    schedule = build()
    assert schedule.offsets.tolist() == OFFSETS and schedule.indices.tolist() == INDICES


@pytest.mark.parametrize("kwargs", [dict(seq_len=64), dict(block_size=8), dict(lanes=(2, 1))],
                         ids=["other-seq_len", "other-block_size", "other-lanes"])
def test_offsets_wrong_length(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=r"offsets has length 4, expected rows \+ 1"):
        build(**kwargs)


def test_offsets_not_starting_at_zero() -> None:
    with pytest.raises(ValueError, match="offsets must start at 0, got 1"):
        build(offsets=[1, 1, 3, 6])


def test_offsets_decreasing() -> None:
    with pytest.raises(ValueError, match="offsets must not decrease"):
        build(offsets=[0, 3, 2, 6])


def test_offsets_not_ending_at_nnz() -> None:
    with pytest.raises(ValueError, match="offsets must end at nnz"):
        build(offsets=[0, 1, 3, 5])


def test_indices_negative() -> None:
    with pytest.raises(ValueError, match="indices must be >= 0"):
        build(indices=[0, -1, 1, 0, 1, 2])


def test_indices_out_of_range() -> None:
    with pytest.raises(ValueError, match="indices must be < num_blocks = 3"):
        build(indices=[0, 0, 1, 0, 1, 3])


def test_indices_not_causal() -> None:
    with pytest.raises(ValueError, match="indices are not causal"):
        build(indices=[1, 0, 1, 0, 1, 2])


def test_indices_unsorted_within_row() -> None:
    with pytest.raises(ValueError, match="indices are unsorted within row 2"):
        build(indices=[0, 0, 1, 0, 2, 1])


def test_indices_duplicated_within_row() -> None:
    with pytest.raises(ValueError, match="indices are duplicated within row 2"):
        build(indices=[0, 0, 1, 0, 1, 1])


def test_empty_row() -> None:
    with pytest.raises(ValueError, match="offsets has an empty row at row 1"):
        build(offsets=[0, 1, 1, 4], indices=[0, 0, 1, 2])


def test_float_offsets() -> None:
    with pytest.raises(TypeError, match="offsets must be an integer tensor"):
        build(offsets=torch.tensor(OFFSETS, dtype=torch.float32))


def test_float_indices() -> None:
    with pytest.raises(TypeError, match="indices must be an integer tensor"):
        build(indices=torch.tensor(INDICES, dtype=torch.float64))


def test_offsets_not_a_tensor() -> None:
    with pytest.raises(TypeError, match="offsets must be a torch.Tensor"):
        BlockSchedule(OFFSETS, torch.tensor(INDICES), 16, 48)


def test_two_dimensional_offsets() -> None:
    with pytest.raises(ValueError, match="offsets must be 1-D"):
        build(offsets=torch.tensor(OFFSETS).view(2, 2))


@pytest.mark.cuda
def test_offsets_and_indices_on_different_devices() -> None:
    with pytest.raises(ValueError, match="offsets is on cpu but indices is on cuda"):
        build(indices=torch.tensor(INDICES, device="cuda"))


# ------------------------------------------------------------------------ scheduled_attention inputs
SCHEDULE = dense_causal_schedule(48, 16)


def test_q_wrong_rank(no_launch: None) -> None:
    q = randn(2, 48, 16)
    with pytest.raises(ValueError, match=r"q must have shape \[S, D\] or \[B, H, S, D\]"):
        scheduled_attention(q, q, q, SCHEDULE)


def test_k_rank_differs_from_q(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k must have the same rank as q"):
        scheduled_attention(q, k[0, 0], v, SCHEDULE)


def test_k_and_v_shapes_differ(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        scheduled_attention(q, k, v[..., :32, :], SCHEDULE)


def test_k_shorter_than_q(no_launch: None) -> None:
    q, _, _ = qkv()
    k, v = randn(1, 2, 32, 16), randn(1, 2, 32, 16)
    with pytest.raises(ValueError, match="k must hold at least as many positions as q"):
        scheduled_attention(q, k, v, SCHEDULE)


def test_schedule_for_other_q_len(no_launch: None) -> None:
    """q shorter than k needs a schedule built for that q_len; the square one is refused, and so is a schedule
    for another q_len."""
    q, _, _ = qkv()
    k, v = randn(1, 2, 64, 16), randn(1, 2, 64, 16)
    with pytest.raises(ValueError, match="built for seq_len=48"):
        scheduled_attention(q, k, v, SCHEDULE)
    with pytest.raises(ValueError, match=r"built for q_len=64 queries, but q has sequence length 48"):
        scheduled_attention(q, k, v, dense_causal_schedule(64, 16))
    with pytest.raises(ValueError, match=r"built for q_len=40 queries"):
        scheduled_attention(q, k, v, dense_causal_schedule(64, 16, q_len=40))


def test_k_head_dim_differs_from_q(no_launch: None) -> None:
    q, _, _ = qkv()
    k, v = randn(1, 2, 48, 32), randn(1, 2, 48, 32)
    with pytest.raises(ValueError, match="k must have the same head dimension as q"):
        scheduled_attention(q, k, v, SCHEDULE)


def test_heads_not_multiple_of_kv_heads(no_launch: None) -> None:
    q, k, v = qkv(heads=3, kv_heads=2)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple .* key/value heads \(2\)"):
        scheduled_attention(q, k, v, SCHEDULE)


@pytest.mark.parametrize("dim", [24, 512])
def test_unsupported_head_dim(no_launch: None, dim: int) -> None:
    q, k, v = qkv(dim=dim)
    with pytest.raises(ValueError, match=rf"head dimension \(q.shape\[-1\]\) must be one of .*, got {dim}"):
        scheduled_attention(q, k, v, SCHEDULE)


@pytest.mark.parametrize("block_size", [24, 8])
def test_block_size_not_power_of_two_at_least_16(no_launch: None, block_size: int) -> None:
    q, k, v = qkv()
    schedule = dense_causal_schedule(48, block_size)
    with pytest.raises(ValueError, match=rf"block_size must be a power of two >= 16, got {block_size}"):
        scheduled_attention(q, k, v, schedule)


def test_float64_inputs(no_launch: None) -> None:
    q, k, v = qkv(dtype=torch.float64)
    with pytest.raises(TypeError, match="q must be float16, bfloat16 or float32"):
        scheduled_attention(q, k, v, SCHEDULE)


def test_integer_inputs(no_launch: None) -> None:
    q, k, v = (torch.randint(-5, 5, (1, 2, 48, 16), generator=GEN) for _ in range(3))
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        scheduled_attention(q, k, v, SCHEDULE)


def test_k_dtype_differs_from_q(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match="k must have the same dtype as q"):
        scheduled_attention(q, k.half(), v, SCHEDULE)


def test_schedule_not_a_block_schedule(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match="schedule must be a topo_attn.BlockSchedule, got tuple"):
        scheduled_attention(q, k, v, (SCHEDULE.offsets, SCHEDULE.indices))


def test_transposed_schedule(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="schedule is transposed"):
        scheduled_attention(q, k, v, SCHEDULE.transpose())


def test_schedule_for_another_seq_len(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="schedule was built for seq_len=64"):
        scheduled_attention(q, k, v, dense_causal_schedule(64, 16))


def test_schedule_for_same_blocks_but_another_seq_len(no_launch: None) -> None:
    """Same block count (3) is not enough: the schedule's seq_len must equal q's."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="schedule was built for seq_len=40"):
        scheduled_attention(q, k, v, dense_causal_schedule(40, 16))


@pytest.mark.parametrize("lanes", [(2, 2), (1, 3)])
def test_per_lane_schedule_for_other_lanes(no_launch: None, lanes: tuple[int, int]) -> None:
    q, k, v = qkv(batch=1, heads=2)
    with pytest.raises(ValueError, match=r"schedule holds one row-set per lane for lanes .* but q has \(B, H\)"):
        scheduled_attention(q, k, v, random_schedule(3, 16, 48, lanes))


@pytest.mark.cuda
def test_schedule_on_another_device() -> None:
    q, k, v = (t.cuda() for t in qkv())
    with pytest.raises(ValueError, match="schedule is on cpu but q is on cuda"):
        scheduled_attention(q, k, v, SCHEDULE)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_gradients_flow_to_the_input_that_requires_grad(device: str, name: str) -> None:
    """Inputs may require grad: the gradient reaches that input (and matches the float64 reference through
    torch autograd); the others get none."""
    tensors = dict(zip("qkv", qkv(heads=4, kv_heads=2, device=device)))
    tensors[name].requires_grad_()
    schedule = random_schedule(3, 16, 48, lanes=(1, 4)).to(device)
    out = scheduled_attention(tensors["q"], tensors["k"], tensors["v"], schedule)
    assert out.requires_grad
    d_out = randn(*out.shape).to(device)
    out.backward(d_out)
    reference = {n: t.detach().double().requires_grad_(n == name) for n, t in tensors.items()}
    dense_masked_attention(reference["q"], reference["k"], reference["v"], schedule).backward(d_out.double())
    for n, t in tensors.items():
        assert (t.grad is None) == (n != name)
    torch.testing.assert_close(tensors[name].grad.double(), reference[name].grad, atol=1e-5, rtol=1e-5)


def test_input_that_requires_grad_is_validated_before_launch(no_launch: None) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="schedule was built for seq_len=64"):
        scheduled_attention(q.requires_grad_(), k, v, dense_causal_schedule(64, 16))


def test_requires_grad_under_no_grad_runs(device: str) -> None:
    """The same call under torch.no_grad() runs the kernel and matches the reference."""
    q, k, v = qkv(device=device)
    q.requires_grad_()
    schedule = SCHEDULE.to(device)
    with torch.no_grad():
        out = scheduled_attention(q, k, v, schedule)
        expected = dense_masked_attention(q.double(), k.double(), v.double(), schedule)
    assert not out.requires_grad
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scale", [math.nan, 0.0, math.inf], ids=["nan", "zero", "inf"])
def test_scale_bad_value(no_launch: None, scale: float) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scale must be finite and non-zero"):
        scheduled_attention(q, k, v, SCHEDULE, scale=scale)


@pytest.mark.parametrize("scale", ["0.5", True], ids=["str", "bool"])
def test_scale_bad_type(no_launch: None, scale: object) -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match="scale must be a float or None"):
        scheduled_attention(q, k, v, SCHEDULE, scale=scale)


_NO_INTERPRETER_SCRIPT = """
import torch
import topo_attn
import topo_attn.attention.forward as forward
assert not forward.INTERPRETED and not torch.cuda.is_available()
q = torch.randn(48, 16)
try:
    topo_attn.scheduled_attention(q, torch.randn(48, 16), torch.randn(48, 16), topo_attn.dense_causal_schedule(48, 16))
except ValueError as error:
    print("ValueError:", error)
else:
    raise SystemExit("no error raised")
"""


def test_cpu_tensors_without_cuda_or_interpreter() -> None:
    """Without TRITON_INTERPRET and without CUDA, CPU inputs are refused with a hint at both."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-c", _NO_INTERPRETER_SCRIPT], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ValueError: q is on cpu" in result.stdout
    assert "CUDA" in result.stdout and "TRITON_INTERPRET" in result.stdout


# ------------------------------------------------------------------- dense_masked_attention shares it
def test_dense_masked_attention_rejects_schedule_for_another_seq_len() -> None:
    q, k, v = qkv(dtype=torch.float64)
    with pytest.raises(ValueError, match="schedule was built for seq_len=64"):
        dense_masked_attention(q, k, v, dense_causal_schedule(64, 16))


# ---------------------------------------------------------------------------------- valid calls run
def test_valid_call_2d_shared_schedule(device: str) -> None:
    """[S, D] inputs with a partial last block match the float64 reference, output and log-sum-exp."""
    seq_len = 97
    q, k, v = (randn(seq_len, 32).to(device) for _ in range(3))
    schedule = random_schedule(7, 16, seq_len, seed=5).to(device)
    out, lse = scheduled_attention(q, k, v, schedule, scale=0.3, return_lse=True)
    expected, expected_lse = dense_masked_attention(q.double(), k.double(), v.double(), schedule, scale=0.3,
                                                    return_lse=True)
    assert out.shape == q.shape and out.dtype == torch.float32 and lse.shape == (seq_len,)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)


def test_valid_call_gqa_per_lane_schedule(device: str) -> None:
    """[B, H, S, D] with grouped-query heads and one row-set per lane match the float64 reference."""
    batch, heads, kv_heads, seq_len = 2, 4, 2, 80
    q, k, v = qkv(batch, heads, kv_heads, seq_len, dim=16, device=device)
    schedule = random_schedule(5, 16, seq_len, lanes=(batch, heads), seed=9).to(device)
    out = scheduled_attention(q, k, v, schedule)
    expected = dense_masked_attention(q.double(), k.double(), v.double(), schedule)
    assert out.shape == q.shape
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
