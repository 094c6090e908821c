"""Benchmark runner: ``python -m topo_attn.bench --suite pr|llm|build|train|select``.

Times scheduled attention against SDPA's dense causal attention and FlexAttention with the same block mask,
in one run, on a CUDA GPU. Prints a markdown table and writes JSON (GPU, versions, the exact command, one row
per case) under ``data/benchmarks/``. TFLOP/s count the work done: the causal token pairs for SDPA, the
visited token pairs for the block-sparse kernels. ``limit`` is SDPA's time scaled by the visited fraction:
what a block-sparse kernel as efficient as SDPA would take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .build import BUILD_LENGTHS, build_markdown, run_build_case
from .select import run_select_case, select_markdown
from .train import run_train_case, train_markdown


@dataclass(frozen=True)
class Case:
    """One benchmark shape. ``topk=None`` means #22's choice, ``num_blocks // 8`` (at least 1)."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    block_size: int
    dtype: str
    window: int = 1
    sinks: int = 1
    topk: int | None = None


def _llm(S: int, block: int, B: int = 1, H: int = 32, H_kv: int = 32, D: int = 128) -> Case:
    kv = "" if H_kv == H else f" kv{H_kv}"
    return Case(f"B{B} H{H}{kv} S{S // 1024}k D{D} b{block}", B, H, H_kv, S, D, block, "bfloat16")


SUITES: dict[str, list[Case]] = {
    # triton-lang/kernels#22's own table: one head, fp16, dim 64, block 64, window 1, one sink, top-k n/8
    "pr": [Case(f"S{S}", 1, 1, 1, S, 64, 64, "float16") for S in (1024, 2048, 4096)],
    "llm": [_llm(S, b) for b in (64, 128) for S in (4096, 16384, 32768, 65536)]
    + [_llm(16384, 64, H=16, H_kv=16, D=64), _llm(8192, 64, B=4), _llm(8192, 128, B=4),
       _llm(16384, 128, H_kv=8), _llm(16384, 64, H_kv=8)],
    # schedule construction next to the attention it serves (topo_attn.bench.build)
    "build": [_llm(S, b) for b in (64, 128) for S in BUILD_LENGTHS],
    # forward + backward against SDPA and FlexAttention (topo_attn.bench.train)
    "train": [_llm(S, b) for b in (64, 128) for S in (16384, 32768)] + [_llm(16384, 128, H_kv=8)],
    # selection quality against build + attention time on the captured real q, k, v (topo_attn.bench.select)
    "select": [Case("MiniLM real q/k/v b16", 2, 12, 12, 512, 32, 16, "float16")],
}

PR_COLUMNS = ["seq", "scheduled / dense blocks", "block reduction", "dense masked ms", "full causal SDPA ms",
              "Triton dense CSR ms", "Triton scheduled ms", "Triton sparse vs dense CSR", "Triton vs SDPA",
              "max abs error"]
LLM_COLUMNS = ["case", "visited / causal blocks", "SDPA ms (TF/s)", "ours ms (TF/s)", "flex ms (TF/s)", "limit ms",
               "ours / SDPA TF/s", "flex / ours time", "dense CSR / SDPA time", "build ms", "max abs error"]


def _median_ms(fn, warmup_ms: float = 50, rep_ms: float = 300) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def _visited_pairs(schedule) -> int:
    """Token pairs the kernel computes: full off-diagonal blocks plus the causal part of diagonal blocks."""
    nb, bs, S = schedule.num_blocks, schedule.block_size, schedule.seq_len
    rows = schedule.row_ids() % nb
    q_sizes = torch.clamp(S - rows * bs, max=bs)  # the last query block may be partial
    diagonal = schedule.indices.long() == rows
    full = int(q_sizes[~diagonal].sum()) * bs
    causal = int((q_sizes[diagonal] * (q_sizes[diagonal] + 1) // 2).sum())
    return (full + causal) // schedule.num_lanes


def run_case(case: Case, suite: str, with_flex: bool = True) -> dict:
    """Build the schedule, check the kernel against the float32 reference on sampled rows and heads, time
    SDPA, ours (topology and dense CSR schedules) and FlexAttention."""
    import torch.nn.functional as F

    import topo_attn as ta

    dtype = getattr(torch, case.dtype)
    B, H, H_kv, S, D, bs = case.batch, case.heads, case.kv_heads, case.seq_len, case.head_dim, case.block_size
    gen = torch.Generator(device="cuda").manual_seed(20260629 + S)
    q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, H_kv, S, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(B, H_kv, S, D, device="cuda", dtype=dtype, generator=gen)
    nb = ta.num_blocks(S, bs)
    topk = case.topk if case.topk is not None else max(1, nb // 8)

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
    sdpa_ms = _median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
    ours_ms = _median_ms(lambda: ta.scheduled_attention(q, k, v, schedule))
    dense_ms = _median_ms(lambda: ta.scheduled_attention(q, k, v, dense))
    flex_ms = float("nan")
    if with_flex:
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.reset()  # a fresh compile per case: past 8 shapes dynamo would fall back to eager
        flex = torch.compile(flex_attention, dynamic=False)
        block_mask = schedule.to_flex_block_mask()
        options = {"kernel_options": {"BLOCK_M": 64, "BLOCK_N": 64}} if bs == 64 else {}
        try:
            flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, **options)
            flex_ms = _median_ms(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, **options))
        except Exception as exc:  # report, do not hide: the row shows NaN and the reason
            print(f"  FlexAttention failed on {case.name}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)

    causal_pairs = S * (S + 1) // 2
    visited_pairs = _visited_pairs(schedule)
    work = 4 * B * H * D  # FLOPs per token pair: QK^T and PV, 2 each
    tflops = lambda pairs, ms: work * pairs / (ms * 1e-3) / 1e12  # noqa: E731
    row = dict(
        case=case.name, suite=suite, **{f"cfg_{k}": v for k, v in asdict(case).items()}, topk_used=topk,
        seq_len=S, scheduled_blocks=schedule.nnz, causal_blocks=dense.nnz,
        block_reduction=1 - schedule.nnz / dense.nnz, visited_fraction=visited_pairs / causal_pairs,
        sdpa_ms=sdpa_ms, ours_ms=ours_ms, dense_csr_ms=dense_ms, flex_ms=flex_ms,
        limit_ms=sdpa_ms * visited_pairs / causal_pairs,
        sdpa_tflops=tflops(causal_pairs, sdpa_ms), ours_tflops=tflops(visited_pairs, ours_ms),
        flex_tflops=tflops(visited_pairs, flex_ms), dense_csr_tflops=tflops(causal_pairs, dense_ms),
        build_ms=statistics.median(build_times), max_abs_error=max_err,
    )
    row["ours_vs_sdpa_tflops"] = row["ours_tflops"] / row["sdpa_tflops"]
    row["flex_over_ours_time"] = flex_ms / ours_ms
    row["dense_csr_over_sdpa_time"] = dense_ms / sdpa_ms
    if suite == "pr":  # #22's column: its dense masked torch reference, in float32
        row["dense_masked_ms"] = _median_ms(
            lambda: ta.dense_masked_attention(q.float(), k.float(), v.float(), schedule), rep_ms=100)
    return row


def markdown(rows: list[dict], suite: str) -> str:
    if suite == "pr":
        lines = ["| " + " | ".join(PR_COLUMNS) + " |", "|" + " ---: |" * len(PR_COLUMNS)]
        for r in rows:
            lines.append(
                f"| {r['seq_len']} | {r['scheduled_blocks']} / {r['causal_blocks']} | {r['block_reduction']:.1%} | "
                f"{r['dense_masked_ms']:.3f} | {r['sdpa_ms']:.3f} | {r['dense_csr_ms']:.3f} | {r['ours_ms']:.3f} | "
                f"{r['dense_csr_ms'] / r['ours_ms']:.2f}x | {r['sdpa_ms'] / r['ours_ms']:.2f}x | "
                f"{r['max_abs_error']:.4f} |")
        return "\n".join(lines)
    lines = ["| " + " | ".join(LLM_COLUMNS) + " |", "| --- |" + " ---: |" * (len(LLM_COLUMNS) - 1)]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['scheduled_blocks']} / {r['causal_blocks']} | {r['sdpa_ms']:.3f} ({r['sdpa_tflops']:.0f}) | "
            f"{r['ours_ms']:.3f} ({r['ours_tflops']:.0f}) | {r['flex_ms']:.3f} ({r['flex_tflops']:.0f}) | "
            f"{r['limit_ms']:.3f} | {r['ours_vs_sdpa_tflops']:.2f} | {r['flex_over_ours_time']:.2f}x | "
            f"{r['dense_csr_over_sdpa_time']:.2f}x | {r['build_ms']:.1f} | {r['max_abs_error']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="llm")
    parser.add_argument("--cases", nargs="*", help="only cases whose name contains one of these strings")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compilation is slow)")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. the commit measured)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default data/benchmarks/<suite>_<gpu>.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark runner needs a CUDA GPU; committed results are in data/benchmarks/", file=sys.stderr)
        return 2
    import triton

    cases = [c for c in SUITES[args.suite] if not args.cases or any(s in c.name for s in args.cases)]
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}", file=sys.stderr)
    rows = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.name} ...", file=sys.stderr, flush=True)
        if args.suite == "build":
            rows.append(run_build_case(case, _median_ms))
        elif args.suite == "train":
            rows.append(run_train_case(case, _median_ms, _visited_pairs, with_flex=not args.no_flex))
        elif args.suite == "select":
            rows.extend(run_select_case(case, _median_ms))
        else:
            rows.append(run_case(case, args.suite, with_flex=not args.no_flex))
        torch.cuda.empty_cache()
    tables = {"build": build_markdown, "train": train_markdown, "select": select_markdown}
    table = tables[args.suite](rows) if args.suite in tables else markdown(rows, args.suite)
    print(table)
    command = "python -m topo_attn.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    result = dict(suite=args.suite, gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                  command=command.strip(), date=time.strftime("%Y-%m-%d"), rows=rows, table=table)
    if args.note:
        result["note"] = args.note
    slug = gpu.replace("NVIDIA ", "").replace(" ", "-").lower()
    out = args.out or Path(__file__).resolve().parents[1] / "data" / "benchmarks" / f"{args.suite}_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
