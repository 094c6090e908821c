"""The ``host`` suite of the benchmark runner: where the host time of one attention layer goes
(``python -m topo_attn.bench --suite host``).

Issue 39 asks for at most 60 µs of host time per layer on the sparse path. The model suite measures the whole
layer (``host_us_per_layer``); this suite splits it. On one layer of the model suite's shape (B1, 32 query and
8 key/value heads of 64, bf16, in transformers' ``[B, S, H, D]`` memory viewed as ``[B, H, S, D]``), each
piece is timed alone with the GPU idle before every call (:func:`~topo_attn.bench.timing.idle_host_us`: the
wall time from the call to its return, so the launches' host work and nothing of the GPU's; :data:`ROUNDS`
rounds that each time every piece in turn, the median and the least over the rounds), next to SDPA's:

- ``sdpa``: ``F.scaled_dot_product_attention`` with GQA, the yardstick;
- ``kernel dense``: :func:`topo_attn.scheduled_attention` on the dense schedule a dense layer runs
  (:func:`~topo_attn.integrations.transformers.dense_block_size` tokens per block);
- ``kernel sparse``: the same on ``centroid``'s per-key/value-head schedule at the case's budget;
- ``select <name>``: :func:`topo_attn.selection.select` for each sync-free selector;
- ``backend <name>``: the transformers backend's whole attention call for a layer (``dense`` and each sync-free
  selector), as a model calls it (transformers' ``ALL_ATTENTION_FUNCTIONS``): selection, kernel and
  statistics (needs transformers). The output is written in q's ``[B, S, H, D]`` memory, so the backend
  returns a view and copies nothing.

Each row: ``case``, ``piece``, ``selector`` (None for the others), ``budget`` (blocks, for the selections),
``host_us`` (median over the rounds), ``host_us_min`` (the least), ``rounds``, ``sdpa_us`` (the case's ``sdpa``
row) and ``vs_sdpa``.
"""

from __future__ import annotations

import statistics
import types
from collections.abc import Callable
from functools import partial

import torch

from .table import markdown_header
from .timing import idle_host_us

HOST_COLUMNS = ["case", "piece", "budget", "host us", "least", "/ sdpa"]


ROUNDS = 5
"""Rounds of the host suite: each round times every piece once (interleaved, so a drift of the machine's state
over the run reaches every piece alike), and a row holds the median over the rounds and the least."""


def run_host_case(case, host_timer: Callable[[Callable[[], object]], float] = partial(idle_host_us, calls=10),
                  device: str = "cuda", rounds: int = ROUNDS) -> list[dict]:
    """The rows of the module docstring for ``case`` (a :class:`~topo_attn.bench.cases.Case`: batch, heads,
    key/value heads, length, head dim, block size, dtype, sinks and window; the budget is ``case.rule_topk``)
    on ``device``; ``host_timer(fn)`` times a call in microseconds, ``rounds`` times per piece, the pieces
    interleaved; ``host_us`` is the median of the rounds and ``host_us_min`` the least."""
    import torch.nn.functional as F

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import topo_attn as ta
    from topo_attn.integrations import transformers as tat
    from topo_attn.selection import names, select

    dtype = getattr(torch, case.dtype)
    gen = torch.Generator().manual_seed(0)

    def layout(heads: int) -> torch.Tensor:  # transformers' [B, S, H, D] memory, viewed as [B, H, S, D]
        return torch.randn(case.batch, case.seq_len, heads, case.head_dim, generator=gen).to(device, dtype) \
            .transpose(1, 2)

    q, k, v = layout(case.heads), layout(case.kv_heads), layout(case.kv_heads)
    bs, budget = case.block_size, case.rule_topk
    scale = case.head_dim ** -0.5
    selectors = names("block", sync_free=True)
    module = types.SimpleNamespace(layer_idx=0, is_causal=True)
    dense_schedule = ta.dense_causal_schedule(case.seq_len, max(bs, tat.DENSE_BLOCK_SIZE), device)
    sparse_schedule = select("centroid", q, k, bs, case.sinks, case.window, budget)
    pieces: list[tuple[str, str | None, int | None, Callable[[], object]]] = [
        ("sdpa", None, None, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)),
        ("kernel dense", None, None, lambda: ta.scheduled_attention(q, k, v, dense_schedule, scale=scale)),
        ("kernel sparse", "centroid", budget, lambda: ta.scheduled_attention(q, k, v, sparse_schedule, scale=scale)),
    ]
    for name in selectors:
        pieces.append((f"select {name}", name, budget,
                       (lambda s: lambda: select(s, q, k, bs, case.sinks, case.window, budget))(name)))
    for name in ("dense", *selectors):
        backend = tat.register(selector=name, block_size=bs, sinks=case.sinks, window=case.window, budget=budget,
                               name=f"topo_attn_host_{name}")
        pieces.append((f"backend {name}", None if name == "dense" else name, None if name == "dense" else budget,
                       (lambda f: lambda: f(module, q, k, v, None, scaling=scale))(ALL_ATTENTION_FUNCTIONS[backend])))
    samples: list[list[float]] = [[] for _ in pieces]
    with torch.no_grad():
        for _ in range(rounds):
            for times, (_, _, _, fn) in zip(samples, pieces):
                times.append(host_timer(fn))
    timed = [(piece, selector, blocks, statistics.median(times), min(times))
             for (piece, selector, blocks, _), times in zip(pieces, samples)]
    sdpa_us = timed[0][3]
    return [dict(case=case.name, suite="host", piece=piece, selector=selector, budget=blocks, host_us=us,
                 host_us_min=least, rounds=rounds, sdpa_us=sdpa_us, vs_sdpa=us / sdpa_us, seq_len=case.seq_len,
                 batch=case.batch, heads=case.heads, kv_heads=case.kv_heads, head_dim=case.head_dim, block_size=bs,
                 dtype=case.dtype)
            for piece, selector, blocks, us, least in timed]


def host_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_host_case`)."""
    lines = markdown_header(HOST_COLUMNS)
    for r in rows:
        budget = "" if r["budget"] is None else str(r["budget"])
        least = f"{r['host_us_min']:.1f}" if "host_us_min" in r else ""
        lines.append(f"| {r['case']} | {r['piece']} | {budget} | {r['host_us']:.1f} | {least} | {r['vs_sdpa']:.1f}x |")
    return "\n".join(lines)
