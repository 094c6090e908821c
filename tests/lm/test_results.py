"""The language-model study's result files (topo_attn.lm.results): loading each command's file, the study's
tables and description, joining a study run in parts, and what each loader refuses. The study's results are
the stand-in of tests/lm_standin.py (the JSON's keys and row fields, made-up numbers)."""

from __future__ import annotations

import json

import pytest

from lm_standin import lm_result  # in tests/: the stand-in of the study's results
from topo_attn.lm import results as lm_results
from topo_attn.provenance import ROOT

pytest.importorskip("pandas")


def test_load_lm_quality_and_its_tables(tmp_path):
    result = lm_result()
    path = tmp_path / "lm_quality.json"
    path.write_text(json.dumps(result))
    loaded = lm_results.load_lm_quality(path)
    assert loaded == json.loads(path.read_text())
    described = lm_results.describe_lm_quality(loaded)
    assert "NVIDIA Test GPU" in described and "commit abc1234" in described and "block_size 64" in described
    tables = lm_results.lm_quality_tables(loaded)
    assert set(tables) == {"perplexity", "retrieval", "recall", "speed"}
    perplexity = tables["perplexity"]
    assert list(perplexity.columns[:7]) == ["attention", "budget", "visited_fraction", "bpb_all", "bpb_0-1k",
                                            "bpb_1k-4k", "bpb_4k-8k"]
    assert str(perplexity["budget"].dtype) == "Int64" and perplexity["budget"].isna().sum() == 2  # sdpa, dense
    assert tables["recall"]["recall_mean"].iloc[0] == pytest.approx(0.5)
    assert "speed" not in lm_results.lm_quality_tables(lm_result(speed=False))


def test_load_lm_quality_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="no language-model results at .*missing.json"):
        lm_results.load_lm_quality(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match=str(ROOT / "data" / "nothing.json")):
        lm_results.load_lm_quality("data/nothing.json")  # relative: from the repository's root
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"suite": "pr", "rows": []}))
    with pytest.raises(ValueError, match="suite 'lm'"):
        lm_results.load_lm_quality(bad)
    bad.write_text(json.dumps({k: v for k, v in lm_result().items() if k != "retrieval"}))
    with pytest.raises(ValueError, match=r"lacks \['retrieval'\]"):
        lm_results.load_lm_quality(bad)
    bad.write_text(json.dumps({**lm_result(), "recall": {}}))
    with pytest.raises(ValueError, match="must be lists"):
        lm_results.load_lm_quality(bad)


def test_combine_lm_quality_joins_parts_of_one_study():
    whole = lm_result()
    configs = [(r["attention"], r["budget"]) for r in whole["perplexity"]]
    base = {("sdpa", None), ("dense", None)}
    split = configs.index(next(c for c in configs if c not in base and c[0] != "window"))

    def part(keep):  # a run of some selectors: sdpa and dense in every part
        chosen = base | set(keep)
        return {**whole, **{s: [r for r in whole[s] if (r["attention"], r["budget"]) in chosen]
                            for s in ("perplexity", "retrieval")}}

    a, b = part(configs[:split]), part(configs[split:])
    b["perplexity"] = [{**r, "seconds": -1.0} for r in b["perplexity"]]  # to see which part a row came from
    combined = lm_results.combine_lm_quality([a, b])
    assert [(r["attention"], r["budget"]) for r in combined["perplexity"]] == configs
    assert all(r["seconds"] != -1.0 for r in combined["perplexity"][:split])  # sdpa, dense: from the first part
    assert len(combined["retrieval"]) == len(whole["retrieval"])
    with pytest.raises(ValueError, match="block_size"):
        lm_results.combine_lm_quality([a, {**b, "block_size": 32}])
    with pytest.raises(ValueError, match="at least one"):
        lm_results.combine_lm_quality([])


def test_load_lm_research_and_its_table(tmp_path):
    rows = [dict(selector=s, budget=b, recall=0.5 + 0.1 * i + 0.01 * b, late_recall=0.4 + 0.1 * i + 0.01 * b,
                 blocks_per_row=3.0 + b) for i, s in enumerate(("random", "centroid", "quest_mst")) for b in (2, 6)]
    result = dict(suite="lm_research", gpu="NVIDIA Test GPU", torch="2", triton="3", command="x", rows=rows,
                  commit="abc1234", dirty=False, commit_source="test")
    path = tmp_path / "lm_research.json"
    path.write_text(json.dumps(result))
    loaded = lm_results.load_lm_research(path)
    table = lm_results.lm_research_table(loaded)
    assert list(table.index) == ["random", "centroid", "quest_mst"] and list(table.columns) == ["budget 2",
                                                                                                  "budget 6"]
    assert table.loc["centroid", "budget 6"] == "0.660 / 0.560"
    path.write_text(json.dumps({**result, "suite": "lm"}))
    with pytest.raises(ValueError, match="lm_research"):
        lm_results.load_lm_research(path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        lm_results.load_lm_research(tmp_path / "missing.json")


def test_load_lm_passkey_and_its_table(tmp_path):
    from topo_attn.lm.generation import markdown

    loaded = lm_results.load_lm_passkey("data/benchmarks/lm_passkey_generate_h200.json")  # the committed one
    assert "| quest | 30 | 25.8% | 100% | 100% | 100% | 88% |" in markdown(loaded)
    path = tmp_path / "passkey.json"
    path.write_text(json.dumps({**loaded, "suite": "lm"}))
    with pytest.raises(ValueError, match="lm_passkey_generate"):
        lm_results.load_lm_passkey(path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        lm_results.load_lm_passkey(tmp_path / "missing.json")


def test_the_committed_results_load():
    """Every committed file of the study's commands loads with its loader, and its suite is the one the loader
    names."""
    found = {path.name: json.loads(path.read_text()).get("suite")
             for path in sorted((ROOT / "data" / "benchmarks").glob("lm_*.json"))}
    loaders = {lm_results.LM_SUITE: lm_results.load_lm_quality,
               lm_results.LM_RESEARCH_SUITE: lm_results.load_lm_research,
               lm_results.LM_PASSKEY_SUITE: lm_results.load_lm_passkey}
    assert set(found.values()) >= set(loaders)
    for name, suite in found.items():
        if suite in loaders:
            assert loaders[suite](f"data/benchmarks/{name}")["suite"] == suite
    assert "speed" in lm_results.lm_quality_tables(lm_results.load_lm_quality("data/benchmarks/lm_quality_h200.json"))


def test_importing_the_loaders_imports_neither_transformers_nor_pandas():
    import subprocess
    import sys

    code = "import sys, topo_attn.lm.results; print(sorted(m for m in ('transformers', 'pandas') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
