"""A small stand-in for the language-model study's results (``python -m topo_attn.lm evaluate``'s JSON, suite
``lm``), for the figure and notebook tests: the same keys and row fields, made-up numbers."""

from __future__ import annotations

BUCKETS = ("0-1k", "1k-4k", "4k-8k")
DISTANCES = (1024, 2048, 8064)
SPEED_FIELDS = ("case", "suite", "attention", "selector", "budget", "seq_len", "batch", "heads", "kv_heads",
                "head_dim", "block_size", "dtype", "layers", "hidden", "transformers", "ms", "visited_fraction",
                "max_logit_diff", "syncs", "schedule_share", "host_us_per_layer", "skipped", "floor_ms", "vs_sdpa",
                "vs_flex", "attention_share")


def lm_result(selectors=("window", "centroid", "quest", "topology_causal"), budgets=(2, 6), layers=2, heads=2,
              speed=True) -> dict:
    """Results with ``sdpa``, ``dense``, ``window`` at budget 0 and every other selector at every budget; the
    bits per byte of bucket ``i`` are ``0.8 + 0.01 * i`` (sdpa, dense) plus ``0.1 / (1 + budget)`` for the
    sparse configurations, exact matches ``budget / 10`` (1 for the references), recall per head ``0.5 +
    budget / 20``."""
    configs = [("sdpa", None), ("dense", None)] + [("window", 0)] * ("window" in selectors) + [
        (s, b) for s in selectors if s != "window" for b in budgets]
    perplexity, retrieval, recall = [], [], []
    for attention, budget in configs:
        visited = 1.0 if budget is None else (2 + budget) / 20
        extra = 0.0 if budget is None else 0.1 / (1 + budget)
        bits = {b: 0.8 + 0.01 * i + extra for i, b in enumerate(BUCKETS)}
        perplexity.append(dict(attention=attention, budget=budget, visited_fraction=visited,
                               bits_per_byte={"all": sum(bits.values()) / len(bits), **bits}, documents=2,
                               seconds=1.0))
        for distance in DISTANCES:
            exact = 1.0 if budget is None else budget / 10
            retrieval.append(dict(attention=attention, budget=budget, visited_fraction=visited, distance=distance,
                                  exact=exact, probes=2, loss=1.0 - exact))
        if budget is not None:
            recall += [dict(attention=attention, budget=budget, layer=layer, visited_fraction=visited,
                            recall=[0.5 + budget / 20 - 0.01 * layer] * heads) for layer in range(layers)]
    result = dict(suite="lm", model="data/lm", gpu="NVIDIA Test GPU", torch="9.9.9", triton="8.8.8",
                  command="python -m topo_attn.lm evaluate", date="2026-01-01", commit="abc1234", dirty=False,
                  commit_source="test", documents=2, length=8192, block_size=64, sinks=1, window=1, dense_layers=[],
                  dtype="bfloat16", causal_blocks_per_lane=8256, perplexity=perplexity, retrieval=retrieval,
                  recall=recall, seconds=1.0)
    if speed:
        nan = float("nan")
        rows = [("no attention", None, 10.0, nan, None), ("sdpa", None, 40.0, nan, None),
                ("topo_attn dense", "dense", 50.0, 1.0, None), ("topo_attn centroid", "centroid", 20.0, 0.3, None),
                ("topo_attn oracle", "oracle", nan, nan, "its scores wait for the host"),
                ("flex_attention", None, nan, nan, None)]
        result["speed"] = [dict(case="kit LM S8k b64", suite="model", attention=label, selector=selector,
                                budget=16 if selector not in (None, "dense") else None, seq_len=8192, batch=1,
                                heads=8, kv_heads=2, head_dim=64, block_size=64, dtype="bfloat16", layers=8,
                                hidden=512, transformers="5.0", ms=ms, visited_fraction=visited, max_logit_diff=0.0,
                                syncs=0.0, schedule_share=0.1 if selector else nan, host_us_per_layer=50.0 if selector
                                else nan, skipped=skipped, floor_ms=10.0, vs_sdpa=ms / 40.0, vs_flex=nan,
                                attention_share=(ms - 10.0) / 30.0) for label, selector, ms, visited, skipped in rows]
    return result
