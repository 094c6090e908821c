"""The Triton backward pass against torch autograd through the float64 reference: shapes, dtypes, GQA, odd
lengths, block sizes, shared and per-lane schedules, unread key blocks, determinism, gradcheck, a short
training loop, and clear errors for what is not supported. On the CPU the kernels run in Triton's
interpreter."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError

import topo_attn as ta
import topo_attn.attention.backward as backward
from helpers import TOLERANCE, inputs, padded_copy, random_schedule, reference_grads  # in tests/


def _kernel_grads(q, k, v, schedule, d_out, scale=None, deterministic=True):
    """Output and (dq, dk, dv) of scheduled_attention for fresh leaves holding q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = ta.scheduled_attention(*leaves, schedule, scale=scale, deterministic=deterministic)
    out.backward(d_out)
    return out.detach(), [t.grad for t in leaves]


def _check_grads(grads, refs, dtype):
    """Each gradient within a few units of the dtype's rounding, relative to that gradient's magnitude."""
    tol = TOLERANCE[dtype]
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert grad.dtype == dtype and grad.shape == ref.shape, name
        assert torch.isfinite(grad).all(), name
        scale = ref.abs().max().item() or 1.0  # an exactly zero gradient (S = 1: dq) must come out ~zero
        torch.testing.assert_close(grad.double(), ref, atol=tol * scale, rtol=tol, msg=lambda m: f"{name}: {m}")


def _compare(q, k, v, schedule, dtype, seed, scale=None, deterministic=True):
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.device, dtype)
    out, grads = _kernel_grads(q, k, v, schedule, d_out, scale, deterministic)
    ref_out, refs = reference_grads(q, k, v, schedule, d_out, scale)
    torch.testing.assert_close(out.double(), ref_out, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    _check_grads(grads, refs, dtype)
    return grads, refs


CASES = [
    # B, H, H_kv, S, D, block_size, dtype
    (1, 1, 1, 128, 64, 64, torch.float16),
    (2, 2, 2, 97, 32, 16, torch.float16),
    (1, 4, 2, 200, 64, 32, torch.bfloat16),
    (1, 4, 2, 130, 16, 64, torch.float32),
    (2, 2, 1, 160, 128, 64, torch.bfloat16),
    (1, 2, 2, 77, 128, 16, torch.float32),
    (1, 3, 3, 129, 32, 32, torch.float32),
    (1, 2, 1, 250, 16, 128, torch.float16),
    (1, 2, 1, 45, 256, 16, torch.bfloat16),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-lane"])
@pytest.mark.parametrize("B,H,H_kv,S,D,block_size,dtype", CASES)
def test_gradients_match_reference(B, H, H_kv, S, D, block_size, dtype, per_lane, deterministic, device):
    seed = S * D + H
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), dtype, device, seed)
    schedule = random_schedule(torch.Generator().manual_seed(seed), S, block_size,
                               lanes=(B, H) if per_lane else None, device=device)
    _, refs = _compare(q, k, v, schedule, dtype, seed, deterministic=deterministic)
    assert all(ref.abs().max() > 0 for ref in refs), "a zero reference gradient would test nothing"


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_a_padded_schedule_gives_the_reference_output_and_gradients(deterministic, device):
    """A padded schedule (entries in a longer buffer of junk, as topology_22's GPU build leaves it): the forward
    and every gradient match the float64 reference of its exact entries, and equal the exact schedule's run;
    a few queries at the end of the keys (the split-K decode kernel) read it as well."""
    B, H, H_kv, S, D, bs, dtype = 1, 4, 2, 160, 32, 32, torch.float16
    q, k, v = inputs((B, H, S, D), (B, H_kv, S, D), dtype, device, 11)
    exact = random_schedule(torch.Generator().manual_seed(11), S, bs, lanes=(B, H_kv), device=device)
    padded = padded_copy(exact, 29)
    _compare(q, k, v, padded, dtype, 11, deterministic=deterministic)
    if deterministic:
        d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(device, dtype)
        for got, want in zip(_kernel_grads(q, k, v, padded, d_out)[1], _kernel_grads(q, k, v, exact, d_out)[1]):
            assert torch.equal(got, want)
    step = random_schedule(torch.Generator().manual_seed(13), S, bs, lanes=(B, H_kv), device=device, q_len=3)
    with torch.no_grad():
        out = ta.scheduled_attention(q[:, :, -3:], k, v, padded_copy(step, 7))
        want = ta.dense_masked_attention(q[:, :, -3:].double(), k.double(), v.double(), step)
    torch.testing.assert_close(out.double(), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    seq_len=st.integers(1, 200),
    block_size=st.sampled_from([16, 32, 64]),
    head_dim=st.sampled_from([16, 32, 64]),
    heads=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2)]),
    per_lane=st.booleans(),
    diagonal=st.sampled_from([None, True, False]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
)
def test_random_valid_schedules_match_reference(seed, seq_len, block_size, head_dim, heads, per_lane, diagonal,
                                                dtype):
    """Any valid CSR schedule: rows with and without the diagonal block, partial last blocks, lengths shorter
    than one block."""
    from helpers import DEVICE

    H, H_kv = heads
    schedule = random_schedule(torch.Generator().manual_seed(seed), seq_len, block_size,
                               lanes=(1, H) if per_lane else None, diagonal=diagonal, device=DEVICE)
    q, k, v = inputs((1, H, seq_len, head_dim), (1, H_kv, seq_len, head_dim), dtype, DEVICE, seed)
    _compare(q, k, v, schedule, dtype, seed)


@pytest.mark.parametrize("S,D,block_size,dtype", [(200, 64, 32, torch.float16), (97, 16, 16, torch.float32)])
def test_two_dimensional_inputs(S, D, block_size, dtype, device):
    """[S, D] inputs: gradients come back as [S, D]."""
    q, k, v = inputs((S, D), (S, D), dtype, device, seed=S)
    schedule = ta.topology_schedule(k, block_size, window=1, sinks=1, topk=1)
    grads, _ = _compare(q, k, v, schedule, dtype, seed=S)
    assert all(g.shape == (S, D) for g in grads)


def test_dense_schedule_equals_sdpa_gradients(device):
    """With every causal block scheduled the gradients are those of plain causal attention (torch's SDPA in
    float64, an implementation independent of dense_masked_attention)."""
    q, k, v = inputs((1, 2, 150, 32), (1, 2, 150, 32), torch.float32, device, seed=31)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(32)).to(device)
    _, grads = _kernel_grads(q, k, v, ta.dense_causal_schedule(150, 32, device=device), d_out)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True).backward(d_out.double())
    _check_grads(grads, [t.grad for t in leaves], torch.float32)


def test_custom_scale_strided_inputs_and_expanded_output_gradient(device):
    """A [B, S, H, D] layout viewed as [B, H, S, D], a custom scale, and ``out.sum()`` (whose output gradient
    is an expanded tensor with zero strides): strides are runtime arguments everywhere."""
    gen = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, 130, 4, 32, generator=gen).to(device).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    schedule = ta.topology_schedule(k, 32, window=1, sinks=1, topk=1)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]  # clone keeps the strides
    assert not leaves[0].is_contiguous()
    ta.scheduled_attention(*leaves, schedule, scale=0.3).sum().backward()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ta.dense_masked_attention(*ref_leaves, schedule, scale=0.3).sum().backward()
    _check_grads([t.grad for t in leaves], [t.grad for t in ref_leaves], torch.float32)


@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-lane"])
def test_unread_key_blocks_get_zero_gradients(per_lane, device):
    """Key blocks that no query block schedules get dK = dV = 0 exactly, as in the reference. Per lane with
    GQA, a key block read by only one head of the group gets that head's gradient."""
    S, bs, H, H_kv = 100, 16, 4, 2  # 7 blocks, the last one partial
    n = ta.num_blocks(S, bs)
    mask = torch.eye(n, dtype=torch.bool)
    mask[:, 0] = True
    mask[2, 2] = mask[5, 5] = False  # key blocks 2 and 5: nobody reads them
    mask[6, 5] = False
    if per_lane:
        mask = mask.expand(1, H, n, n).clone()
        mask[0, 1, 3, 3] = False  # key block 3 of kv head 0: read by query head 0 only
        mask[0, 1, 3, 1] = True
        mask[0, 2:, 4, 4] = False  # key block 4 of kv head 1: read by nobody (query heads 2 and 3)
        mask[0, 2:, 4, 1] = True
    schedule = ta.BlockSchedule.from_block_mask(mask, bs, S).to(device)
    unread = [2, 5]
    q, k, v = inputs((1, H, S, 32), (1, H_kv, S, 32), torch.float32, device, seed=3)
    grads, refs = _compare(q, k, v, schedule, torch.float32, seed=3)
    for g, ref in zip(grads[1:], refs[1:]):
        for b in unread:
            assert torch.equal(g[..., b * bs:(b + 1) * bs, :], torch.zeros_like(g[..., b * bs:(b + 1) * bs, :]))
            assert torch.equal(ref[..., b * bs:(b + 1) * bs, :], torch.zeros_like(ref[..., b * bs:(b + 1) * bs, :]))
        if per_lane:
            assert (g[0, 1, 4 * bs:5 * bs] == 0).all() and (g[0, 0, 4 * bs:5 * bs] != 0).any()
            assert (g[0, 0, 3 * bs:4 * bs] != 0).any()


def test_backward_is_deterministic(device):
    """The deterministic path has no atomics: two backward passes give bit-identical gradients (GQA sums the
    group in registers)."""
    q, k, v = inputs((2, 4, 190, 64), (2, 2, 190, 64), torch.bfloat16, device, seed=8)
    schedule = random_schedule(torch.Generator().manual_seed(8), 190, 32, lanes=(2, 4), device=device)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(device, torch.bfloat16)
    _, first = _kernel_grads(q, k, v, schedule, d_out, deterministic=True)
    _, second = _kernel_grads(q, k, v, schedule, d_out, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("argument,torch_flag,expected", [
    (None, False, "deterministic"), (True, False, "deterministic"), (False, False, "atomic"),
    (False, True, "deterministic"),
])
def test_backward_path_follows_the_argument_then_torch(argument, torch_flag, expected, device, monkeypatch):
    """The backward is deterministic by default; ``deterministic=False`` takes the atomic path unless
    ``torch.use_deterministic_algorithms(True)`` is in force. The launcher is wrapped to record the path it
    was given (it still runs the kernels, whose gradients are checked)."""
    seen = []
    launcher = backward.scheduled_attention_backward

    def recording(*args, **kwargs):
        seen.append(kwargs["path"])
        return launcher(*args, **kwargs)

    monkeypatch.setattr(backward, "scheduled_attention_backward", recording)
    q, k, v = inputs((1, 2, 70, 16), (1, 1, 70, 16), torch.float32, device, seed=14)
    schedule = random_schedule(torch.Generator().manual_seed(14), 70, 16, device=device)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(15)).to(device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(torch_flag)
    try:
        kwargs = {} if argument is None else {"deterministic": argument}
        assert backward.backward_path(**kwargs) == expected
        ta.scheduled_attention(*leaves, schedule, **kwargs).backward(d_out)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert seen == [expected]
    _check_grads([t.grad for t in leaves], reference_grads(q, k, v, schedule, d_out)[1], torch.float32)


def test_deterministic_must_be_a_bool(device):
    q, k, v = inputs((1, 1, 32, 16), (1, 1, 32, 16), torch.float32, device, seed=15)
    for bad in (1, None):
        with pytest.raises(TypeError, match="deterministic must be True or False, got"):
            ta.scheduled_attention(q, k, v, ta.dense_causal_schedule(32, 16, device=device), deterministic=bad)


def test_tile_shapes_agree(device):
    """The kernels are correct for any tiles that divide the block (as a tuner may pick): more query than key
    rows per step and the reverse, in both kernels, on both paths."""
    S, D, bs = 150, 32, 64
    q, k, v = inputs((1, 2, S, D), (1, 1, S, D), torch.float16, device, seed=12)
    schedule = random_schedule(torch.Generator().manual_seed(12), S, bs, lanes=(1, 2), device=device)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(13)).to(device, torch.float16)
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    _, refs = reference_grads(q, k, v, schedule, d_out)
    for m, n in ((16, 64), (64, 16), (32, 32)):
        tiles = dict(BLOCK_M=m, BLOCK_N=n, num_warps=4, NUM_STAGES=2)
        config = dict(dq=tiles, dkdv=dict(tiles, BLOCK_M=n, BLOCK_N=m))
        for path in ("atomic", "deterministic"):
            grads = backward.scheduled_attention_backward(d_out, q, k, v, out, lse, schedule, D ** -0.5,
                                                          config=config, path=path)
            _check_grads(grads, refs, torch.float16)


def test_lse_is_not_differentiable(device):
    """The returned log-sum-exp carries no gradient: it does not require grad, backpropagating through it
    alone raises, and adding it to a loss changes nothing."""
    q, k, v = (t.requires_grad_() for t in inputs((1, 2, 64, 16), (1, 2, 64, 16), torch.float32, device, 4))
    schedule = ta.dense_causal_schedule(64, 16, device=device)
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()
    (out.sum() + lse.sum()).backward()
    with_lse = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ta.scheduled_attention(q, k, v, schedule).sum().backward()
    for a, t in zip(with_lse, (q, k, v)):
        assert torch.equal(a, t.grad)


# gradcheck. The kernels take fp16/bf16/fp32, not float64, so gradcheck runs on a float64 function of a few
# variables around a float32 kernel call: q, k, v move along 4 random (signed) directions each, are rounded to
# float32, and the output is read through 4 random projections. Slow-mode gradcheck compares every entry of
# that 4 x 12 Jacobian; the surrounding torch ops are exact chain rule, so it checks the kernels' backward.
# Central differences with eps = 3e-3 err by about 2^-24 |y| / eps (the float32 rounding of the output, ~1e-5)
# plus eps^2 |y'''| (~1e-5); measured errors are <= 3e-5 on entries of size 0.4-1.3. atol 2e-4 and rtol 2e-3
# leave over 5x margin, while a gradient that is 1% off fails (test_gradcheck_can_fail).
GRADCHECK = dict(eps=3e-3, atol=2e-4, rtol=2e-3, nondet_tol=0.0)


def _projected(seed, B, H, H_kv, S, D, block_size, per_lane, device, n=4, m=4):
    gen = torch.Generator().manual_seed(seed)
    schedule = random_schedule(gen, S, block_size, lanes=(B, H) if per_lane else None, device=device)
    base = [torch.randn(B, h, S, D, generator=gen, dtype=torch.float64).to(device) for h in (H, H_kv, H_kv)]
    directions = [torch.randn(n, *b.shape, generator=gen, dtype=torch.float64).to(device) for b in base]
    readout = (torch.randn(m, B, H, S, D, generator=gen, dtype=torch.float64) / (B * H * S * D) ** 0.5).to(device)

    def f(xq, xk, xv):
        q, k, v = ((b + torch.tensordot(x, d, 1)).float() for b, x, d in zip(base, (xq, xk, xv), directions))
        return (readout * ta.scheduled_attention(q, k, v, schedule).double()).flatten(1).sum(1)

    return f, [torch.zeros(n, dtype=torch.float64, device=device, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("B,H,H_kv,S,D,block_size,per_lane", [
    (1, 2, 1, 40, 16, 16, True),
    (2, 1, 1, 50, 32, 32, False),
])
def test_gradcheck(B, H, H_kv, S, D, block_size, per_lane, device):
    f, xs = _projected(S, B, H, H_kv, S, D, block_size, per_lane, device)
    assert torch.autograd.gradcheck(f, xs, **GRADCHECK)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["dq", "dk", "dv"])
def test_gradcheck_can_fail(which, device, monkeypatch):
    """The gradcheck above with one gradient 1% off fails."""
    launcher = backward.scheduled_attention_backward

    def off_by_one_percent(*args, **kwargs):
        grads = list(launcher(*args, **kwargs))
        grads[which] = grads[which] * 1.01
        return tuple(grads)

    monkeypatch.setattr(backward, "scheduled_attention_backward", off_by_one_percent)
    f, xs = _projected(40, 1, 2, 1, 40, 16, 16, True, device)
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        torch.autograd.gradcheck(f, xs, **GRADCHECK)


def _train(attention, schedule, device, steps=5):
    """A one-layer model: x -> q, k, v projections (GQA: 4 query heads, 2 kv heads) -> attention -> output
    projection -> MSE to a random target; ``steps`` Adam steps. Returns the losses."""
    gen = torch.Generator().manual_seed(2024)
    S, d_model, H, H_kv, D = schedule.seq_len, 48, 4, 2, 16
    x, target = (torch.randn(S, d_model, generator=gen).to(device) for _ in range(2))
    params = [(torch.randn(*shape, generator=gen) / shape[0] ** 0.5).to(device).requires_grad_()
              for shape in ((d_model, H * D), (d_model, H_kv * D), (d_model, H_kv * D), (H * D, d_model))]
    wq, wk, wv, wo = params
    optimizer = torch.optim.Adam(params, lr=3e-2)
    losses = []
    for _ in range(steps):
        q, k, v = ((x @ w).view(S, h, D).transpose(0, 1)[None] for w, h in ((wq, H), (wk, H_kv), (wv, H_kv)))
        out = attention(q, k, v, schedule)[0].transpose(0, 1).reshape(S, H * D)
        loss = ((out @ wo - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_loop_matches_dense_reference(device):
    """Adam steps through scheduled_attention follow the same losses as through dense_masked_attention."""
    schedule = random_schedule(torch.Generator().manual_seed(5), 120, 16, lanes=(1, 4), device=device)
    ours = _train(ta.scheduled_attention, schedule, device)
    reference = _train(ta.dense_masked_attention, schedule, device)
    assert reference[-1] < 0.9 * reference[0], "the loop should learn something"
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(reference), atol=0, rtol=1e-4)


# ------------------------------------------------------------------------------ what is not supported
def test_second_derivative_raises(device):
    q, k, v = (t.requires_grad_() for t in inputs((1, 1, 32, 16), (1, 1, 32, 16), torch.float32, device, 6))
    out = ta.scheduled_attention(q, k, v, ta.dense_causal_schedule(32, 16, device=device))
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        dq.sum().backward()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch importing functorch
def test_forward_mode_ad_raises(device):
    """Dual tensors would otherwise lose their tangent silently (the kernel reads only the primal)."""
    import torch.autograd.forward_ad as fwAD

    q, k, v = inputs((1, 1, 32, 16), (1, 1, 32, 16), torch.float32, device, 7)
    schedule = ta.dense_causal_schedule(32, 16, device=device)
    with fwAD.dual_level():
        with pytest.raises(ValueError, match="k is a forward-mode AD dual tensor"):
            ta.scheduled_attention(q, fwAD.make_dual(k, torch.randn_like(k)), v, schedule)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch importing functorch
def test_functorch_transforms_raise(device):
    q, k, v = inputs((1, 1, 32, 16), (1, 1, 32, 16), torch.float32, device, 8)
    schedule = ta.dense_causal_schedule(32, 16, device=device)
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda q: ta.scheduled_attention(q, k, v, schedule).sum())(q)


def test_inputs_modified_after_forward_raise(device):
    """The backward reads the saved inputs: changing one in place afterwards raises instead of giving
    gradients of other values."""
    q, k, v = (t.requires_grad_() for t in inputs((1, 1, 32, 16), (1, 1, 32, 16), torch.float32, device, 9))
    k_used = k * 1.0
    out = ta.scheduled_attention(q, k_used, v, ta.dense_causal_schedule(32, 16, device=device))
    k_used.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# ------------------------------------------------------------------------------ compiled kernels (GPU)
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D", [16, 32, 64, 128, 256])
def test_every_tile_config_compiles_and_matches(D, dtype):
    """Every default tile configuration compiles within the GPU's shared memory and is correct, for every
    block size, with a partial last block and GQA."""
    S = 1000
    q, k, v = inputs((1, 4, S, D), (1, 2, S, D), dtype, "cuda", seed=D)
    for block_size in (16, 32, 64, 128):
        schedule = ta.topology_schedule(k.repeat_interleave(2, dim=1), block_size, window=1, sinks=1, topk=2)
        _compare(q, k, v, schedule, dtype, seed=block_size)


@pytest.mark.cuda
def test_backward_new_sequence_length_does_not_recompile():
    """Sequence length is a runtime argument of the backward kernels too."""
    def compiled() -> set:
        kernels = (backward.attention_bwd_preprocess_kernel, backward.attention_bwd_dq_kernel,
                   backward.attention_bwd_dkdv_kernel)
        return {(i, key) for i, kernel in enumerate(kernels) for cache in kernel.device_caches.values()
                for key in cache[0]}

    for i, S in enumerate([1024, 1000, 1536, 777, 2048]):
        q, k, v = inputs((1, 2, S, 64), (1, 2, S, 64), torch.float16, "cuda", seed=S)
        schedule = ta.topology_schedule(k, 64, window=1, sinks=1, topk=2)
        _compare(q, k, v, schedule, torch.float16, seed=S)
        if i == 0:
            after_first = compiled()
    assert compiled() == after_first, f"new kernel variants: {compiled() - after_first}"


@pytest.mark.cuda
def test_backward_offsets_beyond_32_bits():
    """B * H * S * D > 2^31: the last head's addresses overflow int32 unless the kernels use 64-bit offsets. A
    diagonal-only schedule keeps the reference cheap (causal attention within each block)."""
    H, S, D, block_size = 66, 262144, 128, 128
    assert H * S * D > 2**31
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, d_out = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    n = S // block_size
    schedule = ta.BlockSchedule(torch.arange(n + 1, device="cuda"), torch.arange(n, device="cuda"), block_size, S)
    _, grads = _kernel_grads(q, k, v, schedule, d_out)
    last = [t[0, -1].clone() for t in (q, k, v, d_out)]
    grads = [g[0, -1].clone() for g in grads]
    del q, k, v, d_out
    torch.cuda.empty_cache()
    leaves = [t.double().view(n, block_size, D).requires_grad_() for t in last[:3]]
    torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True).backward(
        last[3].double().view(n, block_size, D))
    _check_grads(grads, [t.grad.view(S, D) for t in leaves], torch.bfloat16)
