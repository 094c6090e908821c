"""The ``model`` suite of the benchmark runner: a whole transformers model's prefill with the kit's attention
next to SDPA and FlexAttention (``python -m topo_attn.bench --suite model``).

Per case: a LlamaForCausalLM shaped like a 1B model (:data:`LLAMA_1B`: 16 layers, hidden 2048, 32 query and 8
key/value heads of dim 64, intermediate 5632, vocabulary 32000) with random weights in the case's dtype, one
prefill forward of ``seq_len`` random tokens (``model(ids, logits_to_keep=1, use_cache=False)`` under
``torch.no_grad()``) timed with each attention implementation of the same model, switched with
``model.set_attn_implementation``: ``sdpa``, ``flex_attention`` (transformers' own), and the kit's backend
(:mod:`topo_attn.integrations.transformers`) with the ``dense`` selector and with each of
:data:`SPARSE_SELECTORS` at a budget of ``n / 8`` blocks (the case's ``topk`` when set; sinks and window from
the case). Each row gives the time, its ratio to SDPA and to FlexAttention, the visited fraction of the causal
blocks (mean over layers, from :func:`~topo_attn.integrations.transformers.last_stats`) and the largest
difference of the last position's logits from SDPA's. Needs transformers (the ``lm`` extra).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable

import torch

from .table import markdown_header

LLAMA_1B = dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=5632, vocab_size=32000)
"""The model's shape beyond the case's heads and head dim (``hidden_size = heads * head_dim``)."""

SPARSE_SELECTORS = ("centroid", "topology_22")
"""The sparse selectors timed next to ``dense``."""

MODEL_COLUMNS = ["case", "attention", "prefill ms", "/ SDPA time", "/ flex time", "visited blocks",
                 "max |logit - SDPA|"]


def calls_median_ms(fn: Callable[[], object], warmup: int = 1, repeats: int = 5) -> float:
    """Median time of ``fn()`` in milliseconds over ``repeats`` calls after ``warmup`` calls (compilation and
    autotuning happen there), each timed alone with CUDA events. For calls of tens of milliseconds and more,
    where ``triton.testing.do_bench``'s five-call estimate would cost more than the measurement."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def build_model(case, device: str = "cuda", shape: dict | None = None):
    """A LlamaForCausalLM with random weights (seeded) in the case's dtype on ``device``, SDPA attention:
    ``case.heads`` query and ``case.kv_heads`` key/value heads of ``case.head_dim``, the rest from ``shape``
    (default :data:`LLAMA_1B`), in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(LLAMA_1B if shape is None else shape)
    shape.setdefault("hidden_size", case.heads * case.head_dim)
    config = LlamaConfig(num_attention_heads=case.heads, num_key_value_heads=case.kv_heads, head_dim=case.head_dim,
                         max_position_embeddings=max(case.seq_len, 2048), attn_implementation="sdpa", **shape)
    torch.manual_seed(20261225)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(getattr(torch, case.dtype)).eval()


def run_model_case(case, median_ms: Callable = calls_median_ms, with_flex: bool = True, device: str = "cuda",
                   shape: dict | None = None, model=None) -> list[dict]:
    """Rows (one per attention implementation) for ``case`` (a :class:`~topo_attn.bench.cases.Case`) on
    ``device`` with the model of :func:`build_model` (``shape`` as there), or with ``model`` when given (a
    causal LM on ``device`` whose heads match the case's; left on ``sdpa``). ``median_ms(fn)`` times a call;
    FlexAttention (left out without ``with_flex``) that fails is reported on stderr and its row holds NaN."""
    import transformers

    import topo_attn as ta
    from topo_attn.integrations import transformers as tat

    started = time.perf_counter()
    if model is None:
        model = build_model(case, device, shape)
        print(f"  {case.name}: model built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    gen = torch.Generator().manual_seed(case.seq_len)
    ids = torch.randint(0, model.config.vocab_size, (case.batch, case.seq_len), generator=gen).to(device)
    nb = ta.num_blocks(case.seq_len, case.block_size)
    budget = case.topk if case.topk is not None else max(1, nb // 8)
    backends = [("sdpa", "sdpa", None)]
    for selector in ("dense", *SPARSE_SELECTORS):
        name = tat.register(selector=selector, block_size=case.block_size, sinks=case.sinks, window=case.window,
                            budget=budget, name=f"topo_attn_bench_{selector}")
        backends.append((f"topo_attn {selector}", name, selector))
    if with_flex:  # last: its compilation is the slowest step, and a stall there leaves the other rows done
        backends.append(("flex_attention", "flex_attention", None))

    def forward():
        with torch.no_grad():
            return model(ids, logits_to_keep=1, use_cache=False).logits

    rows, reference = [], None
    for label, implementation, selector in backends:
        ms, diff, visited = float("nan"), float("nan"), float("nan")
        started = time.perf_counter()
        try:
            model.set_attn_implementation(implementation)
            logits = forward().float()
            reference = logits if reference is None else reference
            diff = (logits - reference).abs().max().item()
            ms = median_ms(forward)
            if selector is not None:
                stats = tat.last_stats(implementation).values()
                visited = sum(s.visited_fraction for s in stats) / len(stats)
        except Exception as exc:  # as in the other suites: report, do not hide (the row shows NaN)
            if implementation != "flex_attention":
                raise
            print(f"  {label} failed on {case.name}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        # (on stderr as it goes: where the time went, compilation included, even if a later backend stalls)
        print(f"  {case.name}, {label}: {ms:.1f} ms per prefill, {time.perf_counter() - started:.0f} s in all",
              file=sys.stderr, flush=True)
        rows.append(dict(case=case.name, suite="model", attention=label, selector=selector,
                         budget=budget if selector not in (None, "dense") else None, seq_len=case.seq_len,
                         batch=case.batch, heads=case.heads, kv_heads=case.kv_heads, head_dim=case.head_dim,
                         block_size=case.block_size, dtype=case.dtype, layers=model.config.num_hidden_layers,
                         hidden=model.config.hidden_size, transformers=transformers.__version__, ms=ms,
                         visited_fraction=visited, max_logit_diff=diff))
    model.set_attn_implementation("sdpa")
    return _with_ratios(rows)


def _with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` with ``vs_sdpa`` and ``vs_flex``: each time over SDPA's and FlexAttention's (NaN when absent)."""
    times = {r["attention"]: r["ms"] for r in rows}
    sdpa, flex = times.get("sdpa", float("nan")), times.get("flex_attention", float("nan"))
    return [{**r, "vs_sdpa": r["ms"] / sdpa, "vs_flex": r["ms"] / flex} for r in rows]


def model_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_model_case`)."""
    def shown(value: float, form: str, unit: str = "") -> str:  # NaN (no FlexAttention, no schedule): empty
        return "" if math.isnan(value) else format(value, form) + unit

    lines = markdown_header(MODEL_COLUMNS, left=2)
    for r in rows:
        lines.append(f"| {r['case']} | {r['attention']} | {shown(r['ms'], '.1f')} | "
                     f"{shown(r['vs_sdpa'], '.2f', 'x')} | {shown(r['vs_flex'], '.2f', 'x')} | {shown(r['visited_fraction'], '.1%')} | "
                     f"{shown(r['max_logit_diff'], '.2e')} |")
    return "\n".join(lines)
