"""Reading kernel benchmark results (topo_attn.bench.results) from JSON files (the commit record itself:
tests/test_provenance.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topo_attn.bench import results as bench_results

ROW = dict(case="S1024", seq_len=1024, ours_ms=0.011, sdpa_ms=0.016, flex_ms=float("nan"), limit_ms=0.0065,
           ours_tflops=4.7, sdpa_tflops=8.2, flex_tflops=float("nan"), scheduled_blocks=59, causal_blocks=136,
           cfg_heads=1)
HEADER = dict(suite="pr", gpu="NVIDIA H200", torch="2.11.0+cu130", triton="3.6.0",
              command="python -m topo_attn.bench --suite pr")


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_loads_kernel_results_and_skips_other_files(tmp_path):
    write(tmp_path / "b.json", {**HEADER, "rows": [ROW, {**ROW, "case": "S2048", "seq_len": 2048}]})
    write(tmp_path / "salience_cpu.json", {"command": "python tests/bench_salience.py", "speedup": 18.5,
                                           "times": [1, 2]})
    found = bench_results.load_kernel_benchmarks(tmp_path)
    assert len(found) == 1
    bench = found[0]
    assert (bench.suite, bench.gpu, bench.torch, bench.triton) == ("pr", "NVIDIA H200", "2.11.0+cu130", "3.6.0")
    assert "NVIDIA H200" in bench.describe() and "2.11.0+cu130" in bench.describe() and "3.6.0" in bench.describe()
    table = bench.table()
    assert list(table.index) == ["S1024", "S2048"]
    assert list(table.columns[:8]) == list(bench_results.ROW_KEYS[1:])
    assert "scheduled_blocks" in table.columns and "cfg_heads" not in table.columns
    assert "cfg_heads" in bench.table(all_columns=True).columns
    summary = bench_results.summary(found, tmp_path)
    assert "1 file" in summary and "NVIDIA H200" in summary
    other = bench_results.other_results_table(tmp_path)
    assert list(other.columns) == ["salience_cpu.json"] and "speedup" in other.index and "times" not in other.index


def test_no_results_is_said_plainly(tmp_path):
    write(tmp_path / "salience_cpu.json", {"command": "x"})
    assert bench_results.load_kernel_benchmarks(tmp_path) == []
    summary = bench_results.summary([], tmp_path)
    assert summary.startswith("**No kernel benchmark results yet.**") and str(tmp_path) in summary



def test_a_missing_results_folder_is_named(tmp_path):
    for load in (bench_results.load_kernel_benchmarks, bench_results.other_results_table):
        with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} does not exist"):
            load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        bench_results.load_suite("build", tmp_path / "missing")


def test_results_dir_is_the_repository_data_benchmarks():
    root = Path(__file__).resolve().parents[2]
    assert bench_results.ROOT == root and bench_results.RESULTS_DIR == root / "data" / "benchmarks"
    assert {"pr", "llm"} <= {b.suite for b in bench_results.load_kernel_benchmarks()}


@pytest.mark.parametrize("data, match", [
    ({"rows": [ROW]}, "lacks \\['suite', 'gpu'"),
    ({**HEADER, "rows": {"a": 1}}, "must be a list"),
    ({**HEADER, "rows": [{k: v for k, v in ROW.items() if k != "limit_ms"}]}, "row 0 lacks \\['limit_ms'\\]"),
])
def test_malformed_results_raise(tmp_path, data, match):
    write(tmp_path / "bad.json", data)
    with pytest.raises(ValueError, match=match):
        bench_results.load_kernel_benchmarks(tmp_path)


def test_rows_marked_invalid_are_refused(tmp_path):
    """A row marked invalid after its measurement makes both loaders refuse the file, naming it, the case and
    the reason; the same file without the mark loads."""
    rows = [ROW, {**ROW, "case": "S2048", "invalid": {"flex": "dynamo fell back to eager"}}]
    write(tmp_path / "llm_x.json", {**HEADER, "suite": "llm", "rows": rows})
    write(tmp_path / "train_x.json", {**HEADER, "suite": "train", "rows": rows})
    with pytest.raises(ValueError, match="llm_x.json: row 1 \\(S2048\\) is marked invalid: .*fell back to eager"):
        bench_results.load_kernel_benchmarks(tmp_path)
    with pytest.raises(ValueError, match="train_x.json: row 1 \\(S2048\\) is marked invalid"):
        bench_results.load_suite("train", tmp_path)
    write(tmp_path / "llm_x.json", {**HEADER, "suite": "llm", "rows": [ROW, {**ROW, "case": "S2048"}]})
    assert [len(b.rows) for b in bench_results.load_kernel_benchmarks(tmp_path)] == [2]


def test_committed_results_hold_no_invalid_rows():
    """Every committed figure is valid: no committed file carries a row marked invalid (the loaders would
    refuse it)."""
    for path in sorted(bench_results.RESULTS_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            bench_results.refuse_invalid_rows(path, data["rows"])


def test_no_measuring_without_a_gpu_or_when_off():
    import torch

    message, measured = bench_results.run_small_benchmark(["--suite", "pr"], run=False)
    assert measured == [] and "Not measuring" in message
    if not torch.cuda.is_available():
        message, measured = bench_results.run_small_benchmark(["--suite", "pr"])
        assert measured == [] and "No CUDA GPU" in message


def test_other_suites_are_read_by_load_suite(tmp_path):
    """Files of the build / train / select suites have rows of their own shape: the kernel loader skips
    them and load_suite reads them, with their GPU, versions and command."""
    write(tmp_path / "a.json", {**HEADER, "rows": [ROW]})
    write(tmp_path / "build_h200.json", {**HEADER, "suite": "build", "command": "python -m topo_attn.bench --suite build",
                                         "rows": [{"case": "x", "shared_build_ms": 1.0}, {"case": "y", "shared_build_ms": 2.0}]})
    assert [b.suite for b in bench_results.load_kernel_benchmarks(tmp_path)] == ["pr"]
    (header, frame), = bench_results.load_suite("build", tmp_path)
    assert header["gpu"] == "NVIDIA H200" and header["command"].endswith("--suite build")
    assert header["path"] == "build_h200.json" and list(frame["shared_build_ms"]) == [1.0, 2.0]
    assert header["note"] is None
    assert bench_results.load_suite("train", tmp_path) == []
    write(tmp_path / "train_h200.json", {**HEADER, "suite": "train", "note": "flex failed on b64",
                                         "rows": [{"case": "x", "ours_bwd_ms": 3.0}]})
    (header, frame), = bench_results.load_suite("train", tmp_path)
    assert header["note"] == "flex failed on b64" and list(frame["ours_bwd_ms"]) == [3.0]


# ------------------------------------------------------------------------------------- the commit of the code
def test_the_commit_is_read_and_described(tmp_path):
    write(tmp_path / "a.json", {**HEADER, "commit": "abc1234", "dirty": True, "commit_source": "test",
                                "rows": [ROW]})
    write(tmp_path / "b.json", {**HEADER, "rows": [ROW]})
    write(tmp_path / "c.json", {**HEADER, "commit": None, "commit_source": "an installed package", "rows": [ROW]})
    a, b, c = bench_results.load_kernel_benchmarks(tmp_path)
    assert (a.commit, a.dirty, a.commit_source) == ("abc1234", True, "test")
    assert a.describe().endswith("; commit abc1234 with uncommitted changes under topo_attn/")
    assert b.commit is None and b.describe().endswith("; commit not recorded")
    assert c.describe().endswith("; commit unknown (an installed package)")
    write(tmp_path / "build.json", {**HEADER, "suite": "build", "commit": "def5678", "dirty": False,
                                    "commit_source": "test", "rows": [{"case": "x"}]})
    (header, _), = bench_results.load_suite("build", tmp_path)
    assert header["commit"] == "def5678" and bench_results.commit_text(header) == "commit def5678"


@pytest.mark.parametrize("field, value", [("commit", 1234567), ("dirty", "no"), ("commit_source", None)])
def test_a_malformed_commit_raises(tmp_path, field, value):
    write(tmp_path / "bad.json", {**HEADER, "commit": "abc1234", field: value, "rows": [ROW]})
    with pytest.raises(ValueError, match=f"bad.json: '{field}' must be"):
        bench_results.load_kernel_benchmarks(tmp_path)
    write(tmp_path / "bad.json", {**HEADER, "suite": "build", "commit": "abc1234", field: value, "rows": [ROW]})
    with pytest.raises(ValueError, match=f"bad.json: '{field}' must be"):
        bench_results.load_suite("build", tmp_path)


def test_the_loaders_describe_the_commits_of_the_committed_results():
    """The kernel loader's descriptions and the suites' headers say the commit each committed file names (that
    every file names one: tests/test_provenance.py)."""
    for bench in bench_results.load_kernel_benchmarks():
        assert bench.commit and bench.describe().endswith(f"; commit {bench.commit}")
    for suite in ("build", "train", "select"):
        for header, _ in bench_results.load_suite(suite):
            assert bench_results.commit_text(header) == f"commit {header['commit']}"


def test_other_results_leave_out_files_of_the_packages_other_commands(tmp_path):
    """The "other results" are the files without rows that no other command of the package wrote: a file of
    ``python -m topo_attn.<module>`` (the language-model study's, for example) is read by that module's own
    loaders, whatever its suite; scripts and shell loops stay."""
    write(tmp_path / "salience_cpu.json", {"command": "python tests/bench_salience.py", "speedup": 18.5})
    write(tmp_path / "study.json", {"suite": "anything", "command": "python -m topo_attn.lm evaluate --out x",
                                    "perplexity": []})
    write(tmp_path / "loop.json", {"command": "for i in 1 2; do python -m topo_attn.bench --suite llm; done",
                                   "runs": []})
    assert list(bench_results.other_results_table(tmp_path).columns) == ["loop.json", "salience_cpu.json"]
    assert bench_results.written_by_another_command({"command": "python -m topo_attn.lm research"})
    for data in ({"command": "python -m topo_attn.bench --suite pr"}, {"command": "python tests/bench_hopper.py"},
                 {"command": "python -m topo_attn"}, {"command": None}, {}, []):
        assert not bench_results.written_by_another_command(data), data
    committed = set(bench_results.other_results_table().columns)  # the repository's: no language-model file
    assert "salience_cpu.json" in committed and not any(name.startswith("lm_") for name in committed)


def test_the_language_model_results_are_left_to_their_own_loaders(tmp_path):
    """The language-model study's files (topo_attn.lm.results reads them) are neither kernel results nor
    "other results", with rows (the research step's) or without (the study's sections)."""
    from lm_standin import lm_result  # in tests/: the stand-in of the study's results

    write(tmp_path / "lm_quality.json", lm_result())
    write(tmp_path / "lm_research.json", {**HEADER, "suite": "lm_research",
                                          "command": "python -m topo_attn.lm research",
                                          "rows": [{"selector": "quest", "budget": 2, "recall": 0.9}]})
    write(tmp_path / "salience_cpu.json", {"command": "x", "speedup": 2.0})
    assert bench_results.load_kernel_benchmarks(tmp_path) == []
    assert list(bench_results.other_results_table(tmp_path).columns) == ["salience_cpu.json"]
    assert bench_results.load_suite("lm", tmp_path) == []
