"""docs/benchmarks.md names every committed result file in data/benchmarks/, and names no file that is not there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"
JSON_NAME = re.compile(r"[A-Za-z0-9_.-]+\.json")


def named_results() -> set[str]:
    """The result files the page names: every `*.json` file name in it, bare or in a `data/benchmarks/` path.
    Names written with another folder in front (such as `build/benchmarks/measured_here.json`) are not
    results."""
    text, names = PAGE.read_text(), set()
    for match in JSON_NAME.finditer(text):
        before = text[:match.start()]
        folder = re.search(r"([A-Za-z0-9_.-]+/)*$", before).group(0)
        if folder in ("", "data/benchmarks/"):
            names.add(match.group(0))
    return names


def test_every_committed_result_is_on_the_page():
    committed = {p.name for p in RESULTS.glob("*.json")}
    assert committed, f"no result files in {RESULTS}"
    missing = sorted(committed - named_results())
    assert not missing, f"docs/benchmarks.md does not name these files of data/benchmarks/: {missing}"


def test_the_page_names_only_existing_results():
    committed = {p.name for p in RESULTS.glob("*.json")}
    unknown = sorted(named_results() - committed)
    assert not unknown, f"docs/benchmarks.md names result files that data/benchmarks/ does not hold: {unknown}"


def test_the_name_finder_reads_paths_and_bare_names(tmp_path, monkeypatch):
    page = tmp_path / "benchmarks.md"
    page.write_text("`a_h200.json`, data/benchmarks/b.json and (`c.json`); not /tmp/llm.json or build/x/d.json\n")
    monkeypatch.setattr(sys.modules[__name__], "PAGE", page)
    assert named_results() == {"a_h200.json", "b.json", "c.json"}
