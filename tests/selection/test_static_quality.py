"""The study of topology's kept salience (topo_attn.selection.static_quality): the per-query block mass against
block_attention_mass, the rows against a direct loop over the steps, a case where the kept rule is exact, and the
command line."""

from __future__ import annotations

import json

import pytest
import torch

from topo_attn.selection import block_attention_mass
from topo_attn.selection.incremental import select_for_queries
from topo_attn.selection.static_quality import decode_quality, main, query_block_mass
from topo_attn.selection.static_step import StaticBlockStats, step_block_table

BS = 8


def test_the_query_mass_sums_to_block_attention_mass():
    """GQA (4 query heads over 2), a partial last block: summed over each query block's queries and the group's
    heads, it is block_attention_mass; each query's row sums to 1 and puts nothing after the query's block."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 45, 8, generator=gen), torch.randn(2, 2, 45, 8, generator=gen)
    mass = query_block_mass(q, k, BS, chunk=16)
    torch.testing.assert_close(mass.sum(-1), torch.ones(2, 2, 45, dtype=torch.float64))
    after = torch.arange(6)[None, :] > (torch.arange(45) // BS)[:, None]
    assert bool((mass[..., after] == 0).all())
    want = block_attention_mass(q, k, BS).reshape(2, 2, 2, 6, 6).sum(2)
    got = torch.zeros(2, 2, 6, 6, dtype=torch.float64).index_add_(2, torch.arange(45) // BS, mass * 2)
    torch.testing.assert_close(got, want)


def test_rows_equal_a_direct_loop():
    """Exact and kept masses and the kept recall, recomputed step by step from select_for_queries,
    step_block_table and a float64 softmax of each query."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 4, 96, 8, generator=gen), 2 * torch.randn(1, 2, 96, 8, generator=gen)
    budget, sinks, window = 3, 1, 1
    (row,) = decode_quality(q, k, BS, [budget], sinks, window)
    stats = StaticBlockStats.for_cache(k, BS, salience=True)
    total = {"exact": 0.0, "kept": 0.0, "recall": 0.0}
    steps = 0
    for t in range(96):
        stats.update(k, torch.tensor(t), 1)
        qb = t // BS
        if qb - window <= sinks:
            continue
        steps += 1
        logits = torch.einsum("hd,hsd->hs", q[0, :, t].double(), k[0, :, :t + 1].double().repeat_interleave(2, 0))
        probs = torch.softmax(logits / 8 ** 0.5, -1).reshape(2, 2, t + 1).mean(1)  # [H_kv, t + 1]: the group's mean
        exact = select_for_queries("topology", q[..., t:t + 1, :], k[..., :t + 1, :], BS, sinks, window, budget)
        table = step_block_table("topology", q[..., t:t + 1, :], stats, torch.tensor(t + 1), sinks, window, budget)
        for lane in range(2):
            wanted = {b for b in exact.indices.reshape(2, -1)[lane].tolist() if sinks <= b < qb - window}
            kept = {b for b in table[0, lane, sinks + window + 1:].tolist() if b >= 0}
            for name, blocks in (("exact", wanted), ("kept", kept)):
                total[name] += sum(float(probs[lane, b * BS:(b + 1) * BS].sum()) for b in blocks)
            total["recall"] += len(kept & wanted) / len(wanted)
    assert row["steps"] == steps and row["lanes"] == 2
    assert row["mass_exact"] == pytest.approx(total["exact"] / (2 * steps), rel=1e-9)
    assert row["mass_kept"] == pytest.approx(total["kept"] / (2 * steps), rel=1e-9)
    assert row["recall_kept"] == pytest.approx(total["recall"] / (2 * steps), rel=1e-9)
    assert row["mass_random"] < row["mass_exact"] + 1  # a share of the attention
    assert -1 <= row["spearman_kept"] <= 1 and -1 <= row["spearman_nearest"] <= 1


def test_where_the_kept_rule_is_exact_nothing_is_lost():
    """Far outliers around one point (the kept rule's bars are #22's salience there): recall 1, the same mass, a
    rank correlation of 1 wherever the ranks are not constant."""
    keys = torch.zeros(1, 1, 160, 8)
    for axis, (block, radius) in enumerate([(3, 20.0), (7, 50.0), (8, 30.0), (12, 40.0), (15, 10.0)]):
        keys[..., block * BS:(block + 1) * BS, axis] += radius
    q = torch.randn(1, 2, 160, 8, generator=torch.Generator().manual_seed(2))
    for row in decode_quality(q, keys, BS, [1, 2, 4]):
        assert row["recall_kept"] == 1.0 and row["kept_over_exact"] == pytest.approx(1.0, rel=1e-12)
        assert row["spearman_kept"] == pytest.approx(1.0)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"\[B, H, S, D\] and \[B, H_kv, S, D\]"):
        decode_quality(torch.zeros(1, 3, 16, 4), torch.zeros(1, 2, 16, 4), BS)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        decode_quality(torch.zeros(1, 2, 16, 4), torch.zeros(1, 2, 16, 4), BS, [0])


def test_the_command_writes_its_file(tmp_path, capsys):
    """A small run: the table on stdout, the JSON with the command, the commit record, a row per data set and
    budget and the timing rows; a bad value ends as a usage error."""
    out = tmp_path / "q.json"
    assert main(["--seeds", "3", "--seq-len", "160", "--block-size", "16", "--budgets", "2", "--timing-blocks", "4",
                 "--repeats", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["command"].startswith("python -m topo_attn.selection.static_quality --seeds 3")
    assert "commit" in data and data["torch"] == torch.__version__
    assert [(r["data"].split()[0], r["budget"], r["seed"]) for r in data["quality"]] == [("real", 2, None),
                                                                                      ("synthetic", 2, 3)]
    assert len(data["summary"]) == 2 and data["timing"][0]["blocks"] == 4 and "rows" not in data
    assert "| data | budget |" in capsys.readouterr().out
    from topo_attn.cli import run

    assert run(main, ["--budgets", "0"], prog="x") == 2
