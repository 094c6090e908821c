"""The ``build`` suite of the benchmark runner: what a topology schedule costs to build, next to the attention
it serves (``python -m topo_attn.bench --suite build``).

Per sequence length and block size (B=1, H=32, D=128, bf16, window 1, one sink, top-k n/8): the build time of
a shared schedule and of per-lane schedules (one per head) on the GPU in float64 and float32 and, for the
shared one, on the CPU; our attention time with each schedule; SDPA's dense causal time. The break-even
length is the shortest one from which build + scheduled attention beats SDPA.
"""

from __future__ import annotations

import sys
import time

import torch

from .table import markdown_header

BUILD_COLUMNS = ["case", "blocks", "SDPA ms", "shared: build ms (f32) / attn ms", "build / attn",
                 "(build + attn) / SDPA", "per-lane: build ms (f32) / attn ms", "build / attn",
                 "(build + attn) / SDPA", "CPU shared build ms"]


def run_build_case(case, median_ms) -> dict:
    """One row for ``case`` (a :class:`~topo_attn.bench.cases.Case`), on a CUDA GPU: the schedule builds and
    the attention timed by ``median_ms(fn)``, and whether the GPU builds (float64 and float32) equal the CPU
    path's (a difference is also reported on stderr)."""
    import torch.nn.functional as F

    import topo_attn as ta

    B, H, S, D, bs = case.batch, case.heads, case.seq_len, case.head_dim, case.block_size
    gen = torch.Generator(device="cuda").manual_seed(20261202 + S)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=getattr(torch, case.dtype), generator=gen)
               for _ in range(3))
    nb = ta.num_blocks(S, bs)
    topk = case.rule_topk
    rule = (bs, case.window, case.sinks, topk)

    def build(keys, dtype=torch.float64, **kwargs):
        return ta.topology_schedule(keys, *rule, dtype=dtype, **kwargs)

    shared = build(k, shared_lane=(0, 0))
    per_lane = build(k)
    # the GPU builds must equal the CPU path's (float64); the float32 build is timed and compared too
    cpu_keys = k[0, 0].cpu()
    cpu_shared = build(cpu_keys)
    same = (torch.equal(shared.indices.cpu(), cpu_shared.indices)
            and torch.equal(shared.offsets.cpu(), cpu_shared.offsets))
    f32 = build(k, torch.float32, shared_lane=(0, 0))
    same_f32 = torch.equal(f32.indices, shared.indices) and torch.equal(f32.offsets, shared.offsets)
    row = dict(
        case=case.name, suite="build", seq_len=S, block_size=bs, num_blocks=nb, lanes=B * H, topk_used=topk,
        shared_equals_cpu=same, shared_f32_equals_f64=same_f32,
        sdpa_ms=median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        shared_build_ms=median_ms(lambda: build(k, shared_lane=(0, 0))),
        shared_build_f32_ms=median_ms(lambda: build(k, torch.float32, shared_lane=(0, 0))),
        shared_attn_ms=median_ms(lambda: ta.scheduled_attention(q, k, v, shared)),
        lane_build_ms=median_ms(lambda: build(k)),
        lane_build_f32_ms=median_ms(lambda: build(k, torch.float32)),
        lane_attn_ms=median_ms(lambda: ta.scheduled_attention(q, k, v, per_lane)),
    )
    start = time.perf_counter()
    build(cpu_keys)
    row["cpu_shared_build_ms"] = (time.perf_counter() - start) * 1e3
    for kind in ("shared", "lane"):
        row[f"{kind}_build_over_attn"] = row[f"{kind}_build_ms"] / row[f"{kind}_attn_ms"]
        row[f"{kind}_total_over_sdpa"] = (row[f"{kind}_build_ms"] + row[f"{kind}_attn_ms"]) / row["sdpa_ms"]
    if not same:
        print(f"  {case.name}: GPU shared schedule differs from the CPU one", file=sys.stderr)
    return row


def build_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_build_case`), then the break-even sentence."""
    lines = markdown_header(BUILD_COLUMNS)
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['num_blocks']} | {r['sdpa_ms']:.3f} | "
            f"{r['shared_build_ms']:.3f} ({r['shared_build_f32_ms']:.3f}) / {r['shared_attn_ms']:.3f} | "
            f"{r['shared_build_over_attn']:.1%} | {r['shared_total_over_sdpa']:.2f} | "
            f"{r['lane_build_ms']:.3f} ({r['lane_build_f32_ms']:.3f}) / {r['lane_attn_ms']:.3f} | "
            f"{r['lane_build_over_attn']:.1%} | {r['lane_total_over_sdpa']:.2f} | {r['cpu_shared_build_ms']:.1f} |")
    lines.append("")
    lines.append(break_even(rows))
    return "\n".join(lines)


def break_even(rows: list[dict]) -> str:
    """The shortest measured length from which build + scheduled attention beats SDPA, per block size and
    kind of schedule, in words."""
    parts = []
    for bs in sorted({r["block_size"] for r in rows}):
        for kind, name in (("shared", "shared schedule"), ("lane", "per-lane schedules")):
            measured = sorted((r["seq_len"], r[f"{kind}_total_over_sdpa"] < 1) for r in rows if r["block_size"] == bs)
            # the first length after the last loss, if the sparse path wins there
            last_loss = max((i for i, (_, win) in enumerate(measured) if not win), default=-1)
            first = measured[last_loss + 1][0] if last_loss + 1 < len(measured) else None
            where = f"from S = {first}" if first is not None else "at no measured length"
            parts.append(f"block {bs}, {name}: build + attention beats SDPA {where}")
    return "Break-even: " + "; ".join(parts) + "."
