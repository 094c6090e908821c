"""The ``train`` suite of the benchmark runner: backward and forward+backward of scheduled attention next to
SDPA's dense causal attention and FlexAttention with the same block mask (``python -m topo_attn.bench --suite
train``).

Per case (bf16, #22's rule: window 1, one sink, top-k n/8, a schedule shared by all lanes): the time of
``out.backward(dO)`` alone (the forward's graph kept) and of forward + backward, for each of the three. TFLOP/s
count the work done, as in the ``llm`` suite: the causal token pairs for SDPA, the visited token pairs for ours
and FlexAttention; a backward does 2.5x the forward's FLOPs on the same pairs (five matrix products of the
forward's two sizes: recomputed QK^T, dP = dO V^T, dV, dQ, dK). The gradients are checked against a float32
``dense_masked_attention`` through torch autograd on the first lane group.
"""

from __future__ import annotations

import sys

import torch

from .table import markdown_header
from .timing import backward_and_step_ms, visited_pairs

TRAIN_COLUMNS = ["case", "visited / causal blocks", "SDPA bwd ms (TF/s)", "ours bwd ms (TF/s)", "flex bwd ms (TF/s)",
                 "ours / SDPA TF/s", "flex / ours time", "fwd+bwd ms: SDPA / ours / flex", "max grad error"]
BACKWARD_WORK = 2.5  # backward FLOPs per forward FLOP on the same token pairs


def max_grad_error(q, k, v, d_out, schedule) -> float:
    """Largest error of ``q.grad``, ``k.grad``, ``v.grad`` (set by a backward of ``d_out`` through scheduled
    attention with ``schedule``) over the first kv head and the query heads that read it, relative to each
    reference gradient's largest entry; the reference is a float32 ``dense_masked_attention`` through torch
    autograd. ``q`` ``[B, H, S, D]``, ``k`` and ``v`` ``[B, H_kv, S, D]``, ``d_out`` like ``q``."""
    import topo_attn as ta

    group = q.shape[1] // k.shape[1]
    heads, kv = slice(0, group), slice(0, 1)
    leaves = [t[:, s].detach().float().requires_grad_() for t, s in ((q, heads), (k, kv), (v, kv))]
    ta.dense_masked_attention(*leaves, schedule).backward(d_out[:, heads].float())
    ours = (q.grad[:, heads], k.grad[:, kv], v.grad[:, kv])
    return max(((g.float() - t.grad).abs().max() / t.grad.abs().max()).item() for g, t in zip(ours, leaves))


def first_that_compiles(times, name: str) -> tuple[tuple[float, float], bool | None]:
    """FlexAttention's ``(backward ms, forward + backward ms)`` from ``times(autotune)``: first with its default
    tiles, then, where that fails, under inductor's ``max_autotune`` (torch 2.11 on Hopper has one default
    backward tile for D=128, 64 x 128, which a 64-token block mask does not divide; the autotuning search has
    smaller ones). Returns the times and whether they needed autotuning, or NaNs and None when both fail. Each
    failure is reported on stderr, not hidden."""
    for autotune in (False, True):
        try:
            return times(autotune), autotune
        except Exception as exc:  # report, do not hide: the row shows NaN (or the autotuned times) and the reason
            how = "autotuned" if autotune else "default tiles"
            print(f"  FlexAttention ({how}) failed on {name}: {type(exc).__name__}: {str(exc)[:200]}",
                  file=sys.stderr)
    return (float("nan"), float("nan")), None


def run_train_case(case, median_ms, with_flex: bool = True) -> dict:
    """One row for ``case`` (a :class:`~topo_attn.bench.cases.Case`), on a CUDA GPU: backward and forward +
    backward of ours, SDPA and, with ``with_flex``, FlexAttention (:func:`first_that_compiles`: autotuned where
    its default tiles fail, ``flex_autotuned`` says which; NaN columns where both fail), timed by
    ``median_ms(fn)``, and the gradient error of :func:`max_grad_error`."""
    import torch.nn.functional as F

    import topo_attn as ta

    dtype = getattr(torch, case.dtype)
    B, H, H_kv, S, D, bs = case.batch, case.heads, case.kv_heads, case.seq_len, case.head_dim, case.block_size
    gen = torch.Generator(device="cuda").manual_seed(20261203 + S)
    q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    k = torch.randn(B, H_kv, S, D, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    v = torch.randn(B, H_kv, S, D, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    d_out = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen)
    nb = ta.num_blocks(S, bs)
    topk = case.rule_topk
    schedule = ta.topology_schedule(k.detach(), bs, case.window, case.sinks, topk, shared_lane=(0, 0))
    gqa = H_kv != H

    ours = lambda q, k, v: ta.scheduled_attention(q, k, v, schedule)  # noqa: E731
    ours(q, k, v).backward(d_out)
    max_err = max_grad_error(q, k, v, d_out, schedule)
    ours_bwd, ours_step = backward_and_step_ms(ours, q, k, v, d_out, median_ms)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)  # noqa: E731
    sdpa_bwd, sdpa_step = backward_and_step_ms(sdpa, q, k, v, d_out, median_ms)
    flex_bwd = flex_step = float("nan")
    flex_autotuned = None
    if with_flex:  # as in the llm suite
        from torch.nn.attention.flex_attention import flex_attention

        block_mask = schedule.to_flex_block_mask()
        options = {"kernel_options": {"BLOCK_M": 64, "BLOCK_N": 64}} if bs == 64 else {}

        def flex_times(autotune: bool) -> tuple[float, float]:
            torch._dynamo.reset()  # a fresh compile per case: past 8 shapes dynamo would fall back to eager
            with torch._inductor.config.patch(max_autotune=autotune):
                compiled = torch.compile(flex_attention, dynamic=False)
                flex = lambda q, k, v: compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa, **options)  # noqa: E731
                return backward_and_step_ms(flex, q, k, v, d_out, median_ms)

        (flex_bwd, flex_step), flex_autotuned = first_that_compiles(flex_times, case.name)

    causal_pairs = S * (S + 1) // 2
    visited = visited_pairs(schedule)
    work = BACKWARD_WORK * 4 * B * H * D  # backward FLOPs per token pair
    tflops = lambda pairs, ms: work * pairs / (ms * 1e-3) / 1e12  # noqa: E731
    row = dict(
        case=case.name, suite="train", seq_len=S, block_size=bs, batch=B, heads=H, kv_heads=H_kv, head_dim=D,
        dtype=case.dtype, topk_used=topk, scheduled_blocks=schedule.nnz, causal_blocks=nb * (nb + 1) // 2,
        visited_fraction=visited / causal_pairs,
        sdpa_bwd_ms=sdpa_bwd, ours_bwd_ms=ours_bwd, flex_bwd_ms=flex_bwd,
        sdpa_bwd_tflops=tflops(causal_pairs, sdpa_bwd), ours_bwd_tflops=tflops(visited, ours_bwd),
        flex_bwd_tflops=tflops(visited, flex_bwd),
        sdpa_step_ms=sdpa_step, ours_step_ms=ours_step, flex_step_ms=flex_step,
        max_grad_rel_error=max_err, flex_autotuned=flex_autotuned,
    )
    row["ours_vs_sdpa_bwd_tflops"] = row["ours_bwd_tflops"] / row["sdpa_bwd_tflops"]
    row["flex_over_ours_bwd_time"] = flex_bwd / ours_bwd
    return row


def train_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_train_case`)."""
    lines = markdown_header(TRAIN_COLUMNS)
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['scheduled_blocks']} / {r['causal_blocks']} | "
            f"{r['sdpa_bwd_ms']:.3f} ({r['sdpa_bwd_tflops']:.0f}) | {r['ours_bwd_ms']:.3f} ({r['ours_bwd_tflops']:.0f}) | "
            f"{r['flex_bwd_ms']:.3f} ({r['flex_bwd_tflops']:.0f}){' autotuned' if r.get('flex_autotuned') else ''} | "
            f"{r['ours_vs_sdpa_bwd_tflops']:.2f} | "
            f"{r['flex_over_ours_bwd_time']:.2f}x | "
            f"{r['sdpa_step_ms']:.3f} / {r['ours_step_ms']:.3f} / {r['flex_step_ms']:.3f} | "
            f"{r['max_grad_rel_error']:.1e} |")
    return "\n".join(lines)
