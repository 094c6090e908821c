"""The ``model`` suite of the benchmark runner: a whole transformers model's prefill with the kit's attention
next to SDPA and FlexAttention (``python -m topo_attn.bench --suite model``).

Per case: a LlamaForCausalLM shaped like a 1B model (:data:`LLAMA_1B`: 16 layers, hidden 2048, 32 query and 8
key/value heads of dim 64, intermediate 5632, vocabulary 32000) with random weights in the case's dtype
(:func:`build_model`), its prefill of ``seq_len`` random tokens timed with each attention implementation by
:func:`topo_attn.prefill_speed.prefill_speed_rows` (the no-attention floor, SDPA, the kit's dense backend, every
selector at ``n / 8`` blocks and at a fixed budget, FlexAttention; that module's docstring says what each row
holds), with the case's block size, sink and window. :func:`model_markdown` is the suite's table. Needs
transformers (the ``lm`` extra).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from ..prefill_speed import calls_median_ms, prefill_speed_rows
from .table import markdown_header, shown

LLAMA_1B = dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=5632, vocab_size=32000)
"""The model's shape beyond the case's heads and head dim (``hidden_size = heads * head_dim``)."""

MODEL_COLUMNS = ["case", "attention", "budget", "prefill ms", "/ SDPA time", "attention share", "visited blocks",
                 "schedule share", "host us / layer", "syncs", "max |logit - SDPA|"]


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
                   shape: dict | None = None, after_row: Callable[[list[dict]], None] | None = None,
                   selectors: tuple[str, ...] | None = None,
                   compile: Callable[[Callable], Callable] | None = None) -> list[dict]:
    """The rows of :func:`~topo_attn.prefill_speed.prefill_speed_rows` for ``case`` (a
    :class:`~topo_attn.bench.cases.Case`) on ``device`` with the model of :func:`build_model` (``shape`` as
    there): the case's name, length, batch, block size, sinks, window and ``topk`` (``None``: ``n / 8`` and the
    fixed budget). ``median_ms(fn)`` times a call; ``with_flex`` adds FlexAttention's row; ``after_row(rows)``
    sees the rows done so far after each attention; ``selectors`` keeps only those selectors' rows (``"dense"``:
    the kit's dense row) next to the floor and sdpa; ``compile`` times every row on the compiled forward (as
    there)."""
    started = time.perf_counter()
    model = build_model(case, device, shape)
    print(f"  {case.name}: model built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return prefill_speed_rows(model, case.name, case.seq_len, case.block_size, batch=case.batch, sinks=case.sinks,
                              window=case.window, topk=case.topk, median_ms=median_ms, with_flex=with_flex,
                              after_row=after_row, selectors=selectors, compile=compile)


def model_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_model_case`)."""
    lines = markdown_header(MODEL_COLUMNS, left=2)
    for r in rows:
        budget = r.get("budget")  # (a float in a table read back with missing budgets)
        budget = "" if budget is None or budget != budget else int(budget)
        lines.append(f"| {r['case']} | {r['attention']} | {budget} | {shown(r['ms'], '.1f')} | "
                     f"{shown(r['vs_sdpa'], '.2f', 'x')} | {shown(r.get('attention_share'), '.2f')} | "
                     f"{shown(r['visited_fraction'], '.1%')} | {shown(r.get('schedule_share'), '.1%')} | "
                     f"{shown(r.get('host_us_per_layer'), '.0f')} | {shown(r.get('syncs'), '.0f')} | "
                     f"{shown(r['max_logit_diff'], '.2e')} |")
    return "\n".join(lines)
