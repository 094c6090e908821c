"""A small stand-in for the language-model study's results (``python -m topo_attn.lm evaluate``'s JSON, suite
``lm``), for the figure and notebook tests: the same keys and row fields, made-up numbers."""

from __future__ import annotations

BUCKETS = ("0-1k", "1k-4k", "4k-8k")
DISTANCES = (1024, 2048, 8064)
SPEED_FIELDS = ("case", "suite", "attention", "selector", "budget", "seq_len", "batch", "heads", "kv_heads",
                "head_dim", "block_size", "dtype", "layers", "hidden", "transformers", "ms", "visited_fraction",
                "max_logit_diff", "syncs", "schedule_share", "host_us_per_layer", "skipped", "floor_ms", "vs_sdpa",
                "vs_flex", "attention_share", "compiled")


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
                                attention_share=(ms - 10.0) / 30.0, compiled=False)
                           for label, selector, ms, visited, skipped in rows]
    return result


HEADER = dict(model="data/lm", gpu="NVIDIA Test GPU", torch="9.9.9", triton="8.8.8", date="2026-01-01",
              commit="abc1234", dirty=False, commit_source="test")


def retrieval_suite_result(tasks=("single_needle", "multi_key"), distances=(1024, 4096), probes=4,
                           selectors=("quest", "topology"), budgets=(6, 30)) -> dict:
    """``python -m topo_attn.lm retrieval``'s JSON (suite ``lm_retrieval``), its rows built by the runner's own
    :func:`~topo_attn.lm.retrieval_runner.cell_rows` from made-up outcomes: ``sdpa`` and ``dense`` answer every
    probe, a selector at budget ``b`` the first ``min(probes, b // 6 + i)`` probes of the ``i``-th distance
    (``quest``) or one fewer (every other selector)."""
    from types import SimpleNamespace

    from topo_attn.lm import retrieval_runner

    cells = [(t, d) for t in tasks for d in distances]
    probe_list = [SimpleNamespace(task=t, distance=d) for t, d in cells for _ in range(probes)]
    outcomes = {("sdpa", None): [True] * len(probe_list), ("dense", None): [True] * len(probe_list)}
    for s in selectors:
        for b in budgets:
            right = []
            for t, d in cells:
                k = min(probes, max(0, b // 6 + distances.index(d) - (s != "quest")))
                right += [j < k for j in range(probes)]
            outcomes[(s, b)] = right
    rows = retrieval_runner.cell_rows(probe_list, outcomes)
    return dict(suite="lm_retrieval", **HEADER, command="python -m topo_attn.lm retrieval", tasks=list(tasks),
                distances=list(distances), probes_per_cell=probes, dense_gate=retrieval_runner.dense_gate(rows),
                rows=rows, seconds=1.0)


def eviction_result(policies=("salience", "streaming", "snapkv"), fractions=(0.25, 0.125),
                    tasks=("single_needle", "multi_key"), probes=4) -> dict:
    """``python -m topo_attn.lm eviction``'s JSON (suite ``lm_eviction``), retrieval cells built by the runner's
    own :func:`~topo_attn.lm.eviction_runner.retrieval_cells`: ``dense`` (cache fraction 1) at 1.5 bits per byte
    answers every probe; a policy at fraction ``f`` adds ``0.1 / (8 * f) * (1 + i)`` bits for the ``i``-th policy
    and answers the first ``probes - 1 - i`` probes of each task (at least none)."""
    from types import SimpleNamespace

    from topo_attn.lm import eviction_runner

    probe_list = [SimpleNamespace(task=t) for t in tasks for _ in range(probes)]
    dense = [True] * len(probe_list)
    rows = [dict(policy="dense", cache_fraction=1.0, keep_blocks=128, query_blind=None, bits_per_byte=1.5,
                 n_bytes=4096, bits_per_byte_minus_dense=0.0, peak_tokens=8192, kv_bytes=8192, full_kv_bytes=8192,
                 memory_fraction=1.0, retrieval=eviction_runner.retrieval_cells(probe_list, dense, None),
                 seconds=1.0)]
    for i, policy in enumerate(policies):
        for f in fractions:
            extra = 0.1 / (8 * f) * (1 + i)
            right = [j < max(0, probes - 1 - i) for _ in tasks for j in range(probes)]
            rows.append(dict(policy=policy, cache_fraction=f, keep_blocks=int(128 * f), query_blind=True,
                             bits_per_byte=1.5 + extra, n_bytes=4096, bits_per_byte_minus_dense=extra,
                             peak_tokens=int(8192 * f) + 64, kv_bytes=int(8192 * f) + 64, full_kv_bytes=8192,
                             memory_fraction=(int(8192 * f) + 64) / 8192,
                             retrieval=eviction_runner.retrieval_cells(probe_list, right, dense), seconds=1.0))
    return dict(suite="lm_eviction", **HEADER, command="python -m topo_attn.lm eviction", complete=True,
                length=8192, prefix=4096, block_size=64, context_blocks=128, policies=list(policies),
                cache_fractions=list(fractions), tasks=list(tasks), distances=[6144], probes_per_cell=probes,
                rows=rows, seconds=1.0)
