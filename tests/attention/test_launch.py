"""The short launch path (``topo_attn/launch.py``): the launch key holds what Triton specialises on, and on a
GPU a kernel launched directly gives what Triton's own path gives, with a new compiled kernel for inputs
that Triton would specialise differently (unaligned addresses)."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from helpers import DEVICE, TOLERANCE, inputs, random_schedule  # in tests/
from topo_attn import launch


def test_the_key_separates_what_triton_specialises_on():
    """Ints equal to 1, divisible by 16 and past 32 bits; aligned and unaligned tensor addresses; dtypes."""
    spec = launch.specialisation
    assert len({spec(1), spec(2), spec(16), spec(32), spec(1 << 31), spec(-(1 << 31) - 1)}) == 5
    assert spec(16) == spec(48) and spec(3) == spec(5)
    assert spec(16, True) == spec(17, True) == spec(1, True) != spec(1 << 31, True)  # do_not_specialize
    x = torch.randn(64, dtype=torch.float16)
    assert spec(x) != spec(x[1:])  # 2 bytes off: no longer 16-byte aligned
    assert spec(x) == spec(x[8:])  # 16 bytes off: still aligned
    assert spec(x) != spec(x.float())
    assert spec(0.5) == spec(2.0) and spec(None) is type(None)
    t = x.view(1, 1, 8, 8)
    assert spec(launch.Tiles(t, [1, 1, 8, 8])) != spec(launch.Tiles(t, [1, 1, 4, 8]))
    with pytest.raises(TypeError, match="str"):
        spec("a string")


def test_tiles_become_triton_descriptors():
    """``Tiles`` holds the tensor's shape and strides and builds triton's descriptor (validated there)."""
    t = torch.randn(2, 3, 32, 16, dtype=torch.float16).transpose(1, 2)
    tiles = launch.Tiles(t, [1, 1, 8, 16])
    assert tiles.shape == list(t.shape) and tiles.strides == list(t.stride()) and tiles.padding == "zero"
    descriptor = tiles.descriptor()
    assert descriptor.base is t and list(descriptor.block_shape) == [1, 1, 8, 16]


def test_the_interpreter_s_numpy_problem_is_named_by_version():
    """Triton < 3.7's interpreter fails with numpy >= 2.4; every other pairing runs."""
    reason = launch.interpreter_unsupported_reason
    assert "install triton>=3.7 or numpy<2.4" in reason("3.6.0", "2.4.1")
    assert reason("3.1.0", "2.4.0") and reason("3.6.0", "3.0.0")
    assert reason("3.7.0", "2.4.1") is None and reason("3.9.0", "2.4.0") is None
    assert reason("3.6.0", "2.3.5") is None and reason("3.6.0", "1.26.4") is None


def test_an_interpreter_that_cannot_run_stops_before_the_launch(monkeypatch, device):
    """Where the interpreter cannot run (``INTERPRETER_PROBLEM``), a kernel call raises that reason, on the
    launch path every call takes in the interpreter, before any launch."""
    monkeypatch.setattr(launch, "DIRECT", False)
    monkeypatch.setattr(launch, "INTERPRETER_PROBLEM", "the interpreter cannot run here: install something")
    q, k, v = inputs((1, 2, 128, 16), (1, 2, 128, 16), torch.float16, device, seed=3)
    with pytest.raises(RuntimeError, match="the interpreter cannot run here"):
        ta.scheduled_attention(q, k, v, ta.dense_causal_schedule(128, 32, device=device))


@pytest.mark.cuda
def test_direct_launches_match_and_respecialise():
    """Repeated calls reuse one compiled kernel per key; an unaligned view of the same values then gets its
    own and the same answer as the float64 reference."""
    if not launch.DIRECT:
        pytest.skip("direct launches need triton 3.6 and a compiled kernel")
    B, H, S, D = 1, 2, 300, 64
    q, k, v = inputs((B, H, S, D), (B, H, S, D), torch.float16, DEVICE, seed=5)
    schedule = random_schedule(torch.Generator().manual_seed(5), S, 64, device=DEVICE)
    ref = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule)
    tol = TOLERANCE[torch.float16]
    first = ta.scheduled_attention(q, k, v, schedule, kernel="portable")
    plans = len(launch.PLANS)
    for _ in range(3):
        again = ta.scheduled_attention(q, k, v, schedule, kernel="portable")
        torch.testing.assert_close(again, first, atol=0, rtol=0)
    assert len(launch.PLANS) == plans
    # the same values at an address 2 bytes past a 16-byte boundary: pointer loads, another specialisation
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)
    q_odd = flat[1:].view_as(q).copy_(q)
    out = ta.scheduled_attention(q_odd, k, v, schedule, kernel="portable")
    assert len(launch.PLANS) > plans
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(first.double(), ref, atol=tol, rtol=tol)
