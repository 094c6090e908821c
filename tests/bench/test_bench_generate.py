"""The ``generate`` suite's CPU-side pieces: a tiny Llama through the whole case (the kit's backend in Triton's
interpreter; transformers does not compile the step on a CPU), the static cache filled and rewound, the bytes
floor, the rows and the markdown table."""

from __future__ import annotations

import math

import pytest
import torch

from topo_attn.bench.cases import SUITES, Case

pytest.importorskip("transformers", minversion="5")

TINY = dict(num_hidden_layers=2, intermediate_size=128, vocab_size=96)


def test_generate_suite_is_the_issue_case():
    cases = SUITES["generate"]
    assert [(c.batch, c.seq_len) for c in cases] == [(1, 32768), (1, 131072), (8, 32768), (8, 131072)]
    assert all((c.heads, c.kv_heads, c.head_dim, c.block_size, c.dtype) == (32, 8, 64, 64, "bfloat16")
               for c in cases)


def test_generate_case_rows_on_a_tiny_model(device):
    """The floor, the recipe, the kit dense (its tokens equal the recipe's) and each fixed-shape selector, with
    each decode merge, timed."""
    from topo_attn.bench.generate import (GENERATE_COLUMNS, KIT_DENSE, NO_ATTENTION, ONE_LAUNCH, RECIPE,
                                          generate_markdown, run_generate_case)

    case = Case("tiny", 2, 4, 2, 80, 16, 16, "float32")
    rows = run_generate_case(case, new_tokens=3, budget_tokens=32, peak_tbps=1.0, device=device, shape=TINY,
                             repeats=1, warmup=1)
    kit = [KIT_DENSE] + [f"kit {s} static cache compiled" for s in ("topology", "centroid", "quest")]
    assert [r["attention"] for r in rows] == [NO_ATTENTION, RECIPE] + kit + [a + ONE_LAUNCH for a in kit]
    floor, recipe, dense, *sparse = rows[:6]
    dense_one_launch, *sparse_one_launch = rows[6:]
    for dense_row in (dense, dense_one_launch):
        assert dense_row["tokens_match"] is True and dense_row["matching_tokens"] == 4
        assert dense_row["first_logit_diff"] < 1e-3
    assert "tokens_match" not in recipe and "tokens_match" not in floor
    assert floor["matching_tokens"] < 4  # no attention changes the tokens: the comparison can fail
    for one, two in zip(sparse_one_launch, sparse):  # the merge changes nothing but rounding
        assert one["matching_tokens"] == two["matching_tokens"] and one["selector"] == two["selector"]
    assert recipe["vs_recipe"] == 1.0 and all(math.isfinite(r["ms_per_token"]) for r in rows)  # CPU timings: noise
    assert all(r["attention_ms"] == r["ms_per_token"] - floor["ms_per_token"] for r in rows)
    assert all(r["budget_tokens"] == 32 and r["selector"] in ("topology", "centroid", "quest")
               for r in sparse + sparse_one_launch)
    assert all(r["floor_ms"] > 0 and r["context"] == 80 and r["batch"] == 2 for r in rows)
    assert all(r["floor_ms"] > dense["floor_ms"] for r in sparse)  # the whole short cache, and the statistics
    table = generate_markdown(rows).splitlines()
    assert table[0] == "| " + " | ".join(GENERATE_COLUMNS) + " |" and len(table) == 2 + len(rows)
    assert "| yes |" in table[4]


def test_generate_case_with_some_rows_reports_each_row(device):
    """``dense=False``, one selector and one merge: the floor, the recipe and that selector's row only, each
    reported through ``after_row`` as it finishes, with the fields measured against the floor and the recipe."""
    from topo_attn.bench.generate import NO_ATTENTION, RECIPE, run_generate_case

    case = Case("tiny", 1, 4, 2, 48, 16, 16, "float32")
    reported = []
    rows = run_generate_case(case, new_tokens=2, budget_tokens=16, peak_tbps=1.0, device=device, shape=TINY,
                             repeats=1, warmup=1, selectors=("quest",), merges=("separate",), dense=False,
                             after_row=reported.append)
    assert [r["attention"] for r in rows] == [NO_ATTENTION, RECIPE, "kit quest static cache compiled"]
    assert [[r["attention"] for r in part] for part in reported] == [[NO_ATTENTION, RECIPE],
                                                                     [NO_ATTENTION, RECIPE, rows[2]["attention"]]]
    assert reported[-1] == rows and all("tokens" not in r and "vs_recipe" in r for r in reported[-1])
    assert rows[1]["vs_recipe"] == 1.0 and rows[2]["attention_ms"] == rows[2]["ms_per_token"] - rows[0]["ms_per_token"]


def test_fill_and_rewind_keep_the_statistics(device):
    """The filled cache holds ``context`` tokens; rewinding after a generation brings every layer back, and the
    kept statistics cover the context's complete blocks."""
    from topo_attn.bench.generate import fill_static_cache, rewind
    from topo_attn.bench.model import build_model
    from topo_attn.integrations import transformers as tat
    from topo_attn.integrations.static_cache import TopoStaticCache
    from topo_attn.selection.stats import key_block_bounds

    model = build_model(Case("tiny", 1, 4, 2, 64, 16, 16, "float32"), device, TINY)
    cache = TopoStaticCache(model.config, max_cache_len=80)
    fill_static_cache(cache, model, 1, 48)
    cache.layers[0].cumulative_length.add_(5)  # as a generation would
    rewind(cache, 48, (16,))
    for layer in cache.layers:
        assert int(layer.cumulative_length) == 48
        stats = getattr(layer.keys, tat.STATIC_STATE_ATTRIBUTE).block_stats(layer.keys, 16)
        lo, hi = key_block_bounds(layer.keys[:, :, :48], 16)
        assert torch.equal(stats.lo[:, :, :3], lo.to(stats.lo.dtype))
        assert torch.equal(stats.hi[:, :, :3], hi.to(stats.hi.dtype))


def test_the_table_leaves_missing_values_empty():
    """A row read back from a result file (NaN for what it lacks) or read from a run's log (its time only)
    shows empty cells, not ``nan`` or an error; a measured row shows every cell."""
    from topo_attn.bench.generate import generate_markdown

    measured = dict(case="c", attention="kit dense", budget_tokens=None, ms_per_token=2.0, attention_ms=0.5,
                    vs_recipe=0.4, floor_ms=0.8, vs_floor=2.5, tokens_match=False, matching_tokens=18,
                    new_tokens=32, first_logit_diff=0.09)
    from_log = dict(case="c", attention="kit quest", budget_tokens=2048, ms_per_token=3.0, attention_ms=1.5,
                    vs_recipe=0.1, new_tokens=32)
    read_back = {**measured, "budget_tokens": float("nan"), "tokens_match": None, "first_logit_diff": float("nan")}
    first, second, third = generate_markdown([measured, from_log, read_back]).splitlines()[2:]
    assert first == "| c | kit dense |  | 2.00 | 0.50 | 0.40x | 0.80 | 2.5x | NO | 18 / 33 | 9.00e-02 |"
    assert second == "| c | kit quest | 2048 | 3.00 | 1.50 | 0.10x |  |  |  |  |  |"
    assert third == "| c | kit dense |  | 2.00 | 0.50 | 0.40x | 0.80 | 2.5x |  | 18 / 33 |  |"
