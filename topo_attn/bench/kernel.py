"""The ``pr`` and ``llm`` suites of the benchmark runner: the forward kernel against SDPA's dense causal
attention and FlexAttention with the same block mask (``python -m topo_attn.bench --suite pr|llm``).

Per case: the build time of a topology schedule shared by all lanes; the time of scheduled attention with it
and with the dense causal CSR schedule; SDPA's and FlexAttention's times; the kernel's largest error against a
float32 :func:`~topo_attn.attention.reference.dense_masked_attention` on sampled rows and heads. TFLOP/s count
the work done: the causal token pairs for SDPA, the visited token pairs for the block-sparse kernels.
``limit`` is SDPA's time scaled by the visited fraction: what a block-sparse kernel as efficient as SDPA would
take. ``ours_host_us`` is the host time of one call (:func:`~topo_attn.bench.timing.host_us`: validation,
tile choice and Triton's launch) and ``ours_graph_ms`` the kernel's time alone (a CUDA graph replay); at short
sequences the first can exceed the second, and the eager ``ours_ms`` then counts the host's time. The ``pr``
suite adds #22's own column, its dense masked torch reference in float32. ``forward_kernel`` names the forward
that ran (:func:`~topo_attn.forward_kernel`: ``"hopper"`` or ``"portable"``, with ``forward_fallback`` saying
why not the Hopper one).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

from .cases import Case
from .table import markdown_header
from .timing import graph_median_ms, host_us, visited_pairs

PR_COLUMNS = ["seq", "scheduled / dense blocks", "block reduction", "dense masked ms", "full causal SDPA ms",
              "Triton dense CSR ms", "Triton scheduled ms", "Triton sparse vs dense CSR", "Triton vs SDPA",
              "Triton host us", "Triton graph ms", "max abs error"]
LLM_COLUMNS = ["case", "visited / causal blocks", "SDPA ms (TF/s)", "ours ms (TF/s)", "flex ms (TF/s)", "limit ms",
               "ours / SDPA TF/s", "flex / ours time", "dense CSR / SDPA time", "build ms", "max abs error"]


def run_kernel_case(case: Case, suite: str, median_ms: Callable, with_flex: bool = True) -> dict:
    """One row for ``case`` of ``suite`` (``"pr"`` or ``"llm"``), on a CUDA GPU: build the schedule, check the
    kernel against the float32 reference on sampled rows and heads, time SDPA, ours (topology and dense CSR
    schedules) and, with ``with_flex``, FlexAttention (compiled afresh per case with ``fullgraph=True``, so
    dynamo cannot fall back to eager unseen, and its output checked on the same sample as ours: a failure, or
    an output off by more than ten times ours, is reported on stderr and in ``flex_failure``, and its columns
    are NaN). ``median_ms(fn)`` times a call."""
    import torch.nn.functional as F

    import topo_attn as ta

    dtype = getattr(torch, case.dtype)
    B, H, H_kv, S, D, bs = case.batch, case.heads, case.kv_heads, case.seq_len, case.head_dim, case.block_size
    gen = torch.Generator(device="cuda").manual_seed(20260629 + S)
    q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, H_kv, S, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(B, H_kv, S, D, device="cuda", dtype=dtype, generator=gen)
    topk = case.rule_topk

    def build():
        return ta.topology_schedule(k, bs, case.window, case.sinks, topk, shared_lane=(0, 0))

    build_times = []
    for _ in range(3):
        start = time.perf_counter()
        schedule = build()
        torch.cuda.synchronize()
        build_times.append((time.perf_counter() - start) * 1e3)
    dense = ta.dense_causal_schedule(S, bs, device="cuda")

    # correctness on a sample: the last 256 query rows (the longest rows) of the first two heads
    rows = slice(max(0, S - 256), S)
    heads = slice(0, min(H, 2))
    kv_heads = slice(0, min(H_kv, 2)) if H_kv == H else slice(0, 1)
    if H_kv != H:
        heads = slice(0, min(H // H_kv, 2))  # query heads that share kv head 0
    out = ta.scheduled_attention(q, k, v, schedule)
    ref = ta.dense_masked_attention(q[:, heads].float(), k[:, kv_heads].float(), v[:, kv_heads].float(), schedule,
                                    rows=rows)
    max_err = (out[:, heads, rows].float() - ref).abs().max().item()

    gqa = H_kv != H
    sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
    ours_ms = median_ms(lambda: ta.scheduled_attention(q, k, v, schedule))
    kernel, fallback = ta.forward_kernel(q, k, v, schedule, D ** -0.5)
    ours_host_us = host_us(lambda: ta.scheduled_attention(q, k, v, schedule))
    ours_graph_ms = graph_median_ms(lambda: ta.scheduled_attention(q, k, v, schedule))
    dense_ms = median_ms(lambda: ta.scheduled_attention(q, k, v, dense))
    flex_ms, flex_err, flex_failure = float("nan"), None, None
    if with_flex:
        from torch.nn.attention.flex_attention import flex_attention

        # a fresh compile per case (past 8 shapes dynamo would fall back to eager), and fullgraph: a graph
        # break or a fallback raises instead of timing eager FlexAttention
        torch._dynamo.reset()
        flex = torch.compile(flex_attention, dynamic=False, fullgraph=True)
        block_mask = schedule.to_flex_block_mask()
        options = {"kernel_options": {"BLOCK_M": 64, "BLOCK_N": 64}} if bs == 64 else {}
        try:
            flex_out = flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, **options)
            flex_err = (flex_out[:, heads, rows].float() - ref).abs().max().item()
            if not flex_err <= 10 * max(max_err, 1e-3):  # the same sample as ours: a wrong mask is no timing
                raise ValueError(f"FlexAttention's output is off by {flex_err:.2e} (ours {max_err:.2e})")
            flex_ms = median_ms(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, **options))
        except Exception as exc:  # report, do not hide: the row shows NaN and the reason
            flex_failure = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"  FlexAttention failed on {case.name}: {flex_failure}", file=sys.stderr)

    causal_pairs = S * (S + 1) // 2
    visited = visited_pairs(schedule)
    work = 4 * B * H * D  # FLOPs per token pair: QK^T and PV, 2 each
    tflops = lambda pairs, ms: work * pairs / (ms * 1e-3) / 1e12  # noqa: E731
    row = dict(
        case=case.name, suite=suite, **{f"cfg_{k}": v for k, v in asdict(case).items()}, topk_used=topk,
        seq_len=S, scheduled_blocks=schedule.nnz, causal_blocks=dense.nnz,
        block_reduction=1 - schedule.nnz / dense.nnz, visited_fraction=visited / causal_pairs,
        forward_kernel=kernel, forward_fallback=fallback,
        sdpa_ms=sdpa_ms, ours_ms=ours_ms, ours_host_us=ours_host_us, ours_graph_ms=ours_graph_ms,
        dense_csr_ms=dense_ms, flex_ms=flex_ms,
        limit_ms=sdpa_ms * visited / causal_pairs,
        sdpa_tflops=tflops(causal_pairs, sdpa_ms), ours_tflops=tflops(visited, ours_ms),
        flex_tflops=tflops(visited, flex_ms), dense_csr_tflops=tflops(causal_pairs, dense_ms),
        build_ms=statistics.median(build_times), max_abs_error=max_err, flex_max_abs_error=flex_err,
        flex_failure=flex_failure,
    )
    row["ours_vs_sdpa_tflops"] = row["ours_tflops"] / row["sdpa_tflops"]
    row["flex_over_ours_time"] = flex_ms / ours_ms
    row["dense_csr_over_sdpa_time"] = dense_ms / sdpa_ms
    if suite == "pr":  # #22's column: its dense masked torch reference, in float32
        row["dense_masked_ms"] = median_ms(
            lambda: ta.dense_masked_attention(q.float(), k.float(), v.float(), schedule), rep_ms=100)
    return row


def kernel_markdown(rows: list[dict], suite: str) -> str:
    """The markdown table of ``rows`` (from :func:`run_kernel_case`): #22's columns for ``suite == "pr"``, the
    LLM columns otherwise."""
    if suite == "pr":
        lines = markdown_header(PR_COLUMNS, left=0)
        for r in rows:
            lines.append(
                f"| {r['seq_len']} | {r['scheduled_blocks']} / {r['causal_blocks']} | {r['block_reduction']:.1%} | "
                f"{r['dense_masked_ms']:.3f} | {r['sdpa_ms']:.3f} | {r['dense_csr_ms']:.3f} | {r['ours_ms']:.3f} | "
                f"{r['dense_csr_ms'] / r['ours_ms']:.2f}x | {r['sdpa_ms'] / r['ours_ms']:.2f}x | "
                f"{r['ours_host_us']:.1f} | {r['ours_graph_ms']:.4f} | {r['max_abs_error']:.4f} |")
        return "\n".join(lines)
    lines = markdown_header(LLM_COLUMNS)
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['scheduled_blocks']} / {r['causal_blocks']} | {r['sdpa_ms']:.3f} ({r['sdpa_tflops']:.0f}) | "
            f"{r['ours_ms']:.3f} ({r['ours_tflops']:.0f}) | {r['flex_ms']:.3f} ({r['flex_tflops']:.0f}) | "
            f"{r['limit_ms']:.3f} | {r['ours_vs_sdpa_tflops']:.2f} | {r['flex_over_ours_time']:.2f}x | "
            f"{r['dense_csr_over_sdpa_time']:.2f}x | {r['build_ms']:.1f} | {r['max_abs_error']:.1e} |")
    return "\n".join(lines)
