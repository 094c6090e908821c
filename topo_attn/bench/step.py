"""The ``step`` suite of the benchmark runner: one layer's work in one decode step over a static cache, the
selection's update and table next to the decode it serves (``python -m topo_attn.bench --suite step``).

Per case (the ``generate`` suite's shapes): seeded random keys and values ``[B, H_kv, seq_len + block_size, D]``
in the case's dtype, one query per sequence, and the cache's
:class:`~topo_attn.selection.static_step.StaticBlockStats` (with the kept salience) built once over the
``seq_len`` context tokens (``update`` from position 0, then ``rebuild_salience``). Then, per selector of
:data:`~topo_attn.selection.static_step.STATIC_SELECTORS` but ``window``, at a budget of ``budget_tokens`` (in
blocks of the case's size), the case's sinks and window (one block each), each call timed by the ``timer``
handed in (the runner passes :func:`~topo_attn.bench.timing.graph_median_ms`, a CUDA-graph replay):

- ``update_table_us``: :func:`~topo_attn.selection.static_step.decode_step_table` (``fused=True``, one launch) at
  the length ``seq_len + block_size // 2``, inside a block (no block completes);
- ``completing_us``: the same call at ``seq_len + block_size``, whose key completes a block;
- ``topology`` only: ``kept_us``, the same call as ``update_table_us`` with the stats holding kept rows
  (:meth:`~topo_attn.selection.static_step.StaticBlockStats.kept_table`) and the lane's ``last`` refilled with
  ``length - 1`` before each call, so the kernel reuses the row; ``fill_us`` is that one-element fill alone,
  reported and not subtracted (``kept_us`` includes it);
- ``decode_us``: :func:`~topo_attn.attention.static_decode.static_decode` at the inside length with the step's
  table (the selector's table at that length, computed before any timed call), and ``dense_decode_us`` the same
  with every block (``table=None``, the same for every selector of the case);
- ``selection_share``: ``update_table_us / (update_table_us + decode_us)``.

Needs a CUDA GPU for real timings (the kernels run in Triton's interpreter on the CPU for the tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .cases import Case
from .generate import BUDGET_TOKENS
from .table import markdown_header, shown

STEP_COLUMNS = ["case", "selector", "budget tokens", "update + table us", "completing us", "kept us", "fill us",
                "decode us", "dense decode us", "selection share"]


def step_selectors() -> list[str]:
    """The selectors the suite times: the static step's, but ``window`` (it selects nothing)."""
    from ..selection.static_step import STATIC_SELECTORS

    return [s for s in STATIC_SELECTORS if s != "window"]


def run_step_case(case: Case, timer: Callable[[Callable[[], object]], float], device: str = "cuda",
                  budget_tokens: int = BUDGET_TOKENS, seed: int = 0,
                  tables: dict[str, torch.Tensor] | None = None) -> list[dict]:
    """One row per selector of :func:`step_selectors` for ``case`` (see the module docstring). ``timer(fn)``
    gives the median time of ``fn()`` in milliseconds; the rows hold microseconds. ``tables``, when given,
    receives each selector's table (a copy of the one its decode is timed with)."""
    from ..attention.static_decode import static_decode
    from ..selection.static_step import StaticBlockStats, decode_step_table

    bs, S = case.block_size, case.seq_len
    budget = budget_tokens // bs
    dtype = getattr(torch, case.dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    cache_shape = (case.batch, case.kv_heads, S + bs, case.head_dim)
    keys = torch.randn(cache_shape, generator=generator, device=device, dtype=dtype)
    values = torch.randn(cache_shape, generator=generator, device=device, dtype=dtype)
    q = torch.randn((case.batch, case.heads, 1, case.head_dim), generator=generator, device=device, dtype=dtype)
    stats = StaticBlockStats.for_cache(keys, bs, salience=True)
    stats.update(keys, torch.tensor(0, device=device), S)
    stats.rebuild_salience(torch.tensor(S, device=device))
    inside_len, completing_len = S + bs // 2, S + bs
    inside, completing = (torch.tensor(n, device=device) for n in (inside_len, completing_len))

    def step(selector: str, length: torch.Tensor) -> Callable[[], torch.Tensor]:
        return lambda: decode_step_table(selector, q, keys, stats, length, case.sinks, case.window, budget, fused=True)

    def us(fn: Callable[[], object]) -> float:
        return timer(fn) * 1e3

    selectors = step_selectors()
    # every selector's table from the same statistics, before a timed call completes a block
    step_tables = {s: step(s, inside)().clone() for s in selectors}
    if tables is not None:
        tables.update({s: t.clone() for s, t in step_tables.items()})
    dense_us = us(lambda: static_decode(q, keys, values, inside, None, bs))
    rows = []
    for selector in selectors:
        table = step_tables[selector]
        row = dict(case=case.name, batch=case.batch, context=S, selector=selector, budget_tokens=budget * bs,
                   update_table_us=us(step(selector, inside)), completing_us=us(step(selector, completing)))
        if selector == "topology":
            _, last = stats.kept_table(case.sinks, case.window, budget)
            step(selector, inside)()  # keep the rows at this length (last = length, refilled below)
            fill = lambda: last.fill_(inside_len - 1)  # noqa: E731
            kept_step = step(selector, inside)

            def kept_call():
                fill()
                return kept_step()

            row.update(kept_us=us(kept_call), fill_us=us(fill))
            stats.kept_tables.pop((case.sinks, case.window, budget))  # the other selectors' calls as before
        row["decode_us"] = us(lambda: static_decode(q, keys, values, inside, table, bs))
        row["dense_decode_us"] = dense_us
        row["selection_share"] = row["update_table_us"] / (row["update_table_us"] + row["decode_us"])
        rows.append(row)
    return rows


def step_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_step_case`, or read back from a result file); a missing
    value (``kept_us`` and ``fill_us`` are ``topology``'s only) shows as an empty cell."""
    lines = markdown_header(STEP_COLUMNS, left=2)
    for r in rows:
        lines.append(f"| {r['case']} | {r['selector']} | {r['budget_tokens']} | {shown(r['update_table_us'], '.1f')} | "
                     f"{shown(r['completing_us'], '.1f')} | {shown(r.get('kept_us'), '.1f')} | "
                     f"{shown(r.get('fill_us'), '.1f')} | {shown(r['decode_us'], '.1f')} | "
                     f"{shown(r['dense_decode_us'], '.1f')} | {shown(r['selection_share'], '.2f')} |")
    return "\n".join(lines)
