"""The ``select`` suite of the benchmark runner: selection quality against time on a GPU
(``python -m topo_attn.bench --suite select``).

On the captured real queries, keys and values (:func:`topo_attn.selection.load_real_qkv`, the package data
``topo_attn/sample_data/minilm_qkv.npz``: each captured layer is a batch entry, each head a lane, float16),
every selector of :mod:`topo_attn.selection` at every budget: the time to build its schedule (the oracle's
build is the full attention mass it needs), the kernel's time with that schedule, and the recall and output
error of the schedule against full causal attention (the float64 reference). SDPA's dense causal time on the
same input is the yardstick.
"""

from __future__ import annotations


from .table import markdown_header

SELECT_BUDGETS = (1, 2, 4, 8)
SELECT_COLUMNS = ["selector", "budget", "blocks / row", "recall", "rel L2", "build ms", "attention ms",
                  "build + attention ms", "SDPA ms"]


def run_select_case(case, median_ms, budgets=SELECT_BUDGETS, device: str = "cuda", qkv=None) -> list[dict]:
    """Rows (one per selector and budget) for ``case`` (a :class:`~topo_attn.bench.cases.Case`; its block
    size, sinks and window are used) on ``device``: the input is the captured real q, k, v, or ``qkv = (q, k, v,
    info)`` (``[B, H, S, D]`` each; ``info`` with ``model`` and ``layers``). ``median_ms(fn)`` times a call."""
    import torch.nn.functional as F

    import topo_attn as ta
    from topo_attn import selection

    q, k, v, info = selection.load_real_qkv() if qkv is None else qkv
    q, k, v = (t.to(device) for t in (q, k, v))
    bs, sinks, window = case.block_size, case.sinks, case.window
    reference = selection.full_attention(q, k, v, bs)
    sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    rows = []
    for budget in budgets:
        for name in selection.SELECTORS:
            def build():
                return selection.select(name, q, k, bs, sinks, window, budget)

            schedule = build()
            metrics = selection.schedule_quality(q, k, v, schedule, reference=reference).summary()
            build_ms = median_ms(build)
            attn_ms = median_ms(lambda: ta.scheduled_attention(q, k, v, schedule))
            rows.append(dict(case=case.name, suite="select", selector=name, budget=budget,
                             model=info["model"], layers=info["layers"], shape=list(q.shape), block_size=bs,
                             sinks=sinks, window=window, blocks_per_row=metrics["blocks_per_row"],
                             recall=metrics["recall"], rel_l2=metrics["rel_l2"], build_ms=build_ms,
                             attention_ms=attn_ms, total_ms=build_ms + attn_ms, sdpa_ms=sdpa_ms))
    return rows


def select_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_select_case`)."""
    lines = markdown_header(SELECT_COLUMNS)
    for r in rows:
        lines.append(f"| {r['selector']} | {r['budget']} | {r['blocks_per_row']:.2f} | {r['recall']:.4f} | "
                     f"{r['rel_l2']:.4f} | {r['build_ms']:.3f} | {r['attention_ms']:.3f} | {r['total_ms']:.3f} | "
                     f"{r['sdpa_ms']:.3f} |")
    return "\n".join(lines)
