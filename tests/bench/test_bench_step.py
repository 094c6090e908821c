"""The ``step`` suite's CPU-side pieces: a tiny case through :func:`run_step_case` (the kernels in Triton's
interpreter, the timer a stand-in that calls each function once), its rows, tables and markdown."""

from __future__ import annotations

import torch

from topo_attn.bench.cases import SUITES, Case


def test_step_suite_is_the_generate_cases():
    assert SUITES["step"] == SUITES["generate"]


def test_step_case_rows_on_a_tiny_case(device):
    from topo_attn.attention.static_decode import static_decode
    from topo_attn.bench.step import STEP_COLUMNS, run_step_case, step_markdown
    from topo_attn.selection.static_step import StaticBlockStats, decode_step_table

    calls = []

    def timer(fn):  # calls fn once; each call is timed at 0.001 ms per call so far
        calls.append(fn())
        return 1e-3 * len(calls)

    case = Case("tiny", 2, 4, 2, 128, 16, 16, "float32")
    tables = {}
    rows = run_step_case(case, timer, device=device, budget_tokens=32, tables=tables)
    assert [r["selector"] for r in rows] == ["topology", "centroid", "quest"]
    fields = {"case", "batch", "context", "selector", "budget_tokens", "update_table_us", "completing_us",
              "decode_us", "dense_decode_us", "selection_share"}
    for r in rows:
        kept = {"kept_us", "fill_us"} if r["selector"] == "topology" else set()
        assert set(r) == fields | kept
        assert (r["case"], r["batch"], r["context"], r["budget_tokens"]) == ("tiny", 2, 128, 32)
        assert r["selection_share"] == r["update_table_us"] / (r["update_table_us"] + r["decode_us"])
        assert r["dense_decode_us"] == rows[0]["dense_decode_us"]
    assert rows[0]["kept_us"] > 0 and rows[0]["fill_us"] > 0
    # 1 dense decode, then per selector: update + table, completing, (topology: kept, fill), decode
    assert len(calls) == 1 + 3 * 3 + 2

    # the suite's tables are decode_step_table's on statistics built the same way, and its decodes use them
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (2, 2, 128 + 16, 16)
    keys = torch.randn(shape, generator=generator, device=device)
    values = torch.randn(shape, generator=generator, device=device)
    q = torch.randn((2, 4, 1, 16), generator=generator, device=device)
    length = torch.tensor(128 + 8, device=device)
    assert list(tables) == ["topology", "centroid", "quest"]
    decodes = [calls[i] for i in (5, 8, 11)]  # each selector's last call
    for (selector, table), out in zip(tables.items(), decodes):
        stats = StaticBlockStats.for_cache(keys, 16, salience=True)
        stats.update(keys, torch.tensor(0, device=device), 128)
        stats.rebuild_salience(torch.tensor(128, device=device))
        expected = decode_step_table(selector, q, keys, stats, length, 1, 1, 2, fused=True)
        assert table.shape == (2, 2, 5) and torch.equal(table, expected), selector
        torch.testing.assert_close(out, static_decode(q, keys, values, length, expected, 16))
    assert torch.equal(calls[3], tables["topology"])  # the kept row, reused
    torch.testing.assert_close(calls[0], static_decode(q, keys, values, length, None, 16))

    table = step_markdown(rows).splitlines()
    assert table[0] == "| " + " | ".join(STEP_COLUMNS) + " |" and len(table) == 2 + len(rows)
    assert all(line.startswith("| tiny | ") for line in table[2:])


def test_the_table_leaves_missing_values_empty():
    """topology's kept-row columns are empty on the other selectors' rows, whether the key is absent or NaN."""
    from topo_attn.bench.step import step_markdown

    row = dict(case="c", selector="quest", budget_tokens=2048, update_table_us=20.0, completing_us=30.0,
               decode_us=13.5, dense_decode_us=39.4, selection_share=0.6)
    table = step_markdown([row, {**row, "kept_us": float("nan"), "fill_us": None},
                           {**row, "selector": "topology", "kept_us": 9.3, "fill_us": 4.8}]).splitlines()[2:]
    assert table[0] == table[1] == "| c | quest | 2048 | 20.0 | 30.0 |  |  | 13.5 | 39.4 | 0.60 |"
    assert table[2] == "| c | topology | 2048 | 20.0 | 30.0 | 9.3 | 4.8 | 13.5 | 39.4 | 0.60 |"
