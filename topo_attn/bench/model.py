"""The ``model`` suite of the benchmark runner: a whole transformers model's prefill with the kit's attention
next to SDPA and FlexAttention (``python -m topo_attn.bench --suite model``).

Per case: a LlamaForCausalLM shaped like a 1B model (:data:`LLAMA_1B`: 16 layers, hidden 2048, 32 query and 8
key/value heads of dim 64, intermediate 5632, vocabulary 32000) with random weights in the case's dtype, one
prefill forward of ``seq_len`` random tokens (``model(ids, logits_to_keep=1, use_cache=False)`` under
``torch.no_grad()``) timed with each attention implementation of the same model, switched with
``model.set_attn_implementation``, in this order:

- the **no-attention floor** (:data:`FLOOR`): an attention that returns its values, so its time is everything
  but attention (what sparsity cannot save);
- ``sdpa``; the kit's backend (:mod:`topo_attn.integrations.transformers`) with ``dense``; then every selector
  of the registry at a budget of ``n / 8`` blocks and at :data:`FIXED_BUDGET` blocks (2048 tokens with 64-token
  blocks), one sink and a one-block window (the case's), each key/value head's query heads choosing together.
  Selectors whose scores need host syncs (``oracle``, the cluster selectors) run only up to
  :data:`SLOW_SELECTORS_UP_TO` tokens; longer cases give them a row with NaN and the reason;
- ``flex_attention`` (transformers' own) last, when asked for.

Each row gives the time, its ratio to SDPA and to FlexAttention, the **attention share**
``(ms - floor) / (sdpa_ms - floor)`` (the row's attention over SDPA's, the rest of the model taken out), the
visited fraction of the causal blocks (mean over layers), the largest difference of the last position's
logits from SDPA's, the host syncs of one forward (counted with ``torch.cuda.set_sync_debug_mode``), and for the
kit's rows, from one more forward with CUDA events around each layer's schedule and kernels
(:func:`~topo_attn.integrations.transformers.record_timings`): the schedule's share of the attention time of the
sparse layers and the host time per layer. Needs transformers (the ``lm`` extra).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch

from .table import markdown_header

LLAMA_1B = dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=5632, vocab_size=32000)
"""The model's shape beyond the case's heads and head dim (``hidden_size = heads * head_dim``)."""

FLOOR = "no attention"
"""The label of the floor's row: the same model with an attention that returns its values."""

FIXED_BUDGET = 32
"""The fixed budget of extra blocks per query block (2048 tokens with 64-token blocks)."""

SLOW_SELECTORS_UP_TO = 8192
"""Selectors that wait for the host (not ``sync_free``: the oracle's full attention, the cluster selectors'
numpy cuts) run up to this many tokens."""

MODEL_COLUMNS = ["case", "attention", "budget", "prefill ms", "/ SDPA time", "attention share", "visited blocks",
                 "schedule share", "host us / layer", "syncs", "max |logit - SDPA|"]


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


def no_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The floor's attention function: each query head's output is its key/value head's values
    (``[B, L, H, D]``), as cheap as an attention can be while the rest of the model runs unchanged."""
    group = query.shape[1] // value.shape[1]
    return value.repeat_interleave(group, dim=1).transpose(1, 2).contiguous(), None


def host_syncs(fn: Callable[[], object]) -> int:
    """How many synchronising CUDA calls ``fn()`` makes (``torch.cuda.set_sync_debug_mode("warn")``)."""
    import warnings

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message) for w in caught)


def _backends(case, budgets: list[int]) -> list[tuple[str, str, str | None, int | None]]:
    """(label, attn_implementation, selector, budget) of every row but the floor's and FlexAttention's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from topo_attn import selection
    from topo_attn.integrations import transformers as tat

    AttentionInterface.register("topo_attn_bench_floor", no_attention)
    AttentionMaskInterface.register("topo_attn_bench_floor", partial(tat.plain_causal_mask, "topo_attn_bench_floor"))
    rows = [(FLOOR, "topo_attn_bench_floor", None, None), ("sdpa", "sdpa", None, None)]
    common = dict(block_size=case.block_size, sinks=case.sinks, window=case.window)
    rows.append(("topo_attn dense", tat.register("dense", name="topo_attn_bench_dense", **common), "dense", None))
    for selector in selection.names("block"):
        for budget in (budgets if selection.SELECTORS[selector].adds_blocks else budgets[:1]):
            name = f"topo_attn_bench_{selector}_{budget}"
            rows.append((f"topo_attn {selector}", tat.register(selector, budget=budget, name=name, **common),
                         selector, budget))
    return rows


def run_model_case(case, median_ms: Callable = calls_median_ms, with_flex: bool = True, device: str = "cuda",
                   shape: dict | None = None, model=None) -> list[dict]:
    """Rows (module docstring) for ``case`` (a :class:`~topo_attn.bench.cases.Case`) on ``device`` with the
    model of :func:`build_model` (``shape`` as there), or with ``model`` when given (a causal LM on ``device``
    whose heads match the case's; left on ``sdpa``). ``median_ms(fn)`` times a call; FlexAttention (left out
    without ``with_flex``) that fails is reported on stderr and its row holds NaN. The syncs and the
    per-layer timings are measured on a GPU only (NaN elsewhere)."""
    import transformers

    import topo_attn as ta
    from topo_attn import selection
    from topo_attn.integrations import transformers as tat

    started = time.perf_counter()
    if model is None:
        model = build_model(case, device, shape)
        print(f"  {case.name}: model built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    gen = torch.Generator().manual_seed(case.seq_len)
    ids = torch.randint(0, model.config.vocab_size, (case.batch, case.seq_len), generator=gen).to(device)
    nb = ta.num_blocks(case.seq_len, case.block_size)
    budgets = [case.topk] if case.topk is not None else sorted({max(1, nb // 8), FIXED_BUDGET})
    backends = _backends(case, budgets)
    if with_flex:  # last: its compilation is the slowest step, and a stall there leaves the other rows done
        backends.append(("flex_attention", "flex_attention", None, None))
    on_gpu = torch.device(device).type == "cuda"

    def forward():
        with torch.no_grad():
            return model(ids, logits_to_keep=1, use_cache=False).logits

    rows, reference = [], None
    for label, implementation, selector, budget in backends:
        row = dict(case=case.name, suite="model", attention=label, selector=selector, budget=budget,
                   seq_len=case.seq_len, batch=case.batch, heads=case.heads, kv_heads=case.kv_heads,
                   head_dim=case.head_dim, block_size=case.block_size, dtype=case.dtype,
                   layers=model.config.num_hidden_layers, hidden=model.config.hidden_size,
                   transformers=transformers.__version__, ms=float("nan"), visited_fraction=float("nan"),
                   max_logit_diff=float("nan"), syncs=float("nan"), schedule_share=float("nan"),
                   host_us_per_layer=float("nan"), skipped=None)
        rows.append(row)
        if (selector in selection.SELECTORS and not selection.SELECTORS[selector].sync_free
                and case.seq_len > SLOW_SELECTORS_UP_TO):
            row["skipped"] = f"its scores wait for the host; run up to {SLOW_SELECTORS_UP_TO} tokens"
            continue
        started = time.perf_counter()
        try:
            model.set_attn_implementation(implementation)
            logits = forward().float()
            if label == "sdpa":
                reference = logits
            if reference is not None:
                row["max_logit_diff"] = (logits - reference).abs().max().item()
            row["ms"] = median_ms(forward)
            if selector is not None:
                stats = tat.last_stats(implementation).values()
                row["visited_fraction"] = sum(s.visited_fraction for s in stats) / len(stats)
            if on_gpu:
                row["syncs"] = host_syncs(forward)
            if on_gpu and selector is not None:
                tat.record_timings(implementation)
                forward()
                timed = tat.timings(implementation)
                tat.record_timings(implementation, enabled=False)
                row["schedule_share"] = (sum(t.select_ms for t in timed)
                                         / sum(t.select_ms + t.kernel_ms for t in timed))
                row["host_us_per_layer"] = 1e3 * sum(t.host_ms for t in timed) / len(timed)
        except Exception as exc:  # as in the other suites: report, do not hide (the row shows NaN)
            if implementation != "flex_attention":
                raise
            print(f"  {label} failed on {case.name}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        # (on stderr as it goes: where the time went, compilation included, even if a later backend stalls)
        print(f"  {case.name}, {label} {budget or ''}: {row['ms']:.1f} ms per prefill, "
              f"{time.perf_counter() - started:.0f} s in all", file=sys.stderr, flush=True)
    model.set_attn_implementation("sdpa")
    return _with_ratios(rows)


def _with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` with ``vs_sdpa`` and ``vs_flex`` (each time over SDPA's and FlexAttention's) and
    ``attention_share`` (``(ms - floor) / (sdpa - floor)``); NaN where a time is absent."""
    times = {r["attention"]: r["ms"] for r in rows}
    sdpa, flex = times.get("sdpa", float("nan")), times.get("flex_attention", float("nan"))
    floor = times.get(FLOOR, float("nan"))
    return [{**r, "floor_ms": floor, "vs_sdpa": r["ms"] / sdpa, "vs_flex": r["ms"] / flex,
             "attention_share": (r["ms"] - floor) / (sdpa - floor)} for r in rows]


def model_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_model_case`)."""
    def shown(value, form: str, unit: str = "") -> str:  # None or NaN (no FlexAttention, no schedule): empty
        return "" if value is None or math.isnan(value) else format(value, form) + unit

    lines = markdown_header(MODEL_COLUMNS, left=2)
    for r in rows:
        lines.append(f"| {r['case']} | {r['attention']} | {r.get('budget') or ''} | {shown(r['ms'], '.1f')} | "
                     f"{shown(r['vs_sdpa'], '.2f', 'x')} | {shown(r.get('attention_share'), '.2f')} | "
                     f"{shown(r['visited_fraction'], '.1%')} | {shown(r.get('schedule_share'), '.1%')} | "
                     f"{shown(r.get('host_us_per_layer'), '.0f')} | {shown(r.get('syncs'), '.0f')} | "
                     f"{shown(r['max_logit_diff'], '.2e')} |")
    return "\n".join(lines)
